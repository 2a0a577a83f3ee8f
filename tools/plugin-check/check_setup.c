/* check_setup.c - the checks before any data moves: abi, init-fini,
 * address, reachable, connect. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "link.h"
#include "sess.h"

/* ---------------------------------------------------------------- abi */

static void check_vtable(const pc_worker_t *w) {
  const mep_transport_t *tp = w->tp;
  /* The fields of ABI 1.0, whatever later minors append. */
  size_t v1 = offsetof(mep_transport_t, fini) + sizeof tp->fini;
  if (tp->abi_major != MEP_TRANSPORT_ABI_MAJOR)
    pc_fail("abi_major is %u, this mep speaks %d", tp->abi_major,
            MEP_TRANSPORT_ABI_MAJOR);
  if (tp->struct_size < v1)
    pc_fail("struct_size is %u, which does not cover the ABI 1.0 fields "
            "(%zu bytes)",
            tp->struct_size, v1);
  if (!tp->name || !tp->name[0]) pc_fail("the plugin's name is empty");
  for (const char *c = tp->name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
          *c == '_' || *c == '-' || (*c >= 'A' && *c <= 'Z')))
      pc_fail("the plugin's name \"%s\" has a character other than letters, "
              "digits, '-' and '_' (it names a file and a config section)",
              tp->name);
  if (!tp->version) pc_fail("version is NULL; give at least \"\"");

  const char *base = strrchr(w->plugin_path, '/');
  base = base ? base + 1 : w->plugin_path;
  char want[PATH_MAX];
  snprintf(want, sizeof want, "libmep-transport-%s.so", tp->name);
  if (strcmp(base, want) != 0)
    pc_fail("the plugin is named \"%s\" but its file is %s; the core finds "
            "it as %s",
            tp->name, base, want);

  const struct {
    const char *name;
    int set;
  } fns[] = {
      {"init", tp->init != NULL},         {"props", tp->props != NULL},
      {"address", tp->address != NULL},   {"reachable", tp->reachable != NULL},
      {"connect", tp->connect != NULL},   {"reg", tp->reg != NULL},
      {"dereg", tp->dereg != NULL},       {"import", tp->import != NULL},
      {"unimport", tp->unimport != NULL}, {"write", tp->write != NULL},
      {"signal", tp->signal != NULL},     {"poll", tp->poll != NULL},
      {"close", tp->close != NULL},       {"fini", tp->fini != NULL},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    if (!fns[i].set)
      pc_fail("the mandatory function %s is NULL", fns[i].name);
}

static int fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* A device kind needs both descriptor parts, in a vtable of ABI 1.3 or
 * later (a 1.3 core reads device_region, not map), and MEP_DEV_MLX5 the
 * local part too (ABI 1.6). With MEP_DEV_NONE the
 * functions are never called, so they may be there: a plugin whose kind
 * depends on the machine keeps them and says NONE where it has none. */
static void check_dev_kind(const mep_transport_t *tp, mep_dev_kind_t kind) {
  if ((int)kind < MEP_DEV_NONE || (int)kind > MEP_DEV_PROXY)
    pc_fail("props: dev_kind is %d, not a mep_dev_kind_t", (int)kind);
  if (kind == MEP_DEV_NONE) return;
  if (!tp->device_descriptor)
    pc_fail("props: dev_kind is %d but device_descriptor is NULL",
            (int)kind);
  if (!MEP_TP_HAS(tp, mep_transport_t, device_region))
    pc_fail("props: dev_kind is %d but the vtable (struct_size %u, ABI "
            "%u.%u) ends before device_region (ABI 1.3): a core of ABI 1.3 "
            "cannot give its kernels the plugin's regions",
            (int)kind, tp->struct_size, tp->abi_major, tp->abi_minor);
  if (!tp->device_region)
    pc_fail("props: dev_kind is %d but device_region is NULL", (int)kind);
  const int has_local = MEP_TP_HAS(tp, mep_transport_t, device_local);
  if (kind == MEP_DEV_MLX5 && (!has_local || !tp->device_local))
    pc_fail("props: dev_kind is MEP_DEV_MLX5 but device_local (ABI 1.6) is "
            "%s: kernels could not name their own memory as a source",
            has_local ? "NULL" : "past the vtable's end");
}

