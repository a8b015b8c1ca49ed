// The chunked update's GPU form (kernels/metal/gated_delta_chunked_{prep,state,out}.metal): an
// output-pass case runs its prep case and its state-pass case (the two cases before it, same
// draws) and then itself, as src/ops/gated_delta/graph.rs `build_gpu_chunked` chains them, and
// compares y and the state
// within docs/DESIGN.md §4's chunked bounds (not bit for bit: the chunked form sums in another
// order) with
//   - a float64 recurrence on the kernel's own gates: y within one ulp of its dtype plus 2e-5 of
//     the largest |y|, the state within 2e-5 of the largest |state|;
//   - the CPU chunked form (mlxk_gated_delta_update_chunked, same chunk size): within the sum of
//     the two forms' bounds (two ulps plus 4e-5 of the largest magnitude; 4e-5 for the state).
// Where the matrix tiles round their inputs (CUDA's tf32 and bf16 forms, cuda_tiles_host.h;
// every product of the three texts), each bound relative to the largest magnitude gains
// tile_bound(): 6 (2δ + δ²) for an input rounding of δ (2^-11, 2^-8). A tile product whose
// inputs are each within δ of their values is within (2δ + δ²) of the sum of its terms'
// magnitudes; y and the state pass through at most five such products in sequence (K Kᵀ, then
// W, U0 = Tm [β γ K | β V] in the prep; U = U0 − W H and H ← γ H + Kdᵀ U in the state pass;
// y = γ Q H + P U, two side by side, in the output pass) and a sixth covers those sums' size
// against the largest magnitude and the earlier chunks' errors, which the gates decay.
// Measured: the worst case is under 0.3 of it (tf32) and 0.15 (bf16), over runs.
// A masked token's y must be +0 exactly. Masked cases with B ≥ 2 have row 0 fully masked.

#include "harness.h"

namespace harness {
namespace {

// One ulp of `dtype` at |x| (the spacing of the dtype's values around x).
double ulp(int dtype, double x) {
  const int mantissa = dtype == MLXK_DTYPE_BFLOAT16 ? 7 : dtype == MLXK_DTYPE_FLOAT16 ? 10 : 23;
  const double ax = std::fabs(x);
  if (ax == 0.0) return 0.0;
  int e = 0;
  std::frexp(ax, &e);  // ax = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 1 - mantissa);
}

// The float64 recurrence on the kernel's gates: y [B, T, Hv, Dv], state [B, Hv, Dv, Dk].
void recurrence64(const int64_t* dims, const RecurrenceDraw& x, const Tensor& g,
                  const Tensor& beta, bool masked, std::vector<double>* y,
                  std::vector<double>* state) {
  const int64_t B = dims[0], T = dims[1], Hk = dims[2], Hv = dims[3], Dk = dims[4], Dv = dims[5];
  y->assign(static_cast<size_t>(B * T * Hv * Dv), 0.0);
  state->assign(static_cast<size_t>(B * Hv * Dv * Dk), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t hv = 0; hv < Hv; ++hv) {
      const int64_t hk = hv / (Hv / Hk);
      double* S = state->data() + (b * Hv + hv) * Dv * Dk;
      for (int64_t i = 0; i < Dv * Dk; ++i) S[i] = x.state.get((b * Hv + hv) * Dv * Dk + i);
      for (int64_t t = 0; t < T; ++t) {
        if (masked && x.mask.get(b * T + t) == 0.0f) continue;
        const double decay = g.get((b * T + t) * Hv + hv);
        const double bt = beta.get((b * T + t) * Hv + hv);
        const int64_t qk0 = ((b * T + t) * Hk + hk) * Dk;
        const int64_t v0 = ((b * T + t) * Hv + hv) * Dv;
        for (int64_t d = 0; d < Dv; ++d) {
          double* row = S + d * Dk;
          double kv = 0.0;
          for (int64_t j = 0; j < Dk; ++j) {
            row[j] *= decay;
            kv += row[j] * x.k.get(qk0 + j);
          }
          const double delta = (x.v.get(v0 + d) - kv) * bt;
          double out = 0.0;
          for (int64_t j = 0; j < Dk; ++j) {
            row[j] += x.k.get(qk0 + j) * delta;
            out += row[j] * x.q.get(qk0 + j);
          }
          (*y)[v0 + d] = out;
        }
      }
    }
  }
}

// The worst ratio of |got - want| to the bound `abs + ulps * ulp(dtype, want)` over the
// elements; the first element past its bound in `first`.
double worst(const Tensor& got, const std::vector<double>& want, int dtype, double abs,
             double ulps, std::string* first) {
  double ratio = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got.get(i)) - want[i]);
    // At least the smallest normal float: GPUs flush subnormal results (so does the emulation).
    const double bound = std::max(abs + ulps * ulp(dtype, want[i]), 1.1754943508222875e-38);
    const double r = bound > 0.0 ? err / bound : (err > 0.0 ? 1e30 : 0.0);
    if (!(r <= 1.0) && first->empty()) {
      char s[160];
      std::snprintf(s, sizeof s, "[%zu] %.9g, expected %.9g (bound %.3g)", i, got.get(i),
                    want[i], bound);
      *first = s;
    }
    if (!(r <= ratio)) ratio = r;
  }
  return ratio;
}

