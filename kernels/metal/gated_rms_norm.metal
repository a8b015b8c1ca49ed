// Gated RMSNorm (Qwen's RMSNormGated): MLX's four-values-per-thread RMS reduction, then the
// float32 SiLU gate. RMS reduction adapted from MLX's rms_norm kernel, Copyright © 2024 Apple
// Inc., MIT license (THIRD_PARTY_NOTICES.md). eps arrives as its float32 bit pattern (EPS).
// Launch: grid (rows * THREADS, 1, 1), threadgroup (THREADS, 1, 1) with
// THREADS = min(1024, ceil(D / 128) * 32) (on CUDA, k * 32 for k rows when THREADS is 32);
// template T, D, THREADS, EPS.
#ifndef MLXK_MUL  // a product that must not fuse into a following add (docs/DESIGN.md §3)
#define MLXK_MUL(a, b) ((a) * (b))
#endif
  // Row r is threads [r * THREADS, (r + 1) * THREADS) of grid x: one threadgroup on Metal; on
  // CUDA a block may hold several rows when THREADS is 32 (one SIMD group a row, no
  // threadgroup memory).
  const uint row = thread_position_in_grid.x / uint(THREADS);
  const uint lane = thread_index_in_simdgroup;
  float acc = 0.0f;
  const uint tid = thread_position_in_grid.x % uint(THREADS);
  threadgroup float sums[32];
  threadgroup float inverse[1];
  for (uint r = 0; r < uint(D); r += uint(THREADS) * 4u) {
    for (uint i = 0; i < 4u; ++i) {
      const uint col = r + tid * 4u + i;
      const float value = col < uint(D) ? float(x[row * uint(D) + col]) : 0.0f;
      acc += MLXK_MUL(value, value);
    }
  }
  acc = metal::simd_sum(acc);
  if (THREADS > 32) {
    const uint sg = simdgroup_index_in_threadgroup;
    if (sg == 0) sums[lane] = 0.0f;
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (lane == 0) sums[sg] = acc;
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (sg == 0) {
      acc = metal::simd_sum(sums[lane]);
      if (lane == 0) inverse[0] = metal::precise::rsqrt(acc / float(D) + as_type<float>(uint(EPS)));
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  }
  const float inv = THREADS > 32 ? inverse[0]
    : metal::precise::rsqrt(acc / float(D) + as_type<float>(uint(EPS)));
  for (uint r = 0; r < uint(D); r += uint(THREADS) * 4u) {
    for (uint i = 0; i < 4u; ++i) {
      const uint col = r + tid * 4u + i, index = row * uint(D) + col;
      if (col >= uint(D)) continue;
      const T normalized = weight[col] * T(float(x[index]) * inv);
      const float g = float(gate[index]);
      const float y = 1.0f / (1.0f + metal::exp(metal::abs(g)));
      const float sigmoid = g < 0.0f ? y : 1.0f - y;
      out[index] = T((g * sigmoid) * float(normalized));
    }
  }
