/*
 * test_tcp_attack - a process hosts a tcp context (rank 1 of 2) with a
 * registered region of random bytes; the test process attacks it with raw
 * sockets: a wrong secret, a wrong secret length, garbage, a hello for the
 * wrong ranks or socket, for another incarnation of the host (a stale
 * address blob), from incarnation 0 or of protocol version 1, a silent
 * client, and, with the right secret
 * claiming rank 0, writes outside the region, to an unknown region, with a
 * wrapping offset, an unknown type, an unaligned signal, a wrong sequence
 * number, a malformed goodbye. Each connection must be closed by the host;
 * the bad messages must be reported as {NONE, MEP_ERR_BOUNDS or
 * MEP_ERR_PROTOCOL, peer 0}, the unauthenticated ones not at all, a good
 * goodbye as {NONE, MEP_ERR_CLOSED, 0}; the region must never change; a
 * hello for rank 0 after its failure gets a refusal (MEPN), no ack. With
 * 2 sockets per peer: a goodbye on each is a close, data after a goodbye
 * or a signal left waiting at the last goodbye a protocol error, a goodbye
 * on one socket and an end without one on the other a failure. Then a
 * second pair of contexts connects properly and moves random data both
 * ways. The host is driven by one-byte commands over a socketpair.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcp_test.h"

#define REGION_LEN (64 * 1024 + 3)
#define HOST_TIMEOUT_MS 1500 /* also how long a silent client may idle */
#define MAXC 64

/* ------------------------------------------------ wire bytes, by hand */

