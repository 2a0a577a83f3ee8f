/* The reference of the collective tests checks itself: conversions against
 * known values and a second, integer-bit formulation; the reduction check
 * accepts the expected bits and refuses one changed bit, for every dtype
 * and op. Without this, a wrong reference could hide a wrong library. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ref.h"

static void known_f16(float f, uint16_t h) {
  CHECK(ref_f32_to_f16(f) == h, "f16(%.10g) = 0x%04x, want 0x%04x", f,
        ref_f32_to_f16(f), h);
}

static void conversions(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ref_f16_to_f32((uint16_t)h);
    uint16_t back = ref_f32_to_f16(f);
    CHECK(isnan(f) ? isnan(ref_f16_to_f32(back)) : back == h,
          "f16 0x%04x -> %g -> 0x%04x", h, f, back);
    uint32_t w = h << 16;
    float g = ref_bf16_to_f32((uint16_t)h), g2;
    memcpy(&g2, &w, 4);
    CHECK(isnan(g) ? isnan(g2) : memcmp(&g, &g2, 4) == 0,
          "bf16 0x%04x -> %g, its bits say %g", h, g, g2);
    CHECK(isnan(g) || ref_f32_to_bf16(g) == h, "bf16 0x%04x round trip", h);
  }
  known_f16(1.0f, 0x3c00);
  known_f16(-2.0f, 0xc000);
  known_f16(65504.0f, 0x7bff);
  known_f16(65519.0f, 0x7bff);
  known_f16(65520.0f, 0x7c00); /* halfway to 2^16 rounds up: infinity */
  known_f16(0x1p-24f, 0x0001);
  known_f16(0x1p-25f, 0x0000);        /* tie to even: zero */
  known_f16(0x1.8p-24f, 0x0002);      /* tie to even: 2 */
  known_f16(0x1.002p0f, 0x3c00);      /* 1 + 2^-11: tie to even */
  known_f16(0x1.006p0f, 0x3c02);      /* 1 + 3 * 2^-11: tie to even */
  known_f16(0.1f, 0x2e66);
  known_f16(-0.0f, 0x8000);
  /* bfloat16 rounding against the integer formulation (non-NaN). */
  uint64_t s = 42;
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)splitmix64(&s);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u; /* halfway cases */
    float f;
    memcpy(&f, &u, 4);
    if (isnan(f)) continue;
    uint16_t want = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    CHECK(ref_f32_to_bf16(f) == want, "bf16 of 0x%08x: 0x%04x, want 0x%04x",
          u, ref_f32_to_bf16(f), want);
  }
}

/* For every dtype and op: the expected bits pass, one flipped bit fails
 * (the low bit; bool also a byte other than 0 and 1). */
static void reductions(void) {
  char why[256];
  for (int dt = 0; dt < MEP_DTYPE_COUNT; dt++)
    for (int op = 0; op < MEP_OP_COUNT; op++)
      for (int n = 1; n <= 7; n += 3)
        for (size_t idx = 0; idx < 500; idx++) {
          if (dt == MEP_BOOL && op == MEP_AVG) continue;
          uint8_t want[8], bad[8];
          size_t sz = ref_size((mep_dtype_t)dt);
          ref_reduced((mep_dtype_t)dt, (mep_op_t)op, n, 7, idx, want);
          CHECK(ref_check_reduced((mep_dtype_t)dt, (mep_op_t)op, n, 7, idx,
                                  want, why, sizeof why) == 0,
                "%s %s: refused its own result: %s",
                ref_dtype_name((mep_dtype_t)dt), ref_op_name((mep_op_t)op),
                why);
          memcpy(bad, want, sz);
          bad[0] ^= 1;
          CHECK(ref_check_reduced((mep_dtype_t)dt, (mep_op_t)op, n, 7, idx,
                                  bad, why, sizeof why) != 0,
                "%s %s: accepted a changed bit",
                ref_dtype_name((mep_dtype_t)dt), ref_op_name((mep_op_t)op));
          if (dt == MEP_BOOL) {
            bad[0] = (uint8_t)(want[0] ? 2 : 0x80); /* not 0 or 1 */
            CHECK(ref_check_reduced(MEP_BOOL, (mep_op_t)op, n, 7, idx, bad,
                                    why, sizeof why) != 0,
                  "bool: accepted byte %u", bad[0]);
          }
        }
  /* The inputs hit the cases that matter: zero and nonzero bools, wrapped
   * int8 sums. */
  int zeros = 0, wraps = 0;
  for (size_t i = 0; i < 1000; i++) {
    uint8_t b, x, y;
    ref_elem(MEP_BOOL, 1, 0, i, &b);
    zeros += b == 0;
    ref_elem(MEP_INT8, 1, 0, i, &x);
    ref_elem(MEP_INT8, 1, 1, i, &y);
    int sum = (int8_t)x + (int8_t)y;
    wraps += sum > 127 || sum < -128;
  }
  CHECK(zeros > 300 && zeros < 700, "bool inputs: %d zeros in 1000", zeros);
  CHECK(wraps > 100, "int8 inputs: %d sums of 1000 wrap", wraps);
}

/* The tree order, against its shape written out by hand for 3 to 6
 * ranks: float32 sums whose order shows in the bits. */
static void tree_order(void) {
  char why[256];
  int differs = 0;
  for (size_t idx = 0; idx < 200; idx++) {
    float x[6], want[4];
    for (int r = 0; r < 6; r++) ref_elem(MEP_FLOAT32, 9, r, idx, &x[r]);
    want[0] = (x[0] + x[1]) + x[2];
    want[1] = (x[0] + x[1]) + (x[2] + x[3]);
    want[2] = ((x[0] + x[1]) + x[2]) + (x[3] + x[4]);
    want[3] = ((x[0] + x[1]) + (x[2] + x[3])) + (x[4] + x[5]);
    for (int n = 3; n <= 6; n++) {
      ref_set_tree(1);
      CHECK(ref_check_reduced(MEP_FLOAT32, MEP_SUM, n, 9, idx, &want[n - 3],
                              why, sizeof why) == 0,
            "tree of %d ranks, element %zu: %s", n, idx, why);
      ref_set_tree(0);
      differs += ref_check_reduced(MEP_FLOAT32, MEP_SUM, n, 9, idx,
                                   &want[n - 3], why, sizeof why) != 0;
    }
  }
  CHECK(differs > 10, "only %d of 800 tree sums differ from the chain's",
        differs);
}

int main(void) {
  conversions();
  reductions();
  tree_order();
  printf("ok: the reference checks itself\n");
  return 0;
}
