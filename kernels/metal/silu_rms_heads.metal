// SiLU + RMS head split of the convolution output into q, k (normalized, scaled) and v.
// RMS reduction adapted from MLX's rms_norm kernel, Copyright © 2024 Apple Inc., MIT license
// (THIRD_PARTY_NOTICES.md). eps arrives as its float32 bit pattern (template EPS).
// Launch: grid (32 * (2 * HK + HV), B * S, 1), threadgroup (32 k, 1, 1) for k dividing the heads
// (1 on Metal); template T, C, HK, HV,
// DK, DV, EPS. Heads of up to 128 values: lane l owns columns [4l, 4l + 4).
#ifndef MLXK_MUL  // a product that must not fuse into a following add (docs/DESIGN.md §3)
#define MLXK_MUL(a, b) ((a) * (b))
#endif
  const uint lane = thread_index_in_simdgroup;
  // One SIMD group per (head, row): 32 lanes of grid x per head (a threadgroup may hold several).
  const uint head = thread_position_in_grid.x / 32u;
  const uint row = thread_position_in_grid.y;
  const bool normalize = head < uint(2 * HK);
  const uint width = normalize ? uint(DK) : uint(DV);
  const uint channel = normalize ? head * uint(DK)
    : uint(2 * HK * DK) + (head - uint(2 * HK)) * uint(DV);
  T values[4];
  float sum = 0.0f;
  for (uint i = 0; i < 4u; ++i) {
    const uint col = lane * 4u + i;
    const T value = col < width ? x[row * uint(C) + channel + col] : T(0);
    values[i] = mlxk_silu(value);  // kernels/metal/silu.h, the launch's header
    const float activated = float(values[i]);
    sum += MLXK_MUL(activated, activated);
  }
  if (normalize) {
    sum = metal::simd_sum(sum);
    const float inv = metal::precise::rsqrt(sum / float(DK) + as_type<float>(uint(EPS)));
    const uint index = (row * uint(HK) + head % uint(HK)) * uint(DK) + lane * 4u;
    for (uint i = 0; i < 4u; ++i) {
      if (lane * 4u + i >= uint(DK)) continue;
      const T normalized = T(float(values[i]) * inv);
      if (head < uint(HK)) q[index + i] = qscale[lane * 4u + i] * normalized;
      else k[index + i] = kscale[lane * 4u + i] * normalized;
    }
  } else {
    const uint index = (row * uint(HV) + head - uint(2 * HK)) * uint(DV) + lane * 4u;
    for (uint i = 0; i < 4u; ++i) if (lane * 4u + i < uint(DV)) v[index + i] = values[i];
  }
