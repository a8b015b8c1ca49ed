// The Metal-text emulation test: for every generated case (emu_gen.inc), builds fresh random
// inputs, runs the library's CPU kernel through the C ABI (include/mlxkern.h), runs the Metal
// kernel file on the same inputs through the executor, and compares the outputs bit for bit
// (the recurrence's backward pass, whose CPU kernel sums in another order: within a tolerance,
// its exact invariants bit for bit). See README.md. C++17; no MLX header (MLX's own ops come
// from mlx_cpu_ops.cc).

// The parts: harness_cases.cc (the cases), harness_backward.cc (the backward cases), this file
// (the shim's numerics self-test, the known differences, main), harness.h (what they share).

#include "harness.h"

// emu_kernels.cc: the executor and shim self-test.
bool emu_shim_self_test(std::string* report);

namespace harness {
namespace {

// ------------------------------------------------------------------------------------------
// Self-tests of the shim's numerics against MLX's CPU ops.

void numerics_self_test() {
  // exp: a dense sweep of [-90, 90] plus random finite floats in that range.
  std::vector<float> x;
  for (float v = -90.0f; v <= 90.0f; v += 0.0009765625f) x.push_back(v);
  Rng rng{12345};
  for (int i = 0; i < (1 << 18); ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.next());
    const float f = mlxk_emu::bits_to_float(bits);
    if (std::isfinite(f) && std::fabs(f) < 100.0f) x.push_back(f);
  }
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(88.0f);
  x.push_back(-88.0f);
  std::vector<float> mlx_exp(x.size());
  if (mlxk_emu_mlx_exp_f32(x.data(), x.size(), mlx_exp.data()) != 0) die("MLX exp");
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (mlxk_emu::float_to_bits(mlxk_emu::exp_f32(x[i])) != mlxk_emu::float_to_bits(mlx_exp[i])) {
      if (bad++ < 3) {
        std::fprintf(stderr, "exp(%.9g): shim %.9g, MLX %.9g\n", x[i], mlxk_emu::exp_f32(x[i]),
                     mlx_exp[i]);
      }
    }
  }
  if (bad) die("the shim's exp differs from MLX's CPU exp on %zu of %zu values", bad, x.size());
  std::printf("PASS: metal-emu shim: exp(float) is MLX's CPU exp bit for bit (%zu values)\n",
              x.size());

  // float32 -> bfloat16 / float16: random bit patterns (NaN excluded) and edge values.
  std::vector<float> f;
  for (int i = 0; i < (1 << 20); ++i) {
    const float v = mlxk_emu::bits_to_float(static_cast<uint32_t>(rng.next()));
    if (!std::isnan(v)) f.push_back(v);
  }
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x477FEFFFu,
                     0x477FF000u, 0x477FE000u, 0x33000000u, 0x33000001u, 0x387FE000u,
                     0x387FF000u, 0x38800000u, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu}) {
    f.push_back(mlxk_emu::bits_to_float(b));
  }
  for (int i = 0; i < (1 << 16); ++i) {  // every half and bfloat16 value and its midpoints
    f.push_back(mlxk_emu::half_bits_to_float(static_cast<uint16_t>(i)));
    f.push_back(mlxk_emu::bfloat_bits_to_float(static_cast<uint16_t>(i)));
    const float h = mlxk_emu::half_bits_to_float(static_cast<uint16_t>(i));
    const float h1 = mlxk_emu::half_bits_to_float(static_cast<uint16_t>(i + 1));
    if (std::isfinite(h) && std::isfinite(h1)) f.push_back(0.5f * h + 0.5f * h1);
  }
  f.erase(std::remove_if(f.begin(), f.end(), [](float v) { return std::isnan(v); }), f.end());
  for (int dtype : {MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16}) {
    std::vector<uint16_t> mlx(f.size());
    if (mlxk_emu_mlx_astype(f.data(), f.size(), MLXK_DTYPE_FLOAT32, dtype, mlx.data()) != 0) {
      die("MLX astype");
    }
    size_t wrong = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t mine = dtype == MLXK_DTYPE_BFLOAT16 ? mlxk_emu::float_to_bfloat_bits(f[i])
                                                          : mlxk_emu::float_to_half_bits(f[i]);
      if (mine != mlx[i]) {
        if (wrong++ < 3) {
          std::fprintf(stderr, "%s(%.9g = 0x%08X): shim 0x%04X, MLX 0x%04X\n",
                       dtype_name(dtype), f[i], mlxk_emu::float_to_bits(f[i]), mine, mlx[i]);
        }
      }
    }
    if (wrong) die("float32 -> %s differs from MLX's astype on %zu values", dtype_name(dtype), wrong);
  }
  std::printf("PASS: metal-emu shim: float32 -> bfloat16 and -> float16 round to nearest even as "
              "MLX's astype (%zu values each)\n", f.size());
}

// ------------------------------------------------------------------------------------------
// Known differences: findings of the emulation, each documented in README.md with the side
// that is wrong. A known case must still differ (else the entry is stale: remove it), and the
// diagnostic variant build must make it bit-identical (scripts/test/metal-emu.sh runs it).

struct KnownDifference {
  const char* kind;
  int dtype;
  const char* finding;
};

const KnownDifference kKnownDifferences[] = {
    // None: every emulated launch matches the CPU kernels bit for bit.
    {nullptr, 0, nullptr},
};

