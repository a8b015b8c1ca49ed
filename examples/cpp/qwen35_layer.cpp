// Runs one Qwen3.5 Gated DeltaNet layer through mlxkern over a token stream: a prefill, decode
// steps, and speculative verify windows with partial acceptance and state rollback.
//
//   qwen35_layer WEIGHTS.safetensors INPUTS.safetensors OUTPUTS.safetensors [--quiet]
//
// WEIGHTS: the layer's tensors under mlx-lm's names (in_proj_qkv.weight, in_proj_z.weight,
//   in_proj_b.weight, in_proj_a.weight, conv1d.weight [conv_dim, K, 1], dt_bias, A_log,
//   norm.weight, out_proj.weight), bfloat16 except A_log (float32), and the configuration in the
//   metadata (hidden_size, linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
//   linear_value_head_dim, linear_conv_kernel_dim, rms_norm_eps).
// INPUTS: `x` [N, hidden] bfloat16, the token stream, and metadata `plan`: comma-separated steps
//   consuming the stream in order, `forward:T` (prefill or decode, committed) or
//   `verify:T:M` (a draft window of T tokens of which the first M are accepted).
// OUTPUTS: `y` [N, hidden] bfloat16 (the layer output of every token, rejected drafts
//   included), `state` [1, Hv, Dv, Dk] float32 and `conv_state` [1, K-1, conv_dim] bfloat16
//   after the last step.
#include "mlxkern.hpp"
#include "qwen35_gdn.hpp"
#include "safetensors.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct PlanStep {
  bool verify = false;
  int tokens = 0;
  int accepted = 0;
};

std::vector<PlanStep> parse_plan(const std::string &text) {
  std::vector<PlanStep> plan;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    PlanStep step;
    if (item.rfind("forward:", 0) == 0) {
      step.tokens = std::stoi(item.substr(8));
    } else if (item.rfind("verify:", 0) == 0) {
      const std::string rest = item.substr(7);
      const size_t colon = rest.find(':');
      if (colon == std::string::npos) throw std::runtime_error("plan: verify:T:M expected");
      step.verify = true;
      step.tokens = std::stoi(rest.substr(0, colon));
      step.accepted = std::stoi(rest.substr(colon + 1));
    } else {
      throw std::runtime_error("plan: unknown step '" + item + "'");
    }
    if (step.tokens <= 0 || step.accepted < 0 || step.accepted > step.tokens)
      throw std::runtime_error("plan: bad step '" + item + "'");
    plan.push_back(step);
  }
  return plan;
}

safetensors::Tensor bf16_tensor(const std::vector<float> &values, std::vector<int64_t> shape) {
  safetensors::Tensor tensor;
  tensor.dtype = "BF16";
  tensor.shape = std::move(shape);
  tensor.data.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = mlxk::bf16_from_float(values[i]);
    std::memcpy(tensor.data.data() + 2 * i, &bits, 2);
  }
  return tensor;
}

safetensors::Tensor f32_tensor(const std::vector<float> &values, std::vector<int64_t> shape) {
  safetensors::Tensor tensor;
  tensor.dtype = "F32";
  tensor.shape = std::move(shape);
  tensor.data.resize(values.size() * 4);
  std::memcpy(tensor.data.data(), values.data(), tensor.data.size());
  return tensor;
}

