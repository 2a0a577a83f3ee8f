/*
 * nvlink.h - the nvlink transport's internal objects, shared by its files.
 *
 * The transport moves CUDA memory between processes of one host with CUDA
 * IPC: a region's remote key carries the cudaIpcMemHandle_t of its
 * allocation, the importer maps that allocation into its own address space
 * and writes into it with cudaMemcpyAsync on one stream per context; a
 * signal is a one-thread kernel on the same stream, so it lands after
 * every earlier write of the context (hence of the ep).
 *
 * No wire protocol: nothing is sent between the processes besides the
 * address and key blobs, which travel through the core's store.
 *
 * A peer that dies gives no notice through CUDA IPC: its memory stays
 * mapped (our mapping keeps the allocation alive) and writes into it still
 * complete. The core finds dead peers through its own probes and then
 * unimports and closes; both work after the peer died.
 *
 * Threads: one mutex per context (ctx->mu) guards its eps, registrations,
 * queues and event pool, and is held while work is enqueued on the stream
 * so that the order of the pending queue is the stream's order. The table
 * of opened IPC handles is process-wide (CUDA refuses to open one handle
 * twice in a process) and has its own mutex, a leaf.
 * Every entry point that calls CUDA makes the context's device current for
 * the call and restores the caller's device after it.
 */
#ifndef MEP_NVLINK_NVLINK_H
#define MEP_NVLINK_NVLINK_H

#include <pthread.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "mep/transport.h"

#define NVL_LOG(ctx, lvl, ...) ((ctx)->env->log((lvl), __VA_ARGS__))
#define NVL_ERR(ctx, code, ...) ((ctx)->env->set_error(__VA_ARGS__), (code))

#define NVL_DEFAULT_TIMEOUT_MS 30000

/* The transport's name; the build makes a copy under another (meson.build)
 * to test that nothing depends on it. */
#ifndef MEP_NVL_NAME
#define MEP_NVL_NAME "nvlink"
#endif

/* Blobs: little-endian, a magic and a version first. */
#define NVL_BLOB_VERSION 1
#define NVL_BUSID_LEN 20
#define NVL_HANDLE_LEN 64
#define NVL_ADDR_LEN (4 + 4 + 8 + 8 + 8 + 4 + 4 + 16 + NVL_BUSID_LEN)
#define NVL_RKEY_LEN (4 + 4 + 8 + 8 + 8 + 8 + NVL_HANDLE_LEN)

/* What a context publishes about itself. */
typedef struct nvl_addr {
  uint64_t host;    /* 64-bit hash of env->host_id */
  uint64_t nonce;   /* random per context: tells processes apart */
  uint64_t visible; /* digest of the set of GPUs this process sees */
  uint32_t pid;
  uint32_t dev; /* the ordinal, for messages only */
  uint8_t uuid[16];
  char busid[NVL_BUSID_LEN]; /* NUL-terminated PCI bus id */
} nvl_addr_t;

/* What a registration publishes: its allocation and its place in it. */
typedef struct nvl_rkey {
  uint64_t nonce; /* the owner context's */
  uint64_t off;   /* of the region in its allocation */
  uint64_t len;   /* of the region */
  uint64_t size;  /* of the allocation */
  uint8_t handle[NVL_HANDLE_LEN];
} nvl_rkey_t;

struct nvl_ep;

/* A write whose event is not known complete yet. */
typedef struct nvl_op {
  cudaEvent_t ev;
  uint64_t token;
  int peer;
  struct nvl_ep *ep; /* NULL once its ep closed: reported already */
} nvl_op_t;

typedef struct nvl_ctx {
  const mep_tp_env_t *env;
  int rank, size;
  int dev; /* the device current at init */
  int timeout_ms;
  int peer_access; /* [nvlink] enable_peer_access */
  cudaStream_t stream;
  nvl_addr_t self;
  pthread_mutex_t mu;
  struct nvl_ep **eps; /* [size]: an open ep, a closed one, or NULL */
  struct nvl_mr *mrs;
  nvl_op_t *ops; /* pending writes, a ring in stream order */
  size_t ops_head, ops_n, ops_cap;
  mep_tp_completion_t *done; /* completions known, a ring */
  size_t done_head, done_n, done_cap;
  cudaEvent_t *pool; /* idle events */
  size_t pool_n, pool_cap;
  cudaError_t broken; /* a sticky CUDA error seen on the stream, or 0 */
} nvl_ctx_t;

typedef struct nvl_ep {
  nvl_ctx_t *ctx;
  int rank;
  int closed;
  int peer_dev; /* the peer's GPU as an ordinal here, -1 when it is ours */
  uint64_t nonce;
  struct nvl_rmr *rmrs;
} nvl_ep_t;

typedef struct nvl_mr {
  nvl_ctx_t *ctx;
  struct nvl_mr *prev, *next;
  uint8_t *ptr;
  uint64_t len;
} nvl_mr_t;

typedef struct nvl_map nvl_map_t;

typedef struct nvl_rmr {
  nvl_ep_t *ep;
  struct nvl_rmr *prev, *next;
  nvl_map_t *map;
  uint8_t *ptr; /* the region's first byte in our address space */
  uint64_t len;
} nvl_rmr_t;

/* device.c */
int mep__nvl_enter(nvl_ctx_t *ctx, int *saved);
void mep__nvl_leave(nvl_ctx_t *ctx, int saved);
int mep__nvl_identity(int dev, nvl_addr_t *a, char *why, size_t why_len);
uint64_t mep__nvl_hash(const void *p, size_t n, uint64_t h);
int mep__nvl_drain(nvl_ctx_t *ctx, const char *what);

/* blob.c */
void mep__nvl_addr_encode(uint8_t *buf, const nvl_addr_t *a);
int mep__nvl_addr_decode(const void *buf, size_t len, nvl_addr_t *a,
                         char *why, size_t why_len);
void mep__nvl_rkey_encode(uint8_t *buf, const nvl_rkey_t *k);
int mep__nvl_rkey_decode(const void *buf, size_t len, nvl_rkey_t *k,
                         char *why, size_t why_len);

/* region.c */
int mep__nvl_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len, mep_memkind_t kind,
                 mep_tp_mr_t **mr, void *rkey, size_t *rkey_len);
int mep__nvl_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr);
int mep__nvl_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                    mep_tp_rmr_t **rmr);
int mep__nvl_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr);
int mep__nvl_map(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void **dev_ptr);
void mep__nvl_rmrs_release(nvl_ctx_t *ctx, nvl_rmr_t *list);
void mep__nvl_mrs_free(nvl_ctx_t *ctx);

/* desc.c */
int mep__nvl_device_descriptor(mep_tp_ctx_t *ctx, int peer, void *desc,
                               size_t *len);
int mep__nvl_device_region(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void *desc,
                           size_t *len);

/* plugin.c: the [nvlink] keys */
#define MEP_NVL_NKEYS 2
extern const mep_tp_cfg_key_t mep__nvl_keys[MEP_NVL_NKEYS];

/* ops.c */
int mep__nvl_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
                   mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
                   uint64_t token);
int mep__nvl_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                    uint64_t value, mep_signal_op_t op);
int mep__nvl_poll(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max);
void mep__nvl_ops_orphan(nvl_ctx_t *ctx, nvl_ep_t *ep);
void mep__nvl_ops_free(nvl_ctx_t *ctx);

/* signal.cu: enqueues the store (add == 0) or atomic add of `value` to
 * the 8-byte word at dst on `stream`; the cudaError_t of the launch. */
int mep__nvl_signal_launch(uint64_t *dst, uint64_t value, int add,
                           cudaStream_t stream);

#endif
