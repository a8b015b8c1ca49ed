// One Qwen3.5 Gated DeltaNet layer (mlx-lm 0.32.2 `qwen3_5.GatedDeltaNet`) for a bfloat16
// model (or a float32 one: the weights' dtype is the model's), batch 1, written the way an
// engine on MLX's C++ API writes it: the dense parts are MLX ops, the Gated DeltaNet parts are
// mlxkern's kernels, and the arrays go back and forth without a copy (mlxk::Array::from_mlx /
// to_mlx), so one step is ONE lazy MLX graph and the caller evaluates it with ONE mx::eval (the
// output, the recurrent state and the conv state together):
//
//   MLX ops     qkv, z, b, a = x·W_qkv^T, x·W_z^T, x·W_b^T, x·W_a^T         (nn.Linear)
//               conv_in      = concatenate(conv_state, qkv)                 (conv state: K-1 rows)
//               conv_out     = conv1d(conv_in, w, groups = conv_dim)        (depthwise, causal)
//   mlxkern     y, state     = mlxk_gated_delta_update_from_conv(conv_out, ..., a, b, A_log,
//                              dt_bias, state): the head split (SiLU, split, normalize_qk) and
//                              the recurrence in one call; for a verify window, whose q, k, v
//                              the replay needs, q, k, v = mlxk_silu_rms_heads(conv_out), then
//                              mlxk_gated_delta_update (mlxk_gated_delta_update_chunked for a
//                              long prefill, on request)
//               normed       = mlxk_gated_rms_norm(y, z, norm.weight)
//   MLX op      out          = normed·W_out^T                               (out_proj)
//
// The recurrent state [1, Hv, Dv, Dk] float32 and the conv state [1, K-1, conv_dim] (the
// model's dtype) are MLX arrays owned by the layer and replaced by each step's (lazy) results;
// once the layer drops the old state, the graph holds its last reference and the CPU kernel
// writes the new state into the old buffer.
//
// Training: sequence() runs the layer over a batch of whole sequences from zero states, with an
// optional low-rank adapter (LoRA) on in_proj_qkv, as a pure function of its inputs. The
// kernels are nodes of MLX's graph with backward nodes of their own, so mx::value_and_grad of a
// loss built on sequence() differentiates through the gated norm, the recurrence, the head
// split, the conv and the projection (qwen35_train.cpp).
//
// Speculative decoding: verify() runs a draft window from the current state and keeps a
// checkpoint (the pre-verify state, the conv input, the window's k, v, a, b); accept(m) keeps
// the first m tokens: the recurrent state is replayed from the checkpoint with
// mlxk_gated_delta_state and the conv state cut from the checkpoint's conv input, lazily, so
// the rollback is computed by the next step's eval.
//
// Needs MLX's headers (C++20) and libmlx, the one libmlxkern links (mlxkern.h, "Sharing arrays
// with a host's MLX").
#ifndef MLXKERN_EXAMPLE_QWEN35_GDN_HPP
#define MLXKERN_EXAMPLE_QWEN35_GDN_HPP

#ifndef MLXKERN_WITH_MLX
#define MLXKERN_WITH_MLX
#endif
#include "mlxkern.hpp"

#include <mlx/mlx.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qwen35 {

