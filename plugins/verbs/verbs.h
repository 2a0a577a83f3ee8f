/*
 * verbs.h - the verbs transport's internal objects, shared by its files.
 *
 * One context per communicator: an opened RDMA device (protection domain,
 * completion channel), a bootstrap listener (handshake.h), and per peer an
 * endpoint: a completion queue of its own, nqp RC queue pairs and the TCP
 * socket of its set-up, kept open as a liveness channel. Everything the
 * core can wait for is behind one epoll fd (props.event_fd): the
 * completion channel, the device's async events, the endpoints' sockets
 * and an eventfd that is readable while completions wait in the plugin's
 * own queue. No threads.
 *
 * Work requests. Each queue pair has a ring of work requests indexed by a
 * sequence number: [head, posted) are at the device, [posted, tail) wait
 * in the plugin (the send queue or the in-flight bytes are at their limit,
 * or a signal waits for its fence). Completions are signalled
 * selectively: the last work request of each write asks for one (its
 * token completes then), other requests only every `signal_every`, when
 * the send queue fills up, and every half of `inflight_bytes`. An RC queue pair
 * completes in order, so a completion for sequence s completes every
 * request up to s. A write of at most max_inline bytes is copied into its
 * request when it is posted, so its token completes right then. A signal
 * to a region that takes signals in band rides in the immediate of a
 * write's request, or is a request that completes nothing (inband.c).
 *
 * Locks, always taken in this order, never held across a blocking call:
 *   ctx->poll_mu  held by poll() throughout, and by whoever retires an
 *                 endpoint (close, fini), so nothing is freed under it
 *   ctx->mu       the peers table, the live list, the tombstones, the
 *                 registrations' list (the live list changes under
 *                 poll_mu too, so poll() walks it without ctx->mu)
 *   ep->mu        an endpoint's queue pairs, rings, fences and state
 *   ctx->cq_mu    the plugin's completion queue (a leaf)
 *   ctx->mr_mu    the registrations' list and its generation (a leaf:
 *                 poll() applies a peer's signals under ep->mu with it)
 * The endpoint's socket, its completion queue's arming and the events of
 * the completion channel belong to the poll thread.
 *
 * Lifetime of an endpoint (ABI 1.1: ranks are dropped and replaced):
 * connect() makes it privately and publishes it in ctx->peers and the
 * live list once its queue pairs are at RTS. close() releases what it
 * holds (queue pairs, completion queue, socket, rings) and leaves the
 * struct as the rank's tombstone, so a second close() is harmless; the
 * tombstone goes when connect() is called for that rank again, or at fini.
 */
#ifndef MEP_VERBS_VERBS_H
#define MEP_VERBS_VERBS_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>

#include "handshake.h"
#include "rdma_dev.h"
#include "fork_watch.h"
#include "mep/transport.h"

#define VERBS_LOG(ctx, lvl, ...) ((ctx)->env->log((lvl), __VA_ARGS__))
#define VERBS_ERR(ctx, code, ...) ((ctx)->env->set_error(__VA_ARGS__), (code))

/* How long close() may wait for the last completions, and then as long
 * for its goodbye to be acknowledged. */
#define VERBS_BYE_MS 200
/* Small writes that may wait for the signal that usually follows them,
 * so that both go to the device in one doorbell (docs/perf.md): at most
 * this many, of at most this many bytes together. */
#define VERBS_LAZY_MAX 8
#define VERBS_LAZY_BYTES (16u * 1024u)
/* Work requests handed to one ibv_post_send. */
#define VERBS_POST_BATCH 32
/* poll() looks at its fds (sockets, async events, the completion channel)
 * every this many calls (a system call each time, which a ping-pong cannot
 * afford on every call); completions are polled on every call. */
#define VERBS_FD_CHECK_POLLS 256
/* After this many calls in a row that handed the core no completion,
 * poll() clears its eventfd and from then on keeps the completion queues
 * armed: the core sleeps on the epoll fd only after 512 idle calls
 * (core/src/progress.c). */
#define VERBS_IDLE_POLLS 384

/* Signals the receiver's poll() applies (inband.c, docs/verbs.md): words
 * per peer that get an index (the immediate names a word by it), the
 * sender's hash of them, the immediate's layout, the message's length. */
#define VERBS_WORDS 256
#define VERBS_WORD_HASH 512
#define VERBS_NO_INDEX 0xffffu
#define VERBS_IMM_SIGNAL (1u << 31)
#define VERBS_IMM_VALUE_BITS 22
#define VERBS_IMM_VALUE_MAX ((1u << VERBS_IMM_VALUE_BITS) - 1)
#define VERBS_SIGMSG_LEN 32

