// A C++ host that keeps its arrays in MLX (mlx::core) and hands them to mlxkern without a
// copy (mlxk_array_from_mlx / mlxk_array_to_mlx): zero copy, laziness across the boundary,
// views (transposed, broadcast, offset), results consumed by the host's own ops, the misuse
// cases, the MLX lock with a host thread using MLX concurrently, and MLX's autograd through the
// kernels (mx::vjp and mx::value_and_grad against the explicit backward calls, bit for bit; jvp,
// vmap and second derivatives refused by name). Fresh random inputs every run (the seed is
// printed). Built and run by scripts/test/interop.sh under ASan + LSan.
#include <mlx/mlx.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mlxkern.h"

namespace mx = mlx::core;

static int checks = 0;
static int failures = 0;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    ++checks;                                                                         \
    if (!(cond)) {                                                                    \
      ++failures;                                                                     \
      std::fprintf(stderr, "FAIL (%s:%d): %s [%s]\n", __FILE__, __LINE__, #cond,      \
                   mlxk_last_error());                                                \
    }                                                                                 \
  } while (0)

#define OK(call) CHECK((call) == MLXK_OK)

static mlxk_array *from_host(const mx::array &a) {
  mlxk_array *h = nullptr;
  OK(mlxk_array_from_mlx(&a, &h));
  return h;
}

// The host's array sharing a handle's; the host owns it (deleted here by a unique_ptr).
static std::unique_ptr<mx::array> to_host(const mlxk_array *h) {
  void *p = nullptr;
  OK(mlxk_array_to_mlx(h, &p));
  return std::unique_ptr<mx::array>(static_cast<mx::array *>(p));
}

static std::vector<uint8_t> bytes_of(mx::array a) {
  a = mx::contiguous(a);
  mx::eval(a);
  const auto *p = a.data<uint8_t>();
  return std::vector<uint8_t>(p, p + a.nbytes());
}

static std::vector<uint8_t> read_handle(const mlxk_array *h) {
  size_t n = 0;
  OK(mlxk_array_nbytes(h, &n));
  std::vector<uint8_t> out(n);
  OK(mlxk_array_read(h, out.data(), n));
  return out;
}

// A handle holding a row-contiguous copy of `a` made through the C ABI's own constructor: the
// reference path (what a host did before it could share arrays).
static mlxk_array *copy_in(const mx::array &a) {
  auto bytes = bytes_of(a);
  std::vector<int32_t> shape(a.shape().begin(), a.shape().end());
  mlxk_dtype dtype = a.dtype() == mx::bfloat16 ? MLXK_DTYPE_BFLOAT16
                     : a.dtype() == mx::float16 ? MLXK_DTYPE_FLOAT16
                     : a.dtype() == mx::bool_   ? MLXK_DTYPE_BOOL
                                                : MLXK_DTYPE_FLOAT32;
  mlxk_array *h = nullptr;
  OK(mlxk_array_new(bytes.data(), shape.data(), shape.size(), dtype, &h));
  return h;
}

struct Inputs {
  mx::array q, k, v, a, b, a_log, dt_bias, state;
};

// y and state of mlxk_gated_delta_update on handles made by `make`.
template <class Make>
static std::pair<std::vector<uint8_t>, std::vector<uint8_t>> update(const Inputs &x, Make make) {
  mlxk_array *hs[8] = {make(x.q), make(x.k), make(x.v), make(x.a), make(x.b), make(x.a_log),
                       make(x.dt_bias), make(x.state)};
  mlxk_array *y = nullptr, *s = nullptr;
  OK(mlxk_gated_delta_update(hs[0], hs[1], hs[2], hs[3], hs[4], hs[5], hs[6], hs[7], nullptr, &y,
                             &s));
  auto out = std::make_pair(read_handle(y), read_handle(s));
  for (auto *h : hs) OK(mlxk_array_free(h));
  OK(mlxk_array_free(y));
  OK(mlxk_array_free(s));
  return out;
}

