// The pool benchmark on the CPU (`make bench`'s "pool" section; MLXK_BENCH_ONLY=pool runs it
// alone): mlxkern's engine-shaped calls on a pool of recurrent states against what engines do
// with MLX ops, at Qwen3.5-35B-A3B dims (Hk 16, Hv 32, Dk = Dv = 128, bf16 q/k/v), one layer.
// The cases, inputs, checks and timing are benches/pool_cases.h's (shared with the MLX CUDA
// rows, benches/bench_cuda_pool.cc):
//
//   continuous batching  a pool of 64 slots, 32 sequences decoding; every 8 steps one leaves and
//                        a new one joins with a 16-64 token prefill (fresh flag). Per step:
//                        (a) pool     mlxk_gated_delta_update_pool, old pool freed (in place)
//                        (a2) packed  one mlxk_gated_delta_update_packed per step
//                        (b) gather   mx::take -> dense mlxk_gated_delta_update -> mx::scatter
//                                     in one graph (gather2: in two evals, the scatter in place)
//                        (c) dense    the dense kernel alone on a dense [32, ...] state
//                        ms/step (mean over whole cycles, median decode step, median join step),
//                        state bytes read + written per step (from the shapes and what each path
//                        does; whether the pool's buffer stayed the same, i.e. no copy of N, is
//                        observed), the ratios (a)/(c) (target <= 1.05) and (b)/(a)
//   packed prefill       16 prompts of 64-2048 tokens (fixed seed): packed, padded with a mask,
//                        one call per prompt; exact and chunked; tokens/s of real tokens
//   speculative trees    a draft tree of 16, 32 and 64 nodes (benches/tree_cases.h): one tree
//                        verify against the same nodes as separate chain verifies; ms a verify
//
//   pool OUTPUT.json [batching|prefill|tree]   (MLXK_BENCH_QUICK=1: fewer rounds)
//
// Built by scripts/bench/run.sh against the .venv's MLX (the libmlx mlxkern links).
#include "pool_cases.h"
#include "tree_cases.h"

#include <cstdlib>
#include <cstring>

#include "mlxk_test_util.h"
// The machine's description and JSON strings only (its timing is for the C drivers).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "harness.h"
#pragma GCC diagnostic pop

