/*
 * ibgda.h - the ibgda transport's internal objects.
 *
 * GPU-initiated RDMA on mlx5: kernels write work requests into a queue
 * pair's send queue and ring its doorbell (mep/device/mlx5.h), with no CPU
 * on the path. Two backends ([ibgda] backend):
 *  - device: an mlx5 NIC through rdma-core (mlx5dv). This version probes
 *    for one and reports the transport unavailable, with the reason, in
 *    every case: the DEVX queue set-up and UAR mapping are not built yet,
 *    and it never pretends (docs/ibgda.md).
 *  - model: the software model of the NIC (model.h) serves queue pairs
 *    laid out as mlx5 lays them out; peers are processes of this host.
 * The connection set-up is the verbs plugin's bootstrap (handshake.h,
 * built from plugins/verbs: one implementation), kept open as a liveness
 * channel. Host write() and signal() post on the same queue pair, built
 * by the same builders, so the core runs over the transport unchanged.
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
#include "model.h"
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

/* The kernels' queue pair as one GPU reaches it (gpu.c). */
#define IBGDA_KCTR 8 /* counter words: pi, ready, ci, cq_ci, cq_lock */
typedef struct ibgda_gpu {
  uint64_t mem;  /* where kernels reach the queue pair's block; 0: not
                  * attached */
  uint64_t ctr;  /* IBGDA_KCTR zeroed words in that GPU's memory */
  void *cu_ctx;  /* the CUDA context they belong to */
  void *host;    /* the block (host address), for detaching */
} ibgda_gpu_t;

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
  uint32_t key;
} ibgda_mr_t;

typedef struct ibgda_rmr {
  ibgda_ep_t *ep;
  uint64_t addr, len;
  uint32_t rkey;
} ibgda_rmr_t;

struct ibgda_cuda;

typedef struct ibgda_ctx {
  const mep_tp_env_t *env;
  struct ibgda_cuda *cuda; /* the CUDA driver, once opened (gpu.c) */
  ibgda_cfg_t cfg;
  int rank, size, timeout_ms;
  uint64_t inc;
  m5_t model;
  int model_open;
  uint64_t *sink; /* 8 registered bytes for FETCH_AND_ADD results */
  uint32_t sink_key;
  mep__rdma_boot_t boot;
  uint8_t addr[MEP_TP_MAX_ADDR];
  size_t addr_len;
  pthread_mutex_t mu, cq_mu;
  ibgda_ep_t **peers; /* [size]: live or tombstone */
  mep_tp_completion_t *cq;
  size_t cq_head, cq_n, cq_cap;
} ibgda_ctx_t;

/* config.c */
#define MEP_IBGDA_NKEYS 7
extern const mep_tp_cfg_key_t mep__ibgda_keys[MEP_IBGDA_NKEYS];
int mep__ibgda_cfg_read(const mep_tp_env_t *env, ibgda_cfg_t *cfg);

/* probe.c: backend = device. Always an error: MEP_ERR_UNAVAILABLE with
 * the reason (no mlx5 device, or one found that this version cannot
 * drive), error set. */
int mep__ibgda_probe_device(const mep_tp_env_t *env, const ibgda_cfg_t *cfg);

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

/* gpu.c: maps the block mem for kernels of the current CUDA context and
 * gives its producers' counters there (*g; already attached to this
 * context: nothing to do): 0, or -1 and why. detach undoes it. */
int mep__ibgda_gpu_attach(ibgda_ctx_t *ctx, void *mem, size_t len,
                          ibgda_gpu_t *g, char *why, size_t why_len);
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
