/*
 * ibgda.h - the ibgda transport's internal objects.
 *
 * GPU-initiated RDMA on mlx5: kernels write work requests into a queue
 * pair's send queue and ring its doorbell (mep/device/mlx5.h), with no CPU
 * on the path. Two backends ([ibgda] backend):
 *  - device: an mlx5 NIC through rdma-core (hw.c): RC queue pairs made by
 *    libibverbs and libmlx5, whose send queue, doorbell record and CQ
 *    (host memory) and doorbell register (a UAR page) mlx5dv_init_obj
 *    names; kernels reach them once mapped for the GPU (gpu.c). Built
 *    against mlx5dv.h; no ConnectX was at hand to run it (docs/ibgda.md).
 *  - model: the software model of the NIC (model.h) serves queue pairs
 *    laid out as mlx5 lays them out; peers are processes of this host.
 * Both fill the same layout (m5_qp_t's producer fields), so everything
 * above it (host posting, descriptors, kernels) is one code. The
 * connection set-up is the verbs plugin's: its bootstrap (handshake.h)
 * and, on a NIC, its device opening and RC steps (rdma_dev.h), built from
 * plugins/verbs (one implementation); the bootstrap's socket stays open
 * as a liveness channel. Host write() and signal() post on the same
 * queue pair, built by the same builders, so the core runs over the
 * transport unchanged.
 *
 * Per peer two RC queue pairs: `qp`, which the host posts on, and `kqp`,
 * which GPU kernels alone post on (its descriptor is the peer part kernels
 * take), so that neither producer's bookkeeping meets the other's WQEs.
 * Host posting on qp: every write asks for a CQE
 * (its token completes with it); signals ask for one only when half the
 * send queue went by without, so that completions keep freeing room. The
 * CQE's WQE counter completes every WQE up to it (in order on an RC QP).
 *
 * Locks, in this order: ctx->mu (peers table, tombstones), ep->mu (the
 * queue pair's producer side and CQ consumer), ctx->cq_mu (the plugin's
 * completion queue, a leaf).
 */
#ifndef MEP_IBGDA_IBGDA_H
#define MEP_IBGDA_IBGDA_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "handshake.h"
#include "fork_watch.h"
#include "model.h"
#include "rdma_dev.h"
#include "mep/transport.h"

#define IBGDA_ERR(ctx, code, ...) ((ctx)->env->set_error(__VA_ARGS__), (code))
#define IBGDA_LOG(ctx, lvl, ...) ((ctx)->env->log((lvl), __VA_ARGS__))
#define IBGDA_BYE_MS 200

enum { IBGDA_BACKEND_AUTO = 0, IBGDA_BACKEND_DEVICE = 1,
       IBGDA_BACKEND_MODEL = 2 };

typedef struct ibgda_cfg {
  int backend;
  char device[64];
  int port;
  uint32_t sq_bbs;
  int max_inline;
  int gid_index;
  char boot_ifname[64];
  int port_lo, port_hi;
} ibgda_cfg_t;

/* What the plugin remembers of one posted WQE, at its first BB. */
typedef struct ibgda_rec {
  uint64_t token;
  uint16_t nbb;
  uint8_t has_token;
} ibgda_rec_t;

struct ibgda_ctx;

/* Memory kernels reach: host memory, or (io) a page of the NIC's. */
typedef struct ibgda_range {
  void *host;
  size_t len;
  int io;
} ibgda_range_t;
#define IBGDA_MAX_RANGES 5

/* The kernels' queue pair as one GPU reaches it (gpu.c). */
#define IBGDA_KCTR 8 /* counter words: pi, ready, ci, cq_ci, cq_lock */
typedef struct ibgda_gpu {
  int n;         /* ranges mapped; 0: not attached */
  ibgda_range_t r[IBGDA_MAX_RANGES];
  uint64_t dev[IBGDA_MAX_RANGES]; /* where kernels reach each */
  uint64_t ctr;  /* IBGDA_KCTR zeroed words in that GPU's memory */
  void *cu_ctx;  /* the CUDA context they belong to */
} ibgda_gpu_t;

/* backend = device: a queue pair's verbs objects and its layout as the
 * producers see it (an m5_qp_t that no model serves; hw.c). */
typedef struct ibgda_hwqp {
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  uint32_t psn;
  m5_qp_t view;
  uint64_t user[8] __attribute__((aligned(64)));
} ibgda_hwqp_t;

