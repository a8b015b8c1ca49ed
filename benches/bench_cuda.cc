// `make bench-cuda`: mlxkern's kernels on an MLX CUDA GPU beside MLX's own paths in the same
// process, at Qwen3.5-35B-A3B dims (Hk 16, Hv 32, Dk = Dv = 128, bf16 activations, f32 state).
//
// Rows (each a graph built and evaluated as an engine would, one mx::eval per iteration):
//   decode   B = 1, 8, 32, 256; 30 layers, each with its own state (working set above the
//            H200's 60 MB L2), one graph of 30 layer steps per eval:
//              mlxkern      mlxk_gated_delta_update on the GPU (gates as MLX ops)
//              mlx fast     mx::fast::gated_delta_update (MLX CUDA: its ops fallback), same gates
//              mlx floor    MLX's own elementwise op over the same states (mx::negative: reads
//                           and writes every state byte once, what a state update must move) —
//                           the floor inside MLX for one op per layer
//   replay   mlxk_gated_delta_state, T = 8, B = 1 and 32, 30 layers
//   split    mlxk_silu_rms_heads at S = 1 and 512 (the conv output: 8192 channels), 30 layers
//   norm     mlxk_gated_rms_norm at S = 1 and 512 (rows = S · 32 heads, D = 128), 30 layers
//   layer    a decode step's head split and update: mlxk_silu_rms_heads then
//            mlxk_gated_delta_update (two nodes) against mlxk_gated_delta_update_from_conv (one),
//            B = 1, 8, 32, 256, 30 layers, the decode floor beside them
//   fromconvrows  the from_conv kernel at 4, 8, 16 value rows a warp (B = 8, 32), pipelined
//   fromconvtokens  the from_conv kernel (one node) against the head split's and the
//            recurrence's kernels (two nodes) at B = 1, 8, 32 and T = 1, 2, 4, 8
//   prefill  mlxk_gated_delta_update over T = 4096, B = 1, one layer; mx::fast beside it
//   pipelined decode, replay, split and norm again (floor and mlxkern) with one graph in
//            flight while the next is built, as generate loops run (rows ", pipelined"), and
//            the dispatch group's custom copies at B = 1 and 32
//   dispatch where decode B = 1's time goes: MLX custom kernels (a copy with 1 and with 9
//            inputs, the recurrence text straight through mx::fast::cuda_kernel), eval and build
//   grad     forward + mlxk_gated_delta_update_vjp over T = 512, 2048, 4096, B = 1, one layer;
//            mx::vjp of mx::fast::gated_delta_update beside it, with MLX's peak memory
// For each: median time per layer-step over timed iterations after warm-up, the bytes the kernel
// must move (inputs read + outputs written) and the GB/s that gives, and the ratio to the floor.
// Output: a table on stdout and JSON lines in $MLXK_BENCH_JSON (if set).
#define MLXKERN_WITH_MLX
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/mlx.h"
#include "mlxkern.hpp"

namespace mx = mlx::core;

