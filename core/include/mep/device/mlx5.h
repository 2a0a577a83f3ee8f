/*
 * device/mlx5.h - mlx5 send-queue work requests, built by hand.
 *
 * Audience: the ibgda plugin (host), the software model of the NIC
 * (plugins/ibgda/model*.c) and GPU kernels (mep/device/mlx5.cuh). One
 * encoding for all three: plain C with MEP_HD qualifiers, so the same
 * functions compile for the host and for the device, and the host's
 * encoding tests (tests/unit/ibgda) check exactly what the GPU runs.
 *
 * The layout is the one rdma-core's infiniband/mlx5dv.h documents (and the
 * ConnectX PRM): a send queue is a ring of 64-byte building blocks (BB); a
 * work request (WQE) takes one or more consecutive BBs and is a list of
 * 16-byte segments:
 *   control (16 B)      opmod | WQE index (16 bits) | opcode,
 *                       QP number (24 bits) | DS (WQE size in 16-byte units),
 *                       signature, fence / completion / solicited flags,
 *                       immediate data
 *   remote address      remote address, rkey
 *   data (pointer)      byte count, lkey, local address
 *   inline data         byte count | MLX5_INLINE_SEG, then the bytes, the
 *                       whole padded to 16 bytes
 *   atomic              add value (FETCH_AND_ADD), compare
 * Every multi-byte field is big-endian. After writing WQEs the producer
 * stores its producer index (counted in BBs, low 16 bits, big-endian) in
 * the doorbell record, then writes the first 8 bytes of the last WQE's
 * control segment to the doorbell register (the UAR page) - that order:
 * the NIC reads the record to learn how far it may fetch.
 *
 * A completion queue is a ring of 64-byte CQEs (struct mlx5_cqe64). The
 * last byte holds opcode (high 4 bits) and the owner bit (bit 0); a CQE
 * belongs to software when its opcode is not MLX5_CQE_INVALID and its
 * owner bit equals the wrap parity of the consumer index ((ci / n) & 1).
 *
 * Byte order: hosts and GPUs here are little-endian; fields are swapped
 * with shifts (nvcc turns them into PRMT), never with htobe* (not in
 * device code).
 */
#ifndef MEP_DEVICE_MLX5_H
#define MEP_DEVICE_MLX5_H

#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mep/device/mlx5.h assumes a little-endian host"
#endif

#ifndef MEP_HD
#ifdef __CUDACC__
#define MEP_HD static __host__ __device__ __forceinline__
#else
#define MEP_HD static inline
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Values of mlx5dv.h (tests/unit/ibgda checks each against it). */
enum {
  MEP_MLX5_SEND_WQE_BB = 64,
  MEP_MLX5_SEND_WQE_SHIFT = 6,
  MEP_MLX5_SEG = 16, /* DS unit */

  MEP_MLX5_OPCODE_NOP = 0x00,
  MEP_MLX5_OPCODE_RDMA_WRITE = 0x08,
  MEP_MLX5_OPCODE_RDMA_WRITE_IMM = 0x09,
  MEP_MLX5_OPCODE_RDMA_READ = 0x10,
  MEP_MLX5_OPCODE_ATOMIC_CS = 0x11,
  MEP_MLX5_OPCODE_ATOMIC_FA = 0x12,

  /* fm_ce_se */
  MEP_MLX5_CTRL_SOLICITED = 1 << 1,
  MEP_MLX5_CTRL_CQ_UPDATE = 2 << 2,
  MEP_MLX5_CTRL_SMALL_FENCE = 1 << 5,
  MEP_MLX5_CTRL_FENCE = 4 << 5,

  /* CQE opcodes (op_own >> 4) */
  MEP_MLX5_CQE_REQ = 0,
  MEP_MLX5_CQE_RESP_WR_IMM = 1,
  MEP_MLX5_CQE_REQ_ERR = 13,
  MEP_MLX5_CQE_RESP_ERR = 14,
  MEP_MLX5_CQE_INVALID = 15,
  MEP_MLX5_CQE_OWNER_MASK = 1,

