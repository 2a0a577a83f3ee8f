/*
 * transport.h - the plugin ABI of mep, for authors of transports.
 *
 * A transport is a shared module named libmep-transport-<name>.so that
 * exports one symbol, `mep_transport_plugin_v1`, a const mep_transport_t.
 * The core finds it through MEP_PLUGIN_PATH, then the installed plugin
 * directory, and dlopen()s it with RTLD_NOW | RTLD_LOCAL. A plugin includes
 * this header (and mep.h for the error codes) and nothing else of mep; it
 * need not link libmep.
 *
 * Versioning: like sqlite3_vfs, the struct starts with its ABI version and
 * only ever grows at its end. A plugin sets abi_major/abi_minor to the
 * MEP_TRANSPORT_ABI_* it was built with and struct_size to sizeof(its
 * struct). The core refuses a plugin whose abi_major differs from its own,
 * and reads a field only when struct_size covers it, so an older plugin
 * keeps working when fields are appended.
 *
 * Threads: the core calls poll() from one thread at a time (its progress
 * thread, or a thread waiting for its own request: not always the same
 * thread, but never two at once); every other function may be called from
 * other threads at the same time as poll() and each other, so a plugin
 * guards its shared state.
 * init/fini of one context are not concurrent with anything on it.
 *
 * Errors: functions return 0 or a negative MEP_ERR_* (mep.h) and describe
 * a failure with env->set_error, so the user reads it in mep_last_error().
 *
 * Rules every plugin keeps (mep-plugin-check tests them):
 *  - write/signal refuse a range outside the local registration or the
 *    imported remote length at once, with MEP_ERR_BOUNDS (MEP_ERR_INVALID
 *    for a misaligned signal), and send nothing;
 *  - address() never writes past *len, reachable() never past why_len;
 *  - once a peer failed, no later write to it completes with status 0;
 *  - unimport, dereg and close return 0 after the peer died;
 *  - close() returns within a bounded time also when the peer is frozen
 *    or cut off, and releases the connection's sockets, queues and memory;
 *    the completions of writes still pending on it are queued before close
 *    returns (with a negative status), and after those poll() reports
 *    nothing more about that connection;
 *  - connect() to a rank whose earlier ep was closed makes a new
 *    connection: a replacement process of that rank, with a new address
 *    blob (recovery, ABI 1.1);
 *  - fini is called once per context, after close of each of its eps.
 *
 * The core closes an ep only after unimporting every region imported
 * through it, and never uses it after close.
 */
#ifndef MEP_TRANSPORT_H
#define MEP_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "mep.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MEP_TRANSPORT_ABI_MAJOR 1
#define MEP_TRANSPORT_ABI_MINOR 6

/* The exported symbol's name, as the loader looks it up. */
#define MEP_TRANSPORT_SYMBOL "mep_transport_plugin_v1"

/* Largest address blob and remote-key blob a plugin may produce. */
#define MEP_TP_MAX_ADDR 256
#define MEP_TP_MAX_RKEY 128

/* Token of a completion that no operation asked for (a peer failed). */
#define MEP_TP_TOKEN_NONE UINT64_MAX

/* Whether *p, a struct of `type` whose struct_size its maker set, reaches
 * `field`: one made against an older header ends before the fields added
 * since. A plugin reads a field of the core's mep_tp_env_t, and writes one
 * of its mep_tp_props_t, only where this holds:
 *   if (MEP_TP_HAS(env, mep_tp_env_t, cfg_str)) ... (ABI 1.3 and later) */
#define MEP_TP_HAS(p, type, field)                                            \
  ((p)->struct_size >= offsetof(type, field) + sizeof((p)->field))

/* ------------------------------------------- configuration keys (1.3)
 * A plugin declares the keys of its [<name>] section in a table
 * (mep_transport_t.config_keys). The core checks the section and the
 * MEP_<NAME>_<KEY> environment overrides against it when it loads the
 * plugin: a bad value is MEP_ERR_CONFIG naming the key, the value and
 * where it came from (file:line or the variable); an undeclared key is a
 * warning naming file and line. mep-info prints the table and conf/mep.ini
 * documents it from the same text, so `help` is what users read. */
