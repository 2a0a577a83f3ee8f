/* rdma_dev.c - the RDMA device, its port and GID: which ones, what they
 * can do, and where they are on the network. Shared by the verbs and ibgda
 * plugins (rdma_dev.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <string.h>

#include "rdma_dev.h"

#define ERR MEP__RDMA_ERR

const char *mep__rdma_mtu_name(int mtu) {
  switch (mtu) {
  case IBV_MTU_256: return "256";
  case IBV_MTU_512: return "512";
  case IBV_MTU_1024: return "1024";
  case IBV_MTU_2048: return "2048";
  case IBV_MTU_4096: return "4096";
  }
  return "?";
}

/* GB/s of the port's link, from its width and per-lane speed codes. */
static double link_rate(const struct ibv_port_attr *pa) {
  double lanes = pa->active_width == 1 ? 1 : pa->active_width == 2 ? 4
               : pa->active_width == 4 ? 8 : pa->active_width == 8 ? 12
               : pa->active_width == 16 ? 2 : 1;
  double gbit;
  switch (pa->active_speed) {
  case 1: gbit = 2.5; break;
  case 2: gbit = 5; break;
  case 4: case 8: gbit = 10; break;
  case 16: gbit = 14.0625; break;
  case 32: gbit = 25.78; break;
  case 64: gbit = 50; break;
  case 128: gbit = 100; break;
  default: gbit = 200; break;
  }
  return lanes * gbit / 8;
}

static int is_v4_mapped(const uint8_t g[16]) {
  static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g, pre, 12) == 0;
}

/* The prefix length of the interface that holds ip, 0 if none does. */
static uint8_t subnet_of(struct in_addr ip) {
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all)) return 0;
  uint8_t bits = 0;
  for (struct ifaddrs *i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != AF_INET)
      continue;
    const struct sockaddr_in *a = (const void *)i->ifa_addr;
    const struct sockaddr_in *m = (const void *)i->ifa_netmask;
    if (a->sin_addr.s_addr != ip.s_addr) continue;
    bits = (uint8_t)__builtin_popcount(m->sin_addr.s_addr);
    break;
  }
  freeifaddrs(all);
  return bits;
}

/* RoCE: the configured GID index, or the first RoCE v2 GID with an IPv4
 * address, else the first RoCE v2 GID, else index 0. */
static int pick_gid(mep__rdma_dev_t *d, const mep__rdma_want_t *w,
                    const struct ibv_port_attr *pa) {
  int pick = w->gid_index;
  if (pick < 0) {
    int v2 = -1, v2ip = -1;
    for (int i = 0; i < pa->gid_tbl_len && v2ip < 0; i++) {
      struct ibv_gid_entry e;
      if (ibv_query_gid_ex(d->ib, d->port, (uint32_t)i, &e, 0) ||
          e.gid_type != IBV_GID_TYPE_ROCE_V2)
        continue;
      if (v2 < 0) v2 = i;
      if (is_v4_mapped(e.gid.raw)) v2ip = i;
    }
    pick = v2ip >= 0 ? v2ip : v2 >= 0 ? v2 : 0;
  }
  union ibv_gid g;
  if (ibv_query_gid(d->ib, d->port, pick, &g))
    return ERR(w, MEP_ERR_CONFIG, "%s: GID index %d%s: %s port %u has no "
               "such GID", w->plugin, pick,
               w->gid_index >= 0 ? " (gid_index)" : "", d->name, d->port);
  d->gid_index = pick;
  memcpy(d->gid, g.raw, 16);
  return 0;
}

static int pick_addressing(mep__rdma_dev_t *d, const mep__rdma_want_t *w,
                           const struct ibv_port_attr *pa) {
  d->link_layer = pa->link_layer == IBV_LINK_LAYER_ETHERNET ? 2 : 1;
  d->lid = pa->lid;
  if (d->link_layer == 2) {
    int rc = pick_gid(d, w, pa);
    if (rc) return rc;
  } else {
    union ibv_gid g;
    d->gid_index = w->gid_index >= 0 ? w->gid_index : 0;
    if (ibv_query_gid(d->ib, d->port, d->gid_index, &g))
      return ERR(w, MEP_ERR_CONFIG, "%s: gid_index = %d: %s port %u has no "
                 "such GID", w->plugin, d->gid_index, d->name, d->port);
    memcpy(d->gid, g.raw, 16);
  }
  d->has_ip = is_v4_mapped(d->gid);
  if (d->has_ip) {
    memcpy(&d->ip, d->gid + 12, 4);
    d->prefix = subnet_of(d->ip);
  }
  return 0;
}

/* The configured port if it is active, else the first active one: its
 * number, or 0 (why says why not). */
static int pick_port(struct ibv_context *ib, int want, int nports,
                     struct ibv_port_attr *pa, char *why, size_t n) {
  for (int p = want ? want : 1; p <= (want ? want : nports); p++) {
    if (p > nports) {
      snprintf(why, n, "has no port %d (it has %d)", p, nports);
      return 0;
    }
    if (ibv_query_port(ib, (uint8_t)p, pa)) {
      snprintf(why, n, "port %d cannot be queried: %s", p, strerror(errno));
      continue;
    }
    if (pa->state == IBV_PORT_ACTIVE) return p;
    snprintf(why, n, "port %d is %s", p, ibv_port_state_str(pa->state));
  }
  return 0;
}

