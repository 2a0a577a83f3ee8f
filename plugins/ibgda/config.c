/* config.c - the [ibgda] keys: their declaration (which the core checks
 * and mep-info and conf/mep.ini show) and the typed read of them. */
#include <stddef.h>
#include <string.h>

#include "entry.h"
#include "ibgda.h"

const mep_tp_cfg_key_t mep__ibgda_keys[MEP_IBGDA_NKEYS] = {
    {"backend", MEP_TP_CFG_CHOICE, 0, 0, "auto", "auto|device|model",
     "What serves the queue pairs. device: an mlx5 NIC (ConnectX) through "
     "rdma-core (libmlx5), unavailable with the reason where there is "
     "none; built against mlx5dv.h, not run on a ConnectX by this project "
     "(docs/ibgda.md). model: the software model of the NIC (a thread per "
     "rank that carries out the WQEs; peers on this host only), for "
     "tests. auto: as device; the model is never chosen silently."},
    {"device", MEP_TP_CFG_STRING, 0, 0, "", NULL,
     "mlx5 device to use (mlx5_0); empty: the first mlx5 device."},
    {"port", MEP_TP_CFG_INT, 0, 255, "0", NULL,
     "Port of the device; 0: its first active port."},
    {"gid_index", MEP_TP_CFG_INT, -1, 1023, "-1", NULL,
     "GID index of the port (RoCE); -1: the first RoCE v2 GID with an "
     "IPv4 address, as the verbs plugin picks it."},
    {"send_queue", MEP_TP_CFG_INT, 64, 16384, "1024", NULL,
     "Send queue size per peer in 64-byte building blocks (a power of "
     "two); the completion queue has as many entries."},
    {"max_inline", MEP_TP_CFG_INT, 0, MEP_MLX5_MAX_INLINE, "64", NULL,
     "Host writes of at most this many bytes carry their data in the work "
     "request (inline) and complete when posted; 0 turns that off."},
    {"bootstrap_ifname", MEP_TP_CFG_STRING, 0, 0, "", NULL,
     "Interface whose IPv4 address the connection set-up listens on (the "
     "verbs plugin's TCP exchange of queue pair numbers, kept open to "
     "notice a peer's end). Empty: the first non-loopback interface that "
     "is up, else lo."},
    {"port_range", MEP_TP_CFG_RANGE, 1, 65535, "0", NULL,
     "TCP ports the connection set-up listens on: 0 for an ephemeral port, "
     "or a range LO-HI."},
};

static int copy_str(const mep_tp_env_t *env, const char *key, char *dst,
                    size_t cap) {
  const char *v = env->cfg_str(env, key);
  if (strlen(v) >= cap) {
    env->set_error("ibgda: [ibgda] %s = '%s' is longer than %zu characters",
                   key, v, cap - 1);
    return MEP_ERR_CONFIG;
  }
  strcpy(dst, v);
  return 0;
}

int mep__ibgda_cfg_read(const mep_tp_env_t *env, ibgda_cfg_t *c) {
  int rc = mep__tp_env_typed(env, "ibgda");
  if (rc) return rc;
  memset(c, 0, sizeof *c);
  int64_t backend, port, gid, sq, inl, lo, hi;
  rc = env->cfg_int(env, "backend", &backend);
  if (!rc) rc = env->cfg_int(env, "port", &port);
  if (!rc) rc = env->cfg_int(env, "gid_index", &gid);
  if (!rc) rc = env->cfg_int(env, "send_queue", &sq);
  if (!rc) rc = env->cfg_int(env, "max_inline", &inl);
  if (!rc) rc = env->cfg_range(env, "port_range", &lo, &hi);
  if (!rc) rc = copy_str(env, "device", c->device, sizeof c->device);
  if (!rc)
    rc = copy_str(env, "bootstrap_ifname", c->boot_ifname,
                  sizeof c->boot_ifname);
  if (rc) return rc;
  if (sq & (sq - 1)) {
    env->set_error("ibgda: [ibgda] send_queue = %lld is not a power of two",
                   (long long)sq);
    return MEP_ERR_CONFIG;
  }
  /* the CHOICE index: auto, device, model */
  c->backend = (int)backend;
  c->port = (int)port;
  c->gid_index = (int)gid;
  c->sq_bbs = (uint32_t)sq;
  c->max_inline = (int)inl;
  c->port_lo = (int)lo;
  c->port_hi = (int)hi;
  return 0;
}
