// Gated DeltaNet recurrence: the body of mlx-lm's `gated_delta_step` Metal kernel (scalar gate,
// generic layout), Copyright © 2025 Apple Inc., MIT license (THIRD_PARTY_NOTICES.md).
// mlxkern reads T from k's shape (`k_shape`, which MLX passes with the launch: no memory read
// that every other address would wait for), and replaces the token-active marker with `true`
// (unmasked) or `mask[b_idx * T + t]` (masked variant).
// Launch: grid (32, Dv / ROWS, B * Hv), threadgroup (32, 4, 1); template InT, StT, Dk, Dv, Hk, Hv,
// ROWS (value rows per SIMD group: 1 on Metal; src/cuda.rs picks it on CUDA).
// With MLXK_FROM_CONV defined (by the launch's header, with kernels/metal/silu.h), inputs x,
// qscale, kscale replace q, k, v: the head split of mlxk_silu_rms_heads and this recurrence in
// one kernel (mlxk_gated_delta_update_from_conv), template EPS besides.
// With MLXK_POOL defined (by the launch's header), the states live in a pool and the input rows,
// int32 [R, 5], gives each grid row b_idx its (tok0, span, len, src, dst) (node::gated_delta::
// Pool): its tokens start at tok0 of the flattened token dimension of q, k, v, y, g, beta and
// the mask ([B, T] rows or packed sequences; the masked variant's marker becomes
// `mask[tok0 + t]`), it runs len of them (T below) and owns span of y (zeros past len), starts
// from state_in row src (the pool [N, Hv, Dv, Dk]; zeros when src < 0) and ends in state_out
// row dst (not written when dst < 0).
#if defined(MLXK_FROM_CONV) && defined(MLXK_POOL)
#error the recurrence from the convolution output has no pool form
#endif
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
    auto n = thread_position_in_grid.z;
    auto b_idx = n / Hv;
    auto hv_idx = n % Hv;
    auto hk_idx = hv_idx / (Hv / Hk);
    constexpr int n_per_t = Dk / 32;

#ifdef MLXK_FROM_CONV
    // q, k and v computed from the convolution's output x [B, T, 2 Hk Dk + Hv Dv] (channels
    // q | k | v) as the head split computes them (silu_rms_heads.metal; template EPS, inputs
    // qscale and kscale; Dk <= 128).
    const int T = x_shape[1];
    constexpr int C = 2 * Hk * Dk + Hv * Dv;
    auto x_ = x + b_idx * T * C;
    const int q_at = hk_idx * Dk, k_at = (Hk + hk_idx) * Dk, v_at = 2 * Hk * Dk + hv_idx * Dv;
    // A threadgroup's SIMD groups share one head (its grid z): each token's q and k are
    // computed by the first and passed on in threadgroup memory, two tokens' worth, so that
    // one barrier a token keeps every read before the slot's next write.
    threadgroup float qk_tg[2][2 * Dk];
#elif defined(MLXK_POOL)
    // rows: [R, 5]; q, k: [.., Hk, Dk] and v: [.., Hv, Dv] from token tok0 on.
    (void)k_shape;  // MLX passes it (the text names it), unused here
    auto row_ = rows + 5 * b_idx;
    const uint tok0 = uint(row_[0]);
    // The row's token count, as lane 0 has it: every lane of a SIMD group reads the same row
    // (its grid z), and through the shuffle the loop's trip count is uniform to the compiler
    // (NVRTC otherwise allows for lanes leaving the loop at different tokens: twice the code
    // and 34 more registers a thread, measured with scripts/cuda/sass.py).
    const int T = simd_shuffle(row_[2], 0);
    auto q_ = q + tok0 * Hk * Dk + hk_idx * Dk;
    auto k_ = k + tok0 * Hk * Dk + hk_idx * Dk;
    auto v_ = v + tok0 * Hv * Dv + hv_idx * Dv;
#else
    const int T = k_shape[1];  // k: [B, T, Hk, Dk]
    // q, k: [B, T, Hk, Dk]
    auto q_ = q + b_idx * T * Hk * Dk + hk_idx * Dk;
    auto k_ = k + b_idx * T * Hk * Dk + hk_idx * Dk;

    // v: [B, T, Hv, Dv]
    auto v_ = v + b_idx * T * Hv * Dv + hv_idx * Dv;
#endif
    // y: [B, T, Hv, Dv]
#ifdef MLXK_POOL
    y += tok0 * Hv * Dv + hv_idx * Dv;
