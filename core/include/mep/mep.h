/*
 * mep.h - the public API of libmep, for programs that communicate with mep.
 *
 * Conventions (every function below follows them unless it says otherwise):
 *  - Functions returning int return 0 (MEP_OK) on success and a negative
 *    MEP_ERR_* code on failure. On failure mep_last_error() holds a sentence
 *    naming what failed, where and why; it is thread-local and stays valid
 *    until the next failing mep call on the same thread.
 *  - Objects are created by X_create, X_start or X_load and released by the
 *    matching X_destroy, X_stop or X_free. Releasing NULL is a no-op.
 *  - Unless stated, an object may be used from several threads only if the
 *    caller serialises the calls.
 */
#ifndef MEP_MEP_H
#define MEP_MEP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MEP_API __attribute__((visibility("default")))
#define MEP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MEP_API
#define MEP_PRINTF(f, a)
#endif

/* ---------------------------------------------------------------- version */

#define MEP_VERSION_MAJOR 0
#define MEP_VERSION_MINOR 1
#define MEP_VERSION_PATCH 0

/* The library's version as "MAJOR.MINOR.PATCH"; static storage. */
MEP_API const char *mep_version(void);

/* ----------------------------------------------------------------- errors */

enum {
  MEP_OK = 0,
  MEP_ERR_INVALID = -1,      /* bad argument or state */
  MEP_ERR_NOMEM = -2,        /* out of memory */
  MEP_ERR_SYSTEM = -3,       /* an operating-system call failed */
  MEP_ERR_TIMEOUT = -4,      /* a deadline passed */
  MEP_ERR_UNAVAILABLE = -5,  /* a transport cannot run here (no device...) */
  MEP_ERR_NOT_FOUND = -6,    /* no such plugin, key, file or region */
  MEP_ERR_ABI = -7,          /* a plugin built for another ABI */
  MEP_ERR_CONFIG = -8,       /* malformed or contradictory configuration */
  MEP_ERR_PEER_FAILED = -9,  /* the peer died or its connection broke */
  MEP_ERR_UNREACHABLE = -10, /* no transport reaches the peer */
  MEP_ERR_MISMATCH = -11,    /* ranks disagree on what they are doing */
  MEP_ERR_PROTOCOL = -12,    /* malformed message on the wire */
  MEP_ERR_BOUNDS = -13,      /* an access outside a registered region */
  MEP_ERR_AUTH = -14,        /* a peer without the job's secret */
  MEP_ERR_UNSUPPORTED = -15, /* valid but not supported (memory kind...) */
  MEP_ERR_CLOSED = -16,      /* the object was shut down */
  MEP_ERR_EXCLUDED = -17,    /* the other ranks dropped this one */
};
#define MEP_ERR_LAST MEP_ERR_EXCLUDED

/* A collective that lost ranks while it ran finished over the survivors:
 * every survivor holds the same result, computed from the survivors'
 * inputs only, and the same dropped set (mep_req_dropped). A success:
 * positive, so `rc < 0` still tests for failure. */
#define MEP_OK_DEGRADED 1

/* What mep_req_status returns for a request still running. */
#define MEP_RUNNING 2

/* A constant name-and-meaning string for a MEP_* code (MEP_OK_DEGRADED
 * included) ("MEP_ERR_TIMEOUT:
 * timed out"); never NULL, also for unknown codes. Thread-safe. */
MEP_API const char *mep_strerror(int code);

/* The calling thread's message for its last failed mep call, or "" if none.
 * The storage is thread-local and overwritten by the next failure. */
MEP_API const char *mep_last_error(void);

/* For libraries built on mep (the frontends): sets the calling thread's
 * message (printf style) and returns `code`, so their failures read like
 * mep's own. With `wrap` nonzero the message becomes "<new>: <old>". */
MEP_API int mep_set_error(int code, int wrap, const char *fmt, ...)
    MEP_PRINTF(3, 4);

/* ---------------------------------------------------------------- logging */

typedef enum {
  MEP_LOG_ERROR = 0,
  MEP_LOG_WARN = 1,
  MEP_LOG_INFO = 2,
  MEP_LOG_DEBUG = 3,
  MEP_LOG_TRACE = 4,
} mep_log_level_t;

