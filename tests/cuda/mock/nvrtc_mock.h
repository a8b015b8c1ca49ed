// Compile-only stand-ins for what NVRTC and MLX's device header (mlx/backend/cuda/device/
// utils.cuh) give a custom kernel, so that tests/cuda/syntax.rs can run the CUDA kernel texts
// exactly as MLX assembles them through a host C++ compiler with -fsyntax-only: an identifier
// CUDA does not have, a typo or a type error fails here instead of on the GPU machine. Nothing
// here is run. No system header is included: glibc's would declare names (ushort, ...) that
// NVRTC does not have.
#pragma once

#define __device__
#define __global__
#define __shared__
#define __forceinline__ inline
#define __grid_constant__

typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned long size_t;

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
};
uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z);
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
float2 make_float2(float x, float y);
float4 make_float4(float x, float y, float z, float w);

float __fadd_rn(float, float);
float __fsub_rn(float, float);
float __fmul_rn(float, float);
float __fdiv_rn(float, float);
float __fmaf_rn(float, float, float);
float __fsqrt_rn(float);
float __frcp_rn(float);
float __int_as_float(int);
int __float_as_int(float);
float __uint_as_float(unsigned int);
unsigned int __float_as_uint(float);
float floorf(float);
float log1pf(float);
float __shfl_xor_sync(unsigned int mask, float x, int lane_mask);
float __shfl_sync(unsigned int mask, float x, int lane);
void __syncthreads();

// cuda_bf16.h / cuda_fp16.h: 16-bit types that convert to and from float implicitly.
struct __nv_bfloat16 {
  unsigned short bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float);
  operator float() const;
};
float __bfloat162float(__nv_bfloat16);
__nv_bfloat16 __float2bfloat16_rn(float);
__nv_bfloat16 __ushort_as_bfloat16(unsigned short);
unsigned short __bfloat16_as_ushort(__nv_bfloat16);
struct __half {
  unsigned short bits;
  __half() = default;
  __half(float);
  operator float() const;
};
float __half2float(__half);
__half __float2half_rn(float);
__half __ushort_as_half(unsigned short);
unsigned short __half_as_ushort(__half);

// cuda_bf16.hpp / cuda_fp16.hpp: arithmetic and comparisons of two 16-bit values.
#define MLXK_MOCK_OPERATORS(H)            \
  H operator+(const H&, const H&);        \
  H operator-(const H&, const H&);        \
  H operator*(const H&, const H&);        \
  H operator/(const H&, const H&);        \
  H operator-(const H&);                  \
  bool operator==(const H&, const H&);    \
  bool operator!=(const H&, const H&);    \
  bool operator<(const H&, const H&);     \
  bool operator>(const H&, const H&);     \
  bool operator<=(const H&, const H&);    \
  bool operator>=(const H&, const H&);
MLXK_MOCK_OPERATORS(__nv_bfloat16)
MLXK_MOCK_OPERATORS(__half)
#undef MLXK_MOCK_OPERATORS

namespace cooperative_groups {}

namespace mlx::core::cu {
template <class T, int N>
struct mock_array {
  T values[N];
  const T& operator[](int i) const { return values[i]; }
};
using Shape = mock_array<int32_t, 10>;
using Strides = mock_array<int64_t, 10>;
}  // namespace mlx::core::cu