typedef enum mep_tp_cfg_type {
  MEP_TP_CFG_STRING = 1, /* free text */
  MEP_TP_CFG_INT = 2,    /* integer in [min, max]; K, M, G (binary) suffixes */
  MEP_TP_CFG_BOOL = 3,   /* 0/1, false/true, no/yes, off/on */
  MEP_TP_CFG_CHOICE = 4, /* one of `choices`, written "a|b|c" */
  MEP_TP_CFG_RANGE = 5,  /* "0", or "LO-HI" with min <= LO <= HI <= max */
} mep_tp_cfg_type_t;

/* One declared key. The layout is fixed for ABI major 1 (the table is an
 * array): new attributes would come as a new table. */
typedef struct mep_tp_cfg_key {
  const char *name;     /* letters, digits and '_'; case-insensitive */
  mep_tp_cfg_type_t type;
  int64_t min, max;     /* INT and RANGE bounds */
  const char *def;      /* the default, written as a user would; NULL for a
                         * key that is unset unless given (STRING) */
  const char *choices;  /* CHOICE: "adaptive|spin" */
  const char *help;     /* what it does, in sentences, for users */
} mep_tp_cfg_key_t;

/* What the core tells a plugin at init. Valid until fini returns. */
typedef struct mep_tp_env {
  uint32_t struct_size; /* sizeof(mep_tp_env_t) of the core */
  int rank;             /* this process's rank in the communicator */
  int size;             /* rank slots: the communicator's max_size (ranks
                           beyond the current group may connect later) */
  /* Identical in every process of one host and different across hosts
   * (hostname and boot id, or $MEP_HOST_ID). */
  const char *host_id;
  /* Per-job secret made by rank 0 and shared through the store; a
   * connection-based plugin authenticates peers with it. */
  const uint8_t *secret;
  size_t secret_len;
  int timeout_ms; /* deadline for connect and other blocking steps */
  /* The plugin's own config section: get(cfg, "key") is the value after
   * environment overrides, or NULL when unset. */
  const void *cfg;
  const char *(*cfg_get)(const void *cfg, const char *key);
  /* Log through the core (rank prefix, MEP_LOG level, MEP_LOG_FILE). */
  void (*log)(mep_log_level_t level, const char *fmt, ...) MEP_PRINTF(2, 3);
  /* Describe the failure being returned; shown by mep_last_error(). */
  void (*set_error)(const char *fmt, ...) MEP_PRINTF(1, 2);

  /* ABI 1.3 (check struct_size before use; a plugin may refuse an older
   * core with MEP_ERR_ABI). The keys the plugin declared, as the core
   * checked them, and typed reads of them: the value cfg_get gives, else
   * the declared default, checked against the declaration. cfg_int reads
   * INT, BOOL (0 or 1) and CHOICE (the index among the choices) keys;
   * cfg_range a RANGE key (0-0 for "0"); cfg_str any key's text ("" when
   * it has none). Errors: MEP_ERR_CONFIG naming key, value and origin, or
   * MEP_ERR_INVALID for a key the table does not declare with that type;
   * the message is set (mep_last_error). Thread-safe. */
  const mep_tp_cfg_key_t *cfg_keys;
  size_t cfg_nkeys;
  int (*cfg_int)(const struct mep_tp_env *env, const char *key,
                 int64_t *out);
  int (*cfg_range)(const struct mep_tp_env *env, const char *key,
                   int64_t *lo, int64_t *hi);
  const char *(*cfg_str)(const struct mep_tp_env *env, const char *key);
} mep_tp_env_t;

/* Memory kinds a plugin handles, as a bit set of (1 << mep_memkind_t). */
#define MEP_TP_MEM_HOST (1u << MEP_MEM_HOST)
#define MEP_TP_MEM_CUDA (1u << MEP_MEM_CUDA)