static mx::array normal(const mx::Shape &shape, mx::Dtype dtype, mx::array &key) {
  auto split = mx::random::split(key);
  key = split.first;
  return mx::astype(mx::random::normal(shape, mx::float32, 0.0f, 0.5f, split.second), dtype);
}

static Inputs random_inputs(int B, int T, int Hk, int Hv, int Dk, int Dv, mx::array &key) {
  auto bf = mx::bfloat16;
  Inputs x{normal({B, T, Hk, Dk}, bf, key), normal({B, T, Hk, Dk}, bf, key),
           normal({B, T, Hv, Dv}, bf, key), normal({B, T, Hv}, bf, key),
           normal({B, T, Hv}, bf, key), normal({Hv}, mx::float32, key),
           normal({Hv}, bf, key), normal({B, Hv, Dv, Dk}, mx::float32, key)};
  return x;
}

static void evaluated_inputs_are_shared_not_copied(mx::array &key) {
  auto x = normal({2, 3, 4, 64}, mx::bfloat16, key);
  mx::eval(x);
  auto *h = from_host(x);
  auto back = to_host(h);
  CHECK(back->id() == x.id());
  CHECK(back->data<void>() == x.data<void>());
  CHECK(read_handle(h) == bytes_of(x));
  // The kernel's node takes the host's evaluated array itself as its input: the same node, so
  // the kernel reads the host's buffer.
  auto in = random_inputs(1, 2, 1, 2, 32, 4, key);
  mx::eval({in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, in.state});
  mlxk_array *hs[8] = {from_host(in.q), from_host(in.k), from_host(in.v), from_host(in.a),
                       from_host(in.b), from_host(in.a_log), from_host(in.dt_bias),
                       from_host(in.state)};
  mlxk_array *y = nullptr, *s = nullptr;
  OK(mlxk_gated_delta_update(hs[0], hs[1], hs[2], hs[3], hs[4], hs[5], hs[6], hs[7], nullptr, &y,
                             &s));
  auto yh = to_host(y);
  CHECK(!yh->is_available());
  CHECK(yh->inputs().size() == 8);
  if (yh->inputs().size() == 8) {
    CHECK(yh->inputs()[0].id() == in.q.id());
    CHECK(yh->inputs()[7].id() == in.state.id());
  }
  for (auto *hh : hs) OK(mlxk_array_free(hh));
  OK(mlxk_array_free(y));
  OK(mlxk_array_free(s));
  OK(mlxk_array_free(h));
}

static void lazy_host_nodes_stay_lazy(mx::array &key) {
  auto in = random_inputs(2, 5, 2, 4, 64, 8, key);
  mx::eval({in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, in.state});
  auto expect = update(in, copy_in);
  // The same values as unevaluated host nodes: q * 1 and v + 0 are exact.
  Inputs lazy = in;
  lazy.q = mx::multiply(in.q, mx::array(1.0f, mx::bfloat16));
  lazy.v = mx::add(in.v, mx::array(0.0f, mx::bfloat16));
  CHECK(!lazy.q.is_available());
  mlxk_array *hs[8] = {from_host(lazy.q), from_host(lazy.k), from_host(lazy.v),
                       from_host(lazy.a), from_host(lazy.b), from_host(lazy.a_log),
                       from_host(lazy.dt_bias), from_host(lazy.state)};
  CHECK(!lazy.q.is_available());
  mlxk_array *y = nullptr, *s = nullptr;
  OK(mlxk_gated_delta_update(hs[0], hs[1], hs[2], hs[3], hs[4], hs[5], hs[6], hs[7], nullptr, &y,
                             &s));
  auto yh = to_host(y);
  auto sh = to_host(s);
  for (auto *h : hs) OK(mlxk_array_free(h));
  OK(mlxk_array_free(y));
  OK(mlxk_array_free(s));
  // Still nothing computed; one host evaluation computes the host's nodes and the kernel's.
  CHECK(!lazy.q.is_available());
  CHECK(!yh->is_available());
  mx::eval({*yh, *sh});
  CHECK(lazy.q.is_available());
  CHECK(bytes_of(*yh) == expect.first);
  CHECK(bytes_of(*sh) == expect.second);
  // The host consumes the result with its own ops.
  auto total = mx::sum(mx::astype(*yh, mx::float32));
  auto again = mx::sum(mx::astype(in.q, mx::float32));  // unrelated op on a shared input
  mx::eval({total, again});
  double host_sum = 0;
  {
    auto y32 = mx::astype(*yh, mx::float32);
    mx::eval(y32);
    for (size_t i = 0; i < y32.size(); ++i) host_sum += y32.data<float>()[i];
  }
  CHECK(std::fabs(total.item<float>() - host_sum) <= 1e-3 * (1 + std::fabs(host_sum)));
}

