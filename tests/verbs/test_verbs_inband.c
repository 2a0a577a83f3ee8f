/*
 * test_verbs_inband - signals that ride in the immediate of a put's own
 * WRITE (or of a WRITE of no bytes, or a message) and that the receiver's
 * poll() applies: [verbs] fuse_signals, plugins/verbs/inband.c. Needs an
 * RDMA device: run-vm.sh runs it in the VM.
 *
 * Each phase forks a sender (rank 0) and a receiver (rank 1) that drive
 * the plugin through its ABI, as the core does, and talk over a socket
 * pair to step together:
 *  - sizes: puts of 1, 7, 8, 255, 256, 257 (around max_inline), 4095,
 *    65537 and 1 MiB + 3 bytes at odd offsets, each with a SET and an ADD
 *    signal; every byte compared and 4 KiB of guard bytes on each side
 *    untouched. First, the in-band path is shown in use: the put's bytes
 *    land without the receiver calling anything, its signal only once it
 *    polls. Then SET values an immediate cannot carry (a jump of 2^30, a
 *    smaller value) and a large ADD, which go as messages;
 *  - words: 300 signal words, more than get an index (256), twice;
 *  - striped: four queue pairs striping writes of 4 KiB and more: a large
 *    write, then a small put and its signal, eight times: the large
 *    write's bytes are there when the signal is;
 *  - off: with fuse_signals = off the signal lands without the receiver's
 *    poll();
 *  - bounds: the receiver deregisters the region of a signal word that
 *    has an index; the sender's next put+signal to it (immediate), or a
 *    SET it sends as a message, is reported by the receiver as
 *    MEP_ERR_BOUNDS naming the sender, the word untouched, and the sender
 *    learns that the receiver dropped it;
 *  - bounds-put: the receiver deregisters the put's region: the sender's
 *    device refuses the fused WRITE, the sender reports MEP_ERR_BOUNDS
 *    naming the receiver, and the signal is not applied.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "vpair.h"
#include <mep/transport.h>

#define DATA (4u << 20) /* the put regions */
#define GUARD 4096u
#define CTL 4096u /* signal words */
#define W_SET 0   /* word offsets in CTL */
#define W_ADD 8
#define W_BIG 16


typedef struct side {
  const mep_transport_t *vt;
  mep_plugin_t *p;
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx;
  mep_tp_ep_t *ep;
  mep_tp_mr_t *mr_src, *mr_dst, *mr_ctl;
  mep_tp_rmr_t *r_dst, *r_ctl;
  uint8_t *src, *dst;
  volatile uint64_t *ctl;
  int sock, rank;
  uint64_t token;
  int nfail, fail_status, fail_peer, tokens_bad;
} side_t;

/* Polls; failures are recorded (a phase that expects none checks). */
static void poll_tp(side_t *s, int n) {
  mep_tp_completion_t c[32];
  for (int i = 0; i < n; i++) {
    int got = s->vt->poll(s->ctx, c, 32);
    CHECK(got >= 0, "poll: %d", got);
    for (int j = 0; j < got; j++) {
      if (c[j].status == 0) continue;
      if (c[j].token != MEP_TP_TOKEN_NONE) {
        s->tokens_bad++;
        continue;
      }
      if (!s->nfail++) {
        s->fail_status = c[j].status;
        s->fail_peer = c[j].peer;
      }
    }
  }
}

static void no_failures(side_t *s, const char *when) {
  CHECK(s->nfail == 0 && s->tokens_bad == 0, "rank %d: %s: %d failure "
        "reports (first: status %d naming rank %d), %d failed writes",
        s->rank, when, s->nfail, s->fail_status, s->fail_peer,
        s->tokens_bad);
}

static void send_byte(side_t *s, uint8_t b) { vpair_send_byte(s->sock, b); }

/* A byte from the peer, polling the plugin meanwhile. */
static void idle_poll(void *s) { poll_tp(s, 20); }
static uint8_t recv_byte(side_t *s) {
  return vpair_recv_byte(s->sock, s->rank, 60000, idle_poll, s);
}

