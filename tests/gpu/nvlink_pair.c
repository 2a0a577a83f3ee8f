/*
 * nvlink_pair.c - the nvlink transport driven directly by two processes.
 *
 * Forks a pair of ranks (rank r uses GPU r % the number of GPUs, so it runs
 * on one GPU or two), which swap address and key blobs over a socketpair
 * (no store) and check: reachable both ways and refused for another host;
 * host memory refused; writes of random data of 1 B to 64 MiB at odd
 * offsets land byte-exact, nothing around them changes, and complete in
 * order; SET and ADD signals; bounds violations refused and nothing of them
 * lands; map() gives a pointer through which the peer's data reads back;
 * close and fini. Then a second pair in which one rank is SIGKILLed: the
 * survivor's writes, unimport, close and fini still return in time.
 *
 * Usage: nvlink_pair [path/to/libmep-transport-nvlink.so]
 * (without it the plugin is found on MEP_PLUGIN_PATH). Exits 77 without a
 * GPU. Prints "N passed, N failed".
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <mep/transport.h>

#include "check.h"

#define STEP_MS 30000 /* deadline of one wait in a child */
#define CHILD_MS 240000 /* deadline of a whole child */
#define FLAGS_LEN 64u
#define DATA_LEN ((64u << 20) + 64u)
#define SRC_LEN ((64u << 20) + 64u)
#define MAP_LEN 4099u
#define PEEK_LEN 16u

static int g_rank = -1, g_pass, g_fail, g_results = -1;
static const char *g_plugin_path;