const KnownDifference* known_difference(const EmuCase& c) {
  for (const auto& k : kKnownDifferences) {
    if (k.kind != nullptr && std::strcmp(k.kind, c.kind) == 0 && k.dtype == c.dtype) return &k;
  }
  return nullptr;
}

}  // namespace
}  // namespace harness

using namespace harness;

int main(int argc, char** argv) {
  // Arguments: case ids and/or --kind KIND, to run a subset.
  std::vector<int> only;
  std::vector<std::string> kinds;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kind") == 0 && i + 1 < argc) {
      kinds.push_back(argv[++i]);
    } else {
      only.push_back(std::atoi(argv[i]));
    }
  }
  if (const char* seed = std::getenv("METAL_EMU_SEED")) {
    g_seed_offset = std::strtoull(seed, nullptr, 0) * 0x9E3779B97F4A7C15ull;
    std::printf("metal-emu: METAL_EMU_SEED=%s\n", seed);
  }
  const std::string variant = emu_variant();
  const std::string tag = variant.empty() ? "metal-emu" : "metal-emu [" + variant + "]";

  if (variant.empty()) {
    numerics_self_test();
    std::string report;
    if (!emu_shim_self_test(&report)) die("executor/shim self-test: %s", report.c_str());
    std::printf("PASS: metal-emu executor: %s\n", report.c_str());
  }

  size_t count = 0;
  const EmuCase* cases = emu_cases(&count);
  int failures = 0, passes = 0, known = 0, within = 0;
  for (size_t i = 0; i < count; ++i) {
    const EmuCase& c = cases[i];
    if (!only.empty() && std::find(only.begin(), only.end(), c.id) == only.end()) continue;
    if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), c.kind) == kinds.end()) continue;
    // The chunked backward's later stages run with their stage 0 case.
    if (std::strcmp(c.kind, "backward_chunked_stage") == 0) continue;
    // A chunk prep and state case run with their output pass's case (two and one later).
    if (std::strcmp(c.kind, "chunk_prep") == 0 || std::strcmp(c.kind, "chunk_state") == 0 ||
        std::strcmp(c.kind, "chunk_pool_prep") == 0 ||
        std::strcmp(c.kind, "chunk_pool_state") == 0) {
      continue;
    }
    const Result r = run_case(c);
    char geometry[200];
    std::snprintf(geometry, sizeof geometry,
                  "grid (%u, %u, %u) threadgroup (%u, %u, %u): %" PRIu64 " threadgroups, %" PRIu64
                  " threads, %" PRIu64 " SIMD meetings, %" PRIu64 " barriers",
                  c.grid[0], c.grid[1], c.grid[2], c.threadgroup[0], c.threadgroup[1],
                  c.threadgroup[2], r.stats.threadgroups, r.stats.threads,
                  r.stats.simd_collectives, r.stats.barriers);
    const KnownDifference* k = variant.empty() ? known_difference(c) : nullptr;
    const bool tolerance =
        std::strncmp(c.kind, "backward", 8) == 0 || std::strcmp(c.kind, "chunk_out") == 0 ||
        std::strcmp(c.kind, "tiles") == 0;
    if (r.exact && k == nullptr) {
      ++(tolerance ? within : passes);
      std::printf("PASS: %s %s %s: %s (%s); %s\n", tag.c_str(), c.kind, c.label,
                  r.verdict.c_str(), r.summary.c_str(), geometry);
    } else if (!r.exact && k != nullptr) {
      ++known;
      std::printf("KNOWN DIFFERENCE: %s %s %s: %s (%s); %s\n      %s\n      %s\n", tag.c_str(),
                  c.kind, c.label, r.summary.c_str(), k->finding, geometry,
                  r.accuracy.c_str(), r.detail.c_str());
    } else if (r.exact && g_seed_offset != 0) {
      // Other draws: a small case may miss the difference by chance.
      ++passes;
      std::printf("PASS: %s %s %s: bit-identical to the CPU kernel with these draws (%s); known "
                  "difference not hit\n", tag.c_str(), c.kind, c.label, r.summary.c_str());
    } else if (r.exact) {
      ++failures;
      std::printf("FAIL: %s %s %s: bit-identical now, but listed as a known difference (%s): "
                  "remove it from kKnownDifferences in tests/metal_emu/harness.cc and README.md\n",
                  tag.c_str(), c.kind, c.label, k->finding);
    } else {
      ++failures;
      std::printf("FAIL: %s %s %s: %s; %s\n      %s\n", tag.c_str(), c.kind, c.label,
                  r.summary.c_str(), geometry, r.detail.c_str());
    }
    std::fflush(stdout);
  }
  print_backward_worst();
  print_backward_chunked_worst();
  if (failures) {
    std::printf("FAIL: %s: %d of %d cases failed\n", tag.c_str(), failures,
                failures + passes + known + within);
    return 1;
  }
  const std::string backward =
      within
          ? "; " + std::to_string(within) + " backward, chunked and tile cases within tolerance, invariants exact"
          : "";
  if (known) {
    std::printf("PASS: %s: %d cases bit-identical; %d known differences (README.md)%s\n",
                tag.c_str(), passes, known, backward.c_str());
  } else if (passes) {
    std::printf("PASS: %s: all %d cases bit-identical%s\n", tag.c_str(), passes,
                backward.c_str());
  } else {
    std::printf("PASS: %s: %d backward, chunked and tile cases within tolerance, invariants exact\n", tag.c_str(),
                within);
  }
  return 0;
}