namespace {

constexpr int kLayers = 30, kHk = 16, kHv = 32, kD = 128;

FILE* json = nullptr;

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// Median microseconds of one call of `step` (which builds and evaluates one graph).
double time_us(const std::function<void()>& step, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    double t0 = now_us();
    step();
    t.push_back(now_us() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// MLXK_BENCH_ONLY=pipelined re-runs decode, replay, head split and gated norm with one graph in
// flight while the next is built, as mlx-lm's and MLXLMCommon's generate loops run a decode
// step (async_eval of step n + 1, then wait for step n): the host's graph building then
// overlaps the GPU's work instead of adding to it. Rows of that mode carry ", pipelined".
bool pipelined = false;

using Build = std::function<std::vector<mx::array>()>;

// Where a pipelined graph's host time goes, µs a graph (medians' run): building it, handing it
// to MLX (async_eval: eval_gpu of every node and the CUDA graph's launch), waiting for the graph
// before it, and releasing that graph's arrays. Printed with each pipelined row.
struct Phases {
  double build = 0, submit = 0, wait = 0, release = 0;
  bool valid = false;
} phases;

// Microseconds of one graph: serial, the median of `iters` build-and-eval calls; pipelined, the
// median over three runs of `iters` graphs of the time per graph, one graph always in flight.
double graph_us(const Build& build, int warmup, int iters) {
  if (!pipelined) return time_us([&] { mx::eval(build()); }, warmup, iters);
  std::vector<mx::array> in_flight;
  auto run = [&](int n, Phases& p) {
    for (int i = 0; i < n; ++i) {
      double t0 = now_us();
      auto next = build();
      double t1 = now_us();
      mx::async_eval(next);
      double t2 = now_us();
      if (!in_flight.empty()) mx::eval(in_flight);
      double t3 = now_us();
      in_flight = std::move(next);
      double t4 = now_us();
      p.build += t1 - t0;
      p.submit += t2 - t1;
      p.wait += t3 - t2;
      p.release += t4 - t3;
    }
    mx::eval(in_flight);
    in_flight.clear();
  };
  Phases unused;
  run(warmup, unused);
  std::vector<std::pair<double, Phases>> t;
  for (int r = 0; r < 3; ++r) {
    Phases p;
    const double t0 = now_us();
    run(iters, p);
    t.emplace_back((now_us() - t0) / iters, p);
  }
  std::sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  phases = t[1].second;
  for (double* x : {&phases.build, &phases.submit, &phases.wait, &phases.release}) *x /= iters;
  phases.valid = true;
  return t[1].first;
}

std::string impl(const std::string& name) { return pipelined ? name + ", pipelined" : name; }

void row(const std::string& group, const std::string& name, const std::string& peer, double us,
         double per, double bytes, double floor_us) {
  const double gbs = bytes / (us / per) / 1e3;
  std::printf("%-8s %-34s %-12s %10.2f us/layer  %8.1f GB/s", group.c_str(), name.c_str(),
              peer.c_str(), us / per, gbs);
  if (floor_us > 0) std::printf("  %5.2fx floor", us / floor_us);
  char host[160] = "";
  if (phases.valid) {
    std::printf("  [build %.2f, submit %.2f, wait %.2f, release %.2f us/layer]", phases.build / per,
                phases.submit / per, phases.wait / per, phases.release / per);
    std::snprintf(host, sizeof host,
                  ",\"build_us\":%.3f,\"submit_us\":%.3f,\"wait_us\":%.3f,\"release_us\":%.3f",
                  phases.build / per, phases.submit / per, phases.wait / per,
                  phases.release / per);
    phases.valid = false;
  }
  std::printf("\n");
  if (json) {
    std::fprintf(json,
                 "{\"group\":\"%s\",\"case\":\"%s\",\"impl\":\"%s\",\"us_per_layer\":%.3f,"
                 "\"bytes_per_layer\":%.0f,\"gbs\":%.2f,\"vs_floor\":%.4f%s}\n",
                 group.c_str(), name.c_str(), peer.c_str(), us / per, bytes, gbs,
                 floor_us > 0 ? us / floor_us : 0.0, host);
    std::fflush(json);
  }
}

mx::array normal(const mx::Shape& shape, mx::Dtype dtype, float scale) {
  return mx::astype(mx::multiply(mx::random::normal(shape), mx::array(scale)), dtype);
}

struct Layer {
  mx::array q, k, v, a, b, a_log, dt_bias, state;
};

std::vector<Layer> layers(int batch, int t) {
  std::vector<Layer> out;
  for (int l = 0; l < kLayers; ++l) {
    Layer x{normal({batch, t, kHk, kD}, mx::bfloat16, 0.088f),
            normal({batch, t, kHk, kD}, mx::bfloat16, 0.088f),
            normal({batch, t, kHv, kD}, mx::bfloat16, 1.0f),
            normal({batch, t, kHv}, mx::bfloat16, 1.0f),
            normal({batch, t, kHv}, mx::bfloat16, 1.0f),
            normal({kHv}, mx::float32, 0.5f),
            normal({kHv}, mx::bfloat16, 0.5f),
            normal({batch, kHv, kD, kD}, mx::float32, 0.1f)};
    mx::eval({x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.state});
    out.push_back(std::move(x));
  }
  return out;
}

// mlx-lm's compute_g and sigmoid as MLX ops (what mlxkern's GPU path builds too).
std::pair<mx::array, mx::array> gates(const Layer& x) {
  auto decay = mx::negative(mx::exp(mx::astype(x.a_log, mx::float32)));
  auto z = mx::add(x.a, x.dt_bias);
  auto g = mx::exp(mx::multiply(decay, mx::logaddexp(z, mx::array(0.0f, z.dtype()))));
  return {g, mx::sigmoid(x.b)};
}

// MLX's floor op over every layer's state (reads and writes each state byte once), one graph.
Build state_floor(const std::vector<Layer>& ls) {
  return [&ls] {
    std::vector<mx::array> outs;
    for (auto& x : ls) outs.push_back(mx::negative(x.state));
    return outs;
  };
}

double update_bytes(int batch, int t) {
  const double state = double(batch) * kHv * kD * kD * 4 * 2;
  const double act = double(batch) * t * (2 * kHk * kD + 2 * kHv * kD + 2 * kHv) * 2;
  return state + act;
}

void decode(int batch, int warmup, int iters) {
  auto ls = layers(batch, 1);
  const std::string name = "decode B=" + std::to_string(batch) + " (30 layers)";
  Build build_floor = state_floor(ls);
  Build build = [&] {
    std::vector<mx::array> outs;
    for (auto& x : ls) {
      auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
      auto st = h(x.state);
      auto r = mlxk::gated_delta_update(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                        h(x.dt_bias), &st);
      outs.push_back(r.y.to_mlx());
      outs.push_back(r.state.to_mlx());
    }
    return outs;
  };
  Build fast = [&] {
    std::vector<mx::array> outs;
    for (auto& x : ls) {
      auto [g, beta] = gates(x);
      auto r = mx::fast::gated_delta_update(x.q, x.k, x.v, g, beta, x.state);
      outs.insert(outs.end(), r.begin(), r.end());
    }
    return outs;
  };
  const double bytes = update_bytes(batch, 1);
  const double f = graph_us(build_floor, warmup, iters);
  row("decode", name, impl("mlx floor"), f, kLayers, double(batch) * kHv * kD * kD * 8, 0);
  if (batch == 1 && !pipelined) {
    // Where a step's time goes: building the 30 nodes on the host (no eval).
    row("decode", name, "mlxkern build", time_us([&] { (void)build(); }, warmup, iters),
        kLayers, 0, 0);
    row("decode", name, "floor build", time_us([&] { (void)build_floor(); }, warmup, iters),
        kLayers, 0, 0);
  }
  row("decode", name, impl("mlxkern"), graph_us(build, warmup, iters), kLayers, bytes, f);
  if (!pipelined) row("decode", name, "mlx fast", graph_us(fast, warmup, iters), kLayers, bytes, f);
}

void replay(int batch, int warmup, int iters) {
  auto ls = layers(batch, 8);
  const std::string name = "replay T=8 B=" + std::to_string(batch) + " (30 layers)";
  std::vector<std::int32_t> lengths(batch, 8);
  Build floor = state_floor(ls);
  Build ours = [&] {
    std::vector<mx::array> outs;
    for (auto& x : ls) {
      auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
      auto st = h(x.state);
      auto r = mlxk::gated_delta_state(h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log), h(x.dt_bias),
                                       &st, mlxk::Span<std::int32_t>(lengths));
      outs.push_back(r.to_mlx());
    }
    return outs;
  };
  const double f = graph_us(floor, warmup, iters);
  row("replay", name, impl("mlx floor"), f, kLayers, double(batch) * kHv * kD * kD * 8, 0);
  row("replay", name, impl("mlxkern"), graph_us(ours, warmup, iters), kLayers,
      update_bytes(batch, 8) - double(batch) * 8 * (kHk + kHv) * kD * 2, f);
}

void head_split(int s, int warmup, int iters) {
  const int c = 2 * kHk * kD + kHv * kD;
  std::vector<mx::array> xs;
  for (int l = 0; l < kLayers; ++l) xs.push_back(normal({1, s, c}, mx::bfloat16, 2.0f));
  auto qs = normal({kD}, mx::bfloat16, 1.0f), ks = normal({kD}, mx::bfloat16, 1.0f);
  mx::eval(xs);
  mx::eval({qs, ks});
  const std::string name = "head split S=" + std::to_string(s) + " (30 layers)";
  Build floor = [&] {
    std::vector<mx::array> outs;
    for (auto& x : xs) outs.push_back(mx::negative(x));
    return outs;
  };
  Build ours = [&] {
    std::vector<mx::array> outs;
    auto hq = mlxk::Array::from_mlx(qs), hk = mlxk::Array::from_mlx(ks);
    for (auto& x : xs) {
      auto r = mlxk::silu_rms_heads(mlxk::Array::from_mlx(x), hq, hk, kHk, kHv, kD, 1e-6f);
      outs.push_back(r.q.to_mlx());
      outs.push_back(r.k.to_mlx());
      outs.push_back(r.v.to_mlx());
    }
    return outs;
  };
  const double bytes = double(s) * c * 2 * 2;
  const double f = graph_us(floor, warmup, iters);
  row("split", name, impl("mlx floor"), f, kLayers, bytes, 0);
  row("split", name, impl("mlxkern"), graph_us(ours, warmup, iters), kLayers, bytes, f);
}

// The head split's scales and eps of a decode layer (Qwen3.5's q and k scales), eps also as
// the bit pattern the kernels take as template EPS.
struct SplitConstants {
  mx::array qs = mx::astype(mx::full({kD}, 1.0f / kD), mx::bfloat16);
  mx::array ks = mx::astype(mx::full({kD}, 1.0f / std::sqrt(float(kD))), mx::bfloat16);
  float eps = 1e-6f / kD;
  int eps_bits = 0;
  SplitConstants() {
    std::memcpy(&eps_bits, &eps, sizeof eps);
    mx::eval({qs, ks});
  }
};

// A decode step's head split and update per layer: the two calls (mlxk_silu_rms_heads, then
// mlxk_gated_delta_update on its q, k, v) against mlxk_gated_delta_update_from_conv (one node,
// the same bits), beside the floor op over the same states.
void split_update(int batch, int warmup, int iters) {
  auto ls = layers(batch, 1);
  const int c = 2 * kHk * kD + kHv * kD;
  std::vector<mx::array> xs;
  for (int l = 0; l < kLayers; ++l) xs.push_back(normal({batch, 1, c}, mx::bfloat16, 2.0f));
  mx::eval(xs);
  const SplitConstants split_constants;
  const auto &qs = split_constants.qs, &ks = split_constants.ks;
  const float eps = split_constants.eps;
  const std::string name = "split + update B=" + std::to_string(batch) + " (30 layers)";
  auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
  Build floor = state_floor(ls);
  Build two = [&] {
    std::vector<mx::array> outs;
    auto hq = h(qs), hk = h(ks);
    for (int l = 0; l < kLayers; ++l) {
      const Layer& x = ls[l];
      auto st = h(x.state);
      auto s = mlxk::silu_rms_heads(h(xs[l]), hq, hk, kHk, kHv, kD, eps);
      auto r = mlxk::gated_delta_update(s.q, s.k, s.v, h(x.a), h(x.b), h(x.a_log),
                                        h(x.dt_bias), &st);
      outs.push_back(r.y.to_mlx());
      outs.push_back(r.state.to_mlx());
    }
    return outs;
  };
  Build one = [&] {
    std::vector<mx::array> outs;
    auto hq = h(qs), hk = h(ks);
    for (int l = 0; l < kLayers; ++l) {
      const Layer& x = ls[l];
      auto st = h(x.state);
      auto r = mlxk::gated_delta_update_from_conv(h(xs[l]), hq, hk, kHk, kHv, kD, eps, h(x.a),
                                                  h(x.b), h(x.a_log), h(x.dt_bias), &st);
      outs.push_back(r.y.to_mlx());
      outs.push_back(r.state.to_mlx());
    }
    return outs;
  };
  const double bytes = update_bytes(batch, 1);
  const double f = graph_us(floor, warmup, iters);
  row("layer", name, impl("mlx floor"), f, kLayers, double(batch) * kHv * kD * kD * 8, 0);
  row("layer", name, impl("split + update"), graph_us(two, warmup, iters), kLayers, bytes, f);
  row("layer", name, impl("from conv"), graph_us(one, warmup, iters), kLayers, bytes, f);
}

void gated_norm(int s, int warmup, int iters) {
  std::vector<mx::array> xs, zs;
  for (int l = 0; l < kLayers; ++l) {
    xs.push_back(normal({s * kHv, kD}, mx::bfloat16, 1.0f));
    zs.push_back(normal({s * kHv, kD}, mx::bfloat16, 2.0f));
  }
  auto w = normal({kD}, mx::bfloat16, 1.0f);
  mx::eval(xs);
  mx::eval(zs);
  mx::eval(w);
  const std::string name = "gated norm S=" + std::to_string(s) + " (30 layers)";
  Build floor = [&] {
    std::vector<mx::array> outs;
    for (int l = 0; l < kLayers; ++l) outs.push_back(mx::add(xs[l], zs[l]));
    return outs;
  };
  Build ours = [&] {
    std::vector<mx::array> outs;
    auto hw = mlxk::Array::from_mlx(w);
    for (int l = 0; l < kLayers; ++l) {
      outs.push_back(mlxk::gated_rms_norm(mlxk::Array::from_mlx(xs[l]),
                                          mlxk::Array::from_mlx(zs[l]), hw, 1e-6f)
                         .to_mlx());
    }
    return outs;
  };
  const double bytes = double(s) * kHv * kD * 2 * 3;
  const double f = graph_us(floor, warmup, iters);
  row("norm", name, impl("mlx floor"), f, kLayers, bytes, 0);
  row("norm", name, impl("mlxkern"), graph_us(ours, warmup, iters), kLayers, bytes, f);
}

void prefill(int t, int warmup, int iters) {
  Layer x = layers(1, t).front();
  const std::string name = "prefill T=" + std::to_string(t) + " B=1 (1 layer)";
  auto ours = [&] {
    auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
    auto st = h(x.state);
    auto r = mlxk::gated_delta_update(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                      h(x.dt_bias), &st);
    mx::eval({r.y.to_mlx(), r.state.to_mlx()});
  };
  auto fast = [&] {
    auto [g, beta] = gates(x);
    auto r = mx::fast::gated_delta_update(x.q, x.k, x.v, g, beta, x.state);
    mx::eval(r);
  };
  const double bytes = update_bytes(1, t);
  const double o = time_us(ours, warmup, iters);
  row("prefill", name, "mlxkern", o, 1, bytes, 0);
  const double m = time_us(fast, 1, 3);
  row("prefill", name, "mlx fast", m, 1, bytes, 0);
  std::printf("prefill  mlx fast / mlxkern = %.1fx\n", m / o);
}

// Where a decode step's time goes at B = 1 (diagnostic rows, same 30 layers and states; the two
// copies also at B = 32), each one op per layer built straight on MLX's API unless it says
// mlxkern:
//   custom copy 1:1      mx::fast::cuda_kernel copying the state (1 input, 1 output): MLX's
//                        dispatch of a custom kernel against the floor's built-in op
//   custom copy 8:2      the same copy with the recurrence's 8 inputs and 2 outputs
//   recurrence direct    the library's CUDA recurrence text (fused gates) through
//                        mx::fast::cuda_kernel, without mlxkern's C ABI, handles and checks
//   ... build            the host's graph building alone for 30 layers (no eval)
std::string read_text(const char* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) throw std::runtime_error(std::string("cannot read ") + path);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return text;
}

// Copies of the layers' states through mx::fast::cuda_kernel, each one op per layer: MLX's
// dispatch of a custom kernel that does no more than the floor op's work.
//   0 custom copy 1:1              1 input, 1 output
//   1 custom copy 1:1, 10 KB text  the same with 10 KB of comment as its header: MLX hashes a
//                                  custom kernel's whole text on every eval, and mlxkern's texts
//                                  are 5-11 KB (comments stripped)
//   2 custom copy 8:2              the recurrence's 8 inputs and 2 outputs
struct CustomCopies {
  static constexpr const char* names[] = {"custom copy 1:1", "custom copy 1:1, 10 KB text",
                                          "custom copy 8:2"};
  std::vector<mx::fast::CustomKernelFunction> kernels;

