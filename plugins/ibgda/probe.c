/* probe.c - backend = device: looks for an mlx5 NIC through rdma-core.
 *
 * This version does not drive one: creating queue pairs whose send queue,
 * doorbell record and CQ a GPU can write (DEVX UMEM registration) and
 * mapping the UAR page for the GPU are not built, and no ConnectX was at
 * hand to prove them. So the answer is always MEP_ERR_UNAVAILABLE, with a
 * reason that says which case this machine is: no RDMA device, devices
 * but none mlx5, or an mlx5 device that this version cannot use yet. */
#include <dlfcn.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#include "ibgda.h"

/* libmlx5 is opened here, not linked: the plugin loads without it, and
 * once opened it stays (RTLD_NODELETE), as libibverbs keeps its providers,
 * so unloading the plugin never unloads the provider under libibverbs. */
typedef bool (*is_supported_fn)(struct ibv_device *);

static is_supported_fn open_mlx5(char *why, size_t len) {
  void *h = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    snprintf(why, len, "%s", dlerror());
    return NULL;
  }
  is_supported_fn f = (is_supported_fn)(uintptr_t)dlsym(h,
                                                        "mlx5dv_is_supported");
  if (!f) snprintf(why, len, "libmlx5.so.1 has no mlx5dv_is_supported");
  dlclose(h);
  return f;
}

int mep__ibgda_probe_device(const mep_tp_env_t *env, const ibgda_cfg_t *cfg) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) ibv_free_device_list(list);
    env->set_error("ibgda: no RDMA device (backend = device needs an mlx5 "
                   "NIC; backend = model runs the software model)");
    return MEP_ERR_UNAVAILABLE;
  }
  char why[256];
  is_supported_fn is_mlx5 = open_mlx5(why, sizeof why);
  if (!is_mlx5) {
    ibv_free_device_list(list);
    env->set_error("ibgda: rdma-core's mlx5 library cannot be used: %s", why);
    return MEP_ERR_UNAVAILABLE;
  }
  char others[160] = "";
  const char *found = NULL;
  for (int i = 0; i < n; i++) {
    const char *name = ibv_get_device_name(list[i]);
    if (cfg->device[0] && strcmp(cfg->device, name)) continue;
    if (is_mlx5(list[i])) {
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
