// MLX autograd through mlxkern's GPU kernels (`make test-cuda`; docs/DESIGN.md §4
// "Gradients"): with the GPU as default device, mx::vjp of a host function that calls the
// recurrence (exact and chunked), the head split, the two in one call (from_conv) and the gated norm (handles
// shared with the host's arrays) must
//   - give the forward outputs bit for bit as the inference call does, and
//   - give gradients for every input within a stated bound of the explicit CPU backward
//     (mlxk_*_vjp with the CPU as default device) on the same inputs and cotangents.
// The recurrence's GPU gradient is the backward kernel (kernels/metal/gated_delta_backward.metal);
// the head split's and the gated norm's are MLX ops. Bound: max |gpu - cpu| <= bound · u ·
// max |cpu| per gradient, u the unit roundoff of the input dtype (2^-8 bf16, 2^-24 f32), as
// tests/gated_delta/vjp.rs justifies (16-bit: 8; f32: 64).
// Skips (exit 0, with a message) where the loaded MLX has no GPU backend.
#define MLXKERN_WITH_MLX
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "mlx/mlx.h"
#include "mlxkern.hpp"

namespace mx = mlx::core;

namespace {

int failures = 0;

std::vector<float> floats(const mx::array& a) {
  auto f = mx::astype(a, mx::float32);
  f = mx::contiguous(f);
  mx::eval(f);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + f.size());
}

double unit(mx::Dtype d) {
  if (d == mx::bfloat16) return std::ldexp(1.0, -8);
  if (d == mx::float16) return std::ldexp(1.0, -11);
  return std::ldexp(1.0, -24);
}

// `rel` (when >= 0) replaces the bound's bound · u with a relative bound of its own.
void near(const std::string& what, const mx::array& gpu, const mx::array& cpu, mx::Dtype dtype,
          double rel = -1.0) {
  if (gpu.shape() != cpu.shape()) {
    std::printf("FAIL: %s: shapes differ\n", what.c_str());
    ++failures;
    return;
  }
  auto g = floats(gpu), c = floats(cpu);
  double scale = 0, worst = 0;
  for (float x : c) scale = std::max(scale, double(std::fabs(x)));
  for (size_t i = 0; i < c.size(); ++i) {
    if (!std::isfinite(g[i])) worst = INFINITY;
    worst = std::max(worst, std::fabs(double(g[i]) - double(c[i])));
  }
  const double bound =
      (rel >= 0 ? rel : (dtype == mx::float32 ? 64.0 : 8.0) * unit(dtype)) * scale;
  const bool ok = worst <= bound && (c.empty() || scale > 0 || worst == 0);
  std::printf("%s: %s max |gpu - cpu| %.3g (%.2f u of max |cpu| %.3g)\n", ok ? "PASS" : "FAIL",
              what.c_str(), worst, scale > 0 ? worst / scale / unit(dtype) : 0.0, scale);
  if (!ok) ++failures;
}

void identical(const std::string& what, const mx::array& a, const mx::array& b,
               const char* compared = "forward inside mx::vjp vs the inference call") {
  auto x = floats(a), y = floats(b);
  size_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += std::memcmp(&x[i], &y[i], 4) != 0;
  std::printf("%s: %s %s: %zu/%zu differ\n", differ == 0 ? "PASS" : "FAIL", what.c_str(),
              compared, differ, x.size());
  if (differ != 0) ++failures;
}

mx::array normal(const mx::Shape& shape, mx::Dtype dtype, float scale) {
  return mx::astype(mx::multiply(mx::random::normal(shape), mx::array(scale)), dtype);
}

mlxk::Array h(const mx::array& a) { return mlxk::Array::from_mlx(a); }