typedef struct verbs_cfg {
  char device[64];
  int port;      /* 0: the first active one */
  int gid_index; /* -1: automatic */
  int mtu;       /* enum ibv_mtu, 0: the port's active MTU */
  int nqp;
  uint64_t stripe; /* writes this long or longer are striped */
  int sq_depth;
  uint64_t inflight; /* bytes of writes at the device, per queue pair */
  int max_inline;
  int signal_every;
  int timeout, retry, tclass, sl;
  char boot_ifname[64];
  int port_lo, port_hi;
  char fabric[64];
  int gpu_off;
  int inband; /* fuse_signals: this side's host regions take signals
               * in band */
} verbs_cfg_t;

/* The opened device and the port in use (rdma_dev.h). */
typedef mep__rdma_dev_t verbs_dev_t;

/* GPU memory: how CUDA pointers are registered, decided at init. */
enum { VERBS_GPU_NONE = 0, VERBS_GPU_DMABUF = 1, VERBS_GPU_PEERMEM = 2 };
typedef struct verbs_gpu {
  int mode;
  char why[256]; /* with mode NONE: why not */
  void *lib;     /* libcuda, dlopen'ed */
  int (*mem_handle)(void *fd, uint64_t ptr, size_t size, int type,
                    unsigned long long flags);
  /* whether CUDA knows a host pointer (mapped for kernels): libcuda kept
   * open for it where a GPU is found, whatever gpu_memory says */
  void *attr_lib;
  int (*ptr_attr)(void *data, int attribute, uint64_t ptr);
} verbs_gpu_t;

/* What an epoll event points to. */
enum { VERBS_SRC_CHAN, VERBS_SRC_ASYNC, VERBS_SRC_CQ, VERBS_SRC_LINK };
typedef struct verbs_src {
  int kind;
} verbs_src_t;

/* VW_IMM: a WRITE of no bytes with a signal in its immediate; VW_SIG: a
 * SEND of a signal message (inband.c). */
enum { VW_WRITE = 1, VW_INLINE, VW_SET, VW_ADD, VW_MARK, VW_IMM, VW_SIG };

/* A striped write: its token completes when every part has. */
typedef struct verbs_op {
  uint64_t token;
  int left;
  int status;
} verbs_op_t;

/* One work request, queued or at the device. */
typedef struct verbs_wr {
  uint8_t kind;
  uint8_t last; /* the last request of a write or of a stripe of it */
  uint8_t with_imm; /* VW_WRITE, VW_INLINE: a signal rides in `imm` */
  uint8_t sig_op;   /* VW_SIG: MEP_SIGNAL_SET or _ADD */
  uint16_t index;   /* VW_SIG: the word's index, or VERBS_NO_INDEX */
  uint32_t imm;     /* with_imm, VW_IMM: the immediate (host order) */
  uint32_t lkey, rkey, len;
  uint64_t laddr, raddr;
  uint64_t value;  /* SET/ADD operand; a write's token */
  verbs_op_t *op;  /* a striped write's, else NULL */
} verbs_wr_t;

typedef struct verbs_qp {
  struct ibv_qp *qp;
  uint32_t psn;
  verbs_wr_t *ring;
  uint64_t mask; /* ring capacity - 1 (a power of two) */
  uint64_t head, posted, tail, last_sig;
  uint64_t inflight;  /* bytes of writes posted, not completed */
  uint64_t unsig;     /* bytes posted since the last signalled request */
} verbs_qp_t;

/* A signal on queue pair 0 at sequence `at` may be posted once every
 * other queue pair q completed everything before need[q]. */
typedef struct verbs_fence {
  uint64_t at;
  uint64_t need[MEP_RDMA_MAX_QPS];
} verbs_fence_t;

struct verbs_ctx;
struct verbs_rmr;
struct verbs_mr;

/* The sender's signal words of one peer: (rkey, address) -> index, and
 * per index the last value SET through it (inband.c). */
typedef struct verbs_tx_words {
  uint64_t addr[VERBS_WORD_HASH];
  uint32_t rkey[VERBS_WORD_HASH];
  uint16_t slot[VERBS_WORD_HASH]; /* index + 1, 0: empty */
  uint64_t prev[VERBS_WORDS];
  int n;
} verbs_tx_words_t;

/* The receiver's: per index the word, its last SET value, and the
 * registration it lies in as found at generation `gen`. */
