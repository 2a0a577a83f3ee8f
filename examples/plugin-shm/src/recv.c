/* recv.c - the receiving side of a ring: every message is copied out of
 * shared memory and checked before a byte of it touches a region, since
 * the peer could change the ring under us at any time. */
#include "shm.h"

#include <stdarg.h>
#include <stdio.h>

typedef struct check {
  int status;     /* MEP_ERR_BOUNDS or MEP_ERR_PROTOCOL */
  char why[256];
} check_t;

static int bad(check_t *c, int status, const char *fmt, ...)
    MEP_PRINTF(3, 4);

static int bad(check_t *c, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof(c->why), fmt, ap);
  va_end(ap);
  c->status = status;
  return status;
}

/* The region a message targets, with [offset, offset+len) inside it. */
static int check_target(shm_ep_t *ep, const struct shm_msg *m, uint64_t len,
                        shm_mr_t **mr, check_t *c) {
  *mr = shm_region_lookup(ep->ctx, m->region);
  if (!*mr)
    return bad(c, MEP_ERR_BOUNDS,
               "%s to region %u (generation %u), which is unknown or "
               "deregistered",
               m->type == SHM_MSG_WRITE ? "wrote" : "signalled",
               (unsigned)(m->region & 0xffffffffu),
               (unsigned)(m->region >> 32));
  uint64_t rlen = (*mr)->len;
  if (m->offset > rlen || len > rlen - m->offset)
    return bad(c, MEP_ERR_BOUNDS,
               "%s %llu bytes at offset %llu of region %u (%llu bytes): out "
               "of bounds",
               m->type == SHM_MSG_WRITE ? "wrote" : "signalled",
               (unsigned long long)len, (unsigned long long)m->offset,
               (unsigned)(m->region & 0xffffffffu), (unsigned long long)rlen);
  return 0;
}

static int check_msg(shm_ep_t *ep, const struct shm_msg *m, uint64_t avail,
                     shm_mr_t **mr, check_t *c) {
  if (m->magic != SHM_MSG_MAGIC)
    return bad(c, MEP_ERR_PROTOCOL, "sent a message with a bad magic %#x",
               m->magic);
  if (m->type == SHM_MSG_WRITE) {
    if (m->arg > ep->rx.cap - sizeof(*m) ||
        sizeof(*m) + shm_pad8(m->arg) > avail)
      return bad(c, MEP_ERR_PROTOCOL,
                 "sent a write of %llu bytes of which only %llu are in the "
                 "ring",
                 (unsigned long long)m->arg,
                 (unsigned long long)(avail - sizeof(*m)));
    return check_target(ep, m, m->arg, mr, c);
  }
  if (m->type == SHM_MSG_SIGNAL) {
    if (m->op != MEP_SIGNAL_SET && m->op != MEP_SIGNAL_ADD)
      return bad(c, MEP_ERR_PROTOCOL, "sent a signal with operation %u",
                 m->op);
    int rc = check_target(ep, m, 8, mr, c);
    if (rc == 0 && (uintptr_t)((*mr)->ptr + m->offset) % 8 != 0)
      return bad(c, MEP_ERR_BOUNDS,
                 "signalled offset %llu of region %u, which is not 8-byte "
                 "aligned",
                 (unsigned long long)m->offset,
                 (unsigned)(m->region & 0xffffffffu));
    return rc;
  }
  return bad(c, MEP_ERR_PROTOCOL, "sent a message of unknown type %u",
             m->type);
}

/* The release store (or the read-modify-write) publishes the bytes copied
 * before it to a reader that loads the word with acquire. */
static void apply_signal(shm_mr_t *mr, const struct shm_msg *m) {
  _Atomic uint64_t *word = (_Atomic uint64_t *)(void *)(mr->ptr + m->offset);
  if (m->op == MEP_SIGNAL_SET)
    atomic_store_explicit(word, m->arg, memory_order_release);
  else
    atomic_fetch_add_explicit(word, m->arg, memory_order_acq_rel);
}

int shm_recv_progress(shm_ep_t *ep) {
  if (ep->state != SHM_EP_OPEN) return 0;
  shm_ring_t *r = &ep->rx;
  uint64_t head = atomic_load_explicit(&r->hdr->head, memory_order_acquire);
  uint64_t avail = head - r->pos;
  check_t c = {0};
  if (head < r->pos || avail > r->cap)
    bad(&c, MEP_ERR_PROTOCOL,
        "moved the head of its ring to %llu while %llu bytes were consumed",
        (unsigned long long)head, (unsigned long long)r->pos);
  while (!c.status && avail >= sizeof(struct shm_msg)) {
    struct shm_msg m;
    shm_mr_t *mr = NULL;
    shm_ring_read(r, r->pos, &m, sizeof(m));
    if (check_msg(ep, &m, avail, &mr, &c) != 0) break;
    uint64_t size = sizeof(m);
    if (m.type == SHM_MSG_WRITE) {
      shm_ring_read(r, r->pos + sizeof(m), mr->ptr + m.offset, m.arg);
      size += shm_pad8(m.arg);
    } else {
      apply_signal(mr, &m);
    }
    r->pos += size;
    avail -= size;
    atomic_store_explicit(&r->hdr->tail, r->pos, memory_order_release);
  }
  if (!c.status && avail != 0)
    bad(&c, MEP_ERR_PROTOCOL, "published %llu bytes, less than a message",
        (unsigned long long)avail);
  if (!c.status) return 0;
  shm_log(ep->ctx, MEP_LOG_ERROR, "shm: rank %d %s; marking it failed",
          ep->peer, c.why);
  shm_ep_fail(ep, c.status);
  return c.status;
}
