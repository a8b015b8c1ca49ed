// Generated from include/mlxkern.h by scripts/gen-symbols.ts. Do not edit:
// run `bun scripts/gen-symbols.ts` (test/symbols.test.ts fails when this file is stale).

/* eslint-disable */

// ---- #define MLXK_* constants ----
export const MLXK_VERSION = "0.1.0";
export const MLXK_VERSION_MAJOR = 0;
export const MLXK_VERSION_MINOR = 1;
export const MLXK_VERSION_PATCH = 0;
export const MLXK_ABI_VERSION = 1;
export const MLXK_MAX_NDIM = 16;
export const MLXK_GLM52_EXPERT_SLOT_ALIGNMENT = 16384;
export const MLXK_DTYPE_BOOL = 0;
export const MLXK_DTYPE_UINT8 = 1;
export const MLXK_DTYPE_INT8 = 2;
export const MLXK_DTYPE_INT32 = 3;
export const MLXK_DTYPE_UINT32 = 4;
export const MLXK_DTYPE_FLOAT16 = 5;
export const MLXK_DTYPE_BFLOAT16 = 6;
export const MLXK_DTYPE_FLOAT32 = 7;
export const MLXK_DEVICE_CPU = 0;
export const MLXK_DEVICE_GPU = 1;
export const MLXK_GPU_NONE = 0;
export const MLXK_GPU_METAL = 1;
export const MLXK_GPU_CUDA = 2;
export const MLXK_OK = 0;
export const MLXK_ERR_NULL_POINTER = 1;
export const MLXK_ERR_INVALID_ARGUMENT = 2;
export const MLXK_ERR_SHAPE = 3;
export const MLXK_ERR_DTYPE = 4;
export const MLXK_ERR_UNSUPPORTED = 5;
export const MLXK_ERR_BACKEND = 6;
export const MLXK_ERR_OUT_OF_MEMORY = 7;
export const MLXK_ERR_BUFFER_TOO_SMALL = 8;
export const MLXK_ERR_PANIC = 9;
export const MLXK_ERR_INVALID_HANDLE = 10;

// ---- plain-data structs (passed by pointer; offsets in bytes, natural alignment) ----
export const mlxk_glm52_layout_struct = {
  name: "mlxk_glm52_layout",
  size: 72,
  fields: [
    { name: "hidden_size", type: "u64", offset: 0 },
    { name: "intermediate_size", type: "u64", offset: 8 },
    { name: "slot_bytes", type: "u64", offset: 16 },
    { name: "down_weight_offset", type: "u64", offset: 24 },
    { name: "gate_weight_offset", type: "u64", offset: 32 },
    { name: "up_weight_offset", type: "u64", offset: 40 },
    { name: "down_scale_offset", type: "u64", offset: 48 },
    { name: "gate_scale_offset", type: "u64", offset: 56 },
    { name: "up_scale_offset", type: "u64", offset: 64 },
  ],
} as const;

// ---- opaque handle types (pointers in bun:ffi) ----
export const opaqueTypes = ["mlxk_array"] as const;

