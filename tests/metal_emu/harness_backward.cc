// The Metal-text emulation test's backward cases (harness.h).

#include "harness.h"

namespace harness {

// ------------------------------------------------------------------------------------------
// The recurrence's backward pass (README.md, "Backward"): the kernel's f32 gradients against
// the library's CPU backward through mlxk_gated_delta_update_vjp, within a tolerance (the two
// sum in different orders); exact invariants (checkpoint interval, masked tokens) bit for bit.

// The bound on a gradient's error, relative to the gradient tensor's largest magnitude (the
// per-head sums da_log and ddt_bias: relative to the largest sum of magnitudes of a head's
// terms), after the CPU result's own rounding to its dtype is allowed for. README.md gives the
// reasoning and the observed worst cases.
constexpr double kBackwardTolerance = 1.0 / (1 << 14);

// The reals that round to element i of `t` (round to nearest): [*lo, *hi], the midpoints to
// its neighbours in t's dtype (16- or 32-bit float).
void rounding_interval(const Tensor& t, size_t i, double* lo, double* hi) {
  const int bits = static_cast<int>(dtype_size(t.dtype)) * 8;
  const uint32_t sign = 1u << (bits - 1);
  const uint32_t b = t.bits(i);
  const int64_t ordered = (b & sign) ? -static_cast<int64_t>(b & (sign - 1)) : b;
  auto value = [&](int64_t o) {
    Tensor one = make(t.dtype, {1});
    const uint32_t pattern =
        o >= 0 ? static_cast<uint32_t>(o) : sign | static_cast<uint32_t>(-o);
    std::memcpy(one.bytes.data(), &pattern, dtype_size(t.dtype));
    return static_cast<double>(one.get(0));
  };
  const double c = t.get(i), below = value(ordered - 1), above = value(ordered + 1);
  *lo = std::isfinite(below) ? 0.5 * (below + c) : c - 0.5 * (above - c);
  *hi = std::isfinite(above) ? 0.5 * (c + above) : c + 0.5 * (c - below);
}

// The Metal text runs with subnormals flushed (as Apple GPUs do), the CPU backward without:
// each flush moves a value by less than 2^-126, and a gradient sums at most T * Dv * Dk
// (< 2^21 here) such values with factors below 2^5, so differences under 2^-100 in absolute
// value are the flushing and nothing else. They only matter in the strongly decaying head,
// whose state lives among the subnormals.
const double kFlushAllowance = std::ldexp(1.0, -100);

// The Metal text's gradient `metal` (exact sums, in double, of its f32 outputs) against the
// CPU's `cpu` (the C ABI's result in its dtype): the distance from `metal` to the reals that
// round to the CPU's value (its last rounding, to f32 and to the output's dtype, allowed for),
// less the flushing allowance, relative to `scale` (0: the largest |value| of either side).
// `twice`: the CPU value went double -> f32 -> its dtype (the gate chain), so the f32 rounding
// is allowed for as well. Non-finite values give an infinite ratio.
GradError grad_error(const Tensor& cpu, const std::vector<double>& metal, bool twice,
                     double scale) {
  if (cpu.count() != metal.size()) {
    die("grad_error: %zu vs %zu values", cpu.count(), metal.size());
  }
  GradError e;
  if (scale == 0.0) {
    for (size_t i = 0; i < metal.size(); ++i) {
      scale = std::max({scale, std::fabs(static_cast<double>(cpu.get(i))), std::fabs(metal[i])});
    }
  }
  e.scale = scale;
  const bool narrowed = cpu.dtype != MLXK_DTYPE_FLOAT32;
  for (size_t i = 0; i < metal.size(); ++i) {
    const double c = cpu.get(i), m = metal[i];
    double ratio;
    if (!std::isfinite(c) || !std::isfinite(m)) {
      ratio = INFINITY;
    } else {
      double lo, hi;
      rounding_interval(cpu, i, &lo, &hi);
      if (twice && narrowed) {  // the f32 it was rounded from: within an f32 half-ulp of it
        const double f32 = std::ldexp(std::fabs(c), -24) + std::ldexp(1.0, -150);
        lo -= f32;
        hi += f32;
      }
      const double excess = (m < lo ? lo - m : m > hi ? m - hi : 0.0) - kFlushAllowance;
      ratio = excess <= 0.0 ? 0.0 : scale > 0.0 ? excess / scale : INFINITY;
    }
    if (ratio > e.ratio || i == 0) {
      e.ratio = ratio;
      e.at = i;
      e.cpu = c;
      e.metal = m;
    }
  }
  return e;
}

constexpr int kGradients = 8;
const char* const kGradientNames[kGradients] = {"dq", "dk",     "dv",     "dstate",
                                                "da", "db",     "da_log", "ddt_bias"};

// The worst ratio per forward dtype and gradient over the cases run, with the case.
struct Worst {
  double ratio = -1.0;
  int case_id = -1;
};
std::map<int, std::array<Worst, kGradients>> g_backward_worst;

// The non-scratch outputs (dq_h, dk_h, dv, dg_part, dbeta_part, dstate) of the backward cases run, by
// case id: a case's twin must give the same bits.
std::map<int, std::vector<Tensor>> g_backward_outputs;

mlxk_array* new_array(const Tensor& t) {
  std::vector<int32_t> shape(t.shape.begin(), t.shape.end());
  mlxk_array* a = nullptr;
  check(mlxk_array_new(t.bytes.data(), shape.data(), shape.size(), t.dtype, &a),
        "mlxk_array_new");
  return a;
}

const EmuCase* find_case(int id) {
  size_t count = 0;
  const EmuCase* cases = emu_cases(&count);
  for (size_t i = 0; i < count; ++i) {
    if (cases[i].id == id) return &cases[i];
  }
  die("no case %d", id);
}

Result run_backward(const EmuCase& c) {
  const int64_t B = c.dims[0], T = c.dims[1], Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4],
                Dv = c.dims[5];
  const int64_t group = Hv / Hk;
  const bool masked = c.masked != 0;
  Rng rng{c.seed ^ g_seed_offset};
  RecurrenceDraw x = draw_recurrence(c, rng);
  int dy_dtype = -1;
  for (int i = 0; i < c.n_inputs; ++i) {
    if (std::strcmp(c.inputs[i].name, "dy") == 0) dy_dtype = c.inputs[i].dtype;
  }
  Tensor dy = random(rng, dy_dtype, {B, T, Hv, Dv}, -1.0f, 1.0f);
  Tensor dstate_out = random(rng, MLXK_DTYPE_FLOAT32, {B, Hv, Dv, Dk}, -1.0f, 1.0f);
  if (masked && B >= 2) {  // row 0 entirely padding (the last token of the last row is real)
    for (int64_t t = 0; t < T; ++t) x.mask.set(static_cast<size_t>(t), 0.0f);
  }

