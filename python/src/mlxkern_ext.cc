// mlxkern._ext: the C ABI (include/mlxkern.h) on Python's `mlx.core.array`, with no copy.
//
// Every array argument is the host's `mlx::core::array` (MLX's Python binding keeps one per
// `mx.array`); it is handed to the library with mlxk_array_from_mlx (the same buffer or the same
// lazy node), the kernel builds its nodes, and each result comes back with mlxk_array_to_mlx as
// a new `mx.array` sharing the kernel's node: nothing is evaluated here, and MLX's autograd
// (mx.grad, mx.vjp, mx.value_and_grad) differentiates through the kernels' nodes.
//
// The module is compiled against the headers of the MLX package it runs with and links that
// package's libmlx (one MLX in the process). A failed call raises mlxkern.Error (or the
// subclass for its status) carrying the library's message, which names the argument at fault.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <mlx/array.h>
#include <mlx/version.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mlxkern.h"

namespace nb = nanobind;
namespace mx = mlx::core;
using namespace nb::literals;

namespace {

// A failed mlxk_ call: the status and the library's message (read right after the call).
struct Failure {
  mlxk_status status;
  std::string message;
};

// The Python classes raised for each status (set once by mlxkern/__init__.py); index 0 is the
// base class mlxkern.Error.
nb::object& error_classes() {
  static nb::object* classes = new nb::object();  // never destroyed: outlives the interpreter
  return *classes;
}

void check(mlxk_status status, const std::string& prefix = std::string()) {
  if (status != MLXK_OK) {
    const char* message = mlxk_last_error();
    throw Failure{status, prefix + (message != nullptr ? message : "")};
  }
}

// One handle, freed on every path.
struct Handle {
  mlxk_array* raw = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : raw(other.raw) { other.raw = nullptr; }
  ~Handle() {
    if (raw != nullptr) mlxk_array_free(raw);
  }
};

std::string arg_type_name(nb::handle h) {
  nb::handle t = h.type();
  std::string module = nb::cast<std::string>(nb::getattr(t, "__module__", nb::str("")));
  std::string name = nb::cast<std::string>(nb::getattr(t, "__qualname__", nb::str("?")));
  return module.empty() || module == "builtins" ? name : module + "." + name;
}

std::string repr_of(nb::handle h) {
  nb::object text = nb::steal(PyObject_Str(h.ptr()));
  if (!text.is_valid()) {
    PyErr_Clear();
    return "?";
  }
  return nb::cast<std::string>(text);
}

// The handle sharing the Python argument `name` of function `fn` (an mx.array; None where
// `optional`, giving an empty handle).
Handle in(const char* fn, const char* name, nb::handle value, bool optional = false) {
  Handle out;
  if (optional && value.is_none()) return out;
  mx::array* array = nullptr;
  if (!nb::try_cast<mx::array*>(value, array, false) || array == nullptr) {
    throw nb::type_error((std::string(fn) + ": " + name + " must be an mlx.core.array" +
                          (optional ? " or None" : "") + " (got " + arg_type_name(value) + ")")
                             .c_str());
  }
  mlxk_status status = mlxk_array_from_mlx(array, &out.raw);
  if (status != MLXK_OK) {
    std::string message = mlxk_last_error();
    std::string dtype = repr_of(value.attr("dtype"));
    std::string shape = repr_of(value.attr("shape"));
    throw Failure{status, std::string(fn) + ": " + name + " (" + dtype + ", shape " + shape +
                              "): " + message};
  }
  return out;
}

// A new mx.array sharing the result handle (lazy if the kernel's node is).
nb::object out(const Handle& handle) {
  void* raw = nullptr;
  check(mlxk_array_to_mlx(handle.raw, &raw));
  std::unique_ptr<mx::array> owned(static_cast<mx::array*>(raw));
  return nb::cast(mx::array(std::move(*owned)));
}

const uint8_t* flags(const std::vector<uint8_t>& values) {
  return values.empty() ? nullptr : values.data();
}

std::vector<uint8_t> fresh_flags(const char* fn, nb::handle fresh, size_t n) {
  std::vector<uint8_t> out;
  if (fresh.is_none()) return out;
  std::vector<bool> values;
  if (!nb::try_cast(fresh, values)) {
    throw nb::type_error((std::string(fn) + ": fresh must be a sequence of bools or None (got " +
                          arg_type_name(fresh) + ")")
                             .c_str());
  }
  if (values.size() != n) {
    throw Failure{MLXK_ERR_INVALID_ARGUMENT,
                  std::string(fn) + ": fresh has " + std::to_string(values.size()) +
                      " flags, expected one per slot (" + std::to_string(n) + ")"};
  }
  for (bool v : values) out.push_back(v ? 1 : 0);
  return out;
}

using A = nb::handle;

#define IN(name) in(FN, #name, name)
#define IN_OPT(name) in(FN, #name, name, true)

// --- the recurrence ---------------------------------------------------------------------------

nb::object compute_g(A A_log, A a, A dt_bias) {
  constexpr const char* FN = "compute_g";
  Handle hl = in(FN, "A_log", A_log), ha = IN(a), hd = IN(dt_bias), g;
  check(mlxk_compute_g(hl.raw, ha.raw, hd.raw, &g.raw));
  return out(g);
}

nb::tuple update(A q, A k, A v, A a, A b, A A_log, A dt_bias, A state, A mask) {
  constexpr const char* FN = "gated_delta_update";
  Handle hq = IN(q), hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hs = IN_OPT(state), hm = IN_OPT(mask), y, s;
  check(mlxk_gated_delta_update(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw, hs.raw,
                                hm.raw, &y.raw, &s.raw));
  return nb::make_tuple(out(y), out(s));
}

nb::tuple update_chunked(A q, A k, A v, A a, A b, A A_log, A dt_bias, A state, A mask,
                         int32_t chunk_size) {
  constexpr const char* FN = "gated_delta_update_chunked";
  Handle hq = IN(q), hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hs = IN_OPT(state), hm = IN_OPT(mask), y, s;
  check(mlxk_gated_delta_update_chunked(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw,
                                        hs.raw, hm.raw, chunk_size, &y.raw, &s.raw));
  return nb::make_tuple(out(y), out(s));
}

nb::tuple update_vjp_impl(const char* FN, bool chunked, A q, A k, A v, A a, A b, A A_log,
                          A dt_bias, A state, A mask, A dy, A dstate, int32_t chunk_size) {
  Handle hq = IN(q), hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hs = IN_OPT(state), hm = IN_OPT(mask), hdy = IN_OPT(dy),
         hds = IN_OPT(dstate);
  Handle g[8];
  if (chunked) {
    check(mlxk_gated_delta_update_chunked_vjp(
        hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw, hs.raw, hm.raw, chunk_size,
        hdy.raw, hds.raw, &g[0].raw, &g[1].raw, &g[2].raw, &g[3].raw, &g[4].raw, &g[5].raw,
        &g[6].raw, &g[7].raw));
  } else {
    check(mlxk_gated_delta_update_vjp(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw,
                                      hs.raw, hm.raw, hdy.raw, hds.raw, &g[0].raw, &g[1].raw,
                                      &g[2].raw, &g[3].raw, &g[4].raw, &g[5].raw, &g[6].raw,
                                      &g[7].raw));
  }
  return nb::make_tuple(out(g[0]), out(g[1]), out(g[2]), out(g[3]), out(g[4]), out(g[5]),
                        out(g[6]), out(g[7]));
}

nb::tuple update_vjp(A q, A k, A v, A a, A b, A A_log, A dt_bias, A state, A mask, A dy,
                     A dstate) {
  return update_vjp_impl("gated_delta_update_vjp", false, q, k, v, a, b, A_log, dt_bias, state,
                         mask, dy, dstate, 0);
}

nb::tuple update_chunked_vjp(A q, A k, A v, A a, A b, A A_log, A dt_bias, A state, A mask,
                             int32_t chunk_size, A dy, A dstate) {
  return update_vjp_impl("gated_delta_update_chunked_vjp", true, q, k, v, a, b, A_log, dt_bias,
                         state, mask, dy, dstate, chunk_size);
}

nb::object state_replay(A k, A v, A a, A b, A A_log, A dt_bias, A state,
                        const std::vector<int32_t>& accepted_lengths) {
  constexpr const char* FN = "gated_delta_state";
  Handle hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hs = IN_OPT(state), s;
  check(mlxk_gated_delta_state(hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw, hs.raw,
                               accepted_lengths.empty() ? nullptr : accepted_lengths.data(),
                               accepted_lengths.size(), &s.raw));
  return out(s);
}

nb::tuple from_conv(A x, A q_scale, A k_scale, int32_t key_heads, int32_t value_heads,
                    int32_t value_width, float eps, A a, A b, A A_log, A dt_bias, A state,
                    A mask) {
  constexpr const char* FN = "gated_delta_update_from_conv";
  Handle hx = IN(x), hqs = IN(q_scale), hks = IN(k_scale), ha = IN(a), hb = IN(b),
         hl = in(FN, "A_log", A_log), hd = IN(dt_bias), hs = IN_OPT(state), hm = IN_OPT(mask), y,
         s;
  check(mlxk_gated_delta_update_from_conv(hx.raw, hqs.raw, hks.raw, key_heads, value_heads,
                                          value_width, eps, ha.raw, hb.raw, hl.raw, hd.raw,
                                          hs.raw, hm.raw, &y.raw, &s.raw));
  return nb::make_tuple(out(y), out(s));
}

// --- pools ------------------------------------------------------------------------------------

nb::tuple update_pool_impl(const char* FN, bool chunked, A q, A k, A v, A a, A b, A A_log,
                           A dt_bias, A pool, const std::vector<int32_t>& slots, A fresh, A mask,
                           int32_t chunk_size) {
  Handle hq = IN(q), hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hp = IN(pool), hm = IN_OPT(mask), y, p;
  std::vector<uint8_t> f = fresh_flags(FN, fresh, slots.size());
  const int32_t* s = slots.empty() ? nullptr : slots.data();
  if (chunked) {
    check(mlxk_gated_delta_update_pool_chunked(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw,
                                               hd.raw, hp.raw, s, flags(f), slots.size(), hm.raw,
                                               chunk_size, &y.raw, &p.raw));
  } else {
    check(mlxk_gated_delta_update_pool(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw,
                                       hp.raw, s, flags(f), slots.size(), hm.raw, &y.raw,
                                       &p.raw));
  }
  return nb::make_tuple(out(y), out(p));
}

nb::tuple update_pool(A q, A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                      const std::vector<int32_t>& slots, A fresh, A mask) {
  return update_pool_impl("gated_delta_update_pool", false, q, k, v, a, b, A_log, dt_bias, pool,
                          slots, fresh, mask, 0);
}

nb::tuple update_pool_chunked(A q, A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                              const std::vector<int32_t>& slots, A fresh, A mask,
                              int32_t chunk_size) {
  return update_pool_impl("gated_delta_update_pool_chunked", true, q, k, v, a, b, A_log, dt_bias,
                          pool, slots, fresh, mask, chunk_size);
}

nb::object verify_pool(A q, A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                       const std::vector<int32_t>& slots, A fresh, A mask) {
  constexpr const char* FN = "gated_delta_verify_pool";
  Handle hq = IN(q), hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hp = IN(pool), hm = IN_OPT(mask), y;
  std::vector<uint8_t> f = fresh_flags(FN, fresh, slots.size());
  check(mlxk_gated_delta_verify_pool(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw,
                                     hp.raw, slots.empty() ? nullptr : slots.data(), flags(f),
                                     slots.size(), hm.raw, &y.raw));
  return out(y);
}

// The tree calls read one slot (and one accepted length) per tree: len(cu_nodes) - 1.
void check_trees(const char* FN, const char* name, std::size_t values,
                 const std::vector<int32_t>& cu_nodes) {
  if (!cu_nodes.empty() && values + 1 != cu_nodes.size()) {
    throw Failure{MLXK_ERR_INVALID_ARGUMENT,
                  std::string(FN) + ": " + name + " has " + std::to_string(values) +
                      " values, expected one per tree (len(cu_nodes) - 1 = " +
                      std::to_string(cu_nodes.size() - 1) + ")"};
  }
}

const int32_t* ints(const std::vector<int32_t>& v) { return v.empty() ? nullptr : v.data(); }

nb::object verify_tree_pool(A q, A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                            const std::vector<int32_t>& cu_nodes,
                            const std::vector<int32_t>& parents,
                            const std::vector<int32_t>& slots, A fresh) {
  constexpr const char* FN = "gated_delta_verify_tree_pool";
  Handle hq = IN(q), hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hp = IN(pool), y;
  check_trees(FN, "slots", slots.size(), cu_nodes);
  std::vector<uint8_t> f = fresh_flags(FN, fresh, slots.size());
  check(mlxk_gated_delta_verify_tree_pool(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw,
                                          hp.raw, ints(cu_nodes), cu_nodes.size(), ints(parents),
                                          parents.size(), ints(slots), flags(f), &y.raw));
  return out(y);
}

nb::object commit_tree_pool(A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                            const std::vector<int32_t>& cu_nodes,
                            const std::vector<int32_t>& parents,
                            const std::vector<int32_t>& slots,
                            const std::vector<int32_t>& accepted_lengths,
                            const std::vector<int32_t>& accepted_paths, A fresh) {
  constexpr const char* FN = "gated_delta_commit_tree_pool";
  Handle hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hp = IN(pool), p;
  check_trees(FN, "slots", slots.size(), cu_nodes);
  check_trees(FN, "accepted_lengths", accepted_lengths.size(), cu_nodes);
  if (accepted_lengths.size() != slots.size()) {
    throw Failure{MLXK_ERR_INVALID_ARGUMENT,
                  std::string(FN) + ": accepted_lengths has " +
                      std::to_string(accepted_lengths.size()) +
                      " values, expected one per slot (" + std::to_string(slots.size()) + ")"};
  }
  std::vector<uint8_t> f = fresh_flags(FN, fresh, slots.size());
  check(mlxk_gated_delta_commit_tree_pool(hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw, hp.raw,
                                          ints(cu_nodes), cu_nodes.size(), ints(parents),
                                          parents.size(), ints(slots), flags(f),
                                          ints(accepted_lengths), ints(accepted_paths),
                                          accepted_paths.size(), &p.raw));
  return out(p);
}

nb::tuple update_packed_impl(const char* FN, bool chunked, A q, A k, A v, A a, A b, A A_log,
                             A dt_bias, A pool, const std::vector<int32_t>& cu_seqlens,
                             const std::vector<int32_t>& slots, A fresh, int32_t chunk_size) {
  Handle hq = IN(q), hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hp = IN(pool), y, p;
  if (slots.size() + 1 != cu_seqlens.size()) {
    throw Failure{MLXK_ERR_INVALID_ARGUMENT,
                  std::string(FN) + ": slots has " + std::to_string(slots.size()) +
                      " values, expected one per sequence (len(cu_seqlens) - 1 = " +
                      std::to_string(cu_seqlens.empty() ? 0 : cu_seqlens.size() - 1) + ")"};
  }
  std::vector<uint8_t> f = fresh_flags(FN, fresh, slots.size());
  const int32_t* cu = cu_seqlens.empty() ? nullptr : cu_seqlens.data();
  const int32_t* s = slots.empty() ? nullptr : slots.data();
  if (chunked) {
    check(mlxk_gated_delta_update_packed_chunked(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw,
                                                 hd.raw, hp.raw, cu, cu_seqlens.size(), s,
                                                 flags(f), chunk_size, &y.raw, &p.raw));
  } else {
    check(mlxk_gated_delta_update_packed(hq.raw, hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw,
                                         hp.raw, cu, cu_seqlens.size(), s, flags(f), &y.raw,
                                         &p.raw));
  }
  return nb::make_tuple(out(y), out(p));
}

nb::tuple update_packed(A q, A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                        const std::vector<int32_t>& cu_seqlens, const std::vector<int32_t>& slots,
                        A fresh) {
  return update_packed_impl("gated_delta_update_packed", false, q, k, v, a, b, A_log, dt_bias,
                            pool, cu_seqlens, slots, fresh, 0);
}

nb::tuple update_packed_chunked(A q, A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                                const std::vector<int32_t>& cu_seqlens,
                                const std::vector<int32_t>& slots, A fresh, int32_t chunk_size) {
  return update_packed_impl("gated_delta_update_packed_chunked", true, q, k, v, a, b, A_log,
                            dt_bias, pool, cu_seqlens, slots, fresh, chunk_size);
}

nb::object state_pool(A k, A v, A a, A b, A A_log, A dt_bias, A pool,
                      const std::vector<int32_t>& slots,
                      const std::vector<int32_t>& accepted_lengths, A fresh) {
  constexpr const char* FN = "gated_delta_state_pool";
  Handle hk = IN(k), hv = IN(v), ha = IN(a), hb = IN(b), hl = in(FN, "A_log", A_log),
         hd = IN(dt_bias), hp = IN(pool), p;
  if (accepted_lengths.size() != slots.size()) {
    throw Failure{MLXK_ERR_INVALID_ARGUMENT,
                  std::string(FN) + ": accepted_lengths has " +
                      std::to_string(accepted_lengths.size()) +
                      " values, expected one per slot (" + std::to_string(slots.size()) + ")"};
  }
  std::vector<uint8_t> f = fresh_flags(FN, fresh, slots.size());
  check(mlxk_gated_delta_state_pool(hk.raw, hv.raw, ha.raw, hb.raw, hl.raw, hd.raw, hp.raw,
                                    slots.empty() ? nullptr : slots.data(), flags(f),
                                    accepted_lengths.empty() ? nullptr : accepted_lengths.data(),
                                    slots.size(), &p.raw));
  return out(p);
}

nb::tuple from_conv_pool(A x, A q_scale, A k_scale, int32_t key_heads, int32_t value_heads,
                         int32_t value_width, float eps, A a, A b, A A_log, A dt_bias, A pool,
                         const std::vector<int32_t>& slots, A fresh, A mask) {
  constexpr const char* FN = "gated_delta_update_from_conv_pool";
  Handle hx = IN(x), hqs = IN(q_scale), hks = IN(k_scale), ha = IN(a), hb = IN(b),
         hl = in(FN, "A_log", A_log), hd = IN(dt_bias), hp = IN(pool), hm = IN_OPT(mask), y, p;
  std::vector<uint8_t> f = fresh_flags(FN, fresh, slots.size());
  check(mlxk_gated_delta_update_from_conv_pool(
      hx.raw, hqs.raw, hks.raw, key_heads, value_heads, value_width, eps, ha.raw, hb.raw, hl.raw,
      hd.raw, hp.raw, slots.empty() ? nullptr : slots.data(), flags(f), slots.size(), hm.raw,
      &y.raw, &p.raw));
  return nb::make_tuple(out(y), out(p));
}

// --- the head split and the gated norm --------------------------------------------------------

nb::tuple heads(A x, A q_scale, A k_scale, int32_t key_heads, int32_t value_heads,
                int32_t value_width, float eps) {
  constexpr const char* FN = "silu_rms_heads";
  Handle hx = IN(x), hqs = IN(q_scale), hks = IN(k_scale), q, k, v;
  check(mlxk_silu_rms_heads(hx.raw, hqs.raw, hks.raw, key_heads, value_heads, value_width, eps,
                            &q.raw, &k.raw, &v.raw));
  return nb::make_tuple(out(q), out(k), out(v));
}

nb::tuple heads_vjp(A x, A q_scale, A k_scale, int32_t key_heads, int32_t value_heads,
                    int32_t value_width, float eps, A dq, A dk, A dv) {
  constexpr const char* FN = "silu_rms_heads_vjp";
  Handle hx = IN(x), hqs = IN(q_scale), hks = IN(k_scale), hdq = IN_OPT(dq), hdk = IN_OPT(dk),
         hdv = IN_OPT(dv), gx, gq, gk;
  check(mlxk_silu_rms_heads_vjp(hx.raw, hqs.raw, hks.raw, key_heads, value_heads, value_width,
                                eps, hdq.raw, hdk.raw, hdv.raw, &gx.raw, &gq.raw, &gk.raw));
  return nb::make_tuple(out(gx), out(gq), out(gk));
}

nb::object norm(A x, A gate, A weight, float eps) {
  constexpr const char* FN = "gated_rms_norm";
  Handle hx = IN(x), hg = IN(gate), hw = IN(weight), o;
  check(mlxk_gated_rms_norm(hx.raw, hg.raw, hw.raw, eps, &o.raw));
  return out(o);
}

nb::tuple norm_vjp(A x, A gate, A weight, float eps, A dout) {
  constexpr const char* FN = "gated_rms_norm_vjp";
  Handle hx = IN(x), hg = IN(gate), hw = IN(weight), hdo = IN_OPT(dout), dx, dg, dw;
  check(mlxk_gated_rms_norm_vjp(hx.raw, hg.raw, hw.raw, eps, hdo.raw, &dx.raw, &dg.raw, &dw.raw));
  return nb::make_tuple(out(dx), out(dg), out(dw));
}

// --- devices, limits, versions ----------------------------------------------------------------

void set_default_device(const std::string& device) {
  mlxk_device d;
  if (device == "cpu") {
    d = MLXK_DEVICE_CPU;
  } else if (device == "gpu") {
    d = MLXK_DEVICE_GPU;
  } else {
    throw Failure{MLXK_ERR_INVALID_ARGUMENT,
                  "set_default_device: device is '" + device + "', expected 'cpu' or 'gpu'"};
  }
  check(mlxk_set_default_device(d));
}

std::string gpu_backend() {
  switch (mlxk_gpu_backend()) {
    case MLXK_GPU_METAL:
      return "metal";
    case MLXK_GPU_CUDA:
      return "cuda";
    default:
      return "none";
  }
}

size_t memory_limit() {
  size_t bytes = 0;
  check(mlxk_get_memory_limit(&bytes));
  return bytes;
}

// Shares one small array both ways: the exchange guard's verdict (one libmlx, the built-against
// version), raised as the library's error where it refuses.
void check_exchange() {
  mx::array probe(1.0f);
  Handle h;
  check(mlxk_array_from_mlx(&probe, &h.raw), "mlxkern cannot share arrays with this MLX: ");
  out(h);
}

// --- GLM-5.2 ----------------------------------------------------------------------------------

mlxk_glm52_layout canonical(uint64_t hidden, uint64_t intermediate, uint32_t bits,
                            uint32_t group_size) {
  mlxk_glm52_layout layout{};
  check(mlxk_glm52_layout_canonical(hidden, intermediate, bits, group_size, &layout));
  return layout;
}

void validate(const mlxk_glm52_layout& layout, uint32_t bits, uint32_t group_size) {
  check(mlxk_glm52_layout_validate(&layout, bits, group_size));
}

// An array argument (None reaches in(), which names it), and an optional one (None by default).
auto arr(const char* name) { return nb::arg(name).none(); }
auto opt(const char* name) { return nb::arg(name).none() = nb::none(); }

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "mlxkern's kernels on mlx.core arrays (the compiled part; use the mlxkern package).";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Failure& e) {
      nb::object classes = error_classes();
      nb::object cls;
      if (classes.is_valid() && !classes.is_none()) {
        nb::dict d = nb::borrow<nb::dict>(classes);
        nb::object key = nb::int_(e.status);
        cls = d.contains(key) ? nb::object(d[key]) : nb::object(d[nb::int_(-1)]);
      }
      nb::object exc = cls.is_valid()
                           ? cls(nb::str(e.message.c_str()), nb::int_(e.status),
                                 nb::str(mlxk_status_name(e.status)))
                           : nb::object();
      if (exc.is_valid()) {
        PyErr_SetObject(cls.ptr(), exc.ptr());
      } else {
        PyErr_SetString(PyExc_RuntimeError, e.message.c_str());
      }
    }
  });

  m.def("_set_error_classes", [](nb::dict classes) { error_classes() = classes; });
  m.def("_check_exchange", &check_exchange);
  m.attr("MLX_BUILD_VERSION") = std::to_string(MLX_VERSION_MAJOR) + "." +
                                std::to_string(MLX_VERSION_MINOR) + "." +
                                std::to_string(MLX_VERSION_PATCH);
  m.attr("ABI_VERSION") = MLXK_ABI_VERSION;
  m.def("version", [] { return std::string(mlxk_version()); });
  m.def("abi_version", [] { return mlxk_abi_version(); });
  m.def("mlx_version", [] { return std::string(mlxk_mlx_version()); });
  m.def("status_name", [](int32_t s) { return std::string(mlxk_status_name(s)); }, "status"_a);

  m.def("set_default_device", &set_default_device, "device"_a);
  m.def("gpu_backend", &gpu_backend);
  m.def("set_memory_limit", [](size_t b) { check(mlxk_set_memory_limit(b)); }, "bytes"_a);
  m.def("memory_limit", &memory_limit);
  m.def("set_cache_limit", [](size_t b) { check(mlxk_set_cache_limit(b)); }, "bytes"_a);

  m.def("compute_g", &compute_g, arr("A_log"), arr("a"), arr("dt_bias"));
  m.def("gated_delta_update", &update, arr("q"), arr("k"), arr("v"), arr("a"), arr("b"),
        arr("A_log"), arr("dt_bias"), opt("state"), opt("mask"));
  m.def("gated_delta_update_chunked", &update_chunked, arr("q"), arr("k"), arr("v"), arr("a"),
        arr("b"), arr("A_log"), arr("dt_bias"), opt("state"), opt("mask"), "chunk_size"_a = 0);
  m.def("gated_delta_update_vjp", &update_vjp, arr("q"), arr("k"), arr("v"), arr("a"), arr("b"),
        arr("A_log"), arr("dt_bias"), opt("state"), opt("mask"), opt("dy"), opt("dstate"));
  m.def("gated_delta_update_chunked_vjp", &update_chunked_vjp, arr("q"), arr("k"), arr("v"),
        arr("a"), arr("b"), arr("A_log"), arr("dt_bias"), opt("state"), opt("mask"),
        "chunk_size"_a = 0, opt("dy"), opt("dstate"));
  m.def("gated_delta_state", &state_replay, arr("k"), arr("v"), arr("a"), arr("b"), arr("A_log"),
        arr("dt_bias"), arr("state"), "accepted_lengths"_a);
  m.def("gated_delta_update_from_conv", &from_conv, arr("x"), arr("q_scale"), arr("k_scale"),
        "key_heads"_a, "value_heads"_a, "value_width"_a, "eps"_a, arr("a"), arr("b"), arr("A_log"),
        arr("dt_bias"), opt("state"), opt("mask"));
  m.def("gated_delta_update_pool", &update_pool, arr("q"), arr("k"), arr("v"), arr("a"), arr("b"),
        arr("A_log"), arr("dt_bias"), arr("pool"), "slots"_a, "fresh"_a = nb::none(), opt("mask"));
  m.def("gated_delta_update_pool_chunked", &update_pool_chunked, arr("q"), arr("k"), arr("v"),
        arr("a"), arr("b"), arr("A_log"), arr("dt_bias"), arr("pool"), "slots"_a,
        "fresh"_a = nb::none(), opt("mask"), "chunk_size"_a = 0);
  m.def("gated_delta_verify_pool", &verify_pool, arr("q"), arr("k"), arr("v"), arr("a"), arr("b"),
        arr("A_log"), arr("dt_bias"), arr("pool"), "slots"_a, "fresh"_a = nb::none(), opt("mask"));
  m.def("gated_delta_update_packed", &update_packed, arr("q"), arr("k"), arr("v"), arr("a"),
        arr("b"), arr("A_log"), arr("dt_bias"), arr("pool"), "cu_seqlens"_a, "slots"_a,
        "fresh"_a = nb::none());
  m.def("gated_delta_update_packed_chunked", &update_packed_chunked, arr("q"), arr("k"), arr("v"),
        arr("a"), arr("b"), arr("A_log"), arr("dt_bias"), arr("pool"), "cu_seqlens"_a, "slots"_a,
        "fresh"_a = nb::none(), "chunk_size"_a = 0);
  m.def("gated_delta_state_pool", &state_pool, arr("k"), arr("v"), arr("a"), arr("b"), arr("A_log"),
        arr("dt_bias"), arr("pool"), "slots"_a, "accepted_lengths"_a, "fresh"_a = nb::none());
  m.def("gated_delta_verify_tree_pool", &verify_tree_pool, arr("q"), arr("k"), arr("v"), arr("a"),
        arr("b"), arr("A_log"), arr("dt_bias"), arr("pool"), "cu_nodes"_a, "parents"_a, "slots"_a,
        "fresh"_a = nb::none());
  m.def("gated_delta_commit_tree_pool", &commit_tree_pool, arr("k"), arr("v"), arr("a"), arr("b"),
        arr("A_log"), arr("dt_bias"), arr("pool"), "cu_nodes"_a, "parents"_a, "slots"_a,
        "accepted_lengths"_a, "accepted_paths"_a, "fresh"_a = nb::none());
  m.def("gated_delta_update_from_conv_pool", &from_conv_pool, arr("x"), arr("q_scale"),
        arr("k_scale"), "key_heads"_a, "value_heads"_a, "value_width"_a, "eps"_a, arr("a"),
        arr("b"), arr("A_log"), arr("dt_bias"), arr("pool"), "slots"_a, "fresh"_a = nb::none(),
        opt("mask"));

  m.def("silu_rms_heads", &heads, arr("x"), arr("q_scale"), arr("k_scale"), "key_heads"_a,
        "value_heads"_a, "value_width"_a, "eps"_a);
  m.def("silu_rms_heads_vjp", &heads_vjp, arr("x"), arr("q_scale"), arr("k_scale"), "key_heads"_a,
        "value_heads"_a, "value_width"_a, "eps"_a, opt("dq"), opt("dk"), opt("dv"));
  m.def("gated_rms_norm", &norm, arr("x"), arr("gate"), arr("weight"), "eps"_a);
  m.def("gated_rms_norm_vjp", &norm_vjp, arr("x"), arr("gate"), arr("weight"), "eps"_a,
        opt("dout"));

  nb::class_<mlxk_glm52_layout>(m, "GLM52Layout")
      .def(nb::init<>())
      .def_rw("hidden_size", &mlxk_glm52_layout::hidden_size)
      .def_rw("intermediate_size", &mlxk_glm52_layout::intermediate_size)
      .def_rw("slot_bytes", &mlxk_glm52_layout::slot_bytes)
      .def_rw("down_weight_offset", &mlxk_glm52_layout::down_weight_offset)
      .def_rw("gate_weight_offset", &mlxk_glm52_layout::gate_weight_offset)
      .def_rw("up_weight_offset", &mlxk_glm52_layout::up_weight_offset)
      .def_rw("down_scale_offset", &mlxk_glm52_layout::down_scale_offset)
      .def_rw("gate_scale_offset", &mlxk_glm52_layout::gate_scale_offset)
      .def_rw("up_scale_offset", &mlxk_glm52_layout::up_scale_offset);
  m.def("glm52_layout_canonical", &canonical, "hidden"_a, "intermediate"_a, "bits"_a,
        "group_size"_a);
  m.def("glm52_layout_validate", &validate, "layout"_a, "bits"_a, "group_size"_a);
}
