/*
 * rdma_dev.h - what the verbs and ibgda plugins share below their own
 * logic: the RDMA device and port they open (which one, its addressing,
 * its limits) and an RC queue pair's steps INIT -> RTR -> RTS towards a
 * peer's numbers (handshake.h carries them). One implementation, built
 * into both plugins (meson: verbs_shared_src).
 */
#ifndef MEP_RDMA_DEV_H
#define MEP_RDMA_DEV_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "handshake.h"
#include "mep/transport.h"

/* The opened device and the port in use. */
typedef struct mep__rdma_dev {
  struct ibv_context *ib;
  struct ibv_pd *pd;
  struct ibv_comp_channel *chan; /* NULL unless asked for (want.channel) */
  char name[64];
  uint8_t port;
  int gid_index;
  uint8_t gid[16];
  uint16_t lid;
  uint8_t link_layer; /* 1 InfiniBand, 2 Ethernet */
  uint8_t mtu;        /* the port's active MTU (enum ibv_mtu) */
  uint32_t max_msg;
  int atomics;
  int max_rd_atomic, max_dest_rd_atomic;
  int max_qp_wr;
  int has_ip; /* the GID is an IPv4-mapped address (RoCE v2) */
  struct in_addr ip;
  uint8_t prefix; /* its subnet's prefix length, 0 if unknown */
  double gbps;    /* the port's link rate, for props */
  int software;   /* rxe or siw: a software device */
} mep__rdma_dev_t;

/* Which device a plugin wants, from its configuration. */
typedef struct mep__rdma_want {
  const mep_tp_env_t *env; /* set_error */
  const char *plugin;      /* "verbs", "ibgda": messages and [section] */
  const char *needs;       /* what to install when no device exists */
  const char *device;      /* "": the first usable */
  int port;                /* 0: the first active */
  int gid_index;           /* -1: automatic (RoCE: the first v2 GID with
                            * an IPv4 address) */
  int channel;             /* also a non-blocking completion channel */
  /* NULL, or whether this device will do (0: no, and why) */
  int (*accept)(struct ibv_device *dev, char *why, size_t len);
} mep__rdma_want_t;

#define MEP__RDMA_ERR(w, code, ...) ((w)->env->set_error(__VA_ARGS__), (code))

/* Opens the first device and port that `w` takes, with a protection
 * domain (and a completion channel if asked): 0, or MEP_ERR_UNAVAILABLE
 * (none usable), MEP_ERR_CONFIG (the one named is not there, or its GID
 * index), MEP_ERR_SYSTEM, the error set. */
int mep__rdma_dev_open(mep__rdma_dev_t *d, const mep__rdma_want_t *w);
void mep__rdma_dev_close(mep__rdma_dev_t *d);
const char *mep__rdma_mtu_name(int mtu);

/* An RC queue pair's path parameters, from the plugin's configuration. */
typedef struct mep__rdma_path {
  int mtu; /* enum ibv_mtu, 0: the port's */
  int sl, tclass, timeout, retry;
} mep__rdma_path_t;

/* INIT: on the device's port, with local write, remote write and (where
 * the device has them) remote atomics. 0 or -1 (errno set). */
int mep__rdma_rc_init(const mep__rdma_dev_t *d, struct ibv_qp *qp);
/* The path towards the peer of `t`: 0 with *mtu the smaller of the two
 * sides' MTU (the configured one or the port's), or MEP_ERR_UNREACHABLE
 * when its device is on another link layer, `why` naming both (for the
 * plugin's own message). */
int mep__rdma_rc_path(const mep__rdma_dev_t *d, const mep__rdma_path_t *p,
                      const mep__rdma_qpinfo_t *t, enum ibv_mtu *mtu,
                      char *why, size_t len);
/* RTR then RTS towards queue pair q of the peer's `t`, starting this
 * side's sends at my_psn: 0, or -1 with *step "RTR" or "RTS" (errno
 * set). */
int mep__rdma_rc_up(const mep__rdma_dev_t *d, const mep__rdma_path_t *p,
                    struct ibv_qp *qp, uint32_t my_psn,
                    const mep__rdma_qpinfo_t *t, int q, enum ibv_mtu mtu,
                    const char **step);
/* A random 24-bit starting packet sequence number. */
uint32_t mep__rdma_psn(void);

#endif