  /* error CQE syndromes */
  MEP_MLX5_SYND_LOCAL_LENGTH_ERR = 0x01,
  MEP_MLX5_SYND_LOCAL_QP_OP_ERR = 0x02,
  MEP_MLX5_SYND_LOCAL_PROT_ERR = 0x04,
  MEP_MLX5_SYND_WR_FLUSH_ERR = 0x05,
  MEP_MLX5_SYND_BAD_RESP_ERR = 0x10,
  MEP_MLX5_SYND_LOCAL_ACCESS_ERR = 0x11,
  MEP_MLX5_SYND_REMOTE_INVAL_REQ_ERR = 0x12,
  MEP_MLX5_SYND_REMOTE_ACCESS_ERR = 0x13,
  MEP_MLX5_SYND_REMOTE_OP_ERR = 0x14,
  MEP_MLX5_SYND_TRANSPORT_RETRY_EXC_ERR = 0x15,

  /* the doorbell record's words: receive, send (MLX5_RCV_DBR, MLX5_SND_DBR) */
  MEP_MLX5_RCV_DBR = 0,
  MEP_MLX5_SND_DBR = 1,
};

#define MEP_MLX5_INLINE_SEG 0x80000000u

/* The largest inline payload these builders put in one WQE: the WQE stays
 * within MEP_MLX5_MAX_WQE_BB building blocks (ds fits its 6 bits). */
#define MEP_MLX5_MAX_WQE_BB 4
#define MEP_MLX5_MAX_INLINE                                                   \
  (MEP_MLX5_MAX_WQE_BB * MEP_MLX5_SEND_WQE_BB - 2 * MEP_MLX5_SEG - 4)

/* The segments, laid out as mlx5dv.h's structs of the same name. Fields
 * hold big-endian values (use the builders). */
typedef struct mep_mlx5_ctrl_seg {
  uint32_t opmod_idx_opcode;
  uint32_t qpn_ds;
  uint8_t signature;
  uint8_t dci_stream_channel_id[2];
  uint8_t fm_ce_se;
  uint32_t imm;
} mep_mlx5_ctrl_seg_t;

typedef struct mep_mlx5_raddr_seg {
  uint64_t raddr;
  uint32_t rkey;
  uint32_t reserved;
} mep_mlx5_raddr_seg_t;

typedef struct mep_mlx5_data_seg {
  uint32_t byte_count;
  uint32_t lkey;
  uint64_t addr;
} mep_mlx5_data_seg_t;

typedef struct mep_mlx5_inl_data_seg {
  uint32_t byte_count; /* then the bytes */
} mep_mlx5_inl_data_seg_t;

typedef struct mep_mlx5_atomic_seg {
  uint64_t swap_add;
  uint64_t compare;
} mep_mlx5_atomic_seg_t;

/* A CQE is 64 bytes, read through the offsets of struct mlx5_cqe64 and,
 * for an error CQE, struct mlx5_err_cqe. */
typedef struct mep_mlx5_cqe {
  uint8_t b[64];
} mep_mlx5_cqe_t;

enum {
  MEP_MLX5_CQE_SIZE = 64,
  MEP_MLX5_CQE_OFF_IMM = 36,         /* imm_inval_pkey, be32 */
  MEP_MLX5_CQE_OFF_BYTE_CNT = 44,    /* be32 */
  MEP_MLX5_CQE_OFF_VENDOR_SYND = 54, /* mlx5_err_cqe.vendor_err_synd */
  MEP_MLX5_CQE_OFF_SYNDROME = 55,    /* mlx5_err_cqe.syndrome */
  MEP_MLX5_CQE_OFF_SOP_QPN = 56,     /* be32: opcode << 24 | qpn */
  MEP_MLX5_CQE_OFF_WQE_COUNTER = 60, /* be16 */
  MEP_MLX5_CQE_OFF_SIGNATURE = 62,
  MEP_MLX5_CQE_OFF_OP_OWN = 63,
};

/* ------------------------------------------------------------ bytes */

MEP_HD uint16_t mep_mlx5_bswap16(uint16_t v) {
  return (uint16_t)((v >> 8) | (v << 8));
}
MEP_HD uint32_t mep_mlx5_bswap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) |
         (v << 24);
}
MEP_HD uint64_t mep_mlx5_bswap64(uint64_t v) {
  return ((uint64_t)mep_mlx5_bswap32((uint32_t)v) << 32) |
         mep_mlx5_bswap32((uint32_t)(v >> 32));
}