/* Waits, polling, until the word reaches `want`; returns it. */
static uint64_t wait_word(side_t *s, size_t off, uint64_t want,
                          const char *what) {
  volatile uint64_t *w = &s->ctl[off / 8];
  int64_t end = vpair_now_ms() + 30000;
  while (*w < want) {
    CHECK(vpair_now_ms() < end, "rank %d: %s: the word reads %llu, want %llu",
          s->rank, what, (unsigned long long)*w, (unsigned long long)want);
    poll_tp(s, 1);
  }
  return __atomic_load_n(w, __ATOMIC_ACQUIRE);
}

static void xchg(side_t *s, const void *mine, void *theirs, size_t len) {
  vpair_xchg(s->sock, mine, theirs, len);
}

static void *alloc(size_t len) {
  void *p = NULL;
  CHECK(posix_memalign(&p, 4096, len) == 0, "out of memory");
  memset(p, 0, len);
  return p;
}

static mep_tp_mr_t *reg_share(side_t *s, void *p, size_t len,
                              mep_tp_rmr_t **theirs) {
  mep_tp_mr_t *mr;
  uint8_t rk[MEP_TP_MAX_RKEY], prk[MEP_TP_MAX_RKEY];
  size_t rlen = sizeof rk;
  CHECK_OK(s->vt->reg(s->ctx, p, len, MEP_MEM_HOST, &mr, rk, &rlen));
  if (theirs) {
    xchg(s, rk, prk, rlen);
    CHECK_OK(s->vt->import(s->ep, prk, rlen, theirs));
  }
  return mr;
}

static void setup(side_t *s) {
  CHECK_OK(mep_plugin_find("verbs", &s->p));
  CHECK_OK(mep_plugin_env_open(&s->env, NULL, s->p));
  s->env.rank = s->rank;
  s->env.size = 2;
  s->env.secret = vpair_secret;
  s->env.secret_len = sizeof vpair_secret;
  s->env.timeout_ms = 20000;
  s->vt = mep_plugin_vtable(s->p);
  CHECK_OK(s->vt->init(&s->env, &s->ctx));
  uint8_t a[MEP_TP_MAX_ADDR], b[MEP_TP_MAX_ADDR];
  size_t len = sizeof a;
  CHECK_OK(s->vt->address(s->ctx, a, &len));
  xchg(s, a, b, len);
  CHECK_OK(s->vt->connect(s->ctx, !s->rank, b, len, &s->ep));
  s->src = alloc(DATA);
  s->dst = alloc(DATA + 2 * GUARD);
  s->ctl = alloc(CTL);
  s->mr_src = reg_share(s, s->src, DATA, NULL);
  s->mr_dst = reg_share(s, s->dst, DATA + 2 * GUARD, &s->r_dst);
  s->mr_ctl = reg_share(s, (void *)s->ctl, CTL, &s->r_ctl);
  fill_random(s->dst, DATA + 2 * GUARD, 0xb9 + (uint64_t)s->rank);
}

/* Both done before either closes; a phase that dropped the connection
 * skips the goodbye (close and fini must still work). */
static void teardown(side_t *s, int broken) {
  if (!broken) {
    send_byte(s, 'e');
    CHECK(recv_byte(s) == 'e', "expected the end");
    poll_tp(s, 100);
  }
  CHECK_OK(s->vt->unimport(s->ep, s->r_dst));
  CHECK_OK(s->vt->unimport(s->ep, s->r_ctl));
  CHECK_OK(s->vt->close(s->ep));
  if (s->mr_ctl) CHECK_OK(s->vt->dereg(s->ctx, s->mr_ctl));
  if (s->mr_dst) CHECK_OK(s->vt->dereg(s->ctx, s->mr_dst));
  CHECK_OK(s->vt->dereg(s->ctx, s->mr_src));
  CHECK_OK(s->vt->fini(s->ctx));
  mep_plugin_env_fini(&s->env);
  mep_plugin_close(s->p);
}

static void put(side_t *s, uint64_t loff, uint64_t roff, uint64_t len) {
  CHECK_OK(s->vt->write(s->ep, s->mr_src, loff, s->r_dst, GUARD + roff, len,
                        s->token++));
}

