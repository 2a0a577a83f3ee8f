/* ep_util.h - helpers the paths share (ep_host*.c, ep_normal.c,
 * cuda/ep_cuda.c). They live in ep_util.c, a leaf: it calls nothing of the
 * paths or of ep_buffer.c, so calls go one way, ep_buffer.c -> a path ->
 * ep_util.c. */
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

/* Waits (up to timeout_us, rounded up to ms) for the communicator's earlier
 * sends to leave the staging area a call is about to reuse. A peer that
 * failed or left is no error here (the call's own waits drop it); other
 * failures return their code with the message naming fn. */
int mep__ep_flush(mep_comm_t *comm, int64_t timeout_us, const char *fn);

/* A put or signal to dst failed with rc: a peer that died or left is
 * cleared in active (returns 0); anything else is the call's error. */
int mep__ep_peer_error(int32_t *active, int dst, int rc);

#endif /* MEP_EP_UTIL_H */
