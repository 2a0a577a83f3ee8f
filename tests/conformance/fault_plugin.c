/* fault_plugin.c - libmep-transport-fault.so, a test fixture: a plugin
 * that forwards every call to another plugin ($MEP_FAULT_INNER, a path)
 * and injects one kind of misbehaviour ($MEP_FAULT), so that the tests can
 * show that mep-plugin-check catches it. Faults:
 *   none      forward only (the wrapper itself must pass)
 *   corrupt   flip a source byte in the middle of writes of >= 4 KiB
 *   drop      leave out one write in 97 but report it complete
 *   dup       report one completion twice
 *   nobounds  accept writes with huge offsets or lengths without sending
 *   leakfd    every init opens /dev/null and never closes it
 *   leakmem   every init allocates memory and never frees it (only
 *             LeakSanitizer notices)
 *   crash     rank 1 aborts in its first write
 *   hang      rank 1's poll never returns (from its first call: a later
 *             one may never come when few calls are enough)
 *   nofail    poll swallows every failed completion
 *   latefail  after close(ep), a later poll reports the peer failed
 *   norecon   connect() refuses a second connection in a context, as
 *             plugins of ABI 1.0 did
 *   desc      declares MEP_DEV_PTR and gives well-formed descriptor parts
 *             (the region part's base is a made-up address: the regions
 *             are host memory, which no kernel dereferences)
 *   descsize  as desc, but the peer part's header says a larger size than
 *             the part has
 *   descover  as desc, but the peer part is written whole even into too
 *             little room
 *   cudaonly  props says CUDA memory only (the suite must pick CUDA memory
 *             for it, and skip where there is none)
 *   propsall  props fills the whole struct it was built with, whatever
 *             struct_size the core says
 *   oldenv    init calls a typed configuration read (ABI 1.3) without
 *             checking that the env's struct_size reaches it */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mep/transport.h"

typedef enum {
  F_NONE,
  F_CORRUPT,
  F_DROP,
  F_DUP,
  F_NOBOUNDS,
  F_LEAKFD,
  F_LEAKMEM,
  F_CRASH,
  F_HANG,
  F_NOFAIL,
  F_LATEFAIL,
  F_NORECON,
  F_DESC,
  F_DESCSIZE,
  F_DESCOVER,
  F_CUDAONLY,
  F_PROPSALL,
  F_OLDENV,
} fault_t;

static const mep_transport_t *inner;
static const mep_tp_env_t *env_of_fault; /* the last init's */
static fault_t fault;
static int my_rank;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long n_writes;
/* Completions the wrapper owes: dropped or faked writes, a duplicate. */
static mep_tp_completion_t owed[64];
static int n_owed;
static int dup_done;

static fault_t parse_fault(const char *s) {
  static const struct {
    const char *name;
    fault_t f;
  } names[] = {
      {"corrupt", F_CORRUPT}, {"drop", F_DROP},     {"dup", F_DUP},
      {"nobounds", F_NOBOUNDS}, {"leakfd", F_LEAKFD}, {"leakmem", F_LEAKMEM},
      {"crash", F_CRASH},
      {"hang", F_HANG},       {"nofail", F_NOFAIL},
      {"latefail", F_LATEFAIL}, {"norecon", F_NORECON},
      {"desc", F_DESC},       {"descsize", F_DESCSIZE},
      {"descover", F_DESCOVER}, {"cudaonly", F_CUDAONLY},
      {"propsall", F_PROPSALL}, {"oldenv", F_OLDENV},
  };
  for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
    if (strcmp(s, names[i].name) == 0) return names[i].f;
  return F_NONE;
}

