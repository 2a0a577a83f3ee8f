/* test_model.c - the software model of the mlx5 NIC (plugins/ibgda/
 * model.h), driven through the WQE builders of mep/device/mlx5.h as the
 * plugin and kernels drive it: good WQEs of every kind do what a
 * reference memcpy/add says, with the CQEs mlx5 would write; each class
 * of malformed WQE is injected once and must be refused with its
 * syndrome, its sentence, untouched memory and the later WQEs flushed;
 * a completion queue overrun is loud; and a second process is written
 * through process_vm_writev, its keys checked against its own table. */
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "model.h"

static char last_log[512];
static void t_log(mep_log_level_t lvl, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_log, sizeof last_log, fmt, ap);
  va_end(ap);
  (void)lvl;
}
static void t_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
}
static mep_tp_env_t env = {.struct_size = sizeof(mep_tp_env_t),
                           .log = t_log, .set_error = t_err};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A producer over one model QP, as the plugin's host side is. */
typedef struct prod {
  m5_qp_t *q;
  uint32_t pi, cq_ci;
} prod_t;

static void ring(prod_t *p, uint32_t first) {
  const mep_mlx5_ctrl_seg_t *c =
      mep_mlx5_seg(p->q->sq, p->q->sq_bbs - 1, first, 0);
  __atomic_store_n(&p->q->dbrec[MEP_MLX5_SND_DBR],
                   mep_mlx5_dbrec_value(p->pi), __ATOMIC_RELEASE);
  __atomic_store_n(p->q->db, mep_mlx5_db_value(c), __ATOMIC_RELEASE);
}

/* The next CQE, waited for (5 s at most). */
static mep_mlx5_cqe_t next_cqe(prod_t *p) {
  m5_qp_t *q = p->q;
  int64_t deadline = now_ms() + 5000;
  mep_mlx5_cqe_t *c = &q->cq[p->cq_ci & (q->cq_n - 1)];
  while (!mep_mlx5_cqe_ready(c, p->cq_ci, q->cq_n)) {
    CHECK(now_ms() < deadline, "no CQE %u within 5 s", p->cq_ci);
    sched_yield();
  }
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  mep_mlx5_cqe_t out = *c;
  p->cq_ci++;
  __atomic_store_n(&q->cq_dbrec[0], mep_mlx5_cq_dbrec_value(p->cq_ci),
                   __ATOMIC_RELEASE);
  return out;
}

static void expect_ok(prod_t *p, uint16_t idx, uint8_t wop, uint32_t bytes) {
  mep_mlx5_cqe_t c = next_cqe(p);
  CHECK(mep_mlx5_cqe_opcode(&c) == MEP_MLX5_CQE_REQ,
        "CQE opcode %u (syndrome 0x%x), want REQ; model said: %s",
        mep_mlx5_cqe_opcode(&c), mep_mlx5_cqe_syndrome(&c), last_log);
  CHECK(mep_mlx5_cqe_wqe_counter(&c) == idx, "wqe counter %u, want %u",
        mep_mlx5_cqe_wqe_counter(&c), idx);
  CHECK(mep_mlx5_cqe_qpn(&c) == p->q->qpn, "qpn");
  CHECK(mep_mlx5_cqe_byte_cnt(&c) == bytes, "byte count %u, want %u",
        mep_mlx5_cqe_byte_cnt(&c), bytes);
  CHECK(c.b[MEP_MLX5_CQE_OFF_SOP_QPN] == wop, "wqe opcode");
}

static void expect_err(prod_t *p, uint16_t idx, uint8_t synd,
                       const char *phrase) {
  mep_mlx5_cqe_t c = next_cqe(p);
  CHECK(mep_mlx5_cqe_opcode(&c) == MEP_MLX5_CQE_REQ_ERR,
        "CQE opcode %u, want REQ_ERR (%s)", mep_mlx5_cqe_opcode(&c), phrase);
  CHECK(mep_mlx5_cqe_wqe_counter(&c) == idx, "err wqe counter %u, want %u",
        mep_mlx5_cqe_wqe_counter(&c), idx);
  CHECK(mep_mlx5_cqe_syndrome(&c) == synd, "syndrome 0x%x, want 0x%x (%s)",
        mep_mlx5_cqe_syndrome(&c), synd, phrase);
  if (phrase)
    CHECK(strstr(last_log, phrase), "model said '%s', want '%s'", last_log,
          phrase);
}

static m5_t m;
static uint8_t *src, *dst, *ref;
static uint64_t *sink;
static uint32_t skey, dkey, sinkkey;
#define N 8192

