// The C++ half of the bridge: array plumbing, the few MLX ops the kernels need, the GPU
// launches, and the CPU primitive whose eval_cpu hands the buffers to a Rust kernel. The host
// exchange and the scan for loaded MLXs are in host.cc, the backward passes as MLX ops in
// vjp_ops.cc.
#include "src/bridge/mlx_bridge.h"
#include "src/bridge/mlx_compat.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <typeinfo>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/backend/cuda/cuda.h"
#include "mlx/backend/metal/metal.h"
#include "mlx/device.h"
#include "mlx/fast.h"
#include "mlx/memory.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"
#include "mlx/transforms.h"
#include "mlx/version.h"
#include "mlxkern/src/bridge/mod.rs.h"


namespace mx = mlx::core;

namespace mlxk {
namespace {

// mlxk_dtype codes (the C ABI's numbering) to and from MLX dtypes.
mx::Dtype to_mlx(int32_t code) {
  switch (code) {
    case 0: return mx::bool_;
    case 1: return mx::uint8;
    case 2: return mx::int8;
    case 3: return mx::int32;
    case 4: return mx::uint32;
    case 5: return mx::float16;
    case 6: return mx::bfloat16;
    case 7: return mx::float32;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(code));
}

int32_t from_mlx(mx::Dtype dtype) {
  switch (dtype.val()) {
    case mx::Dtype::Val::bool_: return 0;
    case mx::Dtype::Val::uint8: return 1;
    case mx::Dtype::Val::int8: return 2;
    case mx::Dtype::Val::int32: return 3;
    case mx::Dtype::Val::uint32: return 4;
    case mx::Dtype::Val::float16: return 5;
    case mx::Dtype::Val::bfloat16: return 6;
    case mx::Dtype::Val::float32: return 7;
    default: return -1;
  }
}

mx::Shape to_shape(rust::Slice<const int32_t> dims) {
  return mx::Shape(dims.begin(), dims.end());
}

std::vector<mx::Shape> output_shapes(const rust::Vec<int32_t>& dims,
                                     const rust::Vec<uint32_t>& ndims) {
  std::vector<mx::Shape> shapes;
  size_t at = 0;
  for (auto n : ndims) {
    shapes.emplace_back(dims.begin() + at, dims.begin() + at + n);
    at += n;
  }
  return shapes;
}

// A freshly allocated, owned, row-contiguous array of `shape` (contents uninitialized).
mx::array allocated(const mx::Shape& shape, mx::Dtype dtype, void** data) {
  size_t count = 1;
  for (auto d : shape) count *= static_cast<size_t>(d);
  return compat::allocated_array(std::max<size_t>(count * dtype.size(), 1), shape, dtype, data);
}

// `mlxk_eval_fault`'s answers (crate::seams): the node's eval raises, or its task does.
constexpr uint8_t kFaultAtEval = 1;
constexpr uint8_t kFaultInTask = 2;

// What the library's primitives share: the kernel code `kernel` (node::Kernel), whose C
// function names messages, and the transforms they refuse (forward mode and batching).
class MlxkernPrimitive : public mx::Primitive {
 public:
  MlxkernPrimitive(mx::Stream stream, uint32_t kernel) : mx::Primitive(stream), kernel_(kernel) {}

  std::vector<mx::array> jvp(const std::vector<mx::array>&, const std::vector<mx::array>&,
                             const std::vector<int>&) override {
    throw std::invalid_argument("mlxkern: jvp is not implemented for " + kernel_name() +
                                "; use vjp (mx::vjp, mx::grad, mx::value_and_grad)");
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(const std::vector<mx::array>&,
                                                           const std::vector<int>&) override {
    throw std::invalid_argument("mlxkern: vmap is not implemented for " + kernel_name() +
                                "; call it on the batched arrays (its leading dimensions are "
                                "batch dimensions)");
  }

 protected:
  std::string kernel_name() const { return std::string(mlxk_kernel_name(kernel_)); }
  uint32_t kernel() const { return kernel_; }

 private:
  uint32_t kernel_;
};

// The MLX primitive behind every CPU kernel: lazy in the graph, and at eval it runs the Rust
// kernel named by `launch.kernel` on the CPU stream's thread.
class RustCpuKernel : public MlxkernPrimitive {
 public:
  RustCpuKernel(mx::Stream stream, CpuLaunch launch)
      : MlxkernPrimitive(stream, launch.kernel), launch_(std::move(launch)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const uint8_t fault = mlxk_eval_fault();
    if (fault == kFaultAtEval) {
      throw std::runtime_error("mlxkern: injected fault: evaluating " + kernel_name() +
                               " failed before its outputs were allocated");
    }
    std::string failed;
    if (fault == kFaultInTask) {
      failed = "mlxkern: injected fault: " + kernel_name() + " raised before its kernel ran";
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& in = inputs[i];
      if (in.size() != 0 && (!in.flags().row_contiguous || in.data_size() != in.size())) {
        throw std::runtime_error("mlxkern CPU kernel: input " + std::to_string(i) +
                                 " is not a row-contiguous array");
      }
    }
    // make_arrays gives every output its own copy of the input list, so each input is held
    // once per output and is never donatable. MLX drops the siblings' copies after this eval
    // anyway (array::detach); dropping them now lets the new state take over the old buffer.
    // The evaluated output's own list (`inputs`) stays: MLX keeps those buffers alive until
    // the dispatched task has run.
    std::vector<size_t> cleared;
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (&outputs[o].inputs() != &inputs) {
        outputs[o].inputs().clear();
        cleared.push_back(o);
      }
    }
    // Whatever raises from here on (an allocation, MLX's scheduler reporting an earlier
    // task's error) leaves the node as it was: the siblings get their lists back, so each
    // output can still be evaluated again and still reaches the inputs it was given (a
    // donated pool is not lost: docs/serving.md, "Faults"). Outputs take over inputs only
    // after every allocation has succeeded.
    try {
      dispatch(inputs, outputs, std::move(failed));
    } catch (...) {
      for (auto o : cleared) outputs[o].inputs() = inputs;
      throw;
    }
  }

