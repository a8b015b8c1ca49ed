// Trains a low-rank adapter (LoRA) on one Qwen3.5 Gated DeltaNet layer (qwen35_gdn.hpp: MLX ops
// for the projections, conv and out_proj, mlxkern's kernels for the head split, the recurrence
// and the gated norm) with MLX's autograd, from C++:
//
//   loss(A, B) = mean((layer.sequence(x, LoRA{A, B} on in_proj_qkv) - target)^2)
//   (loss, dA, dB) = mx::value_and_grad(loss)        -- through every kernel's backward node
//   A, B           = Adam step (MLX ops: mlx.optimizers.Adam's formula, its learning rate on
//                    mlx.optimizers.cosine_decay's schedule)
//
// The layer's own weights stay fixed; each step is one graph (forward, backward, optimizer) and
// one mx::eval. tests/cpp/test_qwen35_train.py trains the same model in mlx-lm 0.32.2 on the
// same data and compares the two loss curves (scripts/bench/train-example.sh, make train-example).
//
//   qwen35_train WEIGHTS.safetensors DATA.safetensors OUT.safetensors [--quiet]
//
// WEIGHTS: the layer's tensors under mlx-lm's names and its configuration in the metadata, as
//   for qwen35_layer (all float32 here, or bfloat16 with A_log float32).
// DATA: `x` [N, B, T, hidden] (N batches of B sequences, the model's dtype) and `target`, the
//   same shape: step s trains on batch s mod N; `lora_a` [hidden, r] and `lora_b`
//   [r, conv_dim] float32, the adapter's initial matrices. Metadata: `steps`, `learning_rate`,
//   `lora_scale`, `beta1`, `beta2`, `eps` (Adam), optionally `decay_steps` (the learning rate
//   follows a cosine from learning_rate to 0 over that many steps; absent: constant) and
//   `recurrence` (exact or chunked).
// OUT: `loss` [steps] float32 (the loss before each step's update), the final `lora_a` and
//   `lora_b`; metadata `seconds` (the training loop) and `step_ms_median`.
#include "qwen35_gdn.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numbers>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

namespace mx = mlx::core;

double ms_since(std::chrono::steady_clock::time_point from) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - from)
      .count();
}

const std::string &meta(const std::unordered_map<std::string, std::string> &metadata,
                        const char *key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw std::runtime_error(std::string("data: no metadata ") + key);
  return it->second;
}

const mx::array &tensor(const std::unordered_map<std::string, mx::array> &tensors,
                        const char *name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw std::runtime_error(std::string("data: no tensor ") + name);
  return it->second;
}

/** mlx.optimizers.Adam (bias_correction=False) on one parameter, in its order of operations:
 * m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p = p - lr m / (sqrt(v) + eps). The learning
 * rate is constant, or follows mlx.optimizers.cosine_decay(learning_rate, decay_steps). */
struct Adam {
  double learning_rate = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int decay_steps = 0;  // 0: constant

  /** The learning rate of update `step` (0 for the first), a float32 scalar: cosine_decay's
   * 0 + 0.5 (1 + cos((pi / decay_steps) min(step, decay_steps))) (init - 0). */
  [[nodiscard]] mx::array rate(int step) const {
    if (decay_steps == 0) return mx::array(static_cast<float>(learning_rate));
    const mx::array s(static_cast<float>(std::min(step, decay_steps)));
    const mx::array angle =
        mx::multiply(mx::array(static_cast<float>(std::numbers::pi / decay_steps)), s);
    const mx::array decay =
        mx::multiply(mx::array(0.5f), mx::add(mx::array(1.0f), mx::cos(angle)));
    return mx::add(mx::array(0.0f),
                   mx::multiply(decay, mx::array(static_cast<float>(learning_rate))));
  }

  void update(mx::array &param, const mx::array &grad, mx::array &m, mx::array &v,
              const mx::array &lr) const {
    const mx::Dtype t = grad.dtype();
    // Python floats against arrays: scalars of the array's dtype (1 - b1 rounded once).
    auto scalar = [t](double value) { return mx::array(static_cast<float>(value), t); };
    m = mx::add(mx::multiply(scalar(beta1), m), mx::multiply(scalar(1.0 - beta1), grad));
    v = mx::add(mx::multiply(scalar(beta2), v),
                mx::multiply(scalar(1.0 - beta2), mx::square(grad)));
    param = mx::subtract(param, mx::divide(mx::multiply(mx::astype(lr, t), m),
                                           mx::add(mx::sqrt(v), scalar(eps))));
  }
};

