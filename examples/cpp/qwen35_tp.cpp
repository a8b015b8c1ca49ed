// A Qwen3.5 Gated DeltaNet layer run tensor-parallel across processes on MLX's distributed
// layer (qwen35_tp.hpp: each rank its heads, its state pools, one all_sum per step), and
// checked against the one-process layer (qwen35_gdn.hpp) on the same random weights and inputs.
//
//   qwen35_tp rank      --out DIR [options]   one rank (MLX_RANK / MLX_HOSTFILE for the ring
//                                             backend; --ranks 1 runs alone): writes
//                                             DIR/rank<r>.safetensors
//   qwen35_tp reference --out DIR [options]   the one-process layer, then the comparison with
//                                             every DIR/rank<r>.safetensors (exit 1 beyond the
//                                             bounds)
//   options: --ranks R (2)  --config small|35b (small)  --seed N (1)  --reduce float32|model
//            (float32)  --backend ring|any (ring)
//
// The serving plan (the same in both modes): a pool of 4 slots; sequence 0 in slot 3 and
// sequence 1 in slot 1. Prefill sequence 0 (24 tokens, exact recurrence), prefill sequence 1
// (40 tokens, chunked recurrence), 4 decode steps of both sequences in one batch, a 5-token
// forward of sequence 0 from its carried states, batched decode steps, and two speculative
// rounds of both sequences (a 4-draft window of which 1 and 3 are accepted, a 3-draft window of
// which 3 and 0 are: verify on the pool, then each row's prefix committed into its slot), each
// followed by decode steps. The reference runs each sequence alone through the one-process
// layer (its own state, no pool; its verify and accept).
//
// Bounds: the engine test's (tests/cpp/test_qwen35_layer.py): per output
//   |y_tp - y_one| <= 2 ulp_bf16(|y|) + 2^-9 sqrt(max(1, 4096 / (Hv Dv))) max|y of the step|,
// the recurrent state |ds| <= 2^-8 max|s|, the conv state within 1 bfloat16 ulp. With the
// all_sum in the model's dtype (--reduce model) the absolute term gains R 2^-9 max|y|: each
// rank's partial product and each addition of the ring is rounded to bfloat16 once more (the
// engine test's bound alone fails it on some seeds: 1.0-1.17x at 35B-A3B's shapes, 2 ranks).
// Every rank's output must also be the same bits as rank 0's (the all_sum's result).
#include "qwen35_tp.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

namespace mx = mlx::core;
using qwen35::Config;
using qwen35::Recurrence;

struct Options {
  std::string mode, out, config = "small", reduce = "float32", backend = "ring";
  int ranks = 2;
  std::uint64_t seed = 1;
};

Options parse(int argc, char **argv) {
  if (argc < 2) throw std::invalid_argument("mode: expected 'rank' or 'reference'");
  Options o;
  o.mode = argv[1];
  if (o.mode != "rank" && o.mode != "reference")
    throw std::invalid_argument("mode: '" + o.mode + "', expected 'rank' or 'reference'");
  for (int i = 2; i < argc; i += 2) {
    const std::string name = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(name + ": expected a value");
    const std::string value = argv[i + 1];
    auto number = [&](long long low) {
      char *end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < low)
        throw std::invalid_argument(name + ": '" + value + "', expected an integer >= " +
                                    std::to_string(low));
      return v;
    };
    if (name == "--out") o.out = value;
    else if (name == "--config") o.config = value;
    else if (name == "--reduce") o.reduce = value;
    else if (name == "--backend") o.backend = value;
    else if (name == "--ranks") o.ranks = static_cast<int>(number(1));
    else if (name == "--seed") o.seed = static_cast<std::uint64_t>(number(0));
    else throw std::invalid_argument("'" + name + "': unknown option");
  }
  if (o.out.empty()) throw std::invalid_argument("--out: expected an output folder");
  if (o.config != "small" && o.config != "35b")
    throw std::invalid_argument("--config: '" + o.config + "', expected small or 35b");
  if (o.reduce != "float32" && o.reduce != "model")
    throw std::invalid_argument("--reduce: '" + o.reduce + "', expected float32 or model");
  return o;
}