int run(int argc, char **argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s WEIGHTS.safetensors INPUTS.safetensors OUTPUTS.safetensors [--quiet]\n",
                 argv[0]);
    return 2;
  }
  const bool quiet = argc > 4 && std::strcmp(argv[4], "--quiet") == 0;
  mlxk::check_abi();
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();

  const safetensors::File weights = safetensors::read(argv[1]);
  const qwen35::Config config = qwen35::Config::from_metadata(weights);
  qwen35::GatedDeltaNet layer(config, weights);
  const safetensors::File inputs = safetensors::read(argv[2]);
  const std::vector<PlanStep> plan = parse_plan(inputs.meta("plan"));
  const safetensors::Tensor &x_tensor = inputs.at("x");
  if (x_tensor.shape.size() != 2 || x_tensor.shape[1] != config.hidden_size)
    throw std::runtime_error("inputs: x must be [N, hidden_size]");
  const std::vector<float> x = qwen35::to_floats(x_tensor);
  const int total = static_cast<int>(x_tensor.shape[0]);
  const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();

  std::printf("qwen35_layer: mlxkern %s, hidden %d, Hk %d, Hv %d, Dk %d, Dv %d, K %d; %zu steps, "
              "%d tokens (load %.1f ms)\n",
              mlxk::version().c_str(), config.hidden_size, config.key_heads, config.value_heads,
              config.key_dim, config.value_dim, config.conv_kernel, plan.size(), total, load_ms);

  const size_t hidden = static_cast<size_t>(config.hidden_size);
  std::vector<float> y(static_cast<size_t>(total) * hidden, 0.0f);
  int position = 0;
  bool replay_identical = true;
  qwen35::Timing sum;
  for (size_t index = 0; index < plan.size(); ++index) {
    const PlanStep &step = plan[index];
    if (position + step.tokens > total) throw std::runtime_error("plan consumes more than x holds");
    const std::vector<float> chunk(x.begin() + static_cast<std::ptrdiff_t>(position * hidden),
                                   x.begin() + static_cast<std::ptrdiff_t>((position + step.tokens) * hidden));
    qwen35::Timing timing;
    std::vector<float> out;
    std::string note;
    if (step.verify) {
      out = layer.verify(chunk, step.tokens, &timing);
      const auto start = Clock::now();
      const bool identical = layer.accept(step.accepted);
      const double accept_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      replay_identical = replay_identical && identical;
      char text[160];
      std::snprintf(text, sizeof text, "accept %d/%d, rollback + check %.3f ms, replayed state %s",
                    step.accepted, step.tokens, accept_ms, identical ? "bit-identical" : "DIFFERS");
      note = text;
    } else {
      out = layer.forward(chunk, step.tokens, &timing);
    }
    std::copy(out.begin(), out.end(), y.begin() + static_cast<std::ptrdiff_t>(position * hidden));
    if (!quiet) {
      std::printf("  step %2zu %-7s T=%-3d projections+conv %8.3f ms, mlxkern %8.3f ms, out_proj %8.3f ms%s%s\n",
                  index,
                  step.verify ? "verify" : index == 0 ? "prefill" : step.tokens > 1 ? "forward" : "decode",
                  step.tokens, timing.projections, timing.kernels, timing.out_proj,
                  note.empty() ? "" : "; ", note.c_str());
    }
    sum.projections += timing.projections;
    sum.kernels += timing.kernels;
    sum.out_proj += timing.out_proj;
    position += step.tokens;
  }
  if (position != total) throw std::runtime_error("plan does not consume all of x");

  safetensors::File outputs;
  outputs.tensors["y"] = bf16_tensor(y, {total, config.hidden_size});
  outputs.tensors["state"] = f32_tensor(
      layer.state(), {1, config.value_heads, config.value_dim, config.key_dim});
  outputs.tensors["conv_state"] =
      bf16_tensor(layer.conv_window(), {1, config.conv_kernel - 1, config.conv_dim()});
  safetensors::write(argv[3], outputs);

  std::printf("qwen35_layer: total projections+conv %.1f ms, mlxkern %.1f ms, out_proj %.1f ms; "
              "replayed states %s\n",
              sum.projections, sum.kernels, sum.out_proj,
              replay_identical ? "bit-identical to direct updates" : "NOT bit-identical");
  return replay_identical ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mlxk::Error &error) {
    std::fprintf(stderr, "qwen35_layer: mlxkern error %s: %s\n", error.status_name(),
                 error.message().c_str());
  } catch (const std::exception &error) {
    std::fprintf(stderr, "qwen35_layer: %s\n", error.what());
  }
  return 2;
}
