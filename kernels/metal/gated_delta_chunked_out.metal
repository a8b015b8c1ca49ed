// The chunked (WY / UT) gated delta rule on the GPU, third of three launches: the output pass,
// every chunk in parallel. One threadgroup per (chunk, batch row, value head, tile of VO value
// columns) makes the chunk's rows of y from the state entering the chunk (H_c = S_cᵀ, stored by
// the state pass, gated_delta_chunked_state.metal) and U (U0 − W H_c, stored by it too):
//   y = diag(γ) Q H_c + P U
// (P and γ from the prep launch, gated_delta_chunked_prep.metal). The threadgroups of the last
// chunk also copy the final state (the state pass's slot NC) to state_out, so that this launch
// makes both of the update's results.
// Products: a panel product a step, on the matrix tiles (the launch's header, tiles.h: simdgroup
// matrices on Metal, tensor cores or FMAs on MLX CUDA) from threadgroup memory: Q's panel
// (C x KP) times H_c's rows k0 .. k0 + KP (Dk / KP steps), then P's panel times U's rows
// s0 .. s0 + KP (C / KP steps; P is zero above its diagonal). Each SIMD group owns 4 tiles of
// y (16 tokens x 8 columns) and keeps one accumulator a tile: Q H_c, scaled by γ per row
// before the first P U step adds to it.
// Launch: grid (NT·NC, ceil(Dv / VO), B·Hv), threadgroup (NT, 1, 1), NT = C·VO / 16,
// NC = ceil(T / C); template InT, Dk, Dv, Hk, Hv, C, VO (32 or 64). Inputs: the exact update's
// launch inputs (q, k, v, g, beta, state_in, the mask when MLXK_MASKED is defined, on CUDA
// a_log and dt_bias: only q and the mask are read; the rest give the node the exact update's
// gradient), then p [B·Hv, Tp, C], gam [B·Hv, Tp], states [B·Hv, NC + 1, Dv, Dk], u
// [B·Hv, Tp, Dv] (f32, Tp = NC·C). Outputs y [B, T, Hv, Dv] (InT; +0 for a masked token; a
// padded row of the last chunk is not written) and state_out [B, Hv, Dv, Dk] (f32).
// With MLXK_POOL defined (a pool or packed call; the launch's header): grid (NT·NCH,
// ceil(Dv / VO), Hv), chunk j of the prep's chunk table per grid x; inputs q, the mask (where
// given), rows [R, 5] (node::gated_delta::Pool), chunks [NCH, 2], then p, gam, u [Hv, NCH·C, ·]
// and states [Hv, NCH + R, Dv, Dk] (gated_delta_chunked_state.metal); output y only (the state
// pass writes the rows' states: the pool's node has no gradient). A row's y covers its span
// tokens from tok0 (+0 past len: all of a padding row's).
#ifndef MLXK_POOL
    (void)k;  // the exact update's inputs that only the gradient reads
    (void)v;
    (void)g;
    (void)beta;
    (void)state_in;
#endif
    constexpr int NT = C * VO / 16;       // threads a threadgroup
    constexpr int KP = 16;                // key columns a panel of Q; tokens a panel of P
    constexpr int CP = C + 1;             // the row-role panel's stride (fewer bank conflicts)
    constexpr int VP = VO + 1;            // the column-role panel's stride
    constexpr int PA = (C * KP + NT - 1) / NT;   // Q or P panel values a thread loads
    constexpr int PB = (KP * VO + NT - 1) / NT;  // H_c or U panel values a thread loads
    constexpr int NA = Dk / KP;           // a chunk's steps: NA panels of Q and H_c,
    constexpr int NP = C / KP;            // then NP of P and U
    constexpr int NS = NA + NP;
    constexpr int NSG = NT / 32;          // SIMD groups
    constexpr int YT = (C / 16) * (VO / 8);  // y's tiles (16 tokens x 8 columns)
    constexpr int YPT = YT / NSG;         // a SIMD group's tiles (4)
    const int tid = int(thread_position_in_threadgroup.x);
    const uint lane = uint(tid % 32);
    const int sg = tid / 32;
    const int tile = int(threadgroup_position_in_grid.y);
#ifdef MLXK_POOL
    // Grid x: chunk jc of the chunk table, chunk c of row r, whose tokens start at tok0 of the
    // flattened token axis; it runs T = len of its span tokens (the rest get y = +0).
    (void)q_shape;  // MLX passes it (the text names it), unused here
    const int jc = int(threadgroup_position_in_grid.x);
    const int hv_idx = int(threadgroup_position_in_grid.z);
    const int r = chunks[2 * jc], c = chunks[2 * jc + 1];
    const size_t base = size_t(rows[5 * r]);
    const int span = rows[5 * r + 1], T = rows[5 * r + 2];
    const int NCH = chunks_shape[0], R = rows_shape[0];
    const size_t row0 = (size_t(hv_idx) * size_t(NCH) + jc) * C;
    const size_t slot = (size_t(hv_idx) * size_t(NCH + R) + jc + r) * Dv;
#else
    const int T = q_shape[1];  // q: [B, T, Hk, Dk]
    const int NC = (T + C - 1) / C;
    const int c = int(threadgroup_position_in_grid.x);
    const int n = int(threadgroup_position_in_grid.z);
    const int b_idx = n / Hv;
    const int hv_idx = n % Hv;
    const int span = T;
    const size_t base = size_t(b_idx) * T;  // the row's first token (flattened)
    const size_t row0 = size_t(n) * size_t(NC) * C + c * C;  // the chunk's first row of p, gam, u
    const size_t slot = (size_t(n) * size_t(NC + 1) + c) * Dv;  // H_c's first row in states
