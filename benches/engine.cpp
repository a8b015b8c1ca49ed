// The engine-layer benchmark: one whole Qwen3.5 Gated DeltaNet layer (examples/cpp/qwen35_gdn.hpp)
// at Qwen3.5-35B-A3B's dims (hidden 2048, Hk 16, Hv 32, Dk = Dv = 128, conv kernel 4), B = 1,
// random bfloat16 weights, on the CPU: a decode step (T = 1) and a 512-token prefill.
//
//   engine_zero_copy  (a) the engine layer: MLX ops + mlxkern kernels exchanged with
//                     from_mlx / to_mlx, one graph and one mx::eval per step
//   engine_host_copy  (b) the same layer passing every kernel's inputs and outputs through host
//                     memory, the path before the exchange existed: MLX evaluates the
//                     projections and conv, the host reads back conv_out, a, b, z and uploads
//                     them with mlxk_array_new; mlxkern computes and the host reads the gated
//                     norm's output back and uploads it to MLX for out_proj (3 evaluations per
//                     step; the recurrent state stays an mlxkern handle, updated in place)
//   dense_alone       (a)'s MLX ops alone: projections, conv, out_proj (on a fixed input), 1 eval
//   kernels_alone     (a)'s mlxkern kernels alone: head split, recurrence, gated norm on fixed,
//                     evaluated inputs, the state carried, 1 eval
//   kernels_host_copy_alone
//                     (b)'s kernels with their trips through host memory, alone: the same
//                     inputs read back and uploaded, the output read back and uploaded to MLX;
//                     minus kernels_alone, the boundary cost (b) pays per step
// (c), mlx-lm's module, is measured by benches/engine_peer.py right after this program.
//
// The four are measured in interleaved rounds (one sample of each per round), so that load
// from other work on the machine falls on all of them alike; medians per step. Writes the
// records to OUTPUT.json for benches/report.py.
//
//   engine OUTPUT.json          (MLXK_BENCH_QUICK=1: fewer rounds)
//
// Built by scripts/bench/run.sh against the .venv's MLX (the libmlx mlxkern links).
#include "qwen35_gdn.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace mx = mlx::core;
using Clock = std::chrono::steady_clock;

// --- the machine (as benches/harness.h describes it) ---------------------------------------

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 || line.rfind("Model Name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

std::string loadavg_json() {
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  if (!(in >> a >> b >> c)) return "null";
  char text[96];
  std::snprintf(text, sizeof text, "[%.2f, %.2f, %.2f]", a, b, c);
  return text;
}

// --- one implementation of a step ---------------------------------------------------------

struct Impl {
  std::string name;
  std::string note;
  int evals_per_step = 1;
  double bytes_copied_per_step = 0;  // host memory traffic across the MLX / mlxkern boundary
  std::function<void()> step;
  std::vector<double> samples;       // seconds per step
};

struct Stats {
  double median, p10, p90, min, max;
};

Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto q = [&v](double p) {
    const double pos = p * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
  };
  return Stats{q(0.5), q(0.1), q(0.9), v.front(), v.back()};
}

// Row-major bytes of an evaluated, row-contiguous MLX array, read back into host memory.
std::vector<std::uint8_t> read_back(const mx::array &a) {
  if (!a.is_available() || !a.flags().row_contiguous || a.data_size() != a.size())
    throw std::logic_error("read_back: expected an evaluated row-contiguous array");
  const auto *p = a.data<std::uint8_t>();
  return std::vector<std::uint8_t>(p, p + a.nbytes());
}

// An MLX array uploaded from host bfloat16 bits (copied into an MLX buffer).
mx::array upload_bf16(const std::vector<std::uint8_t> &bytes, const mx::Shape &shape) {
  const auto *bits = reinterpret_cast<const std::uint16_t *>(bytes.data());
  return mx::view(mx::array(bits, shape, mx::uint16), mx::bfloat16);
}