static void views_are_made_contiguous_in_the_graph(mx::array &key) {
  const int B = 2, T = 4, Hk = 2, Hv = 4, Dk = 32, Dv = 6;
  auto in = random_inputs(B, T, Hk, Hv, Dk, Dv, key);
  mx::eval({in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, in.state});
  auto expect = update(in, copy_in);
  Inputs views = in;
  // q as a transposed view of a [B, Hk, T, Dk] array.
  auto q_bhtd = mx::contiguous(mx::transpose(in.q, {0, 2, 1, 3}));
  mx::eval(q_bhtd);
  views.q = mx::transpose(q_bhtd, {0, 2, 1, 3});
  // a as a broadcast of its first batch row when both rows are equal.
  auto a_row = mx::slice(in.a, {0, 0, 0}, {1, T, Hv});
  views.a = mx::broadcast_to(a_row, {B, T, Hv});
  Inputs expect_in = in;
  expect_in.a = mx::contiguous(views.a);
  mx::eval(expect_in.a);
  // v as an offset slice of a larger array.
  auto big = mx::concatenate({normal({B, T, Hv, Dv}, mx::bfloat16, key), in.v}, 1);
  mx::eval(big);
  views.v = mx::slice(big, {0, T, 0, 0}, {B, 2 * T, Hv, Dv});
  mx::eval({views.q, views.a, views.v});
  CHECK(!views.q.flags().row_contiguous);
  CHECK(views.a.data_size() != views.a.size());
  CHECK(views.v.data<uint8_t>() != big.data<uint8_t>());
  auto got = update(views, from_host);
  auto want = update(expect_in, copy_in);
  CHECK(got.first == want.first);
  CHECK(got.second == want.second);
  CHECK(bytes_of(views.q) == bytes_of(in.q));
  (void)expect;
}

static void misuse(mx::array &key) {
  mlxk_array *h = nullptr;
  CHECK(mlxk_array_from_mlx(nullptr, &h) == MLXK_ERR_NULL_POINTER);
  CHECK(std::strstr(mlxk_last_error(), "mlx_array") != nullptr);
  auto x = normal({3}, mx::float32, key);
  CHECK(mlxk_array_from_mlx(&x, nullptr) == MLXK_ERR_NULL_POINTER);
  auto f64 = mx::astype(x, mx::float64);
  CHECK(mlxk_array_from_mlx(&f64, &h) == MLXK_ERR_DTYPE);
  CHECK(std::strstr(mlxk_last_error(), "dtype") != nullptr);
  CHECK(h == nullptr);
  auto *g = from_host(x);
  OK(mlxk_array_free(g));
  void *p = nullptr;
  CHECK(mlxk_array_to_mlx(g, &p) == MLXK_ERR_INVALID_HANDLE);
  CHECK(p == nullptr);
  CHECK(mlxk_array_to_mlx(nullptr, &p) == MLXK_ERR_NULL_POINTER);
  OK(mlxk_mlx_array_free(nullptr));
  CHECK(mlxk_mlx_unlock() == MLXK_ERR_INVALID_ARGUMENT);
  CHECK(std::string(mlxk_mlx_version()) == mx::version());
}

