/*
 * device/win.cuh - inline device functions on a device window (device.h).
 *
 * The one place that looks at a peer's descriptor kind. A send is:
 *
 *   uint8_t *p = mep_dev_dst(w, peer, dst_off, stage_off);
 *   ... the threads of a warp (or block) store `len` bytes at p ...
 *   __threadfence_system(); __syncwarp();   (every writer, then)
 *   if (lane == 0) mep_dev_put(w, peer, dst_off, stage_off, len, deadline);
 *
 * and, once every put a signal covers has been issued (by any thread of
 * the grid, which the caller orders, e.g. with a counter):
 *
 *   mep_dev_signal(w, peer, off, value, deadline);
 *
 * A receiver polls mep_dev_load_acquire(mep_dev_src(w, src, off)) and
 * then reads the bytes at mep_dev_src(w, src, data_off). A kernel may
 * also read a mapped peer's own bytes (mep_dev_peer_src) once the peer
 * signalled them; it then tells the peer when it is done reading.
 *
 * stage_off must be unique among the puts in flight of one call: for a
 * MEP_DEV_PROXY peer the bytes wait there (this rank's host part) until
 * the proxy has sent them (*ring_done passed its slot), for a
 * MEP_DEV_MLX5 peer until the NIC has read them (mep_dev_quiet). For the
 * proxy, dst_off, stage_off and len are bounds-checked on the host (a bad
 * command is dropped and reported); for MEP_DEV_MLX5 the NIC checks them
 * against the memory keys (a bad request fails the queue pair, whose
 * later requests then fail too, as on mlx5).
 * Deadlines are %globaltimer nanoseconds (mep_dev_now_ns() + timeout);
 * the functions return 0, -1 when the ring (or send queue) stayed full
 * past it, or -2 when a MEP_DEV_MLX5 peer's queue pair failed.
 *
 * put, signal and quiet take a template flag, kMlx5 (default true). A
 * kernel launched only for windows without a MEP_DEV_MLX5 peer (the host
 * knows: mep_devwin_kind) passes false, and those branches are not
 * compiled into it: inlined, they cost the EP kernels registers, spills
 * and a microsecond a call over NVLink (ptxas -v, ep_bench on H100).
 * With false, a MEP_DEV_MLX5 peer would be taken for a proxied one.
 */
#ifndef MEP_DEVICE_WIN_CUH
#define MEP_DEVICE_WIN_CUH

#include "mep/device.h"
#include "mep/device/mlx5_qp.h"

__device__ __forceinline__ uint64_t mep_dev_now_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t
mep_dev_load_acquire(const volatile uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];"
               : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void mep_dev_store_release(volatile uint64_t *p,
                                                      uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;"
               :: "l"(p), "l"(v) : "memory");
}

/* Peer's entry of one of the window's descriptor arrays. */
__device__ __forceinline__ const void *mep__dev_part(const uint8_t *parts,
                                                    int peer) {
  return parts + (size_t)peer * MEP_DEV_DESC_MAX;
}

/* Largest byte count of one RDMA WRITE the window posts (mlx5 reads a
 * count of 0 as 2 GiB). */
#define MEP__DEV_MLX5_MAX_WRITE (1u << 30)

/* One thread: RDMA WRITEs of len bytes from this rank's host part at
 * src_off to the MLX5 peer's at dst_off, on its queue pair. Inlined like
 * the rest: as calls, the MLX5 functions cost the EP kernels more
 * registers than inlined (ptxas -v: the low-latency combine receive 64
 * as before inlined, 90 with calls, half its occupancy). */
