/* ep_normal_cuda.c - the normal mode's CUDA path, host side: the device
 * window cut as ep_normal.c cuts host memory, the kernels' state, and the
 * launches of the count exchange, dispatch and combine (kernels in
 * ep_normal_notify.cu, ep_normal_dispatch.cu and ep_normal_combine.cu).
 * A call fills kernel arguments and queues work on its stream; the count
 * exchange then waits for the two numbers the host needs. A dispatch after
 * a host exchange copies its counts to the device first (stream-ordered,
 * from pageable memory the copy has taken when it returns). */
#include <cuda_runtime_api.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ep_cuda.h"
#include "ep_normal.h"
#include "ep_normal_k.h"
#include "ep_util.h"

struct mep__epn_cuda {
  mep_devwin_t *win;
  const mep_dev_win_t *dwin; /* device */
  int has_proxy, has_mlx5, sms;
  int wide_recv;             /* the dispatch receive spreads over every SM
                              * (MEP_EP_NORMAL_WIDE_RECV=0: no) */
  void *mem;                 /* one allocation for the three below */
  mep__epn_state_t *st;
  int32_t *active;           /* [R] */
  int32_t *rpm;              /* [R][R] + [R] source tokens: a non-cached
                              * dispatch's counts */
  int32_t *host;             /* pageable [R][R] + [R]: their staging */
  mep__epn_nres_t *res;      /* mapped: the count exchange's results */
  mep__epn_nres_t *res_dev;  /* their device address */
  uint64_t nseq;             /* count exchanges queued */
};

static int fail(mep_ep_normal_t *b, int code, cudaError_t e,
                const char *what) {
  return mep_set_error(code, 0, "mep_ep normal mode (CUDA path) on rank %d: "
                       "%s: %s", b->rank, what, cudaGetErrorString(e));
}

int mep__epn_cuda_create(mep_ep_normal_t *b) {
  int R = b->size;
  if (R > MEP__EPN_MAX_RANKS)
    return mep_set_error(MEP_ERR_INVALID, 0, "mep_ep_normal_create: %d "
                         "ranks; the CUDA path takes at most %d", R,
                         MEP__EPN_MAX_RANKS);
  struct mep__epn_cuda *cu = calloc(1, sizeof *cu);
  if (!cu)
    return mep_set_error(MEP_ERR_NOMEM, 0, "mep_ep_normal_create: no memory");
  b->cuda = cu;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&cu->sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess)
    return fail(b, MEP_ERR_UNSUPPORTED, e, "no usable CUDA device");
  cu->wide_recv = !mep__ep_env_off("MEP_EP_NORMAL_WIDE_RECV");
  size_t rr = (size_t)R, o_act = mep__ep_round16(sizeof(mep__epn_state_t));
  size_t o_rpm = o_act + mep__ep_round16(rr * 4);
  size_t bytes = o_rpm + (rr * rr + rr) * 4;
  cu->host = malloc((rr * rr + rr) * 4);
  if (!cu->host)
    return mep_set_error(MEP_ERR_NOMEM, 0, "mep_ep_normal_create: no memory");
  if ((e = cudaMalloc(&cu->mem, bytes)) != cudaSuccess)
    return fail(b, MEP_ERR_NOMEM, e, "allocating the kernels' state");
  if ((e = cudaHostAlloc((void **)&cu->res, sizeof *cu->res,
                         cudaHostAllocMapped)) != cudaSuccess ||
      (e = cudaHostGetDevicePointer((void **)&cu->res_dev, cu->res, 0)) !=
          cudaSuccess)
    return fail(b, MEP_ERR_NOMEM, e, "allocating the count exchange's "
                "mapped results");
  memset(cu->res, 0, sizeof *cu->res);
  uint8_t *m = cu->mem;
  cu->st = (mep__epn_state_t *)m;
  cu->active = (int32_t *)(m + o_act);
  cu->rpm = (int32_t *)(m + o_rpm);
  e = cudaMemset(m, 0, bytes);
  if (e == cudaSuccess)
    e = cudaMemcpy(cu->active, b->active, rr * 4, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return fail(b, MEP_ERR_SYSTEM, e, "the state");
  int rc = mep_devwin_create(b->comm, (size_t)b->lay.total, &cu->win);
  if (rc)
    return mep_set_error(rc, 1, "mep_ep_normal_create: the device window of "
                         "%llu bytes on rank %d",
                         (unsigned long long)b->lay.total, b->rank);
  cu->dwin = mep_devwin_device(cu->win);
  cu->has_proxy = mep_devwin_host_base(cu->win) != NULL;
  cu->has_mlx5 = mep__ep_win_has_mlx5(cu->win, b->size);
  /* the memset ran on the legacy stream, which the caller's non-blocking
   * streams do not wait for */
  if ((e = cudaDeviceSynchronize()) != cudaSuccess)
    return fail(b, MEP_ERR_SYSTEM, e, "setting up the buffer");
  return 0;
}

