/* test_hw_layout.c - backend = device's layout (plugins/ibgda/hw_layout.c):
 * what mlx5dv_init_obj says of a queue pair and its CQ becomes the layout
 * producers post on. mlx5dv's structures are filled here as libmlx5 fills
 * them, pointing into a queue pair the software model serves, so that the
 * layout's every pointer is then exercised: RDMA WRITEs of random sizes
 * posted through it (mep/device/mlx5_qp.h, as kernels post) must land
 * byte for byte, and their completions free the ring (a swapped doorbell
 * record, register or CQ would stall or fail). Then each kind of queue
 * this version cannot post on is refused with its reason. */
#include <infiniband/mlx5dv.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ibgda.h"
#include "mep/device/mlx5_qp.h"

static void t_log(mep_log_level_t lvl, const char *fmt, ...) {
  (void)lvl, (void)fmt;
}
static void t_err(const char *fmt, ...) { (void)fmt; }
static mep_tp_env_t env = {.struct_size = sizeof(mep_tp_env_t),
                           .log = t_log, .set_error = t_err};

/* mlx5dv_init_obj's answer for queue pair q, as libmlx5 gives it */
static void dv_of(const m5_qp_t *q, struct mlx5dv_qp *dq,
                  struct mlx5dv_cq *dc) {
  memset(dq, 0, sizeof *dq);
  memset(dc, 0, sizeof *dc);
  dq->dbrec = (__be32 *)q->dbrec;
  dq->sq.buf = q->sq;
  dq->sq.wqe_cnt = q->sq_bbs;
  dq->sq.stride = 64;
  dq->bf.reg = q->db;
  dq->bf.size = 256;
  dc->buf = q->cq;
  dc->dbrec = (__be32 *)q->cq_dbrec;
  dc->cqe_cnt = q->cq_n;
  dc->cqe_size = 64;
}

static void refused(const m5_qp_t *q, void (*spoil)(struct mlx5dv_qp *,
                                                    struct mlx5dv_cq *),
                    const char *needle) {
  struct mlx5dv_qp dq;
  struct mlx5dv_cq dc;
  dv_of(q, &dq, &dc);
  spoil(&dq, &dc);
  m5_qp_t v;
  memset(&v, 0, sizeof v);
  char why[240] = "";
  CHECK(mep__ibgda_hw_layout(&dq, &dc, 7, &v, why, sizeof why) == -1,
        "a queue with %s was taken", needle);
  CHECK(strstr(why, needle), "why '%s' lacks '%s'", why, needle);
  CHECK(v.sq == NULL, "a refused layout was filled in");
}

static void stride128(struct mlx5dv_qp *q, struct mlx5dv_cq *c) {
  (void)c;
  q->sq.stride = 128;
}
static void sq_odd(struct mlx5dv_qp *q, struct mlx5dv_cq *c) {
  (void)c;
  q->sq.wqe_cnt = 96;
}
static void sq_tiny(struct mlx5dv_qp *q, struct mlx5dv_cq *c) {
  (void)c;
  q->sq.wqe_cnt = 2;
}
static void cqe128(struct mlx5dv_qp *q, struct mlx5dv_cq *c) {
  (void)q;
  c->cqe_size = 128;
}
static void cq_odd(struct mlx5dv_qp *q, struct mlx5dv_cq *c) {
  (void)q;
  c->cqe_cnt = 100;
}
static void no_bf(struct mlx5dv_qp *q, struct mlx5dv_cq *c) {
  (void)c;
  q->bf.reg = NULL;
}
static void no_cq_dbrec(struct mlx5dv_qp *q, struct mlx5dv_cq *c) {
  (void)q;
  c->dbrec = NULL;
}

