/* devwin_proxy.c - the device window's proxy thread (devwin.h).
 *
 * Ordering: a kernel writes a slot's fields, fences (system scope) and
 * then stores seq with release semantics; the thread loads seq with
 * acquire semantics before it reads the fields, so it sees the fields of
 * that command and, for a PUT, the bytes the kernel staged before it.
 * *done is stored with release after the command was handed to mep, so a
 * kernel that sees it may reuse the slot.
 *
 * A slot a kernel reserved but never wrote (it gave up on a full ring at
 * its deadline) would stop the ring for good. The thread skips such a
 * hole, and reports it, once later slots are ready and the hole stayed
 * empty for the communicator's timeout.
 *
 * Merging: the ready PUTs that follow each other in the ring (up to the
 * next command of another kind) are taken together, sorted by peer and
 * destination, and those whose bytes continue one another in both the
 * stage and the window go as one mep_put. Kernels put a row in pieces
 * from several warps, in whatever order the warps reserve their slots;
 * a transport pays per message (tcp: a header and a system call), so a
 * row then crosses as one message, not one per piece. Puts carry no
 * order among themselves (a signal orders the puts before it, and a
 * batch never passes a signal), so sorting them changes nothing a
 * receiver may rely on. */
#include "devwin.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "error.h"
#include "log.h"

/* PUTs taken together at most (merging, above). */
#define PROXY_BATCH 512

typedef struct proxy_put {
  int32_t peer;
  uint64_t src, dst, len;
  uint64_t first, last; /* the ring positions it carries out */
} proxy_put_t;

struct mep__proxy {
  mep_comm_t *comm;
  mep_region_t *region;
  uint64_t bytes;                   /* of the region, the same everywhere */
  volatile mep_dev_cmd_t *ring;
  uint32_t len;
  volatile uint64_t *done;
  volatile uint32_t *failed;
  uint64_t pos;                     /* the next slot to take */
  uint64_t unflushed;               /* puts since the last flush */
  proxy_put_t *batch;               /* [PROXY_BATCH] */
  _Atomic uint64_t puts, merged;    /* PUTs carried out; of them, merged
                                     * into an earlier one's mep_put */
  pthread_t thread;
  _Atomic int stop;
  _Atomic uint64_t target;
  uint8_t *told;                    /* [size]: a failure to it was logged */
  int told_bad;                     /* a bad command was logged */
  pthread_mutex_t mu;               /* err, msg */
  int err;
  char msg[512];
};

/* Idle rounds: spin, then yield, then sleep in short steps (at most
 * 50 us, so a command after a pause waits little), so many ranks on few
 * cores leave each other the CPU. */
static void idle(unsigned *rounds) {
  unsigned r = (*rounds)++;
  if (r < 256) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (r < 512) {
    sched_yield();
  } else {
    struct timespec ts = {0, r < 1024 ? 5000 : r < 2048 ? 20000 : 50000};
    nanosleep(&ts, NULL);
  }
}

static int in_bounds(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}

/* Records the first error (for mep__proxy_error and the kernels' flag)
 * and logs once per peer (peer >= 0) or once for bad commands. */
static void record(mep__proxy_t *px, int code, int peer, const char *fmt,
                   ...) MEP_PRINTF(4, 5);
static void record(mep__proxy_t *px, int code, int peer, const char *fmt,
                   ...) {
  char m[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&px->mu);
  if (!px->err) {
    px->err = code;
    snprintf(px->msg, sizeof px->msg, "%s", m);
    __atomic_store_n(px->failed, (uint32_t)-code, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&px->mu);
  int log = 0;
  if (peer >= 0 && peer < px->comm->size) {
    log = !px->told[peer];
    px->told[peer] = 1;
  } else {
    log = !px->told_bad;
    px->told_bad = 1;
  }
  if (log) mep__warn("%s (later ones like it are not logged)", m);
}

static const char *op_name(uint32_t op) {
  return op == MEP_DEV_CMD_PUT ? "put" : op == MEP_DEV_CMD_SIGNAL ? "signal"
                                                                  : "command";
}

/* Why the command cannot be carried out, or NULL. */
static const char *invalid(const mep__proxy_t *px, uint32_t op, int32_t peer,
                           uint64_t src, uint64_t dst, uint64_t arg) {
  if (op != MEP_DEV_CMD_PUT && op != MEP_DEV_CMD_SIGNAL)
    return "unknown operation";
  if (peer < 0 || peer >= px->comm->size) return "no such rank";
  if (peer == px->comm->rank) return "a command to the own rank";
  if (op == MEP_DEV_CMD_PUT)
    return !in_bounds(src, arg, px->bytes)   ? "the source is out of bounds"
           : !in_bounds(dst, arg, px->bytes) ? "the destination is out of "
                                               "bounds"
                                             : NULL;
  if (dst % 8) return "the signal word is not 8-byte aligned";
  return in_bounds(dst, 8, px->bytes) ? NULL : "the signal word is out of "
                                               "bounds";
}

static int ready(const mep__proxy_t *px, uint64_t pos) {
  volatile mep_dev_cmd_t *c = &px->ring[pos & (px->len - 1)];
  return __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE) == pos + 1;
}