#endif
    const int hk_idx = hv_idx / (Hv / Hk);
    const int t0 = c * C;
    const int d0 = tile * VO;
    const size_t qk0 = (base + t0) * Hk * Dk + hk_idx * Dk;

    threadgroup float sa[KP * CP];  // the row-role panel: Q or P, column-major
    threadgroup float sc[KP * VP];  // the column-role panel: H_c or U, row-major

    // The SIMD group's tiles x = 0 .. YPT − 1: tile sg + NSG·x, rows s0 .. s0 + 15 and
    // columns j0 .. j0 + 7 of the chunk's y tile.
    mlxk_tile::acc16x8 acc[YPT];
    for (int x = 0; x < YPT; ++x) mlxk_tile::fill(acc[x], 0.0f);
    // Step ls's panels go through registers (pa, pb) while step st = ls − 1 computes, so that
    // no step waits for its global loads alone.
    float pa[PA], pb[PB];
    for (int ls = 0; ls <= NS; ++ls) {
      const int st = ls - 1;
      if (st >= 0) {
        // Step st's panels from registers into sa and sc.
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int i = 0; i < PA; ++i) {
          const int e = tid + NT * i, t = e / KP, j = e % KP;
          if (e < C * KP) sa[j * CP + t] = pa[i];
        }
        for (int i = 0; i < PB; ++i) {
          const int e = tid + NT * i;
          if (e < KP * VO) {
            const int kk = st < NA ? e % KP : e / VO, col = st < NA ? e / KP : e % VO;
            sc[kk * VP + col] = pb[i];
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      }
      // Step ls's panels into registers: Q and H_c (ls < NA), or P and U.
      if (ls < NA) {
        const int k0 = ls * KP;
        for (int i = 0; i < PA; ++i) {
          const int e = tid + NT * i, t = e / KP, j = e % KP;
          pa[i] = 0.0f;
          if (e < C * KP && t0 + t < T) {
            pa[i] = static_cast<float>(q[qk0 + size_t(t) * Hk * Dk + k0 + j]);
          }
        }
        for (int i = 0; i < PB; ++i) {
          const int e = tid + NT * i, kk = e % KP, col = e / KP;
          pb[i] = e < KP * VO && d0 + col < Dv ? states[(slot + d0 + col) * Dk + k0 + kk] : 0.0f;
        }
      } else if (ls < NS) {
        const int s0 = (ls - NA) * KP;
        for (int i = 0; i < PA; ++i) {
          const int e = tid + NT * i, t = e / KP, j = e % KP;
          pa[i] = e < C * KP ? p[(row0 + t) * C + s0 + j] : 0.0f;
        }
        for (int i = 0; i < PB; ++i) {
          const int e = tid + NT * i, col = e % VO, kk = e / VO;
          pb[i] = e < KP * VO && d0 + col < Dv ? u[(row0 + s0 + kk) * Dv + d0 + col] : 0.0f;
        }
      }
      // Step st's panel product: (C x KP) x (KP x VO), Q H_c (st < NA) or P U into acc; γ
      // scales Q H_c's rows before the first P U step.
      if (st >= 0) {
        for (int x = 0; x < YPT; ++x) {
          const int ti = sg + NSG * x;
          const int s0 = ti / (VO / 8) * 16, j0 = ti % (VO / 8) * 8;
          if (st == NA) {
            for (int e = 0; e < mlxk_tile::kElems; ++e) {
              const float gv = gam[row0 + s0 + mlxk_tile::row(lane, e)];
              mlxk_tile::set(acc[x], e, gv * mlxk_tile::get(acc[x], e));
            }
          }
          for (int k0 = 0; k0 < KP; k0 += 8) {
            mlxk_tile::a16x8 at;
            mlxk_tile::b8x8 bt;
            mlxk_tile::load_a(at, sa + k0 * CP + s0, CP, true, lane);
            mlxk_tile::load_b(bt, sc + k0 * VP + j0, VP, false, lane);
            mlxk_tile::mma(acc[x], at, bt);
          }
        }
      }
    }

    // y = γ Q H_c + P U; +0 for a masked token (and a token of the span past T); the last
    // chunk's padded rows are not written.
    for (int x = 0; x < YPT; ++x) {
      const int ti = sg + NSG * x;
      const int s0 = ti / (VO / 8) * 16, j0 = ti % (VO / 8) * 8;
      for (int e = 0; e < mlxk_tile::kElems; ++e) {
        const int tt = t0 + s0 + mlxk_tile::row(lane, e);
        const int d = d0 + j0 + mlxk_tile::col(lane, e);
        if (tt < span && d < Dv) {
          bool act = tt < T;
#ifdef MLXK_MASKED
          act = act && mask[base + tt];
#endif
          y[((base + tt) * Hv + hv_idx) * Dv + d] =
              act ? static_cast<InT>(mlxk_tile::get(acc[x], e)) : static_cast<InT>(0);
        }
      }
    }
#ifndef MLXK_POOL
    // The final state (slot NC), the tile's columns, from the last chunk's threadgroups.
    if (c == NC - 1) {
      const size_t last = (size_t(n) * size_t(NC + 1) + NC) * Dv;
      for (int e = tid; e < VO * Dk; e += NT) {
        const int d = d0 + e / Dk, kq = e % Dk;
        if (d < Dv) state_out[(size_t(n) * Dv + d) * Dk + kq] = states[(last + d) * Dk + kq];
      }
    }
#endif