// A host thread builds and evaluates MLX graphs while this thread calls mlxkern; both hold
// the MLX lock around their MLX work, as the header says a multi-threaded host must.
static void lock_serializes_host_threads(mx::array &key) {
  auto in = random_inputs(1, 3, 1, 2, 32, 4, key);
  mx::eval({in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, in.state});
  auto expect = update(in, copy_in);
  std::atomic<bool> stop{false};
  std::atomic<int> host_rounds{0};
  std::thread host([&] {
    auto base = mx::ones({64, 64});
    while (!stop.load()) {
      OK(mlxk_mlx_lock());
      auto m = mx::matmul(base, base);
      mx::eval(m);
      OK(mlxk_mlx_unlock());
      host_rounds.fetch_add(1);
    }
  });
  bool same = true;
  for (int i = 0; i < 20; ++i) {
    OK(mlxk_mlx_lock());
    OK(mlxk_mlx_lock());  // it counts
    auto got = update(in, from_host);
    OK(mlxk_mlx_unlock());
    OK(mlxk_mlx_unlock());
    same = same && got == expect;
  }
  // On a loaded machine the host thread may not have run yet: give it up to 30 s for a round.
  for (int waited = 0; host_rounds.load() == 0 && waited < 3000; ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop.store(true);
  host.join();
  CHECK(same);
  CHECK(host_rounds.load() > 0);
  CHECK(mlxk_mlx_unlock() == MLXK_ERR_INVALID_ARGUMENT);
}

// A host function over handles: the arrays go in through from_mlx, the kernel's results come
// back through to_mlx (the handles are freed at once; the host's arrays keep the nodes).
template <class Call>
static std::vector<mx::array> through(const std::vector<mx::array> &x, size_t outputs, Call call) {
  std::vector<mlxk_array *> h;
  for (const auto &a : x) h.push_back(from_host(a));
  std::vector<mlxk_array *> out(outputs, nullptr);
  OK(call(h, out));
  std::vector<mx::array> result;
  for (auto *o : out) {
    if (o == nullptr) return result;
    result.push_back(*to_host(o));
  }
  for (auto *a : h) OK(mlxk_array_free(a));
  for (auto *o : out) OK(mlxk_array_free(o));
  return result;
}

static std::vector<mx::array> head_split(const std::vector<mx::array> &x, int hk, int hv, int dv,
                                         float eps) {
  return through(x, 3, [&](std::vector<mlxk_array *> &h, std::vector<mlxk_array *> &o) {
    return mlxk_silu_rms_heads(h[0], h[1], h[2], hk, hv, dv, eps, &o[0], &o[1], &o[2]);
  });
}

static std::vector<mx::array> gated_norm(const std::vector<mx::array> &x, float eps) {
  return through(x, 1, [&](std::vector<mlxk_array *> &h, std::vector<mlxk_array *> &o) {
    return mlxk_gated_rms_norm(h[0], h[1], h[2], eps, &o[0]);
  });
}

static std::vector<mx::array> delta_update(const std::vector<mx::array> &x) {
  return through(x, 2, [&](std::vector<mlxk_array *> &h, std::vector<mlxk_array *> &o) {
    return mlxk_gated_delta_update(h[0], h[1], h[2], h[3], h[4], h[5], h[6],
                                   h.size() > 7 ? h[7] : nullptr, nullptr, &o[0], &o[1]);
  });
}

// Explicit C-ABI calls on copies of the host's arrays (NULL where `a` is empty).
static std::vector<mlxk_array *> copies(const std::vector<mx::array> &x) {
  std::vector<mlxk_array *> h;
  for (const auto &a : x) h.push_back(a.size() ? copy_in(a) : nullptr);
  return h;
}

static void free_all(const std::vector<mlxk_array *> &h) {
  for (auto *a : h) OK(mlxk_array_free(a));
}

// A recurrence case for MLX's autograd: the inputs, as primals too, and the cotangents of y
// (bf16) and of the state (f32), evaluated.
struct VjpCase {
  Inputs in;
  std::vector<mx::array> primals, cotangents;
  // Copies of the primals, then of the cotangents, through the C ABI's constructor.
  std::vector<mlxk_array *> copied() const {
    std::vector<mx::array> all = primals;
    all.insert(all.end(), cotangents.begin(), cotangents.end());
    return copies(all);
  }
};

static VjpCase vjp_case(int B, int T, int Hk, int Hv, int Dk, int Dv, mx::array &key) {
  Inputs in = random_inputs(B, T, Hk, Hv, Dk, Dv, key);
  auto dy = normal({B, T, Hv, Dv}, mx::bfloat16, key);
  auto dstate = normal({B, Hv, Dv, Dk}, mx::float32, key);
  std::vector<mx::array> primals = {in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, in.state};
  mx::eval(primals);
  mx::eval({dy, dstate});
  return {in, primals, {dy, dstate}};
}

// MLX's autograd through the kernel: mx::vjp of a host function that runs the update via
// from_mlx / to_mlx gives the bits of mlxk_gated_delta_update_vjp on the same cotangents, and
// its forward values are the inference call's.
static void autograd_matches_the_explicit_backward(mx::array &key) {
  const VjpCase c = vjp_case(2, 6, 1, 2, 32, 4, key);
  auto [outs, grads] = mx::vjp(delta_update, c.primals, c.cotangents);
  mx::eval(grads);
  CHECK(grads.size() == 8);
  auto inference = update(c.in, copy_in);
  CHECK(bytes_of(outs[0]) == inference.first);
  CHECK(bytes_of(outs[1]) == inference.second);
  const auto h = c.copied();
  mlxk_array *g[8] = {nullptr};
  OK(mlxk_gated_delta_update_vjp(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], nullptr, h[8],
                                 h[9], &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], &g[7]));
  for (int i = 0; i < 8 && grads.size() == 8; ++i) {
    CHECK(bytes_of(grads[i]) == read_handle(g[i]));
    OK(mlxk_array_free(g[i]));
  }
  free_all(h);
  // value_and_grad of a scalar loss goes through the same node.
  auto loss = [&](const std::vector<mx::array> &x) -> std::vector<mx::array> {
    auto o = delta_update(x);
    return {mx::sum(mx::astype(o[0], mx::float32) * mx::astype(c.cotangents[0], mx::float32)) +
            mx::sum(o[1] * c.cotangents[1])};
  };
  auto [value, dq] = mx::value_and_grad(loss, std::vector<int>{0})(c.primals);
  mx::eval({value[0], dq[0]});
  CHECK(std::isfinite(value[0].item<float>()));
  CHECK(dq[0].shape() == c.in.q.shape());
}

