// Tests of include/mlxkern.hpp, the header-only C++ layer: ownership (destructor, move,
// release, out-parameters adopted before the status check), errors (status, message, what()),
// the host conversions, every kernel wrapper, the pool calls (include/mlxkern_pool.hpp, against
// the dense wrappers bit for bit) and the GLM-5.2 layout helpers.
//
// Whether a handle was freed is observed through the library's registry: a freed handle gives
// MLXK_ERR_INVALID_HANDLE. Built by scripts/test/cpp.sh with -Werror and strict warnings, and
// run under AddressSanitizer + UndefinedBehaviorSanitizer.
#include "mlxkern.hpp"
#include "mlxkern.hpp"  // the include guard makes a second include a no-op

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "checks.hpp"

namespace {

// Runs `body`, which must throw mlxk::Error with `status`; returns the error's message.
template <class Body>
std::string expect_error(mlxk_status status, Body body, int line) {
  try {
    body();
  } catch (const mlxk::Error &error) {
    check_at(error.status() == status, "the expected status", line);
    const std::string what = error.what();
    check_at(what.rfind(std::string(mlxk_status_name(status)) + ": ", 0) == 0,
             "what() starts with the status name", line);
    check_at(!error.message().empty(), "a non-empty message", line);
    return error.message();
  } catch (...) {
    check_at(false, "threw something other than mlxk::Error", line);
    return {};
  }
  check_at(false, "no exception", line);
  return {};
}

#define EXPECT_ERROR(status, ...) expect_error((status), [&]() { __VA_ARGS__; }, __LINE__)

bool is_live(mlxk_array *raw) {
  std::size_t ndim = 0;
  return mlxk_array_ndim(raw, &ndim) == MLXK_OK;
}

std::vector<float> random_floats(std::mt19937 &rng, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float &value : out) value = normal(rng);
  return out;
}

// --- compile-time properties ---------------------------------------------------------------

static_assert(!std::is_copy_constructible<mlxk::Array>::value, "Array is move-only");
static_assert(!std::is_copy_assignable<mlxk::Array>::value, "Array is move-only");
static_assert(std::is_nothrow_move_constructible<mlxk::Array>::value, "noexcept move");
static_assert(std::is_nothrow_move_assignable<mlxk::Array>::value, "noexcept move");
static_assert(std::is_base_of<std::runtime_error, mlxk::Error>::value, "Error is a runtime_error");
static_assert(static_cast<int>(mlxk::Dtype::BFloat16) == MLXK_DTYPE_BFLOAT16, "dtype values");
static_assert(mlxk::dtype_size(mlxk::Dtype::BFloat16) == 2, "dtype sizes");

// --- tests ---------------------------------------------------------------------------------

