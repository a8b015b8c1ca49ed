// The matrix tiles' self-test (kernels/metal/tiles_check.metal on the Metal form
// kernels/metal/tiles.h, the shim's simdgroup matrices): y = c0 + mask(diag(gate) A B),
// z = Aᵀ A and w = A Aᵀ against float64 products of the same float32 inputs.
//
// Bound, per element, relative to S = Σ_k |a_ik| |b_kj|: (1) the inputs' rounding, δ per input,
// moves each product by at most 2δ + δ²: δ = 0 for the Metal form (simdgroup_float8x8
// multiplies float32) and CUDA's fma form, 2^-11 for tf32 (cvt.rna: 10 mantissa bits,
// nearest), 2^-8 for bf16 (7 bits, nearest even); (2) the float32 accumulation of the k
// products moves the sum by at most k · 2^-24 of S rounded to nearest (γ_k); the bound takes
// k · 2^-23, since neither Apple nor NVIDIA documents the order or the rounding of these sums
// (the emulator sums k = 0..7 in fused multiply-adds: simdgroup_matrix.h, cuda_tiles_host.h).
// y adds two roundings of 2^-24 of |gate| S + |c0|. Masked elements (column > row) must be
// c0's bits exactly: c0 + 0. ysum (row_sum over a tile's 8 columns) adds 10 roundings more of
// 2^-23 (eight terms, each within its bound). The same bounds hold on the GPU
// (tests/cuda/tiles.rs).

#include "harness.h"

namespace harness {
namespace {

struct Worst {
  double ratio = 0.0;
  size_t at = 0;
  double got = 0.0, want = 0.0;
};

void note(Worst* w, size_t at, double got, double want, double bound) {
  const double r = std::fabs(got - want) / std::max(bound, 1.17549435e-38);
  if (!(r <= w->ratio)) {  // NaN too
    *w = Worst{std::isnan(r) ? INFINITY : r, at, got, want};
  }
}

}  // namespace

Result run_tiles(const EmuCase& c) {
  const int64_t items = c.dims[0], M = c.dims[1], K = c.dims[2], N = c.dims[3];
  Rng rng{c.seed ^ g_seed_offset};
  Named in;
  in["a"] = random(rng, MLXK_DTYPE_FLOAT32, {items, M, K}, -1.0f, 1.0f);
  in["b"] = random(rng, MLXK_DTYPE_FLOAT32, {items, K, N}, -1.0f, 1.0f);
  in["gate"] = random(rng, MLXK_DTYPE_FLOAT32, {items, M}, 0.0f, 1.0f);
  in["c0"] = random(rng, MLXK_DTYPE_FLOAT32, {items, M, N}, -0.25f, 0.25f);
  Result r;
  const std::vector<Tensor> out = launch_kernel(c, in, &r.stats);
  const Tensor &a = in["a"], &b = in["b"], &gate = in["gate"], &c0 = in["c0"];
  const double u = std::ldexp(1.0, -24);
  const int form = emu_tile_form();
  const double delta = form == 1 ? std::ldexp(1.0, -11) : form == 2 ? std::ldexp(1.0, -8) : 0.0;
  const double rounding = 2 * delta + delta * delta;
  Worst wy, wz, ww, ws;
  size_t masked = 0, masked_wrong = 0;
  for (int64_t g = 0; g < items; ++g) {
    auto A = [&](int64_t i, int64_t l) { return double(a.get(size_t((g * M + i) * K + l))); };
    auto B = [&](int64_t l, int64_t j) { return double(b.get(size_t((g * K + l) * N + j))); };
    for (int64_t i = 0; i < M; ++i) {
      double tile_sum = 0.0, tile_mag = 0.0;  // ysum: over the 8 columns of a tile
      for (int64_t j = 0; j < N; ++j) {
        double p = 0.0, s = 0.0;
        for (int64_t l = 0; l < K; ++l) {
          p += A(i, l) * B(l, j);
          s += std::fabs(A(i, l) * B(l, j));
        }
        const size_t at = size_t((g * M + i) * N + j);
        const double gi = gate.get(size_t(g * M + i)), ci = c0.get(at);
        if (j > i) {
          ++masked;
          masked_wrong += out[0].bits(at) != c0.bits(at);
        } else {
          const double bound = (rounding + K * 2 * u) * gi * s + 2 * u * (gi * s + std::fabs(ci));
          note(&wy, at, out[0].get(at), ci + gi * p, bound);
          tile_sum += gi * p;
          tile_mag += gi * s;
        }
        if (j % 8 == 7) {
          // Eight elements, each within its bound, summed in float32: 8 more roundings.
          const size_t st = size_t((g * M + i) * (N / 8) + j / 8);
          note(&ws, st, out[3].get(st), tile_sum, (rounding + (K + 10) * 2 * u) * tile_mag);
          tile_sum = tile_mag = 0.0;
        }
      }
    }
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < K; ++j) {
        double p = 0.0, s = 0.0;
        for (int64_t l = 0; l < M; ++l) {
          p += A(l, i) * A(l, j);
          s += std::fabs(A(l, i) * A(l, j));
        }
        const size_t at = size_t((g * K + i) * K + j);
        note(&wz, at, out[1].get(at), p, (rounding + M * 2 * u) * s);
      }
    }
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < M; ++j) {
        double p = 0.0, s = 0.0;
        for (int64_t l = 0; l < K; ++l) {
          p += A(i, l) * A(j, l);
          s += std::fabs(A(i, l) * A(j, l));
        }
        const size_t at = size_t((g * M + i) * M + j);
        note(&ww, at, out[2].get(at), p, (rounding + K * 2 * u) * s);
      }
    }
  }
  char s[400];
  std::snprintf(s, sizeof s,
                "worst error / bound: y %.3f, z %.3f, w %.3f, ysum %.3f; %zu masked y exact of %zu",
                wy.ratio, wz.ratio, ww.ratio, ws.ratio, masked - masked_wrong, masked);
  r.summary = s;
  r.verdict = "within 2δ + δ² + k 2^-23 of the float64 products";
  const Worst* worst[4] = {&wy, &wz, &ww, &ws};
  const char* names[4] = {"y", "z", "w", "ysum"};
  for (int o = 0; o < 4; ++o) {
    if (worst[o]->ratio > 1.0) {
      r.exact = false;
      char d[200];
      std::snprintf(d, sizeof d, "%s[%zu] = %.9g, float64 %.9g (%.3g of the bound); ", names[o],
                    worst[o]->at, worst[o]->got, worst[o]->want, worst[o]->ratio);
      r.detail += d;
    }
  }
  if (masked_wrong) {
    r.exact = false;
    r.detail += std::to_string(masked_wrong) + " masked elements of y are not c0's bits";
  }
  return r;
}

}  // namespace harness