  CustomCopies() {
    const std::string copy = "auto i = blockIdx.x * blockDim.x + threadIdx.x; out[i] = s[i];";
    std::string padding;
    while (padding.size() < 10240) padding += "// padding of the text MLX hashes per eval\n";
    kernels.push_back(mx::fast::cuda_kernel("mlxk_probe_copy11", {"s"}, {"out"}, copy, "", true, 0));
    kernels.push_back(
        mx::fast::cuda_kernel("mlxk_probe_copy11_long", {"s"}, {"out"}, copy, padding, true, 0));
    kernels.push_back(mx::fast::cuda_kernel(
        "mlxk_probe_copy82",
        {"q", "k", "v", "g", "beta", "state_in", "a_log", "dt_bias"}, {"y", "state_out"},
        "auto i = blockIdx.x * blockDim.x + threadIdx.x; state_out[i] = state_in[i];"
        " if (i < 4096) y[i] = v[i];",
        "", true, 0));
  }

  // One graph: copy `which` of every layer's state (batch `batch`).
  Build build(int which, const std::vector<Layer>& ls, int batch) const {
    return [this, which, &ls, batch] {
      const std::vector<std::pair<std::string, mx::fast::TemplateArg>> none;
      const int n = batch * kHv * kD * kD;
      std::vector<mx::array> outs;
      for (auto& x : ls) {
        if (which < 2) {
          outs.push_back(kernels[which]({x.state}, {x.state.shape()}, {mx::float32}, {n, 1, 1},
                                        {256, 1, 1}, none, std::nullopt, false, {})[0]);
          continue;
        }
        std::vector<mx::array> in = {x.q, x.k, x.v, x.a, x.b, x.state, x.a_log, x.dt_bias};
        auto r = kernels[2](in, {{batch, 1, kHv, kD}, x.state.shape()},
                            {mx::bfloat16, mx::float32}, {n, 1, 1}, {256, 1, 1}, none,
                            std::nullopt, false, {});
        outs.insert(outs.end(), r.begin(), r.end());
      }
      return outs;
    };
  }
};

// The copies at B = 1 and 32 (serial or pipelined as the mode says), MLX's floor op beside.
void copies(const CustomCopies& c, int warmup, int iters) {
  for (int batch : {1, 32}) {
    auto ls = layers(batch, 1);
    const std::string name = "decode B=" + std::to_string(batch) + " (30 layers)";
    const double bytes = double(batch) * kHv * kD * kD * 8;
    Build floor = state_floor(ls);
    const double f = graph_us(floor, warmup, iters);
    row("dispatch", name, impl("mlx floor"), f, kLayers, bytes, 0);
    for (int which = 0; which < 3; ++which) {
      row("dispatch", name, impl(CustomCopies::names[which]),
          graph_us(c.build(which, ls, batch), warmup, iters), kLayers, bytes, f);
    }
  }
}

// The kernel of mlxk_gated_delta_update_from_conv (gated_delta.metal with MLXK_FROM_CONV, gates
// in the kernel) straight through mx::fast::cuda_kernel at B = 8 and 32 with 4, 8 and 16 value
// rows a warp, pipelined: which layout suits the head split inside the recurrence (its q and k
// come from one SIMD group of each threadgroup). Rows "from conv ROWS=n, pipelined".
void from_conv_rows(int warmup, int iters) {
  auto text = [](const char* path) {
    std::string source = read_text(path);
    const std::string marker = "MLXK_TOKEN_ACTIVE";
    for (size_t at; (at = source.find(marker)) != std::string::npos;) {
      source.replace(at, marker.size(), "true");
    }
    return source;
  };
  const std::string header = read_text("kernels/cuda/metal_compat.cuh") +
                             read_text("kernels/cuda/gates.cuh") + "#define MLXK_FROM_CONV 1\n" +
                             read_text("kernels/metal/silu.h");
  const std::vector<std::string> inputs = {"x",        "qscale", "kscale", "g", "beta",
                                           "state_in", "a_log",  "dt_bias"};
  // MLXK_BENCH_ALT=<file>: a variant of gated_delta.metal, swept beside it (rows "alt from
  // conv ROWS=n").
  std::vector<std::pair<std::string, mx::fast::CustomKernelFunction>> kernels = {
      {"", mx::fast::cuda_kernel("mlxk_probe_from_conv", inputs, {"y", "state_out"},
                                 text("kernels/metal/gated_delta.metal"), header, true, 0)}};
  if (const char* alt = std::getenv("MLXK_BENCH_ALT")) {
    kernels.emplace_back("alt ", mx::fast::cuda_kernel("mlxk_probe_from_conv_alt", inputs,
                                                       {"y", "state_out"}, text(alt), header,
                                                       true, 0));
  }
  const int c = 2 * kHk * kD + kHv * kD;
  const SplitConstants split_constants;
  const auto &qs = split_constants.qs, &ks = split_constants.ks;
  const int eps_bits = split_constants.eps_bits;
  const bool was = pipelined;
  pipelined = true;
  for (int batch : {8, 32}) {
    auto ls = layers(batch, 1);
    std::vector<mx::array> xs;
    for (int l = 0; l < kLayers; ++l) xs.push_back(normal({batch, 1, c}, mx::bfloat16, 2.0f));
    mx::eval(xs);
    for (const auto& [label, kernel] : kernels) {
      for (int rows : {4, 8, 16}) {
        Build b = [&] {
          std::vector<mx::array> outs;
          for (int l = 0; l < kLayers; ++l) {
            const Layer& x = ls[l];
            auto r = kernel({xs[l], qs, ks, x.a, x.b, x.state, x.a_log, x.dt_bias},
                            {{batch, 1, kHv, kD}, x.state.shape()}, {mx::bfloat16, mx::float32},
                            {32, kD / rows, batch * kHv}, {32, 4, 1},
                            {{"Dk", kD}, {"Dv", kD}, {"Hk", kHk}, {"Hv", kHv}, {"ROWS", rows},
                             {"EPS", eps_bits}, {"InT", mx::bfloat16}, {"StT", mx::float32}},
                            std::nullopt, false, {});
            outs.insert(outs.end(), r.begin(), r.end());
          }
          return outs;
        };
        row("layer", "from conv B=" + std::to_string(batch) + " (30 layers)",
            impl(label + "from conv ROWS=" + std::to_string(rows)), graph_us(b, warmup, iters),
            kLayers, update_bytes(batch, 1), 0);
      }
    }
  }
  pipelined = was;
}

// One kernel against two for several tokens a call (speculative decoding's verify windows): the
// kernel of mlxk_gated_delta_update_from_conv against the head split's kernel followed by the
// recurrence's, each straight through mx::fast::cuda_kernel with the library's texts (comments
// stripped, as the library hands them to MLX), launch geometry and value rows a warp
// (src/cuda.rs), at B = 1, 8, 32 and T = 1, 2, 4, 8, serial and pipelined: where the one
// kernel's longer token loop (each token's x, SiLU and norm before its state math) costs less
// than a second node. MLXK_BENCH_ALT=<file> adds a variant of gated_delta.metal as one kernel.
// Rows "one kernel", "two kernels", "alt one kernel" of case "from conv B=b T=t".
void from_conv_tokens(int warmup, int iters) {
  auto stripped = [](const std::string& text) {
    std::string out;
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(at, end - at);
      if (size_t c = line.find("//"); c != std::string::npos) line.resize(c);
      if (line.find_first_not_of(" \t") != std::string::npos) out += line + "\n";
      at = end + 1;
    }
    return out;
  };
  auto source = [&](const char* path) {
    std::string text = read_text(path);
    const std::string marker = "MLXK_TOKEN_ACTIVE";
    for (size_t at; (at = text.find(marker)) != std::string::npos;) {
      text.replace(at, marker.size(), "true");
    }
    return stripped(text);
  };
  const std::string compat = stripped(read_text("kernels/cuda/metal_compat.cuh"));
  const std::string gates_h = stripped(read_text("kernels/cuda/gates.cuh"));
  const std::string silu_h = stripped(read_text("kernels/metal/silu.h"));
  const std::vector<std::string> from_conv_inputs = {"x",        "qscale", "kscale", "g", "beta",
                                                     "state_in", "a_log",  "dt_bias"};
  std::vector<std::pair<std::string, mx::fast::CustomKernelFunction>> one = {
      {"one kernel", mx::fast::cuda_kernel("mlxk_probe_tokens_from_conv", from_conv_inputs,
                                           {"y", "state_out"},
                                           source("kernels/metal/gated_delta.metal"),
                                           compat + gates_h + "#define MLXK_FROM_CONV 1\n" + silu_h,
                                           true, 0)}};
  if (const char* alt = std::getenv("MLXK_BENCH_ALT")) {
    one.emplace_back("alt one kernel",
                     mx::fast::cuda_kernel("mlxk_probe_tokens_from_conv_alt", from_conv_inputs,
                                           {"y", "state_out"}, source(alt),
                                           compat + gates_h + "#define MLXK_FROM_CONV 1\n" +
                                               silu_h,
                                           true, 0));
  }
  auto split = mx::fast::cuda_kernel("mlxk_probe_tokens_split", {"x", "qscale", "kscale"},
                                     {"q", "k", "v"}, source("kernels/metal/silu_rms_heads.metal"),
                                     compat + silu_h, true, 0);
  auto recurrence = mx::fast::cuda_kernel(
      "mlxk_probe_tokens_recurrence", {"q", "k", "v", "g", "beta", "state_in", "a_log", "dt_bias"},
      {"y", "state_out"}, source("kernels/metal/gated_delta.metal"), compat + gates_h, true, 0);
  const int c = 2 * kHk * kD + kHv * kD;
  const SplitConstants split_constants;
  const auto &qs = split_constants.qs, &ks = split_constants.ks;
  const int eps_bits = split_constants.eps_bits;
  const bool was = pipelined;
  for (int batch : {1, 8, 32}) {
    // src/cuda.rs rows_per_simd_group for Hv = 32, Dv = 128.
    const int pairs = batch * kHv;
    const int rows = pairs >= 1024 ? 16 : pairs >= 512 ? 8 : pairs >= 256 ? 4 : 1;
    const std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs = {
        {"Dk", kD},   {"Dv", kD},          {"Hk", kHk},          {"Hv", kHv},
        {"ROWS", rows}, {"EPS", eps_bits}, {"InT", mx::bfloat16}, {"StT", mx::float32}};
    for (int t : {1, 2, 4, 8}) {
      auto ls = layers(batch, t);
      std::vector<mx::array> xs;
      for (int l = 0; l < kLayers; ++l) xs.push_back(normal({batch, t, c}, mx::bfloat16, 2.0f));
      mx::eval(xs);
      const std::string name =
          "from conv B=" + std::to_string(batch) + " T=" + std::to_string(t) + " (30 layers)";
      std::vector<std::pair<std::string, Build>> builds;
      for (const auto& [label, kernel] : one) {
        builds.emplace_back(label, [&, kernel = kernel] {
          std::vector<mx::array> outs;
          for (int l = 0; l < kLayers; ++l) {
            const Layer& x = ls[l];
            auto r = kernel({xs[l], qs, ks, x.a, x.b, x.state, x.a_log, x.dt_bias},
                            {{batch, t, kHv, kD}, x.state.shape()}, {mx::bfloat16, mx::float32},
                            {32, kD / rows, batch * kHv}, {32, 4, 1}, targs, std::nullopt, false,
                            {});
            outs.insert(outs.end(), r.begin(), r.end());
          }
          return outs;
        });
      }
      builds.emplace_back("two kernels", [&] {
        std::vector<mx::array> outs;
        for (int l = 0; l < kLayers; ++l) {
          const Layer& x = ls[l];
          auto qkv = split({xs[l], qs, ks},
                           {{batch, t, kHk, kD}, {batch, t, kHk, kD}, {batch, t, kHv, kD}},
                           {mx::bfloat16, mx::bfloat16, mx::bfloat16},
                           {32 * (2 * kHk + kHv), batch * t, 1}, {256, 1, 1},
                           {{"T", mx::bfloat16}, {"C", c}, {"HK", kHk}, {"HV", kHv}, {"DK", kD},
                            {"DV", kD}, {"EPS", eps_bits}},
                           std::nullopt, false, {});
          auto r = recurrence({qkv[0], qkv[1], qkv[2], x.a, x.b, x.state, x.a_log, x.dt_bias},
                              {{batch, t, kHv, kD}, x.state.shape()},
                              {mx::bfloat16, mx::float32}, {32, kD / rows, batch * kHv},
                              {32, 4, 1}, targs, std::nullopt, false, {});
          outs.insert(outs.end(), r.begin(), r.end());
        }
        return outs;
      });
      for (bool mode : {false, true}) {
        pipelined = mode;
        for (const auto& [label, build] : builds) {
          row("tokens", name, impl(label), graph_us(build, warmup, iters), kLayers,
              update_bytes(batch, t), 0);
        }
      }
    }
  }
  pipelined = was;
}

