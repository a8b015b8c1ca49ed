// The chunked (WY / UT) gated delta rule on the GPU, second of two launches: the walk over the
// chunks, one threadgroup per (batch row, value head, tile of VT value columns), the tile's
// columns of the state H = Sᵀ ([Dk, VT]) in threadgroup memory. Per chunk, from the first
// launch's rows (gated_delta_chunked_prep.metal):
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
    constexpr int PE = (C * KP + NT - 1) / NT;   // W, Q or P panel values a thread loads
    constexpr int PEK = (KP * Dk + NT - 1) / NT; // Kd panel values a thread loads
    constexpr int PF = 2 * PE > PEK ? 2 * PE : PEK;
    constexpr int SB = 2 * KP * CP > KP * Dk ? 2 * KP * CP : KP * Dk;
    constexpr int NA = Dk / KP;           // a chunk's steps: NA panels of W and Q,
    constexpr int NP = C / KP;            // NP of P and NP of Kd
    constexpr int NS = NA + 2 * NP;
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

    // A chunk is NS steps, each one panel through sb: W and Q (U = U0 − W H, Q H), P (y), Kd
    // (H). Every step's panel is loaded into registers (pf) while the step before it computes,
    // across the phases and into the next chunk, so no step waits for its global loads alone.
    float pf[PF];
    float u0r[RR][CC];  // the chunk's U0 and γ, loaded with its first P panel
    float gtr[RR];
    float decay = 1.0f;
    float au[RR][CC], ay[RR][CC], py[RR][CC], hn[KR][CC];
    for (int i = 0; i < RR; ++i) {
      gtr[i] = 0.0f;
      for (int cc = 0; cc < CC; ++cc) {
        u0r[i][cc] = 0.0f;
        au[i][cc] = 0.0f;
        ay[i][cc] = 0.0f;
        py[i][cc] = 0.0f;
      }
    }
    for (int i = 0; i < KR; ++i) {
      for (int cc = 0; cc < CC; ++cc) hn[i][cc] = 0.0f;
    }
    // Step 0 of chunk 0.
    for (int i = 0; i < PE; ++i) {
      const int e = tid + NT * i, t = e / KP, j = e % KP;
      pf[i] = 0.0f;
      pf[PE + i] = 0.0f;
      if (NC > 0 && e < C * KP) {
        pf[i] = w[(size_t(n) * size_t(NC) * C + t) * Dk + j];
        if (t < T) pf[PE + i] = static_cast<float>(q[(size_t(b_idx) * T + t) * Hk * Dk + hk_idx * Dk + j]);
      }
    }
    for (int c = 0; c < NC; ++c) {
      const int t0 = c * C;
      for (int st = 0; st < NS; ++st) {
        // The panel of this step from pf into sb.
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        if (st < NA) {
          for (int i = 0; i < PE; ++i) {
            const int e = tid + NT * i, t = e / KP, j = e % KP;
            if (e < C * KP) {
              sb[j * CP + t] = pf[i];
              sb[KP * CP + j * CP + t] = pf[PE + i];
            }
          }
        } else if (st < NA + NP) {
          for (int i = 0; i < PE; ++i) {
            const int e = tid + NT * i, t = e / KP, j = e % KP;
            if (e < C * KP) sb[j * CP + t] = pf[i];
          }
        } else {
          for (int i = 0; i < PEK; ++i) {
            const int e = tid + NT * i;
            if (e < KP * Dk) sb[e] = pf[i];
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        // The next step's panel into pf (of this chunk, or step 0 of the next).
        {
          const int ns = st + 1 < NS ? st + 1 : 0;
          const int nc = st + 1 < NS ? c : c + 1;
          const size_t nrow0 = size_t(n) * size_t(NC) * C + size_t(nc) * C;
          if (nc < NC) {
            if (ns < NA) {
              const size_t nqk0 = (size_t(b_idx) * T + nc * C) * Hk * Dk + hk_idx * Dk;
              for (int i = 0; i < PE; ++i) {
                const int e = tid + NT * i, t = e / KP, j = e % KP;
                pf[i] = 0.0f;
                pf[PE + i] = 0.0f;
                if (e < C * KP) {
                  pf[i] = w[(nrow0 + t) * Dk + ns * KP + j];
                  if (nc * C + t < T) {
                    pf[PE + i] = static_cast<float>(q[nqk0 + size_t(t) * Hk * Dk + ns * KP + j]);
                  }
                }
              }
            } else if (ns < NA + NP) {
              for (int i = 0; i < PE; ++i) {
                const int e = tid + NT * i, t = e / KP, j = e % KP;
                pf[i] = 0.0f;
                if (e < C * KP) pf[i] = p[(nrow0 + t) * C + (ns - NA) * KP + j];
              }
              if (ns == NA) {
                for (int i = 0; i < RR; ++i) {
                  const int t = rb + RB * i;
                  gtr[i] = t < C ? gam[nrow0 + t] : 0.0f;
                  for (int cc = 0; cc < CC; ++cc) {
                    const int dv = tile * VT + cb + CB * cc;
                    u0r[i][cc] = t < C && dv < Dv ? u0[(nrow0 + t) * Dv + dv] : 0.0f;
                  }
                }
                decay = gam[nrow0 + C - 1];
              }
            } else {
              const size_t at = (nrow0 + size_t(ns - NA - NP) * KP) * Dk;
              for (int i = 0; i < PEK; ++i) {
                const int e = tid + NT * i;
                pf[i] = e < KP * Dk ? kd[at + e] : 0.0f;
              }
            }
          }
        }
        if (st < NA) {
          // W H and Q H over this panel's KP key columns.
          const int k0 = st * KP;
          if (st == 0) {
            for (int i = 0; i < RR; ++i) {
              for (int cc = 0; cc < CC; ++cc) {
                au[i][cc] = 0.0f;
                ay[i][cc] = 0.0f;
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
          if (st == NA - 1) {
            // U = U0 − W H (read by every thread after the next step's first barrier).
            for (int i = 0; i < RR; ++i) {
              const int t = rb + RB * i;
              for (int cc = 0; cc < CC; ++cc) {
                if (t < C) us[t][cb + CB * cc] = u0r[i][cc] - au[i][cc];
              }
            }
          }
        } else if (st < NA + NP) {
          // P U over this panel's KP tokens (P is zero above the diagonal).
          const int s0 = (st - NA) * KP;
          if (st == NA) {
            for (int i = 0; i < RR; ++i) {
              for (int cc = 0; cc < CC; ++cc) py[i][cc] = 0.0f;
            }
          }
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
          if (st == NA + NP - 1) {
            // y = γ Q H + P U.
            for (int i = 0; i < RR; ++i) {
              const int t = rb + RB * i;
              const int tt = t0 + t;
              if (t < C && tt < T) {
                bool act = true;
#ifdef MLXK_MASKED
                act = mask[b_idx * T + tt];
#endif
                for (int cc = 0; cc < CC; ++cc) {
                  const int dv = tile * VT + cb + CB * cc;
                  if (dv < Dv) {
                    y[((size_t(b_idx) * T + tt) * Hv + hv_idx) * Dv + dv] =
                        act ? static_cast<InT>(gtr[i] * ay[i][cc] + py[i][cc])
                            : static_cast<InT>(0);
                  }
                }
              }
            }
          }
        } else {
          // H ← γ_{C-1} H + Kdᵀ U over this panel's KP tokens: thread tid owns rows
          // rb·KR .. rb·KR + KR − 1 of its columns.
          const int s0 = (st - NA - NP) * KP;
          if (st == NA + NP) {
            for (int i = 0; i < KR; ++i) {
              for (int cc = 0; cc < CC; ++cc) {
                hn[i][cc] = rb * KR + i < Dk ? decay * hs[rb * KR + i][cb + CB * cc] : 0.0f;
              }
            }
          }
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
          if (st == NS - 1) {
            for (int i = 0; i < KR; ++i) {
              for (int cc = 0; cc < CC; ++cc) {
                if (rb * KR + i < Dk) hs[rb * KR + i][cb + CB * cc] = hn[i][cc];
              }
            }
          }
        }
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);

    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
      if (d < Dv) state_out[(size_t(n) * Dv + d) * Dk + kq] = hs[kq][cc];
    }
