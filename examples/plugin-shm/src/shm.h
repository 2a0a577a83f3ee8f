/*
 * shm.h - internal types of the shm transport: a same-host transport that
 * moves data through one shared-memory ring per ordered pair of ranks.
 *
 * Memory registered with mep is ordinary process memory, which another
 * process cannot map after the fact. So the receiver of each ordered pair
 * creates a ring in POSIX shared memory, the sender maps it, and both copy:
 * the sender from its region into the ring, the receiver (in poll) from the
 * ring into its region, after validating every message.
 */
#ifndef SHM_H
#define SHM_H

#include <mep/transport.h>

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_VERSION "0.1.0"
#define SHM_PROTO_VERSION 1u
#define SHM_NONCE_BYTES 16
#define SHM_NAME_MAX 48

#define SHM_RING_DEFAULT (4u << 20)
#define SHM_RING_MIN 4096u
#define SHM_RING_MAX (1u << 30)

/* How often poll() checks whether peer processes are still alive. */
#define SHM_LIVENESS_NS (100 * 1000 * 1000LL)

/* Object tags: catch a handle of the wrong kind or one already freed. */
#define SHM_TAG_CTX 0x6d657073686d6378ull /* "mepshmcx" */
#define SHM_TAG_EP 0x6d657073686d6570ull
#define SHM_TAG_MR 0x6d657073686d6d72ull
#define SHM_TAG_RMR 0x6d657073686d726dull

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2,
               "64-bit atomics in shared memory must be lock-free");

/* ------------------------------------------------------------ shared ring */

#define SHM_RING_MAGIC 0x3152474e494d5053ull /* "SPMINGR1": ring is ready */
#define SHM_RING_HDR_BYTES 4096u

/* The head of a ring object, shared by two processes. The receiver fills it
 * and publishes `magic` last; head is written only by the sender, tail only
 * by the receiver, each with release and read with acquire. Neither side
 * trusts the other's values: every read of them is range-checked. */
struct shm_ring_hdr {
  _Atomic uint64_t magic;
  uint32_t version;
  uint32_t hdr_bytes;
  uint64_t data_bytes;
  int32_t src_rank;
  int32_t dst_rank;
  uint8_t rx_nonce[SHM_NONCE_BYTES];
  uint8_t tx_nonce[SHM_NONCE_BYTES];
  alignas(64) _Atomic uint64_t head; /* bytes ever produced */
  alignas(64) _Atomic uint64_t tail; /* bytes ever consumed */
  alignas(64) _Atomic uint32_t tx_closed; /* sender will send no more */
  _Atomic uint32_t rx_closed;             /* receiver reads no more */
};
_Static_assert(sizeof(struct shm_ring_hdr) <= SHM_RING_HDR_BYTES,
               "ring header fits its page");

/* Messages in the ring, each 8-byte aligned: a header, then for WRITE its
 * payload padded to 8 bytes. */
enum { SHM_MSG_WRITE = 1, SHM_MSG_SIGNAL = 2 };
#define SHM_MSG_MAGIC 0x4d534d50u

struct shm_msg {
  uint16_t type;
  uint16_t op;     /* SIGNAL: mep_signal_op_t */
  uint32_t magic;  /* SHM_MSG_MAGIC: catches a desynchronised stream */
  uint64_t region; /* the receiver's region id */
  uint64_t offset;
  uint64_t arg;    /* WRITE: payload bytes; SIGNAL: value */
};
_Static_assert(sizeof(struct shm_msg) == 32, "message header is 32 bytes");

static inline uint64_t shm_pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

/* One side's mapping of a ring. `pos` is this side's own counter (head for
 * the sender, tail for the receiver), kept privately so a peer that
 * scribbles over the shared copy cannot move it. */
typedef struct shm_ring {
  struct shm_ring_hdr *hdr;
  uint8_t *data;
  uint64_t cap;
  size_t map_len;
  uint64_t pos;
  char name[SHM_NAME_MAX];
  int named; /* the name may still exist in /dev/shm and is ours to unlink */
} shm_ring_t;