#else
    y += b_idx * T * Hv * Dv + hv_idx * Dv;
#endif

    auto dk_idx = thread_position_in_threadgroup.x;
    // A SIMD group owns ROWS value rows (template; 1 on Metal, as in mlx-lm's kernel): rows
    // ROWS * y .. ROWS * y + ROWS - 1 of its grid row y, each computed as the single row is.
    auto dv_0 = ROWS * thread_position_in_grid.y;

    // state_in, state_out: [B, Hv, Dv, Dk]
#ifdef MLXK_POOL
    // The pool [N, Hv, Dv, Dk]: row src (64-bit offsets: a pool may hold more than 2^32
    // values). The row's span and dst are read after the token loop, where they are used (no
    // register holds them across it).
    const int src = row_[3];
    auto i_state = state_in + ((size_t(src < 0 ? 0 : src) * Hv + hv_idx) * Dv + dv_0) * Dk;
#else
    auto i_state = state_in + (n * Dv + dv_0) * Dk;
    auto o_state = state_out + (n * Dv + dv_0) * Dk;
#endif

    float state[ROWS][n_per_t];
#ifdef MLXK_POOL
    if (src < 0) {  // no source row (a fresh or padding row): zeros
      for (int r = 0; r < ROWS; ++r) {
        for (int i = 0; i < n_per_t; ++i) state[r][i] = 0.0f;
      }
    } else  // the loads below
#endif
    for (int r = 0; r < ROWS; ++r) {
      MLXK_LOAD_STATE(state[r], i_state + r * Dk + n_per_t * dk_idx);
    }

    // g: [B, T, Hv]
#ifdef MLXK_POOL
    auto g_ = g + tok0 * Hv;
    auto beta_ = beta + tok0 * Hv;
#else
    auto g_ = g + b_idx * T * Hv;
    auto beta_ = beta + b_idx * T * Hv;