namespace mx = mlx::core;

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

  /** Qwen3.5-35B-A3B's linear-attention layer. */
  static Config qwen35_35b_a3b() {
    Config config;
    config.hidden_size = 2048;
    config.key_heads = 16;
    config.value_heads = 32;
    config.key_dim = 128;
    config.value_dim = 128;
    config.conv_kernel = 4;
    config.rms_norm_eps = 1e-6f;
    return config;
  }

  /** From a checkpoint's metadata (the config.json names). */
  static Config from_metadata(const std::unordered_map<std::string, std::string> &meta) {
    auto text = [&](const char *key) -> const std::string & {
      auto it = meta.find(key);
      if (it == meta.end()) throw std::runtime_error(std::string("metadata: no ") + key);
      return it->second;
    };
    Config config;
    config.hidden_size = std::stoi(text("hidden_size"));
    config.key_heads = std::stoi(text("linear_num_key_heads"));
    config.value_heads = std::stoi(text("linear_num_value_heads"));
    config.key_dim = std::stoi(text("linear_key_head_dim"));
    config.value_dim = std::stoi(text("linear_value_head_dim"));
    config.conv_kernel = std::stoi(text("linear_conv_kernel_dim"));
    config.rms_norm_eps = std::stof(text("rms_norm_eps"));
    config.check();
    return config;
  }

  void check() const {
    if (hidden_size <= 0 || key_heads <= 0 || value_heads <= 0 || key_dim <= 0 ||
        value_dim <= 0 || conv_kernel < 2 || value_heads % key_heads != 0)
      throw std::runtime_error("inconsistent layer configuration");
  }
};

/** The layer's parameters under mlx-lm's names, as MLX arrays (a converted checkpoint:
 * bfloat16, A_log float32; or all float32). in_proj_qkv's dtype is the model's. */
struct Weights {
  mx::array in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // [out, hidden]
  mx::array conv1d;                                        // [conv_dim, K, 1]
  mx::array out_proj;                                      // [hidden, Hv*Dv]
  mx::array a_log, dt_bias, norm;                          // [Hv], [Hv], [Dv]

  /** From a loaded checkpoint (mx::load_safetensors), shapes checked. */
  static Weights from_map(const std::unordered_map<std::string, mx::array> &tensors,
                          const Config &c) {
    auto get = [&](const char *name, mx::Shape shape) {
      auto it = tensors.find(name);
      if (it == tensors.end()) throw std::runtime_error(std::string("weights: no ") + name);
      if (it->second.shape() != shape)
        throw std::runtime_error(std::string("weights: ") + name + ": unexpected shape");
      return it->second;
    };
    return Weights{get("in_proj_qkv.weight", {c.conv_dim(), c.hidden_size}),
                   get("in_proj_z.weight", {c.value_width(), c.hidden_size}),
                   get("in_proj_b.weight", {c.value_heads, c.hidden_size}),
                   get("in_proj_a.weight", {c.value_heads, c.hidden_size}),
                   get("conv1d.weight", {c.conv_dim(), c.conv_kernel, 1}),
                   get("out_proj.weight", {c.hidden_size, c.value_width()}),
                   get("A_log", {c.value_heads}),
                   get("dt_bias", {c.value_heads}),
                   get("norm.weight", {c.value_dim})};
  }

  /** Random weights of a plausible scale (nn.Linear / Conv1d's uniform +-1/sqrt(fan_in);
   * decay rates with g = exp(-A softplus(a + dt_bias)) mostly in (0.2, 1)). */
  static Weights random(const Config &c, std::uint64_t seed) {
    mx::array key = mx::random::key(seed);
    auto next = [&key]() {
      auto split = mx::random::split(key);
      key = split.first;
      return split.second;
    };
    auto linear = [&](int out, int in) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(in));
      return mx::random::uniform(-bound, bound, {out, in}, mx::bfloat16, next());
    };
    const float conv_bound = 1.0f / std::sqrt(static_cast<float>(c.conv_kernel));
    return Weights{
        linear(c.conv_dim(), c.hidden_size),
        linear(c.value_width(), c.hidden_size),
        linear(c.value_heads, c.hidden_size),
        linear(c.value_heads, c.hidden_size),
        mx::random::uniform(-conv_bound, conv_bound, {c.conv_dim(), c.conv_kernel, 1},
                            mx::bfloat16, next()),
        linear(c.hidden_size, c.value_width()),
        mx::log(mx::random::uniform(0.02f, 1.0f, {c.value_heads}, mx::float32, next())),
        mx::astype(mx::multiply(mx::random::normal({c.value_heads}, mx::float32, next()),
                                mx::array(0.5f)),
                   mx::bfloat16),
        mx::astype(mx::add(mx::array(1.0f),
                           mx::multiply(mx::random::normal({c.value_dim}, mx::float32, next()),
                                        mx::array(0.2f))),
                   mx::bfloat16)};
  }

  [[nodiscard]] std::vector<mx::array> all() const {
    return {in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, out_proj, a_log, dt_bias, norm};
  }
};

