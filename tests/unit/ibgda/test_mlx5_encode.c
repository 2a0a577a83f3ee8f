/* test_mlx5_encode.c - the WQE and CQE encoding of mep/device/mlx5.h,
 * compiled for the host, against rdma-core's infiniband/mlx5dv.h: its
 * values, its structs' layout, and its helpers (mlx5dv_set_ctrl_seg,
 * mlx5dv_set_data_seg) or, where it has none, its structs filled with
 * htobe*, for random inputs. Whole send-queue rings built both ways must
 * be byte-identical, also for WQEs that wrap around the ring's end. */
#include <endian.h>
#include <infiniband/mlx5dv.h>
#include <stddef.h>

#include "check.h"
#include "mep/device/mlx5.h"

static uint64_t seed = 0x1bd6a17;
static uint64_t rnd(void) { return splitmix64(&seed); }

static void values(void) {
  CHECK((int)MEP_MLX5_SEND_WQE_BB == MLX5_SEND_WQE_BB, "BB");
  CHECK((int)MEP_MLX5_SEND_WQE_SHIFT == MLX5_SEND_WQE_SHIFT, "shift");
  CHECK(MEP_MLX5_INLINE_SEG == (uint32_t)MLX5_INLINE_SEG, "inline seg");
  CHECK((int)MEP_MLX5_OPCODE_NOP == MLX5_OPCODE_NOP, "nop");
  CHECK((int)MEP_MLX5_OPCODE_RDMA_WRITE == MLX5_OPCODE_RDMA_WRITE, "write");
  CHECK((int)MEP_MLX5_OPCODE_RDMA_WRITE_IMM == MLX5_OPCODE_RDMA_WRITE_IMM,
        "imm");
  CHECK((int)MEP_MLX5_OPCODE_RDMA_READ == MLX5_OPCODE_RDMA_READ, "read");
  CHECK((int)MEP_MLX5_OPCODE_ATOMIC_CS == MLX5_OPCODE_ATOMIC_CS, "cs");
  CHECK((int)MEP_MLX5_OPCODE_ATOMIC_FA == MLX5_OPCODE_ATOMIC_FA, "fa");
  CHECK((int)MEP_MLX5_CTRL_CQ_UPDATE == MLX5_WQE_CTRL_CQ_UPDATE, "ce");
  CHECK((int)MEP_MLX5_CTRL_SOLICITED == MLX5_WQE_CTRL_SOLICITED, "se");
  CHECK((int)MEP_MLX5_CTRL_FENCE == MLX5_WQE_CTRL_FENCE, "fence");
  CHECK((int)MEP_MLX5_CTRL_SMALL_FENCE == MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE,
        "small fence");
  CHECK((int)MEP_MLX5_CQE_REQ == MLX5_CQE_REQ, "req");
  CHECK((int)MEP_MLX5_CQE_RESP_WR_IMM == MLX5_CQE_RESP_WR_IMM, "resp imm");
  CHECK((int)MEP_MLX5_CQE_REQ_ERR == MLX5_CQE_REQ_ERR, "req err");
  CHECK((int)MEP_MLX5_CQE_RESP_ERR == MLX5_CQE_RESP_ERR, "resp err");
  CHECK((int)MEP_MLX5_CQE_INVALID == MLX5_CQE_INVALID, "invalid");
  CHECK((int)MEP_MLX5_CQE_OWNER_MASK == MLX5_CQE_OWNER_MASK, "owner");
  CHECK((int)MEP_MLX5_SYND_LOCAL_LENGTH_ERR ==
            MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
        "s1");
  CHECK(
      (int)MEP_MLX5_SYND_LOCAL_QP_OP_ERR == MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
      "s2");
  CHECK((int)MEP_MLX5_SYND_LOCAL_PROT_ERR == MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
        "s4");
  CHECK((int)MEP_MLX5_SYND_WR_FLUSH_ERR == MLX5_CQE_SYNDROME_WR_FLUSH_ERR,
        "s5");
  CHECK((int)MEP_MLX5_SYND_BAD_RESP_ERR == MLX5_CQE_SYNDROME_BAD_RESP_ERR,
        "s10");
  CHECK((int)MEP_MLX5_SYND_LOCAL_ACCESS_ERR ==
            MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR,
        "s11");
  CHECK((int)MEP_MLX5_SYND_REMOTE_INVAL_REQ_ERR ==
            MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR,
        "s12");
  CHECK((int)MEP_MLX5_SYND_REMOTE_ACCESS_ERR ==
            MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR,
        "s13");
  CHECK((int)MEP_MLX5_SYND_REMOTE_OP_ERR == MLX5_CQE_SYNDROME_REMOTE_OP_ERR,
        "s14");
  CHECK((int)(int)MEP_MLX5_SND_DBR == MLX5_SND_DBR &&
            (int)MEP_MLX5_RCV_DBR == MLX5_RCV_DBR,
        "dbr");
}

