// A Qwen3.5 Gated DeltaNet layer tensor-parallel across the ranks of MLX's own distributed
// layer (mx::distributed: ring over TCP, MPI, NCCL on CUDA, JACCL on Thunderbolt Macs), the way
// an engine that outgrows one device shards it:
//
//   - every kernel of the layer is per head, so rank r of R owns key heads
//     [r Hk/R, (r+1) Hk/R) and value heads [r Hv/R, (r+1) Hv/R). With Hv = g Hk, value head h
//     reads key head h / g, so a contiguous split keeps each GQA group on one rank (Hk % R == 0);
//   - the rank's rows of in_proj_qkv (its q, k and v channels), of conv1d (the same channels:
//     the conv is depthwise), of in_proj_z / in_proj_b / in_proj_a, of A_log and dt_bias, and
//     its columns of out_proj; norm.weight (per Dv) is whole on every rank;
//   - per rank it keeps a recurrent state pool [N, Hv/R, Dv, Dk] float32 (mlxkern's pool calls:
//     slots name sequences, the same slot on every rank) and a conv state pool
//     [N, K-1, conv_dim/R] in the model's dtype;
//   - a step is the one-process layer on the rank's heads: MLX ops for the projections and the
//     conv, mlxk_gated_delta_update_from_conv_pool (or the head split and
//     mlxk_gated_delta_update_pool_chunked for a long prefill), mlxk_gated_rms_norm, then the
//     rank's share of out_proj, and one all_sum across ranks gives the layer's output. Nothing
//     else crosses ranks: x goes to every rank whole, the states never move;
//   - a speculative round is verify() (mlxk_gated_delta_verify_pool on the rank's heads, the
//     same all_sum) and accept() (mlxk_gated_delta_state_pool and the conv state cut from the
//     window), every rank given the same accepted lengths.
//
// The all_sum runs on the partial products in float32 (Reduce::Float32: each rank's matmul
// over its Hv/R * Dv inputs kept in float32, summed, rounded to the model's dtype once, as the
// one-process matmul rounds its float32 sum once) or in the model's dtype (Reduce::Model: half
// the bytes on the wire, one more rounding per rank).
//
// Needs MLX's headers (C++20) and libmlx, the one libmlxkern links.
#ifndef MLXKERN_EXAMPLE_QWEN35_TP_HPP
#define MLXKERN_EXAMPLE_QWEN35_TP_HPP

#include "qwen35_gdn.hpp"

#include <mlx/distributed/distributed.h>
#include <mlx/distributed/ops.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace qwen35 {

/** Which dtype the all_sum after out_proj runs in. */
enum class Reduce { Float32, Model };

/** Rank `rank` of `ranks`: its heads and its channels of the conv dimension. */
struct Shard {
  int ranks = 1;
  int rank = 0;

  /** Throws std::invalid_argument naming the argument when the layer cannot be split so. */
  void check(const Config &c) const {
    if (ranks < 1)
      throw std::invalid_argument("ranks: " + std::to_string(ranks) + ", expected at least 1");
    if (rank < 0 || rank >= ranks)
      throw std::invalid_argument("rank: " + std::to_string(rank) + ", expected 0 <= rank < " +
                                  std::to_string(ranks));
    if (c.key_heads % ranks != 0)
      throw std::invalid_argument("ranks: " + std::to_string(ranks) + " does not divide the " +
                                  std::to_string(c.key_heads) +
                                  " key heads (each rank holds whole GQA groups)");
  }

  /** The rank's layer: Hk/R key heads and Hv/R value heads, the rest unchanged. */
  [[nodiscard]] Config local(const Config &c) const {
    Config l = c;
    l.key_heads = c.key_heads / ranks;
    l.value_heads = c.value_heads / ranks;
    return l;
  }

  /** The rank's channels of a tensor whose `axis` runs over the conv dimension
   * ([q | k | v] = [Hk Dk | Hk Dk | Hv Dv]): its q, its k and its v channels, in that order. */
  [[nodiscard]] mx::array channels(const mx::array &t, const Config &c, int axis) const {
    const Config l = local(c);
    const int qk = l.key_width(), v = l.value_width();
    const int q0 = rank * qk, k0 = c.key_width() + rank * qk, v0 = 2 * c.key_width() + rank * v;
    return mx::concatenate({range(t, axis, q0, qk), range(t, axis, k0, qk), range(t, axis, v0, v)},
                           axis);
  }

