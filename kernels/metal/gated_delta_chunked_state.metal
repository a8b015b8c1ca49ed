// The chunked (WY / UT) gated delta rule on the GPU, second of three launches: the state pass,
// the one walk over the chunks in order. One threadgroup per (batch row, value head, tile of VT
// value columns) keeps the tile's columns of the state H = Sᵀ ([Dk, VT]) in threadgroup memory
// and, per chunk, from the first launch's rows (gated_delta_chunked_prep.metal):
//   stores H (the state entering the chunk),  U = U0 − W H,  H ← γ_{C-1} H + Kdᵀ U.
// Only these two products are sequential; y (diag(γ) Q H + P U) is made from the stored states
// and U by the third launch (gated_delta_chunked_out.metal), every chunk in parallel. Every value
// column evolves on its own, so the tiles share nothing but their reads. A padded or masked
// token has W, U0 and Kd rows of zeros (the prep's identity steps), so it changes nothing.
// Products: two panel products a step, each a loop over a (rows x KP) x (KP x VT) block of
// threadgroup memory: W's panel (C x KP) times H's rows k0 .. k0 + KP, Kdᵀ's panel (Dk x KP)
// times U's rows s0 .. s0 + KP.
// Launch: grid (256, ceil(Dv / VT), B·Hv), threadgroup (256, 1, 1); template Dk, Dv, Hv, C, VT
// (8, 16 or 32). Inputs: state_in [B, Hv, Dv, Dk] (f32), w [B·Hv, Tp, Dk], u0 [B·Hv, Tp, Dv],
// kd [B·Hv, Tp, Dk], gam [B·Hv, Tp] (f32, Tp = NC·C). Outputs (f32): states
// [B·Hv, NC + 1, Dv, Dk] (slot c: the state entering chunk c, laid out as the state; slot NC:
// the final state), u [B·Hv, Tp, Dv].
// With MLXK_POOL defined (a pool or packed call; the launch's header), grid z is (row, value
// head) of R·Hv; after gam come rows [R, 5] (node::gated_delta::Pool) and firsts [R + 1] (row
// r's chunks are chunks firsts[r] .. firsts[r + 1] − 1 of the prep's chunk table): the state
// starts from the pool's row src (state_in [N, Hv, Dv, Dk]; zeros where src < 0), w, u0, kd,
// gam and u are [Hv, NCH·C, ·], states [Hv, NCH + R, Dv, Dk] (row r's slots f + r for its
// chunks f, then its final state), and the final state also goes to row dst of state_out
// [W, Hv, Dv, Dk] (not where dst < 0). The pool's node has no gradient, so this pass writes it.
    constexpr int NT = 256;                // threads a threadgroup
    constexpr int CC = VT >= 16 ? 4 : 2;   // tile columns a thread owns: cb + CB·c, c < CC
    constexpr int CB = VT / CC;
    constexpr int RB = NT / CB;            // row groups: thread tid is in group tid / CB
    constexpr int RR = (C + RB - 1) / RB;  // chunk rows a thread owns: rb + RB·i
    constexpr int KR = (Dk + RB - 1) / RB; // state rows a thread owns: rb·KR + i
    constexpr int KP = 16;                 // key columns a panel of W; tokens a panel of Kd
    constexpr int CP = C + 1;              // W's panel row stride (fewer bank conflicts)
    constexpr int PE = (C * KP + NT - 1) / NT;   // W panel values a thread loads
    constexpr int PEK = (KP * Dk + NT - 1) / NT; // Kd panel values a thread loads
    constexpr int PF = PE > PEK ? PE : PEK;
    constexpr int SB = KP * CP > KP * Dk ? KP * CP : KP * Dk;
    constexpr int NA = Dk / KP;            // a chunk's steps: NA panels of W,
    constexpr int NP = C / KP;             // then NP of Kd
    constexpr int NS = NA + NP;
    const int tid = int(thread_position_in_threadgroup.x);
    const int tile = int(threadgroup_position_in_grid.y);
    const int n = int(threadgroup_position_in_grid.z);
    const int cb = tid % CB;
    const int rb = tid / CB;
#ifdef MLXK_POOL
    // Row r's NC chunks are chunks f0 .. f0 + NC − 1 of the table; its slots of states
    // f0 + r .. f0 + r + NC (of NCH + R a value head).
    const int r = n / Hv, hv_idx = n % Hv;
    const int NCH = w_shape[1] / C;
    const int R = firsts_shape[0] - 1;
    const int f0 = firsts[r];
    const int NC = firsts[r + 1] - f0;
    const int src = rows[5 * r + 3], dst = rows[5 * r + 4];
    const size_t head = (size_t(hv_idx) * size_t(NCH) + f0) * C;
    const size_t kept = size_t(hv_idx) * size_t(NCH + R) + f0 + r;
#else
    const int NC = w_shape[1] / C;
    const size_t head = size_t(n) * size_t(NC) * C;  // the head's first row of w, u0, kd, u
    const size_t kept = size_t(n) * size_t(NC + 1);  // the head's first slot of states
#endif

    threadgroup float ht[Dk][VT];  // H's tile
    threadgroup float us[C][VT];   // U's tile
    threadgroup float sb[SB];      // the panel: W (column-major) or Kd (token-major)

    // state_in [B, Hv, Dv, Dk]: H[k][d] = S[d][k] (k fastest: the reads are contiguous). On a
    // pool: its row src (zeros where src < 0).
    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
#ifdef MLXK_POOL
      ht[kq][cc] = d < Dv && src >= 0
                       ? state_in[((size_t(src) * Hv + hv_idx) * Dv + d) * Dk + kq]
                       : 0.0f;
