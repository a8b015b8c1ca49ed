// kernels/cuda/metal_compat.cuh's exp floors x + 0.5 in float where MLX's CPU exp adds in double.
// For every float x_init in [-88, 88] (x = x_init * 1.442695f, rounded): floor((double)x + 0.5)
// equals the float form: s = x + 0.5f; i = floorf(s); if (i == s && i - 0.5f > x) i -= 1.
// Build: cc -O2 -ffp-contract=off scripts/cuda/exp_floor_check.c -lm; about 11 s; exit 0 = equal.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  uint64_t n = 0, bad = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; ++u) {
    uint32_t bits = (uint32_t)u;
    float xi;
    memcpy(&xi, &bits, 4);
    if (!(xi >= -88.0f && xi <= 88.0f)) continue;
    volatile float x = xi * 1.442695f;
    float want = (float)floor((double)x + 0.5);
    volatile float r = x + 0.5f;
    float i = floorf(r);
    volatile float back = i - 0.5f;
    if (i == r && back > x) i -= 1.0f;
    ++n;
    if (i != want) { if (bad < 5) printf("x_init %a x %a want %g got %g\n", xi, x, want, i); ++bad; }
  }
  printf("%llu inputs, %llu differ\n", (unsigned long long)n, (unsigned long long)bad);
  return bad != 0;
}
