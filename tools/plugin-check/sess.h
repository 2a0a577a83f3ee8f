/* sess.h - one plugin context of a check's rank, connected to the other
 * rank: every call into the plugin goes through here, so that each is
 * watched by the watchdog and each result is checked against the contract
 * of transport.h, and every completion poll() reports is accounted for. */
#ifndef PC_SESS_H
#define PC_SESS_H

#include <stddef.h>
#include <stdint.h>

#include "mem.h"
#include "worker.h"

/* Poison for bytes a plugin must not write. */
#define PC_CANARY 0xa5

typedef struct pc_compl {
  uint64_t token;
  int status;
  int peer;
} pc_compl_t;

typedef struct pc_sess {
  pc_worker_t *w;
  const mep_transport_t *tp;
  mep_tp_env_t env;
  int env_ok;
  mep_tp_ctx_t *ctx;
  mep_tp_ep_t *ep;
  int peer;
  mep_tp_props_t props;
  unsigned char addr[MEP_TP_MAX_ADDR];
  size_t addr_len;
  unsigned char peer_addr[MEP_TP_MAX_ADDR];
  size_t peer_addr_len;
  /* Tokens of accepted writes not yet reported by poll(). */
  uint64_t *inflight;
  size_t n_inflight, cap_inflight;
  /* Failed completions, kept only while allow_failures is set (otherwise a
   * failure ends the check). */
  pc_compl_t *fails;
  size_t n_fails, cap_fails;
  int allow_failures;
  uint64_t n_completed; /* successful token completions so far */
  uint64_t next_token;
  int spin;     /* bench: never yield the CPU while waiting */
  pc_mem_t mem; /* what its regions are made of (pc_mem_pick) */
} pc_sess_t;

/* A local registration. Its bytes are host or CUDA memory: the checks
 * reach them through pc_region_fill/expect/read, never through ptr. */
typedef struct pc_region {
  pc_mem_t mem;
  void *ptr;
  size_t len;
  mep_tp_mr_t *mr;
  unsigned char rkey[MEP_TP_MAX_RKEY];
  size_t rkey_len;
} pc_region_t;

/* The peer's region, imported. */
typedef struct pc_remote {
  mep_tp_rmr_t *rmr;
  uint64_t len;
} pc_remote_t;

/* init + props only (no peer), and the memory its regions will be made
 * of. SKIPs the check when init says MEP_ERR_UNAVAILABLE. */
void pc_sess_init(pc_sess_t *s, pc_worker_t *w);
/* The steps of pc_sess_connect: the own address blob (size and overrun
 * checked), the exchange of blobs with the peer, and reachable on both
 * sides (the same answer, or the check is SKIPped when both say no). */
void pc_sess_address(pc_sess_t *s);
void pc_sess_exchange(pc_sess_t *s);
void pc_sess_reachable(pc_sess_t *s);
/* address, exchange, reachable, connect. */
void pc_sess_connect(pc_sess_t *s);
/* pc_sess_init + pc_sess_connect, then a barrier. */
void pc_sess_open(pc_sess_t *s, pc_worker_t *w);
/* What the plugin's props make of some checks. */
/* 1 when it maps the peer's memory into this process (MEP_DEV_PTR): the
 * owner of a region cannot take such a mapping back, so a write through
 * it lands, in place, until the importer unimports. */
int pc_sess_maps_peer(const pc_sess_t *s);
/* 1 when it carries no host memory: the core never makes it a peer's
 * route (its own traffic is host memory) and learns of a dead peer from
 * the route's transport, not from this one. */
int pc_sess_never_route(const pc_sess_t *s);

/* Barriers (one polling, one not), close, fini; every return checked. */
void pc_sess_close(pc_sess_t *s);
/* close (twice when twice != 0) and fini without talking to the peer. */
void pc_sess_close_alone(pc_sess_t *s, int twice);
/* fini only, for a context that never connected. */
void pc_sess_fini(pc_sess_t *s);

/* One poll() of at most max completions (1..64); returns how many. */
int pc_progress_max(pc_sess_t *s, int max);
int pc_progress(pc_sess_t *s);

/* Registers len zeroed bytes of the session's memory (SKIPs the check
 * when that memory cannot be had here, see pc_mem_require). */
void pc_region_reg(pc_sess_t *s, pc_region_t *r, size_t len);
/* dereg, then pc_region_free. */
void pc_region_dereg(pc_sess_t *s, pc_region_t *r);
/* Frees the memory of a region (already deregistered, or never was). */
void pc_region_free(pc_region_t *r);

/* The bytes [off, off+len) of a region: pc_fill and pc_expect
 * (pattern.h) on them, and a copy of them to host memory. */
void pc_region_fill(const pc_region_t *r, size_t off, size_t len,
                    uint64_t seed, uint64_t start);
void pc_region_expect(const pc_region_t *r, size_t off, size_t len,
                      uint64_t seed, uint64_t start, const char *what);
void pc_region_read(const pc_region_t *r, size_t off, void *dst,
                    size_t len);
unsigned char pc_region_byte(const pc_region_t *r, size_t off);
/* Sends the rkey and length to the peer / receives and imports one. */
void pc_region_send(const pc_region_t *r);
void pc_region_import(pc_sess_t *s, pc_remote_t *rm);
/* Both at once, for symmetric checks. */
void pc_region_share(pc_sess_t *s, const pc_region_t *mine,
                     pc_remote_t *theirs);
void pc_remote_release(pc_sess_t *s, pc_remote_t *rm);

/* Raw calls: return the plugin's code; a write accepted (0) goes in
 * flight with its token. */
int pc_try_write(pc_sess_t *s, const pc_region_t *src, uint64_t loff,
                 const pc_remote_t *dst, uint64_t roff, uint64_t len,
                 uint64_t token);
int pc_try_signal(pc_sess_t *s, const pc_remote_t *dst, uint64_t roff,
                  uint64_t value, mep_signal_op_t op);
/* Same, failing the check unless the call returns 0; pc_write takes the
 * next token and returns it. */
uint64_t pc_write(pc_sess_t *s, const pc_region_t *src, uint64_t loff,
                  const pc_remote_t *dst, uint64_t roff, uint64_t len);
void pc_signal(pc_sess_t *s, const pc_remote_t *dst, uint64_t roff,
               uint64_t value, mep_signal_op_t op);

/* The 8-byte word at off of a local region, read with acquire ordering. */
uint64_t pc_word(const pc_region_t *r, size_t off);
/* Polls until the word reaches at least `target`, or fails the check
 * after timeout_ms naming `what`. Returns the word's value. */
uint64_t pc_wait_word(pc_sess_t *s, const pc_region_t *r, size_t off,
                      uint64_t target, const char *what);
/* Polls until fewer than `n` writes are in flight (0: all reported). */
void pc_wait_inflight_below(pc_sess_t *s, size_t n, const char *what);
void pc_wait_all(pc_sess_t *s, const char *what);
/* Between two polls of a waiting loop: lets the other processes run. */
void pc_relax(const pc_sess_t *s, int progressed);

/* 1 if `token` is still in flight. */
int pc_inflight_has(const pc_sess_t *s, uint64_t token);

#endif
