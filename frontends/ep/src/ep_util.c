/* ep_util.c - the helpers of ep_util.h: the first active ranks (both
 * paths' create) and the CPU path's clock. */
#include "ep_util.h"

#include <stdlib.h>
#include <time.h>

#include "ep_impl.h"

int mep__ep_initial_active(const mep_ep_buffer_t *b, int32_t *out) {
  int n = mep_comm_max_size(b->comm);
  uint8_t *act = malloc(n > 0 ? (size_t)n : 1);
  if (!act)
    return mep_set_error(MEP_ERR_NOMEM, 0, "mep_ep_buffer_create: no memory "
                         "for %d active-rank flags", n);
  int rc = mep_comm_active(b->comm, act, n, NULL);
  for (int r = 0; r < b->size; r++) out[r] = rc < 0 || act[r];
  free(act);
  return 0;
}

uint64_t mep__ep_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int mep__ep_left_ms(uint64_t deadline_us) {
  uint64_t now = mep__ep_now_us();
  if (now >= deadline_us) return 0;
  uint64_t ms = (deadline_us - now + 999) / 1000;
  return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

int mep__ep_flush(mep_comm_t *comm, int64_t timeout_us, const char *fn) {
  int64_t ms = timeout_us / 1000 + 1;
  int rc = mep_flush(comm, ms > INT32_MAX ? INT32_MAX : (int)ms);
  if (rc == MEP_ERR_PEER_FAILED || rc == MEP_ERR_CLOSED ||
      rc == MEP_ERR_EXCLUDED || rc == 0)
    return 0;
  return mep_set_error(rc, 1, "%s: waiting for earlier sends to leave the "
                       "staging area", fn);
}

int mep__ep_peer_error(int32_t *active, int dst, int rc) {
  if (rc == MEP_ERR_PEER_FAILED || rc == MEP_ERR_CLOSED ||
      rc == MEP_ERR_EXCLUDED || rc == MEP_ERR_UNREACHABLE) {
    active[dst] = 0;
    return 0;
  }
  return rc;
}