  // The CPU backward through the C ABI.
  Handle hq(x.q), hk(x.k), hv(x.v), ha(x.a), hb(x.b), ha_log(x.a_log), hdt(x.dt_bias), hdy(dy),
      hdso(dstate_out);
  Handle hstate, hmask;  // NULL when absent
  if (c.with_state) hstate.a = new_array(x.state);
  if (masked) hmask.a = new_array(x.mask);
  Handle grads[kGradients];  // dq, dk, dv, da, db, da_log, ddt_bias, dstate (the ABI's order)
  check(mlxk_gated_delta_update_vjp(hq.a, hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hstate.a,
                                    hmask.a, hdy.a, hdso.a, &grads[0].a, &grads[1].a,
                                    &grads[2].a, &grads[3].a, &grads[4].a, &grads[5].a,
                                    &grads[6].a, &grads[7].a),
        "mlxk_gated_delta_update_vjp");
  const Tensor cpu_dq = grads[0].read(), cpu_dk = grads[1].read(), cpu_dv = grads[2].read(),
               cpu_da = grads[3].read(), cpu_db = grads[4].read(), cpu_da_log = grads[5].read(),
               cpu_ddt = grads[6].read(), cpu_dstate = grads[7].read();

  // The kernel, on the inputs the library's Metal path would pass.
  Named in;
  Tensor g, beta;
  gates_for_kernel(c, x, &g, &beta);
  in["q"] = x.q;
  in["k"] = x.k;
  in["v"] = x.v;
  in["g"] = g;
  in["beta"] = beta;
  in["state_in"] = x.state;
  in["dy"] = dy;
  in["dstate_out"] = dstate_out;
  Tensor t_in = make(MLXK_DTYPE_INT32, {2});
  t_in.set(0, static_cast<float>(T));
  t_in.set(1, static_cast<float>(c.checkpoint));
  in["Tin"] = t_in;
  if (masked) in["mask"] = x.mask;
  Result r;
  r.verdict = "within tolerance of the CPU backward";
  const std::vector<Tensor> out = launch_kernel(c, in, &r.stats);
  auto output = [&](const char* name) -> const Tensor& {
    for (int i = 0; i < c.n_outputs; ++i) {
      if (std::strcmp(c.outputs[i].name, name) == 0) return out[static_cast<size_t>(i)];
    }
    die("case %d: no output %s", c.id, name);
  };
  const Tensor &dq_h = output("dq_h"), &dk_h = output("dk_h"), &dv = output("dv"),
               &dg_part = output("dg_part"), &dbeta_part = output("dbeta_part"),
               &dstate = output("dstate");
  // The kernel's partial sums per value head and row partition: [B, T, Hv, P, Dk], [B, T, Hv, P].
  const int64_t P = dq_h.shape[3];
  auto over_parts = [&](const Tensor& t, size_t i) {
    double sum = 0.0;
    for (int64_t p = 0; p < P; ++p) sum += t.get(i * static_cast<size_t>(P) + static_cast<size_t>(p));
    return sum;
  };