static void le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}
static uint64_t rd(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The incarnations of the hellos: the attacker's own, and the host's
 * (from its address blob) unless a case changes it. */
#define MY_INC 0x5eed5eed5eed5eedull
static uint64_t g_to_inc;

static size_t hello(uint8_t *b, uint32_t from, uint32_t to, uint32_t idx,
                    uint32_t nsock, const uint8_t *sec, uint32_t slen) {
  memcpy(b, "MEPH", 4);
  le(b + 4, 2, 2);
  le(b + 6, nsock, 2);
  le(b + 8, from, 4);
  le(b + 12, to, 4);
  le(b + 16, idx, 4);
  le(b + 20, slen, 4);
  le(b + 24, MY_INC, 8);
  le(b + 32, g_to_inc, 8);
  if (slen) memcpy(b + 40, sec, slen);
  return 40 + slen;
}

static void header(uint8_t *h, int type, int op, int count, uint32_t region,
                   uint64_t off, uint64_t lv, uint64_t seq) {
  h[0] = (uint8_t)type;
  h[1] = (uint8_t)op;
  le(h + 2, (uint64_t)count, 2);
  le(h + 4, region, 4);
  le(h + 8, off, 8);
  le(h + 16, lv, 8);
  le(h + 24, seq, 8);
}

/* ------------------------------------------------------------- host */

typedef struct host {
  tt_host_t h;
  uint8_t secret[32];
  uint8_t *region, *copy;
  mep_tp_mr_t *mr;
  mep_tp_completion_t got[MAXC];
  int ngot;
} host_t;

static void host_poll(host_t *H) {
  mep_tp_completion_t c[8];
  int n = H->h.vt->poll(H->h.ctx, c, 8);
  TT_CHECK(n >= 0, "host poll: %d", n);
  for (int i = 0; i < n && H->ngot < MAXC; i++) H->got[H->ngot++] = c[i];
}

/* A fresh context and region; sends the address and rkey blobs. */
static void host_start(host_t *H, int cfd, int nsock) {
  tt_open(&H->h, 1, 2, H->secret, sizeof H->secret, nsock, "lo",
          HOST_TIMEOUT_MS);
  tt_fill(H->region, tt_seed(), 0, REGION_LEN);
  memcpy(H->copy, H->region, REGION_LEN);
  uint8_t blob[MEP_TP_MAX_ADDR + MEP_TP_MAX_RKEY];
  size_t n = MEP_TP_MAX_ADDR, k = MEP_TP_MAX_RKEY;
  TT_OK(H->h.vt->address(H->h.ctx, blob, &n));
  tt_send(cfd, blob, n);
  TT_OK(H->h.vt->reg(H->h.ctx, H->region, REGION_LEN, MEP_MEM_HOST, &H->mr,
                     blob, &k));
  tt_send(cfd, blob, k);
  H->ngot = 0;
}

static void host_stop(host_t *H) {
  TT_OK(H->h.vt->dereg(H->h.ctx, H->mr));
  tt_close(&H->h);
}

/* The well-behaved exchange, in both roles: ranks 0 (tester) and 1 (host)
 * in a new pair of contexts with a new secret, writing random data both
 * ways and checking it. */
static void good_exchange(int rank, int cfd, const uint8_t *secret) {
  const size_t L = 1024 * 1024 + 7;
  tt_host_t h;
  tt_open(&h, rank, 2, secret, 16, 2, "lo", 10000);
  const mep_transport_t *vt = h.vt;
  uint8_t blob[MEP_TP_MAX_ADDR], rkey[MEP_TP_MAX_RKEY];
  size_t n = sizeof blob, k = sizeof rkey;
  TT_OK(vt->address(h.ctx, blob, &n));
  tt_send(cfd, blob, n);
  n = tt_recv(cfd, blob, sizeof blob, 10000);
  mep_tp_ep_t *ep;
  TT_OK(vt->connect(h.ctx, 1 - rank, blob, n, &ep));
  uint8_t *src = malloc(L), *dst = calloc(1, L);
  TT_CHECK(src && dst, "out of memory");
  uint64_t seed;
  if (rank == 0) seed = tt_seed(), tt_send(cfd, &seed, sizeof seed);
  else tt_recv(cfd, &seed, sizeof seed, 10000);
  tt_fill(src, seed + (uint64_t)rank, 0, L);
  mep_tp_mr_t *smr, *dmr;
  mep_tp_rmr_t *rmr;
  TT_OK(vt->reg(h.ctx, src, L, MEP_MEM_HOST, &smr, rkey, &k));
  k = sizeof rkey;
  TT_OK(vt->reg(h.ctx, dst, L, MEP_MEM_HOST, &dmr, rkey, &k));
  tt_send(cfd, rkey, k);
  k = tt_recv(cfd, rkey, sizeof rkey, 10000);
  TT_OK(vt->import(ep, rkey, k, &rmr));
  TT_OK(vt->write(ep, smr, 3, rmr, 13, L - 16, 42));
  TT_OK(vt->signal(ep, rmr, 0, 1, MEP_SIGNAL_ADD));
  double deadline = tt_now() + 20;
  int done = 0;
  while (!done || __atomic_load_n((uint64_t *)(void *)dst,
                                  __ATOMIC_ACQUIRE) < 1) {
    mep_tp_completion_t c[4];
    int m = vt->poll(h.ctx, c, 4);
    TT_CHECK(m >= 0, "poll");
    for (int i = 0; i < m; i++) {
      TT_CHECK(c[i].token == 42 && c[i].status == 0 && !done,
               "good exchange: completion %" PRIu64 " status %d",
               c[i].token, c[i].status);
      done = 1;
    }
    TT_CHECK(tt_now() < deadline, "good exchange: no data after 20 s");
  }
  long long bad = tt_verify(dst + 13, seed + (uint64_t)(1 - rank), 3, L - 16);
  TT_CHECK(bad < 0, "good exchange: byte %lld differs", bad);
  /* Each side has its data and its write completed: nothing more needs
   * polling. Both close only after both checked, so neither sees the
   * other's close as a failure. */
  uint8_t b = 1;
  tt_send(cfd, &b, 1);
  tt_recv(cfd, &b, 1, 20000);
  TT_OK(vt->unimport(ep, rmr));
  TT_OK(vt->close(ep));
  TT_OK(vt->dereg(h.ctx, smr));
  TT_OK(vt->dereg(h.ctx, dmr));
  tt_close(&h);
  free(src);
  free(dst);
}

static void host_main(int cfd, const uint8_t *secret) {
  static host_t H;
  memcpy(H.secret, secret, sizeof H.secret);
  H.region = malloc(REGION_LEN);
  H.copy = malloc(REGION_LEN);
  TT_CHECK(H.region && H.copy, "out of memory");
  host_start(&H, cfd, 1);
  double deadline = tt_now() + 120;
  for (;;) {
    host_poll(&H);
    TT_CHECK(tt_now() < deadline, "host: still running after 120 s");
    struct pollfd pf = {.fd = cfd, .events = POLLIN};
    if (poll(&pf, 1, 1) <= 0) continue;
    uint8_t cmd = 0, ok;
    tt_recv(cfd, &cmd, 1, 1000);
    switch (cmd) {
    case 'P': /* completions so far */
      tt_send(cfd, H.got, (size_t)H.ngot * sizeof H.got[0]);
      H.ngot = 0;
      break;
    case 'V': /* is the region untouched? */
      ok = !memcmp(H.region, H.copy, REGION_LEN);
      tt_send(cfd, &ok, 1);
      break;
    case 'R': /* a fresh context */
    case 'D': /* a fresh context with 2 sockets per peer */
      host_stop(&H);
      host_start(&H, cfd, cmd == 'D' ? 2 : 1);
      break;
    case 'N': { /* the well-behaved exchange */
      uint8_t s2[16];
      tt_recv(cfd, s2, sizeof s2, 1000);
      good_exchange(1, cfd, s2);
      break;
    }
    case 'Q':
      host_stop(&H);
      free(H.region);
      free(H.copy);
      exit(0);
    default:
      TT_FAIL("host: unknown command %d", cmd);
    }
  }
}

/* ----------------------------------------------------------- attacker */

typedef struct tester {
  int cfd;
  struct sockaddr_in host;
  uint32_t region;
  uint8_t secret[32];
} tester_t;

static void get_blobs(tester_t *T) {
  uint8_t b[MEP_TP_MAX_ADDR];
  size_t n = tt_recv(T->cfd, b, sizeof b, 10000);
  TT_CHECK(n == 24 && !memcmp(b, "MEPA", 4), "address blob of %zu bytes", n);
  T->host.sin_family = AF_INET;
  memcpy(&T->host.sin_addr, b + 8, 4);
  T->host.sin_port = htons((uint16_t)rd(b + 12, 2));
  g_to_inc = rd(b + 16, 8);
  TT_CHECK(g_to_inc != 0, "address blob with incarnation 0");
  n = tt_recv(T->cfd, b, sizeof b, 10000);
  TT_CHECK(n == 24 && !memcmp(b, "MEPR", 4), "rkey blob of %zu bytes", n);
  T->region = (uint32_t)rd(b + 12, 4);
  TT_CHECK(rd(b + 16, 8) == REGION_LEN, "rkey length %" PRIu64,
           rd(b + 16, 8));
}

static int dial(tester_t *T) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TT_CHECK(fd >= 0, "socket");
  TT_CHECK(!connect(fd, (struct sockaddr *)&T->host, sizeof T->host),
           "connect to the host: %s", strerror(errno));
  return fd;
}