int shm_ring_create(shm_ring_t *r, const char *name, uint64_t cap, int src,
                    int dst, const uint8_t *rx_nonce, const uint8_t *tx_nonce,
                    char *err, size_t err_len);
/* 1: mapped; 0: not there yet (retry); negative: error in err. */
int shm_ring_open(shm_ring_t *r, const char *name, int src, int dst,
                  const uint8_t *rx_nonce, const uint8_t *tx_nonce, char *err,
                  size_t err_len);
void shm_ring_unlink(shm_ring_t *r);
void shm_ring_unmap(shm_ring_t *r);
void shm_ring_read(const shm_ring_t *r, uint64_t pos, void *dst, uint64_t len);
void shm_ring_write(shm_ring_t *r, uint64_t pos, const void *src,
                    uint64_t len);

/* ----------------------------------------------------------- address blob */

typedef struct shm_addr {
  int rank;
  pid_t pid;
  uint64_t start_time; /* /proc start time of pid, 0 if unknown */
  uint8_t nonce[SHM_NONCE_BYTES];
  char host_id[MEP_TP_MAX_ADDR];
} shm_addr_t;

int shm_addr_encode(const shm_addr_t *a, void *buf, size_t *len);
/* 0 or MEP_ERR_PROTOCOL with the reason in err. */
int shm_addr_decode(const void *buf, size_t len, shm_addr_t *a, char *err,
                    size_t err_len);

/* ------------------------------------------------------- names and hashes */

void shm_key_from_secret(const uint8_t *secret, size_t len, uint8_t key[16]);
void shm_ring_name(const uint8_t key[16], int src, int dst,
                   const uint8_t *rx_nonce, const uint8_t *tx_nonce,
                   char name[SHM_NAME_MAX]);

/* --------------------------------------------------------------- processes */

uint64_t shm_proc_start_time(pid_t pid);
/* Opens a handle that tells whether `pid` (started at start_time) lives. */
int shm_proc_watch(pid_t pid, uint64_t start_time, int *pidfd);
/* 1 alive, 0 gone. */
int shm_proc_alive(pid_t pid, uint64_t start_time, int pidfd);

/* ----------------------------------------------------------------- objects */

typedef struct shm_ctx shm_ctx_t;
typedef struct shm_ep shm_ep_t;

enum { SHM_OP_WRITE = 1, SHM_OP_SIGNAL = 2, SHM_OP_REPORT = 3 };

/* A queued send, and later the completion it turns into. */
typedef struct shm_op {
  struct shm_op *next;
  int kind;
  const uint8_t *src; /* WRITE: next source byte */
  uint64_t region;
  uint64_t roff;      /* WRITE: next remote offset */
  uint64_t left;      /* WRITE: bytes not yet in the ring */
  uint64_t value;     /* SIGNAL */
  uint32_t sig_op;
  uint64_t token;
  int status;
  int peer;
} shm_op_t;

typedef struct shm_queue {
  shm_op_t *head;
  shm_op_t *tail;
} shm_queue_t;

void shm_queue_push(shm_queue_t *q, shm_op_t *op);
shm_op_t *shm_queue_pop(shm_queue_t *q);

enum { SHM_EP_OPEN = 0, SHM_EP_FAILED = 1, SHM_EP_CLOSED = 2 };

typedef struct shm_rmr {
  uint64_t tag;
  shm_ep_t *ep;
  struct shm_rmr *prev, *next;
  uint64_t id;
  uint64_t len;
  uint32_t misalign; /* remote base address mod 8 */
} shm_rmr_t;

struct shm_ep {
  uint64_t tag;
  shm_ctx_t *ctx;
  shm_ep_t *all_next; /* every ep ever made, freed at fini */
  int peer;
  int state;
  int fail_status;
  shm_ring_t rx;      /* peer -> us, created by us */
  shm_ring_t tx;      /* us -> peer, created by the peer */
  pid_t pid;
  uint64_t start_time;
  int pidfd;
  shm_queue_t sendq;
  shm_op_t *report;   /* preallocated failure completion */
  shm_rmr_t *rmrs;    /* imported regions, freed at unimport or fini */
};

