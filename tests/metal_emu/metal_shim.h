// The Metal Shading Language surface that kernels/metal/*.metal use, for compiling those files
// unchanged as C++17 (with MLX's preamble, `metal::utils()`, in mind: `using namespace metal`,
// bfloat16_t, float16_t). Include after every other header: it defines the address-space
// qualifiers as macros. See docs/metal-emulator.md for the decisions; in short:
//
// * Address spaces: `device`, `constant`, `thread` are empty. `threadgroup` makes a variable
//   `static`, so all fibers (threads) of the running threadgroup share it; the executor runs
//   one threadgroup at a time, so each threadgroup has the storage to itself. It is not reset
//   between threadgroups (Metal leaves it uninitialized; GCC ignores section attributes on
//   template-local statics, so there is no portable way to find and poison it).
// * half: IEEE binary16; Metal's half arithmetic is half precision: half op half -> half,
//   half op integer -> half (the integer converts to half), half op float -> float; each half
//   result is the float result rounded to nearest even (exact for + - * / of two halves: float
//   carries more than 2 * 11 + 2 bits, so the double rounding is harmless).
// * bfloat16_t: MLX 0.32 on Metal 3.1+ is `typedef bfloat bfloat16_t` (mlx/backend/metal/
//   kernels/bf16.h), Metal's native bfloat. Rules (MSL 3.1, as quoted in MLX's bf16_math.h):
//   bfloat converts implicitly only to float; float and half do not convert implicitly to
//   bfloat; arithmetic follows C++'s usual conversions, so bfloat op bfloat -> bfloat,
//   bfloat op integer -> bfloat, bfloat op float -> float, bfloat op half is an error. Each
//   bfloat result is the float result rounded to nearest even (NaN -> 0x7FC0). These are also
//   the result types of MLX's pre-3.1 struct _MLX_BFloat16 (bfloat op int32 -> bfloat computed
//   in float). Each operation rounds (no excess precision kept across a bfloat expression).
// * metal::exp returns its argument's type: exp(float) is MLX's CPU exp formula (the one the
//   CPU kernels use); exp(half) and exp(bfloat) round that float result to the type (MLX's
//   bf16_math.h defines exp(bfloat) as bfloat(exp(float(x)))). metal::precise::rsqrt(x) is
//   1 / sqrt(x). fast:: and precise:: variants are the same functions. Built with
//   -DMLXK_EMU_EXP_RETURNS_FLOAT (a diagnostic, not Metal), exp(half) and exp(bfloat) return
//   the same rounded value typed float.
// * simd_sum is the xor butterfly (offsets 1, 2, 4, 8, 16: x[l] = x[l] + x[l ^ offset]) over
//   the 32 lanes of the SIMD group; simd_shuffle_xor exchanges lanes; simd_shuffle broadcasts
//   one lane (named alike in every lane); all are collectives the executor resolves when all
//   32 lanes arrive. threadgroup_barrier waits for the threadgroup.
// * simdgroup_float8x8 and its load, store and multiply-accumulate: simdgroup_matrix.h (lane
//   map and summation order there).
// * No double: arithmetic of half or bfloat with double is deleted (Metal has no double).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "executor.h"
#include "metal_numeric.h"

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;

struct uint3 {
  uint x, y, z;
};

// ------------------------------------------------------------------------------------------
// half and bfloat (Metal 3.1's native type; MLX: typedef bfloat bfloat16_t): the bits, made
// from a float (round to nearest even, metal_numeric.h) or an integer, read as a float.

#define MLXK_EMU_FLOAT16(X, TO_BITS, FROM_BITS)                              \
  struct X {                                                                 \
    uint16_t bits_;                                                          \
    X() = default;                                                           \
    explicit X(float x) : bits_(mlxk_emu::TO_BITS(x)) {}                     \
    template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>     \
    X(I i) : bits_(mlxk_emu::TO_BITS(static_cast<float>(i))) {}              \
    operator float() const { return mlxk_emu::FROM_BITS(bits_); }            \
    static X from_bits(uint16_t b) {                                         \
      X h;                                                                   \
      h.bits_ = b;                                                           \
      return h;                                                              \
    }                                                                        \
  };

MLXK_EMU_FLOAT16(half, float_to_half_bits, half_bits_to_float)
MLXK_EMU_FLOAT16(bfloat, float_to_bfloat_bits, bfloat_bits_to_float)