/* The level in force: MEP_LOG (error|warn|info|debug|trace) read once at
 * first use, else [core] log_level of the first communicator's config,
 * else warn. Lines go to stderr, or to MEP_LOG_FILE when set, prefixed with
 * "mep[rank] LEVEL". Thread-safe. */
MEP_API mep_log_level_t mep_log_get_level(void);
MEP_API void mep_log_set_level(mep_log_level_t level);

/* Parses "error".."trace" (case-insensitive). Returns MEP_ERR_INVALID for
 * anything else. */
MEP_API int mep_log_parse_level(const char *name, mep_log_level_t *level);

/* ----------------------------------------------------------------- config */

typedef struct mep_config mep_config_t;

/* Loads configuration: `path`, else $MEP_CONFIG, else built-in defaults
 * only (path NULL and MEP_CONFIG unset is not an error). The INI file is
 * parsed with inih; a malformed line is an error (MEP_ERR_CONFIG) naming
 * file and line; an unknown section or key is logged as a warning naming
 * file and line. MEP_<SECTION>_<KEY> environment variables override the
 * file (section and key upper-cased, spaces and dashes as '_').
 * On success *out is owned by the caller (mep_config_free). */
MEP_API int mep_config_load(const char *path, mep_config_t **out);

/* The value of `key` in `section` after environment overrides, or NULL
 * when neither the file nor the environment sets it. The string lives as
 * long as the config. Thread-safe for concurrent readers. */
MEP_API const char *mep_config_get(const mep_config_t *cfg,
                                   const char *section, const char *key);

/* The documented default of a key of [core], [peer N] or [host NAME]
 * ("30000" for core/timeout_ms), or NULL for keys without one. A plugin's
 * keys and defaults are its own (mep_plugin_config_keys, mep-info). */
MEP_API const char *mep_config_default(const char *section, const char *key);

/* The file the config came from, or NULL for built-in defaults. */
MEP_API const char *mep_config_path(const mep_config_t *cfg);

MEP_API void mep_config_free(mep_config_t *cfg);

/* ------------------------------------------------------------------ store */

/* A key/value rendezvous store. Callers may supply their own (the c10d and
 * Python frontends wrap their stores); every callback returns 0 or a
 * negative MEP_ERR_*. Callbacks must be safe to call from several threads.
 *  set:   store `len` bytes under `key`, replacing any value.
 *  get:   wait up to timeout_ms (-1: forever) for `key`; on success *val is
 *         a malloc'ed copy the caller frees with free(). MEP_ERR_TIMEOUT.
 *  add:   atomically add `delta` to the integer under `key` (absent = 0),
 *         return the new value in *result.
 *  check: *exists = 1 if `key` is set, else 0; never waits.
 *  destroy: releases `ctx`; may be NULL. */
typedef struct mep_store {
  void *ctx;
  int (*set)(void *ctx, const char *key, const void *val, size_t len);
  int (*get)(void *ctx, const char *key, void **val, size_t *len,
             int timeout_ms);
  int (*add)(void *ctx, const char *key, int64_t delta, int64_t *result);
  int (*check)(void *ctx, const char *key, int *exists);
  void (*destroy)(void *ctx);
} mep_store_t;

typedef struct mep_store_server mep_store_server_t;

/* Starts the built-in TCP store server on `host` (NULL: all interfaces) and
 * `port` (0: an ephemeral port; see mep_store_server_port) in a background
 * thread of this process. Other processes reach it with
 * mep_store_tcp_connect. */
MEP_API int mep_store_server_start(const char *host, int port,
                                   mep_store_server_t **out);
MEP_API int mep_store_server_port(const mep_store_server_t *srv);
/* Stops the thread and closes every client connection. */
MEP_API void mep_store_server_stop(mep_store_server_t *srv);

/* Connects to a built-in TCP store at host:port, retrying refused
 * connections until timeout_ms. Once a connection was made, a refused one
 * means the server is gone: a request fails at once with
 * MEP_ERR_PEER_FAILED instead of retrying (a server started again on the
 * port serves the next request). The returned store is thread-safe and
 * owned by the caller (mep_store_destroy). */
MEP_API int mep_store_tcp_connect(const char *host, int port, int timeout_ms,
                                  mep_store_t **out);

