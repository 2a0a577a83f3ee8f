/* config.c - the [verbs] keys: their declaration (which the core checks
 * the user's configuration against, and mep-info prints) and their
 * reading. */
#include <stddef.h>
#include <string.h>

#include "entry.h"
#include "verbs.h"

const mep_tp_cfg_key_t mep__verbs_keys[MEP_VERBS_NKEYS] = {
    {"device", MEP_TP_CFG_STRING, 0, 0, "", NULL,
     "RDMA device to use, as ibv_devices lists it (mlx5_0, rxe0). Empty: "
     "the first device with an active port."},
    {"port", MEP_TP_CFG_INT, 0, 255, "0", NULL,
     "Port of the device; 0: its first active port."},
    {"gid_index", MEP_TP_CFG_INT, -1, 1023, "-1", NULL,
     "GID table index the queue pairs use. -1: the first RoCE v2 GID that "
     "holds an IPv4 address (::ffff:a.b.c.d), else the first RoCE v2 GID, "
     "else index 0; InfiniBand ports are addressed by LID."},
    {"mtu", MEP_TP_CFG_CHOICE, 0, 0, "auto", "auto|256|512|1024|2048|4096",
     "Path MTU in bytes; auto: the port's active MTU. Two ranks use the "
     "smaller of their two values."},
    {"qps_per_peer", MEP_TP_CFG_INT, 1, MEP_RDMA_MAX_QPS, "1", NULL,
     "RC queue pairs per peer (1 to 16). Writes of at least stripe_bytes "
     "are split over them; a signal still lands after every earlier write "
     "on all of them. Two ranks use the smaller of their two values."},
    {"stripe_bytes", MEP_TP_CFG_INT, 4096, 1 << 30, "262144", NULL,
     "Writes of at least this many bytes are striped over the queue pairs "
     "of their peer (with qps_per_peer above 1)."},
    {"send_queue", MEP_TP_CFG_INT, 16, 16384, "256", NULL,
     "Work requests each queue pair holds at the device; more wait in the "
     "plugin until completions make room."},
    {"inflight_bytes", MEP_TP_CFG_INT, 65536, 1 << 30, "4194304", NULL,
     "Bytes of writes each queue pair has at the device at once; more wait "
     "in the plugin until completions make room. Writes are split into "
     "work requests of at most half of it. Bounds how long one call spends "
     "posting (a software device such as rxe moves the data in the posting "
     "thread) and shares the link between peers."},
    {"max_inline", MEP_TP_CFG_INT, 0, 1024, "256", NULL,
     "Writes of at most this many bytes are copied into their work request "
     "(inline): their source is free at once. Where the device allows less, "
     "the largest power-of-two fraction it takes; 0 turns inline data "
     "off."},
    {"signal_every", MEP_TP_CFG_INT, 1, 4096, "16", NULL,
     "Work requests that complete no write (signals, inline writes) ask "
     "for a completion only this often; it must be below half of "
     "send_queue."},
    {"timeout", MEP_TP_CFG_INT, 0, 31, "14", NULL,
     "Local ACK timeout before a retry, as 4.096 us x 2^timeout (14: 67 "
     "ms); 0 waits forever."},
    {"retry_count", MEP_TP_CFG_INT, 0, 7, "7", NULL,
     "Retries of an unacknowledged work request before it fails and its "
     "peer is reported failed."},
    {"traffic_class", MEP_TP_CFG_INT, 0, 255, "0", NULL,
     "Traffic class (RoCE: the DSCP and ECN bits) of the packets."},
    {"service_level", MEP_TP_CFG_INT, 0, 15, "0", NULL,
     "Service level (InfiniBand virtual lane, RoCE priority) of the "
     "packets."},
    {"bootstrap_ifname", MEP_TP_CFG_STRING, 0, 0, "", NULL,
     "Interface whose IPv4 address the connection set-up listens on (a "
     "small TCP exchange of queue pair numbers, kept open to notice a "
     "peer's end). Empty: the address of the RoCE GID, else the first "
     "non-loopback interface that is up, else lo."},
    {"port_range", MEP_TP_CFG_RANGE, 1, 65535, "0", NULL,
     "TCP ports the connection set-up listens on: 0 for an ephemeral port, "
     "or a range LO-HI for firewalls that open only those."},
    {"fabric", MEP_TP_CFG_STRING, 0, 0, "", NULL,
     "Name of the RDMA fabric this rank's device is on. Two ranks reach "
     "each other over verbs only when their names are equal; with no name "
     "on either side, when they share the InfiniBand subnet or, for RoCE, "
     "the IPv4 subnet of their GIDs. Other peers go over the next "
     "transport (tcp)."},
    {"gpu_memory", MEP_TP_CFG_CHOICE, 0, 0, "auto", "auto|off",
     "CUDA memory: auto registers it through dma-buf or a peer-memory "
     "module (nvidia_peermem) where the GPU, its driver and the device "
     "allow it, as found when the plugin starts; off registers host memory "
     "only. Without it the core carries GPU data through host memory."},
    {"fuse_signals", MEP_TP_CFG_BOOL, 0, 0, "on", NULL,
     "Signals to the host memory this rank registers travel in the "
     "immediate of the write they follow (one RDMA request for a put and "
     "its signal instead of two) or of a WRITE of no bytes, and this "
     "rank's poll() applies them. Never for memory a GPU may read directly "
     "(pinned and mapped with CUDA) nor for CUDA memory: there, and with "
     "off, a signal is an RDMA WRITE or atomic that lands without this "
     "rank's CPU. The owner of a region decides; every peer follows."},
};

