// The matrix tiles' MLX CUDA form (kernels/cuda/tiles.cuh) on the Metal shim, in place of their
// Metal form, for the emulator builds that check CUDA's lane layouts on the CPU
// (scripts/test/metal-emu.sh: MLXK_EMU_TILE_FORM = MLXK_TILE_FMA, MLXK_TILE_TF32 or
// MLXK_TILE_BF16). emu_kernels.cc includes it after metal_shim.h and before the kernels: it
// defines the Metal form's include guard (so the launch headers' Metal form compiles to
// nothing) and gives tiles.cuh the four operations its PTX would perform:
// * to_tf32: cvt.rna.tf32.f32, nearest with ties away from zero to 10 mantissa bits (the low
//   13 bits of the float cleared; infinities and NaN unchanged);
// * pack_bf16: cvt.rn.bf16x2.f32, each half rounded to nearest even (the shim's bfloat);
// * __fmaf_rn, __shfl_xor_sync: std::fma, the shim's simd_shuffle_xor;
// * mma_tf32, mma_bf16: mma.sync.aligned.m16n8k8.row.col.f32.{tf32,bf16} as a SIMD collective:
//   every lane deposits its fragments, the resolver builds A (16 x 8), B (8 x 8) and C (16 x 8)
//   through the PTX ISA's fragment layouts ("Matrix fragments for mma.m16n8k8"; g = lane / 4,
//   t = lane % 4) and computes D[i][j] = C[i][j] + sum over k of A[i][k] B[k][j] with k = 0 to 7,
//   each step one fused multiply-add. NVIDIA documents neither the order nor the rounding of
//   the tensor cores' sums (Fasi et al., PeerJ CS 7:e330, measured truncation), so only the
//   layouts and the inputs' rounding are NVIDIA's here; results are checked within bounds.
#pragma once

#include <cmath>
#include <cstring>

#define MLXK_TILES_H  // the Metal form in the launches' headers: skipped
#define MLXK_TILE_HOST
#define MLXK_TILE_FORM MLXK_EMU_TILE_FORM
#ifndef METAL_FUNC
#define METAL_FUNC inline
#endif

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __shfl_xor_sync(unsigned, float x, int mask) {
  return emu::simd_shuffle_xor(x, static_cast<uint16_t>(mask));
}

namespace emu {

inline float tf32_value(uint32_t bits) { return mlxk_emu::bits_to_float(bits); }
inline float bf16_value(uint32_t bits16) { return mlxk_emu::bits_to_float(bits16 << 16); }

// D = C + A B from the 32 lanes' fragments (`layout` 1: tf32, 2: bf16).
inline void resolve_cuda_mma(const void* const* in, void* const* out, uint64_t layout) {
  float a[16][8], b[8][8], c[16][8];
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    const uint32_t* v = static_cast<const uint32_t*>(in[l]);  // a[4], b[2], c[4]
    const uint32_t g = l >> 2, t = l & 3;
    if (layout == 1) {
      a[g][t] = tf32_value(v[0]);
      a[g + 8][t] = tf32_value(v[1]);
      a[g][t + 4] = tf32_value(v[2]);
      a[g + 8][t + 4] = tf32_value(v[3]);
      b[t][g] = tf32_value(v[4]);
      b[t + 4][g] = tf32_value(v[5]);
    } else {
      a[g][2 * t] = bf16_value(v[0] & 0xFFFFu);
      a[g][2 * t + 1] = bf16_value(v[0] >> 16);
      a[g + 8][2 * t] = bf16_value(v[1] & 0xFFFFu);
      a[g + 8][2 * t + 1] = bf16_value(v[1] >> 16);
      b[2 * t][g] = bf16_value(v[4] & 0xFFFFu);
      b[2 * t + 1][g] = bf16_value(v[4] >> 16);
    }
    for (uint32_t e = 0; e < 4; ++e) {
      c[g + 8 * (e >> 1)][2 * t + (e & 1)] = mlxk_emu::bits_to_float(v[6 + e]);
    }
  }
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    const uint32_t g = l >> 2, t = l & 3;
    float d[4];
    for (uint32_t e = 0; e < 4; ++e) {
      const uint32_t i = g + 8 * (e >> 1), j = 2 * t + (e & 1);
      float acc = c[i][j];
      for (uint32_t k = 0; k < 8; ++k) acc = std::fma(a[i][k], b[k][j], acc);
      d[e] = acc;
    }
    std::memcpy(out[l], d, sizeof d);
  }
}

inline void cuda_mma(uint64_t layout, float* c, const uint32_t* a, int na, const uint32_t* b,
                     int nb) {
  uint32_t in[10] = {0};
  for (int i = 0; i < na; ++i) in[i] = a[i];
  for (int i = 0; i < nb; ++i) in[4 + i] = b[i];
  for (int e = 0; e < 4; ++e) in[6 + e] = mlxk_emu::float_to_bits(c[e]);
  simd_collective(&resolve_cuda_mma, layout, in, sizeof in, c, 4 * sizeof(float));
}

}  // namespace emu

namespace mlxk_tile {

inline uint to_tf32(float x) {
  uint32_t bits = mlxk_emu::float_to_bits(x);
  if ((bits & 0x7F800000u) == 0x7F800000u) return bits;
  return (bits + 0x1000u) & 0xFFFFE000u;
}
inline uint pack_bf16(float lo, float hi) {
  return uint(mlxk_emu::float_to_bfloat_bits(lo)) | uint(mlxk_emu::float_to_bfloat_bits(hi)) << 16;
}
inline void mma_tf32(float* c, const uint* a, const uint* b) { emu::cuda_mma(1, c, a, 4, b, 2); }
inline void mma_bf16(float* c, const uint* a, const uint* b) { emu::cuda_mma(2, c, a, 2, b, 1); }

}  // namespace mlxk_tile

#include "kernels/cuda/tiles.cuh"
