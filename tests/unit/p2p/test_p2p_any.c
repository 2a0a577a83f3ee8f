/* mep_recv from MEP_ANY_SOURCE between forked ranks, every message checked
 * against a reference each side computes from the run's seed:
 *   all:   every rank sends every other rank (and itself) messages on
 *          three interleaved tags, of sizes 0, 1, odd, around a slot and
 *          the ring and beyond it; each rank receives them all with
 *          any-source recvs, some posted before the sends, some after.
 *          mep_req_source names the sender; the k-th message a rank gets
 *          from (sender, tag) must be the k-th that sender sent on that tag
 *          (order per pair and tag), with its bytes and size; every message
 *          arrives exactly once. Then arrival order: two messages that
 *          arrived (unexpected) from two ranks are taken earliest first,
 *          whatever their ranks; and posting order: a message goes to the
 *          recv posted first among a specific-source and an any-source one.
 *   fail:  (4 ranks, short timeout) an any-source recv nobody sends to
 *          fails with MEP_ERR_TIMEOUT naming "any rank"; a sender that dies
 *          while its message streams in either delivered it whole or cut
 *          it off (MEP_ERR_PEER_FAILED naming it), or nothing arrived and
 *          the recv waits on; while one other rank lives, a waiting
 *          any-source recv stays posted and gets its message; once every
 *          other rank has failed, it fails with MEP_ERR_PEER_FAILED, and a
 *          new one too, except that the own rank's messages still match.
 * usage: test_p2p_any NRANKS BUFFER_BYTES|0 [all|fail] [SEED] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "launch.h"

#define WAIT_MS 120000
#define SHORT_TIMEOUT_MS 1500
#define NTAGS 3
#define PER_PAIR 20 /* messages from each rank to each rank */
#define BIG ((size_t)5 << 20)

static uint64_t run_seed;
static size_t slot, payload, ring; /* reference geometry */

