// Metal's names for NVRTC: the kernels in kernels/metal/ compile unchanged through MLX's
// mx::fast::cuda_kernel with this text as their header (docs/DESIGN.md §3, "MLX CUDA").
//
// MLX puts this after its own header (mlx/backend/cuda/device/utils.cuh: cuda_bf16.h,
// cuda_fp16.h) and before the kernel, whose body runs inside `namespace mlx::core::cu`. It
// declares inputs as `const T* name` and outputs as `T* name` (bf16 is __nv_bfloat16, f16 is
// __half), template arguments as `constexpr int` / `using` lines, and launches
// ceil(grid / threadgroup) blocks of `threadgroup` threads (src/cuda.rs picks threadgroups that
// divide the grid, so no thread lies outside it, as with Metal's dispatchThreads).
//
// Every rule below keeps the CPU kernels' bits:
// - NVRTC compiles with --fmad=true, so `a * b + c` may become one FMA. The kernel text wraps
//   each product that feeds a sum in MLXK_MUL: here __fmul_rn, which is never contracted.
// - float with __nv_bfloat16 / __half mixes as Metal does: the 16-bit value widens to float and
//   the operation is float (NVRTC 13 otherwise finds `float * __nv_bfloat16` ambiguous between
//   the built-in and cuda_bf16.h's operators). 16-bit with 16-bit stays 16-bit, correctly
//   rounded (equal to the float result rounded, as the CPU kernels compute it).
// - metal::exp is MLX's CPU exp (src/cpu/math.rs), metal::precise::rsqrt is 1 / sqrt, each
//   step correctly rounded; metal::abs clears the sign bit.
// - simd_sum is the xor butterfly at offsets 1, 2, 4, 8, 16 (src/cpu/reduce.rs); a warp is a
//   SIMD group (lanes are the linear thread index mod 32, x fastest, as on Metal).

typedef unsigned int uint;

#define MLXK_MUL(a, b) __fmul_rn((a), (b))

// Metal's inline-function marker (kernels/metal/silu.h): functions a kernel calls.
#define METAL_FUNC __device__ inline

namespace mlxk_cuda {
__device__ inline uint linear_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
__device__ inline uint3 grid_position() {
  return make_uint3(blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y * blockDim.y + threadIdx.y,
                    blockIdx.z * blockDim.z + threadIdx.z);
}
}  // namespace mlxk_cuda

#define thread_position_in_grid (::mlxk_cuda::grid_position())
#define thread_position_in_threadgroup (threadIdx)
#define threadgroup_position_in_grid (blockIdx)
#define thread_index_in_simdgroup (::mlxk_cuda::linear_thread() & 31u)
#define simdgroup_index_in_threadgroup (::mlxk_cuda::linear_thread() >> 5)
#define threadgroup __shared__

