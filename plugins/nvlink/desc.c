/* desc.c - the nvlink transport's device descriptors (MEP_DEV_PTR): the
 * peer part says kernels on this GPU reach the peer's GPU, the region part
 * is the address the imported region is mapped at. */
#include <string.h>

#include "nvlink.h"

static int put(const void *part, size_t n, void *desc, size_t *len) {
  if (*len < n) return MEP_ERR_INVALID;
  memcpy(desc, part, n);
  *len = n;
  return 0;
}

int mep__nvl_device_descriptor(mep_tp_ctx_t *ctxp, int peer, void *desc,
                               size_t *len) {
  nvl_ctx_t *ctx = ctxp;
  if (!ctx || !desc || !len) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: device descriptor: rank "
                   "%d in a group of %d", peer, ctx->size);
  pthread_mutex_lock(&ctx->mu);
  const nvl_ep_t *ep = ctx->eps[peer];
  int open = ep && !ep->closed, dev = open ? ep->peer_dev : -1;
  pthread_mutex_unlock(&ctx->mu);
  if (!open)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: device descriptor: rank "
                   "%d is not connected", peer);
  /* Kernels cannot load from another GPU's memory without peer access;
   * both ranks read the same [nvlink] enable_peer_access. */
  if (dev >= 0 && !ctx->peer_access)
    return NVL_ERR(ctx, MEP_ERR_UNREACHABLE, "nvlink: rank %d's GPU is "
                   "reached by copies only ([nvlink] enable_peer_access = "
                   "0)", peer);
  mep_dev_ptr_peer_t part = {
      .hdr = {MEP_DEV_PTR, MEP_DEV_PTR_VERSION, sizeof part},
      .device = dev,
      .flags = dev >= 0 ? MEP_DEV_PTR_PEER_ACCESS : 0,
  };
  if (put(&part, sizeof part, desc, len))
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: device descriptor: %zu "
                   "bytes of room, %zu needed", *len, sizeof part);
  return 0;
}

int mep__nvl_device_region(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp, void *desc,
                           size_t *len) {
  nvl_ep_t *ep = epp;
  nvl_rmr_t *r = rmrp;
  void *base = NULL;
  if (!desc || !len) return MEP_ERR_INVALID;
  int rc = mep__nvl_map(ep, r, &base);
  if (rc) return rc;
  mep_dev_ptr_region_t part = {
      .hdr = {MEP_DEV_PTR, MEP_DEV_PTR_VERSION, sizeof part},
      .base = (uint64_t)(uintptr_t)base,
      .len = r->len,
  };
  if (put(&part, sizeof part, desc, len))
    return NVL_ERR(ep->ctx, MEP_ERR_INVALID, "nvlink: device region: %zu "
                   "bytes of room, %zu needed", *len, sizeof part);
  return 0;
}
