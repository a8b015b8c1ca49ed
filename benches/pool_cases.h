// The engine-shaped cases of the pool benchmarks, shared by the CPU program (benches/pool.cpp,
// `make bench`) and the MLX CUDA rows (benches/bench_cuda_pool.cc, `make bench-cuda`): the same
// inputs, schedule, checks and timing on whatever device MLX and mlxkern default to. Qwen3.5-
// 35B-A3B dims: Hk 16, Hv 32, Dk = Dv = 128, bfloat16 q, k, v, a, b; float32 states.
//
// Continuous batching (run_batching): a pool of `slots` states of which `active` sequences are
// decoding. Every `cycle` steps one sequence leaves and a new one joins: its prompt (16 to 64
// tokens) is prefilled into a free slot from zeros (the fresh flag) in the same graph as the
// decode step of the others; after the step it takes the leaver's row and the leaver's slot is
// freed (so the slots in use wander over the whole pool). One graph and one mx::eval per step,
// over `layers` layers, each with its own pool. The paths:
//   pool     mlxk_gated_delta_update_pool (prefill: B = 1, fresh; decode: B = active), the old
//            pool handle freed before evaluation (in place)
//   packed   one mlxk_gated_delta_update_packed call per step: the decode rows as sequences of
//            one token and, on a join step, the prompt as one more sequence
//   gather   what engines on MLX ops do: mx::take of the rows, the dense
//            mlxk_gated_delta_update, mx::scatter of the new states into the pool (prefill:
//            the dense call from zeros, then a scatter of one row), one graph
//   gather2  the same in two evals (take + kernel, then the scatters): MLX's scatter then
//            writes into the pool in place, which it cannot while the graph's take holds it
//   dense    the target: the dense kernel alone on a dense [active, ...] state carried in place
//            (prefill: the dense call from zeros, its state evaluated and dropped); no slots
// Before timing, the first step's outputs of pool, packed, gather and gather2 are compared bit
// for bit (y and every pool slot); after timing, their pools again (they ran the same steps).
// Whether a path's pool (dense: state) kept its buffer over the timed steps is observed: a pool
// path whose buffer changed has copied the whole pool (N states); its bytes then count one copy
// a step (what gather's one graph does: its take holds the old pool when the scatter runs).
//
// Packed prefill (run_prefill): `prompts` prompts of lengths drawn in [min_len, max_len]
// (fixed seed), prefilled from zeros three ways, each exact and chunked:
//   packed      mlxk_gated_delta_update_packed(_chunked) into a pool (fresh slots, in place)
//   padded      mlxk_gated_delta_update(_chunked) on [prompts, max length] with a mask
//   per prompt  one mlxk_gated_delta_update(_chunked) call per prompt (one graph, one eval)
// Checked before timing: packed against per prompt bit for bit (documented); padded against
// per prompt (printed: bit-equal or the largest difference).
//
// A call that fails (an unsupported form on the device, a missing kernel) skips its path or
// row with the error printed; the others go on.

#ifndef MLXKERN_BENCH_POOL_CASES_H
#define MLXKERN_BENCH_POOL_CASES_H

#ifndef MLXKERN_WITH_MLX
#define MLXKERN_WITH_MLX
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "mlx/mlx.h"
#include "mlxkern.hpp"

