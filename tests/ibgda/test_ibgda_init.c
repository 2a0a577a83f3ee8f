/*
 * test_ibgda_init - the ibgda plugin as the core loads it: its answer for
 * backend = device and auto on this machine, read against what sysfs says
 * independently (no RDMA device; devices but none driven by mlx5_core; an
 * mlx5 device, which it opens or says why not), the configuration it
 * refuses, and the model backend's init, props and reachability.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include <mep/transport.h>

/* 0: no RDMA device; 1: devices, none mlx5; 2: an mlx5 device. */
static int sysfs_kind(void) {
  DIR *d = opendir("/sys/class/infiniband");
  if (!d) return 0;
  int kind = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (kind < 1) kind = 1;
    char p[512], t[PATH_MAX];
    snprintf(p, sizeof p, "/sys/class/infiniband/%s/device/driver",
             e->d_name);
    ssize_t n = readlink(p, t, sizeof t - 1);
    if (n > 0) {
      t[n] = 0;
      if (strstr(t, "mlx5")) kind = 2;
    }
  }
  closedir(d);
  return kind;
}

static const uint8_t secret[16] = "0123456789abcdef";

static int try_init(mep_plugin_t *p, mep_tp_env_t *env, mep_tp_ctx_t **ctx) {
  int rc = mep_plugin_env_open(env, NULL, p);
  if (rc) return rc;
  env->rank = 0;
  env->size = 2;
  env->secret = secret;
  env->secret_len = sizeof secret;
  env->timeout_ms = 5000;
  *ctx = NULL;
  rc = mep_plugin_vtable(p)->init(env, ctx);
  if (rc) mep_plugin_env_fini(env);
  return rc;
}

static void device(mep_plugin_t *p, const char *backend) {
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx;
  setenv("MEP_IBGDA_BACKEND", backend, 1);
  int kind = sysfs_kind();
  int rc = try_init(p, &env, &ctx);
  if (kind == 2 && rc == 0) { /* an mlx5 NIC, opened */
    const mep_transport_t *vt = mep_plugin_vtable(p);
    mep_tp_props_t pr = {.struct_size = sizeof pr};
    CHECK_OK(vt->props(ctx, &pr));
    CHECK(pr.dev_kind == MEP_DEV_MLX5, "dev_kind %d", (int)pr.dev_kind);
    CHECK_OK(vt->fini(ctx));
    mep_plugin_env_fini(&env);
    printf("PASS backend = %s: an mlx5 device opened\n", backend);
  } else {
    CHECK_RC(rc, MEP_ERR_UNAVAILABLE);
    switch (kind) {
    case 0: CHECK_MSG("no RDMA device"); break;
    case 1: CHECK_MSG("no mlx5 device (found: "); break;
    default: CHECK(mep_last_error()[0], "unavailable without a reason");
    }
    printf("PASS backend = %s: unavailable: %s\n", backend,
           mep_last_error());
  }
  unsetenv("MEP_IBGDA_BACKEND");
}

static void config_refused(mep_plugin_t *p) {
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx;
  setenv("MEP_IBGDA_BACKEND", "model", 1);
  setenv("MEP_IBGDA_SEND_QUEUE", "1000", 1);
  CHECK_RC(try_init(p, &env, &ctx), MEP_ERR_CONFIG);
  CHECK_MSG("power of two");
  unsetenv("MEP_IBGDA_SEND_QUEUE");
  setenv("MEP_IBGDA_BACKEND", "hardware", 1);
  CHECK_RC(try_init(p, &env, &ctx), MEP_ERR_CONFIG);
  CHECK_MSG("backend");
  unsetenv("MEP_IBGDA_BACKEND");
  printf("PASS configuration refused\n");
}

static void model(mep_plugin_t *p) {
  const mep_transport_t *vt = mep_plugin_vtable(p);
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx;
  setenv("MEP_IBGDA_BACKEND", "model", 1);
  CHECK_OK(try_init(p, &env, &ctx));
  mep_tp_props_t pr = {.struct_size = sizeof pr};
  CHECK_OK(vt->props(ctx, &pr));
  CHECK(pr.mem_kinds == MEP_TP_MEM_HOST, "mem kinds %#x", pr.mem_kinds);
  CHECK(pr.dev_kind == MEP_DEV_MLX5, "dev_kind %d", (int)pr.dev_kind);
  CHECK(pr.atomics == 0, "the model's FETCH_AND_ADD is not atomic");
  CHECK(strstr(vt->version, "not run on a ConnectX"), "version '%s' lacks "
        "the honesty statement", vt->version);
  uint8_t addr[MEP_TP_MAX_ADDR];
  size_t len = sizeof addr;
  CHECK_OK(vt->address(ctx, addr, &len));
  char why[160];
  CHECK(vt->reachable(ctx, 1, addr, len, why, sizeof why) == 1,
        "its own address is unreachable: %s", why);
  addr[9] ^= 1; /* another kernel's boot id */
  CHECK(vt->reachable(ctx, 1, addr, len, why, sizeof why) == 0 &&
            strstr(why, "other host"),
        "another host is reachable (%s)", why);
  addr[9] ^= 1;
  addr[5] = 1; /* a peer on the device backend (a NIC) */
  CHECK(vt->reachable(ctx, 1, addr, len, why, sizeof why) == 0 &&
            strstr(why, "device backend"),
        "a peer on a NIC is reachable from the model (%s)", why);
  uint8_t rkey[MEP_TP_MAX_RKEY], buf[64];
  size_t rlen = sizeof rkey;
  mep_tp_mr_t *mr;
  CHECK_RC(vt->reg(ctx, buf, 64, MEP_MEM_CUDA, &mr, rkey, &rlen),
           MEP_ERR_UNSUPPORTED);
  CHECK_MSG("host memory only");
  CHECK_OK(vt->reg(ctx, buf, 64, MEP_MEM_HOST, &mr, rkey, &rlen));
  CHECK_OK(vt->dereg(ctx, mr));
  /* no connection: no descriptor */
  uint8_t desc[MEP_DEV_DESC_MAX];
  size_t dl = sizeof desc;
  CHECK_RC(vt->device_descriptor(ctx, 1, desc, &dl), MEP_ERR_INVALID);
  CHECK_OK(vt->fini(ctx));
  mep_plugin_env_fini(&env);
  unsetenv("MEP_IBGDA_BACKEND");
  printf("PASS backend = model: init, props, address, registration\n");
}

int main(void) {
  mep_plugin_t *p;
  CHECK_OK(mep_plugin_find("ibgda", &p));
  device(p, "device");
  device(p, "auto");
  config_refused(p);
  model(p);
  mep_plugin_close(p);
  return 0;
}