// The same through the chunked form: mx::vjp of mlxk_gated_delta_update_chunked gives the bits
// of mlxk_gated_delta_update_chunked_vjp (the chunked form's own backward, on the CPU).
static void chunked_autograd_matches_the_chunked_vjp(mx::array &key) {
  const VjpCase c = vjp_case(2, 37, 1, 2, 32, 5, key);
  auto fun = [](const std::vector<mx::array> &x) {
    return through(x, 2, [&](std::vector<mlxk_array *> &h, std::vector<mlxk_array *> &o) {
      return mlxk_gated_delta_update_chunked(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
                                             nullptr, 16, &o[0], &o[1]);
    });
  };
  auto [outs, grads] = mx::vjp(fun, c.primals, c.cotangents);
  mx::eval(grads);
  CHECK(grads.size() == 8);
  const auto h = c.copied();
  mlxk_array *g[8] = {nullptr}, *e[8] = {nullptr};
  OK(mlxk_gated_delta_update_chunked_vjp(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], nullptr,
                                         16, h[8], h[9], &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                                         &g[6], &g[7]));
  OK(mlxk_gated_delta_update_vjp(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], nullptr, h[8],
                                 h[9], &e[0], &e[1], &e[2], &e[3], &e[4], &e[5], &e[6], &e[7]));
  int differ = 0;
  for (int i = 0; i < 8 && grads.size() == 8; ++i) {
    CHECK(bytes_of(grads[i]) == read_handle(g[i]));
    differ += read_handle(g[i]) != read_handle(e[i]);
    OK(mlxk_array_free(g[i]));
    OK(mlxk_array_free(e[i]));
  }
  CHECK(differ > 0);  // the chunked backward, not the exact one's bits
  free_all(h);
}