#define SAME(a, fa, b, fb)                                \
  CHECK(offsetof(a, fa) == offsetof(b, fb) &&             \
            sizeof(((a *)0)->fa) == sizeof(((b *)0)->fb), \
        "%s.%s", #a, #fa)

static void layout(void) {
  CHECK(sizeof(mep_mlx5_ctrl_seg_t) == sizeof(struct mlx5_wqe_ctrl_seg), "c");
  SAME(mep_mlx5_ctrl_seg_t, opmod_idx_opcode, struct mlx5_wqe_ctrl_seg,
       opmod_idx_opcode);
  SAME(mep_mlx5_ctrl_seg_t, qpn_ds, struct mlx5_wqe_ctrl_seg, qpn_ds);
  SAME(mep_mlx5_ctrl_seg_t, signature, struct mlx5_wqe_ctrl_seg, signature);
  SAME(mep_mlx5_ctrl_seg_t, dci_stream_channel_id, struct mlx5_wqe_ctrl_seg,
       dci_stream_channel_id);
  SAME(mep_mlx5_ctrl_seg_t, fm_ce_se, struct mlx5_wqe_ctrl_seg, fm_ce_se);
  SAME(mep_mlx5_ctrl_seg_t, imm, struct mlx5_wqe_ctrl_seg, imm);
  CHECK(sizeof(mep_mlx5_raddr_seg_t) == sizeof(struct mlx5_wqe_raddr_seg),
        "r");
  SAME(mep_mlx5_raddr_seg_t, raddr, struct mlx5_wqe_raddr_seg, raddr);
  SAME(mep_mlx5_raddr_seg_t, rkey, struct mlx5_wqe_raddr_seg, rkey);
  CHECK(sizeof(mep_mlx5_data_seg_t) == sizeof(struct mlx5_wqe_data_seg), "d");
  SAME(mep_mlx5_data_seg_t, byte_count, struct mlx5_wqe_data_seg, byte_count);
  SAME(mep_mlx5_data_seg_t, lkey, struct mlx5_wqe_data_seg, lkey);
  SAME(mep_mlx5_data_seg_t, addr, struct mlx5_wqe_data_seg, addr);
  CHECK(
      sizeof(mep_mlx5_inl_data_seg_t) == sizeof(struct mlx5_wqe_inl_data_seg),
      "i");
  CHECK(sizeof(mep_mlx5_atomic_seg_t) == sizeof(struct mlx5_wqe_atomic_seg),
        "a");
  SAME(mep_mlx5_atomic_seg_t, swap_add, struct mlx5_wqe_atomic_seg, swap_add);
  SAME(mep_mlx5_atomic_seg_t, compare, struct mlx5_wqe_atomic_seg, compare);
  CHECK(sizeof(mep_mlx5_cqe_t) == sizeof(struct mlx5_cqe64), "cqe");
  CHECK(
      (int)MEP_MLX5_CQE_OFF_IMM == offsetof(struct mlx5_cqe64, imm_inval_pkey),
      "imm");
  CHECK(
      (int)MEP_MLX5_CQE_OFF_BYTE_CNT == offsetof(struct mlx5_cqe64, byte_cnt),
      "bc");
  CHECK((int)MEP_MLX5_CQE_OFF_SOP_QPN ==
            offsetof(struct mlx5_cqe64, sop_drop_qpn),
        "qpn");
  CHECK((int)MEP_MLX5_CQE_OFF_WQE_COUNTER ==
            offsetof(struct mlx5_cqe64, wqe_counter),
        "wc");
  CHECK((int)MEP_MLX5_CQE_OFF_SIGNATURE ==
            offsetof(struct mlx5_cqe64, signature),
        "sig");
  CHECK((int)MEP_MLX5_CQE_OFF_OP_OWN == offsetof(struct mlx5_cqe64, op_own),
        "oo");
  CHECK(sizeof(struct mlx5_err_cqe) == 64, "err cqe");
  CHECK((int)MEP_MLX5_CQE_OFF_SYNDROME ==
            offsetof(struct mlx5_err_cqe, syndrome),
        "synd");
  CHECK((int)MEP_MLX5_CQE_OFF_VENDOR_SYND ==
            offsetof(struct mlx5_err_cqe, vendor_err_synd),
        "vsynd");
  CHECK((int)MEP_MLX5_CQE_OFF_SOP_QPN ==
            offsetof(struct mlx5_err_cqe, s_wqe_opcode_qpn),
        "err qpn");
  CHECK((int)MEP_MLX5_CQE_OFF_WQE_COUNTER ==
            offsetof(struct mlx5_err_cqe, wqe_counter),
        "err wc");
  CHECK((int)MEP_MLX5_CQE_OFF_OP_OWN == offsetof(struct mlx5_err_cqe, op_own),
        "err oo");
}

/* Each segment builder against its mlx5dv.h counterpart. */
static void segments(void) {
  for (int it = 0; it < 10000; it++) {
    uint64_t r = rnd(), r2 = rnd(), r3 = rnd();
    uint16_t pi = (uint16_t)r;
    uint8_t op = (uint8_t)(r >> 16), opmod = (uint8_t)(r >> 24);
    uint32_t qpn = (uint32_t)(r2 & 0xffffff);
    uint8_t fm = (uint8_t)(r >> 32), ds = (uint8_t)((r >> 40) & 0x3f);
    uint32_t imm = (uint32_t)r3;

    mep_mlx5_ctrl_seg_t mine;
    memset(&mine, 0xa5, sizeof mine);
    mep_mlx5_set_ctrl(&mine, pi, op, opmod, qpn, fm, ds, imm);
    struct mlx5_wqe_ctrl_seg ref;
    memset(&ref, 0, sizeof ref);
    /* mlx5dv_set_ctrl_seg takes imm as stored (big-endian for WRITE_IMM) */
    mlx5dv_set_ctrl_seg(&ref, pi, op, opmod, qpn, fm, ds, 0, htobe32(imm));
    CHECK(!memcmp(&mine, &ref, 16), "ctrl seg differs (it %d)", it);
    CHECK(mep_mlx5_ctrl_opcode(&mine) == op &&
              mep_mlx5_ctrl_idx(&mine) == pi &&
              mep_mlx5_ctrl_opmod(&mine) == opmod &&
              mep_mlx5_ctrl_qpn(&mine) == qpn && mep_mlx5_ctrl_ds(&mine) == ds,
          "ctrl decode");
    /* the doorbell register value is the segment's first 8 bytes */
    uint64_t db = mep_mlx5_db_value(&mine), first8;
    memcpy(&first8, &ref, 8);
    CHECK(db == first8, "doorbell value");

    uint32_t lkey = (uint32_t)r2, len = (uint32_t)(r2 >> 32);
    uint64_t addr = rnd();
    mep_mlx5_data_seg_t md;
    struct mlx5_wqe_data_seg rd;
    mep_mlx5_set_data(&md, len, lkey, addr);
    mlx5dv_set_data_seg(&rd, len, lkey, (uintptr_t)addr);
    CHECK(!memcmp(&md, &rd, 16), "data seg");

    mep_mlx5_raddr_seg_t mr;
    struct mlx5_wqe_raddr_seg rr = {htobe64(addr), htobe32(lkey), 0};
    memset(&mr, 0xa5, sizeof mr);
    mep_mlx5_set_raddr(&mr, addr, lkey);
    CHECK(!memcmp(&mr, &rr, 16), "raddr seg");

    mep_mlx5_atomic_seg_t ma;
    struct mlx5_wqe_atomic_seg ra = {htobe64(r3), 0};
    memset(&ma, 0xa5, sizeof ma);
    mep_mlx5_set_atomic_fa(&ma, r3);
    CHECK(!memcmp(&ma, &ra, 16), "atomic seg");

    uint32_t il = len % 1024;
    mep_mlx5_inl_data_seg_t mi;
    struct mlx5_wqe_inl_data_seg ri = {htobe32(il | MLX5_INLINE_SEG)};
    mep_mlx5_set_inl(&mi, il);
    CHECK(!memcmp(&mi, &ri, 4), "inline seg");

    CHECK(mep_mlx5_dbrec_value((uint32_t)r) == htobe32((uint32_t)r & 0xffff),
          "dbrec");
    CHECK(mep_mlx5_cq_dbrec_value((uint32_t)r) ==
              htobe32((uint32_t)r & 0xffffff),
          "cq dbrec");
  }
}

/* mlx5dv_set_ctrl_seg leaves the reserved dci_stream_channel_id bytes as
 * they were; the builders zero them, as a caller of mlx5dv does first. */
static void ref_ctrl(void *seg, uint16_t pi, uint8_t op, uint32_t qpn,
                     uint8_t fm, uint8_t ds, uint32_t imm_be) {
  memset(seg, 0, 16);
  mlx5dv_set_ctrl_seg(seg, pi, op, 0, qpn, fm, ds, 0, imm_be);
}

/* Reference WQE builders: mlx5dv.h's structs, written as libmlx5's
 * post_send writes them, into a flat copy of the ring. */
static void *ref_seg(uint8_t *sq, uint32_t nbb, uint32_t pi, uint32_t seg) {
  size_t off = ((size_t)(pi % nbb) * 64 + seg * 16) % ((size_t)nbb * 64);
  return sq + off;
}

static uint32_t ref_write(uint8_t *sq, uint32_t nbb, uint32_t pi, uint32_t qpn,
                          uint8_t fm, uint64_t la, uint32_t lk, uint64_t ra,
                          uint32_t rk, uint32_t len, int imm_op,
                          uint32_t imm) {
  struct mlx5_wqe_raddr_seg *r = ref_seg(sq, nbb, pi, 1);
  r->raddr = htobe64(ra);
  r->rkey = htobe32(rk);
  r->reserved = 0;
  mlx5dv_set_data_seg(ref_seg(sq, nbb, pi, 2), len, lk, (uintptr_t)la);
  ref_ctrl(ref_seg(sq, nbb, pi, 0), (uint16_t)pi,
           imm_op ? MLX5_OPCODE_RDMA_WRITE_IMM : MLX5_OPCODE_RDMA_WRITE, qpn,
           fm, 3, imm_op ? htobe32(imm) : 0);
  return 1;
}

static uint32_t ref_inline(uint8_t *sq, uint32_t nbb, uint32_t pi,
                           uint32_t qpn, uint8_t fm, const uint8_t *src,
                           uint32_t len, uint64_t ra, uint32_t rk) {
  struct mlx5_wqe_raddr_seg *r = ref_seg(sq, nbb, pi, 1);
  r->raddr = htobe64(ra);
  r->rkey = htobe32(rk);
  r->reserved = 0;
  /* header + data, padded to whole 16-byte units, each unit placed on
   * its own (the ring may wrap between units) */
  uint8_t flat[MEP_MLX5_MAX_WQE_BB * 64];
  memset(flat, 0, sizeof flat);
  struct mlx5_wqe_inl_data_seg h = {htobe32(len | MLX5_INLINE_SEG)};
  memcpy(flat, &h, 4);
  memcpy(flat + 4, src, len);
  uint32_t units = (4 + len + 15) / 16;
  for (uint32_t u = 0; u < units; u++)
    memcpy(ref_seg(sq, nbb, pi, 2 + u), flat + 16 * u, 16);
  uint32_t ds = 2 + units;
  ref_ctrl(ref_seg(sq, nbb, pi, 0), (uint16_t)pi, MLX5_OPCODE_RDMA_WRITE, qpn,
           fm, (uint8_t)ds, 0);
  return (ds * 16 + 63) / 64;
}

static uint32_t ref_fa(uint8_t *sq, uint32_t nbb, uint32_t pi, uint32_t qpn,
                       uint8_t fm, uint64_t ra, uint32_t rk, uint64_t add,
                       uint64_t la, uint32_t lk) {
  struct mlx5_wqe_raddr_seg *r = ref_seg(sq, nbb, pi, 1);
  r->raddr = htobe64(ra);
  r->rkey = htobe32(rk);
  r->reserved = 0;
  struct mlx5_wqe_atomic_seg *a = ref_seg(sq, nbb, pi, 2);
  a->swap_add = htobe64(add);
  a->compare = 0;
  mlx5dv_set_data_seg(ref_seg(sq, nbb, pi, 3), 8, lk, (uintptr_t)la);
  ref_ctrl(ref_seg(sq, nbb, pi, 0), (uint16_t)pi, MLX5_OPCODE_ATOMIC_FA, qpn,
           fm, 4, 0);
  return 1;
}

/* Random WQE streams through small rings (so they wrap, also inside a
 * WQE) and past the 16-bit index; both rings must match byte for byte. */
static void rings(void) {
  for (uint32_t nbb = 1; nbb <= 16; nbb *= 2) {
    uint8_t *mine = aligned_alloc(64, nbb * 64),
            *ref = aligned_alloc(64, nbb * 64);
    memset(mine, 0, nbb * 64);
    memset(ref, 0, nbb * 64);
    uint32_t pi = 0xfff0u * (nbb & 1); /* one ring crosses 65536 */
    for (int it = 0; it < 3000; it++) {
      uint64_t r = rnd();
      uint32_t qpn = (uint32_t)(r >> 8) & 0xffffff;
      uint8_t fm = (uint8_t)((r & 1 ? MEP_MLX5_CTRL_CQ_UPDATE : 0) |
                             (r & 2 ? MEP_MLX5_CTRL_FENCE : 0));
      uint64_t la = rnd(), ra = rnd();
      uint32_t lk = (uint32_t)rnd(), rk = (uint32_t)rnd();
      uint32_t a, b;
      switch ((r >> 40) % 4) {
        case 0:
        case 1: {
          int imm_op = (r >> 40) % 4 == 1;
          a = mep_mlx5_wqe_write(mine, nbb - 1, pi, qpn, fm, la, lk, ra, rk,
                                 (uint32_t)r, imm_op, (uint32_t)la);
          b = ref_write(ref, nbb, pi, qpn, fm, la, lk, ra, rk, (uint32_t)r,
                        imm_op, (uint32_t)la);
          break;
        }
        case 2: {
          uint32_t max = MEP_MLX5_MAX_INLINE;
          if (max > nbb * 64 - 36) max = nbb * 64 - 36; /* fits the ring */
          uint32_t len = (uint32_t)(r >> 48) % (max + 1);
          uint8_t src[MEP_MLX5_MAX_INLINE];
          fill_random(src, len, r);
          a = mep_mlx5_wqe_write_inline(mine, nbb - 1, pi, qpn, fm, src, len,
                                        ra, rk);
          b = ref_inline(ref, nbb, pi, qpn, fm, src, len, ra, rk);
          break;
        }
        default:
          a = mep_mlx5_wqe_fetch_add(mine, nbb - 1, pi, qpn, fm, ra & ~7ull,
                                     rk, la, la & ~7ull, lk);
          b = ref_fa(ref, nbb, pi, qpn, fm, ra & ~7ull, rk, la, la & ~7ull,
                     lk);
      }
      CHECK(a == b, "BBs %u, reference %u", a, b);
      CHECK(!memcmp(mine, ref, nbb * 64),
            "ring of %u BBs differs after WQE "
            "%d at pi %u (kind %d)",
            nbb, it, pi, (int)((r >> 40) % 4));
      pi += a;
    }
    free(mine);
    free(ref);
  }
  CHECK((int)MEP_MLX5_MAX_INLINE == 4 * 64 - 36, "max inline");
  CHECK(mep_mlx5_ds_inline(MEP_MLX5_MAX_INLINE) == 16, "max inline ds");
  CHECK(mep_mlx5_sq_fits(10, 2, 2, 10) && !mep_mlx5_sq_fits(10, 2, 3, 10),
        "fits");
}

/* CQEs: what the model writes reads back through mlx5dv.h's struct and
 * accessors, and the owner rule matches libmlx5's. */
static void cqes(void) {
  for (int it = 0; it < 10000; it++) {
    uint64_t r = rnd(), r2 = rnd();
    uint32_t n = 1u << (r % 8), ci = (uint32_t)(r >> 8) & 0xfffff;
    int err = (r >> 30) & 1;
    uint8_t opc = err ? MLX5_CQE_REQ_ERR
                      : ((r >> 31) & 1 ? MLX5_CQE_RESP_WR_IMM : MLX5_CQE_REQ);
    uint32_t qpn = (uint32_t)r2 & 0xffffff;
    uint16_t wc = (uint16_t)(r2 >> 24);
    uint32_t bc = (uint32_t)(r >> 32), imm = (uint32_t)(r2 >> 32);
    uint8_t synd = (uint8_t)(r2 >> 40), vs = (uint8_t)(r2 >> 48);
    uint8_t wop = (uint8_t)(r2 >> 56);
    mep_mlx5_cqe_t q;
    memset(&q, 0x5a, sizeof q);
    mep_mlx5_cqe_fill(&q, opc, wop, qpn, wc, bc, imm, synd, vs);
    q.b[63] = mep_mlx5_cqe_op_own(opc, ci, n);
    struct mlx5_cqe64 c;
    memcpy(&c, &q, 64);
    CHECK(mlx5dv_get_cqe_opcode(&c) == opc, "opcode");
    CHECK(mlx5dv_get_cqe_owner(&c) == ((ci / n) & 1), "owner");
    CHECK(be16toh(c.wqe_counter) == wc, "wqe counter");
    CHECK(be32toh(c.imm_inval_pkey) == imm, "imm");
    CHECK((be32toh(c.sop_drop_qpn) & 0xffffff) == qpn, "qpn");
    if (err) {
      struct mlx5_err_cqe e;
      memcpy(&e, &q, 64);
      CHECK(e.syndrome == synd && e.vendor_err_synd == vs, "syndrome");
      CHECK(be32toh(e.s_wqe_opcode_qpn) >> 24 == wop, "wqe opcode");
      CHECK(mep_mlx5_cqe_syndrome(&q) == synd, "syndrome read");
      CHECK(mep_mlx5_cqe_vendor_syndrome(&q) == vs, "vendor read");
    } else {
      CHECK(be32toh(c.byte_cnt) == bc, "byte count");
      CHECK(mep_mlx5_cqe_byte_cnt(&q) == bc, "byte count read");
    }
    CHECK(mep_mlx5_cqe_opcode(&q) == opc &&
              mep_mlx5_cqe_wqe_counter(&q) == wc &&
              mep_mlx5_cqe_qpn(&q) == qpn && mep_mlx5_cqe_imm(&q) == imm,
          "reads");
    /* libmlx5's get_sw_cqe: valid when not INVALID and owner == !!(ci & n) */
    int sw = mlx5dv_get_cqe_opcode(&c) != MLX5_CQE_INVALID &&
             !((c.op_own & MLX5_CQE_OWNER_MASK) ^ !!(ci & n));
    CHECK(mep_mlx5_cqe_ready(&q, ci, n) == sw && sw, "ready");
    CHECK(!mep_mlx5_cqe_ready(&q, ci + n, n), "a stale pass is not ready");
    mep_mlx5_cqe_init(&q);
    memcpy(&c, &q, 64);
    CHECK(mlx5dv_get_cqe_opcode(&c) == MLX5_CQE_INVALID, "init invalid");
    CHECK(!mep_mlx5_cqe_ready(&q, ci, n), "init not ready");
  }
}

int main(void) {
  values();
  layout();
  segments();
  rings();
  cqes();
  printf("ok\n");
  return 0;
}