__device__ __forceinline__ int mep__dev_mlx5_put(
    const mep_dev_win_t *w, int peer, uint64_t dst_off, uint64_t src_off,
    uint64_t len, uint64_t deadline_ns) {
  mep_mlx5_qp_t q = mep_mlx5_qp_view(
      (const mep_dev_mlx5_peer_t *)mep__dev_part(w->peer_desc, peer));
  const mep_dev_mlx5_region_t *r = (const mep_dev_mlx5_region_t *)
      mep__dev_part(w->region_desc, peer);
  const mep_dev_mlx5_region_t *l = (const mep_dev_mlx5_region_t *)
      mep__dev_part(w->local_desc, peer);
  while (len) {
    uint32_t n = len > MEP__DEV_MLX5_MAX_WRITE ? MEP__DEV_MLX5_MAX_WRITE
                                               : (uint32_t)len;
    int rc = mep_mlx5_qp_put(&q, r->raddr + dst_off, r->rkey,
                             l->raddr + src_off, l->rkey, n, deadline_ns);
    if (rc) return rc;
    dst_off += n;
    src_off += n;
    len -= n;
  }
  return 0;
}

/* One thread: an inline RDMA WRITE of the 8-byte value to the MLX5 peer's
 * host part at off, after the requests before it on the queue pair. */
__device__ __forceinline__ int mep__dev_mlx5_signal(
    const mep_dev_win_t *w, int peer, uint64_t off, uint64_t value,
    uint64_t deadline_ns) {
  mep_mlx5_qp_t q = mep_mlx5_qp_view(
      (const mep_dev_mlx5_peer_t *)mep__dev_part(w->peer_desc, peer));
  const mep_dev_mlx5_region_t *r = (const mep_dev_mlx5_region_t *)
      mep__dev_part(w->region_desc, peer);
  return mep_mlx5_qp_signal(&q, r->raddr + off, r->rkey, value, 0,
                            deadline_ns);
}

/* One thread: waits until the NIC has carried out every request posted
 * so far to each MEP_DEV_MLX5 peer, so that the stage bytes they read may
 * be written again. Nothing to wait for with the other kinds (the proxy's
 * ring has its own counter, ring_done). 0, -1 (deadline) or -2 (a queue
 * pair failed: its requests will never complete, so waiting is over). */
template <bool kMlx5 = true>
__device__ __forceinline__ int mep_dev_quiet(const mep_dev_win_t *w,
                                             uint64_t deadline_ns) {
  int rc = 0;
  for (int p = 0; kMlx5 && p < w->size; p++) {
    if (w->kind[p] != MEP_DEV_MLX5) continue;
    mep_mlx5_qp_t q = mep_mlx5_qp_view(
        (const mep_dev_mlx5_peer_t *)mep__dev_part(w->peer_desc, p));
    /* completions that came free it without a NOP of its own */
    if (mep_mlx5_load64(q.ready) == mep_mlx5_load64(q.ci)) continue;
    if (mep_mlx5_qp_poll(&q) == 0 &&
        mep_mlx5_load64(q.ready) == mep_mlx5_load64(q.ci))
      continue;
    int r = mep_mlx5_qp_quiet(&q, deadline_ns);
    if (r == -1) return -1;
    if (r) rc = r;
  }
  return rc;
}

/* Where the bytes for `peer` at its offset dst_off are to be written. */
__device__ __forceinline__ uint8_t *mep_dev_dst(const mep_dev_win_t *w,
                                                int peer, uint64_t dst_off,
                                                uint64_t stage_off) {
  if (w->kind[peer] == MEP_DEV_PTR) return w->peer[peer] + dst_off;
  return w->host_base + stage_off;
}

/* Where the bytes a source rank put at offset `off` land on this rank. */
__device__ __forceinline__ uint8_t *mep_dev_src(const mep_dev_win_t *w,
                                                int src, uint64_t off) {
  if (w->kind[src] == MEP_DEV_PTR) return w->dev_base + off;
  return w->host_base + off;
}

/* Where the bytes at offset `off` of a mapped peer's device part (the
 * peer's own bytes, not ones it sent) are readable here, for a kernel that
 * pulls from the peer instead of having it push; NULL for a peer reached
 * through the proxy, whose memory this GPU cannot read. */
