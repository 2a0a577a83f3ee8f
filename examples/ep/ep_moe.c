/* ep_moe - a small program on the EP API (mep/ep.h) for engines that do
 * not use PyTorch: every rank routes its tokens to top-k experts,
 * dispatches them, lets its own experts scale what they received, combines
 * the results back and checks each output against what it computes alone.
 *
 *   ep_moe --rank R --size N --store HOST:PORT [--tokens T] [--hidden H]
 *          [--experts-per-rank L] [--topk K] [--iters I]
 *
 * Rank 0 serves the rendezvous store on PORT. Host memory (MEP_EP_HOST),
 * so it runs anywhere over any transport; a GPU program makes its buffer
 * with MEP_EP_CUDA and passes device pointers and a stream instead. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mep/ep.h>

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even (the inputs here are finite). */
static uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The experts of this example: expert e scales its input by 2^(e % 3 - 1)
 * (exact in bf16), so every rank can check its combined output alone. */
static float expert_scale(int e) { return (float)(1 << (e % 3)) / 2.0f; }

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int die(const char *what, int rc) {
  fprintf(stderr, "ep_moe: %s: %s: %s\n", what, mep_strerror(rc),
          mep_last_error());
  return 1;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ep_moe --rank R --size N --store HOST:PORT [--tokens T] "
             "[--hidden H]\n              [--experts-per-rank L] [--topk K] "
             "[--iters I]\n"
             "  Dispatches T tokens per rank (default 32, hidden 256) to K "
             "of N*L experts\n  (defaults 2 and 4), combines them back and "
             "checks every output; I rounds\n  (default 5). Rank 0 serves "
             "the store on PORT.\n");
}

typedef struct opts {
  int rank, size, tokens, hidden, local, topk, iters, port;
  char host[256];
} opts_t;