static prod_t qp(uint32_t sq, uint32_t cq) {
  prod_t p = {0};
  CHECK(!mep__m5_qp_create(&m, sq, cq, &p.q), "qp");
  mep__m5_qp_target(&m, p.q, 0, getpid(), (uint64_t)(uintptr_t)m.keys);
  return p;
}

/* Many good WQEs of each kind through a small ring, past the 16-bit
 * index, checked against a reference copy of the target. */
static void good(void) {
  prod_t p = qp(16, 16);
  uint64_t s = 7;
  memcpy(ref, dst, N);
  uint32_t count = 0;
  while (p.pi < 70000) {
    uint64_t r = splitmix64(&s);
    uint32_t first = p.pi, mask = p.q->sq_bbs - 1, bytes = 0;
    uint8_t wop = 0;
    switch (r % 4) {
    case 0: {
      uint32_t len = 1 + (uint32_t)(r >> 8) % 2048;
      uint32_t lo = (uint32_t)(r >> 24) % (N - len),
               ro = (uint32_t)(r >> 40) % (N - len);
      fill_random(src + lo, len, r);
      memcpy(ref + ro, src + lo, len);
      p.pi += mep_mlx5_wqe_write(p.q->sq, mask, p.pi, p.q->qpn,
                                 MEP_MLX5_CTRL_CQ_UPDATE,
                                 (uint64_t)(uintptr_t)(src + lo), skey,
                                 (uint64_t)(uintptr_t)(dst + ro), dkey, len,
                                 (r >> 60) & 1, (uint32_t)r);
      bytes = len;
      wop = (r >> 60) & 1 ? MEP_MLX5_OPCODE_RDMA_WRITE_IMM
                          : MEP_MLX5_OPCODE_RDMA_WRITE;
      break;
    }
    case 1: {
      uint32_t len = (uint32_t)(r >> 8) % (MEP_MLX5_MAX_INLINE + 1);
      uint32_t ro = (uint32_t)(r >> 40) % (N - len);
      uint8_t b[MEP_MLX5_MAX_INLINE];
      fill_random(b, len, r);
      memcpy(ref + ro, b, len);
      p.pi += mep_mlx5_wqe_write_inline(p.q->sq, mask, p.pi, p.q->qpn,
                                        MEP_MLX5_CTRL_CQ_UPDATE, b, len,
                                        (uint64_t)(uintptr_t)(dst + ro),
                                        dkey);
      bytes = len;
      wop = MEP_MLX5_OPCODE_RDMA_WRITE;
      break;
    }
    case 2: {
      uint32_t ro = ((uint32_t)(r >> 40) % (N / 8)) * 8;
      uint64_t old, add = r >> 3;
      memcpy(&old, ref + ro, 8);
      uint64_t nv = old + add;
      memcpy(ref + ro, &nv, 8);
      *sink = ~old;
      p.pi += mep_mlx5_wqe_fetch_add(p.q->sq, mask, p.pi, p.q->qpn,
                                     MEP_MLX5_CTRL_CQ_UPDATE,
                                     (uint64_t)(uintptr_t)(dst + ro), dkey,
                                     add, (uint64_t)(uintptr_t)sink,
                                     sinkkey);
      ring(&p, first);
      expect_ok(&p, (uint16_t)first, MEP_MLX5_OPCODE_ATOMIC_FA, 8);
      CHECK(*sink == old, "fetch-add returned %llx, want %llx",
            (unsigned long long)*sink, (unsigned long long)old);
      count++;
      continue;
    }
    default:
      p.pi += mep_mlx5_wqe_nop(p.q->sq, mask, p.pi, p.q->qpn,
                               MEP_MLX5_CTRL_CQ_UPDATE);
      wop = MEP_MLX5_OPCODE_NOP;
    }
    ring(&p, first);
    expect_ok(&p, (uint16_t)first, wop, bytes);
    count++;
  }
  CHECK(!memcmp(dst, ref, N), "target differs from the reference after %u "
        "WQEs", count);
  /* unsignaled WQEs complete with the next signaled one, in order */
  uint32_t first = p.pi;
  for (int i = 0; i < 5; i++)
    p.pi += mep_mlx5_wqe_write_inline(p.q->sq, 15, p.pi, p.q->qpn, 0, "abc",
                                      3, (uint64_t)(uintptr_t)(dst + i), dkey);
  uint32_t last = p.pi;
  p.pi += mep_mlx5_wqe_nop(p.q->sq, 15, p.pi, p.q->qpn,
                           MEP_MLX5_CTRL_CQ_UPDATE);
  ring(&p, last);
  expect_ok(&p, (uint16_t)last, MEP_MLX5_OPCODE_NOP, 0);
  CHECK(!memcmp(dst, "aaaaabc", 7), "unsignaled inline writes");
  (void)first;
  mep__m5_qp_destroy(&m, p.q);
}

