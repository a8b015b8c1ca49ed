// Scalar numerics of the Metal-text emulation, shared by the shim (metal_shim.h) and the test
// harness: IEEE bit casts, the float32 -> bfloat16 / binary16 conversions, and the CPU kernels'
// transcendental formulas (src/cpu/math.rs: MLX's CPU exp; rsqrt = 1 / sqrt).
//
// Compiled with -ffp-contract=off and without fast-math: every float operation below is one
// IEEE single operation, rounded to nearest even.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mlxk_emu {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// float32 -> bfloat16, round to nearest even; NaN -> 0x7FC0. This is MLX's definition
// (float_to_bfloat_bits in mlx/backend/metal/kernels/bf16.h before Metal 3.1, and MLX's CPU
// _MLX_BFloat16), src/cpu/elem.rs's bf16_bits, and Metal's own float -> bfloat conversion
// (round to nearest even) for every non-NaN value.
inline uint16_t float_to_bfloat_bits(float x) {
  if (std::isnan(x)) return 0x7FC0;
  uint32_t bits = float_to_bits(x);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float bfloat_bits_to_float(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

// float32 -> IEEE binary16, round to nearest even (subnormals kept, overflow to infinity);
// NaN -> 0x7E00 with the sign, as src/cpu/elem.rs converts.
inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: infinity
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal or zero
    if (ax <= 0x33000000u) return sign;  // <= 2^-25 (a tie with 0 rounds to even 0)
    const uint32_t mantissa = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - (ax >> 23);  // 14..24
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (ax >> 13) - (112u << 10);
  const uint32_t rest = ax & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_to_float(sign | 0x7F800000u | (mantissa << 13));
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// MLX's CPU exp for float32 (mlx/backend/cpu/simd/math.h), as src/cpu/math.rs ports it:
// 2^(x * log2 e) split into an integer power built in the exponent bits and a degree-6
// polynomial (fused multiply-adds) for the fraction; x + 0.5 is rounded in double as MLX adds
// the double 0.5. The edge cases are taken first (same results as the Rust order, without the
// out-of-range float -> int conversion that C++ leaves undefined).
inline float exp_f32(float x_init) {
  if (std::isnan(x_init)) return x_init;
  if (x_init > 88.0f) return std::numeric_limits<float>::infinity();
  if (x_init < -88.0f) return 0.0f;
  const float x = x_init * 1.442695f;
  const float ipart = static_cast<float>(std::floor(static_cast<double>(x) + 0.5));
  const float fpart = x - ipart;
  float p = 1.535336188319500e-4f;
  p = std::fma(p, fpart, 1.339887440266574e-3f);
  p = std::fma(p, fpart, 9.618437357674640e-3f);
  p = std::fma(p, fpart, 5.550332471162809e-2f);
  p = std::fma(p, fpart, 2.402264791363012e-1f);
  p = std::fma(p, fpart, 6.931472028550421e-1f);
  p = std::fma(p, fpart, 1.000000000000000f);
  const uint32_t epart = static_cast<uint32_t>(static_cast<int32_t>(ipart) + 127) << 23;
  return bits_to_float(epart) * p;
}

// rsqrt as the CPU kernels compute it (src/cpu/math.rs): 1 / sqrt(x), each correctly rounded.
inline float rsqrt_f32(float x) { return 1.0f / std::sqrt(x); }

}  // namespace mlxk_emu
