// The Metal-text emulation test's chunked backward cases (harness.h; README.md, "Chunked
// backward"): kernels/metal/gated_delta_chunked_backward.metal's five launches
// (src/metal/gated_delta/chunked_backward.rs) run in sequence, each stage's outputs the next stages' inputs, on the
// inputs src/ops/gated_delta/chunked_vjp.rs passes; the gradients compared with a float64
// backward of the exact recurrence (the truth both forms approximate) and with the library's
// CPU backward (mlxk_gated_delta_update_vjp), each relative to the gradient's largest
// magnitude; masked tokens' gradients and fully masked rows' dstate bit for bit.

#include "harness.h"

namespace harness {

namespace {

// The bound on a gradient's error relative to its scale (README.md gives the reasoning and the
// observed worst cases), against the float64 backward and against the CPU backward: 2^-14 for
// float32 products (the Metal form's simdgroup matrices, CUDA's fma form), plus, where the
// matrix tiles round their inputs (CUDA's tf32 and bf16 forms, cuda_tiles_host.h), 4 (2δ + δ²)
// for an input rounding of δ (2^-11, 2^-8): each tile product a gradient is made of moves its
// result by at most 2δ + δ² of the sum of its terms' magnitudes, and those errors add along the
// gradient's chain of products (stage 1's KKᵀ, W and Ũ, the states' or dstates' products, then
// the square or keys stage's); with these draws' magnitudes (|k|² ≈ 4/3, β ≤ 1, gates ≤ 1: sums
// of magnitudes within a small factor of the results) four such terms bound it, and the worst
// observed is under a quarter of that (README.md).
double chunked_tolerance() {
  const int form = emu_tile_form();
  const double delta = form == 1 ? std::ldexp(1.0, -11) : form == 2 ? std::ldexp(1.0, -8) : 0.0;
  return std::ldexp(1.0, -14) + 4 * (2 * delta + delta * delta);
}

// Per forward dtype: against float64, against the CPU backward, and the CPU backward's own
// error against float64 (for comparison).
std::map<int, std::array<WorstGrad, kGradients>> g_vs_f64, g_vs_cpu, g_cpu_vs_f64;

// The gradients of one backward in double: dq, dk [B, T, Hk, Dk]; dv [B, T, Hv, Dv]; dg,
// dbeta [B, T, Hv]; dstate [B, Hv, Dv, Dk].
struct Grads {
  std::vector<double> dq, dk, dv, dg, dbeta, dstate;
};

// The exact recurrence's backward in double on the values the kernels read (q, k, v, g, beta
// as stored, the state, dy, dstate_out), token by token (the formulas of
// src/cpu/gated_delta/backward.rs).
Grads reference_backward(const EmuCase& c, const RecurrenceDraw& x, const Tensor& g,
                         const Tensor& beta, const Tensor& dy, const Tensor& dstate_out) {
  const int64_t B = c.dims[0], T = c.dims[1], Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4],
                Dv = c.dims[5];
  const int64_t group = Hv / Hk;
  const bool masked = c.masked != 0;
  Grads r;
  r.dq.assign(static_cast<size_t>(B * T * Hk * Dk), 0.0);
  r.dk.assign(r.dq.size(), 0.0);
  r.dv.assign(static_cast<size_t>(B * T * Hv * Dv), 0.0);
  r.dg.assign(static_cast<size_t>(B * T * Hv), 0.0);
  r.dbeta.assign(r.dg.size(), 0.0);
  r.dstate.assign(static_cast<size_t>(B * Hv * Dv * Dk), 0.0);
  const size_t S = static_cast<size_t>(Dv * Dk);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t hk = h / group;
      auto qk = [&](int64_t t, int64_t i) { return static_cast<size_t>(((b * T + t) * Hk + hk) * Dk + i); };
      auto vv = [&](int64_t t, int64_t j) { return static_cast<size_t>(((b * T + t) * Hv + h) * Dv + j); };
      auto gt = [&](int64_t t) { return static_cast<size_t>((b * T + t) * Hv + h); };
      auto active = [&](int64_t t) { return !masked || x.mask.get(static_cast<size_t>(b * T + t)) != 0.0f; };
      // The states entering each token.
      std::vector<double> states(static_cast<size_t>(T + 1) * S);
      for (size_t e = 0; e < S; ++e) {
        states[e] = x.state.get(static_cast<size_t>((b * Hv + h)) * S + e);
      }
      for (int64_t t = 0; t < T; ++t) {
        const double* s0 = &states[static_cast<size_t>(t) * S];
        double* s1 = &states[static_cast<size_t>(t + 1) * S];
        std::copy(s0, s0 + S, s1);
        if (!active(t)) continue;
        const double gv = g.get(gt(t)), bv = beta.get(gt(t));
        for (int64_t j = 0; j < Dv; ++j) {
          double* row = s1 + j * Dk;
          double kv = 0.0;
          for (int64_t i = 0; i < Dk; ++i) {
            row[i] *= gv;
            kv += row[i] * x.k.get(qk(t, i));
          }
          const double delta = (x.v.get(vv(t, j)) - kv) * bv;
          for (int64_t i = 0; i < Dk; ++i) row[i] += x.k.get(qk(t, i)) * delta;
        }
      }
      std::vector<double> ds(S);
      for (size_t e = 0; e < S; ++e) {
        ds[e] = dstate_out.get(static_cast<size_t>((b * Hv + h)) * S + e);
      }
      for (int64_t t = T - 1; t >= 0; --t) {
        if (!active(t)) continue;
        const double* sp = &states[static_cast<size_t>(t) * S];
        const double* sn = &states[static_cast<size_t>(t + 1) * S];
        const double gv = g.get(gt(t)), bv = beta.get(gt(t));
        double dg = 0.0, dbeta = 0.0;
        for (int64_t j = 0; j < Dv; ++j) {
          const double dyj = dy.get(vv(t, j));
          double kv = 0.0, ddelta = 0.0;
          for (int64_t i = 0; i < Dk; ++i) {
            const double kf = x.k.get(qk(t, i)), qf = x.q.get(qk(t, i));
            kv += gv * sp[j * Dk + i] * kf;
            r.dq[qk(t, i)] += dyj * sn[j * Dk + i];
            ds[static_cast<size_t>(j * Dk + i)] += dyj * qf;
            ddelta += ds[static_cast<size_t>(j * Dk + i)] * kf;
          }
          const double err = x.v.get(vv(t, j)) - kv, delta = err * bv;
          r.dv[vv(t, j)] = ddelta * bv;
          dbeta += ddelta * err;
          const double dkv = -ddelta * bv;
          for (int64_t i = 0; i < Dk; ++i) {
            const double kf = x.k.get(qk(t, i));
            double& d = ds[static_cast<size_t>(j * Dk + i)];
            r.dk[qk(t, i)] += delta * d + dkv * gv * sp[j * Dk + i];
            const double ds1 = d + dkv * kf;
            dg += ds1 * sp[j * Dk + i];
            d = gv * ds1;
          }
        }
        r.dg[gt(t)] = dg;
        r.dbeta[gt(t)] = dbeta;
      }
      for (size_t e = 0; e < S; ++e) r.dstate[static_cast<size_t>(b * Hv + h) * S + e] = ds[e];
    }
  }
  return r;
}