/* Device descriptor kinds (see device.h, for kernels). */
typedef enum {
  MEP_DEV_NONE = 0,  /* kernels reach this transport through the proxy */
  MEP_DEV_PTR = 1,   /* a mapped pointer to the peer's memory */
  MEP_DEV_MLX5 = 2,  /* GPU-initiated RDMA on mlx5 */
  MEP_DEV_PROXY = 3, /* a host-mapped command ring served by a CPU thread */
} mep_dev_kind_t;

/* ---------------------------------------------- device descriptors (1.3)
 * What a GPU kernel needs to reach a peer by itself, in two parts that
 * each begin with mep_dev_desc_t: the peer part (device_descriptor: the
 * connection, e.g. queue pairs) and the region part (device_region: one
 * imported region, e.g. a mapped address or a remote key). The core
 * copies both, as they are, into device memory for its kernels (device.h)
 * and chooses the transport that serves kernels for a peer by what the
 * transports declare, never by name: a plugin that fills descriptors of a
 * kind the core's kernels know is used exactly like a built-in one. */
#define MEP_DEV_DESC_MAX 128 /* largest descriptor part, header included */

typedef struct mep_dev_desc {
  uint16_t kind;    /* mep_dev_kind_t */
  uint16_t version; /* of that kind's layout: MEP_DEV_<KIND>_VERSION */
  uint32_t size;    /* bytes of the whole part, header included */
} mep_dev_desc_t;

/* MEP_DEV_PTR: kernels load from and store to the peer's memory. */
#define MEP_DEV_PTR_VERSION 1
#define MEP_DEV_PTR_PEER_ACCESS 1u /* peer access is enabled: the GPUs
                                    * reach each other directly */
typedef struct mep_dev_ptr_peer {
  mep_dev_desc_t hdr;
  int32_t device; /* the peer's GPU as an ordinal of this process, -1 when
                   * it is this process's own GPU */
  uint32_t flags; /* MEP_DEV_PTR_* */
} mep_dev_ptr_peer_t;

typedef struct mep_dev_ptr_region {
  mep_dev_desc_t hdr;
  uint64_t base; /* where kernels on this process's GPU (current at the
                  * plugin's init) reach the region's first byte */
  uint64_t len;  /* of the region */
} mep_dev_ptr_region_t;

/* MEP_DEV_MLX5 (ABI 1.4): kernels build mlx5 work requests in a queue
 * pair's send queue and ring its doorbell (mep/device/mlx5.h has the
 * encoding, mep/device/mlx5_qp.h the protocol on the counters). The
 * addresses of the queue pair's objects are where kernels on this
 * process's GPU reach them; `sink` and the region part's raddr are
 * addresses as the NIC names them in WQEs. Version 1: one RC queue pair
 * per peer that kernels alone post on (the host's own requests to the
 * peer go on another), so producers of the grid share only the counters
 * below. The region part of this rank's own registration (device_local,
 * ABI 1.6) names a WRITE's source: raddr its address, rkey its lkey. */
#define MEP_DEV_MLX5_VERSION 1
#define MEP_DEV_MLX5_MODEL 1u /* the queues are served by the software
                               * model of the NIC, not by a ConnectX */
typedef struct mep_dev_mlx5_peer {
  mep_dev_desc_t hdr;
  uint32_t qpn;      /* the queue pair number (24 bits) */
  uint32_t sq_bbs;   /* send queue size in 64-byte building blocks, a power
                      * of two; the WQE index mask is sq_bbs - 1 */
  uint64_t sq;       /* the send queue's first building block */
  uint64_t dbrec;    /* the doorbell record: 2 big-endian 32-bit words,
                      * [1] the send producer index (low 16 bits) */
  uint64_t db;       /* the doorbell register: 8-byte stores of the
                      * first 8 bytes of the last control segment */
  /* Counters, each a uint64_t at that address, shared by every producer
   * of the queue pair (mep/device/mlx5_qp.h says how they are used): */
  uint64_t pi;       /* building blocks reserved (atomic add) */
  uint64_t ready;    /* building blocks published, in order */
  uint64_t ci;       /* building blocks completed, from the CQ */
  uint64_t cq;       /* the completion queue: cq_n 64-byte CQEs */
  uint32_t cq_n;     /* a power of two */
  uint32_t sink_lkey; /* lkey of `sink`, for FETCH_AND_ADD results */
  uint64_t cq_dbrec; /* the CQ's doorbell record: [0] the consumer index */
  uint64_t cq_ci;    /* uint64_t: CQEs consumed */
  uint64_t cq_lock;  /* uint64_t: 0 free, 1 a poller holds the CQ, 2 the
                      * queue pair failed (an error CQE) */
  uint64_t sink;     /* 8 bytes of local registered memory (the NIC's
                      * address: kernels never dereference it) */
  uint32_t flags;    /* MEP_DEV_MLX5_* */
  uint32_t reserved;
} mep_dev_mlx5_peer_t;

