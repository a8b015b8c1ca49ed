// The Metal-text emulation test's cases (harness.h): host tensors, the library through its C ABI,
// each kind's random inputs and CPU results, the kernel's launch on the executor, the bit for bit
// comparison, and, where the head split differs, which side is nearer the exact value.

#include <xmmintrin.h>

#include "harness.h"

namespace harness {

// ------------------------------------------------------------------------------------------
// Host tensors

size_t dtype_size(int dtype) {
  switch (dtype) {
    case MLXK_DTYPE_BOOL:
    case MLXK_DTYPE_UINT8:
    case MLXK_DTYPE_INT8: return 1;
    case MLXK_DTYPE_FLOAT16:
    case MLXK_DTYPE_BFLOAT16: return 2;
    default: return 4;
  }
}

const char* dtype_name(int dtype) {
  switch (dtype) {
    case MLXK_DTYPE_BOOL: return "bool";
    case MLXK_DTYPE_INT32: return "int32";
    case MLXK_DTYPE_FLOAT16: return "float16";
    case MLXK_DTYPE_BFLOAT16: return "bfloat16";
    case MLXK_DTYPE_FLOAT32: return "float32";
    default: return "?";
  }
}

[[noreturn]] void die(const char* format, ...) {
  std::fprintf(stderr, "FAIL: metal-emu: ");
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::exit(1);
}

Tensor make(int dtype, std::vector<int64_t> shape, uint8_t fill) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(t.count() * dtype_size(dtype), fill);
  return t;
}

Tensor random(Rng& rng, int dtype, std::vector<int64_t> shape, float lo, float hi) {
  Tensor t = make(dtype, std::move(shape));
  for (size_t i = 0; i < t.count(); ++i) t.set(i, rng.uniform(lo, hi));
  return t;
}

// ------------------------------------------------------------------------------------------
// The library through its C ABI

void check(mlxk_status status, const char* what) {
  if (status != MLXK_OK) {
    die("%s: %s: %s", what, mlxk_status_name(status), mlxk_last_error());
  }
}

// ------------------------------------------------------------------------------------------
// Cases

RecurrenceDraw draw_recurrence(const EmuCase& c, Rng& rng) {
  const int64_t B = c.dims[0], T = c.dims[1], Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4],
                Dv = c.dims[5];
  const float qk = 1.0f / std::sqrt(static_cast<float>(Dk));
  RecurrenceDraw x;
  x.q = random(rng, c.dtype, {B, T, Hk, Dk}, -2.0f * qk, 2.0f * qk);
  x.k = random(rng, c.dtype, {B, T, Hk, Dk}, -2.0f * qk, 2.0f * qk);
  x.v = random(rng, c.dtype, {B, T, Hv, Dv}, -1.0f, 1.0f);
  x.a = random(rng, c.dtype, {B, T, Hv}, -3.0f, 3.0f);
  x.b = random(rng, c.aux_dtype, {B, T, Hv}, -4.0f, 4.0f);
  x.a_log = random(rng, MLXK_DTYPE_FLOAT32, {Hv}, -2.0f, 1.0f);
  x.dt_bias = random(rng, c.dtype, {Hv}, -1.0f, 1.0f);
  // The last value head decays strongly, as some heads of real checkpoints do: with a = 0 and
  // dt_bias = 0 there, g = exp(-exp(4.83) * ln 2) ~ 2e-38, the smallest normals, so its state
  // decays into subnormals, which Apple GPUs flush (as operands and as results): so must the
  // emulation (it runs the Metal text with FTZ and DAZ) and the CPU kernel.
  x.a_log.set(static_cast<size_t>(Hv - 1), 4.83f);
  x.dt_bias.set(static_cast<size_t>(Hv - 1), 0.0f);
  // b = -100 there too: beta = sigmoid(-100) rounds to 0, so the head adds
  // nothing and its state stays the decayed, subnormal one: IEEE and flushing
  // arithmetic then give different y and state bits.
  for (int64_t row = 0; row < B * T; ++row) {
    x.a.set(static_cast<size_t>(row * Hv + Hv - 1), 0.0f);
    x.b.set(static_cast<size_t>(row * Hv + Hv - 1), -100.0f);
  }
  x.state = c.with_state ? random(rng, MLXK_DTYPE_FLOAT32, {B, Hv, Dv, Dk}, -1.0f, 1.0f)
                         : make(MLXK_DTYPE_FLOAT32, {B, Hv, Dv, Dk});
  x.mask = make(MLXK_DTYPE_BOOL, {B, T});
  for (size_t i = 0; i < x.mask.count(); ++i) x.mask.set(i, rng.uniform(0, 1) < 0.65f ? 1 : 0);
  if (x.mask.count() >= 2) {  // at least one real and one padded token
    x.mask.set(0, 0.0f);
    x.mask.set(x.mask.count() - 1, 1.0f);
  }
  return x;
}

