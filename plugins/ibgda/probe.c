/* probe.c - backend = device: looks for an mlx5 NIC through rdma-core
 * before anything is opened, so that a machine without one gets the
 * reason that fits it: no RDMA device, devices but none mlx5, no usable
 * libmlx5, or no device of the configured name. hw.c opens the one it
 * finds. */
#include <dlfcn.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ibgda.h"

/* libmlx5 is opened here, not linked: the plugin loads without it, and
 * once opened it stays (RTLD_NODELETE), as libibverbs keeps its providers,
 * so unloading the plugin never unloads the provider under libibverbs.
 * Opened once per process. */
static ibgda_dv_t dv;
static char dv_why[200];
static pthread_once_t dv_once = PTHREAD_ONCE_INIT;

static void dv_open(void) {
  void *h = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    snprintf(dv_why, sizeof dv_why, "%s", dlerror());
    return;
  }
  *(void **)&dv.is_mlx5 = dlsym(h, "mlx5dv_is_supported");
  *(void **)&dv.init_obj = dlsym(h, "mlx5dv_init_obj");
  if (!dv.is_mlx5 || !dv.init_obj) {
    snprintf(dv_why, sizeof dv_why, "libmlx5.so.1 lacks mlx5dv_is_supported "
             "or mlx5dv_init_obj");
    dv.is_mlx5 = NULL;
  }
  dlclose(h);
}

const ibgda_dv_t *mep__ibgda_dv(const char **why) {
  pthread_once(&dv_once, dv_open);
  *why = dv_why;
  return dv.is_mlx5 ? &dv : NULL;
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
  const char *why;
  const ibgda_dv_t *d = mep__ibgda_dv(&why);
  if (!d) {
    ibv_free_device_list(list);
    env->set_error("ibgda: rdma-core's mlx5 library cannot be used: %s", why);
    return MEP_ERR_UNAVAILABLE;
  }
  char others[160] = "";
  const char *found = NULL;
  for (int i = 0; i < n; i++) {
    const char *name = ibv_get_device_name(list[i]);
    if (cfg->device[0] && strcmp(cfg->device, name)) continue;
    if (d->is_mlx5(list[i])) {
      found = name;
      break;
    }
    size_t at = strlen(others);
    snprintf(others + at, sizeof others - at, "%s%s", at ? ", " : "", name);
  }
  int rc = found ? 0 : MEP_ERR_UNAVAILABLE;
  if (!found && cfg->device[0] && !others[0])
    env->set_error("ibgda: no RDMA device named '%s' ([ibgda] device)",
                   cfg->device);
  else if (!found)
    env->set_error("ibgda: no mlx5 device (found: %s; mlx5dv_is_supported "
                   "says no to each)", others);
  ibv_free_device_list(list);
  return rc;
}