#define T(cond, ...)                                                          \
  do {                                                                        \
    if (cond) {                                                               \
      g_pass++;                                                               \
    } else {                                                                  \
      g_fail++;                                                               \
      fprintf(stderr, "rank %d FAIL %s:%d: %s: ", g_rank, __FILE__,           \
              __LINE__, #cond);                                               \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, " [last error: %s]\n", mep_last_error());               \
    }                                                                         \
  } while (0)

/* A check the rest of the child depends on. */
#define REQ(cond, ...)                                                        \
  do {                                                                        \
    int ok_ = !!(cond);                                                       \
    T(ok_, __VA_ARGS__);                                                      \
    if (!ok_) finish(1);                                                      \
  } while (0)

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Reports this child's counts to the parent and exits. */
static _Noreturn void finish(int code) {
  int rec[3] = {g_rank, g_pass, g_fail};
  if (g_results >= 0 && write(g_results, rec, sizeof rec) != sizeof rec)
    perror("nvlink_pair: reporting results");
  fprintf(stderr, "rank %d: %d passed, %d failed\n", g_rank, g_pass, g_fail);
  _exit(code == 77 ? 77 : g_fail ? 1 : code);
}

/* ------------------------------------------------ messages between ranks */

static int xfer(int fd, void *buf, size_t len, int out) {
  uint8_t *p = buf;
  int64_t deadline = now_ms() + STEP_MS;
  while (len) {
    struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
    int left = (int)(deadline - now_ms());
    if (left <= 0 || poll(&pfd, 1, left) <= 0) return -1;
    ssize_t n = out ? write(fd, p, len) : read(fd, p, len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static void send_blob(int fd, const void *buf, uint32_t len) {
  REQ(!xfer(fd, &len, sizeof len, 1) && !xfer(fd, (void *)buf, len, 1),
      "sending %u bytes to the peer", len);
}

static uint32_t recv_blob(int fd, void *buf, uint32_t cap) {
  uint32_t len = 0;
  REQ(!xfer(fd, &len, sizeof len, 0) && len <= cap &&
          !xfer(fd, buf, len, 0),
      "receiving a blob of %u bytes (room for %u) from the peer", len, cap);
  return len;
}

static void barrier(int fd, uint8_t tag) {
  uint8_t got = 0;
  REQ(!xfer(fd, &tag, 1, 1) && !xfer(fd, &got, 1, 0) && got == tag,
      "barrier %u with the peer (got %u)", tag, got);
}

/* ----------------------------------------------------- plugin and memory */

typedef struct rank_ctx {
  const mep_transport_t *tp;
  mep_plugin_t *plugin;
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx;
  int fd;
} rank_ctx_t;

static void load_plugin(rank_ctx_t *rc) {
  int r = g_plugin_path ? mep_plugin_open(g_plugin_path, &rc->plugin)
                        : mep_plugin_find("nvlink", &rc->plugin);
  REQ(r == 0, "loading the nvlink plugin: %s", mep_strerror(r));
  rc->tp = mep_plugin_vtable(rc->plugin);
  REQ(rc->tp && rc->tp->map && rc->tp->struct_size >= sizeof *rc->tp,
      "the plugin's vtable has map() (ABI 1.2)");
  REQ(mep_plugin_env_open(&rc->env, NULL, rc->plugin) == 0, "env open");
  rc->env.rank = g_rank;
  rc->env.size = 2;
  rc->env.timeout_ms = 10000;
}

/* Without a GPU the plugin must say so; the test is then skipped. */
static void skip_without_gpu(rank_ctx_t *rc) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) {
    REQ(cudaSetDevice(g_rank % n) == cudaSuccess, "cudaSetDevice(%d)",
        g_rank % n);
    return;
  }
  mep_tp_ctx_t *ctx = NULL;
  int r = rc->tp->init(&rc->env, &ctx);
  T(r == MEP_ERR_UNAVAILABLE, "init without a GPU returned %d", r);
  T(strstr(mep_last_error(), "no CUDA device") != NULL,
    "init's reason names the missing device");
  fprintf(stderr, "rank %d: no CUDA device (%s): skipping\n", g_rank,
          e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  finish(g_fail ? 1 : 77);
}

static void *dev_alloc(size_t len) {
  void *p = NULL;
  REQ(cudaMalloc(&p, len) == cudaSuccess, "cudaMalloc(%zu)", len);
  return p;
}

/* cudaMemcpy from pageable memory may return before the bytes reach the
 * GPU; the other process and the plugin's stream must see them. */
static void to_dev(void *dst, const void *src, size_t len) {
  REQ(cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice) == cudaSuccess &&
          cudaDeviceSynchronize() == cudaSuccess,
      "cudaMemcpy of %zu bytes to the GPU", len);
}

static void from_dev(void *dst, const void *src, size_t len) {
  REQ(cudaMemcpy(dst, src, len, cudaMemcpyDefault) == cudaSuccess,
      "cudaMemcpy of %zu bytes from the GPU", len);
}

static uint64_t word_at(const uint8_t *dev) {
  uint64_t v = 0;
  from_dev(&v, dev, sizeof v);
  return v;
}

/* Reads the flag word with cudaMemcpy until it holds `want` or the
 * deadline passes; the last value read. */
static uint64_t wait_word(const uint8_t *dev, uint64_t want) {
  int64_t deadline = now_ms() + STEP_MS;
  uint64_t v;
  while ((v = word_at(dev)) != want && now_ms() < deadline) nap_us(100);
  return v;
}

/* Polls until `token` completes; its status, or 1 at the deadline. Other
 * completions are failures. */
static int wait_token(rank_ctx_t *rc, uint64_t token, int peer) {
  int64_t deadline = now_ms() + STEP_MS;
  while (now_ms() < deadline) {
    mep_tp_completion_t c[4];
    int n = rc->tp->poll(rc->ctx, c, 4);
    T(n >= 0, "poll returned %d", n);
    if (n < 0) return n;
    for (int i = 0; i < n; i++) {
      T(c[i].token == token && c[i].peer == peer,
        "completion of token %llu peer %d, expected token %llu peer %d",
        (unsigned long long)c[i].token, c[i].peer,
        (unsigned long long)token, peer);
      if (c[i].token == token) return c[i].status;
    }
    if (!n) nap_us(50);
  }
  return 1;
}

static void *reg(rank_ctx_t *rc, void *ptr, size_t len, uint8_t *key,
                 uint32_t *key_len) {
  mep_tp_mr_t *mr = NULL;
  size_t kl = MEP_TP_MAX_RKEY;
  int r = rc->tp->reg(rc->ctx, ptr, len, MEP_MEM_CUDA, &mr, key, &kl);
  REQ(r == 0 && mr && kl <= MEP_TP_MAX_RKEY, "reg of %zu bytes: %d", len, r);
  *key_len = (uint32_t)kl;
  return mr;
}

static mep_tp_rmr_t *import(rank_ctx_t *rc, mep_tp_ep_t *ep, const void *key,
                            uint32_t len) {
  mep_tp_rmr_t *rmr = NULL;
  int r = rc->tp->import(ep, key, len, &rmr);
  REQ(r == 0 && rmr, "import: %d", r);
  return rmr;
}

/* ------------------------------------------------------------ the pair */

typedef struct pair {
  rank_ctx_t rc;
  int peer;
  mep_tp_ep_t *ep;
  uint8_t *rbuf;  /* our allocation: flags then data */
  uint8_t *src;   /* our source of writes */
  mep_tp_mr_t *mr_flags, *mr_data, *mr_src;
  mep_tp_rmr_t *flags, *data; /* the peer's */
  uint8_t *host;  /* DATA_LEN bytes of host staging */
} pair_t;

static uint64_t seed_of(int rank, int round) {
  return 0x5eed0000ull + (uint64_t)rank * 1000 + (uint64_t)round;
}

static void check_reachable(pair_t *p, const uint8_t *blob, uint32_t len) {
  rank_ctx_t *rc = &p->rc;
  char why[256] = "";
  int mine = rc->tp->reachable(rc->ctx, p->peer, blob, len, why, sizeof why);
  T(mine == 1, "reachable(rank %d) = %d: %s", p->peer, mine, why);
  int theirs = -1;
  REQ(!xfer(rc->fd, &mine, sizeof mine, 1) &&
          !xfer(rc->fd, &theirs, sizeof theirs, 0),
      "swapping reachable answers");
  T(theirs == mine, "the peer answered %d, this side %d", theirs, mine);
  /* a context that claims another host is refused, with that reason */
  mep_tp_env_t other = rc->env;
  other.host_id = "a-host-that-is-not-this-one";
  mep_tp_ctx_t *octx = NULL;
  REQ(rc->tp->init(&other, &octx) == 0, "init of a second context");
  uint8_t ob[MEP_TP_MAX_ADDR];
  size_t ol = sizeof ob;
  REQ(rc->tp->address(octx, ob, &ol) == 0, "address of the second context");
  why[0] = '\0';
  int r = rc->tp->reachable(rc->ctx, p->peer, ob, ol, why, sizeof why);
  T(r == 0 && strstr(why, "other host"), "reachable(other host) = %d: %s", r,
    why);
  size_t tiny = 3;
  T(rc->tp->address(octx, ob, &tiny) == MEP_ERR_INVALID,
    "address into 3 bytes is refused");
  T(rc->tp->fini(octx) == 0, "fini of the second context");
  why[0] = '\0';
  r = rc->tp->reachable(rc->ctx, p->peer, "bad", 3, why, sizeof why);
  T(r == 0 && why[0], "reachable(garbage) = %d: %s", r, why);
}

static void check_host_refused(pair_t *p) {
  rank_ctx_t *rc = &p->rc;
  void *h = malloc(4096);
  REQ(h != NULL, "malloc");
  uint8_t key[MEP_TP_MAX_RKEY];
  size_t kl = sizeof key;
  mep_tp_mr_t *mr = NULL;
  int r = rc->tp->reg(rc->ctx, h, 4096, MEP_MEM_HOST, &mr, key, &kl);
  T(r == MEP_ERR_UNSUPPORTED && strstr(mep_last_error(), "host"),
    "reg of host memory returned %d", r);
  kl = sizeof key;
  r = rc->tp->reg(rc->ctx, h, 4096, MEP_MEM_CUDA, &mr, key, &kl);
  T(r == MEP_ERR_UNSUPPORTED, "reg of malloc'ed memory as CUDA memory "
    "returned %d", r);
  free(h);
}

/* Each rank writes a round to the other and checks what it received. */
static void round_trip(pair_t *p, int i, uint64_t len) {
  rank_ctx_t *rc = &p->rc;
  uint64_t roff = 1 + 2 * (uint64_t)i, loff = 3 + 2 * (uint64_t)i;
  REQ(cudaMemset(p->rbuf + FLAGS_LEN, 0xAB, DATA_LEN) == cudaSuccess &&
          cudaDeviceSynchronize() == cudaSuccess,
      "clearing the data region");
  fill_random(p->host, len, seed_of(g_rank, i));
  to_dev(p->src + loff, p->host, len);
  barrier(rc->fd, (uint8_t)(10 + i));
  int r = rc->tp->write(p->ep, p->mr_src, loff, p->data, roff, len,
                        100 + (uint64_t)i);
  T(r == 0, "write of %llu bytes: %d", (unsigned long long)len, r);
  r = rc->tp->signal(p->ep, p->flags, 0, (uint64_t)i + 1, MEP_SIGNAL_SET);
  T(r == 0, "signal after %llu bytes: %d", (unsigned long long)len, r);
  uint64_t v = wait_word(p->rbuf, (uint64_t)i + 1);
  T(v == (uint64_t)i + 1, "round %d: flag %llu, want %d", i,
    (unsigned long long)v, i + 1);
  from_dev(p->host, p->rbuf + FLAGS_LEN + roff - 1, len + 2);
  T(p->host[0] == 0xAB && p->host[len + 1] == 0xAB,
    "round %d: the bytes around the write changed (%#x, %#x)", i,
    p->host[0], p->host[len + 1]);
  long long at = diff_random(p->host + 1, len, seed_of(p->peer, i));
  T(at < 0, "round %d: %llu bytes at offset %llu differ from byte %lld", i,
    (unsigned long long)len, (unsigned long long)roff, at);
  r = wait_token(rc, 100 + (uint64_t)i, p->peer);
  T(r == 0, "round %d: the write completed with %d", i, r);
  barrier(rc->fd, (uint8_t)(20 + i));
}

static void check_order(pair_t *p) {
  rank_ctx_t *rc = &p->rc;
  for (uint64_t t = 0; t < 10; t++)
    T(rc->tp->write(p->ep, p->mr_src, t, p->data, 7 * t, 7, 1000 + t) == 0,
      "write %llu", (unsigned long long)t);
  uint64_t next = 1000;
  int64_t deadline = now_ms() + STEP_MS;
  while (next < 1010 && now_ms() < deadline) {
    mep_tp_completion_t c[3];
    int n = rc->tp->poll(rc->ctx, c, 3);
    REQ(n >= 0 && n <= 3, "poll returned %d", n);
    for (int k = 0; k < n; k++, next++)
      T(c[k].token == next && c[k].status == 0 && c[k].peer == p->peer,
        "completion %d: token %llu status %d, want token %llu status 0", k,
        (unsigned long long)c[k].token, c[k].status,
        (unsigned long long)next);
  }
  T(next == 1010, "%llu of 10 completions arrived",
    (unsigned long long)(next - 1000));
  mep_tp_completion_t c;
  T(rc->tp->poll(rc->ctx, &c, 1) == 0, "no completion is left over");
  T(rc->tp->poll(rc->ctx, NULL, 0) == 0, "poll with max 0");
}

/* ADD through a second import of the flags (one mapping, two regions),
 * which is then unimported while the first stays usable. */
static void check_signals(pair_t *p, const uint8_t *fkey, uint32_t fkl) {
  rank_ctx_t *rc = &p->rc;
  mep_tp_rmr_t *again = import(rc, p->ep, fkey, fkl);
  void *m1 = NULL, *m2 = NULL;
  T(rc->tp->map(p->ep, p->flags, &m1) == 0 &&
        rc->tp->map(p->ep, again, &m2) == 0 && m1 && m1 == m2,
    "two imports of one region map to one address (%p, %p)", m1, m2);
  uint64_t big = (1ull << 32) + 7;
  T(rc->tp->signal(p->ep, again, 8, 5, MEP_SIGNAL_ADD) == 0, "ADD 5");
  T(rc->tp->signal(p->ep, again, 8, big, MEP_SIGNAL_ADD) == 0, "ADD 2^32+7");
  T(rc->tp->signal(p->ep, again, 16, 0x0123456789abcdefull,
                   MEP_SIGNAL_SET) == 0, "SET a 64-bit value");
  T(rc->tp->unimport(p->ep, again) == 0, "unimport of the second import");
  T(rc->tp->signal(p->ep, p->flags, 0, 1000, MEP_SIGNAL_SET) == 0,
    "SET through the first import after the second was released");
  uint64_t v = wait_word(p->rbuf, 1000);
  T(v == 1000, "flag %llu, want 1000", (unsigned long long)v);
  v = word_at(p->rbuf + 8);
  T(v == 5 + big, "ADD gave %llu, want %llu", (unsigned long long)v,
    (unsigned long long)(5 + big));
  v = word_at(p->rbuf + 16);
  T(v == 0x0123456789abcdefull, "SET gave %#llx", (unsigned long long)v);
  barrier(rc->fd, 40);
}

/* Refused operations, then a marker: had any of them been carried out, it
 * would have landed before the marker. */
static void check_bounds(pair_t *p) {
  rank_ctx_t *rc = &p->rc;
  const mep_transport_t *tp = rc->tp;
  T(tp->write(p->ep, p->mr_src, 0, p->data, DATA_LEN - 10, 11, 1) ==
        MEP_ERR_BOUNDS, "a write past the remote end");
  T(tp->write(p->ep, p->mr_src, SRC_LEN - 5, p->data, 0, 6, 2) ==
        MEP_ERR_BOUNDS, "a write past the local end");
  T(tp->write(p->ep, p->mr_src, 0, p->data, UINT64_MAX, 2, 3) ==
        MEP_ERR_BOUNDS, "a remote offset that overflows");
  T(tp->write(p->ep, p->mr_src, 1, p->data, 0, UINT64_MAX, 4) ==
        MEP_ERR_BOUNDS, "a length that overflows");
  T(tp->signal(p->ep, p->flags, 4, 1, MEP_SIGNAL_SET) == MEP_ERR_INVALID,
    "a misaligned signal");
  T(tp->signal(p->ep, p->flags, FLAGS_LEN, 1, MEP_SIGNAL_ADD) ==
        MEP_ERR_BOUNDS, "a signal past the end");
  T(tp->signal(p->ep, p->flags, UINT64_MAX - 7, 1, MEP_SIGNAL_SET) ==
        MEP_ERR_BOUNDS, "a signal at an offset that overflows");
  T(tp->signal(p->ep, p->flags, 0, 1, (mep_signal_op_t)7) == MEP_ERR_INVALID,
    "an unknown signal operation");
  T(tp->signal(p->ep, p->flags, 0, 2000, MEP_SIGNAL_SET) == 0, "marker");
  T(wait_word(p->rbuf, 2000) == 2000, "the marker arrived");
  uint8_t tail[PEEK_LEN];
  from_dev(tail, p->rbuf + FLAGS_LEN + DATA_LEN - PEEK_LEN, PEEK_LEN);
  int clean = 1;
  for (unsigned k = 0; k < PEEK_LEN; k++) clean &= tail[k] == 0xAB;
  T(clean, "the end of the data region is untouched by refused writes");
  mep_tp_completion_t c;
  T(tp->poll(rc->ctx, &c, 1) == 0, "refused writes complete nothing");
  barrier(rc->fd, 41);
}

/* Each rank puts known bytes in its data region; the peer reads them
 * through map(), by a device-to-device copy and back to the host. */
static void check_map(pair_t *p) {
  rank_ctx_t *rc = &p->rc;
  fill_random(p->host, MAP_LEN, seed_of(g_rank, 77));
  to_dev(p->rbuf + FLAGS_LEN, p->host, MAP_LEN);
  barrier(rc->fd, 50);
  void *m = NULL, *mf = NULL;
  T(rc->tp->map(p->ep, p->data, &m) == 0 && m, "map of the data region");
  T(rc->tp->map(p->ep, p->flags, &mf) == 0 &&
        (uint8_t *)mf + FLAGS_LEN == (uint8_t *)m,
    "regions of one allocation map %u bytes apart (%p, %p)", FLAGS_LEN, mf,
    m);
  T(rc->tp->map(NULL, p->data, &m) == MEP_ERR_INVALID, "map without an ep");
  if (m) {
    REQ(cudaMemcpy(p->src, m, MAP_LEN, cudaMemcpyDeviceToDevice) ==
            cudaSuccess, "a device copy from the mapped pointer");
    memset(p->host, 0, MAP_LEN);
    from_dev(p->host, p->src, MAP_LEN);
    long long at = diff_random(p->host, MAP_LEN, seed_of(p->peer, 77));
    T(at < 0, "the peer's bytes read through map() differ at %lld", at);
  }
  barrier(rc->fd, 51);
}

static void teardown(pair_t *p) {
  rank_ctx_t *rc = &p->rc;
  const mep_transport_t *tp = rc->tp;
  T(tp->unimport(p->ep, p->data) == 0, "unimport data");
  T(tp->unimport(p->ep, p->flags) == 0, "unimport flags");
  T(tp->dereg(rc->ctx, p->mr_src) == 0, "dereg src");
  T(tp->dereg(rc->ctx, p->mr_data) == 0, "dereg data");
  T(tp->dereg(rc->ctx, p->mr_flags) == 0, "dereg flags");
  T(tp->close(p->ep) == 0, "close");
  T(tp->close(p->ep) == 0, "a second close");
  T(tp->fini(rc->ctx) == 0, "fini");
  barrier(rc->fd, 60); /* the peer let go of our memory */
  T(cudaFree(p->rbuf) == cudaSuccess && cudaFree(p->src) == cudaSuccess,
    "cudaFree");
  free(p->host);
}

/* Writes go both ways, so each rank is sender and receiver. */
static void pair_main(int rank, int fd) {
  pair_t p = {.peer = 1 - rank};
  rank_ctx_t *rc = &p.rc;
  rc->fd = fd;
  load_plugin(rc);
  skip_without_gpu(rc);
  REQ(rc->tp->init(&rc->env, &rc->ctx) == 0, "init");
  mep_tp_props_t props = {.struct_size = sizeof props};
  REQ(rc->tp->props(rc->ctx, &props) == 0, "props");
  T(props.mem_kinds == MEP_TP_MEM_CUDA && props.dev_kind == MEP_DEV_PTR &&
        props.atomics == 1 && props.event_fd == -1,
    "props: mem_kinds %#x dev_kind %d atomics %d event_fd %d",
    props.mem_kinds, (int)props.dev_kind, props.atomics, props.event_fd);

  uint8_t addr[MEP_TP_MAX_ADDR], paddr[MEP_TP_MAX_ADDR];
  size_t al = sizeof addr;
  REQ(rc->tp->address(rc->ctx, addr, &al) == 0 && al <= MEP_TP_MAX_ADDR,
      "address");
  send_blob(fd, addr, (uint32_t)al);
  uint32_t pal = recv_blob(fd, paddr, sizeof paddr);
  check_reachable(&p, paddr, pal);
  REQ(rc->tp->connect(rc->ctx, p.peer, paddr, pal, &p.ep) == 0 && p.ep,
      "connect");
  mep_tp_ep_t *again = NULL;
  T(rc->tp->connect(rc->ctx, p.peer, paddr, pal, &again) == 0 &&
        again == p.ep, "a second connect to the same process");
  check_host_refused(&p);

  p.rbuf = dev_alloc(FLAGS_LEN + DATA_LEN);
  p.src = dev_alloc(SRC_LEN);
  REQ((p.host = malloc(DATA_LEN + 2)) != NULL, "malloc");
  REQ(cudaMemset(p.rbuf, 0, FLAGS_LEN) == cudaSuccess, "clearing flags");
  uint8_t kf[MEP_TP_MAX_RKEY], kd[MEP_TP_MAX_RKEY], ks[MEP_TP_MAX_RKEY];
  uint32_t kfl, kdl, ksl;
  p.mr_flags = reg(rc, p.rbuf, FLAGS_LEN, kf, &kfl);
  p.mr_data = reg(rc, p.rbuf + FLAGS_LEN, DATA_LEN, kd, &kdl);
  p.mr_src = reg(rc, p.src, SRC_LEN, ks, &ksl);
  send_blob(fd, kf, kfl);
  send_blob(fd, kd, kdl);
  uint8_t pkf[MEP_TP_MAX_RKEY], pkd[MEP_TP_MAX_RKEY];
  uint32_t pkfl = recv_blob(fd, pkf, sizeof pkf);
  uint32_t pkdl = recv_blob(fd, pkd, sizeof pkd);
  mep_tp_rmr_t *bad = NULL;
  T(rc->tp->import(p.ep, pkf, pkfl - 1, &bad) == MEP_ERR_PROTOCOL,
    "a truncated key is refused");
  T(rc->tp->import(p.ep, kf, kfl, &bad) == MEP_ERR_PROTOCOL,
    "a key of another process than the ep's is refused");
  p.flags = import(rc, p.ep, pkf, pkfl);
  p.data = import(rc, p.ep, pkd, pkdl);

  static const uint64_t sizes[] = {1, 7, 4096, (1u << 20) + 3, 64u << 20};
  for (int i = 0; i < (int)(sizeof sizes / sizeof sizes[0]); i++)
    round_trip(&p, i, sizes[i]);
  check_order(&p);
  barrier(fd, 30);
  check_signals(&p, pkf, pkfl);
  check_bounds(&p);
  check_map(&p);
  teardown(&p);
  mep_plugin_env_fini(&rc->env);
  mep_plugin_close(rc->plugin);
  finish(0);
}

/* ------------------------------------------------------ a peer killed */

/* Rank 0 of the second pair: publishes a region, then waits to be killed. */
static void victim_main(int fd) {
  rank_ctx_t rc = {.fd = fd};
  load_plugin(&rc);
  skip_without_gpu(&rc);
  REQ(rc.tp->init(&rc.env, &rc.ctx) == 0, "init");
  uint8_t addr[MEP_TP_MAX_ADDR], key[MEP_TP_MAX_RKEY];
  size_t al = sizeof addr;
  REQ(rc.tp->address(rc.ctx, addr, &al) == 0, "address");
  uint8_t *buf = dev_alloc(1u << 20);
  uint32_t kl;
  reg(&rc, buf, 1u << 20, key, &kl);
  send_blob(fd, addr, (uint32_t)al);
  send_blob(fd, key, kl);
  uint8_t b;
  xfer(fd, &b, 1, 0); /* the kill comes first; else the deadline */
  T(0, "the victim was not killed within %d ms", STEP_MS);
  finish(1);
}

static void survivor_main(int fd, int ctl) {
  rank_ctx_t rc = {.fd = fd};
  load_plugin(&rc);
  skip_without_gpu(&rc);
  REQ(rc.tp->init(&rc.env, &rc.ctx) == 0, "init");
  uint8_t addr[MEP_TP_MAX_ADDR], key[MEP_TP_MAX_RKEY], skey[MEP_TP_MAX_RKEY];
  uint32_t al = recv_blob(fd, addr, sizeof addr);
  uint32_t kl = recv_blob(fd, key, sizeof key), skl;
  mep_tp_ep_t *ep = NULL;
  REQ(rc.tp->connect(rc.ctx, 0, addr, al, &ep) == 0, "connect");
  mep_tp_rmr_t *rmr = import(&rc, ep, key, kl);
  uint8_t *src = dev_alloc(1u << 20);
  mep_tp_mr_t *mr = reg(&rc, src, 1u << 20, skey, &skl);
  T(rc.tp->write(ep, mr, 0, rmr, 0, 1u << 20, 1) == 0, "write");
  T(wait_token(&rc, 1, 0) == 0, "the write completed");
  uint8_t b = 'r';
  REQ(!xfer(ctl, &b, 1, 1) && !xfer(ctl, &b, 1, 0) && b == 'k',
      "the parent reports the peer killed");
  int64_t t0 = now_ms();
  int r = rc.tp->write(ep, mr, 1, rmr, 3, (1u << 20) - 3, 2);
  if (r == 0) {
    r = wait_token(&rc, 2, 0);
    T(r <= 0, "a write to the dead peer's memory neither completed nor "
      "failed in time");
  }
  rc.tp->signal(ep, rmr, 8, 1, MEP_SIGNAL_ADD); /* may fail; must not hang */
  T(rc.tp->unimport(ep, rmr) == 0, "unimport after the peer died");
  T(rc.tp->close(ep) == 0, "close after the peer died");
  T(rc.tp->close(ep) == 0, "a second close");
  T(rc.tp->dereg(rc.ctx, mr) == 0, "dereg");
  T(rc.tp->fini(rc.ctx) == 0, "fini after the peer died");
  int64_t took = now_ms() - t0;
  T(took < 10000, "cleaning up after a dead peer took %lld ms",
    (long long)took);
  cudaFree(src);
  mep_plugin_env_fini(&rc.env);
  mep_plugin_close(rc.plugin);
  finish(0);
}

/* --------------------------------------------------------------- parent */

/* The child's exit code, or -1 after killing it at the deadline or when a
 * signal ended it (`killed`: we sent that one, say nothing). */
static int reap(pid_t pid, int64_t deadline, int killed) {
  int st = 0;
  for (;;) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return -1;
    if (now_ms() >= deadline) {
      fprintf(stderr, "nvlink_pair: child %d missed its deadline; killed\n",
              (int)pid);
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    nap_us(10000);
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (killed) return -1;
  fprintf(stderr, "nvlink_pair: child %d died of signal %d\n", (int)pid,
          WIFSIGNALED(st) ? WTERMSIG(st) : -1);
  return -1;
}

static pid_t spawn(int rank, void (*body)(int, int), int a, int b,
                   int *close_fds, int nclose) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("nvlink_pair: fork");
    exit(1);
  }
  if (pid == 0) {
    g_rank = rank;
    for (int i = 0; i < nclose; i++) close(close_fds[i]);
    body(a, b);
    _exit(1);
  }
  return pid;
}

static void pair_body(int fd, int unused) {
  (void)unused;
  pair_main(g_rank, fd);
}
static void victim_body(int fd, int unused) {
  (void)unused;
  victim_main(fd);
}
static void survivor_body(int fd, int ctl) { survivor_main(fd, ctl); }

/* Exit codes of the first pair: 77 from either means no GPU. */
static int run_pair(int *skipped) {
  int sv[2], bad = 0;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return perror("socketpair"), 1;
  pid_t a = spawn(0, pair_body, sv[0], 0, &sv[1], 1);
  pid_t b = spawn(1, pair_body, sv[1], 0, &sv[0], 1);
  close(sv[0]);
  close(sv[1]);
  int64_t deadline = now_ms() + CHILD_MS;
  int ra = reap(a, deadline, 0), rb = reap(b, deadline, 0);
  *skipped = ra == 77 || rb == 77;
  if (!*skipped) bad = (ra != 0) + (rb != 0);
  return bad;
}

static int run_kill(void) {
  int sv[2], ctl[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) ||
      socketpair(AF_UNIX, SOCK_STREAM, 0, ctl))
    return perror("socketpair"), 1;
  int for_victim[3] = {sv[1], ctl[0], ctl[1]};
  int for_survivor[2] = {sv[0], ctl[0]};
  pid_t v = spawn(0, victim_body, sv[0], -1, for_victim, 3);
  pid_t s = spawn(1, survivor_body, sv[1], ctl[1], for_survivor, 2);
  close(sv[0]);
  close(sv[1]);
  close(ctl[1]);
  uint8_t b = 0;
  int bad = 0, ready = !xfer(ctl[0], &b, 1, 0) && b == 'r';
  kill(v, SIGKILL);
  int rv = reap(v, now_ms() + STEP_MS, 1);
  if (ready) {
    b = 'k';
    if (xfer(ctl[0], &b, 1, 1)) ready = 0;
  } else {
    fprintf(stderr, "nvlink_pair: the survivor never got ready\n");
  }
  close(ctl[0]);
  int rs = reap(s, now_ms() + CHILD_MS, 0);
  if (rv == 77 || rs == 77) return 0;
  bad += !ready + (rs != 0);
  return bad;
}

int main(int argc, char **argv) {
  g_plugin_path = argc > 1 ? argv[1] : NULL;
  signal(SIGPIPE, SIG_IGN);
  int res[2];
  if (pipe(res)) return perror("pipe"), 1;
  g_results = res[1];
  int skipped = 0, bad = run_pair(&skipped);
  if (!skipped) bad += run_kill();
  close(res[1]);
  g_results = -1;
  int pass = 0, fail = 0, rec[3];
  while (read(res[0], rec, sizeof rec) == (ssize_t)sizeof rec) {
    pass += rec[1];
    fail += rec[2];
  }
  if (skipped && !fail) {
    printf("nvlink_pair: no CUDA device here: skipped (%d passed)\n", pass);
    return 77;
  }
  /* a child that died or hung without reporting counts once */
  if (bad && !fail) fail = bad;
  printf("%d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}