// g = compute_g(a_log, a, dt_bias) through the library (f32) and beta = sigmoid(b) through
// MLX's CPU op (b's dtype): the kernel inputs the library's Metal path passes.
void gates_for_kernel(const EmuCase& c, const RecurrenceDraw& x, Tensor* g, Tensor* beta) {
  Handle ha(x.a), ha_log(x.a_log), hdt(x.dt_bias), hg;
  check(mlxk_compute_g(ha_log.a, ha.a, hdt.a, &hg.a), "mlxk_compute_g");
  *g = hg.read();
  *beta = make(c.aux_dtype, x.b.shape);
  if (mlxk_emu_mlx_sigmoid(x.b.bytes.data(), x.b.count(), x.b.dtype, beta->bytes.data()) != 0) {
    die("MLX sigmoid");
  }
}

Built build_recurrence(const EmuCase& c, Rng& rng) {
  const int64_t B = c.dims[0], T = c.dims[1];
  const bool replay = std::strcmp(c.kind, "replay") == 0;
  const bool masked = c.masked != 0;
  const RecurrenceDraw x = draw_recurrence(c, rng);
  const Tensor &q = x.q, &k = x.k, &v = x.v, &a = x.a, &b = x.b, &a_log = x.a_log,
               &dt_bias = x.dt_bias, &state = x.state, &mask = x.mask;

  Handle hq(q), hk(k), hv(v), ha(a), hb(b), ha_log(a_log), hdt(dt_bias);
  Handle hstate, hmask;  // optional: NULL when absent
  Built out;
  auto adopt = [](Handle& h, const Tensor& t) {
    std::vector<int32_t> shape(t.shape.begin(), t.shape.end());
    check(mlxk_array_new(t.bytes.data(), shape.data(), shape.size(), t.dtype, &h.a),
          "mlxk_array_new");
  };
  if (c.with_state) adopt(hstate, state);
  if (masked) adopt(hmask, mask);
  Tensor g, beta;
  gates_for_kernel(c, x, &g, &beta);

  out.inputs["k"] = k;
  out.inputs["v"] = v;
  out.inputs["g"] = g;
  out.inputs["beta"] = beta;
  out.inputs["state_in"] = state;
  if (!replay) {
    out.inputs["q"] = q;
    if (masked) out.inputs["mask"] = mask;
    Handle y, s;
    check(mlxk_gated_delta_update(hq.a, hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hstate.a,
                                  hmask.a, &y.a, &s.a),
          "mlxk_gated_delta_update");
    out.expected["y"] = y.read();
    out.expected["state_out"] = s.read();
  } else {
    Tensor lengths = make(MLXK_DTYPE_INT32, {B});
    if (c.n_lengths != B) die("case %d: %d lengths for B = %" PRId64, c.id, c.n_lengths, B);
    for (int i = 0; i < c.n_lengths; ++i) lengths.set(i, static_cast<float>(c.lengths[i]));
    out.inputs["lengths"] = lengths;
    Handle s;
    check(mlxk_gated_delta_state(hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hstate.a, c.lengths,
                                 static_cast<size_t>(c.n_lengths), &s.a),
          "mlxk_gated_delta_state");
    out.expected["state_out"] = s.read();
  }
  return out;
}