void recurrence(int B, int T, int Hk, int Hv, int Dk, int Dv, mx::Dtype dtype, bool state,
                bool mask) {
  const std::string what = "recurrence B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " Hk=" + std::to_string(Hk) + " Hv=" + std::to_string(Hv) +
                           " Dk=" + std::to_string(Dk) + " Dv=" + std::to_string(Dv) +
                           (dtype == mx::float32 ? " f32" : " bf16") + (state ? " state" : "") +
                           (mask ? " masked" : "");
  const float qs = 1.0f / std::sqrt(float(Dk));
  std::vector<mx::array> p = {normal({B, T, Hk, Dk}, dtype, qs), normal({B, T, Hk, Dk}, dtype, qs),
                              normal({B, T, Hv, Dv}, dtype, 1.0f), normal({B, T, Hv}, dtype, 1.0f),
                              normal({B, T, Hv}, dtype, 1.0f), normal({Hv}, mx::float32, 0.5f),
                              normal({Hv}, dtype, 0.5f),
                              normal({B, Hv, Dv, Dk}, mx::float32, 0.3f)};
  auto m = mx::greater(mx::random::uniform({B, T}), mx::array(0.25f));
  if (B > 1) {
    // Row 1 fully masked.
    m = mx::concatenate({mx::slice(m, {0, 0}, {1, T}), mx::zeros({1, T}, mx::bool_),
                         mx::slice(m, {2, 0}, {B, T})},
                        0);
  }
  mx::eval(p);
  mx::eval(m);
  const int n = state ? 8 : 7;
  std::vector<mx::array> primals(p.begin(), p.begin() + n);
  auto fun = [&](const std::vector<mx::array>& x) {
    mlxk::Array st;
    if (state) st = h(x[7]);
    mlxk::Array mk;
    if (mask) mk = h(m);
    auto r = mlxk::gated_delta_update(h(x[0]), h(x[1]), h(x[2]), h(x[3]), h(x[4]), h(x[5]),
                                      h(x[6]), state ? &st : nullptr, mask ? &mk : nullptr);
    return std::vector<mx::array>{r.y.to_mlx(), r.state.to_mlx()};
  };
  auto dy = normal({B, T, Hv, Dv}, dtype, 1.0f);
  auto ds = normal({B, Hv, Dv, Dk}, mx::float32, 0.5f);
  mx::eval({dy, ds});

  mlxk::set_default_device(mlxk::Device::Gpu);
  auto inference = fun(primals);
  auto [outputs, grads] = mx::vjp(fun, primals, {dy, ds});
  mx::eval(outputs);
  mx::eval(grads);
  mx::eval(inference);
  identical(what + " y", outputs[0], inference[0]);
  identical(what + " state", outputs[1], inference[1]);

  mlxk::set_default_device(mlxk::Device::Cpu);
  mlxk::Array st = state ? h(p[7]) : mlxk::Array();
  mlxk::Array mk = mask ? h(m) : mlxk::Array();
  auto dyh = h(dy), dsh = h(ds);
  auto cpu = mlxk::gated_delta_update_vjp(h(p[0]), h(p[1]), h(p[2]), h(p[3]), h(p[4]), h(p[5]),
                                          h(p[6]), state ? &st : nullptr, mask ? &mk : nullptr,
                                          &dyh, &dsh);
  const char* names[] = {"dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"};
  mlxk::Array* ref[] = {&cpu.dq, &cpu.dk, &cpu.dv, &cpu.da, &cpu.db, &cpu.da_log, &cpu.dt_bias,
                        &cpu.state};
  for (int i = 0; i < n; ++i) {
    // da_log and ddt_bias sum over every token: their scale is the sum's, so they compare in
    // f32 units of their own magnitude with the 16-bit bound.
    near(what + " " + names[i], grads[i], ref[i]->to_mlx(), dtype);
  }
}

