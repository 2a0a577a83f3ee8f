/*
 * device.h - GPU kernels that reach peers themselves: the device window.
 *
 * Audience: frontends with their own kernels (frontends/ep). A device
 * window is `bytes` of memory on every rank of a communicator, in two
 * parts of equal size and layout: a device part (on the GPU that was
 * current at creation) and, when some pair of ranks of the group is not
 * reached through mapped memory, a pinned host part mapped into the GPU.
 *
 * Per peer, the window has one descriptor kind (transport.h):
 *  - MEP_DEV_PTR: the peer's device part is mapped here (this rank itself,
 *    and every peer whose device route gives MEP_DEV_PTR descriptors, such
 *    as the nvlink transport's); kernels store into it directly.
 *  - MEP_DEV_MLX5: the peer's device route is a transport whose requests
 *    kernels post themselves (ibgda): kernels write the bytes into this
 *    rank's host part at a stage offset, as for the proxy, and post an
 *    RDMA WRITE from there to the peer's host part on the route's queue
 *    pair, with no CPU on the path (a transport that does not map a peer's
 *    memory still wins over this kind only where none maps it);
 *  - MEP_DEV_PROXY: kernels write the bytes into this rank's host part (a
 *    "stage" offset the caller picks) and enqueue a command on a
 *    host-mapped ring; a CPU thread of the window carries it out with
 *    mep_put / mep_signal over the communicator's route to that peer, which
 *    lands the bytes in the peer's host part at the destination offset.
 * The inline device functions of mep/device/win.cuh hide the kinds:
 * kernels call mep_dev_dst / mep_dev_put / mep_dev_signal for sends and
 * mep_dev_src for where a source's bytes land here, and never test a kind
 * (mep_dev_peer_src, a mapped peer's own bytes, is NULL for the others).
 *
 * This header is plain C: host code includes it for the API, CUDA code
 * for the descriptor layout (and mep/device/win.cuh for the functions).
 */
#ifndef MEP_DEVICE_H
#define MEP_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "mep/mep.h"
#include "mep/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MEP_DEV_WIN_VERSION 3

/* Commands of the proxy ring. */
#define MEP_DEV_CMD_PUT 1    /* bytes of own host part -> peer's host part */
#define MEP_DEV_CMD_SIGNAL 2 /* store a 64-bit value in the peer's host part */

/* One slot of the proxy ring, in pinned host memory. The GPU writes every
 * field, fences, and writes `seq` last; the proxy takes the slot when seq
 * equals its ring position + 1. */
typedef struct mep_dev_cmd {
  uint64_t seq;
  uint32_t op;     /* MEP_DEV_CMD_* */
  int32_t peer;
  uint64_t src_off; /* PUT: offset in this rank's host part */
  uint64_t dst_off; /* offset in the peer's host part */
  uint64_t arg;     /* PUT: length in bytes; SIGNAL: the value */
  uint64_t pad[3];  /* one slot per 64 bytes */
} mep_dev_cmd_t;

/* What a kernel takes: a device-resident, read-only struct. Only grows at
 * its end; `version` says which fields exist. */
typedef struct mep_dev_win {
  uint32_t version;      /* MEP_DEV_WIN_VERSION */
  int32_t rank, size;
  uint32_t ring_len;     /* slots of `ring`, a power of two; 0: no proxy */
  uint64_t bytes;        /* of each part */
  uint8_t *dev_base;     /* this rank's device part */
  uint8_t *host_base;    /* this rank's host part, mapped; NULL if none */
  const int32_t *kind;   /* device [size]: MEP_DEV_PTR, MEP_DEV_MLX5 or
                          * MEP_DEV_PROXY */
  uint8_t *const *peer;  /* device [size]: a PTR peer's device part as
                          * mapped here (own rank: dev_base); NULL else */
  mep_dev_cmd_t *ring;   /* host, mapped [ring_len] */
  unsigned long long *ring_tail;    /* device: slots reserved so far */
  volatile uint64_t *ring_done;     /* host, mapped: slots the proxy
                                     * has carried out and whose stage
                                     * bytes it no longer reads */
  volatile uint32_t *proxy_failed;  /* host, mapped: nonzero once the
                                     * proxy dropped a command (a peer
                                     * failed); see mep_devwin_proxy_error */
  /* Version 2: each peer's device descriptor as its transport gave it
   * (transport.h), MEP_DEV_DESC_MAX bytes per rank, zero for this rank and
   * for proxy peers: the peer part (the connection) and the region part
   * (the peer's part of the window). Device functions of kinds beyond ptr
   * read them; for MEP_DEV_PTR `peer` above is the region part's base. */
  const uint8_t *peer_desc;   /* device [size][MEP_DEV_DESC_MAX] */
  const uint8_t *region_desc; /* device [size][MEP_DEV_DESC_MAX] */
  /* Version 3: for a MEP_DEV_MLX5 peer, region_desc is the peer's host
   * part and local_desc this rank's own host part as the peer's transport
   * names it (its lkey); zero for the other kinds. */
  const uint8_t *local_desc;  /* device [size][MEP_DEV_DESC_MAX] */
} mep_dev_win_t;

