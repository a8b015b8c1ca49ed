// SiLU with MLX's CPU rounding points: the header of the head split (silu_rms_heads.metal) and
// of the recurrence computing its q, k and v from the convolution's output (gated_delta.metal,
// MLXK_FROM_CONV), so both compute the same bits. x * sigmoid(x), with e = exp(|x|) rounded to
// T, y = 1 / (1 + e) and 1 - y in float, sigmoid rounded to T, the product rounded to T (as
// MLX's CPU sigmoid and multiply round them; docs/DESIGN.md §3).
#ifndef MLXK_SILU_H
#define MLXK_SILU_H
#ifndef METAL_FUNC
#define METAL_FUNC inline
#endif
#ifndef MLXK_MUL  // a product that must not fuse into a following add (docs/DESIGN.md §3)
#define MLXK_MUL(a, b) ((a) * (b))
#endif
// x * sigmoid: rounded to T for 16-bit T; for float32, a product no following add may absorb.
template <typename T>
METAL_FUNC T mlxk_silu_product(T x, T sigmoid) {
  return x * sigmoid;
}
METAL_FUNC float mlxk_silu_product(float x, float sigmoid) { return MLXK_MUL(x, sigmoid); }
template <typename T>
METAL_FUNC T mlxk_silu(T value) {
  const float e = float(T(metal::exp(float(metal::abs(value)))));
  const float y = 1.0f / (1.0f + e);
  const T sigmoid = T(value < T(0) ? y : 1.0f - y);
  return mlxk_silu_product(value, sigmoid);
}
#endif
