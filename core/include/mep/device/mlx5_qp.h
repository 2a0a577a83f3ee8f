/*
 * device/mlx5_qp.h - posting on an mlx5 queue pair from many producers at
 * once: GPU threads (mep/device/mlx5.cuh wraps this for warps) or, with
 * the same code, host threads (the tests run it against the software
 * model of the NIC on a CPU).
 *
 * A queue pair is described by a MEP_DEV_MLX5 peer part (transport.h);
 * its shared counters live in memory every producer reaches:
 *   pi      building blocks reserved: a producer adds its WQE's size
 *           atomically and owns [old, old + nbb) of the ring;
 *   ready   building blocks published: producers publish in reservation
 *           order, each waiting for ready == its start;
 *   ci      building blocks completed, advanced by whoever polls the CQ;
 *   cq_ci   CQEs consumed; cq_lock 0 (free), 1 (a poller holds the CQ),
 *           2 (an error CQE came: the queue pair failed, as on mlx5).
 * A WQE may be written once pi + nbb - ci <= sq_bbs (its slots were
 * completed). Posting: reserve, write the WQE (mep/device/mlx5.h), then
 * publish: a system-scope fence (the WQE before the doorbell record), the
 * doorbell record (producer index, big-endian), a fence, the doorbell
 * register (the first 8 bytes of the control segment), and ready.
 *
 * Completions: a WQE asks for a CQE when it reaches a quarter of the
 * ring (mep_mlx5_qp_ce), so a full ring always holds WQEs whose CQEs
 * free it, without a shared "last signalled" word. A CQE's WQE counter
 * names the WQE's first building block (16 bits); the poller widens it
 * against ci and reads the WQE's size from its control segment, still in
 * the ring since ci has not passed it.
 *
 * On hardware the doorbell register is a UAR page of the NIC: the store to
 * it is MMIO, which PTX orders with st.mmio / a system fence; the model
 * watches an ordinary word, so both are served by the fence + store below.
 * A deadline that passes while a producer holds a reservation leaves its
 * slots unpublished: the queue pair is stuck from then on (its peer's
 * receivers time out), as a failed connection would be.
 *
 * Return values: 0, -1 (the deadline passed), -2 (the queue pair failed).
 */
#ifndef MEP_DEVICE_MLX5_QP_H
#define MEP_DEVICE_MLX5_QP_H

#include "mep/device/mlx5.h"
#include "mep/transport.h"

/* the host side of the primitives below (nvcc's device pass sees the
 * same declarations) */
#include <sched.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* -------------------------------------------- host/device primitives */