/* Calls store->destroy (if any) and frees the struct when it was made by
 * mep_store_tcp_connect. */
MEP_API void mep_store_destroy(mep_store_t *store);

/* Since 0.2. For the callbacks of a store of the caller's own: whether the
 * core still wants the request the calling thread is making. 1: it does
 * not (mep_comm_destroy cancelled the fault-tolerance claim that made it);
 * a callback that waits (for a server that may have vanished) should look
 * now and then, every 50 ms or so, and return MEP_ERR_CLOSED once it is 1.
 * 0: it still does. -1: the request cannot be cancelled, wait as usual.
 * The built-in store (mep_store_tcp_connect) does this itself. Thread-safe;
 * it reads the calling thread's state only. */
MEP_API int mep_store_cancelled(void);

/* ----------------------------------------------------------- communicator */

typedef struct mep_comm mep_comm_t;

/* Fields are read only when struct_size covers them, so code built
 * against an older mep.h keeps working. */
typedef struct mep_comm_opts {
  uint32_t struct_size;       /* sizeof(mep_comm_opts_t); for growth */
  const mep_config_t *config; /* NULL: mep_config_load(NULL) internally */
  const char *name;           /* store key namespace; NULL: "mep" */
  int timeout_ms;             /* <= 0: [core] timeout_ms */
  /* Since 0.2. The number of ranks the group may grow to (see
   * mep_comm_recover_ranks); <= size: size. Equal on every rank. */
  int max_size;
  /* Since 0.2. 1: this process joins a running group as `rank`, either
   * replacing a rank the group dropped or growing the group (rank >= the
   * group's size); `size` is the group's size once it is admitted. The
   * call publishes the process, waits until the active ranks admit it
   * with mep_comm_recover_ranks (up to the timeout) and returns the
   * communicator in the group's current state. */
  int join;
} mep_comm_opts_t;

/* Creates the communicator of `rank` in a group of `size` over `store`:
 * rank 0 makes the job secret, every rank loads the allowed transports,
 * publishes its addresses, picks a transport per peer (see docs/config.md,
 * "Choosing a transport") and connects. Collective: every rank of the group
 * calls it with the same `size` and name. The store must outlive the
 * communicator. `opts` may be NULL.
 * Errors: MEP_ERR_INVALID (rank/size), MEP_ERR_CONFIG, MEP_ERR_UNREACHABLE
 * (naming the peer and each transport's reason), MEP_ERR_TIMEOUT,
 * MEP_ERR_NOT_FOUND (a transport named explicitly that does not load). */
MEP_API int mep_comm_create(mep_store_t *store, int rank, int size,
                            const mep_comm_opts_t *opts, mep_comm_t **out);

/* Closes connections, releases regions still registered and unloads
 * transports. Not collective; safe after peers died. Requests still
 * running fail with MEP_ERR_CLOSED (their buffers are not touched after
 * this returns); they stay valid for mep_req_test/wait/status/free. */
MEP_API int mep_comm_destroy(mep_comm_t *comm);

MEP_API int mep_comm_rank(const mep_comm_t *comm);
/* Rank slots in use: the highest rank ever admitted + 1 (grows with
 * mep_comm_recover_ranks; dropped ranks keep their slot). */
MEP_API int mep_comm_size(const mep_comm_t *comm);
/* The opts' max_size: what the group may grow to. */
MEP_API int mep_comm_max_size(const mep_comm_t *comm);

/* The communicator's timeout for a wait, in ms ([core] timeout_ms or the
 * creation option); -1 for NULL. */
MEP_API int mep_comm_timeout_ms(const mep_comm_t *comm);

/* The name of the transport used to reach `peer` ("self" for the own
 * rank), or NULL for a bad peer or one dropped from the group (its
 * connection is closed). Otherwise static within the communicator. */
MEP_API const char *mep_comm_route(const mep_comm_t *comm, int peer);

/* -------------------------------------------------- fault tolerance
 * Ranks that die, freeze past the deadline or are cut off leave the active
 * set; the survivors agree on it (see docs/fault-tolerance.md). Every
 * change of the set increments the communicator's epoch. Thread-safe. */

/* The epoch: 0 at creation, +1 whenever the active set changes. */
MEP_API uint64_t mep_comm_epoch(const mep_comm_t *comm);

