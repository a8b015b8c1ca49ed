// Loading and unloading mlxkern at run time while the host's graph still holds its nodes:
// dlopen the library, build a lazy kernel result, hand it to the host (mlxk_array_to_mlx),
// free every handle, dlclose, then evaluate and destroy the result in the host. The library is
// linked -z nodelete (pinned at run time on macOS), so its code stays mapped; without that the
// evaluation jumps into unmapped code. Then: a second, different copy of libmlx loaded into
// the process makes every exchange refuse with MLXK_ERR_UNSUPPORTED.
//
// Usage: host_dlclose <path of libmlxkern.so> <path of a copy of libmlx.so in another folder>
#include <dlfcn.h>
#include <mlx/mlx.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "mlxkern.h"

namespace mx = mlx::core;

static int failures = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      ++failures;                                                              \
      std::fprintf(stderr, "FAIL (%s:%d): %s\n", __FILE__, __LINE__, #cond);   \
    }                                                                          \
  } while (0)

template <class F>
static F sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) {
    std::fprintf(stderr, "FAIL: dlsym %s: %s\n", name, dlerror());
    std::exit(1);
  }
  return reinterpret_cast<F>(p);
}

static bool mapped(const char *needle) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s LIBMLXKERN LIBMLX_COPY\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "FAIL: dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  auto from_mlx = sym<decltype(&mlxk_array_from_mlx)>(lib, "mlxk_array_from_mlx");
  auto to_mlx = sym<decltype(&mlxk_array_to_mlx)>(lib, "mlxk_array_to_mlx");
  auto norm = sym<decltype(&mlxk_gated_rms_norm)>(lib, "mlxk_gated_rms_norm");
  auto array_free = sym<decltype(&mlxk_array_free)>(lib, "mlxk_array_free");
  auto last_error = sym<decltype(&mlxk_last_error)>(lib, "mlxk_last_error");

  auto key = mx::random::key(7);
  auto x = mx::random::normal({4, 256}, mx::float32, 0.0f, 1.0f, key);
  auto gate = mx::random::normal({4, 256}, mx::float32, 0.0f, 1.0f, mx::random::split(key).first);
  auto weight = mx::ones({256});
  mx::eval({x, gate, weight});
  mlxk_array *hx = nullptr, *hg = nullptr, *hw = nullptr, *out = nullptr;
  CHECK(from_mlx(&x, &hx) == MLXK_OK);
  CHECK(from_mlx(&gate, &hg) == MLXK_OK);
  CHECK(from_mlx(&weight, &hw) == MLXK_OK);
  // Two identical lazy results: one evaluated now, one after the dlclose.
  void *early = nullptr, *late = nullptr;
  CHECK(norm(hx, hg, hw, 1e-6f, &out) == MLXK_OK);
  CHECK(to_mlx(out, &early) == MLXK_OK);
  CHECK(array_free(out) == MLXK_OK);
  CHECK(norm(hx, hg, hw, 1e-6f, &out) == MLXK_OK);
  CHECK(to_mlx(out, &late) == MLXK_OK);
  for (auto *h : {out, hx, hg, hw}) CHECK(array_free(h) == MLXK_OK);
  auto *a = static_cast<mx::array *>(early);
  auto *b = static_cast<mx::array *>(late);
  mx::eval(*a);
  CHECK(dlclose(lib) == 0);
  CHECK(mapped("libmlxkern"));  // -z nodelete: still mapped
  mx::eval(*b);
  CHECK(mx::array_equal(*a, *b).item<bool>());
  delete a;
  delete b;  // destroys the kernel's primitive, whose code is in the closed library
  std::printf("host_dlclose: lazy result evaluated and destroyed after dlclose\n");

  // A second libmlx (another file) in the process: the exchange refuses.
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  from_mlx = sym<decltype(&mlxk_array_from_mlx)>(lib, "mlxk_array_from_mlx");
  last_error = sym<decltype(&mlxk_last_error)>(lib, "mlxk_last_error");
  mlxk_array *h = nullptr;
  CHECK(from_mlx(&x, &h) == MLXK_OK);
  array_free = sym<decltype(&mlxk_array_free)>(lib, "mlxk_array_free");
  CHECK(array_free(h) == MLXK_OK);
  void *second = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!second) {
    std::fprintf(stderr, "FAIL: dlopen %s: %s\n", argv[2], dlerror());
    return 1;
  }
  h = nullptr;
  CHECK(from_mlx(&x, &h) == MLXK_ERR_UNSUPPORTED);
  CHECK(h == nullptr);
  CHECK(std::strstr(last_error(), "2 copies of libmlx") != nullptr);
  std::printf("host_dlclose: with a second libmlx loaded: %s\n", last_error());
  std::printf("host_dlclose: %s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
