/*
 * test_verbs_init - the verbs plugin as the core loads it, on any host:
 * its table of keys, the configuration it refuses (before it looks for a
 * device), and init's answer. Where no RDMA device exists init must say
 * MEP_ERR_UNAVAILABLE "no RDMA device" (the core then skips the
 * transport); where one does (the VM, a real NIC), init must succeed and
 * props, address, reachable and registration must be sane, CUDA memory
 * refused with a reason where the device cannot register it.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include <mep/transport.h>

static int have_rdma_device(void) {
  DIR *d = opendir("/sys/class/infiniband");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n > 0;
}

static const uint8_t secret[16] = "0123456789abcdef";

/* init with the environment as it is; *ctx set on success */
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

static void config_refused(mep_plugin_t *p) {
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx;
  setenv("MEP_VERBS_SIGNAL_EVERY", "200", 1); /* send_queue is 256 */
  CHECK_RC(try_init(p, &env, &ctx), MEP_ERR_CONFIG);
  CHECK_MSG("signal_every");
  unsetenv("MEP_VERBS_SIGNAL_EVERY");
  setenv("MEP_VERBS_QPS_PER_PEER", "17", 1);
  CHECK_RC(try_init(p, &env, &ctx), MEP_ERR_CONFIG);
  CHECK_MSG("qps_per_peer");
  unsetenv("MEP_VERBS_QPS_PER_PEER");
  setenv("MEP_VERBS_MTU", "9000", 1);
  CHECK_RC(try_init(p, &env, &ctx), MEP_ERR_CONFIG);
  unsetenv("MEP_VERBS_MTU");
  printf("PASS configuration refused before any device is opened\n");
}

static void with_device(const mep_transport_t *vt, mep_tp_ctx_t *ctx) {
  mep_tp_props_t pr = {.struct_size = sizeof pr};
  CHECK_OK(vt->props(ctx, &pr));
  CHECK(pr.mem_kinds & MEP_TP_MEM_HOST, "no host memory: %#x", pr.mem_kinds);
  CHECK(pr.dev_kind == MEP_DEV_NONE, "dev_kind %d", (int)pr.dev_kind);
  CHECK(pr.event_fd >= 0, "no event fd");
  uint8_t addr[MEP_TP_MAX_ADDR];
  size_t len = sizeof addr;
  CHECK_OK(vt->address(ctx, addr, &len));
  char why[128];
  CHECK(vt->reachable(ctx, 1, addr, len, why, sizeof why) == 1,
        "its own address is unreachable: %s", why);
  CHECK(vt->reachable(ctx, 1, addr, len - 1, why, sizeof why) == 0,
        "a truncated address is reachable");
  uint8_t rkey[MEP_TP_MAX_RKEY], buf[64];
  size_t rlen = sizeof rkey;
  mep_tp_mr_t *mr;
  CHECK_OK(vt->reg(ctx, buf + 1, 1, MEP_MEM_HOST, &mr, rkey, &rlen));
  CHECK_OK(vt->dereg(ctx, mr));
  rlen = sizeof rkey;
  CHECK_OK(vt->reg(ctx, buf, 0, MEP_MEM_HOST, &mr, rkey, &rlen));
  CHECK_OK(vt->dereg(ctx, mr));
  if (!(pr.mem_kinds & MEP_TP_MEM_CUDA)) {
    rlen = sizeof rkey;
    CHECK_RC(vt->reg(ctx, buf, sizeof buf, MEP_MEM_CUDA, &mr, rkey, &rlen),
             MEP_ERR_UNSUPPORTED);
    CHECK_MSG("CUDA");
    printf("PASS CUDA memory refused: %s\n", mep_last_error());
  }
  printf("PASS a device: props, address, reachable, registration\n");
}

int main(void) {
  mep_plugin_t *p = NULL;
  if (mep_plugin_find("verbs", &p)) {
    printf("SKIP: the verbs plugin is not built here: %s\n",
           mep_last_error());
    return 77;
  }
  const mep_transport_t *vt = mep_plugin_vtable(p);
  CHECK(strcmp(vt->name, "verbs") == 0, "name %s", vt->name);
  CHECK(vt->config_keys && vt->config_nkeys >= 10, "%zu keys",
        vt->config_nkeys);
  config_refused(p);
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx = NULL;
  int rc = try_init(p, &env, &ctx);
  if (!have_rdma_device()) {
    CHECK_RC(rc, MEP_ERR_UNAVAILABLE);
    CHECK_MSG("no RDMA device");
    printf("PASS no device: %s\n", mep_last_error());
  } else {
    CHECK_OK(rc);
    with_device(vt, ctx);
    CHECK_OK(vt->fini(ctx));
    mep_plugin_env_fini(&env);
  }
  mep_plugin_close(p);
  return 0;
}