Built build_head_split(const EmuCase& c, Rng& rng) {
  const int64_t B = c.dims[0], S = c.dims[1], Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4],
                Dv = c.dims[5];
  const int64_t C = 2 * Hk * Dk + Hv * Dv;
  const float eps = mlxk_emu::bits_to_float(c.eps_bits);
  Tensor x = random(rng, c.dtype, {B, S, C}, -8.0f, 8.0f);
  Tensor qs = make(c.dtype, {Dk});
  Tensor ks = make(c.dtype, {Dk});
  for (int64_t i = 0; i < Dk; ++i) {
    qs.set(i, rng.uniform(0.5f, 1.5f) / static_cast<float>(Dk));
    ks.set(i, rng.uniform(0.5f, 1.5f) / std::sqrt(static_cast<float>(Dk)));
  }
  Handle hx(x), hqs(qs), hks(ks);
  Handle q, k, v;
  check(mlxk_silu_rms_heads(hx.a, hqs.a, hks.a, static_cast<int32_t>(Hk),
                            static_cast<int32_t>(Hv), static_cast<int32_t>(Dv), eps, &q.a, &k.a,
                            &v.a),
        "mlxk_silu_rms_heads");
  Built out;
  out.inputs["x"] = x;
  out.inputs["qscale"] = qs;
  out.inputs["kscale"] = ks;
  out.expected["q"] = q.read();
  out.expected["k"] = k.read();
  out.expected["v"] = v.read();
  return out;
}

// The recurrence from the convolution's output: the recurrence's gate, state and mask draws,
// x and the scales as the head split draws them; the CPU result through
// mlxk_gated_delta_update_from_conv (the head split's and the update's CPU kernels).
Built build_from_conv(const EmuCase& c, Rng& rng) {
  const int64_t B = c.dims[0], T = c.dims[1], Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4],
                Dv = c.dims[5];
  const int64_t C = 2 * Hk * Dk + Hv * Dv;
  const float eps = mlxk_emu::bits_to_float(c.eps_bits);
  const bool masked = c.masked != 0;
  const RecurrenceDraw r = draw_recurrence(c, rng);
  Tensor x = random(rng, c.dtype, {B, T, C}, -8.0f, 8.0f);
  Tensor qs = make(c.dtype, {Dk});
  Tensor ks = make(c.dtype, {Dk});
  for (int64_t i = 0; i < Dk; ++i) {
    qs.set(i, rng.uniform(0.5f, 1.5f) / static_cast<float>(Dk));
    ks.set(i, rng.uniform(0.5f, 1.5f) / std::sqrt(static_cast<float>(Dk)));
  }
  Handle hx(x), hqs(qs), hks(ks), ha(r.a), hb(r.b), ha_log(r.a_log), hdt(r.dt_bias);
  Handle hstate, hmask;  // optional: NULL when absent
  auto adopt = [](Handle& h, const Tensor& t) {
    std::vector<int32_t> shape(t.shape.begin(), t.shape.end());
    check(mlxk_array_new(t.bytes.data(), shape.data(), shape.size(), t.dtype, &h.a),
          "mlxk_array_new");
  };
  if (c.with_state) adopt(hstate, r.state);
  if (masked) adopt(hmask, r.mask);
  Tensor g, beta;
  gates_for_kernel(c, r, &g, &beta);
  Built out;
  out.inputs["x"] = x;
  out.inputs["qscale"] = qs;
  out.inputs["kscale"] = ks;
  out.inputs["g"] = g;
  out.inputs["beta"] = beta;
  out.inputs["state_in"] = r.state;
  if (masked) out.inputs["mask"] = r.mask;
  Handle y, st;
  check(mlxk_gated_delta_update_from_conv(hx.a, hqs.a, hks.a, static_cast<int32_t>(Hk),
                                          static_cast<int32_t>(Hv), static_cast<int32_t>(Dv), eps,
                                          ha.a, hb.a, ha_log.a, hdt.a, hstate.a, hmask.a, &y.a,
                                          &st.a),
        "mlxk_gated_delta_update_from_conv");
  out.expected["y"] = y.read();
  out.expected["state_out"] = st.read();
  return out;
}

