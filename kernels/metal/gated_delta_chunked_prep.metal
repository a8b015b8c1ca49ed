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
// Products on the matrix tiles (the launch's header, tiles.h: simdgroup matrices on Metal,
// tensor cores or FMAs on MLX CUDA), from threadgroup memory: K Kᵀ and Q Kᵀ in tiles of 16 x 8
// tokens (those above the diagonal skipped), W and U0 = Tm [β γ K | β V] in tiles of 16 tokens x
// 8 columns (Tm's blocks above the diagonal skipped); the inverse (I + A)⁻¹ stays scalar.
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
    constexpr int NSG = NT / 32;  // SIMD groups
    constexpr int GT = (C / 16) * (C / 8);  // the Gram products' tiles (16 x 8 tokens)
    constexpr int GPT = (GT + NSG - 1) / NSG;
    constexpr int CP = C + 1;     // row stride of A and of the panels (fewer bank conflicts)
    constexpr int NJ = Dk + Dv;   // columns of the right-hand sides [β γ K | β V]
    constexpr int SP = 8;         // tokens a panel of the right-hand sides
    constexpr int JW = 256;       // right-hand side columns a pass (8 a lane)
    constexpr int XT = (C / 16) * (JW / 8);  // W and U0's tiles a pass (16 tokens x 8 columns)
    constexpr int XPT = XT / NSG;
    constexpr int PE = (C * KP + NT - 1) / NT;  // Gram panel values a thread loads
    constexpr int XE = (SP * JW + NT - 1) / NT; // right-hand side values a thread loads
    constexpr int SB = 2 * KP * CP > SP * JW ? 2 * KP * CP : SP * JW;
    const int tid = int(thread_position_in_threadgroup.x);
    const uint lane = uint(tid % 32);
    const int sg = tid / 32;
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

    // The Gram products K Kᵀ and Q Kᵀ on and below the diagonal: SIMD group sg owns tiles
    // sg + NSG·x (rows t0 .. t0 + 15, columns s0 .. s0 + 7; those with s0 > t0 + 15 are zeros).
    // Panels of KP key columns, column-major in sb (K at 0, Q at KP·CP), each loaded into
    // registers while the one before is used.
    mlxk_tile::acc16x8 kk[GPT], qk[GPT];
    for (int x = 0; x < GPT; ++x) {
      mlxk_tile::fill(kk[x], 0.0f);
      mlxk_tile::fill(qk[x], 0.0f);
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
      for (int x = 0; x < GPT; ++x) {
        const int ti = sg + NSG * x;
        const int gt0 = ti / (C / 8) * 16, gs0 = ti % (C / 8) * 8;
        if (ti >= GT || gs0 > gt0 + 15) continue;
        for (int j = 0; j < KP; j += 8) {
          mlxk_tile::a16x8 ka, qa;
          mlxk_tile::b8x8 kb;
          mlxk_tile::load_a(ka, sb + j * CP + gt0, CP, true, lane);
          mlxk_tile::load_a(qa, sb + KP * CP + j * CP + gt0, CP, true, lane);
          mlxk_tile::load_b(kb, sb + j * CP + gs0, CP, false, lane);
          mlxk_tile::mma(kk[x], ka, kb);
          mlxk_tile::mma(qk[x], qa, kb);
        }
      }
    }
    // P (to the output) and A (to am), with the running products Γ(t, s) = g_{s+1} ⋯ g_t
    // (in that order); above the diagonal zeros.
    for (int x = 0; x < GPT; ++x) {
      const int ti = sg + NSG * x;
      if (ti >= GT) continue;
      const int gt0 = ti / (C / 8) * 16, gs0 = ti % (C / 8) * 8;
      for (int e = 0; e < mlxk_tile::kElems; ++e) {
        const int t = gt0 + mlxk_tile::row(lane, e), s = gs0 + mlxk_tile::col(lane, e);
        float G = 1.0f;
        for (int u = s + 1; u <= t; ++u) G = G * gl[u];
        p[(row0 + t) * C + s] = t >= s ? G * mlxk_tile::get(qk[x], e) : 0.0f;
        am[t][s] = t > s ? bl[t] * (G * mlxk_tile::get(kk[x], e)) : 0.0f;
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
    // Tm's diagonal (ones), for the products below (read after their first barrier).
    if (tid < C) am[tid][tid] = 1.0f;

    // W and U0 = Tm [β γ K | β V]: SIMD group sg owns tiles sg + NSG·x (rows t0 .. t0 + 15,
    // columns j0 + n0 .. j0 + n0 + 7) of each pass of JW columns; the right-hand sides go
    // through sb, SP rows at a time (Kd = Γ(C − 1, t) k_t written on the way).
    for (int j0 = 0; j0 < NJ; j0 += JW) {
      mlxk_tile::acc16x8 acc[XPT];
      for (int x = 0; x < XPT; ++x) mlxk_tile::fill(acc[x], 0.0f);
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
        for (int x = 0; x < XPT; ++x) {
          const int ti = sg + NSG * x;
          const int xt0 = ti / (JW / 8) * 16, n0 = ti % (JW / 8) * 8;
          if (s0 > xt0 + 15 || j0 + n0 >= NJ) continue;  // Tm[t][s] = 0 for s > t
          mlxk_tile::a16x8 ta;
          mlxk_tile::b8x8 xb;
          mlxk_tile::load_a(ta, &am[xt0][s0], CP, false, lane);
          mlxk_tile::load_b(xb, sb + n0, JW, false, lane);
          mlxk_tile::mma(acc[x], ta, xb);
        }
      }
      for (int x = 0; x < XPT; ++x) {
        const int ti = sg + NSG * x;
        const int xt0 = ti / (JW / 8) * 16, n0 = ti % (JW / 8) * 8;
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int t = xt0 + mlxk_tile::row(lane, e);
          const int j = j0 + n0 + mlxk_tile::col(lane, e);
          if (j < Dk) {
            w[(row0 + t) * Dk + j] = mlxk_tile::get(acc[x], e);
          } else if (j < NJ) {
            u0[(row0 + t) * Dv + (j - Dk)] = mlxk_tile::get(acc[x], e);
          }
        }
      }
    }