static void signal_to(side_t *s, uint64_t off, uint64_t v,
                      mep_signal_op_t op) {
  CHECK_OK(s->vt->signal(s->ep, s->r_ctl, off, v, op));
}

/* The receive region: the put's bytes at roff, the background elsewhere
 * (4 KiB around it), then the background put back. */
static void expect_put(side_t *s, uint64_t roff, uint64_t len, uint64_t seed,
                       const char *what) {
  uint64_t bg = 0xb9 + (uint64_t)s->rank;
  uint8_t *at = s->dst + GUARD + roff;
  long long d = diff_random(at, len, seed);
  CHECK(d < 0, "%s: byte %lld of %llu differs", what, d,
        (unsigned long long)len);
  uint8_t *copy = alloc(DATA + 2 * GUARD);
  fill_random(copy, DATA + 2 * GUARD, bg);
  uint64_t lo = GUARD + roff, hi = lo + len;
  uint64_t from = lo > GUARD ? lo - GUARD : 0;
  uint64_t to = hi + GUARD < DATA + 2 * GUARD ? hi + GUARD : DATA + 2 * GUARD;
  CHECK(memcmp(s->dst + from, copy + from, lo - from) == 0,
        "%s: a guard byte before the put changed", what);
  CHECK(memcmp(s->dst + hi, copy + hi, to - hi) == 0,
        "%s: a guard byte after the put changed", what);
  memcpy(at, copy + lo, len);
  free(copy);
}

/* ------------------------------------------------------------- sizes */

static const uint64_t sizes[] = {1, 7, 8, 255, 256, 257, 4095, 65537,
                                 (1u << 20) + 3};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static uint64_t odd(uint64_t i, uint64_t salt) {
  return 2 * ((i * 2654435761u + salt) % 2000) + 1;
}

static void sizes_sender(side_t *s) {
  /* the in-band path is in use: bytes land at once, the signal waits for
   * the receiver's poll() */
  fill_random(s->src + 1, 8, 0x51);
  put(s, 1, 3, 8);
  signal_to(s, W_SET, 1, MEP_SIGNAL_SET);
  poll_tp(s, 100);
  CHECK(recv_byte(s) == 'k', "expected the first check");
  for (uint64_t i = 0; i < NSIZES; i++) {
    uint64_t loff = odd(i, 5), roff = odd(i, 11);
    fill_random(s->src + loff, sizes[i], 100 + i);
    put(s, loff, roff, sizes[i]);
    signal_to(s, W_ADD, 3, MEP_SIGNAL_ADD);
    signal_to(s, W_SET, 2 + i, MEP_SIGNAL_SET);
    CHECK(recv_byte(s) == 'k', "expected an acknowledgement");
  }
  /* values no immediate carries: messages */
  uint64_t big = (1ull << 30) + 77;
  signal_to(s, W_SET, big, MEP_SIGNAL_SET);
  CHECK(recv_byte(s) == 'k', "expected an acknowledgement");
  signal_to(s, W_SET, 5, MEP_SIGNAL_SET); /* smaller: a message too */
  signal_to(s, W_BIG, 1ull << 40, MEP_SIGNAL_ADD);
  signal_to(s, W_BIG, 1, MEP_SIGNAL_ADD);
  signal_to(s, W_SET, 6, MEP_SIGNAL_SET); /* +1: an immediate again */
  CHECK(recv_byte(s) == 'k', "expected an acknowledgement");
  no_failures(s, "sizes");
}

