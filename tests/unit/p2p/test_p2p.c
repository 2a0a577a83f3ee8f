/* Point-to-point send/recv between forked ranks, checked byte for byte
 * against data each side regenerates from a seed:
 *   all:     argument checks; self messages (send before and after the
 *            recv); ping-pong of 0, 1, 7, slot-1, slot, slot+1, ring+3 and
 *            5 MiB bytes and random sizes; tags received in another order
 *            than sent while the first one overflows the ring; 64 sends in
 *            flight per peer before (and after) the recvs; all pairs at
 *            once; buffers too small (MEP_ERR_INVALID naming both sizes,
 *            the message consumed); empty messages with NULL buffers.
 *   timeout: a recv nobody sends to fails with MEP_ERR_TIMEOUT at the
 *            communicator's deadline, naming peer and tag.
 *   fail:    rank 1 leaves; rank 0's pending and new requests to it fail
 *            with MEP_ERR_PEER_FAILED.
 * usage: test_p2p NRANKS BUFFER_BYTES|0 [all|timeout|fail] [SEED] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "launch.h"

#define WAIT_MS 120000
#define BIG ((size_t)5 << 20)
#define GUARD 16

static uint64_t run_seed;
static size_t slot, payload, ring; /* reference geometry */

static uint64_t seed_of(int src, int dst, int phase, int k) {
  uint64_t s = run_seed ^ ((uint64_t)(unsigned)src << 44) ^
               ((uint64_t)(unsigned)dst << 24) ^
               ((uint64_t)(unsigned)phase << 16) ^ (uint64_t)(unsigned)k;
  return splitmix64(&s);
}

/* The documented rule (docs and p2p.h), computed here independently. */
static void reference_geometry(size_t buffer, int size) {
  size_t chunk = (size_t)1 << 20, share = buffer / (size_t)(size - 1);
  slot = chunk < share / 2 ? chunk : share / 2;
  slot -= slot % 64;
  if (slot < 4096) slot = 4096;
  size_t n = share / slot < 2 ? 2 : share / slot;
  ring = n * slot;
  payload = slot - 64;
}

/* A message buffer with guard bytes after the capacity. */
typedef struct {
  uint8_t *p;
  size_t cap, want;
  mep_req_t *req;
} msg_t;

static void msg_alloc(msg_t *m, size_t cap, size_t want) {
  m->p = malloc(cap + GUARD);
  CHECK(m->p, "out of memory for %zu bytes", cap);
  memset(m->p, 0xEE, cap + GUARD);
  m->cap = cap;
  m->want = want;
  m->req = NULL;
}

static void send_msg(mep_comm_t *comm, msg_t *m, size_t len, int peer,
                     int tag, uint64_t seed) {
  msg_alloc(m, len, len);
  fill_random(m->p, len, seed);
  CHECK_OK(mep_send(comm, m->p, len, peer, tag, &m->req));
}

static void recv_msg(mep_comm_t *comm, msg_t *m, size_t cap, size_t want,
                     int peer, int tag) {
  msg_alloc(m, cap, want);
  CHECK_OK(mep_recv(comm, m->p, cap, peer, tag, &m->req));
}

static void wait_send(msg_t *m) {
  CHECK_OK(mep_req_wait(m->req, WAIT_MS));
  mep_req_free(m->req);
  free(m->p);
}

/* Waits for a recv and checks length, content and the guard. */
static void check_recv(msg_t *m, uint64_t seed, const char *what) {
  CHECK_OK(mep_req_wait(m->req, WAIT_MS));
  size_t got = mep_req_bytes(m->req);
  CHECK(got == m->want, "%s: received %zu bytes, want %zu", what, got,
        m->want);
  long long bad = diff_random(m->p, m->want, seed);
  CHECK(bad < 0, "%s: byte %lld of %zu differs", what, bad, m->want);
  for (size_t i = m->want; i < m->cap + GUARD; i++)
    CHECK(m->p[i] == 0xEE, "%s: byte %zu after the message was written",
          what, i);
  mep_req_free(m->req);
  free(m->p);
}

