/* ep_host_dispatch.c - dispatch on the CPU path. Send: each token's row
 * [token | pad | data] is built once in its stage slot and put once into
 * every rank one of its experts lives on, at (half, this rank, token);
 * each (token, expert) takes the expert's next slot, and the token's
 * index goes into that slot of the index stage, laid out as at the
 * destination; then each active rank gets, in a few messages instead of
 * one per expert, its index words, the count words (seq, count) of its
 * experts but the last, and the last signalled. Zero counts are sent
 * too, so "0 tokens" differs from "not yet". Receive: each active
 * source's last count word under one deadline (its other words and its
 * index were put before it), then the rows the index names unpacked
 * into the layouts of ep.h. */
#include <string.h>

#include "ep_fp8.h"
#include "ep_host.h"
#include "ep_util.h"

static const char *const FN = "mep_ep_dispatch";

/* Builds the message of token t in its stage slot (t, 0); returns its
 * length. */
static size_t build_msg(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                        int t) {
  size_t H = (size_t)b->cfg.hidden;
  char *m = (char *)b->host->mem + mep__ep_disp_stage(&b->lay, t, 0);
  const uint16_t *x = (const uint16_t *)a->x + (size_t)t * H;
  int32_t t32 = t;
  memset(m, 0, MEP_EP_MSG_HEADER);
  memcpy(m, &t32, sizeof t32);
  m += MEP_EP_MSG_HEADER;
  if (!(a->flags & MEP_EP_FP8)) {
    memcpy(m, x, 2 * H);
    return MEP_EP_MSG_HEADER + 2 * H;
  }
  /* codes, then hidden / 128 float scales; 64 groups at a time */
  size_t G = H / MEP_EP_FP8_GROUP;
  float s[64];
  for (size_t g0 = 0; g0 < G; g0 += 64) {
    size_t ng = G - g0 < 64 ? G - g0 : 64;
    mep__ep_quantize_row(x + g0 * MEP_EP_FP8_GROUP,
                         (int)(ng * MEP_EP_FP8_GROUP),
                         !!(a->flags & MEP_EP_ROUND_SCALE),
                         (uint8_t *)m + g0 * MEP_EP_FP8_GROUP, s);
    memcpy(m + H + g0 * sizeof(float), s, ng * sizeof(float));
  }
  return MEP_EP_MSG_HEADER + H + G * sizeof(float);
}

/* Token t's row to every active rank its experts live on, once each,
 * and its index into each expert's next slot (staged; sent by
 * send_counts). */
static int send_token(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                      const mep__ep_call_t *c, int half, int t) {
  struct mep__ep_host *h = b->host;
  int L = b->lay.local, K = a->num_topk, T = b->cfg.max_tokens_per_rank;
  int sent[MEP_EP_STAGE_TOPK], ns = 0;
  size_t len = 0;
  for (int k = 0; k < K; k++) {
    int64_t e = a->topk_idx[(size_t)t * K + k];
    int dst = (int)(e / L);
    if (e < 0 || !c->active[dst]) continue;
    /* more than T only with tokens naming one expert twice: the extra
     * copies are dropped, as on the CUDA path */
    if (h->counts[e] >= (uint32_t)T) continue;
    uint32_t slot = h->counts[e]++;
    int32_t t32 = t;
    memcpy((char *)h->mem + mep__ep_index_stage(&b->lay, (int)e, (int)slot),
           &t32, sizeof t32);
    int seen = 0;
    for (int i = 0; i < ns; i++) seen |= sent[i] == dst;
    if (seen) continue;
    sent[ns++] = dst;
    if (!len) len = build_msg(b, a, t);
    int rc = mep_put(b->comm, dst, h->region,
                     mep__ep_disp_stage(&b->lay, t, 0), h->region,
                     mep__ep_disp_token(&b->lay, half, b->rank, t), len);
    if (rc && (rc = mep__ep_peer_error(c->active, dst, rc)))
      return mep_set_error(rc, 1, "%s: sending token %d to rank %d", FN, t,
                           dst);
  }
  return 0;
}

/* Rank dst's index words of this call: one put, or one per expert with
 * tokens (mep__ep_index_one_put). */
static int send_index(mep_ep_buffer_t *b, int dst, int half) {
  struct mep__ep_host *h = b->host;
  const mep__ep_layout_t *l = &b->lay;
  int L = l->local, one = mep__ep_index_one_put(l);
  for (int el = 0; el < L; el += one ? L : 1) {
    uint32_t n = one ? (uint32_t)(L * l->tokens) : h->counts[dst * L + el];
    if (!n) continue;
    int rc = mep_put(b->comm, dst, h->region,
                     mep__ep_index_stage(l, dst * L + el, 0), h->region,
                     mep__ep_disp_index(l, half, el, b->rank, 0),
                     (size_t)n * 4);
    if (rc) return rc;
  }
  return 0;
}

/* Rank dst's index, then its count words (mep__ep_host_send_words). */
static int send_counts(mep_ep_buffer_t *b, int dst, uint64_t seq) {
  struct mep__ep_host *h = b->host;
  const mep__ep_layout_t *l = &b->lay;
  int L = l->local, half = (int)(seq & 1);
  int rc = send_index(b, dst, half);
  if (rc) return rc;
  for (int el = 0; el < L; el++) {
    uint64_t word = mep__ep_word(seq, h->counts[dst * L + el]);
    memcpy((char *)h->mem + mep__ep_count_stage(l, dst, el), &word,
           sizeof word);
  }
  return mep__ep_host_send_words(b, dst,
                                 mep__ep_disp_count(l, half, 0, b->rank));
}