// ---- the bun:ffi symbol table, one entry per prototype, in header order ----
export const symbols = {
  // mlxk_status mlxk_array_new(const void * data, const int32_t * shape, size_t ndim, mlxk_dtype dtype, struct mlxk_array ** out)
  mlxk_array_new: { args: ["ptr", "ptr", "usize", "i32", "ptr"], returns: "i32" },
  // mlxk_status mlxk_array_zeros(const int32_t * shape, size_t ndim, mlxk_dtype dtype, struct mlxk_array ** out)
  mlxk_array_zeros: { args: ["ptr", "usize", "i32", "ptr"], returns: "i32" },
  // mlxk_status mlxk_array_free(struct mlxk_array * array)
  mlxk_array_free: { args: ["ptr"], returns: "i32" },
  // mlxk_status mlxk_array_ndim(const struct mlxk_array * array, size_t * ndim)
  mlxk_array_ndim: { args: ["ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_array_shape(const struct mlxk_array * array, int32_t * dims, size_t capacity)
  mlxk_array_shape: { args: ["ptr", "ptr", "usize"], returns: "i32" },
  // mlxk_status mlxk_array_dtype(const struct mlxk_array * array, mlxk_dtype * dtype)
  mlxk_array_dtype: { args: ["ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_array_nbytes(const struct mlxk_array * array, size_t * nbytes)
  mlxk_array_nbytes: { args: ["ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_array_eval(const struct mlxk_array * array)
  mlxk_array_eval: { args: ["ptr"], returns: "i32" },
  // mlxk_status mlxk_array_read(const struct mlxk_array * array, void * dst, size_t dst_bytes)
  mlxk_array_read: { args: ["ptr", "ptr", "usize"], returns: "i32" },
  // mlxk_status mlxk_array_astype(const struct mlxk_array * array, mlxk_dtype dtype, struct mlxk_array ** out)
  mlxk_array_astype: { args: ["ptr", "i32", "ptr"], returns: "i32" },
  // mlxk_status mlxk_set_default_device(mlxk_device device)
  mlxk_set_default_device: { args: ["i32"], returns: "i32" },
  // mlxk_gpu_backend_kind mlxk_gpu_backend(void)
  mlxk_gpu_backend: { args: [], returns: "i32" },
  // mlxk_status mlxk_set_memory_limit(size_t bytes)
  mlxk_set_memory_limit: { args: ["usize"], returns: "i32" },
  // mlxk_status mlxk_get_memory_limit(size_t * bytes)
  mlxk_get_memory_limit: { args: ["ptr"], returns: "i32" },
  // mlxk_status mlxk_set_cache_limit(size_t bytes)
  mlxk_set_cache_limit: { args: ["usize"], returns: "i32" },
  // mlxk_status mlxk_compute_g(const struct mlxk_array * a_log, const struct mlxk_array * a, const struct mlxk_array * dt_bias, struct mlxk_array ** g)
  mlxk_compute_g: { args: ["ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * state, const struct mlxk_array * mask, struct mlxk_array ** y, struct mlxk_array ** state_out)
  mlxk_gated_delta_update: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_from_conv(const struct mlxk_array * x, const struct mlxk_array * q_scale, const struct mlxk_array * k_scale, int32_t key_heads, int32_t value_heads, int32_t value_width, float eps, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * state, const struct mlxk_array * mask, struct mlxk_array ** y, struct mlxk_array ** state_out)
  mlxk_gated_delta_update_from_conv: { args: ["ptr", "ptr", "ptr", "i32", "i32", "i32", "f32", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_chunked(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * state, const struct mlxk_array * mask, int32_t chunk_size, struct mlxk_array ** y, struct mlxk_array ** state_out)
  mlxk_gated_delta_update_chunked: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i32", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_vjp(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * state, const struct mlxk_array * mask, const struct mlxk_array * dy, const struct mlxk_array * dstate_out, struct mlxk_array ** dq, struct mlxk_array ** dk, struct mlxk_array ** dv, struct mlxk_array ** da, struct mlxk_array ** db, struct mlxk_array ** da_log, struct mlxk_array ** ddt_bias, struct mlxk_array ** dstate)
  mlxk_gated_delta_update_vjp: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_chunked_vjp(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * state, const struct mlxk_array * mask, int32_t chunk_size, const struct mlxk_array * dy, const struct mlxk_array * dstate_out, struct mlxk_array ** dq, struct mlxk_array ** dk, struct mlxk_array ** dv, struct mlxk_array ** da, struct mlxk_array ** db, struct mlxk_array ** da_log, struct mlxk_array ** ddt_bias, struct mlxk_array ** dstate)
  mlxk_gated_delta_update_chunked_vjp: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i32", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_state(const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * state, const int32_t * accepted_lengths, size_t n_lengths, struct mlxk_array ** state_out)
  mlxk_gated_delta_state: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_pool(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * slots, const uint8_t * fresh, size_t n_slots, const struct mlxk_array * mask, struct mlxk_array ** y, struct mlxk_array ** pool_out)
  mlxk_gated_delta_update_pool: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_pool_chunked(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * slots, const uint8_t * fresh, size_t n_slots, const struct mlxk_array * mask, int32_t chunk_size, struct mlxk_array ** y, struct mlxk_array ** pool_out)
  mlxk_gated_delta_update_pool_chunked: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "i32", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_verify_pool(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * slots, const uint8_t * fresh, size_t n_slots, const struct mlxk_array * mask, struct mlxk_array ** y)
  mlxk_gated_delta_verify_pool: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_packed(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * cu_seqlens, size_t n_cu_seqlens, const int32_t * slots, const uint8_t * fresh, struct mlxk_array ** y, struct mlxk_array ** pool_out)
  mlxk_gated_delta_update_packed: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_packed_chunked(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * cu_seqlens, size_t n_cu_seqlens, const int32_t * slots, const uint8_t * fresh, int32_t chunk_size, struct mlxk_array ** y, struct mlxk_array ** pool_out)
  mlxk_gated_delta_update_packed_chunked: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "ptr", "i32", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_state_pool(const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * slots, const uint8_t * fresh, const int32_t * accepted_lengths, size_t n_slots, struct mlxk_array ** pool_out)
  mlxk_gated_delta_state_pool: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_update_from_conv_pool(const struct mlxk_array * x, const struct mlxk_array * q_scale, const struct mlxk_array * k_scale, int32_t key_heads, int32_t value_heads, int32_t value_width, float eps, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * slots, const uint8_t * fresh, size_t n_slots, const struct mlxk_array * mask, struct mlxk_array ** y, struct mlxk_array ** pool_out)
  mlxk_gated_delta_update_from_conv_pool: { args: ["ptr", "ptr", "ptr", "i32", "i32", "i32", "f32", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_verify_tree_pool(const struct mlxk_array * q, const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * cu_nodes, size_t n_cu_nodes, const int32_t * parents, size_t n_nodes, const int32_t * slots, const uint8_t * fresh, struct mlxk_array ** y)
  mlxk_gated_delta_verify_tree_pool: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "usize", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_delta_commit_tree_pool(const struct mlxk_array * k, const struct mlxk_array * v, const struct mlxk_array * a, const struct mlxk_array * b, const struct mlxk_array * a_log, const struct mlxk_array * dt_bias, const struct mlxk_array * pool, const int32_t * cu_nodes, size_t n_cu_nodes, const int32_t * parents, size_t n_nodes, const int32_t * slots, const uint8_t * fresh, const int32_t * accepted_lengths, const int32_t * accepted_paths, size_t n_accepted, struct mlxk_array ** pool_out)
  mlxk_gated_delta_commit_tree_pool: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "usize", "ptr", "usize", "ptr", "ptr", "ptr", "ptr", "usize", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_rms_norm(const struct mlxk_array * x, const struct mlxk_array * gate, const struct mlxk_array * weight, float eps, struct mlxk_array ** out)
  mlxk_gated_rms_norm: { args: ["ptr", "ptr", "ptr", "f32", "ptr"], returns: "i32" },
  // mlxk_status mlxk_gated_rms_norm_vjp(const struct mlxk_array * x, const struct mlxk_array * gate, const struct mlxk_array * weight, float eps, const struct mlxk_array * dout, struct mlxk_array ** dx, struct mlxk_array ** dgate, struct mlxk_array ** dweight)
  mlxk_gated_rms_norm_vjp: { args: ["ptr", "ptr", "ptr", "f32", "ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_glm52_layout_canonical(uint64_t hidden, uint64_t intermediate, uint32_t bits, uint32_t group_size, struct mlxk_glm52_layout * out)
  mlxk_glm52_layout_canonical: { args: ["u64", "u64", "u32", "u32", "ptr"], returns: "i32" },
  // mlxk_status mlxk_glm52_layout_validate(const struct mlxk_glm52_layout * layout, uint32_t bits, uint32_t group_size)
  mlxk_glm52_layout_validate: { args: ["ptr", "u32", "u32"], returns: "i32" },
  // const char * mlxk_mlx_version(void)
  mlxk_mlx_version: { args: [], returns: "cstring" },
  // mlxk_status mlxk_array_from_mlx(const void * mlx_array, struct mlxk_array ** out)
  mlxk_array_from_mlx: { args: ["ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_array_to_mlx(const struct mlxk_array * array, void ** mlx_array_out)
  mlxk_array_to_mlx: { args: ["ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_mlx_array_free(void * mlx_array)
  mlxk_mlx_array_free: { args: ["ptr"], returns: "i32" },
  // mlxk_status mlxk_mlx_lock(void)
  mlxk_mlx_lock: { args: [], returns: "i32" },
  // mlxk_status mlxk_mlx_unlock(void)
  mlxk_mlx_unlock: { args: [], returns: "i32" },
  // mlxk_status mlxk_silu_rms_heads(const struct mlxk_array * x, const struct mlxk_array * q_scale, const struct mlxk_array * k_scale, int32_t key_heads, int32_t value_heads, int32_t value_width, float eps, struct mlxk_array ** q, struct mlxk_array ** k, struct mlxk_array ** v)
  mlxk_silu_rms_heads: { args: ["ptr", "ptr", "ptr", "i32", "i32", "i32", "f32", "ptr", "ptr", "ptr"], returns: "i32" },
  // mlxk_status mlxk_silu_rms_heads_vjp(const struct mlxk_array * x, const struct mlxk_array * q_scale, const struct mlxk_array * k_scale, int32_t key_heads, int32_t value_heads, int32_t value_width, float eps, const struct mlxk_array * dq, const struct mlxk_array * dk, const struct mlxk_array * dv, struct mlxk_array ** dx, struct mlxk_array ** dq_scale, struct mlxk_array ** dk_scale)
  mlxk_silu_rms_heads_vjp: { args: ["ptr", "ptr", "ptr", "i32", "i32", "i32", "f32", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr"], returns: "i32" },
  // const char * mlxk_last_error(void)
  mlxk_last_error: { args: [], returns: "cstring" },
  // const char * mlxk_status_name(mlxk_status status)
  mlxk_status_name: { args: ["i32"], returns: "cstring" },
  // const char * mlxk_version(void)
  mlxk_version: { args: [], returns: "cstring" },
  // uint32_t mlxk_abi_version(void)
  mlxk_abi_version: { args: [], returns: "u32" },
} as const;

/** Parameter names per function, as the header spells them (for messages and docs). */
export const parameterNames = {
  mlxk_array_new: ["data", "shape", "ndim", "dtype", "out"],
  mlxk_array_zeros: ["shape", "ndim", "dtype", "out"],
  mlxk_array_free: ["array"],
  mlxk_array_ndim: ["array", "ndim"],
  mlxk_array_shape: ["array", "dims", "capacity"],
  mlxk_array_dtype: ["array", "dtype"],
  mlxk_array_nbytes: ["array", "nbytes"],
  mlxk_array_eval: ["array"],
  mlxk_array_read: ["array", "dst", "dst_bytes"],
  mlxk_array_astype: ["array", "dtype", "out"],
  mlxk_set_default_device: ["device"],
  mlxk_gpu_backend: [],
  mlxk_set_memory_limit: ["bytes"],
  mlxk_get_memory_limit: ["bytes"],
  mlxk_set_cache_limit: ["bytes"],
  mlxk_compute_g: ["a_log", "a", "dt_bias", "g"],
  mlxk_gated_delta_update: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "state", "mask", "y", "state_out"],
  mlxk_gated_delta_update_from_conv: ["x", "q_scale", "k_scale", "key_heads", "value_heads", "value_width", "eps", "a", "b", "a_log", "dt_bias", "state", "mask", "y", "state_out"],
  mlxk_gated_delta_update_chunked: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "state", "mask", "chunk_size", "y", "state_out"],
  mlxk_gated_delta_update_vjp: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "state", "mask", "dy", "dstate_out", "dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"],
  mlxk_gated_delta_update_chunked_vjp: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "state", "mask", "chunk_size", "dy", "dstate_out", "dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"],
  mlxk_gated_delta_state: ["k", "v", "a", "b", "a_log", "dt_bias", "state", "accepted_lengths", "n_lengths", "state_out"],
  mlxk_gated_delta_update_pool: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "pool", "slots", "fresh", "n_slots", "mask", "y", "pool_out"],
  mlxk_gated_delta_update_pool_chunked: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "pool", "slots", "fresh", "n_slots", "mask", "chunk_size", "y", "pool_out"],
  mlxk_gated_delta_verify_pool: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "pool", "slots", "fresh", "n_slots", "mask", "y"],
  mlxk_gated_delta_update_packed: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "pool", "cu_seqlens", "n_cu_seqlens", "slots", "fresh", "y", "pool_out"],
  mlxk_gated_delta_update_packed_chunked: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "pool", "cu_seqlens", "n_cu_seqlens", "slots", "fresh", "chunk_size", "y", "pool_out"],
  mlxk_gated_delta_state_pool: ["k", "v", "a", "b", "a_log", "dt_bias", "pool", "slots", "fresh", "accepted_lengths", "n_slots", "pool_out"],
  mlxk_gated_delta_update_from_conv_pool: ["x", "q_scale", "k_scale", "key_heads", "value_heads", "value_width", "eps", "a", "b", "a_log", "dt_bias", "pool", "slots", "fresh", "n_slots", "mask", "y", "pool_out"],
  mlxk_gated_delta_verify_tree_pool: ["q", "k", "v", "a", "b", "a_log", "dt_bias", "pool", "cu_nodes", "n_cu_nodes", "parents", "n_nodes", "slots", "fresh", "y"],
  mlxk_gated_delta_commit_tree_pool: ["k", "v", "a", "b", "a_log", "dt_bias", "pool", "cu_nodes", "n_cu_nodes", "parents", "n_nodes", "slots", "fresh", "accepted_lengths", "accepted_paths", "n_accepted", "pool_out"],
  mlxk_gated_rms_norm: ["x", "gate", "weight", "eps", "out"],
  mlxk_gated_rms_norm_vjp: ["x", "gate", "weight", "eps", "dout", "dx", "dgate", "dweight"],
  mlxk_glm52_layout_canonical: ["hidden", "intermediate", "bits", "group_size", "out"],
  mlxk_glm52_layout_validate: ["layout", "bits", "group_size"],
  mlxk_mlx_version: [],
  mlxk_array_from_mlx: ["mlx_array", "out"],
  mlxk_array_to_mlx: ["array", "mlx_array_out"],
  mlxk_mlx_array_free: ["mlx_array"],
  mlxk_mlx_lock: [],
  mlxk_mlx_unlock: [],
  mlxk_silu_rms_heads: ["x", "q_scale", "k_scale", "key_heads", "value_heads", "value_width", "eps", "q", "k", "v"],
  mlxk_silu_rms_heads_vjp: ["x", "q_scale", "k_scale", "key_heads", "value_heads", "value_width", "eps", "dq", "dk", "dv", "dx", "dq_scale", "dk_scale"],
  mlxk_last_error: [],
  mlxk_status_name: ["status"],
  mlxk_version: [],
  mlxk_abi_version: [],
} as const;
