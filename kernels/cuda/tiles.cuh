// Matrix tiles for the chunked kernels' products, MLX CUDA form: the API of kernels/metal/tiles.h
// (read its comment first), which src/cuda.rs replaces with this text in a CUDA launch's header,
// after metal_compat.cuh. One warp owns each tile; every operation is a warp collective.
//
// Three forms, chosen by MLXK_TILE_FORM (a line of the launch's header; src/cuda.rs writes it
// from MLXK_CUDA_TILES, fma by default), all with one accumulator layout:
//   MLXK_TILE_TF32  mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: inputs rounded to tf32
//                   by cvt.rna.tf32.f32 (10-bit mantissa, nearest, ties away: relative error
//                   <= 2^-11 per input), float32 accumulation;
//   MLXK_TILE_BF16  mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32: inputs rounded to bf16
//                   by cvt.rn.bf16x2.f32 (8-bit mantissa, nearest even: <= 2^-8 per input),
//                   float32 accumulation; twice tf32's rate on Hopper;
//   MLXK_TILE_FMA   no tensor core: each lane keeps whole rows of A and columns of B and sums
//                   in float32 fused multiply-adds (k = 0 to 7), the reference of the other two.
// Inline PTX only: <mma.h> is not on pip installs of MLX CUDA (its NVRTC lacks crt/mma.h).
//
// Lane layouts (PTX ISA, "Matrix fragments for mma.m16n8k8"; g = lane / 4, t = lane % 4):
//   tf32 A: (g, t) (g + 8, t) (g, t + 4) (g + 8, t + 4); B: (k = t, n = g) (k = t + 4, n = g)
//   bf16 A: two registers of two: row g, columns 2t, 2t + 1; row g + 8, the same columns
//        B: one register: (k = 2t, n = g) (k = 2t + 1, n = g)
//   accumulator (every form): e = 0..3 at row g + 8 (e / 2), column 2t + e % 2
// so row(lane, e) and col(lane, e) are the same for the three forms.
//
// MLXK_TILE_HOST (the Metal emulator's build of this layout, tests/metal_emu): the includer
// provides to_tf32, pack_bf16, mma_tf32 and mma_bf16 instead of the PTX below.
#ifndef MLXK_TILES_CUH
#define MLXK_TILES_CUH

#define MLXK_TILE_FMA 0
#define MLXK_TILE_TF32 1
#define MLXK_TILE_BF16 2
#ifndef MLXK_TILE_FORM
#define MLXK_TILE_FORM MLXK_TILE_FMA
#endif

namespace mlxk_tile {

enum { kElems = 4 };

#if MLXK_TILE_FORM == MLXK_TILE_FMA
struct a16x8 {
  float x[16];  // row g: k = 0..7, then row g + 8
};
struct b8x8 {
  float x[16];  // column 2t: k = 0..7, then column 2t + 1
};
#elif MLXK_TILE_FORM == MLXK_TILE_TF32
struct a16x8 {
  uint x[4];
};
struct b8x8 {
  uint x[2];
};
#elif MLXK_TILE_FORM == MLXK_TILE_BF16
struct a16x8 {
  uint x[2];
};
struct b8x8 {
  uint x[1];
};
#else
#error "MLXK_TILE_FORM: MLXK_TILE_FMA, MLXK_TILE_TF32 or MLXK_TILE_BF16"
#endif
struct acc16x8 {
  float x[4];
};

#ifndef MLXK_TILE_HOST
// x rounded to tf32 (the bits of a float whose low 13 mantissa bits are 0).
METAL_FUNC uint to_tf32(float x) {
  uint u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return u;
}
// lo and hi rounded to bf16, lo in the low half.
METAL_FUNC uint pack_bf16(float lo, float hi) {
  uint u;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
  return u;
}
METAL_FUNC void mma_tf32(float* c, const uint* a, const uint* b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
METAL_FUNC void mma_bf16(float* c, const uint* a, const uint* b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b[0]));
}
#endif

METAL_FUNC int row(uint lane, int e) { return int(lane >> 2) + 8 * (e >> 1); }
METAL_FUNC int col(uint lane, int e) { return int(lane & 3) * 2 + (e & 1); }

