/* ep_ref.c - the EP tests' reference (ep_ref.h). Written from ep.h alone:
 * it shares nothing with the CPU path but the host fp8 conversions, which
 * have their own exhaustive test (test_ep_fp8). */
#include "ep_ref.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_fp8.h"
#include "mep/ep.h"

static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s) {
  return (double)(mix(s) >> 11) * 0x1p-53;
}

static uint64_t stream(const ep_case_t *c, int rank, uint64_t what) {
  uint64_t s = c->seed ^ (0x5851f42d4c957f2dull * (uint64_t)(rank + 1)) ^
               (what << 56);
  (void)mix(&s);
  return s;
}

static int fail(char *why, size_t len, const char *fmt, ...) {
  if (why && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
  }
  return -1;
}

int ep_ref_num_tokens(const ep_case_t *c, int rank) {
  uint64_t s = stream(c, rank, 1);
  uint64_t v = mix(&s);
  switch (v % 8) {
  case 0: return 0;
  case 1: return c->max_tokens < 1 ? c->max_tokens : 1;
  case 2:
  case 3: return c->max_tokens;
  default: return (int)((v >> 8) % (uint64_t)(c->max_tokens + 1));
  }
}

/* One group of 128 channels: its magnitude varies by token and group so
 * scales differ; some groups are zero or tiny (the amax floor of 1e-4),
 * some values are outliers. */
static void gen_x(const ep_case_t *c, uint64_t *s, uint16_t *x) {
  for (int g = 0; g < c->hidden / MEP_EP_FP8_GROUP; g++) {
    uint64_t kind = mix(s) % 32;
    double mag = ldexp(1.0, (int)(mix(s) % 14) - 8);
    if (kind == 0) mag = 0.0;
    if (kind == 1) mag = 1e-6;
    for (int i = 0; i < MEP_EP_FP8_GROUP; i++) {
      double v = uniform(s) + uniform(s) + uniform(s) + uniform(s) - 2.0;
      if (mix(s) % 97 == 0) v *= 40.0;
      x[g * MEP_EP_FP8_GROUP + i] = mep__ep_float_to_bf16((float)(v * mag));
    }
  }
}

void ep_ref_inputs(const ep_case_t *c, int rank, uint16_t *x,
                   int64_t *topk_idx, float *weights) {
  int n = ep_ref_num_tokens(c, rank), H = c->hidden, K = c->topk;
  uint64_t sx = stream(c, rank, 2), si = stream(c, rank, 3),
           sw = stream(c, rank, 4);
  int *perm = malloc(sizeof(int) * (size_t)(c->experts > 0 ? c->experts : 1));
  for (int t = 0; t < n; t++) {
    if (x) gen_x(c, &sx, x + (size_t)t * H);
    for (int e = 0; e < c->experts; e++) perm[e] = e;
    for (int k = 0; k < K; k++) {
      int64_t e = -1;
      if (k < c->experts) {
        int j = k + (int)(mix(&si) % (uint64_t)(c->experts - k));
        int tmp = perm[k];
        perm[k] = perm[j];
        perm[j] = tmp;
        e = perm[k];
      }
      if (mix(&si) % 8 == 0) e = -1;
      if (topk_idx) topk_idx[(size_t)t * K + k] = e;
      float w = (float)(0.05 + uniform(&sw));
      if (weights) weights[(size_t)t * K + k] = w;
    }
  }
  free(perm);
}

/* Every rank's inputs, regenerated. */
typedef struct all_inputs {
  int *n;
  uint16_t **x;
  int64_t **idx;
  float **w;
} all_inputs_t;

static void all_free(const ep_case_t *c, all_inputs_t *a) {
  for (int r = 0; a->x && r < c->ranks; r++) {
    free(a->x[r]);
    free(a->idx[r]);
    free(a->w[r]);
  }
  free(a->n);
  free(a->x);
  free(a->idx);
  free(a->w);
}