/* Sends what it can: the host may close the socket midway. */
static void send_some(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      if (poll(&pf, 1, 2000) <= 0) return;
      continue;
    }
    if (n <= 0) return;
    p += n;
    len -= (size_t)n;
  }
}

/* The host closes the connection within `secs`; returns the bytes it sent
 * before (an ack, for an accepted hello) in buf. */
static size_t expect_closed(int fd, double secs, uint8_t *buf, size_t cap,
                            const char *what) {
  double deadline = tt_now() + secs;
  size_t got = 0;
  for (;;) {
    int left = (int)((deadline - tt_now()) * 1000);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    TT_CHECK(left > 0 && poll(&pf, 1, left) > 0,
             "%s: the host kept the connection open for %.1f s", what, secs);
    uint8_t tmp[64];
    ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) break;
    TT_CHECK(n > 0, "%s: recv: %s", what, strerror(errno));
    for (ssize_t i = 0; i < n && got < cap; i++) buf[got++] = tmp[i];
  }
  close(fd);
  return got;
}

static void cmd(tester_t *T, uint8_t c) { tt_send(T->cfd, &c, 1); }

static int fetch(tester_t *T, mep_tp_completion_t *c) {
  cmd(T, 'P');
  size_t n = tt_recv(T->cfd, c, MAXC * sizeof *c, 10000);
  return (int)(n / sizeof *c);
}

