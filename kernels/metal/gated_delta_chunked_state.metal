// The chunked (WY / UT) gated delta rule on the GPU, second of three launches: the state pass,
// the one walk over the chunks in order. One threadgroup per (batch row, value head, tile of VT
// value columns) keeps the tile's columns of the state H = Sᵀ ([Dk, VT]) in threadgroup memory
// and, per chunk, from the first launch's rows (gated_delta_chunked_prep.metal):
//   stores H (the state entering the chunk),  U = U0 − W H,  H ← γ_{C-1} H + Kdᵀ U.
// Only these two products are sequential; y (diag(γ) Q H + P U) is made from the stored states
// and U by the third launch (gated_delta_chunked_out.metal), every chunk in parallel. Every value
// column evolves on its own, so the tiles share nothing but their reads. A padded or masked
// token has W, U0 and Kd rows of zeros (the prep's identity steps), so it changes nothing.
// Products on the matrix tiles (the launch's header, tiles.h: simdgroup matrices on Metal,
// tensor cores or FMAs on MLX CUDA): U = U0 − W H in tiles of 16 tokens x 8 columns (W's rows
// from device memory, H's from threadgroup memory), H ← γ H + Kdᵀ U in tiles of 16 keys x 8
// columns (Kd from device memory, U from threadgroup memory). Each SIMD group keeps its H tiles
// in its accumulators from one chunk to the next; threadgroup memory holds a copy for W H and
// the kept states. Two barriers a chunk.
// Launch: grid (256, ceil(Dv / VT), B·Hv), threadgroup (256, 1, 1); template Dk, Dv, Hv, C, VT
// (8, 16 or 32); Dk and C multiples of 16. Inputs: state_in [B, Hv, Dv, Dk] (f32), w [B·Hv, Tp, Dk], u0 [B·Hv, Tp, Dv],
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
    constexpr int NT = 256;                 // threads a threadgroup
    constexpr int NSG = NT / 32;            // SIMD groups
    constexpr int UT = (C / 16) * (VT / 8); // U's tiles (16 tokens x 8 columns)
    constexpr int UPT = (UT + NSG - 1) / NSG;
    constexpr int HT = (Dk / 16) * (VT / 8);  // H's tiles (16 keys x 8 columns)
    constexpr int HPT = (HT + NSG - 1) / NSG;
    constexpr int HS = VT + 1;  // H's row stride (the kept states' copies, key by key: fewer
                                // bank conflicts)
    const int tid = int(thread_position_in_threadgroup.x);
    const uint lane = uint(tid % 32);
    const int sg = tid / 32;
    const int tile = int(threadgroup_position_in_grid.y);
    const int n = int(threadgroup_position_in_grid.z);
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

    threadgroup float ht[Dk * HS];  // H's tile, row-major (key k, column j at k·HS + j)
    threadgroup float us[C * VT];   // U's tile, row-major

    // state_in [B, Hv, Dv, Dk]: H[k][d] = S[d][k] (k fastest: the reads are contiguous). On a
    // pool: its row src (zeros where src < 0).
    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
#ifdef MLXK_POOL
      ht[kq * HS + cc] = d < Dv && src >= 0
                             ? state_in[((size_t(src) * Hv + hv_idx) * Dv + d) * Dk + kq]
                             : 0.0f;
#else
      ht[kq * HS + cc] = d < Dv ? state_in[(size_t(n) * Dv + d) * Dk + kq] : 0.0f;
