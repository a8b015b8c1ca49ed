// The gradient benchmark, mlxkern's side: one layer's forward (mlxk_gated_delta_update, or
// mlxk_gated_delta_update_chunked) or backward (mlxk_gated_delta_update_vjp, or
// mlxk_gated_delta_update_chunked_vjp) at Qwen3.5-35B-A3B's dims (B = 1, Hk 16, Hv 32,
// Dk = Dv = 128, bfloat16 activations, no initial state), through the C ABI, in a process of
// its own so that its peak memory is that one operation's:
//
//   grad OUTPUT.json T PHASE        PHASE: fwd (y and the state) or bwd (all eight gradients
//                                   from the cotangents dy, bfloat16, and dstate_out, float32);
//                                   cfwd, cbwd: the same for the chunked form (default chunk)
//
// Time: warm-up, then timed samples (benches/harness.h's measure(), with room for three samples
// of the multi-second backward at T = 4096). Memory, from just before the first call (inputs
// made and evaluated) to the end of the timed samples:
//   rss        the process's resident set: VmHWM - VmRSS at the start (/proc/self/status; the
//              high-water mark is reset to the current RSS there through /proc/self/clear_refs,
//              so the inputs' host staging does not count). Covers everything: MLX's buffers and
//              the kernels' own working memory (the backward's float32 copies and checkpoints).
//   mlx        MLX's allocator: mx::get_peak_memory() after mx::reset_peak_memory(), minus
//              mx::get_active_memory() at the start (the results' buffers; not the kernels'
//              working memory, which Rust allocates).
// Benches/grad_peer.py measures MLX's two paths the same way; scripts/bench/run.sh runs both per T.
// Inputs come from benches/inputs.h's generator (the prefill case's seeds, so q, k, v, a, b
// are bench.c's prefill inputs; dy and dstate_out have tags of their own), as in the peer.
// MLXK_BENCH_QUICK=1: the short timing budget.
//
// C++ for MLX's memory counters (mlx/memory.h); otherwise only include/mlxkern.h and the C
// bench helpers. Built by scripts/bench/run.sh against the .venv's MLX (the libmlx mlxkern links).
#include <mlx/memory.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "inputs.h"
#include "mlxkern.h"
#include "mlxk_test_util.h"
#include "harness.h"

