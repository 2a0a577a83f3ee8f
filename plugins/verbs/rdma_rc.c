/* rdma_rc.c - an RC queue pair's steps: INIT on the port, then RTR and
 * RTS towards the peer's numbers (rdma_dev.h). */
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "rdma_dev.h"

uint32_t mep__rdma_psn(void) {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
    v = (uint32_t)(uintptr_t)&v * 2654435761u;
  return v & 0xffffffu;
}

int mep__rdma_rc_init(const mep__rdma_dev_t *d, struct ibv_qp *qp) {
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_INIT,
      .pkey_index = 0,
      .port_num = d->port,
      .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                         (d->atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0),
  };
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                                   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
             ? -1
             : 0;
}

/* A port's link layer (1 or 2, as in mep__rdma_dev_t), for messages. */
static const char *link_name(uint8_t link_layer) {
  return link_layer == 1 ? "InfiniBand" : "Ethernet";
}

int mep__rdma_rc_path(const mep__rdma_dev_t *d, const mep__rdma_path_t *p,
                      const mep__rdma_qpinfo_t *t, enum ibv_mtu *mtu,
                      char *why, size_t len) {
  if (t->link_layer != d->link_layer) {
    snprintf(why, len, "device is on another link layer (%s, this one %s)",
             link_name(t->link_layer), link_name(d->link_layer));
    return MEP_ERR_UNREACHABLE;
  }
  int mine = p->mtu && p->mtu < d->mtu ? p->mtu : d->mtu;
  *mtu = (enum ibv_mtu)(mine < t->mtu ? mine : t->mtu);
  return 0;
}

static int rtr(const mep__rdma_dev_t *d, const mep__rdma_path_t *p,
               struct ibv_qp *qp, const mep__rdma_qpinfo_t *t, int q,
               enum ibv_mtu mtu) {
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_RTR,
      .path_mtu = mtu,
      .dest_qp_num = t->qpn[q],
      .rq_psn = t->psn[q],
      .max_dest_rd_atomic = (uint8_t)d->max_dest_rd_atomic,
      .min_rnr_timer = 12,
      .ah_attr = {.dlid = t->lid, .sl = (uint8_t)p->sl, .port_num = d->port},
  };
  /* RoCE always routes by GID; InfiniBand only across subnets. */
  if (d->link_layer == 2 || memcmp(t->gid, d->gid, 8) != 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, t->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = (uint8_t)p->tclass;
  }
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int rts(const mep__rdma_dev_t *d, const mep__rdma_path_t *p,
               struct ibv_qp *qp, uint32_t my_psn) {
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_RTS,
      .timeout = (uint8_t)p->timeout,
      .retry_cnt = (uint8_t)p->retry,
      .rnr_retry = 7,
      .sq_psn = my_psn,
      .max_rd_atomic = (uint8_t)d->max_rd_atomic,
  };
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

int mep__rdma_rc_up(const mep__rdma_dev_t *d, const mep__rdma_path_t *p,
                    struct ibv_qp *qp, uint32_t my_psn,
                    const mep__rdma_qpinfo_t *t, int q, enum ibv_mtu mtu,
                    const char **step) {
  *step = "RTR";
  if (rtr(d, p, qp, t, q, mtu)) return -1;
  *step = "RTS";
  return rts(d, p, qp, my_psn) ? -1 : 0;
}