static void sizes_receiver(side_t *s) {
  /* nobody polls here: the put's bytes land, the signal does not */
  int64_t end = vpair_now_ms() + 10000;
  while (diff_random(s->dst + GUARD + 3, 8, 0x51) >= 0)
    CHECK(vpair_now_ms() < end, "the put's bytes did not land without poll()");
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  CHECK(s->ctl[W_SET / 8] == 0, "the signal was applied without poll(): "
        "not carried in band");
  wait_word(s, W_SET, 1, "the first signal");
  expect_put(s, 3, 8, 0x51, "the first put");
  printf("PASS the put lands one-sidedly, its signal once poll() runs\n");
  send_byte(s, 'k');
  for (uint64_t i = 0; i < NSIZES; i++) {
    char what[80];
    snprintf(what, sizeof what, "a put of %llu bytes at offset %llu",
             (unsigned long long)sizes[i], (unsigned long long)odd(i, 11));
    CHECK(wait_word(s, W_SET, 2 + i, what) == 2 + i, "%s: SET", what);
    CHECK(s->ctl[W_ADD / 8] == 3 * (i + 1), "%s: the ADD word reads %llu",
          what, (unsigned long long)s->ctl[W_ADD / 8]);
    expect_put(s, odd(i, 11), sizes[i], 100 + i, what);
    send_byte(s, 'k');
  }
  uint64_t big = (1ull << 30) + 77;
  wait_word(s, W_SET, big, "a SET 2^30 above the last");
  send_byte(s, 'k');
  int64_t until = vpair_now_ms() + 30000;
  while (s->ctl[W_SET / 8] != 6) {
    CHECK(vpair_now_ms() < until, "the SETs after 2^30 (5, then 6): the word "
          "reads %llu", (unsigned long long)s->ctl[W_SET / 8]);
    poll_tp(s, 1);
  }
  CHECK(s->ctl[W_BIG / 8] == (1ull << 40) + 1, "a large ADD: %llu",
        (unsigned long long)s->ctl[W_BIG / 8]);
  send_byte(s, 'k');
  no_failures(s, "sizes");
  printf("PASS %zu sizes at odd offsets with SET and ADD, guards intact; "
         "values carried as messages\n", (size_t)NSIZES);
}

/* ------------------------------------------------------------- words */

#define NWORDS 300

static void words_sender(side_t *s) {
  for (uint64_t round = 1; round <= 2; round++) {
    for (uint64_t w = 0; w < NWORDS; w++)
      signal_to(s, 8 * (w + 100), round * 1000 + w, MEP_SIGNAL_SET);
    CHECK(recv_byte(s) == 'k', "expected an acknowledgement");
  }
  no_failures(s, "words");
}

static void words_receiver(side_t *s) {
  for (uint64_t round = 1; round <= 2; round++) {
    wait_word(s, 8 * (NWORDS - 1 + 100), round * 1000 + NWORDS - 1,
              "the last word");
    for (uint64_t w = 0; w < NWORDS; w++)
      CHECK(s->ctl[w + 100] == round * 1000 + w, "round %llu: word %llu "
            "reads %llu", (unsigned long long)round, (unsigned long long)w,
            (unsigned long long)s->ctl[w + 100]);
    send_byte(s, 'k');
  }
  no_failures(s, "words");
  printf("PASS %d signal words, more than get an index, twice\n", NWORDS);
}

/* ----------------------------------------------------------- striped */

#define ROUNDS 8
#define LARGE (3u << 20)

static void striped_sender(side_t *s) {
  for (uint64_t k = 1; k <= ROUNDS; k++) {
    fill_random(s->src + 1, LARGE + k, 0x700 + k);
    put(s, 1, 1 + k, LARGE + k);
    fill_random(s->src + LARGE + 4096, 7, 0x800 + k);
    put(s, LARGE + 4096, LARGE + 8192 + k, 7);
    if (k % 2)
      signal_to(s, W_SET, k, MEP_SIGNAL_SET);
    else
      signal_to(s, W_ADD, 1, MEP_SIGNAL_ADD);
    CHECK(recv_byte(s) == 'k', "expected an acknowledgement");
  }
  no_failures(s, "striped");
}

static void striped_receiver(side_t *s) {
  for (uint64_t k = 1; k <= ROUNDS; k++) {
    if (k % 2)
      wait_word(s, W_SET, k, "the signal after a striped write");
    else
      wait_word(s, W_ADD, k / 2, "the ADD after a striped write");
    /* at once, before anything else is polled */
    char what[96];
    snprintf(what, sizeof what, "round %llu: the striped write of %u bytes",
             (unsigned long long)k, LARGE + (unsigned)k);
    long long d = diff_random(s->dst + GUARD + 1 + k, LARGE + k, 0x700 + k);
    CHECK(d < 0, "%s: byte %lld not there when the signal was", what, d);
    d = diff_random(s->dst + GUARD + LARGE + 8192 + k, 7, 0x800 + k);
    CHECK(d < 0, "round %llu: the small put's byte %lld", (unsigned long long)k,
          d);
    expect_put(s, 1 + k, LARGE + k, 0x700 + k, what);
    expect_put(s, LARGE + 8192 + k, 7, 0x800 + k, "the small put");
    send_byte(s, 'k');
  }
  no_failures(s, "striped");
  printf("PASS %d rounds: a striped write's bytes are there when the "
         "signal after it is\n", ROUNDS);
}