Config make_config(const std::string &name) {
  if (name == "35b") return Config::qwen35_35b_a3b();
  Config c;  // small enough for four ranks on two cores: Hk 4, Hv 8
  c.hidden_size = 512;
  c.key_heads = 4;
  c.value_heads = 8;
  c.key_dim = 64;
  c.value_dim = 64;
  c.conv_kernel = 4;
  c.rms_norm_eps = 1e-6f;
  return c;
}

// --- the plan ---

struct Row {
  int sequence = 0;
  bool fresh = false;
  int accepted = 0;  // a verify step's accepted drafts
};
struct Step {
  std::string name;
  std::vector<Row> rows;
  int tokens = 0;
  Recurrence recurrence = Recurrence::Exact;
  bool verify = false;  // a draft window of `tokens`, then each row's accepted prefix kept
};

constexpr int kPoolSlots = 4;
constexpr int kSequences = 2;
constexpr std::int32_t kSlot[kSequences] = {3, 1};

std::vector<Step> plan() {
  std::vector<Step> steps;
  steps.push_back({"prefill seq 0 (exact)", {{0, true}}, 24, Recurrence::Exact});
  steps.push_back({"prefill seq 1 (chunked)", {{1, true}}, 40, Recurrence::Chunked});
  for (int i = 0; i < 4; ++i)
    steps.push_back({"decode seq 0+1", {{0, false}, {1, false}}, 1, Recurrence::Exact});
  steps.push_back({"forward seq 0 (carried)", {{0, false}}, 5, Recurrence::Exact});
  for (int i = 0; i < 2; ++i)
    steps.push_back({"decode seq 0+1", {{0, false}, {1, false}}, 1, Recurrence::Exact});
  steps.push_back({"verify 0+1, accept 1, 3", {{0, false, 1}, {1, false, 3}}, 4,
                   Recurrence::Exact, true});
  steps.push_back({"decode seq 0+1", {{0, false}, {1, false}}, 1, Recurrence::Exact});
  steps.push_back({"verify 0+1, accept 3, 0", {{0, false, 3}, {1, false, 0}}, 3,
                   Recurrence::Exact, true});
  for (int i = 0; i < 2; ++i)
    steps.push_back({"decode seq 0+1", {{0, false}, {1, false}}, 1, Recurrence::Exact});
  return steps;
}

/** Every sequence's tokens [total, hidden] in the model's dtype, the same in every process. */
std::vector<mx::array> inputs(const Config &c, const std::vector<Step> &steps,
                              std::uint64_t seed) {
  std::vector<int> total(kSequences, 0);
  for (const Step &s : steps)
    for (const Row &r : s.rows) total[r.sequence] += s.tokens;
  std::vector<mx::array> x;
  for (int s = 0; s < kSequences; ++s)
    x.push_back(mx::astype(mx::random::normal({total[s], c.hidden_size}, mx::float32,
                                              mx::random::key(seed * 1000 + 17 + s)),
                           mx::bfloat16));
  mx::eval(x);
  return x;
}

mx::array rows_of(const mx::array &x, int from, int count) {
  return mx::slice(x, {from, 0}, {from + count, x.shape(1)});
}

double ms_since(std::chrono::steady_clock::time_point from) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - from)
      .count();
}

std::string rank_file(const std::string &dir, int rank) {
  return dir + "/rank" + std::to_string(rank) + ".safetensors";
}

// --- one rank ---