namespace pool_cases {

namespace mx = mlx::core;
using Clock = std::chrono::steady_clock;

constexpr int kHk = 16, kHv = 32, kD = 128;
constexpr double kStateBytes = double(kHv) * kD * kD * 4;  // one sequence's state, 2 MiB

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline mx::array normal(const mx::Shape& shape, mx::Dtype dtype, float scale, std::uint64_t seed) {
  return mx::astype(mx::multiply(mx::random::normal(shape, mx::float32, mx::random::key(seed)),
                                 mx::array(scale)),
                    dtype);
}

inline std::string error_text(const std::exception& e) { return e.what(); }

// One call's activations q, k, v, a, b ([batch, t, ...], evaluated) and handles sharing them.
struct Acts {
  std::vector<mx::array> arrays;
  std::vector<mlxk::Array> h;
  const mlxk::Array& operator[](std::size_t i) const { return h[i]; }
};

inline Acts acts_of(std::vector<mx::array> arrays) {
  mx::eval(arrays);
  Acts x;
  for (const mx::array& a : arrays) x.h.push_back(mlxk::Array::from_mlx(a));
  x.arrays = std::move(arrays);
  return x;
}

inline Acts random_acts(int batch, int t, std::uint64_t seed) {
  return acts_of({normal({batch, t, kHk, kD}, mx::bfloat16, 0.088f, seed),
                  normal({batch, t, kHk, kD}, mx::bfloat16, 0.088f, seed + 1),
                  normal({batch, t, kHv, kD}, mx::bfloat16, 1.0f, seed + 2),
                  normal({batch, t, kHv}, mx::bfloat16, 1.0f, seed + 3),
                  normal({batch, t, kHv}, mx::bfloat16, 1.0f, seed + 4)});
}

// Activations joined along `axis` (each part's arrays concatenated).
inline Acts join_acts(const std::vector<const Acts*>& parts, int axis) {
  std::vector<mx::array> out;
  for (std::size_t i = 0; i < 5; ++i) {
    std::vector<mx::array> each;
    for (const Acts* p : parts) each.push_back(p->arrays[i]);
    out.push_back(mx::concatenate(each, axis));
  }
  return acts_of(std::move(out));
}

struct Gates {
  mx::array a_log = normal({kHv}, mx::float32, 0.5f, 11);
  mx::array dt_bias = normal({kHv}, mx::bfloat16, 0.5f, 12);
  mlxk::Array h_a_log, h_dt_bias;
  Gates() {
    mx::eval({a_log, dt_bias});
    h_a_log = mlxk::Array::from_mlx(a_log);
    h_dt_bias = mlxk::Array::from_mlx(dt_bias);
  }
};

// --- the calls (mlxkern's C ABI) ----------------------------------------------------------

struct Update {
  mlxk::Array y, state;  // state: the new pool for the pool calls
};

inline Update pool_call(const Acts& x, const Gates& g, const mlxk::Array& pool,
                        const std::vector<std::int32_t>& slots,
                        const std::vector<std::uint8_t>& fresh) {
  Update r;
  mlxk::check(mlxk_gated_delta_update_pool(
      x[0].get(), x[1].get(), x[2].get(), x[3].get(), x[4].get(), g.h_a_log.get(),
      g.h_dt_bias.get(), pool.get(), slots.data(), fresh.data(), slots.size(), nullptr,
      mlxk::OutHandle(r.y), mlxk::OutHandle(r.state)));
  return r;
}

inline Update packed_call(const Acts& x, const Gates& g, const mlxk::Array& pool,
                          const std::vector<std::int32_t>& cu,
                          const std::vector<std::int32_t>& slots,
                          const std::vector<std::uint8_t>& fresh, bool chunked) {
  Update r;
  if (chunked) {
    mlxk::check(mlxk_gated_delta_update_packed_chunked(
        x[0].get(), x[1].get(), x[2].get(), x[3].get(), x[4].get(), g.h_a_log.get(),
        g.h_dt_bias.get(), pool.get(), cu.data(), cu.size(), slots.data(), fresh.data(), 0,
        mlxk::OutHandle(r.y), mlxk::OutHandle(r.state)));
  } else {
    mlxk::check(mlxk_gated_delta_update_packed(
        x[0].get(), x[1].get(), x[2].get(), x[3].get(), x[4].get(), g.h_a_log.get(),
        g.h_dt_bias.get(), pool.get(), cu.data(), cu.size(), slots.data(), fresh.data(),
        mlxk::OutHandle(r.y), mlxk::OutHandle(r.state)));
  }
  return r;
}

inline Update dense_call(const Acts& x, const Gates& g, const mlxk::Array* state,
                         const mlxk::Array* mask, bool chunked) {
  mlxk::DeltaUpdate d =
      chunked ? mlxk::gated_delta_update_chunked(x[0], x[1], x[2], x[3], x[4], g.h_a_log,
                                                 g.h_dt_bias, state, mask, 0)
              : mlxk::gated_delta_update(x[0], x[1], x[2], x[3], x[4], g.h_a_log, g.h_dt_bias,
                                         state, mask);
  return Update{std::move(d.y), std::move(d.state)};
}

// --- comparisons ----------------------------------------------------------------------------

// Whether two arrays hold the same bits (bfloat16 or float32).
inline bool same_bits(const mx::array& a, const mx::array& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const mx::Dtype bits = a.dtype() == mx::float32 ? mx::uint32 : mx::uint16;
  return mx::array_equal(mx::view(a, bits), mx::view(b, bits), false).item<bool>();
}

inline double max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), mx::astype(b, mx::float32))))
      .item<float>();
}

// "bit-equal" or "differs: max |diff| X"; `must` marks a documented equality.
struct Check {
  std::string what, result;
  bool must = false, ok = true;
};

