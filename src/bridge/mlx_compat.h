// The MLX versions the bridge compiles against, and every difference between them, in one
// place (docs/DESIGN.md §2.2, "MLX versions"). The bridge includes this header and never tests
// MLX_VERSION_* itself.
//
// Supported: MLX 0.31.x and 0.32.x (checked here with the pip wheels 0.31.1 and 0.32.4, and with
// the MLX 0.31.1 that mlx-swift 0.31.x compiles into an app). What differs between them:
//   - 0.32 moved buffer ownership into allocator::Data (malloc returns a Data that frees itself;
//     array(Data, shape, dtype)); 0.31 returns a bare allocator::Buffer and the array takes a
//     deleter (array(Buffer, shape, dtype, deleter = allocator::free)).
// Everything else the bridge uses (Primitive, fast::metal_kernel / cuda_kernel, the CPU
// command encoder, donation through copy_shared_buffer / is_donatable, set_data(malloc(n)))
// has the same spelling in both.
//
// Older MLX: 0.30 lacks mx::fast::cuda_kernel's current signature and the CPU encoder's
// dispatch of this form; it is refused below rather than half supported. Newer MLX (0.33+) is
// refused too until the bridge has been built and tested against it: MLX has no stable C++
// ABI, and each minor release has changed at least one type the bridge touches.
#pragma once

#include <cstddef>
#include <utility>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/version.h"

#if !defined(MLX_VERSION_MAJOR) || !defined(MLX_VERSION_MINOR)
#error "mlxkern: mlx/version.h did not define MLX_VERSION_MAJOR/MINOR"
#endif

#define MLXK_MLX_NUMERIC (100000 * MLX_VERSION_MAJOR + 1000 * MLX_VERSION_MINOR)

#if MLXK_MLX_NUMERIC < 31000 || MLXK_MLX_NUMERIC >= 33000
#error "mlxkern supports MLX 0.31.x and 0.32.x (docs/DESIGN.md §2.2): point MLX_DIR at one"
#endif

namespace mlxk::compat {

namespace mx = mlx::core;

// A newly allocated MLX array of `nbytes` bytes with `shape` and `dtype`; `*data` receives the
// address of its (uninitialized) storage.
inline mx::array allocated_array(size_t nbytes, const mx::Shape& shape, mx::Dtype dtype,
                                 void** data) {
  auto storage = mx::allocator::malloc(nbytes);
#if MLXK_MLX_NUMERIC >= 32000
  *data = storage.buffer().raw_ptr();
#else
  *data = storage.raw_ptr();
#endif
  return mx::array(std::move(storage), shape, dtype);
}

}  // namespace mlxk::compat