namespace {

namespace mx = mlx::core;

constexpr int HK = 16, HV = 32, DK = 128, DV = 128;

struct Inputs {
  int tokens = 0;
  mlxk_array *q = nullptr, *k = nullptr, *v = nullptr, *a = nullptr, *b = nullptr;
  mlxk_array *a_log = nullptr, *dt_bias = nullptr, *dy = nullptr, *dstate_out = nullptr;
  std::vector<mlxk_array *> all() const { return {q, k, v, a, b, a_log, dt_bias, dy, dstate_out}; }
};

mlxk_array *upload(const void *data, std::vector<int32_t> shape, mlxk_dtype dtype) {
  return mlxkt_new_array(data, shape.data(), shape.size(), dtype);
}

// bench.c's prefill inputs (B = 1, no state) and its shared a_log, dt_bias; dy ~ N(0, 1) and
// dstate_out ~ N(0, 0.05^2), the size of the bench's states.
Inputs make_inputs(int tokens) {
  Inputs in;
  in.tokens = tokens;
  const uint64_t cs = case_seed(KIND_PREFILL, 1, static_cast<uint64_t>(tokens), 0);
  const size_t n_qk = static_cast<size_t>(tokens) * HK * DK;
  const size_t n_v = static_cast<size_t>(tokens) * HV * DV;
  const size_t n_ab = static_cast<size_t>(tokens) * HV;
  std::vector<uint16_t> buf(n_v);
  fill_unit_rows_bf16(buf.data(), n_qk / DK, DK, tensor_seed(TAG_Q, cs), 1.0 / std::sqrt(double(DK)));
  in.q = upload(buf.data(), {1, tokens, HK, DK}, MLXK_DTYPE_BFLOAT16);
  fill_unit_rows_bf16(buf.data(), n_qk / DK, DK, tensor_seed(TAG_K, cs), 1.0);
  in.k = upload(buf.data(), {1, tokens, HK, DK}, MLXK_DTYPE_BFLOAT16);
  fill_normal_bf16(buf.data(), n_v, tensor_seed(TAG_V, cs), 1.0);
  in.v = upload(buf.data(), {1, tokens, HV, DV}, MLXK_DTYPE_BFLOAT16);
  fill_normal_bf16(buf.data(), n_ab, tensor_seed(TAG_A, cs), 1.0);
  in.a = upload(buf.data(), {1, tokens, HV}, MLXK_DTYPE_BFLOAT16);
  fill_normal_bf16(buf.data(), n_ab, tensor_seed(TAG_B, cs), 1.0);
  in.b = upload(buf.data(), {1, tokens, HV}, MLXK_DTYPE_BFLOAT16);
  fill_normal_bf16(buf.data(), n_v, tensor_seed(TAG_DY, cs), 1.0);
  in.dy = upload(buf.data(), {1, tokens, HV, DV}, MLXK_DTYPE_BFLOAT16);

  const uint64_t shared = case_seed(KIND_SHARED, 0, 0, 0);
  float a_log[HV];
  uint16_t dt_bias[HV];
  for (int h = 0; h < HV; h++) {
    a_log[h] = static_cast<float>(std::log(1.0 + 15.0 * uniform_at(tensor_seed(TAG_A_LOG, shared), h)));
  }
  fill_normal_bf16(dt_bias, HV, tensor_seed(TAG_DT_BIAS, shared), 0.5);
  in.a_log = upload(a_log, {HV}, MLXK_DTYPE_FLOAT32);
  in.dt_bias = upload(dt_bias, {HV}, MLXK_DTYPE_BFLOAT16);

  std::vector<float> ds(static_cast<size_t>(HV) * DV * DK);
  for (size_t i = 0; i < ds.size(); i++) {
    ds[i] = static_cast<float>(normal_at(tensor_seed(TAG_DSTATE_OUT, cs), i) * 0.05);
  }
  in.dstate_out = upload(ds.data(), {1, HV, DV, DK}, MLXK_DTYPE_FLOAT32);
  for (mlxk_array *x : in.all()) CHECK_OK(mlxk_array_eval(x));
  return in;
}

bool chunked = false;  // the phase names the chunked form (cfwd, cbwd)

void forward(void *p) {
  const Inputs &in = *static_cast<const Inputs *>(p);
  mlxk_array *y, *s;
  if (chunked) {
    CHECK_OK(mlxk_gated_delta_update_chunked(in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias,
                                             nullptr, nullptr, 0, &y, &s));
  } else {
    CHECK_OK(mlxk_gated_delta_update(in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, nullptr,
                                     nullptr, &y, &s));
  }
  CHECK_OK(mlxk_array_eval(y));
  CHECK_OK(mlxk_array_eval(s));
  CHECK_OK(mlxk_array_free(y));
  CHECK_OK(mlxk_array_free(s));
}

// The eight results of the backward, evaluated (one node: the first eval computes them all).
std::vector<mlxk_array *> gradients(const Inputs &in) {
  std::vector<mlxk_array *> g(8);
  if (chunked) {
    CHECK_OK(mlxk_gated_delta_update_chunked_vjp(in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias,
                                                 nullptr, nullptr, 0, in.dy, in.dstate_out, &g[0],
                                                 &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], &g[7]));
  } else {
    CHECK_OK(mlxk_gated_delta_update_vjp(in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias,
                                         nullptr, nullptr, in.dy, in.dstate_out, &g[0], &g[1], &g[2],
                                         &g[3], &g[4], &g[5], &g[6], &g[7]));
  }
  for (mlxk_array *x : g) CHECK_OK(mlxk_array_eval(x));
  return g;
}

void backward(void *p) {
  for (mlxk_array *x : gradients(*static_cast<const Inputs *>(p))) CHECK_OK(mlxk_array_free(x));
}

// A /proc/self/status field in bytes (kB lines), or 0.
size_t status_bytes(const char *key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoull(line.c_str() + n + 1, nullptr, 10) * 1024;
    }
  }
  return 0;
}

// Resets VmHWM to the current VmRSS (Linux >= 4.0); false where that is not possible.
bool reset_peak_rss() {
  FILE *f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// sum |x| of each gradient, read back after the timing (the peer reports the same sums).
std::string gradient_sums(const Inputs &in) {
  static const char *const names[8] = {"dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"};
  std::vector<mlxk_array *> g = gradients(in);
  std::string out = "{";
  for (int i = 0; i < 8; i++) {
    size_t nbytes = 0;
    mlxk_dtype dtype;
    CHECK_OK(mlxk_array_nbytes(g[i], &nbytes));
    CHECK_OK(mlxk_array_dtype(g[i], &dtype));
    const size_t count = nbytes / (dtype == MLXK_DTYPE_BFLOAT16 ? 2 : 4);
    float *values = mlxkt_read_floats(g[i], count);
    double sum = 0.0;
    for (size_t j = 0; j < count; j++) sum += std::fabs(static_cast<double>(values[j]));
    std::free(values);
    char item[96];
    std::snprintf(item, sizeof item, "%s\"%s_abs_sum\": %.9g", i ? ", " : "", names[i], sum);
    out += item;
    CHECK_OK(mlxk_array_free(g[i]));
  }
  return out + "}";
}

}  // namespace