inline Check compare(const std::string& what, const mx::array& a, const mx::array& b, bool must) {
  Check c{what, "", must, true};
  if (a.shape() != b.shape()) {
    c.result = "shapes differ";
    c.ok = !must;
  } else if (same_bits(a, b)) {
    c.result = "bit-equal";
  } else {
    char text[96];
    std::snprintf(text, sizeof text, "differs: max |diff| %.3g", max_abs_diff(a, b));
    c.result = text;
    c.ok = !must;
  }
  std::printf("  check %-58s %s%s\n", what.c_str(), c.result.c_str(),
              c.ok ? "" : "  <-- FAILED (documented bit for bit)");
  return c;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --- continuous batching -------------------------------------------------------------------

struct BatchingConfig {
  int slots = 64, active = 32, cycle = 8, min_prefill = 16, max_prefill = 64;
  int layers = 1, rounds = 12;
  bool gpu = false;  // the pool calls' GPU form: the B new states through a temporary + scatter
  std::uint32_t seed = 20250;
};

struct Step {
  bool join = false;
  int prefill = 0;  // which prompt (World::prefill)
  int decode = 0;   // which decode inputs (World::decode)
  std::int32_t new_slot = -1;
  std::vector<std::int32_t> slots;         // the decoding rows' slots (B = active)
  std::vector<std::int32_t> packed_slots;  // slots, then new_slot on a join step
  std::vector<std::uint8_t> packed_fresh;
};

// The schedule of `steps` steps: the same for every path.
inline std::vector<Step> schedule(const BatchingConfig& cfg, int steps, int prompts) {
  std::mt19937 rng(cfg.seed);
  std::vector<std::int32_t> slots(static_cast<std::size_t>(cfg.slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<std::int32_t> active(slots.begin(), slots.begin() + cfg.active);
  std::vector<std::int32_t> free_slots(slots.begin() + cfg.active, slots.end());
  std::vector<Step> out;
  int joins = 0;
  for (int s = 0; s < steps; ++s) {
    Step st;
    st.join = s % cfg.cycle == 0;
    st.decode = s % cfg.cycle;
    st.slots = active;
    st.packed_slots = active;
    st.packed_fresh.assign(active.size(), 0);
    if (st.join) {
      st.prefill = joins++ % prompts;
      st.new_slot = free_slots.front();
      free_slots.erase(free_slots.begin());
      st.packed_slots.push_back(st.new_slot);
      st.packed_fresh.push_back(1);
      // After the step the new sequence takes a leaver's row; the leaver's slot is freed.
      const std::size_t leaver = std::uniform_int_distribution<std::size_t>(0, active.size() - 1)(rng);
      free_slots.push_back(active[leaver]);
      active[leaver] = st.new_slot;
    }
    out.push_back(std::move(st));
  }
  return out;
}

// The inputs every path reads.
struct World {
  BatchingConfig cfg;
  Gates gates;
  std::vector<int> prefill_lengths;
  std::vector<Acts> decode;          // [active, 1, ...], one per step of a cycle
  std::vector<Acts> prefill;         // [1, L, ...]
  std::vector<Acts> packed_decode;   // decode[i] as [1, active, ...]
  std::vector<Acts> packed_join;     // decode[0] then prefill[j], [1, active + L, ...]
  std::vector<std::int32_t> cu_decode;
  std::vector<std::vector<std::int32_t>> cu_join;

  explicit World(const BatchingConfig& c) : cfg(c) {
    std::mt19937 rng(cfg.seed + 1);
    std::uniform_int_distribution<int> len(cfg.min_prefill, cfg.max_prefill);
    for (int i = 0; i < cfg.cycle; ++i) {
      decode.push_back(random_acts(cfg.active, 1, 1000 + 10 * static_cast<std::uint64_t>(i)));
      std::vector<mx::array> flat;
      for (const mx::array& a : decode.back().arrays) {
        mx::Shape shape = a.shape();
        shape[0] = 1;
        shape[1] = cfg.active;
        flat.push_back(mx::reshape(a, shape));
      }
      packed_decode.push_back(acts_of(std::move(flat)));
    }
    for (int j = 0; j < 4; ++j) {
      prefill_lengths.push_back(len(rng));
      prefill.push_back(random_acts(1, prefill_lengths.back(), 2000 + 10 * static_cast<std::uint64_t>(j)));
      packed_join.push_back(join_acts({&packed_decode[0], &prefill.back()}, 1));
    }
    for (int i = 0; i <= cfg.active; ++i) cu_decode.push_back(i);
    for (int l : prefill_lengths) {
      cu_join.push_back(cu_decode);
      cu_join.back().push_back(cfg.active + l);
    }
  }

  // Layer l's starting pool: the same values for every path, a buffer of its own.
  mx::array start_pool(int l) const {
    mx::array p = normal({cfg.slots, kHv, kD, kD}, mx::float32, 0.1f, 500 + static_cast<std::uint64_t>(l));
    mx::eval(p);
    return p;
  }
};

// Layer 0's outputs of one step, kept for the checks.
struct StepOut {
  std::optional<mx::array> prefill_y;
  std::optional<mx::array> decode_y;  // [active, 1, Hv, Dv]
};

class Path {
 public:
  std::string name, note, skipped;
  std::vector<double> decode_s, join_s;  // seconds per step, all layers
  std::vector<const void*> buffers;      // layer 0's state buffer after each timed step
  BatchingConfig cfg;
  virtual ~Path() = default;
  // Builds one step's graph over every layer and evaluates it; `keep`: layer 0's outputs.
  virtual void step(const Step& s, StepOut* keep) = 0;
  // Layer l's pool (dense: its state), for the checks and the buffer's identity.
  virtual mx::array pool(int l) const = 0;
  // State bytes read + written per layer-step (join: a join step), copies of N excluded.
  virtual double bytes(bool join) const = 0;
  // Drops the path's arrays (after timing; the figures stay).
  virtual void release() = 0;
  bool pool_path() const { return name != "dense"; }
  bool in_place() const {
    return !buffers.empty() &&
           std::all_of(buffers.begin(), buffers.end(), [&](const void* b) { return b == buffers[0]; });
  }
};

class PoolPath : public Path {
 public:
  explicit PoolPath(const World& w) : w_(w) {
    cfg = w.cfg;
    name = "pool";
    note = "mlxk_gated_delta_update_pool: prefill B=1 fresh, decode B=active; old pool freed";
    for (int l = 0; l < w.cfg.layers; ++l) pools_.push_back(mlxk::Array::from_mlx(w.start_pool(l)));
  }
  void step(const Step& s, StepOut* keep) override {
    std::vector<mx::array> outs;
    for (std::size_t l = 0; l < pools_.size(); ++l) {
      if (s.join) {
        Update p = pool_call(w_.prefill[static_cast<std::size_t>(s.prefill)], w_.gates, pools_[l],
                             {s.new_slot}, {1});
        pools_[l] = std::move(p.state);  // frees the old handle: the call takes over its buffer
        outs.push_back(p.y.to_mlx());
        if (keep && l == 0) keep->prefill_y = outs.back();
      }
      const std::vector<std::uint8_t> fresh(s.slots.size(), 0);
      Update d = pool_call(w_.decode[static_cast<std::size_t>(s.decode)], w_.gates, pools_[l],
                           s.slots, fresh);
      pools_[l] = std::move(d.state);
      outs.push_back(d.y.to_mlx());
      if (keep && l == 0) keep->decode_y = outs.back();
      outs.push_back(pools_[l].to_mlx());
    }
    mx::eval(outs);
  }
  mx::array pool(int l) const override { return pools_[static_cast<std::size_t>(l)].to_mlx(); }
  void release() override { pools_.clear(); }
  // CPU: B read + B written in place; GPU: B read, B written to a temporary, scattered (B + B).
  double bytes(bool join) const override {
    return cfg.gpu ? (4.0 * cfg.active + (join ? 3 : 0)) * kStateBytes
                    : (2.0 * cfg.active + (join ? 1 : 0)) * kStateBytes;
  }

 private:
  const World& w_;
  std::vector<mlxk::Array> pools_;
};

class PackedPath : public Path {
 public:
  explicit PackedPath(const World& w) : w_(w) {
    cfg = w.cfg;
    name = "packed";
    note = "one mlxk_gated_delta_update_packed per step: active 1-token sequences (+ the prompt)";
    for (int l = 0; l < w.cfg.layers; ++l) pools_.push_back(mlxk::Array::from_mlx(w.start_pool(l)));
  }
  void step(const Step& s, StepOut* keep) override {
    std::vector<mx::array> outs;
    const std::size_t p = static_cast<std::size_t>(s.prefill);
    const Acts& x = s.join ? w_.packed_join[p] : w_.packed_decode[static_cast<std::size_t>(s.decode)];
    const std::vector<std::int32_t>& cu = s.join ? w_.cu_join[p] : w_.cu_decode;
    for (std::size_t l = 0; l < pools_.size(); ++l) {
      Update r = packed_call(x, w_.gates, pools_[l], cu, s.packed_slots, s.packed_fresh, false);
      pools_[l] = std::move(r.state);
      outs.push_back(r.y.to_mlx());
      outs.push_back(pools_[l].to_mlx());
      if (keep && l == 0) {
        const int a = w_.cfg.active;
        const mx::array& y = outs[outs.size() - 2];
        keep->decode_y = mx::reshape(mx::slice(y, {0, 0, 0, 0}, {1, a, kHv, kD}), {a, 1, kHv, kD});
        if (s.join) keep->prefill_y = mx::slice(y, {0, a, 0, 0}, {1, y.shape(1), kHv, kD});
      }
    }
    mx::eval(outs);
  }
  mx::array pool(int l) const override { return pools_[static_cast<std::size_t>(l)].to_mlx(); }
  void release() override { pools_.clear(); }
  double bytes(bool join) const override {
    return cfg.gpu ? (4.0 * cfg.active + (join ? 3 : 0)) * kStateBytes
                    : (2.0 * cfg.active + (join ? 1 : 0)) * kStateBytes;
  }

 private:
  const World& w_;
  std::vector<mlxk::Array> pools_;
};

class GatherPath : public Path {
 public:
  // two_evals: the gathered rows and the kernel evaluated first, the scatters in a second eval
  // (MLX then updates the pool in place; in one graph the gather still holds the old pool when
  // the scatter runs, and MLX's scatter copies it).
  GatherPath(const World& w, bool two_evals) : w_(w), two_evals_(two_evals) {
    cfg = w.cfg;
    name = two_evals ? "gather2" : "gather";
    note = two_evals ? "the same in two evals: take + kernel, then the scatters"
                     : "mx::take rows -> dense mlxk_gated_delta_update -> mx::scatter, one eval";
    for (int l = 0; l < w.cfg.layers; ++l) pools_.push_back(w.start_pool(l));
  }
  void step(const Step& s, StepOut* keep) override {
    std::vector<mx::array> outs, joined, decoded;  // y's; the new states as scatter updates
    const int a = static_cast<int>(s.slots.size());
    const mx::array idx(s.slots.begin(), {a}, mx::int32);
    const mx::array one(&s.new_slot, {1}, mx::int32);
    auto scatter = [&](std::size_t l) {
      if (s.join) pools_[l] = mx::scatter(pools_[l], {one}, joined[l], {0});
      pools_[l] = mx::scatter(pools_[l], {idx}, decoded[l], {0});
    };
    for (std::size_t l = 0; l < pools_.size(); ++l) {
      Update d;
      {
        const mlxk::Array rows = mlxk::Array::from_mlx(mx::take(pools_[l], idx, 0));
        d = dense_call(w_.decode[static_cast<std::size_t>(s.decode)], w_.gates, &rows, nullptr,
                       false);
      }
      decoded.push_back(mx::reshape(d.state.to_mlx(), {a, 1, kHv, kD, kD}));
      outs.push_back(d.y.to_mlx());
      if (keep && l == 0) keep->decode_y = outs.back();
      if (s.join) {
        Update p = dense_call(w_.prefill[static_cast<std::size_t>(s.prefill)], w_.gates, nullptr,
                              nullptr, false);
        joined.push_back(mx::reshape(p.state.to_mlx(), {1, 1, kHv, kD, kD}));
        outs.push_back(p.y.to_mlx());
        if (keep && l == 0) keep->prefill_y = outs.back();
      }
      if (!two_evals_) {
        scatter(l);
        outs.push_back(pools_[l]);
      }
    }
    if (two_evals_) {
      outs.insert(outs.end(), decoded.begin(), decoded.end());
      outs.insert(outs.end(), joined.begin(), joined.end());
      mx::eval(outs);
      outs.clear();
      for (std::size_t l = 0; l < pools_.size(); ++l) {
        scatter(l);
        outs.push_back(pools_[l]);
      }
    }
    mx::eval(outs);
  }
  mx::array pool(int l) const override { return pools_[static_cast<std::size_t>(l)]; }
  void release() override { pools_.clear(); }
  // take: B read + B written; the kernel: B + B; scatter: B read + B written (in place).
  double bytes(bool join) const override {
    return (6.0 * cfg.active + (join ? 3 : 0)) * kStateBytes;
  }

 private:
  const World& w_;
  bool two_evals_;
  std::vector<mx::array> pools_;
};

class DensePath : public Path {
 public:
  explicit DensePath(const World& w) : w_(w) {
    cfg = w.cfg;
    name = "dense";
    note = "the dense kernel alone: decode on a dense [active] state in place; prefill from zeros";
    for (int l = 0; l < w.cfg.layers; ++l) {
      mx::array st = normal({w.cfg.active, kHv, kD, kD}, mx::float32, 0.1f, 700 + static_cast<std::uint64_t>(l));
      mx::eval(st);
      states_.push_back(mlxk::Array::from_mlx(st));
    }
  }
  void step(const Step& s, StepOut*) override {
    std::vector<mx::array> outs;
    for (std::size_t l = 0; l < states_.size(); ++l) {
      if (s.join) {
        Update p = dense_call(w_.prefill[static_cast<std::size_t>(s.prefill)], w_.gates, nullptr,
                              nullptr, false);
        outs.push_back(p.y.to_mlx());
        outs.push_back(p.state.to_mlx());
      }
      Update d = dense_call(w_.decode[static_cast<std::size_t>(s.decode)], w_.gates, &states_[l],
                            nullptr, false);
      states_[l] = std::move(d.state);
      outs.push_back(d.y.to_mlx());
      outs.push_back(states_[l].to_mlx());
    }
    mx::eval(outs);
  }
  mx::array pool(int l) const override { return states_[static_cast<std::size_t>(l)].to_mlx(); }
  void release() override { states_.clear(); }
  double bytes(bool join) const override {
    return (2.0 * cfg.active + (join ? 1 : 0)) * kStateBytes;
  }

 private:
  const World& w_;
  std::vector<mlxk::Array> states_;
};

// A path that could not be set up: it carries the reason.
class SkippedPath : public Path {
 public:
  SkippedPath(const std::string& n, const std::string& why) {
    name = n;
    skipped = why;
  }
  void step(const Step&, StepOut*) override {}
  mx::array pool(int) const override { return mx::array(0.0f); }
  double bytes(bool) const override { return 0; }
  void release() override {}
};

struct BatchingResult {
  BatchingConfig cfg;
  std::vector<int> prefill_lengths;
  std::vector<std::unique_ptr<Path>> paths;
  std::vector<Check> checks;
  bool ok = true;
  const Path* find(const std::string& name) const {
    for (const auto& p : paths)
      if (p->name == name && p->skipped.empty()) return p.get();
    return nullptr;
  }
};

// Mean seconds per layer-step over whole cycles.
inline double mean_step(const Path& p, int layers) {
  const double sum = std::accumulate(p.decode_s.begin(), p.decode_s.end(), 0.0) +
                     std::accumulate(p.join_s.begin(), p.join_s.end(), 0.0);
  const std::size_t n = p.decode_s.size() + p.join_s.size();
  return n ? sum / static_cast<double>(n) / layers : 0.0;
}

// State bytes per layer-step, averaged over a cycle; a pool path not updated in place pays a
// copy of N (read + write) per step.
inline double mean_bytes(const Path& p, const BatchingConfig& cfg) {
  double b = (p.bytes(true) + (cfg.cycle - 1) * p.bytes(false)) / cfg.cycle;
  if (p.pool_path() && !p.in_place()) b += 2.0 * cfg.slots * kStateBytes;
  return b;
}

inline BatchingResult run_batching(const BatchingConfig& cfg) {
  BatchingResult r;
  r.cfg = cfg;
  const World w(cfg);
  r.prefill_lengths = w.prefill_lengths;
  const int steps = cfg.cycle * (1 + cfg.rounds);
  const std::vector<Step> plan = schedule(cfg, steps, static_cast<int>(w.prefill.size()));
  auto make = [&](const char* name, auto build) {
    try {
      r.paths.push_back(build());
    } catch (const std::exception& e) {
      r.paths.push_back(std::make_unique<SkippedPath>(name, "setting up: " + error_text(e)));
      std::printf("  %s: skipped: %s\n", name, r.paths.back()->skipped.c_str());
    }
  };
  make("pool", [&] { return std::make_unique<PoolPath>(w); });
  make("packed", [&] { return std::make_unique<PackedPath>(w); });
  make("gather", [&] { return std::make_unique<GatherPath>(w, false); });
  make("gather2", [&] { return std::make_unique<GatherPath>(w, true); });
  make("dense", [&] { return std::make_unique<DensePath>(w); });
  auto run = [&](Path& p, const Step& s, StepOut* keep, bool timed) {
    if (!p.skipped.empty()) return;
    try {
      const auto t0 = Clock::now();
      p.step(s, keep);
      const double t = seconds_since(t0);
      if (!timed) return;
      (s.join ? p.join_s : p.decode_s).push_back(t);
      p.buffers.push_back(p.pool(0).buffer().ptr());
    } catch (const std::exception& e) {
      p.skipped = error_text(e);
      std::printf("  %s: skipped: %s\n", p.name.c_str(), p.skipped.c_str());
    }
  };
  // Step 0 (a join step) on every path; the pool paths' outputs compared with the first pool
  // path that ran (pool, else packed, else gather).
  std::vector<StepOut> first(r.paths.size());
  for (std::size_t i = 0; i < r.paths.size(); ++i) run(*r.paths[i], plan[0], &first[i], false);
  std::size_t ref = r.paths.size();
  for (std::size_t i = 0; i < r.paths.size() && ref == r.paths.size(); ++i)
    if (r.paths[i]->skipped.empty() && r.paths[i]->pool_path() && first[i].decode_y) ref = i;
  auto check_against_ref = [&](const char* when) {
    if (ref == r.paths.size() || !r.paths[ref]->skipped.empty()) return;
    const Path& base = *r.paths[ref];
    for (std::size_t i = ref + 1; i < r.paths.size(); ++i) {
      const Path& p = *r.paths[i];
      if (!p.skipped.empty() || !p.pool_path()) continue;
      for (int l = 0; l < cfg.layers; ++l)
        r.checks.push_back(compare(p.name + " vs " + base.name + ": every slot, layer " +
                                       std::to_string(l) + when,
                                   p.pool(l), base.pool(l), true));
    }
  };
  if (ref < r.paths.size()) {
    const StepOut& a = first[ref];
    const std::string vs = " vs " + r.paths[ref]->name;
    for (std::size_t i = ref + 1; i < r.paths.size(); ++i) {
      const Path& p = *r.paths[i];
      if (!p.skipped.empty() || !p.pool_path() || !first[i].decode_y || !first[i].prefill_y) continue;
      r.checks.push_back(compare(p.name + vs + ": decode y, step 0", *first[i].decode_y,
                                 *a.decode_y, true));
      r.checks.push_back(compare(p.name + vs + ": prefill y, step 0", *first[i].prefill_y,
                                 *a.prefill_y, true));
    }
    first.clear();
    check_against_ref(", after step 0");
  } else {
    std::printf("  checks skipped: no pool path ran\n");
  }
  first.clear();
  // The rest of cycle 0 warms up; then `rounds` cycles, the paths interleaved step by step
  // (load from other work on the machine falls on all of them alike), their order rotated
  // every step (none always follows the same one).
  const std::size_t n = r.paths.size();
  for (int s = 1; s < steps; ++s)
    for (std::size_t k = 0; k < n; ++k)
      run(*r.paths[(k + static_cast<std::size_t>(s)) % n], plan[static_cast<std::size_t>(s)], nullptr,
          s >= cfg.cycle);
  check_against_ref(", after every step");
  for (const Check& c : r.checks) r.ok = r.ok && c.ok;
  for (auto& p : r.paths) p->release();  // the figures stay; the World goes
  return r;
}

// --- packed prefill ------------------------------------------------------------------------

// The mixed lengths of the packed16k rows (bench_cuda_pool.cc) and of fla's varlen peer
// (benches/peer_fla.py): 8 prompts, 16384 tokens.
constexpr int kMixedLengths[] = {512, 1024, 1536, 2048, 2560, 3072, 2048, 3584};

struct PrefillConfig {
  int prompts = 16, min_len = 64, max_len = 2048, slots = 64, rounds = 3;
  std::uint32_t seed = 7;
  std::vector<int> lengths;  // the prompts' lengths as given (then `prompts` is its size)
};

struct PrefillRow {
  std::string name, note, skipped;
  bool chunked = false;
  double tokens = 0, computed_tokens = 0;  // real tokens; tokens the call computes (padding too)
  std::vector<double> s;                   // seconds per call (all prompts)
};

struct PrefillResult {
  PrefillConfig cfg;
  std::vector<int> lengths;
  int total = 0, longest = 0;
  std::vector<PrefillRow> rows;
  std::vector<Check> checks;
  bool ok = true;
};

// A row's graph (its outputs, evaluated and timed) and, for the checks only, those outputs as
// y over the real tokens [1, total, Hv, Dv] and the final states [prompts, Hv, Dv, Dk].
struct PrefillImpl {
  std::function<std::vector<mx::array>()> build;
  std::function<std::pair<mx::array, mx::array>(const std::vector<mx::array>&)> views;
};

inline PrefillResult run_prefill(const PrefillConfig& given) {
  PrefillConfig cfg = given;
  if (!cfg.lengths.empty()) cfg.prompts = static_cast<int>(cfg.lengths.size());
  PrefillResult r;
  r.cfg = cfg;
  std::mt19937 rng(cfg.seed);
  std::uniform_int_distribution<int> len(cfg.min_len, cfg.max_len);
  r.lengths = cfg.lengths;
  for (int i = static_cast<int>(r.lengths.size()); i < cfg.prompts; ++i) r.lengths.push_back(len(rng));
  r.total = std::accumulate(r.lengths.begin(), r.lengths.end(), 0);
  r.longest = *std::max_element(r.lengths.begin(), r.lengths.end());
  const Gates gates;
  std::vector<Acts> prompts;
  std::vector<const Acts*> prompt_ptrs;
  for (int i = 0; i < cfg.prompts; ++i)
    prompts.push_back(random_acts(1, r.lengths[static_cast<std::size_t>(i)],
                                  3000 + 10 * static_cast<std::uint64_t>(i)));
  for (const Acts& p : prompts) prompt_ptrs.push_back(&p);
  const Acts packed = join_acts(prompt_ptrs, 1);
  // Padded: each prompt followed by zeros up to the longest, one row each; the mask.
  std::vector<mx::array> padded_parts[5];
  for (const Acts& p : prompts) {
    for (std::size_t j = 0; j < 5; ++j) {
      const mx::array& a = p.arrays[j];
      mx::Shape pad = a.shape();
      pad[1] = r.longest - a.shape(1);
      padded_parts[j].push_back(pad[1] ? mx::concatenate({a, mx::zeros(pad, a.dtype())}, 1) : a);
    }
  }
  std::vector<mx::array> padded_arrays;
  for (auto& parts : padded_parts) padded_arrays.push_back(mx::concatenate(parts, 0));
  const Acts padded = acts_of(std::move(padded_arrays));
  const mx::array lengths(r.lengths.begin(), {cfg.prompts, 1}, mx::int32);
  const mx::array mask_arr = mx::less(mx::expand_dims(mx::arange(r.longest), 0), lengths);
  mx::eval(mask_arr);
  const mlxk::Array mask = mlxk::Array::from_mlx(mask_arr);
  std::vector<std::int32_t> cu{0}, slots(static_cast<std::size_t>(cfg.slots));
  for (int l : r.lengths) cu.push_back(cu.back() + l);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(static_cast<std::size_t>(cfg.prompts));
  const std::vector<std::uint8_t> fresh(slots.size(), 1);
  const mx::array slot_idx(slots.begin(), {cfg.prompts}, mx::int32);
  mlxk::Array pool = mlxk::Array::from_mlx([&] {
    mx::array p = normal({cfg.slots, kHv, kD, kD}, mx::float32, 0.1f, 900);
    mx::eval(p);
    return p;
  }());

  std::vector<PrefillImpl> impls;
  for (bool chunked : {false, true}) {
    const std::string form = chunked ? " chunked" : "";
    const std::string dense_fn = chunked ? "mlxk_gated_delta_update_chunked" : "mlxk_gated_delta_update";
    const double real = r.total;
    r.rows.push_back({"packed" + form,
                      std::string(chunked ? "mlxk_gated_delta_update_packed_chunked"
                                          : "mlxk_gated_delta_update_packed") +
                          " into a pool (fresh slots, old pool freed)",
                      "", chunked, real, real, {}});
    impls.push_back(
        {[&, chunked] {
           Update u = packed_call(packed, gates, pool, cu, slots, fresh, chunked);
           pool = std::move(u.state);  // the old pool freed: in place
           return std::vector<mx::array>{u.y.to_mlx(), pool.to_mlx()};
         },
         [&](const std::vector<mx::array>& o) {
           return std::make_pair(o[0], mx::take(o[1], slot_idx, 0));
         }});
    r.rows.push_back({"padded" + form, dense_fn + " on [prompts, longest] with a mask", "", chunked,
                      real, double(cfg.prompts) * r.longest, {}});
    impls.push_back({[&, chunked] {
                       Update u = dense_call(padded, gates, nullptr, &mask, chunked);
                       return std::vector<mx::array>{u.y.to_mlx(), u.state.to_mlx()};
                     },
                     [&](const std::vector<mx::array>& o) {
                       std::vector<mx::array> ys;
                       for (int i = 0; i < cfg.prompts; ++i)
                         ys.push_back(mx::slice(o[0], {i, 0, 0, 0},
                                                {i + 1, r.lengths[static_cast<std::size_t>(i)], kHv, kD}));
                       return std::make_pair(mx::concatenate(ys, 1), o[1]);
                     }});
    r.rows.push_back({"per prompt" + form, "one " + dense_fn + " per prompt, one eval", "", chunked,
                      real, real, {}});
    impls.push_back({[&, chunked] {
                       std::vector<mx::array> out;
                       for (const Acts& p : prompts) {
                         Update u = dense_call(p, gates, nullptr, nullptr, chunked);
                         out.push_back(u.y.to_mlx());
                         out.push_back(u.state.to_mlx());
                       }
                       return out;
                     },
                     [](const std::vector<mx::array>& o) {
                       std::vector<mx::array> ys, states;
                       for (std::size_t i = 0; i < o.size(); i += 2) {
                         ys.push_back(o[i]);
                         states.push_back(o[i + 1]);
                       }
                       return std::make_pair(mx::concatenate(ys, 1), mx::concatenate(states, 0));
                     }});
  }
  auto run = [&](std::size_t i) -> std::optional<std::vector<mx::array>> {
    PrefillRow& row = r.rows[i];
    if (!row.skipped.empty()) return std::nullopt;
    try {
      const auto t0 = Clock::now();
      std::vector<mx::array> o = impls[i].build();
      mx::eval(o);
      row.s.push_back(seconds_since(t0));
      return o;
    } catch (const std::exception& e) {
      row.skipped = error_text(e);
      std::printf("  %s: skipped: %s\n", row.name.c_str(), row.skipped.c_str());
      return std::nullopt;
    }
  };
  // One run of each (the warm-up, not timed), its outputs checked; then the timed rounds,
  // interleaved.
  for (std::size_t base = 0; base < r.rows.size(); base += 3) {
    std::vector<std::optional<std::pair<mx::array, mx::array>>> v(3);
    for (std::size_t i = 0; i < 3; ++i) {
      if (auto o = run(base + i)) v[i] = impls[base + i].views(*o);
      r.rows[base + i].s.clear();
    }
    const std::string form = r.rows[base].chunked ? " (chunked)" : "";
    if (v[0] && v[2]) {
      r.checks.push_back(compare("packed vs per prompt: y" + form, v[0]->first, v[2]->first, true));
      r.checks.push_back(compare("packed vs per prompt: states" + form, v[0]->second, v[2]->second, true));
    }
    if (v[1] && v[2]) {
      r.checks.push_back(compare("padded vs per prompt: y at real tokens" + form, v[1]->first, v[2]->first, false));
      r.checks.push_back(compare("padded vs per prompt: states" + form, v[1]->second, v[2]->second, false));
    }
  }
  for (int round = 0; round < cfg.rounds; ++round)
    for (std::size_t i = 0; i < r.rows.size(); ++i) run(i);
  for (const Check& c : r.checks) r.ok = r.ok && c.ok;
  return r;
}

}  // namespace pool_cases

#endif  // MLXKERN_BENCH_POOL_CASES_H