static void all_make(const ep_case_t *c, all_inputs_t *a) {
  size_t R = (size_t)c->ranks;
  a->n = calloc(R, sizeof(int));
  a->x = calloc(R, sizeof(void *));
  a->idx = calloc(R, sizeof(void *));
  a->w = calloc(R, sizeof(void *));
  for (int r = 0; r < c->ranks; r++) {
    size_t n = (size_t)ep_ref_num_tokens(c, r);
    a->n[r] = (int)n;
    a->x[r] = malloc(sizeof(uint16_t) * (n * (size_t)c->hidden + 1));
    a->idx[r] = malloc(sizeof(int64_t) * (n * (size_t)c->topk + 1));
    a->w[r] = malloc(sizeof(float) * (n * (size_t)c->topk + 1));
    ep_ref_inputs(c, r, a->x[r], a->idx[r], a->w[r]);
  }
}

static int routes_to(const ep_case_t *c, const int64_t *idx, int t, int e) {
  for (int k = 0; k < c->topk; k++)
    if (idx[(size_t)t * c->topk + k] == e) return 1;
  return 0;
}

/* The spacing of e4m3 values around a code's magnitude. */
static float e4m3_step(uint8_t code) {
  int exp = (code >> 3) & 0xf;
  return ldexpf(1.0f, (exp > 0 ? exp : 1) - 7 - 3);
}

/* The scale of group g of row i of local expert le, as delivered. */
static float got_scale(const ep_case_t *c, const void *scales, int le,
                       int g, int i) {
  size_t S = (size_t)c->ranks * c->max_tokens;
  if (c->flags & MEP_EP_UE8M0) {
    size_t GW = (size_t)c->hidden / (MEP_EP_FP8_GROUP * MEP_EP_UE8M0_PACK);
    uint32_t w = (uint32_t)((const int32_t *)scales)
        [le * GW * S + (size_t)(g / MEP_EP_UE8M0_PACK) * S + i];
    return mep__ep_ue8m0_to_scale(
        (uint8_t)(w >> (8 * (g % MEP_EP_UE8M0_PACK))));
  }
  size_t G = (size_t)c->hidden / MEP_EP_FP8_GROUP;
  return ((const float *)scales)[le * G * S + (size_t)g * S + i];
}

static int check_row(const ep_case_t *c, int le, size_t i, const uint16_t *x,
                     const void *recv_x, const void *recv_scales, char *why,
                     size_t why_len, const char *where) {
  size_t H = (size_t)c->hidden, S = (size_t)c->ranks * c->max_tokens;
  size_t row = (size_t)le * S + i;
  if (!(c->flags & MEP_EP_FP8)) {
    const uint16_t *got = (const uint16_t *)recv_x + row * H;
    for (size_t h = 0; h < H; h++)
      if (got[h] != x[h])
        return fail(why, why_len, "%s: channel %zu is bf16 0x%04x, want 0x%04x",
                    where, h, got[h], x[h]);
    return 0;
  }
  int G = c->hidden / MEP_EP_FP8_GROUP, rs = !!(c->flags & MEP_EP_ROUND_SCALE);
  uint8_t *codes = malloc(H);
  float *scales = malloc(sizeof(float) * (size_t)G);
  int rc = 0;
  mep__ep_quantize_row(x, c->hidden, rs, codes, scales);
  const uint8_t *got = (const uint8_t *)recv_x + row * H;
  for (int g = 0; g < G && rc == 0; g++) {
    float s = got_scale(c, recv_scales, le, g, (int)i), se = scales[g];
    if (rs ? s != se : !(fabsf(s - se) <= se * 0x1p-20f)) {
      rc = fail(why, why_len, "%s: group %d has scale %.9g, want %.9g", where,
                g, (double)s, (double)se);
      break;
    }
    if (rs && (frexpf(s, &(int){0}) != 0.5f))
      rc = fail(why, why_len, "%s: group %d: scale %.9g is not a power of two",
                where, g, (double)s);
    for (int j = 0; j < MEP_EP_FP8_GROUP && rc == 0; j++) {
      size_t h = (size_t)g * MEP_EP_FP8_GROUP + (size_t)j;
      float xv = mep__ep_bf16_to_float(x[h]);
      float want = mep__ep_e4m3_to_float(codes[h]);
      /* the reference's own quantisation keeps within half a step */
      if (!(fabsf(want * se - xv) <=
            fabsf(xv) * 0x1p-4f * 1.0001f + se * 0x1p-10f))
        rc = fail(why, why_len, "%s: reference quantisation of %.9g is %.9g"
                  " (scale %.9g): more than half an e4m3 step", where,
                  (double)xv, (double)(want * se), (double)se);
      float v = mep__ep_e4m3_to_float(got[h]);
      if (got[h] == codes[h]) continue;
      float step = fmaxf(e4m3_step(got[h]), e4m3_step(codes[h]));
      if (!(fabsf(v - want) <= step))
        rc = fail(why, why_len, "%s: channel %zu is e4m3 0x%02x (%g), want "
                  "0x%02x (%g)", where, h, got[h], (double)v, codes[h],
                  (double)want);
    }
  }
  free(codes);
  free(scales);
  return rc;
}

