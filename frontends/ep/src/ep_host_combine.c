/* ep_host_combine.c - combine on the CPU path. Send: every row an expert of
 * this rank received goes back to its token's rank, at (half, expert,
 * token); then every expert of this rank raises its flag (seq) on every
 * active rank, also when it sent that rank nothing: all but the last in
 * one put, the last signalled. Receive: each active rank's last flag
 * under one deadline (a rank that misses it is cleared), then the
 * weighted sum per token in float, rounded once. */
#include <stdlib.h>
#include <string.h>

#include "ep_fp8.h"
#include "ep_host.h"
#include "ep_util.h"

static const char *const FN = "mep_ep_combine";

/* The rows to send must name real tokens in real rows: they become
 * offsets of puts. */
static int check_ranges(mep_ep_buffer_t *b, const mep_ep_combine_args_t *a) {
  int L = b->lay.local, R = b->size, T = b->cfg.max_tokens_per_rank;
  uint64_t S = (uint64_t)R * (uint64_t)T;
  for (int el = 0; el < L; el++)
    for (int src = 0; src < R; src++) {
      int64_t lr = a->layout_range[(size_t)el * R + src];
      uint64_t n = mep__ep_lr_count(lr), begin = mep__ep_lr_begin(lr);
      if (n > (uint64_t)T || begin + n > S)
        return mep_set_error(MEP_ERR_INVALID, 0, "%s: layout_range[%d][%d] "
                             "is count %llu begin %llu: outside the %d rows "
                             "from a rank or the %llu of an expert", FN, el,
                             src, (unsigned long long)n,
                             (unsigned long long)begin, T,
                             (unsigned long long)S);
      for (uint64_t i = begin; i < begin + n; i++) {
        int32_t t = a->src_info[(size_t)el * S + i];
        if (t < 0 || t >= T)
          return mep_set_error(MEP_ERR_INVALID, 0, "%s: src_info[%d][%llu] "
                               "is %d, outside 0..max_tokens_per_rank (%d)",
                               FN, el, (unsigned long long)i, (int)t, T);
      }
    }
  return 0;
}

/* Rank dst's flags of this rank's experts (mep__ep_host_send_words). */
static int send_flags(mep_ep_buffer_t *b, int dst, uint64_t seq) {
  const mep__ep_layout_t *l = &b->lay;
  uint64_t word = mep__ep_word(seq, MEP_EP_COMB_PUSHED);
  for (int el = 0; el < l->local; el++)
    memcpy((char *)b->host->mem + mep__ep_count_stage(l, dst, el), &word,
           sizeof word);
  return mep__ep_host_send_words(
      b, dst, mep__ep_comb_flag(l, (int)(seq & 1), b->rank * l->local));
}

static int send_phase(mep_ep_buffer_t *b, const mep_ep_combine_args_t *a,
                      const mep__ep_call_t *c, uint64_t seq) {
  struct mep__ep_host *h = b->host;
  int L = b->lay.local, R = b->size, half = (int)(seq & 1);
  size_t row_bytes = 2 * (size_t)b->cfg.hidden;
  size_t S = (size_t)R * b->cfg.max_tokens_per_rank;
  const char *x = a->x ? a->x : mep__ep_host_combine_buffer(b);
  int copy = x != (const char *)mep__ep_host_combine_buffer(b);
  int rc = check_ranges(b, a);
  if (rc) return rc;
  if ((rc = mep__ep_flush(b->comm, c->timeout_us, FN))) return rc;
  for (int el = 0; el < L; el++)
    for (int src = 0; src < R; src++) {
      int64_t lr = a->layout_range[(size_t)el * R + src];
      uint32_t n = mep__ep_lr_count(lr), begin = mep__ep_lr_begin(lr);
      for (uint32_t i = 0; i < n && c->active[src]; i++) {
        size_t row = (size_t)begin + i;
        uint64_t stage = mep__ep_comb_stage(&b->lay, el, (int)row);
        if (copy)
          memcpy((char *)h->mem + stage, x + ((size_t)el * S + row) * row_bytes,
                 row_bytes);
        int t = a->src_info[(size_t)el * S + row];
        rc = mep_put(b->comm, src, h->region, stage, h->region,
                     mep__ep_comb_row(&b->lay, half, b->rank * L + el, t),
                     row_bytes);
        if (rc && (rc = mep__ep_peer_error(c->active, src, rc)))
          return mep_set_error(rc, 1, "%s: sending expert %d's row for token "
                               "%d to rank %d", FN, b->rank * L + el, t, src);
      }
    }
  for (int src = 0; src < R; src++) {
    if (!c->active[src]) continue;
    rc = send_flags(b, src, seq);
    if (rc && (rc = mep__ep_peer_error(c->active, src, rc)))
      return mep_set_error(rc, 1, "%s: signalling rank %d", FN, src);
  }
  /* the caller may rewrite the zero-copy buffer once this returns */
  return mep__ep_flush(b->comm, c->timeout_us, FN);
}

static int recv_phase(mep_ep_buffer_t *b, const mep_ep_combine_args_t *a,
                      const mep__ep_call_t *c, uint64_t seq) {
  int L = b->lay.local, K = a->num_topk, H = b->cfg.hidden;
  int half = (int)(seq & 1);
  int rc = mep__ep_host_wait_words(b, c, seq,
                                   mep__ep_comb_flag(&b->lay, half, 0), FN);
  if (rc) return rc;
  float *acc = malloc(sizeof(float) * (size_t)H);
  if (!acc)
    return mep_set_error(MEP_ERR_NOMEM, 0, "%s: no memory for a row of %d "
                         "floats", FN, H);
  uint16_t *out = a->out;
  for (int t = 0; t < a->num_tokens; t++) {
    memset(acc, 0, sizeof(float) * (size_t)H);
    for (int k = 0; k < K; k++) {
      int64_t e = a->topk_idx[(size_t)t * K + k];
      if (e < 0 || !c->active[e / L]) continue;
      float w = a->topk_weights[(size_t)t * K + k];
      const uint16_t *row =
          (const uint16_t *)((const char *)b->host->mem +
                             mep__ep_comb_row(&b->lay, half, (int)e, t));
      for (int i = 0; i < H; i++) acc[i] += w * mep__ep_bf16_to_float(row[i]);
    }
    for (int i = 0; i < H; i++)
      out[(size_t)t * H + i] = mep__ep_float_to_bf16(acc[i]);
  }
  free(acc);
  return 0;
}

int mep__ep_host_combine(mep_ep_buffer_t *b, const mep_ep_combine_args_t *a,
                         const mep__ep_call_t *c) {
  struct mep__ep_host *h = b->host;
  if ((c->phases & 1) && h->comb_sent != h->comb_recvd)
    return mep_set_error(MEP_ERR_INVALID, 0, "%s: the MEP_EP_SEND call %llu "
                         "has not been received yet (call again with "
                         "MEP_EP_RECV first)", FN,
                         (unsigned long long)h->comb_sent);
  if (c->phases == 2 && h->comb_sent == h->comb_recvd)
    return mep_set_error(MEP_ERR_INVALID, 0, "%s: MEP_EP_RECV without a "
                         "preceding MEP_EP_SEND call", FN);
  if (c->phases & 1) {
    int rc = send_phase(b, a, c, h->comb_sent + 1);
    if (rc) return rc;
    h->comb_sent++;
  }
  if (c->phases & 2) {
    h->comb_recvd++;
    return recv_phase(b, a, c, h->comb_recvd);
  }
  return 0;
}