/* Fills active[0..len) with 1 for active ranks and 0 for the others
 * (len >= mep_comm_max_size, else MEP_ERR_INVALID) and *epoch (may be
 * NULL) with the epoch of that set. Returns the number of active ranks. */
MEP_API int mep_comm_active(const mep_comm_t *comm, uint8_t *active, int len,
                            uint64_t *epoch);

/* The live active set: max_size int32 words, 1 for an active rank, 0 for
 * another, updated in place as the set changes. The array is page-aligned
 * and lives as long as the communicator, so it can be mapped into a
 * device's address space for kernels. Never NULL for a valid comm. */
MEP_API const volatile int32_t *mep_comm_active_array(const mep_comm_t *comm);

/* Writes up to `max` ranks dropped by the last collective that finished
 * on this communicator (the ranks of MEP_OK_DEGRADED) in increasing order
 * and returns how many it dropped (may exceed max). For blocking calls;
 * with requests use mep_req_dropped. */
MEP_API int mep_comm_dropped(const mep_comm_t *comm, int *ranks, int max);

typedef enum {
  MEP_PEER_ACTIVE = 0,  /* in the active set */
  MEP_PEER_DROPPED = 1, /* left the group; no process waits to replace it */
  MEP_PEER_JOINING = 2, /* a process waits to join as this rank */
  MEP_PEER_EMPTY = 3,   /* a slot beyond the group nobody asked for */
} mep_peer_state_t;

/* The state of every rank slot, state[0..len) with len >= max_size.
 * Collective over the active ranks: they exchange what each sees, and a
 * rank is JOINING only when every active rank sees its process, so every
 * caller gets the same array. */
MEP_API int mep_comm_peer_state(mep_comm_t *comm, mep_peer_state_t *state,
                                int len);

/* Admits the joining processes of `ranks` (each JOINING, see
 * mep_comm_peer_state): connects them, resets the sequence numbers and
 * staging state of every pair with them and makes them active (epoch + 1).
 * A rank >= size grows the group. Collective over the active ranks, with
 * the same list on each; the joiners' mep_comm_create returns once this
 * completes. No collective may be running on the communicator.
 * Regions registered by the user before the call are not known to the
 * joiners: register regions again after recovery. Errors: MEP_ERR_INVALID
 * (a rank that is not joining), MEP_ERR_MISMATCH (ranks passed different
 * lists), MEP_ERR_TIMEOUT, MEP_ERR_UNREACHABLE. */
MEP_API int mep_comm_recover_ranks(mep_comm_t *comm, const int *ranks, int n);

/* ---------------------------------------------------------------- regions */

typedef enum {
  MEP_MEM_HOST = 0,
  MEP_MEM_CUDA = 1,
} mep_memkind_t;

typedef struct mep_region mep_region_t;

/* Registers [ptr, ptr+len) with every transport the communicator routes
 * through and publishes its remote keys. Collective in order: every rank
 * registers its regions in the same order, and the k-th region of one rank
 * is the peer of the k-th region of every other rank (lengths may differ).
 * `ptr` stays owned by the caller and must outlive the registration.
 * MEP_ERR_UNSUPPORTED for a memory kind no routed transport handles. */
MEP_API int mep_region_register(mep_comm_t *comm, void *ptr, size_t len,
                                mep_memkind_t kind, mep_region_t **out);

/* Deregisters. Peers' later writes to it are refused. */
MEP_API int mep_region_deregister(mep_region_t *region);

MEP_API void *mep_region_ptr(const mep_region_t *region);
MEP_API size_t mep_region_len(const mep_region_t *region);

/* ------------------------------------------------------ one-sided transfer */

typedef enum {
  MEP_SIGNAL_SET = 0, /* store the value */
  MEP_SIGNAL_ADD = 1, /* atomically add the value */
} mep_signal_op_t;

/* Writes `len` bytes from src at src_off into `peer`'s instance of dst at
 * dst_off. Returns once the write is queued; the source bytes must not
 * change until mep_flush returns. Bounds are checked locally against both
 * regions (MEP_ERR_BOUNDS) and again by the receiver. peer == own rank is a
 * local copy. Thread-safe. MEP_ERR_PEER_FAILED if the peer is known dead,
 * MEP_ERR_CLOSED if it destroyed its communicator. */
