// Matrix tiles for the chunked kernels' products, Metal form (docs/backends.md, "Tiles"): the
// header of the launches whose text multiplies matrices with them. The same API has an MLX CUDA
// form (kernels/cuda/tiles.cuh, which src/cuda.rs puts in this text's place) and runs in the
// Metal emulator on this very text (tests/metal_emu/metal_shim.h's simdgroup matrices).
//
// One SIMD group (32 lanes) owns each tile; every operation is a SIMD-group collective (all 32
// lanes call it with the same arguments but `lane`). Roles are types:
//   mlxk_tile::a16x8    A, 16 rows x 8 of the reduced dimension k
//   mlxk_tile::b8x8     B, 8 of k x 8 columns
//   mlxk_tile::acc16x8  the float32 accumulator, 16 x 8
// and the operations
//   fill(c, x)                       every element of c = x
//   load_a(a, p, ld, transposed, lane)  A[r][k] = transposed ? p[k * ld + r] : p[r * ld + k]
//   load_b(b, p, ld, transposed, lane)  B[k][n] = transposed ? p[n * ld + k] : p[k * ld + n]
//   load_c(c, p, ld, lane)           C[r][n] = p[r * ld + n]
//   mma(c, a, b)                     C += A B
//   store(c, p, ld, lane)            p[r * ld + n] = C[r][n]
//   get(c, e), set(c, e, x), row(lane, e), col(lane, e): the kElems = 4 elements a lane
//                                    holds of an accumulator, at (row, col), e = 0..3
//   row_sum(x, lane)                 x summed over the 4 lanes that hold one accumulator row
//                                    (each lane's x its own elements of that row): the row's
//                                    total over the tile's 8 columns, in each of those lanes
// p is a threadgroup or device float pointer (float32 values); ld counts floats. row and col
// let a kernel scale rows by gates, mask, or add per element: on every form the lane map puts
// e = 0, 1 on one row (columns col, col + 1) and e = 2, 3 eight rows below.
//
// Metal: each 16 x 8 tile is two simdgroup_float8x8 (rows 0-7, 8-15), mma is two
// simdgroup_multiply_accumulate, so a 16x8x8 product wastes nothing on either backend. The
// element a lane holds follows MLX's steel GEMM (BaseMMAFrag::get_coord, also tinygrad's METAL
// map): q = lane / 4, row (q & 4) + (lane / 2) % 4, columns (q & 2) * 2 + (lane % 2) * 2 and
// the next; Apple documents none, the emulator assumes the same.
#ifndef MLXK_TILES_H
#define MLXK_TILES_H
#ifndef METAL_FUNC
#define METAL_FUNC inline
#endif

namespace mlxk_tile {

enum { kElems = 4 };

struct a16x8 {
  simdgroup_float8x8 m[2];
};
struct b8x8 {
  simdgroup_float8x8 m;
};
struct acc16x8 {
  simdgroup_float8x8 m[2];
};

METAL_FUNC int row(uint lane, int e) {
  const uint q = lane / 4;
  return int((q & 4) + (lane / 2) % 4) + 8 * (e >> 1);
}
METAL_FUNC int col(uint lane, int e) {
  const uint q = lane / 4;
  return int((q & 2) * 2 + (lane % 2) * 2) + (e & 1);
}

METAL_FUNC void fill(thread acc16x8& c, float x) {
  c.m[0] = make_filled_simdgroup_matrix<float, 8, 8>(x);
  c.m[1] = make_filled_simdgroup_matrix<float, 8, 8>(x);
}

template <class P>
METAL_FUNC void load_a(thread a16x8& a, P p, uint ld, bool transposed, uint lane) {
  (void)lane;
  simdgroup_load(a.m[0], p, ld, ulong2(0, 0), transposed);
  simdgroup_load(a.m[1], p + (transposed ? 8 : 8 * ld), ld, ulong2(0, 0), transposed);
}

template <class P>
METAL_FUNC void load_b(thread b8x8& b, P p, uint ld, bool transposed, uint lane) {
  (void)lane;
  simdgroup_load(b.m, p, ld, ulong2(0, 0), transposed);
}

template <class P>
METAL_FUNC void load_c(thread acc16x8& c, P p, uint ld, uint lane) {
  (void)lane;
  simdgroup_load(c.m[0], p, ld);
  simdgroup_load(c.m[1], p + 8 * ld, ld);
}

METAL_FUNC void mma(thread acc16x8& c, thread const a16x8& a, thread const b8x8& b) {
  simdgroup_multiply_accumulate(c.m[0], a.m[0], b.m, c.m[0]);
  simdgroup_multiply_accumulate(c.m[1], a.m[1], b.m, c.m[1]);
}

template <class P>
METAL_FUNC void store(thread const acc16x8& c, P p, uint ld, uint lane) {
  (void)lane;
  simdgroup_store(c.m[0], p, ld);
  simdgroup_store(c.m[1], p + 8 * ld, ld);
}

// The lanes of a row differ in lane bits 0 and 3 (the columns): x + lane ^ 1's, then + lane ^ 8's.
METAL_FUNC float row_sum(float x, uint lane) {
  (void)lane;
  x = x + simd_shuffle_xor(x, ushort(1));
  return x + simd_shuffle_xor(x, ushort(8));
}

METAL_FUNC float get(thread acc16x8& c, int e) { return c.m[e >> 1].thread_elements()[e & 1]; }
METAL_FUNC void set(thread acc16x8& c, int e, float x) { c.m[e >> 1].thread_elements()[e & 1] = x; }

}  // namespace mlxk_tile

#endif  // MLXK_TILES_H
