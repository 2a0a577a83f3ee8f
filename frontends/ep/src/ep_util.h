/* ep_util.h - helpers both paths use (ep_host*.c, cuda/ep_cuda.c). They
 * live in ep_util.c, a leaf: it calls nothing of the paths or of
 * ep_buffer.c, so calls go one way, ep_buffer.c -> a path -> ep_util.c. */
#ifndef MEP_EP_UTIL_H
#define MEP_EP_UTIL_H

#include <stdint.h>

#include "mep/ep.h"

/* The buffer's first active_ranks: 1 for the ranks active in the
 * communicator now, 0 for those that already left (out[0..b->size)).
 * 0 or MEP_ERR_NOMEM. */
int mep__ep_initial_active(const mep_ep_buffer_t *b, int32_t *out);

/* Microseconds of a monotonic clock. */
uint64_t mep__ep_now_us(void);
/* Milliseconds left until deadline_us for mep_wait, rounded up; 0 once
 * passed (a single check). */
int mep__ep_left_ms(uint64_t deadline_us);

#endif /* MEP_EP_UTIL_H */