static void expect_untouched(tester_t *T, const char *what) {
  uint8_t ok = 0;
  cmd(T, 'V');
  tt_recv(T->cfd, &ok, 1, 10000);
  TT_CHECK(ok == 1, "%s: the host's region changed", what);
}

/* An unauthenticated connection: dropped, nothing reported, no change. */
static void reject_case(tester_t *T, const char *what, const uint8_t *hs,
                        size_t len, double wait) {
  int fd = dial(T);
  send_some(fd, hs, len);
  /* Data right behind the hello must not land either. A client that
   * stalls mid-hello (wait above the host's timeout) sends nothing more:
   * it must be dropped at the deadline. */
  uint8_t h[32 + 100];
  header(h, 1, 0, 0, T->region, 0, 100, 0);
  memset(h + 32, 0xEE, 100);
  if (wait <= 3.0) send_some(fd, h, sizeof h);
  uint8_t ack[16];
  size_t got = expect_closed(fd, wait, ack, sizeof ack, what);
  TT_CHECK(got == 0, "%s: the host answered %zu bytes", what, got);
  mep_tp_completion_t c[MAXC];
  int n = fetch(T, c);
  TT_CHECK(n == 0, "%s: %d completions (first: token %" PRIu64 " status %d)",
           what, n, n ? c[0].token : 0, n ? c[0].status : 0);
  expect_untouched(T, what);
  printf("ok: %s dropped\n", what);
}

/* Authenticated as rank 0, then a bad message: the host closes, reports
 * {NONE, want, 0}, the region is unchanged. A fresh host context after. */
static void bad_message(tester_t *T, const char *what, const uint8_t *msg,
                        size_t len, int want) {
  int fd = dial(T);
  uint8_t hs[40 + 32];
  size_t n = hello(hs, 0, 1, 0, 1, T->secret, sizeof T->secret);
  send_some(fd, hs, n);
  uint8_t ack[16];
  size_t got = 0;
  while (got < sizeof ack) { /* the ack comes before anything is sent */
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    TT_CHECK(poll(&pf, 1, 5000) > 0, "%s: no ack", what);
    ssize_t r = recv(fd, ack + got, sizeof ack - got, 0);
    TT_CHECK(r > 0, "%s: the host refused the right secret", what);
    got += (size_t)r;
  }
  TT_CHECK(!memcmp(ack, "MEPK", 4) && rd(ack + 8, 4) == 1 &&
               rd(ack + 12, 4) == 0 && rd(ack + 6, 2) == 1,
           "%s: malformed ack", what);
  send_some(fd, msg, len);
  expect_closed(fd, 3.0, ack, 0, what);
  mep_tp_completion_t c[MAXC];
  int k = fetch(T, c);
  TT_CHECK(k == 1 && c[0].token == MEP_TP_TOKEN_NONE && c[0].peer == 0 &&
               c[0].status == want,
           "%s: %d completions, first {%" PRIu64 ", %d, peer %d}, want "
           "{NONE, %d, 0}", what, k, k ? c[0].token : 0, k ? c[0].status : 0,
           k ? c[0].peer : -1, want);
  expect_untouched(T, what);
  /* the slot of rank 0 is now dead: another hello for it is refused, with
   * a refusal (the dialler may retry: the host holds a failed connection
   * of that rank until it closes it), never an ack */
  int fd2 = dial(T);
  send_some(fd2, hs, n);
  got = expect_closed(fd2, 3.0, ack, sizeof ack, "hello for a failed rank");
  TT_CHECK(got == 16 && !memcmp(ack, "MEPN", 4) && rd(ack + 6, 2) == 2 &&
               rd(ack + 8, 4) == 1 && rd(ack + 12, 4) == 0,
           "%s: a failed rank was answered with %zu bytes (%.4s), not a "
           "refusal (MEPN, reason 2, rank 1, socket 0)", what, got,
           got >= 4 ? (const char *)ack : "");
  TT_CHECK(fetch(T, c) == 0, "%s: completions after the refusal", what);
  printf("ok: %s refused (status %d)\n", what, want);
  cmd(T, 'R');
  get_blobs(T);
}