/* DS (16-byte units) and building blocks of a WQE. */
MEP_HD uint32_t mep_mlx5_ds_write(void) { return 3; } /* ctrl raddr data */
MEP_HD uint32_t mep_mlx5_ds_atomic(void) { return 4; } /* + atomic */
MEP_HD uint32_t mep_mlx5_ds_inline(uint32_t len) {
  return 2 + (4 + len + MEP_MLX5_SEG - 1) / MEP_MLX5_SEG;
}
MEP_HD uint32_t mep_mlx5_bbs(uint32_t ds) {
  return (ds * MEP_MLX5_SEG + MEP_MLX5_SEND_WQE_BB - 1) /
         MEP_MLX5_SEND_WQE_BB;
}

/* The 16-byte unit `seg` of the WQE that starts at building block `pi`
 * of a send queue of (mask + 1) BBs at sq: a WQE that runs past the end
 * of the ring continues at its start, as the NIC reads it. */
MEP_HD void *mep_mlx5_seg(void *sq, uint32_t mask, uint32_t pi,
                          uint32_t seg) {
  uint32_t units = (mask + 1) * (MEP_MLX5_SEND_WQE_BB / MEP_MLX5_SEG);
  uint32_t u = ((pi & mask) * (MEP_MLX5_SEND_WQE_BB / MEP_MLX5_SEG) + seg) %
               units;
  return (uint8_t *)sq + (uint64_t)u * MEP_MLX5_SEG;
}

/* ---------------------------------------------------------- segments */

/* Control segment: as mlx5dv_set_ctrl_seg (pi: the WQE's index, i.e.
 * its first building block's producer count, low 16 bits used). imm is
 * given in host order and stored big-endian (the value a RDMA WRITE with
 * immediate delivers). */
MEP_HD void mep_mlx5_set_ctrl(mep_mlx5_ctrl_seg_t *c, uint32_t pi,
                              uint8_t opcode, uint8_t opmod, uint32_t qpn,
                              uint8_t fm_ce_se, uint8_t ds, uint32_t imm) {
  c->opmod_idx_opcode = mep_mlx5_bswap32(((uint32_t)opmod << 24) |
                                         ((pi & 0xffffu) << 8) | opcode);
  c->qpn_ds = mep_mlx5_bswap32(((qpn & 0xffffffu) << 8) | ds);
  c->signature = 0;
  c->dci_stream_channel_id[0] = 0;
  c->dci_stream_channel_id[1] = 0;
  c->fm_ce_se = fm_ce_se;
  c->imm = mep_mlx5_bswap32(imm);
}

MEP_HD void mep_mlx5_set_raddr(mep_mlx5_raddr_seg_t *r, uint64_t raddr,
                               uint32_t rkey) {
  r->raddr = mep_mlx5_bswap64(raddr);
  r->rkey = mep_mlx5_bswap32(rkey);
  r->reserved = 0;
}

/* As mlx5dv_set_data_seg. */
MEP_HD void mep_mlx5_set_data(mep_mlx5_data_seg_t *d, uint32_t len,
                              uint32_t lkey, uint64_t addr) {
  d->byte_count = mep_mlx5_bswap32(len);
  d->lkey = mep_mlx5_bswap32(lkey);
  d->addr = mep_mlx5_bswap64(addr);
}

/* The header of an inline data segment of `len` bytes. */
MEP_HD void mep_mlx5_set_inl(mep_mlx5_inl_data_seg_t *s, uint32_t len) {
  s->byte_count = mep_mlx5_bswap32(len | MEP_MLX5_INLINE_SEG);
}

MEP_HD void mep_mlx5_set_atomic_fa(mep_mlx5_atomic_seg_t *a, uint64_t add) {
  a->swap_add = mep_mlx5_bswap64(add);
  a->compare = 0;
}

/* ------------------------------------------------------------- WQEs
 * Each writes one whole WQE at producer index pi (in BBs) and returns the
 * BBs it takes; the caller reserved them. */

/* RDMA WRITE (or WRITE with immediate when `imm_op`) of len bytes from
 * laddr (lkey) to raddr (rkey). */
