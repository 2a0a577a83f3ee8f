/* peer.c - marking a peer failed. A leaf over the communicator's peer
 * table: the progress thread, the failure detector (ft.c), the
 * point-to-point rings and the CUDA kernel path all report through it. */
#include <stdatomic.h>

#include "comm.h"
#include "log.h"

void mep__comm_fail_peer(mep_comm_t *comm, int peer, int code,
                         const char *why) {
  if (peer < 0 || peer >= comm->max_size) return;
  int expected = 0;
  if (!atomic_compare_exchange_strong(&comm->peers[peer].failed, &expected,
                                      code))
    return;
  if (code == MEP_ERR_CLOSED) /* it destroyed its communicator: no fault */
    mep__info("rank %d closed its communicator (%s)", peer,
              why ? why : "reported by its transport");
  else
    mep__warn("rank %d failed: %s (%s)", peer, mep_strerror(code),
              why ? why : "reported by its transport");
}
