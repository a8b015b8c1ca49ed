// The grid executor: see executor.h.

#include "executor.h"

#include <ucontext.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace emu {
namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr size_t kPayload = kSimdPayload;

enum class State { Runnable, AtSimd, AtBarrier, Done };

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  State state = State::Runnable;
  Resolver resolver = nullptr;
  uint64_t arg = 0;
  alignas(16) unsigned char in[kPayload];
  alignas(16) unsigned char out[kPayload];
  ThreadCoords coords;
};

struct Threadgroup {
  std::vector<Fiber> fibers;  // grown as needed, stacks reused
  ucontext_t scheduler;
  const Body* body = nullptr;
  Fiber* current = nullptr;
  uint32_t count = 0;
  Dim3 pos{0, 0, 0};
};

Threadgroup g_group;

[[noreturn]] void fail(const char* format, ...) {
  std::fprintf(stderr, "metal-emu executor: threadgroup (%u, %u, %u): ", g_group.pos.x,
               g_group.pos.y, g_group.pos.z);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::abort();
}

void fiber_main() {
  Fiber* fiber = g_group.current;
  (*g_group.body)(fiber->coords);
  fiber->state = State::Done;
  swapcontext(&fiber->context, &g_group.scheduler);
  std::abort();  // a finished fiber is never resumed
}

Fiber* current_fiber(const char* what) {
  if (g_group.current == nullptr) {
    std::fprintf(stderr, "metal-emu executor: %s outside a dispatched thread\n", what);
    std::abort();
  }
  return g_group.current;
}

void block(Fiber* fiber, State state) {
  fiber->state = state;
  swapcontext(&fiber->context, &g_group.scheduler);
}

// Runs one threadgroup to completion; returns its meetings in `stats`.
void run_threadgroup(Stats& stats) {
  Threadgroup& tg = g_group;
  const uint32_t n = tg.count;
  for (uint32_t i = 0; i < n; ++i) {
    Fiber& f = tg.fibers[i];
    if (!f.stack) f.stack.reset(new char[kStackBytes]);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_main, 0);
    f.state = State::Runnable;
  }
  const uint32_t simd_groups = (n + kSimdWidth - 1) / kSimdWidth;
  for (;;) {
    for (uint32_t i = 0; i < n; ++i) {
      Fiber& f = tg.fibers[i];
      if (f.state != State::Runnable) continue;
      tg.current = &f;
      swapcontext(&tg.scheduler, &f.context);
      tg.current = nullptr;
    }
    // Every thread now waits or is done.
    uint32_t done = 0, at_barrier = 0;
    bool resolved = false;
    for (uint32_t sg = 0; sg < simd_groups; ++sg) {
      const uint32_t first = sg * kSimdWidth;
      const uint32_t last = first + kSimdWidth < n ? first + kSimdWidth : n;
      uint32_t at_simd = 0;
      for (uint32_t i = first; i < last; ++i) {
        const State s = tg.fibers[i].state;
        at_simd += s == State::AtSimd;
        done += s == State::Done;
        at_barrier += s == State::AtBarrier;
      }
      if (at_simd == 0) continue;
      if (last - first != kSimdWidth) {
        fail("SIMD group %u has %u threads: a collective needs 32 lanes", sg, last - first);
      }
      if (at_simd != kSimdWidth) {
        fail("SIMD group %u: %u of 32 lanes reached a SIMD collective (the others exited or "
             "wait at a barrier): the collective is not uniform across the SIMD group",
             sg, at_simd);
      }
      const void* in[kSimdWidth];
      void* out[kSimdWidth];
      const Fiber& lane0 = tg.fibers[first];
      for (uint32_t l = 0; l < kSimdWidth; ++l) {
        Fiber& f = tg.fibers[first + l];
        if (f.resolver != lane0.resolver || f.arg != lane0.arg) {
          fail("SIMD group %u: lanes 0 and %u wait at different SIMD collectives", sg, l);
        }
        in[l] = f.in;
        out[l] = f.out;
      }
      lane0.resolver(in, out, lane0.arg);
      for (uint32_t l = 0; l < kSimdWidth; ++l) tg.fibers[first + l].state = State::Runnable;
      ++stats.simd_collectives;
      resolved = true;
    }
    if (resolved) continue;
    if (done == n) return;
    if (at_barrier + done == n) {
      if (done != 0) {
        fail("%u of %u threads exited while the others wait at a threadgroup barrier", done,
             n);
      }
      for (uint32_t i = 0; i < n; ++i) tg.fibers[i].state = State::Runnable;
      ++stats.barriers;
      continue;
    }
    fail("deadlock");
  }
}

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

}  // namespace