mlxk::Array to_handle(const std::vector<std::uint8_t> &bytes, const mx::array &like) {
  const mlxk::Shape shape(like.shape().begin(), like.shape().end());
  return mlxk::Array::from_bytes(bytes.data(), bytes.size(), shape,
                                 like.dtype() == mx::float32 ? mlxk::Dtype::Float32
                                                             : mlxk::Dtype::BFloat16);
}

// --- the cases ------------------------------------------------------------------------------

struct CaseResult {
  int tokens;
  int steps_per_sample;
  std::vector<Impl> impls;
};

CaseResult run_case(const qwen35::Config &config, const qwen35::Weights &weights, int tokens,
                    int rounds, int steps_per_sample) {
  const int hidden = config.hidden_size;
  const mx::array x = mx::astype(
      mx::random::normal({1, tokens, hidden}, mx::float32, mx::random::key(100 + tokens)),
      mx::bfloat16);
  mx::eval(x);

  // (a) the engine layer.
  auto zero_copy = std::make_shared<qwen35::GatedDeltaNet>(config, weights);
  // (b) the same layer through host memory: the same MLX ops and kernels, the state an
  //     mlxkern handle.
  auto host = std::make_shared<qwen35::GatedDeltaNet>(config, weights);
  auto host_state = std::make_shared<mlxk::Array>(mlxk::Array::zeros(
      {1, config.value_heads, config.value_dim, config.key_dim}, mlxk::Dtype::Float32));
  auto host_conv_state = std::make_shared<mx::array>(host->conv_state());
  // The parts alone: fixed, evaluated inputs.
  auto parts = std::make_shared<qwen35::GatedDeltaNet>(config, weights);
  const qwen35::Projections p0 = parts->project(x);
  const qwen35::Conv c0 = parts->conv(parts->conv_state(), p0.qkv);
  const mx::array normed0 = mx::astype(
      mx::random::normal({1, tokens, config.value_heads, config.value_dim}, mx::float32,
                         mx::random::key(200 + tokens)),
      mx::bfloat16);
  auto kernel_state = std::make_shared<mx::array>(parts->state());
  mx::eval({p0.a, p0.b, p0.z, c0.out, normed0, *kernel_state});

  const double T = tokens;
  const double host_bytes =
      2.0 * T * (config.conv_dim() + 2 * config.value_heads + config.value_width()) * 2 +
      2.0 * T * config.value_width() * 2;

  CaseResult result{tokens, steps_per_sample, {}};
  result.impls.push_back(Impl{
      "engine_zero_copy",
      "MLX ops + mlxkern kernels, from_mlx / to_mlx, one graph and one mx::eval per step",
      1, 0.0, [zero_copy, x]() {
        const mx::array out = zero_copy->forward(x);
        mx::eval(zero_copy->step_outputs(out));
      }, {}});
  result.impls.push_back(Impl{
      "engine_host_copy",
      "the same layer, kernel inputs and outputs through host memory (read back, upload): "
      "MLX eval, mlxkern read, MLX eval",
      3, host_bytes, [host, host_state, host_conv_state, x, config]() {
        // MLX: projections and conv, evaluated; their values read back to the host.
        const qwen35::Projections p = host->project(x);
        const qwen35::Conv c = host->conv(*host_conv_state, p.qkv);
        mx::eval({c.out, p.a, p.b, p.z, c.next_state});
        *host_conv_state = c.next_state;
        const auto conv_bytes = read_back(c.out), a_bytes = read_back(p.a),
                   b_bytes = read_back(p.b), z_bytes = read_back(p.z);
        // mlxkern: the same values uploaded; the result read back.
        const qwen35::KernelParams &k = host->kernel_params();
        const mlxk::HeadSplit heads =
            mlxk::silu_rms_heads(to_handle(conv_bytes, c.out), k.q_scale, k.k_scale,
                                 config.key_heads, config.value_heads, config.value_dim, k.qk_eps);
        mlxk::DeltaUpdate update = mlxk::gated_delta_update(
            heads.q, heads.k, heads.v, to_handle(a_bytes, p.a), to_handle(b_bytes, p.b),
            k.a_log, k.dt_bias, host_state.get());
        *host_state = std::move(update.state);  // the old state freed: updated in place
        const mlxk::Array normed =
            mlxk::gated_rms_norm(update.y, to_handle(z_bytes, p.z), k.norm_weight,
                                 config.rms_norm_eps);
        std::vector<std::uint8_t> normed_bytes(normed.nbytes());
        normed.read(normed_bytes.data(), normed_bytes.size());  // evaluates
        // MLX: out_proj on the uploaded values.
        const mx::array out = host->out_proj(
            upload_bf16(normed_bytes, {1, p.z.shape(1), config.value_heads, config.value_dim}));
        mx::eval(out);
      }, {}});
  result.impls.push_back(Impl{
      "dense_alone", "(a)'s MLX ops alone: 4 projections, concatenate + conv1d, out_proj; 1 eval",
      1, 0.0, [parts, x, normed0]() {
        const qwen35::Projections p = parts->project(x);
        const qwen35::Conv c = parts->conv(parts->conv_state(), p.qkv);
        const mx::array out = parts->out_proj(normed0);
        mx::eval({out, c.out, c.next_state, p.a, p.b, p.z});
      }, {}});
  result.impls.push_back(Impl{
      "kernels_alone",
      "(a)'s mlxkern kernels alone: head split, exact recurrence, gated norm; 1 eval",
      1, 0.0, [parts, kernel_state, p0, c0]() {
        const qwen35::KernelResults k = parts->kernels(c0.out, p0.a, p0.b, p0.z, *kernel_state,
                                                       qwen35::Recurrence::Exact);
        *kernel_state = k.state;  // only the graph holds the old state: updated in place
        mx::eval({k.normed, *kernel_state});
      }, {}});

  auto copy_state = std::make_shared<mlxk::Array>(mlxk::Array::zeros(
      {1, config.value_heads, config.value_dim, config.key_dim}, mlxk::Dtype::Float32));
  result.impls.push_back(Impl{
      "kernels_host_copy_alone",
      "(b)'s kernels with their host copies alone: inputs read back and uploaded, output read "
      "back and uploaded to MLX; 1 eval (mlxkern's read)",
      1, host_bytes, [parts, copy_state, p0, c0, config]() {
        const auto conv_bytes = read_back(c0.out), a_bytes = read_back(p0.a),
                   b_bytes = read_back(p0.b), z_bytes = read_back(p0.z);
        const qwen35::KernelParams &k = parts->kernel_params();
        const mlxk::HeadSplit heads =
            mlxk::silu_rms_heads(to_handle(conv_bytes, c0.out), k.q_scale, k.k_scale,
                                 config.key_heads, config.value_heads, config.value_dim, k.qk_eps);
        mlxk::DeltaUpdate update = mlxk::gated_delta_update(
            heads.q, heads.k, heads.v, to_handle(a_bytes, p0.a), to_handle(b_bytes, p0.b),
            k.a_log, k.dt_bias, copy_state.get());
        *copy_state = std::move(update.state);
        const mlxk::Array normed = mlxk::gated_rms_norm(update.y, to_handle(z_bytes, p0.z),
                                                        k.norm_weight, config.rms_norm_eps);
        std::vector<std::uint8_t> normed_bytes(normed.nbytes());
        normed.read(normed_bytes.data(), normed_bytes.size());
        const mx::array uploaded = upload_bf16(
            normed_bytes, {1, p0.z.shape(1), config.value_heads, config.value_dim});
        if (uploaded.size() == 0) throw std::logic_error("empty upload");
      }, {}});

  for (Impl &impl : result.impls) impl.step();  // warm-up
  if (tokens == 1)
    for (Impl &impl : result.impls) impl.step();
  for (int round = 0; round < rounds; ++round) {
    for (Impl &impl : result.impls) {
      const auto start = Clock::now();
      for (int s = 0; s < steps_per_sample; ++s) impl.step();
      impl.samples.push_back(std::chrono::duration<double>(Clock::now() - start).count() /
                             steps_per_sample);
    }
  }
  return result;
}

