/*
 * device/mlx5.cuh - warp-level puts and signals on an mlx5 queue pair
 * (MEP_DEV_MLX5), for kernels that send to a peer without the CPU.
 *
 * Each function is called by all 32 lanes of a warp with the same
 * arguments and returns the same value to all: 0, -1 (deadline, a
 * %globaltimer value in ns: mep_mlx5_now_ns() + timeout) or -2 (the queue
 * pair failed). Lane 0 reserves the building blocks and publishes the WQE
 * (mep/device/mlx5_qp.h: atomic reservation, doorbell record, then
 * doorbell register, in reservation order across the grid); for inline
 * data the lanes write its 16-byte units in parallel. A put's source must
 * be registered memory the NIC reads (lkey) and stay unchanged until the
 * WRITE completed (mep_dev_mlx5_quiet_warp); an inline put's source is
 * free on return. Signals land after every WQE published before them on
 * the queue pair.
 *
 * The queue pair comes from the peer part of the descriptor:
 *   mep_mlx5_qp_t q = mep_mlx5_qp_view((const mep_dev_mlx5_peer_t *)part);
 * (device-resident, as a device window carries it) and the remote address
 * and rkey from the region part (mep_dev_mlx5_region_t).
 */
#ifndef MEP_DEVICE_MLX5_CUH
#define MEP_DEVICE_MLX5_CUH

#include "mep/device/mlx5_qp.h"

#define MEP_DEV_MLX5_FULL_MASK 0xffffffffu

__device__ __forceinline__ unsigned mep__dev_mlx5_lane(void) {
  return threadIdx.x & 31u;
}

/* RDMA WRITE of len bytes at laddr (lkey) to raddr (rkey). */
__device__ __forceinline__ int mep_dev_mlx5_put_warp(
    const mep_mlx5_qp_t *q, uint64_t raddr, uint32_t rkey, uint64_t laddr,
    uint32_t lkey, uint32_t len, uint64_t deadline_ns) {
  /* every lane's stores of the source are visible before lane 0 posts */
  __threadfence_system();
  __syncwarp();
  int rc = 0;
  if (mep__dev_mlx5_lane() == 0)
    rc = mep_mlx5_qp_put(q, raddr, rkey, laddr, lkey, len, deadline_ns);
  return __shfl_sync(MEP_DEV_MLX5_FULL_MASK, rc, 0);
}

/* RDMA WRITE of len (<= MEP_MLX5_MAX_INLINE) bytes from src, carried in
 * the WQE; lane l writes inline units l, l + 32, ... */
__device__ __forceinline__ int mep_dev_mlx5_put_inline_warp(
    const mep_mlx5_qp_t *q, uint64_t raddr, uint32_t rkey, const void *src,
    uint32_t len, uint64_t deadline_ns) {
  unsigned lane = mep__dev_mlx5_lane();
  uint32_t ds = mep_mlx5_ds_inline(len), nbb = mep_mlx5_bbs(ds);
  uint32_t mask = q->sq_bbs - 1;
  unsigned long long pi = 0;
  int rc = 0;
  if (lane == 0) {
    uint64_t p;
    rc = mep_mlx5_qp_reserve(q, nbb, deadline_ns, &p);
    pi = p;
  }
  rc = __shfl_sync(MEP_DEV_MLX5_FULL_MASK, rc, 0);
  pi = __shfl_sync(MEP_DEV_MLX5_FULL_MASK, pi, 0);
  if (rc) return rc;
  /* the inline segment: units 2 .. ds-1, a 4-byte big-endian header
   * (length | MLX5_INLINE_SEG), the bytes, zero padding */
  const uint8_t *s = (const uint8_t *)src;
  uint32_t hdr = mep_mlx5_bswap32(len | MEP_MLX5_INLINE_SEG);
  for (uint32_t u = 2 + lane; u < ds; u += 32) {
    uint8_t *p = (uint8_t *)mep_mlx5_seg(q->sq, mask, (uint32_t)pi, u);
    for (uint32_t b = 0; b < MEP_MLX5_SEG; b++) {
      uint32_t o = (u - 2) * MEP_MLX5_SEG + b;
      p[b] = o < 4 ? (uint8_t)(hdr >> (8 * o))
                   : (o - 4 < len ? s[o - 4] : (uint8_t)0);
    }
  }
  if (lane == 0) {
    mep_mlx5_set_raddr(
        (mep_mlx5_raddr_seg_t *)mep_mlx5_seg(q->sq, mask, (uint32_t)pi, 1),
        raddr, rkey);
    mep_mlx5_set_ctrl(
        (mep_mlx5_ctrl_seg_t *)mep_mlx5_seg(q->sq, mask, (uint32_t)pi, 0),
        (uint32_t)pi, MEP_MLX5_OPCODE_RDMA_WRITE, 0, q->qpn,
        mep_mlx5_qp_ce(q, pi, nbb), (uint8_t)ds, 0);
  }
  /* each lane's units are visible system-wide before the doorbell */
  __threadfence_system();
  __syncwarp();
  if (lane == 0) rc = mep_mlx5_qp_publish(q, pi, nbb, deadline_ns);
  return __shfl_sync(MEP_DEV_MLX5_FULL_MASK, rc, 0);
}

/* Stores (add 0) or adds (add 1) value to the 8-byte word at raddr, after
 * every WQE published before it on the queue pair; the caller's earlier
 * puts must have returned (in any warp whose return it observed). */
__device__ __forceinline__ int mep_dev_mlx5_signal_warp(
    const mep_mlx5_qp_t *q, uint64_t raddr, uint32_t rkey, uint64_t value,
    int add, uint64_t deadline_ns) {
  __syncwarp();
  int rc = 0;
  if (mep__dev_mlx5_lane() == 0)
    rc = mep_mlx5_qp_signal(q, raddr, rkey, value, add, deadline_ns);
  return __shfl_sync(MEP_DEV_MLX5_FULL_MASK, rc, 0);
}

/* Waits until every WQE published before the call completed (their
 * sources may be reused). */
__device__ __forceinline__ int mep_dev_mlx5_quiet_warp(const mep_mlx5_qp_t *q,
                                                       uint64_t deadline_ns) {
  __syncwarp();
  int rc = 0;
  if (mep__dev_mlx5_lane() == 0) rc = mep_mlx5_qp_quiet(q, deadline_ns);
  return __shfl_sync(MEP_DEV_MLX5_FULL_MASK, rc, 0);
}

#endif /* MEP_DEVICE_MLX5_CUH */