Built build_gated_norm(const EmuCase& c, Rng& rng) {
  std::vector<int64_t> shape(c.dims, c.dims + c.ndims);
  const int64_t D = shape.back();
  const float eps = mlxk_emu::bits_to_float(c.eps_bits);
  Tensor x = random(rng, c.dtype, shape, -3.0f, 3.0f);
  Tensor gate = random(rng, c.aux_dtype, shape, -6.0f, 6.0f);
  Tensor w = random(rng, c.dtype, {D}, 0.5f, 1.5f);
  Handle hx(x), hg(gate), hw(w), out_handle;
  check(mlxk_gated_rms_norm(hx.a, hg.a, hw.a, eps, &out_handle.a), "mlxk_gated_rms_norm");
  Built out;
  out.inputs["x"] = x;
  out.inputs["gate"] = gate;
  out.inputs["weight"] = w;
  out.expected["out"] = out_handle.read();
  return out;
}

std::string head_split_accuracy(const EmuCase& c, const Tensor& x, const Tensor& cpu,
                                const Tensor& metal);

Mismatch compare(const Tensor& cpu, const Tensor& metal) {
  Mismatch m;
  m.total = cpu.count();
  for (size_t i = 0; i < cpu.count(); ++i) {
    const bool same = cpu.bits(i) == metal.bits(i) || (cpu.is_nan(i) && metal.is_nan(i));
    if (same) continue;
    if (m.count < 3) {
      char line[160];
      std::snprintf(line, sizeof line, "%s[%zu]: CPU %.9g (0x%X), Metal text %.9g (0x%X)",
                    m.first.empty() ? "" : "; ", i, cpu.get(i), cpu.bits(i), metal.get(i),
                    metal.bits(i));
      m.first += line;
    }
    ++m.count;
  }
  return m;
}

uint64_t g_seed_offset = 0;  // METAL_EMU_SEED: other random draws than the default ones

