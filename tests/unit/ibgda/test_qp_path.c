/* test_qp_path.c - the multi-producer posting path of mep/device/
 * mlx5_qp.h (what GPU kernels run), compiled for the host and run by
 * several threads at once against the software model of the NIC, through
 * a MEP_DEV_MLX5 descriptor as the ibgda plugin fills it. A small ring
 * makes producers wait for room and wrap; each thread's data and its
 * final SET are checked against a reference, ADDs from all threads must
 * sum exactly (one queue pair: the NIC applies them in turn), and after
 * quiet every building block is completed. Then an error CQE fails the
 * queue pair for every producer. */
#include <pthread.h>
#include <stdarg.h>
#include <unistd.h>

#include "check.h"
#include "model.h"
#include "mep/device/mlx5_qp.h"

static void t_log(mep_log_level_t lvl, const char *fmt, ...) {
  (void)lvl, (void)fmt;
}
static void t_err(const char *fmt, ...) { (void)fmt; }
static mep_tp_env_t env = {.struct_size = sizeof(mep_tp_env_t),
                           .log = t_log, .set_error = t_err};

#define THREADS 4
#define OPS 3000
#define SLOT 512 /* bytes of dst per op of a thread */
static m5_t m;
static mep_dev_mlx5_peer_t desc;
static uint8_t *src[THREADS], *dst;
static uint64_t *words; /* [THREADS] SET words, then one ADD word */
static uint32_t skey[THREADS], dkey, wkey, sinkkey;
static uint64_t added[THREADS];

static uint64_t deadline(void) { return mep_mlx5_now_ns() + 10000000000ull; }

static void *producer(void *arg) {
  int t = (int)(intptr_t)arg;
  mep_mlx5_qp_t q = mep_mlx5_qp_view(&desc);
  uint64_t s = 1000 + (uint64_t)t;
  for (int i = 0; i < OPS; i++) {
    uint64_t r = splitmix64(&s);
    uint8_t *d = dst + ((size_t)t * OPS + (size_t)i) * SLOT;
    uint32_t len = 1 + (uint32_t)(r % SLOT);
    int rc;
    if (r & (1ull << 40)) {
      uint8_t *sp = src[t] + (size_t)i * SLOT;
      fill_random(sp, len, r);
      rc = mep_mlx5_qp_put(&q, (uint64_t)(uintptr_t)d, dkey,
                           (uint64_t)(uintptr_t)sp, skey[t], len,
                           deadline());
    } else {
      uint8_t b[SLOT];
      if (len > MEP_MLX5_MAX_INLINE) len = MEP_MLX5_MAX_INLINE;
      fill_random(b, len, r);
      rc = mep_mlx5_qp_put_inline(&q, (uint64_t)(uintptr_t)d, dkey, b, len,
                                  deadline());
    }
    CHECK(rc == 0, "thread %d op %d: %d", t, i, rc);
    uint64_t add = (r >> 8) & 0xffff;
    added[t] += add;
    CHECK(!mep_mlx5_qp_signal(&q, (uint64_t)(uintptr_t)&words[THREADS], wkey,
                              add, 1, deadline()), "add");
    CHECK(!mep_mlx5_qp_signal(&q, (uint64_t)(uintptr_t)&words[t], wkey,
                              (uint64_t)i + 1, 0, deadline()), "set");
  }
  return NULL;
}