typedef struct shm_mr {
  uint64_t tag;
  shm_ctx_t *ctx;
  uint8_t *ptr;
  uint64_t len;
  uint64_t id;
} shm_mr_t;

/* Region ids are (generation << 32 | slot): a slot is reused after dereg,
 * and the generation keeps a late message for the old region out of the
 * new one. */
typedef struct shm_slot {
  shm_mr_t *mr;
  uint32_t gen;
  uint32_t next_free;
} shm_slot_t;

struct shm_ctx {
  uint64_t tag;
  shm_ctx_t *live_next; /* the list of live contexts, for idempotent fini */
  const mep_tp_env_t *env;
  pthread_mutex_t lock;
  int rank;
  int size;
  int timeout_ms;
  uint64_t ring_bytes;
  shm_addr_t self;
  uint8_t key[16];
  shm_ep_t **peers; /* [size], the current ep of each rank */
  shm_ep_t *all_eps;
  shm_slot_t *slots;
  uint32_t nslots;
  uint32_t slot_cap;
  uint32_t free_slot; /* UINT32_MAX: none */
  shm_queue_t done;   /* completions not yet returned by poll */
  int64_t next_liveness_ns;
};

/* ------------------------------------------------------------- internals */

void shm_log(const shm_ctx_t *ctx, mep_log_level_t level, const char *fmt,
             ...) MEP_PRINTF(3, 4);
/* Sets the error through the env and returns `code`. */
int shm_error(const shm_ctx_t *ctx, int code, const char *fmt, ...)
    MEP_PRINTF(3, 4);
int64_t shm_now_ns(void);

int shm_config_ring_bytes(const mep_tp_env_t *env, uint64_t *out, char *err,
                          size_t err_len);
#define SHM_NKEYS 1
extern const mep_tp_cfg_key_t shm_config_keys[SHM_NKEYS];

shm_ctx_t *shm_ctx_of(mep_tp_ctx_t *p);
shm_ep_t *shm_ep_of(mep_tp_ep_t *p);

/* Marks the ep failed (or closed): pending writes complete with
 * MEP_ERR_PEER_FAILED (MEP_ERR_CLOSED when closed by us), the peer is told
 * through the ring flags, and, for a failure, one report completion with
 * `status` is queued. Caller holds the lock. */
void shm_ep_fail(shm_ep_t *ep, int status);
void shm_ep_release(shm_ep_t *ep);
void shm_ep_free(shm_ep_t *ep);

/* Moves queued sends into the ring while it has room. Caller holds the
 * lock. Returns 0 or a negative status that failed the ep. */
int shm_send_progress(shm_ep_t *ep);
/* Applies the messages waiting in the ep's receive ring. Caller holds the
 * lock. Returns 0 or the status that failed the ep. */
int shm_recv_progress(shm_ep_t *ep);
shm_mr_t *shm_region_lookup(shm_ctx_t *ctx, uint64_t id);
void shm_regions_free(shm_ctx_t *ctx);

int shm_init(const mep_tp_env_t *env, mep_tp_ctx_t **out);
int shm_fini(mep_tp_ctx_t *ctx);
int shm_props(mep_tp_ctx_t *ctx, mep_tp_props_t *props);
int shm_address(mep_tp_ctx_t *ctx, void *buf, size_t *len);
int shm_reachable(mep_tp_ctx_t *ctx, int peer, const void *blob, size_t len,
                  char *why, size_t why_len);
int shm_connect(mep_tp_ctx_t *ctx, int peer, const void *blob, size_t len,
                mep_tp_ep_t **ep);
int shm_close(mep_tp_ep_t *ep);
int shm_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len, mep_memkind_t kind,
            mep_tp_mr_t **mr, void *rkey, size_t *rkey_len);
int shm_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr);
int shm_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
               mep_tp_rmr_t **rmr);
int shm_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr);
int shm_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
              mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len, uint64_t token);
int shm_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
               uint64_t value, mep_signal_op_t op);
int shm_poll(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max);

#endif /* SHM_H */