#endif

    // The gates: every 32 tokens, lane l computes token (t + l)'s decay and beta once for all
    // of the SIMD group's rows; token t then takes them from lane t % 32 (a shuffle moves the
    // float bits unchanged). Tokens past T and masked tokens are never read.
    const uint lane = thread_index_in_simdgroup;
    float lane_decay = 0.0f, lane_beta = 0.0f;

    for (int t = 0; t < T; ++t) {
#ifdef MLXK_FROM_CONV
      // This token's x values, read before its gates are computed so that the two reads
      // overlap: the first SIMD group's q and k columns (the head split's lane order) and
      // lane r's value row r.
      const bool splits = thread_position_in_threadgroup.y == 0;
      InT x_q[4], x_k[4];
      for (int i = 0; i < 4; ++i) {
        const int col = 4 * int(lane) + i;
        x_q[i] = splits && col < Dk ? x_[q_at + col] : InT(0);
        x_k[i] = splits && col < Dk ? x_[k_at + col] : InT(0);
      }
      const InT x_v = int(lane) < ROWS ? x_[v_at + dv_0 + int(lane)] : InT(0);
#endif
      const int from = t % 32;
      if (from == 0 && t + int(lane) < T) {
        lane_decay = MLXK_GATE_DECAY_AT(t + int(lane));
        lane_beta = MLXK_GATE_BETA_AT(t + int(lane));
      }
      const float decay = simd_shuffle(lane_decay, from);
      const float beta_t = simd_shuffle(lane_beta, from);
      if (MLXK_TOKEN_ACTIVE) {
        // This token's k and q as float, read once for all ROWS rows (the same values the
        // products would widen them to), and the rows' v, all read before any y is written:
        // y may alias v as far as a compiler knows, so a read after a write would wait for it.
        float k_t[n_per_t], q_t[n_per_t];
        InT v_t[ROWS];
#ifdef MLXK_FROM_CONV
        const int slot = t & 1;
        if (splits) {
          // The head split's sums of squares in its own lane order (lane l: columns 4l .. 4l +
          // 3, zeros past Dk), then this lane's columns normalized and scaled. Where Dk = 128
          // the two orders own the same columns and the activations are reused.
          float q_sum = 0.0f, k_sum = 0.0f;
          InT q_act[4], k_act[4];
          for (int i = 0; i < 4; ++i) {
            q_act[i] = mlxk_silu<InT>(x_q[i]);
            k_act[i] = mlxk_silu<InT>(x_k[i]);
            const float qa = float(q_act[i]), ka = float(k_act[i]);
            q_sum += MLXK_MUL(qa, qa);
            k_sum += MLXK_MUL(ka, ka);
          }
          q_sum = simd_sum(q_sum);
          k_sum = simd_sum(k_sum);
          const float eps = as_type<float>(uint(EPS));
          const float q_inv = metal::precise::rsqrt(q_sum / float(Dk) + eps);
          const float k_inv = metal::precise::rsqrt(k_sum / float(Dk) + eps);
          for (int i = 0; i < n_per_t; ++i) {
            const int col = n_per_t * int(dk_idx) + i;
            const InT qa = Dk == 128 ? q_act[i] : mlxk_silu<InT>(x_[q_at + col]);
            const InT ka = Dk == 128 ? k_act[i] : mlxk_silu<InT>(x_[k_at + col]);
            qk_tg[slot][col] = static_cast<float>(qscale[col] * InT(float(qa) * q_inv));
            qk_tg[slot][Dk + col] = static_cast<float>(kscale[col] * InT(float(ka) * k_inv));
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int i = 0; i < n_per_t; ++i) {
          q_t[i] = qk_tg[slot][n_per_t * dk_idx + i];
          k_t[i] = qk_tg[slot][Dk + n_per_t * dk_idx + i];
        }
        // v: lane r < ROWS activates row dv_0 + r once, and every lane takes each row's value
        // from its lane (a shuffle moves the bits unchanged; InT to float and back is exact).
        float v_lane = 0.0f;
        if (int(lane) < ROWS) {
          v_lane = static_cast<float>(mlxk_silu<InT>(x_v));
        }
        for (int r = 0; r < ROWS; ++r) {
          v_t[r] = static_cast<InT>(simd_shuffle(v_lane, r));
        }
#else
        for (int i = 0; i < n_per_t; ++i) {
          k_t[i] = static_cast<float>(k_[n_per_t * dk_idx + i]);
          q_t[i] = static_cast<float>(q_[n_per_t * dk_idx + i]);
        }
        for (int r = 0; r < ROWS; ++r) {
          v_t[r] = v_[dv_0 + r];
        }
#endif
        for (int r = 0; r < ROWS; ++r) {
          float kv_mem = 0.0f;
          for (int i = 0; i < n_per_t; ++i) {
            state[r][i] = MLXK_MUL(state[r][i], decay);
            kv_mem += MLXK_MUL(state[r][i], k_t[i]);
          }
          kv_mem = simd_sum(kv_mem);

          auto delta = (v_t[r] - kv_mem) * beta_t;

          float out = 0.0f;
          for (int i = 0; i < n_per_t; ++i) {
            state[r][i] = state[r][i] + MLXK_MUL(k_t[i], delta);
            out += MLXK_MUL(state[r][i], q_t[i]);
          }
          out = simd_sum(out);
          // Every v is read already: y goes out row by row, holding no register for later.
          if (lane == 0) {
            y[dv_0 + r] = static_cast<InT>(out);
          }
        }
      } else {
        for (int r = 0; r < ROWS; ++r) {
          y[dv_0 + r] = static_cast<InT>(0);
        }
      }
      // Increment data pointers to next time step
#ifdef MLXK_FROM_CONV
      x_ += C;
#else
      q_ += Hk * Dk;
      k_ += Hk * Dk;
      v_ += Hv * Dv;
#endif
      y += Hv * Dv;
    }
#ifdef MLXK_POOL
    // y of the tokens the row owns and does not run (all of a padding row's) is zero.
    const int span = rows[5 * b_idx + 1], dst = rows[5 * b_idx + 4];
    for (int t = T; t < span; ++t) {
      for (int r = 0; r < ROWS; ++r) {
        y[dv_0 + r] = static_cast<InT>(0);
      }
      y += Hv * Dv;
    }
    // The final state: row dst of the written rows [W, Hv, Dv, Dk] (on CUDA in place: of the
    // pool itself).
#ifdef MLXK_POOL_IN_PLACE
    auto o_state = MLXK_POOL_IN_PLACE(state_in) +
                   ((size_t(dst < 0 ? 0 : dst) * Hv + hv_idx) * Dv + dv_0) * Dk;
#else
    auto o_state = state_out + ((size_t(dst < 0 ? 0 : dst) * Hv + hv_idx) * Dv + dv_0) * Dk;
#endif
    if (dst >= 0)  // the stores below
#endif
    for (int r = 0; r < ROWS; ++r) {
      MLXK_STORE_STATE(o_state + r * Dk + n_per_t * dk_idx, state[r]);
    }