  /** The rank's value heads of a tensor whose `axis` runs over Hv * `width` values. */
  [[nodiscard]] mx::array value_heads(const mx::array &t, const Config &c, int axis,
                                      int width) const {
    const int heads = c.value_heads / ranks;
    return range(t, axis, rank * heads * width, heads * width);
  }

  /** The rank's weights, contiguous (sliced from the whole layer's). */
  [[nodiscard]] Weights weights(const Weights &w, const Config &c) const {
    auto own = [](mx::array t) { return mx::contiguous(std::move(t)); };
    return Weights{own(channels(w.in_proj_qkv, c, 0)),
                   own(value_heads(w.in_proj_z, c, 0, c.value_dim)),
                   own(value_heads(w.in_proj_b, c, 0, 1)),
                   own(value_heads(w.in_proj_a, c, 0, 1)),
                   own(channels(w.conv1d, c, 0)),
                   own(value_heads(w.out_proj, c, 1, c.value_dim)),
                   own(value_heads(w.a_log, c, 0, 1)),
                   own(value_heads(w.dt_bias, c, 0, 1)),
                   w.norm};
  }

 private:
  static mx::array range(const mx::array &t, int axis, int start, int count) {
    mx::Shape begin(t.ndim(), 0), end = t.shape();
    begin[axis] = start;
    end[axis] = start + count;
    return mx::slice(t, begin, end);
  }
};

/** One rank's part of the layer over a pool of sequences. */
class TensorParallelLayer {
 public:
  /** `weights`: the whole layer's (every rank slices its own); `slots`: the pool's size N. */
  TensorParallelLayer(const Config &config, const Weights &weights, mx::distributed::Group group,
                      int slots, Reduce reduce)
      : config_(config),
        shard_{group.size(), group.rank()},
        group_(std::move(group)),
        reduce_(reduce),
        local_(checked_local(config, shard_, slots), shard_.weights(weights, config)),
        slots_(slots) {
    const Config &l = local_.config();
    const mx::Dtype dtype = local_.weights().in_proj_qkv.dtype();
    mx::array pool = mx::zeros({slots, l.value_heads, l.value_dim, l.key_dim}, mx::float32);
    conv_pool_ = mx::zeros({slots, l.conv_kernel - 1, l.conv_dim()}, dtype);
    out_proj_f32_ = mx::astype(local_.weights().out_proj, mx::float32);
    mx::eval({pool, conv_pool_, out_proj_f32_});
    pool_ = mlxk::Array::from_mlx(pool);
  }

  [[nodiscard]] const Shard &shard() const { return shard_; }
  [[nodiscard]] const Config &local_config() const { return local_.config(); }

  /** The layer over x [B, T, hidden] (B sequences of T tokens each; row b's states in slot
   * slots[b], started from zeros where fresh[b]), committing the tokens. Lazy: returns the
   * layer's output [B, T, hidden], the same on every rank; evaluate it with states(). */
  mx::array step(const mx::array &x, const std::vector<std::int32_t> &slots,
                 const std::vector<std::uint8_t> &fresh,
                 Recurrence recurrence = Recurrence::Exact) {
    check_rows(x, slots, fresh);
    const Config &l = local_.config();
    const int rows = static_cast<int>(slots.size());
    const mx::array index(slots.data(), {rows}, mx::int32);

    // The rows' conv states: gathered from the pool, zeros where fresh.
    const mx::array is_fresh = mx::reshape(
        mx::not_equal(mx::array(fresh.begin(), {rows}, mx::uint8), mx::array(0, mx::uint8)),
        {rows, 1, 1});
    const mx::array conv_state =
        mx::where(is_fresh, mx::zeros({1, 1, 1}, conv_pool_.dtype()),
                  mx::take(conv_pool_, index, 0));

    const Projections p = local_.project(x);
    const Conv c = local_.conv(conv_state, p.qkv);
    const KernelParams &k = local_.kernel_params();
    const mlxk::Array h_conv = mlxk::Array::from_mlx(c.out);
    const mlxk::Array h_a = mlxk::Array::from_mlx(p.a);
    const mlxk::Array h_b = mlxk::Array::from_mlx(p.b);
    mlxk::PoolUpdate update;
    if (recurrence == Recurrence::Exact) {
      update = mlxk::gated_delta_update_from_conv_pool(
          h_conv, k.q_scale, k.k_scale, l.key_heads, l.value_heads, l.value_dim, k.qk_eps, h_a,
          h_b, k.a_log, k.dt_bias, pool_, slots, fresh);
    } else {
      const mlxk::HeadSplit heads = mlxk::silu_rms_heads(h_conv, k.q_scale, k.k_scale,
                                                         l.key_heads, l.value_heads, l.value_dim,
                                                         k.qk_eps);
      update = mlxk::gated_delta_update_pool_chunked(heads.q, heads.k, heads.v, h_a, h_b,
                                                     k.a_log, k.dt_bias, pool_, slots, fresh);
    }
    // The old pool handle goes: the kernel writes the rows' states into its buffer.
    pool_ = std::move(update.pool);
    conv_pool_ = mx::scatter(conv_pool_, index, mx::expand_dims(c.next_state, 1), 0);
    const mx::array normed =
        mlxk::gated_rms_norm(update.y, mlxk::Array::from_mlx(p.z), k.norm_weight, l.rms_norm_eps)
            .to_mlx();

    return reduce(normed);
  }