// mx::vjp through the head split and the gated norm gives the bits of their explicit backward
// calls on the same cotangents, and its forward values are the inference calls'.
static void autograd_through_the_norms(mx::array &key) {
  const int B = 2, S = 3, Hk = 2, Hv = 4, Dk = 32, Dv = 24, C = 2 * Hk * Dk + Hv * Dv;
  const float eps = 1e-6f / Dk;
  for (auto dtype : {mx::bfloat16, mx::float32}) {
    std::vector<mx::array> primals = {normal({B, S, C}, dtype, key), normal({Dk}, dtype, key),
                                      normal({Dk}, dtype, key)};
    std::vector<mx::array> cot = {normal({B, S, Hk, Dk}, dtype, key),
                                  normal({B, S, Hk, Dk}, mx::float32, key),
                                  normal({B, S, Hv, Dv}, dtype, key)};
    mx::eval(primals);
    mx::eval(cot);
    auto fun = [&](const std::vector<mx::array> &x) { return head_split(x, Hk, Hv, Dv, eps); };
    auto [outs, grads] = mx::vjp(fun, primals, cot);
    mx::eval(outs);
    mx::eval(grads);
    CHECK(grads.size() == 3);
    auto h = copies(primals);
    // mx::vjp hands the primitive each cotangent cast to its output's dtype (dk's float32
    // becomes bfloat16 here); the explicit call gets the same.
    auto c = copies({mx::astype(cot[0], dtype), mx::astype(cot[1], dtype), cot[2]});
    mlxk_array *inference[3] = {nullptr, nullptr, nullptr}, *g[3] = {nullptr, nullptr, nullptr};
    OK(mlxk_silu_rms_heads(h[0], h[1], h[2], Hk, Hv, Dv, eps, &inference[0], &inference[1],
                           &inference[2]));
    OK(mlxk_silu_rms_heads_vjp(h[0], h[1], h[2], Hk, Hv, Dv, eps, c[0], c[1], c[2], &g[0], &g[1],
                               &g[2]));
    for (int i = 0; i < 3 && outs.size() == 3 && grads.size() == 3; ++i) {
      CHECK(bytes_of(outs[i]) == read_handle(inference[i]));
      CHECK(bytes_of(grads[i]) == read_handle(g[i]));
      CHECK(grads[i].dtype() == primals[i].dtype());
      OK(mlxk_array_free(inference[i]));
      OK(mlxk_array_free(g[i]));
    }
    // Gradients that are not all zero: the comparison above means something.
    CHECK(mx::any(mx::not_equal(grads[0], mx::array(0.0f))).item<bool>());
    free_all(h);
    free_all(c);

    // The gated norm with a gate of another dtype.
    std::vector<mx::array> np = {normal({B, S, Hv, Dv}, dtype, key),
                                 normal({B, S, Hv, Dv}, mx::float16, key),
                                 normal({Dv}, dtype, key)};
    auto dout = normal({B, S, Hv, Dv}, dtype, key);
    mx::eval(np);
    mx::eval(dout);
    auto norm = [&](const std::vector<mx::array> &x) { return gated_norm(x, 1e-6f); };
    auto [nouts, ngrads] = mx::vjp(norm, np, {dout});
    mx::eval(nouts);
    mx::eval(ngrads);
    auto nh = copies(np);
    auto dh = copy_in(dout);
    mlxk_array *out = nullptr, *ng[3] = {nullptr, nullptr, nullptr};
    OK(mlxk_gated_rms_norm(nh[0], nh[1], nh[2], 1e-6f, &out));
    OK(mlxk_gated_rms_norm_vjp(nh[0], nh[1], nh[2], 1e-6f, dh, &ng[0], &ng[1], &ng[2]));
    CHECK(nouts.size() == 1 && ngrads.size() == 3);
    if (nouts.size() == 1 && ngrads.size() == 3) {
      CHECK(bytes_of(nouts[0]) == read_handle(out));
      for (int i = 0; i < 3; ++i) {
        CHECK(bytes_of(ngrads[i]) == read_handle(ng[i]));
        CHECK(ngrads[i].dtype() == np[i].dtype());
      }
    }
    OK(mlxk_array_free(out));
    for (auto *a : ng) OK(mlxk_array_free(a));
    OK(mlxk_array_free(dh));
    free_all(nh);
  }
}

