/* comm_state.c - the subsystems' state on a communicator: the staging of
 * the collectives, the point-to-point rings and the control channel.
 * Creation (comm_api.c) and joining (recover.c) set it up; both, and
 * admitting ranks, import the active peers' instances. */
#include "coll.h"
#include "ft.h"
#include "p2p.h"
#include "region.h"

/* Registers the staging of collectives, point-to-point and the control
 * channel: the same regions in the same order on every rank; then
 * publishes them as one bundle (region_state.c). */
int mep__comm_setup_state(mep_comm_t *comm) {
  int rc = mep__coll_init(comm);
  if (rc == MEP_OK) rc = mep__p2p_init(comm);
  if (rc == MEP_OK) rc = mep__ft_init(comm);
  if (rc == MEP_OK) rc = mep__region_publish_state(comm);
  return rc;
}

/* Imports the active peers' instances of those regions, so that no
 * collective, message or agreement waits on the store later. Imports
 * already made are kept. */
int mep__comm_import_state(mep_comm_t *comm) {
  mep__region_bundles_keep(comm);
  int rc = mep__coll_connect(comm);
  if (rc == MEP_OK) rc = mep__p2p_connect(comm, mep__ft_act(comm));
  if (rc == MEP_OK) rc = mep__ft_connect(comm);
  mep__region_bundles_drop(comm);
  return rc;
}
