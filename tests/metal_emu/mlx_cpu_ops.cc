// MLX's own CPU ops for the harness (C++20: MLX's headers), behind a plain C interface so the
// C++17 harness needs no MLX header:
//   - sigmoid: beta = sigmoid(b), the value the library computes (src/bridge/mlx_bridge.cc,
//     `sigmoid`) and hands to the recurrence kernels;
//   - exp and astype: references for the shim's exp formula and its float -> bfloat16 / float16
//     conversions (self-tests).
// The library links the same libmlx, so these are the very functions it calls.

#include <mlx/mlx.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>

namespace mx = mlx::core;

namespace {

mx::Dtype to_mlx(int code) {
  switch (code) {
    case 0: return mx::bool_;
    case 3: return mx::int32;
    case 5: return mx::float16;
    case 6: return mx::bfloat16;
    case 7: return mx::float32;
  }
  throw std::invalid_argument("unsupported dtype code");
}

mx::array from_host(const void* data, size_t n, int dtype) {
  const mx::Dtype t = to_mlx(dtype);
  mx::array a = mx::zeros({static_cast<int>(n)}, t, mx::Device::cpu);
  a.eval();
  std::memcpy(a.data<void>(), data, n * mx::size_of(t));
  return a;
}

int to_host(mx::array a, void* out) {
  a = mx::contiguous(a, false, mx::Device::cpu);
  a.eval();
  std::memcpy(out, a.data<void>(), a.nbytes());
  return 0;
}

template <class F>
int guarded(F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::cerr << "metal-emu: MLX: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace

extern "C" int mlxk_emu_mlx_sigmoid(const void* in, size_t n, int dtype, void* out) {
  return guarded([&] { return to_host(mx::sigmoid(from_host(in, n, dtype), mx::Device::cpu), out); });
}

extern "C" int mlxk_emu_mlx_exp_f32(const float* in, size_t n, float* out) {
  return guarded([&] { return to_host(mx::exp(from_host(in, n, 7), mx::Device::cpu), out); });
}

extern "C" int mlxk_emu_mlx_astype(const void* in, size_t n, int from, int to, void* out) {
  return guarded([&] {
    return to_host(mx::astype(from_host(in, n, from), to_mlx(to), mx::Device::cpu), out);
  });
}