int main(void) {
  m5_t m;
  m5_qp_t *qp;
  CHECK(!mep__m5_open(&m, &env, 0), "model");
  CHECK(!mep__m5_qp_create(&m, 64, 64, &qp), "queue pair");
  mep__m5_qp_target(&m, qp, 0, getpid(), (uint64_t)(uintptr_t)m.keys);

  struct mlx5dv_qp dq;
  struct mlx5dv_cq dc;
  dv_of(qp, &dq, &dc);
  m5_qp_t v;
  memset(&v, 0, sizeof v);
  char why[240] = "";
  CHECK(mep__ibgda_hw_layout(&dq, &dc, 0x7abcdef1u, &v, why, sizeof why) ==
            0, "a queue libmlx5 could give was refused: %s", why);
  CHECK(v.qpn == 0xbcdef1u, "qpn %#x: the low 24 bits, as the NIC's", v.qpn);
  CHECK(v.sq_bbs == 64 && v.cq_n == 64, "sizes %u %u", v.sq_bbs, v.cq_n);
  /* the model serves qp by its own number: post with it */
  v.qpn = qp->qpn;

  const size_t N = 1 << 20;
  uint8_t *src = aligned_alloc(64, N), *dst = aligned_alloc(64, N);
  uint64_t *ctr = aligned_alloc(64, 64), *sink = aligned_alloc(64, 64);
  uint32_t skey, dkey, sinkkey;
  CHECK(src && dst && ctr && sink, "memory");
  memset(ctr, 0, 64);
  memset(dst, 0, N);
  uint64_t s = 42;
  for (size_t i = 0; i < N; i++) src[i] = (uint8_t)splitmix64(&s);
  CHECK(!mep__m5_reg(&m, src, N, &skey) && !mep__m5_reg(&m, dst, N, &dkey) &&
            !mep__m5_reg(&m, sink, 8, &sinkkey),
        "registrations");
  mep_dev_mlx5_peer_t d = {
      .hdr = {MEP_DEV_MLX5, MEP_DEV_MLX5_VERSION, sizeof d},
      .qpn = v.qpn, .sq_bbs = v.sq_bbs,
      .sq = (uint64_t)(uintptr_t)v.sq,
      .dbrec = (uint64_t)(uintptr_t)v.dbrec,
      .db = (uint64_t)(uintptr_t)v.db,
      .pi = (uint64_t)(uintptr_t)&ctr[0],
      .ready = (uint64_t)(uintptr_t)&ctr[1],
      .ci = (uint64_t)(uintptr_t)&ctr[2],
      .cq = (uint64_t)(uintptr_t)v.cq, .cq_n = v.cq_n,
      .sink_lkey = sinkkey,
      .cq_dbrec = (uint64_t)(uintptr_t)v.cq_dbrec,
      .cq_ci = (uint64_t)(uintptr_t)&ctr[3],
      .cq_lock = (uint64_t)(uintptr_t)&ctr[4],
      .sink = (uint64_t)(uintptr_t)sink};
  mep_mlx5_qp_t q = mep_mlx5_qp_view(&d);
  uint64_t dl = mep_mlx5_now_ns() + 20000000000ull;
  /* sizes: one byte, odd, around a building block and a page, large;
   * 300 writes wrap the 64-block ring several times */
  const uint32_t fixed[] = {1, 63, 64, 65, 4095, 4097, 65537, 262147};
  size_t at = 0;
  for (int i = 0; i < 300; i++) {
    uint32_t len = i < 8 ? fixed[i] : 1 + (uint32_t)(splitmix64(&s) % 3000);
    if (at + len > N) at = 0;
    CHECK(mep_mlx5_qp_put(&q, (uint64_t)(uintptr_t)(dst + at), dkey,
                          (uint64_t)(uintptr_t)(src + at), skey, len,
                          dl) == 0,
          "write %d of %u bytes", i, len);
    at += len + (splitmix64(&s) % 64);
  }
  CHECK(mep_mlx5_qp_quiet(&q, dl) == 0, "quiet: the completions never came");
  CHECK(ctr[2] == ctr[0], "ci %llu of pi %llu after quiet",
        (unsigned long long)ctr[2], (unsigned long long)ctr[0]);
  /* every byte written matches */
  size_t wrote = 0;
  uint64_t s2 = 42;
  for (size_t i = 0; i < N; i++) (void)splitmix64(&s2); /* src's draws */
  at = 0;
  for (int i = 0; i < 300; i++) {
    uint32_t len = i < 8 ? fixed[i] : 1 + (uint32_t)(splitmix64(&s2) % 3000);
    if (at + len > N) at = 0;
    CHECK(memcmp(dst + at, src + at, len) == 0, "write %d (%u bytes at %zu) "
          "did not land", i, len, at);
    wrote += len;
    at += len + (splitmix64(&s2) % 64);
  }
  char err[320];
  CHECK(mep__m5_last_error(&m, err, sizeof err) == 0, "the model refused a "
        "WQE: %s", err);
  printf("PASS layout from mlx5dv: qpn, sizes; 300 writes (%zu bytes) "
         "posted through it landed\n", wrote);

  refused(qp, stride128, "stride other than 64");
  refused(qp, sq_odd, "power of two of at least 4");
  refused(qp, sq_tiny, "power of two of at least 4");
  refused(qp, cqe128, "CQEs of other than 64 bytes");
  refused(qp, cq_odd, "CQ size that is not a power of two");
  refused(qp, no_bf, "does not name");
  refused(qp, no_cq_dbrec, "does not name");
  printf("PASS refused: 128-byte stride, ring sizes, 128-byte CQEs, "
         "missing objects\n");
  mep__m5_close(&m);
  free(src);
  free(dst);
  free(ctr);
  free(sink);
  return 0;
}