// The chunked update's GPU output node (after the prep and state-pass kernels) carries the
// chunked GPU backward (kernels/metal/gated_delta_chunked_backward.metal): mx::vjp through it gives the exact
// update's gradients (through its own GPU backward) up to float32 rounding, within 2^-14 of each
// gradient's largest magnitude plus two units of its dtype (the chunked backward's bound,
// docs/DESIGN.md §4; 16-bit gradients are rounded once more), and its forward inside mx::vjp is
// the inference call's.
void chunked(int B, int T, int Hk, int Hv, int Dk, int Dv, mx::Dtype dtype, bool mask, int chunk) {
  const std::string what = "chunked B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " Hv=" + std::to_string(Hv) + " Dk=" + std::to_string(Dk) +
                           " Dv=" + std::to_string(Dv) + (dtype == mx::float32 ? " f32" : " bf16") +
                           (mask ? " masked" : "") + " chunk " + std::to_string(chunk);
  const float qs = 1.0f / std::sqrt(float(Dk));
  std::vector<mx::array> p = {normal({B, T, Hk, Dk}, dtype, qs), normal({B, T, Hk, Dk}, dtype, qs),
                              normal({B, T, Hv, Dv}, dtype, 1.0f), normal({B, T, Hv}, dtype, 1.0f),
                              normal({B, T, Hv}, dtype, 1.0f), normal({Hv}, mx::float32, 0.5f),
                              normal({Hv}, dtype, 0.5f),
                              normal({B, Hv, Dv, Dk}, mx::float32, 0.3f)};
  auto m = mx::greater(mx::random::uniform({B, T}), mx::array(0.25f));
  mx::eval(p);
  mx::eval(m);
  auto fun = [&](bool chunked_form) {
    return [&, chunked_form](const std::vector<mx::array>& x) {
      mlxk::Array st = h(x[7]);
      mlxk::Array mk;
      if (mask) mk = h(m);
      auto r = chunked_form
                   ? mlxk::gated_delta_update_chunked(h(x[0]), h(x[1]), h(x[2]), h(x[3]), h(x[4]),
                                                      h(x[5]), h(x[6]), &st,
                                                      mask ? &mk : nullptr, chunk)
                   : mlxk::gated_delta_update(h(x[0]), h(x[1]), h(x[2]), h(x[3]), h(x[4]),
                                              h(x[5]), h(x[6]), &st, mask ? &mk : nullptr);
      return std::vector<mx::array>{r.y.to_mlx(), r.state.to_mlx()};
    };
  };
  auto dy = normal({B, T, Hv, Dv}, dtype, 1.0f);
  auto ds = normal({B, Hv, Dv, Dk}, mx::float32, 0.5f);
  mx::eval({dy, ds});
  mlxk::set_default_device(mlxk::Device::Gpu);
  auto inference = fun(true)(p);
  auto [outputs, grads] = mx::vjp(fun(true), p, {dy, ds});
  auto [exact_outputs, exact_grads] = mx::vjp(fun(false), p, {dy, ds});
  mx::eval(outputs);
  mx::eval(grads);
  mx::eval(exact_grads);
  mx::eval(inference);
  identical(what + " y", outputs[0], inference[0]);
  identical(what + " state", outputs[1], inference[1]);
  const char* names[] = {"dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"};
  for (int i = 0; i < 8; ++i) {
    near(what + " " + names[i] + " (chunked node vs exact update)", grads[i], exact_grads[i],
         grads[i].dtype(), std::ldexp(1.0, -14) + 2 * unit(grads[i].dtype()));
  }
  mlxk::set_default_device(mlxk::Device::Cpu);
}