void test_conversions() {
  CHECK(mlxk::bf16_from_float(1.0f) == 0x3F80);
  CHECK(mlxk::bf16_from_float(-2.0f) == 0xC000);
  // Ties round to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  CHECK(mlxk::bf16_from_float(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(mlxk::bf16_from_float(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(mlxk::bf16_from_float(std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK(mlxk::bf16_from_float(-std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK(mlxk::bf16_from_float(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(mlxk::bf16_from_float(3.4e38f) == 0x7F80);  // rounds up past the largest bfloat16
  CHECK(mlxk::float_from_bf16(0x3F80) == 1.0f);
  CHECK(mlxk::round_bf16(0.1f) == mlxk::float_from_bf16(0x3DCD));
  CHECK(mlxk::float_from_f16(0x3C00) == 1.0f);
  CHECK(mlxk::float_from_f16(0xC000) == -2.0f);
  CHECK(mlxk::float_from_f16(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(mlxk::float_from_f16(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(mlxk::float_from_f16(0x7BFF) == 65504.0f);
  CHECK(std::isinf(mlxk::float_from_f16(0xFC00)) && mlxk::float_from_f16(0xFC00) < 0);
  CHECK(std::isnan(mlxk::float_from_f16(0x7E00)));
  CHECK(std::signbit(mlxk::float_from_f16(0x8000)));
}

void test_ownership() {
  mlxk_array *raw = nullptr;
  {
    mlxk::Array a = mlxk::Array::zeros({2, 3}, mlxk::Dtype::Float32);
    raw = a.get();
    CHECK(is_live(raw));
    mlxk::Array b = std::move(a);  // moves the handle, frees nothing
    CHECK(a.empty() && !a);
    CHECK(b.get() == raw && is_live(raw));
    mlxk::Array c;
    c = std::move(b);
    CHECK(c.get() == raw && b.empty());
    c = mlxk::Array::zeros({1}, mlxk::Dtype::Int32);  // assignment frees the old handle
    CHECK(!is_live(raw));
    raw = c.get();
  }
  CHECK(!is_live(raw));  // the destructor freed it

  mlxk::Array d = mlxk::Array::zeros({4}, mlxk::Dtype::BFloat16);
  mlxk_array *released = d.release();
  CHECK(d.empty() && is_live(released));
  CHECK(mlxk_array_free(released) == MLXK_OK);
  CHECK(!is_live(released));

  mlxk::Array e = mlxk::Array::zeros({1}, mlxk::Dtype::Float32);
  e.reset();
  CHECK(e.empty());

  // An out-parameter is adopted before the status is checked: a handle written by a call that
  // then reports failure is freed when the exception unwinds.
  mlxk_array *stranded = nullptr;
  auto writes_then_fails = [&stranded](mlxk_array **out) {
    if (mlxk_array_zeros(nullptr, 0, MLXK_DTYPE_FLOAT32, out) != MLXK_OK) return MLXK_ERR_BACKEND;
    stranded = *out;
    return mlxk_array_ndim(nullptr, nullptr);  // sets last_error, returns NULL_POINTER
  };
  EXPECT_ERROR(MLXK_ERR_NULL_POINTER, {
    mlxk::Array result;
    mlxk::check(writes_then_fails(mlxk::OutHandle(result)));
  });
  CHECK(stranded != nullptr && !is_live(stranded));
}

void test_arrays() {
  const std::vector<float> values{1.5f, -2.25f, 0.1f, 3.0f, -0.0f, 7.0f};
  mlxk::Array f32 = mlxk::Array::from_f32(values, {2, 3});
  CHECK((f32.shape() == mlxk::Shape{2, 3}));
  CHECK(f32.ndim() == 2 && f32.size() == 6 && f32.nbytes() == 24);
  CHECK(f32.dtype() == mlxk::Dtype::Float32);
  CHECK(f32.to_floats() == values);

  mlxk::Array bf16 = mlxk::Array::from_bf16(values, {3, 2});
  CHECK(bf16.dtype() == mlxk::Dtype::BFloat16 && bf16.nbytes() == 12);
  const std::vector<float> rounded = bf16.to_floats();
  bool all_rounded = true;
  for (std::size_t i = 0; i < values.size(); ++i)
    all_rounded = all_rounded && rounded[i] == mlxk::round_bf16(values[i]);
  CHECK(all_rounded);
  // MLX's astype rounds the same way.
  CHECK(f32.astype(mlxk::Dtype::BFloat16).to_vector<std::uint16_t>() ==
        bf16.to_vector<std::uint16_t>());
  const std::vector<float> halves = f32.astype(mlxk::Dtype::Float16).to_floats();
  CHECK(halves[0] == 1.5f && halves[1] == -2.25f && halves[3] == 3.0f);
  CHECK(std::fabs(halves[2] - 0.1f) < 1e-4f);

  mlxk::Array ints = mlxk::Array::from_i32({1, -2, 3}, {3});
  CHECK((ints.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -2, 3}));
  mlxk::Array bools = mlxk::Array::from_bool(std::vector<bool>{true, false, true}, {1, 3});
  CHECK((bools.to_vector<std::uint8_t>() == std::vector<std::uint8_t>{1, 0, 1}));
  const bool raw_bools[2] = {false, true};
  CHECK((mlxk::Array::from_bool(mlxk::Span<bool>(raw_bools, 2), {2}).to_vector<std::uint8_t>() ==
         std::vector<std::uint8_t>{0, 1}));
  mlxk::Array bits = mlxk::Array::from_bf16_bits({0x3F80, 0xC000}, {2});
  CHECK((bits.to_floats() == std::vector<float>{1.0f, -2.0f}));
  mlxk::Array scalar = mlxk::Array::from_f32({42.0f}, {});
  CHECK(scalar.ndim() == 0 && scalar.to_floats() == std::vector<float>{42.0f});

  // Errors: the wrapper's own checks and the library's.
  EXPECT_ERROR(MLXK_ERR_SHAPE, (void)mlxk::Array::from_f32(values, {4}));
  EXPECT_ERROR(MLXK_ERR_SHAPE, (void)mlxk::Array::from_f32({}, {-1}));
  EXPECT_ERROR(MLXK_ERR_DTYPE, (void)ints.to_floats());
  EXPECT_ERROR(MLXK_ERR_DTYPE, (void)f32.to_vector<std::uint16_t>());
  mlxk::Array empty;
  const std::string message = EXPECT_ERROR(MLXK_ERR_NULL_POINTER, (void)empty.shape());
  CHECK(message.find("mlxk_array_ndim") != std::string::npos);
  EXPECT_ERROR(MLXK_ERR_NULL_POINTER, empty.eval());
  float small[2];
  EXPECT_ERROR(MLXK_ERR_BUFFER_TOO_SMALL, f32.read(small, sizeof small));
}

// Gated DeltaNet wrappers on small random inputs: shapes, dtypes, masks, and the replay's
// bit-identity with a direct update of the prefix.
void test_gated_delta() {
  std::mt19937 rng(1234);
  const int B = 2, T = 5, Hk = 2, Hv = 4, Dk = 32, Dv = 16;
  auto bf16 = [&](std::vector<std::int32_t> shape, float scale) {
    return mlxk::Array::from_bf16(random_floats(rng, mlxk::element_count(shape), scale), shape);
  };
  // q, k unit-norm per head, as the layer feeds them.
  auto unit_heads = [&](int heads) {
    const std::size_t width = Dk;
    std::vector<float> x = random_floats(rng, mlxk::element_count({B, T, heads, Dk}));
    for (std::size_t h = 0; h < x.size(); h += width) {
      float sum = 0;
      for (std::size_t i = 0; i < width; ++i) sum += x[h + i] * x[h + i];
      for (std::size_t i = 0; i < width; ++i) x[h + i] /= std::sqrt(sum);
    }
    return mlxk::Array::from_bf16(x, {B, T, heads, Dk});
  };
  mlxk::Array q = unit_heads(Hk), k = unit_heads(Hk);
  mlxk::Array v = bf16({B, T, Hv, Dv}, 1.0f);
  mlxk::Array a = bf16({B, T, Hv}, 1.0f), b = bf16({B, T, Hv}, 1.0f);
  mlxk::Array a_log = mlxk::Array::from_f32(random_floats(rng, Hv, 0.5f), {Hv});
  mlxk::Array dt_bias = bf16({Hv}, 0.5f);

  mlxk::DeltaUpdate first = mlxk::gated_delta_update(q, k, v, a, b, a_log, dt_bias);
  CHECK((first.y.shape() == mlxk::Shape{B, T, Hv, Dv}));
  CHECK(first.y.dtype() == mlxk::Dtype::BFloat16);
  CHECK((first.state.shape() == mlxk::Shape{B, Hv, Dv, Dk}));
  CHECK(first.state.dtype() == mlxk::Dtype::Float32);

  // A second call from that state; the start state stays alive (it is replayed below).
  mlxk::DeltaUpdate second = mlxk::gated_delta_update(q, k, v, a, b, a_log, dt_bias, &first.state);
  const std::vector<std::int32_t> accepted{3, 0};
  mlxk::Array replayed =
      mlxk::gated_delta_state(k, v, a, b, a_log, dt_bias, &first.state, accepted);
  // Row 0 accepted 3 tokens: equal to a masked update that keeps only its first 3 tokens;
  // row 1 accepted none: its start state.
  std::vector<bool> keep(static_cast<std::size_t>(B) * T, false);
  for (int t = 0; t < 3; ++t) keep[static_cast<std::size_t>(t)] = true;
  mlxk::Array mask = mlxk::Array::from_bool(keep, {B, T});
  mlxk::DeltaUpdate masked =
      mlxk::gated_delta_update(q, k, v, a, b, a_log, dt_bias, &first.state, &mask);
  const std::vector<float> replay = replayed.to_floats();
  const std::vector<float> direct = masked.state.to_floats();
  CHECK(replay.size() == direct.size() &&
        std::memcmp(replay.data(), direct.data(), replay.size() * 4) == 0);
  const std::vector<float> y_masked = masked.y.to_floats();
  bool zeros = true;  // masked tokens give y = 0
  for (std::size_t i = 3 * Hv * Dv; i < static_cast<std::size_t>(B) * T * Hv * Dv; ++i)
    zeros = zeros && y_masked[i] == 0.0f;
  CHECK(zeros);
  // Replaying the whole window reproduces the update's state bit for bit.
  mlxk::Array full = mlxk::gated_delta_state(k, v, a, b, a_log, dt_bias, &first.state, {T, T});
  CHECK(full.to_vector<std::uint32_t>() == second.state.to_vector<std::uint32_t>());
  // An empty optional Array means "absent" (zeros), like nullptr.
  mlxk::Array none;
  mlxk::DeltaUpdate from_zeros = mlxk::gated_delta_update(q, k, v, a, b, a_log, dt_bias, &none);
  CHECK(from_zeros.y.to_vector<std::uint16_t>() == first.y.to_vector<std::uint16_t>());

  // The chunked form agrees with the exact update to float32 rounding (y: 1 bf16 ulp).
  for (std::int32_t chunk : {0, 16}) {
    mlxk::DeltaUpdate chunked =
        mlxk::gated_delta_update_chunked(q, k, v, a, b, a_log, dt_bias, &first.state, &mask, chunk);
    const std::vector<float> cs = chunked.state.to_floats(), es = masked.state.to_floats();
    const std::vector<float> cy = chunked.y.to_floats(), ey = y_masked;
    float s_scale = 0, y_scale = 0;
    for (float x : es) s_scale = std::max(s_scale, std::fabs(x));
    for (float x : ey) y_scale = std::max(y_scale, std::fabs(x));
    bool close = cs.size() == es.size() && cy.size() == ey.size();
    for (std::size_t i = 0; close && i < cs.size(); ++i)
      close = std::fabs(cs[i] - es[i]) <= 2e-5f * s_scale;
    for (std::size_t i = 0; close && i < cy.size(); ++i)
      close = std::fabs(cy[i] - ey[i]) <= std::fabs(ey[i]) / 128.0f + 2e-5f * y_scale;
    CHECK(close);
  }
  {
    std::string bad = EXPECT_ERROR(
        MLXK_ERR_INVALID_ARGUMENT,
        (void)mlxk::gated_delta_update_chunked(q, k, v, a, b, a_log, dt_bias, nullptr, nullptr, 8));
    CHECK(bad.find("chunk_size") != std::string::npos);
  }

  // The backward pass: gradients in their inputs' shapes and dtypes; none without cotangents
  // is all zeros; y's cotangent given, the q gradient is finite and not all zero.
  {
    mlxk::DeltaGradients none_given =
        mlxk::gated_delta_update_vjp(q, k, v, a, b, a_log, dt_bias, &first.state, nullptr,
                                     nullptr, nullptr);
    CHECK(none_given.dq.shape() == q.shape() && none_given.dq.dtype() == q.dtype());
    CHECK(none_given.state.shape() == first.state.shape());
    bool zero = true;
    for (float x : none_given.dk.to_floats()) zero = zero && x == 0.0f;
    CHECK(zero);
    mlxk::DeltaGradients with_dy = mlxk::gated_delta_update_vjp(
        q, k, v, a, b, a_log, dt_bias, &first.state, nullptr, &first.y, nullptr);
    bool finite = true, nonzero = false;
    for (float x : with_dy.dq.to_floats()) {
      finite = finite && std::isfinite(x);
      nonzero = nonzero || x != 0.0f;
    }
    CHECK(finite && nonzero);
    CHECK(with_dy.da_log.shape() == a_log.shape() && with_dy.dt_bias.shape() == dt_bias.shape());
    // The chunked backward: the same gradients up to float32 rounding (within one ulp of the
    // gradient's dtype, bf16 for dq, dk, dv, plus 2e-4 of its largest magnitude); a bad chunk
    // size is refused by name.
    for (std::int32_t chunk : {0, 16}) {
      mlxk::DeltaGradients chunked = mlxk::gated_delta_update_chunked_vjp(
          q, k, v, a, b, a_log, dt_bias, &first.state, nullptr, chunk, &first.y, nullptr);
      const mlxk::Array *pairs[][2] = {{&chunked.dq, &with_dy.dq}, {&chunked.dk, &with_dy.dk},
                                       {&chunked.dv, &with_dy.dv}, {&chunked.da, &with_dy.da},
                                       {&chunked.db, &with_dy.db}, {&chunked.state, &with_dy.state}};
      for (auto &pair : pairs) {
        CHECK(pair[0]->shape() == pair[1]->shape() && pair[0]->dtype() == pair[1]->dtype());
        const std::vector<float> c = pair[0]->to_floats(), e = pair[1]->to_floats();
        float scale = 0;
        for (float x : e) scale = std::max(scale, std::fabs(x));
        bool close = c.size() == e.size() && scale > 0;
        for (std::size_t i = 0; close && i < c.size(); ++i) close = std::fabs(c[i] - e[i]) <= std::fabs(e[i]) / 128.0f + 2e-4f * scale;
        CHECK(close);
      }
    }
    std::string bad = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                                   (void)mlxk::gated_delta_update_chunked_vjp(
                                       q, k, v, a, b, a_log, dt_bias, nullptr, nullptr, 24, &first.y, nullptr));
    CHECK(bad.find("chunk_size") != std::string::npos);
  }

  // compute_g: float32, a's shape, in (0, 1].
  mlxk::Array g = mlxk::compute_g(a_log, a, dt_bias);
  CHECK(g.dtype() == mlxk::Dtype::Float32 && (g.shape() == mlxk::Shape{B, T, Hv}));
  bool in_range = true;
  for (float value : g.to_floats()) in_range = in_range && value > 0.0f && value <= 1.0f;
  CHECK(in_range);

  // Errors are thrown with the library's message; no handle is stranded.
  std::string message = EXPECT_ERROR(
      MLXK_ERR_SHAPE, (void)mlxk::gated_delta_update(q, k, a, a, b, a_log, dt_bias));
  CHECK(message.find("mlxk_gated_delta_update") != std::string::npos);
  message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                         (void)mlxk::gated_delta_state(k, v, a, b, a_log, dt_bias, nullptr,
                                                       {T + 1, 0}));
  CHECK(message.find("accepted_lengths") != std::string::npos);
  mlxk::Array f32_state = mlxk::Array::zeros({B, Hv, Dv, Dk}, mlxk::Dtype::BFloat16);
  EXPECT_ERROR(MLXK_ERR_DTYPE,
               (void)mlxk::gated_delta_update(q, k, v, a, b, a_log, dt_bias, &f32_state));
}

void test_norms() {
  std::mt19937 rng(99);
  const int Hk = 2, Hv = 3, Dk = 32, Dv = 16, S = 4;
  const int width = 2 * Hk * Dk + Hv * Dv;
  mlxk::Array x = mlxk::Array::from_bf16(random_floats(rng, S * width), {1, S, width});
  const std::vector<float> q_scale(Dk, 1.0f / Dk), k_scale(Dk, 1.0f / std::sqrt(float(Dk)));
  mlxk::Array qs = mlxk::Array::from_bf16(q_scale, {Dk});
  mlxk::Array ks = mlxk::Array::from_bf16(k_scale, {Dk});
  mlxk::HeadSplit heads = mlxk::silu_rms_heads(x, qs, ks, Hk, Hv, Dv, 1e-6f / Dk);
  CHECK((heads.q.shape() == mlxk::Shape{1, S, Hk, Dk}));
  CHECK((heads.k.shape() == mlxk::Shape{1, S, Hk, Dk}));
  CHECK((heads.v.shape() == mlxk::Shape{1, S, Hv, Dv}));
  // k is unit-RMS times Dk^-1/2, i.e. about unit L2 norm per head.
  const std::vector<float> k = heads.k.to_floats();
  float sum = 0;
  for (int i = 0; i < Dk; ++i) sum += k[static_cast<std::size_t>(i)] * k[static_cast<std::size_t>(i)];
  CHECK(std::fabs(sum - 1.0f) < 0.02f);
  EXPECT_ERROR(MLXK_ERR_DTYPE, (void)mlxk::silu_rms_heads(
                                   x, mlxk::Array::from_f32(q_scale, {Dk}), ks, Hk, Hv, Dv, 0.0f));
  EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT, (void)mlxk::silu_rms_heads(x, qs, ks, Hk, Hv, Dv, -1.0f));

  mlxk::Array y = mlxk::Array::from_bf16(random_floats(rng, S * Hv * Dv), {1, S, Hv, Dv});
  mlxk::Array z = mlxk::Array::from_bf16(random_floats(rng, S * Hv * Dv), {1, S, Hv, Dv});
  mlxk::Array w32 = mlxk::Array::from_f32(random_floats(rng, Dv), {Dv});
  EXPECT_ERROR(MLXK_ERR_DTYPE, (void)mlxk::gated_rms_norm(y, z, w32, 1e-6f));
  mlxk::Array out = mlxk::gated_rms_norm(y, z, w32.astype(mlxk::Dtype::BFloat16), 1e-6f);
  CHECK(out.dtype() == mlxk::Dtype::BFloat16 && (out.shape() == y.shape()));

  // The backward passes: gradients in their inputs' shapes and dtypes, all zero without
  // cotangents, finite and not all zero with them; argument errors thrown.
  auto all = [](const mlxk::Array &a, bool (*pred)(float)) {
    bool ok = true;
    for (float value : a.to_floats()) ok = ok && pred(value);
    return ok;
  };
  auto zero = [](float value) { return value == 0.0f; };
  auto finite = [](float value) { return std::isfinite(value); };
  {
    mlxk::HeadSplitGradients none =
        mlxk::silu_rms_heads_vjp(x, qs, ks, Hk, Hv, Dv, 1e-6f / Dk, nullptr, nullptr, nullptr);
    CHECK(none.x.shape() == x.shape() && none.x.dtype() == x.dtype());
    CHECK((none.q_scale.shape() == mlxk::Shape{Dk}) && (none.k_scale.shape() == mlxk::Shape{Dk}));
    CHECK(all(none.x, zero) && all(none.q_scale, zero) && all(none.k_scale, zero));
    mlxk::HeadSplitGradients g = mlxk::silu_rms_heads_vjp(x, qs, ks, Hk, Hv, Dv, 1e-6f / Dk,
                                                          &heads.q, &heads.k, &heads.v);
    CHECK(all(g.x, finite) && !all(g.x, zero) && !all(g.q_scale, zero));
    std::string bad = EXPECT_ERROR(
        MLXK_ERR_SHAPE, (void)mlxk::silu_rms_heads_vjp(x, qs, ks, Hk, Hv, Dv, 1e-6f / Dk,
                                                       &heads.v, nullptr, nullptr));
    CHECK(bad.find("mlxk_silu_rms_heads_vjp: dq:") != std::string::npos);
  }
  {
    mlxk::Array w = w32.astype(mlxk::Dtype::BFloat16);
    mlxk::NormGradients none = mlxk::gated_rms_norm_vjp(y, z, w, 1e-6f, nullptr);
    CHECK(none.x.shape() == y.shape() && none.gate.dtype() == z.dtype());
    CHECK((none.weight.shape() == mlxk::Shape{Dv}) && all(none.x, zero) && all(none.gate, zero));
    mlxk::NormGradients g = mlxk::gated_rms_norm_vjp(y, z, w, 1e-6f, &out);
    CHECK(all(g.x, finite) && !all(g.gate, zero) && !all(g.weight, zero));
    EXPECT_ERROR(MLXK_ERR_SHAPE, (void)mlxk::gated_rms_norm_vjp(y, z, w, 1e-6f, &w));
  }
}

