// Gated DeltaNet recurrence, backward pass in chunked (WY / UT) form (mlxkern): the gradients
// of sum(dy * y) + sum(dstate_out * state_out) with respect to q, k, v, the gates g and beta and
// the initial state, for the chunked form's maths (src/cpu/gated_delta/chunked/mod.rs; docs/DESIGN.md §4,
// "Gradients"). Five kernels, one per stage, chosen by MLXK_CBWD_STAGE (the launch's header),
// run in sequence as nodes of one graph:
//
//   1 prep    per (head, chunk): Γ, γ, Γ∘KKᵀ, Γ∘QKᵀ, Tm = (I + A)⁻¹, W = Tm diag(βγ) K,
//             Ũ = Tm diag(β) V.
//   2 states  per (head, column tile), chunks in order: the state entering every chunk (kept)
//             and U = Ũ − W H.
//   3 dstates per (head, column tile), chunks in reverse: the state gradient leaving every
//             chunk (kept), dU = (Γ∘QKᵀ)ᵀ dY + diag(Γ_L) K dH', and dstate.
//   4 square  per (head, chunk): the chunk's L x L products: dP = dY Uᵀ,
//             dA = −Tmᵀ dU Uᵀ (strictly lower), Tmᵀ dU (dv), and the gate terms made of them.
//   5 keys    per (head, chunk): dq, dk, and the gate gradients (d log g summed backwards
//             over the chunk, then d g = d log g / g where g is a normal float, else 0).
//
// Notation per (batch row b, value head hv) and chunk of L <= C tokens from t0: the state is
// kept as H = Sᵀ, stored [Dv, Dk] like the state. Γ(t, s) = g_{s+1} ... g_t (s <= t), computed
// as a product (never a ratio), γ_t = g_0 ... g_t, Γ_L(s) = Γ(L - 1, s). A masked token is an
// identity step: g = 1, beta = 0, dy = 0; all its gradients are +0.
//
// Every stage: threadgroups of NT threads (NT / 32 SIMD groups) along grid x, one per work item
// (grid x = NT * items). Inputs and outputs as src/metal/gated_delta/chunked_backward.rs lists them; scratch arrays
// are f32: per head [n = b * Hv + hv] and token [n, T, X] (W: [n, NC * C, Dk], the last chunk's
// rows past T zero), per chunk [n, NC, C, C], kept states [n, NC, Dv, Dk]. Tin = {T}; mask
// [B, T] in the masked variant (MLXK_TOKEN_ACTIVE).
// Template: Dk (multiple of 32), Dv, Hk, Hv, C (chunk, 16 or 32), TN (value columns of a tile),
// NT. The stages' matrix products run on the matrix tiles (the launch's header, tiles.h:
// simdgroup matrices on Metal, tensor cores or FMAs on MLX CUDA), but for stage 1's inverse
// and stage 4's C x C x C product dA; in 2 and 3 the tile's TN columns are padded to TNP, a
// multiple of 8, by zero columns.
// A product. Unlike the exact kernels' MLXK_MUL it may fuse with the sum it feeds (NVRTC's
// --fmad=true makes those FMAs): this backward has no bit-exact contract, and a fused
// multiply-add is faster and rounds once instead of twice.
#define MLXK_CB_MUL(a, b) ((a) * (b))
    const int T = Tin[0];
    const int NC = (T + C - 1) / C;
    const uint tid = thread_position_in_threadgroup.x;
    const uint item = thread_position_in_grid.x / NT;