/* --------------------------------------------------------------- off */

static void off_sender(side_t *s) {
  fill_random(s->src + 1, 8, 0x52);
  put(s, 1, 5, 8);
  signal_to(s, W_SET, 9, MEP_SIGNAL_SET);
  poll_tp(s, 100);
  CHECK(recv_byte(s) == 'k', "expected an acknowledgement");
  no_failures(s, "off");
}

static void off_receiver(side_t *s) {
  int64_t end = vpair_now_ms() + 10000;
  while (s->ctl[W_SET / 8] != 9)
    CHECK(vpair_now_ms() < end, "fuse_signals = off: the signal did not land "
          "without poll()");
  expect_put(s, 5, 8, 0x52, "the put before it");
  send_byte(s, 'k');
  printf("PASS fuse_signals = off: the signal lands without poll()\n");
}

/* ------------------------------------------------------------ bounds */

/* mode 0: the signal rides in an immediate; 1: it is a message */
static void bounds_sender(side_t *s, int mode) {
  signal_to(s, W_SET, 1, MEP_SIGNAL_SET); /* gives the word an index */
  CHECK(recv_byte(s) == 'd', "expected the receiver's dereg");
  fill_random(s->src + 1, 8, 0x53);
  put(s, 1, 1, 8);
  signal_to(s, W_SET, mode ? 1ull << 40 : 2, MEP_SIGNAL_SET);
  int64_t end = vpair_now_ms() + 10000;
  while (!s->nfail) {
    CHECK(vpair_now_ms() < end, "the receiver's refusal was not noticed");
    poll_tp(s, 1);
  }
  CHECK(s->fail_peer == 1, "a failure naming rank %d", s->fail_peer);
  printf("PASS the sender learns: status %d (%s)\n", s->fail_status,
         mep_strerror(s->fail_status));
}

static void bounds_receiver(side_t *s, int mode) {
  wait_word(s, W_SET, 1, "the signal that defines the word");
  CHECK_OK(s->vt->dereg(s->ctx, s->mr_ctl));
  s->mr_ctl = NULL;
  send_byte(s, 'd');
  int64_t end = vpair_now_ms() + 10000;
  while (!s->nfail) {
    CHECK(vpair_now_ms() < end, "a signal to a deregistered region was not "
          "reported");
    poll_tp(s, 1);
  }
  CHECK(s->fail_status == MEP_ERR_BOUNDS && s->fail_peer == 0,
        "the report: status %d naming rank %d, want MEP_ERR_BOUNDS naming "
        "rank 0", s->fail_status, s->fail_peer);
  CHECK(s->ctl[W_SET / 8] == 1, "the deregistered word changed to %llu",
        (unsigned long long)s->ctl[W_SET / 8]);
  printf("PASS a signal %s to a deregistered region: MEP_ERR_BOUNDS naming "
         "the sender, the word untouched\n",
         mode ? "as a message" : "in an immediate");
}

static void bounds_put_sender(side_t *s) {
  signal_to(s, W_SET, 1, MEP_SIGNAL_SET);
  CHECK(recv_byte(s) == 'd', "expected the receiver's dereg");
  fill_random(s->src + 1, 8, 0x54);
  put(s, 1, 1, 8);
  signal_to(s, W_SET, 2, MEP_SIGNAL_SET);
  int64_t end = vpair_now_ms() + 10000;
  while (!s->nfail) {
    CHECK(vpair_now_ms() < end, "the refused put was not reported");
    poll_tp(s, 1);
  }
  CHECK(s->fail_status == MEP_ERR_BOUNDS && s->fail_peer == 1,
        "the report: status %d naming rank %d, want MEP_ERR_BOUNDS naming "
        "rank 1", s->fail_status, s->fail_peer);
  send_byte(s, 'f');
  printf("PASS a put+signal to a deregistered region: the sender reports "
         "MEP_ERR_BOUNDS naming the receiver\n");
}