#define MLXK_EMU_INTEGRAL template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>

// X op X -> X, X op integer -> X, X op float -> float; comparisons in float.
#define MLXK_EMU_ARITH(X, OP)                                                              \
  inline X operator OP(X a, X b) { return X(static_cast<float>(a) OP static_cast<float>(b)); } \
  inline float operator OP(X a, float b) { return static_cast<float>(a) OP b; }            \
  inline float operator OP(float a, X b) { return a OP static_cast<float>(b); }            \
  MLXK_EMU_INTEGRAL inline X operator OP(X a, I b) { return a OP X(b); }                   \
  MLXK_EMU_INTEGRAL inline X operator OP(I a, X b) { return X(a) OP b; }                   \
  float operator OP(X, double) = delete;                                                   \
  float operator OP(double, X) = delete;

#define MLXK_EMU_COMPARE(X, OP)                                                            \
  inline bool operator OP(X a, X b) { return static_cast<float>(a) OP static_cast<float>(b); } \
  inline bool operator OP(X a, float b) { return static_cast<float>(a) OP b; }             \
  inline bool operator OP(float a, X b) { return a OP static_cast<float>(b); }             \
  MLXK_EMU_INTEGRAL inline bool operator OP(X a, I b) {                                    \
    return static_cast<float>(a) OP static_cast<float>(b);                                 \
  }                                                                                        \
  MLXK_EMU_INTEGRAL inline bool operator OP(I a, X b) {                                    \
    return static_cast<float>(a) OP static_cast<float>(b);                                 \
  }

#define MLXK_EMU_TYPE(X)                                                \
  MLXK_EMU_ARITH(X, +)                                                  \
  MLXK_EMU_ARITH(X, -)                                                  \
  MLXK_EMU_ARITH(X, *)                                                  \
  MLXK_EMU_ARITH(X, /)                                                  \
  MLXK_EMU_COMPARE(X, <)                                                \
  MLXK_EMU_COMPARE(X, <=)                                               \
  MLXK_EMU_COMPARE(X, >)                                                \
  MLXK_EMU_COMPARE(X, >=)                                               \
  MLXK_EMU_COMPARE(X, ==)                                               \
  MLXK_EMU_COMPARE(X, !=)                                               \
  inline X operator-(X a) { return X::from_bits(a.bits_ ^ 0x8000u); } \
  inline X operator+(X a) { return a; }                                 \
  inline X& operator+=(X& a, X b) { return a = a + b; }                 \
  inline X& operator-=(X& a, X b) { return a = a - b; }                 \
  inline X& operator*=(X& a, X b) { return a = a * b; }                 \
  inline X& operator/=(X& a, X b) { return a = a / b; }

MLXK_EMU_TYPE(half)
MLXK_EMU_TYPE(bfloat)

// Metal: bfloat and half do not mix implicitly.
#define MLXK_EMU_NO_MIX(OP)                  \
  float operator OP(bfloat, half) = delete; \
  float operator OP(half, bfloat) = delete;
MLXK_EMU_NO_MIX(+)
MLXK_EMU_NO_MIX(-)
MLXK_EMU_NO_MIX(*)
MLXK_EMU_NO_MIX(/)

#undef MLXK_EMU_NO_MIX
#undef MLXK_EMU_TYPE
#undef MLXK_EMU_COMPARE
#undef MLXK_EMU_ARITH
#undef MLXK_EMU_INTEGRAL

// ------------------------------------------------------------------------------------------
// namespace metal

