/* The request hooks the CUDA staged path stands on (req.h), passed to
 * mep__coll_submit (coll.h): a collective started with a gate does not
 * start while the gate is shut, holds the collectives queued behind it,
 * starts once it opens, and runs on_settle exactly once with its
 * argument; the hooks go to that collective only. Two forked ranks; each
 * shuts its own gate for a while. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coll.h"
#include "launch.h"
#include "req.h"

typedef struct hook_state {
  atomic_int open, settled, gate_calls;
  void *seen_arg;
  int seen_status;
} hook_state_t;

static int gate(void *arg) {
  hook_state_t *h = arg;
  atomic_fetch_add(&h->gate_calls, 1);
  return atomic_load(&h->open);
}

static void on_settle(mep_req_t *req, void *arg) {
  hook_state_t *h = arg;
  h->seen_arg = arg;
  h->seen_status = req->status;
  atomic_fetch_add(&h->settled, 1);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static int done(mep_req_t *r) {
  int d = 0;
  CHECK(mep_req_test(r, &d) == MEP_OK, "mep_req_test");
  return d;
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  (void)arg;
  int rank = mep_comm_rank(comm), n = mep_comm_size(comm);
  enum { COUNT = 1001 };
  static int32_t in1[COUNT], out1[COUNT], in2[COUNT], out2[COUNT];
  for (int i = 0; i < COUNT; i++) {
    in1[i] = rank * 1000 + i;
    in2[i] = rank - i;
  }
  hook_state_t h;
  memset(&h, 0, sizeof h);
  mep_req_t *r1 = NULL, *r2 = NULL;
  mep__req_hooks_t hooks = {.gate = gate, .on_settle = on_settle, .arg = &h};
  mep__coll_call_t call = {.kind = MEP__COLL_ALLREDUCE, .send = in1,
                           .recv = out1, .count = COUNT, .dtype = MEP_INT32,
                           .op = MEP_SUM, .root = -1};
  CHECK(mep__coll_submit(comm, &call, &hooks, &r1) == MEP_OK,
        "gated allreduce: %s", mep_last_error());
  /* no hooks here: they are r1's alone */
  CHECK(mep_allreduce(comm, in2, out2, COUNT, MEP_INT32, MEP_SUM, &r2) ==
            MEP_OK, "second allreduce: %s", mep_last_error());
  sleep_ms(300);
  CHECK(atomic_load(&h.gate_calls) > 0, "rank %d: the engine never asked "
        "the gate", rank);
  CHECK(!done(r1) && !done(r2), "rank %d: a collective ran past a shut gate "
        "(r1 %d, r2 %d)", rank, done(r1), done(r2));
  CHECK(atomic_load(&h.settled) == 0, "on_settle ran before the end");
  atomic_store(&h.open, 1);
  CHECK(mep_req_wait(r1, 30000) == MEP_OK, "rank %d: gated allreduce: %s",
        rank, mep_last_error());
  CHECK(mep_req_wait(r2, 30000) == MEP_OK, "rank %d: second allreduce: %s",
        rank, mep_last_error());
  for (int i = 0; i < COUNT; i++) {
    int32_t s1 = 0, s2 = 0;
    for (int r = 0; r < n; r++) {
      s1 += r * 1000 + i;
      s2 += r - i;
    }
    CHECK(out1[i] == s1 && out2[i] == s2, "rank %d: element %d: %d %d, want "
          "%d %d", rank, i, out1[i], out2[i], s1, s2);
  }
  CHECK(atomic_load(&h.settled) == 1 && h.seen_arg == &h &&
            h.seen_status == MEP_OK,
        "rank %d: on_settle ran %d times (arg %p, want %p; status %d)", rank,
        atomic_load(&h.settled), h.seen_arg, (void *)&h, h.seen_status);
  int calls = atomic_load(&h.gate_calls);
  mep_req_free(r1);
  mep_req_free(r2);
  /* a later collective has no gate and no hook */
  CHECK(mep_allreduce(comm, in2, out2, COUNT, MEP_INT32, MEP_SUM, NULL) ==
            MEP_OK, "third allreduce: %s", mep_last_error());
  CHECK(atomic_load(&h.gate_calls) == calls && atomic_load(&h.settled) == 1,
        "rank %d: the hooks stuck to a later collective", rank);
  printf("rank %d: gate asked %d times; 1 settle\n", rank, calls);
  return 0;
}

int main(void) {
  mep_launch_opts_t o = {.size = 2, .timeout_ms = 60000, .name = "reqgate"};
  int bad = mep_launch(&o, body, NULL);
  printf("%d passed, %d failed\n", bad ? 0 : 1, bad ? 1 : 0);
  return bad ? 1 : 0;
}
