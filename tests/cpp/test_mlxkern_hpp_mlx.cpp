// Tests of include/mlxkern.hpp's MLX part (MLXKERN_WITH_MLX): mlxk::Array::from_mlx and
// to_mlx share arrays with the host's MLX without a copy. Same buffer and same node both ways,
// laziness across the boundary (host nodes into kernels, kernel results into host ops, one
// mx::eval), views, a decode loop whose state is carried as an mx::array (updated in place),
// ownership (either side may outlive the other; the heap copy to_mlx receives is deleted),
// and the errors. Fresh random inputs every run (the seed is printed; MLXK_CPP_SEED replays).
//
// Built by scripts/test/cpp.sh against libmlx (MLX's headers as -isystem) with the same strict
// warnings as test_mlxkern_hpp.cpp, and run under ASan + LSan + UBSan.
#define MLXKERN_WITH_MLX
#include "mlxkern.hpp"
#include "mlxkern.hpp"  // the include guard makes a second include a no-op

#include <mlx/mlx.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "checks.hpp"

namespace mx = mlx::core;

namespace {

template <class Body>
void expect_error(mlxk_status status, Body body, int line) {
  try {
    body();
  } catch (const mlxk::Error &error) {
    check_at(error.status() == status, "the expected status", line);
    check_at(!error.message().empty(), "a non-empty message", line);
    return;
  } catch (...) {
    check_at(false, "threw something other than mlxk::Error", line);
    return;
  }
  check_at(false, "no exception", line);
}

#define EXPECT_ERROR(status, ...) expect_error((status), [&]() { __VA_ARGS__; }, __LINE__)

static_assert(std::is_same<decltype(mlxk::Array::from_mlx(std::declval<const mx::array &>())),
                           mlxk::Array>::value,
              "from_mlx returns an owning Array");
static_assert(std::is_same<decltype(std::declval<const mlxk::Array &>().to_mlx()), mx::array>::value,
              "to_mlx returns an mx::array by value");

// The run's random key, split for every draw (made in main: no MLX array outlives it).
std::vector<mx::array> key;

mx::array normal(const mx::Shape &shape, mx::Dtype dtype, float scale = 1.0f) {
  auto split = mx::random::split(key.at(0));
  key.at(0) = split.first;
  return mx::astype(mx::multiply(mx::random::normal(shape, mx::float32, split.second),
                                 mx::array(scale)),
                    dtype);
}

// Row-major bytes of an MLX array (evaluated, made contiguous first).
std::vector<std::uint8_t> host_bytes(mx::array a) {
  a = mx::contiguous(a);
  mx::eval(a);
  const auto *p = a.data<std::uint8_t>();
  return std::vector<std::uint8_t>(p, p + a.nbytes());
}

std::vector<std::uint8_t> handle_bytes(const mlxk::Array &a) {
  std::vector<std::uint8_t> out(a.nbytes());
  a.read(out.data(), out.size());
  return out;
}

mlxk::Dtype dtype_of(mx::Dtype dtype) {
  if (dtype == mx::bfloat16) return mlxk::Dtype::BFloat16;
  if (dtype == mx::float16) return mlxk::Dtype::Float16;
  if (dtype == mx::bool_) return mlxk::Dtype::Bool;
  return mlxk::Dtype::Float32;
}

// The copying path: the host's values read back and handed to the C ABI's constructor.
mlxk::Array copied(const mx::array &a) {
  const std::vector<std::uint8_t> bytes = host_bytes(a);
  mlxk::Shape shape(a.shape().begin(), a.shape().end());
  return mlxk::Array::from_bytes(bytes.data(), bytes.size(), shape, dtype_of(a.dtype()));
}

void test_same_array_both_ways() {
  mx::array x = normal({2, 3, 64}, mx::bfloat16);
  mx::eval(x);
  mlxk::Array h = mlxk::Array::from_mlx(x);
  CHECK(h.shape() == (mlxk::Shape{2, 3, 64}));
  CHECK(h.dtype() == mlxk::Dtype::BFloat16);
  CHECK(handle_bytes(h) == host_bytes(x));
  mx::array back = h.to_mlx();
  CHECK(back.id() == x.id());                  // the same array ...
  CHECK(back.data<void>() == x.data<void>());  // ... and the same buffer: no copy either way
  // Each direction makes a new owner; neither side's lifetime depends on the other's.
  mx::array y = normal({4, 8}, mx::float32);
  mx::eval(y);
  const std::vector<std::uint8_t> want = host_bytes(y);
  mlxk::Array hy = mlxk::Array::from_mlx(y);
  y = mx::array(0.0f);  // the host drops its array: the handle keeps the buffer
  CHECK(handle_bytes(hy) == want);
  mx::array again = hy.to_mlx();
  hy.reset();  // the handle goes: the host's array keeps the buffer
  CHECK(host_bytes(again) == want);
}

void test_lazy_through_kernels() {
  // Gated norm on lazy host nodes; its lazy result consumed by a host op; one eval.
  mx::array x = normal({1, 5, 4, 64}, mx::bfloat16);
  mx::array gate = normal({1, 5, 4, 64}, mx::bfloat16);
  mx::array weight = mx::astype(mx::add(mx::array(1.0f), normal({64}, mx::float32, 0.2f)),
                                mx::bfloat16);
  mx::eval({x, gate, weight});
  const mlxk::Array want = mlxk::gated_rms_norm(copied(x), copied(gate), copied(weight), 1e-6f);
  const std::vector<std::uint8_t> want_bytes = handle_bytes(want);

  // x * 1 and gate + 0 are exact: the same values, as unevaluated host nodes.
  mx::array lazy_x = mx::multiply(x, mx::array(1.0f, mx::bfloat16));
  mx::array lazy_gate = mx::add(gate, mx::array(0.0f, mx::bfloat16));
  mx::array out(0.0f);
  {
    const mlxk::Array hx = mlxk::Array::from_mlx(lazy_x);
    const mlxk::Array hg = mlxk::Array::from_mlx(lazy_gate);
    const mlxk::Array hw = mlxk::Array::from_mlx(weight);
    out = mlxk::gated_rms_norm(hx, hg, hw, 1e-6f).to_mlx();
  }  // every handle freed: the graph alone holds the kernel's node
  CHECK(!lazy_x.is_available());
  CHECK(!out.is_available());
  mx::array consumed = mx::multiply(out, mx::array(1.0f, mx::bfloat16));  // a host op on it
  mx::eval(consumed);
  CHECK(lazy_x.is_available());  // the host's node was computed by the same eval
  CHECK(host_bytes(consumed) == want_bytes);

  // A view (transposed) is made contiguous inside the graph.
  mx::array xt = mx::transpose(normal({1, 64, 4, 5}, mx::bfloat16), {0, 3, 2, 1});
  mx::eval(xt);
  const mlxk::Array viewed =
      mlxk::gated_rms_norm(mlxk::Array::from_mlx(xt), mlxk::Array::from_mlx(gate),
                           mlxk::Array::from_mlx(weight), 1e-6f);
  const mlxk::Array reference =
      mlxk::gated_rms_norm(copied(xt), copied(gate), copied(weight), 1e-6f);
  CHECK(handle_bytes(viewed) == handle_bytes(reference));

  // Multi-output kernels: the head split's three results, each taken into the host.
  const int hk = 2, hv = 4, d = 32;
  mx::array conv = normal({1, 3, 2 * hk * d + hv * d}, mx::bfloat16);
  mx::array scale = mx::full({d}, mx::array(0.25f, mx::bfloat16));
  mx::eval({conv, scale});
  const mlxk::HeadSplit a = mlxk::silu_rms_heads(mlxk::Array::from_mlx(conv),
                                                 mlxk::Array::from_mlx(scale),
                                                 mlxk::Array::from_mlx(scale), hk, hv, d, 1e-6f);
  const mlxk::HeadSplit b =
      mlxk::silu_rms_heads(copied(conv), copied(scale), copied(scale), hk, hv, d, 1e-6f);
  mx::array q = a.q.to_mlx(), k = a.k.to_mlx(), v = a.v.to_mlx();
  CHECK(q.shape() == (mx::Shape{1, 3, hk, d}) && v.shape() == (mx::Shape{1, 3, hv, d}));
  mx::eval({q, k, v});
  CHECK(host_bytes(q) == handle_bytes(b.q));
  CHECK(host_bytes(k) == handle_bytes(b.k));
  CHECK(host_bytes(v) == handle_bytes(b.v));
}

// A decode loop whose recurrent state stays an mx::array: in through from_mlx, out through
// to_mlx, one mx::eval per step; bit-identical to the same steps on the library's own handles,
// and the new state written into the old state's buffer once nothing else holds it.
void test_decode_loop_state_as_mlx_array() {
  const int hk = 2, hv = 4, dk = 64, dv = 32, steps = 5;
  mx::array a_log = normal({hv}, mx::float32, 0.5f);
  mx::array dt_bias = normal({hv}, mx::bfloat16, 0.5f);
  mx::array state = normal({1, hv, dv, dk}, mx::float32, 0.1f);
  mx::eval({a_log, dt_bias, state});
  const mlxk::Array h_alog = mlxk::Array::from_mlx(a_log);
  const mlxk::Array h_dt = mlxk::Array::from_mlx(dt_bias);
  mlxk::Array ref_state = copied(state);
  const mlxk::Array r_alog = copied(a_log), r_dt = copied(dt_bias);
  int in_place = 0;
  for (int step = 0; step < steps; ++step) {
    mx::array q = normal({1, 1, hk, dk}, mx::bfloat16, 0.1f);
    mx::array k = normal({1, 1, hk, dk}, mx::bfloat16, 0.1f);
    mx::array v = normal({1, 1, hv, dv}, mx::bfloat16);
    mx::array a = normal({1, 1, hv}, mx::bfloat16);
    mx::array b = normal({1, 1, hv}, mx::bfloat16);
    mx::eval({q, k, v, a, b});

    mlxk::DeltaUpdate ref = mlxk::gated_delta_update(copied(q), copied(k), copied(v), copied(a),
                                                     copied(b), r_alog, r_dt, &ref_state);
    ref_state = std::move(ref.state);

    const void *old_buffer = state.data<void>();
    mx::array y(0.0f);
    {
      const mlxk::Array h_state = mlxk::Array::from_mlx(state);
      mlxk::DeltaUpdate up = mlxk::gated_delta_update(
          mlxk::Array::from_mlx(q), mlxk::Array::from_mlx(k), mlxk::Array::from_mlx(v),
          mlxk::Array::from_mlx(a), mlxk::Array::from_mlx(b), h_alog, h_dt, &h_state);
      y = up.y.to_mlx();
      state = up.state.to_mlx();  // the host's old state goes; the graph holds the last copy
    }
    mx::eval({y, state});
    in_place += state.data<void>() == old_buffer ? 1 : 0;
    CHECK(host_bytes(y) == handle_bytes(ref.y));
    CHECK(host_bytes(state) == handle_bytes(ref_state));
  }
  CHECK(in_place == steps);
}

void test_errors() {
  const mlxk::Array empty;
  EXPECT_ERROR(MLXK_ERR_NULL_POINTER, (void)empty.to_mlx());
  // Dtypes without an mlxk_dtype are refused, naming the dtype.
  EXPECT_ERROR(MLXK_ERR_DTYPE, (void)mlxk::Array::from_mlx(mx::zeros({2}, mx::int64)));
  EXPECT_ERROR(MLXK_ERR_DTYPE, (void)mlxk::Array::from_mlx(mx::zeros({2}, mx::float64)));
  // A shared array is checked like any other input.
  const mlxk::Array x = mlxk::Array::from_mlx(mx::zeros({1, 2, 4, 64}, mx::bfloat16));
  const mlxk::Array g = mlxk::Array::from_mlx(mx::zeros({1, 2, 4, 64}, mx::bfloat16));
  const mlxk::Array w = mlxk::Array::from_mlx(mx::ones({32}, mx::bfloat16));
  EXPECT_ERROR(MLXK_ERR_SHAPE, (void)mlxk::gated_rms_norm(x, g, w, 1e-6f));
}

}  // namespace

int main() {
  unsigned long long seed = std::random_device{}();
  if (const char *env = std::getenv("MLXK_CPP_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::printf("test_mlxkern_hpp_mlx: seed %llu (MLXK_CPP_SEED replays), MLX %s\n", seed,
              mlxk_mlx_version());
  try {
    key.push_back(mx::random::key(seed));
    test_same_array_both_ways();
    test_lazy_through_kernels();
    test_decode_loop_state_as_mlx_array();
    test_errors();
  } catch (const std::exception &error) {
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", error.what());
    return 1;
  }
  key.clear();
  std::printf("%d checks passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