/* Authenticated as rank 0 on socket idx of a host with nsock sockets per
 * peer. */
static int join(tester_t *T, uint32_t idx, uint32_t nsock, const char *what) {
  int fd = dial(T);
  uint8_t hs[40 + 32], ack[16];
  send_some(fd, hs, hello(hs, 0, 1, idx, nsock, T->secret, sizeof T->secret));
  size_t got = 0;
  while (got < sizeof ack) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    TT_CHECK(poll(&pf, 1, 5000) > 0, "%s: no ack", what);
    ssize_t r = recv(fd, ack + got, sizeof ack - got, 0);
    TT_CHECK(r > 0, "%s: the host refused the right secret", what);
    got += (size_t)r;
  }
  TT_CHECK(!memcmp(ack, "MEPK", 4) && rd(ack + 12, 4) == idx &&
               rd(ack + 6, 2) == nsock,
           "%s: malformed ack", what);
  return fd;
}

/* Both sockets of a host with 2 sockets per peer: m0 on socket 0, then m1
 * on socket 1, then, with hang_up, both closed by us. The host closes both
 * and reports {NONE, want, 0} once; the region never changes. */
static void two_socket_case(tester_t *T, const char *what, const uint8_t *m0,
                            size_t n0, const uint8_t *m1, size_t n1,
                            int hang_up, int want) {
  cmd(T, 'D');
  get_blobs(T);
  int fd[2] = {join(T, 0, 2, what), join(T, 1, 2, what)};
  send_some(fd[0], m0, n0);
  send_some(fd[1], m1, n1);
  for (int i = 0; i < 2; i++) {
    if (hang_up)
      close(fd[i]);
    else
      expect_closed(fd[i], 3.0, NULL, 0, what);
  }
  mep_tp_completion_t c[MAXC];
  int k = 0;
  double deadline = tt_now() + 3.0;
  while (k == 0 && tt_now() < deadline) k = fetch(T, c);
  TT_CHECK(k == 1 && c[0].token == MEP_TP_TOKEN_NONE && c[0].peer == 0 &&
               c[0].status == want,
           "%s: %d completions, first {%" PRIu64 ", %d, peer %d}, want "
           "{NONE, %d, 0}", what, k, k ? c[0].token : 0, k ? c[0].status : 0,
           k ? c[0].peer : -1, want);
  usleep(100 * 1000);
  TT_CHECK(fetch(T, c) == 0, "%s: more completions", what);
  expect_untouched(T, what);
  printf("ok: %s (status %d)\n", what, want);
}