int ep_ref_check_dispatch(const ep_case_t *c, int rank, const int32_t *active,
                          const void *recv_x, const void *recv_scales,
                          const int32_t *src_info, const int64_t *layout_range,
                          const int32_t *recv_count, char *why,
                          size_t why_len) {
  int R = c->ranks, T = c->max_tokens, L = c->experts / c->ranks, rc = 0;
  size_t S = (size_t)R * T, H = (size_t)c->hidden;
  all_inputs_t a = {0};
  all_make(c, &a);
  char *mark = malloc((size_t)T + 1);
  char where[160];
  for (int le = 0; le < L && rc == 0; le++) {
    int e = rank * L + le;
    int64_t off = 0;
    for (int r = 0; r < R && rc == 0; r++) {
      int64_t cnt = 0;
      memset(mark, 0, (size_t)T + 1);
      for (int t = 0; active[r] && t < a.n[r]; t++)
        if (routes_to(c, a.idx[r], t, e)) {
          mark[t] = 1;
          cnt++;
        }
      int64_t lr = layout_range[(size_t)le * R + r];
      /* DeepEP's packing: begin in the high half, count in the low */
      int64_t begin = lr >> 32, got_cnt = lr & 0xffffffff;
      if (got_cnt != cnt || (cnt > 0 && begin != off)) {
        rc = fail(why, why_len, "rank %d expert %d: layout_range from rank %d"
                  " is count %lld begin %lld, want count %lld begin %lld%s",
                  rank, e, r, (long long)got_cnt, (long long)begin,
                  (long long)cnt, (long long)off,
                  active[r] ? "" : " (rank inactive)");
        break;
      }
      for (int64_t i = begin; i < begin + cnt && rc == 0; i++) {
        int32_t t = src_info[(size_t)le * S + (size_t)i];
        snprintf(where, sizeof where, "rank %d expert %d row %lld (rank %d "
                 "token %d)", rank, e, (long long)i, r, (int)t);
        if (t < 0 || t >= a.n[r] || mark[t] != 1) {
          rc = fail(why, why_len, "%s: token %d of rank %d %s", where, (int)t,
                    r, t < 0 || t >= a.n[r] ? "does not exist"
                    : mark[t] == 2 ? "came twice" : "was not routed here");
          break;
        }
        mark[t] = 2;
        rc = check_row(c, le, (size_t)i, a.x[r] + (size_t)t * H, recv_x,
                       recv_scales, why, why_len, where);
      }
      off += cnt;
    }
    if (rc == 0 && recv_count[le] != off)
      rc = fail(why, why_len, "rank %d expert %d: recv_count %d, want %lld",
                rank, e, (int)recv_count[le], (long long)off);
  }
  free(mark);
  all_free(c, &a);
  return rc;
}

static float expert_factor(int e) { return 1.0f + (float)(e % 7) / 8.0f; }

void ep_ref_expert_rows(const ep_case_t *c, int rank, const void *recv_x,
                        const void *recv_scales, const int64_t *layout_range,
                        uint16_t *comb_x) {
  int R = c->ranks, L = c->experts / c->ranks;
  size_t S = (size_t)R * c->max_tokens, H = (size_t)c->hidden;
  for (int le = 0; le < L; le++) {
    float f = expert_factor(rank * L + le);
    for (int r = 0; r < R; r++) {
      int64_t lr = layout_range[(size_t)le * R + r];
      int64_t begin = lr >> 32, cnt = lr & 0xffffffff;
      for (int64_t i = begin; i < begin + cnt; i++) {
        size_t row = (size_t)le * S + (size_t)i;
        for (size_t h = 0; h < H; h++) {
          float v;
          if (c->flags & MEP_EP_FP8)
            v = mep__ep_e4m3_to_float(((const uint8_t *)recv_x)[row * H + h]) *
                got_scale(c, recv_scales, le, (int)(h / MEP_EP_FP8_GROUP),
                          (int)i);
          else
            v = mep__ep_bf16_to_float(((const uint16_t *)recv_x)[row * H + h]);
          comb_x[row * H + h] = mep__ep_float_to_bf16(v * f);
        }
      }
    }
  }
}