namespace {

using namespace pool_cases;

const char* yes_no(bool v) { return v ? "yes" : "no"; }

void print_batching(const BatchingResult& r) {
  const Path* pool = r.find("pool");
  const Path* dense = r.find("dense");
  std::printf("  %-7s %9s %10s %10s %10s %8s %9s  %s\n", "path", "ms/step", "decode ms", "join ms",
              "MiB/step", "GB/s", "in place", "vs dense");
  for (const auto& p : r.paths) {
    if (!p->skipped.empty()) {
      std::printf("  %-7s skipped: %s\n", p->name.c_str(), p->skipped.c_str());
      continue;
    }
    const double mean = mean_step(*p, r.cfg.layers), bytes = mean_bytes(*p, r.cfg);
    std::printf("  %-7s %9.3f %10.3f %10.3f %10.0f %8.2f %9s", p->name.c_str(), mean * 1e3,
                median(p->decode_s) * 1e3 / r.cfg.layers, median(p->join_s) * 1e3 / r.cfg.layers,
                bytes / (1 << 20), bytes / mean * 1e-9, yes_no(p->in_place()));
    if (dense) std::printf("  %7.3fx", mean / mean_step(*dense, r.cfg.layers));
    std::printf("\n");
  }
  std::printf("  MiB/step: state bytes read + written per step (S = 2 MiB a state, B = %d, N = %d): pool, "
              "packed and dense 2*B*S (+S on a join step), gather 6*B*S (+3*S: take, kernel, "
              "scatter); + 2*N*S where the pool's buffer changed (\"in place\" no: a copy of N)\n",
              r.cfg.active, r.cfg.slots);
  if (pool && dense)
    std::printf("  (a) pool / (c) dense: %.3fx per step (target <= 1.05: %s), decode steps %.3fx\n",
                mean_step(*pool, 1) / mean_step(*dense, 1),
                mean_step(*pool, 1) <= 1.05 * mean_step(*dense, 1) ? "met" : "NOT met",
                median(pool->decode_s) / median(dense->decode_s));
  for (const char* g : {"gather", "gather2"})
    if (const Path* gather = r.find(g); gather && pool)
      std::printf("  (b) %s / (a) pool: %.3fx per step\n", g, mean_step(*gather, 1) / mean_step(*pool, 1));
}

void json_checks(FILE* f, const std::vector<Check>& checks) {
  std::fprintf(f, "[");
  for (std::size_t i = 0; i < checks.size(); ++i) {
    std::fprintf(f, "%s{\"what\": ", i ? ", " : "");
    json_string(f, checks[i].what.c_str());
    std::fprintf(f, ", \"result\": ");
    json_string(f, checks[i].result.c_str());
    std::fprintf(f, ", \"documented_equal\": %s, \"ok\": %s}", checks[i].must ? "true" : "false",
                 checks[i].ok ? "true" : "false");
  }
  std::fprintf(f, "]");
}

void json_batching(FILE* f, const BatchingResult& r) {
  const BatchingConfig& c = r.cfg;
  std::fprintf(f, "{\"slots\": %d, \"active\": %d, \"cycle\": %d, \"prefill_tokens\": [%d, %d], "
                  "\"layers\": %d, \"rounds\": %d, \"state_bytes\": %.0f, \"prefill_lengths\": [",
               c.slots, c.active, c.cycle, c.min_prefill, c.max_prefill, c.layers, c.rounds,
               kStateBytes);
  for (std::size_t i = 0; i < r.prefill_lengths.size(); ++i)
    std::fprintf(f, "%s%d", i ? ", " : "", r.prefill_lengths[i]);
  std::fprintf(f, "], \"checks\": ");
  json_checks(f, r.checks);
  std::fprintf(f, ", \"paths\": [");
  bool first = true;
  for (const auto& p : r.paths) {
    std::fprintf(f, "%s{\"path\": ", first ? "" : ", ");
    first = false;
    json_string(f, p->name.c_str());
    std::fprintf(f, ", \"note\": ");
    json_string(f, p->note.c_str());
    if (!p->skipped.empty()) {
      std::fprintf(f, ", \"skipped\": ");
      json_string(f, p->skipped.c_str());
      std::fprintf(f, "}");
      continue;
    }
    const double mean = mean_step(*p, c.layers), bytes = mean_bytes(*p, c);
    std::fprintf(f, ", \"ms_per_step\": %.4f, \"decode_step_median_ms\": %.4f, "
                    "\"join_step_median_ms\": %.4f, \"timed_steps\": %zu, \"in_place\": %s, "
                    "\"state_bytes_per_step\": %.0f, \"state_bytes_decode_step\": %.0f, "
                    "\"state_bytes_join_step\": %.0f, \"gb_per_s\": %.3f}",
                 mean * 1e3, median(p->decode_s) * 1e3 / c.layers,
                 median(p->join_s) * 1e3 / c.layers, p->decode_s.size() + p->join_s.size(),
                 p->in_place() ? "true" : "false", bytes, p->bytes(false), p->bytes(true),
                 bytes / mean * 1e-9);
  }
  std::fprintf(f, "]");
  const Path *pool = r.find("pool"), *dense = r.find("dense"), *gather = r.find("gather"),
             *gather2 = r.find("gather2"), *packed = r.find("packed");
  auto ratio = [&](const Path* a, const Path* b) {
    return a && b ? mean_step(*a, 1) / mean_step(*b, 1) : -1.0;
  };
  std::fprintf(f, ", \"pool_over_dense\": %.4f, \"gather_over_pool\": %.4f, "
                  "\"gather2_over_pool\": %.4f, \"packed_over_dense\": %.4f, "
                  "\"target_pool_over_dense\": 1.05, \"met\": %s}",
               ratio(pool, dense), ratio(gather, pool), ratio(gather2, pool), ratio(packed, dense),
               pool && dense ? (ratio(pool, dense) <= 1.05 ? "true" : "false") : "null");
}

void print_prefill(const PrefillResult& r) {
  const PrefillRow* base[2] = {nullptr, nullptr};
  for (const PrefillRow& row : r.rows)
    if (row.name.rfind("per prompt", 0) == 0 && row.skipped.empty() && !row.s.empty())
      base[row.chunked] = &row;
  std::printf("  %-20s %10s %12s %16s  %s\n", "row", "ms/call", "tokens/s", "computed tokens",
              "vs per prompt");
  for (const PrefillRow& row : r.rows) {
    if (!row.skipped.empty() || row.s.empty()) {
      std::printf("  %-20s skipped: %s\n", row.name.c_str(), row.skipped.c_str());
      continue;
    }
    const double t = median(row.s);
    std::printf("  %-20s %10.1f %12.0f %16.0f", row.name.c_str(), t * 1e3, row.tokens / t,
                row.computed_tokens);
    if (const PrefillRow* b = base[row.chunked]) std::printf("  %7.3fx", median(b->s) / t);
    std::printf("\n");
  }
}

void json_prefill(FILE* f, const PrefillResult& r) {
  std::fprintf(f, "{\"prompts\": %d, \"length_range\": [%d, %d], \"seed\": %u, \"rounds\": %d, "
                  "\"total_tokens\": %d, \"longest\": %d, \"lengths\": [",
               r.cfg.prompts, r.cfg.min_len, r.cfg.max_len, r.cfg.seed, r.cfg.rounds, r.total, r.longest);
  for (std::size_t i = 0; i < r.lengths.size(); ++i) std::fprintf(f, "%s%d", i ? ", " : "", r.lengths[i]);
  std::fprintf(f, "], \"checks\": ");
  json_checks(f, r.checks);
  std::fprintf(f, ", \"rows\": [");
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const PrefillRow& row = r.rows[i];
    std::fprintf(f, "%s{\"row\": ", i ? ", " : "");
    json_string(f, row.name.c_str());
    std::fprintf(f, ", \"form\": \"%s\", \"note\": ", row.chunked ? "chunked" : "exact");
    json_string(f, row.note.c_str());
    if (!row.skipped.empty() || row.s.empty()) {
      std::fprintf(f, ", \"skipped\": ");
      json_string(f, row.skipped.c_str());
      std::fprintf(f, "}");
      continue;
    }
    const double t = median(row.s);
    std::fprintf(f, ", \"ms_per_call\": %.3f, \"samples\": %zu, \"tokens\": %.0f, "
                    "\"computed_tokens\": %.0f, \"tokens_per_s\": %.1f}",
                 t * 1e3, row.s.size(), row.tokens, row.computed_tokens, row.tokens / t);
  }
  std::fprintf(f, "]}");
}