static void goodbyes(tester_t *T) {
  uint8_t m[32 + 4096 + 32];
  uint32_t R = T->region;
  header(m, 3, 0, 0, R, 0, 0, 0);
  bad_message(T, "goodbye naming a region", m, 32, MEP_ERR_PROTOCOL);
  header(m, 3, 0, 0, 0, 0, 5, 0);
  bad_message(T, "goodbye with a value", m, 32, MEP_ERR_PROTOCOL);
  header(m, 3, 0, 0, 0, 0, 0, 1);
  bad_message(T, "goodbye with a wrong sequence number", m, 32,
              MEP_ERR_PROTOCOL);
  header(m, 3, 0, 0, 0, 0, 0, 0);
  bad_message(T, "a goodbye", m, 32, MEP_ERR_CLOSED);

  uint8_t bye[32], m1[32 + 32 + 64];
  header(bye, 3, 0, 0, 0, 0, 0, 0);
  two_socket_case(T, "a goodbye on each socket", bye, 32, bye, 32, 0,
                  MEP_ERR_CLOSED);
  two_socket_case(T, "a goodbye on one socket, then hung up", NULL, 0, bye,
                  32, 1, MEP_ERR_PEER_FAILED);
  memcpy(m1, bye, 32);
  header(m1 + 32, 1, 0, 0, R, 0, 64, 0);
  memset(m1 + 64, 0xCD, 64);
  two_socket_case(T, "a write after a goodbye", NULL, 0, m1, sizeof m1, 0,
                  MEP_ERR_PROTOCOL);
  /* a signal on socket 0 that waits for a message on socket 1, then
   * goodbyes on both, without that message: the signal never applies */
  header(m, 2, 0, 2, R, 8, 77, 0);
  le(m + 32, 0, 8);
  le(m + 40, 1, 8);
  header(m + 48, 3, 0, 0, 0, 0, 0, 1);
  two_socket_case(T, "goodbyes while a signal waits", m, 80, bye, 32, 0,
                  MEP_ERR_PROTOCOL);
  cmd(T, 'R');
  get_blobs(T);
}

