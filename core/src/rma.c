/* rma.c - one-sided put and signal, flush and wait: over the peers'
 * transports, with the progress thread's waiting (progress.c) and the
 * regions' remote keys (region.c). */
#include <stdatomic.h>
#include <string.h>

#include "error.h"
#include "region.h"

/* off + len within size, without overflow. */
static int in_bounds(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}

static int check_peer(const mep_comm_t *comm, int peer, const char *what) {
  if (peer < 0 || peer >= comm->size)
    return mep__err(MEP_ERR_INVALID, "%s: peer %d is not in [0, %d)", what,
                    peer, comm->size);
  int failed = atomic_load(&comm->peers[peer].failed);
  if (failed == MEP_ERR_CLOSED)
    return mep__err(MEP_ERR_CLOSED, "%s: rank %d has closed its "
                    "communicator", what, peer);
  if (failed)
    return mep__err(MEP_ERR_PEER_FAILED, "%s: rank %d has failed (%s)", what,
                    peer, mep_strerror(failed));
  if (peer != comm->rank && !comm->peers[peer].ep)
    return mep__err(MEP_ERR_PEER_FAILED, "%s: rank %d is not in the group",
                    what, peer);
  return MEP_OK;
}

static int check_regions(const mep_comm_t *comm, const mep_region_t *a,
                         const mep_region_t *b, const char *what) {
  if (!a || !b)
    return mep__err(MEP_ERR_INVALID, "%s: NULL region", what);
  if (a->comm != comm || b->comm != comm)
    return mep__err(MEP_ERR_INVALID, "%s: region of another communicator",
                    what);
  return MEP_OK;
}

/* mep_put with `tag` or'ed into the write's token (region.h). */
static int put(mep_comm_t *comm, int peer, const mep_region_t *src,
               size_t src_off, const mep_region_t *dst, size_t dst_off,
               size_t len, uint64_t tag) {
  if (!comm) return mep__err(MEP_ERR_INVALID, "mep_put: NULL communicator");
  int rc = check_regions(comm, src, dst, "mep_put");
  if (rc == MEP_OK) rc = check_peer(comm, peer, "mep_put");
  if (rc) return rc;
  if (!in_bounds(src_off, len, src->len))
    return mep__err(MEP_ERR_BOUNDS, "mep_put: %zu bytes at offset %zu of a "
                    "source region of %zu bytes", len, src_off, src->len);
  if (peer == comm->rank) {
    if (!in_bounds(dst_off, len, dst->len))
      return mep__err(MEP_ERR_BOUNDS, "mep_put to self: %zu bytes at offset "
                      "%zu of region %u (%zu bytes)", len, dst_off, dst->id,
                      dst->len);
    if (len) memmove((char *)dst->ptr + dst_off, (char *)src->ptr + src_off, len);
    return MEP_OK;
  }
  mep__remote_t *rem;
  rc = mep__region_remote((mep_region_t *)dst, peer, &rem);
  if (rc) return rc;
  if (!in_bounds(dst_off, len, rem->len))
    return mep__err(MEP_ERR_BOUNDS, "mep_put to rank %d: %zu bytes at offset "
                    "%zu of its region %u (%llu bytes)", peer, len, dst_off,
                    dst->id, (unsigned long long)rem->len);
  const mep__peer_t *p = &comm->peers[peer];
  const mep__tp_t *tp = &comm->tps[p->tp];
  uint64_t token = atomic_fetch_add(&comm->issued, 1) | tag;
  mep__err_clear();
  rc = tp->vt->write(p->ep, src->mrs[p->tp], src_off, rem->rmr, dst_off, len,
                     token);
  if (rc) {
    /* Not issued after all: count it as completed so flush stays exact. */
    atomic_fetch_add(&comm->completed, 1);
    return mep__err_wrap(rc, "mep_put to rank %d over %s", peer, tp->name);
  }
  /* Its completion may already wait in the transport with no fd event. */
  mep__progress_kick(comm);
  return MEP_OK;
}

int mep_put(mep_comm_t *comm, int peer, const mep_region_t *src,
            size_t src_off, const mep_region_t *dst, size_t dst_off,
            size_t len) {
  return put(comm, peer, src, src_off, dst, dst_off, len, 0);
}

int mep__put_tagged(mep_comm_t *comm, int peer, const mep_region_t *src,
                    size_t src_off, const mep_region_t *dst, size_t dst_off,
                    size_t len, uint64_t tag) {
  return put(comm, peer, src, src_off, dst, dst_off, len, tag);
}