void test_glm52() {
  const mlxk::GLM52Layout layout = mlxk::GLM52Layout::canonical(6144, 2048, 4, 64);
  CHECK(layout.gate_weight_offset == 0 && layout.up_weight_offset == 6291456 &&
        layout.down_weight_offset == 12582912 && layout.gate_scale_offset == 18874368 &&
        layout.up_scale_offset == 19267584 && layout.down_scale_offset == 19660800 &&
        layout.slot_bytes == 20054016);
  layout.validate(4, 64);
  CHECK(layout.is_valid(4, 64));
  CHECK(mlxk::GLM52Layout::canonical(6144, 2048, 8, 64).slot_bytes == 38928384);
  CHECK(mlxk::GLM52Layout::canonical(6144, 2048, 4, 32).slot_bytes == 21233664);

  mlxk::GLM52Layout bad = layout;
  bad.down_scale_offset += 8;
  CHECK(!bad.is_valid(4, 64));
  const std::string message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT, bad.validate(4, 64));
  CHECK(message.find("down scale offset is not 16-byte aligned") != std::string::npos);
  EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT, (void)mlxk::GLM52Layout::canonical(6144, 2048, 3, 64));
  const mlxk_glm52_layout &raw = layout.raw();
  CHECK(raw.hidden_size == 6144 && raw.intermediate_size == 2048);
}