/** A low-rank adapter on a projection, as mlx-lm's LoRALinear computes it (without dropout):
 * y = x W^T + scale * ((x A) B), with A [in, rank] and B [rank, out]. */
struct LoRA {
  mx::array a;  // [in, rank]
  mx::array b;  // [rank, out]
  float scale = 1.0f;
};

/** Which recurrence a step runs: the exact one (decode, speculative verify; bit-identical
 * across call patterns) or the chunked (WY) form (faster long prefill on the CPU, equal up to
 * float32 rounding). */
enum class Recurrence { Exact, Chunked };

/** A step's dense inputs of the kernels (lazy MLX arrays). */
struct Projections {
  mx::array qkv;  // [B, T, conv_dim]
  mx::array z;    // [B, T, Hv, Dv]
  mx::array b;    // [B, T, Hv]
  mx::array a;    // [B, T, Hv]
};

struct Conv {
  mx::array input;       // [B, K-1+T, conv_dim]: the conv state, then the step's qkv
  mx::array out;         // [B, T, conv_dim], before SiLU (the head split applies it)
  mx::array next_state;  // [B, K-1, conv_dim]: the last K-1 rows of input
};

/** The kernels' results: MLX arrays for the host's graph, and the head split's handles (the
 * speculative checkpoint keeps k and v for the replay). */
struct KernelResults {
  mx::array normed;  // [B, T, Hv, Dv], the model's dtype
  mx::array state;   // [B, Hv, Dv, Dk] float32
  mlxk::HeadSplit heads;
};

/** The inputs mlxkern's kernels take besides the step's arrays: handles made once. */
struct KernelParams {
  mlxk::Array a_log, dt_bias, norm_weight, q_scale, k_scale;
  float qk_eps = 0;
};

class GatedDeltaNet {
 public:
  GatedDeltaNet(const Config &config, Weights weights)
      : config_(config),
        w_(std::move(weights)),
        state_(mx::zeros({1, config.value_heads, config.value_dim, config.key_dim}, mx::float32)),
        conv_state_(mx::zeros({1, config.conv_kernel - 1, config.conv_dim()},
                              w_.in_proj_qkv.dtype())) {
    config_.check();
    const mx::Dtype dtype = w_.in_proj_qkv.dtype();
    if (w_.norm.dtype() != dtype) w_.norm = mx::astype(w_.norm, dtype);
    // mlx-lm's normalize_qk(q, k, inv_scale = Dk**-0.5, eps = 1e-6):
    //   q = inv_scale**2 * rms_norm(q, eps * inv_scale**2); k = inv_scale * rms_norm(k, ...)
    // The Python scalars multiply an array of the model's dtype, so each is rounded to it
    // first; the rms_norm eps is a float32 (the double product rounded once).
    const double inv_scale = std::pow(static_cast<double>(config.key_dim), -0.5);
    const double inv_scale_sq = std::pow(inv_scale, 2.0);
    mx::array q_scale = mx::full({config.key_dim}, static_cast<float>(inv_scale_sq), dtype);
    mx::array k_scale = mx::full({config.key_dim}, static_cast<float>(inv_scale), dtype);
    std::vector<mx::array> ready = w_.all();
    ready.insert(ready.end(), {q_scale, k_scale, state_, conv_state_});
    mx::eval(ready);  // the weights (a checkpoint loads lazily) and the zero states, once
    params_.a_log = mlxk::Array::from_mlx(w_.a_log);
    params_.dt_bias = mlxk::Array::from_mlx(w_.dt_bias);
    params_.norm_weight = mlxk::Array::from_mlx(w_.norm);
    params_.q_scale = mlxk::Array::from_mlx(q_scale);
    params_.k_scale = mlxk::Array::from_mlx(k_scale);
    params_.qk_eps = static_cast<float>(1e-6 * inv_scale_sq);
  }

