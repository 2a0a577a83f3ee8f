/* mep-scale-probe - what one communicator of N local ranks costs each rank
 * (docs/scaling.md, scripts/bench-scaling.py).
 *
 * Forks N ranks around a store of its own (tools/common/launch.h). Each
 * rank reports, on one line of stdout:
 *  - memory: its resident set (VmRSS) before the communicator, after it
 *    is made and every rank passed a barrier, and after an EP buffer of
 *    the CPU path (MEP_EP_HOST) is made, with mep_ep_size_hint, and at
 *    the end, after the timed calls;
 *  - connections: the sockets among its open file descriptors;
 *  - the time mep_comm_create took, and the store requests it made;
 *  - time per call, the median over the timed iterations of each: an
 *    8-byte all-reduce, a barrier, an all-to-all of B bytes per peer, and
 *    an EP dispatch + combine of T tokens (bf16, top-k, fixed routing).
 * The lines start with "probe " and hold key=value pairs. Exits 0 when
 * every rank finished every call. */
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mep/ep.h>

#include "launch.h"

typedef struct opts {
  int n, tokens, hidden, local, topk, iters, warmup, a2a_bytes, timeout_ms;
  int hold_ms;
} opts_t;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* VmRSS of this process in KiB, or -1. */
static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

/* Open file descriptors and, among them, sockets. */
static void count_fds(int *fds, int *socks) {
  *fds = *socks = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[300], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len < 0) continue; /* the directory's own fd, closed meanwhile */
    target[len] = 0;
    (*fds)++;
    if (!strncmp(target, "socket:", 7)) (*socks)++;
  }
  closedir(d);
  (*fds)--; /* the directory stream's own */
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static long g_rss_start;
static double g_t_start;

static void before_comm(int rank, void *arg) {
  (void)rank;
  (void)arg;
  g_rss_start = rss_kb();
  g_t_start = now_us();
}

static int fail(int rank, const char *what, int rc) {
  fprintf(stderr, "mep-scale-probe: rank %d: %s: %s: %s\n", rank, what,
          mep_strerror(rc), mep_last_error());
  return 1;
}

/* The EP buffers of one rank, for the timed round trips. */
typedef struct ep_io {
  uint16_t *x, *rx, *out;
  int64_t *idx, *lr;
  float *w;
  int32_t *si, *cnt;
} ep_io_t;

static int ep_round(mep_ep_buffer_t *b, const opts_t *o, ep_io_t *io) {
  mep_ep_dispatch_args_t d = {
      .struct_size = sizeof d, .x = io->x, .topk_idx = io->idx,
      .num_tokens = o->tokens, .num_topk = o->topk, .recv_x = io->rx,
      .recv_src_info = io->si, .recv_layout_range = io->lr,
      .recv_count = io->cnt};
  int rc = mep_ep_dispatch(b, &d);
  if (rc) return rc;
  /* the experts' outputs: what they received, unchanged (the probe times
   * communication, not experts) */
  mep_ep_combine_args_t c = {
      .struct_size = sizeof c, .x = io->rx, .topk_idx = io->idx,
      .topk_weights = io->w, .src_info = io->si, .layout_range = io->lr,
      .num_tokens = o->tokens, .num_topk = o->topk, .out = io->out};
  return mep_ep_combine(b, &c);
}

static float bf16f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Each expert returned its input and the weights sum to 1, so every
 * output is its input within bf16 rounding. */
static int op_check_ep(const ep_io_t *io, int T, int K, int H) {
  (void)K;
  for (size_t i = 0; i < (size_t)T * H; i++) {
    float a = bf16f(io->x[i]), b = bf16f(io->out[i]);
    if (b < a * 0.98f || b > a * 1.02f) return 1;
  }
  return 0;
}