static uint64_t seed_of(int src, int dst, int tag, int k) {
  uint64_t s = run_seed ^ ((uint64_t)(unsigned)src << 44) ^
               ((uint64_t)(unsigned)dst << 24) ^
               ((uint64_t)(unsigned)tag << 16) ^ (uint64_t)(unsigned)k;
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

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------- the plan */

/* Message k from src to dst: its tag and size, a pure function of the
 * seed, so the receiver knows what to expect without being told. */
static int msg_tag(int src, int dst, int k) {
  return (int)(seed_of(src, dst, 99, k) % NTAGS);
}

/* Messages stay below 3 rings, and 2 MiB with the large default rings,
 * so the receive buffers of a run fit in memory. */
static size_t max_size(void) {
  size_t cap = (size_t)2 << 20;
  return 3 * ring + 1 < cap ? 3 * ring + 1 : cap;
}

static size_t msg_size(int src, int dst, int k) {
  uint64_t v = seed_of(src, dst, 98, k);
  size_t around[] = {0, 1, 7, payload - 1, payload, payload + 1,
                     slot,      ring - 1, ring, ring + 3, 2 * ring + 1};
  size_t na = sizeof around / sizeof around[0], len;
  if (v % 3 == 0) len = around[(v >> 8) % na];
  else len = ((size_t)(v >> 8) % max_size()) | 1; /* odd */
  return len < max_size() ? len : max_size();
}

typedef struct {
  uint8_t *p;
  mep_req_t *req;
} rmsg_t;

/* --------------------------------------------------------------- all */

/* Checks a finished any-source recv against the plan: it must be the
 * next message of (sender, tag), whole. next[src * NTAGS + tag] counts
 * what was taken from each, and points into the sender's sequence. */
static void check_any(mep_comm_t *comm, rmsg_t *m, int tag, int *next,
                      int n, const char *what) {
  int me = mep_comm_rank(comm);
  CHECK_OK(mep_req_wait(m->req, WAIT_MS));
  int src = mep_req_source(m->req);
  CHECK(src >= 0 && src < n, "%s: source %d of a finished recv", what, src);
  /* The sender's k-th message on this tag: walk its sequence. */
  int seen = next[src * NTAGS + tag]++, k = 0, found = -1;
  for (; k < PER_PAIR; k++)
    if (msg_tag(src, me, k) == tag && seen-- == 0) {
      found = k;
      break;
    }
  CHECK(found >= 0, "%s: one message too many from rank %d on tag %d",
        what, src, tag);
  size_t want = msg_size(src, me, found), got = mep_req_bytes(m->req);
  CHECK(got == want, "%s: message %d from rank %d tag %d has %zu bytes, "
        "want %zu (out of order?)", what, found, src, tag, got, want);
  long long bad = diff_random(m->p, want, seed_of(src, me, tag, found));
  CHECK(bad < 0, "%s: message %d from rank %d tag %d: byte %lld of %zu "
        "differs", what, found, src, tag, bad, want);
  mep_req_free(m->req);
  free(m->p);
}

static void post_any(mep_comm_t *comm, rmsg_t *m, size_t cap, int tag) {
  m->p = malloc(cap ? cap : 1);
  CHECK(m->p, "out of memory");
  CHECK_OK(mep_recv(comm, m->p, cap, MEP_ANY_SOURCE, tag, &m->req));
}

static void test_mixed(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  int expect[NTAGS] = {0}; /* messages this rank gets per tag */
  for (int s = 0; s < n; s++)
    for (int k = 0; k < PER_PAIR; k++) expect[msg_tag(s, me, k)]++;
  int total = n * PER_PAIR;
  rmsg_t *r = calloc((size_t)total, sizeof *r);
  int *rtag = calloc((size_t)total, sizeof *rtag);
  mep_req_t **sreq = calloc((size_t)total, sizeof *sreq);
  uint8_t **sbuf = calloc((size_t)total, sizeof *sbuf);
  int *next = calloc((size_t)n * NTAGS, sizeof *next);
  CHECK(r && rtag && sreq && sbuf && next, "out of memory");
  /* Half the recvs of each tag before the sends, interleaving tags. */
  int nr = 0, posted[NTAGS] = {0};
  for (int i = 0; i < total; i++) {
    int tag = i % NTAGS;
    if (posted[tag] >= expect[tag] / 2) continue;
    rtag[nr] = tag;
    post_any(comm, &r[nr++], max_size(), tag);
    posted[tag]++;
  }
  for (int k = 0; k < PER_PAIR; k++)
    for (int d = 0; d < n; d++) {
      int i = k * n + d;
      size_t len = msg_size(me, d, k);
      int tag = msg_tag(me, d, k);
      sbuf[i] = malloc(len ? len : 1);
      CHECK(sbuf[i], "out of memory");
      fill_random(sbuf[i], len, seed_of(me, d, tag, k));
      CHECK_OK(mep_send(comm, sbuf[i], len, d, tag, &sreq[i]));
    }
  for (int tag = 0; tag < NTAGS; tag++)
    while (posted[tag] < expect[tag]) {
      rtag[nr] = tag;
      post_any(comm, &r[nr++], max_size(), tag);
      posted[tag]++;
    }
  CHECK(nr == total, "posted %d recvs for %d messages", nr, total);
  /* Recvs of one tag finish in posting order; check them in it. */
  for (int i = 0; i < nr; i++) {
    char what[64];
    snprintf(what, sizeof what, "any-source recv %d (tag %d)", i, rtag[i]);
    check_any(comm, &r[i], rtag[i], next, n, what);
  }
  for (int s = 0; s < n; s++)
    for (int t = 0; t < NTAGS; t++) {
      int want = 0;
      for (int k = 0; k < PER_PAIR; k++) want += msg_tag(s, me, k) == t;
      CHECK(next[s * NTAGS + t] == want, "from rank %d tag %d: %d "
            "messages received, %d sent", s, t, next[s * NTAGS + t], want);
    }
  for (int i = 0; i < total; i++) {
    CHECK_OK(mep_req_wait(sreq[i], WAIT_MS));
    mep_req_free(sreq[i]);
    free(sbuf[i]);
  }
  free(r), free(rtag), free(sreq), free(sbuf), free(next);
}

/* Sends `len` bytes of stream `seed` and waits. */
static void send_now(mep_comm_t *comm, int peer, int tag, size_t len,
                     uint64_t seed) {
  uint8_t *b = malloc(len ? len : 1);
  CHECK(b, "out of memory");
  fill_random(b, len, seed);
  CHECK_OK(mep_send(comm, b, len, peer, tag, NULL));
  free(b);
}

static void recv_now(mep_comm_t *comm, int peer, int tag) {
  CHECK_OK(mep_recv(comm, NULL, 0, peer, tag, NULL));
}

/* Rank `first`'s message, then rank `second`'s, reach rank 0 unexpected
 * (each followed by a marker on another tag that rank 0 receives, so it
 * knows the message arrived); an any-source recv takes `first`'s. */
static void test_arrival(mep_comm_t *comm, int first, int second, int tag) {
  int me = mep_comm_rank(comm);
  size_t la = payload + 5, lb = 3;
  if (me == first || me == second) {
    int a = me == first;
    if (!a) recv_now(comm, 0, tag + 1); /* rank 0 saw the first */
    send_now(comm, 0, tag, a ? la : lb, seed_of(me, 0, tag, 0));
    send_now(comm, 0, tag + 2, 0, 0);
  } else if (me == 0) {
    recv_now(comm, first, tag + 2);
    CHECK_OK(mep_send(comm, NULL, 0, second, tag + 1, NULL));
    recv_now(comm, second, tag + 2);
    int order[2] = {first, second};
    for (int i = 0; i < 2; i++) {
      uint8_t *b = malloc(la);
      mep_req_t *r;
      CHECK_OK(mep_recv(comm, b, la, MEP_ANY_SOURCE, tag, &r));
      CHECK_OK(mep_req_wait(r, WAIT_MS));
      CHECK(mep_req_source(r) == order[i], "arrival order: recv %d got "
            "rank %d's message, rank %d's arrived %s", i,
            mep_req_source(r), order[i], i ? "second" : "first");
      size_t want = order[i] == first ? la : lb;
      CHECK(mep_req_bytes(r) == want, "arrival order: %zu bytes, want %zu",
            mep_req_bytes(r), want);
      CHECK(diff_random(b, want, seed_of(order[i], 0, tag, 0)) < 0,
            "arrival order: bytes of rank %d's message", order[i]);
      mep_req_free(r);
      free(b);
    }
  }
}

/* Rank 0 posts a recv naming rank 1 and an any-source one (in the order
 * `any_first` says), then rank 1 sends two messages: the first goes to the
 * recv posted first. */
static void test_post_order(mep_comm_t *comm, int any_first, int tag) {
  int me = mep_comm_rank(comm);
  if (me == 1) {
    recv_now(comm, 0, tag + 1);
    for (int k = 0; k < 2; k++)
      send_now(comm, 0, tag, 100 + (size_t)k, seed_of(1, 0, tag, k));
  } else if (me == 0) {
    uint8_t b[2][200];
    mep_req_t *r[2];
    int peer[2] = {any_first ? MEP_ANY_SOURCE : 1,
                   any_first ? 1 : MEP_ANY_SOURCE};
    for (int i = 0; i < 2; i++)
      CHECK_OK(mep_recv(comm, b[i], sizeof b[i], peer[i], tag, &r[i]));
    CHECK_OK(mep_send(comm, NULL, 0, 1, tag + 1, NULL));
    for (int i = 0; i < 2; i++) {
      CHECK_OK(mep_req_wait(r[i], WAIT_MS));
      CHECK(mep_req_source(r[i]) == 1, "source %d", mep_req_source(r[i]));
      CHECK(mep_req_bytes(r[i]) == 100 + (size_t)i, "posting order (%s "
            "first): recv %d got the %zu-byte message",
            any_first ? "any source" : "rank 1", i, mep_req_bytes(r[i]));
      CHECK(diff_random(b[i], 100 + (size_t)i, seed_of(1, 0, tag, i)) < 0,
            "posting order: bytes");
      mep_req_free(r[i]);
    }
  }
}

static void test_args(mep_comm_t *comm) {
  char b[4] = {1, 2, 3, 4}; /* sent to itself: any bytes, but defined ones */
  mep_req_t *r = NULL;
  CHECK_RC(mep_send(comm, b, 4, MEP_ANY_SOURCE, 0, &r), MEP_ERR_INVALID);
  CHECK_MSG("peer -1");
  CHECK_RC(mep_recv(comm, b, 4, -2, 0, &r), MEP_ERR_INVALID);
  CHECK_MSG("MEP_ANY_SOURCE");
  CHECK(r == NULL, "a failed call handed out a request");
  CHECK(mep_req_source(NULL) == -1, "source of no request");
  /* A specific recv reports its peer, a send none. */
  int me = mep_comm_rank(comm);
  mep_req_t *s;
  CHECK_OK(mep_send(comm, b, 4, me, 1, &s));
  CHECK_OK(mep_recv(comm, b, 4, me, 1, &r));
  CHECK_OK(mep_req_wait(r, WAIT_MS));
  CHECK_OK(mep_req_wait(s, WAIT_MS));
  CHECK(mep_req_source(r) == me && mep_req_source(s) == -1,
        "sources %d and %d", mep_req_source(r), mep_req_source(s));
  mep_req_free(r);
  mep_req_free(s);
}

static int body_all(mep_comm_t *comm) {
  int n = mep_comm_size(comm);
  test_args(comm);
  test_mixed(comm);
  if (n >= 3) { /* two senders besides the receiver */
    test_arrival(comm, 1, n - 1, 200);
    test_arrival(comm, n - 1, 1, 210);
  }
  test_post_order(comm, 0, 220);
  test_post_order(comm, 1, 230);
  CHECK_OK(mep_barrier(comm, NULL));
  return 0;
}

/* ------------------------------------------------------------- fail */

/* Waits until rank `peer` is seen failed: a recv from it fails. */
static void wait_failed(mep_comm_t *comm, int peer) {
  mep_req_t *r;
  CHECK_OK(mep_recv(comm, NULL, 0, peer, 999, &r));
  CHECK_RC(mep_req_wait(r, WAIT_MS), MEP_ERR_PEER_FAILED);
  mep_req_free(r);
}

/* A recv of an empty message that outlasts the short deadline: rank 0
 * takes seconds between its messages to the others. */
static void patient_recv(mep_comm_t *comm, int peer, int tag) {
  for (int i = 0; i < 40; i++) {
    int rc = mep_recv(comm, NULL, 0, peer, tag, NULL);
    if (rc == MEP_OK) return;
    CHECK(rc == MEP_ERR_TIMEOUT, "recv from rank %d tag %d: %s", peer, tag,
          mep_last_error());
  }
  CHECK(0, "rank %d never sent tag %d", peer, tag);
}

static int running(mep_req_t *r) {
  int done = 0;
  CHECK_OK(mep_req_test(r, &done));
  return !done;
}

static int body_fail(mep_comm_t *comm) {
  int me = mep_comm_rank(comm);
  if (me == 3) { /* dies while its big message streams out */
    patient_recv(comm, 0, 2);
    uint8_t *b = malloc(BIG);
    fill_random(b, BIG, seed_of(3, 0, 1, 0));
    mep_req_t *s;
    CHECK_OK(mep_send(comm, b, BIG, 0, 1, &s));
    /* Some of it streams out (the rings are small), rarely all of it. */
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    _exit(0);
  }
  if (me == 2 || me == 1) { /* leave when told; rank 1 sends first */
    if (me == 1) {
      patient_recv(comm, 0, 3);
      send_now(comm, 0, 1, 777, seed_of(1, 0, 1, 1));
    }
    patient_recv(comm, 0, 4);
    return 0;
  }
  /* Nobody sends tag 77: the deadline, naming any rank. */
  mep_req_t *r;
  char b8[8];
  long long t0 = now_ms();
  CHECK_OK(mep_recv(comm, b8, sizeof b8, MEP_ANY_SOURCE, 77, &r));
  CHECK_RC(mep_req_wait(r, WAIT_MS), MEP_ERR_TIMEOUT);
  CHECK_MSG("any rank");
  CHECK_MSG("tag 77");
  long long dt = now_ms() - t0;
  CHECK(dt >= SHORT_TIMEOUT_MS - 20 && dt < SHORT_TIMEOUT_MS + 10000,
        "timed out after %lld ms, deadline %d", dt, SHORT_TIMEOUT_MS);
  mep_req_free(r);
  /* Rank 3 dies mid-message. */
  uint8_t *big = malloc(BIG);
  CHECK(big, "out of memory");
  CHECK_OK(mep_recv(comm, big, BIG, MEP_ANY_SOURCE, 1, &r));
  CHECK_OK(mep_send(comm, NULL, 0, 3, 2, NULL));
  wait_failed(comm, 3);
  if (!running(r)) {
    int rc = mep_req_wait(r, 0);
    if (rc == MEP_OK) {
      CHECK(mep_req_source(r) == 3 && mep_req_bytes(r) == BIG &&
            diff_random(big, BIG, seed_of(3, 0, 1, 0)) < 0,
            "rank 3's message delivered, but not whole");
      printf("rank 3's message arrived whole before it died\n");
    } else {
      CHECK(rc == MEP_ERR_PEER_FAILED, "cut-off recv: %d (%s): %s", rc,
            mep_strerror(rc), mep_last_error());
      CHECK_MSG("rank 3");
      printf("cut off: %s\n", mep_last_error());
    }
    mep_req_free(r);
    CHECK_OK(mep_recv(comm, big, BIG, MEP_ANY_SOURCE, 1, &r));
  } else {
    printf("nothing of rank 3's message arrived\n");
  }
  /* Rank 2 leaves: rank 1 lives, so the recv waits on and gets its
   * message. */
  CHECK_OK(mep_send(comm, NULL, 0, 2, 4, NULL));
  wait_failed(comm, 2);
  CHECK(running(r), "an any-source recv ended while rank 1 lives: %d",
        mep_req_status(r));
  CHECK_OK(mep_send(comm, NULL, 0, 1, 3, NULL));
  CHECK_OK(mep_req_wait(r, WAIT_MS));
  CHECK(mep_req_source(r) == 1 && mep_req_bytes(r) == 777 &&
        diff_random(big, 777, seed_of(1, 0, 1, 1)) < 0,
        "rank 1's message: source %d, %zu bytes", mep_req_source(r),
        mep_req_bytes(r));
  mep_req_free(r);
  /* Rank 1 leaves too: nobody else can send. */
  CHECK_OK(mep_recv(comm, big, BIG, MEP_ANY_SOURCE, 5, &r));
  CHECK_OK(mep_send(comm, NULL, 0, 1, 4, NULL));
  t0 = now_ms();
  CHECK_RC(mep_req_wait(r, WAIT_MS), MEP_ERR_PEER_FAILED);
  CHECK_MSG("every other rank");
  CHECK(now_ms() - t0 < 4 * SHORT_TIMEOUT_MS, "failed only after %lld ms",
        now_ms() - t0);
  mep_req_free(r);
  CHECK_RC(mep_recv(comm, big, BIG, MEP_ANY_SOURCE, 5, NULL),
           MEP_ERR_PEER_FAILED);
  /* The own rank's messages still match. */
  send_now(comm, 0, 6, 33, seed_of(0, 0, 6, 0));
  CHECK_OK(mep_recv(comm, big, BIG, MEP_ANY_SOURCE, 6, &r));
  CHECK_OK(mep_req_wait(r, WAIT_MS));
  CHECK(mep_req_source(r) == 0 && mep_req_bytes(r) == 33 &&
        diff_random(big, 33, seed_of(0, 0, 6, 0)) < 0, "own message");
  mep_req_free(r);
  free(big);
  return 0;
}

static const char *mode = "all";

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store, (void)arg;
  return strcmp(mode, "fail") == 0 ? body_fail(comm) : body_all(comm);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NRANKS BUFFER_BYTES|0 [all|fail] [SEED]\n",
            argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  size_t buffer = (size_t)strtoull(argv[2], NULL, 0);
  if (argc > 3) mode = argv[3];
  run_seed = argc > 4 ? strtoull(argv[4], NULL, 0)
                      : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
  CHECK(n >= 2, "need at least 2 ranks");
  CHECK(strcmp(mode, "fail") != 0 || n == 4, "fail mode runs on 4 ranks");
  char v[32];
  if (buffer) {
    snprintf(v, sizeof v, "%zu", buffer);
    setenv("MEP_CORE_BUFFER_BYTES", v, 1);
  }
  unsetenv("MEP_CORE_CHUNK_BYTES"); /* the reference geometry assumes 1 MiB */
  if (strcmp(mode, "fail") == 0) {
    snprintf(v, sizeof v, "%d", SHORT_TIMEOUT_MS);
    setenv("MEP_CORE_TIMEOUT_MS", v, 1);
  }
  reference_geometry(buffer ? buffer : (size_t)16 << 20, n);
  printf("%d ranks, mode %s, seed %llu, slot %zu, ring %zu\n", n, mode,
         (unsigned long long)run_seed, slot, ring);
  fflush(stdout);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 280000, .name = "p2pany"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d rank(s) failed", failed);
  printf("ok\n");
  return 0;
}