/* ---------------------------------------------------------------- phases */

static void test_args(mep_comm_t *comm) {
  int n = mep_comm_size(comm);
  char b[4];
  mep_req_t *r = NULL;
  CHECK_RC(mep_send(comm, b, 4, n, 0, &r), MEP_ERR_INVALID);
  CHECK_MSG("peer");
  CHECK_RC(mep_recv(comm, b, 4, -2, 0, &r), MEP_ERR_INVALID);
  CHECK_RC(mep_send(comm, b, 4, 0, -3, &r), MEP_ERR_INVALID);
  CHECK_MSG("tag");
  CHECK_RC(mep_recv(comm, NULL, 4, 0, 0, &r), MEP_ERR_INVALID);
  CHECK_RC(mep_send(NULL, b, 4, 0, 0, &r), MEP_ERR_INVALID);
  CHECK(r == NULL, "a failed call handed out a request");
}

static void test_self(mep_comm_t *comm) {
  int me = mep_comm_rank(comm);
  msg_t s, r;
  size_t sizes[] = {0, 1, 4099, payload + 1, (size_t)3 << 20};
  for (int k = 0; k < 5; k++) { /* send first, then recv */
    send_msg(comm, &s, sizes[k], me, 1, seed_of(me, me, 1, k));
    wait_send(&s);
    recv_msg(comm, &r, sizes[k] + 5, sizes[k], me, 1);
    check_recv(&r, seed_of(me, me, 1, k), "self, send first");
  }
  for (int k = 0; k < 5; k++) { /* recv first */
    recv_msg(comm, &r, sizes[k], sizes[k], me, 2);
    send_msg(comm, &s, sizes[k], me, 2, seed_of(me, me, 2, k));
    wait_send(&s);
    check_recv(&r, seed_of(me, me, 2, k), "self, recv first");
  }
  /* Blocking calls (no request). */
  uint8_t out[33], in[40];
  fill_random(out, sizeof out, 7);
  CHECK_OK(mep_send(comm, out, sizeof out, me, 3, NULL));
  CHECK_OK(mep_recv(comm, in, sizeof in, me, 3, NULL));
  CHECK(memcmp(in, out, sizeof out) == 0, "blocking self message differs");
  /* A recv released before its message: it finishes in the background. */
  static uint8_t detached[64];
  mep_req_t *d;
  CHECK_OK(mep_recv(comm, detached, sizeof detached, me, 4, &d));
  mep_req_free(d);
  CHECK_OK(mep_send(comm, out, sizeof out, me, 4, NULL));
}

/* Round r pairs each rank with rank ^ r: every pair meets once. */
static int partner(int me, int r, int n) {
  int p = me ^ r;
  return p < n ? p : -1;
}

static void test_pingpong(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  size_t sizes[16] = {0, 1, 7, payload - 1, payload, payload + 1, slot,
                      ring + 3, BIG};
  int ns = 9;
  uint64_t shared = run_seed; /* every rank draws the same sizes */
  while (ns < 14) sizes[ns++] = splitmix64(&shared) % (2 * ring + 1000);
  for (int r = 1; r < 2 * n; r++) {
    int p = partner(me, r, n);
    if (p < 0) continue;
    for (int k = 0; k < ns; k++) {
      msg_t m;
      char what[96];
      snprintf(what, sizeof what, "ping-pong %zu bytes from rank %d",
               sizes[k], p);
      if (me < p) {
        send_msg(comm, &m, sizes[k], p, 10, seed_of(me, p, 10, k));
        wait_send(&m);
        recv_msg(comm, &m, sizes[k] + 3, sizes[k], p, 10);
        check_recv(&m, seed_of(p, me, 10, k), what);
      } else {
        recv_msg(comm, &m, sizes[k], sizes[k], p, 10);
        check_recv(&m, seed_of(p, me, 10, k), what);
        send_msg(comm, &m, sizes[k], p, 10, seed_of(me, p, 10, k));
        wait_send(&m);
      }
    }
  }
}

