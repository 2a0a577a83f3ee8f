/* probe.c - backend = device: looks for an mlx5 NIC through rdma-core.
 *
 * This version does not drive one: creating queue pairs whose send queue,
 * doorbell record and CQ a GPU can write (DEVX UMEM registration) and
 * mapping the UAR page for the GPU are not built, and no ConnectX was at
 * hand to prove them. So the answer is always MEP_ERR_UNAVAILABLE, with a
 * reason that says which case this machine is: no RDMA device, devices
 * but none mlx5, or an mlx5 device that this version cannot use yet. */
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#include "ibgda.h"

int mep__ibgda_probe_device(const mep_tp_env_t *env, const ibgda_cfg_t *cfg) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) ibv_free_device_list(list);
    env->set_error("ibgda: no RDMA device (backend = device needs an mlx5 "
                   "NIC; backend = model runs the software model)");
    return MEP_ERR_UNAVAILABLE;
  }
  char others[160] = "";
  const char *found = NULL;
  for (int i = 0; i < n; i++) {
    const char *name = ibv_get_device_name(list[i]);
    if (cfg->device[0] && strcmp(cfg->device, name)) continue;
    if (mlx5dv_is_supported(list[i])) {
      found = name;
      break;
    }
    size_t at = strlen(others);
    snprintf(others + at, sizeof others - at, "%s%s", at ? ", " : "", name);
  }
  int rc = MEP_ERR_UNAVAILABLE;
  if (found)
    env->set_error("ibgda: mlx5 device %s found, but this version does not "
                   "drive mlx5 hardware (DEVX queues and the GPU doorbell "
                   "mapping are not built; only backend = model is)", found);
  else if (cfg->device[0] && !others[0])
    env->set_error("ibgda: no RDMA device named '%s' ([ibgda] device)",
                   cfg->device);
  else
    env->set_error("ibgda: no mlx5 device (found: %s; mlx5dv_is_supported "
                   "says no to each)", others);
  ibv_free_device_list(list);
  return rc;
}