typedef struct verbs_rx_word {
  uint64_t addr, prev, gen;
  uint32_t rkey;
  int defined;
  struct verbs_mr *mr;
} verbs_rx_word_t;

typedef struct verbs_ep {
  verbs_src_t src; /* first: epoll events of its socket point here */
  struct verbs_ctx *ctx;
  int rank;
  uint64_t inc; /* the peer's incarnation */
  pthread_mutex_t mu;
  int connected; /* published: the core holds it */
  int dead, dead_status;
  int retired; /* released by close: a tombstone */
  int link_fd;
  mep__rdma_link_rx_t link_rx;
  struct ibv_cq *cq;
  int cq_armed; /* poll thread */
  int nqp_made, nqp;
  uint32_t max_inline;
  verbs_qp_t qps[MEP_RDMA_MAX_QPS];
  verbs_fence_t *fences;
  size_t fcap, fhead, fn;
  uint64_t peer_scratch;
  uint32_t peer_scratch_rkey;
  int recvs; /* receives posted on queue pair 0, for the peer's signals */
  uint64_t recv_seq; /* receives ever posted: the next one's buffer */
  /* a receive buffer per receive (a signal message lands there), and
   * the messages this side sends, one per send slot of queue pair 0 */
  uint8_t *rx_bufs, *msg_slots;
  struct ibv_mr *rx_mr, *msg_mr;
  verbs_tx_words_t *tx_words; /* made at the first such signal */
  verbs_rx_word_t *rx_words;  /* made at the first word defined */
  /* with no inline support: the sources of SET, one per send slot */
  uint64_t *set_slots;
  struct ibv_mr *set_mr;
  struct verbs_rmr *rmrs;
  struct verbs_ep *live_prev, *live_next;
} verbs_ep_t;

typedef struct verbs_mr {
  struct verbs_ctx *ctx;
  struct verbs_mr *prev, *next;
  struct ibv_mr *mr; /* NULL for a region of 0 bytes */
  uint8_t *base;
  uint64_t len;
  int kind;
  int inband; /* takes signals that poll() applies (inband.c) */
} verbs_mr_t;

typedef struct verbs_rmr {
  verbs_ep_t *ep;
  struct verbs_rmr *prev, *next;
  uint64_t addr, len;
  uint32_t rkey;
  int inband; /* its owner applies signals to it in poll() */
} verbs_rmr_t;

typedef struct verbs_ctx {
  const mep_tp_env_t *env;
  verbs_cfg_t cfg;
  verbs_dev_t dev;
  verbs_gpu_t gpu;
  int rank, size, timeout_ms;
  uint64_t inc;
  mep__rdma_boot_t boot;
  uint8_t addr[MEP_TP_MAX_ADDR];
  size_t addr_len;
  int epfd, cqfd;
  verbs_src_t chan_src, async_src, cq_src;
  /* an 8-byte sink for fetch-and-add results, and a word peers write
   * their markers to */
  uint64_t *scratch;
  struct ibv_mr *scratch_mr;

  pthread_mutex_t poll_mu, mu, cq_mu, mr_mu;
  uint64_t mr_gen;         /* mr_mu: counts deregistrations */
  verbs_ep_t **peers;      /* size entries */
  verbs_ep_t **tombs;      /* size entries */
  uint8_t *connecting;     /* size entries */
  verbs_ep_t *live;        /* the published endpoints */
  verbs_mr_t *mrs;         /* live registrations (mr_mu) */
  unsigned npoll, idle;    /* poll thread: calls, and idle calls in a row */

  mep_tp_completion_t *cq;
  size_t cq_head, cq_n, cq_cap;
  int cq_armed;

  mep__fork_watch_t fork; /* a forked child lets go of the sockets */
} verbs_ctx_t;

/* config.c */
#define MEP_VERBS_NKEYS 19
extern const mep_tp_cfg_key_t mep__verbs_keys[MEP_VERBS_NKEYS];
int mep__verbs_cfg_read(const mep_tp_env_t *env, verbs_cfg_t *cfg);


/* gpu.c */
void mep__verbs_gpu_probe(verbs_ctx_t *ctx);
void mep__verbs_gpu_close(verbs_gpu_t *g);
/* Registers CUDA memory the way gpu.mode says: the MR, or NULL with the
 * error set. */
struct ibv_mr *mep__verbs_gpu_reg(verbs_ctx_t *ctx, void *ptr, size_t len,
                                  int access);
