// One emulated launch, as tests/metal_emu/signatures.cc writes it (emu_gen.inc): the case the
// harness builds inputs for, the launch description from src/metal/ (geometry, buffers),
// and the launcher that runs the kernel file through the executor.
#pragma once

#include <cstddef>
#include <cstdint>

#include "executor.h"

struct EmuTensor {
  const char* name;
  int dtype;  // mlxk_dtype code
  int ndim;
  int64_t dims[8];
};

struct EmuCase {
  int id;
  const char* kind;  // recurrence(_masked), replay, head_split, gated_norm, backward(_masked),
                     // pool_update(_masked), pool_verify(_masked), pool_packed, pool_replay,
                     // chunk_prep, chunk_state, chunk_out, chunk_pool_*
  const char* label;
  const char* kernel_name;  // the name MLX gives the instantiated kernel
  const char* file;         // the kernel file compiled as the body
  int dtype;                // q/k/v or x dtype
  int aux_dtype;            // b's dtype (recurrence, replay) or the gate's (gated norm)
  int ndims;
  int64_t dims[8];  // B T Hk Hv Dk Dv (recurrence, replay), B S Hk Hv Dk Dv (head split), shape
  int masked;
  int with_state;
  int n_lengths;
  int32_t lengths[16];  // replay (pool replay: the accepted lengths)
  int checkpoint;  // backward: tokens between kept states (Tin[1])
  int twin;        // backward: the case with the same draws and another checkpoint, or -1
  int pool_n;      // pool cases: the pool's rows N
  int n_slots;     // pool cases: one slot and one fresh flag per row
  int32_t slots[16];
  int32_t fresh[16];
  int n_cu;  // packed pool cases: cu_seqlens (n_slots + 1 offsets)
  int32_t cu_seqlens[17];
  uint32_t eps_bits;
  uint64_t seed;
  uint32_t grid[3];
  uint32_t threadgroup[3];
  int n_inputs;
  EmuTensor inputs[20];  // in the launch's order
  int n_outputs;
  EmuTensor outputs[8];
  emu::Stats (*launch)(void* const* inputs, void* const* outputs);
};

// The generated cases (emu_kernels.cc).
const EmuCase* emu_cases(size_t* count);
// "" for the Metal shim; a description for the diagnostic variant build.
const char* emu_variant();
// The matrix tiles' form the kernels run with: -1 the Metal form (simdgroup matrices), else
// the CUDA form's MLXK_TILE_FORM (0 fma, 1 tf32, 2 bf16; cuda_tiles_host.h).
int emu_tile_form();