typedef struct mep_devwin mep_devwin_t;

/* Creates a window of `bytes` (> 0) per part. Collective: every active
 * rank of `comm` calls it in the same order with the same bytes (else
 * MEP_ERR_MISMATCH). Both parts start zeroed. Each peer's kind comes from
 * its device route (the first transport of the communicator's list that
 * declares MEP_DEV_PTR and gives a descriptor for it, else the first
 * that declares MEP_DEV_MLX5; [core] device_transport narrows the
 * choice): MEP_DEV_PTR (and this rank) where it maps the peer's memory,
 * MEP_DEV_MLX5 where kernels post its requests, MEP_DEV_PROXY over the
 * communicator's route elsewhere. The host part (and the proxy thread)
 * exist only when a pair of the group needs a kind other than
 * MEP_DEV_PTR, which all ranks agree on. Uses the CUDA device current on
 * the calling thread. The window keeps `comm`, which must outlive it.
 * Errors: MEP_ERR_UNSUPPORTED without CUDA (build or GPU), MEP_ERR_NOMEM,
 * MEP_ERR_SYSTEM for a CUDA failure, errors of the store and
 * transports. */
MEP_API int mep_devwin_create(mep_comm_t *comm, size_t bytes,
                              mep_devwin_t **out);

/* Lets the proxy carry out every command kernels queued so far, and the
 * NIC every request they posted to MEP_DEV_MLX5 peers (each bounded by
 * the communicator's timeout), then stops the proxy: later commands are
 * not served. For a teardown in step: drain, a barrier of the group, then
 * destroy, so that no rank's late put reaches a peer's freed host part.
 * Call it only when no kernel using the window runs. Returns 0, or
 * MEP_ERR_TIMEOUT (commands left undone), MEP_ERR_SYSTEM, or
 * MEP_ERR_INVALID for NULL; a window without a proxy, or one already
 * drained, returns 0. */
MEP_API int mep_devwin_drain(mep_devwin_t *win);

/* Drains the window as mep_devwin_drain does (commands still queued, and
 * requests posted to MEP_DEV_MLX5 peers, are carried out first, bounded
 * by the communicator's timeout), unmaps peers and frees both parts.
 * Local, not collective: peers must no longer write into this rank's
 * window (the caller's protocol ensures it, as for regions). NULL: no-op. */
MEP_API int mep_devwin_destroy(mep_devwin_t *win);

/* The descriptor kernels take (device memory, owned by the window). */
MEP_API const mep_dev_win_t *mep_devwin_device(const mep_devwin_t *win);

/* This rank's device part; its host part (NULL when the group needs no
 * proxy); the bytes of each. */
MEP_API void *mep_devwin_dev_base(const mep_devwin_t *win);
MEP_API void *mep_devwin_host_base(const mep_devwin_t *win);
MEP_API size_t mep_devwin_bytes(const mep_devwin_t *win);

/* The kind kernels use for `peer` (MEP_DEV_PTR, MEP_DEV_MLX5 or
 * MEP_DEV_PROXY), or MEP_ERR_INVALID for a rank outside the group. */
MEP_API int mep_devwin_kind(const mep_devwin_t *win, int peer);

/* 0 while the proxy has carried out every command; else the first error
 * it met (MEP_ERR_PEER_FAILED, ...), with mep_last_error-style text in
 * `msg` (may be NULL). Commands to a failed peer are dropped, so the
 * receivers' timeouts, not a hang, tell the rest of the group. */
MEP_API int mep_devwin_proxy_error(const mep_devwin_t *win, char *msg,
                                   size_t len);

#ifdef __cplusplus
}
#endif
#endif /* MEP_DEVICE_H */
