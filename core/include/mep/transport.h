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
#define MEP_TRANSPORT_ABI_MINOR 2

/* The exported symbol's name, as the loader looks it up. */
#define MEP_TRANSPORT_SYMBOL "mep_transport_plugin_v1"

/* Largest address blob and remote-key blob a plugin may produce. */
#define MEP_TP_MAX_ADDR 256
#define MEP_TP_MAX_RKEY 128

/* Token of a completion that no operation asked for (a peer failed). */
#define MEP_TP_TOKEN_NONE UINT64_MAX

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

  /* Optional (NULL): what a GPU kernel needs to reach `peer` itself. */
  int (*device_descriptor)(mep_tp_ctx_t *ctx, int peer, void *desc,
                           size_t *len);

  /* Safe after the peer died; may be repeated on an ep until connect() is
   * called for that rank again (then the old ep is gone for good). */
  int (*close)(mep_tp_ep_t *ep);
  int (*fini)(mep_tp_ctx_t *ctx);

  /* ABI 1.2. Optional (NULL; required when dev_kind is MEP_DEV_PTR): the
   * address at which a kernel on this process's current GPU loads from and
   * stores to the first byte of the imported region rmr. Valid until
   * unimport. Plain loads and stores through it reach the peer's memory;
   * they are ordered against the peer's kernels only by the kernels' own
   * fences (__threadfence_system) and flags. */
  int (*map)(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void **dev_ptr);
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
 * caller's to set. Release with mep_plugin_env_fini. */
MEP_API int mep_plugin_env_init(mep_tp_env_t *env, const mep_config_t *cfg,
                                const char *section);
MEP_API void mep_plugin_env_fini(mep_tp_env_t *env);

/* This host's id as plugins see it in env->host_id: $MEP_HOST_ID, else
 * hostname and boot id. Static storage. */
MEP_API const char *mep_host_id(void);

#ifdef __cplusplus
}
#endif
#endif /* MEP_TRANSPORT_H */