static int rank_main(mep_comm_t *comm, mep_store_t *store, void *arg) {
  const opts_t *o = arg;
  double create_ms = (now_us() - g_t_start) / 1e3;
  unsigned long long create_ops = mep_launch_store_requests(store);
  int rank = mep_comm_rank(comm), n = mep_comm_size(comm), rc;
  /* two barriers: collectives alternate between two staging slots per
   * peer, and the barrier after the EP buffer must not be the first to
   * touch the second's pages (a page per peer and direction, which the
   * EP's delta would otherwise count) */
  for (int i = 0; i < 2; i++)
    if ((rc = mep_barrier(comm, NULL))) return fail(rank, "barrier", rc);
  long rss_comm = rss_kb();
  int fds, socks;
  count_fds(&fds, &socks);

  /* the EP buffer (CPU path) */
  const int T = o->tokens, H = o->hidden, L = o->local, K = o->topk;
  const int E = n * L;
  const size_t S = (size_t)n * T;
  mep_ep_config_t cfg = {.struct_size = sizeof cfg, .max_tokens_per_rank = T,
                         .hidden = H, .num_experts = E, .flags = MEP_EP_HOST};
  size_t hint = mep_ep_size_hint(T, H, n, E);
  mep_ep_buffer_t *b = NULL;
  if ((rc = mep_ep_buffer_create(comm, &cfg, &b)))
    return fail(rank, "mep_ep_buffer_create", rc);
  if ((rc = mep_barrier(comm, NULL))) return fail(rank, "barrier", rc);
  long rss_ep = rss_kb();

  ep_io_t io = {
      .x = calloc((size_t)T * H, 2), .rx = calloc((size_t)L * S * H, 2),
      .out = calloc((size_t)T * H, 2), .idx = calloc((size_t)T * K, 8),
      .lr = calloc((size_t)L * n, 8), .w = calloc((size_t)T * K, 4),
      .si = calloc((size_t)L * S, 4), .cnt = calloc((size_t)L, 4)};
  int iters = o->iters, total = o->warmup + o->iters;
  size_t a2a = (size_t)o->a2a_bytes * (size_t)n;
  uint8_t *sa = malloc(a2a ? a2a : 1), *ra = malloc(a2a ? a2a : 1);
  double *t = calloc((size_t)iters, sizeof *t);
  if (!io.x || !io.rx || !io.out || !io.idx || !io.lr || !io.w || !io.si ||
      !io.cnt || !sa || !ra || !t)
    return fail(rank, "buffers", MEP_ERR_NOMEM);
  uint64_t seed = 0x5ca1e000u + (uint64_t)rank;
  for (size_t i = 0; i < (size_t)T * H; i++)
    io.x[i] = (uint16_t)(0x3f80u + (rng(&seed) & 0x7fu)); /* 1.0 .. 2.0 */
  for (int tk = 0; tk < T; tk++)
    for (int k = 0; k < K; k++) { /* K distinct experts */
      int64_t e;
      int dup;
      do {
        e = (int64_t)(rng(&seed) % (uint64_t)E);
        dup = 0;
        for (int j = 0; j < k; j++) dup |= io.idx[(size_t)tk * K + j] == e;
      } while (dup);
      io.idx[(size_t)tk * K + k] = e;
      io.w[(size_t)tk * K + k] = 1.0f / (float)K;
    }
  memset(sa, rank & 0xff, a2a);

  double med[4];
  const char *names[4] = {"allreduce", "barrier", "alltoall", "ep"};
  for (int op = 0; op < 4; op++) {
    if ((rc = mep_barrier(comm, NULL))) return fail(rank, "barrier", rc);
    for (int i = 0; i < total; i++) {
      double x[2] = {rank, 1}, y[2];
      double t0 = now_us();
      switch (op) {
      case 0: rc = mep_allreduce(comm, x, y, 1, MEP_FLOAT64, MEP_SUM, NULL);
        break;
      case 1: rc = mep_barrier(comm, NULL); break;
      case 2:
        rc = mep_alltoall(comm, sa, ra, (size_t)o->a2a_bytes, MEP_UINT8,
                          NULL);
        break;
      default: rc = ep_round(b, o, &io); break;
      }
      double dt = now_us() - t0;
      if (rc) return fail(rank, names[op], rc);
      if (op == 0 && y[0] != (double)n * (n - 1) / 2)
        return fail(rank, "allreduce: wrong sum", MEP_ERR_PROTOCOL);
      if (i >= o->warmup) t[i - o->warmup] = dt;
    }
    med[op] = median(t, iters);
  }
  if (op_check_ep(&io, T, K, H)) return fail(rank, "ep: wrong output", 1);
  long rss_end = rss_kb();

  char line[1024];
  int len = snprintf(
      line, sizeof line,
      "probe rank=%d n=%d pid=%d rss_start_kb=%ld rss_comm_kb=%ld "
      "rss_ep_kb=%ld rss_end_kb=%ld fds=%d socks=%d create_ms=%.1f create_store_ops=%llu "
      "ep_hint=%zu tokens=%d hidden=%d experts=%d topk=%d a2a_bytes=%d iters=%d "
      "allreduce_us=%.2f barrier_us=%.2f alltoall_us=%.2f ep_us=%.2f\n",
      rank, n, (int)getpid(), g_rss_start, rss_comm, rss_ep, rss_end, fds, socks,
      create_ms, create_ops, hint, T, H, E, K, o->a2a_bytes, iters, med[0], med[1],
      med[2], med[3]);
  if (write(1, line, (size_t)len) != len) return 1; /* one write: atomic */
  if (o->hold_ms) { /* the group stays up to be looked at from outside */
    struct timespec ts = {o->hold_ms / 1000, (long)(o->hold_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
  }
  (void)mep_barrier(comm, NULL); /* nobody leaves while others measure */
  mep_ep_buffer_destroy(b);
  void *owned[] = {io.x, io.rx, io.out, io.idx, io.lr, io.w, io.si, io.cnt,
                   sa, ra, t};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) free(owned[i]);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
"usage: mep-scale-probe [-n RANKS] [--tokens T] [--hidden H]\n"
"                       [--experts-per-rank L] [--topk K] [--a2a-bytes B]\n"
"                       [-w WARMUP] [-i ITERS] [-t TIMEOUT_MS]\n"
"                       [--hold-ms MS]\n"
"Forks RANKS local ranks (default 2) and prints one line per rank:\n"
"resident memory before the communicator, after it and after an EP buffer\n"
"of the CPU path (T tokens per rank, default 32; hidden H, default 512;\n"
"RANKS * L experts, L default 2), its sockets and file descriptors, the\n"
"time mep_comm_create took and its store requests, and the median time\n"
"(us) over ITERS calls (default 200, after WARMUP = 20) of an 8-byte\n"
"all-reduce, a barrier, an all-to-all of B bytes per peer (default 1024)\n"
"and an EP dispatch + combine (top-K, default 2). TIMEOUT_MS bounds the\n"
"whole run (default 600000).\n"
"With --hold-ms, every rank keeps its communicator for MS ms after its\n"
"line, so that the group can be looked at from outside (its queue pairs\n"
"in `rdma res show qp`, say).\n"
"\n"
"mep-scale-probe --hint T,H,N,E [T,H,N,E ...] prints \"hint T H N E BYTES\"\n"
"per argument: mep_ep_size_hint(T, H, N, E), 0 for invalid parameters.\n");
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--hint")) {
    for (int i = 2; i < argc; i++) {
      int t, h, n, e;
      if (sscanf(argv[i], "%d,%d,%d,%d", &t, &h, &n, &e) != 4) {
        usage(stderr);
        return 2;
      }
      printf("hint %d %d %d %d %zu\n", t, h, n, e,
             mep_ep_size_hint(t, h, n, e));
    }
    return 0;
  }
  static const struct option lo[] = {
      {"tokens", required_argument, 0, 'T'},
      {"hidden", required_argument, 0, 'H'},
      {"experts-per-rank", required_argument, 0, 'L'},
      {"topk", required_argument, 0, 'k'},
      {"a2a-bytes", required_argument, 0, 'a'},
      {"hold-ms", required_argument, 0, 'm'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  opts_t o = {.n = 2, .tokens = 32, .hidden = 512, .local = 2, .topk = 2,
              .iters = 200, .warmup = 20, .a2a_bytes = 1024,
              .timeout_ms = 600000};
  int c;
  while ((c = getopt_long(argc, argv, "n:w:i:t:h", lo, NULL)) != -1) {
    switch (c) {
    case 'n': o.n = atoi(optarg); break;
    case 'T': o.tokens = atoi(optarg); break;
    case 'H': o.hidden = atoi(optarg); break;
    case 'L': o.local = atoi(optarg); break;
    case 'k': o.topk = atoi(optarg); break;
    case 'a': o.a2a_bytes = atoi(optarg); break;
    case 'w': o.warmup = atoi(optarg); break;
    case 'i': o.iters = atoi(optarg); break;
    case 't': o.timeout_ms = atoi(optarg); break;
    case 'm': o.hold_ms = atoi(optarg); break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc || o.n < 1 || o.tokens < 1 || o.local < 1 ||
      o.topk < 1 || o.topk > o.n * o.local || o.topk > MEP_EP_MAX_TOPK ||
      o.iters < 1 || o.warmup < 0 || o.a2a_bytes < 0 || o.timeout_ms < 1 ||
      o.hold_ms < 0) {
    usage(stderr);
    return 2;
  }
  setvbuf(stdout, NULL, _IONBF, 0);
  mep_launch_opts_t lo2 = {.size = o.n, .timeout_ms = o.timeout_ms,
                           .name = "scale", .before_comm = before_comm};
  int bad = mep_launch(&lo2, rank_main, &o);
  if (bad) fprintf(stderr, "mep-scale-probe: %d of %d ranks failed\n", bad,
                   o.n);
  return bad ? 1 : 0;
}