typedef struct ibgda_ep {
  struct ibgda_ctx *ctx;
  int rank;
  uint64_t inc;
  pthread_mutex_t mu;
  int dead, retired;
  int link_fd;
  mep__rdma_link_rx_t link_rx;
  m5_qp_t *qp;  /* the host's */
  m5_qp_t *kqp; /* the kernels' */
  ibgda_hwqp_t *hw[2]; /* backend = device: what qp and kqp are views of */
  uint32_t peer_qpn, peer_kqpn;
  /* kqp for kernels, attached at the first device_descriptor made with a
   * CUDA context current (gpu.c) */
  ibgda_gpu_t kgpu;
  /* qp's counters as mep/device/mlx5_qp.h names them (qp->user: pi,
   * ready, ci, cq_ci, cq_lock), kept by host posting; kqp's are the
   * kernels' */
  uint64_t *ctr;
  uint64_t last_sig; /* pi of the last WQE that asked for a CQE */
  ibgda_rec_t *recs; /* [sq_bbs] */
  unsigned npoll;
} ibgda_ep_t;

typedef struct ibgda_mr {
  struct ibgda_ctx *ctx;
  uint8_t *base;
  uint64_t len;
  uint32_t key;  /* the rkey (the model's one key serves as both) */
  uint32_t lkey;
  struct ibv_mr *ib; /* backend = device */
} ibgda_mr_t;

typedef struct ibgda_rmr {
  ibgda_ep_t *ep;
  uint64_t addr, len;
  uint32_t rkey;
} ibgda_rmr_t;

struct ibgda_cuda;
struct ibgda_pin;

typedef struct ibgda_ctx {
  const mep_tp_env_t *env;
  struct ibgda_cuda *cuda; /* the CUDA driver, once opened (gpu.c) */
  struct ibgda_pin *pins;  /* pages mapped for GPUs (gpu.c) */
  ibgda_cfg_t cfg;
  int rank, size, timeout_ms;
  uint64_t inc;
  m5_t model;
  int model_open;
  mep__rdma_dev_t dev; /* backend = device */
  int hw;              /* backend = device, its device open */
  uint64_t *sink; /* 8 registered bytes for FETCH_AND_ADD results */
  uint32_t sink_key;   /* its lkey */
  struct ibv_mr *sink_mr; /* backend = device */
  mep__rdma_boot_t boot;
  uint8_t addr[MEP_TP_MAX_ADDR];
  size_t addr_len;
  pthread_mutex_t mu, cq_mu;
  ibgda_ep_t **peers; /* [size]: live or tombstone */
  mep_tp_completion_t *cq;
  size_t cq_head, cq_n, cq_cap;
  mep__fork_watch_t fork; /* a forked child lets go of the sockets */
} ibgda_ctx_t;

/* config.c */
#define MEP_IBGDA_NKEYS 8
extern const mep_tp_cfg_key_t mep__ibgda_keys[MEP_IBGDA_NKEYS];
int mep__ibgda_cfg_read(const mep_tp_env_t *env, ibgda_cfg_t *cfg);

/* probe.c: backend = device, before anything opens: 0 where an mlx5
 * device is listed (the one configured, if any), else MEP_ERR_UNAVAILABLE
 * or MEP_ERR_CONFIG with the reason (no RDMA device, none mlx5, no libmlx5),
 * error set. */
int mep__ibgda_probe_device(const mep_tp_env_t *env, const ibgda_cfg_t *cfg);
/* libmlx5's entry points this plugin calls, or NULL and *why. */
struct mlx5dv_obj;
typedef struct ibgda_dv {
  _Bool (*is_mlx5)(struct ibv_device *);
  int (*init_obj)(struct mlx5dv_obj *, uint64_t);
} ibgda_dv_t;
const ibgda_dv_t *mep__ibgda_dv(const char **why);

/* hw.c: backend = device. open: the device and port (rdma_dev.h, only
 * mlx5 devices), its protection domain, the sink's registration. */
int mep__ibgda_hw_open(ibgda_ctx_t *ctx);
void mep__ibgda_hw_close(ibgda_ctx_t *ctx);
/* A queue pair at INIT and its CQ, its layout in q->view: 0 or an error
 * (set). */
int mep__ibgda_hw_qp_create(ibgda_ctx_t *ctx, ibgda_hwqp_t **q);
void mep__ibgda_hw_qp_destroy(ibgda_hwqp_t *q);
/* RTR, RTS towards queue pair i of the peer's t. */
int mep__ibgda_hw_qp_up(ibgda_ctx_t *ctx, ibgda_hwqp_t *q, int peer,
                        const mep__rdma_qpinfo_t *t, int i);
/* The layout producers use from what mlx5dv_init_obj gave for a queue
 * pair (its number qpn) and its CQ: 0, or -1 and why this version cannot
 * post on it (a stride, CQE size or count it does not handle). Pure: the
 * unit tests feed it mlx5dv's structures. */