  [[nodiscard]] const Config &config() const { return config_; }
  [[nodiscard]] const Weights &weights() const { return w_; }
  [[nodiscard]] const KernelParams &kernel_params() const { return params_; }

  /** The recurrent state [1, Hv, Dv, Dk] float32 after the committed tokens (lazy until the
   * step's eval). */
  [[nodiscard]] const mx::array &state() const { return state_; }
  /** The conv state [1, K-1, conv_dim] in the model's dtype (lazy until the step's eval). */
  [[nodiscard]] const mx::array &conv_state() const { return conv_state_; }

  /** What one eval must compute after a step: its output and the layer's two states. */
  [[nodiscard]] std::vector<mx::array> step_outputs(const mx::array &out) const {
    return {out, state_, conv_state_};
  }

  /** The layer over x [1, T, hidden] (the model's dtype) from the current states, committing
   * the tokens.
   * Lazy: returns the output [1, T, hidden]; evaluate it with state() and conv_state(). */
  mx::array forward(const mx::array &x, Recurrence recurrence = Recurrence::Exact) {
    if (pending_) throw std::logic_error("forward() during a verify: call accept() first");
    const Projections p = project(x);
    const Conv c = conv(conv_state_, p.qkv);
    KernelResults k = kernels(c.out, p.a, p.b, p.z, state_, recurrence);
    // The layer lets go of the old state: the graph holds its last reference, and the kernel
    // writes the new state into its buffer.
    state_ = k.state;
    conv_state_ = c.next_state;
    return out_proj(k.normed);
  }

  /** The layer over whole sequences x [B, T, hidden] from zero states (no conv history, a zero
   * recurrent state), with `qkv_adapter` (if given) added to in_proj_qkv. Leaves the layer's
   * states alone: a pure function of x and the adapter's arrays, which is what a training step
   * differentiates (mx::value_and_grad over the adapter's A and B: the gradient flows back
   * through out_proj, the gated norm, the recurrence, the head split, the conv and the
   * adapter). Lazy: returns the output [B, T, hidden]. */
  [[nodiscard]] mx::array sequence(const mx::array &x, const LoRA *qkv_adapter = nullptr,
                                   Recurrence recurrence = Recurrence::Exact) const {
    const Config &c = config_;
    const int batch = x.shape(0);
    const Projections p = project(x, qkv_adapter);
    const Conv cv = conv(mx::zeros({batch, c.conv_kernel - 1, c.conv_dim()}, p.qkv.dtype()), p.qkv);
    const mx::array state = mx::zeros({batch, c.value_heads, c.value_dim, c.key_dim}, mx::float32);
    const KernelResults k = kernels(cv.out, p.a, p.b, p.z, state, recurrence);
    return out_proj(k.normed);
  }

  /** Runs a draft window x [1, T, hidden] from the current states and keeps a checkpoint for
   * accept(). Lazy, as forward(). */
  mx::array verify(const mx::array &x) {
    if (pending_) throw std::logic_error("verify() during a verify: call accept() first");
    const Projections p = project(x);
    const Conv c = conv(conv_state_, p.qkv);
    KernelResults k = kernels(c.out, p.a, p.b, p.z, state_, Recurrence::Exact, /*keep_heads=*/true);
    pending_.emplace(Pending{x.shape(1), state_, c.input, std::move(k.heads), p.a, p.b});
    state_ = k.state;
    conv_state_ = c.next_state;
    return out_proj(k.normed);
  }