int run_rank(const Options &o) {
  const Config config = make_config(o.config);
  mx::distributed::Group group = mx::distributed::init(o.ranks > 1, o.backend);
  if (group.size() != o.ranks)
    throw std::invalid_argument("--ranks: " + std::to_string(o.ranks) + ", but the " +
                                o.backend + " backend formed a group of " +
                                std::to_string(group.size()) +
                                " (set MLX_RANK and MLX_HOSTFILE for each process)");
  const int rank = group.rank();
  const qwen35::Weights weights = qwen35::Weights::random(config, o.seed);
  qwen35::TensorParallelLayer layer(config, weights, group, kPoolSlots,
                                    o.reduce == "model" ? qwen35::Reduce::Model
                                                        : qwen35::Reduce::Float32);
  const std::vector<Step> steps = plan();
  const std::vector<mx::array> x = inputs(config, steps, o.seed);

  std::vector<std::vector<mx::array>> y(kSequences);
  std::vector<int> position(kSequences, 0);
  const auto begin = std::chrono::steady_clock::now();
  for (const Step &s : steps) {
    std::vector<mx::array> rows;
    std::vector<std::int32_t> slots;
    std::vector<std::uint8_t> fresh;
    std::vector<std::int32_t> accepted;
    for (const Row &r : s.rows) {
      rows.push_back(mx::expand_dims(rows_of(x[r.sequence], position[r.sequence], s.tokens), 0));
      slots.push_back(kSlot[r.sequence]);
      fresh.push_back(r.fresh ? 1 : 0);
      accepted.push_back(r.accepted);
    }
    mx::array out(0.0f);
    if (s.verify) {
      out = layer.verify(mx::concatenate(rows, 0), slots);
      layer.accept(accepted);  // the commit joins the step's graph
    } else {
      out = layer.step(mx::concatenate(rows, 0), slots, fresh, s.recurrence);
    }
    std::vector<mx::array> results = layer.states();
    results.push_back(out);
    mx::eval(results);  // the step's one evaluation (the all_sum included)
    for (size_t i = 0; i < s.rows.size(); ++i) {
      const int seq = s.rows[i].sequence;
      y[seq].push_back(mx::squeeze(mx::slice(out, {static_cast<int>(i), 0, 0},
                                             {static_cast<int>(i) + 1, s.tokens,
                                              config.hidden_size}),
                                   0));
      position[seq] += s.tokens;
    }
  }
  const double run_ms = ms_since(begin);

  std::unordered_map<std::string, mx::array> saved;
  for (int s = 0; s < kSequences; ++s) {
    auto [state, conv] = layer.slot_states(kSlot[s]);
    saved.insert({"y" + std::to_string(s), mx::concatenate(y[s], 0)});
    saved.insert({"state" + std::to_string(s), state});
    saved.insert({"conv" + std::to_string(s), conv});
  }
  mx::save_safetensors(rank_file(o.out, rank), saved,
                       {{"ranks", std::to_string(group.size())},
                        {"config", o.config},
                        {"reduce", o.reduce}});
  const Config &l = layer.local_config();
  std::printf("rank %d/%d: Hk %d..%d, Hv %d..%d, pool [%d, %d, %d, %d] float32; %zu steps in "
              "%.1f ms (one eval and one all_sum in %s each)\n",
              rank, group.size(), rank * l.key_heads, (rank + 1) * l.key_heads - 1,
              rank * l.value_heads, (rank + 1) * l.value_heads - 1, kPoolSlots, l.value_heads,
              l.value_dim, l.key_dim, steps.size(), run_ms, o.reduce.c_str());
  return 0;
}

// --- the one-process layer and the comparison ---

std::vector<double> to_doubles(const mx::array &a) {
  const mx::array f = mx::contiguous(mx::astype(a, mx::float32));
  mx::eval(f);
  const float *p = f.data<float>();
  return std::vector<double>(p, p + f.size());
}

double bf16_ulp(double x) {
  const double e = std::floor(std::log2(std::max(std::fabs(x), std::ldexp(1.0, -126))));
  return std::ldexp(1.0, static_cast<int>(e) - 7);
}

struct Agreement {
  double max_abs = 0, max_rel = 0, of_tolerance = 0, exact = 0;
  size_t values = 0;
};

/** The engine test's output bound, per value; `scale` is the step's max |y|. */
Agreement compare_output(const std::vector<double> &got, const std::vector<double> &want,
                         double abs_fraction) {
  Agreement a;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  size_t same = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    const double allowed =
        2.0 * bf16_ulp(std::max(std::fabs(got[i]), std::fabs(want[i]))) + abs_fraction * scale;
    a.max_abs = std::max(a.max_abs, d);
    a.of_tolerance = std::max(a.of_tolerance, d / allowed);
    same += d == 0 ? 1 : 0;
  }
  a.values = want.size();
  a.max_rel = scale > 0 ? a.max_abs / scale : a.max_abs;
  a.exact = want.empty() ? 1.0 : static_cast<double>(same) / static_cast<double>(want.size());
  return a;
}

