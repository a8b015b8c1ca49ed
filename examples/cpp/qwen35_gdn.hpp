// One Qwen3.5 Gated DeltaNet layer (mlx-lm 0.32.2 `qwen3_5.GatedDeltaNet`) for a bfloat16
// model, batch 1: the dense parts (input projections, depthwise causal conv, out_proj) in plain
// C++, the rest through mlxkern:
//
//   qkv, z, b, a = x·W_qkv^T, x·W_z^T, x·W_b^T, x·W_a^T    (f32 sums, rounded once to bf16)
//   conv_in      = [conv window (K-1 tokens) | qkv]          (window carried across calls)
//   conv_out[t]  = bf16( sum_j w[:, j] * conv_in[t + j] )    (f32 sum, rounded once)
//   q, k, v      = mlxk_silu_rms_heads(conv_out)             (SiLU + split + normalize_qk)
//   y, state     = mlxk_gated_delta_update(q, k, v, a, b, A_log, dt_bias, state)
//   out          = mlxk_gated_rms_norm(y, z, norm.weight) · W_out^T
//
// Speculative decoding: verify() runs a draft window from the current state and keeps a
// checkpoint (the pre-verify state, the conv input and the window's k, v, a, b); accept(m)
// then keeps the first m tokens: the recurrent state is replayed from the checkpoint with
// mlxk_gated_delta_state and the conv window is cut from the checkpoint's conv input.
#ifndef MLXKERN_EXAMPLE_QWEN35_GDN_HPP
#define MLXKERN_EXAMPLE_QWEN35_GDN_HPP

#include "mlxkern.hpp"
#include "safetensors.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace qwen35 {

/** The TextModelArgs fields GatedDeltaNet reads. */
struct Config {
  int hidden_size = 0;
  int key_heads = 0;      // linear_num_key_heads (Hk)
  int value_heads = 0;    // linear_num_value_heads (Hv)
  int key_dim = 0;        // linear_key_head_dim (Dk)
  int value_dim = 0;      // linear_value_head_dim (Dv)
  int conv_kernel = 0;    // linear_conv_kernel_dim (K)
  float rms_norm_eps = 0; // the gated norm's eps

  [[nodiscard]] int key_width() const { return key_heads * key_dim; }
  [[nodiscard]] int value_width() const { return value_heads * value_dim; }
  [[nodiscard]] int conv_dim() const { return 2 * key_width() + value_width(); }

  /** From a checkpoint's metadata (the config.json names). */
  static Config from_metadata(const safetensors::File &file) {
    auto integer = [&](const char *key) { return std::stoi(file.meta(key)); };
    Config config;
    config.hidden_size = integer("hidden_size");
    config.key_heads = integer("linear_num_key_heads");
    config.value_heads = integer("linear_num_value_heads");
    config.key_dim = integer("linear_key_head_dim");
    config.value_dim = integer("linear_value_head_dim");
    config.conv_kernel = integer("linear_conv_kernel_dim");
    config.rms_norm_eps = std::stof(file.meta("rms_norm_eps"));
    if (config.hidden_size <= 0 || config.key_heads <= 0 || config.value_heads <= 0 ||
        config.key_dim <= 0 || config.value_dim <= 0 || config.conv_kernel < 2 ||
        config.value_heads % config.key_heads != 0)
      throw std::runtime_error("checkpoint metadata: inconsistent layer configuration");
    return config;
  }
};

/** A tensor's elements as floats (F32, BF16 or F16; exact). */
inline std::vector<float> to_floats(const safetensors::Tensor &tensor) {
  const size_t n = tensor.elements();
  std::vector<float> out(n);
  if (tensor.dtype == "F32") {
    std::memcpy(out.data(), tensor.data.data(), n * 4);
  } else if (tensor.dtype == "BF16" || tensor.dtype == "F16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, tensor.data.data() + 2 * i, 2);
      out[i] = tensor.dtype == "BF16" ? mlxk::float_from_bf16(bits) : mlxk::float_from_f16(bits);
    }
  } else {
    throw std::runtime_error("expected a float tensor, got " + tensor.dtype);
  }
  return out;
}

/** A tensor as an mlxkern array of the same dtype and shape. */
inline mlxk::Array to_array(const safetensors::Tensor &tensor) {
  mlxk::Dtype dtype;
  if (tensor.dtype == "F32") dtype = mlxk::Dtype::Float32;
  else if (tensor.dtype == "BF16") dtype = mlxk::Dtype::BFloat16;
  else if (tensor.dtype == "F16") dtype = mlxk::Dtype::Float16;
  else throw std::runtime_error("unsupported tensor dtype " + tensor.dtype);
  mlxk::Shape shape;
  for (int64_t dim : tensor.shape) shape.push_back(static_cast<int32_t>(dim));
  return mlxk::Array::from_bytes(tensor.data.data(), tensor.data.size(), shape, dtype);
}

