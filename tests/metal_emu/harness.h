// What the files of the Metal-text emulation test share (harness.cc runs the cases;
// harness_cases.cc builds their inputs and CPU results, launches the kernels and compares;
// harness_pool.cc builds the pool cases';
// harness_backward.cc checks the recurrence's backward pass): host tensors, the library's
// handles, the case types. C++17; no MLX header.

#ifndef MLXK_METAL_EMU_HARNESS_H
#define MLXK_METAL_EMU_HARNESS_H

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "case_desc.h"
#include "executor.h"
#include "mlxkern.h"
#include "metal_numeric.h"

extern "C" int mlxk_emu_mlx_sigmoid(const void* in, size_t n, int dtype, void* out);
extern "C" int mlxk_emu_mlx_exp_f32(const float* in, size_t n, float* out);
extern "C" int mlxk_emu_mlx_astype(const void* in, size_t n, int from, int to, void* out);

namespace harness {

// ------------------------------------------------------------------------------------------
// Host tensors

size_t dtype_size(int dtype);
const char* dtype_name(int dtype);
[[noreturn]] void die(const char* format, ...);

struct Tensor {
  int dtype = MLXK_DTYPE_FLOAT32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  size_t count() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
  float get(size_t i) const {
    const uint8_t* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case MLXK_DTYPE_FLOAT32: { float f; std::memcpy(&f, p, 4); return f; }
      case MLXK_DTYPE_BFLOAT16: { uint16_t b; std::memcpy(&b, p, 2); return mlxk_emu::bfloat_bits_to_float(b); }
      case MLXK_DTYPE_FLOAT16: { uint16_t b; std::memcpy(&b, p, 2); return mlxk_emu::half_bits_to_float(b); }
      case MLXK_DTYPE_INT32: { int32_t v; std::memcpy(&v, p, 4); return static_cast<float>(v); }
      case MLXK_DTYPE_BOOL: return p[0] ? 1.0f : 0.0f;
    }
    die("get: dtype %d", dtype);
  }
  uint32_t bits(size_t i) const {
    const uint8_t* p = bytes.data() + i * dtype_size(dtype);
    uint32_t b = 0;
    std::memcpy(&b, p, dtype_size(dtype));
    return b;
  }
  bool is_nan(size_t i) const {
    return (dtype == MLXK_DTYPE_FLOAT32 || dtype == MLXK_DTYPE_BFLOAT16 ||
            dtype == MLXK_DTYPE_FLOAT16) && std::isnan(get(i));
  }
  void set(size_t i, float v) {
    uint8_t* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case MLXK_DTYPE_FLOAT32: std::memcpy(p, &v, 4); return;
      case MLXK_DTYPE_BFLOAT16: { uint16_t b = mlxk_emu::float_to_bfloat_bits(v); std::memcpy(p, &b, 2); return; }
      case MLXK_DTYPE_FLOAT16: { uint16_t b = mlxk_emu::float_to_half_bits(v); std::memcpy(p, &b, 2); return; }
      case MLXK_DTYPE_INT32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); return; }
      case MLXK_DTYPE_BOOL: p[0] = v != 0.0f; return;
    }
    die("set: dtype %d", dtype);
  }
  std::string describe() const {
    std::string s = std::string(dtype_name(dtype)) + " [";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

Tensor make(int dtype, std::vector<int64_t> shape, uint8_t fill = 0);

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
};

Tensor random(Rng& rng, int dtype, std::vector<int64_t> shape, float lo, float hi);

// ------------------------------------------------------------------------------------------
// The library through its C ABI

void check(mlxk_status status, const char* what);

struct Handle {
  mlxk_array* a = nullptr;
  Handle() = default;
  explicit Handle(const Tensor& t) {
    std::vector<int32_t> shape(t.shape.begin(), t.shape.end());
    check(mlxk_array_new(t.bytes.data(), shape.data(), shape.size(), t.dtype, &a),
          "mlxk_array_new");
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (a) check(mlxk_array_free(a), "mlxk_array_free");
  }
  Tensor read() const {
    size_t ndim = 0;
    check(mlxk_array_ndim(a, &ndim), "mlxk_array_ndim");
    std::vector<int32_t> dims(ndim);
    check(mlxk_array_shape(a, dims.data(), ndim), "mlxk_array_shape");
    mlxk_dtype dtype = 0;
    check(mlxk_array_dtype(a, &dtype), "mlxk_array_dtype");
    Tensor t = make(dtype, std::vector<int64_t>(dims.begin(), dims.end()));
    check(mlxk_array_read(a, t.bytes.data(), t.bytes.size()), "mlxk_array_read");
    return t;
  }
};

// ------------------------------------------------------------------------------------------
// Cases

using Named = std::map<std::string, Tensor>;

struct Built {
  Named inputs;    // the emulated kernel's inputs, by launch input name
  Named expected;  // the CPU kernel's outputs, by launch output name
};

// The recurrence's random inputs (the forward, the replay and the backward draw them alike).
struct RecurrenceDraw {
  Tensor q, k, v, a, b, a_log, dt_bias, state, mask;
};

RecurrenceDraw draw_recurrence(const EmuCase& c, Rng& rng);
void gates_for_kernel(const EmuCase& c, const RecurrenceDraw& x, Tensor* g, Tensor* beta);

struct Mismatch {
  size_t count = 0;
  size_t total = 0;
  std::string first;
};

Mismatch compare(const Tensor& cpu, const Tensor& metal);

struct Result {
  bool exact = true;
  std::string summary;  // per-output counts
  std::string detail;   // first mismatches
  std::string accuracy; // head split: which side is nearer the exact SiLU where they differ
  std::string verdict = "bit-identical to the CPU kernel";  // what a pass shows
  emu::Stats stats;
};

extern uint64_t g_seed_offset;  // METAL_EMU_SEED: other random draws than the default ones

// Runs the case's kernel on `inputs` (by launch input name, checked against the launch's
// dtypes and shapes) and returns its outputs in the launch's order.
std::vector<Tensor> launch_kernel(const EmuCase& c, Named& inputs, emu::Stats* stats);
Result run_case(const EmuCase& c);

// harness_pool.cc: a pool case's inputs (the row table restated from
// src/ops/gated_delta/pool.rs) and the CPU pool call's results as the launch's outputs.
Built build_pool(const EmuCase& c, Rng& rng);

// harness_backward.cc
Result run_backward(const EmuCase& c);
// harness_chunked.cc: a chunk output case with its prep and state cases, within the chunked
// bounds; a chunked pool case with its launches and the dense call's, bit for bit.
Result run_chunked(const EmuCase& c);
Result run_chunked_pool(const EmuCase& c);
void print_backward_worst();

// A gradient's error against the CPU backward's (harness_backward.cc `grad_error`).
struct GradError {
  double ratio = 0.0;  // the largest excess / scale
  double scale = 0.0;
  size_t at = 0;
  double cpu = 0.0, metal = 0.0;
};
GradError grad_error(const Tensor& cpu, const std::vector<double>& metal, bool twice,
                     double scale = 0.0);
mlxk_array* new_array(const Tensor& t);
const EmuCase* find_case(int id);

// harness_tiles.cc: the matrix tiles' self-test against float64 products.
Result run_tiles(const EmuCase& c);

// harness_backward_chunked.cc: the chunked backward's five launches from stage 0's case.
Result run_backward_chunked(const EmuCase& c);
void print_backward_chunked_worst();

}  // namespace harness

#endif
