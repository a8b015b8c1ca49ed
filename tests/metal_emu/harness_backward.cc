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

const char* const kGradientNames[kGradients] = {"dq", "dk",     "dv",     "dstate",
                                                "da", "db",     "da_log", "ddt_bias"};

void WorstGrad::see(double r, int id) {
  if (r > ratio) *this = {r, id};
}

std::map<int, std::array<WorstGrad, kGradients>> g_backward_worst;

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

int input_dtype(const EmuCase& c, const char* name) {
  int dtype = -1;
  for (int i = 0; i < c.n_inputs; ++i) {
    if (std::strcmp(c.inputs[i].name, name) == 0) dtype = c.inputs[i].dtype;
  }
  return dtype;
}

BackwardDraw draw_backward(const EmuCase& c, int dy_dtype) {
  const int64_t B = c.dims[0], T = c.dims[1], Hv = c.dims[3], Dk = c.dims[4], Dv = c.dims[5];
  Rng rng{c.seed ^ g_seed_offset};
  BackwardDraw d{draw_recurrence(c, rng), {}, {}};
  d.dy = random(rng, dy_dtype, {B, T, Hv, Dv}, -1.0f, 1.0f);
  d.dstate_out = random(rng, MLXK_DTYPE_FLOAT32, {B, Hv, Dv, Dk}, -1.0f, 1.0f);
  if (c.masked != 0 && B >= 2) {  // row 0 entirely padding (the last token of the last row is real)
    for (int64_t t = 0; t < T; ++t) d.x.mask.set(static_cast<size_t>(t), 0.0f);
  }
  return d;
}

std::array<Tensor, kGradients> cpu_backward(const EmuCase& c, const BackwardDraw& d) {
  const RecurrenceDraw& x = d.x;
  Handle hq(x.q), hk(x.k), hv(x.v), ha(x.a), hb(x.b), ha_log(x.a_log), hdt(x.dt_bias),
      hdy(d.dy), hdso(d.dstate_out);
  Handle hstate, hmask;  // NULL when absent
  if (c.with_state) hstate.a = new_array(x.state);
  if (c.masked != 0) hmask.a = new_array(x.mask);
  Handle grads[kGradients];  // dq, dk, dv, da, db, da_log, ddt_bias, dstate (the ABI's order)
  check(mlxk_gated_delta_update_vjp(hq.a, hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hstate.a,
                                    hmask.a, hdy.a, hdso.a, &grads[0].a, &grads[1].a,
                                    &grads[2].a, &grads[3].a, &grads[4].a, &grads[5].a,
                                    &grads[6].a, &grads[7].a),
        "mlxk_gated_delta_update_vjp");
  return {grads[0].read(), grads[1].read(), grads[2].read(), grads[7].read(),
          grads[3].read(), grads[4].read(), grads[5].read(), grads[6].read()};
}

Named backward_kernel_inputs(const EmuCase& c, const BackwardDraw& d,
                             const std::vector<int64_t>& tin) {
  Named in;
  Tensor g, beta;
  gates_for_kernel(c, d.x, &g, &beta);
  in["q"] = d.x.q;
  in["k"] = d.x.k;
  in["v"] = d.x.v;
  in["g"] = g;
  in["beta"] = beta;
  in["state_in"] = d.x.state;
  in["dy"] = d.dy;
  in["dstate_out"] = d.dstate_out;
  Tensor t_in = make(MLXK_DTYPE_INT32, {static_cast<int64_t>(tin.size())});
  for (size_t i = 0; i < tin.size(); ++i) t_in.set(i, static_cast<float>(tin[i]));
  in["Tin"] = t_in;
  if (c.masked != 0) in["mask"] = d.x.mask;
  return in;
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> w(t.count());
  for (size_t i = 0; i < w.size(); ++i) w[i] = t.get(i);
  return w;
}

std::vector<double> per_key_head(const EmuCase& c, const Tensor& h, int64_t P) {
  const int64_t BT = c.dims[0] * c.dims[1], Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4];
  const int64_t group = Hv / Hk;
  std::vector<double> sum(static_cast<size_t>(BT * Hk * Dk), 0.0);
  for (int64_t bt = 0; bt < BT; ++bt) {
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
}

GateChain gate_chain(const RecurrenceDraw& x, int64_t Hv, const std::vector<double>& dg,
                     const std::vector<double>& dbeta) {
  GateChain c;
  const size_t gates = dg.size(), heads = static_cast<size_t>(Hv);
  c.da.assign(gates, 0.0);
  c.db.assign(gates, 0.0);
  c.da_log.assign(heads, 0.0);
  c.ddt.assign(heads, 0.0);
  c.scale_log.assign(heads, 0.0);
  c.scale_dt.assign(heads, 0.0);
  for (size_t i = 0; i < gates; ++i) {
    const size_t h = i % heads;
    const double xv = static_cast<double>(x.a.get(i)) + static_cast<double>(x.dt_bias.get(h));
    const double softplus = std::max(xv, 0.0) + std::log1p(std::exp(-std::fabs(xv)));
    const double sigmoid_x = 1.0 / (1.0 + std::exp(-xv));
    const double rate = std::exp(static_cast<double>(x.a_log.get(h)));
    const double gv = std::exp(-rate * softplus);
    c.da[i] = dg[i] * -rate * sigmoid_x * gv;
    c.ddt[h] += c.da[i];
    c.scale_dt[h] += std::fabs(c.da[i]);
    const double log_term = dg[i] * -rate * softplus * gv;
    c.da_log[h] += log_term;
    c.scale_log[h] += std::fabs(log_term);
    const double bv = 1.0 / (1.0 + std::exp(-static_cast<double>(x.b.get(i))));
    c.db[i] = dbeta[i] * bv * (1.0 - bv);
  }
  return c;
}