static void bounds_put_receiver(side_t *s) {
  wait_word(s, W_SET, 1, "the signal before dereg");
  CHECK_OK(s->vt->dereg(s->ctx, s->mr_dst));
  s->mr_dst = NULL;
  send_byte(s, 'd');
  struct pollfd p = {.fd = s->sock, .events = POLLIN};
  int64_t end = vpair_now_ms() + 20000;
  while (poll(&p, 1, 0) == 0) {
    CHECK(vpair_now_ms() < end, "no word from the sender");
    poll_tp(s, 10);
  }
  poll_tp(s, 200);
  CHECK(s->ctl[W_SET / 8] == 1, "the signal after the refused put was "
        "applied (%llu)", (unsigned long long)s->ctl[W_SET / 8]);
}

/* ------------------------------------------------------------ phases */

enum { P_SIZES, P_WORDS, P_STRIPED, P_OFF, P_BOUNDS_IMM, P_BOUNDS_MSG,
       P_BOUNDS_PUT };

static int run(int phase, int rank, int sock) {
  side_t s = {.rank = rank, .sock = sock, .token = 1};
  setup(&s);
  int snd = rank == 0, broken = 0;
  switch (phase) {
  case P_SIZES: snd ? sizes_sender(&s) : sizes_receiver(&s); break;
  case P_WORDS: snd ? words_sender(&s) : words_receiver(&s); break;
  case P_STRIPED: snd ? striped_sender(&s) : striped_receiver(&s); break;
  case P_OFF: snd ? off_sender(&s) : off_receiver(&s); break;
  case P_BOUNDS_IMM:
  case P_BOUNDS_MSG:
    broken = 1;
    snd ? bounds_sender(&s, phase == P_BOUNDS_MSG)
        : bounds_receiver(&s, phase == P_BOUNDS_MSG);
    break;
  case P_BOUNDS_PUT:
    broken = 1;
    snd ? bounds_put_sender(&s) : bounds_put_receiver(&s);
    break;
  }
  teardown(&s, broken);
  return 0;
}

static void phase(int ph, const char *name, const char *const *env) {
  for (const char *const *e = env; e && *e; e += 2) setenv(e[0], e[1], 1);
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  fflush(stdout);
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    pid[r] = fork();
    CHECK(pid[r] >= 0, "fork");
    if (pid[r] == 0) {
      close(sv[!r]);
      alarm(240);
      _exit(run(ph, r, sv[r]));
    }
  }
  close(sv[0]);
  close(sv[1]);
  for (int r = 0; r < 2; r++) {
    int st;
    CHECK(waitpid(pid[r], &st, 0) == pid[r], "waitpid");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "phase %s: rank %d failed (status %#x)", name, r, st);
  }
  for (const char *const *e = env; e && *e; e += 2) unsetenv(e[0]);
  printf("PASS phase %s\n", name);
}

int main(void) {
  int skip = vpair_skip();
  if (skip) return skip;
  static const char *const striped[] = {"MEP_VERBS_QPS_PER_PEER", "4",
                                        "MEP_VERBS_STRIPE_BYTES", "4096",
                                        NULL};
  static const char *const off[] = {"MEP_VERBS_FUSE_SIGNALS", "off", NULL};
  static const char *const noinline[] = {"MEP_VERBS_MAX_INLINE", "0", NULL};
  phase(P_SIZES, "sizes", NULL);
  phase(P_SIZES, "sizes (no inline data)", noinline);
  phase(P_WORDS, "words", NULL);
  phase(P_STRIPED, "striped", striped);
  phase(P_OFF, "off", off);
  phase(P_BOUNDS_IMM, "bounds (immediate)", NULL);
  phase(P_BOUNDS_MSG, "bounds (message)", NULL);
  phase(P_BOUNDS_PUT, "bounds (the put)", NULL);
  printf("PASS signals in band\n");
  return 0;
}