static int load_inner(const mep_tp_env_t *env) {
  if (inner) return 0;
  const char *path = getenv("MEP_FAULT_INNER");
  if (!path) {
    env->set_error("fault: set MEP_FAULT_INNER to the plugin to wrap");
    return MEP_ERR_UNAVAILABLE;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const mep_transport_t *vt = h ? dlsym(h, MEP_TRANSPORT_SYMBOL) : NULL;
  if (!vt) {
    env->set_error("fault: cannot load %s: %s", path, dlerror());
    return MEP_ERR_UNAVAILABLE;
  }
  inner = vt; /* kept loaded for the life of the process */
  return 0;
}

static int f_init(const mep_tp_env_t *env, mep_tp_ctx_t **ctx) {
  int rc = load_inner(env);
  if (rc) return rc;
  env_of_fault = env;
  fault = parse_fault(getenv("MEP_FAULT"));
  my_rank = env->rank;
  if (fault == F_OLDENV && env->cfg_str) (void)env->cfg_str(env, "enable");
  if (fault == F_LEAKFD && open("/dev/null", O_RDONLY) < 0)
    return MEP_ERR_SYSTEM;
  if (fault == F_LEAKMEM) {
    /* Written through a volatile pointer so the allocation stays. */
    char *volatile lost = malloc(4096);
    if (lost) lost[0] = 1;
  }
  /* The wrapped plugin reads its own keys: hand it an env whose typed
   * reads know them (the core bound the wrapper's, which has none). */
  static mep_tp_env_t inner_env;
  inner_env = *env;
  if (env->struct_size >= sizeof inner_env &&
      MEP_TP_HAS(inner, mep_transport_t, config_nkeys)) {
    inner_env.cfg_keys = inner->config_keys;
    inner_env.cfg_nkeys = inner->config_nkeys;
  }
  return inner->init(&inner_env, ctx);
}

static int desc_fault(void) {
  return fault == F_DESC || fault == F_DESCSIZE || fault == F_DESCOVER;
}

static int f_props(mep_tp_ctx_t *ctx, mep_tp_props_t *p) {
  if (fault == F_PROPSALL) {
    mep_tp_props_t full = {.struct_size = sizeof full};
    int rc = inner->props(ctx, &full);
    if (rc == 0) memcpy(p, &full, sizeof full);
    return rc;
  }
  int rc = inner->props(ctx, p);
  if (rc) return rc;
  if (desc_fault()) p->dev_kind = MEP_DEV_PTR;
  if (fault == F_CUDAONLY) p->mem_kinds = MEP_TP_MEM_CUDA;
  return 0;
}

static int f_address(mep_tp_ctx_t *ctx, void *buf, size_t *len) {
  return inner->address(ctx, buf, len);
}

static int f_reachable(mep_tp_ctx_t *ctx, int peer, const void *blob,
                       size_t len, char *why, size_t why_len) {
  return inner->reachable(ctx, peer, blob, len, why, why_len);
}

static mep_tp_ctx_t *connected_ctx; /* the last context that connected */

static int f_connect(mep_tp_ctx_t *ctx, int peer, const void *blob,
                     size_t len, mep_tp_ep_t **ep) {
  if (fault == F_NORECON && ctx == connected_ctx) {
    env_of_fault->set_error("fault: connect to rank %d: it already failed or "
                            "was closed in this context", peer);
    return MEP_ERR_PEER_FAILED;
  }
  int rc = inner->connect(ctx, peer, blob, len, ep);
  if (rc == 0) connected_ctx = ctx;
  return rc;
}

/* The registrations, so that "corrupt" can reach a write's source. */
typedef struct reg_entry {
  mep_tp_mr_t *mr;
  unsigned char *ptr;
  size_t len;
} reg_entry_t;
static reg_entry_t *regs;
static size_t n_regs;

/* The desc faults: an rkey carries its region's length in its first 8
 * bytes, so that the importer's region part can tell it. */
typedef struct import_entry {
  mep_tp_rmr_t *rmr;
  uint64_t len;
} import_entry_t;
static import_entry_t imports[64];
static size_t n_imports;

static int reg_with_len(mep_tp_ctx_t *ctx, void *ptr, size_t len,
                        mep_memkind_t kind, mep_tp_mr_t **mr, void *rkey,
                        size_t *rkey_len) {
  if (*rkey_len < 8) return MEP_ERR_INVALID;
  size_t room = *rkey_len - 8;
  int rc = inner->reg(ctx, ptr, len, kind, mr, (unsigned char *)rkey + 8,
                      &room);
  if (rc) return rc;
  uint64_t n = len;
  memcpy(rkey, &n, 8);
  *rkey_len = room + 8;
  return 0;
}

static int import_with_len(mep_tp_ep_t *ep, const void *rkey, size_t len,
                           mep_tp_rmr_t **rmr) {
  if (len < 8) {
    env_of_fault->set_error("fault: import: an rkey of %zu bytes", len);
    return MEP_ERR_PROTOCOL;
  }
  uint64_t n;
  memcpy(&n, rkey, 8);
  int rc = inner->import(ep, (const unsigned char *)rkey + 8, len - 8, rmr);
  if (rc) return rc;
  pthread_mutex_lock(&lock);
  if (n_imports < sizeof imports / sizeof imports[0])
    imports[n_imports++] = (import_entry_t){*rmr, n};
  pthread_mutex_unlock(&lock);
  return 0;
}

static void forget_import(mep_tp_rmr_t *rmr) {
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_imports; i++)
    if (imports[i].rmr == rmr) {
      imports[i] = imports[--n_imports];
      break;
    }
  pthread_mutex_unlock(&lock);
}