int run_reference(const Options &o) {
  const Config config = make_config(o.config);
  qwen35::Shard{o.ranks, 0}.check(config);
  const qwen35::Weights weights = qwen35::Weights::random(config, o.seed);
  const std::vector<Step> steps = plan();
  const std::vector<mx::array> x = inputs(config, steps, o.seed);

  // The ranks' results first: a missing or foreign file is an error before any work.
  std::vector<mx::SafetensorsLoad> ranks;
  for (int r = 0; r < o.ranks; ++r) {
    const std::string file = rank_file(o.out, r);
    ranks.push_back(mx::load_safetensors(file));
    const auto &meta = ranks.back().second;
    const std::vector<std::pair<std::string, std::string>> expected = {
        {"ranks", std::to_string(o.ranks)}, {"config", o.config}, {"reduce", o.reduce}};
    for (const auto &[key, want] : expected) {
      const auto it = meta.find(key);
      if (it == meta.end() || it->second != want)
        throw std::invalid_argument("--out: " + file + " holds " + key + " '" +
                                    (it == meta.end() ? "" : it->second) + "', expected '" +
                                    want + "' (--" + key + ")");
    }
  }

  // Each sequence alone through the one-process layer, step by step as the plan runs it.
  std::vector<qwen35::GatedDeltaNet> layers;
  for (int s = 0; s < kSequences; ++s) layers.emplace_back(config, weights);
  std::vector<std::vector<mx::array>> y(kSequences);
  std::vector<int> position(kSequences, 0);
  const auto begin = std::chrono::steady_clock::now();
  for (const Step &s : steps) {
    for (const Row &r : s.rows) {
      qwen35::GatedDeltaNet &layer = layers[r.sequence];
      const mx::array chunk =
          mx::expand_dims(rows_of(x[r.sequence], position[r.sequence], s.tokens), 0);
      mx::array out(0.0f);
      if (s.verify) {
        out = layer.verify(chunk);
        layer.accept(r.accepted);
      } else {
        out = layer.forward(chunk, s.recurrence);
      }
      mx::eval(layer.step_outputs(out));
      y[r.sequence].push_back(mx::squeeze(out, 0));
      position[r.sequence] += s.tokens;
    }
  }
  const double run_ms = ms_since(begin);
  std::printf("reference: the one-process layer (hidden %d, Hk %d, Hv %d, Dk %d, Dv %d), each "
              "sequence alone, %.1f ms\n",
              config.hidden_size, config.key_heads, config.value_heads, config.key_dim,
              config.value_dim, run_ms);

  // The engine test's absolute term; an all_sum in bfloat16 rounds each rank's partial product
  // (half an ulp: 2^-9 of a partial of the order of the step's outputs) and each of the ring's
  // R - 1 additions once more: R more such terms.
  const double engine_fraction =
      std::ldexp(1.0, -9) *
      std::sqrt(std::max(1.0, 4096.0 / (config.value_heads * config.value_dim)));
  const double abs_fraction =
      engine_fraction + (o.reduce == "model" ? o.ranks * std::ldexp(1.0, -9) : 0.0);
  bool ok = true;

  // Outputs: every step's rows, rank 0 against the reference; every rank against rank 0.
  std::printf("  %-32s %-5s %8s %10s %13s %8s %7s\n", "output, rank 0 vs one process", "",
              "values", "max|d|", "max|d|/max|y|", "exact", "of tol");
  Agreement worst;
  std::fill(position.begin(), position.end(), 0);
  std::vector<size_t> taken(kSequences, 0);  // the reference's outputs of each sequence used
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step &s = steps[i];
    std::vector<double> got, want;
    for (const Row &r : s.rows) {
      const std::vector<double> g = to_doubles(
          rows_of(ranks[0].first.at("y" + std::to_string(r.sequence)), position[r.sequence],
                  s.tokens));
      const std::vector<double> w = to_doubles(y[r.sequence][taken[r.sequence]++]);
      got.insert(got.end(), g.begin(), g.end());
      want.insert(want.end(), w.begin(), w.end());
      position[r.sequence] += s.tokens;
    }
    const Agreement a = compare_output(got, want, abs_fraction);
    std::printf("  step %2zu %-24s T=%-3d %8zu %10.3g %13.3g %7.2f%% %7.2f %s\n", i,
                s.name.c_str(), s.tokens, a.values, a.max_abs, a.max_rel, 100 * a.exact,
                a.of_tolerance, a.of_tolerance <= 1 ? "ok" : "FAIL");
    ok = ok && a.of_tolerance <= 1;
    worst.max_abs = std::max(worst.max_abs, a.max_abs);
    worst.max_rel = std::max(worst.max_rel, a.max_rel);
    worst.of_tolerance = std::max(worst.of_tolerance, a.of_tolerance);
  }
  for (int r = 1; r < o.ranks; ++r)
    for (int s = 0; s < kSequences; ++s) {
      const std::string name = "y" + std::to_string(s);
      const bool same = mx::array_equal(ranks[r].first.at(name), ranks[0].first.at(name))
                            .item<bool>();
      if (!same) std::printf("FAIL: rank %d's output of sequence %d differs from rank 0's\n", r, s);
      ok = ok && same;
    }

  // States: each rank's slot against its heads / channels of the one-process layer's.
  double state_rel = 0, conv_ulps = 0, state_exact = 0, conv_exact = 0;
  size_t state_values = 0, conv_values = 0;
  for (int r = 0; r < o.ranks; ++r) {
    const qwen35::Shard shard{o.ranks, r};
    for (int s = 0; s < kSequences; ++s) {
      const mx::array full = mx::squeeze(layers[s].state(), 0);  // [Hv, Dv, Dk]
      const std::vector<double> want =
          to_doubles(shard.value_heads(full, config, 0, 1));
      const std::vector<double> got = to_doubles(ranks[r].first.at("state" + std::to_string(s)));
      double scale = 0, d = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        d = std::max(d, std::fabs(got[i] - want[i]));
        state_exact += got[i] == want[i] ? 1 : 0;
      }
      state_values += want.size();
      state_rel = std::max(state_rel, scale > 0 ? d / scale : d);
      const std::vector<double> conv_want =
          to_doubles(shard.channels(mx::squeeze(layers[s].conv_state(), 0), config, 1));
      const std::vector<double> conv_got =
          to_doubles(ranks[r].first.at("conv" + std::to_string(s)));
      for (size_t i = 0; i < conv_want.size(); ++i) {
        const double cd = std::fabs(conv_got[i] - conv_want[i]);
        conv_ulps = std::max(
            conv_ulps, cd / bf16_ulp(std::max(std::fabs(conv_got[i]), std::fabs(conv_want[i]))));
        conv_exact += cd == 0 ? 1 : 0;
      }
      conv_values += conv_want.size();
    }
  }
  const bool states_ok = state_rel <= std::ldexp(1.0, -8) && conv_ulps <= 1.0;
  ok = ok && states_ok;
  std::printf("  recurrent states (every rank's slots): max |ds|/max|s| %.3g (bound 2^-8), "
              "exact %.2f%%; conv states: max %.2f bf16 ulp (bound 1), exact %.2f%% %s\n",
              state_rel, 100 * state_exact / static_cast<double>(state_values), conv_ulps,
              100 * conv_exact / static_cast<double>(conv_values), states_ok ? "ok" : "FAIL");
  std::printf("%s: %d ranks (%s all_sum), %s config, seed %llu: outputs max |d| %.3g, max "
              "|d|/max|y| %.3g, worst |d|/tolerance %.2f (2 ulp + %.3g max|y|%s); every rank's "
              "output the same bits as rank 0's%s\n",
              ok ? "PASS" : "FAIL", o.ranks, o.reduce.c_str(), o.config.c_str(),
              static_cast<unsigned long long>(o.seed), worst.max_abs, worst.max_rel,
              worst.of_tolerance, abs_fraction,
              o.reduce == "model" ? ": the engine test's term + R 2^-9" : ": the engine test's",
              ok ? "" : " (or not: see above)");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    mlxk::check_abi();
    const Options o = parse(argc, argv);
    return o.mode == "rank" ? run_rank(o) : run_reference(o);
  } catch (const mlxk::Error &error) {
    std::fprintf(stderr, "qwen35_tp: mlxkern error %s: %s\n", error.status_name(),
                 error.message().c_str());
  } catch (const std::exception &error) {
    std::fprintf(stderr, "qwen35_tp: %s\n", error.what());
  }
  return 2;
}
