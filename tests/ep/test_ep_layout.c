/* test_ep_layout: the stages of layout.h, which a send to a proxied rank
 * fills and puts from (ep_dispatch_send.cu, ep_reduce_send.cu), against
 * what the puts assume: the dispatch's count words and index words are
 * staged as at their destination and apart from the other stages; the
 * reduce-mode stages lie inside the combine stage exactly when
 * mep__ep_red_stage_fits says so, apart from each other; a rank's weight
 * words are laid out as the destination's comb_wts of this rank (one put
 * carries them), and consecutive tokens' partial sums are consecutive in
 * the stage as at the destination (the proxy merges their puts). Shapes
 * from a fixed-seed random sweep plus the edges (1 token, hidden 128, 1-3
 * local experts). */
#include "check.h"
#include "layout.h"

static void check(int R, int T, int H, int nl) {
  mep__ep_layout_t l;
  mep__ep_layout(&l, R, T, H, R * nl);
  const uint64_t stage_end = l.comb_stage + (uint64_t)nl * R * T * 2 * H;
  CHECK(stage_end <= l.total, "R=%d T=%d H=%d L=%d", R, T, H, nl);
  /* the last byte each kind of stage uses */
  const uint64_t p_end = mep__ep_red_pstage(&l, R - 1, T - 1) + 4ull * H;
  const uint64_t w_end =
      mep__ep_red_wstage(&l, R - 1, T - 1, MEP_EP_STAGE_TOPK - 1) + 8;
  const int fits = mep__ep_red_stage_fits(&l);
  CHECK(fits == (nl >= 3), "R=%d T=%d H=%d L=%d: fits %d", R, T, H, nl,
         fits);
  if (fits)
    CHECK(w_end <= stage_end, "R=%d T=%d H=%d L=%d: %llu > %llu", R, T, H,
           nl, (unsigned long long)w_end, (unsigned long long)stage_end);
  else
    CHECK(w_end > stage_end, "R=%d T=%d H=%d L=%d: fits, said not", R, T,
           H, nl);
  /* the dispatch's stages apart from each other and from the combine's */
  CHECK(mep__ep_index_stage(&l, R * nl - 1, T - 1) + 4 <= l.count_stage &&
             mep__ep_count_stage(&l, R - 1, nl - 1) + 8 <= l.comb_stage &&
             mep__ep_disp_stage(&l, T - 1, MEP_EP_STAGE_TOPK - 1) + l.msg <=
                 l.index_stage,
         "R=%d T=%d L=%d: dispatch stages overlap", R, T, nl);
  CHECK(mep__ep_red_pstage(&l, 0, 0) == l.comb_stage, "R=%d", R);
  CHECK(p_end <= mep__ep_red_wstage(&l, 0, 0, 0), "R=%d T=%d H=%d", R, T,
         H);
  for (int half = 0; half < 2; half++)
    for (int me = 0; me < R; me++)
      for (int q = 0; q < R; q++) {
        /* one put: the staged words for q at the offsets of q's comb_wts
         * of source `me`, word for word */
        const uint64_t w0 = mep__ep_red_wstage(&l, q, 0, 0);
        const uint64_t c0 = mep__ep_comb_wts(&l, half, me, 0, 0);
        for (int t = 0; t < T; t += T > 7 ? T / 7 : 1)
          for (int k = 0; k < (int)MEP_EP_STAGE_TOPK; k++)
            CHECK(mep__ep_red_wstage(&l, q, t, k) - w0 ==
                       mep__ep_comb_wts(&l, half, me, t, k) - c0,
                   "R=%d T=%d q=%d t=%d k=%d", R, T, q, t, k);
        /* the dispatch's count words for q in one put, and its index
         * words in another: staged as at q's disp_count and disp_index
         * of `me`, word for word, in a block of nl * T words */
        const uint64_t i0 = mep__ep_index_stage(&l, q * nl, 0);
        const uint64_t d0 = mep__ep_disp_index(&l, half, 0, me, 0);
        for (int el = 0; el < nl; el++) {
          CHECK(mep__ep_count_stage(&l, q, el) -
                     mep__ep_count_stage(&l, q, 0) ==
                 mep__ep_disp_count(&l, half, el, me) -
                     mep__ep_disp_count(&l, half, 0, me),
                 "R=%d L=%d q=%d el=%d", R, nl, q, el);
          for (int t = 0; t < T; t += T > 7 ? T / 7 : 1) {
            const uint64_t is = mep__ep_index_stage(&l, q * nl + el, t) - i0;
            CHECK(is == mep__ep_disp_index(&l, half, el, me, t) - d0 &&
                       is < (uint64_t)nl * T * 4,
                   "R=%d T=%d q=%d el=%d t=%d", R, T, q, el, t);
          }
        }
        /* a partial sum per token, consecutive as at the destination */
        for (int t = 0; t + 1 < T; t += T > 7 ? T / 7 : 1) {
          const uint64_t ds = mep__ep_red_pstage(&l, q, t + 1) -
                              mep__ep_red_pstage(&l, q, t);
          const uint64_t dd = mep__ep_comb_part(&l, half, me, t + 1) -
                              mep__ep_comb_part(&l, half, me, t);
          CHECK(ds == 4ull * H && dd == ds, "R=%d H=%d t=%d", R, H, t);
        }
      }
}

int main(void) {
  srand(12345);
  const int hs[] = {128, 256, 384, 2048, 4096, 7168};
  for (int R = 1; R <= 8; R++)
    for (int nl = 1; nl <= 4; nl++)
      for (size_t h = 0; h < sizeof hs / sizeof hs[0]; h++) {
        check(R, 1, hs[h], nl);
        check(R, 1 + rand() % 300, hs[h], nl);
      }
  for (int i = 0; i < 200; i++)
    check(1 + rand() % 16, 1 + rand() % 200, 128 * (1 + rand() % 64),
          1 + rand() % 32);
  printf("ok\n");
  return 0;
}
