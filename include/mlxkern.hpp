/*
 * mlxkern.hpp: a header-only C++17 layer over mlxkern.h.
 *
 * - mlxk::Array owns one mlxk_array handle (move-only, freed by the destructor; release()
 *   hands the raw handle back to the caller).
 * - Every failing call throws mlxk::Error, which carries the status and the library's message
 *   (read from mlxk_last_error() right after the failing call, on the same thread).
 * - Kernels are free functions returning Arrays; multi-output kernels return small structs.
 *   Results are lazy, as in the C API: an error raised while computing surfaces (as an Error)
 *   from eval(), read() or to_floats().
 * - No handle leaks on any path: every out-parameter is adopted by an Array before the status is
 *   checked, so an exception never strands a handle.
 *
 * Thread rules and ownership are those of mlxkern.h: an Array may be used from any thread, but
 * one Array object is not synchronized (do not move or destroy it while another thread uses it).
 *
 * Engines on MLX's C++ API: define MLXKERN_WITH_MLX before the first include of this header
 * (or pass -DMLXKERN_WITH_MLX; `pkg-config --cflags mlxkern-mlx` does) and it includes
 * <mlx/array.h> and adds, without a copy in either direction (mlxkern.h, "Sharing arrays with
 * a host's MLX": one libmlx in the process, the one mlxkern was built against):
 *
 *   mlxk::Array::from_mlx(const mlx::core::array &)   a handle sharing the host's array (lazy
 *                                                     stays lazy; views are fine)
 *   mlx::core::array mlxk::Array::to_mlx() const      the host's array sharing the handle's
 *                                                     (lazy if the handle's is)
 *
 * so a layer's MLX ops and mlxkern's kernels make one graph, evaluated by one mx::eval:
 *
 *   mlxk::Array conv = mlxk::Array::from_mlx(mx::conv1d(conv_input, w, 1, 0, 1, channels));
 *   mlxk::HeadSplit heads = mlxk::silu_rms_heads(conv, q_scale, k_scale, hk, hv, dv, eps);
 *   ...
 *   mx::array out = mx::matmul(mx::reshape(normed.to_mlx(), {1, t, -1}), w_out_t);
 *   mx::eval({out, state});
 *
 * The macro is an explicit opt-in (it does not follow whether mlx/mlx.h was included first),
 * so a file's meaning does not depend on its include order; without it this header needs
 * nothing but mlxkern.h and the C++17 standard library. With it, MLX's headers set the
 * language level (MLX 0.32's need C++20) and the program links libmlx.
 *
 *   mlxk::Array state;                                   // empty: zeros on the first call
 *   for (...) {
 *     mlxk::DeltaUpdate step = mlxk::gated_delta_update(q, k, v, a, b, a_log, dt_bias, &state);
 *     state = std::move(step.state);  // frees the old handle first: the update runs in place
 *     std::vector<float> y = step.y.to_floats();         // evaluates; errors throw mlxk::Error
 *   }
 */

#ifndef MLXKERN_HPP
#define MLXKERN_HPP

#include "mlxkern.h"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef MLXKERN_WITH_MLX
#include <memory>

#include <mlx/array.h>
#endif

namespace mlxk {

// ---------------------------------------------------------------------------------------------
// Errors

/** A failed mlxk_ call: the status code and the library's message. */
class Error : public std::runtime_error {
 public:
  Error(mlxk_status status, const std::string &message)
      : std::runtime_error(std::string(mlxk_status_name(status)) + ": " + message),
        status_(status),
        message_(message) {}

  /** The MLXK_ERR_* code. */
  [[nodiscard]] mlxk_status status() const noexcept { return status_; }
  /** The status's name, e.g. "MLXK_ERR_SHAPE" (a static string). */
  [[nodiscard]] const char *status_name() const noexcept { return mlxk_status_name(status_); }
  /** The library's message alone (what() prefixes the status name). */
  [[nodiscard]] const std::string &message() const noexcept { return message_; }