/* The command at pos if it can be carried out (0), else dropped and
 * reported (-1). */
static int check(mep__proxy_t *px, uint64_t pos, const mep_dev_cmd_t *c) {
  const char *bad = invalid(px, c->op, c->peer, c->src_off, c->dst_off,
                            c->arg);
  if (!bad) return 0;
  record(px, c->op == MEP_DEV_CMD_PUT && c->peer >= 0 ? MEP_ERR_BOUNDS
                                                      : MEP_ERR_INVALID,
         -1, "device window proxy: dropped command %llu (%s op %u to rank "
         "%d, src %llu, dst %llu, arg %llu; window of %llu bytes): %s",
         (unsigned long long)pos, op_name(c->op), c->op, (int)c->peer,
         (unsigned long long)c->src_off, (unsigned long long)c->dst_off,
         (unsigned long long)c->arg, (unsigned long long)px->bytes, bad);
  return -1;
}

static mep_dev_cmd_t load(const mep__proxy_t *px, uint64_t pos) {
  volatile mep_dev_cmd_t *v = &px->ring[pos & (px->len - 1)];
  mep_dev_cmd_t c;
  c.op = v->op;
  c.peer = v->peer;
  c.src_off = v->src_off;
  c.dst_off = v->dst_off;
  c.arg = v->arg;
  return c;
}

static void carry_out_signal(mep__proxy_t *px, const mep_dev_cmd_t *c) {
  int rc = mep_signal(px->comm, c->peer, px->region, c->dst_off, c->arg,
                      MEP_SIGNAL_SET);
  if (rc)
    record(px, rc, c->peer, "device window proxy: dropped the signal of "
           "command %llu to rank %d: %s", (unsigned long long)px->pos,
           (int)c->peer, mep_last_error());
}

static int is_put(const mep__proxy_t *px, uint64_t pos) {
  return px->ring[pos & (px->len - 1)].op == MEP_DEV_CMD_PUT;
}

static int put_order(const void *a, const void *b) {
  const proxy_put_t *x = a, *y = b;
  if (x->peer != y->peer) return x->peer < y->peer ? -1 : 1;
  return (x->dst > y->dst) - (x->dst < y->dst);
}

/* Takes the ready PUTs from pos on, up to the next command of another
 * kind (or a full batch, or half the ring: slots must come back), into
 * px->batch; a malformed one is dropped and reported. Their count. */
static uint32_t take_puts(mep__proxy_t *px) {
  uint32_t n = 0;
  uint64_t start = px->pos, most = px->len > 1 ? px->len / 2 : 1;
  while (n < PROXY_BATCH && px->pos - start < most &&
         ready(px, px->pos) && is_put(px, px->pos)) {
    mep_dev_cmd_t c = load(px, px->pos);
    if (!check(px, px->pos, &c) && c.arg)
      px->batch[n++] = (proxy_put_t){c.peer, c.src_off, c.dst_off, c.arg,
                                     px->pos, px->pos};
    px->pos++;
  }
  return n;
}

/* One mep_put per run of the batch whose bytes continue one another. */
static void carry_out_puts(mep__proxy_t *px, uint32_t n) {
  proxy_put_t *b = px->batch;
  qsort(b, n, sizeof *b, put_order);
  for (uint32_t i = 0; i < n;) {
    proxy_put_t m = b[i++];
    while (i < n && b[i].peer == m.peer && b[i].dst == m.dst + m.len &&
           b[i].src == m.src + m.len) {
      m.len += b[i].len;
      m.first = b[i].first < m.first ? b[i].first : m.first;
      m.last = b[i].last > m.last ? b[i].last : m.last;
      i++;
      atomic_fetch_add(&px->merged, 1);
    }
    int rc = mep_put(px->comm, m.peer, px->region, m.src, px->region, m.dst,
                     m.len);
    if (rc == MEP_OK)
      px->unflushed++;
    else
      record(px, rc, m.peer, "device window proxy: dropped the put of "
             "commands %llu to %llu to rank %d: %s",
             (unsigned long long)m.first, (unsigned long long)m.last,
             (int)m.peer, mep_last_error());
  }
  atomic_fetch_add(&px->puts, n);
}

static void flush(mep__proxy_t *px) {
  px->unflushed = 0;
  int rc = mep_flush(px->comm, -1);
  if (rc)
    record(px, rc, -1, "device window proxy: a put did not complete: %s",
           mep_last_error());
}

/* Skips the slot at pos when a later one is ready: its writer gave up. */
static int skip_hole(mep__proxy_t *px) {
  for (uint32_t k = 1; k < px->len; k++) {
    if (!ready(px, px->pos + k)) continue;
    record(px, MEP_ERR_TIMEOUT, -1, "device window proxy: slot %llu was "
           "reserved but not written for %d ms while later ones were (a "
           "kernel gave up on a full ring?); skipped it",
           (unsigned long long)px->pos, px->comm->timeout_ms);
    return 1;
  }
  return 0;
}