#endif
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    // The SIMD group's H tiles x = 0 .. HPT − 1 (tile sg + NSG·x: keys i0 .. i0 + 15, columns
    // j0 .. j0 + 7), kept in accumulators across the chunks.
    mlxk_tile::acc16x8 hacc[HPT];
    for (int x = 0; x < HPT; ++x) {
      const int ti = sg + NSG * x;
      mlxk_tile::fill(hacc[x], 0.0f);
      if (ti < HT) {
        const int i0 = ti / (VT / 8) * 16, j0 = ti % (VT / 8) * 8;
        mlxk_tile::load_c(hacc[x], ht + i0 * HS + j0, HS, lane);
      }
    }

    for (int c = 0; c < NC; ++c) {
      const size_t row0 = head + size_t(c) * C;
      const float decay = gam[row0 + C - 1];
      // ht holds the state entering chunk c (complete since the last barrier): to its slot.
      for (int e = tid; e < Dk * VT; e += NT) {
        const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
        if (d < Dv) states[((kept + c) * Dv + d) * Dk + kq] = ht[kq * HS + cc];
      }
      // U = U0 − W H: W's rows s0 .. s0 + 15 from device memory, H's from ht.
      for (int x = 0; x < UPT; ++x) {
        const int ui = sg + NSG * x;
        if (ui >= UT) continue;
        const int s0 = ui / (VT / 8) * 16, j0 = ui % (VT / 8) * 8;
        // U0's elements first, so that their loads overlap the product.
        float u0v[mlxk_tile::kElems];
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int d = tile * VT + j0 + mlxk_tile::col(lane, e);
          u0v[e] = d < Dv ? u0[(row0 + s0 + mlxk_tile::row(lane, e)) * Dv + d] : 0.0f;
        }
        mlxk_tile::acc16x8 acc;
        mlxk_tile::fill(acc, 0.0f);
        for (int i0 = 0; i0 < Dk; i0 += 8) {
          mlxk_tile::a16x8 wt;
          mlxk_tile::b8x8 hb;
          mlxk_tile::load_a(wt, w + (row0 + s0) * Dk + i0, Dk, false, lane);
          mlxk_tile::load_b(hb, ht + i0 * HS + j0, HS, false, lane);
          mlxk_tile::mma(acc, wt, hb);
        }
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int s = s0 + mlxk_tile::row(lane, e), jj = j0 + mlxk_tile::col(lane, e);
          const int d = tile * VT + jj;
          const float val = d < Dv ? u0v[e] - mlxk_tile::get(acc, e) : 0.0f;
          us[s * VT + jj] = val;
          if (d < Dv) u[(row0 + s) * Dv + d] = val;
        }
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      // H ← γ_{C-1} H + Kdᵀ U: Kdᵀ's rows i0 .. i0 + 15 (Kd's columns, device memory), U's
      // rows from us; then the new H to ht for the next chunk's W H and slot.
      for (int x = 0; x < HPT; ++x) {
        const int ti = sg + NSG * x;
        if (ti >= HT) continue;
        const int i0 = ti / (VT / 8) * 16, j0 = ti % (VT / 8) * 8;
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          mlxk_tile::set(hacc[x], e, decay * mlxk_tile::get(hacc[x], e));
        }
        for (int s0 = 0; s0 < C; s0 += 8) {
          mlxk_tile::a16x8 kt;
          mlxk_tile::b8x8 ub;
          mlxk_tile::load_a(kt, kd + (row0 + s0) * Dk + i0, Dk, true, lane);
          mlxk_tile::load_b(ub, us + s0 * VT + j0, VT, false, lane);
          mlxk_tile::mma(hacc[x], kt, ub);
        }
        mlxk_tile::store(hacc[x], ht + i0 * HS + j0, HS, lane);
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    }

    // The final state to slot NC (on a pool also to row dst of state_out, where dst ≥ 0).
    for (int e = tid; e < Dk * VT; e += NT) {
      const int kq = e % Dk, cc = e / Dk, d = tile * VT + cc;
      if (d < Dv) states[((kept + NC) * Dv + d) * Dk + kq] = ht[kq * HS + cc];
#ifdef MLXK_POOL
      if (d < Dv && dst >= 0) {
        state_out[((size_t(dst) * Hv + hv_idx) * Dv + d) * Dk + kq] = ht[kq * HS + cc];
      }
#endif
    }