static void fill_caps(mep__rdma_dev_t *d, const struct ibv_device_attr *da,
                      const struct ibv_port_attr *pa) {
  d->mtu = (uint8_t)pa->active_mtu;
  d->max_msg = pa->max_msg_sz;
  d->atomics = da->atomic_cap != IBV_ATOMIC_NONE;
  d->max_rd_atomic = da->max_qp_init_rd_atom > 16 ? 16
                                                  : da->max_qp_init_rd_atom;
  d->max_dest_rd_atomic = da->max_qp_rd_atom > 16 ? 16 : da->max_qp_rd_atom;
  d->max_qp_wr = da->max_qp_wr;
  d->gbps = link_rate(pa);
  d->software = strncmp(d->name, "rxe", 3) == 0 ||
                strncmp(d->name, "siw", 3) == 0;
}

/* Opens `dev` if it has a usable port: 1 done, 0 not usable (why). */
static int try_device(mep__rdma_dev_t *d, const mep__rdma_want_t *w,
                      struct ibv_device *dev, char *why, size_t n) {
  if (w->accept && !w->accept(dev, why, n)) return 0;
  struct ibv_context *ib = ibv_open_device(dev);
  if (!ib) {
    snprintf(why, n, "%s cannot be opened: %s", ibv_get_device_name(dev),
             strerror(errno));
    return 0;
  }
  struct ibv_device_attr da;
  struct ibv_port_attr pa;
  char pwhy[128] = "has no port";
  int port = 0;
  if (ibv_query_device(ib, &da))
    snprintf(pwhy, sizeof pwhy, "cannot be queried: %s", strerror(errno));
  else
    port = pick_port(ib, w->port, da.phys_port_cnt, &pa, pwhy,
                     sizeof pwhy);
  if (!port) {
    snprintf(why, n, "%s %s", ibv_get_device_name(dev), pwhy);
    ibv_close_device(ib);
    return 0;
  }
  d->ib = ib;
  d->port = (uint8_t)port;
  snprintf(d->name, sizeof d->name, "%s", ibv_get_device_name(dev));
  fill_caps(d, &da, &pa);
  return pick_addressing(d, w, &pa) ? -1 : 1;
}

static int open_resources(mep__rdma_dev_t *d, const mep__rdma_want_t *w) {
  d->pd = ibv_alloc_pd(d->ib);
  int ok = d->pd != NULL;
  if (ok && w->channel) {
    d->chan = ibv_create_comp_channel(d->ib);
    ok = d->chan &&
         !fcntl(d->chan->fd, F_SETFL,
                fcntl(d->chan->fd, F_GETFL) | O_NONBLOCK) &&
         !fcntl(d->ib->async_fd, F_SETFL,
                fcntl(d->ib->async_fd, F_GETFL) | O_NONBLOCK);
  }
  if (!ok)
    return ERR(w, MEP_ERR_SYSTEM, "%s: %s: allocating a protection domain%s "
               "failed: %s", w->plugin, d->name,
               w->channel ? " or completion channel" : "", strerror(errno));
  return 0;
}

int mep__rdma_dev_open(mep__rdma_dev_t *d, const mep__rdma_want_t *w) {
  memset(d, 0, sizeof *d);
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    int e = errno;
    if (list) ibv_free_device_list(list);
    return ERR(w, MEP_ERR_UNAVAILABLE, "%s: no RDMA device (libibverbs "
               "lists none%s%s): %s", w->plugin, list ? "" : ": ",
               list ? "" : strerror(e), w->needs);
  }
  char why[256] = "", names[256] = "";
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const char *name = ibv_get_device_name(list[i]);
    size_t len = strlen(names);
    snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", name);
    if (w->device[0] && strcmp(w->device, name) != 0) continue;
    rc = try_device(d, w, list[i], why, sizeof why);
  }
  ibv_free_device_list(list);
  if (rc < 0) return MEP_ERR_CONFIG;
  if (rc == 0 && w->device[0] && !why[0])
    return ERR(w, MEP_ERR_CONFIG, "%s: [%s] device = %s: no such RDMA device "
               "(found: %s)", w->plugin, w->plugin, w->device, names);
  if (rc == 0)
    return ERR(w, MEP_ERR_UNAVAILABLE, "%s: no usable RDMA %s (%s)",
               w->plugin, w->accept ? "device" : "port", why);
  return open_resources(d, w);
}

void mep__rdma_dev_close(mep__rdma_dev_t *d) {
  if (d->chan) ibv_destroy_comp_channel(d->chan);
  if (d->pd) ibv_dealloc_pd(d->pd);
  if (d->ib) ibv_close_device(d->ib);
  d->chan = NULL;
  d->pd = NULL;
  d->ib = NULL;
}