static int imported_len(mep_tp_rmr_t *rmr, uint64_t *len) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_imports && !found; i++)
    if (imports[i].rmr == rmr) {
      *len = imports[i].len;
      found = 1;
    }
  pthread_mutex_unlock(&lock);
  return found;
}

static int f_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len, mep_memkind_t kind,
                 mep_tp_mr_t **mr, void *rkey, size_t *rkey_len) {
  if (desc_fault())
    return reg_with_len(ctx, ptr, len, kind, mr, rkey, rkey_len);
  int rc = inner->reg(ctx, ptr, len, kind, mr, rkey, rkey_len);
  if (rc || fault != F_CORRUPT) return rc;
  pthread_mutex_lock(&lock);
  reg_entry_t *r = realloc(regs, (n_regs + 1) * sizeof *regs);
  if (r) {
    regs = r;
    regs[n_regs++] = (reg_entry_t){*mr, ptr, len};
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

static int f_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr) {
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_regs; i++)
    if (regs[i].mr == mr) {
      regs[i] = regs[--n_regs];
      break;
    }
  if (n_regs == 0) {
    free(regs);
    regs = NULL;
  }
  pthread_mutex_unlock(&lock);
  return inner->dereg(ctx, mr);
}

/* Flips byte `off` of the registration: the write then sends a corrupted
 * byte, as if it had been damaged on the way. */
static void corrupt_source(mep_tp_mr_t *mr, uint64_t off) {
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_regs; i++)
    if (regs[i].mr == mr && off < regs[i].len) regs[i].ptr[off] ^= 0x5a;
  pthread_mutex_unlock(&lock);
}

static int f_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                    mep_tp_rmr_t **rmr) {
  if (desc_fault()) return import_with_len(ep, rkey, len, rmr);
  return inner->import(ep, rkey, len, rmr);
}

static int f_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr) {
  forget_import(rmr);
  return inner->unimport(ep, rmr);
}

/* A completion reported by the wrapper instead of the inner plugin. */
static void owe_status(uint64_t token, int status, int peer) {
  pthread_mutex_lock(&lock);
  if (n_owed < (int)(sizeof owed / sizeof owed[0]))
    owed[n_owed++] = (mep_tp_completion_t){token, status, peer};
  pthread_mutex_unlock(&lock);
}

static void owe(uint64_t token, int peer) { owe_status(token, 0, peer); }

static int f_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
                   mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
                   uint64_t token) {
  unsigned long k = __atomic_fetch_add(&n_writes, 1, __ATOMIC_RELAXED);
  const uint64_t huge = (uint64_t)1 << 40;
  switch (fault) {
  case F_CRASH:
    if (my_rank == 1) abort();
    break;
  case F_DROP:
    if (len > 0 && k % 97 == 50) {
      owe(token, 1 - my_rank);
      return 0;
    }
    break;
  case F_NOBOUNDS:
    if (loff > huge || roff > huge || len > huge) {
      owe(token, 1 - my_rank);
      return 0;
    }
    break;
  case F_CORRUPT:
    if (len >= 4096) corrupt_source(mr, loff + len / 2);
    break;
  default:
    break;
  }
  return inner->write(ep, mr, loff, rmr, roff, len, token);
}

static int f_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                    uint64_t value, mep_signal_op_t op) {
  return inner->signal(ep, rmr, roff, value, op);
}