  void dispatch(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                std::string failed) {
    // A node that updates a state or a pool starts only once the tasks computing its inputs
    // in this evaluation have run and none failed: an input a failed task left holds no valid
    // data, and the kernel must not write a pool (the caller's, taken over) from it. A failure
    // raises here, before any output has a buffer. Inputs computed before this evaluation
    // (available) need no wait. Where MLX has a GPU, a CPU task may be waiting for GPU work
    // this evaluation has not committed yet, and waiting for it here would never end: there
    // the task's own check (stream_failure, below) stands alone.
    static const bool cpu_only_mlx = !mx::metal::is_available() && !mx::cu::is_available();
    auto writes_state = [](int32_t from) { return from >= 0; };
    auto computing = [](const mx::array& in) {
      return in.status() != mx::array::Status::available;
    };
    if (cpu_only_mlx &&
        std::any_of(launch_.donate_from.begin(), launch_.donate_from.end(), writes_state) &&
        std::any_of(inputs.begin(), inputs.end(), computing)) {
      compat::finish_stream(stream());
    }
    std::vector<int32_t> aliased(outputs.size(), -1);
    for (size_t o = 0; o < outputs.size(); ++o) {
      auto& out = outputs[o];
      int32_t from = o < launch_.donate_from.size() ? launch_.donate_from[o] : -1;
      if (from >= 0 && static_cast<size_t>(from) < inputs.size() &&
          std::find(aliased.begin(), aliased.end(), from) == aliased.end() &&
          inputs[from].is_donatable() && inputs[from].nbytes() == out.nbytes() &&
          inputs[from].itemsize() == out.itemsize() && out.nbytes() != 0) {
        aliased[o] = from;
      } else {
        out.set_data(mx::allocator::malloc(std::max<size_t>(out.nbytes(), 1)));
      }
    }
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (aliased[o] >= 0) outputs[o].copy_shared_buffer(inputs[aliased[o]]);
    }
    // What the dispatched task keeps alive: the inputs, except those whose buffer an output
    // took over. Such a buffer lives on in that output (and, while this task is pending, MLX
    // retains it for siblings that are not the evaluated array); holding the old input here
    // too would keep the buffer's use count at 2 until the task has run, so a chained next
    // step (built before the stream thread catches up) could not take it over in turn.
    std::vector<mx::array> keep_alive;
    keep_alive.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (std::find(aliased.begin(), aliased.end(), static_cast<int32_t>(i)) == aliased.end()) {
        keep_alive.push_back(inputs[i]);
      }
    }
    auto& encoder = mx::cpu::get_command_encoder(stream());
    std::vector<size_t> in_ptrs, in_bytes, out_ptrs, out_bytes;
    for (const auto& in : inputs) {
      encoder.set_input_array(in);
      in_ptrs.push_back(in.size() ? reinterpret_cast<size_t>(in.data<uint8_t>()) : 0);
      in_bytes.push_back(in.nbytes());
    }
    for (auto& out : outputs) {
      encoder.set_output_array(out);
      out_ptrs.push_back(reinterpret_cast<size_t>(out.data<uint8_t>()));
      out_bytes.push_back(out.nbytes());
    }
    encoder.dispatch([kernel = launch_.kernel,
                      params = std::vector<int64_t>(launch_.params.begin(), launch_.params.end()),
                      in_ptrs = std::move(in_ptrs), in_bytes = std::move(in_bytes),
                      out_ptrs = std::move(out_ptrs), out_bytes = std::move(out_bytes),
                      aliased = std::move(aliased), keep_alive = std::move(keep_alive),
                      donate_from = std::vector<int32_t>(launch_.donate_from.begin(),
                                                         launch_.donate_from.end()),
                      failed = std::move(failed), stream = stream()]() {
      (void)keep_alive;  // the input buffers outlive the kernel whatever MLX's bookkeeping
      // A Rust error (or a caught panic) arrives as rust::Error, which reaches the eval
      // (compat::run_task: MLX 0.32 re-throws it there, on 0.31 the library's eval does).
      compat::run_task([&] {
        // An earlier task of this stream that failed (an input of this node, most likely)
        // left its outputs unwritten: the kernel does not run on them, the node fails with
        // that error instead (a donated pool keeps every state it had).
        std::string why = failed.empty() ? compat::stream_failure(stream) : failed;
        mlxk_cpu_kernel(kernel, rust::Slice<const int64_t>(params.data(), params.size()),
                        rust::Slice<const size_t>(in_ptrs.data(), in_ptrs.size()),
                        rust::Slice<const size_t>(in_bytes.data(), in_bytes.size()),
                        rust::Slice<const size_t>(out_ptrs.data(), out_ptrs.size()),
                        rust::Slice<const size_t>(out_bytes.data(), out_bytes.size()),
                        rust::Slice<const int32_t>(aliased.data(), aliased.size()),
                        rust::Slice<const int32_t>(donate_from.data(), donate_from.size()),
                        rust::Str(why.data(), why.size()));
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxkern CPU kernel scheduled on a GPU stream");
  }

  // MLX's autograd. A kernel's gradients come from its backward node (node::vjp_plan, via
  // mlxk_vjp_launch), whose inputs are the forward's (`primals`, in the node's order) followed
  // by the cotangents of all its outputs, each in the dtype the plan names. `gradients` says
  // which backward output is the gradient of each forward input (-1: none, zeros).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override {
    (void)outputs;
    std::vector<int32_t> dtypes;
    for (const auto& c : cotangents) dtypes.push_back(from_mlx(c.dtype()));
    VjpLaunch plan;
    try {
      plan = mlxk_vjp_launch(
          launch_.kernel, rust::Slice<const int64_t>(launch_.params.data(), launch_.params.size()),
          rust::Slice<const int32_t>(dtypes.data(), dtypes.size()));
    } catch (const rust::Error& e) {
      throw std::invalid_argument(e.what());
    }
    if (plan.gradients.size() != primals.size() ||
        plan.cotangent_dtypes.size() != cotangents.size()) {
      throw std::invalid_argument("mlxkern: the backward node of " + kernel_name() +
                                  " does not fit its forward's inputs and outputs");
    }
    auto s = stream();
    std::vector<mx::array> inputs(primals.begin(), primals.end());
    for (size_t i = 0; i < cotangents.size(); ++i) {
      auto c = mx::astype(cotangents[i], to_mlx(plan.cotangent_dtypes[i]), s);
      inputs.push_back(mx::contiguous(c, false, s));
    }
    std::vector<mx::Dtype> out_dtypes;
    for (auto code : plan.launch.output_dtypes) out_dtypes.push_back(to_mlx(code));
    auto grads = mx::array::make_arrays(
        mlxk::output_shapes(plan.launch.output_dims, plan.launch.output_ndims), out_dtypes,
        std::make_shared<RustCpuKernel>(s, plan.launch), inputs);
    std::vector<mx::array> result;
    for (int arg : argnums) {
      int32_t g = plan.gradients[arg];
      result.push_back(g >= 0 ? grads[g] : mx::zeros_like(primals[arg], s));
    }
    return result;
  }

  const char* name() const override { return "MlxkernCpuKernel"; }

 private:
  CpuLaunch launch_;
};

// A GPU kernel node (mx::fast::metal_kernel / cuda_kernel) with a gradient: MLX's custom-kernel
// primitive has no vjp, so the library's launches wrap it. Evaluation is the wrapped
// primitive's, unchanged; MLX's autograd asks mlxk_gpu_vjp (Rust) for the gradients of every
// input, given the forward's description (`kernel`, `params`: node::gpu_vjp).
class GpuKernelWithVjp : public MlxkernPrimitive {
 public:
  GpuKernelWithVjp(std::shared_ptr<mx::Primitive> kernel, uint32_t vjp_kernel,
                   std::vector<int64_t> params)
      : MlxkernPrimitive(kernel->stream(), vjp_kernel),
        launched_(std::move(kernel)),
        params_(std::move(params)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    launched_->eval_cpu(inputs, outputs);
  }
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    launched_->eval_gpu(inputs, outputs);
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override {
    (void)outputs;
    ArrayList p{primals}, c{cotangents};
    std::unique_ptr<ArrayList> grads;
    try {
      grads = mlxk_gpu_vjp(kernel(),
                           rust::Slice<const int64_t>(params_.data(), params_.size()), p, c);
    } catch (const rust::Error& e) {
      throw std::invalid_argument(e.what());
    }
    if (grads->items.size() != primals.size()) {
      throw std::invalid_argument("mlxkern: the GPU backward of " + kernel_name() +
                                  " does not fit its forward's inputs");
    }
    std::vector<mx::array> result;
    for (int arg : argnums) result.push_back(grads->items[arg]);
    return result;
  }

  const char* name() const override { return "MlxkernGpuKernel"; }

 private:
  std::shared_ptr<mx::Primitive> launched_;  // MLX's CustomKernel
  std::vector<int64_t> params_;
};

// The outputs of a GPU kernel node, rebuilt on a GpuKernelWithVjp of the same primitive and
// inputs when `vjp_kernel` is not 0 (the original nodes are dropped unevaluated).
std::vector<mx::array> with_vjp(std::vector<mx::array> outs, uint32_t vjp_kernel,
                                rust::Slice<const int64_t> params) {
  if (vjp_kernel == 0 || outs.empty() || !outs[0].has_primitive()) return outs;
  auto kernel = outs[0].primitive_ptr();
  auto inputs = outs[0].inputs();
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  for (const auto& o : outs) {
    shapes.push_back(o.shape());
    dtypes.push_back(o.dtype());
  }
  return mx::array::make_arrays(
      std::move(shapes), dtypes,
      std::make_shared<GpuKernelWithVjp>(kernel, vjp_kernel,
                                         std::vector<int64_t>(params.begin(), params.end())),
      inputs);
}

}  // namespace

mx::Stream stream_for(bool gpu) {
  return mx::default_stream(gpu ? mx::Device(mx::Device::gpu) : mx::Device(mx::Device::cpu));
}

std::unique_ptr<Array> array_from_bytes(rust::Slice<const uint8_t> data,
                                        rust::Slice<const int32_t> shape, int32_t dtype) {
  void* dst = nullptr;
  auto a = allocated(to_shape(shape), to_mlx(dtype), &dst);
  if (data.size() != a.nbytes()) throw std::invalid_argument("array_from_bytes: size mismatch");
  if (data.size()) std::memcpy(dst, data.data(), data.size());
  return std::make_unique<Array>(std::move(a));
}

std::unique_ptr<Array> array_zeros(rust::Slice<const int32_t> shape, int32_t dtype) {
  void* dst = nullptr;
  auto a = allocated(to_shape(shape), to_mlx(dtype), &dst);
  std::memset(dst, 0, a.nbytes());
  return std::make_unique<Array>(std::move(a));
}

std::unique_ptr<Array> array_share(const Array& a) { return std::make_unique<Array>(a); }

size_t array_ndim(const Array& a) { return a.ndim(); }
int32_t array_dim(const Array& a, size_t axis) { return a.shape()[axis]; }
int32_t array_dtype(const Array& a) { return from_mlx(a.dtype()); }
size_t array_size(const Array& a) { return a.size(); }
size_t array_nbytes(const Array& a) { return a.nbytes(); }

size_t array_address(const Array& a) {
  if (a.size() == 0 || !a.is_available()) return 0;
  return reinterpret_cast<size_t>(a.data<uint8_t>());
}

namespace {
// `eval` of `a`; after a failure, MLX's count of active tasks is put right before the error
// goes on (compat::settle_after_failure: MLX 0.32 can leave counts behind a failed CPU task,
// and a later eval would then wait for good).
void eval_or_settle(mx::array& a) {
  try {
    mx::eval(a);
    compat::rethrow_task_error();
  } catch (...) {
    compat::settle_after_failure(stream_for(false));
    throw;
  }
}
}  // namespace

void array_eval(const Array& a) {
  mx::array copy = a;
  eval_or_settle(copy);
}

size_t array_id(const Array& a) { return static_cast<size_t>(a.id()); }

std::unique_ptr<Array> array_as_given(const Array& a, size_t given) {
  // The nodes between a step's result and the pool it was given (a contiguous copy, the GPU's
  // scatter, an earlier step chained on the same pool) are few; the walk stops at evaluated
  // nodes, which keep no inputs.
  std::vector<mx::array> todo{a};
  std::unordered_set<uintptr_t> seen;
  while (!todo.empty() && seen.size() < 4096) {
    mx::array x = std::move(todo.back());
    todo.pop_back();
    if (x.id() == given) return std::make_unique<Array>(x);
    if (!seen.insert(x.id()).second) continue;
    for (const auto& in : x.inputs()) todo.push_back(in);
  }
  if (a.data_shared_ptr() == nullptr) return std::make_unique<Array>(a);
  // The node ran (its task is done: it failed, or the eval stopped after it) and MLX left its
  // outputs unscheduled: the pool, as its task left it, as an array of its own, so that no
  // later evaluation runs the node again.
  void* unused = nullptr;
  auto held = compat::allocated_array(1, a.shape(), a.dtype(), &unused);
  held.copy_shared_buffer(a);
  return std::make_unique<Array>(std::move(held));
}

void array_read(const Array& a, rust::Slice<uint8_t> dst) {
  if (dst.size() != a.nbytes()) throw std::invalid_argument("array_read: size mismatch");
  mx::array c = a;
  eval_or_settle(c);
  if (a.size() && (!c.flags().row_contiguous || c.data_size() != c.size())) {
    c = mx::contiguous(c, false, mx::Device(mx::Device::cpu));
    mx::eval(c);
  }
  if (dst.size()) std::memcpy(dst.data(), c.data<uint8_t>(), dst.size());
}

std::unique_ptr<Array> array_astype(const Array& a, int32_t dtype, bool gpu) {
  return std::make_unique<Array>(mx::astype(a, to_mlx(dtype), stream_for(gpu)));
}

std::unique_ptr<Array> array_stop_gradient(const Array& a, bool gpu) {
  return std::make_unique<Array>(mx::stop_gradient(a, stream_for(gpu)));
}

std::unique_ptr<ArrayList> list_new() { return std::make_unique<ArrayList>(); }
void list_push(ArrayList& list, const Array& a) { list.items.push_back(a); }
size_t list_len(const ArrayList& list) { return list.items.size(); }
std::unique_ptr<Array> list_get(const ArrayList& list, size_t i) {
  return std::make_unique<Array>(list.items.at(i));
}

std::unique_ptr<Array> compute_g(const Array& a_log, const Array& a, const Array& dt_bias,
                                 bool gpu) {
  // mlx-lm gated_delta.compute_g: exp(-exp(A_log.astype(f32)) * softplus(a + dt_bias)), with
  // softplus(x) = logaddexp(x, 0) and the 0 a weak scalar of x's dtype. Same ops, same dtypes.
  auto s = stream_for(gpu);
  auto decay_rate = mx::negative(mx::exp(mx::astype(a_log, mx::float32, s), s), s);
  auto x = mx::add(a, dt_bias, s);
  auto softplus = mx::logaddexp(x, mx::array(0.0f, x.dtype()), s);
  return std::make_unique<Array>(mx::exp(mx::multiply(decay_rate, softplus, s), s));
}

std::unique_ptr<Array> sigmoid(const Array& x, bool gpu) {
  return std::make_unique<Array>(mx::sigmoid(x, stream_for(gpu)));
}

std::unique_ptr<Array> pool_scatter(const Array& pool, const Array& slots, const Array& states,
                                    bool gpu) {
  // MLX's scatter takes updates shaped as the indices followed by the slice (1 along axis 0).
  auto shape = states.shape();
  shape.insert(shape.begin() + 1, 1);
  auto s = stream_for(gpu);
  return std::make_unique<Array>(
      mx::scatter(pool, {slots}, mx::reshape(states, shape, s), std::vector<int>{0}, s));
}

std::unique_ptr<Array> take_tokens(const Array& a, const Array& tokens, bool gpu) {
  // a [1, T, ...] as [T, ...]; MLX's take along axis 0 puts the indices' shape in front.
  auto s = stream_for(gpu);
  auto shape = a.shape();
  mx::Shape rest(shape.begin() + 1, shape.end());
  return std::make_unique<Array>(mx::take(mx::reshape(a, rest, s), tokens, 0, s));
}

namespace {
// Whether `a` is known now to arrive at eval as one row-contiguous buffer: evaluated and
// row-contiguous, or an output of this library's CPU kernels (always contiguous).
bool known_contiguous(const mx::array& a) {
  if (a.is_available()) return a.flags().row_contiguous && a.data_size() == a.size();
  return a.has_primitive() && typeid(a.primitive()) == typeid(RustCpuKernel);
}
}  // namespace

std::unique_ptr<ArrayList> cpu_kernel_op(const CpuLaunch& launch, const ArrayList& inputs) {
  std::vector<mx::Dtype> dtypes;
  for (auto code : launch.output_dtypes) dtypes.push_back(to_mlx(code));
  auto shapes = output_shapes(launch.output_dims, launch.output_ndims);
  auto stream = stream_for(false);
  // A host's arrays may be views (transposed, broadcast, offset) or lazy nodes whose layout is
  // known only at eval; the kernels read row-contiguous buffers, so those pass through
  // mx::contiguous in the graph (lazy, and sharing the buffer when it already is contiguous).
  // libmlx exports only its API, so the layout cannot be fixed inside eval_cpu instead.
  std::vector<mx::array> ins;
  ins.reserve(inputs.items.size());
  for (const auto& a : inputs.items) {
    ins.push_back(known_contiguous(a) ? a : mx::contiguous(a, false, stream));
  }
  auto primitive = std::make_shared<RustCpuKernel>(stream, launch);
  auto out = std::make_unique<ArrayList>();
  out->items = mx::array::make_arrays(std::move(shapes), dtypes, primitive, ins);
  return out;
}

namespace {
// A launch's template arguments, integers then dtypes, as MLX takes them.
std::vector<std::pair<std::string, mx::fast::TemplateArg>> template_args(const MetalLaunch& launch) {
  std::vector<std::pair<std::string, mx::fast::TemplateArg>> args;
  for (size_t i = 0; i < launch.template_int_names.size(); ++i) {
    args.emplace_back(std::string(launch.template_int_names[i]),
                      static_cast<int>(launch.template_int_values[i]));
  }
  for (size_t i = 0; i < launch.template_dtype_names.size(); ++i) {
    args.emplace_back(std::string(launch.template_dtype_names[i]),
                      to_mlx(launch.template_dtype_values[i]));
  }
  return args;
}

std::vector<mx::Dtype> output_dtypes(const MetalLaunch& launch) {
  std::vector<mx::Dtype> dtypes;
  for (auto code : launch.output_dtypes) dtypes.push_back(to_mlx(code));
  return dtypes;
}

std::vector<std::string> strings(const rust::Vec<rust::String>& list) {
  return std::vector<std::string>(list.begin(), list.end());
}
}  // namespace

// The kernel objects MLX's metal_kernel / cuda_kernel make, kept per launch: making one scans
// and copies the source, which a decode step would otherwise pay on every call. One map per
// call site (Metal, CUDA). Guarded by the library's MLX lock.
template <class Make>
const mx::fast::CustomKernelFunction& cached_kernel(const MetalLaunch& launch, Make make) {
  static auto& kernels = *new std::unordered_map<std::string, mx::fast::CustomKernelFunction>();
  // A launch's name fixes its text (kernel, variant, "_gates", input dtypes: src/ops); the
  // sizes are a cheap guard. Hashing the ~14 KB of text instead costs microseconds per call.
  std::string key(launch.name);
  key += '/';
  key += std::to_string(launch.header.size());
  key += '/';
  key += std::to_string(launch.source.size());
  auto found = kernels.find(key);
  if (found == kernels.end()) found = kernels.emplace(key, make()).first;
  return found->second;
}

namespace {
// The primitive of a kept launch's first node (its CustomKernel, or the GpuKernelWithVjp around
// it) with its outputs' shapes and dtypes, by (launch id, stream). MLX's kernel function
// regenerates the kernel's whole text on every call (names, signature, template arguments) and
// the primitive copies it; a primitive is immutable and evaluates from its inputs alone (MLX's
// compile shares one across calls the same way), so later nodes of the launch share it.
// Guarded by the library's MLX lock.
struct KeptNode {
  std::shared_ptr<mx::Primitive> primitive;
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  size_t inputs;
};

std::unordered_map<uint64_t, KeptNode>& kept_nodes() {
  static auto& kept = *new std::unordered_map<uint64_t, KeptNode>();
  return kept;
}

// Launch ids are far below 2^48; streams far below 2^16.
uint64_t kept_key(uint64_t id, const mx::Stream& s) {
  return (id << 16) ^ static_cast<uint64_t>(s.index & 0xffff);
}

// The outputs of a node of launch `id` on stream `s` when its primitive is kept, else nullptr.
std::unique_ptr<ArrayList> from_kept(uint64_t id, const mx::Stream& s, const ArrayList& inputs) {
  if (id == 0) return nullptr;
  auto& kept = kept_nodes();
  auto found = kept.find(kept_key(id, s));
  if (found == kept.end() || found->second.inputs != inputs.items.size()) return nullptr;
  auto out = std::make_unique<ArrayList>();
  out->items = mx::array::make_arrays(found->second.shapes, found->second.dtypes,
                                      found->second.primitive, inputs.items);
  return out;
}

// Keeps the primitive of `outs` (a launch's node) for later calls.
void keep(uint64_t id, const mx::Stream& s, const std::vector<mx::array>& outs, size_t inputs) {
  if (id == 0 || outs.empty() || !outs[0].has_primitive()) return;
  auto& kept = kept_nodes();
  if (kept.size() >= 512) kept.clear();  // as the launches behind them (src/ops), bounded
  KeptNode node{outs[0].primitive_ptr(), {}, {}, inputs};
  for (const auto& o : outs) {
    node.shapes.push_back(o.shape());
    node.dtypes.push_back(o.dtype());
  }
  kept[kept_key(id, s)] = std::move(node);
}
}  // namespace

std::unique_ptr<ArrayList> metal_kernel_op(const MetalLaunch& launch, uint64_t id,
                                           const ArrayList& inputs, bool gpu, uint32_t vjp_kernel,
                                           rust::Slice<const int64_t> vjp_params) {
  auto stream = stream_for(gpu);
  if (auto out = from_kept(id, stream, inputs)) return out;
  const auto& kernel = cached_kernel(launch, [&] {
    return mx::fast::metal_kernel(std::string(launch.name), strings(launch.input_names),
                                  strings(launch.output_names), std::string(launch.source),
                                  std::string(launch.header),
                                  /*ensure_row_contiguous=*/true, /*atomic_outputs=*/false);
  });
  auto out = std::make_unique<ArrayList>();
  out->items = kernel(inputs.items, output_shapes(launch.output_dims, launch.output_ndims),
                      output_dtypes(launch),
                      {launch.grid[0], launch.grid[1], launch.grid[2]},
                      {launch.threadgroup[0], launch.threadgroup[1], launch.threadgroup[2]},
                      template_args(launch), std::nullopt, false, stream);
  out->items = with_vjp(std::move(out->items), vjp_kernel, vjp_params);
  keep(id, stream, out->items, inputs.items.size());
  return out;
}

std::unique_ptr<ArrayList> cuda_kernel_op(const MetalLaunch& launch, uint64_t id,
                                          const ArrayList& inputs, bool gpu, uint32_t vjp_kernel,
                                          rust::Slice<const int64_t> vjp_params) {
  auto stream = stream_for(gpu);
  if (auto out = from_kept(id, stream, inputs)) return out;
  auto shapes = output_shapes(launch.output_dims, launch.output_ndims);
  auto dtypes = output_dtypes(launch);
  auto out = std::make_unique<ArrayList>();
  if (launch.grid[0] == 0 || launch.grid[1] == 0 || launch.grid[2] == 0) {
    // CUDA refuses a launch of zero blocks; every output of such a launch has no elements.
    for (size_t i = 0; i < shapes.size(); ++i) {
      out->items.push_back(mx::zeros(shapes[i], dtypes[i], stream_for(gpu)));
    }
    return out;
  }
  const auto& kernel = cached_kernel(launch, [&] {
    return mx::fast::cuda_kernel(std::string(launch.name), strings(launch.input_names),
                                 strings(launch.output_names), std::string(launch.source),
                                 std::string(launch.header),
                                 /*ensure_row_contiguous=*/true, /*shared_memory=*/0);
  });
  out->items = kernel(inputs.items, shapes, dtypes,
                      {launch.grid[0], launch.grid[1], launch.grid[2]},
                      {launch.threadgroup[0], launch.threadgroup[1], launch.threadgroup[2]},
                      template_args(launch), std::nullopt, false, stream);
  out->items = with_vjp(std::move(out->items), vjp_kernel, vjp_params);
  keep(id, stream, out->items, inputs.items.size());
  return out;
}

namespace {
// MLX CUDA's command encoder, found at run time (a CPU-only or Metal MLX has none): the pool
// launch that writes the pool's own rows registers that buffer as its node's output, so that
// later nodes of the same CUDA graph that read the pool wait for it.
struct CudaEncoder {
  void* (*get)(mx::Stream) = nullptr;               // cu::get_command_encoder
  void (*set_output)(void*, const mx::array&) = nullptr;  // cu::CommandEncoder::set_output_array
};

const CudaEncoder& cuda_encoder() {
  static const CudaEncoder found = [] {
    CudaEncoder e;
    // Looked up in the object that defines MLX (a host may have loaded both it and this
    // library without making their symbols global), else in the global scope.
    void* mlx = nullptr;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&mx::version), &info) && info.dli_fname) {
      mlx = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    auto find = [mlx](const char* name) {
      void* found = mlx ? dlsym(mlx, name) : nullptr;
      return found ? found : dlsym(RTLD_DEFAULT, name);
    };
    e.get = reinterpret_cast<void* (*)(mx::Stream)>(
        find("_ZN3mlx4core2cu19get_command_encoderENS0_6StreamE"));
    e.set_output = reinterpret_cast<void (*)(void*, const mx::array&)>(
        find("_ZN3mlx4core2cu14CommandEncoder16set_output_arrayERKNS0_5arrayE"));
    return e;
  }();
  return found;
}

// The pool launch of PoolWrite::InPlace: evaluates the wrapped CustomKernel with a pool buffer
// of its own in the place of input `pool_`, which becomes the node's pool output (the last).
class PoolInPlace : public MlxkernPrimitive {
 public:
  PoolInPlace(mx::Stream stream, std::shared_ptr<mx::Primitive> kernel,
              std::shared_ptr<mx::Primitive> copy, size_t pool)
      : MlxkernPrimitive(stream, 0), kernel_(std::move(kernel)), copy_(std::move(copy)),
        pool_(pool) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxkern: the in-place pool launch runs on MLX CUDA only");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& enc = cuda_encoder();
    if (enc.get == nullptr || enc.set_output == nullptr) {
      throw std::runtime_error("mlxkern: this MLX has no CUDA command encoder");
    }
    // As in RustCpuKernel: the siblings' copies of the input list would keep the pool from
    // being donatable; MLX drops them after this eval anyway.
    for (auto& out : outputs) {
      if (&out.inputs() != &inputs) out.inputs().clear();
    }
    const mx::array& pool_in = inputs[pool_];
    // Outputs: the kernel's (y for an update), the new pool, then the kernel's state row that
    // no thread writes.
    mx::array& pool_out = outputs[outputs.size() - 2];
    if (pool_in.is_donatable() && pool_in.nbytes() == pool_out.nbytes() &&
        pool_in.flags().row_contiguous) {
      pool_out.copy_shared_buffer(pool_in);
    } else {
      // The caller keeps its pool: a copy of all N states, then the kernel writes the B rows.
      std::vector<mx::array> copied{pool_out};
      copy_->eval_gpu({pool_in}, copied);
    }
    std::vector<mx::array> in = inputs;
    in[pool_] = pool_out;
    // The pool buffer is written by the kernel's node: registered as its output before the
    // kernel adds that node (the inputs are row-contiguous, so the kernel adds no copy first).
    enc.set_output(enc.get(stream()), pool_out);
    std::vector<mx::array> kernel_out;
    for (size_t i = 0; i + 2 < outputs.size(); ++i) kernel_out.push_back(outputs[i]);
    kernel_out.push_back(outputs.back());
    kernel_->eval_gpu(in, kernel_out);
  }