#else
      ht[kq][cc] = d < Dv ? state_in[(size_t(n) * Dv + d) * Dk + kq] : 0.0f;
#endif
    }

    // Every step's panel is loaded into registers (pf) while the step before it computes,
    // across the phases and into the next chunk, so no step waits for its global loads alone.
    float pf[PF];
    float u0r[RR][CC];  // the chunk's U0, loaded with its first step
    float decay = 1.0f;
    float au[RR][CC], hn[KR][CC];
    for (int i = 0; i < RR; ++i) {
      for (int cc = 0; cc < CC; ++cc) {
        u0r[i][cc] = 0.0f;
        au[i][cc] = 0.0f;
      }
    }
    for (int i = 0; i < KR; ++i) {
      for (int cc = 0; cc < CC; ++cc) hn[i][cc] = 0.0f;
    }
    // Step 0 of chunk 0.
    for (int i = 0; i < PE; ++i) {
      const int e = tid + NT * i, t = e / KP, j = e % KP;
      pf[i] = NC > 0 && e < C * KP ? w[(head + t) * Dk + j] : 0.0f;
    }
    for (int c = 0; c < NC; ++c) {
      const size_t row0 = head + size_t(c) * C;
      for (int st = 0; st < NS; ++st) {
        // The panel of this step from pf into sb.
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        if (st < NA) {
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
        if (st == 0) {
          // The state entering chunk c (H's tile, complete since the last barrier) to its slot.
          for (int e = tid; e < Dk * VT; e += NT) {
            const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
            if (d < Dv) states[((kept + c) * Dv + d) * Dk + kq] = ht[kq][cc];
          }
        } else if (st == NA) {
          // U (complete since the last barrier) to the output pass.
          for (int e = tid; e < C * VT; e += NT) {
            const int t = e / VT, cc = e % VT, d = tile * VT + cc;
            if (d < Dv) u[(row0 + t) * Dv + d] = us[t][cc];
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        // The next step's panel into pf (of this chunk, or step 0 of the next).
        {
          const int ns = st + 1 < NS ? st + 1 : 0;
          const int nc = st + 1 < NS ? c : c + 1;
          const size_t nrow0 = head + size_t(nc) * C;
          if (nc < NC) {
            if (ns < NA) {
              for (int i = 0; i < PE; ++i) {
                const int e = tid + NT * i, t = e / KP, j = e % KP;
                pf[i] = e < C * KP ? w[(nrow0 + t) * Dk + ns * KP + j] : 0.0f;
              }
            } else {
              const size_t at = (nrow0 + size_t(ns - NA) * KP) * Dk;
              for (int i = 0; i < PEK; ++i) {
                const int e = tid + NT * i;
                pf[i] = e < KP * Dk ? kd[at + e] : 0.0f;
              }
            }
          }
        }
        if (st < NA) {
          // W H: W's panel (C x KP, in sb) times H's rows k0 .. k0 + KP (in ht).
          const int k0 = st * KP;
          if (st == 0) {
            for (int i = 0; i < RR; ++i) {
              const int t = rb + RB * i;
              for (int cc = 0; cc < CC; ++cc) {
                const int d = tile * VT + cb + CB * cc;
                u0r[i][cc] = t < C && d < Dv ? u0[(row0 + t) * Dv + d] : 0.0f;
                au[i][cc] = 0.0f;
              }
            }
            decay = gam[row0 + C - 1];
          }
          for (int j = 0; j < KP; ++j) {
            float h[CC];
            for (int cc = 0; cc < CC; ++cc) h[cc] = ht[k0 + j][cb + CB * cc];
            for (int i = 0; i < RR; ++i) {
              const int t = rb + RB * i;
              if (t < C) {
                const float wv = sb[j * CP + t];
                for (int cc = 0; cc < CC; ++cc) au[i][cc] += wv * h[cc];
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
        } else {
          // H ← γ_{C-1} H + Kdᵀ U: Kdᵀ's panel (Dk x KP, in sb) times U's rows s0 .. s0 + KP
          // (in us); thread tid owns rows rb·KR .. rb·KR + KR − 1 of its columns.
          const int s0 = (st - NA) * KP;
          if (st == NA) {
            for (int i = 0; i < KR; ++i) {
              for (int cc = 0; cc < CC; ++cc) {
                hn[i][cc] = rb * KR + i < Dk ? decay * ht[rb * KR + i][cb + CB * cc] : 0.0f;
              }
            }
          }
          for (int j = 0; j < KP; ++j) {
            float uv[CC];
            for (int cc = 0; cc < CC; ++cc) uv[cc] = us[s0 + j][cb + CB * cc];
            for (int i = 0; i < KR; ++i) {
              if (rb * KR + i < Dk) {
                const float kv = sb[j * Dk + rb * KR + i];
                for (int cc = 0; cc < CC; ++cc) hn[i][cc] += kv * uv[cc];
              }
            }
          }
          if (st == NS - 1) {
            for (int i = 0; i < KR; ++i) {
              for (int cc = 0; cc < CC; ++cc) {
                if (rb * KR + i < Dk) ht[rb * KR + i][cb + CB * cc] = hn[i][cc];
              }
            }
          }
        }
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);

    // The final state to slot NC (on a pool also to row dst of state_out, where dst ≥ 0).
    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
      if (d < Dv) states[((kept + NC) * Dv + d) * Dk + kq] = ht[kq][cc];
#ifdef MLXK_POOL
      if (d < Dv && dst >= 0) {
        state_out[((size_t(dst) * Hv + hv_idx) * Dv + d) * Dk + kq] = ht[kq][cc];
      }
#endif
    }