  // dq, dk: the partitions and the value heads of each key head summed (exactly enough: in
  // double).
  auto per_key_head = [&](const Tensor& h) {
    std::vector<double> sum(static_cast<size_t>(B * T * Hk * Dk), 0.0);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      for (int64_t head = 0; head < Hv; ++head) {
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t j = 0; j < Dk; ++j) {
            sum[static_cast<size_t>((bt * Hk + head / group) * Dk + j)] +=
                h.get(static_cast<size_t>(((bt * Hv + head) * P + p) * Dk + j));
          }
        }
      }
    }
    return sum;
  };
  auto widened = [](const Tensor& t) {
    std::vector<double> w(t.count());
    for (size_t i = 0; i < w.size(); ++i) w[i] = t.get(i);
    return w;
  };
  // The gates' chain, as src/cpu/gated_delta/backward.rs `gate_backward` (in double, from the
  // f32 values of a, b, A_log, dt_bias), on the kernel's dg and dbeta.
  const size_t gates = static_cast<size_t>(B * T * Hv);
  std::vector<double> da(gates), db(gates), da_log(static_cast<size_t>(Hv), 0.0),
      ddt(static_cast<size_t>(Hv), 0.0), scale_log(static_cast<size_t>(Hv), 0.0),
      scale_dt(static_cast<size_t>(Hv), 0.0);
  for (size_t i = 0; i < gates; ++i) {
    const size_t h = i % static_cast<size_t>(Hv);
    const double xv = static_cast<double>(x.a.get(i)) + static_cast<double>(x.dt_bias.get(h));
    const double softplus = std::max(xv, 0.0) + std::log1p(std::exp(-std::fabs(xv)));
    const double sigmoid_x = 1.0 / (1.0 + std::exp(-xv));
    const double rate = std::exp(static_cast<double>(x.a_log.get(h)));
    const double gv = std::exp(-rate * softplus);
    const double dgi = over_parts(dg_part, i);
    da[i] = dgi * -rate * sigmoid_x * gv;
    ddt[h] += da[i];
    scale_dt[h] += std::fabs(da[i]);
    const double log_term = dgi * -rate * softplus * gv;
    da_log[h] += log_term;
    scale_log[h] += std::fabs(log_term);
    const double bv = 1.0 / (1.0 + std::exp(-static_cast<double>(x.b.get(i))));
    db[i] = over_parts(dbeta_part, i) * bv * (1.0 - bv);
  }
  const GradError errors[kGradients] = {
      grad_error(cpu_dq, per_key_head(dq_h), false),
      grad_error(cpu_dk, per_key_head(dk_h), false),
      grad_error(cpu_dv, widened(dv), false),
      grad_error(cpu_dstate, widened(dstate), false),
      grad_error(cpu_da, da, true),
      grad_error(cpu_db, db, true),
      grad_error(cpu_da_log, da_log, true,
                 *std::max_element(scale_log.begin(), scale_log.end())),
      grad_error(cpu_ddt, ddt, true, *std::max_element(scale_dt.begin(), scale_dt.end())),
  };
  auto& worst = g_backward_worst[c.dtype];
  r.summary = "error/scale:";
  for (int i = 0; i < kGradients; ++i) {
    const GradError& e = errors[i];
    char part[200];
    std::snprintf(part, sizeof part, " %s %.2e", kGradientNames[i], e.ratio);
    r.summary += part;
    Worst& w = worst[static_cast<size_t>(i)];
    if (e.ratio > w.ratio) w = {e.ratio, c.id};
    if (!(e.ratio <= kBackwardTolerance)) {
      r.exact = false;
      std::snprintf(part, sizeof part,
                    "%s%s[%zu]: CPU %.9g, Metal text %.9g (scale %.3g, bound %.3g)",
                    r.detail.empty() ? "" : " | ", kGradientNames[i], e.at, e.cpu, e.metal,
                    e.scale, kBackwardTolerance);
      r.detail += part;
    }
  }

  // Masked tokens: zero gradients, bit for bit; a fully masked row passes dstate_out through.
  if (masked) {
    size_t padded = 0, wrong = 0, full_rows = 0;
    auto zero = [&](const Tensor& t, size_t from, size_t n) {
      for (size_t i = from; i < from + n; ++i) wrong += t.bits(i) != 0;
    };
    for (int64_t b = 0; b < B; ++b) {
      bool all = true;
      for (int64_t t = 0; t < T; ++t) {
        const size_t bt = static_cast<size_t>(b * T + t);
        if (x.mask.get(bt) != 0.0f) {
          all = false;
          continue;
        }
        ++padded;
        const size_t heads = static_cast<size_t>(Hv), parts = heads * static_cast<size_t>(P);
        zero(dg_part, bt * parts, parts);
        zero(dbeta_part, bt * parts, parts);
        zero(dv, bt * heads * static_cast<size_t>(Dv), heads * static_cast<size_t>(Dv));
        zero(dq_h, bt * parts * static_cast<size_t>(Dk), parts * static_cast<size_t>(Dk));
        zero(dk_h, bt * parts * static_cast<size_t>(Dk), parts * static_cast<size_t>(Dk));
      }
      if (all) {
        ++full_rows;
        const size_t n = static_cast<size_t>(Hv * Dv * Dk);
        for (size_t i = static_cast<size_t>(b) * n; i < static_cast<size_t>(b + 1) * n; ++i) {
          wrong += dstate.bits(i) != dstate_out.bits(i);
        }
      }
    }
    char part[200];
    std::snprintf(part, sizeof part,
                  "; %zu padded tokens give zeros, %zu fully padded rows give "
                  "dstate == dstate_out",
                  padded, full_rows);
    r.summary += part;
    if (wrong) {
      r.exact = false;
      std::snprintf(part, sizeof part, "%s%zu values of padded tokens (zeros) or fully padded "
                    "rows (dstate_out) differ", r.detail.empty() ? "" : " | ", wrong);
      r.detail += part;
    }
  }

  // The checkpoint interval: the twin's outputs must be these bits.
  g_backward_outputs[c.id] = std::vector<Tensor>(out.begin(), out.begin() + 6);
  if (c.twin >= 0) {
    if (g_backward_outputs.count(c.twin) == 0) run_backward(*find_case(c.twin));
    const auto& twin = g_backward_outputs.at(c.twin);
    size_t differ = 0, total = 0;
    for (size_t i = 0; i < twin.size(); ++i) {
      total += twin[i].count();
      differ += compare(twin[i], out[i]).count;
    }
    char part[200];
    if (differ) {
      std::snprintf(part, sizeof part, "; C=%d vs C=%d (case %d): %zu of %zu values differ",
                    c.checkpoint, find_case(c.twin)->checkpoint, c.twin, differ, total);
    } else {
      std::snprintf(part, sizeof part, "; C=%d vs C=%d (case %d): all %zu values the same bits",
                    c.checkpoint, find_case(c.twin)->checkpoint, c.twin, total);
    }
    r.summary += part;
    if (differ) {
      r.exact = false;
      r.detail += std::string(r.detail.empty() ? "" : " | ") +
                  "the checkpoint interval changed " + std::to_string(differ) + " values";
    }
  }
  return r;
}

// The worst errors of the backward cases run, per forward dtype and gradient.
void print_backward_worst() {
  if (g_backward_worst.empty()) return;
  for (const auto& [dtype, worst] : g_backward_worst) {
    std::string line;
    for (int i = 0; i < kGradients; ++i) {
      char part[80];
      std::snprintf(part, sizeof part, "%s %s %.2e (case %d)", i ? "," : "", kGradientNames[i],
                    worst[static_cast<size_t>(i)].ratio, worst[static_cast<size_t>(i)].case_id);
      line += part;
    }
    std::printf("metal-emu backward %s, worst error/scale:%s; bound %.2e\n", dtype_name(dtype),
                line.c_str(), kBackwardTolerance);
  }
}

}  // namespace harness
