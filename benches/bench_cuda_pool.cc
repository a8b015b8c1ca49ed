// `make bench-cuda`'s pool rows (bench_cuda.h): mlxkern's calls on a pool of states by slot
// on the GPU, the cases of benches/pool_cases.h (shared with the CPU's benches/pool.cpp):
//   pool    continuous batching: a pool of 64 slots per layer, 32 sequences decoding, a join
//           (a 16-64 token prefill from zeros, fresh flag) every 8 steps; 30 layers, one graph
//           per step: mlxk_gated_delta_update_pool (old pool freed; "mlxkern pool"), one
//           mlxk_gated_delta_update_packed per step ("mlxkern packed"), mx::take -> dense
//           kernel -> mx::scatter (one eval, "take+kernel+scatter", and two: take + kernel,
//           then the scatters, "take+kernel, scatter") and the dense kernel alone on
//           a dense [32, ...] state (the "floor" column: each path's time over the dense
//           kernel's; the target for the pool call is 1.05)
//   packed  packed prefill: 16 prompts of 64-2048 tokens (fixed seed), one layer: packed,
//           padded with a mask, one call per prompt; exact and chunked (the chunked form is
//           CPU-only: those rows are skipped with the library's message)
//   packed16k  packed prefill of 8 prompts of mixed lengths summing 16384 tokens
//           (kMixedLengths; the same lengths as benches/peer_fla.py's varlen row), the same
//           rows, and one sequence of 16384 tokens, exact and chunked: the packed call's
//           yardstick (packed / one sequence, aimed at 1.1 at most)
// Before timing, the pool paths' y and pools are compared bit for bit, and packed against per
// prompt; a failed comparison is printed and makes the run's exit status nonzero. A call that
// fails skips its row with the error printed.

#include "bench_cuda.h"
#include "pool_cases.h"