static int parse(int argc, char **argv, opts_t *o) {
  static const struct option lo[] = {
      {"rank", required_argument, 0, 'r'},
      {"size", required_argument, 0, 'n'},
      {"store", required_argument, 0, 's'},
      {"tokens", required_argument, 0, 't'},
      {"hidden", required_argument, 0, 'H'},
      {"experts-per-rank", required_argument, 0, 'L'},
      {"topk", required_argument, 0, 'k'},
      {"iters", required_argument, 0, 'i'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (opts_t){.rank = -1, .tokens = 32, .hidden = 256, .local = 4,
                .topk = 2, .iters = 5};
  int c;
  while ((c = getopt_long(argc, argv, "r:n:s:t:H:L:k:i:h", lo, NULL)) != -1) {
    switch (c) {
    case 'r': o->rank = atoi(optarg); break;
    case 'n': o->size = atoi(optarg); break;
    case 's':
      if (sscanf(optarg, "%255[^:]:%d", o->host, &o->port) != 2) o->port = -1;
      break;
    case 't': o->tokens = atoi(optarg); break;
    case 'H': o->hidden = atoi(optarg); break;
    case 'L': o->local = atoi(optarg); break;
    case 'k': o->topk = atoi(optarg); break;
    case 'i': o->iters = atoi(optarg); break;
    case 'h': usage(stdout); exit(0);
    default: return -1;
    }
  }
  /* the library checks hidden, experts and top-k itself, with reasons */
  if (o->rank < 0 || o->size < 1 || o->rank >= o->size || o->port <= 0 ||
      o->tokens < 1 || o->iters < 1 || o->local < 1 || o->topk < 1 ||
      o->topk > o->size * o->local)
    return -1;
  return 0;
}

/* One round: new tokens and routing, dispatch, the experts, combine, and
 * the check. Returns 0, or 1 with the first wrong value printed. */
static int round_trip(mep_ep_buffer_t *b, const opts_t *o, int round,
                      double *us) {
  const int T = o->tokens, H = o->hidden, K = o->topk, R = o->size;
  const int L = o->local, E = R * L;
  const size_t S = (size_t)R * T;
  uint64_t seed = ((uint64_t)o->rank << 32) ^ (uint64_t)round;
  int n = (int)(rng(&seed) % (uint64_t)(T + 1)); /* 0..T tokens */
  uint16_t *x = malloc(sizeof *x * (size_t)T * H);
  int64_t *idx = malloc(sizeof *idx * (size_t)T * K);
  float *w = malloc(sizeof *w * (size_t)T * K);
  uint16_t *rx = malloc(sizeof *rx * (size_t)L * S * H);
  int32_t *si = malloc(sizeof *si * (size_t)L * S);
  int64_t *lr = malloc(sizeof *lr * (size_t)L * R);
  int32_t *cnt = malloc(sizeof *cnt * (size_t)L);
  uint16_t *out = malloc(sizeof *out * (size_t)T * H);
  int bad = !x || !idx || !w || !rx || !si || !lr || !cnt || !out;
  if (bad) fprintf(stderr, "ep_moe: out of memory\n");
  for (int t = 0; !bad && t < n; t++) {
    for (int h = 0; h < H; h++)
      x[(size_t)t * H + h] =
          float_to_bf16((float)((int)(rng(&seed) % 2001) - 1000) / 256.0f);
    for (int k = 0; k < K; k++) { /* K distinct experts */
      int64_t e;
      int dup;
      do {
        e = (int64_t)(rng(&seed) % (uint64_t)E);
        dup = 0;
        for (int j = 0; j < k; j++) dup |= idx[(size_t)t * K + j] == e;
      } while (dup);
      idx[(size_t)t * K + k] = e;
      w[(size_t)t * K + k] = (float)(rng(&seed) % 1000) / 1000.0f;
    }
  }
  double t0 = now_us();
  mep_ep_dispatch_args_t d = {
      .struct_size = sizeof d, .x = x, .topk_idx = idx, .num_tokens = n,
      .num_topk = K, .recv_x = rx, .recv_src_info = si,
      .recv_layout_range = lr, .recv_count = cnt};
  int rc = bad ? MEP_ERR_NOMEM : mep_ep_dispatch(b, &d);
  if (rc) bad = die("dispatch", rc);
  /* The experts: rows of each local expert, source by source, are what the
   * dispatch delivered; each expert scales them into the combine buffer. */
  uint16_t *y = bad ? NULL : mep_ep_combine_buffer(b);
  for (int el = 0; !bad && el < L; el++) {
    float f = expert_scale(o->rank * L + el);
    for (int s = 0; s < R; s++) {
      int64_t v = lr[(size_t)el * R + s];
      size_t begin = (size_t)(v >> 32), cnt_s = (size_t)(uint32_t)v;
      for (size_t row = begin; row < begin + cnt_s; row++)
        for (int h = 0; h < H; h++) {
          size_t i = ((size_t)el * S + row) * H + (size_t)h;
          y[i] = float_to_bf16(bf16_to_float(rx[i]) * f);
        }
    }
  }
  mep_ep_combine_args_t c = {
      .struct_size = sizeof c, .x = y, .topk_idx = idx, .topk_weights = w,
      .src_info = si, .layout_range = lr, .num_tokens = n, .num_topk = K,
      .flags = MEP_EP_ZERO_COPY, .out = out};
  if (!bad && (rc = mep_ep_combine(b, &c))) bad = die("combine", rc);
  *us = now_us() - t0;
  /* out[t] = bf16(sum_k w * scale_e * x_t), summed in float: the scaled
   * rows are exact in bf16, so one rounding of the same sum must match */
  for (int t = 0; !bad && t < n; t++)
    for (int h = 0; h < H; h++) {
      float sum = 0.0f, xv = bf16_to_float(x[(size_t)t * H + h]);
      for (int k = 0; k < K; k++)
        sum += w[(size_t)t * K + k] *
               (xv * expert_scale((int)idx[(size_t)t * K + k]));
      uint16_t want = float_to_bf16(sum), got = out[(size_t)t * H + h];
      if (got != want) {
        fprintf(stderr, "ep_moe: rank %d round %d: token %d channel %d: got "
                        "%g, want %g\n", o->rank, round, t, h,
                bf16_to_float(got), bf16_to_float(want));
        bad = 1;
      }
    }
  free(x);
  free(idx);
  free(w);
  free(rx);
  free(si);
  free(lr);
  free(cnt);
  free(out);
  return bad;
}

int main(int argc, char **argv) {
  opts_t o;
  if (parse(argc, argv, &o)) {
    usage(stderr);
    return 2;
  }
  mep_store_server_t *srv = NULL;
  int rc = o.rank == 0 ? mep_store_server_start(o.host, o.port, &srv) : 0;
  if (rc) return die("store server", rc);
  mep_store_t *store;
  if ((rc = mep_store_tcp_connect(o.host, o.port, 30000, &store)))
    return die("store", rc);
  mep_comm_t *comm;
  if ((rc = mep_comm_create(store, o.rank, o.size, NULL, &comm)))
    return die("communicator", rc);
  mep_ep_config_t cfg = {.struct_size = sizeof cfg,
                         .max_tokens_per_rank = o.tokens,
                         .hidden = o.hidden,
                         .num_experts = o.size * o.local,
                         .flags = MEP_EP_HOST};
  mep_ep_buffer_t *b;
  if ((rc = mep_ep_buffer_create(comm, &cfg, &b))) return die("buffer", rc);
  int bad = 0;
  double us = 0, total = 0;
  for (int r = 0; r < o.iters && !bad; r++) {
    bad = round_trip(b, &o, r, &us);
    total += us;
  }
  if (!bad)
    printf("rank %d: %d rounds of dispatch + combine checked (%d ranks, %d "
           "experts, top-%d, hidden %d); %.0f us per round\n", o.rank,
           o.iters, o.size, o.size * o.local, o.topk, o.hidden,
           total / o.iters);
  /* all ranks are done with each other's memory before any frees it */
  mep_req_t *req = NULL;
  if ((rc = mep_barrier(comm, &req)) == 0 && req) rc = mep_req_wait(req, -1);
  mep_req_free(req);
  mep_ep_buffer_destroy(b);
  mep_comm_destroy(comm);
  mep_store_destroy(store);
  mep_store_server_stop(srv);
  return bad || rc < 0;
}