MEP_API int mep_put(mep_comm_t *comm, int peer, const mep_region_t *src,
                    size_t src_off, const mep_region_t *dst, size_t dst_off,
                    size_t len);

/* Applies `op` with `value` to the 8-byte-aligned word at dst_off of the
 * peer's instance of dst, after every earlier mep_put to that peer has
 * landed there. Thread-safe. */
MEP_API int mep_signal(mep_comm_t *comm, int peer, const mep_region_t *dst,
                       size_t dst_off, uint64_t value, mep_signal_op_t op);

/* Waits until every mep_put issued so far on this communicator has completed
 * locally (its source may be reused), or timeout_ms passes (-1: the
 * communicator's timeout). MEP_ERR_PEER_FAILED names the failed peer. */
MEP_API int mep_flush(mep_comm_t *comm, int timeout_ms);

/* Waits until the 8-byte-aligned word at `off` of the local region reaches
 * at least `value` (signals are sequence numbers that only grow), or
 * timeout_ms passes (-1: the communicator's timeout): MEP_ERR_TIMEOUT.
 * Spins briefly, then yields, then sleeps, so idle waiters leave the CPU
 * to others. Stores the word's last value in *seen when seen != NULL. */
MEP_API int mep_wait(const mep_region_t *region, size_t off, uint64_t value,
                     int timeout_ms, uint64_t *seen);


/* --------------------------------------------------------------- requests */

typedef struct mep_req mep_req_t;

/* Sets *done to 1 once the request finished (then its status is final).
 * Thread-safe. */
MEP_API int mep_req_test(mep_req_t *req, int *done);

/* Waits until the request finished or timeout_ms passed (-1: the
 * communicator's timeout). Returns the request's status (0,
 * MEP_OK_DEGRADED or MEP_ERR_*,
 * with mep_last_error() set to its message), or MEP_ERR_TIMEOUT if it is
 * still running (it stays valid; wait again or free it). */
MEP_API int mep_req_wait(mep_req_t *req, int timeout_ms);

/* The status of a finished request (0, MEP_OK_DEGRADED or MEP_ERR_*),
 * MEP_RUNNING while running. */
MEP_API int mep_req_status(const mep_req_t *req);

/* For a finished collective request: writes up to `max` ranks it dropped
 * (increasing) and returns how many it dropped (0 unless its status is
 * MEP_OK_DEGRADED). */
MEP_API int mep_req_dropped(const mep_req_t *req, int *ranks, int max);

/* Bytes a finished mep_recv received (at most its buffer's size). */
MEP_API size_t mep_req_bytes(const mep_req_t *req);

/* The rank whose message a mep_recv received, once it finished with
 * success: the peer it named, or for MEP_ANY_SOURCE the sender of the
 * message it matched. -1 while it runs, after a failure, and for other
 * requests. */
MEP_API int mep_req_source(const mep_req_t *req);

/* Releases a request. A request still running is detached: it finishes
 * in the background and releases itself (its buffers must stay valid
 * until then). */
MEP_API void mep_req_free(mep_req_t *req);

/* ------------------------------------------------------------ collectives
 * Every rank calls the same collectives in the same order with matching
 * arguments; ranks that disagree (operation, dtype, count, root) get
 * MEP_ERR_MISMATCH naming both sides. Buffers are host memory owned by the
 * caller and must stay untouched until the request finished. With `req`
 * NULL the call blocks until done (up to the communicator's timeout);
 * otherwise it returns at once and *req tracks it. send == recv is
 * allowed (in place) where the sizes agree; an in-place all-reduce that
 * fails leaves the buffer as it was. Collectives of one
 * communicator run one at a time, in call order; they are thread-safe.
 * Faults: collectives run over the active ranks. One during which ranks
 * were lost returns MEP_OK_DEGRADED on every survivor, with the same
 * result over the survivors' inputs (blocks of dropped ranks in all-gather
 * and all-to-all outputs are left as they were; avg divides by the
 * survivors) and the same dropped set. A rooted collective whose root is
 * lost fails with MEP_ERR_PEER_FAILED on every survivor. A rank the others
 * dropped gets MEP_ERR_EXCLUDED from then on. */