int run(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT.json\n", argv[0]);
    return 2;
  }
  const char *quick_env = std::getenv("MLXK_BENCH_QUICK");
  const bool quick = quick_env != nullptr && quick_env[0] != '\0' && std::strcmp(quick_env, "0") != 0;
  mlxk::check_abi();
  const auto begin = Clock::now();
  const std::string load_start = loadavg_json();
  const qwen35::Config config = qwen35::Config::qwen35_35b_a3b();
  const qwen35::Weights weights = qwen35::Weights::random(config, 20250601);
  {
    std::vector<mx::array> all = weights.all();
    mx::eval(all);
  }
  std::printf("engine layer: mlxkern %s on MLX %s; %s; load %s\n", mlxk::version().c_str(),
              mlxk_mlx_version(), cpu_model().c_str(), load_start.c_str());

  std::vector<CaseResult> cases;
  // decode: 8 steps per sample; prefill T = 512: one step per sample.
  cases.push_back(run_case(config, weights, 1, quick ? 3 : 12, 8));
  cases.push_back(run_case(config, weights, 512, quick ? 1 : 3, 1));

  std::ostringstream json;
  json << "{\"tool\": \"mlxkern benches/engine.cpp\", \"library_version\": \"" << mlxk::version()
       << "\", \"mlx_version\": \"" << mlxk_mlx_version() << "\", \"quick\": "
       << (quick ? "true" : "false") << ", \"host\": {\"cpu_model\": \"" << cpu_model()
       << "\"}, \"dims\": {\"hidden\": " << config.hidden_size << ", \"Hk\": " << config.key_heads
       << ", \"Hv\": " << config.value_heads << ", \"Dk\": " << config.key_dim
       << ", \"Dv\": " << config.value_dim << ", \"K\": " << config.conv_kernel
       << ", \"B\": 1}, \"loadavg_start\": " << load_start << ", \"records\": [";
  bool first = true;
  for (const CaseResult &c : cases) {
    for (const Impl &impl : c.impls) {
      const Stats st = stats_of(impl.samples);
      std::printf("  %-8s T=%-4d %-23s %10.3f ms/step  [p10 %9.3f  p90 %9.3f  n %2zu x%d]  %d eval%s/step, "
                  "%.0f bytes copied/step\n",
                  c.tokens == 1 ? "decode" : "prefill", c.tokens, impl.name.c_str(), st.median * 1e3,
                  st.p10 * 1e3, st.p90 * 1e3, impl.samples.size(), c.steps_per_sample,
                  impl.evals_per_step, impl.evals_per_step == 1 ? "" : "s",
                  impl.bytes_copied_per_step);
      json << (first ? "" : ", ") << "{\"case\": \"" << (c.tokens == 1 ? "decode" : "prefill")
           << "\", \"T\": " << c.tokens << ", \"impl\": \"" << impl.name << "\", \"note\": \""
           << impl.note << "\", \"median_us\": " << st.median * 1e6 << ", \"p10_us\": "
           << st.p10 * 1e6 << ", \"p90_us\": " << st.p90 * 1e6 << ", \"min_us\": " << st.min * 1e6
           << ", \"max_us\": " << st.max * 1e6 << ", \"samples\": " << impl.samples.size()
           << ", \"steps_per_sample\": " << c.steps_per_sample << ", \"evals_per_step\": "
           << impl.evals_per_step << ", \"bytes_copied_per_step\": " << impl.bytes_copied_per_step
           << ", \"tokens_per_s\": " << c.tokens / st.median << "}";
      first = false;
    }
  }
  const double total = std::chrono::duration<double>(Clock::now() - begin).count();
  json << "], \"loadavg_end\": " << loadavg_json() << ", \"total_s\": " << total << "}\n";
  std::ofstream(argv[1]) << json.str();
  std::printf("engine: %.1f s -> %s\n", total, argv[1]);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mlxk::Error &error) {
    std::fprintf(stderr, "engine: mlxkern error %s: %s\n", error.status_name(), error.message().c_str());
  } catch (const std::exception &error) {
    std::fprintf(stderr, "engine: %s\n", error.what());
  }
  return 1;
}
