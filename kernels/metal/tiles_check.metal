// The matrix tiles' self-test and benchmark (kernels/metal/tiles.h, kernels/cuda/tiles.cuh):
// every operation of the tile API on small products, for the Metal emulator, the CUDA mock and
// the GPU (src/metal/tiles.rs describes the launches; tests/metal_emu and tests/cuda check them
// against float64 products).
//
// Check (default): per work item g (one threadgroup of NT threads, NT / 32 SIMD groups), with
// A = a[g] (M x K), B = b[g] (K x N), gate[g] (M) and c0[g] (M x N), through threadgroup
// memory:
//   y[g] = c0 + mask(diag(gate) A B)  mask: element (r, n) kept where n <= r, else 0
//                                      (fill, load_a and load_b as stored, mma, row/col with
//                                      get/set, load_c and store on device memory)
//   ysum[g][r][t] = the sum of mask(diag(gate) A B)[r][n] over the 8 columns n of tile t
//                                      (row_sum)
//   z[g] = Aᵀ A   (K x K)            (load_a transposed, load_b as stored, store to device)
//   w[g] = A Aᵀ   (M x M)            (load_b transposed, store to threadgroup memory)
// Template: M, N (multiples of 16), K (multiple of 16), NT.
//
// Bench (MLXK_TILES_BENCH in the launch's header): per work item, A = a[g] (64 x K) and
// B = b[g] (K x 64) in threadgroup memory, four SIMD groups each owning a 32 x 32 block of
// the product (2 x 4 accumulators), summed REPS times over k (the k offset turning with the
// repetition, so loads stay in the loop): y[g] = REPS A B. 2 * 64 * 64 * K * REPS FLOP per item.
    const uint tid = thread_position_in_threadgroup.x;
    const uint item = thread_position_in_grid.x / NT;
    const uint lane = thread_index_in_simdgroup;
    const uint sg = simdgroup_index_in_threadgroup;
    constexpr int NSG = NT / 32;