MEP_HD uint64_t mep_mlx5_atomic_add64(uint64_t *p, uint64_t v) {
#ifdef __CUDA_ARCH__
  return (uint64_t)atomicAdd((unsigned long long *)p, (unsigned long long)v);
#else
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#endif
}
MEP_HD uint64_t mep_mlx5_cas64(uint64_t *p, uint64_t expect, uint64_t want) {
#ifdef __CUDA_ARCH__
  return (uint64_t)atomicCAS((unsigned long long *)p, expect, want);
#else
  __atomic_compare_exchange_n(p, &expect, want, 0, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
  return expect;
#endif
}
MEP_HD uint64_t mep_mlx5_load64(const uint64_t *p) {
#ifdef __CUDA_ARCH__
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];"
               : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
MEP_HD uint8_t mep_mlx5_load8(const uint8_t *p) {
#ifdef __CUDA_ARCH__
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u8 %0, [%1];"
               : "=r"(v) : "l"(p) : "memory");
  return (uint8_t)v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
MEP_HD void mep_mlx5_store64(uint64_t *p, uint64_t v) {
#ifdef __CUDA_ARCH__
  asm volatile("st.release.sys.global.u64 [%0], %1;"
               :: "l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
MEP_HD void mep_mlx5_store32(uint32_t *p, uint32_t v) {
#ifdef __CUDA_ARCH__
  asm volatile("st.release.sys.global.u32 [%0], %1;"
               :: "l"(p), "r"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
/* Everything this thread wrote is visible system-wide (to the NIC) before
 * what it writes next. */
MEP_HD void mep_mlx5_fence(void) {
#ifdef __CUDA_ARCH__
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}
MEP_HD uint64_t mep_mlx5_now_ns(void) {
#ifdef __CUDA_ARCH__
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}
MEP_HD void mep_mlx5_relax(void) {
#ifdef __CUDA_ARCH__
  __nanosleep(64);
#else
  sched_yield();
#endif
}

/* ------------------------------------------------------ the queue pair */

/* The descriptor's addresses as pointers. */
typedef struct mep_mlx5_qp {
  uint8_t *sq;
  uint32_t sq_bbs, qpn;
  uint32_t *dbrec;
  uint64_t *db;
  uint64_t *pi, *ready, *ci;
  mep_mlx5_cqe_t *cq;
  uint32_t cq_n, sink_lkey;
  uint32_t *cq_dbrec;
  uint64_t *cq_ci, *cq_lock;
  uint64_t sink;
} mep_mlx5_qp_t;

MEP_HD mep_mlx5_qp_t mep_mlx5_qp_view(const mep_dev_mlx5_peer_t *d) {
  mep_mlx5_qp_t q;
  q.sq = (uint8_t *)(uintptr_t)d->sq;
  q.sq_bbs = d->sq_bbs;
  q.qpn = d->qpn;
  q.dbrec = (uint32_t *)(uintptr_t)d->dbrec;
  q.db = (uint64_t *)(uintptr_t)d->db;
  q.pi = (uint64_t *)(uintptr_t)d->pi;
  q.ready = (uint64_t *)(uintptr_t)d->ready;
  q.ci = (uint64_t *)(uintptr_t)d->ci;
  q.cq = (mep_mlx5_cqe_t *)(uintptr_t)d->cq;
  q.cq_n = d->cq_n;
  q.sink_lkey = d->sink_lkey;
  q.cq_dbrec = (uint32_t *)(uintptr_t)d->cq_dbrec;
  q.cq_ci = (uint64_t *)(uintptr_t)d->cq_ci;
  q.cq_lock = (uint64_t *)(uintptr_t)d->cq_lock;
  q.sink = d->sink;
  return q;
}

/* Takes the CQEs that arrived (one poller at a time; the others return
 * at once): ci advances past each completed WQE. 0, or -2 once an error
 * CQE came. */
MEP_HD int mep_mlx5_qp_poll(const mep_mlx5_qp_t *q) {
  uint64_t held = mep_mlx5_cas64(q->cq_lock, 0, 1);
  if (held == 2) return -2;
  if (held) return 0;
  uint64_t n = mep_mlx5_load64(q->cq_ci);
  int err = 0;
  for (;;) {
    mep_mlx5_cqe_t *c = &q->cq[n & (q->cq_n - 1)];
    uint8_t oo = mep_mlx5_load8(&c->b[MEP_MLX5_CQE_OFF_OP_OWN]);
    if ((oo >> 4) == MEP_MLX5_CQE_INVALID ||
        (oo & 1) != ((n & q->cq_n) ? 1 : 0))
      break;
    n++;
    if ((oo >> 4) != MEP_MLX5_CQE_REQ) {
      err = 1;
      break;
    }
    uint64_t done = mep_mlx5_load64(q->ci);
    uint16_t idx = mep_mlx5_cqe_wqe_counter(c);
    uint64_t start = done + (uint16_t)(idx - (uint16_t)done);
    const mep_mlx5_ctrl_seg_t *ctrl = (const mep_mlx5_ctrl_seg_t *)
        mep_mlx5_seg(q->sq, q->sq_bbs - 1, (uint32_t)start, 0);
    mep_mlx5_store64(q->ci, start + mep_mlx5_bbs(mep_mlx5_ctrl_ds(ctrl)));
  }
  mep_mlx5_store64(q->cq_ci, n);
  mep_mlx5_store32(&q->cq_dbrec[0], mep_mlx5_cq_dbrec_value((uint32_t)n));
  mep_mlx5_store64(q->cq_lock, err ? 2 : 0);
  return err ? -2 : 0;
}

/* Reserves nbb building blocks: *pi_out their first. */
MEP_HD int mep_mlx5_qp_reserve(const mep_mlx5_qp_t *q, uint32_t nbb,
                               uint64_t deadline_ns, uint64_t *pi_out) {
  if (mep_mlx5_load64(q->cq_lock) == 2) return -2;
  uint64_t pi = mep_mlx5_atomic_add64(q->pi, nbb);
  while (!mep_mlx5_sq_fits(pi, mep_mlx5_load64(q->ci), nbb, q->sq_bbs)) {
    if (mep_mlx5_qp_poll(q) == -2) return -2;
    if (mep_mlx5_now_ns() > deadline_ns) return -1;
    mep_mlx5_relax();
  }
  *pi_out = pi;
  return 0;
}

/* The completion flag a WQE at pi of nbb blocks carries: one where it
 * reaches a quarter of the ring. */
MEP_HD uint8_t mep_mlx5_qp_ce(const mep_mlx5_qp_t *q, uint64_t pi,
                              uint32_t nbb) {
  uint32_t quarter = q->sq_bbs >= 4 ? q->sq_bbs / 4 : 1;
  return (pi + nbb) / quarter != pi / quarter ? MEP_MLX5_CTRL_CQ_UPDATE : 0;
}

/* Publishes the WQE written at [pi, pi + nbb), after every earlier
 * reservation's: doorbell record, then doorbell register. */
MEP_HD int mep_mlx5_qp_publish(const mep_mlx5_qp_t *q, uint64_t pi,
                               uint32_t nbb, uint64_t deadline_ns) {
  mep_mlx5_fence();
  while (mep_mlx5_load64(q->ready) != pi) {
    if (mep_mlx5_now_ns() > deadline_ns) return -1;
    mep_mlx5_relax();
  }
  mep_mlx5_store32(&q->dbrec[MEP_MLX5_SND_DBR],
                   mep_mlx5_dbrec_value((uint32_t)(pi + nbb)));
  mep_mlx5_fence();
  const mep_mlx5_ctrl_seg_t *c = (const mep_mlx5_ctrl_seg_t *)mep_mlx5_seg(
      q->sq, q->sq_bbs - 1, (uint32_t)pi, 0);
  mep_mlx5_store64(q->db, mep_mlx5_db_value(c));
  mep_mlx5_store64(q->ready, pi + nbb);
  return 0;
}

/* RDMA WRITE of len bytes at laddr (lkey: registered with the transport)
 * to raddr (rkey). The source must stay until the WRITE completed
 * (mep_mlx5_qp_quiet). */
MEP_HD int mep_mlx5_qp_put(const mep_mlx5_qp_t *q, uint64_t raddr,
                           uint32_t rkey, uint64_t laddr, uint32_t lkey,
                           uint32_t len, uint64_t deadline_ns) {
  uint32_t nbb = mep_mlx5_bbs(mep_mlx5_ds_write());
  uint64_t pi;
  int rc = mep_mlx5_qp_reserve(q, nbb, deadline_ns, &pi);
  if (rc) return rc;
  mep_mlx5_wqe_write(q->sq, q->sq_bbs - 1, (uint32_t)pi, q->qpn,
                     mep_mlx5_qp_ce(q, pi, nbb), laddr, lkey, raddr, rkey,
                     len, 0, 0);
  return mep_mlx5_qp_publish(q, pi, nbb, deadline_ns);
}

/* RDMA WRITE of len (<= MEP_MLX5_MAX_INLINE) bytes carried in the WQE:
 * the source is free on return. */
MEP_HD int mep_mlx5_qp_put_inline(const mep_mlx5_qp_t *q, uint64_t raddr,
                                  uint32_t rkey, const void *src,
                                  uint32_t len, uint64_t deadline_ns) {
  uint32_t nbb = mep_mlx5_bbs(mep_mlx5_ds_inline(len));
  uint64_t pi;
  int rc = mep_mlx5_qp_reserve(q, nbb, deadline_ns, &pi);
  if (rc) return rc;
  mep_mlx5_wqe_write_inline(q->sq, q->sq_bbs - 1, (uint32_t)pi, q->qpn,
                            mep_mlx5_qp_ce(q, pi, nbb), src, len, raddr,
                            rkey);
  return mep_mlx5_qp_publish(q, pi, nbb, deadline_ns);
}

/* Stores (add 0) or adds (add 1) value to the 8-byte word at raddr, after
 * every WQE published before it on this queue pair (an RC queue pair
 * carries them out in order). */
MEP_HD int mep_mlx5_qp_signal(const mep_mlx5_qp_t *q, uint64_t raddr,
                              uint32_t rkey, uint64_t value, int add,
                              uint64_t deadline_ns) {
  if (!add) return mep_mlx5_qp_put_inline(q, raddr, rkey, &value, 8,
                                          deadline_ns);
  uint32_t nbb = mep_mlx5_bbs(mep_mlx5_ds_atomic());
  uint64_t pi;
  int rc = mep_mlx5_qp_reserve(q, nbb, deadline_ns, &pi);
  if (rc) return rc;
  mep_mlx5_wqe_fetch_add(q->sq, q->sq_bbs - 1, (uint32_t)pi, q->qpn,
                         mep_mlx5_qp_ce(q, pi, nbb), raddr, rkey, value,
                         q->sink, q->sink_lkey);
  return mep_mlx5_qp_publish(q, pi, nbb, deadline_ns);
}

/* Waits until every WQE published before the call completed (a NOP that
 * asks for a CQE marks the point). */
MEP_HD int mep_mlx5_qp_quiet(const mep_mlx5_qp_t *q, uint64_t deadline_ns) {
  uint64_t pi;
  int rc = mep_mlx5_qp_reserve(q, 1, deadline_ns, &pi);
  if (rc) return rc;
  mep_mlx5_wqe_nop(q->sq, q->sq_bbs - 1, (uint32_t)pi, q->qpn,
                   MEP_MLX5_CTRL_CQ_UPDATE);
  rc = mep_mlx5_qp_publish(q, pi, 1, deadline_ns);
  while (!rc && mep_mlx5_load64(q->ci) < pi + 1) {
    rc = mep_mlx5_qp_poll(q);
    if (!rc && mep_mlx5_now_ns() > deadline_ns) rc = -1;
    if (!rc) mep_mlx5_relax();
  }
  return rc;
}

#ifdef __cplusplus
}
#endif
#endif /* MEP_DEVICE_MLX5_QP_H */