/* One malformed WQE on a fresh QP: refused with its syndrome, nothing
 * written, and a good WQE after it flushed. */
typedef void (*build_fn)(prod_t *p);
static void bad(const char *what, build_fn build, uint8_t synd,
                const char *phrase) {
  prod_t p = qp(16, 16);
  memcpy(ref, dst, N);
  uint64_t nerr = mep__m5_last_error(&m, NULL, 0);
  uint32_t first = p.pi;
  build(&p);
  uint32_t second = p.pi;
  p.pi += mep_mlx5_wqe_write_inline(p.q->sq, 15, p.pi, p.q->qpn,
                                    MEP_MLX5_CTRL_CQ_UPDATE, "zz", 2,
                                    (uint64_t)(uintptr_t)dst, dkey);
  ring(&p, second);
  expect_err(&p, (uint16_t)first, synd, phrase);
  expect_err(&p, (uint16_t)second, MEP_MLX5_SYND_WR_FLUSH_ERR, NULL);
  CHECK(mep__m5_last_error(&m, NULL, 0) == nerr + 1,
        "%s: the model reported %llu errors, want 1", what,
        (unsigned long long)(mep__m5_last_error(&m, NULL, 0) - nerr));
  CHECK(!memcmp(dst, ref, N), "%s: memory changed", what);
  printf("refused as it must be: %s: %s\n", what, last_log);
  mep__m5_qp_destroy(&m, p.q);
}

#define D(off) ((uint64_t)(uintptr_t)(dst + (off)))
#define S(off) ((uint64_t)(uintptr_t)(src + (off)))
static void b_opcode(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, D(0), dkey,
                              16, 0, 0);
  /* SEND (0x0a): not an operation of a one-sided transport */
  mep_mlx5_ctrl_seg_t *c = mep_mlx5_seg(p->q->sq, 15, p->pi - 1, 0);
  mep_mlx5_set_ctrl(c, p->pi - 1, 0x0a, 0, p->q->qpn,
                    MEP_MLX5_CTRL_CQ_UPDATE, 3, 0);
}
static void b_ds(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, D(0), dkey,
                              16, 0, 0);
  mep_mlx5_set_ctrl(mep_mlx5_seg(p->q->sq, 15, p->pi - 1, 0), p->pi - 1,
                    MEP_MLX5_OPCODE_RDMA_WRITE, 0, p->q->qpn,
                    MEP_MLX5_CTRL_CQ_UPDATE, 2, 0);
}
static void b_ds_inline(prod_t *p) {
  uint32_t at = p->pi;
  p->pi += mep_mlx5_wqe_write_inline(p->q->sq, 15, p->pi, p->q->qpn,
                                     MEP_MLX5_CTRL_CQ_UPDATE, "0123456789",
                                     10, D(8), dkey);
  /* claims one unit less than the 10 bytes need */
  mep_mlx5_set_ctrl(mep_mlx5_seg(p->q->sq, 15, at, 0), at,
                    MEP_MLX5_OPCODE_RDMA_WRITE, 0, p->q->qpn,
                    MEP_MLX5_CTRL_CQ_UPDATE, 4, 0);
}
static void b_ds_zero(prod_t *p) {
  p->pi += mep_mlx5_wqe_nop(p->q->sq, 15, p->pi, p->q->qpn,
                            MEP_MLX5_CTRL_CQ_UPDATE);
  mep_mlx5_set_ctrl(mep_mlx5_seg(p->q->sq, 15, p->pi - 1, 0), p->pi - 1,
                    MEP_MLX5_OPCODE_NOP, 0, p->q->qpn,
                    MEP_MLX5_CTRL_CQ_UPDATE, 0, 0);
}
static void b_misaligned(prod_t *p) {
  p->pi += mep_mlx5_wqe_fetch_add(p->q->sq, 15, p->pi, p->q->qpn,
                                  MEP_MLX5_CTRL_CQ_UPDATE, D(12), dkey, 1,
                                  (uint64_t)(uintptr_t)sink, sinkkey);
}
static void b_rkey(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, D(0),
                              dkey ^ 0x80, 16, 0, 0);
}
static void b_lkey(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), dkey, D(0), dkey,
                              16, 0, 0);
}
static void b_range(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, D(N - 8),
                              dkey, 16, 0, 0);
}
static void b_range_local(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(N - 1), skey, D(0),
                              dkey, 2, 0, 0);
}
static void b_index(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, D(0), dkey,
                              16, 0, 0);
  mep_mlx5_set_ctrl(mep_mlx5_seg(p->q->sq, 15, p->pi - 1, 0), p->pi + 3,
                    MEP_MLX5_OPCODE_RDMA_WRITE, 0, p->q->qpn,
                    MEP_MLX5_CTRL_CQ_UPDATE, 3, 0);
}
static void b_qpn(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn + 1,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, D(0), dkey,
                              16, 0, 0);
}
static void b_atomic_len(prod_t *p) {
  p->pi += mep_mlx5_wqe_fetch_add(p->q->sq, 15, p->pi, p->q->qpn,
                                  MEP_MLX5_CTRL_CQ_UPDATE, D(16), dkey, 1,
                                  (uint64_t)(uintptr_t)sink, sinkkey);
  mep_mlx5_set_data(mep_mlx5_seg(p->q->sq, 15, p->pi - 1, 3), 4, sinkkey,
                    (uint64_t)(uintptr_t)sink);
}
static uint32_t gone_key;
static void b_dereg(prod_t *p) {
  p->pi += mep_mlx5_wqe_write(p->q->sq, 15, p->pi, p->q->qpn,
                              MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, D(0),
                              gone_key, 16, 0, 0);
}