void dispatch(int warmup, int iters) {
  auto ls = layers(1, 1);
  const std::string name = "decode B=1 (30 layers)";
  const double state_bytes = double(kHv) * kD * kD * 8;
  const std::string header =
      read_text("kernels/cuda/metal_compat.cuh") + read_text("kernels/cuda/gates.cuh");
  auto recurrence = [&](const std::string& kernel_name, const char* path) {
    std::string source = read_text(path);
    const std::string marker = "MLXK_TOKEN_ACTIVE";
    for (size_t at; (at = source.find(marker)) != std::string::npos;) {
      source.replace(at, marker.size(), "true");
    }
    return mx::fast::cuda_kernel(
        kernel_name, {"q", "k", "v", "g", "beta", "state_in", "a_log", "dt_bias"},
        {"y", "state_out"},
        source, header, true, 0);
  };
  auto rec = recurrence("mlxk_probe_recurrence", "kernels/metal/gated_delta.metal");
  // MLXK_BENCH_ALT=<file>: a variant of gated_delta.metal, swept beside it (rows "alt ROWS=").
  const char* alt_path = std::getenv("MLXK_BENCH_ALT");
  std::vector<std::pair<std::string, mx::fast::CustomKernelFunction>> texts = {{"direct", rec}};
  if (alt_path) texts.emplace_back("alt", recurrence("mlxk_probe_recurrence_alt", alt_path));
  const std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs = {
      {"Dk", kD}, {"Dv", kD}, {"Hk", kHk}, {"Hv", kHv}, {"ROWS", 1},
      {"InT", mx::bfloat16}, {"StT", mx::float32}};
  // The recurrence text straight through mx::fast::cuda_kernel (fused gates, one row a warp).
  Build direct = [&] {
    std::vector<mx::array> outs;
    for (auto& x : ls) {
      auto r = rec({x.q, x.k, x.v, x.a, x.b, x.state, x.a_log, x.dt_bias},
                   {{1, 1, kHv, kD}, x.state.shape()}, {mx::bfloat16, mx::float32},
                   {32, kD, kHv}, {32, 4, 1}, targs, std::nullopt, false, {});
      outs.insert(outs.end(), r.begin(), r.end());
    }
    return outs;
  };
  // The library's host side alone: the handle exchange of one call (8 arrays in, 2 out), and
  // the whole call with the CPU as default device (the same checks and handles, a CPU node).
  auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
  row("dispatch", name, "mlxkern handles",
      time_us([&] {
        std::vector<mx::array> outs;
        for (auto& x : ls) {
          for (const auto* a : {&x.q, &x.k, &x.v, &x.a, &x.b, &x.a_log, &x.dt_bias, &x.state}) {
            auto handle = h(*a);
            if (a == &x.state || a == &x.v) outs.push_back(handle.to_mlx());
          }
        }
      }, warmup, iters),
      kLayers, 0, 0);
  mlxk::set_default_device(mlxk::Device::Cpu);
  row("dispatch", name, "mlxkern build (CPU node)",
      time_us([&] {
        std::vector<mx::array> outs;
        for (auto& x : ls) {
          auto st = h(x.state);
          auto r = mlxk::gated_delta_update(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                            h(x.dt_bias), &st);
          outs.push_back(r.y.to_mlx());
          outs.push_back(r.state.to_mlx());
        }
      }, warmup, iters),
      kLayers, 0, 0);
  mlxk::set_default_device(mlxk::Device::Gpu);
  // The recurrence text at B = 8, 32 and 256 with 1 to 16 value rows per warp
  // (cuda::rows_per_simd_group picks the library's): which layout hides the state loads'
  // latency best.
  // MLXK_BENCH_SWEEP=0 leaves the sweep out.
  const char* sweep = std::getenv("MLXK_BENCH_SWEEP");
  for (int batch : {8, 32, 256}) {
    if (sweep && std::string(sweep) == "0") break;
    auto wide = layers(batch, 1);
    for (int rows : {1, 2, 4, 8, 16}) {
      auto targs_r = targs;
      targs_r[4] = {"ROWS", rows};
      for (auto& [label, kernel] : texts) {
        auto step = [&] {
          std::vector<mx::array> outs;
          for (auto& x : wide) {
            auto r = kernel({x.q, x.k, x.v, x.a, x.b, x.state, x.a_log, x.dt_bias},
                            {{batch, 1, kHv, kD}, x.state.shape()}, {mx::bfloat16, mx::float32},
                            {32, kD / rows, batch * kHv}, {32, 4, 1}, targs_r, std::nullopt,
                            false, {});
            outs.insert(outs.end(), r.begin(), r.end());
          }
          mx::eval(outs);
        };
        row("dispatch", "decode B=" + std::to_string(batch) + " (30 layers)",
            label + " ROWS=" + std::to_string(rows), time_us(step, warmup, iters), kLayers,
            update_bytes(batch, 1), 0);
      }
    }
  }
  // The replay text (T = 8, B = 32) with 2 to 16 value rows per warp, pipelined (the GPU's
  // time: the replay at B = 32 is GPU-bound there): it shares the decode's rows rule, which its
  // eight sequential tokens a warp may not suit. Rows "replay ROWS=n, pipelined".
  if (!sweep || std::string(sweep) != "0") {
    auto replay = mx::fast::cuda_kernel(
        "mlxk_probe_replay",
        {"k", "v", "g", "beta", "state_in", "lengths", "a_log", "dt_bias"}, {"state_out"},
        read_text("kernels/metal/gated_delta_state.metal"), header, true, 0);
    auto wide8 = layers(32, 8);
    auto lengths = mx::full({32}, 8, mx::int32);
    mx::eval(lengths);
    pipelined = true;
    for (int rows : {2, 4, 8, 16}) {
      Build b = [&] {
        std::vector<mx::array> outs;
        for (auto& x : wide8) {
          outs.push_back(replay({x.k, x.v, x.a, x.b, x.state, lengths, x.a_log, x.dt_bias},
                                {x.state.shape()}, {mx::float32}, {32, kD / rows, 32 * kHv},
                                {32, 4, 1},
                                {{"Dk", kD}, {"Dv", kD}, {"Hk", kHk}, {"Hv", kHv}, {"ROWS", rows}},
                                std::nullopt, false, {})[0]);
        }
        return outs;
      };
      row("dispatch", "replay T=8 B=32 (30 layers)", impl("replay ROWS=" + std::to_string(rows)),
          graph_us(b, warmup, iters), kLayers, 0, 0);
    }
    pipelined = false;
  }
  const CustomCopies c;
  for (int which = 0; which < 4; ++which) {
    Build b = which < 3 ? c.build(which, ls, 1) : direct;
    const std::string label = which < 3 ? CustomCopies::names[which] : "recurrence direct";
    row("dispatch", name, label, graph_us(b, warmup, iters), kLayers,
        which == 3 ? update_bytes(1, 1) : state_bytes, 0);
    row("dispatch", name, label + " build", time_us([&] { (void)b(); }, warmup, iters), kLayers,
        0, 0);
  }
  // The copies at B = 32, where a decode step moves 128 MiB of state a layer, beside the floor.
  auto wide = layers(32, 1);
  for (int which = 0; which < 3; ++which) {
    row("dispatch", "decode B=32 (30 layers)", CustomCopies::names[which],
        graph_us(c.build(which, wide, 32), warmup, iters), kLayers, 32 * state_bytes, 0);
  }
}