int run(int argc, char **argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: %s WEIGHTS.safetensors DATA.safetensors OUT.safetensors [--quiet]\n",
                 argv[0]);
    return 2;
  }
  const bool quiet = argc > 4 && std::strcmp(argv[4], "--quiet") == 0;
  mlxk::check_abi();

  const mx::SafetensorsLoad weights = mx::load_safetensors(argv[1]);
  const qwen35::Config config = qwen35::Config::from_metadata(weights.second);
  const qwen35::GatedDeltaNet layer(config, qwen35::Weights::from_map(weights.first, config));

  const mx::SafetensorsLoad data = mx::load_safetensors(argv[2]);
  const mx::array xs = tensor(data.first, "x");
  const mx::array targets = tensor(data.first, "target");
  mx::array lora_a = tensor(data.first, "lora_a");
  mx::array lora_b = tensor(data.first, "lora_b");
  const int steps = std::stoi(meta(data.second, "steps"));
  const float lora_scale = std::stof(meta(data.second, "lora_scale"));
  Adam adam;
  adam.learning_rate = std::stod(meta(data.second, "learning_rate"));
  adam.beta1 = std::stod(meta(data.second, "beta1"));
  adam.beta2 = std::stod(meta(data.second, "beta2"));
  adam.eps = std::stod(meta(data.second, "eps"));
  const auto decay_it = data.second.find("decay_steps");
  if (decay_it != data.second.end()) adam.decay_steps = std::stoi(decay_it->second);
  const auto recurrence_it = data.second.find("recurrence");
  const bool chunked = recurrence_it != data.second.end() && recurrence_it->second == "chunked";
  const qwen35::Recurrence recurrence =
      chunked ? qwen35::Recurrence::Chunked : qwen35::Recurrence::Exact;

  if (xs.ndim() != 4 || xs.shape(3) != config.hidden_size || targets.shape() != xs.shape())
    throw std::runtime_error("data: x and target must be [N, B, T, hidden]");
  const int rank = lora_a.shape(1);
  if (lora_a.shape() != mx::Shape{config.hidden_size, rank} ||
      lora_b.shape() != mx::Shape{rank, config.conv_dim()})
    throw std::runtime_error("data: lora_a must be [hidden, r] and lora_b [r, conv_dim]");
  if (steps < 1 || adam.decay_steps < 0)
    throw std::runtime_error("data: steps must be positive, decay_steps not negative");
  const int batches = xs.shape(0);
  mx::eval({xs, targets, lora_a, lora_b});

  std::printf("qwen35_train: mlxkern %s on MLX %s; hidden %d, Hk %d, Hv %d, Dk %d, Dv %d, K %d, "
              "%s; LoRA rank %d (scale %g) on in_proj_qkv; %d steps of B = %d, T = %d over %d %s; "
              "Adam lr %g%s; %s recurrence\n",
              mlxk::version().c_str(), mlxk_mlx_version(), config.hidden_size, config.key_heads,
              config.value_heads, config.key_dim, config.value_dim, config.conv_kernel,
              xs.dtype() == mx::float32 ? "float32" : "bfloat16", rank, lora_scale, steps,
              xs.shape(1), xs.shape(2), batches, batches == 1 ? "batch" : "batches",
              adam.learning_rate,
              adam.decay_steps ? " (cosine decay)" : "", chunked ? "chunked" : "exact");

  // The batch of the current step; the loss reads it, value_and_grad differentiates the loss
  // with respect to its two arguments, A and B.
  mx::array x = xs, target = targets;
  auto loss = [&](const std::vector<mx::array> &params) -> std::vector<mx::array> {
    const qwen35::LoRA adapter{params[0], params[1], lora_scale};
    const mx::array out = layer.sequence(x, &adapter, recurrence);
    return {mx::mean(mx::square(mx::subtract(out, target)))};
  };
  auto loss_and_grad = mx::value_and_grad(loss, std::vector<int>{0, 1});

  mx::array m_a = mx::zeros_like(lora_a), v_a = mx::zeros_like(lora_a);
  mx::array m_b = mx::zeros_like(lora_b), v_b = mx::zeros_like(lora_b);
  std::vector<float> losses;
  std::vector<double> step_ms;
  const auto begin = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const int n = s % batches;
    x = mx::squeeze(mx::slice(xs, {n, 0, 0, 0}, {n + 1, xs.shape(1), xs.shape(2), xs.shape(3)}), 0);
    target = mx::squeeze(
        mx::slice(targets, {n, 0, 0, 0}, {n + 1, xs.shape(1), xs.shape(2), xs.shape(3)}), 0);
    auto [value, grads] = loss_and_grad({lora_a, lora_b});
    const mx::array lr = adam.rate(s);
    adam.update(lora_a, grads[0], m_a, v_a, lr);
    adam.update(lora_b, grads[1], m_b, v_b, lr);
    mx::eval({value[0], lora_a, lora_b, m_a, v_a, m_b, v_b});  // the step's one evaluation
    losses.push_back(value[0].item<float>());
    step_ms.push_back(ms_since(start));
    if (!quiet && (s % std::max(1, steps / 10) == 0 || s == steps - 1))
      std::printf("  step %4d  loss %.6e  (%.1f ms)\n", s, static_cast<double>(losses.back()),
                  step_ms.back());
  }
  const double seconds = ms_since(begin) / 1e3;
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];

  mx::save_safetensors(argv[3],
                       {{"loss", mx::array(losses.data(), {steps}, mx::float32)},
                        {"lora_a", lora_a},
                        {"lora_b", lora_b}},
                       {{"seconds", std::to_string(seconds)},
                        {"step_ms_median", std::to_string(median)}});
  std::printf("qwen35_train: %d steps in %.2f s (median %.1f ms per step, one eval each); loss "
              "%.6e -> %.6e\n",
              steps, seconds, median, static_cast<double>(losses.front()),
              static_cast<double>(losses.back()));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mlxk::Error &error) {
    std::fprintf(stderr, "qwen35_train: mlxkern error %s: %s\n", error.status_name(),
                 error.message().c_str());
  } catch (const std::exception &error) {
    std::fprintf(stderr, "qwen35_train: %s\n", error.what());
  }
  return 2;
}