void simd_collective(Resolver resolver, uint64_t arg, const void* in, void* out, size_t size) {
  simd_collective(resolver, arg, in, size, out, size);
}

void simd_collective(Resolver resolver, uint64_t arg, const void* in, size_t in_size, void* out,
                     size_t out_size) {
  Fiber* f = current_fiber("a SIMD collective");
  if (in_size > kPayload || out_size > kPayload) std::abort();
  f->resolver = resolver;
  f->arg = arg;
  std::memcpy(f->in, in, in_size);
  block(f, State::AtSimd);
  if (out_size != 0) std::memcpy(out, f->out, out_size);
}

uint32_t current_lane() { return current_fiber("a lane query")->coords.index_in_group % kSimdWidth; }

void threadgroup_barrier() { block(current_fiber("threadgroup_barrier"), State::AtBarrier); }

Stats dispatch(Dim3 grid, Dim3 threadgroup, const Body& body) {
  Stats stats;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return stats;
  if (threadgroup.x == 0 || threadgroup.y == 0 || threadgroup.z == 0) {
    std::fprintf(stderr, "metal-emu executor: empty threadgroup\n");
    std::abort();
  }
  // MLX: MTL::Size(min(tx, gx), min(ty, gy), min(tz, gz)), dispatched with dispatchThreads.
  const Dim3 group{threadgroup.x < grid.x ? threadgroup.x : grid.x,
                   threadgroup.y < grid.y ? threadgroup.y : grid.y,
                   threadgroup.z < grid.z ? threadgroup.z : grid.z};
  const Dim3 groups{ceil_div(grid.x, group.x), ceil_div(grid.y, group.y),
                    ceil_div(grid.z, group.z)};
  if (static_cast<uint64_t>(group.x) * group.y * group.z > 1024) {
    std::fprintf(stderr, "metal-emu executor: threadgroup of %u x %u x %u threads exceeds 1024\n",
                 group.x, group.y, group.z);
    std::abort();
  }
  Threadgroup& tg = g_group;
  tg.body = &body;
  for (uint32_t gz = 0; gz < groups.z; ++gz) {
    for (uint32_t gy = 0; gy < groups.y; ++gy) {
      for (uint32_t gx = 0; gx < groups.x; ++gx) {
        const Dim3 pos{gx, gy, gz};
        const Dim3 actual{
            grid.x - gx * group.x < group.x ? grid.x - gx * group.x : group.x,
            grid.y - gy * group.y < group.y ? grid.y - gy * group.y : group.y,
            grid.z - gz * group.z < group.z ? grid.z - gz * group.z : group.z};
        const uint32_t count = actual.x * actual.y * actual.z;
        if (tg.fibers.size() < count) tg.fibers.resize(count);
        tg.count = count;
        tg.pos = pos;
        for (uint32_t z = 0; z < actual.z; ++z) {
          for (uint32_t y = 0; y < actual.y; ++y) {
            for (uint32_t x = 0; x < actual.x; ++x) {
              const uint32_t index = x + y * actual.x + z * actual.x * actual.y;
              ThreadCoords& c = tg.fibers[index].coords;
              c.grid = grid;
              c.group = group;
              c.group_actual = actual;
              c.groups = groups;
              c.group_pos = pos;
              c.pos_in_group = {x, y, z};
              c.pos_in_grid = {gx * group.x + x, gy * group.y + y, gz * group.z + z};
              c.index_in_group = index;
            }
          }
        }
        run_threadgroup(stats);
        ++stats.threadgroups;
        stats.threads += count;
        if (count > stats.max_group_threads) stats.max_group_threads = count;
      }
    }
  }
  tg.body = nullptr;
  return stats;
}

}  // namespace emu
