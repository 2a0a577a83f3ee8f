/* sess.c - a checked plugin context of one rank, and its completions. */
#include "sess.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "link.h"

#define PC_POLL_MAX 64

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (!q) pc_fail("out of memory (%zu bytes)", n);
  return q;
}

static void progress_cb(void *arg) { pc_progress(arg); }

void pc_sess_init(pc_sess_t *s, pc_worker_t *w) {
  memset(s, 0, sizeof *s);
  s->w = w;
  s->tp = w->tp;
  s->peer = 1 - w->rank;
  s->next_token = 1;
  int rc = mep_plugin_env_open(&s->env, w->cfg, w->plugin);
  if (rc != 0)
    pc_fail("mep_plugin_env_open for section [%s]: %s", s->tp->name,
            pc_err(rc));
  s->env_ok = 1;
  s->env.rank = w->rank;
  s->env.size = 2;
  s->env.secret = w->secret;
  s->env.secret_len = w->secret_len;
  s->env.timeout_ms = w->opts->timeout_ms;

  pc_call_begin("init");
  rc = s->tp->init(&s->env, &s->ctx);
  pc_call_end();
  if (rc == MEP_ERR_UNAVAILABLE)
    pc_skip("init: the transport is unavailable here: %s", pc_err(rc));
  if (rc != 0) pc_fail("init failed: %s", pc_err(rc));

  s->props.struct_size = sizeof s->props;
  pc_call_begin("props");
  rc = s->tp->props(s->ctx, &s->props);
  pc_call_end();
  if (rc != 0) pc_fail("props failed: %s", pc_err(rc));
  /* A check that registers nothing runs whatever memory there is. */
  s->mem = pc_mem_pick(w->opts->memory, s->props.mem_kinds);
  if (w->registers) pc_mem_require(s->mem, s->props.mem_kinds);
}

int pc_sess_maps_peer(const pc_sess_t *s) {
  return s->props.dev_kind == MEP_DEV_PTR;
}

int pc_sess_never_route(const pc_sess_t *s) {
  return !(s->props.mem_kinds & MEP_TP_MEM_HOST);
}

/* The address blob, checked for size and for writes past the room given. */
void pc_sess_address(pc_sess_t *s) {
  unsigned char buf[MEP_TP_MAX_ADDR + 64];
  memset(buf, PC_CANARY, sizeof buf);
  size_t len = MEP_TP_MAX_ADDR;
  pc_call_begin("address");
  int rc = s->tp->address(s->ctx, buf, &len);
  pc_call_end();
  if (rc != 0) pc_fail("address failed: %s", pc_err(rc));
  if (len > MEP_TP_MAX_ADDR)
    pc_fail("address returned a blob of %zu bytes, more than "
            "MEP_TP_MAX_ADDR (%d)",
            len, MEP_TP_MAX_ADDR);
  for (size_t i = MEP_TP_MAX_ADDR; i < sizeof buf; i++)
    if (buf[i] != PC_CANARY)
      pc_fail("address wrote past the %d bytes it was given (byte %zu)",
              MEP_TP_MAX_ADDR, i);
  memcpy(s->addr, buf, len);
  s->addr_len = len;
}

void pc_sess_reachable(pc_sess_t *s) {
  char why[256];
  memset(why, 0, sizeof why);
  pc_call_begin("reachable");
  int r = s->tp->reachable(s->ctx, s->peer, s->peer_addr, s->peer_addr_len,
                           why, sizeof why);
  pc_call_end();
  if (r < 0) pc_fail("reachable failed on the peer's blob: %s", pc_err(r));
  if (r > 1) pc_fail("reachable returned %d; want 0 or 1", r);
  why[sizeof why - 1] = '\0';
  pc_link_send_u64(PC_TAG_ANSWER, (uint64_t)r);
  uint64_t theirs = pc_link_recv_u64(PC_TAG_ANSWER, "the reachable answer");
  if (theirs != (uint64_t)r)
    pc_fail("reachable disagrees: rank %d says %d for rank %d%s%s, rank %d "
            "says %d",
            s->w->rank, r, s->peer, r ? "" : ": ", r ? "" : why, s->peer,
            (int)theirs);
  if (r == 0)
    pc_skip("rank %d cannot reach rank %d here (both agree): %s",
            s->w->rank, s->peer, why[0] ? why : "no reason given");
}

void pc_sess_exchange(pc_sess_t *s) {
  pc_link_send(PC_TAG_ADDR, s->addr, s->addr_len);
  s->peer_addr_len = pc_link_recv(PC_TAG_ADDR, s->peer_addr,
                                  sizeof s->peer_addr, "the address blob");
}

