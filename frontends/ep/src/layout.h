/* layout.h - where everything lives in a rank's communication memory (a
 * host region on the CPU path, a device window on the CUDA path), the same
 * on every rank. Plain C and CUDA (host and device). Internal: its names
 * are mep__ep_, the mep_ep_ ones being ep.h's public API.
 *
 * With R ranks, T = max tokens per rank, H = hidden, E experts, L = E / R:
 *  - dispatch receive [2][R][T] messages of msg bytes, source s's token
 *    t at [s][t]: [int32 source token index | 12 bytes unused | data],
 *    data being H bf16, or H fp8 bytes followed by H / 128 float scales.
 *    A token goes once to each destination rank, not once per expert;
 *    the dispatch index says which token fills each expert's slot.
 *  - dispatch counts [2][R][L] words: (seq << 32) | tokens, written by
 *    the source after its messages: "0 tokens" differs from "not yet".
 *  - dispatch index [2][R][L][T] int32: the source token of slot i of
 *    local expert l from source s.
 *  - combine receive [2][E][T] rows of H bf16: expert e's output for this
 *    rank's token t.
 *  - combine flags [2][E] words: (seq << 32) | how, from expert e's rank;
 *    how says where the rows are (MEP_EP_COMB_PUSHED, MEP_EP_COMB_PULL).
 *  - combine map [2][E][T] int32 (CUDA path, pull): the row of expert e's
 *    outputs on its rank (an index into that rank's combine stage of e)
 *    that holds token t's output here.
 *  - combine read-done [R] words: the last combine whose rows source s
 *    has finished reading from this rank (CUDA path, pull).
 *  - combine weights [2][R][T][MEP_EP_MAX_TOPK] words of source s's
 *    token t: (tag << 43) | (local expert here + 1, 0: none) << 32 |
 *    float weight bits, the tag being the call's seq (low 21 bits), and
 *    [2][R] words (seq << 32) | s's tokens (CUDA path, reduce).
 *  - combine partial sums [2][R][T][H] float: rank r's share of this
 *    rank's token t, their flags [2][R][T] words, and [2][R] words from
 *    each rank at the end of its send (CUDA path, reduce).
 *  - dispatch stage [T][MEP_EP_MAX_TOPK] messages, index stage [E][T]
 *    int32 and count stage [E] words, combine stage
 *    [L][R * T] rows of H bf16 (also the zero-copy combine buffer): what a
 *    proxied (or CPU-path) send reads from, and (device part) where mapped
 *    peers pull expert outputs from; in reduce mode, whose rows need no
 *    stage, the host part's holds what goes to proxied ranks instead
 *    (mep__ep_red_pstage, mep__ep_red_wstage).
 * [2]: calls alternate between two halves (seq & 1), so back-to-back calls
 * need no cleaning; seq counts dispatch calls and combine calls apart,
 * from 1. */
#ifndef MEP_EP_LAYOUT_H
#define MEP_EP_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MEP_EP_HD __host__ __device__ __forceinline__
#else
#define MEP_EP_HD static inline
#endif

#define MEP_EP_MSG_HEADER 16u
#define MEP_EP_ALIGN 4096u
#define MEP_EP_STAGE_TOPK 16u /* = MEP_EP_MAX_TOPK of ep.h */
/* The low half of a combine flag: the rows of expert e for this rank are
 * in this rank's combine receive area (pushed), or in the combine stage
 * of e's rank at the rows the combine map names (pull). */
#define MEP_EP_COMB_PUSHED 1u
#define MEP_EP_COMB_PULL 2u

typedef struct mep__ep_layout {
  int ranks, tokens, hidden, experts, local; /* R, T, H, E, L */
  uint64_t msg;         /* bytes of one dispatch message */
  uint64_t disp_recv;   /* offsets of the areas */
  uint64_t disp_count;
  uint64_t disp_index;
  uint64_t comb_recv;
  uint64_t comb_flag;
  uint64_t comb_map;
  uint64_t comb_done;
  uint64_t comb_wts;
  uint64_t comb_wflag;
  uint64_t comb_part;
  uint64_t comb_pflag;
  uint64_t comb_tflag;
  uint64_t disp_stage;
  uint64_t index_stage;
  uint64_t count_stage;
  uint64_t comb_stage;
  uint64_t total;       /* bytes of the whole */
} mep__ep_layout_t;

/* A handle's layout_range word, packed as DeepEP packs it: the first row
 * of a source's tokens in the high half, their count in the low half. */
MEP_EP_HD int64_t mep__ep_lr_pack(uint32_t begin, uint32_t count) {
  return (int64_t)(((uint64_t)begin << 32) | count);
}
MEP_EP_HD uint32_t mep__ep_lr_begin(int64_t v) {
  return (uint32_t)((uint64_t)v >> 32);
}
MEP_EP_HD uint32_t mep__ep_lr_count(int64_t v) { return (uint32_t)v; }