MEP_HD uint32_t mep_mlx5_wqe_write(void *sq, uint32_t mask, uint32_t pi,
                                   uint32_t qpn, uint8_t fm_ce_se,
                                   uint64_t laddr, uint32_t lkey,
                                   uint64_t raddr, uint32_t rkey,
                                   uint32_t len, int imm_op, uint32_t imm) {
  uint32_t ds = mep_mlx5_ds_write();
  mep_mlx5_set_raddr((mep_mlx5_raddr_seg_t *)mep_mlx5_seg(sq, mask, pi, 1),
                     raddr, rkey);
  mep_mlx5_set_data((mep_mlx5_data_seg_t *)mep_mlx5_seg(sq, mask, pi, 2), len,
                    lkey, laddr);
  mep_mlx5_set_ctrl((mep_mlx5_ctrl_seg_t *)mep_mlx5_seg(sq, mask, pi, 0), pi,
                    imm_op ? MEP_MLX5_OPCODE_RDMA_WRITE_IMM
                           : MEP_MLX5_OPCODE_RDMA_WRITE,
                    0, qpn, fm_ce_se, (uint8_t)ds, imm_op ? imm : 0);
  return mep_mlx5_bbs(ds);
}

/* RDMA WRITE of len (<= MEP_MLX5_MAX_INLINE) bytes carried in the WQE. */
MEP_HD uint32_t mep_mlx5_wqe_write_inline(void *sq, uint32_t mask,
                                          uint32_t pi, uint32_t qpn,
                                          uint8_t fm_ce_se, const void *src,
                                          uint32_t len, uint64_t raddr,
                                          uint32_t rkey) {
  uint32_t ds = mep_mlx5_ds_inline(len);
  mep_mlx5_set_raddr((mep_mlx5_raddr_seg_t *)mep_mlx5_seg(sq, mask, pi, 1),
                     raddr, rkey);
  /* The inline segment starts at unit 2: 4 bytes of header, then the
   * data, which may cross units (and the end of the ring). */
  uint8_t *u = (uint8_t *)mep_mlx5_seg(sq, mask, pi, 2);
  mep_mlx5_set_inl((mep_mlx5_inl_data_seg_t *)u, len);
  const uint8_t *s = (const uint8_t *)src;
  uint32_t at = 4, seg = 2;
  for (uint32_t i = 0; i < len; i++) {
    if (at == MEP_MLX5_SEG) {
      u = (uint8_t *)mep_mlx5_seg(sq, mask, pi, ++seg);
      at = 0;
    }
    u[at++] = s[i];
  }
  while (at < MEP_MLX5_SEG) u[at++] = 0; /* padding: deterministic bytes */
  mep_mlx5_set_ctrl((mep_mlx5_ctrl_seg_t *)mep_mlx5_seg(sq, mask, pi, 0), pi,
                    MEP_MLX5_OPCODE_RDMA_WRITE, 0, qpn, fm_ce_se, (uint8_t)ds,
                    0);
  return mep_mlx5_bbs(ds);
}

/* ATOMIC FETCH_AND_ADD of `add` to the 8-byte word at raddr; the old
 * value lands at laddr (lkey, 8 bytes). */
MEP_HD uint32_t mep_mlx5_wqe_fetch_add(void *sq, uint32_t mask, uint32_t pi,
                                       uint32_t qpn, uint8_t fm_ce_se,
                                       uint64_t raddr, uint32_t rkey,
                                       uint64_t add, uint64_t laddr,
                                       uint32_t lkey) {
  uint32_t ds = mep_mlx5_ds_atomic();
  mep_mlx5_set_raddr((mep_mlx5_raddr_seg_t *)mep_mlx5_seg(sq, mask, pi, 1),
                     raddr, rkey);
  mep_mlx5_set_atomic_fa(
      (mep_mlx5_atomic_seg_t *)mep_mlx5_seg(sq, mask, pi, 2), add);
  mep_mlx5_set_data((mep_mlx5_data_seg_t *)mep_mlx5_seg(sq, mask, pi, 3), 8,
                    lkey, laddr);
  mep_mlx5_set_ctrl((mep_mlx5_ctrl_seg_t *)mep_mlx5_seg(sq, mask, pi, 0), pi,
                    MEP_MLX5_OPCODE_ATOMIC_FA, 0, qpn, fm_ce_se, (uint8_t)ds,
                    0);
  return mep_mlx5_bbs(ds);
}

/* A NOP: a control segment only. With MEP_MLX5_CTRL_CQ_UPDATE its CQE
 * tells that every earlier WQE completed (a marker). */
MEP_HD uint32_t mep_mlx5_wqe_nop(void *sq, uint32_t mask, uint32_t pi,
                                 uint32_t qpn, uint8_t fm_ce_se) {
  mep_mlx5_set_ctrl((mep_mlx5_ctrl_seg_t *)mep_mlx5_seg(sq, mask, pi, 0), pi,
                    MEP_MLX5_OPCODE_NOP, 0, qpn, fm_ce_se, 1, 0);
  return 1;
}

