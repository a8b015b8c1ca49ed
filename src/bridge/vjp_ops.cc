// The backward passes as MLX ops (the GPU default device's path, docs/DESIGN.md §4
// "Gradients"), apart from the rest of the bridge (mlx_bridge.cc).
#include "src/bridge/mlx_bridge.h"

#include <functional>
#include <memory>
#include <vector>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "mlxkern/src/bridge/mod.rs.h"

namespace mx = mlx::core;

namespace mlxk {

// The backward passes as MLX ops (the GPU default device's path, docs/DESIGN.md §4
// "Gradients"): each forward written with MLX ops in mlx-lm's formulation, differentiated by
// mx::vjp on the chosen stream, each gradient cast to its primal's dtype.
namespace {
// mx::vjp of `fun` at `primals` with `cotangents`; the gradients in the primals' dtypes.
std::unique_ptr<ArrayList> vjp_cast(
    const std::function<std::vector<mx::array>(const std::vector<mx::array>&)>& fun,
    const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
    mx::Stream s) {
  auto grads = mx::vjp(fun, primals, cotangents).second;
  auto out = std::make_unique<ArrayList>();
  for (size_t i = 0; i < grads.size(); ++i) {
    out->items.push_back(mx::astype(grads[i], primals[i].dtype(), s));
  }
  return out;
}

// The cotangent `given` (cast to `dtype`), or zeros of `shape` and `dtype`.
mx::array cotangent(const ArrayList& inputs, size_t& at, bool given, const mx::Shape& shape,
                    mx::Dtype dtype, mx::Stream s) {
  return given ? mx::astype(inputs.items.at(at++), dtype, s) : mx::zeros(shape, dtype, s);
}

// mlx-lm's compute_g on stream `s` (the ops of compute_g, mlx_bridge.cc).
mx::array gates_g(const mx::array& a_log, const mx::array& a, const mx::array& dt_bias,
                  mx::Stream s) {
  auto decay_rate = mx::negative(mx::exp(mx::astype(a_log, mx::float32, s), s), s);
  auto x = mx::add(a, dt_bias, s);
  auto softplus = mx::logaddexp(x, mx::array(0.0f, x.dtype()), s);
  return mx::exp(mx::multiply(decay_rate, softplus, s), s);
}
}  // namespace

std::unique_ptr<ArrayList> silu_rms_heads_vjp_ops(const ArrayList& inputs, int32_t key_heads,
                                                  int32_t value_heads, int32_t value_width,
                                                  float eps, bool has_dq, bool has_dk,
                                                  bool has_dv, bool gpu) {
  auto s = stream_for(gpu);
  const auto& in = inputs.items;
  const auto& x = in.at(0);
  int B = x.shape(0), S = x.shape(1), Dk = in.at(1).shape(0);
  int Hk = key_heads, Hv = value_heads, Dv = value_width;
  size_t at = 3;
  auto dq = cotangent(inputs, at, has_dq, {B, S, Hk, Dk}, x.dtype(), s);
  auto dk = cotangent(inputs, at, has_dk, {B, S, Hk, Dk}, x.dtype(), s);
  auto dv = cotangent(inputs, at, has_dv, {B, S, Hv, Dv}, x.dtype(), s);
  // mlx-lm: nn.silu(conv_out), split into q | k | v heads, mx.fast.rms_norm(q, q_scale, eps).
  auto fun = [=](const std::vector<mx::array>& p) {
    auto silu = mx::multiply(p[0], mx::sigmoid(p[0], s), s);
    auto parts = mx::split(silu, mx::Shape{Hk * Dk, 2 * Hk * Dk}, -1, s);
    auto q = mx::reshape(parts[0], {B, S, Hk, Dk}, s);
    auto k = mx::reshape(parts[1], {B, S, Hk, Dk}, s);
    auto v = mx::reshape(parts[2], {B, S, Hv, Dv}, s);
    return std::vector<mx::array>{mx::fast::rms_norm(q, p[1], eps, s),
                                  mx::fast::rms_norm(k, p[2], eps, s), v};
  };
  return vjp_cast(fun, {x, in.at(1), in.at(2)}, {dq, dk, dv}, s);
}

std::unique_ptr<ArrayList> gated_rms_norm_vjp_ops(const ArrayList& inputs, float eps,
                                                  bool has_dout, bool gpu) {
  auto s = stream_for(gpu);
  const auto& in = inputs.items;
  const auto& x = in.at(0);
  size_t at = 3;
  auto dout = cotangent(inputs, at, has_dout, x.shape(), x.dtype(), s);
  // Qwen's RMSNormGated (mlx-lm qwen3_next): mx.fast.rms_norm(x, weight, eps), then
  // precise_swiglu: (silu(f32(gate)) * f32(normed)) in x's dtype.
  auto fun = [=](const std::vector<mx::array>& p) {
    auto normed = mx::fast::rms_norm(p[0], p[2], eps, s);
    auto z = mx::astype(p[1], mx::float32, s);
    auto gate = mx::multiply(z, mx::sigmoid(z, s), s);
    auto out = mx::multiply(gate, mx::astype(normed, mx::float32, s), s);
    return std::vector<mx::array>{mx::astype(out, p[0].dtype(), s)};
  };
  return vjp_cast(fun, {x, in.at(1), in.at(2)}, {dout}, s);
}

std::unique_ptr<ArrayList> gated_delta_backward_tail(const ArrayList& inputs, int32_t key_heads,
                                                     bool gpu) {
  auto s = stream_for(gpu);
  const auto& in = inputs.items;
  const auto &q = in.at(0), &v = in.at(1), &dq_h = in.at(2), &dk_h = in.at(3);
  int B = q.shape(0), T = q.shape(1), Dk = q.shape(3), Hv = v.shape(2), P = dq_h.shape(3);
  int Hk = key_heads, G = Hv / Hk;
  // [B, T, Hv, P, Dk] -> [B, T, Hk, Dk]: the value heads of each key head and the partitions.
  auto per_key_head = [&](const mx::array& x) {
    auto sum = G * P == 1 ? mx::reshape(x, {B, T, Hk, Dk}, s)
                          : mx::sum(mx::reshape(x, {B, T, Hk, G * P, Dk}, s), 3, false, s);
    return mx::astype(sum, q.dtype(), s);
  };
  auto per_value_head = [&](const mx::array& x) {
    return P == 1 ? mx::reshape(x, {B, T, Hv}, s) : mx::sum(x, 3, false, s);
  };
  auto out = std::make_unique<ArrayList>();
  out->items = {per_key_head(dq_h), per_key_head(dk_h), mx::astype(in.at(4), v.dtype(), s),
                per_value_head(in.at(5)), per_value_head(in.at(6))};
  return out;
}

std::unique_ptr<ArrayList> gates_vjp(const ArrayList& inputs, bool gpu) {
  auto s = stream_for(gpu);
  const auto& in = inputs.items;
  // g and beta of the f32 gate inputs: the forward's 16-bit rounding points are not
  // differentiated (as the CPU backward's gate chain).
  auto fun = [s](const std::vector<mx::array>& p) {
    auto f32 = [s](const mx::array& x) { return mx::astype(x, mx::float32, s); };
    return std::vector<mx::array>{gates_g(f32(p[2]), f32(p[0]), f32(p[3]), s),
                                  mx::sigmoid(f32(p[1]), s)};
  };
  return vjp_cast(fun, {in.at(0), in.at(1), in.at(2), in.at(3)},
                  {mx::astype(in.at(4), mx::float32, s), mx::astype(in.at(5), mx::float32, s)},
                  s);
}

}  // namespace mlxk