void pc_sess_connect(pc_sess_t *s) {
  pc_sess_address(s);
  pc_sess_exchange(s);
  pc_sess_reachable(s);

  int64_t t0 = pc_now_ns();
  pc_call_begin("connect");
  int rc = s->tp->connect(s->ctx, s->peer, s->peer_addr, s->peer_addr_len,
                          &s->ep);
  pc_call_end();
  int64_t ms = (pc_now_ns() - t0) / 1000000;
  if (rc != 0)
    pc_fail("connect to rank %d failed after %lld ms: %s", s->peer,
            (long long)ms, pc_err(rc));
  if (ms > s->w->opts->timeout_ms + 500)
    pc_fail("connect took %lld ms, more than env->timeout_ms (%d ms)",
            (long long)ms, s->w->opts->timeout_ms);
  pc_info("rank %d: connect took %.2f ms", s->w->rank,
          (double)(pc_now_ns() - t0) / 1e6);
  /* Only now: polling before connect could make a plugin accept the
   * peer's connection in poll() instead of in connect(). */
  pc_link_set_progress(progress_cb, s);
}

void pc_sess_open(pc_sess_t *s, pc_worker_t *w) {
  pc_sess_init(s, w);
  pc_sess_connect(s);
  pc_link_barrier(1, "the barrier after connect");
}

static void release(pc_sess_t *s) {
  pc_link_set_progress(NULL, NULL);
  if (s->env_ok) mep_plugin_env_fini(&s->env);
  s->env_ok = 0;
  free(s->inflight);
  free(s->fails);
  s->inflight = NULL;
  s->fails = NULL;
}

void pc_sess_fini(pc_sess_t *s) {
  pc_link_set_progress(NULL, NULL);
  pc_call_begin("fini");
  int rc = s->tp->fini(s->ctx);
  pc_call_end();
  if (rc != 0) pc_fail("fini failed: %s", pc_err(rc));
  release(s);
}

static void close_ep(pc_sess_t *s, const char *which) {
  pc_call_begin("close");
  int rc = s->tp->close(s->ep);
  pc_call_end();
  if (rc != 0) pc_fail("%s close of the endpoint failed: %s", which,
                       pc_err(rc));
}

void pc_sess_close_alone(pc_sess_t *s, int twice) {
  pc_link_set_progress(NULL, NULL);
  close_ep(s, "the");
  if (twice) close_ep(s, "a second (the contract says idempotent)");
  pc_sess_fini(s);
}

void pc_sess_close(pc_sess_t *s) {
  pc_link_barrier(1, "the end of the check");
  pc_link_barrier(0, "the barrier before close");
  pc_sess_close_alone(s, 0);
}

/* ------------------------------------------------------------ completions */

static void push_fail(pc_sess_t *s, const mep_tp_completion_t *c) {
  if (s->n_fails == s->cap_fails) {
    s->cap_fails = s->cap_fails ? 2 * s->cap_fails : 16;
    s->fails = xrealloc(s->fails, s->cap_fails * sizeof *s->fails);
  }
  s->fails[s->n_fails++] = (pc_compl_t){c->token, c->status, c->peer};
}

static size_t find_inflight(const pc_sess_t *s, uint64_t token) {
  for (size_t i = 0; i < s->n_inflight; i++)
    if (s->inflight[i] == token) return i;
  return (size_t)-1;
}

int pc_inflight_has(const pc_sess_t *s, uint64_t token) {
  return find_inflight(s, token) != (size_t)-1;
}

static void account(pc_sess_t *s, const mep_tp_completion_t *c) {
  unsigned long long tok = (unsigned long long)c->token;
  if (c->status > 0)
    pc_fail("poll reported token 0x%llx with a positive status %d", tok,
            c->status);
  if (c->peer != s->peer)
    pc_fail("poll reported a completion (token 0x%llx, status %s) naming "
            "peer %d; the only peer is %d",
            tok, mep_strerror(c->status), c->peer, s->peer);
  if (c->token == MEP_TP_TOKEN_NONE) {
    if (c->status == 0)
      pc_fail("poll reported a completion with token MEP_TP_TOKEN_NONE and "
              "status 0; such a completion must report a failure");
    if (!s->allow_failures)
      pc_fail("poll reported a failure of peer %d: %s", c->peer,
              mep_strerror(c->status));
    push_fail(s, c);
    return;
  }
  size_t i = find_inflight(s, c->token);
  if (i == (size_t)-1)
    pc_fail("poll reported token 0x%llx, which is not in flight (never "
            "accepted, or reported before)",
            tok);
  s->inflight[i] = s->inflight[--s->n_inflight];
  if (c->status == 0) {
    s->n_completed++;
    return;
  }
  if (!s->allow_failures)
    pc_fail("the write with token 0x%llx failed: %s (peer %d)", tok,
            mep_strerror(c->status), c->peer);
  push_fail(s, c);
}

int pc_progress_max(pc_sess_t *s, int max) {
  mep_tp_completion_t c[PC_POLL_MAX + 1];
  if (max < 1 || max > PC_POLL_MAX) max = PC_POLL_MAX;
  /* A guard entry after the room given catches a poll that writes more. */
  unsigned char guard[sizeof c[0]];
  memset(&c[max], PC_CANARY, sizeof c[max]);
  memcpy(guard, &c[max], sizeof guard);
  pc_call_begin("poll");
  int n = s->tp->poll(s->ctx, c, max);
  pc_call_end();
  if (n < 0) pc_fail("poll failed: %s", pc_err(n));
  if (n > max) pc_fail("poll returned %d completions for room of %d", n, max);
  if (memcmp(guard, &c[max], sizeof guard) != 0)
    pc_fail("poll wrote past the %d completions it was given room for", max);
  for (int i = 0; i < n; i++) account(s, &c[i]);
  return n;
}