typedef struct mep_dev_mlx5_region {
  mep_dev_desc_t hdr;
  uint64_t raddr; /* the peer's address of the region's first byte */
  uint64_t len;
  uint32_t rkey;
  uint32_t reserved;
} mep_dev_mlx5_region_t;

typedef struct mep_tp_props {
  uint32_t struct_size;   /* set by the core; a plugin fills what fits */
  uint32_t mem_kinds;     /* MEP_TP_MEM_* bits */
  mep_dev_kind_t dev_kind; /* descriptor kind, MEP_DEV_NONE if none */
  int atomics;            /* 1 if signal ADD is a real remote atomic */
  uint64_t max_message;   /* largest single write; 0 = unlimited */
  double latency_us;      /* expected small-message latency */
  double bandwidth_gbps;  /* expected bandwidth, GB/s */
  /* A file descriptor that turns readable when poll() has work to do
   * (an epoll fd, an eventfd), so an idle core can sleep on it; -1 if the
   * plugin must be polled. */
  int event_fd;
  /* (ABI 1.5) 1 when a registration of host memory records addresses
   * only and holds on to no memory (pins no pages): one made for a buffer
   * stays right for whatever is mapped at those addresses later, so the
   * core may keep it across calls (its cache of callers' buffers, from
   * which large collective chunks are written without a copy). 0, and in
   * plugins built before this field: the core registers only its own
   * buffers with it, and stages collective chunks. */
  int reg_by_address;
} mep_tp_props_t;

typedef struct mep_tp_completion {
  uint64_t token; /* the write's token, or MEP_TP_TOKEN_NONE */
  int status;     /* 0, or MEP_ERR_PEER_FAILED, MEP_ERR_BOUNDS... */
  int peer;       /* the peer the operation or failure concerns */
} mep_tp_completion_t;

/* Opaque plugin objects, one pointer each. */
typedef void mep_tp_ctx_t;  /* one per communicator */
typedef void mep_tp_ep_t;   /* a connection to one peer */
typedef void mep_tp_mr_t;   /* a local registration */
typedef void mep_tp_rmr_t;  /* an imported peer region */