/* Tolerance of combine: the output is the float sum rounded to bf16 once
 * (half a bf16 ulp: 2^-9 relative; 2^-8 allowed) plus float summation
 * error (2^-20 of the terms' magnitudes). With FP8 a kernel may round an
 * element to the neighbouring e4m3 code (check_dispatch allows it); such
 * an element may miss the strict bound by one step of each term, and at
 * most 1% of the elements may do so. */
int ep_ref_check_combine(const ep_case_t *c, int rank, const int32_t *active,
                         const uint16_t *out, char *why, size_t why_len) {
  int n = ep_ref_num_tokens(c, rank), K = c->topk, H = c->hidden;
  int L = c->experts / c->ranks, G = H / MEP_EP_FP8_GROUP;
  int fp8 = !!(c->flags & MEP_EP_FP8), rs = !!(c->flags & MEP_EP_ROUND_SCALE);
  size_t N = (size_t)n;
  uint16_t *x = malloc(sizeof(uint16_t) * (N * H + 1));
  int64_t *idx = malloc(sizeof(int64_t) * (N * K + 1));
  float *w = malloc(sizeof(float) * (N * K + 1));
  float *q = malloc(sizeof(float) * (size_t)H), *step = malloc(sizeof(float) * (size_t)H);
  uint8_t *codes = malloc((size_t)H);
  float *scales = malloc(sizeof(float) * (size_t)G);
  ep_ref_inputs(c, rank, x, idx, w);
  size_t loose = 0, total = N * (size_t)H;
  /* MEP_EP_COMBINE_PARTIAL=bf16: each rank's partial sum is rounded to
   * bf16 before the final sum, half an ulp (2^-9) of at most the terms'
   * magnitudes each; 2^-8 allowed */
  const char *part = getenv("MEP_EP_COMBINE_PARTIAL");
  const double part_tol =
      part && strcmp(part, "bf16") == 0 ? 0x1p-8 : 0x1p-20;
  int rc = 0;
  for (int t = 0; t < n && rc == 0; t++) {
    const uint16_t *xt = x + (size_t)t * H;
    if (fp8) mep__ep_quantize_row(xt, H, rs, codes, scales);
    for (int h = 0; h < H; h++) {
      int g = h / MEP_EP_FP8_GROUP;
      q[h] = fp8 ? mep__ep_e4m3_to_float(codes[h]) * scales[g]
                 : mep__ep_bf16_to_float(xt[h]);
      step[h] = fp8 ? e4m3_step(codes[h]) * scales[g] : 0.0f;
    }
    for (int h = 0; h < H && rc == 0; h++) {
      double want = 0, mag = 0, slack = 0;
      for (int k = 0; k < K; k++) {
        int64_t e = idx[(size_t)t * K + k];
        if (e < 0 || !active[e / L]) continue;
        float f = expert_factor((int)e);
        float row = mep__ep_bf16_to_float(mep__ep_float_to_bf16(q[h] * f));
        double term = (double)w[(size_t)t * K + k] * row;
        want += term;
        mag += fabs(term);
        slack += fabs((double)w[(size_t)t * K + k]) * f * step[h] * 1.01;
      }
      double got = mep__ep_bf16_to_float(out[(size_t)t * H + h]);
      double tol = fabs(want) * 0x1p-8 + mag * part_tol + 1e-30;
      double err = fabs(got - want);
      if (err <= tol) continue;
      if (fp8 && err <= tol + slack * (1 + 0x1p-7) + fabs(want) * 0x1p-8) {
        loose++;
        continue;
      }
      rc = fail(why, why_len, "rank %d token %d channel %d: combine gave %.9g,"
                " want %.9g (tolerance %.3g)", rank, t, h, got, want, tol);
    }
  }
  if (rc == 0 && loose * 100 > total)
    rc = fail(why, why_len, "rank %d: %zu of %zu combine outputs are off by "
              "more than bf16 rounding", rank, loose, total);
  free(x);
  free(idx);
  free(w);
  free(q);
  free(step);
  free(codes);
  free(scales);
  return rc;
}