static void attack(tester_t *T) {
  uint8_t b[4096];
  const uint8_t *S = T->secret;
  uint8_t wrong[32];
  memcpy(wrong, S, sizeof wrong);
  wrong[31] ^= 1;
  size_t n;

  n = hello(b, 0, 1, 0, 1, wrong, 32);
  reject_case(T, "wrong secret (last byte)", b, n, 3.0);
  wrong[31] ^= 1, wrong[0] ^= 0x80;
  n = hello(b, 0, 1, 0, 1, wrong, 32);
  reject_case(T, "wrong secret (first byte)", b, n, 3.0);
  n = hello(b, 0, 1, 0, 1, S, 31);
  reject_case(T, "secret one byte short", b, n, 3.0);
  n = hello(b, 0, 1, 0, 1, NULL, 0);
  reject_case(T, "no secret", b, n, 3.0);
  tt_fill(b, tt_seed(), 0, 300);
  reject_case(T, "garbage handshake", b, 300, 3.0);
  memcpy(b, "GET / HTTP/1.0\r\n\r\n", 18);
  reject_case(T, "an HTTP request", b, 18, 3.0);
  n = hello(b, 1, 1, 0, 1, S, 32);
  reject_case(T, "hello from itself", b, n, 3.0);
  n = hello(b, 2, 1, 0, 1, S, 32);
  reject_case(T, "hello from outside the group", b, n, 3.0);
  n = hello(b, 0, 0, 0, 1, S, 32);
  reject_case(T, "hello to another rank", b, n, 3.0);
  n = hello(b, 0, 1, 1, 1, S, 32);
  reject_case(T, "socket index out of range", b, n, 3.0);
  n = hello(b, 0, 1, 0, 2, S, 32);
  reject_case(T, "wrong sockets_per_peer", b, n, 3.0);
  uint64_t host_inc = g_to_inc;
  g_to_inc = host_inc ^ 0x100;
  n = hello(b, 0, 1, 0, 1, S, 32);
  reject_case(T, "hello to another incarnation (stale address)", b, n, 3.0);
  g_to_inc = host_inc;
  n = hello(b, 0, 1, 0, 1, S, 32);
  le(b + 24, 0, 8);
  reject_case(T, "hello from incarnation 0", b, n, 3.0);
  n = hello(b, 0, 1, 0, 1, S, 32);
  le(b + 4, 1, 2);
  reject_case(T, "hello of protocol version 1", b, n, 3.0);
  n = hello(b, 0, 1, 0, 1, S, 32);
  double t0 = tt_now();
  reject_case(T, "stalled hello", b, n - 5, 3.0 + HOST_TIMEOUT_MS / 1e3);
  reject_case(T, "silent client", b, 0, 3.0 + HOST_TIMEOUT_MS / 1e3);
  TT_CHECK(tt_now() - t0 > 2 * HOST_TIMEOUT_MS / 1e3 * 0.9,
           "stalled clients dropped before their deadline");

  uint8_t m[32 + 4096 + 32];
  memset(m, 0xAB, sizeof m);
  uint32_t R = T->region;
  header(m, 1, 0, 0, R, REGION_LEN - 100, 4096, 0);
  bad_message(T, "write past the region end", m, 32 + 4096, MEP_ERR_BOUNDS);
  header(m, 1, 0, 0, R, REGION_LEN - 99, 100, 0);
  bad_message(T, "write one byte past the end", m, 32 + 100, MEP_ERR_BOUNDS);
  header(m, 1, 0, 0, R, 16, UINT64_MAX - 15, 0);
  bad_message(T, "write whose end wraps", m, 32 + 4096, MEP_ERR_BOUNDS);
  header(m, 1, 0, 0, R + 7, 0, 64, 0);
  bad_message(T, "write to an unknown region", m, 32 + 64, MEP_ERR_BOUNDS);
  header(m, 9, 0, 0, R, 0, 64, 0);
  bad_message(T, "unknown message type", m, 32 + 64, MEP_ERR_PROTOCOL);
  header(m, 1, 0, 0, R, 0, 64, 5);
  bad_message(T, "wrong sequence number", m, 32 + 64, MEP_ERR_PROTOCOL);
  header(m, 2, 0, 1, R, 12, 77, 0);
  le(m + 32, 0, 8);
  bad_message(T, "unaligned signal", m, 40, MEP_ERR_PROTOCOL);
  header(m, 2, 0, 1, R, REGION_LEN - 3, 77, 0);
  le(m + 32, 0, 8);
  bad_message(T, "signal past the end", m, 40, MEP_ERR_BOUNDS);
  header(m, 2, 0, 1, R, 8, 77, 0);
  le(m + 32, 3, 8);
  bad_message(T, "signal with a wrong count", m, 40, MEP_ERR_PROTOCOL);
  goodbyes(T);
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : tt_seed();
  printf("seed %#" PRIx64 "\n", seed);
  tester_t T = {0};
  tt_fill(T.secret, seed, 0, sizeof T.secret);
  int sv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv), "socketpair");
  fflush(stdout);
  pid_t pid = fork();
  TT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    close(sv[0]);
    alarm(150);
    host_main(sv[1], T.secret);
  }
  close(sv[1]);
  alarm(170);
  T.cfd = sv[0];
  get_blobs(&T);
  attack(&T);
  uint8_t s2[16];
  tt_fill(s2, seed + 1, 0, sizeof s2);
  cmd(&T, 'N');
  tt_send(T.cfd, s2, sizeof s2);
  good_exchange(0, T.cfd, s2);
  printf("ok: a well-behaved pair still works\n");
  cmd(&T, 'Q');
  int st = tt_reap(pid, 10000);
  TT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "the host failed (status %#x)", st);
  close(T.cfd);
  printf("all attack checks passed\n");
  return 0;
}