// What the matrix tiles' input rounding adds to a relative bound (above); 0 for float32 products.
double tile_bound() {
  const int form = emu_tile_form();
  const double delta = form == 1 ? std::ldexp(1.0, -11) : form == 2 ? std::ldexp(1.0, -8) : 0.0;
  return 6 * (2 * delta + delta * delta);
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

std::vector<double> widened(const Tensor& t) {
  std::vector<double> out(t.count());
  for (size_t i = 0; i < out.size(); ++i) out[i] = t.get(i);
  return out;
}

}  // namespace

Result run_chunked(const EmuCase& c) {
  size_t count = 0;
  const EmuCase* cases = emu_cases(&count);
  const EmuCase* prep = nullptr;
  const EmuCase* pass = nullptr;
  for (size_t i = 0; i < count; ++i) {
    if (cases[i].id == c.id - 2) prep = &cases[i];
    if (cases[i].id == c.id - 1) pass = &cases[i];
  }
  if (prep == nullptr || std::strcmp(prep->kind, "chunk_prep") != 0 || pass == nullptr ||
      std::strcmp(pass->kind, "chunk_state") != 0) {
    die("case %d: a chunk output case follows its prep and state cases", c.id);
  }
  const int64_t B = c.dims[0], T = c.dims[1];
  const bool masked = c.masked != 0;
  Rng rng{c.seed ^ g_seed_offset};
  RecurrenceDraw x = draw_recurrence(c, rng);
  if (masked && B >= 2) {
    for (int64_t t = 0; t < T; ++t) x.mask.set(static_cast<size_t>(t), 0.0f);
  }
  Tensor g, beta;
  gates_for_kernel(c, x, &g, &beta);

  Named inputs;
  inputs["q"] = x.q;
  inputs["k"] = x.k;
  inputs["v"] = x.v;
  inputs["g"] = g;
  inputs["beta"] = beta;
  inputs["state_in"] = x.state;
  if (masked) inputs["mask"] = x.mask;
  Result r;
  emu::Stats prep_stats, pass_stats;
  std::vector<Tensor> parts = launch_kernel(*prep, inputs, &prep_stats);
  for (int i = 0; i < prep->n_outputs; ++i) inputs[prep->outputs[i].name] = parts[i];
  std::vector<Tensor> kept = launch_kernel(*pass, inputs, &pass_stats);
  for (int i = 0; i < pass->n_outputs; ++i) inputs[pass->outputs[i].name] = kept[i];
  std::vector<Tensor> outputs = launch_kernel(c, inputs, &r.stats);
  for (const emu::Stats* s : {&prep_stats, &pass_stats}) {
    r.stats.threadgroups += s->threadgroups;
    r.stats.threads += s->threads;
    r.stats.barriers += s->barriers;
  }
  const Tensor& y = outputs[0];
  const Tensor& state = outputs[1];

  // The CPU chunked form on the same draws.
  Handle hq(x.q), hk(x.k), hv(x.v), ha(x.a), hb(x.b), ha_log(x.a_log), hdt(x.dt_bias);
  Handle hstate, hmask, cy, cs;
  auto adopt = [](Handle& h, const Tensor& t) {
    std::vector<int32_t> shape(t.shape.begin(), t.shape.end());
    check(mlxk_array_new(t.bytes.data(), shape.data(), shape.size(), t.dtype, &h.a),
          "mlxk_array_new");
  };
  if (c.with_state) adopt(hstate, x.state);
  if (masked) adopt(hmask, x.mask);
  check(mlxk_gated_delta_update_chunked(hq.a, hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hstate.a,
                                        hmask.a, c.checkpoint, &cy.a, &cs.a),
        "mlxk_gated_delta_update_chunked");
  const Tensor cpu_y = cy.read(), cpu_state = cs.read();

  std::vector<double> y64, s64;
  recurrence64(c.dims, x, g, beta, masked, &y64, &s64);
  const double ymax = max_abs(y64), smax = max_abs(s64);
  std::string first;
  const double tb = tile_bound();
  const double r_y = worst(y, y64, c.dtype, (2e-5 + tb) * ymax, 1.0, &first);
  const double r_s = worst(state, s64, MLXK_DTYPE_FLOAT32, (2e-5 + tb) * smax, 0.0, &first);
  const double r_cy = worst(y, widened(cpu_y), c.dtype, (4e-5 + tb) * ymax, 2.0, &first);
  const double r_cs = worst(state, widened(cpu_state), MLXK_DTYPE_FLOAT32, (4e-5 + tb) * smax,
                            0.0, &first);
  // A masked token's y is +0 (all Dv values of every value head).
  size_t zeros = 0, bad_zeros = 0;
  if (masked) {
    const size_t per_token = y.count() / static_cast<size_t>(B * T);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      if (x.mask.get(static_cast<size_t>(bt)) != 0.0f) continue;
      for (size_t i = 0; i < per_token; ++i) {
        ++zeros;
        if (y.bits(bt * per_token + i) != 0) ++bad_zeros;
      }
    }
  }
  char summary[400];
  std::snprintf(summary, sizeof summary,
                "worst error / bound: vs float64 y %.3f state %.3f, vs CPU chunked y %.3f state "
                "%.3f; %zu masked y values, %zu not +0",
                r_y, r_s, r_cy, r_cs, zeros, bad_zeros);
  r.summary = summary;
  r.exact = r_y <= 1.0 && r_s <= 1.0 && r_cy <= 1.0 && r_cs <= 1.0 && bad_zeros == 0;
  r.detail = first;
  r.verdict = "within the chunked bounds (float64 recurrence, CPU chunked form)";
  return r;
}