int main(void) {
  alarm(120);
  CHECK(!mep__m5_open(&m, &env, 0), "open");
  m5_qp_t *qp;
  CHECK(!mep__m5_qp_create(&m, 64, 64, &qp), "qp");
  mep__m5_qp_target(&m, qp, 0, getpid(), (uint64_t)(uintptr_t)m.keys);
  uint64_t *ctr = aligned_alloc(64, 64), *sink = aligned_alloc(64, 64);
  memset(ctr, 0, 64);
  size_t dlen = (size_t)THREADS * OPS * SLOT;
  dst = calloc(1, dlen);
  words = aligned_alloc(64, 64);
  memset(words, 0, 64);
  CHECK(dst && !mep__m5_reg(&m, dst, dlen, &dkey) &&
            !mep__m5_reg(&m, words, 64, &wkey) &&
            !mep__m5_reg(&m, sink, 8, &sinkkey),
        "reg");
  for (int t = 0; t < THREADS; t++) {
    src[t] = malloc((size_t)OPS * SLOT);
    CHECK(src[t] && !mep__m5_reg(&m, src[t], (size_t)OPS * SLOT, &skey[t]),
          "reg src");
  }
  desc = (mep_dev_mlx5_peer_t){
      .hdr = {MEP_DEV_MLX5, MEP_DEV_MLX5_VERSION, sizeof desc},
      .qpn = qp->qpn, .sq_bbs = qp->sq_bbs,
      .sq = (uint64_t)(uintptr_t)qp->sq,
      .dbrec = (uint64_t)(uintptr_t)qp->dbrec,
      .db = (uint64_t)(uintptr_t)qp->db,
      .pi = (uint64_t)(uintptr_t)&ctr[0],
      .ready = (uint64_t)(uintptr_t)&ctr[1],
      .ci = (uint64_t)(uintptr_t)&ctr[2],
      .cq = (uint64_t)(uintptr_t)qp->cq, .cq_n = qp->cq_n,
      .sink_lkey = sinkkey,
      .cq_dbrec = (uint64_t)(uintptr_t)qp->cq_dbrec,
      .cq_ci = (uint64_t)(uintptr_t)&ctr[3],
      .cq_lock = (uint64_t)(uintptr_t)&ctr[4],
      .sink = (uint64_t)(uintptr_t)sink,
      .flags = MEP_DEV_MLX5_MODEL};
  CHECK(sizeof desc <= MEP_DEV_DESC_MAX &&
            sizeof(mep_dev_mlx5_region_t) <= MEP_DEV_DESC_MAX,
        "descriptor parts of %zu and %zu bytes exceed MEP_DEV_DESC_MAX",
        sizeof desc, sizeof(mep_dev_mlx5_region_t));
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++)
    CHECK(!pthread_create(&th[t], NULL, producer, (void *)(intptr_t)t), "pc");
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  mep_mlx5_qp_t q = mep_mlx5_qp_view(&desc);
  CHECK(mep_mlx5_qp_quiet(&q, deadline()) == 0, "quiet");
  CHECK(ctr[2] == ctr[0] && ctr[1] == ctr[0],
        "after quiet: pi %llu ready %llu ci %llu",
        (unsigned long long)ctr[0], (unsigned long long)ctr[1],
        (unsigned long long)ctr[2]);
  /* the reference: regenerate every op */
  uint64_t total = 0;
  for (int t = 0; t < THREADS; t++) {
    uint64_t s = 1000 + (uint64_t)t;
    for (int i = 0; i < OPS; i++) {
      uint64_t r = splitmix64(&s);
      uint32_t len = 1 + (uint32_t)(r % SLOT);
      if (!(r & (1ull << 40)) && len > MEP_MLX5_MAX_INLINE)
        len = MEP_MLX5_MAX_INLINE;
      uint8_t *d = dst + ((size_t)t * OPS + (size_t)i) * SLOT;
      long long bad = diff_random(d, len, r);
      CHECK(bad < 0, "thread %d op %d: byte %lld of %u differs", t, i, bad,
            len);
    }
    CHECK(words[t] == OPS, "thread %d's SET word is %llu", t,
          (unsigned long long)words[t]);
    total += added[t];
  }
  CHECK(words[THREADS] == total, "ADD word %llu, want %llu",
        (unsigned long long)words[THREADS], (unsigned long long)total);
  printf("%d producers x %d ops: %llu building blocks through a ring of "
         "%u, all completed\n", THREADS, OPS, (unsigned long long)ctr[0],
         qp->sq_bbs);

  /* an error CQE fails the queue pair for every producer */
  CHECK(mep_mlx5_qp_put(&q, (uint64_t)(uintptr_t)dst, dkey ^ 0x80,
                        (uint64_t)(uintptr_t)src[0], skey[0], 8,
                        deadline()) == 0, "post a bad WQE");
  CHECK(mep_mlx5_qp_quiet(&q, deadline()) == -2, "quiet after an error");
  CHECK(ctr[4] == 2, "cq_lock %llu", (unsigned long long)ctr[4]);
  CHECK(mep_mlx5_qp_put_inline(&q, (uint64_t)(uintptr_t)dst, dkey, "x", 1,
                               deadline()) == -2, "post after the error");
  char msg[320];
  mep__m5_last_error(&m, msg, sizeof msg);
  CHECK(strstr(msg, "key mismatch"), "model said %s", msg);
  mep__m5_close(&m);
  printf("ok\n");
  return 0;
}
