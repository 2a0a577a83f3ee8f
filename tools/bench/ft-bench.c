/* mep-ft-bench - how long the survivors of a lost rank take to finish.
 *
 * Forks N ranks around a store of its own; they run 8-byte all-reduces
 * back to back. The bench then kills (SIGKILL) or freezes (SIGSTOP) one
 * rank and measures, on every survivor, the time from that moment to the
 * return of its first MEP_OK_DEGRADED all-reduce (CLOCK_MONOTONIC is
 * shared by the processes of one machine). Repeats R times with a fresh
 * communicator and prints one row per round and a summary. Link cuts need
 * network namespaces: tests/ft/netns.sh runs them. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

typedef struct opts {
  int n, rounds, victim, stop, timeout_ms, probe_ms, iters_before;
} opts_t;

/* What the ranks report to the bench, in shared memory. */
typedef struct board {
  volatile int ready;       /* ranks in the loop */
  volatile uint64_t done_ns[256];
  volatile int status[256];
} board_t;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: mep-ft-bench [-n RANKS] [-r ROUNDS] [--stop] [--victim R]\n"
          "                    [--timeout-ms T] [--probe-ms P]\n"
          "  -n RANKS        ranks to fork (default 4, 2..256)\n"
          "  -r ROUNDS       rounds, each with a fresh communicator (default 5)\n"
          "  --stop          freeze the victim (SIGSTOP) instead of killing it\n"
          "  --victim R      the rank lost (default: the last)\n"
          "  --timeout-ms T  [core] timeout_ms of the ranks (default 2000)\n"
          "  --probe-ms P    [core] probe_ms of the ranks (default 500)\n"
          "Prints per round the time from the loss to each survivor's first\n"
          "degraded all-reduce: min, median, max over the survivors, in ms.\n");
}