struct mlx5dv_qp;
struct mlx5dv_cq;
int mep__ibgda_hw_layout(const struct mlx5dv_qp *dq,
                         const struct mlx5dv_cq *dc, uint32_t qpn,
                         m5_qp_t *view, char *why, size_t why_len);
/* Registers host memory: lkey, rkey. */
int mep__ibgda_hw_reg(ibgda_ctx_t *ctx, void *ptr, size_t len,
                      ibgda_mr_t *mr);

/* addr.c: the address blob and the remote-key blob */
#define MEP_IBGDA_ADDR_LEN 64
typedef struct ibgda_addr {
  uint8_t backend;
  uint8_t boot_id[16];
  uint64_t pidns; /* the inode of the PID namespace */
  uint32_t pid;
  uint64_t keys; /* the model's key table in that process */
  mep__rdma_boot_addr_t boot;
} ibgda_addr_t;
void mep__ibgda_addr_encode(uint8_t out[MEP_IBGDA_ADDR_LEN],
                            const ibgda_addr_t *a);
int mep__ibgda_addr_decode(const void *blob, size_t len, ibgda_addr_t *a,
                           char *why, size_t why_len);
/* This host's kernel boot id and PID namespace, for the blob. */
int mep__ibgda_host_ids(uint8_t boot_id[16], uint64_t *pidns);
#define MEP_IBGDA_RKEY_LEN 32
typedef struct ibgda_rkey {
  uint32_t rank, rkey;
  uint64_t addr, len;
} ibgda_rkey_t;
void mep__ibgda_rkey_encode(uint8_t out[MEP_IBGDA_RKEY_LEN],
                            const ibgda_rkey_t *k);
int mep__ibgda_rkey_decode(const void *blob, size_t len, ibgda_rkey_t *k,
                           char *why, size_t why_len);

/* cq.c: the plugin's completion queue */
void mep__ibgda_cq_push(ibgda_ctx_t *ctx, uint64_t token, int status,
                        int peer);
int mep__ibgda_cq_pop(ibgda_ctx_t *ctx, mep_tp_completion_t *out, int max);

/* gpu.c: maps the n ranges for kernels of the current CUDA context and
 * gives the producers' counters there (*g; already attached to this
 * context: nothing to do): 0, or -1 and why. gpu_addr: where kernels
 * reach a host address within the ranges (0: none). detach undoes
 * attach. */
int mep__ibgda_gpu_attach(ibgda_ctx_t *ctx, const ibgda_range_t *r, int n,
                          ibgda_gpu_t *g, char *why, size_t why_len);
uint64_t mep__ibgda_gpu_addr(const ibgda_gpu_t *g, const void *host);
void mep__ibgda_gpu_detach(ibgda_ctx_t *ctx, ibgda_gpu_t *g);
void mep__ibgda_gpu_close(ibgda_ctx_t *ctx);

/* ep.c */
int mep__ibgda_connect(mep_tp_ctx_t *ctx, int peer, const void *blob,
                       size_t len, mep_tp_ep_t **ep);
int mep__ibgda_close(mep_tp_ep_t *ep);
void mep__ibgda_ep_free(ibgda_ep_t *ep);

/* post.c */
int mep__ibgda_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
                     mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
                     uint64_t token);
int mep__ibgda_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                      uint64_t value, mep_signal_op_t op);
/* ep->mu held: takes the CQEs waiting; -1 if the endpoint failed. */
int mep__ibgda_reap(ibgda_ep_t *ep);
/* ep->mu held: fails the endpoint, completing what is pending with
 * `status`; reports {TOKEN_NONE, status, rank} when `report`. */
void mep__ibgda_ep_fail(ibgda_ep_t *ep, int status, int report);
/* ep->mu held: waits, at most wait_ms, until every WQE posted completed
 * (a NOP asks for the last CQE). 1 when they did. */
int mep__ibgda_settle(ibgda_ep_t *ep, int wait_ms);
int mep__ibgda_poll(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max);

/* region.c */
int mep__ibgda_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len,
                   mep_memkind_t kind, mep_tp_mr_t **mr, void *rkey,
                   size_t *rkey_len);
int mep__ibgda_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr);
int mep__ibgda_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                      mep_tp_rmr_t **rmr);
int mep__ibgda_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr);
int mep__ibgda_device_descriptor(mep_tp_ctx_t *ctx, int peer, void *desc,
                                 size_t *len);
int mep__ibgda_device_region(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void *desc,
                             size_t *len);
int mep__ibgda_device_local(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr, void *desc,
                            size_t *len);

#endif
