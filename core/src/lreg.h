/* lreg.h - a small cache of local-only registrations of callers' buffers
 * (region.h, mep__region_local), for the collective engine's zero-copy
 * sends (coll.c): a buffer a training loop passes call after call is
 * registered once.
 *
 * An entry matches only the exact (address, length) it was made for, never
 * a range inside it: a buffer freed and another allocated at the same
 * address with a different length gets a registration of its own. The
 * least recently used entry is evicted (deregistered) when the cache is
 * full; the engine asks only between collectives' sends and each
 * collective finishes only once the transports are done with its buffers,
 * so nothing in flight uses an evicted registration.
 *
 * Only transports that register by address alone
 * (mep_tp_props_t.reg_by_address) take part: a registration that pins
 * pages would go stale when its buffer is freed and other memory mapped
 * at the same address and length, and pinning a buffer per call costs
 * more than the copy it saves. With any other transport in use, callers'
 * buffers are not registered and chunks are staged. */
#ifndef MEP_SRC_LREG_H
#define MEP_SRC_LREG_H

#include <stddef.h>

#include "comm.h"

typedef struct mep__lregs mep__lregs_t;

/* A cache of at most `cap` registrations; NULL when out of memory. */
mep__lregs_t *mep__lregs_new(mep_comm_t *comm, int cap);
/* Deregisters every entry and frees the cache (NULL is fine). */
void mep__lregs_free(mep__lregs_t *c);
/* The registration of exactly [ptr, ptr + len), made on a miss and held
 * by the cache: 0, MEP_ERR_UNSUPPORTED (a transport in use pins pages:
 * nothing registered) or MEP_ERR_NOMEM. */
int mep__lregs_get(mep__lregs_t *c, const void *ptr, size_t len,
                   mep_region_t **out);
/* Deregisters r and forgets its entry, if the cache holds it: a buffer
 * peers may still write into after a failed collective. */
void mep__lregs_drop(mep__lregs_t *c, mep_region_t *r);
/* Entries held and registrations made so far (for tests). */
int mep__lregs_count(const mep__lregs_t *c);
unsigned long mep__lregs_made(const mep__lregs_t *c);

#endif