static int send_phase(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                      const mep__ep_call_t *c, uint64_t seq) {
  struct mep__ep_host *h = b->host;
  int E = b->cfg.num_experts, half = (int)(seq & 1);
  int rc = mep__ep_flush(b->comm, c->timeout_us, FN);
  if (rc) return rc;
  memset(h->counts, 0, sizeof *h->counts * (size_t)E);
  for (int t = 0; t < a->num_tokens; t++)
    if ((rc = send_token(b, a, c, half, t))) return rc;
  for (int dst = 0; dst < b->size; dst++) {
    if (!c->active[dst]) continue;
    rc = send_counts(b, dst, seq);
    if (rc && (rc = mep__ep_peer_error(c->active, dst, rc)))
      return mep_set_error(rc, 1, "%s: sending the index and counts to "
                           "rank %d", FN, dst);
  }
  return 0;
}

/* Writes row `row` of local expert el from message m of source token t. */
static void unpack(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                   int el, size_t row, int32_t t, const char *m) {
  size_t H = (size_t)b->cfg.hidden, S = (size_t)b->size * b->cfg.max_tokens_per_rank;
  a->recv_src_info[(size_t)el * S + row] = t;
  m += MEP_EP_MSG_HEADER;
  if (!(a->flags & MEP_EP_FP8)) {
    memcpy((char *)a->recv_x + ((size_t)el * S + row) * 2 * H, m, 2 * H);
    return;
  }
  memcpy((char *)a->recv_x + ((size_t)el * S + row) * H, m, H);
  size_t G = H / MEP_EP_FP8_GROUP;
  const char *sc = m + H;
  if (!(a->flags & MEP_EP_UE8M0)) {
    float *out = (float *)a->recv_scales + (size_t)el * G * S + row;
    for (size_t g = 0; g < G; g++) memcpy(out + g * S, sc + g * 4, 4);
    return;
  }
  size_t GW = G / MEP_EP_UE8M0_PACK;
  int32_t *out = (int32_t *)a->recv_scales + (size_t)el * GW * S + row;
  for (size_t j = 0; j < GW; j++) {
    uint32_t w = 0;
    for (int i = 0; i < MEP_EP_UE8M0_PACK; i++) {
      float s;
      memcpy(&s, sc + (j * MEP_EP_UE8M0_PACK + (size_t)i) * 4, 4);
      w |= (uint32_t)mep__ep_scale_to_ue8m0(s) << (8 * i);
    }
    out[j * S] = (int32_t)w;
  }
}

static int recv_phase(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                      const mep__ep_call_t *c, uint64_t seq) {
  struct mep__ep_host *h = b->host;
  int L = b->lay.local, R = b->size, T = b->cfg.max_tokens_per_rank;
  int half = (int)(seq & 1);
  /* each source's other count words and its index were put before the
   * last */
  int rc = mep__ep_host_wait_words(b, c, seq,
                                   mep__ep_disp_count(&b->lay, half, 0, 0), FN);
  if (rc) return rc;
  for (int el = 0; el < L; el++) {
    uint32_t off = 0;
    for (int src = 0; src < R; src++) {
      uint64_t seen = 0;
      uint32_t n = 0;
      if (c->active[src]) {
        memcpy(&seen, (const char *)h->mem +
                          mep__ep_disp_count(&b->lay, half, el, src),
               sizeof seen);
        if (seen >> 32 != seq || (uint32_t)seen > (uint32_t)T)
          return mep_set_error(MEP_ERR_PROTOCOL, 0, "%s: rank %d's count word "
                               "for expert %d is call %llu with %u tokens; "
                               "want call %llu with at most %d", FN, src,
                               b->rank * L + el,
                               (unsigned long long)(seen >> 32),
                               (unsigned)seen, (unsigned long long)seq, T);
        n = (uint32_t)seen;
      }
      a->recv_layout_range[(size_t)el * R + src] = mep__ep_lr_pack(off, n);
      for (uint32_t i = 0; i < n; i++) {
        int32_t t;
        memcpy(&t, (const char *)h->mem +
                       mep__ep_disp_index(&b->lay, half, el, src, (int)i),
               sizeof t);
        if (t < 0 || t >= T)
          return mep_set_error(MEP_ERR_PROTOCOL, 0, "%s: rank %d's index "
                               "names token %d for slot %u of expert %d "
                               "(tokens are 0..%d)", FN, src, (int)t, i,
                               b->rank * L + el, T - 1);
        unpack(b, a, el, off + i, t,
               (const char *)h->mem +
                   mep__ep_disp_token(&b->lay, half, src, t));
      }
      off += n;
    }
    a->recv_count[el] = (int32_t)off;
    if (c->recv_stats) c->recv_stats[el] += (int32_t)off;
  }
  return 0;
}

int mep__ep_host_dispatch(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                          const mep__ep_call_t *c) {
  struct mep__ep_host *h = b->host;
  if ((c->phases & 1) && h->disp_sent != h->disp_recvd)
    return mep_set_error(MEP_ERR_INVALID, 0, "%s: the MEP_EP_SEND call %llu "
                         "has not been received yet (call again with "
                         "MEP_EP_RECV first)", FN,
                         (unsigned long long)h->disp_sent);
  if (c->phases == 2 && h->disp_sent == h->disp_recvd)
    return mep_set_error(MEP_ERR_INVALID, 0, "%s: MEP_EP_RECV without a "
                         "preceding MEP_EP_SEND call", FN);
  if (c->phases & 1) {
    int rc = send_phase(b, a, c, h->disp_sent + 1);
    if (rc) return rc;
    h->disp_sent++;
  }
  if (c->phases & 2) {
    h->disp_recvd++;
    return recv_phase(b, a, c, h->disp_recvd);
  }
  return 0;
}