// Forward + backward of one layer over T tokens (B = 1), as a training step evaluates them:
// mlxkern's explicit backward (the GPU backward kernel) after its forward, against mx::vjp of
// mx::fast::gated_delta_update with the same gates (MLX CUDA: the ops fallback's VJP), with
// random cotangents. Peak memory is MLX's (mx::get_peak_memory, reset before each path).
void grad(int t, int warmup, int iters) {
  Layer x = layers(1, t).front();
  auto dy = normal({1, t, kHv, kD}, mx::bfloat16, 1.0f);
  auto ds = normal({1, kHv, kD, kD}, mx::float32, 0.5f);
  mx::eval({dy, ds});
  const std::string name = "fwd+bwd T=" + std::to_string(t) + " B=1 (1 layer)";
  auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
  auto ours = [&] {
    auto st = h(x.state);
    auto dyh = h(dy), dsh = h(ds);
    auto r = mlxk::gated_delta_update(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                      h(x.dt_bias), &st);
    auto g = mlxk::gated_delta_update_vjp(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                          h(x.dt_bias), &st, nullptr, &dyh, &dsh);
    mx::eval({r.y.to_mlx(), r.state.to_mlx(), g.dq.to_mlx(), g.dk.to_mlx(), g.dv.to_mlx(),
              g.da.to_mlx(), g.db.to_mlx(), g.da_log.to_mlx(), g.dt_bias.to_mlx(),
              g.state.to_mlx()});
  };
  auto fast = [&] {
    auto fun = [&](const std::vector<mx::array>& p) {
      Layer y = x;
      y.a = p[3];
      y.b = p[4];
      y.a_log = p[5];
      y.dt_bias = p[6];
      auto [g, beta] = gates(y);
      return mx::fast::gated_delta_update(p[0], p[1], p[2], g, beta, p[7]);
    };
    auto [outs, grads] =
        mx::vjp(fun, {x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.state}, {dy, ds});
    outs.insert(outs.end(), grads.begin(), grads.end());
    mx::eval(outs);
  };
  mx::reset_peak_memory();
  const double o = time_us(ours, warmup, iters);
  const double o_peak = double(mx::get_peak_memory()) / (1 << 20);
  row("grad", name, "mlxkern", o, 1, 0, 0);
  mx::reset_peak_memory();
  const double m = time_us(fast, 1, 3);
  const double m_peak = double(mx::get_peak_memory()) / (1 << 20);
  row("grad", name, "mlx fast vjp", m, 1, 0, 0);
  std::printf("grad     T=%d mlx fast vjp / mlxkern = %.1fx; MLX peak memory %.0f MiB (mlxkern) "
              "vs %.0f MiB (mlx fast vjp)\n", t, m / o, o_peak, m_peak);
  if (json) {
    std::fprintf(json,
                 "{\"group\":\"grad_memory\",\"t\":%d,\"mlxkern_peak_mib\":%.1f,"
                 "\"mlx_fast_vjp_peak_mib\":%.1f}\n",
                 t, o_peak, m_peak);
  }
}

}  // namespace