static void check_props(const pc_worker_t *w, mep_tp_ctx_t *ctx) {
  mep_tp_props_t p;
  /* Poisoned, so that a field props() leaves unset shows as insane. */
  memset(&p, 0xa5, sizeof p);
  p.struct_size = sizeof p;
  pc_call_begin("props");
  int rc = w->tp->props(ctx, &p);
  pc_call_end();
  if (rc != 0) pc_fail("props failed: %s", pc_err(rc));
  const uint32_t known = MEP_TP_MEM_HOST | MEP_TP_MEM_CUDA;
  if (p.mem_kinds == 0 || (p.mem_kinds & ~known))
    pc_fail("props: mem_kinds is 0x%x; want a non-empty set of "
            "MEP_TP_MEM_HOST|MEP_TP_MEM_CUDA",
            p.mem_kinds);
  check_dev_kind(w->tp, p.dev_kind);
  if (p.atomics != 0 && p.atomics != 1)
    pc_fail("props: atomics is %d; want 0 or 1", p.atomics);
  if (!isfinite(p.latency_us) || p.latency_us < 0)
    pc_fail("props: latency_us is %g; want a finite value >= 0",
            p.latency_us);
  if (!isfinite(p.bandwidth_gbps) || p.bandwidth_gbps < 0)
    pc_fail("props: bandwidth_gbps is %g; want a finite value >= 0",
            p.bandwidth_gbps);
  if (p.event_fd < -1 || (p.event_fd >= 0 && !fd_open(p.event_fd)))
    pc_fail("props: event_fd is %d, which is neither -1 nor an open file "
            "descriptor",
            p.event_fd);
  pc_info("props: mem_kinds 0x%x, dev_kind %d, atomics %d, max_message "
          "%llu, latency %.2f us, bandwidth %.2f GB/s, event_fd %d",
          p.mem_kinds, (int)p.dev_kind, p.atomics,
          (unsigned long long)p.max_message, p.latency_us, p.bandwidth_gbps,
          p.event_fd);
}

/* A core built against the transport.h of ABI 1.0 to 1.4 passes props
 * that end before reg_by_address: props fills what fits, no more. */
static void check_props_older_core(const pc_worker_t *w, mep_tp_ctx_t *ctx) {
  mep_tp_props_t p;
  const uint32_t size = offsetof(mep_tp_props_t, reg_by_address);
  memset(&p, 0xa5, sizeof p);
  p.struct_size = size;
  pc_call_begin("props");
  int rc = w->tp->props(ctx, &p);
  pc_call_end();
  if (rc != 0)
    pc_fail("props failed for a struct of %u bytes (a core of ABI 1.4): %s",
            size, pc_err(rc));
  for (size_t i = size; i < sizeof p; i++)
    if (((const unsigned char *)&p)[i] != 0xa5)
      pc_fail("props wrote byte %zu of a struct whose struct_size is %u "
              "(a core of ABI 1.4 has nothing there)", i, size);
  if (p.struct_size != size)
    pc_fail("props changed struct_size from %u to %u", size, p.struct_size);
}

/* Called where a plugin reads a field an ABI 1.2 core's env lacks. */
static void past_the_env(void) {
  pc_fail("init called a typed configuration read (ABI 1.3) of an env "
          "whose struct_size (%zu bytes) ends before it: a core of ABI "
          "1.2 has no such function (check with MEP_TP_HAS)",
          offsetof(mep_tp_env_t, cfg_keys));
}
static int past_int(const mep_tp_env_t *e, const char *k, int64_t *v) {
  (void)e, (void)k, (void)v;
  past_the_env();
  return MEP_ERR_INVALID;
}
static int past_range(const mep_tp_env_t *e, const char *k, int64_t *lo,
                      int64_t *hi) {
  (void)e, (void)k, (void)lo, (void)hi;
  past_the_env();
  return MEP_ERR_INVALID;
}
static const char *past_str(const mep_tp_env_t *e, const char *k) {
  (void)e, (void)k;
  past_the_env();
  return NULL;
}

/* set_error of the older core's env: notes that init said why, and
 * passes the message on to libmep's. */
static int said_why;
static void (*core_set_error)(const char *fmt, ...);
static void note_set_error(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  said_why = 1;
  core_set_error("%s", msg);
}

/* init with the env of a core of ABI 1.2, whose struct ends before the
 * typed reads (the fields past it hold functions that fail the check):
 * the plugin works without them (shm parses cfg_get itself), or refuses
 * with MEP_ERR_ABI and says why. */
