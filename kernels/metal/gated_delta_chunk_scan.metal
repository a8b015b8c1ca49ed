// The chunked (WY / UT) gated delta rule on the GPU, second of two launches: the walk over the
// chunks, one threadgroup per (batch row, value head, tile of VT value columns), the tile's
// columns of the state H = Sᵀ ([Dk, VT]) in threadgroup memory. Per chunk, from the first
// launch's rows (gated_delta_chunk_prep.metal):
//   U = U0 − W H;  y = diag(γ) Q H + P U;  H ← γ_{C-1} H + Kdᵀ U.
// Every value column evolves on its own, so the tiles share nothing but their reads.
// Launch: grid (256, ceil(Dv / VT), B·Hv), threadgroup (256, 1, 1); template InT, Dk, Dv, Hk,
// Hv, C, VT (8, 16 or 32). Inputs: the exact update's launch inputs (q, k, v, g, beta, state_in,
// the mask when MLXK_MASKED is defined, on CUDA a_log and dt_bias: only q, state_in and the
// mask are read; the rest give the node the exact update's gradient), then w, u0, kd, p, gam.
// Outputs y [B, T, Hv, Dv] (InT; +0 for a masked token) and state_out [B, Hv, Dv, Dk] (f32).
    (void)k;  // the exact update's inputs that only the gradient reads
    (void)v;
    (void)g;
    (void)beta;
    constexpr int NT = 256;               // threads a threadgroup
    constexpr int CC = 4;                 // tile columns a thread owns: cb + CB·c, c < CC
    constexpr int CB = VT / CC;
    constexpr int RB = NT / CB;           // row groups: thread tid is in group tid / CB
    constexpr int RR = (C + RB - 1) / RB; // chunk rows a thread owns: rb + RB·i
    constexpr int KR = (Dk + RB - 1) / RB;  // state rows a thread owns: rb·KR + i
    constexpr int KP = 16;                // key columns a panel of W and Q; tokens a panel of Kd
    constexpr int CP = C + 1;             // the panels' row stride (fewer bank conflicts)
    constexpr int PE = (C * KP + NT - 1) / NT;  // W and Q panel values a thread loads
    constexpr int SB = 2 * KP * CP > KP * Dk ? 2 * KP * CP : KP * Dk;
    const int T = q_shape[1];  // q: [B, T, Hk, Dk]
    const int NC = (T + C - 1) / C;
    const int tid = int(thread_position_in_threadgroup.x);
    const int tile = int(threadgroup_position_in_grid.y);
    const int n = int(threadgroup_position_in_grid.z);
    const int b_idx = n / Hv;
    const int hv_idx = n % Hv;
    const int hk_idx = hv_idx / (Hv / Hk);
    const int cb = tid % CB;
    const int rb = tid / CB;

    threadgroup float hs[Dk][VT];  // H's tile
    threadgroup float us[C][VT];   // U's tile
    threadgroup float sb[SB];      // panels: W and Q (column-major), P, Kd

    // state_in [B, Hv, Dv, Dk]: H[k][d] = S[d][k] (k fastest: the reads are contiguous).
    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
      hs[kq][cc] = d < Dv ? state_in[(size_t(n) * Dv + d) * Dk + kq] : 0.0f;
    }

    for (int c = 0; c < NC; ++c) {
      const int t0 = c * C;
      const size_t row0 = size_t(n) * size_t(NC) * C + t0;
      const size_t qk0 = (size_t(b_idx) * T + t0) * Hk * Dk + hk_idx * Dk;
      // W H and Q H, panel by panel of KP key columns, each loaded into registers while the one
      // before is used.
      float au[RR][CC], ay[RR][CC];
      for (int i = 0; i < RR; ++i) {
        for (int cc = 0; cc < CC; ++cc) {
          au[i][cc] = 0.0f;
          ay[i][cc] = 0.0f;
        }
      }
      float nw[PE], nq[PE];
      for (int i = 0; i < PE; ++i) {
        const int e = tid + NT * i, t = e / KP, j = e % KP;
        nw[i] = 0.0f;
        nq[i] = 0.0f;
        if (e < C * KP) {
          nw[i] = w[(row0 + t) * Dk + j];
          if (t0 + t < T) nq[i] = static_cast<float>(q[qk0 + size_t(t) * Hk * Dk + j]);
        }
      }
      for (int k0 = 0; k0 < Dk; k0 += KP) {
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int i = 0; i < PE; ++i) {
          const int e = tid + NT * i, t = e / KP, j = e % KP;
          if (e < C * KP) {
            sb[j * CP + t] = nw[i];
            sb[KP * CP + j * CP + t] = nq[i];
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        if (k0 + KP < Dk) {
          for (int i = 0; i < PE; ++i) {
            const int e = tid + NT * i, t = e / KP, j = e % KP;
            nw[i] = 0.0f;
            nq[i] = 0.0f;
            if (e < C * KP) {
              nw[i] = w[(row0 + t) * Dk + k0 + KP + j];
              if (t0 + t < T) {
                nq[i] = static_cast<float>(q[qk0 + size_t(t) * Hk * Dk + k0 + KP + j]);
              }
            }
          }
        }
        for (int j = 0; j < KP; ++j) {
          float h[CC];
          for (int cc = 0; cc < CC; ++cc) h[cc] = hs[k0 + j][cb + CB * cc];
          for (int i = 0; i < RR; ++i) {
            const int t = rb + RB * i;
            if (t < C) {
              const float wv = sb[j * CP + t], qv = sb[KP * CP + j * CP + t];
              for (int cc = 0; cc < CC; ++cc) {
                au[i][cc] += wv * h[cc];
                ay[i][cc] += qv * h[cc];
              }
            }
          }
        }
      }
      for (int i = 0; i < RR; ++i) {
        const int t = rb + RB * i;
        for (int cc = 0; cc < CC; ++cc) {
          const int dv = tile * VT + cb + CB * cc;
          if (t < C) us[t][cb + CB * cc] = dv < Dv ? u0[(row0 + t) * Dv + dv] - au[i][cc] : 0.0f;
        }
      }

      // y = γ Q H + P U (P is zero above the diagonal), P through sb KP columns at a time.
      float py[RR][CC];
      for (int i = 0; i < RR; ++i) {
        for (int cc = 0; cc < CC; ++cc) py[i][cc] = 0.0f;
      }
      for (int s0 = 0; s0 < C; s0 += KP) {
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int e = tid; e < C * KP; e += NT) {
          const int t = e / KP, j = e % KP;
          sb[j * CP + t] = p[(row0 + t) * C + s0 + j];
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int j = 0; j < KP; ++j) {
          float u[CC];
          for (int cc = 0; cc < CC; ++cc) u[cc] = us[s0 + j][cb + CB * cc];
          for (int i = 0; i < RR; ++i) {
            const int t = rb + RB * i;
            if (t < C) {
              const float pv = sb[j * CP + t];
              for (int cc = 0; cc < CC; ++cc) py[i][cc] += pv * u[cc];
            }
          }
        }
      }
      for (int i = 0; i < RR; ++i) {
        const int t = rb + RB * i;
        const int tt = t0 + t;
        if (t < C && tt < T) {
          bool act = true;
#ifdef MLXK_MASKED
          act = mask[b_idx * T + tt];
#endif
          const float gt = gam[row0 + t];
          for (int cc = 0; cc < CC; ++cc) {
            const int dv = tile * VT + cb + CB * cc;
            if (dv < Dv) {
              y[((size_t(b_idx) * T + tt) * Hv + hv_idx) * Dv + dv] =
                  act ? static_cast<InT>(gt * ay[i][cc] + py[i][cc]) : static_cast<InT>(0);
            }
          }
        }
      }

      // H ← γ_{C-1} H + Kdᵀ U: thread tid owns rows rb·KR .. rb·KR + KR − 1 of its columns; Kd
      // through sb KP tokens at a time.
      const float decay = gam[row0 + C - 1];
      float hn[KR][CC];
      for (int i = 0; i < KR; ++i) {
        for (int cc = 0; cc < CC; ++cc) {
          hn[i][cc] = rb * KR + i < Dk ? decay * hs[rb * KR + i][cb + CB * cc] : 0.0f;
        }
      }
      for (int s0 = 0; s0 < C; s0 += KP) {
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int e = tid; e < KP * Dk; e += NT) sb[e] = kd[(row0 + s0) * Dk + e];
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int j = 0; j < KP; ++j) {
          float u[CC];
          for (int cc = 0; cc < CC; ++cc) u[cc] = us[s0 + j][cb + CB * cc];
          for (int i = 0; i < KR; ++i) {
            if (rb * KR + i < Dk) {
              const float kv = sb[j * Dk + rb * KR + i];
              for (int cc = 0; cc < CC; ++cc) hn[i][cc] += kv * u[cc];
            }
          }
        }
      }
      for (int i = 0; i < KR; ++i) {
        for (int cc = 0; cc < CC; ++cc) {
          if (rb * KR + i < Dk) hs[rb * KR + i][cb + CB * cc] = hn[i][cc];
        }
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);

    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
      if (d < Dv) state_out[(size_t(n) * Dv + d) * Dk + kq] = hs[kq][cc];
    }