typedef struct mep_transport {
  uint32_t abi_major;   /* MEP_TRANSPORT_ABI_MAJOR at build time */
  uint32_t abi_minor;   /* MEP_TRANSPORT_ABI_MINOR at build time */
  uint32_t struct_size; /* sizeof(mep_transport_t) at build time */
  const char *name;     /* "tcp"; must match the file name */
  const char *version;  /* the plugin's own version, free form */

  /* Creates a context for one communicator. MEP_ERR_UNAVAILABLE with a
   * reason ("no RDMA device") when the transport cannot run here; that is
   * not an error for the job, the core skips the transport. */
  int (*init)(const mep_tp_env_t *env, mep_tp_ctx_t **ctx);

  /* Fills the capabilities. */
  int (*props)(mep_tp_ctx_t *ctx, mep_tp_props_t *props);

  /* Writes this context's address blob (at most *len bytes, at most
   * MEP_TP_MAX_ADDR) and sets *len to its size. The core publishes it. */
  int (*address)(mep_tp_ctx_t *ctx, void *buf, size_t *len);

  /* 1 if this transport reaches `peer` whose blob is given, 0 if not (with
   * a reason in why, e.g. "other host"), negative on error. Must give the
   * same answer on both sides from the exchanged blobs. */
  int (*reachable)(mep_tp_ctx_t *ctx, int peer, const void *blob,
                   size_t len, char *why, size_t why_len);

  /* Connects to `peer`; both sides call it, each rank for its peers in
   * increasing rank order. Bounded by env->timeout_ms. */
  int (*connect)(mep_tp_ctx_t *ctx, int peer, const void *blob, size_t len,
                 mep_tp_ep_t **ep);

  /* Registers local memory. Writes the remote-key blob (at most
   * *rkey_len bytes, at most MEP_TP_MAX_RKEY) peers import. */
  int (*reg)(mep_tp_ctx_t *ctx, void *ptr, size_t len, mep_memkind_t kind,
             mep_tp_mr_t **mr, void *rkey, size_t *rkey_len);
  /* Releases a registration; later incoming writes to it are refused. */
  int (*dereg)(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr);

  /* Imports a peer's region from its remote-key blob. */
  int (*import)(mep_tp_ep_t *ep, const void *rkey, size_t len,
                mep_tp_rmr_t **rmr);
  /* Releases an imported region. */
  int (*unimport)(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr);

  /* One-sided put of `len` bytes from mr+loff to rmr+roff. Completes
   * through poll() with `token` once the source may be reused. */
  int (*write)(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
               mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
               uint64_t token);

  /* Stores (MEP_SIGNAL_SET) or adds (MEP_SIGNAL_ADD) `value` to the 8-byte
   * aligned word at rmr+roff, visible to the peer only after every earlier
   * write on `ep` is. No completion is reported on success. */
  int (*signal)(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                uint64_t value, mep_signal_op_t op);

  /* Makes progress and returns up to `max` completions (the count, or a
   * negative error). Never blocks. A failed operation or a lost peer is a
   * completion with a negative status naming the peer; a peer whose
   * connection breaks is reported at once, not at a timeout. A peer that
   * closed its side in order (its close() ran with nothing left to send)
   * may be reported with MEP_ERR_CLOSED instead of MEP_ERR_PEER_FAILED. */
  int (*poll)(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max);

  /* Required when props.dev_kind is not MEP_DEV_NONE, else NULL (ABI
   * 1.3 gives it its meaning; earlier cores never call it): the peer part
   * of the device descriptor (above) for `peer`, once connect() to it
   * succeeded. Writes at most *len bytes (at most MEP_DEV_DESC_MAX) and
   * sets *len. MEP_ERR_UNREACHABLE, with the reason, when kernels on this
   * process's GPU cannot reach that peer this way (the core then serves
   * it through its proxy). Must give the same answer on both sides. */
  int (*device_descriptor)(mep_tp_ctx_t *ctx, int peer, void *desc,
                           size_t *len);

  /* Safe after the peer died; may be repeated on an ep until connect() is
   * called for that rank again (then the old ep is gone for good). */
  int (*close)(mep_tp_ep_t *ep);
  int (*fini)(mep_tp_ctx_t *ctx);

  /* ABI 1.2, for cores of that ABI (a 1.3 core reads device_region
   * instead). Optional: for MEP_DEV_PTR, the address at which a kernel on
   * this process's current GPU loads from and stores to the first byte of
   * the imported region rmr. Valid until unimport. Plain loads and stores
   * through such an address reach the peer's memory; they are ordered
   * against the peer's kernels only by the kernels' own fences
   * (__threadfence_system) and flags. */
  int (*map)(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void **dev_ptr);

  /* ABI 1.3. Optional (NULL when there are none): the table of the keys of
   * this plugin's [<name>] section (above), config_nkeys entries. */
  const mep_tp_cfg_key_t *config_keys;
  size_t config_nkeys;

  /* ABI 1.3. Required when props.dev_kind is not MEP_DEV_NONE: the region
   * part of the device descriptor (above) of the imported region rmr,
   * valid until unimport; at most *len bytes (at most MEP_DEV_DESC_MAX),
   * *len set. For MEP_DEV_PTR it supersedes map(), which a 1.3 core no
   * longer calls (it stays for older cores). */
  int (*device_region)(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void *desc,
                       size_t *len);

  /* ABI 1.6. Required for a kind whose kernels name this rank's own
   * memory in their requests (MEP_DEV_MLX5: the source of an RDMA WRITE,
   * by its address and lkey), else NULL: the region part of the
   * descriptor for this rank's own registration mr, laid out as
   * device_region lays out an imported one (for MEP_DEV_MLX5, raddr and
   * rkey hold the local address and the lkey). Valid until dereg; at most
   * *len bytes (at most MEP_DEV_DESC_MAX), *len set. */
  int (*device_local)(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr, void *desc,
                      size_t *len);
} mep_transport_t;