void test_settings() {
  mlxk::check_abi();
  CHECK(mlxk::abi_version() == MLXK_ABI_VERSION);
  CHECK(mlxk::version() == MLXK_VERSION);
  mlxk::set_default_device(mlxk::Device::Cpu);
  if (mlxk::gpu_backend() == mlxk::GpuBackend::None)
    EXPECT_ERROR(MLXK_ERR_UNSUPPORTED, mlxk::set_default_device(mlxk::Device::Gpu));
  const std::size_t limit = mlxk::memory_limit();
  CHECK(limit > 0);
  mlxk::set_memory_limit(1024);
  EXPECT_ERROR(MLXK_ERR_OUT_OF_MEMORY, (void)mlxk::Array::zeros({1024}, mlxk::Dtype::Float32));
  mlxk::set_memory_limit(0);
  CHECK(mlxk::memory_limit() == limit);
  mlxk::set_cache_limit(1 << 20);
}

// --- pools of states by slot (include/mlxkern_pool.hpp) ------------------------------------
//
// Each pool call is checked against the dense wrappers on the same inputs: the rows' states
// gathered from the pool on the host (zeros for fresh and padding rows), gated_delta_update /
// _chunked / gated_delta_state on them, and the states scattered back: bit for bit.

using Dims = std::vector<std::int32_t>;