void check_padded(const EmuCase& c, const BackwardDraw& d, int64_t P, const Named& out,
                  Result* r) {
  const int64_t B = c.dims[0], T = c.dims[1], Hv = c.dims[3], Dk = c.dims[4], Dv = c.dims[5];
  const Tensor &dq_h = out.at("dq_h"), &dk_h = out.at("dk_h"), &dv = out.at("dv"),
               &dg_part = out.at("dg_part"), &dbeta_part = out.at("dbeta_part"),
               &dstate = out.at("dstate");
  size_t padded = 0, wrong = 0, full_rows = 0;
  auto zero = [&](const Tensor& t, size_t from, size_t n) {
    for (size_t i = from; i < from + n; ++i) wrong += t.bits(i) != 0;
  };
  for (int64_t b = 0; b < B; ++b) {
    bool all = true;
    for (int64_t t = 0; t < T; ++t) {
      const size_t bt = static_cast<size_t>(b * T + t);
      if (d.x.mask.get(bt) != 0.0f) {
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
        wrong += dstate.bits(i) != d.dstate_out.bits(i);
      }
    }
  }
  char part[200];
  std::snprintf(part, sizeof part,
                "; %zu padded tokens give zeros, %zu fully padded rows give "
                "dstate == dstate_out",
                padded, full_rows);
  r->summary += part;
  if (wrong) {
    r->exact = false;
    std::snprintf(part, sizeof part, "%s%zu values of padded tokens (zeros) or fully padded "
                  "rows (dstate_out) differ", r->detail.empty() ? "" : " | ", wrong);
    r->detail += part;
  }
}

void print_worst(const char* what,
                 const std::map<int, std::array<WorstGrad, kGradients>>& table, double bound) {
  for (const auto& [dtype, worst] : table) {
    std::string line;
    for (int i = 0; i < kGradients; ++i) {
      char part[80];
      std::snprintf(part, sizeof part, "%s %s %.2e (case %d)", i ? "," : "", kGradientNames[i],
                    worst[static_cast<size_t>(i)].ratio, worst[static_cast<size_t>(i)].case_id);
      line += part;
    }
    std::printf("metal-emu %s %s, worst error/scale:%s; bound %.2e\n", what, dtype_name(dtype),
                line.c_str(), bound);
  }
}

Result run_backward(const EmuCase& c) {
  const int64_t B = c.dims[0], T = c.dims[1], Hv = c.dims[3];
  const BackwardDraw d = draw_backward(c, input_dtype(c, "dy"));
  const RecurrenceDraw& x = d.x;

  // The CPU backward through the C ABI.
  const std::array<Tensor, kGradients> cpu = cpu_backward(c, d);

  // The kernel, on the inputs the library's Metal path would pass.
  Named in = backward_kernel_inputs(c, d, {T, c.checkpoint});
  Result r;
  r.verdict = "within tolerance of the CPU backward";
  const std::vector<Tensor> out = launch_kernel(c, in, &r.stats);
  Named named;
  for (int i = 0; i < c.n_outputs; ++i) named[c.outputs[i].name] = out[static_cast<size_t>(i)];
  auto output = [&](const char* name) -> const Tensor& {
    if (named.count(name) == 0) die("case %d: no output %s", c.id, name);
    return named.at(name);
  };
  const Tensor &dq_h = output("dq_h"), &dk_h = output("dk_h"), &dv = output("dv"),
               &dg_part = output("dg_part"), &dbeta_part = output("dbeta_part"),
               &dstate = output("dstate");
  // The kernel's partial sums per value head and row partition: [B, T, Hv, P, Dk], [B, T, Hv, P].
  const int64_t P = dq_h.shape[3];
  auto over_parts = [&](const Tensor& t) {
    std::vector<double> sum(static_cast<size_t>(B * T * Hv), 0.0);
    for (size_t i = 0; i < sum.size(); ++i) {
      for (int64_t p = 0; p < P; ++p) {
        sum[i] += t.get(i * static_cast<size_t>(P) + static_cast<size_t>(p));
      }
    }
    return sum;
  };

  // dq, dk: the partitions and the value heads of each key head summed (exactly enough: in
  // double). The gates' chain, as src/cpu/gated_delta/backward.rs `gate_backward` (in double,
  // from the f32 values of a, b, A_log, dt_bias), on the kernel's dg and dbeta.
  const GateChain chain = gate_chain(x, Hv, over_parts(dg_part), over_parts(dbeta_part));
  const GradError errors[kGradients] = {
      grad_error(cpu[0], per_key_head(c, dq_h, P), false),
      grad_error(cpu[1], per_key_head(c, dk_h, P), false),
      grad_error(cpu[2], doubles(dv), false),
      grad_error(cpu[3], doubles(dstate), false),
      grad_error(cpu[4], chain.da, true),
      grad_error(cpu[5], chain.db, true),
      grad_error(cpu[6], chain.da_log, true,
                 *std::max_element(chain.scale_log.begin(), chain.scale_log.end())),
      grad_error(cpu[7], chain.ddt, true,
                 *std::max_element(chain.scale_dt.begin(), chain.scale_dt.end())),
  };
  auto& worst = g_backward_worst[c.dtype];
  r.summary = "error/scale:";
  for (int i = 0; i < kGradients; ++i) {
    const GradError& e = errors[i];
    char part[200];
    std::snprintf(part, sizeof part, " %s %.2e", kGradientNames[i], e.ratio);
    r.summary += part;
    worst[static_cast<size_t>(i)].see(e.ratio, c.id);
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
  if (c.masked != 0) check_padded(c, d, P, named, &r);

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
void print_backward_worst() { print_worst("backward", g_backward_worst, kBackwardTolerance); }

}  // namespace harness
