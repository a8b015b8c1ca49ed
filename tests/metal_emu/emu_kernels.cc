// The Metal kernels, compiled from kernels/metal/*.metal inside the signatures MLX generates
// for the library's launches (emu_gen.inc, written by signatures.cc), on the Metal shim.
// C++17, -ffp-contract=off, no fast-math.

#include <string>

#include "case_desc.h"
// Last: the shim defines the address-space qualifiers as macros.
#include "metal_shim.h"
#ifdef MLXK_EMU_TILE_FORM
// The matrix tiles' CUDA form instead of their Metal form (CUDA's lane layouts).
#include "cuda_tiles_host.h"
#endif

#include "emu_gen.inc"

const char* emu_variant() {
#if defined(MLXK_EMU_EXP_RETURNS_FLOAT)
  return "exp(half), exp(bfloat) widened to float";
#elif defined(MLXK_EMU_TILE_FORM)
  return MLXK_EMU_TILE_FORM == MLXK_TILE_FMA    ? "CUDA tiles: fma"
         : MLXK_EMU_TILE_FORM == MLXK_TILE_TF32 ? "CUDA tiles: tf32"
                                                 : "CUDA tiles: bf16";
#else
  return "";
#endif
}

int emu_tile_form() {
#ifdef MLXK_EMU_TILE_FORM
  return MLXK_EMU_TILE_FORM;
#else
  return -1;
#endif
}

const EmuCase* emu_cases(size_t* count) {
  *count = sizeof(emu_gen::kCases) / sizeof(emu_gen::kCases[0]);
  return emu_gen::kCases;
}

// ------------------------------------------------------------------------------------------
// Self-test of the executor and the shim's collectives, written in the Metal dialect.

namespace {

// One threadgroup of 96 threads (three SIMD groups), four threadgroups.
constexpr uint kGroup = 96;
constexpr uint kGroups = 4;
float g_sum_out[kGroup * kGroups];
float g_butterfly_out[kGroup * kGroups];
float g_barrier_out[kGroup * kGroups];
half g_half_out[kGroup * kGroups];
bfloat g_bfloat_out[kGroup * kGroups];

float lane_value(uint gid) {
  // Values whose sum depends on the order of the additions.
  const float magnitude[4] = {1e-3f, 1.0f, 3.0e3f, 7.0f};
  return magnitude[gid % 4] * (1.0f + 0.37f * float(gid % 13)) * ((gid * 7) % 5 < 2 ? -1.0f : 1.0f);
}

void self_test_kernel(uint3 thread_position_in_grid, uint thread_index_in_threadgroup,
                      uint thread_index_in_simdgroup) {
  const uint gid = thread_position_in_grid.x;
  const float value = lane_value(gid);
  g_sum_out[gid] = simd_sum(value);
  float x = value;
  for (ushort offset = 1; offset < 32; offset <<= 1) x = x + simd_shuffle_xor(x, offset);
  g_butterfly_out[gid] = x;
  g_half_out[gid] = simd_sum(half(value * 1e-3f));
  g_bfloat_out[gid] = simd_sum(bfloat(value));
  threadgroup float shared[kGroup];
  shared[thread_index_in_threadgroup] = value;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // Read a value written by another SIMD group before the barrier.
  g_barrier_out[gid] = shared[(thread_index_in_threadgroup + 37) % kGroup];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  shared[thread_index_in_threadgroup] = -1.0f;
  (void)thread_index_in_simdgroup;
}

}  // namespace

bool emu_shim_self_test(std::string* report) {
  const emu::Stats stats = emu::dispatch({kGroup * kGroups, 1, 1}, {kGroup, 1, 1},
                                         [](const emu::ThreadCoords& c) {
                                           const MetalThreadAttributes a = metal_thread_attributes(c);
                                           self_test_kernel(a.thread_position_in_grid,
                                                            a.thread_index_in_threadgroup,
                                                            a.thread_index_in_simdgroup);
                                         });
  for (uint gid = 0; gid < kGroup * kGroups; ++gid) {
    const uint base = gid / 32 * 32;
    // The reference: the butterfly over the SIMD group's 32 values, lane by lane.
    float x[32];
    half h[32];
    bfloat b[32];
    for (uint l = 0; l < 32; ++l) {
      x[l] = lane_value(base + l);
      h[l] = half(lane_value(base + l) * 1e-3f);
      b[l] = bfloat(lane_value(base + l));
    }
    for (uint offset = 1; offset < 32; offset <<= 1) {
      float nx[32];
      half nh[32];
      bfloat nb[32];
      for (uint l = 0; l < 32; ++l) {
        nx[l] = x[l] + x[l ^ offset];
        nh[l] = h[l] + h[l ^ offset];
        nb[l] = b[l] + b[l ^ offset];
      }
      for (uint l = 0; l < 32; ++l) x[l] = nx[l], h[l] = nh[l], b[l] = nb[l];
    }
    const uint lane = gid % 32;
    if (as_type<uint>(g_sum_out[gid]) != as_type<uint>(x[lane]) ||
        as_type<uint>(g_butterfly_out[gid]) != as_type<uint>(x[lane]) ||
        g_half_out[gid].bits_ != h[lane].bits_ || g_bfloat_out[gid].bits_ != b[lane].bits_) {
      *report = "simd_sum differs from the xor butterfly at thread " + std::to_string(gid);
      return false;
    }
    const uint group = gid / kGroup * kGroup;
    if (g_barrier_out[gid] != lane_value(group + (gid - group + 37) % kGroup)) {
      *report = "threadgroup memory after a barrier is wrong at thread " + std::to_string(gid);
      return false;
    }
  }
  *report = "simd_sum (float, half, bfloat) is the xor butterfly on every lane, equal to five "
            "simd_shuffle_xor steps; barriers order threadgroup memory across SIMD groups (" +
            std::to_string(stats.threadgroups) + " threadgroups, " +
            std::to_string(stats.simd_collectives) + " SIMD meetings, " +
            std::to_string(stats.barriers) + " barriers)";
  return true;
}