// Runs the case's kernel on `inputs` (by launch input name, checked against the launch's
// dtypes and shapes) and returns its outputs in the launch's order.
std::vector<Tensor> launch_kernel(const EmuCase& c, Named& inputs, emu::Stats* stats) {
  // The inputs, in the launch's order, with the launch's dtypes and shapes.
  std::vector<void*> in;
  for (int i = 0; i < c.n_inputs; ++i) {
    const EmuTensor& d = c.inputs[i];
    auto it = inputs.find(d.name);
    if (it == inputs.end()) die("case %d: no data for launch input %s", c.id, d.name);
    Tensor& t = it->second;
    if (t.dtype != d.dtype || t.shape != std::vector<int64_t>(d.dims, d.dims + d.ndim)) {
      die("case %d: input %s is %s, the launch describes %s [%d dims]", c.id, d.name,
          t.describe().c_str(), dtype_name(d.dtype), d.ndim);
    }
    in.push_back(t.bytes.data());
  }
  // Outputs: MLX allocates them uninitialized; 0xFF bytes (NaN) expose unwritten elements.
  std::vector<Tensor> outputs;
  for (int i = 0; i < c.n_outputs; ++i) {
    const EmuTensor& d = c.outputs[i];
    outputs.push_back(make(d.dtype, std::vector<int64_t>(d.dims, d.dims + d.ndim), 0xFF));
  }
  std::vector<void*> out;
  for (auto& t : outputs) out.push_back(t.bytes.data());
  // Apple GPUs flush float32 subnormals, as operands and as results: run the Metal text so.
  const unsigned mode = _mm_getcsr();
  _mm_setcsr(mode | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  *stats = c.launch(in.data(), out.data());
  _mm_setcsr(mode);
  return outputs;
}

Result run_case(const EmuCase& c) {
  const std::string kind = c.kind;
  if (kind == "backward" || kind == "backward_masked") return run_backward(c);
  if (kind == "backward_chunked" || kind == "backward_chunked_masked") {
    return run_backward_chunked(c);
  }
  if (kind == "chunk_out") return run_chunked(c);
  if (kind == "tiles") return run_tiles(c);
  if (kind == "chunk_pool_out") return run_chunked_pool(c);
  Rng rng{c.seed ^ g_seed_offset};
  Built built;
  if (kind == "recurrence" || kind == "recurrence_masked" || kind == "replay") {
    built = build_recurrence(c, rng);
  } else if (kind == "from_conv" || kind == "from_conv_masked") {
    built = build_from_conv(c, rng);
  } else if (kind.compare(0, 5, "pool_") == 0) {
    built = build_pool(c, rng);
  } else if (kind == "head_split") {
    built = build_head_split(c, rng);
  } else if (kind == "gated_norm") {
    built = build_gated_norm(c, rng);
  } else {
    die("case %d: unknown kind %s", c.id, c.kind);
  }
  Result r;
  std::vector<Tensor> outputs = launch_kernel(c, built.inputs, &r.stats);
  for (int i = 0; i < c.n_outputs; ++i) {
    const char* name = c.outputs[i].name;
    auto it = built.expected.find(name);
    if (it == built.expected.end()) die("case %d: no CPU result for output %s", c.id, name);
    if (it->second.dtype != outputs[i].dtype || it->second.shape != outputs[i].shape) {
      die("case %d: output %s: CPU %s, launch %s", c.id, name, it->second.describe().c_str(),
          outputs[i].describe().c_str());
    }
    const Mismatch m = compare(it->second, outputs[i]);
    char part[160];
    if (m.count == 0) {
      std::snprintf(part, sizeof part, "%s%s: %zu exact", r.summary.empty() ? "" : ", ", name,
                    m.total);
    } else {
      std::snprintf(part, sizeof part, "%s%s: %zu of %zu differ", r.summary.empty() ? "" : ", ",
                    name, m.count, m.total);
      r.exact = false;
      r.detail += std::string(r.detail.empty() ? "" : " | ") + name + ": " + m.first;
    }
    r.summary += part;
    if (m.count && std::strcmp(c.kind, "head_split") == 0 && std::strcmp(name, "v") == 0) {
      r.accuracy = head_split_accuracy(c, built.inputs.at("x"), it->second, outputs[i]);
    }
  }
  return r;
}

// Signed distance of two 16-bit or 32-bit float patterns in units in the last place.
int64_t ulps(uint32_t a, uint32_t b, int dtype) {
  const uint32_t sign = dtype == MLXK_DTYPE_FLOAT32 ? 0x80000000u : 0x8000u;
  auto ordered = [&](uint32_t x) -> int64_t {
    return (x & sign) ? -static_cast<int64_t>(x & (sign - 1)) : static_cast<int64_t>(x);
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// For the head split's v (x * sigmoid(x), no normalization): which side is nearer the exact
// value, computed in double, where the two differ.
std::string head_split_accuracy(const EmuCase& c, const Tensor& x, const Tensor& cpu,
                                const Tensor& metal) {
  const int64_t Hk = c.dims[2], Hv = c.dims[3], Dk = c.dims[4], Dv = c.dims[5];
  const int64_t C = 2 * Hk * Dk + Hv * Dv;
  size_t cpu_nearer = 0, metal_nearer = 0, equal = 0;
  int64_t worst = 0;
  for (size_t i = 0; i < cpu.count(); ++i) {
    if (cpu.bits(i) == metal.bits(i)) continue;
    const int64_t col = static_cast<int64_t>(i) % Dv;
    const int64_t head = static_cast<int64_t>(i) / Dv % Hv;
    const int64_t row = static_cast<int64_t>(i) / (Dv * Hv);
    const double xv = x.get(static_cast<size_t>(row * C + 2 * Hk * Dk + head * Dv + col));
    const double exact = xv / (1.0 + std::exp(-xv));
    const double dc = std::fabs(cpu.get(i) - exact), dm = std::fabs(metal.get(i) - exact);
    (dc < dm ? cpu_nearer : dm < dc ? metal_nearer : equal) += 1;
    worst = std::max(worst, ulps(cpu.bits(i), metal.bits(i), cpu.dtype));
  }
  char s[200];
  std::snprintf(s, sizeof s,
                "v (x*sigmoid(x)): where they differ, the CPU value is nearer the exact one in %zu, "
                "the Metal text's in %zu, equally near in %zu; at most %" PRId64 " ulp apart",
                cpu_nearer, metal_nearer, equal, worst);
  return s;
}

}  // namespace harness