  /** Speculative verify of a draft window x [B, T, hidden] (row b's sequence in slot
   * slots[b]): the layer's output for every draft, from the slots' states, writing no state
   * (mlxk_gated_delta_verify_pool on the rank's heads). Keeps the window's k, v, gates and
   * conv input on this rank for accept(). Lazy, as step(). */
  mx::array verify(const mx::array &x, const std::vector<std::int32_t> &slots) {
    if (pending_) throw std::logic_error("verify() during a verify: call accept() first");
    const std::vector<std::uint8_t> none(slots.size(), 0);
    check_rows(x, slots, none);
    const Config &l = local_.config();
    const mx::array index(slots.data(), {static_cast<int>(slots.size())}, mx::int32);
    const Projections p = local_.project(x);
    const Conv c = local_.conv(mx::take(conv_pool_, index, 0), p.qkv);
    const KernelParams &k = local_.kernel_params();
    const mlxk::Array h_a = mlxk::Array::from_mlx(p.a);
    const mlxk::Array h_b = mlxk::Array::from_mlx(p.b);
    mlxk::HeadSplit heads = mlxk::silu_rms_heads(mlxk::Array::from_mlx(c.out), k.q_scale,
                                                 k.k_scale, l.key_heads, l.value_heads,
                                                 l.value_dim, k.qk_eps);
    const mlxk::Array y = mlxk::gated_delta_verify_pool(heads.q, heads.k, heads.v, h_a, h_b,
                                                        k.a_log, k.dt_bias, pool_, slots, none);
    pending_.emplace(Pending{slots, std::move(heads), p.a, p.b, c.input});
    return reduce(mlxk::gated_rms_norm(y, mlxk::Array::from_mlx(p.z), k.norm_weight,
                                       l.rms_norm_eps)
                      .to_mlx());
  }

  /** Commits the first accepted[b] tokens of row b's verify window (0 <= accepted[b] <= T):
   * mlxk_gated_delta_state_pool replays them into the row's slot on the rank's heads, and the
   * conv state is cut from the window's conv input. Every rank must be given the same lengths.
   * Lazy: the next eval of states() computes it. */
  void accept(const std::vector<std::int32_t> &accepted) {
    if (!pending_) throw std::logic_error("accept() without a verify");
    Pending pending = std::move(*pending_);
    pending_.reset();
    const int rows = static_cast<int>(pending.slots.size());
    const int window = local_.config().conv_kernel - 1;
    const int tokens = pending.conv_input.shape(1) - window;
    if (accepted.size() != pending.slots.size())
      throw std::invalid_argument("accepted: " + std::to_string(accepted.size()) +
                                  " lengths for " + std::to_string(rows) + " rows");
    std::vector<mx::array> conv_rows;
    for (int b = 0; b < rows; ++b) {
      const int m = accepted[static_cast<size_t>(b)];
      if (m < 0 || m > tokens)
        throw std::invalid_argument("accepted: " + std::to_string(m) + " for row " +
                                    std::to_string(b) + ", expected 0.." +
                                    std::to_string(tokens));
      conv_rows.push_back(mx::slice(pending.conv_input, {b, m, 0},
                                    {b + 1, m + window, pending.conv_input.shape(2)}));
    }
    const KernelParams &k = local_.kernel_params();
    pool_ = mlxk::gated_delta_state_pool(pending.heads.k, pending.heads.v,
                                         mlxk::Array::from_mlx(pending.a),
                                         mlxk::Array::from_mlx(pending.b), k.a_log, k.dt_bias,
                                         pool_, pending.slots, accepted,
                                         std::vector<std::uint8_t>(pending.slots.size(), 0));
    const mx::array index(pending.slots.data(), {rows}, mx::int32);
    conv_pool_ = mx::scatter(conv_pool_, index,
                             mx::expand_dims(mx::concatenate(conv_rows, 0), 1), 0);
  }