/* Tag 1 is sent first and overflows the ring; the receiver waits for tag
 * 2 before it even posts tag 1, so tag 1 must not block the ring. */
static void test_tag_order(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  size_t big = ring + 3 < BIG ? ring + 3 : BIG;
  msg_t *s = calloc(2 * (size_t)n, sizeof *s);
  CHECK(s, "out of memory");
  for (int p = 0; p < n; p++) {
    send_msg(comm, &s[2 * p], big, p, 21, seed_of(me, p, 21, 0));
    send_msg(comm, &s[2 * p + 1], 5, p, 22, seed_of(me, p, 22, 0));
  }
  for (int p = 0; p < n; p++) {
    msg_t r;
    recv_msg(comm, &r, 5, 5, p, 22);
    check_recv(&r, seed_of(p, me, 22, 0), "tag 22, posted first");
    recv_msg(comm, &r, big, big, p, 21);
    check_recv(&r, seed_of(p, me, 21, 0), "tag 21, sent first");
  }
  for (int i = 0; i < 2 * n; i++) wait_send(&s[i]);
  free(s);
}

/* Message k from src to dst: mostly small, some empty, some beyond a
 * slot. */
static size_t many_size(int src, int dst, int phase, int k) {
  uint64_t v = seed_of(src, dst, phase, k + 1000);
  switch (v % 8) {
  case 0: return 0;
  case 1: return payload + 1;
  default: return (size_t)(v >> 8) % 70001;
  }
}

#define MANY 64

/* 64 messages per peer in flight; recvs posted after (phase 30) or before
 * (phase 31) the sends; they must arrive in order. */
static void test_many(mep_comm_t *comm, int phase) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  msg_t *s = calloc((size_t)n * MANY, sizeof *s);
  msg_t *r = calloc((size_t)n * MANY, sizeof *r);
  CHECK(s && r, "out of memory");
  for (int pass = 0; pass < 2; pass++) {
    int recv_pass = phase == 30 ? 1 : 0;
    for (int p = 0; p < n; p++)
      for (int k = 0; k < MANY; k++) {
        msg_t *m = &(pass == recv_pass ? r : s)[p * MANY + k];
        if (pass == recv_pass) {
          size_t want = many_size(p, me, phase, k);
          recv_msg(comm, m, want + (size_t)(k % 3), want, p, phase);
        } else {
          send_msg(comm, m, many_size(me, p, phase, k), p, phase,
                   seed_of(me, p, phase, k));
        }
      }
  }
  for (int p = 0; p < n; p++)
    for (int k = 0; k < MANY; k++) {
      char what[80];
      snprintf(what, sizeof what, "message %d of %d from rank %d", k, MANY,
               p);
      check_recv(&r[p * MANY + k], seed_of(p, me, phase, k), what);
    }
  for (int i = 0; i < n * MANY; i++) wait_send(&s[i]);
  free(s);
  free(r);
}

/* Every rank to every rank at once, sizes up to twice the ring. */
static void test_all_pairs(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  msg_t *s = calloc((size_t)n, sizeof *s), *r = calloc((size_t)n, sizeof *r);
  CHECK(s && r, "out of memory");
  size_t cap = 2 * ring + 77 < ((size_t)6 << 20) ? 2 * ring + 77
                                                 : ((size_t)6 << 20);
  for (int it = 0; it < 3; it++) {
    int phase = 40 + it;
    for (int p = 0; p < n; p++) {
      size_t want = (size_t)(seed_of(p, me, phase, 7) % cap);
      recv_msg(comm, &r[p], want, want, p, phase);
    }
    for (int p = 0; p < n; p++)
      send_msg(comm, &s[p], (size_t)(seed_of(me, p, phase, 7) % cap), p,
               phase, seed_of(me, p, phase, 0));
    for (int p = 0; p < n; p++) {
      char what[64];
      snprintf(what, sizeof what, "all pairs, from rank %d", p);
      check_recv(&r[p], seed_of(p, me, phase, 0), what);
    }
    for (int p = 0; p < n; p++) wait_send(&s[p]);
  }
  free(s);
  free(r);
}

