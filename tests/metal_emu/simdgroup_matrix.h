// Metal's simdgroup_matrix surface for the shim (metal_shim.h includes it inside namespace
// metal): simdgroup_float8x8, make_filled_simdgroup_matrix, simdgroup_load, simdgroup_store,
// simdgroup_multiply_accumulate and thread_elements(), as the tiles' Metal form
// (kernels/metal/tiles.h) uses them. Only float 8 x 8.
//
// * A matrix is 64 values spread over the 32 lanes of a SIMD group, two per lane. The lane map
//   (which two a lane holds, what thread_elements() gives) is MLX's steel GEMM's
//   (BaseMMAFrag::get_coord; tinygrad's METAL map): q = lane / 4, row (q & 4) + (lane / 2) % 4,
//   columns (q & 2) * 2 + (lane % 2) * 2 and the next. Apple documents none.
// * load, store and multiply-accumulate are SIMD collectives: all 32 lanes must reach them, a
//   load's or store's arguments (pointer, stride, origin, transposition) must be the same in
//   every lane (else the emulation aborts: a kernel bug). The resolver reads or writes memory
//   for all lanes. simdgroup_load(m, p, ld, origin, transposed): M[r][c] = p[(oy + r) * ld +
//   ox + c], or p[(oy + c) * ld + ox + r] transposed (origin = (ox, oy), column then row);
//   simdgroup_store is its inverse.
// * simdgroup_multiply_accumulate(d, a, b, c): D[i][j] = C[i][j] + sum over k of
//   A[i][k] B[k][j], in a fixed order: k = 0 to 7, each step one fused multiply-add (std::fma,
//   rounded once). Metal documents neither order nor rounding, so results on a GPU may differ
//   by the reordering of 8 terms; the kernels' tests bound their results, never compare bits.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct float2 {
  float x, y;
  float& operator[](int i) { return i ? y : x; }
  float operator[](int i) const { return i ? y : x; }
};

struct ulong2 {
  uint64_t x, y;
  ulong2(uint64_t v = 0) : x(v), y(v) {}
  ulong2(uint64_t a, uint64_t b) : x(a), y(b) {}
};

namespace emu {

inline uint32_t metal8x8_row(uint32_t lane) { return (lane / 4 & 4) + (lane / 2) % 4; }
inline uint32_t metal8x8_col(uint32_t lane) { return (lane / 4 & 2) * 2 + (lane % 2) * 2; }

struct MatrixAccess {
  float* p;
  uint64_t ld, ox, oy;
  uint32_t transposed;
  float v[2];  // a store's values
};

// The address of element (r, c) of the 8 x 8 matrix an access names.
inline float* matrix_element(const MatrixAccess& m, uint32_t r, uint32_t c) {
  return m.transposed ? m.p + (m.oy + c) * m.ld + m.ox + r : m.p + (m.oy + r) * m.ld + m.ox + c;
}

inline const MatrixAccess& same_access(const void* const* in, const char* what) {
  const MatrixAccess& a = *static_cast<const MatrixAccess*>(in[0]);
  for (uint32_t l = 1; l < kSimdWidth; ++l) {
    const MatrixAccess& b = *static_cast<const MatrixAccess*>(in[l]);
    if (b.p != a.p || b.ld != a.ld || b.ox != a.ox || b.oy != a.oy ||
        b.transposed != a.transposed) {
      std::fprintf(stderr, "metal-emu: %s: lanes 0 and %u name different matrices\n", what, l);
      std::abort();
    }
  }
  return a;
}

inline void resolve_matrix_load(const void* const* in, void* const* out, uint64_t) {
  const MatrixAccess& m = same_access(in, "simdgroup_load");
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    float v[2];
    for (uint32_t j = 0; j < 2; ++j) v[j] = *matrix_element(m, metal8x8_row(l), metal8x8_col(l) + j);
    std::memcpy(out[l], v, sizeof v);
  }
}

inline void resolve_matrix_store(const void* const* in, void* const*, uint64_t) {
  const MatrixAccess& m = same_access(in, "simdgroup_store");
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    const MatrixAccess& mine = *static_cast<const MatrixAccess*>(in[l]);
    for (uint32_t j = 0; j < 2; ++j) {
      *matrix_element(m, metal8x8_row(l), metal8x8_col(l) + j) = mine.v[j];
    }
  }
}

// D = A B + C over the lanes' elements (the order above).
inline void resolve_matrix_mma(const void* const* in, void* const* out, uint64_t) {
  float a[8][8], b[8][8], c[8][8];
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    const float* v = static_cast<const float*>(in[l]);
    for (uint32_t j = 0; j < 2; ++j) {
      const uint32_t r = metal8x8_row(l), col = metal8x8_col(l) + j;
      a[r][col] = v[j];
      b[r][col] = v[2 + j];
      c[r][col] = v[4 + j];
    }
  }
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    float d[2];
    for (uint32_t j = 0; j < 2; ++j) {
      const uint32_t r = metal8x8_row(l), col = metal8x8_col(l) + j;
      float acc = c[r][col];
      for (uint32_t k = 0; k < 8; ++k) acc = std::fma(a[r][k], b[k][col], acc);
      d[j] = acc;
    }
    std::memcpy(out[l], d, sizeof d);
  }
}

}  // namespace emu

namespace metal {

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(std::is_same_v<T, float> && Cols == 8 && Rows == 8,
                "the emulation has float 8 x 8 simdgroup matrices only");
  float2 e;  // this lane's two elements (the lane map above)
  float2& thread_elements() { return e; }
  const float2& thread_elements() const { return e; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;

template <class T, int Cols, int Rows>
inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.e = float2{value, value};
  return m;
}

inline void simdgroup_load(simdgroup_float8x8& m, const float* p, uint64_t ld = 8,
                           ulong2 origin = ulong2(0), bool transposed = false) {
  const emu::MatrixAccess access{const_cast<float*>(p), ld, origin.x, origin.y, transposed, {0, 0}};
  float v[2];
  emu::simd_collective(&emu::resolve_matrix_load, 0, &access, sizeof access, v, sizeof v);
  m.e = float2{v[0], v[1]};
}

inline void simdgroup_store(const simdgroup_float8x8& m, float* p, uint64_t ld = 8,
                            ulong2 origin = ulong2(0), bool transposed = false) {
  const emu::MatrixAccess access{p, ld, origin.x, origin.y, transposed, {m.e.x, m.e.y}};
  emu::simd_collective(&emu::resolve_matrix_store, 0, &access, sizeof access, nullptr, 0);
}

inline void simdgroup_multiply_accumulate(simdgroup_float8x8& d, const simdgroup_float8x8& a,
                                          const simdgroup_float8x8& b,
                                          const simdgroup_float8x8& c) {
  const float in[6] = {a.e.x, a.e.y, b.e.x, b.e.y, c.e.x, c.e.y};
  float v[2];
  emu::simd_collective(&emu::resolve_matrix_mma, 0, in, sizeof in, v, sizeof v);
  d.e = float2{v[0], v[1]};
}

}  // namespace metal