/** out[t, o] = bf16( sum_i x[t, i] * w[o, i] ), the sum in f32 in index order: a bfloat16
 * nn.Linear without bias (MLX accumulates in f32 and rounds once). */
inline std::vector<float> linear_bf16(const std::vector<float> &x, int tokens, int in,
                                      const std::vector<float> &w, int out_features) {
  std::vector<float> out(static_cast<size_t>(tokens) * out_features);
  for (int t = 0; t < tokens; ++t) {
    const float *row = x.data() + static_cast<size_t>(t) * in;
    for (int o = 0; o < out_features; ++o) {
      const float *weights = w.data() + static_cast<size_t>(o) * in;
      float sum = 0.0f;
      for (int i = 0; i < in; ++i) sum += row[i] * weights[i];
      out[static_cast<size_t>(t) * out_features + o] = mlxk::round_bf16(sum);
    }
  }
  return out;
}

/** Wall-clock split of one call, in milliseconds. */
struct Timing {
  double projections = 0;  // C++ input projections and conv
  double kernels = 0;      // mlxkern graph building + evaluation + readback
  double out_proj = 0;     // C++ out_proj
};

class GatedDeltaNet {
 public:
  GatedDeltaNet(const Config &config, const safetensors::File &weights) : config_(config) {
    const int hidden = config.hidden_size;
    auto matrix = [&](const char *name, int rows, int cols) {
      const safetensors::Tensor &tensor = weights.at(name);
      if (tensor.shape != std::vector<int64_t>{rows, cols})
        throw std::runtime_error(std::string(name) + ": unexpected shape");
      return to_floats(tensor);
    };
    w_qkv_ = matrix("in_proj_qkv.weight", config.conv_dim(), hidden);
    w_z_ = matrix("in_proj_z.weight", config.value_width(), hidden);
    w_b_ = matrix("in_proj_b.weight", config.value_heads, hidden);
    w_a_ = matrix("in_proj_a.weight", config.value_heads, hidden);
    w_out_ = matrix("out_proj.weight", hidden, config.value_width());
    const safetensors::Tensor &conv = weights.at("conv1d.weight");
    if (conv.shape != std::vector<int64_t>{config.conv_dim(), config.conv_kernel, 1})
      throw std::runtime_error("conv1d.weight: expected [conv_dim, K, 1]");
    conv_weight_ = to_floats(conv);

    a_log_ = to_array(weights.at("A_log"));      // float32 in a converted checkpoint
    dt_bias_ = to_array(weights.at("dt_bias"));  // bfloat16
    norm_weight_ = to_array(weights.at("norm.weight"));
    if (norm_weight_.dtype() != mlxk::Dtype::BFloat16)  // the kernel wants x's dtype
      norm_weight_ = norm_weight_.astype(mlxk::Dtype::BFloat16);

    // mlx-lm's normalize_qk(q, k, inv_scale = Dk**-0.5, eps = 1e-6):
    //   q = inv_scale**2 * rms_norm(q, eps * inv_scale**2); k = inv_scale * rms_norm(k, ...)
    // The Python scalars multiply a bfloat16 array, so each is rounded to bfloat16 first;
    // the rms_norm eps is a float32 (the double product rounded once).
    const double inv_scale = std::pow(static_cast<double>(config.key_dim), -0.5);
    const double inv_scale_sq = std::pow(inv_scale, 2.0);
    qk_eps_ = static_cast<float>(1e-6 * inv_scale_sq);
    const std::vector<float> q_scale(config.key_dim, static_cast<float>(inv_scale_sq));
    const std::vector<float> k_scale(config.key_dim, static_cast<float>(inv_scale));
    q_scale_ = mlxk::Array::from_bf16(q_scale, {config.key_dim});
    k_scale_ = mlxk::Array::from_bf16(k_scale, {config.key_dim});

    conv_window_.assign(static_cast<size_t>(config.conv_kernel - 1) * config.conv_dim(), 0.0f);
  }

  [[nodiscard]] const Config &config() const { return config_; }

  /** Runs `tokens` tokens x [tokens, hidden] (bfloat16 values) and commits them. */
  std::vector<float> forward(const std::vector<float> &x, int tokens, Timing *timing = nullptr) {
    if (pending_) throw std::logic_error("forward() during a verify: call accept() first");
    Step step = run(x, tokens, timing);
    conv_window_ = window_after(step.conv_input, tokens);
    return std::move(step.out);
  }

