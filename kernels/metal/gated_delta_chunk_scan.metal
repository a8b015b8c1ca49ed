// The chunked (WY / UT) gated delta rule on the GPU, second of two launches: the walk over the
// chunks, one threadgroup per (batch row, value head, tile of VT value columns), the tile's
// columns of the state H = Sᵀ ([Dk, VT]) in threadgroup memory. Per chunk, from the first
// launch's rows (gated_delta_chunk_prep.metal):
//   U = U0 − W H;  y = diag(γ) Q H + P U;  H ← γ_{C-1} H + Kdᵀ U.
// Every value column evolves on its own, so the tiles share nothing but their reads.
// Launch: grid (256, ceil(Dv / VT), B·Hv), threadgroup (256, 1, 1); template InT, Dk, Dv, Hk,
// Hv, C, VT (16 or 32). Inputs: the exact update's launch inputs (q, k, v, g, beta, state_in,
// the mask when MLXK_MASKED is defined, on CUDA a_log and dt_bias: only q, state_in and the
// mask are read; the rest give the node the exact update's gradient), then w, u0, kd, p, gam.
// Outputs y [B, T, Hv, Dv] (InT; +0 for a masked token) and state_out [B, Hv, Dv, Dk] (f32).
    (void)k;  // the exact update's inputs that only the gradient reads
    (void)v;
    (void)g;
    (void)beta;
    constexpr int NT = 256;         // threads a threadgroup
    constexpr int KP = 8;           // key columns a panel of W and Q
    constexpr int NRG = NT / VT;    // row groups: thread tid owns column tid % VT of them
    constexpr int RPT = C / NRG;    // chunk rows a thread computes
    constexpr int KPR = Dk / NRG;   // state rows a thread updates
    const int T = q_shape[1];  // q: [B, T, Hk, Dk]
    const int NC = (T + C - 1) / C;
    const int tid = int(thread_position_in_threadgroup.x);
    const int tile = int(threadgroup_position_in_grid.y);
    const int n = int(threadgroup_position_in_grid.z);
    const int b_idx = n / Hv;
    const int hv_idx = n % Hv;
    const int hk_idx = hv_idx / (Hv / Hk);
    const int col = tid % VT;
    const int rg = tid / VT;
    const int dv = tile * VT + col;
    const bool live = dv < Dv;

    threadgroup float hs[Dk][VT];       // H's tile
    threadgroup float us[C][VT];        // U's tile
    threadgroup float wp[C][KP + 1];    // a panel of W
    threadgroup float qp[C][KP + 1];    // the same panel of Q

    // state_in [B, Hv, Dv, Dk]: H[k][d] = S[d][k] (k fastest: the reads are contiguous).
    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
      hs[kq][cc] = d < Dv ? state_in[(size_t(n) * Dv + d) * Dk + kq] : 0.0f;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);

    for (int c = 0; c < NC; ++c) {
      const int t0 = c * C;
      const size_t row0 = size_t(n) * size_t(NC) * C + t0;
      const size_t qk0 = (size_t(b_idx) * T + t0) * Hk * Dk + hk_idx * Dk;
      // W H and Q H, panel by panel of KP key columns.
      float au[RPT], ay[RPT];
      for (int i = 0; i < RPT; ++i) {
        au[i] = 0.0f;
        ay[i] = 0.0f;
      }
      for (int k0 = 0; k0 < Dk; k0 += KP) {
        for (int e = tid; e < C * KP; e += NT) {
          const int t = e / KP, j = e % KP;
          wp[t][j] = w[(row0 + t) * Dk + k0 + j];
          float qv = 0.0f;
          if (t0 + t < T) qv = static_cast<float>(q[qk0 + size_t(t) * Hk * Dk + k0 + j]);
          qp[t][j] = qv;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int j = 0; j < KP; ++j) {
          const float h = hs[k0 + j][col];
          for (int i = 0; i < RPT; ++i) {
            const int t = rg + NRG * i;
            au[i] += wp[t][j] * h;
            ay[i] += qp[t][j] * h;
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      }
      for (int i = 0; i < RPT; ++i) {
        const int t = rg + NRG * i;
        us[t][col] = live ? u0[(row0 + t) * Dv + dv] - au[i] : 0.0f;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);

      // y = γ Q H + P U (P is zero above the diagonal).
      for (int i = 0; i < RPT; ++i) {
        const int t = rg + NRG * i;
        const int tt = t0 + t;
        float acc = gam[row0 + t] * ay[i];
        for (int s = 0; s <= t; ++s) acc += p[(row0 + t) * C + s] * us[s][col];
        if (tt < T && live) {
          bool act = true;
#ifdef MLXK_MASKED
          act = mask[b_idx * T + tt];
#endif
          y[((size_t(b_idx) * T + tt) * Hv + hv_idx) * Dv + dv] =
              act ? static_cast<InT>(acc) : static_cast<InT>(0);
        }
      }

      // H ← γ_{C-1} H + Kdᵀ U: thread tid owns rows rg·KPR .. rg·KPR + KPR - 1 of its column.
      const float decay = gam[row0 + C - 1];
      float hn[KPR];
      for (int j = 0; j < KPR; ++j) hn[j] = decay * hs[rg * KPR + j][col];
      for (int t = 0; t < C; ++t) {
        const float u = us[t][col];
        for (int j = 0; j < KPR; ++j) hn[j] += kd[(row0 + t) * Dk + rg * KPR + j] * u;
      }
      for (int j = 0; j < KPR; ++j) hs[rg * KPR + j][col] = hn[j];
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    }

    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
      if (d < Dv) state_out[(size_t(n) * Dv + d) * Dk + kq] = hs[kq][cc];
    }