BatchingResult batching_section(bool quick) {
  BatchingConfig c;
  c.rounds = quick ? 4 : 16;
  std::printf("== continuous batching: pool of %d slots, %d sequences decoding, a join (prefill of "
              "%d-%d tokens, fresh) every %d steps; %d layer, %d timed cycles a path ==\n",
              c.slots, c.active, c.min_prefill, c.max_prefill, c.cycle, c.layers, c.rounds);
  BatchingResult r = run_batching(c);
  std::printf("  prefill lengths of the joins:");
  for (int l : r.prefill_lengths) std::printf(" %d", l);
  std::printf("\n");
  print_batching(r);
  return r;
}

PrefillResult prefill_section(bool quick) {
  PrefillConfig c;
  c.rounds = quick ? 1 : 5;
  std::printf("== packed prefill: %d prompts of %d-%d tokens (seed %u), from zeros; median of %d ==\n",
              c.prompts, c.min_len, c.max_len, c.seed, c.rounds);
  PrefillResult r = run_prefill(c);
  std::printf("  lengths:");
  for (int l : r.lengths) std::printf(" %d", l);
  std::printf(" (%d tokens, longest %d)\n", r.total, r.longest);
  print_prefill(r);
  return r;
}

std::vector<TreeResult> tree_section(bool quick) {
  std::printf("== speculative trees: one draft tree on a slot of a pool of 8, verified as one tree "
              "call and as one chain verify per node (one eval); median of %d ==\n",
              quick ? 3 : 20);
  std::printf("  %-7s %6s %7s %10s %10s %12s  %s\n", "nodes", "width", "depth", "row", "ms/verify",
              "kernel tok", "chains / tree");
  std::vector<TreeResult> out;
  for (const auto& [width, depth] : {std::pair{4, 4}, std::pair{8, 4}, std::pair{8, 8}}) {
    TreeConfig c;
    c.width = width;
    c.depth = depth;
    c.rounds = quick ? 3 : 20;
    TreeResult r = run_tree(c);
    const double tree = median(r.rows[0].s), chains = median(r.rows[1].s);
    for (const TreeRow& row : r.rows) {
      std::printf("  %-7d %6d %7d %10s %10.3f %12.0f", r.nodes, width, depth, row.name.c_str(),
                  median(row.s) * 1e3, row.tokens);
      if (row.name == "chains") std::printf("  %7.3fx", chains / tree);
      std::printf("\n");
    }
    out.push_back(std::move(r));
  }
  return out;
}