#ifndef MLXK_TILES_BENCH
    threadgroup float a_s[M * K];
    threadgroup float b_s[K * N];
    threadgroup float w_s[M * M];
    for (int e = int(tid); e < M * K; e += NT) a_s[e] = a[size_t(item) * M * K + e];
    for (int e = int(tid); e < K * N; e += NT) b_s[e] = b[size_t(item) * K * N + e];
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);

    // y: (M / 16) x (N / 8) tiles.
    for (int tile = int(sg); tile < (M / 16) * (N / 8); tile += NSG) {
      const int r0 = tile / (N / 8) * 16, n0 = tile % (N / 8) * 8;
      mlxk_tile::acc16x8 acc;
      mlxk_tile::fill(acc, 0.0f);
      for (int k0 = 0; k0 < K; k0 += 8) {
        mlxk_tile::a16x8 at;
        mlxk_tile::b8x8 bt;
        mlxk_tile::load_a(at, a_s + r0 * K + k0, K, false, lane);
        mlxk_tile::load_b(bt, b_s + k0 * N + n0, N, false, lane);
        mlxk_tile::mma(acc, at, bt);
      }
      mlxk_tile::acc16x8 out;
      mlxk_tile::load_c(out, c0 + size_t(item) * M * N + r0 * N + n0, N, lane);
      float part[2] = {0.0f, 0.0f};  // this lane's share of its two rows
      for (int e = 0; e < mlxk_tile::kElems; ++e) {
        const int r = r0 + mlxk_tile::row(lane, e), n = n0 + mlxk_tile::col(lane, e);
        const float scaled = n <= r ? gate[size_t(item) * M + r] * mlxk_tile::get(acc, e) : 0.0f;
        mlxk_tile::set(out, e, mlxk_tile::get(out, e) + scaled);
        part[e >> 1] += scaled;
      }
      mlxk_tile::store(out, y + size_t(item) * M * N + r0 * N + n0, N, lane);
      for (int h = 0; h < 2; ++h) {
        const float total = mlxk_tile::row_sum(part[h], lane);
        if (mlxk_tile::col(lane, 0) == 0) {
          const int r = r0 + mlxk_tile::row(lane, 2 * h);
          ysum[(size_t(item) * M + r) * (N / 8) + n0 / 8] = total;
        }
      }
    }
    // z = Aᵀ A: (K / 16) x (K / 8) tiles, summed over the M rows of A.
    for (int tile = int(sg); tile < (K / 16) * (K / 8); tile += NSG) {
      const int i0 = tile / (K / 8) * 16, j0 = tile % (K / 8) * 8;
      mlxk_tile::acc16x8 acc;
      mlxk_tile::fill(acc, 0.0f);
      for (int m0 = 0; m0 < M; m0 += 8) {
        mlxk_tile::a16x8 at;
        mlxk_tile::b8x8 bt;
        mlxk_tile::load_a(at, a_s + m0 * K + i0, K, true, lane);
        mlxk_tile::load_b(bt, a_s + m0 * K + j0, K, false, lane);
        mlxk_tile::mma(acc, at, bt);
      }
      mlxk_tile::store(acc, z + size_t(item) * K * K + i0 * K + j0, K, lane);
    }
    // w = A Aᵀ: (M / 16) x (M / 8) tiles through threadgroup memory.
    for (int tile = int(sg); tile < (M / 16) * (M / 8); tile += NSG) {
      const int i0 = tile / (M / 8) * 16, j0 = tile % (M / 8) * 8;
      mlxk_tile::acc16x8 acc;
      mlxk_tile::fill(acc, 0.0f);
      for (int k0 = 0; k0 < K; k0 += 8) {
        mlxk_tile::a16x8 at;
        mlxk_tile::b8x8 bt;
        mlxk_tile::load_a(at, a_s + i0 * K + k0, K, false, lane);
        mlxk_tile::load_b(bt, a_s + j0 * K + k0, K, true, lane);
        mlxk_tile::mma(acc, at, bt);
      }
      mlxk_tile::store(acc, w_s + i0 * M + j0, M, lane);
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    for (int e = int(tid); e < M * M; e += NT) w[size_t(item) * M * M + e] = w_s[e];

#else
    constexpr int BM = 64, BN = 64;
    threadgroup float a_s[BM * K];
    threadgroup float b_s[K * BN];
    for (int e = int(tid); e < BM * K; e += NT) a_s[e] = a[size_t(item) * BM * K + e];
    for (int e = int(tid); e < K * BN; e += NT) b_s[e] = b[size_t(item) * K * BN + e];
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    const int r0 = int(sg) / 2 * 32, n0 = int(sg) % 2 * 32;
    mlxk_tile::acc16x8 acc[2][4];
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 4; ++j) mlxk_tile::fill(acc[i][j], 0.0f);
    }
    for (int rep = 0; rep < REPS; ++rep) {
      for (int kk = 0; kk < K; kk += 8) {
        const int k0 = (kk + rep * 8) % K;
        mlxk_tile::a16x8 at[2];
        mlxk_tile::b8x8 bt[4];
        for (int i = 0; i < 2; ++i) {
          mlxk_tile::load_a(at[i], a_s + (r0 + 16 * i) * K + k0, K, false, lane);
        }
        for (int j = 0; j < 4; ++j) {
          mlxk_tile::load_b(bt[j], b_s + k0 * BN + n0 + 8 * j, BN, false, lane);
        }
        for (int i = 0; i < 2; ++i) {
          for (int j = 0; j < 4; ++j) mlxk_tile::mma(acc[i][j], at[i], bt[j]);
        }
      }
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 4; ++j) {
        mlxk_tile::store(acc[i][j], y + size_t(item) * BM * BN + (r0 + 16 * i) * BN + n0 + 8 * j,
                         BN, lane);
      }
    }
#endif
