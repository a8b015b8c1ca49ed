/*
 * The C client test's checks of what the header offers beside the kernels: sharing arrays with a
 * host's MLX, and the GLM-5.2 expert-slot layout.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

#ifdef MLXK_GLM52_EXPERT_SLOT_ALIGNMENT
/* Sharing with a host's MLX from plain C: a handle's array handed out as an mlx::core::array
 * and taken back in (the round trip shares one array: the bytes are the same); the lock. */
void test_host_mlx(void) {
    const char *version = mlxk_mlx_version();
    CHECK(version != NULL && strlen(version) >= 5);
    float data[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 8.0f};
    int32_t shape[2] = {2, 3};
    mlxk_array *a = new_f32(data, shape, 2);
    void *host = NULL;
    CHECK_OK(mlxk_array_to_mlx(a, &host));
    CHECK(host != NULL);
    mlxk_array *b = NULL;
    CHECK_OK(mlxk_array_from_mlx(host, &b));
    CHECK_OK(mlxk_mlx_array_free(host));
    CHECK_OK(mlxk_array_free(a));
    float back[6] = {0};
    CHECK_OK(mlxk_array_read(b, back, sizeof back));
    CHECK(memcmp(back, data, sizeof data) == 0);
    EXPECT_ERROR(mlxk_array_from_mlx(NULL, &a), MLXK_ERR_NULL_POINTER, "mlxk_array_from_mlx",
                 "mlx_array");
    EXPECT_ERROR(mlxk_array_to_mlx(b, NULL), MLXK_ERR_NULL_POINTER, "mlxk_array_to_mlx",
                 "mlx_array_out");
    CHECK_OK(mlxk_array_free(b));
    EXPECT_ERROR(mlxk_array_to_mlx(b, &host), MLXK_ERR_INVALID_HANDLE, "mlxk_array_to_mlx",
                 "array");
    CHECK_OK(mlxk_mlx_array_free(NULL));
    CHECK_OK(mlxk_mlx_lock());
    CHECK_OK(mlxk_mlx_lock());
    mlxk_array *c = new_f32(data, shape, 2);
    CHECK_OK(mlxk_array_free(c));
    CHECK_OK(mlxk_mlx_unlock());
    CHECK_OK(mlxk_mlx_unlock());
    EXPECT_ERROR(mlxk_mlx_unlock(), MLXK_ERR_INVALID_ARGUMENT, "mlxk_mlx_unlock", "lock");
}

void test_glm52(void) {
    CHECK(MLXK_GLM52_EXPERT_SLOT_ALIGNMENT == 16384);
    mlxk_glm52_layout l;
    memset(&l, 0, sizeof l);
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 4, 64, &l));
    CHECK(l.hidden_size == 6144 && l.intermediate_size == 2048);
    CHECK(l.gate_weight_offset == 0 && l.up_weight_offset == 6291456 &&
          l.down_weight_offset == 12582912 && l.gate_scale_offset == 18874368 &&
          l.up_scale_offset == 19267584 && l.down_scale_offset == 19660800 &&
          l.slot_bytes == 20054016);
    CHECK_OK(mlxk_glm52_layout_validate(&l, 4, 64));
    mlxk_glm52_layout q8;
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 8, 64, &q8));
    CHECK(q8.slot_bytes == 38928384 && q8.up_weight_offset == 12582912);
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 4, 32, &q8));
    CHECK(q8.slot_bytes == 21233664);
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 8, 128, &q8));
    CHECK(q8.slot_bytes == 38338560);

    const char *canon = "mlxk_glm52_layout_canonical", *val = "mlxk_glm52_layout_validate";
    EXPECT_ERROR(mlxk_glm52_layout_canonical(6144, 2048, 4, 64, NULL), MLXK_ERR_NULL_POINTER, canon,
                 "out");
    EXPECT_ERROR(mlxk_glm52_layout_canonical(6144, 2048, 3, 64, &q8), MLXK_ERR_INVALID_ARGUMENT,
                 canon, "bits");
    EXPECT_ERROR(mlxk_glm52_layout_canonical(6144, 2048, 4, 48, &q8), MLXK_ERR_INVALID_ARGUMENT,
                 canon, "group_size");
    EXPECT_ERROR(mlxk_glm52_layout_validate(NULL, 4, 64), MLXK_ERR_NULL_POINTER, val, "layout");
    EXPECT_ERROR(mlxk_glm52_layout_validate(&l, 8, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "exceeds the canonical expert slot");
    mlxk_glm52_layout bad = l;
    bad.down_scale_offset += 8;
    EXPECT_ERROR(mlxk_glm52_layout_validate(&bad, 4, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "down scale offset is not 16-byte aligned");
    bad = l;
    bad.up_scale_offset = bad.down_weight_offset;
    EXPECT_ERROR(mlxk_glm52_layout_validate(&bad, 4, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "up scale overlaps down weight");
    bad = l;
    bad.slot_bytes = 100;
    EXPECT_ERROR(mlxk_glm52_layout_validate(&bad, 4, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "slot bytes 100 must be a positive multiple of 16384");
}
#endif