/* --------------------------------------------------------- doorbell */

/* Slot reservation: producers count building blocks in `pi` (a free-running
 * counter, reserved with an atomic add of the WQE's BBs); the NIC has
 * consumed up to `ci` (its completions say so). A WQE of nbb BBs fits
 * while pi + nbb - ci <= sq_bbs. */
MEP_HD int mep_mlx5_sq_fits(uint64_t pi, uint64_t ci, uint32_t nbb,
                            uint32_t sq_bbs) {
  return pi + nbb - ci <= sq_bbs;
}

/* The doorbell record's send word for producer index pi (BBs posted so
 * far): big-endian, low 16 bits, as libmlx5 writes it. */
MEP_HD uint32_t mep_mlx5_dbrec_value(uint32_t pi) {
  return mep_mlx5_bswap32(pi & 0xffffu);
}

/* What the doorbell register gets: the first 8 bytes of the control
 * segment of the last WQE posted, as one 64-bit store. */
MEP_HD uint64_t mep_mlx5_db_value(const mep_mlx5_ctrl_seg_t *c) {
  return (uint64_t)c->opmod_idx_opcode | ((uint64_t)c->qpn_ds << 32);
}

/* Fields of a control segment (or of a doorbell register value), decoded:
 * for the model and the tests. */
MEP_HD uint8_t mep_mlx5_ctrl_opcode(const mep_mlx5_ctrl_seg_t *c) {
  return (uint8_t)mep_mlx5_bswap32(c->opmod_idx_opcode);
}
MEP_HD uint16_t mep_mlx5_ctrl_idx(const mep_mlx5_ctrl_seg_t *c) {
  return (uint16_t)(mep_mlx5_bswap32(c->opmod_idx_opcode) >> 8);
}
MEP_HD uint8_t mep_mlx5_ctrl_opmod(const mep_mlx5_ctrl_seg_t *c) {
  return (uint8_t)(mep_mlx5_bswap32(c->opmod_idx_opcode) >> 24);
}
MEP_HD uint32_t mep_mlx5_ctrl_qpn(const mep_mlx5_ctrl_seg_t *c) {
  return mep_mlx5_bswap32(c->qpn_ds) >> 8;
}
MEP_HD uint8_t mep_mlx5_ctrl_ds(const mep_mlx5_ctrl_seg_t *c) {
  return (uint8_t)(mep_mlx5_bswap32(c->qpn_ds) & 0x3f);
}

/* --------------------------------------------------------------- CQE */

MEP_HD uint32_t mep_mlx5_cqe_be32(const mep_mlx5_cqe_t *q, int off) {
  return ((uint32_t)q->b[off] << 24) | ((uint32_t)q->b[off + 1] << 16) |
         ((uint32_t)q->b[off + 2] << 8) | q->b[off + 3];
}
MEP_HD uint8_t mep_mlx5_cqe_opcode(const mep_mlx5_cqe_t *q) {
  return (uint8_t)(q->b[MEP_MLX5_CQE_OFF_OP_OWN] >> 4);
}
MEP_HD uint8_t mep_mlx5_cqe_owner(const mep_mlx5_cqe_t *q) {
  return (uint8_t)(q->b[MEP_MLX5_CQE_OFF_OP_OWN] & MEP_MLX5_CQE_OWNER_MASK);
}
MEP_HD uint16_t mep_mlx5_cqe_wqe_counter(const mep_mlx5_cqe_t *q) {
  return (uint16_t)((q->b[MEP_MLX5_CQE_OFF_WQE_COUNTER] << 8) |
                    q->b[MEP_MLX5_CQE_OFF_WQE_COUNTER + 1]);
}
MEP_HD uint32_t mep_mlx5_cqe_byte_cnt(const mep_mlx5_cqe_t *q) {
  return mep_mlx5_cqe_be32(q, MEP_MLX5_CQE_OFF_BYTE_CNT);
}
MEP_HD uint32_t mep_mlx5_cqe_imm(const mep_mlx5_cqe_t *q) {
  return mep_mlx5_cqe_be32(q, MEP_MLX5_CQE_OFF_IMM);
}
MEP_HD uint32_t mep_mlx5_cqe_qpn(const mep_mlx5_cqe_t *q) {
  return mep_mlx5_cqe_be32(q, MEP_MLX5_CQE_OFF_SOP_QPN) & 0xffffffu;
}
MEP_HD uint8_t mep_mlx5_cqe_syndrome(const mep_mlx5_cqe_t *q) {
  return q->b[MEP_MLX5_CQE_OFF_SYNDROME];
}
MEP_HD uint8_t mep_mlx5_cqe_vendor_syndrome(const mep_mlx5_cqe_t *q) {
  return q->b[MEP_MLX5_CQE_OFF_VENDOR_SYND];
}

