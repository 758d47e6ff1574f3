/* Checks div_fp8_max (csrc/norm_fused.h) against the division it replaces on
 * the GPU: for every finite non-negative float amax and both FP8 formats,
 * q = amax * (1 / c), r = fma(-q, c, amax), fma(r, 1 / c, q) must equal
 * amax / c wherever the quotient is at least 1e-13 (below it quant_scale
 * floors the scale at 1e-12 either way). About 3 s on one x86 core:
 *   cc -O2 -ffp-contract=off tools/check_div_fp8_max.c -lm -o /tmp/chk && /tmp/chk
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const float formats[2] = {448.f, 57344.f};
  long failures = 0;
  for (int k = 0; k < 2; ++k) {
    const float c = formats[k], rc = 1.f / c;
    long bad = 0, below = 0;
    for (uint32_t u = 0; u < 0x7f800000u; ++u) {
      float amax;
      memcpy(&amax, &u, sizeof amax);
      const float want = amax / c;
      const float q = amax * rc;
      const float r = fmaf(-q, c, amax);
      const float got = r != r ? q : fmaf(r, rc, q);
      if (memcmp(&want, &got, sizeof want) != 0) {
        if (want >= 1e-13f) {
          if (bad++ < 5) printf("c=%g amax=%a: %a != %a\n", c, amax, got, want);
        } else if (got >= 1e-12f) {
          ++bad;  /* would escape the floor */
        } else {
          ++below;
        }
      }
    }
    printf("fp8_max %g: %ld mismatches above 1e-13, %ld below it (floored)\n", c, bad, below);
    failures += bad;
  }
  return failures != 0;
}