std::ptrdiff_t offset(std::size_t i) { return static_cast<std::ptrdiff_t>(i); }

mlxk::Array typed_array(const std::vector<float> &values, const Dims &shape, mlxk::Dtype dtype) {
  if (dtype == mlxk::Dtype::BFloat16) return mlxk::Array::from_bf16(values, shape);
  mlxk::Array f32 = mlxk::Array::from_f32(values, shape);
  return dtype == mlxk::Dtype::Float32 ? std::move(f32) : f32.astype(dtype);
}

bool same_bits(const std::vector<float> &x, std::size_t x0, const std::vector<float> &y,
               std::size_t y0, std::size_t n) {
  return x0 + n <= x.size() && y0 + n <= y.size() &&
         (n == 0 || std::memcmp(x.data() + x0, y.data() + y0, n * sizeof(float)) == 0);
}

// Random inputs of `lengths.size()` sequences (rows), each with its own token count.
struct PoolInputs {
  std::size_t hk, hv, dk, dv;
  mlxk::Dtype dtype;
  std::vector<std::size_t> lengths;
  std::vector<std::vector<float>> q, k, v, a, b;  // per sequence
  mlxk::Array a_log, dt_bias;

  PoolInputs(std::mt19937 &rng, std::vector<std::size_t> lens, std::size_t hk_, std::size_t hv_,
             std::size_t dk_, std::size_t dv_, mlxk::Dtype dtype_)
      : hk(hk_), hv(hv_), dk(dk_), dv(dv_), dtype(dtype_), lengths(std::move(lens)) {
    for (std::size_t len : lengths) {
      for (auto *x : {&q, &k}) {
        std::vector<float> heads = random_floats(rng, len * hk * dk);
        for (std::size_t h = 0; h < heads.size(); h += dk) {
          float sum = 0;
          for (std::size_t i = 0; i < dk; ++i) sum += heads[h + i] * heads[h + i];
          for (std::size_t i = 0; i < dk; ++i) heads[h + i] /= std::sqrt(sum);
        }
        x->push_back(heads);
      }
      v.push_back(random_floats(rng, len * hv * dv));
      a.push_back(random_floats(rng, len * hv, 2.0f));
      b.push_back(random_floats(rng, len * hv, 2.0f));
    }
    a_log = mlxk::Array::from_f32(random_floats(rng, hv, 0.5f), {i32(hv)});
    dt_bias = mlxk::Array::from_bf16(random_floats(rng, hv, 0.5f), {i32(hv)});
  }
  static std::int32_t i32(std::size_t n) { return static_cast<std::int32_t>(n); }
  std::size_t state_size() const { return hv * dv * dk; }
  Dims pool_shape(std::size_t n) const { return {i32(n), i32(hv), i32(dv), i32(dk)}; }

  // q, k, v, a, b of sequences `rows`: [rows, T] (equal lengths) or packed [1, sum of lengths].
  struct Tokens {
    mlxk::Array q, k, v, a, b;
  };
  Tokens tokens(const std::vector<std::size_t> &rows, bool packed) const {
    std::size_t total = 0;
    for (std::size_t r : rows) total += lengths[r];
    const std::int32_t n = packed ? 1 : i32(rows.size());
    const std::int32_t t = packed ? i32(total) : i32(rows.empty() ? 0 : lengths[rows[0]]);
    auto cat = [&](const std::vector<std::vector<float>> &x) {
      std::vector<float> out;
      for (std::size_t r : rows) out.insert(out.end(), x[r].begin(), x[r].end());
      return out;
    };
    return {typed_array(cat(q), {n, t, i32(hk), i32(dk)}, dtype),
            typed_array(cat(k), {n, t, i32(hk), i32(dk)}, dtype),
            typed_array(cat(v), {n, t, i32(hv), i32(dv)}, dtype),
            mlxk::Array::from_bf16(cat(a), {n, t, i32(hv)}),
            mlxk::Array::from_f32(cat(b), {n, t, i32(hv)})};
  }

  // The rows' start states: their slots' (zeros for a padding or fresh row).
  std::vector<float> gather(const std::vector<float> &pool, const std::vector<std::int32_t> &slots,
                            const std::vector<std::uint8_t> &fresh) const {
    const std::size_t s = state_size();
    std::vector<float> out(slots.size() * s, 0.0f);
    for (std::size_t r = 0; r < slots.size(); ++r)
      if (slots[r] >= 0 && (fresh.empty() || fresh[r] == 0))
        std::copy_n(pool.begin() + offset(static_cast<std::size_t>(slots[r]) * s), s,
                    out.begin() + offset(r * s));
    return out;
  }
};

// `rows` distinct slots below n, about a quarter negative (padding rows).
std::vector<std::int32_t> random_slots(std::mt19937 &rng, std::size_t rows, std::size_t n) {
  std::vector<std::int32_t> free_slots(n);
  for (std::size_t i = 0; i < n; ++i) free_slots[i] = static_cast<std::int32_t>(i);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  std::vector<std::int32_t> out;
  for (std::size_t r = 0; r < rows; ++r) {
    if (free_slots.empty() || rng() % 4 == 0) {
      out.push_back(-1 - static_cast<std::int32_t>(rng() % 3));
    } else {
      out.push_back(free_slots.back());
      free_slots.pop_back();
    }
  }
  return out;
}