MEP_EP_HD uint64_t mep__ep_align(uint64_t v) {
  return (v + MEP_EP_ALIGN - 1) / MEP_EP_ALIGN * MEP_EP_ALIGN;
}

/* v rounded up to 16 bytes (a vector's alignment), for the CUDA path's
 * state and shared-memory layouts. */
MEP_EP_HD uint64_t mep__ep_round16(uint64_t v) {
  return (v + 15) & ~(uint64_t)15;
}

/* Fills *l; the caller has validated the parameters. */
MEP_EP_HD void mep__ep_layout(mep__ep_layout_t *l, int ranks, int tokens,
                              int hidden, int experts) {
  uint64_t R = (uint64_t)ranks, T = (uint64_t)tokens, H = (uint64_t)hidden;
  uint64_t E = (uint64_t)experts, L = E / R, off = 0;
  l->ranks = ranks;
  l->tokens = tokens;
  l->hidden = hidden;
  l->experts = experts;
  l->local = (int)L;
  /* bf16 data is the larger: 2H >= H + H / 128 * 4 */
  l->msg = MEP_EP_MSG_HEADER + 2 * H;
  l->disp_recv = off;
  off = mep__ep_align(off + 2 * R * T * l->msg);
  l->disp_count = off;
  off = mep__ep_align(off + 2 * L * R * 8);
  l->disp_index = off;
  off = mep__ep_align(off + 2 * L * R * T * 4);
  l->comb_recv = off;
  off = mep__ep_align(off + 2 * E * T * 2 * H);
  l->comb_flag = off;
  off = mep__ep_align(off + 2 * E * 8);
  l->comb_map = off;
  off = mep__ep_align(off + 2 * E * T * 4);
  l->comb_done = off;
  off = mep__ep_align(off + R * 8);
  l->comb_wts = off;
  off = mep__ep_align(off + 2 * R * T * MEP_EP_STAGE_TOPK * 8);
  l->comb_wflag = off;
  off = mep__ep_align(off + 2 * R * 8);
  l->comb_part = off;
  off = mep__ep_align(off + 2 * R * T * H * 4);
  l->comb_pflag = off;
  off = mep__ep_align(off + 2 * R * 8);
  l->comb_tflag = off;
  off = mep__ep_align(off + 2 * R * T * 8);
  l->disp_stage = off;
  off = mep__ep_align(off + T * MEP_EP_STAGE_TOPK * l->msg);
  l->index_stage = off;
  off = mep__ep_align(off + E * T * 4);
  l->count_stage = off;
  off = mep__ep_align(off + E * 8);
  l->comb_stage = off;
  off = mep__ep_align(off + L * R * T * 2 * H);
  l->total = off;
}

/* Offsets of one item. `half` is seq & 1. */
MEP_EP_HD uint64_t mep__ep_disp_token(const mep__ep_layout_t *l, int half,
                                      int src, int token) {
  uint64_t i = ((uint64_t)half * l->ranks + src) * l->tokens + token;
  return l->disp_recv + i * l->msg;
}
MEP_EP_HD uint64_t mep__ep_disp_index(const mep__ep_layout_t *l, int half,
                                      int local_expert, int src, int slot) {
  uint64_t i = (((uint64_t)half * l->ranks + src) * l->local + local_expert) *
                   l->tokens + slot;
  return l->disp_index + i * 4;
}
/* A source's count words are adjacent ([half][src][local expert]), so
 * that a sender without mapped memory puts them together (count_stage). */