  /** The rank's two pools (lazy until the step's eval). */
  [[nodiscard]] std::vector<mx::array> states() const { return {pool_.to_mlx(), conv_pool_}; }

  /** Slot `slot`'s recurrent state [Hv/R, Dv, Dk] and conv state [K-1, conv_dim/R]. */
  [[nodiscard]] std::pair<mx::array, mx::array> slot_states(int slot) const {
    const mx::array index(slot);
    return {mx::take(pool_.to_mlx(), index, 0), mx::take(conv_pool_, index, 0)};
  }

 private:
  static Config checked_local(const Config &config, const Shard &shard, int slots) {
    config.check();
    shard.check(config);
    if (slots < 1)
      throw std::invalid_argument("slots: " + std::to_string(slots) + ", expected at least 1");
    return shard.local(config);
  }

  /** The rank's share of out_proj over the gated norm's output [B, T, Hv/R, Dv], then the one
   * exchange of the step. */
  [[nodiscard]] mx::array reduce(const mx::array &normed) const {
    if (reduce_ == Reduce::Model) {
      return mx::distributed::all_sum(local_.out_proj(normed), group_);
    }
    const mx::array flat = mx::reshape(normed, {normed.shape(0), normed.shape(1), -1});
    const mx::array partial =
        mx::matmul(mx::astype(flat, mx::float32), mx::transpose(out_proj_f32_));
    return mx::astype(mx::distributed::all_sum(partial, group_), normed.dtype());
  }

  void check_rows(const mx::array &x, const std::vector<std::int32_t> &slots,
                  const std::vector<std::uint8_t> &fresh) const {
    if (x.ndim() != 3 || x.shape(2) != config_.hidden_size)
      throw std::invalid_argument("x: expected [B, T, " + std::to_string(config_.hidden_size) +
                                  "]");
    if (slots.size() != static_cast<size_t>(x.shape(0)))
      throw std::invalid_argument("slots: " + std::to_string(slots.size()) +
                                  " slots for B = " + std::to_string(x.shape(0)) + " rows");
    if (fresh.size() != slots.size())
      throw std::invalid_argument("fresh: " + std::to_string(fresh.size()) + " flags for " +
                                  std::to_string(slots.size()) + " slots");
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0 || slots[i] >= slots_)
        throw std::invalid_argument("slots: slot " + std::to_string(slots[i]) +
                                    " outside the pool of " + std::to_string(slots_));
      for (size_t j = 0; j < i; ++j)
        if (slots[j] == slots[i])
          throw std::invalid_argument("slots: slot " + std::to_string(slots[i]) + " twice");
    }
  }

  struct Pending {
    std::vector<std::int32_t> slots;
    mlxk::HeadSplit heads;
    mx::array a, b;
    mx::array conv_input;
  };

  Config config_;
  Shard shard_;
  mx::distributed::Group group_;
  Reduce reduce_;
  GatedDeltaNet local_;  // the rank's heads: projections, conv, kernel parameters, out_proj
  int slots_;
  mlxk::Array pool_;           // [N, Hv/R, Dv, Dk] float32
  mx::array conv_pool_{0.0f};  // [N, K-1, conv_dim/R], the model's dtype
  mx::array out_proj_f32_{0.0f};
  std::optional<Pending> pending_;
};

}  // namespace qwen35

#endif  // MLXKERN_EXAMPLE_QWEN35_TP_HPP