int main() {
  if (mlxk::gpu_backend() != mlxk::GpuBackend::Cuda) {
    std::printf("bench-cuda: skipped, the loaded MLX has no CUDA backend\n");
    return 0;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  mlxk::set_default_device(mlxk::Device::Gpu);
  mx::set_default_device(mx::Device::gpu);
  if (const char* path = std::getenv("MLXK_BENCH_JSON")) json = std::fopen(path, "w");
  const bool quick = std::getenv("MLXK_BENCH_QUICK") != nullptr;
  const int warmup = quick ? 3 : 10, iters = quick ? 10 : 50;
  std::printf("mlxkern %s, MLX %s; median of %d evals after %d warm-up\n", mlxk_version(),
              mlxk_mlx_version(), iters, warmup);
  int failed = 0;
  // MLXK_BENCH_ONLY=<group>[,<group>...]: those groups alone (decode, replay, head split, gated
  // norm, layer, fromconvrows, fromconvtokens, pipelined, prefill, dispatch, grad).
  const char* only = std::getenv("MLXK_BENCH_ONLY");
  auto wanted = [&](const std::string& what) {
    if (!only) return true;
    const std::string list = std::string(",") + only + ",";
    return list.find("," + what + ",") != std::string::npos;
  };
  auto guarded = [&](const char* what, const std::function<void()>& rows) {
    if (!wanted(what)) return;
    try {
      rows();
    } catch (const std::exception& e) {
      std::printf("FAIL: %s: %s\n", what, e.what());
      ++failed;
    }
  };
  // MLXK_BENCH_BATCH=<B>: decode at that batch size alone (for a profiler).
  const char* batch = std::getenv("MLXK_BENCH_BATCH");
  guarded("decode", [&] {
    for (int b : {1, 8, 32, 256}) {
      if (!batch || std::atoi(batch) == b) decode(b, warmup, iters);
    }
  });
  guarded("replay", [&] { for (int b : {1, 32}) replay(b, warmup, iters); });
  guarded("head split", [&] { for (int s : {1, 512}) head_split(s, warmup, iters); });
  guarded("gated norm", [&] { for (int s : {1, 512}) gated_norm(s, warmup, iters); });
  guarded("layer", [&] { for (int b : {1, 8, 32, 256}) split_update(b, warmup, iters); });
  guarded("fromconvrows", [&] { from_conv_rows(warmup, iters); });
  guarded("fromconvtokens", [&] { from_conv_tokens(warmup, iters); });
  guarded("pipelined", [&] {
    pipelined = true;
    for (int b : {1, 8, 32, 256}) split_update(b, warmup, iters);
    for (int b : {1, 8, 32, 256}) {
      if (!batch || std::atoi(batch) == b) decode(b, warmup, iters);
    }
    for (int b : {1, 32}) replay(b, warmup, iters);
    for (int s : {1, 512}) head_split(s, warmup, iters);
    for (int s : {1, 512}) gated_norm(s, warmup, iters);
    copies(CustomCopies(), warmup, iters);
    pipelined = false;
  });
  guarded("prefill", [&] { prefill(4096, 2, quick ? 3 : 10); });
  guarded("dispatch", [&] { dispatch(warmup, iters); });
  guarded("grad", [&] { for (int t : {512, 2048, 4096}) grad(t, 2, quick ? 3 : 5); });
  if (json) std::fclose(json);
  return failed ? 1 : 0;
}