// The largest |got - want| relative to `scale` (0: the largest |want|); non-finite: infinite.
double relative_error(const std::vector<double>& got, const std::vector<double>& want,
                      double scale, size_t* at) {
  if (scale == 0.0) {
    for (double w : want) scale = std::max(scale, std::fabs(w));
  }
  double worst = 0.0;
  *at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = !std::isfinite(got[i]) ? INFINITY
                     : scale > 0.0          ? std::fabs(got[i] - want[i]) / scale
                                            : (got[i] == want[i] ? 0.0 : INFINITY);
    if (e > worst) {
      worst = e;
      *at = i;
    }
  }
  return worst;
}

}  // namespace

Result run_backward_chunked(const EmuCase& c) {
  const int64_t T = c.dims[1], Hv = c.dims[3];
  // Stage 0 does not read dy: its dtype is that of stage 2's (the next case's but one).
  const int stage2_dy = input_dtype(*find_case(c.id + 2), "dy");
  const int dy_dtype = stage2_dy >= 0 ? stage2_dy : input_dtype(c, "dy");
  if (dy_dtype < 0) die("case %d: no dy input in stage 2", c.id);
  const BackwardDraw d = draw_backward(c, dy_dtype);
  const RecurrenceDraw& x = d.x;

  // The CPU backward through the C ABI.
  const std::array<Tensor, kGradients> cpu = cpu_backward(c, d);

  // The five stages, on the inputs the library's GPU path passes.
  Named in = backward_kernel_inputs(c, d, {T});
  const Tensor g = in.at("g"), beta = in.at("beta");
  Result r;
  r.verdict = "within tolerance of the float64 and the CPU backward";
  for (int stage = 0; stage < 5; ++stage) {
    const EmuCase& s = stage == 0 ? c : *find_case(c.id + stage);
    if (stage > 0 && std::strcmp(s.kind, "backward_chunked_stage") != 0) {
      die("case %d: case %d is not its stage %d", c.id, s.id, stage);
    }
    emu::Stats stats;
    const std::vector<Tensor> out = launch_kernel(s, in, &stats);
    r.stats.threadgroups += stats.threadgroups;
    r.stats.threads += stats.threads;
    r.stats.simd_collectives += stats.simd_collectives;
    r.stats.barriers += stats.barriers;
    for (int i = 0; i < s.n_outputs; ++i) in[s.outputs[i].name] = out[static_cast<size_t>(i)];
  }
  const GateChain kc = gate_chain(x, Hv, doubles(in.at("dg_part")), doubles(in.at("dbeta_part")));
  const Grads ref = reference_backward(c, x, g, beta, d.dy, d.dstate_out);
  const GateChain rc = gate_chain(x, Hv, ref.dg, ref.dbeta);
  auto biggest = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const std::vector<double> kernel[kGradients] = {
      per_key_head(c, in.at("dq_h"), 1), per_key_head(c, in.at("dk_h"), 1),
      doubles(in.at("dv")), doubles(in.at("dstate")),
      kc.da, kc.db, kc.da_log, kc.ddt};
  const std::vector<double>* truth[kGradients] = {&ref.dq, &ref.dk, &ref.dv, &ref.dstate,
                                                  &rc.da, &rc.db, &rc.da_log, &rc.ddt};
  const double scales[kGradients] = {0, 0, 0, 0, 0, 0, biggest(rc.scale_log),
                                     biggest(rc.scale_dt)};
  auto& w_f64 = g_vs_f64[c.dtype];
  auto& w_cpu = g_vs_cpu[c.dtype];
  auto& w_cpu_f64 = g_cpu_vs_f64[c.dtype];
  r.summary = "error/scale vs float64 (vs CPU backward; CPU backward vs float64):";
  for (int i = 0; i < kGradients; ++i) {
    size_t at = 0, at_cpu = 0;
    const double e = relative_error(kernel[i], *truth[i], scales[i], &at);
    const GradError ec = grad_error(cpu[i], kernel[i], i >= 4,
                                    i >= 6 ? biggest(i == 6 ? kc.scale_log : kc.scale_dt) : 0.0);
    const double e_cpu = relative_error(doubles(cpu[i]), *truth[i], scales[i], &at_cpu);
    char part[240];
    std::snprintf(part, sizeof part, " %s %.2e (%.2e; %.2e)", kGradientNames[i], e, ec.ratio,
                  e_cpu);
    r.summary += part;
    w_f64[static_cast<size_t>(i)].see(e, c.id);
    w_cpu[static_cast<size_t>(i)].see(ec.ratio, c.id);
    w_cpu_f64[static_cast<size_t>(i)].see(e_cpu, c.id);
    if (!(e <= chunked_tolerance()) || !(ec.ratio <= chunked_tolerance())) {
      r.exact = false;
      std::snprintf(part, sizeof part,
                    "%s%s[%zu]: float64 %.9g, Metal text %.9g; vs CPU [%zu]: CPU %.9g, Metal "
                    "text %.9g (bound %.3g)",
                    r.detail.empty() ? "" : " | ", kGradientNames[i], at, (*truth[i])[at],
                    kernel[i][at], ec.at, ec.cpu, ec.metal, chunked_tolerance());
      r.detail += part;
    }
  }

  // Masked tokens: zero gradients, bit for bit; a fully masked row passes dstate_out through.
  if (c.masked != 0) check_padded(c, d, 1, in, &r);
  return r;
}

void print_backward_chunked_worst() {
  print_worst("chunked backward vs float64", g_vs_f64, chunked_tolerance());
  print_worst("chunked backward vs CPU backward", g_vs_cpu, chunked_tolerance());
  print_worst("CPU backward vs float64 (for comparison)", g_cpu_vs_f64, chunked_tolerance());
}

}  // namespace harness