int pc_progress(pc_sess_t *s) { return pc_progress_max(s, PC_POLL_MAX); }

void pc_relax(const pc_sess_t *s, int progressed) {
  if (!s->spin && !progressed) sched_yield();
}

/* ------------------------------------------------------- writes, signals */

int pc_try_write(pc_sess_t *s, const pc_region_t *src, uint64_t loff,
                 const pc_remote_t *dst, uint64_t roff, uint64_t len,
                 uint64_t token) {
  if (pc_inflight_has(s, token))
    pc_fail("internal: token 0x%llx reused while in flight",
            (unsigned long long)token);
  pc_call_begin("write");
  int rc = s->tp->write(s->ep, src->mr, loff, dst->rmr, roff, len, token);
  pc_call_end();
  if (rc != 0) return rc;
  if (s->n_inflight == s->cap_inflight) {
    s->cap_inflight = s->cap_inflight ? 2 * s->cap_inflight : 64;
    s->inflight = xrealloc(s->inflight, s->cap_inflight * sizeof(uint64_t));
  }
  s->inflight[s->n_inflight++] = token;
  return 0;
}

uint64_t pc_write(pc_sess_t *s, const pc_region_t *src, uint64_t loff,
                  const pc_remote_t *dst, uint64_t roff, uint64_t len) {
  uint64_t token = s->next_token++;
  int rc = pc_try_write(s, src, loff, dst, roff, len, token);
  if (rc != 0)
    pc_fail("write of %llu bytes from local offset %llu to remote offset "
            "%llu failed: %s",
            (unsigned long long)len, (unsigned long long)loff,
            (unsigned long long)roff, pc_err(rc));
  return token;
}

int pc_try_signal(pc_sess_t *s, const pc_remote_t *dst, uint64_t roff,
                  uint64_t value, mep_signal_op_t op) {
  pc_call_begin("signal");
  int rc = s->tp->signal(s->ep, dst->rmr, roff, value, op);
  pc_call_end();
  return rc;
}

void pc_signal(pc_sess_t *s, const pc_remote_t *dst, uint64_t roff,
               uint64_t value, mep_signal_op_t op) {
  int rc = pc_try_signal(s, dst, roff, value, op);
  if (rc != 0)
    pc_fail("signal %s %llu at remote offset %llu failed: %s",
            op == MEP_SIGNAL_ADD ? "ADD" : "SET", (unsigned long long)value,
            (unsigned long long)roff, pc_err(rc));
}

/* ------------------------------------------------------------------ waits */

/* Turns of a wait loop between two reads of the clock (each turn polls,
 * which never blocks: the watchdog sees to it). */
#define PC_CLOCK_TURNS 64

uint64_t pc_wait_word(pc_sess_t *s, const pc_region_t *r, size_t off,
                      uint64_t target, const char *what) {
  int64_t deadline = pc_now_ms() + s->w->opts->timeout_ms;
  /* Host memory is read in place (pc_word checks the bounds once): a
   * turn makes no call but poll(), as in a ping-pong each costs. */
  uint64_t v = pc_word(r, off);
  const uint64_t *host =
      r->mem == PC_MEM_HOST
          ? (const uint64_t *)(const void *)((const unsigned char *)r->ptr +
                                             off)
          : NULL;
  /* the clock is read every PC_CLOCK_TURNS turns: in a ping-pong a read
   * per turn would delay seeing the word (slow clocks in emulated guests) */
  for (unsigned turn = 1; v < target; turn++) {
    int n = pc_progress(s);
    if (turn % PC_CLOCK_TURNS == 0 && pc_now_ms() > deadline)
      pc_fail("timed out after %d ms waiting for %s (the signal word reads "
              "%llu, want %llu)",
              s->w->opts->timeout_ms, what, (unsigned long long)v,
              (unsigned long long)target);
    pc_relax(s, n);
    v = host ? __atomic_load_n(host, __ATOMIC_ACQUIRE) : pc_word(r, off);
  }
  return v;
}

void pc_wait_inflight_below(pc_sess_t *s, size_t n, const char *what) {
  int64_t last = pc_now_ms();
  size_t before = s->n_inflight;
  while (s->n_inflight >= n && s->n_inflight > 0) {
    int got = pc_progress(s);
    if (s->n_inflight < before) {
      before = s->n_inflight;
      last = pc_now_ms();
    }
    if (pc_now_ms() - last > s->w->opts->timeout_ms)
      pc_fail("timed out after %d ms waiting for the completion of %s (%zu "
              "writes still unreported, e.g. token 0x%llx)",
              s->w->opts->timeout_ms, what, s->n_inflight,
              (unsigned long long)s->inflight[0]);
    pc_relax(s, got);
  }
}

void pc_wait_all(pc_sess_t *s, const char *what) {
  pc_wait_inflight_below(s, 0, what);
}