namespace metal {

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

__device__ inline float simd_sum(float x) {
  for (int offset = 1; offset < 32; offset <<= 1) {
    x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Lane `from`'s x for every lane of the warp (all 32 take part).
__device__ inline float simd_shuffle(float x, int from) {
  return __shfl_sync(0xffffffffu, x, from);
}
// The int form (a pool's row table value, the same in every lane).
__device__ inline int simd_shuffle(int x, int from) { return __shfl_sync(0xffffffffu, x, from); }

__device__ inline float abs(float x) { return __uint_as_float(__float_as_uint(x) & 0x7fffffffu); }
__device__ inline __nv_bfloat16 abs(__nv_bfloat16 x) {
  return __ushort_as_bfloat16(__bfloat16_as_ushort(x) & 0x7fffu);
}
__device__ inline __half abs(__half x) { return __ushort_as_half(__half_as_ushort(x) & 0x7fffu); }

// MLX's CPU exp (mlx/backend/cpu/simd/math.h; src/cpu/math.rs): 2^(x log2 e) as an integer power
// built in the exponent bits times a degree-6 polynomial in fused multiply-adds. MLX floors
// x + 0.5 added in double; here in float, with the one case float rounding changes put back:
// the sum rounded up onto an integer it does not reach (then the floor is one less). For
// |x| < 128 both give the same integer for every float input (all 2.24e9 of [-88, 88]:
// scripts/cuda/exp_floor_check.c), without double-precision arithmetic. The edge cases first,
// as the emulator's port does.
__device__ inline float exp(float x_init) {
  if (x_init != x_init) return x_init;
  if (x_init > 88.0f) return __int_as_float(0x7f800000);
  if (x_init < -88.0f) return 0.0f;
  const float x = __fmul_rn(x_init, 1.442695f);
  const float sum = __fadd_rn(x, 0.5f);
  float ipart = floorf(sum);
  if (ipart == sum && __fsub_rn(ipart, 0.5f) > x) ipart = __fsub_rn(ipart, 1.0f);
  const float fpart = __fsub_rn(x, ipart);
  float p = 1.535336188319500e-4f;
  p = __fmaf_rn(p, fpart, 1.339887440266574e-3f);
  p = __fmaf_rn(p, fpart, 9.618437357674640e-3f);
  p = __fmaf_rn(p, fpart, 5.550332471162809e-2f);
  p = __fmaf_rn(p, fpart, 2.402264791363012e-1f);
  p = __fmaf_rn(p, fpart, 6.931472028550421e-1f);
  p = __fmaf_rn(p, fpart, 1.000000000000000f);
  const unsigned int epart = static_cast<unsigned int>(static_cast<int>(ipart) + 127) << 23;
  return __fmul_rn(__uint_as_float(epart), p);
}

namespace precise {
__device__ inline float rsqrt(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }
}  // namespace precise

}  // namespace metal

using metal::simd_sum;
using metal::simd_shuffle;

__device__ inline void threadgroup_barrier(metal::mem_flags) { __syncthreads(); }

// A lane's N consecutive state values (the recurrence's and replay's MLXK_LOAD_STATE /
// MLXK_STORE_STATE): float4 (or float2) accesses where N and the address allow, one value at a
// time otherwise. Loads and stores only: the values are those of the element-wise form.
namespace mlxk_cuda {
template <int N, class T>
__device__ inline void load_lane(float* dst, const T* src) {
  for (int i = 0; i < N; ++i) dst[i] = static_cast<float>(src[i]);
}
template <int N>
__device__ inline void load_lane(float* dst, const float* src) {
  const unsigned long long at = reinterpret_cast<unsigned long long>(src);
  if (N % 4 == 0 && at % 16 == 0) {
    for (int i = 0; i < N; i += 4) {
      const float4 x = *reinterpret_cast<const float4*>(src + i);
      dst[i] = x.x;
      dst[i + 1] = x.y;
      dst[i + 2] = x.z;
      dst[i + 3] = x.w;
    }
  } else if (N % 2 == 0 && at % 8 == 0) {
    for (int i = 0; i < N; i += 2) {
      const float2 x = *reinterpret_cast<const float2*>(src + i);
      dst[i] = x.x;
      dst[i + 1] = x.y;
    }
  } else {
    for (int i = 0; i < N; ++i) dst[i] = src[i];
  }
}
template <int N>
__device__ inline void store_lane(float* dst, const float* src) {
  const unsigned long long at = reinterpret_cast<unsigned long long>(dst);
  if (N % 4 == 0 && at % 16 == 0) {
    for (int i = 0; i < N; i += 4) {
      *reinterpret_cast<float4*>(dst + i) = make_float4(src[i], src[i + 1], src[i + 2], src[i + 3]);
    }
  } else if (N % 2 == 0 && at % 8 == 0) {
    for (int i = 0; i < N; i += 2) {
      *reinterpret_cast<float2*>(dst + i) = make_float2(src[i], src[i + 1]);
    }
  } else {
    for (int i = 0; i < N; ++i) dst[i] = src[i];
  }
}
}  // namespace mlxk_cuda

#define MLXK_LOAD_STATE(dst, src) ::mlxk_cuda::load_lane<n_per_t>(dst, src)
#define MLXK_STORE_STATE(dst, src) ::mlxk_cuda::store_lane<n_per_t>(dst, src)

// as_type: the bit casts the kernels use (float from its uint/int bit pattern and back).
template <typename To, typename From>
__device__ inline To as_type(From from);
template <>
__device__ inline float as_type<float, uint>(uint from) {
  return __uint_as_float(from);
}
template <>
__device__ inline float as_type<float, int>(int from) {
  return __int_as_float(from);
}
template <>
__device__ inline uint as_type<uint, float>(float from) {
  return __float_as_uint(from);
}

// Mixed float / 16-bit arithmetic with Metal's promotion (see above).
#define MLXK_MIXED(H, WIDEN)                                                            \
  __device__ inline float operator+(H a, float b) { return __fadd_rn(WIDEN(a), b); }    \
  __device__ inline float operator+(float a, H b) { return __fadd_rn(a, WIDEN(b)); }    \
  __device__ inline float operator-(H a, float b) { return __fsub_rn(WIDEN(a), b); }    \
  __device__ inline float operator-(float a, H b) { return __fsub_rn(a, WIDEN(b)); }    \
  __device__ inline float operator*(H a, float b) { return __fmul_rn(WIDEN(a), b); }    \
  __device__ inline float operator*(float a, H b) { return __fmul_rn(a, WIDEN(b)); }    \
  __device__ inline float operator/(H a, float b) { return __fdiv_rn(WIDEN(a), b); }    \
  __device__ inline float operator/(float a, H b) { return __fdiv_rn(a, WIDEN(b)); }
MLXK_MIXED(__nv_bfloat16, __bfloat162float)
MLXK_MIXED(__half, __half2float)
#undef MLXK_MIXED