// A chunked pool case (launches.rs `Kind::ChunkedPool`, src/ops/gated_delta/graph.rs
// `build_gpu_chunked_pool`): its prep, state and output passes over the chunk table, fed as
// the library feeds them (the pool as state_in, the row table, the chunk table, each row's
// chunk range), against the dense chunked launches (the three cases before the pool's) on the
// same rows padded to the longest with the padding masked and the states gathered from the pool
// (zeros for a fresh or padding row). Each row must give that call's bits: y over its span (+0
// for a padding row) and, for a row with a slot, its state (the written row dst). A token past
// a row's length is an identity step in both (g = 1, β = 0, k, q, v read as 0), so the chunks
// they share compute the same; the dense call's extra chunks, all padding, leave a state as it
// is (H + 0; only a −0 would become +0, which these draws never hold).
Result run_chunked_pool(const EmuCase& c) {
  size_t count = 0;
  const EmuCase* cases = emu_cases(&count);
  auto at = [&](int id, const char* kind) -> const EmuCase& {
    for (size_t i = 0; i < count; ++i) {
      if (cases[i].id == id && std::strcmp(cases[i].kind, kind) == 0) return cases[i];
    }
    die("case %d: case %d (%s) does not precede it", c.id, id, kind);
  };
  const EmuCase& prep = at(c.id - 2, "chunk_pool_prep");
  const EmuCase& pass = at(c.id - 1, "chunk_pool_state");
  const EmuCase& dense_out = at(c.id - 3, "chunk_out");
  const EmuCase& dense_pass = at(c.id - 4, "chunk_state");
  const EmuCase& dense_prep = at(c.id - 5, "chunk_prep");
  const int64_t T = c.dims[1], Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4], Dv = c.dims[5];
  const int R = c.n_slots;
  const bool packed = c.n_cu > 0, masked = c.masked != 0;
  if (dense_out.dims[0] != R || (packed && c.n_cu != R + 1)) {
    die("case %d: the dense call has B = %" PRId64 ", the pool %d rows", c.id,
        dense_out.dims[0], R);
  }
  const int64_t Tmax = dense_out.dims[1];
  Rng rng{c.seed ^ g_seed_offset};
  RecurrenceDraw x = draw_recurrence(c, rng);
  if (masked && R >= 2) {
    for (int64_t t = 0; t < T; ++t) x.mask.set(static_cast<size_t>(t), 0.0f);
  }
  Tensor g, beta;
  gates_for_kernel(c, x, &g, &beta);
  const Tensor pool = random(rng, MLXK_DTYPE_FLOAT32, {c.pool_n, Hv, Dv, Dk}, -1.0f, 1.0f);

  // The row table (src/ops/gated_delta/pool.rs `row_table`, compact numbering) and the chunk
  // table (src/metal/gated_delta/chunked.rs `pool_chunk_table`), restated.
  const int64_t chunk = prep.outputs[3].dims[2];  // p [Hv, NCH·C, C]
  Tensor rows = make(MLXK_DTYPE_INT32, {R, 5});
  std::vector<int64_t> tok0(R), span(R), len(R), src(R), dst(R);
  std::vector<int32_t> chunks, firsts{0};
  int written = 0;
  for (int r = 0; r < R; ++r) {
    tok0[r] = packed ? c.cu_seqlens[r] : r * T;
    span[r] = packed ? c.cu_seqlens[r + 1] - c.cu_seqlens[r] : T;
    len[r] = c.slots[r] < 0 ? 0 : span[r];
    src[r] = c.slots[r] < 0 || c.fresh[r] != 0 ? -1 : c.slots[r];
    dst[r] = c.slots[r] < 0 ? -1 : written++;
    const int64_t row[5] = {tok0[r], span[r], len[r], src[r], dst[r]};
    for (int i = 0; i < 5; ++i) rows.set(5 * r + i, static_cast<float>(row[i]));
    for (int64_t k = 0; k < (span[r] + chunk - 1) / chunk; ++k) {
      chunks.push_back(r);
      chunks.push_back(static_cast<int32_t>(k));
    }
    firsts.push_back(static_cast<int32_t>(chunks.size() / 2));
  }
  const int64_t nch = static_cast<int64_t>(chunks.size() / 2);
  Tensor tchunks = make(MLXK_DTYPE_INT32, {nch, 2}), tfirsts = make(MLXK_DTYPE_INT32, {R + 1});
  for (size_t i = 0; i < chunks.size(); ++i) tchunks.set(i, static_cast<float>(chunks[i]));
  for (size_t i = 0; i < firsts.size(); ++i) tfirsts.set(i, static_cast<float>(firsts[i]));

  // The pool's three launches.
  Named inputs;
  inputs["q"] = x.q;
  inputs["k"] = x.k;
  inputs["v"] = x.v;
  inputs["g"] = g;
  inputs["beta"] = beta;
  if (masked) inputs["mask"] = x.mask;
  inputs["rows"] = rows;
  inputs["chunks"] = tchunks;
  inputs["firsts"] = tfirsts;
  inputs["state_in"] = pool;
  Result r;
  emu::Stats stats[5];
  std::vector<Tensor> parts = launch_kernel(prep, inputs, &stats[0]);
  for (int i = 0; i < prep.n_outputs; ++i) inputs[prep.outputs[i].name] = parts[i];
  std::vector<Tensor> kept = launch_kernel(pass, inputs, &stats[1]);
  for (int i = 0; i < 2; ++i) inputs[pass.outputs[i].name] = kept[i];
  const Tensor rows_out = kept[2];
  const Tensor y = launch_kernel(c, inputs, &r.stats)[0];

  // The dense call: the rows padded to Tmax, the padding masked, the states from the pool.
  auto padded = [&](const Tensor& t, int64_t per_token, std::vector<int64_t> shape) {
    Tensor out = make(t.dtype, shape);
    for (int row = 0; row < R; ++row) {
      for (int64_t t0 = 0; t0 < span[row]; ++t0) {
        for (int64_t i = 0; i < per_token; ++i) {
          out.set((row * Tmax + t0) * per_token + i, t.get((tok0[row] + t0) * per_token + i));
        }
      }
    }
    return out;
  };
  Named dense;
  dense["q"] = padded(x.q, Hk * Dk, {R, Tmax, Hk, Dk});
  dense["k"] = padded(x.k, Hk * Dk, {R, Tmax, Hk, Dk});
  dense["v"] = padded(x.v, Hv * Dv, {R, Tmax, Hv, Dv});
  dense["g"] = padded(g, Hv, {R, Tmax, Hv});
  dense["beta"] = padded(beta, Hv, {R, Tmax, Hv});
  Tensor mask = make(MLXK_DTYPE_BOOL, {R, Tmax});
  Tensor state = make(MLXK_DTYPE_FLOAT32, {R, Hv, Dv, Dk});
  const size_t per_state = static_cast<size_t>(Hv * Dv * Dk);
  for (int row = 0; row < R; ++row) {
    for (int64_t t0 = 0; t0 < len[row]; ++t0) {
      const bool on = !masked || x.mask.get(static_cast<size_t>(tok0[row] + t0)) != 0.0f;
      mask.set(static_cast<size_t>(row * Tmax + t0), on ? 1.0f : 0.0f);
    }
    if (src[row] >= 0) {
      std::memcpy(state.bytes.data() + 4 * per_state * row,
                  pool.bytes.data() + 4 * per_state * src[row], 4 * per_state);
    }
  }
  dense["mask"] = mask;
  dense["state_in"] = state;
  std::vector<Tensor> dparts = launch_kernel(dense_prep, dense, &stats[2]);
  for (int i = 0; i < dense_prep.n_outputs; ++i) dense[dense_prep.outputs[i].name] = dparts[i];
  std::vector<Tensor> dkept = launch_kernel(dense_pass, dense, &stats[3]);
  for (int i = 0; i < dense_pass.n_outputs; ++i) dense[dense_pass.outputs[i].name] = dkept[i];
  std::vector<Tensor> dout = launch_kernel(dense_out, dense, &stats[4]);
  const Tensor &dy = dout[0], &dstate = dout[1];
  for (const emu::Stats& s : stats) {
    r.stats.threadgroups += s.threadgroups;
    r.stats.threads += s.threads;
    r.stats.barriers += s.barriers;
  }

  // Every row's y over its span and written state, bit for bit.
  size_t y_values = 0, y_diff = 0, s_values = 0, s_diff = 0;
  std::string first;
  const size_t per_token = static_cast<size_t>(Hv * Dv);
  for (int row = 0; row < R; ++row) {
    for (int64_t t0 = 0; t0 < span[row]; ++t0) {
      for (size_t i = 0; i < per_token; ++i) {
        const size_t at_pool = static_cast<size_t>(tok0[row] + t0) * per_token + i;
        const size_t at_dense = static_cast<size_t>(row * Tmax + t0) * per_token + i;
        ++y_values;
        if (y.bits(at_pool) != dy.bits(at_dense)) {
          if (y_diff++ == 0) {
            char m[160];
            std::snprintf(m, sizeof m, "y row %d token %" PRId64 " [%zu]: pool %.9g, dense %.9g",
                          row, t0, i, y.get(at_pool), dy.get(at_dense));
            first += m;
          }
        }
      }
    }
    if (dst[row] < 0) continue;
    for (size_t i = 0; i < per_state; ++i) {
      ++s_values;
      if (rows_out.bits(dst[row] * per_state + i) != dstate.bits(row * per_state + i)) {
        if (s_diff++ == 0) {
          char m[160];
          std::snprintf(m, sizeof m, "%sstate row %d [%zu]: pool %.9g, dense %.9g",
                        first.empty() ? "" : "; ", row, i, rows_out.get(dst[row] * per_state + i),
                        dstate.get(row * per_state + i));
          first += m;
        }
      }
    }
  }
  char summary[240];
  std::snprintf(summary, sizeof summary,
                "y: %zu of %zu values differ, states: %zu of %zu differ (%" PRId64 " chunks)",
                y_diff, y_values, s_diff, s_values, nch);
  r.summary = summary;
  r.exact = y_diff == 0 && s_diff == 0 && y_values > 0;
  r.detail = first;
  r.verdict = "bit-identical to the dense chunked launches on each row";
  return r;
}

}  // namespace harness