void head_split(mx::Dtype dtype) {
  const int B = 2, S = 9, Hk = 2, Hv = 4, Dk = 64, Dv = 32;
  const int C = 2 * Hk * Dk + Hv * Dv;
  std::vector<mx::array> p = {normal({B, S, C}, dtype, 1.0f), normal({Dk}, dtype, 1.0f),
                              normal({Dk}, dtype, 1.0f)};
  mx::eval(p);
  auto fun = [&](const std::vector<mx::array>& x) {
    auto r = mlxk::silu_rms_heads(h(x[0]), h(x[1]), h(x[2]), Hk, Hv, Dv, 1e-6f);
    return std::vector<mx::array>{r.q.to_mlx(), r.k.to_mlx(), r.v.to_mlx()};
  };
  std::vector<mx::array> cot = {normal({B, S, Hk, Dk}, dtype, 1.0f),
                                normal({B, S, Hk, Dk}, dtype, 1.0f),
                                normal({B, S, Hv, Dv}, dtype, 1.0f)};
  mx::eval(cot);
  mlxk::set_default_device(mlxk::Device::Gpu);
  auto inference = fun(p);
  auto [outputs, grads] = mx::vjp(fun, p, cot);
  mx::eval(grads);
  const std::string what = std::string("head split ") + (dtype == mx::float32 ? "f32" : "bf16");
  for (int i = 0; i < 3; ++i) identical(what + " output " + std::to_string(i), outputs[i], inference[i]);
  mlxk::set_default_device(mlxk::Device::Cpu);
  auto c0 = h(cot[0]), c1 = h(cot[1]), c2 = h(cot[2]);
  auto cpu = mlxk::silu_rms_heads_vjp(h(p[0]), h(p[1]), h(p[2]), Hk, Hv, Dv, 1e-6f, &c0, &c1, &c2);
  near(what + " dx", grads[0], cpu.x.to_mlx(), dtype);
  near(what + " dq_scale", grads[1], cpu.q_scale.to_mlx(), dtype);
  near(what + " dk_scale", grads[2], cpu.k_scale.to_mlx(), dtype);
}

// The head split and the update in one call (one GPU node, whose gradient chains the two
// parts' backward passes): the forward bit for bit as the inference call and as the two calls
// it stands for; the gradients against mx::vjp of those two calls on the GPU.
void from_conv(int B, int T, int Hk, int Hv, int Dk, int Dv, mx::Dtype dtype, bool mask) {
  const std::string what = "from conv B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " Hk=" + std::to_string(Hk) + " Hv=" + std::to_string(Hv) +
                           " Dk=" + std::to_string(Dk) + " Dv=" + std::to_string(Dv) +
                           (dtype == mx::float32 ? " f32" : " bf16") + (mask ? " masked" : "");
  const int C = 2 * Hk * Dk + Hv * Dv;
  const float eps = 1e-6f / float(Dk);
  std::vector<mx::array> p = {
      normal({B, T, C}, dtype, 2.0f),
      mx::astype(mx::add(mx::full({Dk}, 1.0f / float(Dk)), normal({Dk}, mx::float32, 0.1f / float(Dk))), dtype),
      mx::astype(mx::add(mx::full({Dk}, 1.0f / std::sqrt(float(Dk))), normal({Dk}, mx::float32, 0.01f)), dtype),
      normal({B, T, Hv}, dtype, 1.0f),
      normal({B, T, Hv}, dtype, 1.0f),
      normal({Hv}, mx::float32, 0.5f),
      normal({Hv}, dtype, 0.5f),
      normal({B, Hv, Dv, Dk}, mx::float32, 0.3f)};
  auto m = mx::greater(mx::random::uniform({B, T}), mx::array(0.25f));
  mx::eval(p);
  mx::eval(m);
  auto fused = [&](const std::vector<mx::array>& x) {
    mlxk::Array st = h(x[7]);
    mlxk::Array mk;
    if (mask) mk = h(m);
    auto r = mlxk::gated_delta_update_from_conv(h(x[0]), h(x[1]), h(x[2]), Hk, Hv, Dv, eps, h(x[3]),
                                                h(x[4]), h(x[5]), h(x[6]), &st,
                                                mask ? &mk : nullptr);
    return std::vector<mx::array>{r.y.to_mlx(), r.state.to_mlx()};
  };
  auto composed = [&](const std::vector<mx::array>& x) {
    mlxk::Array st = h(x[7]);
    mlxk::Array mk;
    if (mask) mk = h(m);
    auto s = mlxk::silu_rms_heads(h(x[0]), h(x[1]), h(x[2]), Hk, Hv, Dv, eps);
    auto r = mlxk::gated_delta_update(s.q, s.k, s.v, h(x[3]), h(x[4]), h(x[5]), h(x[6]), &st,
                                      mask ? &mk : nullptr);
    return std::vector<mx::array>{r.y.to_mlx(), r.state.to_mlx()};
  };
  auto dy = normal({B, T, Hv, Dv}, dtype, 1.0f);
  auto ds = normal({B, Hv, Dv, Dk}, mx::float32, 0.5f);
  mx::eval({dy, ds});
  mlxk::set_default_device(mlxk::Device::Gpu);
  auto inference = fused(p);
  auto reference = composed(p);
  auto [outputs, grads] = mx::vjp(fused, p, {dy, ds});
  auto [ref_outputs, ref_grads] = mx::vjp(composed, p, {dy, ds});
  mx::eval(outputs);
  mx::eval(grads);
  mx::eval(ref_grads);
  mx::eval(inference);
  mx::eval(reference);
  identical(what + " y", outputs[0], inference[0]);
  identical(what + " state", outputs[1], inference[1]);
  identical(what + " y", inference[0], reference[0], "one call vs the two calls");
  identical(what + " state", inference[1], reference[1], "one call vs the two calls");
  const char* names[] = {"dx", "dq_scale", "dk_scale", "da", "db", "da_log", "ddt_bias", "dstate"};
  // Here "cpu" in near's line is mx::vjp through the two calls, on the GPU.
  for (int i = 0; i < 8; ++i) {
    near(what + " " + names[i] + " (vs mx::vjp of the two calls)", grads[i], ref_grads[i], dtype);
  }
  mlxk::set_default_device(mlxk::Device::Cpu);
}