namespace metal {

template <class To, class From>
inline To as_type(From from) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

inline float abs(float x) { return mlxk_emu::bits_to_float(mlxk_emu::float_to_bits(x) & 0x7FFFFFFFu); }
inline half abs(half x) { return half::from_bits(x.bits_ & 0x7FFFu); }
inline bfloat abs(bfloat x) { return bfloat::from_bits(x.bits_ & 0x7FFFu); }
inline int abs(int x) { return x < 0 ? -x : x; }

inline float exp(float x) { return mlxk_emu::exp_f32(x); }
#ifndef MLXK_EMU_EXP_RETURNS_FLOAT
inline half exp(half x) { return half(mlxk_emu::exp_f32(static_cast<float>(x))); }
inline bfloat exp(bfloat x) { return bfloat(mlxk_emu::exp_f32(static_cast<float>(x))); }
#else
// Diagnostic variant (not Metal): the same rounded value, typed float, so the arithmetic
// around exp happens in float. Used to show that a difference comes from that arithmetic.
inline float exp(half x) { return float(half(mlxk_emu::exp_f32(static_cast<float>(x)))); }
inline float exp(bfloat x) { return float(bfloat(mlxk_emu::exp_f32(static_cast<float>(x)))); }
#endif

inline float rsqrt(float x) { return mlxk_emu::rsqrt_f32(x); }
inline half rsqrt(half x) { return half(mlxk_emu::rsqrt_f32(static_cast<float>(x))); }
inline bfloat rsqrt(bfloat x) { return bfloat(mlxk_emu::rsqrt_f32(static_cast<float>(x))); }

namespace precise {
using metal::exp;
using metal::rsqrt;
}  // namespace precise

namespace fast {
using metal::exp;
using metal::rsqrt;
}  // namespace fast

enum class mem_flags : uint {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
};

inline void threadgroup_barrier(mem_flags) { emu::threadgroup_barrier(); }

template <class T>
inline T simd_sum(T x) {
  return emu::simd_sum(x);
}

template <class T>
inline T simd_shuffle(T x, ushort from) {
  return emu::simd_shuffle(x, from);
}

template <class T>
inline T simd_shuffle_xor(T x, ushort mask) {
  return emu::simd_shuffle_xor(x, mask);
}

}  // namespace metal

// simdgroup_float8x8 and its operations (namespace metal).
#include "simdgroup_matrix.h"

// MLX's preamble (metal::utils()).
using namespace metal;
typedef bfloat bfloat16_t;
typedef half float16_t;

// The thread attributes MLX may add to a kernel's signature (each only when its name appears in
// the source), with the types MLX gives them.
struct MetalThreadAttributes {
  uint dispatch_quadgroups_per_threadgroup;
  uint dispatch_simdgroups_per_threadgroup;
  uint3 dispatch_threads_per_threadgroup;
  uint3 grid_origin;
  uint3 grid_size;
  uint quadgroup_index_in_threadgroup;
  uint quadgroups_per_threadgroup;
  uint simdgroup_index_in_threadgroup;
  uint simdgroups_per_threadgroup;
  uint thread_execution_width;
  uint thread_index_in_quadgroup;
  uint thread_index_in_simdgroup;
  uint thread_index_in_threadgroup;
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threadgroups_per_grid;
  uint3 threads_per_grid;
  uint threads_per_simdgroup;
  uint3 threads_per_threadgroup;
};

inline MetalThreadAttributes metal_thread_attributes(const emu::ThreadCoords& c) {
  auto u3 = [](emu::Dim3 d) { return uint3{d.x, d.y, d.z}; };
  const uint threads = c.group_actual.x * c.group_actual.y * c.group_actual.z;
  const uint w = emu::kSimdWidth;
  MetalThreadAttributes a;
  a.dispatch_quadgroups_per_threadgroup = (threads + 3) / 4;
  a.dispatch_simdgroups_per_threadgroup = (threads + w - 1) / w;
  a.dispatch_threads_per_threadgroup = u3(c.group_actual);
  a.grid_origin = uint3{0, 0, 0};
  a.grid_size = u3(c.grid);
  a.quadgroup_index_in_threadgroup = c.index_in_group / 4;
  a.quadgroups_per_threadgroup = (threads + 3) / 4;
  a.simdgroup_index_in_threadgroup = c.index_in_group / w;
  a.simdgroups_per_threadgroup = (threads + w - 1) / w;
  a.thread_execution_width = w;
  a.thread_index_in_quadgroup = c.index_in_group % 4;
  a.thread_index_in_simdgroup = c.index_in_group % w;
  a.thread_index_in_threadgroup = c.index_in_group;
  a.thread_position_in_grid = u3(c.pos_in_grid);
  a.thread_position_in_threadgroup = u3(c.pos_in_group);
  a.threadgroup_position_in_grid = u3(c.group_pos);
  a.threadgroups_per_grid = u3(c.groups);
  a.threads_per_grid = u3(c.grid);
  a.threads_per_simdgroup = w;
  a.threads_per_threadgroup = u3(c.group_actual);
  return a;
}

// Address spaces.
#define device
#define constant
#define thread
#define threadgroup static
