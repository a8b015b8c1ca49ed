// `make bench-cuda`'s custom-kernel rows (bench_cuda.h): the copies through
// mx::fast::cuda_kernel, the from_conv kernel's layouts, and where decode B = 1's time goes.

#include "bench_cuda.h"

namespace bench_cuda {

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

}  // namespace bench_cuda