void gated_norm(mx::Dtype dtype) {
  const int rows = 37, D = 128;
  std::vector<mx::array> p = {normal({rows, D}, dtype, 1.0f), normal({rows, D}, dtype, 1.0f),
                              normal({D}, dtype, 1.0f)};
  mx::eval(p);
  auto fun = [&](const std::vector<mx::array>& x) {
    return std::vector<mx::array>{mlxk::gated_rms_norm(h(x[0]), h(x[1]), h(x[2]), 1e-6f).to_mlx()};
  };
  auto dout = normal({rows, D}, dtype, 1.0f);
  mx::eval(dout);
  mlxk::set_default_device(mlxk::Device::Gpu);
  auto inference = fun(p);
  auto [outputs, grads] = mx::vjp(fun, p, {dout});
  mx::eval(grads);
  const std::string what = std::string("gated norm ") + (dtype == mx::float32 ? "f32" : "bf16");
  identical(what + " out", outputs[0], inference[0]);
  mlxk::set_default_device(mlxk::Device::Cpu);
  auto d = h(dout);
  auto cpu = mlxk::gated_rms_norm_vjp(h(p[0]), h(p[1]), h(p[2]), 1e-6f, &d);
  near(what + " dx", grads[0], cpu.x.to_mlx(), dtype);
  near(what + " dgate", grads[1], cpu.gate.to_mlx(), dtype);
  near(what + " dweight", grads[2], cpu.weight.to_mlx(), dtype);
}

}  // namespace

int main() {
  if (mlxk::gpu_backend() == mlxk::GpuBackend::None) {
    std::printf("gpu_autograd: skipped, the loaded MLX has no GPU backend\n");
    return 0;
  }
  mx::random::seed(static_cast<uint64_t>(std::time(nullptr)));
  try {
    recurrence(1, 1, 16, 32, 128, 128, mx::bfloat16, true, false);
    recurrence(2, 37, 2, 4, 64, 48, mx::bfloat16, true, true);
    recurrence(3, 70, 1, 3, 32, 7, mx::float32, false, true);
    recurrence(1, 130, 2, 8, 128, 128, mx::bfloat16, true, false);
    recurrence(2, 20, 4, 4, 256, 130, mx::float32, true, false);
    chunked(2, 100, 2, 4, 128, 128, mx::bfloat16, true, 32);
    chunked(1, 70, 1, 2, 64, 7, mx::float32, false, 64);
    from_conv(1, 1, 16, 32, 128, 128, mx::bfloat16, false);
    from_conv(2, 9, 2, 4, 64, 24, mx::bfloat16, true);
    from_conv(2, 5, 1, 2, 32, 7, mx::float32, true);
    head_split(mx::bfloat16);
    head_split(mx::float32);
    gated_norm(mx::bfloat16);
    gated_norm(mx::float32);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("gpu_autograd: %s (%d failures)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