/* Too small: 100 bytes into 50, ring+3 into 64 (streamed and dropped),
 * then 77 bytes on the same tag arrive intact. */
static void test_too_small(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  size_t big = ring + 3 < BIG ? ring + 3 : BIG;
  size_t len[3] = {100, big, 77}, cap[3] = {50, 64, 77};
  msg_t *s = calloc(3 * (size_t)n, sizeof *s);
  CHECK(s, "out of memory");
  for (int p = 0; p < n; p++)
    for (int k = 0; k < 3; k++)
      send_msg(comm, &s[3 * p + k], len[k], p, 50, seed_of(me, p, 50, k));
  for (int p = 0; p < n; p++) {
    for (int k = 0; k < 2; k++) {
      msg_t r;
      recv_msg(comm, &r, cap[k], 0, p, 50);
      CHECK_RC(mep_req_wait(r.req, WAIT_MS), MEP_ERR_INVALID);
      char num[32];
      snprintf(num, sizeof num, "%zu", len[k]);
      CHECK_MSG(num);
      snprintf(num, sizeof num, "%zu", cap[k]);
      CHECK_MSG(num);
      CHECK(mep_req_status(r.req) == MEP_ERR_INVALID, "status");
      CHECK(mep_req_bytes(r.req) == 0, "bytes of a failed recv");
      mep_req_free(r.req);
      free(r.p);
    }
    msg_t r;
    recv_msg(comm, &r, cap[2], len[2], p, 50);
    check_recv(&r, seed_of(p, me, 50, 2), "the message after two too big");
  }
  for (int i = 0; i < 3 * n; i++) wait_send(&s[i]);
  free(s);
}

static void test_empty(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  mep_req_t **rq = calloc(2 * (size_t)n, sizeof *rq);
  CHECK(rq, "out of memory");
  for (int p = 0; p < n; p++) {
    CHECK_OK(mep_recv(comm, NULL, 0, p, 60, &rq[2 * p]));
    CHECK_OK(mep_send(comm, NULL, 0, p, 60, &rq[2 * p + 1]));
  }
  for (int i = 0; i < 2 * n; i++) {
    CHECK_OK(mep_req_wait(rq[i], WAIT_MS));
    CHECK(mep_req_bytes(rq[i]) == 0, "empty message has bytes");
    mep_req_free(rq[i]);
  }
  free(rq);
  (void)me;
}

/* Everyone has received everything from everyone. */
static void barrier(mep_comm_t *comm, int tag) {
  int n = mep_comm_size(comm);
  for (int p = 0; p < n; p++) CHECK_OK(mep_send(comm, NULL, 0, p, tag, NULL));
  for (int p = 0; p < n; p++) CHECK_OK(mep_recv(comm, NULL, 0, p, tag, NULL));
}

static int body_all(mep_comm_t *comm) {
  test_args(comm);
  test_self(comm);
  test_pingpong(comm);
  test_tag_order(comm);
  test_many(comm, 30);
  test_many(comm, 31);
  test_all_pairs(comm);
  test_too_small(comm);
  test_empty(comm);
  barrier(comm, 70);
  return 0;
}

/* ---------------------------------------------------- timeout and fail */

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define SHORT_TIMEOUT_MS 1500

/* Retries a recv past the short communicator deadline. */
static void patient_recv(mep_comm_t *comm, int peer, int tag) {
  for (int i = 0; i < 40; i++) {
    mep_req_t *r;
    CHECK_OK(mep_recv(comm, NULL, 0, peer, tag, &r));
    int rc = mep_req_wait(r, WAIT_MS); /* the request's deadline ends it */
    mep_req_free(r);
    if (rc == MEP_OK) return;
    CHECK(rc == MEP_ERR_TIMEOUT, "recv: %s", mep_last_error());
  }
  CHECK(0, "rank %d never sent tag %d", peer, tag);
}

