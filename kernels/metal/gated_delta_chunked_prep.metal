// The chunked (WY / UT) gated delta rule on the GPU, first of two launches: the work within each
// chunk of C tokens, all chunks and value heads in parallel (docs/DESIGN.md §3 "The chunked
// form", docs/backends.md; its bounds in §4 "Chunked update", docs/numerics.md; the maths as in
// src/cpu/gated_delta/chunked/mod.rs). Per chunk of one (batch row, value head), with keys
// K, queries Q, values V and gates g, β of its C tokens (a masked token, and a token past T in
// the last chunk, is an identity step: g = 1, β = 0, its k, q, v read as 0):
//   γ_t = g_0 ⋯ g_t,  Γ(t, s) = g_{s+1} ⋯ g_t (running products, never a ratio),
//   A[t, s] = β_t Γ(t, s) k_t·k_s (s < t),  P[t, s] = Γ(t, s) q_t·k_s (s ≤ t, else 0),
//   W = (I + A)⁻¹ diag(β γ) K,  U0 = (I + A)⁻¹ diag(β) V  ((I + A)⁻¹ row by row, then products),
//   Kd_t = Γ(C - 1, t) k_t.
// The second launch (gated_delta_chunked_scan.metal) walks the chunks with the state H = Sᵀ:
// U = U0 − W H, y = diag(γ) Q H + P U, H ← γ_{C-1} H + Kdᵀ U.
// Launch: grid (256, NC, B·Hv), threadgroup (256, 1, 1), NC = ceil(T / C); template InT, Dk,
// Dv, Hk, Hv, C (16 ≤ C ≤ 64, a multiple of 16). Inputs q, k, v [B, T, H, D], g, beta
// [B, T, Hv] (on CUDA a and b, with a_log and dt_bias: kernels/cuda/gates.cuh), the mask [B, T]
// when MLXK_MASKED is defined (the launch's header). Outputs (float32, rows of the padded token
// axis Tp = NC·C per (batch row, value head)): w [B·Hv, Tp, Dk], u0 [B·Hv, Tp, Dv],
// kd [B·Hv, Tp, Dk], p [B·Hv, Tp, C], gam [B·Hv, Tp] (γ).
// With MLXK_POOL defined (a pool or packed call; the launch's header), the rows [R, 5]
// (node::gated_delta::Pool: tok0, span, len, src, dst) and the chunk table chunks [NCH, 2]
// (chunk j: chunk c of row r) come after the mask: grid (256, NCH, Hv); row r's tokens start at
// tok0 of the flattened token axis and len of them run (the mask, where given, is read at
// tok0 + t); the outputs are [Hv, NCH·C, ·], chunk j at rows j·C.
#ifndef MLXK_GATE_DECAY_AT  // token t's gates: read from g and beta (computed on CUDA)
#define MLXK_GATE_DECAY_AT(t) g_[(t) * Hv + hv_idx]
#define MLXK_GATE_BETA_AT(t) beta_[(t) * Hv + hv_idx]
#endif
    constexpr int NT = 256;       // threads a threadgroup
    constexpr int KP = 16;        // key columns a panel of the Gram products
    constexpr int NB = C / 4;     // 4×4 blocks a side of the C×C Gram products
    constexpr int CP = C + 1;     // row stride of A and of the panels (fewer bank conflicts)
    constexpr int NJ = Dk + Dv;   // columns of the right-hand sides [β γ K | β V]
    constexpr int SP = 8;         // tokens a panel of the right-hand sides
    constexpr int JW = 256;       // right-hand side columns a pass (8 a lane)
    constexpr int RP = C / 8;     // solution rows a thread owns (8 row blocks)
    constexpr int PE = (C * KP + NT - 1) / NT;  // Gram panel values a thread loads
    constexpr int XE = (SP * JW + NT - 1) / NT; // right-hand side values a thread loads
    constexpr int SB = 2 * KP * CP > SP * JW ? 2 * KP * CP : SP * JW;
    const int tid = int(thread_position_in_threadgroup.x);
#ifdef MLXK_POOL
    // Grid y: chunk jc of the chunk table, chunk c of row r (its first token tok0 of the
    // flattened token axis, T = len tokens that run); rows of the outputs [Hv, NCH·C, ·].
    (void)k_shape;  // MLX passes it (the text names it), unused here
    const int jc = int(threadgroup_position_in_grid.y);
    const int hv_idx = int(threadgroup_position_in_grid.z);
    const int r = chunks[2 * jc], c = chunks[2 * jc + 1];
    const size_t base = size_t(rows[5 * r]);
    const int T = rows[5 * r + 2];
    const size_t row0 = (size_t(hv_idx) * size_t(chunks_shape[0]) + jc) * C;
