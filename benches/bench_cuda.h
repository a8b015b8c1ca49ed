// What the files of `make bench-cuda` share (bench_cuda.cc: the timing, the rows' output, the
// layers' inputs and main; bench_cuda_layers.cc: the kernels' rows at engine dims;
// bench_cuda_dispatch.cc: the custom-kernel rows, where a decode step's time goes;
// bench_cuda_pool.cc: the pool calls' rows, continuous batching and packed prefill).

#ifndef MLXK_BENCH_CUDA_H
#define MLXK_BENCH_CUDA_H

#define MLXKERN_WITH_MLX
#include <dlfcn.h>

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

namespace bench_cuda {

constexpr int kLayers = 30, kHk = 16, kHv = 32, kD = 128;

extern FILE* json;

double now_us();
// Median microseconds of one call of `step` (which builds and evaluates one graph).
double time_us(const std::function<void()>& step, int warmup, int iters);

// MLXK_BENCH_ONLY=pipelined: one graph in flight while the next is built (bench_cuda.cc).
extern bool pipelined;

using Build = std::function<std::vector<mx::array>()>;

// Where a pipelined graph's host time goes, µs a graph (medians' run): building it, handing it
// to MLX (async_eval: eval_gpu of every node and the CUDA graph's launch), waiting for the graph
// before it, and releasing that graph's arrays. Printed with each pipelined row.
struct Phases {
  double build = 0, submit = 0, wait = 0, release = 0;
  bool valid = false;
};
extern Phases phases;

double graph_us(const Build& build, int warmup, int iters);
std::string impl(const std::string& name);
void row(const std::string& group, const std::string& name, const std::string& peer, double us,
         double per, double bytes, double floor_us);
mx::array normal(const mx::Shape& shape, mx::Dtype dtype, float scale);

struct Layer {
  mx::array q, k, v, a, b, a_log, dt_bias, state;
};

std::vector<Layer> layers(int batch, int t);
std::pair<mx::array, mx::array> gates(const Layer& x);
Build state_floor(const std::vector<Layer>& ls);
double update_bytes(int batch, int t);

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

// bench_cuda_layers.cc
void decode(int batch, int warmup, int iters);
void replay(int batch, int warmup, int iters);
void head_split(int s, int warmup, int iters);
void split_update(int batch, int warmup, int iters);
void gated_norm(int s, int warmup, int iters);
void prefill(int t, int warmup, int iters);
void grad(int t, int warmup, int iters);
void grad_chunked(int t, int warmup, int iters);

// bench_cuda_dispatch.cc
std::string read_text(const char* path);
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

void copies(const CustomCopies& c, int warmup, int iters);
void from_conv_rows(int warmup, int iters);
void from_conv_tokens(int warmup, int iters);
void dispatch(int warmup, int iters);

// bench_cuda_pool.cc (cases in pool_cases.h); false where a bit-for-bit comparison failed.
bool pool_batching(bool quick);
bool pool_prefill(bool quick);
// The packed16k rows (bench_cuda_pool.cc): 8 prompts of mixed lengths summing 16384 tokens.
bool packed_mixed(bool quick);

}  // namespace bench_cuda

#endif