#if MLXK_CBWD_STAGE == 1
    // ---- 1: per (head, chunk) ----
    constexpr int NSG = NT / 32;
    constexpr int KS = 16;                     // keys (or values) per staged slice
    constexpr int PT = (C / 16) * (C / 8);     // tiles of a C x C product
    constexpr int PPT = (PT + NSG - 1) / NSG;  // per SIMD group
    const int TP = NC * C;  // W's rows per head
    const uint n = item / uint(NC);
    const int c = int(item % uint(NC));
    const uint b_idx = n / Hv;
    const uint hv_idx = n % Hv;
    const uint hk_idx = hv_idx / (Hv / Hk);
    const int t0 = c * C;
    const int L = T - t0 < C ? T - t0 : C;
    threadgroup float gs[C];
    threadgroup float bs[C];
    threadgroup float gam_s[C];
    threadgroup float gm_s[C * C];
    threadgroup float a_s[C * C];
    threadgroup float tm_s[C * C];
    threadgroup float x_s[2 * C * KS];  // KS keys and queries (or values) of the chunk's tokens
    for (int s = int(tid); s < C; s += NT) {
      float gv = 1.0f, bv = 0.0f;
      if (s < L) {
        const int t = t0 + s;
        const size_t gt = (size_t(b_idx) * T + t) * Hv + hv_idx;
        if (MLXK_TOKEN_ACTIVE) {
          gv = static_cast<float>(g[gt]);
          bv = static_cast<float>(beta[gt]);
        }
      }
      gs[s] = gv;
      bs[s] = bv;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    for (int e = int(tid); e < C * C; e += NT) {
      const int r = e / C, s = e % C;
      float p = 0.0f;
      if (s <= r) {
        p = 1.0f;
        for (int j = s + 1; j <= r; ++j) p = p * gs[j];
      }
      gm_s[e] = p;
    }
    for (int r = int(tid); r < C; r += NT) {
      float p = 1.0f;
      for (int j = 0; j <= r; ++j) p = p * gs[j];
      gam_s[r] = p;
      if (r < L) gam[size_t(n) * T + t0 + r] = p;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    const size_t sq = (size_t(n) * NC + c) * (C * C);
    // K Kᵀ and Q Kᵀ on the matrix tiles, KS keys at a time staged in threadgroup memory (zero
    // past L); then Γ∘KKᵀ (strictly lower), Γ∘QKᵀ (lower) and A = diag(β) Γ∘KKᵀ.
    const uint lane = tid % 32;
    const uint sg = tid / 32;
    mlxk_tile::acc16x8 kk_t[PPT], qk_t[PPT];
    for (int x = 0; x < PPT; ++x) {
      mlxk_tile::fill(kk_t[x], 0.0f);
      mlxk_tile::fill(qk_t[x], 0.0f);
    }
    for (int i0 = 0; i0 < Dk; i0 += KS) {
      for (int e = int(tid); e < C * KS; e += NT) {
        const int r = e / KS, ii = e % KS;
        const size_t at = ((size_t(b_idx) * T + t0 + r) * Hk + hk_idx) * Dk + i0 + ii;
        x_s[e] = r < L ? static_cast<float>(k[at]) : 0.0f;
        x_s[C * KS + e] = r < L ? static_cast<float>(q[at]) : 0.0f;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      for (int x = 0; x < PPT; ++x) {
        const int tile = int(sg) + x * NSG;
        if (tile >= PT) continue;
        const int r0 = tile / (C / 8) * 16, s0 = tile % (C / 8) * 8;
        for (int kk = 0; kk < KS; kk += 8) {
          mlxk_tile::a16x8 ka, qa;
          mlxk_tile::b8x8 kb;
          mlxk_tile::load_a(ka, x_s + r0 * KS + kk, KS, false, lane);
          mlxk_tile::load_a(qa, x_s + C * KS + r0 * KS + kk, KS, false, lane);
          mlxk_tile::load_b(kb, x_s + s0 * KS + kk, KS, true, lane);
          mlxk_tile::mma(kk_t[x], ka, kb);
          mlxk_tile::mma(qk_t[x], qa, kb);
        }
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    }
    for (int e = int(tid); e < C * C; e += NT) gm[sq + e] = gm_s[e];
    for (int x = 0; x < PPT; ++x) {
      const int tile = int(sg) + x * NSG;
      if (tile >= PT) continue;
      const int r0 = tile / (C / 8) * 16, s0 = tile % (C / 8) * 8;
      for (int e = 0; e < mlxk_tile::kElems; ++e) {
        const int r = r0 + mlxk_tile::row(lane, e), s = s0 + mlxk_tile::col(lane, e);
        const int at = r * C + s;
        const bool kept = r < L && s <= r;
        const float kk = kept ? mlxk_tile::get(kk_t[x], e) : 0.0f;
        const float qk = kept ? mlxk_tile::get(qk_t[x], e) : 0.0f;
        const float gkk_e = s < r ? MLXK_CB_MUL(gm_s[at], kk) : 0.0f;
        gkk[sq + at] = gkk_e;
        pm[sq + at] = s <= r ? MLXK_CB_MUL(gm_s[at], qk) : 0.0f;
        a_s[at] = MLXK_CB_MUL(bs[r], gkk_e);
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    // Tm = (I + A)⁻¹ by forward substitution, row by row: Tm[r][col] = δ − Σ A[r][s] Tm[s][col].
    for (int r = 0; r < C; ++r) {
      for (int col = int(tid); col < C; col += NT) {
        float x = col == r ? 1.0f : 0.0f;
        for (int s = col; s < r; ++s) x -= MLXK_CB_MUL(a_s[r * C + s], tm_s[s * C + col]);
        tm_s[r * C + col] = col <= r ? x : 0.0f;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    }
    for (int e = int(tid); e < C * C; e += NT) tm[sq + e] = tm_s[e];
    // W = Tm diag(βγ) K and Ũ = Tm diag(β) V on the matrix tiles, KS keys or values at a time
    // (βγ K and β V staged, zero past L and Dv); W's rows past L are zero (so are Tm's
    // products there: the staged rows are zero and Tm's rows identity rows).
    for (int i0 = 0; i0 < Dk + Dv; i0 += KS) {
      const bool keys = i0 < Dk;
      const int j0 = keys ? i0 : i0 - Dk;  // Dk is a multiple of KS
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      for (int e = int(tid); e < C * KS; e += NT) {
        const int s = e / KS, jj = e % KS;
        float val = 0.0f;
        if (s < L && keys) {
          const size_t at = ((size_t(b_idx) * T + t0 + s) * Hk + hk_idx) * Dk + j0 + jj;
          val = MLXK_CB_MUL(MLXK_CB_MUL(bs[s], gam_s[s]), static_cast<float>(k[at]));
        } else if (s < L && j0 + jj < Dv) {
          const size_t at = ((size_t(b_idx) * T + t0 + s) * Hv + hv_idx) * Dv + j0 + jj;
          val = MLXK_CB_MUL(bs[s], static_cast<float>(v[at]));
        }
        x_s[e] = val;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      for (int tile = int(sg); tile < (C / 16) * (KS / 8); tile += NSG) {
        const int r0 = tile / (KS / 8) * 16, n0 = tile % (KS / 8) * 8;
        mlxk_tile::acc16x8 acc;
        mlxk_tile::fill(acc, 0.0f);
        for (int s0 = 0; s0 < C; s0 += 8) {
          mlxk_tile::a16x8 ta;
          mlxk_tile::b8x8 xb;
          mlxk_tile::load_a(ta, tm_s + r0 * C + s0, C, false, lane);
          mlxk_tile::load_b(xb, x_s + s0 * KS + n0, KS, false, lane);
          mlxk_tile::mma(acc, ta, xb);
        }
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int r = r0 + mlxk_tile::row(lane, e), j = j0 + n0 + mlxk_tile::col(lane, e);
          const float val = r < L ? mlxk_tile::get(acc, e) : 0.0f;
          if (keys) {
            w[(size_t(n) * TP + t0 + r) * Dk + j] = val;
          } else if (r < L && j < Dv) {
            ut[(size_t(n) * T + t0 + r) * Dv + j] = val;
          }
        }
      }
    }
#elif MLXK_CBWD_STAGE == 2
    // ---- 2: per (head, column tile), chunks in order ----
    const int TP = NC * C;  // W's rows per head
    constexpr int NTILE = (Dv + TN - 1) / TN;
    constexpr int TNP = (TN + 7) / 8 * 8;
    constexpr int NSG = NT / 32;
    constexpr int KS = 16;  // key rows per slice staged in threadgroup memory
    const uint n = item / uint(NTILE);
    const int j0 = int(item % uint(NTILE)) * TN;
    const uint b_idx = n / Hv;
    const uint hv_idx = n % Hv;
    const uint hk_idx = hv_idx / (Hv / Hk);
    const uint lane = tid % 32;
    const uint sg = tid / 32;
    threadgroup float h_s[Dk * TNP];  // h[i][jj]
    threadgroup float ug_s[C * TNP];  // diag(Γ_L) U
    threadgroup float k_s[C * KS];    // KS keys of the chunk's tokens, k_s[s][ii]
    threadgroup float gl_s[C];
    for (int e = int(tid); e < Dk * TNP; e += NT) {
      const int jj = e / Dk, i = e % Dk;
      const int j = j0 + jj;
      h_s[i * TNP + jj] = jj < TN && j < Dv ? state_in[(size_t(n) * Dv + j) * Dk + i] : 0.0f;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    for (int c = 0; c < NC; ++c) {
      const int t0 = c * C;
      const int L = T - t0 < C ? T - t0 : C;
      const size_t kept = (size_t(n) * NC + c) * Dv;
      for (int e = int(tid); e < Dk * TN; e += NT) {
        const int jj = e / Dk, i = e % Dk;
        const int j = j0 + jj;
        if (j < Dv) hs[(kept + j) * Dk + i] = h_s[i * TNP + jj];
      }
      for (int s = int(tid); s < C; s += NT) {
        gl_s[s] = s < L ? gm[((size_t(n) * NC + c) * C + (L - 1)) * C + s] : 0.0f;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      // U = Ũ − W h: tiles of 16 tokens x 8 columns, W's rows from device memory.
      for (int tile = int(sg); tile < (C / 16) * (TNP / 8); tile += NSG) {
        const int s0 = tile / (TNP / 8) * 16, n0 = tile % (TNP / 8) * 8;
        mlxk_tile::acc16x8 acc;
        mlxk_tile::fill(acc, 0.0f);
        for (int i0 = 0; i0 < Dk; i0 += 8) {
          mlxk_tile::a16x8 wt;
          mlxk_tile::b8x8 ht;
          mlxk_tile::load_a(wt, w + (size_t(n) * TP + t0 + s0) * Dk + i0, Dk, false, lane);
          mlxk_tile::load_b(ht, h_s + i0 * TNP + n0, TNP, false, lane);
          mlxk_tile::mma(acc, wt, ht);
        }
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int s = s0 + mlxk_tile::row(lane, e), jj = n0 + mlxk_tile::col(lane, e);
          const int j = j0 + jj;
          float val = 0.0f;
          if (s < L && jj < TN && j < Dv) {
            const size_t tw = size_t(n) * T + t0 + s;
            val = ut[tw * Dv + j] - mlxk_tile::get(acc, e);
            u[tw * Dv + j] = val;
          }
          ug_s[s * TNP + jj] = MLXK_CB_MUL(gl_s[s], val);
        }
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      // h = γ_L h + Kᵀ diag(Γ_L) U, KS key rows at a time (tiles of 16 keys x 8 columns).
      const float g_last = gam[size_t(n) * T + t0 + L - 1];
      for (int i0 = 0; i0 < Dk; i0 += KS) {
        for (int e = int(tid); e < C * KS; e += NT) {
          const int s = e / KS, ii = e % KS;
          const size_t ks = ((size_t(b_idx) * T + t0 + s) * Hk + hk_idx) * Dk + i0 + ii;
          k_s[e] = s < L ? static_cast<float>(k[ks]) : 0.0f;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int tile = int(sg); tile < TNP / 8; tile += NSG) {
          const int n0 = tile * 8;
          mlxk_tile::acc16x8 acc;
          mlxk_tile::fill(acc, 0.0f);
          for (int s0 = 0; s0 < C; s0 += 8) {
            mlxk_tile::a16x8 kt;
            mlxk_tile::b8x8 ut_;
            mlxk_tile::load_a(kt, k_s + s0 * KS, KS, true, lane);
            mlxk_tile::load_b(ut_, ug_s + s0 * TNP + n0, TNP, false, lane);
            mlxk_tile::mma(acc, kt, ut_);
          }
          for (int e = 0; e < mlxk_tile::kElems; ++e) {
            const int at = (i0 + mlxk_tile::row(lane, e)) * TNP + n0 + mlxk_tile::col(lane, e);
            h_s[at] = MLXK_CB_MUL(g_last, h_s[at]) + mlxk_tile::get(acc, e);
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      }
    }

#elif MLXK_CBWD_STAGE == 3
    // ---- 3: per (head, column tile), chunks in reverse ----
    const int TP = NC * C;  // W's rows per head
    constexpr int NTILE = (Dv + TN - 1) / TN;
    constexpr int TNP = (TN + 7) / 8 * 8;
    constexpr int NSG = NT / 32;
    constexpr int KS = 16;  // key rows per slice staged in threadgroup memory
    constexpr int UT = (C / 16) * (TNP / 8);  // dU's tiles
    constexpr int UPT = (UT + NSG - 1) / NSG;  // per SIMD group
    const uint n = item / uint(NTILE);
    const int j0 = int(item % uint(NTILE)) * TN;
    const uint b_idx = n / Hv;
    const uint hv_idx = n % Hv;
    const uint hk_idx = hv_idx / (Hv / Hk);
    const uint lane = tid % 32;
    const uint sg = tid / 32;
    threadgroup float dh_s[Dk * TNP];  // dh[i][jj]
    threadgroup float dy_s[C * TNP];
    threadgroup float du_s[C * TNP];
    threadgroup float x_s[C * KS];  // KS keys (or γ-scaled queries) of the chunk's tokens
    threadgroup float gl_s[C];
    threadgroup float gam_s[C];
    for (int e = int(tid); e < Dk * TNP; e += NT) {
      const int jj = e / Dk, i = e % Dk;
      const int j = j0 + jj;
      dh_s[i * TNP + jj] = jj < TN && j < Dv ? dstate_out[(size_t(n) * Dv + j) * Dk + i] : 0.0f;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    for (int c = NC - 1; c >= 0; --c) {
      const int t0 = c * C;
      const int L = T - t0 < C ? T - t0 : C;
      const size_t kept = (size_t(n) * NC + c) * Dv;
      const size_t sq = (size_t(n) * NC + c) * (C * C);
      for (int e = int(tid); e < Dk * TN; e += NT) {
        const int jj = e / Dk, i = e % Dk;
        const int j = j0 + jj;
        if (j < Dv) dhs[(kept + j) * Dk + i] = dh_s[i * TNP + jj];
      }
      for (int s = int(tid); s < C; s += NT) {
        gl_s[s] = s < L ? gm[sq + (L - 1) * C + s] : 0.0f;
        gam_s[s] = s < L ? gam[size_t(n) * T + t0 + s] : 0.0f;
      }
      for (int e = int(tid); e < C * TNP; e += NT) {
        const int s = e / TNP, jj = e % TNP;
        const int j = j0 + jj;
        float val = 0.0f;
        if (s < L && jj < TN && j < Dv) {
          const int t = t0 + s;
          if (MLXK_TOKEN_ACTIVE) {
            val = static_cast<float>(dy[((size_t(b_idx) * T + t) * Hv + hv_idx) * Dv + j]);
          }
        }
        dy_s[e] = val;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      // dU = (Γ∘QKᵀ)ᵀ dY + diag(Γ_L) K dh: each SIMD group keeps its tiles' two sums over the
      // key slices.
      mlxk_tile::acc16x8 pa[UPT], ka[UPT];
      for (int x = 0; x < UPT; ++x) {
        mlxk_tile::fill(pa[x], 0.0f);
        mlxk_tile::fill(ka[x], 0.0f);
        const int tile = int(sg) + x * NSG;
        if (tile >= UT) continue;
        const int s0 = tile / (TNP / 8) * 16, n0 = tile % (TNP / 8) * 8;
        for (int r0 = 0; r0 < C; r0 += 8) {
          mlxk_tile::a16x8 pt;
          mlxk_tile::b8x8 yt;
          mlxk_tile::load_a(pt, pm + sq + r0 * C + s0, C, true, lane);
          mlxk_tile::load_b(yt, dy_s + r0 * TNP + n0, TNP, false, lane);
          mlxk_tile::mma(pa[x], pt, yt);
        }
      }
      for (int i0 = 0; i0 < Dk; i0 += KS) {
        for (int e = int(tid); e < C * KS; e += NT) {
          const int s = e / KS, ii = e % KS;
          const size_t ks = ((size_t(b_idx) * T + t0 + s) * Hk + hk_idx) * Dk + i0 + ii;
          x_s[e] = s < L ? static_cast<float>(k[ks]) : 0.0f;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int x = 0; x < UPT; ++x) {
          const int tile = int(sg) + x * NSG;
          if (tile >= UT) continue;
          const int s0 = tile / (TNP / 8) * 16, n0 = tile % (TNP / 8) * 8;
          for (int ii0 = 0; ii0 < KS; ii0 += 8) {
            mlxk_tile::a16x8 kt;
            mlxk_tile::b8x8 ht;
            mlxk_tile::load_a(kt, x_s + s0 * KS + ii0, KS, false, lane);
            mlxk_tile::load_b(ht, dh_s + (i0 + ii0) * TNP + n0, TNP, false, lane);
            mlxk_tile::mma(ka[x], kt, ht);
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      }
      for (int x = 0; x < UPT; ++x) {
        const int tile = int(sg) + x * NSG;
        if (tile >= UT) continue;
        const int s0 = tile / (TNP / 8) * 16, n0 = tile % (TNP / 8) * 8;
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int s = s0 + mlxk_tile::row(lane, e), jj = n0 + mlxk_tile::col(lane, e);
          const int j = j0 + jj;
          float val = 0.0f;
          if (s < L && jj < TN && j < Dv) {
            val = mlxk_tile::get(pa[x], e) + MLXK_CB_MUL(gl_s[s], mlxk_tile::get(ka[x], e));
            du[(size_t(n) * T + t0 + s) * Dv + j] = val;
          }
          du_s[s * TNP + jj] = val;
        }
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      // dh = γ_L dh + Qᵀ diag(γ) dY − Wᵀ dU, KS key rows at a time (tiles of 16 keys x 8
      // columns; W's rows from device memory).
      const float g_last = gam_s[L - 1];
      for (int i0 = 0; i0 < Dk; i0 += KS) {
        for (int e = int(tid); e < C * KS; e += NT) {
          const int s = e / KS, ii = e % KS;
          const size_t qs = ((size_t(b_idx) * T + t0 + s) * Hk + hk_idx) * Dk + i0 + ii;
          x_s[e] = s < L ? MLXK_CB_MUL(static_cast<float>(q[qs]), gam_s[s]) : 0.0f;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int tile = int(sg); tile < TNP / 8; tile += NSG) {
          const int n0 = tile * 8;
          mlxk_tile::acc16x8 aq, aw;
          mlxk_tile::fill(aq, 0.0f);
          mlxk_tile::fill(aw, 0.0f);
          for (int s0 = 0; s0 < C; s0 += 8) {
            mlxk_tile::a16x8 qt, wt;
            mlxk_tile::b8x8 yt, dt;
            mlxk_tile::load_a(qt, x_s + s0 * KS, KS, true, lane);
            mlxk_tile::load_b(yt, dy_s + s0 * TNP + n0, TNP, false, lane);
            mlxk_tile::mma(aq, qt, yt);
            mlxk_tile::load_a(wt, w + (size_t(n) * TP + t0 + s0) * Dk + i0, Dk, true, lane);
            mlxk_tile::load_b(dt, du_s + s0 * TNP + n0, TNP, false, lane);
            mlxk_tile::mma(aw, wt, dt);
          }
          for (int e = 0; e < mlxk_tile::kElems; ++e) {
            const int at = (i0 + mlxk_tile::row(lane, e)) * TNP + n0 + mlxk_tile::col(lane, e);
            dh_s[at] = MLXK_CB_MUL(g_last, dh_s[at]) + mlxk_tile::get(aq, e) - mlxk_tile::get(aw, e);
          }
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      }
    }
    for (int e = int(tid); e < Dk * TN; e += NT) {
      const int jj = e / Dk, i = e % Dk;
      const int j = j0 + jj;
      if (j < Dv) dstate[(size_t(n) * Dv + j) * Dk + i] = dh_s[i * TNP + jj];
    }

#elif MLXK_CBWD_STAGE == 4
    // ---- 4: per (head, chunk), the L x L products ----
    constexpr int NSG = NT / 32;
    constexpr int DS = 16;                     // value columns per staged slice
    constexpr int PT = (C / 16) * (C / 8);     // tiles of an L x L product
    constexpr int PPT = (PT + NSG - 1) / NSG;  // per SIMD group
    const uint n = item / uint(NC);
    const int c = int(item % uint(NC));
    const uint b_idx = n / Hv;
    const uint hv_idx = n % Hv;
    const int t0 = c * C;
    const int L = T - t0 < C ? T - t0 : C;
    const size_t sq = (size_t(n) * NC + c) * (C * C);
    threadgroup float tm_s[C * C];
    threadgroup float m_g[C * C];   // dU Uᵀ (strictly lower)
    threadgroup float m_r[C * C];   // dA∘Γ∘KKᵀ
    threadgroup float m_x[C * C];   // the gate terms X(t, s), s < t
    threadgroup float m_v[C * C];   // dU Vᵀ
    threadgroup float a_s[4 * C * DS];  // dY, U, dU, V: DS value columns of the chunk
    threadgroup float bs[C];
    for (int s = int(tid); s < C; s += NT) {
      float bv = 0.0f;
      if (s < L) {
        const int t = t0 + s;
        if (MLXK_TOKEN_ACTIVE) bv = static_cast<float>(beta[(size_t(b_idx) * T + t) * Hv + hv_idx]);
      }
      bs[s] = bv;
    }
    for (int e = int(tid); e < C * C; e += NT) tm_s[e] = tm[sq + e];
    // dP = dY Uᵀ (s <= t), dU Uᵀ (s < t), dU Vᵀ (s <= t): sums over the value columns on the
    // matrix tiles, DS columns at a time staged in threadgroup memory (zero past L, Dv and at
    // masked tokens' dY); in each slice also Tmᵀ dU, whence dv = diag(β) Tmᵀ dU.
    const uint lane = tid % 32;
    const uint sg = tid / 32;
    mlxk_tile::acc16x8 dp_t[PPT], dtm_t[PPT], duv_t[PPT];
    for (int x = 0; x < PPT; ++x) {
      mlxk_tile::fill(dp_t[x], 0.0f);
      mlxk_tile::fill(dtm_t[x], 0.0f);
      mlxk_tile::fill(duv_t[x], 0.0f);
    }
    for (int j0 = 0; j0 < Dv; j0 += DS) {
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      for (int e = int(tid); e < C * DS; e += NT) {
        const int r = e / DS, j = j0 + e % DS;
        float y_v = 0.0f, u_v = 0.0f, du_v = 0.0f, v_v = 0.0f;
        if (r < L && j < Dv) {
          const int t = t0 + r;
          const size_t tok = size_t(n) * T + t;
          const size_t at = ((size_t(b_idx) * T + t) * Hv + hv_idx) * Dv + j;
          if (MLXK_TOKEN_ACTIVE) y_v = static_cast<float>(dy[at]);
          u_v = u[tok * Dv + j];
          du_v = du[tok * Dv + j];
          v_v = static_cast<float>(v[at]);
        }
        a_s[e] = y_v;
        a_s[C * DS + e] = u_v;
        a_s[2 * C * DS + e] = du_v;
        a_s[3 * C * DS + e] = v_v;
      }
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      for (int x = 0; x < PPT; ++x) {
        const int tile = int(sg) + x * NSG;
        if (tile >= PT) continue;
        const int r0 = tile / (C / 8) * 16, s0 = tile % (C / 8) * 8;
        for (int jj = 0; jj < DS; jj += 8) {
          mlxk_tile::a16x8 ya, da;
          mlxk_tile::b8x8 ub, vb;
          mlxk_tile::load_a(ya, a_s + r0 * DS + jj, DS, false, lane);
          mlxk_tile::load_a(da, a_s + 2 * C * DS + r0 * DS + jj, DS, false, lane);
          mlxk_tile::load_b(ub, a_s + C * DS + s0 * DS + jj, DS, true, lane);
          mlxk_tile::load_b(vb, a_s + 3 * C * DS + s0 * DS + jj, DS, true, lane);
          mlxk_tile::mma(dp_t[x], ya, ub);
          mlxk_tile::mma(dtm_t[x], da, ub);
          mlxk_tile::mma(duv_t[x], da, vb);
        }
      }
      for (int tile = int(sg); tile < (C / 16) * (DS / 8); tile += NSG) {
        const int s0 = tile / (DS / 8) * 16, jn = tile % (DS / 8) * 8;
        mlxk_tile::acc16x8 acc;
        mlxk_tile::fill(acc, 0.0f);
        for (int k0 = 0; k0 < C; k0 += 8) {
          mlxk_tile::a16x8 ta;
          mlxk_tile::b8x8 db;
          mlxk_tile::load_a(ta, tm_s + k0 * C + s0, C, true, lane);
          mlxk_tile::load_b(db, a_s + 2 * C * DS + k0 * DS + jn, DS, false, lane);
          mlxk_tile::mma(acc, ta, db);
        }
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int s = s0 + mlxk_tile::row(lane, e), j = j0 + jn + mlxk_tile::col(lane, e);
          if (s < L && j < Dv) {
            const float tdu_v = mlxk_tile::get(acc, e);
            tdu[(size_t(n) * T + t0 + s) * Dv + j] = tdu_v;
            const int t = t0 + s;
            const size_t at = ((size_t(b_idx) * T + t) * Hv + hv_idx) * Dv + j;
            dv[at] = (MLXK_TOKEN_ACTIVE) ? MLXK_CB_MUL(bs[s], tdu_v) : 0.0f;
          }
        }
      }
    }
    for (int x = 0; x < PPT; ++x) {
      const int tile = int(sg) + x * NSG;
      if (tile >= PT) continue;
      const int r0 = tile / (C / 8) * 16, s0 = tile % (C / 8) * 8;
      for (int e = 0; e < mlxk_tile::kElems; ++e) {
        const int r = r0 + mlxk_tile::row(lane, e), s = s0 + mlxk_tile::col(lane, e);
        const int at = r * C + s;
        const bool kept = r < L && s <= r;
        const float dp = kept ? mlxk_tile::get(dp_t[x], e) : 0.0f;
        dpg[sq + at] = MLXK_CB_MUL(dp, gm[sq + at]);
        m_x[at] = s < r ? MLXK_CB_MUL(dp, pm[sq + at]) : 0.0f;
        m_g[at] = s < r && kept ? mlxk_tile::get(dtm_t[x], e) : 0.0f;
        m_v[at] = kept ? mlxk_tile::get(duv_t[x], e) : 0.0f;
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    // dA = −Tmᵀ dTm' Tmᵀ with dTm' = dU (diag(β)(V − diag(γ) K H))ᵀ = dU Uᵀ (I + A)ᵀ, so
    // dA = −Tmᵀ (dU Uᵀ) on the strictly lower part: dA[a][cc] = −Σ_t Tm[t][a] dU_t·U_cc, t >= a.
    // Then the terms of dk (dA∘βΓ), of dβ (dA∘Γ∘KKᵀ) and of the gates (dA∘A).
    for (int e = int(tid); e < C * C; e += NT) {
      const int a = e / C, cc = e % C;
      float dak_e = 0.0f, dbk = 0.0f;
      if (cc < a && a < L) {
        float acc = 0.0f;
        for (int t = a; t < L; ++t) acc += MLXK_CB_MUL(tm_s[t * C + a], m_g[t * C + cc]);
        const float da = -acc;
        dak_e = MLXK_CB_MUL(MLXK_CB_MUL(da, bs[a]), gm[sq + e]);
        dbk = MLXK_CB_MUL(da, gkk[sq + e]);
        m_x[e] += MLXK_CB_MUL(dbk, bs[a]);
      }
      dak[sq + e] = dak_e;
      m_r[e] = dbk;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    // Per token: dβ's and the gates' shares from these products.
    for (int s = int(tid); s < L; s += NT) {
      float dbeta_s = 0.0f, db_s = 0.0f;
      for (int r = 0; r < s; ++r) {
        dbeta_s += m_r[s * C + r];
        db_s += m_x[s * C + r];
      }
      for (int r = s; r < L; ++r) dbeta_s += MLXK_CB_MUL(tm_s[r * C + s], m_v[r * C + s]);
      for (int r = s + 1; r < L; ++r) db_s -= m_x[r * C + s];
      dbb[(size_t(n) * T + t0 + s) * 2] = dbeta_s;
      dbb[(size_t(n) * T + t0 + s) * 2 + 1] = db_s;
    }

#elif MLXK_CBWD_STAGE == 5
    // ---- 5: per (head, chunk), dq, dk and the gates ----
    // On the matrix tiles, per block of KB keys (one tile of 8 per SIMD group) and each half of
    // 16 tokens: dY Hᵀ, U dH'ᵀ and (Tmᵀ dU) Hᵀ summed over slices of DS value columns staged in
    // threadgroup memory, then (dP∘Γ) K, (dP∘Γ)ᵀ Q and (dA∘βΓ + its transpose) K over the
    // chunk's tokens; the per-token sums of the gates' terms by row_sum, per SIMD group.
    constexpr int NSG = NT / 32;
    constexpr int KB = 8 * NSG;  // keys per block
    constexpr int DS = 16;       // value columns per staged slice
    constexpr int TH = C / 16;   // halves of 16 tokens
    const uint n = item / uint(NC);
    const int c = int(item % uint(NC));
    const uint b_idx = n / Hv;
    const uint hv_idx = n % Hv;
    const uint hk_idx = hv_idx / (Hv / Hk);
    const uint lane = tid % 32;
    const uint sg = tid / 32;
    const int t0 = c * C;
    const int L = T - t0 < C ? T - t0 : C;
    const size_t sq = (size_t(n) * NC + c) * (C * C);
    const size_t kept = (size_t(n) * NC + c) * Dv * Dk;
    threadgroup float dpg_s[C * C];
    threadgroup float dak_s[C * C];       // dA∘βΓ plus its transpose
    threadgroup float a_s[3 * C * DS];    // dY, U, Tmᵀ dU: DS value columns of the chunk
    threadgroup float h_s[2 * DS * KB];   // H, dH': DS value rows, KB keys
    threadgroup float qk_s[2 * C * KB];   // K, Q: KB keys of the chunk's tokens
    threadgroup float gl_s[C];
    threadgroup float gam_s[C];
    threadgroup float bs[C];
    threadgroup float part[3 * NSG * C];  // per SIMD group and token: the sums q·dq', k·dk_h, k·dk_w
    threadgroup float red[NT];
    for (int e = int(tid); e < C * C; e += NT) {
      dpg_s[e] = dpg[sq + e];
      dak_s[e] = dak[sq + e] + dak[sq + (e % C) * C + e / C];
    }
    for (int s = int(tid); s < C; s += NT) {
      float bv = 0.0f;
      if (s < L) {
        const int t = t0 + s;
        if (MLXK_TOKEN_ACTIVE) bv = static_cast<float>(beta[(size_t(b_idx) * T + t) * Hv + hv_idx]);
      }
      bs[s] = bv;
      gl_s[s] = s < L ? gm[sq + (L - 1) * C + s] : 0.0f;
      gam_s[s] = s < L ? gam[size_t(n) * T + t0 + s] : 0.0f;
    }
    for (int e = int(tid); e < 3 * NSG * C; e += NT) part[e] = 0.0f;
    // Σ H ∘ dH' (the gradient of γ_L H).
    float hsum_part = 0.0f;
    for (int e = int(tid); e < Dv * Dk; e += NT) hsum_part += MLXK_CB_MUL(hs[kept + e], dhs[kept + e]);
    red[tid] = hsum_part;
    const int n0 = int(sg) * 8;  // this SIMD group's keys within a block
    for (int i0 = 0; i0 < Dk; i0 += KB) {
      threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      for (int e = int(tid); e < C * KB; e += NT) {
        const int r = e / KB, ii = e % KB;
        const size_t at = ((size_t(b_idx) * T + t0 + r) * Hk + hk_idx) * Dk + i0 + ii;
        qk_s[e] = r < L ? static_cast<float>(k[at]) : 0.0f;
        qk_s[C * KB + e] = r < L ? static_cast<float>(q[at]) : 0.0f;
      }
      mlxk_tile::acc16x8 p1[TH], p2[TH], p3[TH], x1[TH], x2[TH], x3[TH];
      for (int x = 0; x < TH; ++x) {
        mlxk_tile::fill(p1[x], 0.0f);
        mlxk_tile::fill(p2[x], 0.0f);
        mlxk_tile::fill(p3[x], 0.0f);
        mlxk_tile::fill(x1[x], 0.0f);
        mlxk_tile::fill(x2[x], 0.0f);
        mlxk_tile::fill(x3[x], 0.0f);
      }
      for (int j0 = 0; j0 < Dv; j0 += DS) {
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int e = int(tid); e < C * DS; e += NT) {
          const int s = e / DS, j = j0 + e % DS;
          float y_v = 0.0f, u_v = 0.0f, t_v = 0.0f;
          if (s < L && j < Dv) {
            const int t = t0 + s;
            const size_t tok = size_t(n) * T + t;
            if (MLXK_TOKEN_ACTIVE) {
              y_v = static_cast<float>(dy[((size_t(b_idx) * T + t) * Hv + hv_idx) * Dv + j]);
            }
            u_v = u[tok * Dv + j];
            t_v = tdu[tok * Dv + j];
          }
          a_s[e] = y_v;
          a_s[C * DS + e] = u_v;
          a_s[2 * C * DS + e] = t_v;
        }
        for (int e = int(tid); e < DS * KB; e += NT) {
          const int j = j0 + e / KB, ii = e % KB;
          const size_t at = kept + size_t(j) * Dk + i0 + ii;
          h_s[e] = j < Dv ? hs[at] : 0.0f;
          h_s[DS * KB + e] = j < Dv ? dhs[at] : 0.0f;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int jj = 0; jj < DS; jj += 8) {
          mlxk_tile::b8x8 hb, db;
          mlxk_tile::load_b(hb, h_s + jj * KB + n0, KB, false, lane);
          mlxk_tile::load_b(db, h_s + DS * KB + jj * KB + n0, KB, false, lane);
          for (int x = 0; x < TH; ++x) {
            mlxk_tile::a16x8 at;
            mlxk_tile::load_a(at, a_s + x * 16 * DS + jj, DS, false, lane);
            mlxk_tile::mma(p1[x], at, hb);
            mlxk_tile::load_a(at, a_s + C * DS + x * 16 * DS + jj, DS, false, lane);
            mlxk_tile::mma(p2[x], at, db);
            mlxk_tile::load_a(at, a_s + 2 * C * DS + x * 16 * DS + jj, DS, false, lane);
            mlxk_tile::mma(p3[x], at, hb);
          }
        }
      }
      // Sums over the chunk's tokens r (qk_s was staged before the barriers above).
      for (int r0 = 0; r0 < C; r0 += 8) {
        mlxk_tile::b8x8 kb, qb;
        mlxk_tile::load_b(kb, qk_s + r0 * KB + n0, KB, false, lane);
        mlxk_tile::load_b(qb, qk_s + C * KB + r0 * KB + n0, KB, false, lane);
        for (int x = 0; x < TH; ++x) {
          mlxk_tile::a16x8 at;
          mlxk_tile::load_a(at, dpg_s + x * 16 * C + r0, C, false, lane);
          mlxk_tile::mma(x1[x], at, kb);
          mlxk_tile::load_a(at, dpg_s + r0 * C + x * 16, C, true, lane);
          mlxk_tile::mma(x2[x], at, qb);
          mlxk_tile::load_a(at, dak_s + x * 16 * C + r0, C, false, lane);
          mlxk_tile::mma(x3[x], at, kb);
        }
      }
      for (int x = 0; x < TH; ++x) {
        float pq[2] = {0.0f, 0.0f}, pa[2] = {0.0f, 0.0f}, pb[2] = {0.0f, 0.0f};
        for (int e = 0; e < mlxk_tile::kElems; ++e) {
          const int s = x * 16 + mlxk_tile::row(lane, e), ii = n0 + mlxk_tile::col(lane, e);
          const float dq_inter = MLXK_CB_MUL(gam_s[s], mlxk_tile::get(p1[x], e));
          const float dk_h_term = MLXK_CB_MUL(gl_s[s], mlxk_tile::get(p2[x], e));
          const float dk_w_term = -MLXK_CB_MUL(gam_s[s], mlxk_tile::get(p3[x], e));
          const float kf = qk_s[s * KB + ii], qf = qk_s[C * KB + s * KB + ii];
          pq[e >> 1] += MLXK_CB_MUL(qf, dq_inter);
          pa[e >> 1] += MLXK_CB_MUL(kf, dk_h_term);
          pb[e >> 1] += MLXK_CB_MUL(kf, dk_w_term);
          if (s < L) {
            const int t = t0 + s;
            const bool active = MLXK_TOKEN_ACTIVE;
            const float dq_v = dq_inter + mlxk_tile::get(x1[x], e);
            const float dk_v = dk_h_term + MLXK_CB_MUL(bs[s], dk_w_term) + mlxk_tile::get(x2[x], e) +
                               mlxk_tile::get(x3[x], e);
            const size_t out = ((size_t(b_idx) * T + t) * Hv + hv_idx) * Dk + i0 + ii;
            dq_h[out] = active ? dq_v : 0.0f;
            dk_h[out] = active ? dk_v : 0.0f;
          }
        }
        for (int h = 0; h < 2; ++h) {
          const float sq_h = mlxk_tile::row_sum(pq[h], lane);
          const float sa_h = mlxk_tile::row_sum(pa[h], lane);
          const float sb_h = mlxk_tile::row_sum(pb[h], lane);
          if (mlxk_tile::col(lane, 0) == 0) {
            const int s = x * 16 + mlxk_tile::row(lane, 2 * h);
            part[(0 * NSG + sg) * C + s] += sq_h;
            part[(1 * NSG + sg) * C + s] += sa_h;
            part[(2 * NSG + sg) * C + s] += sb_h;
          }
        }
      }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (tid == 0) {
      float hsum = 0.0f;
      for (int x = 0; x < NT; ++x) hsum += red[x];
      // Per token: q·dq', k·dk_h and k·dk_w summed over the keys (the SIMD groups' shares).
      float sum_q[C], sum_a[C], sum_b[C];
      for (int s = 0; s < C; ++s) {
        sum_q[s] = 0.0f;
        sum_a[s] = 0.0f;
        sum_b[s] = 0.0f;
        for (int w = 0; w < NSG; ++w) {
          sum_q[s] += part[(0 * NSG + w) * C + s];
          sum_a[s] += part[(1 * NSG + w) * C + s];
          sum_b[s] += part[(2 * NSG + w) * C + s];
        }
      }
      // d/d b_t (b_t = log γ_t), then d log g_s = Σ_{t >= s} d/d b_t.
      float y_sum = 0.0f;
      for (int s = 0; s < L; ++s) y_sum += sum_a[s];
      float acc = 0.0f;
      for (int s = L - 1; s >= 0; --s) {
        const size_t tok = size_t(n) * T + t0 + s;
        float db_s = dbb[tok * 2 + 1] + sum_q[s] + MLXK_CB_MUL(bs[s], sum_b[s]) - sum_a[s];
        if (s == L - 1) db_s += y_sum + MLXK_CB_MUL(gam_s[L - 1], hsum);
        acc += db_s;
        const int t = t0 + s;
        const bool active = MLXK_TOKEN_ACTIVE;
        const size_t gt = (size_t(b_idx) * T + t) * Hv + hv_idx;
        const float gv = static_cast<float>(g[gt]);
        // dg = d log g / g where g is a normal float; a gate below that (or 0) gets 0.
        dg_part[gt] = active && gv >= 1.17549435e-38f ? acc / gv : 0.0f;
        dbeta_part[gt] = active ? dbb[tok * 2] + sum_b[s] : 0.0f;
      }
    }
#endif
