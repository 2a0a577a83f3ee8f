/* bad_abi.c - deliberately unloadable plugins for the loader's tests.
 * Built with BAD_ABI_NEXT_MAJOR, the vtable is complete but claims the
 * next major ABI; built with BAD_ABI_NO_SYMBOL, the module exports its
 * vtable under another name, so mep_transport_plugin_v1 is missing. */
#include "mep/transport.h"

static int bad_init(const mep_tp_env_t *env, mep_tp_ctx_t **ctx) {
  (void)ctx;
  env->set_error("badabi: a test plugin that must never be initialised");
  return MEP_ERR_UNAVAILABLE;
}

static int bad_props(mep_tp_ctx_t *ctx, mep_tp_props_t *props) {
  (void)ctx;
  (void)props;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_address(mep_tp_ctx_t *ctx, void *buf, size_t *len) {
  (void)ctx;
  (void)buf;
  (void)len;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_reachable(mep_tp_ctx_t *ctx, int peer, const void *blob,
                         size_t len, char *why, size_t why_len) {
  (void)ctx;
  (void)peer;
  (void)blob;
  (void)len;
  (void)why;
  (void)why_len;
  return 0;
}

static int bad_connect(mep_tp_ctx_t *ctx, int peer, const void *blob,
                       size_t len, mep_tp_ep_t **ep) {
  (void)ctx;
  (void)peer;
  (void)blob;
  (void)len;
  (void)ep;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len,
                   mep_memkind_t kind, mep_tp_mr_t **mr, void *rkey,
                   size_t *rkey_len) {
  (void)ctx;
  (void)ptr;
  (void)len;
  (void)kind;
  (void)mr;
  (void)rkey;
  (void)rkey_len;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr) {
  (void)ctx;
  (void)mr;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                      mep_tp_rmr_t **rmr) {
  (void)ep;
  (void)rkey;
  (void)len;
  (void)rmr;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr) {
  (void)ep;
  (void)rmr;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
                     mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
                     uint64_t token) {
  (void)ep;
  (void)mr;
  (void)loff;
  (void)rmr;
  (void)roff;
  (void)len;
  (void)token;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                      uint64_t value, mep_signal_op_t op) {
  (void)ep;
  (void)rmr;
  (void)roff;
  (void)value;
  (void)op;
  return MEP_ERR_UNSUPPORTED;
}

static int bad_poll(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max) {
  (void)ctx;
  (void)out;
  (void)max;
  return 0;
}

static int bad_close(mep_tp_ep_t *ep) {
  (void)ep;
  return 0;
}

static int bad_fini(mep_tp_ctx_t *ctx) {
  (void)ctx;
  return 0;
}

#if defined(BAD_ABI_NO_SYMBOL)
#define BAD_SYMBOL mep_transport_plugin_v0
#define BAD_NAME "nosym"
#define BAD_MAJOR MEP_TRANSPORT_ABI_MAJOR
#else
#define BAD_SYMBOL mep_transport_plugin_v1
#define BAD_NAME "badabi"
#define BAD_MAJOR (MEP_TRANSPORT_ABI_MAJOR + 1)
#endif

MEP_API const mep_transport_t BAD_SYMBOL = {
    .abi_major = BAD_MAJOR,
    .abi_minor = MEP_TRANSPORT_ABI_MINOR,
    .struct_size = sizeof(mep_transport_t),
    .name = BAD_NAME,
    .version = "0",
    .init = bad_init,
    .props = bad_props,
    .address = bad_address,
    .reachable = bad_reachable,
    .connect = bad_connect,
    .reg = bad_reg,
    .dereg = bad_dereg,
    .import = bad_import,
    .unimport = bad_unimport,
    .write = bad_write,
    .signal = bad_signal,
    .poll = bad_poll,
    .device_descriptor = NULL,
    .close = bad_close,
    .fini = bad_fini,
};