void json_trees(FILE* f, const std::vector<TreeResult>& trees) {
  std::fprintf(f, "[");
  for (std::size_t i = 0; i < trees.size(); ++i) {
    const TreeResult& r = trees[i];
    std::fprintf(f, "%s{\"nodes\": %d, \"leaves\": %d, \"width\": %d, \"depth\": %d, "
                    "\"rounds\": %d, \"checks\": ",
                 i ? ", " : "", r.nodes, r.leaves, r.cfg.width, r.cfg.depth, r.cfg.rounds);
    json_checks(f, r.checks);
    std::fprintf(f, ", \"rows\": [");
    for (std::size_t j = 0; j < r.rows.size(); ++j)
      std::fprintf(f, "%s{\"row\": \"%s\", \"kernel_tokens\": %.0f, \"ms_per_verify\": %.4f}",
                   j ? ", " : "", r.rows[j].name.c_str(), r.rows[j].tokens,
                   median(r.rows[j].s) * 1e3);
    std::fprintf(f, "], \"chains_over_tree\": %.4f}",
                 median(r.rows[1].s) / median(r.rows[0].s));
  }
  std::fprintf(f, "]");
}

int run(int argc, char** argv) {
  const std::string only = argc == 3 ? argv[2] : "";
  if (argc < 2 || argc > 3 ||
      (argc == 3 && only != "batching" && only != "prefill" && only != "tree")) {
    std::fprintf(stderr, "usage: %s OUTPUT.json [batching|prefill|tree]\n", argv[0]);
    return 2;
  }
  const char* quick_env = std::getenv("MLXK_BENCH_QUICK");
  const bool quick = quick_env && quick_env[0] != '\0' && std::strcmp(quick_env, "0") != 0;
  const auto begin = Clock::now();
  char load_start[64], load_end[64], host_text[320];
  read_loadavg(load_start, sizeof load_start);
  const HostInfo host = host_info();
  host_line(&host, host_text, sizeof host_text);
  std::printf("pool: mlxkern %s on MLX %s%s\n  machine: %s\n  1-minute load average at start: %s\n",
              mlxk_version(), mlxk_mlx_version(), quick ? "; quick mode" : "", host_text, load_start);

  BatchingResult batching;
  if (only.empty() || only == "batching") batching = batching_section(quick);
  PrefillResult prefill;
  if (only.empty() || only == "prefill") prefill = prefill_section(quick);
  std::vector<TreeResult> trees;
  if (only.empty() || only == "tree") trees = tree_section(quick);
  bool trees_ok = true;
  for (const TreeResult& t : trees) trees_ok = trees_ok && t.ok;

  read_loadavg(load_end, sizeof load_end);
  const double total = seconds_since(begin);
  FILE* f = std::fopen(argv[1], "w");
  if (!f) {
    std::fprintf(stderr, "pool: cannot write %s\n", argv[1]);
    return 1;
  }
  std::fprintf(f, "{\"tool\": \"mlxkern benches/pool.cpp\", \"library_version\": \"%s\", "
                  "\"mlx_version\": \"%s\", \"quick\": %s, ",
               mlxk_version(), mlxk_mlx_version(), quick ? "true" : "false");
  host_json(f, &host);
  std::fprintf(f, ", \"dims\": {\"Hk\": %d, \"Hv\": %d, \"Dk\": %d, \"Dv\": %d, \"qkv\": \"bfloat16\", "
                  "\"state\": \"float32\"}, \"loadavg_start\": %s, \"loadavg_end\": %s, "
                  "\"total_s\": %.1f",
               kHk, kHv, kD, kD, load_start, load_end, total);
  if (only.empty() || only == "batching") {
    std::fprintf(f, ",\n \"continuous_batching\": ");
    json_batching(f, batching);
  }
  if (only.empty() || only == "prefill") {
    std::fprintf(f, ",\n \"packed_prefill\": ");
    json_prefill(f, prefill);
  }
  if (only.empty() || only == "tree") {
    std::fprintf(f, ",\n \"speculative_trees\": ");
    json_trees(f, trees);
  }
  std::fprintf(f, "}\n");
  std::fclose(f);
  std::printf("  1-minute load average at end: %s\npool: %.1f s -> %s\n", load_end, total, argv[1]);
  if (!batching.ok || !prefill.ok || !trees_ok) {
    std::fprintf(stderr, "pool: a documented bit-for-bit equality FAILED (above)\n");
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const mlxk::Error& error) {
    std::fprintf(stderr, "pool: mlxkern error %s: %s\n", error.status_name(), error.message().c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pool: %s\n", error.what());
  }
  return 1;
}
