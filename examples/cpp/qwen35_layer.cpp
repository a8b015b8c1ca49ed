// Runs one Qwen3.5 Gated DeltaNet layer (qwen35_gdn.hpp: MLX ops + mlxkern kernels in one
// graph) over a token stream: a prefill, decode steps, and speculative verify windows with
// partial acceptance and state rollback. One mx::eval per step.
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
//   `verify:T:M` (a draft window of T tokens of which the first M are accepted); optional
//   metadata `chunked_prefill` N: forward steps of N tokens or more run the chunked recurrence
//   (mlxk_gated_delta_update_chunked) instead of the exact one.
// OUTPUTS: `y` [N, hidden] bfloat16 (the layer output of every token, rejected drafts
//   included), `state` [1, Hv, Dv, Dk] float32 and `conv_state` [1, K-1, conv_dim] bfloat16
//   after the last step.
#include "qwen35_gdn.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace mx = mlx::core;

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

double ms_since(std::chrono::steady_clock::time_point from) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - from)
      .count();
}

int run(int argc, char **argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: %s WEIGHTS.safetensors INPUTS.safetensors OUTPUTS.safetensors "
                 "[--quiet]\n",
                 argv[0]);
    return 2;
  }
  const bool quiet = argc > 4 && std::strcmp(argv[4], "--quiet") == 0;
  mlxk::check_abi();
  const auto begin = std::chrono::steady_clock::now();

  const mx::SafetensorsLoad weights = mx::load_safetensors(argv[1]);
  const qwen35::Config config = qwen35::Config::from_metadata(weights.second);
  qwen35::GatedDeltaNet layer(config, qwen35::Weights::from_map(weights.first, config));
  const mx::SafetensorsLoad inputs = mx::load_safetensors(argv[2]);
  const auto plan_it = inputs.second.find("plan");
  const auto x_it = inputs.first.find("x");
  if (plan_it == inputs.second.end() || x_it == inputs.first.end())
    throw std::runtime_error("inputs: expected a tensor x and metadata plan");
  const std::vector<PlanStep> plan = parse_plan(plan_it->second);
  const auto chunked_it = inputs.second.find("chunked_prefill");
  const int chunked_from = chunked_it == inputs.second.end() ? 0 : std::stoi(chunked_it->second);
  mx::array x = x_it->second;
  if (x.ndim() != 2 || x.shape(1) != config.hidden_size || x.dtype() != mx::bfloat16)
    throw std::runtime_error("inputs: x must be [N, hidden_size] bfloat16");
  mx::eval(x);
  const int total = x.shape(0);
  const double load_ms = ms_since(begin);

  std::printf("qwen35_layer: mlxkern %s on MLX %s, hidden %d, Hk %d, Hv %d, Dk %d, Dv %d, K %d; "
              "%zu steps, %d tokens (load %.1f ms)\n",
              mlxk::version().c_str(), mlxk_mlx_version(), config.hidden_size, config.key_heads,
              config.value_heads, config.key_dim, config.value_dim, config.conv_kernel,
              plan.size(), total, load_ms);

  std::vector<mx::array> outputs;
  int position = 0;
  int evals = 0;
  bool replay_identical = true;
  double build_total = 0, eval_total = 0;
  for (size_t index = 0; index < plan.size(); ++index) {
    const PlanStep &step = plan[index];
    if (position + step.tokens > total) throw std::runtime_error("plan consumes more than x holds");
    auto start = std::chrono::steady_clock::now();
    const mx::array chunk = mx::reshape(
        mx::slice(x, {position, 0}, {position + step.tokens, config.hidden_size}),
        {1, step.tokens, config.hidden_size});
    mx::array out(0.0f);
    mx::array identical(true);
    const bool chunked = !step.verify && chunked_from > 0 && step.tokens >= chunked_from;
    if (step.verify) {
      out = layer.verify(chunk);
      layer.accept(step.accepted, &identical);  // the rollback joins this step's graph
    } else {
      out = layer.forward(chunk, chunked ? qwen35::Recurrence::Chunked : qwen35::Recurrence::Exact);
    }
    std::vector<mx::array> results = layer.step_outputs(out);
    results.push_back(identical);
    const double build_ms = ms_since(start);
    start = std::chrono::steady_clock::now();
    mx::eval(results);  // the step's one evaluation
    ++evals;
    const double eval_ms = ms_since(start);
    build_total += build_ms;
    eval_total += eval_ms;
    const bool same = identical.item<bool>();
    replay_identical = replay_identical && same;
    outputs.push_back(out);
    if (!quiet) {
      const char *kind = step.verify ? "verify" : index == 0 ? "prefill" : step.tokens > 1 ? "forward" : "decode";
      std::printf("  step %2zu %-7s T=%-3d graph %7.3f ms, eval %9.3f ms (1 eval)%s", index, kind,
                  step.tokens, build_ms, eval_ms, chunked ? ", chunked recurrence" : "");
      if (step.verify)
        std::printf("; accept %d/%d, state %s", step.accepted, step.tokens,
                    step.accepted == step.tokens ? "kept"
                    : same ? "replayed, bit-identical to a direct update"
                           : "replayed, DIFFERS from a direct update");
      std::printf("\n");
    }
    position += step.tokens;
  }
  if (position != total) throw std::runtime_error("plan does not consume all of x");

  mx::array y = mx::reshape(mx::concatenate(outputs, 1), {total, config.hidden_size});
  mx::save_safetensors(argv[3], {{"y", y}, {"state", layer.state()}, {"conv_state", layer.conv_state()}});

  std::printf("qwen35_layer: %zu steps, %d evals (one per step); graph building %.1f ms, "
              "evaluation %.1f ms; replayed states %s\n",
              plan.size(), evals, build_total, eval_total,
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
