// Gated DeltaNet recurrence, backward pass (mlxkern): the gradients of sum(dy * y) +
// sum(dstate_out * state_out) with respect to q, k, v, the gates g and beta, and the initial
// state, by a reverse sweep over the tokens that recomputes the forward from checkpoints
// (docs/DESIGN.md §4, "Gradients"; the formulas are src/cpu/gated_delta/backward.rs's).
//
// P threadgroups per (batch row, value head), each of NSG SIMD groups of 32 lanes: threadgroup
// p's SIMD group w owns the value rows p + P (w + NSG r), r = 0 .. RP - 1 (those below Dv), lane
// l the state columns l * Dk/32 .. l * Dk/32 + Dk/32 - 1, as in the forward kernel. The forward
// recomputed here is the forward kernel's arithmetic, so the states it sees are the forward's
// bits. The gradients of q, k, g and beta sum over a threadgroup's rows in a fixed order (rows
// inside a SIMD group, then the SIMD groups through threadgroup memory), one partial sum per
// threadgroup; the sums over the P partials and over the value heads of a key head (GQA) are
// left to the caller.
//
// Inputs: q, k [B, T, Hk, Dk]; v, dy [B, T, Hv, Dv]; g, beta [B, T, Hv]; state_in, dstate_out
// [B, Hv, Dv, Dk] f32; Tin = {T, C} (C: tokens between checkpoints); mask [B, T] in the masked
// variant (MLXK_TOKEN_ACTIVE, as in gated_delta.metal).
// Outputs (f32): dq_h, dk_h [B, T, Hv, P, Dk]; dv [B, T, Hv, Dv]; dg_part, dbeta_part [B, T, Hv, P];
// dstate [B, Hv, Dv, Dk]; ckpt [B * Hv, ceil(T / C), Dv, Dk] and work [B * Hv, C, Dv, Dk],
// scratch for the states entering every chunk and every token of one chunk.
// Launch: grid (32, NSG, B * Hv * P), threadgroup (32, NSG, 1); template Dk, Dv, Hk, Hv, NSG, P,
// RP.
#ifndef MLXK_MUL  // a product that must not fuse into a following add (docs/DESIGN.md §3)
#define MLXK_MUL(a, b) ((a) * (b))
#endif
    const int T = Tin[0];
    const int C = Tin[1];
    const int chunks = T > C ? (T + C - 1) / C : 1;
    const uint n = thread_position_in_grid.z / P;  // b * Hv + hv
    const uint part = thread_position_in_grid.z % P;
    const uint b_idx = n / Hv;
    const uint hv_idx = n % Hv;
    const uint hk_idx = hv_idx / (Hv / Hk);
    constexpr int NPT = Dk / 32;
    const uint lane = thread_position_in_threadgroup.x;
    const uint sg = thread_position_in_threadgroup.y;
    const uint tid = sg * 32 + lane;
    threadgroup float red[NSG * Dk];
    threadgroup float red_s[2 * NSG];

    // Per-row scratch: the states entering each chunk, and each token of the chunk in hand.
    const size_t row_stride = size_t(Dk);
    auto ckpt_ = ckpt + size_t(n) * size_t(chunks) * size_t(Dv) * row_stride;
    auto work_ = work + size_t(n) * size_t(C) * size_t(Dv) * row_stride;

    float s[RP][NPT];
    float ds[RP][NPT];
    for (int r = 0; r < RP; ++r) {
      const uint row = part + P * (sg + NSG * r);
      for (int i = 0; i < NPT; ++i) {
        const uint col = NPT * lane + i;
        const bool here = row < uint(Dv);
        const size_t at = (size_t(n) * Dv + row) * Dk + col;
        s[r][i] = here ? state_in[at] : 0.0f;
        ds[r][i] = here ? dstate_out[at] : 0.0f;
      }
    }

    // Forward over chunks 0 .. chunks - 2 keeping each chunk's entering state, then the chunks
    // in reverse: recompute the chunk from its kept state (keeping every token's entering state
    // in work), and walk it backwards.
    for (int it = 0; it < 2 * chunks - 1; ++it) {
      const bool back = it >= chunks - 1;
      const int c = back ? 2 * chunks - 2 - it : it;
      const int t0 = c * C;
      const int t1 = t0 + C < T ? t0 + C : T;
      for (int r = 0; r < RP; ++r) {
        const uint row = part + P * (sg + NSG * r);
        if (row >= uint(Dv)) continue;
        for (int i = 0; i < NPT; ++i) {
          const size_t at = (size_t(c) * Dv + row) * row_stride + NPT * lane + i;
          if (!back) {
            ckpt_[at] = s[r][i];
          } else if (c != chunks - 1) {
            s[r][i] = ckpt_[at];
          }
        }
      }
      for (int t = t0; t < t1; ++t) {
        const size_t qk = ((size_t(b_idx) * T + t) * Hk + hk_idx) * Dk;
        const size_t vv = ((size_t(b_idx) * T + t) * Hv + hv_idx) * Dv;
        const size_t gt = (size_t(b_idx) * T + t) * Hv + hv_idx;
        for (int r = 0; r < RP; ++r) {
          const uint row = part + P * (sg + NSG * r);
          if (row >= uint(Dv)) continue;
          if (back) {
            for (int i = 0; i < NPT; ++i) {
              work_[(size_t(t - t0) * Dv + row) * row_stride + NPT * lane + i] = s[r][i];
            }
          }
          if (!(MLXK_TOKEN_ACTIVE)) continue;
          const float decay = g[gt];
          const float beta_t = beta[gt];
          float kv_mem = 0.0f;
          for (int i = 0; i < NPT; ++i) {
            s[r][i] = MLXK_MUL(s[r][i], decay);
            kv_mem += MLXK_MUL(s[r][i], k[qk + NPT * lane + i]);
          }
          kv_mem = simd_sum(kv_mem);
          const float delta = (v[vv + row] - kv_mem) * beta_t;
          for (int i = 0; i < NPT; ++i) {
            s[r][i] = s[r][i] + MLXK_MUL(k[qk + NPT * lane + i], delta);
          }
        }
      }
      if (!back) continue;

      for (int t = t1 - 1; t >= t0; --t) {
        const size_t qk = ((size_t(b_idx) * T + t) * Hk + hk_idx) * Dk;
        const size_t vv = ((size_t(b_idx) * T + t) * Hv + hv_idx) * Dv;
        const size_t gt = (size_t(b_idx) * T + t) * Hv + hv_idx;
        const size_t gp = ((size_t(b_idx) * T + t) * Hv + hv_idx) * P + part;  // this partial
        const size_t hd = gp * Dk;
        if (!(MLXK_TOKEN_ACTIVE)) {
          // The state passed through: every gradient of this token is zero, ds is unchanged.
          for (uint f = tid; f < uint(Dk); f += 32 * NSG) {
            dq_h[hd + f] = 0.0f;
            dk_h[hd + f] = 0.0f;
          }
          for (int r = 0; r < RP; ++r) {
            const uint row = part + P * (sg + NSG * r);
            if (row < uint(Dv) && lane == 0) dv[vv + row] = 0.0f;
          }
          if (tid == 0) {
            dg_part[gp] = 0.0f;
            dbeta_part[gp] = 0.0f;
          }
          continue;
        }
        const float decay = g[gt];
        const float beta_t = beta[gt];
        float qf[NPT], kf[NPT];
        for (int i = 0; i < NPT; ++i) {
          qf[i] = static_cast<float>(q[qk + NPT * lane + i]);
          kf[i] = static_cast<float>(k[qk + NPT * lane + i]);
        }
        float dq_p[NPT], dk_p[NPT];
        for (int i = 0; i < NPT; ++i) {
          dq_p[i] = 0.0f;
          dk_p[i] = 0.0f;
        }
        float dg_p = 0.0f, dbeta_p = 0.0f;
        for (int r = 0; r < RP; ++r) {
          const uint row = part + P * (sg + NSG * r);
          if (row >= uint(Dv)) continue;
          const float dy_r = static_cast<float>(dy[vv + row]);
          float sp[NPT], s1[NPT];
          float kv_mem = 0.0f;
          for (int i = 0; i < NPT; ++i) {
            sp[i] = work_[(size_t(t - t0) * Dv + row) * row_stride + NPT * lane + i];
            s1[i] = MLXK_MUL(sp[i], decay);
            kv_mem += MLXK_MUL(s1[i], kf[i]);
          }
          kv_mem = simd_sum(kv_mem);
          const float err = static_cast<float>(v[vv + row]) - kv_mem;
          const float delta = err * beta_t;
          // y = s' . q
          for (int i = 0; i < NPT; ++i) {
            const float s_next = s1[i] + MLXK_MUL(kf[i], delta);
            dq_p[i] += MLXK_MUL(dy_r, s_next);
            ds[r][i] += MLXK_MUL(dy_r, qf[i]);
          }
          // s' = s1 + k delta; delta = (v - s1 . k) beta
          float ddelta = 0.0f;
          for (int i = 0; i < NPT; ++i) ddelta += MLXK_MUL(ds[r][i], kf[i]);
          ddelta = simd_sum(ddelta);
          if (lane == 0) dv[vv + row] = ddelta * beta_t;
          dbeta_p += MLXK_MUL(ddelta, err);
          const float dkv = -ddelta * beta_t;
          float dg_row = 0.0f;
          for (int i = 0; i < NPT; ++i) {
            dk_p[i] += MLXK_MUL(delta, ds[r][i]);
            dk_p[i] += MLXK_MUL(dkv, s1[i]);
            const float ds1 = ds[r][i] + MLXK_MUL(dkv, kf[i]);
            dg_row += MLXK_MUL(ds1, sp[i]);
            ds[r][i] = MLXK_MUL(decay, ds1);
          }
          dg_p += simd_sum(dg_row);
        }
        // The sums over the value rows: each SIMD group's partials, then the groups in order.
        for (int i = 0; i < NPT; ++i) red[sg * Dk + NPT * lane + i] = dq_p[i];
        if (lane == 0) {
          red_s[sg] = dg_p;
          red_s[NSG + sg] = dbeta_p;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (uint f = tid; f < uint(Dk); f += 32 * NSG) {
          float acc = 0.0f;
          for (int w = 0; w < NSG; ++w) acc += red[w * Dk + f];
          dq_h[hd + f] = acc;
        }
        if (tid == 0) {
          float acc_g = 0.0f, acc_b = 0.0f;
          for (int w = 0; w < NSG; ++w) {
            acc_g += red_s[w];
            acc_b += red_s[NSG + w];
          }
          dg_part[gp] = acc_g;
          dbeta_part[gp] = acc_b;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (int i = 0; i < NPT; ++i) red[sg * Dk + NPT * lane + i] = dk_p[i];
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (uint f = tid; f < uint(Dk); f += 32 * NSG) {
          float acc = 0.0f;
          for (int w = 0; w < NSG; ++w) acc += red[w * Dk + f];
          dk_h[hd + f] = acc;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
      }
    }
    for (int r = 0; r < RP; ++r) {
      const uint row = part + P * (sg + NSG * r);
      if (row >= uint(Dv)) continue;
      for (int i = 0; i < NPT; ++i) {
        dstate[(size_t(n) * Dv + row) * Dk + NPT * lane + i] = ds[r][i];
      }
    }
