// Prefix-state replay: the recurrence of gated_delta.metal without the query/output, each row
// b replaying its first lengths[b] tokens. Derived from mlx-lm's `gated_delta_step` kernel,
// Copyright © 2025 Apple Inc., MIT license (THIRD_PARTY_NOTICES.md). The host validates every
// length (0 <= lengths[b] <= T): this text does not clamp.
// Launch: grid (32, Dv / ROWS, B * Hv), threadgroup (32, 4, 1); template Dk, Dv, Hk, Hv, ROWS.
// With MLXK_POOL defined (by the launch's header): the row table `rows` [R, 5] in place of the
// lengths, as in gated_delta.metal; row b_idx replays its len tokens from token tok0 on, from
// state_in (the pool) row src (zeros when src < 0) into state_out row dst (none when dst < 0).
#ifndef MLXK_MUL  // a product that must not fuse into a following add (docs/DESIGN.md §3)
#define MLXK_MUL(a, b) ((a) * (b))
#endif
#ifndef MLXK_GATE_DECAY_AT  // token t's gates: read from g and beta (computed on CUDA)
#define MLXK_GATE_DECAY_AT(t) g_[(t) * Hv + hv_idx]
#define MLXK_GATE_BETA_AT(t) beta_[(t) * Hv + hv_idx]
#endif
#ifndef MLXK_LOAD_STATE  // a lane's n_per_t consecutive state values (vector accesses on CUDA)
#define MLXK_LOAD_STATE(dst, src) \
  for (int i_ = 0; i_ < n_per_t; ++i_) (dst)[i_] = static_cast<float>((src)[i_])
#define MLXK_STORE_STATE(dst, src) for (int i_ = 0; i_ < n_per_t; ++i_) (dst)[i_] = (src)[i_]
#endif
#ifndef MLXK_POOL
  const int T = k_shape[1];  // k: [B, T, Hk, Dk], as in gated_delta.metal
#endif
  auto n = thread_position_in_grid.z;
  auto b_idx = n / Hv;
  auto hv_idx = n % Hv;
  auto hk_idx = hv_idx / (Hv / Hk);
  constexpr int n_per_t = Dk / 32;
  auto dk_idx = thread_position_in_threadgroup.x;
  // ROWS value rows per SIMD group (template; 1 on Metal), as in gated_delta.metal.
  auto dv_0 = ROWS * thread_position_in_grid.y;
#ifdef MLXK_POOL
  (void)k_shape;  // MLX passes it (the text names it), unused here
  auto row_ = rows + 5 * b_idx;
  const uint tok0 = uint(row_[0]);
  const int src = row_[3];  // dst is read after the token loop, where it is used
  auto k_ = k + tok0 * Hk * Dk + hk_idx * Dk;
  auto v_ = v + tok0 * Hv * Dv + hv_idx * Dv;
  auto g_ = g + tok0 * Hv;
  auto beta_ = beta + tok0 * Hv;
  auto i_state = state_in + ((size_t(src < 0 ? 0 : src) * Hv + hv_idx) * Dv + dv_0) * Dk;
  float state[ROWS][n_per_t];
  if (src < 0) {  // no source row (a fresh or padding row): zeros
    for (int r = 0; r < ROWS; ++r) {
      for (int i = 0; i < n_per_t; ++i) state[r][i] = 0.0f;
    }
  } else {
    for (int r = 0; r < ROWS; ++r) MLXK_LOAD_STATE(state[r], i_state + r * Dk + n_per_t * dk_idx);
  }
  const int keep = simd_shuffle(row_[2], 0);  // uniform to the compiler (gated_delta.metal)
#else
  auto k_ = k + b_idx * T * Hk * Dk + hk_idx * Dk;
  auto v_ = v + b_idx * T * Hv * Dv + hv_idx * Dv;
  auto g_ = g + b_idx * T * Hv;
  auto beta_ = beta + b_idx * T * Hv;
  auto i_state = state_in + (n * Dv + dv_0) * Dk;
  auto o_state = state_out + (n * Dv + dv_0) * Dk;
  float state[ROWS][n_per_t];
  for (int r = 0; r < ROWS; ++r) MLXK_LOAD_STATE(state[r], i_state + r * Dk + n_per_t * dk_idx);
  const int keep = lengths[b_idx];
#endif
  // The gates as in gated_delta.metal: lane l computes token (t + l)'s every 32 tokens.
  const uint lane = thread_index_in_simdgroup;
  float lane_decay = 0.0f, lane_beta = 0.0f;
  for (int t = 0; t < keep; ++t) {
    const int from = t % 32;
    if (from == 0 && t + int(lane) < keep) {
      lane_decay = MLXK_GATE_DECAY_AT(t + int(lane));
      lane_beta = MLXK_GATE_BETA_AT(t + int(lane));
    }
    const float decay = simd_shuffle(lane_decay, from);
    const float beta_t = simd_shuffle(lane_beta, from);
    float k_t[n_per_t];  // this token's k as float, read once for all rows
    for (int i = 0; i < n_per_t; ++i) k_t[i] = static_cast<float>(k_[n_per_t * dk_idx + i]);
    for (int r = 0; r < ROWS; ++r) {
      float kv_mem = 0.0f;
      for (int i = 0; i < n_per_t; ++i) {
        state[r][i] = MLXK_MUL(state[r][i], decay);
        kv_mem += MLXK_MUL(state[r][i], k_t[i]);
      }
      kv_mem = simd_sum(kv_mem);
      auto delta = (v_[dv_0 + r] - kv_mem) * beta_t;
      for (int i = 0; i < n_per_t; ++i) {
        state[r][i] = state[r][i] + MLXK_MUL(k_t[i], delta);
      }
    }
    k_ += Hk * Dk;
    v_ += Hv * Dv;
  }
#ifdef MLXK_POOL
  const int dst = rows[5 * b_idx + 4];
#ifdef MLXK_POOL_IN_PLACE  // CUDA: row dst of the pool itself (a buffer of the pool's own)
  auto o_state = MLXK_POOL_IN_PLACE(state_in) +
                 ((size_t(dst < 0 ? 0 : dst) * Hv + hv_idx) * Dv + dv_0) * Dk;
#else
  auto o_state = state_out + ((size_t(dst < 0 ? 0 : dst) * Hv + hv_idx) * Dv + dv_0) * Dk;
#endif
  if (dst >= 0)  // the stores below
#endif
  for (int r = 0; r < ROWS; ++r) MLXK_STORE_STATE(o_state + r * Dk + n_per_t * dk_idx, state[r]);