namespace bench_cuda {

namespace {

// Extra figures of a row: a JSON line without "impl" (not a timing row for chart_cuda.py).
void detail(const std::string& group, const std::string& what, const std::string& text) {
  std::printf("%-8s   %s\n", group.c_str(), text.c_str());
  if (json) {
    std::fprintf(json, "{\"group\":\"%s\",\"detail\":\"%s\",\"text\":\"%s\"}\n", group.c_str(),
                 what.c_str(), text.c_str());
    std::fflush(json);
  }
}

// The rows' names for pool_cases.h's paths.
std::string impl_name(const std::string& path) {
  if (path == "pool") return "mlxkern pool";
  if (path == "packed") return "mlxkern packed";
  if (path == "gather") return "take+kernel+scatter";
  if (path == "gather2") return "take+kernel, scatter";  // two evals
  return path;
}

}  // namespace

bool pool_batching(bool quick) {
  using namespace pool_cases;
  BatchingConfig c;
  c.layers = kLayers;
  c.rounds = quick ? 3 : 10;
  c.gpu = true;
  const std::string name = "batching N=" + std::to_string(c.slots) + " B=" + std::to_string(c.active) +
                           " (30 layers)";
  std::printf("pool     %s: a join (prefill %d-%d tokens) every %d steps, %d timed cycles\n",
              name.c_str(), c.min_prefill, c.max_prefill, c.cycle, c.rounds);
  const BatchingResult r = run_batching(c);
  const Path* dense = r.find("dense");
  const double floor_us = dense ? mean_step(*dense, 1) * 1e6 : 0;
  if (dense) row("pool", name, "dense kernel", floor_us, c.layers, mean_bytes(*dense, c), 0);
  for (const auto& p : r.paths) {
    if (!p->skipped.empty()) {
      std::printf("pool     %-34s %-12s skipped: %s\n", name.c_str(), impl_name(p->name).c_str(),
                  p->skipped.c_str());
      continue;
    }
    if (p.get() == dense) continue;
    row("pool", name, impl_name(p->name), mean_step(*p, 1) * 1e6, c.layers, mean_bytes(*p, c),
        floor_us);
  }
  for (const auto& p : r.paths) {
    if (!p->skipped.empty()) continue;
    char text[256];
    std::snprintf(text, sizeof text,
                  "%s: decode step %.2f us/layer, join step %.2f us/layer (medians), pool buffer "
                  "kept: %s%s",
                  impl_name(p->name).c_str(), median(p->decode_s) * 1e6 / c.layers,
                  median(p->join_s) * 1e6 / c.layers, p->in_place() ? "yes" : "no",
                  p->pool_path() && !p->in_place() ? " (a copy of N per step counted)" : "");
    detail("pool", p->name, text);
  }
  return r.ok;
}

namespace {

// The rows of one packed-prefill case under `group`.
bool print_prefill(const std::string& group, const pool_cases::PrefillResult& r) {
  using namespace pool_cases;
  std::string lengths;
  for (int l : r.lengths) lengths += (lengths.empty() ? "" : " ") + std::to_string(l);
  const std::string name = std::to_string(r.cfg.prompts) + " prompts, " + std::to_string(r.total) +
                           " tokens (1 layer)";
  detail(group, "lengths", "lengths " + lengths + " (seed " + std::to_string(r.cfg.seed) + ")");
  const PrefillRow* base[2] = {nullptr, nullptr};
  for (const PrefillRow& x : r.rows)
    if (x.name.rfind("per prompt", 0) == 0 && x.skipped.empty() && !x.s.empty()) base[x.chunked] = &x;
  for (const PrefillRow& x : r.rows) {
    if (!x.skipped.empty() || x.s.empty()) {
      std::printf("%-8s %-34s %-20s skipped: %s\n", group.c_str(), name.c_str(), x.name.c_str(),
                  x.skipped.c_str());
      continue;
    }
    const double us = median(x.s) * 1e6;
    const double vs = base[x.chunked] ? median(base[x.chunked]->s) * 1e6 / us : 0;
    std::printf("%-8s %-34s %-20s %10.1f us  %10.0f tok/s  (%.0f tokens computed)  %5.2fx per prompt\n",
                group.c_str(), name.c_str(), x.name.c_str(), us, x.tokens / (us * 1e-6),
                x.computed_tokens, vs);
    if (json) {
      std::fprintf(json,
                   "{\"group\":\"%s\",\"case\":\"%s\",\"impl\":\"%s\",\"us_per_layer\":%.3f,"
                   "\"tokens_per_s\":%.1f,\"computed_tokens\":%.0f,\"speedup_vs_per_prompt\":%.4f,"
                   "\"vs_floor\":0}\n",
                   group.c_str(), name.c_str(), x.name.c_str(), us, x.tokens / (us * 1e-6),
                   x.computed_tokens, vs);
      std::fflush(json);
    }
  }
  return r.ok;
}

}  // namespace

bool pool_prefill(bool quick) {
  pool_cases::PrefillConfig c;
  c.rounds = quick ? 2 : 5;
  return print_prefill("packed", pool_cases::run_prefill(c));
}

bool packed_mixed(bool quick) {
  using namespace pool_cases;
  PrefillConfig c;
  c.lengths = {kMixedLengths, kMixedLengths + sizeof(kMixedLengths) / sizeof(kMixedLengths[0])};
  c.slots = 8;
  c.rounds = quick ? 2 : 5;
  const PrefillResult r = run_prefill(c);
  const bool ok = print_prefill("packed16k", r);
  // The yardstick: one sequence of the same total length, dense, exact and chunked.
  const Gates gates;
  const Acts one = random_acts(1, r.total, 4242);
  for (bool chunked : {false, true}) {
    const std::string impl = chunked ? "one sequence chunked" : "one sequence";
    std::vector<double> s;
    try {
      for (int i = 0; i < c.rounds + 1; ++i) {
        const auto t0 = Clock::now();
        Update u = dense_call(one, gates, nullptr, nullptr, chunked);
        mx::eval({u.y.to_mlx(), u.state.to_mlx()});
        if (i > 0) s.push_back(seconds_since(t0));  // the first is the warm-up
      }
    } catch (const std::exception& e) {
      std::printf("packed16k one sequence of %d tokens: skipped: %s\n", r.total, error_text(e).c_str());
      continue;
    }
    const double us = median(s) * 1e6;
    double packed_us = 0;
    for (const PrefillRow& x : r.rows)
      if (x.chunked == chunked && x.name.rfind("packed", 0) == 0 && !x.s.empty()) packed_us = median(x.s) * 1e6;
    const std::string name = "1 sequence, " + std::to_string(r.total) + " tokens (1 layer)";
    std::printf("packed16k %-33s %-20s %10.1f us  packed / one sequence = %.2fx\n", name.c_str(),
                impl.c_str(), us, packed_us > 0 ? packed_us / us : 0.0);
    if (json) {
      std::fprintf(json,
                   "{\"group\":\"packed16k\",\"case\":\"%s\",\"impl\":\"%s\",\"us_per_layer\":%.3f,"
                   "\"packed_over_one\":%.4f,\"vs_floor\":0}\n",
                   name.c_str(), impl.c_str(), us, packed_us > 0 ? packed_us / us : 0.0);
      std::fflush(json);
    }
  }
  return ok;
}

}  // namespace bench_cuda