  /** Keeps the first `accepted` tokens of the last verify window (0 <= accepted <= T): the
   * recurrent state is replayed from the checkpoint (mlxk_gated_delta_state) and the conv
   * state cut from the checkpoint's conv input. Lazy: the next eval of state() computes it.
   * With `identical`, also builds a lazy bool scalar: whether the replayed state equals, bit
   * for bit, mlxk_gated_delta_update run directly over the accepted prefix (the library's
   * contract; an example's check, not something an engine needs). */
  void accept(int accepted, mx::array *identical = nullptr) {
    if (!pending_) throw std::logic_error("accept() without a verify");
    if (accepted < 0 || accepted > pending_->tokens)
      throw std::invalid_argument("accept: accepted length outside the verify window");
    Pending pending = std::move(*pending_);
    pending_.reset();
    if (identical != nullptr) *identical = mx::array(true);
    if (accepted == pending.tokens) return;  // the states after the window are already there

    const mlxk::Array before = mlxk::Array::from_mlx(pending.state_before);
    const mlxk::Array a = mlxk::Array::from_mlx(pending.a);
    const mlxk::Array b = mlxk::Array::from_mlx(pending.b);
    mx::array replayed =
        mlxk::gated_delta_state(pending.heads.k, pending.heads.v, a, b, params_.a_log,
                                params_.dt_bias, &before, {accepted})
            .to_mlx();
    if (identical != nullptr) {
      mx::array direct = before.to_mlx();
      if (accepted > 0) {
        auto prefix = [accepted](const mx::array &t) {
          mx::Shape stop = t.shape();
          stop[1] = accepted;
          return mlxk::Array::from_mlx(mx::slice(t, mx::Shape(t.ndim(), 0), stop));
        };
        direct = mlxk::gated_delta_update(prefix(pending.heads.q.to_mlx()),
                                          prefix(pending.heads.k.to_mlx()),
                                          prefix(pending.heads.v.to_mlx()), prefix(pending.a),
                                          prefix(pending.b), params_.a_log, params_.dt_bias,
                                          &before)
                     .state.to_mlx();
      }
      *identical = mx::array_equal(mx::view(replayed, mx::uint32), mx::view(direct, mx::uint32));
    }
    state_ = std::move(replayed);
    const int window = config_.conv_kernel - 1;
    conv_state_ = mx::contiguous(mx::slice(pending.conv_input, {0, accepted, 0},
                                           {1, accepted + window, config_.conv_dim()}));
  }

  // --- the step's parts (forward() composes them; public for benchmarks and tests) ---

  /** The four input projections of x [B, T, hidden] (MLX ops; nn.Linear without bias), with
   * `qkv_adapter` (if given) on in_proj_qkv as mlx-lm's LoRALinear adds it:
   * x W^T + (scale * ((x A) B)).astype(x.dtype). */
  [[nodiscard]] Projections project(const mx::array &x, const LoRA *qkv_adapter = nullptr) const {
    const int tokens = x.shape(1);
    auto linear = [&x](const mx::array &w) { return mx::matmul(x, mx::transpose(w)); };
    mx::array qkv = linear(w_.in_proj_qkv);
    if (qkv_adapter != nullptr) {
      const mx::array low_rank = mx::matmul(mx::matmul(x, qkv_adapter->a), qkv_adapter->b);
      // A Python float times an array: a scalar of the array's dtype.
      qkv = mx::add(qkv, mx::astype(mx::multiply(mx::array(qkv_adapter->scale, low_rank.dtype()),
                                                 low_rank),
                                    x.dtype()));
    }
    return Projections{std::move(qkv),
                       mx::reshape(linear(w_.in_proj_z),
                                   {x.shape(0), tokens, config_.value_heads, config_.value_dim}),
                       linear(w_.in_proj_b), linear(w_.in_proj_a)};
  }