  /** Runs a draft window from the current state and keeps a checkpoint for accept(). */
  std::vector<float> verify(const std::vector<float> &x, int tokens, Timing *timing = nullptr) {
    if (pending_) throw std::logic_error("verify() during a verify: call accept() first");
    // The checkpoint keeps the start state's handle, so the kernel cannot update it in place.
    if (state_.empty()) state_ = mlxk::Array::zeros(state_shape(), mlxk::Dtype::Float32);
    Pending pending;
    Step step = run(x, tokens, timing, &pending.state_before);
    pending.tokens = tokens;
    pending.conv_input = std::move(step.conv_input);
    pending.q = std::move(step.q);
    pending.k = std::move(step.k);
    pending.v = std::move(step.v);
    pending.a = std::move(step.a);
    pending.b = std::move(step.b);
    pending_ = std::move(pending);
    return std::move(step.out);
  }

  /** Keeps the first `accepted` tokens of the last verify window (0 <= accepted <= window):
   * replays the recurrent state from the checkpoint and restores the conv window. Returns true
   * when the replayed state is bit-identical to a fresh mlxk_gated_delta_update over the
   * accepted prefix (the library's contract); the engine uses the replayed state either way. */
  bool accept(int accepted) {
    if (!pending_) throw std::logic_error("accept() without a verify");
    if (accepted < 0 || accepted > pending_->tokens)
      throw std::invalid_argument("accept: accepted length outside the verify window");
    Pending pending = std::move(*pending_);
    pending_.reset();

    mlxk::Array replayed = mlxk::gated_delta_state(pending.k, pending.v, pending.a, pending.b,
                                                   a_log_, dt_bias_, &pending.state_before,
                                                   {accepted});
    // Bit-identity check against the direct computation of the same prefix.
    std::vector<float> reference;
    if (accepted == 0) {
      reference = pending.state_before.to_floats();
    } else if (accepted == pending.tokens) {
      reference = state_.to_floats();
    } else {
      auto prefix = [accepted](const mlxk::Array &array) {
        mlxk::Shape shape = array.shape();
        const size_t per_token = array.size() / static_cast<size_t>(shape[1]);
        std::vector<uint16_t> bits = array.to_vector<uint16_t>();
        bits.resize(per_token * static_cast<size_t>(accepted));
        shape[1] = accepted;
        return mlxk::Array::from_bf16_bits(bits, shape);
      };
      mlxk::DeltaUpdate direct = mlxk::gated_delta_update(
          prefix(pending.q), prefix(pending.k), prefix(pending.v), prefix(pending.a),
          prefix(pending.b), a_log_, dt_bias_, &pending.state_before);
      reference = direct.state.to_floats();
    }
    const std::vector<float> got = replayed.to_floats();
    const bool identical = got.size() == reference.size() &&
                           std::memcmp(got.data(), reference.data(), got.size() * 4) == 0;

    state_ = std::move(replayed);
    conv_window_ = window_after(pending.conv_input, accepted);
    return identical;
  }

  /** The recurrent state [1, Hv, Dv, Dk] as floats (zeros before the first call). */
  [[nodiscard]] std::vector<float> state() const {
    if (state_.empty())
      return std::vector<float>(static_cast<size_t>(config_.value_heads) * config_.value_dim *
                                config_.key_dim, 0.0f);
    return state_.to_floats();
  }
  /** The conv window [K-1, conv_dim] (bfloat16 values). */
  [[nodiscard]] const std::vector<float> &conv_window() const { return conv_window_; }
  [[nodiscard]] mlxk::Shape state_shape() const {
    return {1, config_.value_heads, config_.value_dim, config_.key_dim};
  }

 private:
  struct Step {
    std::vector<float> out;         // [T, hidden]
    std::vector<float> conv_input;  // [K-1+T, conv_dim]
    mlxk::Array q, k, v, a, b;
  };
  struct Pending {
    int tokens = 0;
    mlxk::Array state_before;
    std::vector<float> conv_input;
    mlxk::Array q, k, v, a, b;
  };