static int copy_str(const mep_tp_env_t *env, const char *key, char *dst,
                    size_t cap) {
  const char *v = env->cfg_str(env, key);
  if (strlen(v) >= cap) {
    env->set_error("verbs: [verbs] %s = '%s' is longer than %zu characters",
                   key, v, cap - 1);
    return MEP_ERR_CONFIG;
  }
  strcpy(dst, v);
  return 0;
}

/* The rules the table cannot say. */
static int cross_check(const mep_tp_env_t *env, const verbs_cfg_t *c) {
  if (c->signal_every * 2 >= c->sq_depth) {
    env->set_error("verbs: [verbs] signal_every = %d must be below half of "
                   "send_queue = %d, so that a full send queue always holds "
                   "a request that completes", c->signal_every, c->sq_depth);
    return MEP_ERR_CONFIG;
  }
  return 0;
}

int mep__verbs_cfg_read(const mep_tp_env_t *env, verbs_cfg_t *c) {
  int rc = mep__tp_env_typed(env, "verbs");
  if (rc) return rc;
  memset(c, 0, sizeof *c);
  static const int mtus[] = {0, IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024,
                             IBV_MTU_2048, IBV_MTU_4096};
  struct {
    const char *key;
    int64_t v;
  } k[] = {{"port", 0},         {"gid_index", 0},    {"mtu", 0},
           {"qps_per_peer", 0}, {"stripe_bytes", 0}, {"send_queue", 0},
           {"max_inline", 0},   {"signal_every", 0}, {"timeout", 0},
           {"retry_count", 0},  {"traffic_class", 0}, {"service_level", 0},
           {"gpu_memory", 0},   {"inflight_bytes", 0},
           {"fuse_signals", 0}};
  for (size_t i = 0; i < sizeof k / sizeof k[0] && !rc; i++)
    rc = env->cfg_int(env, k[i].key, &k[i].v);
  int64_t lo, hi;
  if (!rc) rc = env->cfg_range(env, "port_range", &lo, &hi);
  if (!rc) rc = copy_str(env, "device", c->device, sizeof c->device);
  if (!rc)
    rc = copy_str(env, "bootstrap_ifname", c->boot_ifname,
                  sizeof c->boot_ifname);
  if (!rc) rc = copy_str(env, "fabric", c->fabric, sizeof c->fabric);
  if (rc) return rc;
  c->port = (int)k[0].v;
  c->gid_index = (int)k[1].v;
  c->mtu = mtus[k[2].v];
  c->nqp = (int)k[3].v;
  c->stripe = (uint64_t)k[4].v;
  c->sq_depth = (int)k[5].v;
  c->max_inline = (int)k[6].v;
  c->signal_every = (int)k[7].v;
  c->timeout = (int)k[8].v;
  c->retry = (int)k[9].v;
  c->tclass = (int)k[10].v;
  c->sl = (int)k[11].v;
  c->gpu_off = k[12].v == 1;
  c->inflight = (uint64_t)k[13].v;
  c->inband = k[14].v == 1;
  c->port_lo = (int)lo;
  c->port_hi = (int)hi;
  return cross_check(env, c);
}
