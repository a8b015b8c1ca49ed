// The grid executor of the Metal-text emulation: runs a launch's threads as fibers (ucontext),
// one threadgroup at a time, each SIMD group of 32 lanes meeting at every SIMD collective and
// each threadgroup at every barrier. Deterministic: threads run in index order until they block
// or finish; then every SIMD group whose 32 lanes all wait at a collective is resolved; when no
// SIMD group can proceed and every live thread waits at a barrier, the barrier opens.
//
// Geometry follows MLX's CustomKernel::eval_gpu: the grid counts threads, the threadgroup size
// is min(threadgroup, grid) per axis, and threadgroups at the grid's edge are partial (Metal's
// dispatchThreads). Threads are linearized x-fastest within a threadgroup; lane = index % 32,
// SIMD group = index / 32.
//
// The executor refuses (prints and aborts) what the kernels must never do: a SIMD collective
// reached by only part of a SIMD group (divergence, or lanes that exited), lanes of one SIMD
// group at different collectives, a barrier not reached by every thread of the threadgroup,
// and deadlock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace emu {

constexpr uint32_t kSimdWidth = 32;

struct Dim3 {
  uint32_t x, y, z;
};

// Where one thread is; everything the Metal thread attributes derive from.
struct ThreadCoords {
  Dim3 grid;            // threads per grid (the launch's grid)
  Dim3 group;           // the dispatch's threadgroup size: min(threadgroup, grid) per axis
  Dim3 group_actual;    // this threadgroup's size (smaller at the grid's edge)
  Dim3 groups;          // threadgroups per grid
  Dim3 group_pos;       // threadgroup position in the grid
  Dim3 pos_in_group;    // thread position in its threadgroup
  Dim3 pos_in_grid;     // group_pos * group + pos_in_group
  uint32_t index_in_group;  // x + y * group_actual.x + z * group_actual.x * group_actual.y
};

struct Stats {
  uint64_t threadgroups = 0;
  uint64_t threads = 0;
  uint64_t simd_collectives = 0;  // SIMD-group meetings resolved
  uint64_t barriers = 0;          // threadgroup barriers opened
  uint64_t max_group_threads = 0;
};

using Body = std::function<void(const ThreadCoords&)>;

// Runs `body` for every thread of the grid, threadgroup after threadgroup.
Stats dispatch(Dim3 grid, Dim3 threadgroup, const Body& body);

// ---- Used from inside a dispatched thread (by the shim).

// A SIMD collective: every lane deposits `size` bytes; when the 32 lanes are present, the
// resolver computes each lane's result from all inputs. `arg` (e.g. a shuffle mask) must be
// equal across the lanes.
using Resolver = void (*)(const void* const* in, void* const* out, uint64_t arg);
void simd_collective(Resolver resolver, uint64_t arg, const void* in, void* out, size_t size);
// The same with `in_size` bytes deposited and `out_size` bytes of result per lane (each at
// most kSimdPayload: a matrix operation's operands).
constexpr size_t kSimdPayload = 64;
void simd_collective(Resolver resolver, uint64_t arg, const void* in, size_t in_size, void* out,
                     size_t out_size);
// The calling thread's lane (index in its SIMD group).
uint32_t current_lane();
void threadgroup_barrier();

// simd_sum as the xor butterfly: at offsets 1, 2, 4, 8, 16, x[l] = x[l] + x[l ^ offset].
template <class T>
void resolve_simd_sum(const void* const* in, void* const* out, uint64_t) {
  T x[kSimdWidth];
  for (uint32_t l = 0; l < kSimdWidth; ++l) std::memcpy(&x[l], in[l], sizeof(T));
  for (uint32_t offset = 1; offset < kSimdWidth; offset <<= 1) {
    T next[kSimdWidth];
    for (uint32_t l = 0; l < kSimdWidth; ++l) next[l] = x[l] + x[l ^ offset];
    for (uint32_t l = 0; l < kSimdWidth; ++l) x[l] = next[l];
  }
  for (uint32_t l = 0; l < kSimdWidth; ++l) std::memcpy(out[l], &x[l], sizeof(T));
}

// simd_shuffle_xor: lane l receives lane (l ^ mask)'s value.
template <class T>
void resolve_shuffle_xor(const void* const* in, void* const* out, uint64_t mask) {
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    std::memcpy(out[l], in[l ^ mask], sizeof(T));
  }
}

// simd_shuffle with the source lane the same in every lane (all the kernels need): lane l
// receives lane `from`'s value.
template <class T>
void resolve_shuffle(const void* const* in, void* const* out, uint64_t from) {
  for (uint32_t l = 0; l < kSimdWidth; ++l) std::memcpy(out[l], in[from], sizeof(T));
}

template <class T>
T simd_sum(T value) {
  static_assert(sizeof(T) <= kSimdPayload, "SIMD payloads are at most kSimdPayload bytes");
  T result;
  simd_collective(&resolve_simd_sum<T>, 0, &value, &result, sizeof(T));
  return result;
}

// A lane exchange resolved by `resolver` with `arg` (a lane or a lane mask, the same in every
// lane), checked to lie inside the SIMD group; `what` names the call in the message.
template <class T>
T simd_exchange(Resolver resolver, uint16_t arg, const char* what, T value) {
  static_assert(sizeof(T) <= kSimdPayload, "SIMD payloads are at most kSimdPayload bytes");
  if (arg >= kSimdWidth) {
    std::fprintf(stderr, "metal-emu: %s %u outside the SIMD group\n", what, arg);
    std::abort();
  }
  T result;
  // Lanes naming different arguments wait at different collectives: the executor reports it.
  simd_collective(resolver, arg, &value, &result, sizeof(T));
  return result;
}

template <class T>
T simd_shuffle(T value, uint16_t from) {
  return simd_exchange(&resolve_shuffle<T>, from, "simd_shuffle lane", value);
}

template <class T>
T simd_shuffle_xor(T value, uint16_t mask) {
  return simd_exchange(&resolve_shuffle_xor<T>, mask, "simd_shuffle_xor mask", value);
}

}  // namespace emu