__device__ __forceinline__ const uint8_t *mep_dev_peer_src(
    const mep_dev_win_t *w, int peer, uint64_t off) {
  if (w->kind[peer] != MEP_DEV_PTR) return 0;
  return w->peer[peer] + off;
}

/* One thread: enqueues a proxy command, waiting for a free slot until
 * deadline_ns. The command's fields are written before its seq. */
__device__ __forceinline__ int mep__dev_enqueue(const mep_dev_win_t *w,
                                                uint32_t op, int peer,
                                                uint64_t src_off,
                                                uint64_t dst_off, uint64_t arg,
                                                uint64_t deadline_ns) {
  unsigned long long pos = atomicAdd(w->ring_tail, 1ull);
  while (pos - *w->ring_done >= w->ring_len) {
    if (mep_dev_now_ns() > deadline_ns) return -1;
    __nanosleep(64);
  }
  mep_dev_cmd_t *c = &w->ring[pos & (w->ring_len - 1)];
  c->op = op;
  c->peer = peer;
  c->src_off = src_off;
  c->dst_off = dst_off;
  c->arg = arg;
  __threadfence_system();
  mep_dev_store_release((volatile uint64_t *)&c->seq, pos + 1);
  return 0;
}

/* One thread, after the bytes at mep_dev_dst() are written and fenced
 * (__threadfence_system by each writer): sends them. Nothing to do for a
 * mapped peer, whose memory already holds them. */
template <bool kMlx5 = true>
__device__ __forceinline__ int mep_dev_put(const mep_dev_win_t *w, int peer,
                                           uint64_t dst_off,
                                           uint64_t stage_off, uint64_t len,
                                           uint64_t deadline_ns) {
  int32_t k = w->kind[peer];
  if (k == MEP_DEV_PTR) return 0;
  if (kMlx5 && k == MEP_DEV_MLX5)
    return mep__dev_mlx5_put(w, peer, dst_off, stage_off, len, deadline_ns);
  return mep__dev_enqueue(w, MEP_DEV_CMD_PUT, peer, stage_off, dst_off, len,
                          deadline_ns);
}

/* As mep_dev_signal, without its fence: for a caller that already made
 * every write the signal covers visible at system scope (a
 * __threadfence_system after them, in this thread or in one whose
 * barrier or atomic this thread observed after a fence of its own), so
 * that the threads of a block signal many peers at once instead of
 * fencing one after another. */
template <bool kMlx5 = true>
__device__ __forceinline__ int mep_dev_signal_fenced(const mep_dev_win_t *w,
                                                     int peer, uint64_t off,
                                                     uint64_t value,
                                                     uint64_t deadline_ns) {
  int32_t k = w->kind[peer];
  if (k == MEP_DEV_PTR) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;"
                 :: "l"(w->peer[peer] + off), "l"(value) : "memory");
    return 0;
  }
  if (kMlx5 && k == MEP_DEV_MLX5)
    return mep__dev_mlx5_signal(w, peer, off, value, deadline_ns);
  return mep__dev_enqueue(w, MEP_DEV_CMD_SIGNAL, peer, 0, off, value,
                          deadline_ns);
}

/* One thread: stores `value` in the 8-byte-aligned word at `off` of the
 * peer's window, after every earlier put to that peer this rank issued
 * (and, for a mapped peer, every write the calling thread has seen): a
 * system-scope fence, then the store or the proxy command. */
template <bool kMlx5 = true>
__device__ __forceinline__ int mep_dev_signal(const mep_dev_win_t *w,
                                              int peer, uint64_t off,
                                              uint64_t value,
                                              uint64_t deadline_ns) {
  __threadfence_system();
  return mep_dev_signal_fenced<kMlx5>(w, peer, off, value, deadline_ns);
}

#endif /* MEP_DEVICE_WIN_CUH */