/* 1 when a GPU may read [ptr, ptr+len) of host memory directly (CUDA
 * knows it: pinned and mapped, or registered), or when that cannot be
 * told; 0 when no GPU is here or CUDA does not know the memory. */
int mep__verbs_gpu_maps_host(const verbs_ctx_t *ctx, const void *ptr,
                             size_t len);

/* addr.c: the address blob and the reachability rule */
#define MEP_VERBS_ADDR_LEN 56
typedef struct mep__verbs_addr {
  uint8_t link_layer, port, mtu, prefix;
  uint16_t lid;
  uint8_t gid[16];
  uint64_t fabric; /* a hash of [verbs] fabric, 0 when unset */
  mep__rdma_boot_addr_t boot;
} mep__verbs_addr_t;
void mep__verbs_addr_encode(uint8_t out[MEP_VERBS_ADDR_LEN],
                            const mep__verbs_addr_t *a);
int mep__verbs_addr_decode(const void *blob, size_t len, mep__verbs_addr_t *a,
                           char *why, size_t why_len);
/* 1 when a and b are on one fabric, else 0 with the reason; the same
 * answer whichever is first. */
int mep__verbs_reach(const mep__verbs_addr_t *a, const mep__verbs_addr_t *b,
                     char *why, size_t why_len);
uint64_t mep__verbs_fabric_hash(const char *name);

/* cq.c: the plugin's completion queue */
void mep__verbs_cq_push(verbs_ctx_t *ctx, uint64_t token, int status,
                        int peer);
int mep__verbs_cq_pop(verbs_ctx_t *ctx, mep_tp_completion_t *out, int max);
/* Whether the queue may hold something, without cq_mu: a completion
 * pushed meanwhile is found by the next call. */
static inline int mep__verbs_cq_ready(verbs_ctx_t *ctx) {
  return __atomic_load_n(&ctx->cq_n, __ATOMIC_ACQUIRE) != 0;
}
/* Clears the eventfd when the queue is empty (poll, when idle). */
void mep__verbs_cq_settle(verbs_ctx_t *ctx);
void mep__verbs_cq_forget(verbs_ctx_t *ctx, int rank);

/* qp.c: queue pairs and their state changes */
int mep__verbs_qp_create(verbs_ep_t *ep, int i);
int mep__verbs_qp_up(verbs_ep_t *ep, const mep__rdma_qpinfo_t *theirs);
void mep__verbs_qp_error(verbs_ep_t *ep);

/* ep.c: an endpoint's life */
int mep__verbs_ep_new(verbs_ctx_t *ctx, int rank, uint64_t inc,
                      verbs_ep_t **out);
void mep__verbs_ep_info(const verbs_ep_t *ep, mep__rdma_qpinfo_t *mine);
/* ep->mu held: marks it failed (or closed), completes every pending
 * write with an error, tells the peer through the socket; reports
 * {MEP_TP_TOKEN_NONE, status, rank} when `report`. */
void mep__verbs_ep_fail(verbs_ep_t *ep, int status, int report);
/* poll_mu and ctx->mu held: unpublishes ep and releases what it holds;
 * keeps it as the tombstone (tomb) or frees it. */
void mep__verbs_ep_retire(verbs_ep_t *ep, int tomb);
/* Releases an endpoint that was never published. */
void mep__verbs_ep_free(verbs_ep_t *ep);
void mep__verbs_tomb_free(verbs_ctx_t *ctx, int rank);

/* connect.c */
int mep__verbs_connect(mep_tp_ctx_t *ctx, int peer, const void *blob,
                       size_t len, mep_tp_ep_t **ep);
int mep__verbs_close(mep_tp_ep_t *ep);

/* post.c: write, signal, the rings */
int mep__verbs_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
                     mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
                     uint64_t token);
int mep__verbs_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                      uint64_t value, mep_signal_op_t op);
/* ep->mu held: posts what waits and may go. */
void mep__verbs_pump(verbs_ep_t *ep);
/* ep->mu held: whether anything waits in the plugin to be posted. */
static inline int mep__verbs_waiting(const verbs_ep_t *ep) {
  for (int q = 0; q < ep->nqp; q++)
    if (ep->qps[q].posted != ep->qps[q].tail) return 1;
  return 0;
}
/* ep->mu held: completes queue pair q's requests up to sequence s. */
void mep__verbs_complete(verbs_ep_t *ep, int q, uint64_t s);
/* ep->mu held: a marker on every queue pair whose last posted request
 * asks for no completion, so that completions tell when all is done. */