  const char* name() const override { return "MlxkernPoolInPlace"; }

 private:
  std::shared_ptr<mx::Primitive> kernel_;  // MLX's CustomKernel: the recurrence or replay
  std::shared_ptr<mx::Primitive> copy_;    // MLX's CustomKernel: pool -> a pool of its own
  size_t pool_;
};

// Whether a GPU array's layout is row-contiguous before it is evaluated: evaluated arrays by
// their flags, this library's GPU nodes (their outputs are new contiguous arrays); otherwise
// not known.
bool gpu_known_contiguous(const mx::array& a) {
  if (a.is_available()) return a.flags().row_contiguous && a.data_size() == a.size();
  if (!a.has_primitive()) return false;
  const auto& p = a.primitive();
  return typeid(p) == typeid(PoolInPlace) || typeid(p) == typeid(GpuKernelWithVjp);
}
}  // namespace

bool cuda_pool_in_place_available() {
  const auto& e = cuda_encoder();
  return e.get != nullptr && e.set_output != nullptr && mx::cu::is_available();
}

std::unique_ptr<ArrayList> cuda_pool_kernel_op(const MetalLaunch& launch,
                                               const MetalLaunch& copy_launch, uint64_t id,
                                               const ArrayList& inputs, size_t pool_input,
                                               bool gpu) {
  auto stream = stream_for(gpu);
  if (pool_input >= inputs.items.size()) {
    throw std::invalid_argument("mlxkern: the pool launch's pool input is out of range");
  }
  // Every input row-contiguous before the launch, so that MLX's CustomKernel adds no copy node
  // between the pool's registration and its own: inputs not known to be pass through
  // mx::contiguous (which shares the buffer of data that already is).
  ArrayList in_list;
  auto& in = in_list.items;
  for (const auto& a : inputs.items) {
    in.push_back(gpu_known_contiguous(a) ? a : mx::contiguous(a, false, stream));
  }
  // A kept launch: its PoolInPlace primitive (immutable, with the kernel and copy primitives
  // inside) makes the node, as for the other kept launches.
  if (auto out = from_kept(id, stream, in_list)) {
    out->items.pop_back();  // the kernel's unwritten state row stays a sibling
    return out;
  }
  const auto& kernel = cached_kernel(launch, [&] {
    return mx::fast::cuda_kernel(std::string(launch.name), strings(launch.input_names),
                                 strings(launch.output_names), std::string(launch.source),
                                 std::string(launch.header), true, 0);
  });
  auto shapes = output_shapes(launch.output_dims, launch.output_ndims);
  auto dtypes = output_dtypes(launch);
  auto outs = kernel(in, shapes, dtypes, {launch.grid[0], launch.grid[1], launch.grid[2]},
                     {launch.threadgroup[0], launch.threadgroup[1], launch.threadgroup[2]},
                     template_args(launch), std::nullopt, false, stream);
  const auto& copy = cached_kernel(copy_launch, [&] {
    return mx::fast::cuda_kernel(std::string(copy_launch.name), strings(copy_launch.input_names),
                                 strings(copy_launch.output_names),
                                 std::string(copy_launch.source), std::string(copy_launch.header),
                                 true, 0);
  });
  const auto& pool = in[pool_input];
  auto copied = copy({pool}, {pool.shape()}, {pool.dtype()},
                     {copy_launch.grid[0], copy_launch.grid[1], copy_launch.grid[2]},
                     {copy_launch.threadgroup[0], copy_launch.threadgroup[1],
                      copy_launch.threadgroup[2]},
                     template_args(copy_launch), std::nullopt, false, stream);
  // The node: the kernel's outputs but its last, the new pool, then that last (unwritten).
  std::vector<mx::Shape> node_shapes;
  std::vector<mx::Dtype> node_dtypes;
  for (size_t i = 0; i + 1 < outs.size(); ++i) {
    node_shapes.push_back(outs[i].shape());
    node_dtypes.push_back(outs[i].dtype());
  }
  node_shapes.push_back(pool.shape());
  node_dtypes.push_back(pool.dtype());
  node_shapes.push_back(outs.back().shape());
  node_dtypes.push_back(outs.back().dtype());
  auto node = mx::array::make_arrays(
      std::move(node_shapes), node_dtypes,
      std::make_shared<PoolInPlace>(stream, outs[0].primitive_ptr(), copied[0].primitive_ptr(),
                                    pool_input),
      in);
  keep(id, stream, node, in.size());
  auto out = std::make_unique<ArrayList>();
  for (size_t i = 0; i + 1 < node.size(); ++i) out->items.push_back(node[i]);
  return out;
}

bool metal_available() { return mx::metal::is_available(); }
bool cuda_available() { return mx::cu::is_available(); }

size_t set_cache_limit(size_t bytes) { return mx::set_cache_limit(bytes); }

}  // namespace mlxk