static void check_init_older_core(const pc_worker_t *w,
                                  const mep_tp_env_t *full) {
  mep_tp_env_t env = *full;
  env.struct_size = offsetof(mep_tp_env_t, cfg_keys);
  env.cfg_keys = NULL;
  env.cfg_nkeys = 0;
  env.cfg_int = past_int;
  env.cfg_range = past_range;
  env.cfg_str = past_str;
  core_set_error = full->set_error;
  env.set_error = note_set_error;
  said_why = 0;
  mep_tp_ctx_t *ctx = NULL;
  pc_call_begin("init");
  int rc = w->tp->init(&env, &ctx);
  pc_call_end();
  if (rc == MEP_ERR_ABI) {
    if (!said_why)
      pc_fail("init refused a core of ABI 1.2 (MEP_ERR_ABI) without a "
              "message (env->set_error)");
    pc_info("init with a core of ABI 1.2: %s", pc_err(rc));
    return;
  }
  if (rc == MEP_ERR_UNAVAILABLE) return; /* as with the full env */
  if (rc != 0)
    pc_fail("init with a core of ABI 1.2 returned %s; want 0 or MEP_ERR_ABI",
            pc_err(rc));
  pc_info("init with a core of ABI 1.2: 0 (the plugin works without the "
          "typed reads)");
  pc_call_begin("fini");
  rc = w->tp->fini(ctx);
  pc_call_end();
  if (rc != 0) pc_fail("fini failed: %s", pc_err(rc));
}

void pc_check_abi(pc_worker_t *w) {
  check_vtable(w);
  mep_tp_env_t env;
  int rc = mep_plugin_env_open(&env, w->cfg, w->plugin);
  if (rc != 0) pc_fail("mep_plugin_env_open: %s", pc_err(rc));
  env.rank = 0;
  env.size = 2;
  env.secret = w->secret;
  env.secret_len = w->secret_len;
  env.timeout_ms = w->opts->timeout_ms;
  mep_tp_ctx_t *ctx = NULL;
  pc_call_begin("init");
  rc = w->tp->init(&env, &ctx);
  pc_call_end();
  if (rc == MEP_ERR_UNAVAILABLE)
    pc_skip("the vtable is well-formed, but init says the transport is "
            "unavailable here, so props cannot be checked: %s",
            pc_err(rc));
  if (rc != 0) pc_fail("init failed: %s", pc_err(rc));
  check_props(w, ctx);
  check_props_older_core(w, ctx);
  pc_call_begin("fini");
  rc = w->tp->fini(ctx);
  pc_call_end();
  if (rc != 0) pc_fail("fini failed: %s", pc_err(rc));
  check_init_older_core(w, &env);
  mep_plugin_env_fini(&env);
}

/* ---------------------------------------------------------- init-fini */

typedef struct fd_list {
  int *fds;
  size_t n;
} fd_list_t;

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static fd_list_t list_fds(void) {
  fd_list_t l = {NULL, 0};
  DIR *d = opendir("/proc/self/fd");
  if (!d) pc_skip("cannot read /proc/self/fd to count file descriptors");
  size_t cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = atoi(e->d_name);
    if (fd == dirfd(d)) continue;
    if (l.n == cap) {
      cap = cap ? 2 * cap : 64;
      int *p = realloc(l.fds, cap * sizeof *p);
      if (!p) pc_fail("out of memory listing fds");
      l.fds = p;
    }
    l.fds[l.n++] = fd;
  }
  closedir(d);
  qsort(l.fds, l.n, sizeof *l.fds, cmp_int);
  return l;
}

/* Fails naming every fd that `after` has and `before` lacks. */
static void expect_no_new_fds(const fd_list_t *before, const fd_list_t *after,
                              const char *what) {
  char msg[1024] = "";
  size_t len = 0, leaked = 0;
  for (size_t i = 0; i < after->n; i++) {
    if (bsearch(&after->fds[i], before->fds, before->n, sizeof(int),
                cmp_int))
      continue;
    leaked++;
    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", after->fds[i]);
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    if (len < sizeof msg - 1)
      len += (size_t)snprintf(msg + len, sizeof msg - len, "%sfd %d -> %s",
                              leaked > 1 ? ", " : "", after->fds[i],
                              n > 0 ? target : "?");
  }
  if (leaked)
    pc_fail("%s leaked %zu file descriptor%s (%zu open before, %zu after): "
            "%s",
            what, leaked, leaked > 1 ? "s" : "", before->n, after->n, msg);
  if (after->n != before->n)
    pc_fail("%s changed the number of open file descriptors from %zu to %zu",
            what, before->n, after->n);
}