// A pool call's (y, new pool) against the dense reference (y_ref, states_ref, rows of `y_row`
// values): slotted rows' y and slots bit for bit, padding rows' y zero, other slots unchanged.
bool matches_dense(const PoolInputs &in, const std::vector<std::int32_t> &slots,
                   const std::vector<float> &pool, const std::vector<float> &y,
                   const std::vector<float> &new_pool, const std::vector<float> &y_ref,
                   const std::vector<float> &states_ref, std::size_t y_row) {
  const std::size_t s = in.state_size();
  bool ok = y.size() == y_ref.size() && new_pool.size() == pool.size();
  for (std::size_t r = 0; ok && r < slots.size(); ++r) {
    if (slots[r] < 0) {
      for (std::size_t i = r * y_row; i < (r + 1) * y_row; ++i) ok = ok && y[i] == 0.0f;
    } else {
      ok = same_bits(y, r * y_row, y_ref, r * y_row, y_row) &&
           same_bits(new_pool, static_cast<std::size_t>(slots[r]) * s, states_ref, r * s, s);
    }
  }
  for (std::size_t slot = 0; ok && slot * s < pool.size(); ++slot)
    if (std::find(slots.begin(), slots.end(), static_cast<std::int32_t>(slot)) == slots.end())
      ok = same_bits(new_pool, slot * s, pool, slot * s, s);
  return ok;
}

void test_pool_update(std::mt19937 &rng) {
  struct Case {
    std::size_t b, t, hk, hv, dk, dv, n;
    mlxk::Dtype dtype;
  };
  const Case cases[] = {{3, 4, 1, 2, 32, 8, 5, mlxk::Dtype::BFloat16},
                        {4, 1, 2, 4, 64, 16, 4, mlxk::Dtype::Float32},
                        {2, 6, 1, 1, 32, 5, 7, mlxk::Dtype::Float16},
                        {5, 17, 1, 2, 32, 3, 6, mlxk::Dtype::BFloat16}};
  for (const Case &c : cases) {
    PoolInputs in(rng, std::vector<std::size_t>(c.b, c.t), c.hk, c.hv, c.dk, c.dv, c.dtype);
    const std::vector<float> pool_host = random_floats(rng, c.n * in.state_size(), 0.5f);
    mlxk::Array pool = mlxk::Array::from_f32(pool_host, in.pool_shape(c.n));
    std::vector<std::size_t> rows(c.b);
    for (std::size_t r = 0; r < c.b; ++r) rows[r] = r;
    const PoolInputs::Tokens x = in.tokens(rows, false);
    for (int variant = 0; variant < 3; ++variant) {
      const std::vector<std::int32_t> slots = random_slots(rng, c.b, c.n);
      std::vector<std::uint8_t> fresh;
      if (variant > 0)
        for (std::size_t r = 0; r < c.b; ++r) fresh.push_back(rng() % 3 == 0 ? 1 : 0);
      std::vector<bool> keep(c.b * c.t);
      for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = variant != 1 || rng() % 4 != 0;
      mlxk::Array mask = mlxk::Array::from_bool(keep, {PoolInputs::i32(c.b), PoolInputs::i32(c.t)});
      const mlxk::Array *m = variant == 1 ? &mask : nullptr;
      const mlxk::FreshFlags flags =
          fresh.empty() ? mlxk::FreshFlags() : mlxk::FreshFlags(fresh);
      mlxk::Array start =
          mlxk::Array::from_f32(in.gather(pool_host, slots, fresh), in.pool_shape(c.b));
      const std::size_t y_row = c.t * c.hv * c.dv;
      // The exact update, and its chunked form (chunk 16) against the dense chunked form.
      for (bool chunked : {false, true}) {
        mlxk::DeltaUpdate dense =
            chunked ? mlxk::gated_delta_update_chunked(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                       in.dt_bias, &start, m, 16)
                    : mlxk::gated_delta_update(x.q, x.k, x.v, x.a, x.b, in.a_log, in.dt_bias,
                                               &start, m);
        mlxk::PoolUpdate pooled =
            chunked ? mlxk::gated_delta_update_pool_chunked(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                            in.dt_bias, pool, slots, flags, m, 16)
                    : mlxk::gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                    in.dt_bias, pool, slots, flags, m);
        CHECK(pooled.y.dtype() == c.dtype && pooled.pool.shape() == pool.shape());
        CHECK(matches_dense(in, slots, pool_host, pooled.y.to_floats(), pooled.pool.to_floats(),
                            dense.y.to_floats(), dense.state.to_floats(), y_row));
        if (!chunked) {
          // The verify's y is the update's, bit for bit; it writes nothing.
          mlxk::Array verified = mlxk::gated_delta_verify_pool(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                               in.dt_bias, pool, slots, flags, m);
          const std::vector<float> vy = verified.to_floats(), py = pooled.y.to_floats();
          CHECK(vy.size() == py.size() && same_bits(vy, 0, py, 0, vy.size()));
        }
      }
    }
    CHECK(pool.to_floats() == pool_host);  // the caller kept its pool: untouched
  }
}

// Packed prefill equals one dense call per sequence (zero-length sequences, padding and fresh
// rows included), exact and chunked.
void test_pool_packed(std::mt19937 &rng) {
  const std::vector<std::vector<std::size_t>> length_sets = {{5, 0, 3, 7}, {1}, {2, 9, 1, 0, 4, 6}};
  for (const std::vector<std::size_t> &lengths : length_sets) {
    const std::size_t seqs = lengths.size(), n = seqs + 2;
    PoolInputs in(rng, lengths, 1, 2, 32, 6, mlxk::Dtype::BFloat16);
    const std::size_t s = in.state_size(), per_token = in.hv * in.dv;
    const std::vector<float> pool_host = random_floats(rng, n * s, 0.5f);
    mlxk::Array pool = mlxk::Array::from_f32(pool_host, in.pool_shape(n));
    const std::vector<std::int32_t> slots = random_slots(rng, seqs, n);
    std::vector<std::uint8_t> fresh;
    for (std::size_t i = 0; i < seqs; ++i) fresh.push_back(rng() % 3 == 0 ? 1 : 0);
    std::vector<std::int32_t> cu{0};
    std::vector<std::size_t> all;
    for (std::size_t i = 0; i < seqs; ++i) {
      cu.push_back(cu.back() + PoolInputs::i32(lengths[i]));
      all.push_back(i);
    }
    const PoolInputs::Tokens x = in.tokens(all, true);
    for (bool chunked : {false, true}) {
      mlxk::PoolUpdate packed =
          chunked ? mlxk::gated_delta_update_packed_chunked(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                            in.dt_bias, pool, cu, slots, fresh, 16)
                  : mlxk::gated_delta_update_packed(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                    in.dt_bias, pool, cu, slots, fresh);
      CHECK((packed.y.shape() ==
             Dims{1, cu.back(), PoolInputs::i32(in.hv), PoolInputs::i32(in.dv)}));
      const std::vector<float> y = packed.y.to_floats(), new_pool = packed.pool.to_floats();
      const std::vector<float> starts = in.gather(pool_host, slots, fresh);
      bool ok = true;
      for (std::size_t i = 0; i < seqs; ++i) {
        const std::size_t y0 = static_cast<std::size_t>(cu[i]) * per_token;
        const std::size_t ny = lengths[i] * per_token;
        if (slots[i] < 0) {
          for (std::size_t j = y0; j < y0 + ny; ++j) ok = ok && y[j] == 0.0f;
          continue;
        }
        const std::size_t dst = static_cast<std::size_t>(slots[i]) * s;
        if (lengths[i] == 0) {  // nothing run: the start state (zeros when fresh) is written
          ok = ok && same_bits(new_pool, dst, starts, i * s, s);
          continue;
        }
        const PoolInputs::Tokens one = in.tokens({i}, false);
        mlxk::Array start = mlxk::Array::from_f32(
            std::vector<float>(starts.begin() + offset(i * s),
                               starts.begin() + offset((i + 1) * s)),
            in.pool_shape(1));
        mlxk::DeltaUpdate alone =
            chunked ? mlxk::gated_delta_update_chunked(one.q, one.k, one.v, one.a, one.b, in.a_log,
                                                       in.dt_bias, &start, nullptr, 16)
                    : mlxk::gated_delta_update(one.q, one.k, one.v, one.a, one.b, in.a_log,
                                               in.dt_bias, &start);
        ok = ok && same_bits(y, y0, alone.y.to_floats(), 0, ny) &&
             same_bits(new_pool, dst, alone.state.to_floats(), 0, s);
      }
      for (std::size_t slot = 0; slot < n; ++slot)
        if (std::find(slots.begin(), slots.end(), static_cast<std::int32_t>(slot)) == slots.end())
          ok = ok && same_bits(new_pool, slot * s, pool_host, slot * s, s);
      CHECK(ok);
    }
  }
}