void mep__epn_cuda_destroy(mep_ep_normal_t *b) {
  struct mep__epn_cuda *cu = b->cuda;
  if (!cu) return;
  mep__ep_devwin_leave(b->comm, cu->win, "mep_ep_normal_destroy", b->rank);
  if (cu->win) mep_devwin_destroy(cu->win);
  if (cu->mem) cudaFree(cu->mem);
  if (cu->res) cudaFreeHost(cu->res);
  free(cu->host);
  free(cu);
  b->cuda = NULL;
}

int32_t *mep__epn_cuda_active(mep_ep_normal_t *b) { return b->cuda->active; }

int mep__epn_cuda_sync_active(mep_ep_normal_t *b, int32_t *host,
                              int to_host) {
  size_t n = (size_t)b->size * 4;
  cudaError_t e = to_host ? cudaMemcpy(host, b->cuda->active, n,
                                       cudaMemcpyDeviceToHost)
                          : cudaMemcpy(b->cuda->active, host, n,
                                       cudaMemcpyHostToDevice);
  return e == cudaSuccess ? 0
                          : fail(b, MEP_ERR_SYSTEM, e,
                                 "copying the active ranks");
}

/* An argument and the alignment the kernels' accesses need. */
typedef struct aligned {
  const char *what;
  const void *p;
  uintptr_t a;
} aligned_t;

static int check_aligned(const char *fn, const aligned_t *al, size_t n) {
  int rc = 0;
  for (size_t i = 0; !rc && i < n; i++)
    rc = mep__ep_check_align(fn, al[i].what, al[i].p, al[i].a);
  return rc;
}

/* What both operations' kernels take (the rest zeroed). */
static void fill_common(mep_ep_normal_t *b, int32_t *active,
                        int64_t timeout_us, mep__epn_k_t *k) {
  const mep__epn_lay_t *l = &b->lay;
  struct mep__epn_cuda *cu = b->cuda;
  memset(k, 0, sizeof *k);
  k->win = cu->dwin;
  k->st = cu->st;
  k->rank = b->rank;
  k->R = b->size;
  k->has_proxy = cu->has_proxy;
  k->has_mlx5 = cu->has_mlx5;
  k->active = active;
  /* 2^62 ns is beyond any deadline that matters, and cannot overflow */
  k->timeout_ns = timeout_us >= ((int64_t)1 << 62) / 1000
                      ? (uint64_t)1 << 62
                      : (uint64_t)timeout_us * 1000u;
  k->P = l->pair;
  k->drecv = l->drecv;
  k->crecv = l->crecv;
  k->dstage = l->dstage;
  k->cstage = l->cstage;
  k->dsig = l->dsig;
  k->csig = l->csig;
  k->agree = l->cnt;
  k->agree_slot = l->cw;
  /* after the agreement words of dispatch, combine and the count exchange
   * (epn_agree); the combine's phase words at the slot's end */
  k->prog = 8 * MEP__EPN_AGREE_KINDS * (((uint64_t)b->size + 31) / 32);
  k->cprog = (l->cw - 8 * MEP__EPN_CPHASES) & ~(uint64_t)7;
}

/* Send blocks the dispatch's progress words have room for: a word of the
 * source, then two per block, before the combine's phase words. */
static int prog_blocks(const mep__epn_k_t *k) {
  return (int)((k->cprog - k->prog - 8) / 16);
}