MEP_EP_HD uint64_t mep__ep_disp_count(const mep__ep_layout_t *l, int half,
                                      int local_expert, int src) {
  return l->disp_count +
         (((uint64_t)half * l->ranks + src) * l->local + local_expert) * 8;
}
MEP_EP_HD uint64_t mep__ep_comb_row(const mep__ep_layout_t *l, int half,
                                    int expert, int token) {
  uint64_t i = ((uint64_t)half * l->experts + expert) * l->tokens + token;
  return l->comb_recv + i * 2 * (uint64_t)l->hidden;
}
MEP_EP_HD uint64_t mep__ep_comb_flag(const mep__ep_layout_t *l, int half,
                                     int expert) {
  return l->comb_flag + ((uint64_t)half * l->experts + expert) * 8;
}
MEP_EP_HD uint64_t mep__ep_comb_map(const mep__ep_layout_t *l, int half,
                                    int expert, int token) {
  uint64_t i = ((uint64_t)half * l->experts + expert) * l->tokens + token;
  return l->comb_map + i * 4;
}
MEP_EP_HD uint64_t mep__ep_comb_done(const mep__ep_layout_t *l, int src) {
  return l->comb_done + (uint64_t)src * 8;
}
MEP_EP_HD uint64_t mep__ep_comb_wts(const mep__ep_layout_t *l, int half,
                                    int src, int token, int k) {
  uint64_t i = (((uint64_t)half * l->ranks + src) * l->tokens + token) *
                   MEP_EP_STAGE_TOPK + k;
  return l->comb_wts + i * 8;
}
MEP_EP_HD uint64_t mep__ep_comb_wflag(const mep__ep_layout_t *l, int half,
                                      int src) {
  return l->comb_wflag + ((uint64_t)half * l->ranks + src) * 8;
}
MEP_EP_HD uint64_t mep__ep_comb_part(const mep__ep_layout_t *l, int half,
                                     int src, int token) {
  uint64_t i = ((uint64_t)half * l->ranks + src) * l->tokens + token;
  return l->comb_part + i * 4 * (uint64_t)l->hidden;
}
MEP_EP_HD uint64_t mep__ep_comb_pflag(const mep__ep_layout_t *l, int half,
                                      int src) {
  return l->comb_pflag + ((uint64_t)half * l->ranks + src) * 8;
}
MEP_EP_HD uint64_t mep__ep_comb_tflag(const mep__ep_layout_t *l, int half,
                                      int src, int token) {
  return l->comb_tflag +
         (((uint64_t)half * l->ranks + src) * l->tokens + token) * 8;
}
MEP_EP_HD uint64_t mep__ep_disp_stage(const mep__ep_layout_t *l, int token,
                                      int k) {
  return l->disp_stage +
         ((uint64_t)token * MEP_EP_STAGE_TOPK + k) * l->msg;
}
/* Staged index words sit as at their destination, by expert and slot: a
 * peer's words, [local expert][slot], are as in its dispatch index of
 * this source, so that they go as one put (ep_dispatch_send.cu). */
MEP_EP_HD uint64_t mep__ep_index_stage(const mep__ep_layout_t *l, int expert,
                                       int slot) {
  return l->index_stage + ((uint64_t)expert * l->tokens + slot) * 4;
}
/* A peer's staged index words, [local expert][slot], go as one put,
 * slots without a token included, up to this many bytes (16 local
 * experts of 1024 tokens, 128 of 128); beyond, as one put per expert
 * with tokens. Fewer messages matter more than bytes here: each costs
 * tcp a system call (docs/perf.md). */
#define MEP_EP_INDEX_ONE_PUT (64u << 10)
MEP_EP_HD int mep__ep_index_one_put(const mep__ep_layout_t *l) {
  return (uint64_t)l->local * l->tokens * 4 <= MEP_EP_INDEX_ONE_PUT;
}
/* The count words for rank dst, [dst][local expert] (the CPU path's
 * combine stages its flag words for rank dst there too). */
MEP_EP_HD uint64_t mep__ep_count_stage(const mep__ep_layout_t *l, int dst,
                                       int local_expert) {
  return l->count_stage + ((uint64_t)dst * l->local + local_expert) * 8;
}
MEP_EP_HD uint64_t mep__ep_comb_stage(const mep__ep_layout_t *l,
                                      int local_expert, int row) {
  uint64_t i = (uint64_t)local_expert * l->ranks * l->tokens + row;
  return l->comb_stage + i * 2 * (uint64_t)l->hidden;
}

/* Reduce mode through the proxy (CUDA path, ep_reduce_send.cu): what a
 * send puts to a proxied rank waits in this rank's host part, inside its
 * combine stage, which reduce mode leaves unused: partial sums for rank
 * s's token t at [s][t] (H floats), then the weight words for rank q at
 * [q][t][MEP_EP_STAGE_TOPK], laid out as q's comb_wts of this rank so
 * that one put carries them. It fits where
 * local * 2H >= 4H + MEP_EP_STAGE_TOPK * 8, i.e. from 3 local experts. */
MEP_EP_HD int mep__ep_red_stage_fits(const mep__ep_layout_t *l) {
  uint64_t H = (uint64_t)l->hidden;
  return (uint64_t)l->local * 2 * H >= 4 * H + MEP_EP_STAGE_TOPK * 8;
}
MEP_EP_HD uint64_t mep__ep_red_pstage(const mep__ep_layout_t *l, int dst,
                                      int token) {
  uint64_t i = (uint64_t)dst * l->tokens + token;
  return l->comb_stage + i * 4 * (uint64_t)l->hidden;
}
MEP_EP_HD uint64_t mep__ep_red_wstage(const mep__ep_layout_t *l, int dst,
                                      int token, int k) {
  uint64_t i = ((uint64_t)dst * l->tokens + token) * MEP_EP_STAGE_TOPK + k;
  return mep__ep_red_pstage(l, l->ranks, 0) + i * 8; /* after the sums */
}

/* The 64-bit signal words. */
MEP_EP_HD uint64_t mep__ep_word(uint64_t seq, uint32_t n) {
  return (seq << 32) | n;
}

#endif /* MEP_EP_LAYOUT_H */