/* Drops every failed completion from out[0..n); returns the new count. */
static int without_failures(mep_tp_completion_t *out, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (out[i].status == 0) out[k++] = out[i];
  return k;
}

static int f_poll(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max) {
  if (fault == F_HANG && my_rank == 1)
    for (;;) pause();
  int n = 0;
  pthread_mutex_lock(&lock);
  while (n_owed > 0 && n < max) out[n++] = owed[--n_owed];
  pthread_mutex_unlock(&lock);
  if (n == max) return n;
  int got = inner->poll(ctx, out + n, max - n);
  if (got < 0) return got;
  n += got;
  if (fault == F_NOFAIL) n = without_failures(out, n);
  if (fault == F_DUP && !dup_done && got > 0 &&
      out[n - 1].token != MEP_TP_TOKEN_NONE) {
    dup_done = 1;
    owe(out[n - 1].token, out[n - 1].peer);
  }
  return n;
}

/* A descriptor part into `room` bytes; "descover" writes it whole even
 * when it does not fit. */
static int put_part(const void *part, size_t n, void *desc, size_t *room) {
  if (*room < n) {
    if (fault == F_DESCOVER) memcpy(desc, part, n);
    env_of_fault->set_error("fault: a descriptor part of %zu bytes, %zu of "
                            "room", n, *room);
    return MEP_ERR_INVALID;
  }
  memcpy(desc, part, n);
  *room = n;
  return 0;
}

static int f_device_descriptor(mep_tp_ctx_t *ctx, int peer, void *desc,
                               size_t *len) {
  (void)ctx;
  if (!desc_fault()) {
    env_of_fault->set_error("fault: no device descriptors without a desc "
                            "fault");
    return MEP_ERR_UNSUPPORTED;
  }
  if (peer < 0 || peer >= env_of_fault->size || peer == my_rank) {
    env_of_fault->set_error("fault: device descriptor of rank %d", peer);
    return MEP_ERR_INVALID;
  }
  mep_dev_ptr_peer_t part = {
      .hdr = {MEP_DEV_PTR, MEP_DEV_PTR_VERSION, sizeof part},
      .device = -1,
      .flags = 0,
  };
  if (fault == F_DESCSIZE) part.hdr.size += 8;
  return put_part(&part, sizeof part, desc, len);
}

static int f_device_region(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void *desc,
                           size_t *len) {
  (void)ep;
  uint64_t n;
  if (!desc_fault() || !imported_len(rmr, &n)) {
    env_of_fault->set_error("fault: no device region part for this region");
    return MEP_ERR_INVALID;
  }
  mep_dev_ptr_region_t part = {
      .hdr = {MEP_DEV_PTR, MEP_DEV_PTR_VERSION, sizeof part},
      .base = (uint64_t)(uintptr_t)rmr,
      .len = n,
  };
  return put_part(&part, sizeof part, desc, len);
}

static int f_close(mep_tp_ep_t *ep) {
  if (fault == F_LATEFAIL)
    owe_status(MEP_TP_TOKEN_NONE, MEP_ERR_PEER_FAILED, 1 - my_rank);
  return inner->close(ep);
}

/* What the wrapper owes a context dies with it. */
static int f_fini(mep_tp_ctx_t *ctx) {
  pthread_mutex_lock(&lock);
  n_owed = 0;
  pthread_mutex_unlock(&lock);
  if (ctx == connected_ctx) connected_ctx = NULL;
  return inner->fini(ctx);
}

MEP_API const mep_transport_t mep_transport_plugin_v1 = {
    .abi_major = MEP_TRANSPORT_ABI_MAJOR,
    .abi_minor = MEP_TRANSPORT_ABI_MINOR,
    .struct_size = sizeof(mep_transport_t),
    .name = "fault",
    .version = "test",
    .init = f_init,
    .props = f_props,
    .address = f_address,
    .reachable = f_reachable,
    .connect = f_connect,
    .reg = f_reg,
    .dereg = f_dereg,
    .import = f_import,
    .unimport = f_unimport,
    .write = f_write,
    .signal = f_signal,
    .poll = f_poll,
    .device_descriptor = f_device_descriptor,
    .close = f_close,
    .fini = f_fini,
    .device_region = f_device_region,
};
