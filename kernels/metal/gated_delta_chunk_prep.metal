// The chunked (WY / UT) gated delta rule on the GPU, first of two launches: the work within each
// chunk of C tokens, all chunks and value heads in parallel (docs/DESIGN.md §3 "Chunked update";
// the maths as in src/cpu/chunked/mod.rs). Per chunk of one (batch row, value head), with keys
// K, queries Q, values V and gates g, β of its C tokens (a masked token, and a token past T in
// the last chunk, is an identity step: g = 1, β = 0, its k, q, v read as 0):
//   γ_t = g_0 ⋯ g_t,  Γ(t, s) = g_{s+1} ⋯ g_t (running products, never a ratio),
//   A[t, s] = β_t Γ(t, s) k_t·k_s (s < t),  P[t, s] = Γ(t, s) q_t·k_s (s ≤ t, else 0),
//   W = (I + A)⁻¹ diag(β γ) K,  U0 = (I + A)⁻¹ diag(β) V  (forward substitution, row by row),
//   Kd_t = Γ(C - 1, t) k_t.
// The second launch (gated_delta_chunk_scan.metal) walks the chunks with the state H = Sᵀ:
// U = U0 − W H, y = diag(γ) Q H + P U, H ← γ_{C-1} H + Kdᵀ U.
// Launch: grid (256, NC, B·Hv), threadgroup (256, 1, 1), NC = ceil(T / C); template InT, Dk,
// Dv, Hk, Hv, C (16 ≤ C ≤ 64, a multiple of 16). Inputs q, k, v [B, T, H, D], g, beta
// [B, T, Hv] (on CUDA a and b, with a_log and dt_bias: kernels/cuda/gates.cuh), the mask [B, T]
// when MLXK_MASKED is defined (the launch's header). Outputs (float32, rows of the padded token
// axis Tp = NC·C per (batch row, value head)): w [B·Hv, Tp, Dk], u0 [B·Hv, Tp, Dv],
// kd [B·Hv, Tp, Dk], p [B·Hv, Tp, C], gam [B·Hv, Tp] (γ).
#ifndef MLXK_GATE_DECAY_AT  // token t's gates: read from g and beta (computed on CUDA)
#define MLXK_GATE_DECAY_AT(t) g_[(t) * Hv + hv_idx]
#define MLXK_GATE_BETA_AT(t) beta_[(t) * Hv + hv_idx]
#endif
    constexpr int NT = 256;     // threads a threadgroup
    constexpr int KP = 16;      // key columns a panel of the Gram products
    constexpr int NB = C / 4;   // 4×4 blocks a side of the C×C Gram products
    const int T = k_shape[1];  // k: [B, T, Hk, Dk]
    const int NC = (T + C - 1) / C;
    const int tid = int(thread_position_in_threadgroup.x);
    const int c = int(threadgroup_position_in_grid.y);
    const int n = int(threadgroup_position_in_grid.z);
    const int b_idx = n / Hv;
    const int hv_idx = n % Hv;
    const int hk_idx = hv_idx / (Hv / Hk);
    const int t0 = c * C;
    auto g_ = g + b_idx * T * Hv;
    auto beta_ = beta + b_idx * T * Hv;
    // The chunk's first row in the outputs.
    const size_t row0 = size_t(n) * size_t(NC) * C + t0;
    // Token t's offset in q and k (of its key head) and in v (of its value head).
    const size_t qk0 = (size_t(b_idx) * T + t0) * Hk * Dk + hk_idx * Dk;
    const size_t v0 = (size_t(b_idx) * T + t0) * Hv * Dv + hv_idx * Dv;

    threadgroup float gl[C];       // g_t (1 where inactive)
    threadgroup float bl[C];       // β_t (0 where inactive)
    threadgroup float gm[C];       // γ_t
    threadgroup float gs[C];       // Γ(C - 1, t)
    threadgroup int on[C];         // token t is real and unmasked
    threadgroup float am[C][C + 1];   // A
    threadgroup float kp[KP][C + 1];  // a panel of K, column-major
    threadgroup float qp[KP][C + 1];  // the same panel of Q

    if (tid < C) {
      const int t = t0 + tid;
      bool act = t < T;
#ifdef MLXK_MASKED
      act = act && mask[b_idx * T + t];
#endif
      float decay = 1.0f, beta_t = 0.0f;
      if (act) {
        decay = MLXK_GATE_DECAY_AT(t);
        beta_t = MLXK_GATE_BETA_AT(t);
      }
      gl[tid] = decay;
      bl[tid] = beta_t;
      on[tid] = act ? 1 : 0;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (tid == 0) {
      float x = 1.0f;
      for (int i = 0; i < C; ++i) {
        x = x * gl[i];
        gm[i] = x;
      }
    } else if (tid == 32) {
      float x = 1.0f;
      for (int i = C - 1; i >= 0; --i) {
        gs[i] = x;
        x = x * gl[i];
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (tid < C) {
      gam[row0 + tid] = gm[tid];
    }

    // The Gram products K Kᵀ and Q Kᵀ: thread tid < NB² owns the 4×4 block (bt, bs).
    const bool gram = tid < NB * NB;
    const int bt = tid / NB;
    const int bs = tid % NB;
    float kk[4][4], qk[4][4];
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        kk[i][j] = 0.0f;
        qk[i][j] = 0.0f;
      }
    }
    for (int k0 = 0; k0 < Dk; k0 += KP) {
      for (int e = tid; e < C * KP; e += NT) {
        const int t = e / KP, j = e % KP;
        float kv = 0.0f, qv = 0.0f;
        if (on[t] != 0) {
          const size_t at = qk0 + size_t(t) * Hk * Dk + k0 + j;
          kv = static_cast<float>(k[at]);
          qv = static_cast<float>(q[at]);
        }
        kp[j][t] = kv;
        qp[j][t] = qv;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      if (gram) {
        for (int j = 0; j < KP; ++j) {
          float kt[4], qt[4], ks[4];
          for (int i = 0; i < 4; ++i) {
            kt[i] = kp[j][4 * bt + i];
            qt[i] = qp[j][4 * bt + i];
            ks[i] = kp[j][4 * bs + i];
          }
          for (int i = 0; i < 4; ++i) {
            for (int l = 0; l < 4; ++l) {
              kk[i][l] += kt[i] * ks[l];
              qk[i][l] += qt[i] * ks[l];
            }
          }
        }
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    }
    if (gram) {
      for (int l = 0; l < 4; ++l) {
        const int s = 4 * bs + l;
        float G = 1.0f;  // Γ(4 bt, s) where s ≤ 4 bt
        for (int u = s + 1; u <= 4 * bt; ++u) G = G * gl[u];
        for (int i = 0; i < 4; ++i) {
          const int t = 4 * bt + i;
          if (i > 0 && t > s) G = G * gl[t];
          p[(row0 + t) * C + s] = t >= s ? G * qk[i][l] : 0.0f;
          am[t][s] = t > s ? bl[t] * (G * kk[i][l]) : 0.0f;
        }
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);

    // W and U0 by forward substitution, one column a thread: row t is the right-hand side's row
    // minus A's row t times the rows before it (this thread's own earlier stores).
    for (int j = tid; j < Dk + Dv; j += NT) {
      if (j < Dk) {
        for (int t = 0; t < C; ++t) {
          float kv = 0.0f;
          if (on[t] != 0) kv = static_cast<float>(k[qk0 + size_t(t) * Hk * Dk + j]);
          float x = (bl[t] * gm[t]) * kv;
          for (int s = 0; s < t; ++s) x -= am[t][s] * w[(row0 + s) * Dk + j];
          w[(row0 + t) * Dk + j] = x;
          kd[(row0 + t) * Dk + j] = gs[t] * kv;
        }
      } else {
        const int d = j - Dk;
        for (int t = 0; t < C; ++t) {
          float vv = 0.0f;
          if (on[t] != 0) vv = static_cast<float>(v[v0 + size_t(t) * Hv * Dv + d]);
          float x = bl[t] * vv;
          for (int s = 0; s < t; ++s) x -= am[t][s] * u0[(row0 + s) * Dv + d];
          u0[(row0 + t) * Dv + d] = x;
        }
      }
    }
