// The MLX versions the bridge compiles against, and every difference between them, in one
// place (docs/DESIGN.md §2.2, "MLX versions"). The bridge includes this header and never tests
// MLX_VERSION_* itself.
//
// Supported: MLX 0.30.x, 0.31.x and 0.32.x. CI builds against the pip wheels 0.32.4 (every
// suite) and 0.31.1 (the C ABI and interop suites); 0.30.0 was built and passed the Rust suite
// here; mlx-swift 0.31.x compiles MLX 0.31.1 into the app. What differs between them:
//   - 0.32 moved buffer ownership into allocator::Data (malloc returns a Data that frees itself;
//     array(Data, shape, dtype)); 0.30 and 0.31 return a bare allocator::Buffer and the array
//     takes a deleter (array(Buffer, shape, dtype, deleter = allocator::free)).
//   - 0.32 carries an exception thrown by a task on the CPU stream's thread to the eval that
//     waits for it (the array's event holds it). 0.30 and 0.31 have no handler there: the
//     exception terminates the process. So there a task's error is caught in the task, parked,
//     and thrown by the library's own next eval (run_task / rethrow_task_error below); the
//     kernel has already filled its outputs with NaN bytes (docs/DESIGN.md §2.2). A task that
//     finds an earlier task's error (stream_failure: 0.32 reads the stream's, older ones the
//     parked one) runs no kernel on that task's unwritten outputs.
// Everything else the bridge uses (Primitive, fast::metal_kernel / cuda_kernel, the CPU
// command encoder, donation through copy_shared_buffer / is_donatable, set_data(malloc(n)))
// has the same spelling in all three.
//
// Where the range ends. 0.29 compiles, but its own ops compute the gates g and beta with
// other rounding than the CPU kernel's fused gates (the test fused_gates_equal_mlx_bit_for_bit
// fails: mlx-lm's numbers on that MLX would need 0.29's formulas); 0.28 and older lack
// fast::cuda_kernel and fast::CustomKernelFunction. 0.33 and newer are refused until the
// bridge has been built and tested against them: MLX has no stable C++ ABI, and its minor
// releases change types the bridge touches.
#pragma once

#include <cstddef>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cuda/cuda.h"
#include "mlx/backend/metal/metal.h"
#include "mlx/scheduler.h"
#include "mlx/stream.h"
#include "mlx/transforms.h"
#include "mlx/version.h"

#if !defined(MLX_VERSION_MAJOR) || !defined(MLX_VERSION_MINOR)
#error "mlxkern: mlx/version.h did not define MLX_VERSION_MAJOR/MINOR"
#endif

#define MLXK_MLX_NUMERIC (100000 * MLX_VERSION_MAJOR + 1000 * MLX_VERSION_MINOR)

#if MLXK_MLX_NUMERIC < 30000 || MLXK_MLX_NUMERIC >= 33000
#error "mlxkern supports MLX 0.30.x to 0.32.x (docs/DESIGN.md §2.2): point MLX_DIR at one"
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

#if MLXK_MLX_NUMERIC >= 32000
// Runs a task on MLX's CPU stream thread; MLX hands what it throws to the waiting eval.
template <class Task>
void run_task(Task&& task) {
  task();
}
inline void rethrow_task_error() {}
// Waits until every task of stream `s` has run; throws the first error one raised.
inline void finish_stream(mx::Stream s) {
  mx::synchronize(s);
  mx::scheduler::check_error(s);
}
// After an eval failed: MLX's CPU encoder counts a task, then queues it and, separately, the
// task that uncounts it; the queueing throws a pending error of the stream on the thread that
// created MLX's scheduler, and the uncounting task is then never queued. Where MLX has no GPU
// (every active task is a CPU one), once stream `s` has run everything queued on it, what is
// still counted is such a leftover: uncounted here, or an eval waiting for a count to fall
// would wait for good.
inline void settle_after_failure(mx::Stream s) {
  static const bool cpu_only = !mx::metal::is_available() && !mx::cu::is_available();
  if (!cpu_only) return;
  try {
    mx::synchronize(s);
  } catch (const std::exception&) {
    // The error this settles after, or one raised before it: reported already.
  }
  while (mx::scheduler::n_active_tasks() > 0) mx::scheduler::notify_task_completion(s);
}
// The error an earlier task of stream `s` raised and no eval has reported yet ("" if none).
// MLX keeps the first one; reading it clears it, and the caller's task raises it again.
inline std::string stream_failure(mx::Stream s) {
  try {
    mx::scheduler::check_error(s);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}
#else
// The first error of a task not yet reported (0.30 and 0.31: see above).
inline std::mutex& parked_mutex() {
  static std::mutex mutex;
  return mutex;
}
inline std::string& parked_error() {
  static std::string message;
  return message;
}

template <class Task>
void run_task(Task&& task) {
  try {
    task();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(parked_mutex());
    if (parked_error().empty()) parked_error() = e.what();
  } catch (...) {
    std::lock_guard<std::mutex> lock(parked_mutex());
    if (parked_error().empty()) parked_error() = "mlxkern: unknown error in a CPU kernel task";
  }
}

// The error an earlier task parked and no eval has reported yet ("" if none).
inline std::string stream_failure(mx::Stream) {
  std::lock_guard<std::mutex> lock(parked_mutex());
  return parked_error();
}

// Throws (and clears) the parked error, if any; called after the library's evals.
inline void rethrow_task_error() {
  std::string message;
  {
    std::lock_guard<std::mutex> lock(parked_mutex());
    message.swap(parked_error());
  }
  if (!message.empty()) throw std::runtime_error(message);
}

// Waits until every task of stream `s` has run; throws (and clears) the error one parked.
inline void finish_stream(mx::Stream s) {
  mx::synchronize(s);
  rethrow_task_error();
}
// A failed task's error is parked here, never MLX's: nothing to put right.
inline void settle_after_failure(mx::Stream) {}
#endif

}  // namespace mlxk::compat