// Element (i, j) of the matrix stored at p with leading dimension ld, or of its transpose.
template <class P>
METAL_FUNC float at(P p, uint ld, bool transposed, int i, int j) {
  return transposed ? p[size_t(j) * ld + i] : p[size_t(i) * ld + j];
}

METAL_FUNC void fill(acc16x8& c, float v) {
  for (int e = 0; e < kElems; ++e) c.x[e] = v;
}

template <class P>
METAL_FUNC void load_a(a16x8& a, P p, uint ld, bool transposed, uint lane) {
  const int g = int(lane >> 2), t = int(lane & 3);
#if MLXK_TILE_FORM == MLXK_TILE_FMA
  (void)t;
  for (int k = 0; k < 8; ++k) {
    a.x[k] = at(p, ld, transposed, g, k);
    a.x[8 + k] = at(p, ld, transposed, g + 8, k);
  }
#elif MLXK_TILE_FORM == MLXK_TILE_TF32
  a.x[0] = to_tf32(at(p, ld, transposed, g, t));
  a.x[1] = to_tf32(at(p, ld, transposed, g + 8, t));
  a.x[2] = to_tf32(at(p, ld, transposed, g, t + 4));
  a.x[3] = to_tf32(at(p, ld, transposed, g + 8, t + 4));
#else
  a.x[0] = pack_bf16(at(p, ld, transposed, g, 2 * t), at(p, ld, transposed, g, 2 * t + 1));
  a.x[1] = pack_bf16(at(p, ld, transposed, g + 8, 2 * t), at(p, ld, transposed, g + 8, 2 * t + 1));
#endif
}

template <class P>
METAL_FUNC void load_b(b8x8& b, P p, uint ld, bool transposed, uint lane) {
  const int g = int(lane >> 2), t = int(lane & 3);
#if MLXK_TILE_FORM == MLXK_TILE_FMA
  (void)g;
  for (int k = 0; k < 8; ++k) {
    b.x[k] = at(p, ld, transposed, k, 2 * t);
    b.x[8 + k] = at(p, ld, transposed, k, 2 * t + 1);
  }
#elif MLXK_TILE_FORM == MLXK_TILE_TF32
  b.x[0] = to_tf32(at(p, ld, transposed, t, g));
  b.x[1] = to_tf32(at(p, ld, transposed, t + 4, g));
#else
  b.x[0] = pack_bf16(at(p, ld, transposed, 2 * t, g), at(p, ld, transposed, 2 * t + 1, g));
#endif
}

template <class P>
METAL_FUNC void load_c(acc16x8& c, P p, uint ld, uint lane) {
  for (int e = 0; e < kElems; ++e) c.x[e] = p[size_t(row(lane, e)) * ld + col(lane, e)];
}

METAL_FUNC void mma(acc16x8& c, const a16x8& a, const b8x8& b) {
#if MLXK_TILE_FORM == MLXK_TILE_FMA
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      float s = c.x[2 * i + j];
      for (int k = 0; k < 8; ++k) s = __fmaf_rn(a.x[8 * i + k], b.x[8 * j + k], s);
      c.x[2 * i + j] = s;
    }
  }
#elif MLXK_TILE_FORM == MLXK_TILE_TF32
  mma_tf32(c.x, a.x, b.x);
#else
  mma_bf16(c.x, a.x, b.x);
#endif
}

template <class P>
METAL_FUNC void store(const acc16x8& c, P p, uint ld, uint lane) {
  for (int e = 0; e < kElems; ++e) p[size_t(row(lane, e)) * ld + col(lane, e)] = c.x[e];
}

// The lanes of a row differ in lane bits 0 and 1 (t): x + lane ^ 1's, then + lane ^ 2's.
METAL_FUNC float row_sum(float x, uint lane) {
  (void)lane;
  x = x + __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

METAL_FUNC float get(const acc16x8& c, int e) { return c.x[e]; }
METAL_FUNC void set(acc16x8& c, int e, float v) { c.x[e] = v; }

}  // namespace mlxk_tile

#endif  // MLXK_TILES_CUH
