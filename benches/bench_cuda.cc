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
//   prefill  mlxk_gated_delta_update over T = 512, 4096, 16384, B = 1, one layer, and
//            mlxk_gated_delta_update_chunked (the GPU chunked form, chunks of 32 and 64, and
//            64 with the scan's tile narrowed to 8 columns);
//            mx::fast beside them to T = 4096
//   pipelined decode, replay, split and norm again (floor and mlxkern) with one graph in
//            flight while the next is built, as generate loops run (rows ", pipelined"), and
//            the dispatch group's custom copies at B = 1 and 32
//   dispatch where decode B = 1's time goes: MLX custom kernels (a copy with 1 and with 9
//            inputs, the recurrence text straight through mx::fast::cuda_kernel), eval and build
//   grad     forward + mlxk_gated_delta_update_vjp over T = 512, 2048, 4096, B = 1, one layer;
//            mx::vjp of mx::fast::gated_delta_update beside it, with MLX's peak memory;
//            and T = 512, 4096 through the chunked form's backward (mlxk_gated_delta_update_
//            chunked_vjp, looked up at run time: skipped where the library lacks it)
//   pool     continuous batching on a pool of 64 slots, 32 decoding, 30 layers:
//            mlxk_gated_delta_update_pool, _packed, gather -> dense kernel -> scatter as MLX ops,
//            the dense kernel alone (bench_cuda_pool.cc)
//   packed   packed prefill of 16 prompts (64-2048 tokens): packed, padded, per prompt
//   packed16k  packed prefill of 8 prompts of mixed lengths summing 16384 against one sequence
//            of 16384 tokens
// For each: median time per layer-step over timed iterations after warm-up, the bytes the kernel
// must move (inputs read + outputs written) and the GB/s that gives, and the ratio to the floor.
// Output: a table on stdout and JSON lines in $MLXK_BENCH_JSON (if set).
// Files: this one (timing, output, inputs, main), bench_cuda_layers.cc, bench_cuda_dispatch.cc,
// bench_cuda_pool.cc (with pool_cases.h); bench_cuda.h declares what they share. All are
// compiled together.

#include "bench_cuda.h"

namespace bench_cuda {

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

// Where a pipelined graph's host time goes (struct Phases, bench_cuda.h).
Phases phases;

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

}  // namespace bench_cuda

using namespace bench_cuda;

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
  // norm, layer, fromconvrows, fromconvtokens, pipelined, prefill, dispatch, grad, pool,
  // packed, packed16k; gradchunked: the grad group's chunked rows alone).
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
  // MLXK_BENCH_T=<T>: the prefill and grad groups at that length alone (for a profiler).
  const char* only_t = std::getenv("MLXK_BENCH_T");
  auto length = [&](int t) { return !only_t || std::atoi(only_t) == t; };
  guarded("prefill", [&] {
    for (int t : {512, 4096, 16384}) {
      if (length(t)) prefill(t, 2, quick ? 3 : 10);
    }
  });
  guarded("dispatch", [&] { dispatch(warmup, iters); });
  guarded("grad", [&] {
    for (int t : {512, 2048, 4096}) {
      if (length(t)) grad(t, 2, quick ? 3 : 5);
    }
    for (int t : {512, 4096}) {
      if (length(t)) grad_chunked(t, 2, quick ? 3 : 5);
    }
  });
  // gradchunked: the grad group's chunked rows alone (named only: the grad group has them).
  if (only != nullptr) {
    guarded("gradchunked", [&] {
      for (int t : {512, 4096}) {
        if (length(t)) grad_chunked(t, 2, quick ? 3 : 5);
      }
    });
  }
  auto checked = [&](const char* what, bool ok) {
    if (ok) return;
    std::printf("FAIL: %s: a bit-for-bit comparison failed (above)\n", what);
    ++failed;
  };
  guarded("pool", [&] { checked("pool", pool_batching(quick)); });
  guarded("packed", [&] { checked("packed", pool_prefill(quick)); });
  guarded("packed16k", [&] { checked("packed16k", packed_mixed(quick)); });
  if (json) std::fclose(json);
  return failed ? 1 : 0;
}