  /** The depthwise causal conv over [conv_state | qkv] (MLX ops). */
  [[nodiscard]] Conv conv(const mx::array &conv_state, const mx::array &qkv) const {
    const int window = config_.conv_kernel - 1;
    mx::array input = mx::concatenate({conv_state, qkv}, 1);
    const int rows = input.shape(1);
    mx::array next = mx::contiguous(
        mx::slice(input, {0, rows - window, 0}, {input.shape(0), rows, config_.conv_dim()}));
    mx::array out = mx::conv1d(input, w_.conv1d, /*stride=*/1, /*padding=*/0, /*dilation=*/1,
                               /*groups=*/config_.conv_dim());
    return Conv{std::move(input), std::move(out), std::move(next)};
  }

  /** Head split, recurrence and gated norm (mlxkern's kernels on the host's arrays, lazy).
   * `keep_heads`: the head split's q, k, v are needed afterwards (a verify's checkpoint);
   * otherwise the exact recurrence takes them straight from the conv output
   * (mlxk_gated_delta_update_from_conv: the same bits; on a GPU one kernel node for a decode
   * step instead of two). */
  [[nodiscard]] KernelResults kernels(const mx::array &conv_out, const mx::array &a,
                                      const mx::array &b, const mx::array &z,
                                      const mx::array &state, Recurrence recurrence,
                                      bool keep_heads = false) const {
    const Config &c = config_;
    const mlxk::Array h_conv = mlxk::Array::from_mlx(conv_out);
    const mlxk::Array h_a = mlxk::Array::from_mlx(a);
    const mlxk::Array h_b = mlxk::Array::from_mlx(b);
    const mlxk::Array h_state = mlxk::Array::from_mlx(state);
    mlxk::HeadSplit heads;
    mlxk::DeltaUpdate update;
    if (recurrence == Recurrence::Exact && !keep_heads) {
      update = mlxk::gated_delta_update_from_conv(
          h_conv, params_.q_scale, params_.k_scale, c.key_heads, c.value_heads, c.value_dim,
          params_.qk_eps, h_a, h_b, params_.a_log, params_.dt_bias, &h_state);
    } else {
      heads = mlxk::silu_rms_heads(h_conv, params_.q_scale, params_.k_scale, c.key_heads,
                                   c.value_heads, c.value_dim, params_.qk_eps);
      update = recurrence == Recurrence::Chunked
                   ? mlxk::gated_delta_update_chunked(heads.q, heads.k, heads.v, h_a, h_b,
                                                      params_.a_log, params_.dt_bias, &h_state)
                   : mlxk::gated_delta_update(heads.q, heads.k, heads.v, h_a, h_b,
                                              params_.a_log, params_.dt_bias, &h_state);
    }
    const mlxk::Array normed = mlxk::gated_rms_norm(update.y, mlxk::Array::from_mlx(z),
                                                    params_.norm_weight, c.rms_norm_eps);
    return KernelResults{normed.to_mlx(), update.state.to_mlx(), std::move(heads)};
  }

  /** out_proj over the gated norm's output [B, T, Hv, Dv] (an MLX op). */
  [[nodiscard]] mx::array out_proj(const mx::array &normed) const {
    return mx::matmul(mx::reshape(normed, {normed.shape(0), normed.shape(1), -1}),
                      mx::transpose(w_.out_proj));
  }

 private:
  struct Pending {
    int tokens = 0;
    mx::array state_before;
    mx::array conv_input;
    mlxk::HeadSplit heads;
    mx::array a, b;
  };

  Config config_;
  Weights w_;
  KernelParams params_;
  mx::array state_;       // [1, Hv, Dv, Dk] float32
  mx::array conv_state_;  // [1, K-1, conv_dim], the model's dtype
  std::optional<Pending> pending_;
};

}  // namespace qwen35

#endif  // MLXKERN_EXAMPLE_QWEN35_GDN_HPP
