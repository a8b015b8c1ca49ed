// The C++ half of the bridge between mlxkern's Rust code and MLX's C++ API.
#pragma once

#include <memory>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"
#include "rust/cxx.h"

namespace mlxk {

using Array = mlx::core::array;

struct ArrayList {
  std::vector<mlx::core::array> items;
};

struct MetalLaunch;
struct CpuLaunch;

// The default stream of the GPU (`gpu`) or of the CPU.
mlx::core::Stream stream_for(bool gpu);

std::unique_ptr<Array> array_from_bytes(rust::Slice<const uint8_t> data,
                                        rust::Slice<const int32_t> shape, int32_t dtype);
std::unique_ptr<Array> array_zeros(rust::Slice<const int32_t> shape, int32_t dtype);
std::unique_ptr<Array> array_share(const Array& a);
size_t array_ndim(const Array& a);
int32_t array_dim(const Array& a, size_t axis);
int32_t array_dtype(const Array& a);
size_t array_size(const Array& a);
size_t array_nbytes(const Array& a);
size_t array_address(const Array& a);
void array_eval(const Array& a);
size_t array_id(const Array& a);
std::unique_ptr<Array> array_as_given(const Array& a, size_t given);
void array_read(const Array& a, rust::Slice<uint8_t> dst);
std::unique_ptr<Array> array_astype(const Array& a, int32_t dtype, bool gpu);
std::unique_ptr<Array> array_stop_gradient(const Array& a, bool gpu);

std::unique_ptr<ArrayList> list_new();
void list_push(ArrayList& list, const Array& a);
size_t list_len(const ArrayList& list);
std::unique_ptr<Array> list_get(const ArrayList& list, size_t i);

std::unique_ptr<Array> compute_g(const Array& a_log, const Array& a, const Array& dt_bias,
                                 bool gpu);
std::unique_ptr<Array> sigmoid(const Array& x, bool gpu);
std::unique_ptr<ArrayList> cuda_pool_kernel_op(const MetalLaunch& launch,
                                               const MetalLaunch& copy_launch, uint64_t id,
                                               const ArrayList& inputs, size_t pool_input,
                                               bool gpu);
bool cuda_pool_in_place_available();
std::unique_ptr<Array> pool_scatter(const Array& pool, const Array& slots, const Array& states,
                                    bool gpu);
std::unique_ptr<Array> take_tokens(const Array& a, const Array& tokens, bool gpu);
std::unique_ptr<ArrayList> silu_rms_heads_vjp_ops(const ArrayList& inputs, int32_t key_heads,
                                                  int32_t value_heads, int32_t value_width,
                                                  float eps, bool has_dq, bool has_dk,
                                                  bool has_dv, bool gpu);
std::unique_ptr<ArrayList> gated_rms_norm_vjp_ops(const ArrayList& inputs, float eps,
                                                  bool has_dout, bool gpu);

std::unique_ptr<ArrayList> cpu_kernel_op(const CpuLaunch& launch, const ArrayList& inputs);
std::unique_ptr<ArrayList> metal_kernel_op(const MetalLaunch& launch, uint64_t id,
                                           const ArrayList& inputs,
                                           bool gpu, uint32_t vjp_kernel,
                                           rust::Slice<const int64_t> vjp_params);

std::unique_ptr<ArrayList> cuda_kernel_op(const MetalLaunch& launch, uint64_t id,
                                          const ArrayList& inputs,
                                          bool gpu, uint32_t vjp_kernel,
                                          rust::Slice<const int64_t> vjp_params);
std::unique_ptr<ArrayList> gated_delta_backward_tail(const ArrayList& inputs, int32_t key_heads,
                                                     bool gpu);
std::unique_ptr<ArrayList> gates_vjp(const ArrayList& inputs, bool gpu);

std::unique_ptr<Array> array_from_host(size_t host);
size_t array_to_host(const Array& a);
void host_array_free(size_t host);
rust::String mlx_version();
rust::String mlx_build_version();
rust::Vec<rust::String> loaded_mlx_libraries();
size_t loaded_mlx_library_count();
bool pin_library();

bool metal_available();
bool cuda_available();
size_t set_cache_limit(size_t bytes);

}  // namespace mlxk