 private:
  mlxk_status status_;
  std::string message_;
};

/** Throws Error for a status other than MLXK_OK. Call it directly on the C call's result: the
 * message is copied from mlxk_last_error() before anything else can touch it. */
inline void check(mlxk_status status) {
  if (status != MLXK_OK) {
    const char *message = mlxk_last_error();
    throw Error(status, message != nullptr ? std::string(message) : std::string());
  }
}

// ---------------------------------------------------------------------------------------------
// Dtypes and host conversions

/** Element types, with the C API's stable values. */
enum class Dtype : mlxk_dtype {
  Bool = MLXK_DTYPE_BOOL,
  UInt8 = MLXK_DTYPE_UINT8,
  Int8 = MLXK_DTYPE_INT8,
  Int32 = MLXK_DTYPE_INT32,
  UInt32 = MLXK_DTYPE_UINT32,
  Float16 = MLXK_DTYPE_FLOAT16,
  BFloat16 = MLXK_DTYPE_BFLOAT16,
  Float32 = MLXK_DTYPE_FLOAT32,
};

/** Bytes per element. */
[[nodiscard]] constexpr std::size_t dtype_size(Dtype dtype) noexcept {
  switch (dtype) {
    case Dtype::Bool:
    case Dtype::UInt8:
    case Dtype::Int8:
      return 1;
    case Dtype::Float16:
    case Dtype::BFloat16:
      return 2;
    case Dtype::Int32:
    case Dtype::UInt32:
    case Dtype::Float32:
      return 4;
  }
  return 0;
}

[[nodiscard]] constexpr const char *dtype_name(Dtype dtype) noexcept {
  switch (dtype) {
    case Dtype::Bool: return "bool";
    case Dtype::UInt8: return "uint8";
    case Dtype::Int8: return "int8";
    case Dtype::Int32: return "int32";
    case Dtype::UInt32: return "uint32";
    case Dtype::Float16: return "float16";
    case Dtype::BFloat16: return "bfloat16";
    case Dtype::Float32: return "float32";
  }
  return "unknown";
}

[[nodiscard]] constexpr bool is_floating(Dtype dtype) noexcept {
  return dtype == Dtype::Float16 || dtype == Dtype::BFloat16 || dtype == Dtype::Float32;
}

/** float -> bfloat16 bits, MLX's rule: round to nearest even; every NaN becomes 0x7FC0. */
[[nodiscard]] inline std::uint16_t bf16_from_float(float value) noexcept {
  if (std::isnan(value)) {
    return 0x7FC0;
  }
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits += ((bits >> 16) & 1u) + 0x7FFFu;
  return static_cast<std::uint16_t>(bits >> 16);
}

/** bfloat16 bits -> float (exact). */
[[nodiscard]] inline float float_from_bf16(std::uint16_t bits) noexcept {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

/** Rounds a float to the nearest bfloat16 value, returned as a float. */
[[nodiscard]] inline float round_bf16(float value) noexcept {
  return float_from_bf16(bf16_from_float(value));
}

/** IEEE binary16 bits -> float (exact, subnormals and NaN payloads included). */
[[nodiscard]] inline float float_from_f16(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = bits & 0x3FFu;
  std::uint32_t wide;
  if (exponent == 0x1F) {
    wide = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    wide = sign;
  } else {
    // Subnormal: shift the leading one up to the implicit bit.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    wide = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// ---------------------------------------------------------------------------------------------
// Shapes and spans

using Shape = std::vector<std::int32_t>;

/** A borrowed, read-only run of elements (C++17 has no std::span). Built from a vector, a
 * std::array, an initializer list (valid for the call it is passed to) or a pointer and count. */
template <class T>
class Span {
 public:
  constexpr Span() noexcept = default;
  constexpr Span(const T *data, std::size_t size) noexcept : data_(data), size_(size) {}
  Span(const std::vector<T> &values) noexcept : data_(values.data()), size_(values.size()) {}
  template <std::size_t N>
  constexpr Span(const std::array<T, N> &values) noexcept : data_(values.data()), size_(N) {}
// Viewing an initializer list is safe for a function argument: its array lives until the end
// of the full expression (C++26's std::span gains the same constructor). GCC warns anyway.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
  constexpr Span(std::initializer_list<T> values) noexcept
      : data_(values.begin()), size_(values.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

  [[nodiscard]] constexpr const T *data() const noexcept { return data_; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr const T *begin() const noexcept { return data_; }
  [[nodiscard]] constexpr const T *end() const noexcept { return data_ + size_; }
  constexpr const T &operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  const T *data_ = nullptr;
  std::size_t size_ = 0;
};

/** Number of elements of `shape` (throws Error on a negative dimension). */
[[nodiscard]] inline std::size_t element_count(const Shape &shape) {
  std::size_t count = 1;
  for (std::int32_t dim : shape) {
    if (dim < 0) {
      throw Error(MLXK_ERR_SHAPE, "negative dimension " + std::to_string(dim));
    }
    count *= static_cast<std::size_t>(dim);
  }
  return count;
}

namespace detail {

inline void check_count(std::size_t have, const Shape &shape, const char *what) {
  const std::size_t want = element_count(shape);
  if (have != want) {
    throw Error(MLXK_ERR_SHAPE, std::string(what) + ": " + std::to_string(have) +
                                    " elements given for a shape of " + std::to_string(want));
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Array

/** Owns one mlxk_array handle. Move-only; an empty Array (default-constructed, moved from or
 * released) holds no handle, and passing it where a handle is required throws
 * MLXK_ERR_NULL_POINTER. */
class Array {
 public:
  Array() noexcept = default;
  /** Adopts `raw` (it will be freed by this object). */
  explicit Array(mlxk_array *raw) noexcept : raw_(raw) {}
  ~Array() { reset(); }

  Array(Array &&other) noexcept : raw_(other.release()) {}
  Array &operator=(Array &&other) noexcept {
    if (this != &other) {
      reset(other.release());
    }
    return *this;
  }
  Array(const Array &) = delete;
  Array &operator=(const Array &) = delete;

  /** Gives up ownership: the caller must mlxk_array_free() the result. */
  [[nodiscard]] mlxk_array *release() noexcept {
    mlxk_array *raw = raw_;
    raw_ = nullptr;
    return raw;
  }
  /** Frees the held handle (if any) and adopts `raw`. */
  void reset(mlxk_array *raw = nullptr) noexcept {
    mlxk_array *old = raw_;
    raw_ = raw;
    if (old != nullptr) {
      // Only fails for a handle that is not live, which an Array never holds.
      static_cast<void>(mlxk_array_free(old));
    }
  }
  /** The borrowed handle (still owned by this object). */
  [[nodiscard]] mlxk_array *get() const noexcept { return raw_; }
  [[nodiscard]] bool empty() const noexcept { return raw_ == nullptr; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

  // --- construction (copies host data) ---

  /** From raw row-major bytes: `bytes` must be element_count(shape) * dtype_size(dtype). */
  [[nodiscard]] static Array from_bytes(const void *data, std::size_t bytes, const Shape &shape,
                                        Dtype dtype) {
    const std::size_t want = element_count(shape) * dtype_size(dtype);
    if (bytes != want) {
      throw Error(MLXK_ERR_SHAPE, "from_bytes: " + std::to_string(bytes) +
                                      " bytes given for a shape needing " + std::to_string(want));
    }
    Array out;
    check(mlxk_array_new(data, shape.data(), shape.size(), static_cast<mlxk_dtype>(dtype),
                         out.out()));
    return out;
  }
  [[nodiscard]] static Array from_f32(Span<float> values, const Shape &shape) {
    detail::check_count(values.size(), shape, "from_f32");
    return from_bytes(values.data(), values.size() * sizeof(float), shape, Dtype::Float32);
  }
  /** bfloat16 from floats, each rounded to nearest even (MLX's conversion). */
  [[nodiscard]] static Array from_bf16(Span<float> values, const Shape &shape) {
    detail::check_count(values.size(), shape, "from_bf16");
    std::vector<std::uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      bits[i] = bf16_from_float(values[i]);
    }
    return from_bytes(bits.data(), bits.size() * 2, shape, Dtype::BFloat16);
  }
  /** bfloat16 from its bit patterns. */
  [[nodiscard]] static Array from_bf16_bits(Span<std::uint16_t> bits, const Shape &shape) {
    detail::check_count(bits.size(), shape, "from_bf16_bits");
    return from_bytes(bits.data(), bits.size() * 2, shape, Dtype::BFloat16);
  }
  [[nodiscard]] static Array from_i32(Span<std::int32_t> values, const Shape &shape) {
    detail::check_count(values.size(), shape, "from_i32");
    return from_bytes(values.data(), values.size() * 4, shape, Dtype::Int32);
  }
  [[nodiscard]] static Array from_bool(Span<bool> values, const Shape &shape) {
    detail::check_count(values.size(), shape, "from_bool");
    std::vector<std::uint8_t> bytes(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      bytes[i] = values[i] ? 1 : 0;
    }
    return from_bytes(bytes.data(), bytes.size(), shape, Dtype::Bool);
  }
  /** std::vector<bool> packs bits, so it gets its own overload. */
  [[nodiscard]] static Array from_bool(const std::vector<bool> &values, const Shape &shape) {
    detail::check_count(values.size(), shape, "from_bool");
    std::vector<std::uint8_t> bytes(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      bytes[i] = values[i] ? 1 : 0;
    }
    return from_bytes(bytes.data(), bytes.size(), shape, Dtype::Bool);
  }
  [[nodiscard]] static Array zeros(const Shape &shape, Dtype dtype) {
    Array out;
    check(mlxk_array_zeros(shape.data(), shape.size(), static_cast<mlxk_dtype>(dtype),
                           out.out()));
    return out;
  }

  // --- queries (never evaluate) ---

  [[nodiscard]] Shape shape() const {
    std::size_t ndim = 0;
    check(mlxk_array_ndim(raw_, &ndim));
    Shape dims(ndim);
    check(mlxk_array_shape(raw_, dims.data(), dims.size()));
    return dims;
  }
  [[nodiscard]] std::size_t ndim() const {
    std::size_t ndim = 0;
    check(mlxk_array_ndim(raw_, &ndim));
    return ndim;
  }
  [[nodiscard]] Dtype dtype() const {
    mlxk_dtype dtype = 0;
    check(mlxk_array_dtype(raw_, &dtype));
    return static_cast<Dtype>(dtype);
  }
  [[nodiscard]] std::size_t nbytes() const {
    std::size_t nbytes = 0;
    check(mlxk_array_nbytes(raw_, &nbytes));
    return nbytes;
  }
  /** Number of elements. */
  [[nodiscard]] std::size_t size() const { return nbytes() / dtype_size(dtype()); }

  // --- computation and readback ---

  /** Computes the array now; errors of the kernels that produced it are thrown here. */
  const Array &eval() const {
    check(mlxk_array_eval(raw_));
    return *this;
  }
  /** Evaluates and copies the row-major bytes into `dst` (at least nbytes() long). */
  void read(void *dst, std::size_t dst_bytes) const { check(mlxk_array_read(raw_, dst, dst_bytes)); }

  /** The elements as T, which must match the dtype's storage exactly (float for Float32,
   * std::uint16_t for BFloat16 / Float16 bit patterns, std::int32_t for Int32, ...). */
  template <class T>
  [[nodiscard]] std::vector<T> to_vector() const {
    static_assert(std::is_trivially_copyable<T>::value, "to_vector needs a plain element type");
    const Dtype type = dtype();
    if (dtype_size(type) != sizeof(T)) {
      throw Error(MLXK_ERR_DTYPE, std::string("to_vector: element size ") +
                                      std::to_string(sizeof(T)) + " does not match dtype " +
                                      dtype_name(type));
    }
    std::vector<T> out(nbytes() / sizeof(T));
    read(out.data(), out.size() * sizeof(T));
    return out;
  }
  /** The elements of a float array (float32, bfloat16 or float16) widened to float (exact). */
  [[nodiscard]] std::vector<float> to_floats() const {
    const Dtype type = dtype();
    if (type == Dtype::Float32) {
      return to_vector<float>();
    }
    if (type != Dtype::BFloat16 && type != Dtype::Float16) {
      throw Error(MLXK_ERR_DTYPE,
                  std::string("to_floats: expected a float array, got ") + dtype_name(type));
    }
    const std::vector<std::uint16_t> bits = to_vector<std::uint16_t>();
    std::vector<float> out(bits.size());
    for (std::size_t i = 0; i < bits.size(); ++i) {
      out[i] = type == Dtype::BFloat16 ? float_from_bf16(bits[i]) : float_from_f16(bits[i]);
    }
    return out;
  }

  /** A lazy converted copy (MLX's conversion rules). */
  [[nodiscard]] Array astype(Dtype dtype) const {
    Array out;
    check(mlxk_array_astype(raw_, static_cast<mlxk_dtype>(dtype), out.out()));
    return out;
  }

#ifdef MLXKERN_WITH_MLX
  // --- sharing arrays with the host's MLX (no copy; see the top of this file) ---

  /** A handle sharing the host's MLX array: the same buffer, or the same unevaluated node,
   * which then becomes an input of the kernels' nodes. The host keeps its array; both stay
   * valid while either holds it. Throws Error: MLXK_ERR_UNSUPPORTED (another libmlx than the
   * one mlxkern was built against), MLXK_ERR_DTYPE (float64, int64, ...), MLXK_ERR_SHAPE,
   * MLXK_ERR_INVALID_ARGUMENT. */
  [[nodiscard]] static Array from_mlx(const mlx::core::array &array) {
    Array out;
    check(mlxk_array_from_mlx(&array, out.out()));
    return out;
  }

  /** The host's MLX array sharing this handle's (lazy if the handle's is: the host's own ops
   * and eval compute it with everything else). The library's heap copy is deleted before
   * returning. Throws Error: MLXK_ERR_NULL_POINTER (an empty Array), MLXK_ERR_UNSUPPORTED. */
  [[nodiscard]] mlx::core::array to_mlx() const {
    void *raw = nullptr;
    check(mlxk_array_to_mlx(raw_, &raw));
    const std::unique_ptr<mlx::core::array> owned(static_cast<mlx::core::array *>(raw));
    return std::move(*owned);
  }
#endif

 private:
  friend class OutHandle;

  /** Frees the current handle and returns the slot for a C call to fill. */
  mlxk_array **out() noexcept {
    reset();
    return &raw_;
  }

  mlxk_array *raw_ = nullptr;
};

/** An Array's slot as an out-parameter: `check(mlxk_f(..., OutHandle(result)))`. The C call
 * writes the new handle straight into the Array that owns it, so nothing is ever held by a bare
 * pointer, whether the call (or check) succeeds or throws. */
class OutHandle {
 public:
  explicit OutHandle(Array &target) noexcept : slot_(target.out()) {}
  operator mlxk_array **() const noexcept { return slot_; }

 private:
  mlxk_array **slot_;
};

namespace detail {

inline const mlxk_array *optional_handle(const Array *array) noexcept {
  return array != nullptr ? array->get() : nullptr;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Process-wide settings and version

enum class Device : mlxk_device { Cpu = MLXK_DEVICE_CPU, Gpu = MLXK_DEVICE_GPU };
enum class GpuBackend : mlxk_gpu_backend_kind {
  None = MLXK_GPU_NONE,
  Metal = MLXK_GPU_METAL,
  Cuda = MLXK_GPU_CUDA,
};

/** Sets the device later kernels run on (Error MLXK_ERR_UNSUPPORTED without a GPU). */
inline void set_default_device(Device device) {
  check(mlxk_set_default_device(static_cast<mlxk_device>(device)));
}
[[nodiscard]] inline GpuBackend gpu_backend() noexcept {
  return static_cast<GpuBackend>(mlxk_gpu_backend());
}
inline void set_memory_limit(std::size_t bytes) { check(mlxk_set_memory_limit(bytes)); }
[[nodiscard]] inline std::size_t memory_limit() {
  std::size_t bytes = 0;
  check(mlxk_get_memory_limit(&bytes));
  return bytes;
}
inline void set_cache_limit(std::size_t bytes) { check(mlxk_set_cache_limit(bytes)); }

/** The loaded library's version string, e.g. "0.1.0". */
[[nodiscard]] inline std::string version() { return mlxk_version(); }
[[nodiscard]] inline std::uint32_t abi_version() noexcept { return mlxk_abi_version(); }
/** Throws Error (MLXK_ERR_UNSUPPORTED) when the loaded library's C ABI differs from the one
 * this header was written against. Call it once at start-up. */
inline void check_abi() {
  if (mlxk_abi_version() != MLXK_ABI_VERSION) {
    throw Error(MLXK_ERR_UNSUPPORTED,
                "libmlxkern C ABI " + std::to_string(mlxk_abi_version()) +
                    " loaded, but the header was written for " + std::to_string(MLXK_ABI_VERSION));
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels (see mlxkern.h for shapes, dtypes and numerics). Inputs are borrowed; optional inputs
// are pointers (nullptr, or a pointer to an empty Array, means absent).

/** g = exp(-exp(f32(a_log)) * softplus(a + dt_bias)), float32 with a's shape. */
[[nodiscard]] inline Array compute_g(const Array &a_log, const Array &a, const Array &dt_bias) {
  Array g;
  check(mlxk_compute_g(a_log.get(), a.get(), dt_bias.get(), OutHandle(g)));
  return g;
}

/** The two results of gated_delta_update. */
struct DeltaUpdate {
  Array y;      ///< [B, T, Hv, Dv] in q's dtype (0 at masked tokens)
  Array state;  ///< [B, Hv, Dv, Dk] float32
};

/** One Gated DeltaNet call. `state` [B, Hv, Dv, Dk] float32 (nullptr: zeros); `mask` [B, T]
 * bool (nullptr: every token real). Decode loop: assign the returned state over the old Array
 * before evaluating (the old handle is freed, and the CPU kernel updates the buffer in place). */
[[nodiscard]] inline DeltaUpdate gated_delta_update(const Array &q, const Array &k,
                                                    const Array &v, const Array &a,
                                                    const Array &b, const Array &a_log,
                                                    const Array &dt_bias,
                                                    const Array *state = nullptr,
                                                    const Array *mask = nullptr) {
  DeltaUpdate result;
  check(mlxk_gated_delta_update(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(),
                                dt_bias.get(), detail::optional_handle(state),
                                detail::optional_handle(mask), OutHandle(result.y),
                                OutHandle(result.state)));
  return result;
}

/** gated_delta_update in chunked (WY) form: the faster prefill, equal to the exact update up to
 * float32 rounding (not bit for bit). `chunk_size`: 0 (default, 32) or a multiple of 16 in
 * [16, 128]. On the GPU default device: the GPU chunked kernels (chunks of at most 64). */
[[nodiscard]] inline DeltaUpdate gated_delta_update_chunked(
    const Array &q, const Array &k, const Array &v, const Array &a, const Array &b,
    const Array &a_log, const Array &dt_bias, const Array *state = nullptr,
    const Array *mask = nullptr, std::int32_t chunk_size = 0) {
  DeltaUpdate result;
  check(mlxk_gated_delta_update_chunked(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(),
                                        dt_bias.get(), detail::optional_handle(state),
                                        detail::optional_handle(mask), chunk_size,
                                        OutHandle(result.y), OutHandle(result.state)));
  return result;
}

/** The gradients of gated_delta_update's inputs (see gated_delta_update_vjp). */
struct DeltaGradients {
  Array dq, dk, dv, da, db, da_log, dt_bias, state;
};

/** The update's backward pass (mlxk_gated_delta_update_vjp): the gradients of
 * sum(dy * y) + sum(dstate_out * state_out) with respect to every input; nullptr cotangents
 * are zeros. On the GPU default device: the GPU backward kernel. */
[[nodiscard]] inline DeltaGradients gated_delta_update_vjp(
    const Array &q, const Array &k, const Array &v, const Array &a, const Array &b,
    const Array &a_log, const Array &dt_bias, const Array *state, const Array *mask,
    const Array *dy, const Array *dstate_out) {
  DeltaGradients g;
  check(mlxk_gated_delta_update_vjp(
      q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(), dt_bias.get(),
      detail::optional_handle(state), detail::optional_handle(mask), detail::optional_handle(dy),
      detail::optional_handle(dstate_out), OutHandle(g.dq), OutHandle(g.dk), OutHandle(g.dv),
      OutHandle(g.da), OutHandle(g.db), OutHandle(g.da_log), OutHandle(g.dt_bias),
      OutHandle(g.state)));
  return g;
}

/** The chunked update's backward pass (mlxk_gated_delta_update_chunked_vjp): the gradients of
 * gated_delta_update_chunked, computed chunk by chunk; arguments as gated_delta_update_vjp plus
 * chunk_size (0 = 32, or a multiple of 16 in [16, 128]). */
[[nodiscard]] inline DeltaGradients gated_delta_update_chunked_vjp(
    const Array &q, const Array &k, const Array &v, const Array &a, const Array &b,
    const Array &a_log, const Array &dt_bias, const Array *state, const Array *mask,
    std::int32_t chunk_size, const Array *dy, const Array *dstate_out) {
  DeltaGradients g;
  check(mlxk_gated_delta_update_chunked_vjp(
      q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(), dt_bias.get(),
      detail::optional_handle(state), detail::optional_handle(mask), chunk_size,
      detail::optional_handle(dy), detail::optional_handle(dstate_out), OutHandle(g.dq),
      OutHandle(g.dk), OutHandle(g.dv), OutHandle(g.da), OutHandle(g.db), OutHandle(g.da_log),
      OutHandle(g.dt_bias), OutHandle(g.state)));
  return g;
}

/** Prefix-state replay: row r's state after its first accepted_lengths[r] tokens of the
 * verify window, from the pre-verify `state` (nullptr: zeros). */
[[nodiscard]] inline Array gated_delta_state(const Array &k, const Array &v, const Array &a,
                                             const Array &b, const Array &a_log,
                                             const Array &dt_bias, const Array *state,
                                             Span<std::int32_t> accepted_lengths) {
  Array state_out;
  check(mlxk_gated_delta_state(k.get(), v.get(), a.get(), b.get(), a_log.get(), dt_bias.get(),
                               detail::optional_handle(state), accepted_lengths.data(),
                               accepted_lengths.size(), OutHandle(state_out)));
  return state_out;
}

/** The three results of silu_rms_heads. */
struct HeadSplit {
  Array q;  ///< [B, S, Hk, Dk], normalized and scaled by q_scale
  Array k;  ///< [B, S, Hk, Dk], normalized and scaled by k_scale
  Array v;  ///< [B, S, Hv, Dv], SiLU only
};

/** SiLU + per-head RMS normalization of the conv output x [B, S, 2*Hk*Dk + Hv*Dv]. */
[[nodiscard]] inline HeadSplit silu_rms_heads(const Array &x, const Array &q_scale,
                                              const Array &k_scale, std::int32_t key_heads,
                                              std::int32_t value_heads, std::int32_t value_width,
                                              float eps) {
  HeadSplit result;
  check(mlxk_silu_rms_heads(x.get(), q_scale.get(), k_scale.get(), key_heads, value_heads,
                            value_width, eps, OutHandle(result.q), OutHandle(result.k),
                            OutHandle(result.v)));
  return result;
}

/** The head split and the update of one layer in one call (mlxk_gated_delta_update_from_conv):
 * the bits of silu_rms_heads(x, ...) followed by gated_delta_update(q, k, v, ...); on a GPU
 * one kernel node instead of two where the C function's documentation says (decode). Dk
 * (q_scale's length) a multiple of 32 in [32, 128]. */
[[nodiscard]] inline DeltaUpdate gated_delta_update_from_conv(
    const Array &x, const Array &q_scale, const Array &k_scale, std::int32_t key_heads,
    std::int32_t value_heads, std::int32_t value_width, float eps, const Array &a,
    const Array &b, const Array &a_log, const Array &dt_bias, const Array *state = nullptr,
    const Array *mask = nullptr) {
  DeltaUpdate result;
  check(mlxk_gated_delta_update_from_conv(
      x.get(), q_scale.get(), k_scale.get(), key_heads, value_heads, value_width, eps, a.get(),
      b.get(), a_log.get(), dt_bias.get(), detail::optional_handle(state),
      detail::optional_handle(mask), OutHandle(result.y), OutHandle(result.state)));
  return result;
}

/** Gated RMSNorm over the last axis (weight in x's dtype). */
[[nodiscard]] inline Array gated_rms_norm(const Array &x, const Array &gate, const Array &weight,
                                          float eps) {
  Array out;
  check(mlxk_gated_rms_norm(x.get(), gate.get(), weight.get(), eps, OutHandle(out)));
  return out;
}

/** The gradients of silu_rms_heads' inputs (see silu_rms_heads_vjp). */
struct HeadSplitGradients {
  Array x;        ///< x's shape and dtype
  Array q_scale;  ///< [Dk], x's dtype
  Array k_scale;  ///< [Dk], x's dtype
};

/** The head split's backward pass (mlxk_silu_rms_heads_vjp): the gradients of
 * sum(dq * q) + sum(dk * k) + sum(dv * v) with respect to x, q_scale and k_scale; nullptr
 * cotangents are zeros. The other arguments as silu_rms_heads. On the GPU: MLX ops. */
[[nodiscard]] inline HeadSplitGradients silu_rms_heads_vjp(
    const Array &x, const Array &q_scale, const Array &k_scale, std::int32_t key_heads,
    std::int32_t value_heads, std::int32_t value_width, float eps, const Array *dq,
    const Array *dk, const Array *dv) {
  HeadSplitGradients g;
  check(mlxk_silu_rms_heads_vjp(x.get(), q_scale.get(), k_scale.get(), key_heads, value_heads,
                                value_width, eps, detail::optional_handle(dq),
                                detail::optional_handle(dk), detail::optional_handle(dv),
                                OutHandle(g.x), OutHandle(g.q_scale), OutHandle(g.k_scale)));
  return g;
}

/** The gradients of gated_rms_norm's inputs (see gated_rms_norm_vjp). */
struct NormGradients {
  Array x;       ///< x's shape and dtype
  Array gate;    ///< the gate's shape and dtype
  Array weight;  ///< [D], x's dtype
};

/** The gated norm's backward pass (mlxk_gated_rms_norm_vjp): the gradients of sum(dout * out)
 * with respect to x, gate and weight; a nullptr dout is zeros. On the GPU: MLX ops. */
[[nodiscard]] inline NormGradients gated_rms_norm_vjp(const Array &x, const Array &gate,
                                                      const Array &weight, float eps,
                                                      const Array *dout) {
  NormGradients g;
  check(mlxk_gated_rms_norm_vjp(x.get(), gate.get(), weight.get(), eps,
                                detail::optional_handle(dout), OutHandle(g.x), OutHandle(g.gate),
                                OutHandle(g.weight)));
  return g;
}

// ---------------------------------------------------------------------------------------------
// GLM-5.2 expert-slot layout

/** One expert slot's layout: the C struct's nine fields, plus the library's builder and
 * validator. Plain data, copyable. */
struct GLM52Layout : mlxk_glm52_layout {
  GLM52Layout() noexcept : mlxk_glm52_layout() {}
  explicit GLM52Layout(const mlxk_glm52_layout &raw) noexcept : mlxk_glm52_layout(raw) {}

  /** The canonical layout for Q`bits` (4 or 8) with `group_size` (32, 64 or 128). */
  [[nodiscard]] static GLM52Layout canonical(std::uint64_t hidden, std::uint64_t intermediate,
                                             std::uint32_t bits, std::uint32_t group_size) {
    GLM52Layout layout;
    check(mlxk_glm52_layout_canonical(hidden, intermediate, bits, group_size, &layout));
    return layout;
  }
  /** Throws Error (MLXK_ERR_INVALID_ARGUMENT, naming the field or regions) unless valid. */
  void validate(std::uint32_t bits, std::uint32_t group_size) const {
    check(mlxk_glm52_layout_validate(this, bits, group_size));
  }
  /** validate() as a bool; the reason is dropped. */
  [[nodiscard]] bool is_valid(std::uint32_t bits, std::uint32_t group_size) const noexcept {
    return mlxk_glm52_layout_validate(this, bits, group_size) == MLXK_OK;
  }
  [[nodiscard]] const mlxk_glm52_layout &raw() const noexcept { return *this; }
};

static_assert(sizeof(GLM52Layout) == sizeof(mlxk_glm52_layout),
              "GLM52Layout adds no data to mlxk_glm52_layout");

}  // namespace mlxk

// The calls on a pool of states by slot (mlxk_gated_delta_update_pool, ...): PoolUpdate,
// gated_delta_update_pool, gated_delta_update_packed, gated_delta_verify_pool, ...
#include "mlxkern_pool.hpp"

#endif  // MLXKERN_HPP