typedef enum {
  MEP_FLOAT16 = 0,
  MEP_BFLOAT16 = 1,
  MEP_FLOAT32 = 2,
  MEP_FLOAT64 = 3,
  MEP_INT8 = 4,
  MEP_UINT8 = 5,
  MEP_INT32 = 6,
  MEP_INT64 = 7,
  MEP_BOOL = 8,
} mep_dtype_t;
#define MEP_DTYPE_COUNT 9

/* Reductions. float16/bfloat16 accumulate in float32. On bool, sum and max
 * are "or", prod and min are "and"; avg is sum / size (integers: truncated
 * toward zero; bool: refused). Contributions are combined in rank order on
 * every rank, so every rank gets bit-identical results; the all-reduces
 * that take the logarithmic plan ([core] log_ranks and log_bytes: small
 * ones on many ranks; never float16 or bfloat16) combine them in a fixed
 * binary tree over rank order instead, equally bit-identical on every
 * rank, with the float rounding of that order. */
typedef enum {
  MEP_SUM = 0,
  MEP_PROD = 1,
  MEP_MIN = 2,
  MEP_MAX = 3,
  MEP_AVG = 4,
} mep_op_t;
#define MEP_OP_COUNT 5

/* Bytes per element (bool: 1); 0 for an unknown dtype. */
MEP_API size_t mep_dtype_size(mep_dtype_t dtype);
/* "float16", ...; "sum", ...; NULL for unknown values. */
MEP_API const char *mep_dtype_name(mep_dtype_t dtype);
MEP_API const char *mep_op_name(mep_op_t op);

/* root's `count` elements of buf to every rank's buf. */
MEP_API int mep_broadcast(mep_comm_t *comm, void *buf, size_t count,
                          mep_dtype_t dtype, int root, mep_req_t **req);
/* Reduction of every rank's send into root's recv (recv unused elsewhere,
 * may be NULL there). */
MEP_API int mep_reduce(mep_comm_t *comm, const void *send, void *recv,
                       size_t count, mep_dtype_t dtype, mep_op_t op, int root,
                       mep_req_t **req);
MEP_API int mep_allreduce(mep_comm_t *comm, const void *send, void *recv,
                          size_t count, mep_dtype_t dtype, mep_op_t op,
                          mep_req_t **req);
/* `count` elements per rank; recv holds size * count, in rank order. */
MEP_API int mep_allgather(mep_comm_t *comm, const void *send, void *recv,
                          size_t count, mep_dtype_t dtype, mep_req_t **req);
/* send holds size * count; rank r receives the reduction of block r. */
MEP_API int mep_reduce_scatter(mep_comm_t *comm, const void *send, void *recv,
                               size_t count, mep_dtype_t dtype, mep_op_t op,
                               mep_req_t **req);
/* Block p (count elements) of send goes to rank p, and lands as block q of
 * rank p's recv, q being the sender. */
MEP_API int mep_alltoall(mep_comm_t *comm, const void *send, void *recv,
                         size_t count, mep_dtype_t dtype, mep_req_t **req);
/* Uneven all-to-all: counts and displacements in elements, one per rank. */
MEP_API int mep_alltoallv(mep_comm_t *comm, const void *send,
                          const size_t *send_counts, const size_t *send_displs,
                          void *recv, const size_t *recv_counts,
                          const size_t *recv_displs, mep_dtype_t dtype,
                          mep_req_t **req);
/* Every rank's `count` elements to root's recv (size * count, rank order). */
MEP_API int mep_gather(mep_comm_t *comm, const void *send, void *recv,
                       size_t count, mep_dtype_t dtype, int root,
                       mep_req_t **req);
/* Block r (count elements) of root's send to rank r's recv. */
MEP_API int mep_scatter(mep_comm_t *comm, const void *send, void *recv,
                        size_t count, mep_dtype_t dtype, int root,
                        mep_req_t **req);
MEP_API int mep_barrier(mep_comm_t *comm, mep_req_t **req);