static int parse(int argc, char **argv, opts_t *o) {
  static const struct option lo[] = {
      {"stop", no_argument, 0, 's'},       {"victim", required_argument, 0, 'v'},
      {"timeout-ms", required_argument, 0, 't'},
      {"probe-ms", required_argument, 0, 'p'}, {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (opts_t){.n = 4, .rounds = 5, .victim = -1, .timeout_ms = 2000,
                .probe_ms = 500, .iters_before = 50};
  int c;
  while ((c = getopt_long(argc, argv, "n:r:h", lo, NULL)) != -1) {
    switch (c) {
    case 'n': o->n = atoi(optarg); break;
    case 'r': o->rounds = atoi(optarg); break;
    case 's': o->stop = 1; break;
    case 'v': o->victim = atoi(optarg); break;
    case 't': o->timeout_ms = atoi(optarg); break;
    case 'p': o->probe_ms = atoi(optarg); break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return -1;
    }
  }
  if (optind < argc || o->n < 2 || o->n > 256 || o->rounds < 1 ||
      o->timeout_ms < 1 || o->probe_ms < 1) {
    usage(stderr);
    return -1;
  }
  if (o->victim < 0) o->victim = o->n - 1;
  if (o->victim >= o->n) {
    fprintf(stderr, "mep-ft-bench: --victim %d is not a rank of %d\n",
            o->victim, o->n);
    return -1;
  }
  return 0;
}

/* One rank: all-reduces until one comes back degraded (or fails). */
static int rank_main(const opts_t *o, board_t *b, int port, int round,
                     int rank) {
  char name[32];
  snprintf(name, sizeof name, "ftb%d", round);
  mep_store_t *st;
  mep_comm_t *comm;
  mep_comm_opts_t co = {.struct_size = sizeof co, .name = name,
                        .timeout_ms = o->timeout_ms};
  if (mep_store_tcp_connect("127.0.0.1", port, 10000, &st)) return 2;
  if (mep_comm_create(st, rank, o->n, &co, &comm)) {
    fprintf(stderr, "rank %d: %s\n", rank, mep_last_error());
    return 2;
  }
  int64_t x = rank, y;
  int rc = 0;
  for (int i = 0; i < o->iters_before && rc == 0; i++)
    rc = mep_allreduce(comm, &x, &y, 1, MEP_INT64, MEP_SUM, NULL);
  __atomic_add_fetch(&b->ready, 1, __ATOMIC_SEQ_CST);
  while (rc == 0) rc = mep_allreduce(comm, &x, &y, 1, MEP_INT64, MEP_SUM, NULL);
  b->done_ns[rank] = now_ns();
  b->status[rank] = rc;
  if (rc < 0) fprintf(stderr, "rank %d: %s\n", rank, mep_last_error());
  mep_comm_destroy(comm);
  mep_store_destroy(st);
  return rc == MEP_OK_DEGRADED ? 0 : 1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Runs one round; fills the survivors' times (ms). Returns 0 if every
 * survivor finished degraded. */
static int round_run(const opts_t *o, board_t *b, int round, double *ms,
                     int *nms) {
  mep_launch_store_t store = {0};
  if (mep_launch_store_start(&store)) return -1;
  memset((void *)b, 0, sizeof *b);
  pid_t pids[256];
  fflush(NULL);
  for (int r = 0; r < o->n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(rank_main(o, b, store.port, round, r));
  }
  /* a minute, plus the ranks' own timeout: creation may wait that long
   * for a slow peer (many ranks on few cores) */
  uint64_t grace = (60000ull + (uint64_t)o->timeout_ms) * 1000000u;
  uint64_t ready_by = now_ns() + grace;
  int ready;
  while ((ready = __atomic_load_n(&b->ready, __ATOMIC_SEQ_CST)) < o->n &&
         now_ns() < ready_by)
    usleep(1000);
  int all_ready = ready == o->n, bad = !all_ready;
  uint64_t t0 = 0, give_up = 0;
  if (!all_ready) {
    fprintf(stderr, "mep-ft-bench: round %d: %d of %d ranks were running "
            "all-reduces after %.0f s\n", round, ready, o->n,
            (double)grace / 1e9);
    /* no measurement: every rank goes (give_up is past) */
  } else {
    usleep(20000); /* in the loop for a while */
    t0 = now_ns();
    give_up = t0 + grace;
    kill(pids[o->victim], o->stop ? SIGSTOP : SIGKILL);
  }
  for (int r = 0; r < o->n; r++) {
    if (r == o->victim) continue;
    int st = 0;
    while (waitpid(pids[r], &st, WNOHANG) == 0) {
      if (now_ns() > give_up) {
        if (all_ready)
          fprintf(stderr, "mep-ft-bench: round %d: rank %d still had no "
                  "result %.0f s after the loss; killed\n", round, r,
                  (double)grace / 1e9);
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &st, 0);
        bad = 1;
        break;
      }
      usleep(1000);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
  }
  kill(pids[o->victim], SIGKILL);
  waitpid(pids[o->victim], NULL, 0);
  mep_launch_store_stop(&store);
  uint64_t d[256];
  int k = 0;
  for (int r = 0; r < o->n; r++)
    if (r != o->victim && b->done_ns[r] > t0) d[k++] = b->done_ns[r] - t0;
  qsort(d, (size_t)k, sizeof *d, cmp_u64);
  for (int i = 0; i < k; i++) ms[i] = (double)d[i] / 1e6;
  *nms = k;
  return bad || k != o->n - 1;
}

int main(int argc, char **argv) {
  opts_t o;
  if (parse(argc, argv, &o)) return 2;
  char t[32], p[32];
  snprintf(t, sizeof t, "%d", o.timeout_ms);
  snprintf(p, sizeof p, "%d", o.probe_ms);
  setenv("MEP_CORE_PROBE_MS", p, 1);
  setenv("MEP_CORE_TIMEOUT_MS", t, 1);
  board_t *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (b == MAP_FAILED) {
    perror("mep-ft-bench: mmap");
    return 1;
  }
  printf("# mep-ft-bench: %d ranks, %s rank %d, timeout_ms %d, probe_ms %d\n",
         o.n, o.stop ? "SIGSTOP" : "SIGKILL", o.victim, o.timeout_ms,
         o.probe_ms);
  printf("%6s %10s %10s %10s\n", "round", "min_ms", "median_ms", "max_ms");
  double all_max = 0, sum_med = 0;
  int failed = 0;
  for (int r = 0; r < o.rounds; r++) {
    double ms[256];
    int k = 0;
    int rc = round_run(&o, b, r, ms, &k);
    if (rc || !k) {
      printf("%6d %10s %10s %10s  (a survivor did not finish degraded)\n", r,
             "-", "-", "-");
      failed++;
      continue;
    }
    printf("%6d %10.1f %10.1f %10.1f\n", r, ms[0], ms[k / 2], ms[k - 1]);
    sum_med += ms[k / 2];
    if (ms[k - 1] > all_max) all_max = ms[k - 1];
  }
  int ok = o.rounds - failed;
  if (ok)
    printf("# mean of medians %.1f ms, worst %.1f ms over %d rounds\n",
           sum_med / ok, all_max, ok);
  return failed ? 1 : 0;
}
