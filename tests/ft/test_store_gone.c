/* test_store_gone.c - what existing communicators do once the store is
 * gone (docs/fault-tolerance.md, "Limits"): they keep running, and a
 * majority of them survives a rank's death without the store's
 * arbitration; the result equals the reference over the survivors, and
 * mep_comm_destroy does not wait for the store.
 *
 *   test_store_gone [NRANKS] [killed|frozen]
 *
 * NRANKS: default 4; the last rank dies. killed (the default): the
 * store's process dies, and its host refuses connections. frozen: the
 * store's process is stopped, as a host cut off from the network would
 * look: connections are not refused, requests are never answered.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "launch.h"

#define COUNT 1001

typedef struct shared {
  volatile int ready, store_gone;
} shared_t;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int64_t input(int rank, int i) {
  uint64_t s = (uint64_t)rank * 7919u + (uint64_t)i;
  return (int64_t)(splitmix64(&s) % 1000003u) - 500000;
}

static int rank_main(int port, int rank, int n, shared_t *sh) {
  mep_store_t *st;
  mep_comm_t *comm;
  CHECK_OK(mep_store_tcp_connect("127.0.0.1", port, 10000, &st));
  CHECK_OK(mep_comm_create(st, rank, n, NULL, &comm));
  int64_t x[COUNT], y[COUNT];
  for (int i = 0; i < COUNT; i++) x[i] = input(rank, i);
  CHECK_OK(mep_allreduce(comm, x, y, COUNT, MEP_INT64, MEP_SUM, NULL));
  __atomic_add_fetch(&sh->ready, 1, __ATOMIC_SEQ_CST);
  while (!__atomic_load_n(&sh->store_gone, __ATOMIC_SEQ_CST)) usleep(1000);
  if (rank == n - 1) raise(SIGKILL);
  uint64_t t0 = now_ms();
  int rc = mep_allreduce(comm, x, y, COUNT, MEP_INT64, MEP_SUM, NULL);
  uint64_t took = now_ms() - t0;
  CHECK(rc == MEP_OK_DEGRADED, "rank %d: %d (%s): %s", rank, rc,
        mep_strerror(rc), mep_last_error());
  int lost[4];
  CHECK(mep_comm_dropped(comm, lost, 4) == 1 && lost[0] == n - 1,
        "rank %d: dropped set is not {%d}", rank, n - 1);
  for (int i = 0; i < COUNT; i++) {
    int64_t want = 0;
    for (int r = 0; r < n - 1; r++) want += input(r, i);
    CHECK(y[i] == want, "rank %d: element %d is %lld, want %lld", rank, i,
          (long long)y[i], (long long)want);
  }
  /* The store's claim is given up on after two probe periods. */
  CHECK(took < 5000, "rank %d: the survivors took %llu ms", rank,
        (unsigned long long)took);
  CHECK_OK(mep_allreduce(comm, x, y, COUNT, MEP_INT64, MEP_SUM, NULL));
  printf("rank %d: degraded all-reduce without the store in %llu ms\n", rank,
         (unsigned long long)took);
  /* Not held up for the store's 10 s timeout by the coordinator's claim,
   * which asks a store that refuses connections or never answers. */
  t0 = now_ms();
  mep_comm_destroy(comm);
  took = now_ms() - t0;
  CHECK(took < 3000, "rank %d: mep_comm_destroy took %llu ms", rank,
        (unsigned long long)took);
  printf("rank %d: mep_comm_destroy in %llu ms\n", rank,
         (unsigned long long)took);
  mep_store_destroy(st);
  fflush(stdout); /* the child leaves with _exit */
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  const char *how = argc > 2 ? argv[2] : "killed";
  CHECK(n >= 3 && n <= 16, "NRANKS %d is not in [3, 16]: a majority must "
        "survive", n);
  int frozen = strcmp(how, "frozen") == 0;
  CHECK(frozen || strcmp(how, "killed") == 0, "'%s' is not killed or frozen",
        how);
  setenv("MEP_CORE_PROBE_MS", "500", 0);
  setenv("MEP_CORE_TIMEOUT_MS", "3000", 0);
  shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(sh != MAP_FAILED, "mmap");
  mep_launch_store_t store = {0};
  CHECK(mep_launch_store_start(&store) == 0, "no store");
  pid_t pids[16];
  fflush(NULL);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      close(store.ctl_fd); /* only the parent stops the store */
      _exit(rank_main(store.port, r, n, sh));
    }
  }
  uint64_t deadline = now_ms() + 60000;
  while (__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST) < n &&
         now_ms() < deadline)
    usleep(1000);
  /* The store's process dies, as it would with the host of rank 0, or
   * stops answering, as it would behind a cut cable. */
  kill(store.pid, frozen ? SIGSTOP : SIGKILL);
  if (!frozen) mep_launch_store_stop(&store);
  __atomic_store_n(&sh->store_gone, 1, __ATOMIC_SEQ_CST);
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int status = 0;
    while (waitpid(pids[r], &status, WNOHANG) == 0) {
      if (now_ms() > deadline) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status, 0);
        fprintf(stderr, "rank %d: killed at the deadline\n", r);
        break;
      }
      usleep(1000);
    }
    int ok = r == n - 1 ? WIFSIGNALED(status)
                        : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
      fprintf(stderr, "rank %d failed\n", r);
      failed++;
    }
  }
  if (frozen) {
    kill(store.pid, SIGKILL);
    mep_launch_store_stop(&store);
  }
  printf("%s: %d ranks, store %s, rank %d killed\n", failed ? "FAIL" : "ok",
         n, how, n - 1);
  return failed ? 1 : 0;
}