/* Hands the slots carried out so far back to the GPU. Only after a flush:
 * a kernel reuses a put's stage bytes once its slot is done, and mep_put
 * reads them until mep_flush returns. */
static void publish(mep__proxy_t *px) {
  if (px->unflushed) flush(px);
  __atomic_store_n(px->done, px->pos, __ATOMIC_RELEASE);
}

static void *serve(void *arg) {
  mep__proxy_t *px = arg;
  unsigned rounds = 0;
  uint64_t idle_since = 0, stop_by = 0;
  int timeout = px->comm->timeout_ms;
  for (;;) {
    if (atomic_load(&px->stop)) {
      uint64_t now = mep__now_ms();
      if (!stop_by) stop_by = now + (uint64_t)timeout;
      if (now >= stop_by ||
          (px->pos >= atomic_load(&px->target) && !ready(px, px->pos)))
        break;
    }
    if (ready(px, px->pos)) {
      if (is_put(px, px->pos)) {
        carry_out_puts(px, take_puts(px));
      } else {
        mep_dev_cmd_t c = load(px, px->pos);
        if (!check(px, px->pos, &c)) carry_out_signal(px, &c);
        px->pos++;
      }
      /* a batch is bounded so a full ring gets slots back */
      if (px->pos - *px->done >= px->len / 2) publish(px);
      rounds = 0;
      idle_since = 0;
      continue;
    }
    if (px->pos != *px->done) publish(px);
    uint64_t now = mep__now_ms();
    if (!idle_since) {
      idle_since = now;
    } else if (now - idle_since >= (uint64_t)timeout) {
      idle_since = now; /* scan the ring at most once per timeout */
      if (skip_hole(px)) {
        px->pos++;
        publish(px);
        continue;
      }
    }
    idle(&rounds);
  }
  publish(px);
  return NULL;
}

int mep__proxy_start(mep_comm_t *comm, mep_region_t *region,
                     mep_dev_cmd_t *ring, uint32_t len,
                     volatile uint64_t *done, volatile uint32_t *failed,
                     mep__proxy_t **out) {
  if (!comm || !region || !ring || !done || !failed || !out || !len ||
      (len & (len - 1)))
    return mep__err(MEP_ERR_INVALID, "device window proxy: bad arguments "
                    "(ring of %u slots)", len);
  mep__proxy_t *px = calloc(1, sizeof *px);
  if (!px) return mep__err(MEP_ERR_NOMEM, "out of memory");
  px->told = calloc((size_t)comm->size, 1);
  px->batch = malloc(PROXY_BATCH * sizeof *px->batch);
  if (!px->told || !px->batch) {
    free(px->told);
    free(px->batch);
    free(px);
    return mep__err(MEP_ERR_NOMEM, "out of memory");
  }
  px->comm = comm;
  px->region = region;
  px->bytes = mep_region_len(region);
  px->ring = ring;
  px->len = len;
  px->done = done;
  px->failed = failed;
  px->pos = __atomic_load_n(done, __ATOMIC_ACQUIRE);
  pthread_mutex_init(&px->mu, NULL);
  int e = pthread_create(&px->thread, NULL, serve, px);
  if (e) {
    pthread_mutex_destroy(&px->mu);
    free(px->told);
    free(px->batch);
    free(px);
    return mep__err_errno(MEP_ERR_SYSTEM, e, "device window proxy: "
                          "pthread_create");
  }
  *out = px;
  return MEP_OK;
}

int mep__proxy_error(mep__proxy_t *px, char *msg, size_t len) {
  if (!px) return MEP_OK;
  pthread_mutex_lock(&px->mu);
  int err = px->err;
  if (msg && len) snprintf(msg, len, "%s", err ? px->msg : "");
  pthread_mutex_unlock(&px->mu);
  return err;
}

int mep__proxy_stop(mep__proxy_t *px, uint64_t target) {
  if (!px) return MEP_OK;
  atomic_store(&px->target, target);
  atomic_store(&px->stop, 1);
  pthread_join(px->thread, NULL);
  int rc = MEP_OK;
  if (px->pos < target) {
    rc = mep__err(MEP_ERR_TIMEOUT, "device window proxy: %llu commands "
                  "were still not written after %d ms; they were not "
                  "carried out", (unsigned long long)(target - px->pos),
                  px->comm->timeout_ms);
    mep__warn("%s", mep_last_error());
  }
  pthread_mutex_destroy(&px->mu);
  free(px->told);
  free(px->batch);
  free(px);
  return rc;
}

void mep__proxy_counts(const mep__proxy_t *px, uint64_t *puts,
                       uint64_t *merged) {
  *puts = px ? atomic_load(&px->puts) : 0;
  *merged = px ? atomic_load(&px->merged) : 0;
}