#define PC_INIT_CYCLES 20
#define PC_CONNECT_CYCLES 3

void pc_check_init_fini(pc_worker_t *w) {
  pc_sess_t s;
  /* A first cycle may open what a library keeps for the process. */
  pc_sess_init(&s, w);
  pc_sess_address(&s);
  pc_sess_fini(&s);
  fd_list_t before = list_fds();
  for (int i = 0; i < PC_INIT_CYCLES; i++) {
    pc_sess_init(&s, w);
    pc_sess_address(&s);
    pc_sess_fini(&s);
  }
  fd_list_t after = list_fds();
  expect_no_new_fds(&before, &after, "20 init/address/fini cycles");
  free(after.fds);
  free(before.fds);

  /* Connected contexts, each endpoint closed twice (close is idempotent). */
  pc_link_barrier(0, "the start of the connect cycles");
  pc_sess_open(&s, w);
  pc_link_barrier(0, "the barrier before close");
  pc_sess_close_alone(&s, 1);
  before = list_fds();
  for (int i = 0; i < PC_CONNECT_CYCLES; i++) {
    pc_link_barrier(0, "the start of a connect cycle");
    pc_sess_open(&s, w);
    pc_link_barrier(0, "the barrier before close");
    pc_sess_close_alone(&s, 1);
  }
  after = list_fds();
  expect_no_new_fds(&before, &after,
                    "3 init/connect/close/close/fini cycles");
  free(after.fds);
  free(before.fds);
}

/* ------------------------------------------------------------ address */

void pc_check_address(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_init(&s, w);
  pc_sess_address(&s);
  unsigned char again[MEP_TP_MAX_ADDR];
  size_t len = sizeof again;
  pc_call_begin("address");
  int rc = w->tp->address(s.ctx, again, &len);
  pc_call_end();
  if (rc != 0) pc_fail("a second address call failed: %s", pc_err(rc));
  if (len != s.addr_len || memcmp(again, s.addr, len) != 0)
    pc_fail("a second address call returned another blob (%zu bytes, first "
            "%zu): peers would see different addresses",
            len, s.addr_len);

  /* Too little room: the contract allows at most *len bytes. */
  if (s.addr_len > 0) {
    unsigned char small[MEP_TP_MAX_ADDR + 64];
    memset(small, 0xa5, sizeof small);
    size_t room = s.addr_len - 1;
    pc_call_begin("address");
    rc = w->tp->address(s.ctx, small, &room);
    pc_call_end();
    for (size_t i = s.addr_len - 1; i < sizeof small; i++)
      if (small[i] != 0xa5)
        pc_fail("address wrote byte %zu of a buffer of %zu bytes (its blob "
                "is %zu bytes)",
                i, s.addr_len - 1, s.addr_len);
    if (rc == 0 && room > s.addr_len - 1)
      pc_fail("address returned 0 and a length of %zu for a buffer of %zu "
              "bytes",
              room, s.addr_len - 1);
    pc_info("rank %d: address with room for %zu of %zu bytes returned %s",
            w->rank, s.addr_len - 1, s.addr_len, mep_strerror(rc));
  }
  pc_sess_exchange(&s);
  pc_info("rank %d: address blob of %zu bytes, the peer's %zu", w->rank,
          s.addr_len, s.peer_addr_len);
  pc_link_barrier(0, "the end of the check");
  pc_sess_fini(&s);
}

/* ---------------------------------------------------------- reachable */

void pc_check_reachable(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_init(&s, w);
  pc_sess_address(&s);
  pc_sess_exchange(&s);
  pc_sess_reachable(&s); /* agrees with the peer, else FAIL or SKIP */

  /* Asked again, with a tiny why buffer: same answer, no overrun. */
  char why[4 + 64];
  memset(why, 0x5a, sizeof why);
  pc_call_begin("reachable");
  int r = w->tp->reachable(s.ctx, s.peer, s.peer_addr, s.peer_addr_len, why,
                           4);
  pc_call_end();
  if (r != 1)
    pc_fail("reachable answered 1 and then %d for the same blob", r);
  for (size_t i = 4; i < sizeof why; i++)
    if (why[i] != 0x5a)
      pc_fail("reachable wrote past the 4 bytes of why it was given");
  pc_link_barrier(0, "the end of the check");
  pc_sess_fini(&s);
}

/* ------------------------------------------------------------ connect */

void pc_check_connect(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  pc_sess_close(&s);
}