// value_and_grad of a small graph, head split -> update -> gated norm -> a host loss: the value
// is the inference graph's, and every gradient equals the chain of explicit backward calls
// (the cotangents MLX passes down are the ones the chain computes; the unused final state gets
// a zero cotangent, the explicit call a NULL one).
static void value_and_grad_of_a_layer(mx::array &key) {
  const int B = 2, T = 5, Hk = 1, Hv = 2, Dk = 32, Dv = 16, C = 2 * Hk * Dk + Hv * Dv;
  const float eps = 1e-6f / Dk, norm_eps = 1e-6f;
  auto bf = mx::bfloat16;
  // x, q_scale, k_scale, a, b, a_log, dt_bias, z, weight.
  std::vector<mx::array> p = {normal({B, T, C}, bf, key),         normal({Dk}, bf, key),
                              normal({Dk}, bf, key),              normal({B, T, Hv}, bf, key),
                              normal({B, T, Hv}, bf, key),        normal({Hv}, mx::float32, key),
                              normal({Hv}, bf, key),              normal({B, T, Hv, Dv}, bf, key),
                              normal({Dv}, bf, key)};
  auto weights = normal({B, T, Hv, Dv}, mx::float32, key);
  mx::eval(p);
  mx::eval(weights);
  auto layer = [&](const std::vector<mx::array> &x) {
    auto qkv = head_split({x[0], x[1], x[2]}, Hk, Hv, Dv, eps);
    auto ys = delta_update({qkv[0], qkv[1], qkv[2], x[3], x[4], x[5], x[6]});
    return gated_norm({ys[0], x[7], x[8]}, norm_eps);
  };
  auto loss = [&](const std::vector<mx::array> &x) -> std::vector<mx::array> {
    return {mx::sum(mx::astype(layer(x)[0], mx::float32) * weights)};
  };
  std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  auto [value, grads] = mx::value_and_grad(loss, all)(p);
  mx::eval(value);
  mx::eval(grads);
  CHECK(grads.size() == 9);
  auto expect = loss(p);
  mx::eval(expect);
  CHECK(bytes_of(value[0]) == bytes_of(expect[0]));
  if (grads.size() != 9) return;

  // The chain by hand: forward, then each backward call with the cotangent the next gave.
  auto h = copies(p);
  mlxk_array *q = nullptr, *k = nullptr, *v = nullptr, *y = nullptr, *s = nullptr;
  OK(mlxk_silu_rms_heads(h[0], h[1], h[2], Hk, Hv, Dv, eps, &q, &k, &v));
  OK(mlxk_gated_delta_update(q, k, v, h[3], h[4], h[5], h[6], nullptr, nullptr, &y, &s));
  // d loss / d out = weights, cast to out's dtype by astype's vjp.
  auto dout = copy_in(mx::astype(weights, bf));
  mlxk_array *dy = nullptr, *dz = nullptr, *dw = nullptr;
  OK(mlxk_gated_rms_norm_vjp(y, h[7], h[8], norm_eps, dout, &dy, &dz, &dw));
  mlxk_array *d[8] = {nullptr};
  OK(mlxk_gated_delta_update_vjp(q, k, v, h[3], h[4], h[5], h[6], nullptr, nullptr, dy, nullptr,
                                 &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &d[6], &d[7]));
  mlxk_array *dx = nullptr, *dqs = nullptr, *dks = nullptr;
  OK(mlxk_silu_rms_heads_vjp(h[0], h[1], h[2], Hk, Hv, Dv, eps, d[0], d[1], d[2], &dx, &dqs,
                             &dks));
  mlxk_array *chain[9] = {dx, dqs, dks, d[3], d[4], d[5], d[6], dz, dw};
  for (int i = 0; i < 9; ++i) {
    CHECK(grads[i].shape() == p[i].shape() && grads[i].dtype() == p[i].dtype());
    CHECK(bytes_of(grads[i]) == read_handle(chain[i]));
    OK(mlxk_array_free(chain[i]));
  }
  auto magnitude = mx::sum(mx::abs(mx::astype(grads[0], mx::float32)));
  CHECK(std::isfinite(magnitude.item<float>()) && magnitude.item<float>() > 0);
  for (auto *a : {q, k, v, y, s, dout, dy, d[0], d[1], d[2], d[7]}) OK(mlxk_array_free(a));
  free_all(h);
}