// Speculative decoding on a pool: verify a window, then commit each row's accepted prefix with
// gated_delta_state_pool: equal to gated_delta_state on the gathered rows, scattered back.
void test_pool_verify_commit(std::mt19937 &rng) {
  const std::size_t rows = 5, t = 4, n = 7;
  PoolInputs in(rng, std::vector<std::size_t>(rows, t), 2, 4, 32, 8, mlxk::Dtype::BFloat16);
  const std::vector<float> pool_host = random_floats(rng, n * in.state_size(), 0.5f);
  mlxk::Array pool = mlxk::Array::from_f32(pool_host, in.pool_shape(n));
  const PoolInputs::Tokens x = in.tokens({0, 1, 2, 3, 4}, false);
  const std::vector<std::int32_t> slots = random_slots(rng, rows, n);
  const std::vector<std::uint8_t> fresh{0, 1, 0, 0, 1};
  std::vector<std::int32_t> accepted;
  for (std::size_t r = 0; r < rows; ++r)
    accepted.push_back(static_cast<std::int32_t>(rng() % (t + 1)));
  accepted[0] = 0;
  accepted[1] = static_cast<std::int32_t>(t);

  mlxk::Array y = mlxk::gated_delta_verify_pool(x.q, x.k, x.v, x.a, x.b, in.a_log, in.dt_bias,
                                                pool, slots, fresh);
  mlxk::Array start =
      mlxk::Array::from_f32(in.gather(pool_host, slots, fresh), in.pool_shape(rows));
  mlxk::DeltaUpdate dense =
      mlxk::gated_delta_update(x.q, x.k, x.v, x.a, x.b, in.a_log, in.dt_bias, &start);
  mlxk::Array replayed =
      mlxk::gated_delta_state(x.k, x.v, x.a, x.b, in.a_log, in.dt_bias, &start, accepted);
  mlxk::Array committed = mlxk::gated_delta_state_pool(x.k, x.v, x.a, x.b, in.a_log, in.dt_bias,
                                                       pool, slots, accepted, fresh);
  CHECK(matches_dense(in, slots, pool_host, y.to_floats(), committed.to_floats(),
                      dense.y.to_floats(), replayed.to_floats(), t * in.hv * in.dv));
  // A row that accepted every token holds the update's state.
  if (slots[1] >= 0) {
    const std::size_t s = in.state_size();
    CHECK(same_bits(committed.to_floats(), static_cast<std::size_t>(slots[1]) * s,
                    dense.state.to_floats(), s, s));
  }
}