void mep__verbs_mark(verbs_ep_t *ep);
/* ep->mu held: nothing queued or at the device. */
int mep__verbs_idle(const verbs_ep_t *ep);
/* ep->mu held: tops queue pair 0's receives up (a signal of the peer
 * consumes one). 0, or -1 with errno. */
int mep__verbs_post_recvs(verbs_ep_t *ep);
/* The wr_id of a receive: this bit, and the index of its buffer. */
#define VERBS_RECV_BIT (1ull << 63)

/* poll.c */
int mep__verbs_poll(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max);
/* ep->mu held: takes the completions of ep's queue: how many, or -1 when
 * the endpoint failed meanwhile. */
int mep__verbs_drain(verbs_ep_t *ep);

/* region.c */
int mep__verbs_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len,
                   mep_memkind_t kind, mep_tp_mr_t **mr, void *rkey,
                   size_t *rkey_len);
int mep__verbs_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr);
int mep__verbs_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                      mep_tp_rmr_t **rmr);
int mep__verbs_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr);
void mep__verbs_regions_free(verbs_ctx_t *ctx);

/* rkey.c: the remote-key blob */
#define MEP_VERBS_RKEY_LEN 32
#define MEP_VERBS_RKEY_INBAND 1u /* flags: the owner's poll() applies
                                  * signals to this region */
typedef struct mep__verbs_rkey {
  uint32_t rank, rkey, kind, flags;
  uint64_t addr, len;
} mep__verbs_rkey_t;
void mep__verbs_rkey_encode(uint8_t out[MEP_VERBS_RKEY_LEN],
                            const mep__verbs_rkey_t *k);
int mep__verbs_rkey_decode(const void *blob, size_t len, mep__verbs_rkey_t *k,
                           char *why, size_t why_len);

/* inband_wire.c: the immediate and the message of a signal in band */
typedef struct mep__verbs_sigmsg {
  int op;
  uint16_t index;
  uint32_t rkey;
  uint64_t raddr, value;
} mep__verbs_sigmsg_t;
uint32_t mep__verbs_imm_encode(int op, unsigned index, uint32_t v);
/* 1 and the fields for an immediate that carries a signal, else 0. */
int mep__verbs_imm_decode(uint32_t imm, int *op, unsigned *index,
                          uint32_t *v);
void mep__verbs_sigmsg_encode(uint8_t out[VERBS_SIGMSG_LEN],
                              const mep__verbs_sigmsg_t *m);
int mep__verbs_sigmsg_decode(const void *buf, size_t len,
                             mep__verbs_sigmsg_t *m, char *why,
                             size_t why_len);

/* inband.c */
/* ep->mu held: queues a signal to r's word at raddr for the peer's poll()
 * to apply (r->inband): in the immediate of the write just queued, of a
 * WRITE of no bytes, or as a message. 0 or MEP_ERR_NOMEM (error set). */
int mep__verbs_inband_signal(verbs_ep_t *ep, const verbs_rmr_t *r,
                             uint64_t raddr, uint64_t value,
                             mep_signal_op_t op);
/* ep->mu held: a receive completed; applies the signal it brought. 0, or
 * the status the peer is to be failed with (the reason logged). */
int mep__verbs_inband_recv(verbs_ep_t *ep, const struct ibv_wc *wc);
/* ep->mu held: fills the buffer of the message of VW_SIG request s. */
void mep__verbs_inband_msg(verbs_ep_t *ep, const verbs_wr_t *e, uint64_t s,
                           struct ibv_sge *sge);
/* Receive buffers and message slots of a new endpoint. */
int mep__verbs_inband_alloc(verbs_ep_t *ep);
void mep__verbs_inband_free(verbs_ep_t *ep);
/* post.c, for inband.c: ep->mu held. Room in q's ring for n more
 * requests (0, or -1 out of memory), and the next request, zeroed;
 * inline, as every write and signal takes them. */
int mep__verbs_ring_grow(verbs_qp_t *p, uint64_t n);
static inline int mep__verbs_ring_room(verbs_qp_t *p, uint64_t n) {
  return p->tail - p->head + n <= p->mask + 1 ? 0 : mep__verbs_ring_grow(p, n);
}
static inline verbs_wr_t *mep__verbs_append(verbs_qp_t *p) {
  verbs_wr_t *e = &p->ring[p->tail++ & p->mask];
  *e = (verbs_wr_t){0};
  return e;
}
/* a fence for a signal at sequence `at` of queue pair 0; 0 or -1 */
int mep__verbs_fence_at(verbs_ep_t *ep, uint64_t at);

#endif