static void overrun(void) {
  prod_t p = qp(16, 4);
  uint64_t nerr = mep__m5_last_error(&m, NULL, 0);
  for (int i = 0; i < 5; i++)
    p.pi += mep_mlx5_wqe_nop(p.q->sq, 15, p.pi, p.q->qpn,
                             MEP_MLX5_CTRL_CQ_UPDATE);
  ring(&p, p.pi - 1);
  int64_t deadline = now_ms() + 5000;
  while (mep__m5_last_error(&m, NULL, 0) == nerr)
    CHECK(now_ms() < deadline, "no overrun reported");
  /* the model's thread counts the error before it logs the sentence */
  while (!strstr(last_log, "overrun"))
    CHECK(now_ms() < deadline, "overrun message: %s", last_log);
  for (int i = 0; i < 4; i++) expect_ok(&p, (uint16_t)i, 0, 0);
  printf("refused as it must be: CQ overrun: %s\n", last_log);
  mep__m5_qp_destroy(&m, p.q);
}

/* The model of this process writes into a child process. */
static void cross_process(void) {
  int to_child[2], to_parent[2];
  CHECK(!pipe(to_child) && !pipe(to_parent), "pipe");
  pid_t c = fork();
  CHECK(c >= 0, "fork");
  if (c == 0) {
    alarm(30);
    m5_t cm;
    static uint8_t mem[4096];
    uint32_t k;
    if (mep__m5_open(&cm, &env, 1) || mep__m5_reg(&cm, mem, sizeof mem, &k))
      _exit(2);
    uint64_t msg[3] = {(uint64_t)(uintptr_t)cm.keys,
                       (uint64_t)(uintptr_t)mem, k};
    if (write(to_parent[1], msg, sizeof msg) != sizeof msg) _exit(3);
    uint64_t seed;
    if (read(to_child[0], &seed, 8) != 8) _exit(4);
    uint8_t want[4096];
    memset(want, 0, sizeof want);
    fill_random(want, 1000, seed);
    memcpy(want + 2000, "inline!", 7);
    uint64_t v = 42;
    memcpy(want + 4088, &v, 8);
    _exit(memcmp(mem, want, sizeof want) ? 5 : 0);
  }
  uint64_t msg[3];
  CHECK(read(to_parent[0], msg, sizeof msg) == sizeof msg, "child info");
  prod_t p = qp(16, 16);
  mep__m5_qp_target(&m, p.q, 1, c, msg[0]);
  uint64_t base = msg[1];
  uint32_t rk = (uint32_t)msg[2];
  fill_random(src, 1000, 99);
  uint32_t f = p.pi;
  p.pi += mep_mlx5_wqe_write(p.q->sq, 15, p.pi, p.q->qpn, 0, S(0), skey, base,
                             rk, 1000, 0, 0);
  p.pi += mep_mlx5_wqe_write_inline(p.q->sq, 15, p.pi, p.q->qpn, 0, "inline!",
                                    7, base + 2000, rk);
  uint32_t last = p.pi;
  p.pi += mep_mlx5_wqe_fetch_add(p.q->sq, 15, p.pi, p.q->qpn,
                                 MEP_MLX5_CTRL_CQ_UPDATE, base + 4088, rk, 42,
                                 (uint64_t)(uintptr_t)sink, sinkkey);
  ring(&p, f);
  expect_ok(&p, (uint16_t)last, MEP_MLX5_OPCODE_ATOMIC_FA, 8);
  CHECK(*sink == 0, "the child's word was %llu", (unsigned long long)*sink);
  /* a key that is the child's but not for this range: refused there */
  uint32_t b = p.pi;
  p.pi += mep_mlx5_wqe_write(p.q->sq, 15, p.pi, p.q->qpn,
                             MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, base + 4090,
                             rk, 16, 0, 0);
  ring(&p, b);
  expect_err(&p, (uint16_t)b, MEP_MLX5_SYND_REMOTE_ACCESS_ERR,
             "of rank 1 (out-of-range address)");
  uint64_t seed = 99;
  CHECK(write(to_child[1], &seed, 8) == 8, "go");
  int st;
  CHECK(waitpid(c, &st, 0) == c, "wait");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
        "the child found its memory wrong (status %d)", st);
  mep__m5_qp_destroy(&m, p.q);

  /* a target that is gone: the transport's retries run out */
  prod_t g = qp(16, 16);
  mep__m5_qp_target(&m, g.q, 1, c, msg[0]);
  g.pi += mep_mlx5_wqe_write(g.q->sq, 15, 0, g.q->qpn,
                             MEP_MLX5_CTRL_CQ_UPDATE, S(0), skey, base, rk,
                             16, 0, 0);
  ring(&g, 0);
  expect_err(&g, 0, MEP_MLX5_SYND_TRANSPORT_RETRY_EXC_ERR, "does not answer");
  mep__m5_qp_destroy(&m, g.q);
  printf("cross-process writes, key checks and a vanished target: ok\n");
}