// What the CPU primitive does not offer says so, naming the kernel.
static void unsupported_transforms_name_the_kernel(mx::array &key) {
  auto x = normal({2, 16}, mx::float32, key);
  auto w = normal({16}, mx::float32, key);
  mx::eval({x, w});
  auto norm = [&](const std::vector<mx::array> &a) { return gated_norm({a[0], a[1], w}, 1e-6f); };
  auto message = [](auto &&f) -> std::string {
    try {
      f();
    } catch (const std::exception &e) {
      return e.what();
    }
    return "(no exception)";
  };
  auto jvp = message([&] {
    auto r = mx::jvp(norm, {x, x}, {x, x});
    mx::eval(r.second);
  });
  CHECK(jvp.find("mlxkern: jvp is not implemented for mlxk_gated_rms_norm; use vjp") !=
        std::string::npos);
  auto vmap = message([&] {
    auto batched = mx::vmap(norm, {0, 0}, {0});
    auto r = batched({mx::stack({x, x}), mx::stack({x, x})});
    mx::eval(r);
  });
  CHECK(vmap.find("mlxkern: vmap is not implemented for mlxk_gated_rms_norm") !=
        std::string::npos);
  // Second derivatives: the backward node has no vjp of its own.
  auto second = message([&] {
    using Scalar = std::function<mx::array(const std::vector<mx::array> &)>;
    Scalar inner = [&](const std::vector<mx::array> &a) { return mx::sum(norm(a)[0]); };
    Scalar outer = [&](const std::vector<mx::array> &a) {
      return mx::sum(mx::grad(inner, 0)(a)[0]);
    };
    auto g = mx::grad(outer, 0)({x, x});
    mx::eval(g);
  });
  CHECK(second.find("vjp is not implemented for mlxk_gated_rms_norm_vjp") != std::string::npos);
  // The prefix replay has no gradient.
  auto in = random_inputs(1, 3, 1, 2, 32, 4, key);
  mx::eval({in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, in.state});
  auto replay = [&](const std::vector<mx::array> &a) {
    return through(a, 1, [&](std::vector<mlxk_array *> &hh, std::vector<mlxk_array *> &o) {
      int32_t lengths[1] = {2};
      return mlxk_gated_delta_state(hh[0], hh[1], hh[2], hh[3], hh[4], hh[5], hh[6], lengths, 1,
                                    &o[0]);
    });
  };
  auto state = message([&] {
    auto r = mx::vjp(replay, {in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, in.state},
                     {in.state});
    mx::eval(r.second);
  });
  CHECK(state.find("vjp is not implemented for mlxk_gated_delta_state") != std::string::npos);
  std::printf("host_cpp: refusals: \"%s\" | \"%s\" | \"%s\" | \"%s\"\n", jvp.c_str(), vmap.c_str(),
              second.c_str(), state.c_str());
}

int main() {
  uint64_t seed = std::random_device{}();
  if (const char *s = std::getenv("MLXK_INTEROP_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("host_cpp: seed %llu (MLXK_INTEROP_SEED replays), MLX %s\n",
              static_cast<unsigned long long>(seed), mlxk_mlx_version());
  auto key = mx::random::key(seed);
  evaluated_inputs_are_shared_not_copied(key);
  lazy_host_nodes_stay_lazy(key);
  views_are_made_contiguous_in_the_graph(key);
  misuse(key);
  lock_serializes_host_threads(key);
  autograd_matches_the_explicit_backward(key);
  chunked_autograd_matches_the_chunked_vjp(key);
  autograd_through_the_norms(key);
  value_and_grad_of_a_layer(key);
  unsupported_transforms_name_the_kernel(key);
  std::printf("host_cpp: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