/* 1 when the CQE at consumer index ci of a CQ of n (a power of two)
 * entries is software's: written by the NIC in this pass of the ring
 * (libmlx5's get_sw_cqe rule). */
MEP_HD int mep_mlx5_cqe_ready(const mep_mlx5_cqe_t *q, uint32_t ci,
                              uint32_t n) {
  return mep_mlx5_cqe_opcode(q) != MEP_MLX5_CQE_INVALID &&
         mep_mlx5_cqe_owner(q) == ((ci & n) ? 1 : 0);
}

/* What a fresh CQ holds: every entry invalid, owned by the NIC (libmlx5
 * initialises op_own so). */
MEP_HD void mep_mlx5_cqe_init(mep_mlx5_cqe_t *q) {
  for (int i = 0; i < MEP_MLX5_CQE_SIZE; i++) q->b[i] = 0;
  q->b[MEP_MLX5_CQE_OFF_OP_OWN] = (uint8_t)(MEP_MLX5_CQE_INVALID << 4);
}

/* Writes a CQE as the NIC does (for the model): every field but op_own,
 * which the caller stores last (mep_mlx5_cqe_op_own). For an error
 * CQE (opcode REQ_ERR / RESP_ERR), syndrome and vendor syndrome go where
 * mlx5_err_cqe has them and byte_cnt is not written. */
MEP_HD void mep_mlx5_cqe_fill(mep_mlx5_cqe_t *q, uint8_t opcode, uint8_t wqe_opcode, uint32_t qpn,
                              uint16_t wqe_counter, uint32_t byte_cnt,
                              uint32_t imm, uint8_t syndrome,
                              uint8_t vendor_syndrome) {
  for (int i = 0; i < MEP_MLX5_CQE_SIZE - 1; i++) q->b[i] = 0;
  uint32_t imm_be = mep_mlx5_bswap32(imm);
  uint32_t sq = mep_mlx5_bswap32(((uint32_t)wqe_opcode << 24) |
                                 (qpn & 0xffffffu));
  for (int i = 0; i < 4; i++) {
    q->b[MEP_MLX5_CQE_OFF_IMM + i] = (uint8_t)(imm_be >> (8 * i));
    q->b[MEP_MLX5_CQE_OFF_SOP_QPN + i] = (uint8_t)(sq >> (8 * i));
  }
  if (opcode == MEP_MLX5_CQE_REQ_ERR || opcode == MEP_MLX5_CQE_RESP_ERR) {
    q->b[MEP_MLX5_CQE_OFF_SYNDROME] = syndrome;
    q->b[MEP_MLX5_CQE_OFF_VENDOR_SYND] = vendor_syndrome;
  } else {
    uint32_t bc = mep_mlx5_bswap32(byte_cnt);
    for (int i = 0; i < 4; i++)
      q->b[MEP_MLX5_CQE_OFF_BYTE_CNT + i] = (uint8_t)(bc >> (8 * i));
  }
  q->b[MEP_MLX5_CQE_OFF_WQE_COUNTER] = (uint8_t)(wqe_counter >> 8);
  q->b[MEP_MLX5_CQE_OFF_WQE_COUNTER + 1] = (uint8_t)wqe_counter;
}

/* The last byte, written after the rest is visible. */
MEP_HD uint8_t mep_mlx5_cqe_op_own(uint8_t opcode, uint32_t ci, uint32_t n) {
  return (uint8_t)((opcode << 4) | ((ci & n) ? 1 : 0));
}

/* The CQ doorbell record's consumer word (24 bits, big-endian). */
MEP_HD uint32_t mep_mlx5_cq_dbrec_value(uint32_t ci) {
  return mep_mlx5_bswap32(ci & 0xffffffu);
}

#ifdef __cplusplus
}
#endif
#endif /* MEP_DEVICE_MLX5_H */