#else
    const int T = k_shape[1];  // k: [B, T, Hk, Dk]
    const int NC = (T + C - 1) / C;
    const int c = int(threadgroup_position_in_grid.y);
    const int n = int(threadgroup_position_in_grid.z);
    const int b_idx = n / Hv;
    const int hv_idx = n % Hv;
    const size_t base = size_t(b_idx) * T;  // the row's first token (flattened)
    // The chunk's first row in the outputs.
    const size_t row0 = size_t(n) * size_t(NC) * C + c * C;
#endif
    const int hk_idx = hv_idx / (Hv / Hk);
    const int t0 = c * C;
    auto g_ = g + base * Hv;
    auto beta_ = beta + base * Hv;
    // Token t's offset in q and k (of its key head) and in v (of its value head).
    const size_t qk0 = (base + t0) * Hk * Dk + hk_idx * Dk;
    const size_t v0 = (base + t0) * Hv * Dv + hv_idx * Dv;

    threadgroup float gl[C];      // g_t (1 where inactive)
    threadgroup float bl[C];      // β_t (0 where inactive)
    threadgroup float gm[C];      // γ_t
    threadgroup float gs[C];      // Γ(C - 1, t)
    threadgroup int on[C];        // token t is real and unmasked
    threadgroup float am[C][CP];  // A, then (I + A)⁻¹ below its diagonal
    threadgroup float sb[SB];     // panels: K and Q columns, then right-hand side rows

    if (tid < C) {
      const int t = t0 + tid;
      bool act = t < T;
#ifdef MLXK_MASKED
      act = act && mask[base + t];
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

    // The Gram products K Kᵀ and Q Kᵀ on and below the diagonal: thread tid < NB (NB + 1) / 2
    // owns the 4×4 block (bt, bs), bs ≤ bt. Panels of KP key columns, column-major in sb (K at
    // 0, Q at KP·CP), each loaded into registers while the one before is used.
    int bt = 0;
    while ((bt + 1) * (bt + 2) / 2 <= tid) ++bt;
    const int bs = tid - bt * (bt + 1) / 2;
    const bool gram = bt < NB;
    float kk[4][4], qk[4][4];
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        kk[i][j] = 0.0f;
        qk[i][j] = 0.0f;
      }
    }
    float nk[PE], nq[PE];  // the next panel's values, this thread's share
    for (int i = 0; i < PE; ++i) {
      const int e = tid + NT * i, t = e / KP, j = e % KP;
      nk[i] = 0.0f;
      nq[i] = 0.0f;
      if (e < C * KP && on[t] != 0) {
        nk[i] = static_cast<float>(k[qk0 + size_t(t) * Hk * Dk + j]);
        nq[i] = static_cast<float>(q[qk0 + size_t(t) * Hk * Dk + j]);
      }
    }
    for (int k0 = 0; k0 < Dk; k0 += KP) {
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      for (int i = 0; i < PE; ++i) {
        const int e = tid + NT * i, t = e / KP, j = e % KP;
        if (e < C * KP) {
          sb[j * CP + t] = nk[i];
          sb[KP * CP + j * CP + t] = nq[i];
        }
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      if (k0 + KP < Dk) {
        for (int i = 0; i < PE; ++i) {
          const int e = tid + NT * i, t = e / KP, j = e % KP;
          nk[i] = 0.0f;
          nq[i] = 0.0f;
          if (e < C * KP && on[t] != 0) {
            nk[i] = static_cast<float>(k[qk0 + size_t(t) * Hk * Dk + k0 + KP + j]);
            nq[i] = static_cast<float>(q[qk0 + size_t(t) * Hk * Dk + k0 + KP + j]);
          }
        }
      }
      if (gram) {
        for (int j = 0; j < KP; ++j) {
          float kt[4], qt[4], ks[4];
          for (int i = 0; i < 4; ++i) {
            kt[i] = sb[j * CP + 4 * bt + i];
            qt[i] = sb[KP * CP + j * CP + 4 * bt + i];
            ks[i] = sb[j * CP + 4 * bs + i];
          }
          for (int i = 0; i < 4; ++i) {
            for (int l = 0; l < 4; ++l) {
              kk[i][l] += kt[i] * ks[l];
              qk[i][l] += qt[i] * ks[l];
            }
          }
        }
      }
    }
    // P (to the output) and A (to am), with the running products Γ(t, s) = g_{s+1} ⋯ g_t;
    // the blocks above the diagonal are zeros.
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
    for (int e = tid; e < C * C; e += NT) {
      const int t = e / C, s = e % C;
      if (s / 4 > t / 4) {
        p[(row0 + t) * C + s] = 0.0f;
        am[t][s] = 0.0f;
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);

    // The right-hand sides' first panel (k and v as loaded; 0 where inactive), loaded while the
    // inversion below runs; each later panel while the one before is used.
    float xr[XE];
    for (int i = 0; i < XE; ++i) {
      const int e = tid + NT * i, s = e / JW, j = e % JW;
      xr[i] = 0.0f;
      if (e < SP * JW && on[s] != 0) {
        if (j < Dk) {
          xr[i] = static_cast<float>(k[qk0 + size_t(s) * Hk * Dk + j]);
        } else if (j < NJ) {
          xr[i] = static_cast<float>(v[v0 + size_t(s) * Hv * Dv + (j - Dk)]);
        }
      }
    }

    // (I + A)⁻¹ in place, row by row: Tm[t][s] = −A[t][s] − Σ_{s<u<t} A[t][u] Tm[u][s].
    for (int t = 1; t < C; ++t) {
      float x = 0.0f;
      if (tid < t) {
        x = -am[t][tid];
        for (int u = tid + 1; u < t; ++u) x -= am[t][u] * am[u][tid];
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      if (tid < t) am[t][tid] = x;
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    }

    // W and U0 = Tm [β γ K | β V]: thread (rb, lane) owns rows rb·RP .. rb·RP + RP − 1 and
    // columns j0 + lane + 32 c (c < 8) of each pass; the right-hand sides go through sb, SP rows
    // at a time (Kd = Γ(C − 1, t) k_t written on the way).
    const int rb = tid / 32, lane = tid % 32;
    for (int j0 = 0; j0 < NJ; j0 += JW) {
      float acc[RP][8];
      for (int i = 0; i < RP; ++i) {
        for (int cc = 0; cc < 8; ++cc) acc[i][cc] = 0.0f;
      }
      for (int s0 = 0; s0 < C; s0 += SP) {
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int i = 0; i < XE; ++i) {
          const int e = tid + NT * i, ss = e / JW, j = j0 + e % JW, s = s0 + ss;
          if (e < SP * JW) {
            float x = 0.0f;
            if (j < Dk) {
              x = (bl[s] * gm[s]) * xr[i];
              kd[(row0 + s) * Dk + j] = gs[s] * xr[i];
            } else if (j < NJ) {
              x = bl[s] * xr[i];
            }
            sb[e] = x;
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        {
          // The next panel: s0 + SP of this pass, or the first of the next.
          const int nj0 = s0 + SP < C ? j0 : j0 + JW;
          const int ns0 = s0 + SP < C ? s0 + SP : 0;
          for (int i = 0; i < XE; ++i) {
            const int e = tid + NT * i, s = ns0 + e / JW, j = nj0 + e % JW;
            xr[i] = 0.0f;
            if (e < SP * JW && nj0 < NJ && on[s] != 0) {
              if (j < Dk) {
                xr[i] = static_cast<float>(k[qk0 + size_t(s) * Hk * Dk + j]);
              } else if (j < NJ) {
                xr[i] = static_cast<float>(v[v0 + size_t(s) * Hv * Dv + (j - Dk)]);
              }
            }
          }
        }
        if (s0 < (rb + 1) * RP) {  // Tm[t][s] = 0 for s > t
          for (int ss = 0; ss < SP; ++ss) {
            const int s = s0 + ss;
            float xv[8];
            for (int cc = 0; cc < 8; ++cc) xv[cc] = sb[ss * JW + lane + 32 * cc];
            for (int i = 0; i < RP; ++i) {
              const int t = rb * RP + i;
              const float tm = s == t ? 1.0f : am[t][s];
              for (int cc = 0; cc < 8; ++cc) acc[i][cc] += tm * xv[cc];
            }
          }
        }
      }
      for (int i = 0; i < RP; ++i) {
        const int t = rb * RP + i;
        for (int cc = 0; cc < 8; ++cc) {
          const int j = j0 + lane + 32 * cc;
          if (j < Dk) {
            w[(row0 + t) * Dk + j] = acc[i][cc];
          } else if (j < NJ) {
            u0[(row0 + t) * Dv + (j - Dk)] = acc[i][cc];
          }
        }
      }
    }