// The update from the convolution's output on a pool equals the head split and then the pool
// update; a decode loop that hands the pool back each step (in place) equals one call.
void test_pool_from_conv_and_decode(std::mt19937 &rng) {
  const std::int32_t hk = 1, hv = 2, dk = 32, dv = 8, b = 3, t = 5, n = 4;
  const std::int32_t width = 2 * hk * dk + hv * dv;
  auto count = [](std::int32_t size) { return static_cast<std::size_t>(size); };
  mlxk::Array conv = mlxk::Array::from_bf16(
      random_floats(rng, count(b * t * width)), {b, t, width});
  mlxk::Array qs = mlxk::Array::from_bf16(random_floats(rng, count(dk), 0.2f), {dk});
  mlxk::Array ks = mlxk::Array::from_bf16(random_floats(rng, count(dk), 0.2f), {dk});
  mlxk::Array a = mlxk::Array::from_bf16(random_floats(rng, count(b * t * hv)), {b, t, hv});
  mlxk::Array bb = mlxk::Array::from_bf16(random_floats(rng, count(b * t * hv)), {b, t, hv});
  mlxk::Array a_log = mlxk::Array::from_f32(random_floats(rng, count(hv), 0.5f), {hv});
  mlxk::Array dt_bias = mlxk::Array::from_f32(random_floats(rng, count(hv), 0.5f), {hv});
  const std::vector<float> pool_host = random_floats(rng, count(n * hv * dv * dk));
  mlxk::Array pool = mlxk::Array::from_f32(pool_host, {n, hv, dv, dk});
  const std::vector<std::int32_t> slots{2, -1, 0};
  const std::vector<std::uint8_t> fresh{0, 0, 1};
  const float eps = 1e-6f / dk;

  mlxk::PoolUpdate fused = mlxk::gated_delta_update_from_conv_pool(
      conv, qs, ks, hk, hv, dv, eps, a, bb, a_log, dt_bias, pool, slots, fresh);
  mlxk::HeadSplit heads = mlxk::silu_rms_heads(conv, qs, ks, hk, hv, dv, eps);
  mlxk::PoolUpdate split = mlxk::gated_delta_update_pool(heads.q, heads.k, heads.v, a, bb, a_log,
                                                         dt_bias, pool, slots, fresh);
  const std::vector<float> fy = fused.y.to_floats(), sy = split.y.to_floats();
  const std::vector<float> fp = fused.pool.to_floats(), sp = split.pool.to_floats();
  CHECK(same_bits(fy, 0, sy, 0, sy.size()) && fy.size() == sy.size());
  CHECK(same_bits(fp, 0, sp, 0, sp.size()) && fp.size() == sp.size());

  // Decode: token by token, the returned pool assigned over the old one before evaluation.
  const std::vector<float> q = heads.q.to_floats(), k = heads.k.to_floats();
  const std::vector<float> v = heads.v.to_floats();
  const std::vector<float> av = a.to_floats(), bv = bb.to_floats();
  auto token = [&](const std::vector<float> &x, std::int32_t step, std::int32_t h, std::int32_t d) {
    std::vector<float> out;
    const std::size_t row = static_cast<std::size_t>(h * d);
    for (std::int32_t r = 0; r < b; ++r) {
      const auto from = x.begin() + offset(static_cast<std::size_t>(r * t + step) * row);
      out.insert(out.end(), from, from + offset(row));
    }
    return out;
  };
  mlxk::Array state = mlxk::Array::from_f32(pool_host, {n, hv, dv, dk});
  std::vector<float> ys;
  for (std::int32_t step = 0; step < t; ++step) {
    mlxk::PoolUpdate one = mlxk::gated_delta_update_pool(
        mlxk::Array::from_bf16(token(q, step, hk, dk), {b, 1, hk, dk}),
        mlxk::Array::from_bf16(token(k, step, hk, dk), {b, 1, hk, dk}),
        mlxk::Array::from_bf16(token(v, step, hv, dv), {b, 1, hv, dv}),
        mlxk::Array::from_bf16(token(av, step, hv, 1), {b, 1, hv}),
        mlxk::Array::from_bf16(token(bv, step, hv, 1), {b, 1, hv}), a_log, dt_bias, state, slots,
        step == 0 ? mlxk::FreshFlags(fresh) : mlxk::FreshFlags());
    state = std::move(one.pool);  // frees the old pool: the kernel takes over its buffer
    state.eval();
    const std::vector<float> y = one.y.to_floats();
    ys.insert(ys.end(), y.begin(), y.end());
  }
  CHECK(same_bits(state.to_floats(), 0, sp, 0, sp.size()));
  bool same_y = true;  // ys is [T, B, Hv, Dv]; the one call's [B, T, Hv, Dv]
  const std::size_t tok = static_cast<std::size_t>(hv * dv);
  for (std::size_t step = 0; step < static_cast<std::size_t>(t); ++step)
    for (std::size_t r = 0; r < static_cast<std::size_t>(b); ++r)
      same_y = same_y && same_bits(ys, (step * static_cast<std::size_t>(b) + r) * tok, sy,
                                   (r * static_cast<std::size_t>(t) + step) * tok, tok);
  CHECK(same_y);
}

// Errors name the argument: the library's (duplicate or out-of-range slots) and the wrapper's
// own (a per-slot host array of another length, which the library would read past).
void test_pool_errors(std::mt19937 &rng) {
  PoolInputs in(rng, {2, 2, 2}, 1, 1, 32, 4, mlxk::Dtype::Float32);
  const PoolInputs::Tokens x = in.tokens({0, 1, 2}, false);
  mlxk::Array pool = mlxk::Array::zeros(in.pool_shape(4), mlxk::Dtype::Float32);
  std::string message = EXPECT_ERROR(
      MLXK_ERR_INVALID_ARGUMENT,
      (void)mlxk::gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, in.a_log, in.dt_bias, pool,
                                          {1, 3, 1}));
  CHECK(message.find("mlxk_gated_delta_update_pool: slots[2] is 1, which slots[0] names too") == 0);
  message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                         (void)mlxk::gated_delta_verify_pool(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                             in.dt_bias, pool, {0, 4, -1}));
  CHECK(message.find("slots[1] is 4") != std::string::npos);
  const std::vector<std::uint8_t> two_flags{1, 0};
  message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                         (void)mlxk::gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                             in.dt_bias, pool, {0, 1, 2},
                                                             two_flags));
  CHECK(message == "gated_delta_update_pool: fresh: 2 values for 3 slots; expected one per slot");
  message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                         (void)mlxk::gated_delta_state_pool(x.k, x.v, x.a, x.b, in.a_log,
                                                            in.dt_bias, pool, {0, 1, 2}, {1, 1}));
  CHECK(message.find("accepted_lengths: 2 values for 3 slots") != std::string::npos);
  message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                         (void)mlxk::gated_delta_state_pool(x.k, x.v, x.a, x.b, in.a_log,
                                                            in.dt_bias, pool, {0, 1, 2},
                                                            {1, 3, 0}));
  CHECK(message.find("accepted_lengths") != std::string::npos);
  const PoolInputs::Tokens packed = in.tokens({0, 1, 2}, true);
  message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                         (void)mlxk::gated_delta_update_packed(packed.q, packed.k, packed.v,
                                                               packed.a, packed.b, in.a_log,
                                                               in.dt_bias, pool, {0, 2, 6}, {0}));
  CHECK(message.find("slots: 1 slots for 2 sequences") != std::string::npos);
  message = EXPECT_ERROR(MLXK_ERR_INVALID_ARGUMENT,
                         (void)mlxk::gated_delta_update_packed(packed.q, packed.k, packed.v,
                                                               packed.a, packed.b, in.a_log,
                                                               in.dt_bias, pool, {0, 4, 5},
                                                               {0, 1}));
  CHECK(message.find("cu_seqlens[2] is 5") != std::string::npos);
  mlxk::Array bf16_pool = mlxk::Array::zeros(in.pool_shape(4), mlxk::Dtype::BFloat16);
  message = EXPECT_ERROR(MLXK_ERR_DTYPE,
                         (void)mlxk::gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, in.a_log,
                                                             in.dt_bias, bf16_pool, {0, 1, 2}));
  CHECK(message.find("pool: dtype bfloat16") != std::string::npos);
}

}  // namespace

int main() {
  try {
    test_conversions();
    test_ownership();
    test_arrays();
    test_gated_delta();
    test_norms();
    test_glm52();
    test_settings();
    // Fresh inputs each run; MLXK_TEST_SEED=<seed> replays one.
    const char *fixed = std::getenv("MLXK_TEST_SEED");
    const unsigned seed = fixed != nullptr ? static_cast<unsigned>(std::strtoul(fixed, nullptr, 10))
                                           : std::random_device{}();
    std::printf("pool tests: MLXK_TEST_SEED=%u\n", seed);
    std::mt19937 rng(seed);
    test_pool_update(rng);
    test_pool_packed(rng);
    test_pool_verify_commit(rng);
    test_pool_from_conv_and_decode(rng);
    test_pool_errors(rng);
  } catch (const std::exception &error) {
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", error.what());
    return 1;
  }
  std::printf("%d checks passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
