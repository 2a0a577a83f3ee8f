/* worker.h - one rank of a check, in its own process: how it reports its
 * result to the supervising process and the watchdogs that turn a plugin
 * call that never returns into a FAIL instead of a hang. */
#ifndef PC_WORKER_H
#define PC_WORKER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mep/transport.h"

/* --memory: what the regions of the suite are made of. */
typedef enum pc_memory_opt {
  PC_MEMORY_AUTO, /* host memory where the plugin carries it, else CUDA */
  PC_MEMORY_HOST,
  PC_MEMORY_CUDA,
} pc_memory_opt_t;

typedef struct pc_opts {
  int timeout_ms; /* every wait's deadline, and env->timeout_ms */
  int quick;      /* cap transfer sizes at PC_QUICK_CAP */
  int verbose;
  pc_memory_opt_t memory;
  int iters;    /* bench: latency round trips */
  int iters_bw; /* bench: 64 MiB writes per bandwidth point */
  int sweep;    /* bench: bandwidth from 4 KiB to 64 MiB */
  uint64_t seed;
} pc_opts_t;

#define PC_QUICK_CAP ((uint64_t)4 << 20)
#define PC_BIG ((uint64_t)64 << 20)

/* Shared with the supervisor through an anonymous shared mapping, so that
 * after a crash it can say which plugin call the rank was in. */
typedef struct pc_shared_rank {
  char call[48];
} pc_shared_rank_t;

typedef struct pc_worker {
  int rank;
  int nranks;    /* 1 for checks that need no peer process */
  int link_fd;   /* socketpair to the other rank; -1 without one */
  int result_fd; /* pipe to the supervisor */
  const pc_opts_t *opts;
  const mep_transport_t *tp;
  const mep_plugin_t *plugin;
  const char *plugin_path;
  const mep_config_t *cfg;
  const uint8_t *secret;
  size_t secret_len;
  uint64_t seed; /* the check's seed, the same in both ranks */
  const char *check;
  /* The check registers memory: a session learns before it connects
   * whether that memory can be had, so that both ranks skip alike rather
   * than one seeing the other leave mid-check. */
  int registers;
  pc_shared_rank_t *shared;
} pc_worker_t;

/* Starts the watchdogs (a thread that watches plugin calls, and alarm()
 * for the whole check after budget_ms) and makes `w` the process's
 * worker. */
void pc_worker_start(pc_worker_t *w, int budget_ms);
/* Stops the watchdog thread; call before a normal exit. */
void pc_worker_stop(void);

pc_worker_t *pc_self(void);

/* Result records, one line each, sent to the supervisor. pc_fail and
 * pc_skip end the process at once: a worker is disposable and the
 * supervisor reaps it. pc_peer_gone is a failure that only follows from
 * the other rank's (reported separately), so the supervisor ranks it
 * below that one. */
void pc_pass(void);
_Noreturn void pc_fail(const char *fmt, ...) MEP_PRINTF(1, 2);
_Noreturn void pc_skip(const char *fmt, ...) MEP_PRINTF(1, 2);
_Noreturn void pc_peer_gone(const char *fmt, ...) MEP_PRINTF(1, 2);
/* A detail line, shown with -v. */
void pc_info(const char *fmt, ...) MEP_PRINTF(1, 2);
/* A line of the benchmark table, printed by the supervisor as is. */
void pc_bench_line(const char *fmt, ...) MEP_PRINTF(1, 2);

/* Marks the start and end of a plugin call for the watchdog, and names
 * it in the shared page for the post-mortem. `name` is a string that
 * never changes (a literal). Cheap, because the benchmark's ping-pong
 * makes three calls per message and polls in a loop: inline, the name
 * copied only when it changes (its first byte put back otherwise), and
 * the count advanced by plain stores, as the one thread that calls the
 * plugin is its only writer (no locked instruction; under emulation, in
 * the Soft-RoCE VM, each call, return and atomic costs tens of ns). The
 * name is stored before the count (both release), so a watchdog that
 * reads the same odd count around its read of the name read that call's
 * name. */
extern atomic_ullong pc__call_seq;
extern const char *_Atomic pc__call_name;
extern const char *pc__call_copied; /* the name in the shared page */
extern pc_worker_t *pc__self; /* pc_self() */
void pc__call_name_copy(const char *name);

static inline void pc__call_step(void) {
  unsigned long long seq =
      atomic_load_explicit(&pc__call_seq, memory_order_relaxed);
  atomic_store_explicit(&pc__call_seq, seq + 1, memory_order_release);
}

static inline void pc_call_begin(const char *name) {
  atomic_store_explicit(&pc__call_name, name, memory_order_release);
  pc__call_step();
  pc_worker_t *w = pc__self;
  if (!w || !w->shared) return;
  if (name == pc__call_copied)
    w->shared->call[0] = name[0];
  else
    pc__call_name_copy(name);
}

static inline void pc_call_end(void) {
  pc__call_step();
  pc_worker_t *w = pc__self;
  if (w && w->shared) w->shared->call[0] = '\0';
}

/* Monotonic clock. */
int64_t pc_now_ns(void);
int64_t pc_now_ms(void);

/* mep_strerror(code) and the thread's mep_last_error(), as one string in
 * static storage: "MEP_ERR_BOUNDS: ... (tcp: write ... out of bounds)". */
const char *pc_err(int code);

#endif
