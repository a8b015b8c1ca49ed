// The gates fused into the CUDA recurrence and replay (docs/DESIGN.md §3, "MLX CUDA"), after
// metal_compat.cuh. MLX CUDA spends ~6-10 us of dispatch on every op; the seven ops of mlx-lm's
// compute_g and sigmoid would cost a decode step ten times its kernel. So on CUDA the inputs
// named g and beta carry the raw gate inputs a and b (same [B, T, Hv] layout), a_log and
// dt_bias come as two more inputs, and the kernel text's MLXK_GATE_DECAY_AT / MLXK_GATE_BETA_AT
// compute, per token and value head:
//   g    = exp(-exp(f32(A_log)) * softplus(a + dt_bias))   (a + dt_bias and softplus in the
//                                                           promoted dtype of a and dt_bias)
//   beta = sigmoid(b)                                       (in b's dtype)
// with MLX's CPU formulas and rounding points, as the CPU kernel's fused gates do
// (src/cpu/gated_delta/gates.rs, src/cpu/math.rs). The one formula not ported is log1p inside
// softplus: here CUDA's log1pf, on the CPU glibc's log1pf; both are within an ulp and the result
// is rounded to a bf16/f16 softplus for 16-bit gate inputs (tests/cuda/main.rs counts the gates
// that differ).

namespace mlxk_cuda {

template <class T>
__device__ inline float round_to(float x);
template <>
__device__ inline float round_to<float>(float x) {
  return x;
}
template <>
__device__ inline float round_to<__nv_bfloat16>(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
template <>
__device__ inline float round_to<__half>(float x) {
  return __half2float(__float2half_rn(x));
}

// MLX's promotion among the float dtypes: equal types stay, mixed ones become float32.
template <class A, class B>
struct promoted {
  using type = float;
};
template <class A>
struct promoted<A, A> {
  using type = A;
};

// MLX's CPU logaddexp(x, 0) in type P: every operation rounded to P.
template <class P>
__device__ inline float softplus(float x) {
  const float maxval = (x != x || x > 0.0f) ? x : 0.0f;
  const float minval = (x != x || x < 0.0f) ? x : 0.0f;
  const float inf = __int_as_float(0x7f800000);
  if (minval == -inf || maxval == inf) return maxval;
  const float e = round_to<P>(metal::exp(round_to<P>(__fsub_rn(minval, maxval))));
  return round_to<P>(__fadd_rn(maxval, round_to<P>(log1pf(e))));
}

template <class A, class L, class D>
__device__ inline float gate_decay(A a, L a_log, D dt_bias) {
  using P = typename promoted<A, D>::type;
  const float sum = round_to<P>(__fadd_rn(static_cast<float>(a), static_cast<float>(dt_bias)));
  const float rate = -metal::exp(static_cast<float>(a_log));
  return metal::exp(__fmul_rn(rate, softplus<P>(sum)));
}

// MLX's CPU sigmoid in b's type: e = T(exp(|x|)), y = 1 / (1 + e) in float, T(x < 0 ? y : 1 - y).
template <class T>
__device__ inline float gate_beta(T b) {
  const float x = static_cast<float>(b);
  const float e = round_to<T>(metal::exp(metal::abs(x)));
  const float y = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
  return round_to<T>(x < 0.0f ? y : __fsub_rn(1.0f, y));
}

}  // namespace mlxk_cuda

#define MLXK_GATE_DECAY_AT(t) \
  ::mlxk_cuda::gate_decay(g_[(t) * Hv + hv_idx], a_log[hv_idx], dt_bias[hv_idx])
#define MLXK_GATE_BETA_AT(t) ::mlxk_cuda::gate_beta(beta_[(t) * Hv + hv_idx])