int main(void) {
  alarm(120);
  CHECK(!mep__m5_open(&m, &env, 0), "open");
  src = aligned_alloc(64, N);
  dst = aligned_alloc(64, N);
  ref = malloc(N);
  sink = aligned_alloc(64, 64);
  fill_random(dst, N, 3);
  CHECK(!mep__m5_reg(&m, src, N, &skey) && !mep__m5_reg(&m, dst, N, &dkey) &&
            !mep__m5_reg(&m, sink, 8, &sinkkey),
        "reg");
  good();
  bad("bad opcode", b_opcode, MEP_MLX5_SYND_LOCAL_QP_OP_ERR, "bad opcode");
  bad("bad ds count", b_ds, MEP_MLX5_SYND_LOCAL_LENGTH_ERR, "DS 2");
  bad("inline ds count", b_ds_inline, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
      "does not fit 10 bytes");
  bad("ds 0", b_ds_zero, MEP_MLX5_SYND_LOCAL_LENGTH_ERR, "bad ds count");
  bad("misaligned atomic", b_misaligned, MEP_MLX5_SYND_REMOTE_INVAL_REQ_ERR,
      "misaligned atomic");
  bad("atomic data length", b_atomic_len, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
      "data segment of 4 bytes");
  bad("rkey mismatch", b_rkey, MEP_MLX5_SYND_REMOTE_ACCESS_ERR,
      "key mismatch");
  bad("lkey mismatch", b_lkey, MEP_MLX5_SYND_LOCAL_PROT_ERR,
      "outside lkey");
  bad("out-of-range remote address", b_range,
      MEP_MLX5_SYND_REMOTE_ACCESS_ERR, "out-of-range address");
  bad("out-of-range local address", b_range_local,
      MEP_MLX5_SYND_LOCAL_PROT_ERR, "out-of-range address");
  bad("wrong WQE index", b_index, MEP_MLX5_SYND_LOCAL_QP_OP_ERR,
      "carries index");
  bad("wrong QP number", b_qpn, MEP_MLX5_SYND_LOCAL_QP_OP_ERR, "names QP");
  uint8_t *gone = malloc(64);
  CHECK(!mep__m5_reg(&m, gone, 64, &gone_key), "reg");
  mep__m5_dereg(&m, gone_key);
  bad("deregistered region", b_dereg, MEP_MLX5_SYND_REMOTE_ACCESS_ERR,
      "key mismatch");
  free(gone);
  overrun();
  cross_process();
  mep__m5_close(&m);
  printf("ok\n");
  return 0;
}