  /** The layer over `tokens` tokens from the current state; advances state_. When `keep_old`
   * is given, the state the call started from is moved there instead of being released. */
  Step run(const std::vector<float> &x, int tokens, Timing *timing,
           mlxk::Array *keep_old = nullptr) {
    const Config &c = config_;
    const int conv_dim = c.conv_dim();
    const int window = c.conv_kernel - 1;
    if (tokens <= 0 || x.size() != static_cast<size_t>(tokens) * c.hidden_size)
      throw std::invalid_argument("x must hold tokens * hidden_size values");
    using Clock = std::chrono::steady_clock;
    auto ms = [](Clock::time_point from) {
      return std::chrono::duration<double, std::milli>(Clock::now() - from).count();
    };

    auto start = Clock::now();
    Step step;
    const std::vector<float> qkv = linear_bf16(x, tokens, c.hidden_size, w_qkv_, conv_dim);
    const std::vector<float> z = linear_bf16(x, tokens, c.hidden_size, w_z_, c.value_width());
    const std::vector<float> b = linear_bf16(x, tokens, c.hidden_size, w_b_, c.value_heads);
    const std::vector<float> a = linear_bf16(x, tokens, c.hidden_size, w_a_, c.value_heads);

    // Depthwise causal conv over [window | qkv]; tap j = K-1 is the current token.
    step.conv_input = conv_window_;
    step.conv_input.insert(step.conv_input.end(), qkv.begin(), qkv.end());
    std::vector<float> conv_out(static_cast<size_t>(tokens) * conv_dim);
    for (int t = 0; t < tokens; ++t) {
      for (int ch = 0; ch < conv_dim; ++ch) {
        float sum = 0.0f;
        for (int j = 0; j <= window; ++j)
          sum += conv_weight_[static_cast<size_t>(ch) * c.conv_kernel + j] *
                 step.conv_input[static_cast<size_t>(t + j) * conv_dim + ch];
        conv_out[static_cast<size_t>(t) * conv_dim + ch] = mlxk::round_bf16(sum);
      }
    }
    if (timing) timing->projections += ms(start);

    start = Clock::now();
    const mlxk::Array conv = mlxk::Array::from_bf16(conv_out, {1, tokens, conv_dim});
    mlxk::HeadSplit heads = mlxk::silu_rms_heads(conv, q_scale_, k_scale_, c.key_heads,
                                                 c.value_heads, c.value_dim, qk_eps_);
    step.a = mlxk::Array::from_bf16(a, {1, tokens, c.value_heads});
    step.b = mlxk::Array::from_bf16(b, {1, tokens, c.value_heads});
    mlxk::DeltaUpdate update =
        mlxk::gated_delta_update(heads.q, heads.k, heads.v, step.a, step.b, a_log_, dt_bias_,
                                 state_.empty() ? nullptr : &state_);
    const mlxk::Array gate = mlxk::Array::from_bf16(z, {1, tokens, c.value_heads, c.value_dim});
    const mlxk::Array normed = mlxk::gated_rms_norm(update.y, gate, norm_weight_, c.rms_norm_eps);
    // Drop (or hand over) the old state before evaluating: with no other owner left, the CPU
    // kernel writes the new state into the old buffer.
    if (keep_old) *keep_old = std::move(state_);
    state_ = std::move(update.state);
    const std::vector<float> y = normed.to_floats();  // evaluates the graph
    step.q = std::move(heads.q);
    step.k = std::move(heads.k);
    step.v = std::move(heads.v);
    if (timing) timing->kernels += ms(start);

    start = Clock::now();
    step.out = linear_bf16(y, tokens, c.value_width(), w_out_, c.hidden_size);
    if (timing) timing->out_proj += ms(start);
    return step;
  }

  /** The last K-1 rows of conv_input[0 .. K-1+accepted). */
  [[nodiscard]] std::vector<float> window_after(const std::vector<float> &conv_input,
                                                int accepted) const {
    const size_t width = static_cast<size_t>(config_.conv_dim());
    const size_t rows = static_cast<size_t>(config_.conv_kernel - 1);
    const size_t first = static_cast<size_t>(accepted) * width;
    return std::vector<float>(conv_input.begin() + static_cast<std::ptrdiff_t>(first),
                              conv_input.begin() + static_cast<std::ptrdiff_t>(first + rows * width));
  }

  Config config_;
  std::vector<float> w_qkv_, w_z_, w_b_, w_a_, w_out_, conv_weight_;
  mlxk::Array a_log_, dt_bias_, norm_weight_, q_scale_, k_scale_;
  float qk_eps_ = 0;
  std::vector<float> conv_window_;  // [K-1, conv_dim], bfloat16 values
  mlxk::Array state_;               // [1, Hv, Dv, Dk] float32; empty = zeros
  std::optional<Pending> pending_;
};

}  // namespace qwen35

#endif  // MLXKERN_EXAMPLE_QWEN35_GDN_HPP