/* ---------------------------------------------------- for plugin hosts
 * The following are exported by libmep for programs that drive a plugin
 * directly (mep-plugin-check); plugins themselves do not call them. */

typedef struct mep_plugin mep_plugin_t;

/* Opens the plugin file at `path` and checks its ABI. On failure the error
 * names the file and the cause: the dlopen() text, a missing
 * mep_transport_plugin_v1 symbol, or both ABI versions (MEP_ERR_ABI). */
MEP_API int mep_plugin_open(const char *path, mep_plugin_t **out);

/* Finds libmep-transport-<name>.so in MEP_PLUGIN_PATH, then the installed
 * plugin directory, and opens it. MEP_ERR_NOT_FOUND lists every path tried. */
MEP_API int mep_plugin_find(const char *name, mep_plugin_t **out);

MEP_API const mep_transport_t *mep_plugin_vtable(const mep_plugin_t *p);
MEP_API const char *mep_plugin_path(const mep_plugin_t *p);
MEP_API void mep_plugin_close(mep_plugin_t *p);

/* The installed plugin directory, found relative to libmep itself. */
MEP_API const char *mep_plugin_dir(void);

/* The directories mep_plugin_find searches, in order, colon-separated:
 * MEP_PLUGIN_PATH, the installed directory, and the build tree's plugin
 * directories when libmep runs uninstalled. malloc'ed; the caller frees. */
MEP_API char *mep_plugin_search_path(void);

/* Fills `env` for a plugin host: log and set_error go through libmep,
 * cfg_get reads section `section` of cfg (NULL: built-in defaults only),
 * host_id is this host's; rank, size, secret and timeout_ms are the
 * caller's to set. The typed reads (cfg_int...) know no keys: use
 * mep_plugin_env_open for a plugin at hand. Release with
 * mep_plugin_env_fini. */
MEP_API int mep_plugin_env_init(mep_tp_env_t *env, const mep_config_t *cfg,
                                const char *section);

/* mep_plugin_env_init for plugin `p`'s own section, with its declared keys
 * bound to the typed reads, after checking that section and the
 * MEP_<NAME>_* variables against them (mep_plugin_config_check). On
 * failure env needs no fini. */
MEP_API int mep_plugin_env_open(mep_tp_env_t *env, const mep_config_t *cfg,
                                const mep_plugin_t *p);

/* Checks cfg's [<name>] section of plugin `p` and the MEP_<NAME>_<KEY>
 * environment variables against the keys p declares: MEP_ERR_CONFIG for a
 * value its declaration refuses (naming key, value, and file:line or the
 * variable); a warning for a key it does not declare. A plugin that
 * declares no table is not checked. */
MEP_API int mep_plugin_config_check(const mep_plugin_t *p,
                                    const mep_config_t *cfg);

/* The configuration keys plugin `p` declares (*n of them), or NULL (*n 0)
 * for a plugin without a table. Owned by the plugin: valid until
 * mep_plugin_close. */
MEP_API const mep_tp_cfg_key_t *mep_plugin_config_keys(const mep_plugin_t *p,
                                                       size_t *n);
MEP_API void mep_plugin_env_fini(mep_tp_env_t *env);

/* This host's id as plugins see it in env->host_id: $MEP_HOST_ID, else
 * hostname and boot id. Static storage. */
MEP_API const char *mep_host_id(void);

#ifdef __cplusplus
}
#endif
#endif /* MEP_TRANSPORT_H */