int main(int argc, char **argv) {
  std::string phase = argc == 4 ? argv[3] : "";
  const int tokens = argc == 4 ? std::atoi(argv[2]) : 0;
  if (phase == "cfwd" || phase == "cbwd") {
    chunked = true;
    phase = phase.substr(1);
  }
  if (tokens < 1 || (phase != "fwd" && phase != "bwd")) {
    std::fprintf(stderr, "usage: %s OUTPUT.json T fwd|bwd|cfwd|cbwd   (MLXK_BENCH_QUICK=1: short timing)\n",
                 argv[0]);
    return 2;
  }
  config_from_env();
  if (!cfg.quick) {
    cfg.max_case_s = 20.0;  // three samples of the backward at T = 4096 (3 to 6 s each here)
  }
  const double t_start = mlxkt_now_seconds();
  char load_start[64], load_end[64];
  read_loadavg(load_start, sizeof load_start);
  const HostInfo host = host_info();
  char host_text[320];
  host_line(&host, host_text, sizeof host_text);
  std::printf("mlxkern %s gradient bench, %s%s T=%d (%s): host %s; load average %s\n", mlxk_version(),
              chunked ? "chunked " : "", phase.c_str(), tokens, cfg.quick ? "quick" : "full", host_text, load_start);

  Inputs in = make_inputs(tokens);
  const bool hwm_reset = reset_peak_rss();
  const size_t rss0 = status_bytes("VmRSS");
  const size_t active0 = mx::get_active_memory();
  mx::reset_peak_memory();

  const bool fwd = phase == "fwd";
  const Stats st = measure(fwd ? forward : backward, &in, 1);
  const size_t rss_peak = status_bytes("VmHWM");
  const size_t mlx_peak = mx::get_peak_memory();
  const std::string sums = fwd ? "{}" : gradient_sums(in);

  const std::string id = std::string(fwd ? "grad_fwd_T" : "grad_bwd_T") + std::to_string(tokens);
  const std::string note =
      std::string(chunked ? (fwd ? "mlxk_gated_delta_update_chunked (y, state, chunk 32)"
                                 : "mlxk_gated_delta_update_chunked_vjp (8 gradients from dy, dstate_out, chunk 32)")
                          : (fwd ? "mlxk_gated_delta_update (y, state)"
                                 : "mlxk_gated_delta_update_vjp (8 gradients from dy, dstate_out)")) +
      ", no initial state, one process";
  add_record(id.c_str(), fwd ? "grad_fwd" : "grad_bwd", chunked ? "mlxkern_chunked" : "mlxkern", "call", 1,
             tokens, tokens, 0, st, note.c_str());
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::printf("  peak extra memory: process RSS %.3f GiB, MLX allocator %.3f GiB%s\n",
              double(rss_peak - std::min(rss_peak, rss0)) / gib,
              double(mlx_peak - std::min(mlx_peak, active0)) / gib,
              hwm_reset ? "" : " (VmHWM could not be reset: since the process started)");

  char extra[512];
  std::snprintf(extra, sizeof extra,
                ", \"phase\": \"%s\", \"rss_baseline_bytes\": %zu, \"rss_peak_bytes\": %zu, "
                "\"rss_extra_bytes\": %zu, \"rss_hwm_reset\": %s, \"mlx_active_baseline_bytes\": %zu, "
                "\"mlx_peak_bytes\": %zu, \"mlx_extra_bytes\": %zu",
                fwd ? "fwd" : "bwd", rss0, rss_peak, rss_peak - std::min(rss_peak, rss0),
                hwm_reset ? "true" : "false", active0, mlx_peak, mlx_peak - std::min(mlx_peak, active0));
  for (mlxk_array *x : in.all()) CHECK_OK(mlxk_array_free(x));
  read_loadavg(load_end, sizeof load_end);

  FILE *f = std::fopen(argv[1], "w");
  if (f == nullptr) {
    std::fprintf(stderr, "grad: cannot write %s\n", argv[1]);
    return 1;
  }
  std::fprintf(f, "{\n  \"tool\": \"mlxkern benches/grad.cpp\",\n  \"library_version\": ");
  json_string(f, mlxk_version());
  std::fprintf(f, ",\n  \"quick\": %s,\n  \"cpus_online\": %ld,\n  ", cfg.quick ? "true" : "false",
               host.cpus_online);
  host_json(f, &host);
  std::fprintf(f, ",\n  \"loadavg_start\": %s,\n  \"loadavg_end\": %s,\n", load_start, load_end);
  std::fprintf(f, "  \"dims\": {\"B\": 1, \"Hk\": %d, \"Hv\": %d, \"Dk\": %d, \"Dv\": %d, \"dtype\": \"bfloat16\","
                  " \"state\": \"none\"},\n", HK, HV, DK, DV);
  std::fprintf(f, "  \"timing\": {\"budget_s\": %g, \"max_case_s\": %g, \"min_reps\": %d, \"max_reps\": %d},\n",
               cfg.budget_s, cfg.max_case_s, cfg.min_reps, cfg.max_reps);
  std::fprintf(f, "  \"checks\": %s,\n  \"total_s\": %.3f,\n  \"records\": ", sums.c_str(),
               mlxkt_now_seconds() - t_start);
  write_records(f, extra);
  std::fprintf(f, "\n}\n");
  std::fclose(f);
  return 0;
}