/* --------------------------------------------------------- point-to-point
 * Messages between a pair are matched in order per (peer, tag); any size,
 * streamed through a ring of slots in the receiver's memory, with no store
 * round trip. A recv buffer smaller than the message fails the recv with
 * MEP_ERR_INVALID naming both sizes (the message is consumed). A peer that
 * failed or left the active set fails the call with MEP_ERR_PEER_FAILED;
 * nothing waits forever: a send or recv that cannot finish within the
 * communicator's timeout fails with MEP_ERR_TIMEOUT.
 *
 * Any source: mep_recv with peer MEP_ANY_SOURCE takes the first message of
 * its tag from any rank, the own rank included, in the order the messages
 * arrived (their first bytes); mep_req_source says who sent it. A message
 * goes to the recv posted first among those that match it (naming its
 * sender or any source), so order per (peer, tag) still holds. Faults: an
 * any-source recv that is receiving a message when its sender fails fails
 * with MEP_ERR_PEER_FAILED (the message was cut off); one still waiting
 * for a message keeps waiting while some other rank of the group lives,
 * and fails with MEP_ERR_PEER_FAILED once every other rank has failed (in
 * a group of one it waits for the own rank's sends). */
#define MEP_ANY_SOURCE (-1)
MEP_API int mep_send(mep_comm_t *comm, const void *buf, size_t bytes, int peer,
                     int tag, mep_req_t **req);
MEP_API int mep_recv(mep_comm_t *comm, void *buf, size_t bytes, int peer,
                     int tag, mep_req_t **req);

/* ------------------------------------------------------------ CUDA tensors
 * The collectives below work on CUDA memory of the calling thread's
 * current device and are ordered on `stream` (a cudaStream_t passed as
 * void *; NULL is the legacy default stream). They enqueue the work and
 * return without waiting for the GPU; the stream's later work sees the
 * result. Every rank calls them in the same order as its other
 * collectives of the communicator.
 *  - Where every peer's device route maps its memory (a transport that
 *    declares MEP_DEV_PTR, such as nvlink between GPUs of one host; see
 *    [core] device_transport), kernels read and write the peers' buffers
 *    directly; these launches may be captured in a CUDA graph and
 *    replayed.
 *  - Otherwise the data goes through pinned host memory and the host
 *    collective over the routed transports: the stream waits on a mapped
 *    flag (a stream memory operation), the calling thread does not block.
 *    Not capturable (MEP_ERR_UNSUPPORTED while the stream captures).
 * req (optional): finishes once the collective's outcome is known; its
 * status is that of the host collectives (MEP_OK_DEGRADED with the dropped
 * ranks after a fault). Without req, a fault shows in the next call and in
 * mep_comm_active. A peer that stops answering inside a kernel is marked
 * inactive after [core] timeout_ms; nothing waits forever.
 * MEP_ERR_UNSUPPORTED when libmep was built without CUDA or no GPU is
 * usable; MEP_ERR_INVALID for host pointers. */

/* 1 when this libmep was built with CUDA and sees a GPU, else 0. */
MEP_API int mep_cuda_available(void);
/* Which path the CUDA collectives of comm take now: "kernel" or "staged",
 * or NULL (no CUDA). Collective: the first call sets the kernel path up. */
MEP_API const char *mep_cuda_path(mep_comm_t *comm);

MEP_API int mep_allreduce_cuda(mep_comm_t *comm, const void *send, void *recv,
                               size_t count, mep_dtype_t dtype, mep_op_t op,
                               void *stream, mep_req_t **req);
MEP_API int mep_allgather_cuda(mep_comm_t *comm, const void *send,
                               void *recv, size_t count, mep_dtype_t dtype,
                               void *stream, mep_req_t **req);
MEP_API int mep_reduce_scatter_cuda(mep_comm_t *comm, const void *send,
                                    void *recv, size_t count,
                                    mep_dtype_t dtype, mep_op_t op,
                                    void *stream, mep_req_t **req);
MEP_API int mep_alltoall_cuda(mep_comm_t *comm, const void *send, void *recv,
                              size_t count, mep_dtype_t dtype, void *stream,
                              mep_req_t **req);
MEP_API int mep_broadcast_cuda(mep_comm_t *comm, void *buf, size_t count,
                               mep_dtype_t dtype, int root, void *stream,
                               mep_req_t **req);

#ifdef __cplusplus
}
#endif
#endif /* MEP_MEP_H */