int mep_signal(mep_comm_t *comm, int peer, const mep_region_t *dst,
               size_t dst_off, uint64_t value, mep_signal_op_t op) {
  if (!comm) return mep__err(MEP_ERR_INVALID, "mep_signal: NULL communicator");
  int rc = check_regions(comm, dst, dst, "mep_signal");
  if (rc == MEP_OK) rc = check_peer(comm, peer, "mep_signal");
  if (rc) return rc;
  if (op != MEP_SIGNAL_SET && op != MEP_SIGNAL_ADD)
    return mep__err(MEP_ERR_INVALID, "mep_signal: unknown op %d", (int)op);
  if (dst_off % 8)
    return mep__err(MEP_ERR_INVALID, "mep_signal: offset %zu is not 8-byte "
                    "aligned", dst_off);
  if (peer == comm->rank) {
    if (!in_bounds(dst_off, 8, dst->len))
      return mep__err(MEP_ERR_BOUNDS, "mep_signal to self: offset %zu of a "
                      "region of %zu bytes", dst_off, dst->len);
    uint64_t *word = (uint64_t *)((char *)dst->ptr + dst_off);
    if (op == MEP_SIGNAL_SET)
      __atomic_store_n(word, value, __ATOMIC_RELEASE);
    else
      __atomic_fetch_add(word, value, __ATOMIC_RELEASE);
    return MEP_OK;
  }
  mep__remote_t *rem;
  rc = mep__region_remote((mep_region_t *)dst, peer, &rem);
  if (rc) return rc;
  if (!in_bounds(dst_off, 8, rem->len))
    return mep__err(MEP_ERR_BOUNDS, "mep_signal to rank %d: offset %zu of its "
                    "region %u (%llu bytes)", peer, dst_off, dst->id,
                    (unsigned long long)rem->len);
  const mep__peer_t *p = &comm->peers[peer];
  const mep__tp_t *tp = &comm->tps[p->tp];
  mep__err_clear();
  rc = tp->vt->signal(p->ep, rem->rmr, dst_off, value, op);
  return rc ? mep__err_wrap(rc, "mep_signal to rank %d over %s", peer,
                            tp->name)
            : MEP_OK;
}

int mep_flush(mep_comm_t *comm, int timeout_ms) {
  if (!comm) return mep__err(MEP_ERR_INVALID, "mep_flush: NULL communicator");
  uint64_t target = atomic_load(&comm->issued);
  uint64_t deadline =
      mep__deadline_in((uint64_t)mep__timeout_or_default(comm, timeout_ms));
  mep__waiter_t w;
  int rc = MEP_OK;
  mep__wait_begin(&w, comm);
  while (atomic_load(&comm->completed) < target) {
    if (mep__passed(deadline)) {
      rc = mep__err(MEP_ERR_TIMEOUT, "mep_flush: %llu of %llu puts still "
                    "incomplete after %d ms",
                    (unsigned long long)(target - atomic_load(&comm->completed)),
                    (unsigned long long)target,
                    mep__timeout_or_default(comm, timeout_ms));
      break;
    }
    mep__wait_step(&w);
  }
  mep__wait_end(&w);
  int err = atomic_exchange(&comm->first_error, 0);
  if (rc == MEP_OK && err)
    rc = mep__err(err, "mep_flush: a put to rank %d failed: %s",
                  atomic_load(&comm->first_error_peer), mep_strerror(err));
  return rc;
}

int mep_wait(const mep_region_t *r, size_t off, uint64_t value,
             int timeout_ms, uint64_t *seen) {
  if (!r) return mep__err(MEP_ERR_INVALID, "mep_wait: NULL region");
  if (off % 8 || !in_bounds(off, 8, r->len))
    return mep__err(MEP_ERR_INVALID, "mep_wait: offset %zu is not an aligned "
                    "word of a region of %zu bytes", off, r->len);
  mep_comm_t *comm = r->comm;
  const uint64_t *word = (const uint64_t *)((const char *)r->ptr + off);
  int t = mep__timeout_or_default(comm, timeout_ms);
  uint64_t deadline = mep__deadline_in((uint64_t)t);
  mep__waiter_t w;
  uint64_t v;
  int rc = MEP_OK;
  mep__wait_begin(&w, comm);
  while ((v = __atomic_load_n(word, __ATOMIC_ACQUIRE)) < value) {
    if (mep__passed(deadline)) {
      rc = mep__err(MEP_ERR_TIMEOUT, "mep_wait: word at offset %zu of region "
                    "%u is %llu, not yet %llu, after %d ms", off, r->id,
                    (unsigned long long)v, (unsigned long long)value, t);
      break;
    }
    mep__wait_step(&w);
  }
  mep__wait_end(&w);
  if (seen) *seen = v;
  return rc;
}
