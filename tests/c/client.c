/*
 * C client test of the mlxkern C ABI: compiled against include/mlxkern.h only (and the helpers
 * the C programs share, examples/common/mlxk_test_util.h), linked to the cdylib, run under
 * AddressSanitizer with LeakSanitizer (tests/c/run.sh, `make test-c`).
 *
 * It calls every function of the header (run.sh checks that none is missed) on small random
 * inputs and checks the results (the kernels against a float64 reference written here), then
 * walks the error paths: NULL pointers, wrong ranks and dtypes, freed, double-freed and foreign handles, short buffers, the memory limit.
 * Every failure must return the documented status, leave out-parameters untouched, and set a
 * non-empty mlxk_last_error() that starts with the function's name and names the argument.
 * Every handle is freed; LeakSanitizer checks that at exit.
 *
 * MLXK_CLIENT_VERBOSE=1 prints every error message the checks see.
 *
 * This file runs the checks; client.h declares what the others share: the helpers and the
 * float64 reference (client_util.c) and the checks by surface (client_arrays.c,
 * client_gated_delta.c, client_norms.c, client_host.c).
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

int main(void) {
    mlxkt_checks()->verbose = getenv("MLXK_CLIENT_VERBOSE") != NULL;
    test_versions_and_status_names();
    test_device();
    test_arrays();
    test_array_errors();
    test_memory_limit();
    test_compute_g();
    test_gated_delta_update();
    test_gated_delta_update_chunked();
    test_gated_delta_update_vjp();
    test_gated_delta_update_chunked_vjp();
    test_gated_delta_errors();
    test_gated_delta_state();
    test_gated_delta_pool();
    test_gated_rms_norm();
    test_gated_rms_norm_vjp();
    test_silu_rms_heads();
    test_gated_delta_update_from_conv();
    test_silu_rms_heads_vjp();
    test_threads();
    test_host_mlx();
#ifdef MLXK_GLM52_EXPERT_SLOT_ALIGNMENT
    test_glm52();
    const char *glm = " (GLM-5.2 layout included)";
#else
    const char *glm = " (GLM-5.2 layout not in this header)";
#endif
    const mlxkt_tally *checks = mlxkt_checks();
    printf("client: %ld checks passed, %ld failed%s\n", checks->passed, checks->failed, glm);
    return checks->failed == 0 ? 0 : 1;
}