static int clampi(int v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* Blocks of a send over `rows` rows: the config's SMs (2 x channels,
 * DeepEP's num_sms: what the transfer may take from computation), or every
 * SM without one; at least one. */
static int blocks_for(const mep_ep_normal_t *b, int channels, int rows) {
  int want = channels > 0 ? 2 * channels : b->cuda->sms;
  return clampi(want < rows ? want : rows, 1, 4 * b->cuda->sms);
}

/* SMs of a receive, which runs beside the send (the dispatch's copies
 * each row as it comes, combine's sums each token once its rows are in):
 * those the send leaves (all of them where the send takes most); the
 * launch puts as many blocks on each as fit.
 * MEP_EP_NORMAL_WIDE_RECV=0 holds it to the config's SMs instead (a
 * diagnosis aid: the copy then trails the send). */
static int recv_sms(const mep_ep_normal_t *b, int channels, int send) {
  int sms = b->cuda->sms, left = sms - send;
  if (!b->cuda->wide_recv) return blocks_for(b, channels, sms);
  return left >= sms / 4 ? left : sms;
}

static int launched(mep_ep_normal_t *b, int err, const char *what) {
  return err ? fail(b, MEP_ERR_SYSTEM, (cudaError_t)err, what) : 0;
}

/* Waits until the exchange's kernel has published call seq's results:
 * 0, or MEP_ERR_TIMEOUT past deadline_us. Spins first (the kernel is
 * usually microseconds away), then yields the core. */
static int wait_results(mep_ep_normal_t *b, uint64_t seq,
                        uint64_t deadline_us) {
  const volatile uint64_t *p = &b->cuda->res->seq;
  for (unsigned n = 0;; n++) {
    if (__atomic_load_n(p, __ATOMIC_ACQUIRE) >= seq) return 0;
    if ((n & 1023) == 1023) {
      if (mep__ep_now_us() > deadline_us)
        return mep_set_error(MEP_ERR_TIMEOUT, 0, "mep_ep_notify_dispatch "
                             "on rank %d: the count exchange's kernel did "
                             "not finish in time (the stream is blocked, or "
                             "the GPU is)", b->rank);
      if (n > (1u << 20)) sched_yield();
    }
  }
}

int mep__epn_cuda_notify(mep_ep_normal_t *b, const mep_ep_notify_args_t *a,
                         int32_t *active, int64_t timeout_us) {
  const char *fn = "mep_ep_notify_dispatch";
  struct mep__epn_cuda *cu = b->cuda;
  const aligned_t al[] = {{"num_tokens_per_rank", a->num_tokens_per_rank, 4},
            {"num_tokens_per_expert", a->num_tokens_per_expert, 4},
            {"rank_prefix_matrix", a->rank_prefix_matrix, 4},
            {"channel_prefix_matrix", a->channel_prefix_matrix, 4},
            {"active_ranks", active, 4}};
  int rc = check_aligned(fn, al, sizeof al / sizeof al[0]);
  if (rc) return rc;
  mep__epn_k_t k;
  fill_common(b, active, timeout_us, &k);
  k.num_tokens = a->num_tokens;
  k.in_rank = a->is_token_in_rank;
  k.L = a->num_experts / b->size;
  k.C = a->num_channels;
  k.E = a->num_experts;
  k.align = a->expert_alignment;
  k.dmsg = mep__epn_dmsg_bytes(a->hidden, a->x_elem_size, a->num_scales,
                               a->num_topk);
  k.cmsg = mep__epn_cmsg_bytes(a->hidden, a->num_topk);
  k.per_rank = a->num_tokens_per_rank;
  k.per_expert = a->num_tokens_per_expert;
  k.rpm_out = a->rank_prefix_matrix;
  k.cpm_out = a->channel_prefix_matrix;
  k.counts = cu->rpm;
  k.res = cu->res_dev;
  k.nsig = b->lay.nsig;
  k.ncnt = b->lay.ncnt;
  k.cnt_stage = b->lay.cnt_stage;
  k.slot = b->lay.cw;
  rc = launched(b, mep__epn_launch_notify(&k, a->stream),
                "mep_ep_notify_dispatch: launching the kernel");
  if (rc) return rc;
  uint64_t seq = ++cu->nseq;
  /* the kernel waits for its sources, then for the agreement, each
   * under the timeout; the margin covers the work queued before it. A
   * timeout of 2^40 us (12 days) is as good as none and cannot overflow */
  uint64_t t = timeout_us < ((int64_t)1 << 40) ? (uint64_t)timeout_us
                                               : (uint64_t)1 << 40;
  rc = wait_results(b, seq, mep__ep_now_us() + 2 * t + 10000000u);
  if (rc) return rc;
  const mep__epn_nres_t *res = cu->res;
  if (res->other >= 0)
    return mep__epn_shape_error(res->other, res->shape, (int)k.E,
                                (int)k.dmsg, (int)k.cmsg, fn);
  if (res->bad >= 0) return mep__epn_status_error(b, res->bad, fn);
  uint64_t big = k.dmsg > k.cmsg ? k.dmsg : k.cmsg;
  rc = mep__epn_pair_error(b, res->worst_s, res->worst_r, res->worst, big,
                           fn, "tokens");
  if (rc) return rc;
  *a->num_recv_tokens = res->nrecv;
  memcpy(a->num_recv_tokens_per_expert, res->per_expert,
         sizeof(int32_t) * (size_t)k.L);
  b->nrecv = res->nrecv;
  b->worst = res->worst;
  b->worst_s = res->worst_s;
  b->worst_r = res->worst_r;
  b->notified = 2;
  return 0;
}

/* The host notify's counts as a rank_prefix_matrix, and the sources'
 * token counts, into cu->rpm for the kernels (stream-ordered). */
static int upload_counts(mep_ep_normal_t *b, const int32_t *counts,
                         void *stream) {
  struct mep__epn_cuda *cu = b->cuda;
  int R = b->size;
  for (int r = 0; r < R; r++) {
    int32_t run = 0;
    for (int s = 0; s < R; s++) {
      run += counts[s * R + r];
      cu->host[s * R + r] = run;
    }
  }
  memcpy(cu->host + (size_t)R * R, b->src_tokens, (size_t)R * 4);
  cudaError_t e = cudaMemcpyAsync(cu->rpm, cu->host, ((size_t)R * R + R) * 4,
                                  cudaMemcpyHostToDevice,
                                  (cudaStream_t)stream);
  return e == cudaSuccess ? 0 : fail(b, MEP_ERR_SYSTEM, e,
                                     "copying the counts");
}

int mep__epn_cuda_dispatch(mep_ep_normal_t *b,
                           const mep_ep_normal_dispatch_args_t *a,
                           const int32_t *host_counts, int32_t *active,
                           int64_t timeout_us) {
  const char *fn = "mep_ep_normal_dispatch";
  struct mep__epn_cuda *cu = b->cuda;
  int R = b->size;
  const aligned_t al[] = {{"x", a->x, 16},
            {"x_scales", a->x_scales, 4},
            {"topk_idx", a->topk_idx, 8},
            {"topk_weights", a->topk_weights, 4},
            {"recv_x", a->recv_x, 16},
            {"recv_x_scales", a->recv_x_scales, 4},
            {"recv_topk_idx", a->recv_topk_idx, 8},
            {"recv_topk_weights", a->recv_topk_weights, 4},
            {"send_head", a->send_head, 4},
            {"active_ranks", active, 4}};
  int rc = check_aligned(fn, al, sizeof al / sizeof al[0]);
  if (rc) return rc;
  mep__epn_k_t k;
  fill_common(b, active, timeout_us, &k);
  if (a->cached_rank_prefix_matrix) {
    k.rpm = a->cached_rank_prefix_matrix;
  } else {
    /* the notify's counts, in cu->rpm: the exchange's kernel left them
     * there, or the host's are copied there now */
    rc = host_counts ? upload_counts(b, host_counts, a->stream) : 0;
    if (rc) return rc;
    k.rpm = cu->rpm;
    k.src_tokens = cu->rpm + (size_t)R * R;
    k.rcpm = a->recv_channel_prefix_matrix;
    k.C = a->num_channels;
  }
  k.num_tokens = a->num_tokens;
  k.x = a->x;
  k.hidden = a->hidden;
  k.es = a->x_elem_size;
  k.num_scales = a->num_scales;
  k.x_scales = a->x_scales;
  k.sts = a->scale_token_stride;
  k.shs = a->scale_hidden_stride;
  k.topk_idx = a->topk_idx;
  k.topk_w = a->topk_weights;
  k.K = a->num_topk;
  k.L = a->num_topk > 0 ? a->num_experts / R : 1;
  k.in_rank = a->is_token_in_rank;
  k.send_head = a->send_head;
  k.dmsg = mep__epn_dmsg_bytes(a->hidden, a->x_elem_size, a->num_scales,
                               a->num_topk);
  k.idx_off = mep__epn_dmsg_idx_off(a->hidden, a->x_elem_size, a->num_scales);
  k.recv_x = a->recv_x;
  k.recv_scales = a->recv_x_scales;
  k.recv_src = a->recv_src_idx;
  k.recv_topk = a->recv_topk_idx;
  k.recv_w = a->recv_topk_weights;
  k.send_blocks = blocks_for(b, a->num_channels, a->num_tokens);
  if (k.send_blocks > prog_blocks(&k)) k.send_blocks = prog_blocks(&k);
  k.recv_blocks = recv_sms(b, a->num_channels, k.send_blocks);
  k.recv_rows = a->recv_capacity;
  return launched(b, mep__epn_launch_dispatch(&k, a->stream),
                  "mep_ep_normal_dispatch: launching the kernels");
}

int mep__epn_cuda_combine(mep_ep_normal_t *b,
                          const mep_ep_normal_combine_args_t *a, int channels,
                          int32_t *active, int64_t timeout_us) {
  const char *fn = "mep_ep_normal_combine";
  const aligned_t al[] = {{"x", a->x, 16},
            {"topk_weights", a->topk_weights, 4},
            {"bias_0", a->bias_0, 16},
            {"bias_1", a->bias_1, 16},
            {"combined_x", a->combined_x, 16},
            {"combined_topk_weights", a->combined_topk_weights, 4},
            {"send_head", a->send_head, 4},
            {"rank_prefix_matrix", a->rank_prefix_matrix, 4},
            {"active_ranks", active, 4}};
  int rc = check_aligned(fn, al, sizeof al / sizeof al[0]);
  if (rc) return rc;
  mep__epn_k_t k;
  fill_common(b, active, timeout_us, &k);
  k.rpm = a->rank_prefix_matrix;
  k.num_tokens = a->num_tokens;
  k.send_head_in = a->send_head;
  k.hidden = a->hidden;
  k.K = a->num_topk;
  k.cx = a->x;
  k.cw = a->topk_weights;
  k.bias0 = a->bias_0;
  k.bias1 = a->bias_1;
  k.out = a->combined_x;
  k.out_w = a->combined_topk_weights;
  k.cmsg = mep__epn_cmsg_bytes(a->hidden, a->num_topk);
  k.send_blocks = blocks_for(b, channels, a->num_recv_tokens);
  k.recv_blocks = recv_sms(b, channels, k.send_blocks);
  int t = (a->hidden / 8 + 31) / 32 * 32;
  k.recv_threads = clampi(t, 64, 512);
  return launched(b, mep__epn_launch_combine(&k, a->stream),
                  "mep_ep_normal_combine: launching the kernels");
}

int mep__epn_cuda_layout(const mep_ep_layout_args_t *a) {
  const aligned_t al[] = {{"topk_idx", a->topk_idx, 8},
            {"num_tokens_per_rank", a->num_tokens_per_rank, 4},
            {"num_tokens_per_rdma_rank", a->num_tokens_per_rdma_rank, 4},
            {"num_tokens_per_expert", a->num_tokens_per_expert, 4}};
  int rc = check_aligned("mep_ep_get_dispatch_layout", al,
                         sizeof al / sizeof al[0]);
  if (rc) return rc;
  mep__epn_layout_k_t k;
  memset(&k, 0, sizeof k);
  k.topk_idx = a->topk_idx;
  k.N = a->num_tokens;
  k.K = a->num_topk;
  k.E = a->num_experts;
  k.R = a->num_ranks;
  k.L = a->num_experts / a->num_ranks;
  if (a->num_tokens_per_rdma_rank) {
    k.rph = a->ranks_per_host;
    k.H = a->num_ranks / a->ranks_per_host;
  }
  k.per_rank = a->num_tokens_per_rank;
  k.per_host = a->num_tokens_per_rdma_rank;
  k.per_expert = a->num_tokens_per_expert;
  k.in_rank = a->is_token_in_rank;
  int e = mep__epn_launch_layout(&k, a->stream);
  if (e)
    return mep_set_error(MEP_ERR_SYSTEM, 0, "mep_ep_get_dispatch_layout: "
                         "queueing the layout on the GPU: %s",
                         cudaGetErrorString((cudaError_t)e));
  return 0;
}
