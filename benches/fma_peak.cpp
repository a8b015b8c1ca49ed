// The machine's float32 multiply-add peak, the yardstick of the chunked forward's efficiency in
// `make bench`'s gradient section (benches/report_grad.py): N threads (MLXK_NUM_THREADS, else
// the library's default min(online CPUs, 8)) each run independent fused multiply-add chains on
// registers only (loops unrolled so the accumulators stay in registers), 12 accumulators deep (more than latency x pipes on the x86 cores seen: 4 x 2),
// with the widest vectors the CPU has (AVX-512F, else AVX2 + FMA). Peak = 2 flops x lanes x
// multiply-adds / wall time, the best of 5 runs of ~0.2 s each, all threads started together.
//
//   fma_peak OUTPUT.json
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int kAcc = 12;
constexpr long kIters = 4000000;

__attribute__((target("avx512f"))) float chains512(long iters, float seed) {
  __m512 acc[kAcc];
#pragma GCC unroll 16
  for (int i = 0; i < kAcc; i++) acc[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long n = 0; n < iters; n++) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < kAcc; i++) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}

__attribute__((target("avx2,fma"))) float chains256(long iters, float seed) {
  __m256 acc[kAcc];
#pragma GCC unroll 16
  for (int i = 0; i < kAcc; i++) acc[i] = _mm256_set1_ps(seed + static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long n = 0; n < iters; n++) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < kAcc; i++) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT.json\n", argv[0]);
    return 2;
  }
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    std::fprintf(stderr, "fma_peak: this CPU has neither AVX-512F nor AVX2 + FMA\n");
    return 1;
  }
  const int lanes = avx512 ? 16 : 8;
  int threads = std::min<int>(std::max(1u, std::thread::hardware_concurrency()), 8);
  if (const char *env = std::getenv("MLXK_NUM_THREADS")) {
    if (std::atoi(env) > 0) threads = std::atoi(env);
  }
  // Iterations for ~0.2 s: one short timed run first.
  auto run = [&](long iters) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<float> sink(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++) {
      pool.emplace_back([&, t] {
        ready++;
        while (!go.load()) {
        }
        sink[t] = avx512 ? chains512(iters, 1.0f + t) : chains256(iters, 1.0f + t);
      });
    }
    while (ready.load() < threads) {
    }
    const auto t0 = std::chrono::steady_clock::now();
    go = true;
    for (auto &th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile float keep = sink[0];
    (void)keep;
    return s;
  };
  const double probe = run(kIters / 20);
  const long iters = std::max<long>(1000, static_cast<long>(kIters / 20 * (0.2 / std::max(probe, 1e-6))));
  double best = 1e30;
  for (int r = 0; r < 5; r++) best = std::min(best, run(iters));
  const double gflops = 2.0 * lanes * kAcc * static_cast<double>(iters) * threads / best / 1e9;
  std::printf("fma peak: %.1f GFLOP/s float32 (%s, %d threads, %d accumulators, best of 5 x %.3f s)\n", gflops,
              avx512 ? "AVX-512F" : "AVX2 + FMA", threads, kAcc, best);
  FILE *f = std::fopen(argv[1], "w");
  if (f == nullptr) return 1;
  std::fprintf(f,
               "{\"tool\": \"mlxkern benches/fma_peak.cpp\", \"gflops\": %.3f, \"isa\": \"%s\", \"threads\": %d, "
               "\"accumulators\": %d, \"seconds\": %.4f}\n",
               gflops, avx512 ? "avx512f" : "avx2_fma", threads, kAcc, best);
  std::fclose(f);
  return 0;
}
