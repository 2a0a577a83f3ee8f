/* config.c - the [tcp] keys: their declaration (which the core checks the
 * user's configuration against and mep-info prints) and their reading. */
#include <stddef.h>
#include <string.h>

#include "entry.h"
#include "tcp.h"

const mep_tp_cfg_key_t mep__tcp_keys[MEP_TCP_NKEYS] = {
    {"ifname", MEP_TP_CFG_STRING, 0, 0, "", NULL,
     "Interface to listen on and connect from. Empty: the first "
     "non-loopback interface that is up, else lo."},
    {"port_range", MEP_TP_CFG_RANGE, 1, 65535, "0", NULL,
     "Ports to listen on: 0 for an ephemeral port picked by the system, or a "
     "range LO-HI (e.g. 31000-31100) for firewalls that open only those."},
    {"sockets_per_peer", MEP_TP_CFG_INT, 0, MEP_TCP_MAX_SOCKS, "0", NULL,
     "TCP connections per peer (1 to 16); large writes are striped over "
     "them, which helps on links one TCP stream cannot fill (loopback "
     "among them). 0: 2 in a group of at most 4 ranks, else 1. Every rank "
     "of a group must use the same number."},
    {"connect_retries", MEP_TP_CFG_INT, 0, 1000000, "10", NULL,
     "Attempts of a refused connect (the peer may not listen yet), with "
     "backoff, all within timeout_ms."},
    {"nodelay", MEP_TP_CFG_BOOL, 0, 0, "1", NULL,
     "1 turns off Nagle's algorithm, so small messages such as signals "
     "leave at once instead of waiting to be batched."},
    {"send_thread", MEP_TP_CFG_CHOICE, 0, 0, "auto", "auto|off|on",
     "on: large writes (64 KiB or more queued on a socket) are sent by a "
     "thread of the plugin's own, so the progress thread receives and "
     "reduces meanwhile; off: the thread that queues a write sends it. "
     "auto: on where the process may run on 4 CPUs or more, in a group of "
     "3 ranks or more or with 2 sockets per peer or more."},
    {"send_threads", MEP_TP_CFG_INT, 0, MEP_TCP_MAX_SOCKS, "0", NULL,
     "How many sender threads send_thread starts (1 to 16). One thread "
     "sends one stream at the speed of one CPU's copy, so a peer's writes "
     "striped over sockets_per_peer sockets leave that much faster only "
     "with as many threads. 0: one per socket of a peer, at most one per "
     "4 CPUs."},
    {"recv_thread", MEP_TP_CFG_CHOICE, 0, 0, "auto", "auto|off|on",
     "on: the rest of a long payload (256 KiB or more) is read into its "
     "region by a thread of the plugin's own, one per socket of a peer, at "
     "most one per 4 CPUs, so a peer's streams are received at once; off: "
     "the progress thread reads every byte. auto: on where send_thread's "
     "auto is and the sender and receiver threads of all ranks fit in half "
     "of this process's CPUs."},
};

/* The core checked every value against the table above when it loaded
 * the plugin; the typed reads check again (a host may hand other values)
 * and apply the defaults. */
int mep__tcp_cfg_read(const mep_tp_env_t *env, tcp_cfg_t *cfg) {
  int rc = mep__tp_env_typed(env, "tcp");
  if (rc) return rc;
  memset(cfg, 0, sizeof *cfg);
  int64_t lo, hi, nsock, retries, nodelay, send_thread, send_threads,
      recv_thread;
  rc = env->cfg_range(env, "port_range", &lo, &hi);
  if (!rc) rc = env->cfg_int(env, "sockets_per_peer", &nsock);
  if (!rc) rc = env->cfg_int(env, "connect_retries", &retries);
  if (!rc) rc = env->cfg_int(env, "nodelay", &nodelay);
  if (!rc) rc = env->cfg_int(env, "send_thread", &send_thread);
  if (!rc) rc = env->cfg_int(env, "send_threads", &send_threads);
  if (!rc) rc = env->cfg_int(env, "recv_thread", &recv_thread);
  if (rc) return rc;
  const char *ifname = env->cfg_str(env, "ifname");
  if (strlen(ifname) >= sizeof cfg->ifname) {
    env->set_error("tcp: [tcp] ifname = '%s' is longer than an interface "
                   "name can be", ifname);
    return MEP_ERR_CONFIG;
  }
  strcpy(cfg->ifname, ifname);
  cfg->port_lo = (int)lo;
  cfg->port_hi = (int)hi;
  /* auto may depend on nothing that differs between the ranks (their
   * CPUs, say): peers with different counts refuse each other */
  cfg->nsock = nsock ? (int)nsock : env->size <= TCP_AUTO_SOCKS_RANKS ? 2 : 1;
  cfg->retries = (int)retries;
  cfg->nodelay = (int)nodelay;
  cfg->send_thread = (int)send_thread;
  cfg->send_threads = (int)send_threads;
  cfg->recv_thread = (int)recv_thread;
  return 0;
}
