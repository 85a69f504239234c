/* Batched LoRA delta on a CPU, one token at a time against its own adapter's rows (BGMV-style;
 * built by loader/native_library.py, called from lora_cpu.py).
 *
 * For Linear `lid` and every adapter token: for each fused slice the adapter targets,
 * h = scale * (x @ A[rows, slice]^T) (rank values), then y[slice] += h @ B[rows, slice].
 * The pool's rows are read where they lie (A [rows, S, in], B [rows, out]): no gathered or
 * packed copy per step, and no per-adapter pass; a step's cost is tokens x rank x (in + out),
 * whatever the number of distinct adapters. Tokens are visited in adapter order
 * (`sorted_tokens`), so an adapter's rows stay in cache across its tokens; the first `total`
 * positions of that order are split over torch's OpenMP threads.
 *
 * dtype codes: 0 = fp32, 1 = bf16 (x and y share one, A and B another). Math is fp32; y is
 * rounded once, after the delta is added.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_common.h"

#define MAX_RANK 512

/* delta[off + o] += sum_j h[j] * B[rs + j][off + o] for o < size: o outer, so each output is
 * loaded and stored once; R is a constant at the common ranks. */
#define EXPAND(R)                                                                    \
    do {                                                                             \
        float *dst = delta + off;                                                    \
        if (w_dtype == 0) {                                                          \
            for (int64_t o = 0; o < size; o++) {                                    \
                float acc = dst[o];                                                  \
                for (int64_t j = 0; j < (R); j++) acc += h[j] * b[b0 + j * d_out + o]; \
                dst[o] = acc;                                                        \
            }                                                                        \
        } else {                                                                     \
            for (int64_t o = 0; o < size; o++) {                                    \
                float acc = dst[o];                                                  \
                for (int64_t j = 0; j < (R); j++)                                    \
                    acc += h[j] * bf16_to_f32(b16[b0 + j * d_out + o]);              \
                dst[o] = acc;                                                        \
            }                                                                        \
        }                                                                            \
    } while (0)

/* One token's delta for every slice its adapter targets, added into its row of y. */
static int token_delta(
    const void *x, int64_t x_stride, void *y, int64_t y_stride, int act_dtype,
    const void *a_buf, const void *b_buf, int w_dtype, int64_t tok, const int32_t *token_slot,
    const int32_t *slot_row_start, const int32_t *ranks, const float *scales, int64_t max_loras,
    const int32_t *slice_offsets, const int32_t *slice_sizes, int64_t num_slices, int64_t d_in,
    int64_t d_out, float *xf, float *delta, float *h) {
    const int64_t slot = token_slot[tok];
    if (slot < 0) return 0;
    const int64_t rs = slot_row_start[slot];
    load_row(x, tok * x_stride, d_in, act_dtype, xf);
    int touched = 0;
    for (int64_t si = 0; si < num_slices; si++) {
        const int64_t r = ranks[si * max_loras + slot];
        if (r <= 0) continue;
        if (r > MAX_RANK) return -2;
        const float scale = scales[si * max_loras + slot];
        const int64_t off = slice_offsets[si], size = slice_sizes[si];
        for (int64_t j = 0; j < r; j++) { /* shrink: rank row j of this slice */
            const int64_t a_row = ((rs + j) * num_slices + si) * d_in;
            float dot = 0.0f;
            if (w_dtype == 0) {
                const float *a = (const float *)a_buf + a_row;
                for (int64_t i = 0; i < d_in; i++) dot += xf[i] * a[i];
            } else {
                const uint16_t *a = (const uint16_t *)a_buf + a_row;
                for (int64_t i = 0; i < d_in; i++) dot += xf[i] * bf16_to_f32(a[i]);
            }
            h[j] = dot * scale;
        }
        if (!touched) memset(delta, 0, sizeof(float) * (size_t)d_out);
        touched = 1;
        const float *b = (const float *)b_buf;
        const uint16_t *b16 = (const uint16_t *)b_buf;
        const int64_t b0 = rs * d_out + off;
        switch (r) { /* the common ranks unroll: each output read and written once */
            case 8: EXPAND(8); break;
            case 16: EXPAND(16); break;
            default: EXPAND(r); break;
        }
    }
    if (!touched) return 0;
    for (int64_t si = 0; si < num_slices; si++) { /* add once, rounded once */
        if (ranks[si * max_loras + slot] <= 0) continue;
        const int64_t off = slice_offsets[si], size = slice_sizes[si];
        if (act_dtype == 0) {
            float *yr = (float *)y + tok * y_stride + off;
            for (int64_t o = 0; o < size; o++) yr[o] += delta[off + o];
        } else {
            uint16_t *yr = (uint16_t *)y + tok * y_stride + off;
            for (int64_t o = 0; o < size; o++)
                yr[o] = f32_to_bf16(bf16_to_f32(yr[o]) + delta[off + o]);
        }
    }
    return 0;
}

/* Returns 0, -1 when scratch memory could not be allocated, -2 past MAX_RANK. Positions are
 * split over the OpenMP threads (torch's own pool: the library links the libgomp torch has
 * loaded). */
int lora_delta(
    const void *x, int64_t x_stride, void *y, int64_t y_stride, int act_dtype,
    const void *a_buf, const void *b_buf, int w_dtype,
    const int32_t *sorted_tokens, const int32_t *token_slot, const int32_t *slot_row_start,
    const int32_t *ranks, const float *scales, int64_t max_loras,
    const int32_t *slice_offsets, const int32_t *slice_sizes, int64_t num_slices,
    int64_t d_in, int64_t d_out, int64_t total) {
    int rc = 0;
#pragma omp parallel if (total > 8) reduction(min : rc)
    {
        float *xf = malloc(sizeof(float) * (size_t)d_in);
        float *delta = malloc(sizeof(float) * (size_t)d_out);
        float h[MAX_RANK];
        int err = (!xf || !delta) ? -1 : 0; /* this thread's; rc is the reduction's copy */
#pragma omp for schedule(static)
        for (int64_t pos = 0; pos < total; pos++) {
            if (err) continue;
            err = token_delta(x, x_stride, y, y_stride, act_dtype, a_buf, b_buf, w_dtype,
                             sorted_tokens[pos], token_slot, slot_row_start, ranks, scales,
                             max_loras, slice_offsets, slice_sizes, num_slices, d_in, d_out,
                             xf, delta, h);
        }
        rc = err;
        free(xf); free(delta);
    }
    return rc;
}
