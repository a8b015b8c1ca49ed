// A C++ engine on MLX that uses mlxkern through CMake: the inputs of tests/consumers/reference.c
// made as mlx::core arrays, handed to mlxkern without a copy (mlxk::Array::from_mlx), one decode
// step of the Gated DeltaNet update and one gated RMSNorm, the results taken back as MLX arrays
// (to_mlx) and evaluated by MLX. Prints reference.c's lines (float32 bits in hex).
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "mlxkern.hpp"

namespace mx = mlx::core;

namespace {

std::uint32_t s = 2024;
float next_value() {
  s = s * 1664525u + 1013904223u;
  return static_cast<float>(static_cast<double>(s >> 8) / 16777216.0 * 2.0 - 1.0);
}

mx::array make(const mx::Shape &shape) {
  std::size_t n = 1;
  for (int d : shape) n *= static_cast<std::size_t>(d);
  std::vector<float> data(n);
  for (float &x : data) x = next_value();
  return mx::array(data.begin(), shape, mx::float32);
}

void print(const char *name, mx::array a) {
  mx::eval(a);
  std::vector<std::uint32_t> bits(a.size());
  std::memcpy(bits.data(), a.data<float>(), a.nbytes());
  std::printf("%s %zu", name, bits.size());
  for (std::uint32_t b : bits) std::printf(" %08" PRIx32, b);
  std::printf("\n");
}

}  // namespace

int main() try {
  mlxk::check_abi();
  const mx::Shape qk{2, 1, 2, 32}, vs{2, 1, 4, 8}, gates{2, 1, 4}, heads{4}, st{2, 4, 8, 32},
      rows{3, 16}, width{16};
  mx::array q = make(qk), k = make(qk), v = make(vs), a = make(gates), b = make(gates),
            a_log = make(heads), dt_bias = make(heads), state = make(st);
  mlxk::Array state_h = mlxk::Array::from_mlx(state);
  mlxk::DeltaUpdate step = mlxk::gated_delta_update(
      mlxk::Array::from_mlx(q), mlxk::Array::from_mlx(k), mlxk::Array::from_mlx(v),
      mlxk::Array::from_mlx(a), mlxk::Array::from_mlx(b), mlxk::Array::from_mlx(a_log),
      mlxk::Array::from_mlx(dt_bias), &state_h);
  mx::array x = make(rows), gate = make(rows), weight = make(width);
  mlxk::Array normed = mlxk::gated_rms_norm(mlxk::Array::from_mlx(x), mlxk::Array::from_mlx(gate),
                                            mlxk::Array::from_mlx(weight), 1e-6f);
  // Back in MLX: lazy arrays evaluated by the host's own eval.
  print("y", step.y.to_mlx());
  print("state", step.state.to_mlx());
  print("norm", normed.to_mlx());
  std::fprintf(stderr, "consumer: mlxkern %s, MLX %s\n", mlxk::version().c_str(),
               std::string(mx::version()).c_str());
  return 0;
} catch (const std::exception &e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}