static int body_timeout(mep_comm_t *comm) {
  int me = mep_comm_rank(comm);
  if (me == 0) {
    mep_req_t *r;
    char b[8];
    long long t0 = now_ms();
    CHECK_OK(mep_recv(comm, b, sizeof b, 1, 99, &r));
    CHECK_RC(mep_req_wait(r, WAIT_MS), MEP_ERR_TIMEOUT);
    long long dt = now_ms() - t0;
    CHECK_MSG("rank 1");
    CHECK_MSG("tag 99");
    CHECK(dt >= SHORT_TIMEOUT_MS - 20 && dt < SHORT_TIMEOUT_MS + 10000,
          "timed out after %lld ms, deadline %d", dt, SHORT_TIMEOUT_MS);
    mep_req_free(r);
    /* The pair still works afterwards. */
    CHECK_OK(mep_send(comm, NULL, 0, 1, 5, NULL));
  } else {
    patient_recv(comm, 0, 5);
  }
  return 0;
}

static int body_fail(mep_comm_t *comm) {
  int me = mep_comm_rank(comm);
  if (me == 1) { /* leaves once told; its communicator is destroyed */
    CHECK_OK(mep_recv(comm, NULL, 0, 0, 1, NULL));
    return 0;
  }
  mep_req_t *pending;
  char b[16];
  CHECK_OK(mep_recv(comm, b, sizeof b, 1, 2, &pending));
  long long t0 = now_ms();
  CHECK_OK(mep_send(comm, NULL, 0, 1, 1, NULL));
  CHECK_RC(mep_req_wait(pending, WAIT_MS), MEP_ERR_PEER_FAILED);
  CHECK_MSG("rank 1");
  CHECK(now_ms() - t0 < SHORT_TIMEOUT_MS * 4, "failure seen only after %lld "
        "ms", now_ms() - t0);
  mep_req_free(pending);
  CHECK_RC(mep_send(comm, b, sizeof b, 1, 3, NULL), MEP_ERR_PEER_FAILED);
  CHECK_RC(mep_recv(comm, b, sizeof b, 1, 3, NULL), MEP_ERR_PEER_FAILED);
  /* The own rank is unaffected. */
  CHECK_OK(mep_send(comm, b, 3, 0, 3, NULL));
  CHECK_OK(mep_recv(comm, b, sizeof b, 0, 3, NULL));
  return 0;
}

static const char *mode = "all";

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store, (void)arg;
  int rc = strcmp(mode, "timeout") == 0 ? body_timeout(comm)
           : strcmp(mode, "fail") == 0  ? body_fail(comm)
                                        : body_all(comm);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NRANKS BUFFER_BYTES|0 [all|timeout|fail] "
            "[SEED]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  size_t buffer = (size_t)strtoull(argv[2], NULL, 0);
  if (argc > 3) mode = argv[3];
  run_seed = argc > 4 ? strtoull(argv[4], NULL, 0)
                      : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
  CHECK(n >= 2, "need at least 2 ranks");
  char v[32];
  if (buffer) {
    snprintf(v, sizeof v, "%zu", buffer);
    setenv("MEP_CORE_BUFFER_BYTES", v, 1);
  }
  unsetenv("MEP_CORE_CHUNK_BYTES"); /* the reference geometry assumes 1 MiB */
  if (strcmp(mode, "all") != 0) {
    snprintf(v, sizeof v, "%d", SHORT_TIMEOUT_MS);
    setenv("MEP_CORE_TIMEOUT_MS", v, 1);
  }
  reference_geometry(buffer ? buffer : (size_t)16 << 20, n);
  printf("%d ranks, mode %s, seed %llu, slot %zu, ring %zu\n", n, mode,
         (unsigned long long)run_seed, slot, ring);
  fflush(stdout);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 280000, .name = "p2p"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d rank(s) failed", failed);
  printf("ok\n");
  return 0;
}
