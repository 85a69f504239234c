/* Batch-invariant CPU kernels for the deterministic mode (built by loader/native_library.py).
 *
 * Every reduction here has one fixed order, set by the reduced length alone: never by the
 * number of rows, a row's place in the batch, the thread that computes it, or a buffer's
 * alignment. A dot product of length K keeps 16 lane sums (lane l takes k = l, l + 16, ...,
 * in order, with a fused multiply-add each), then adds the lanes in one fixed pairwise tree.
 * The library is built with -fno-associative-math and -ffp-contract=off, so the compiler may
 * vectorise across the independent lanes but never reorder a lane's own sums.
 *
 * dtype: 0 = fp32, 1 = bf16 (x, w, bias and y share it). Math is fp32, y rounded once.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_common.h"

#define LANES 16
#define ROWS 4    /* rows sharing one pass over a weight row */
#define COLS 16   /* output columns per work item */

static inline float tree16(float *acc) {
    for (int s = LANES / 2; s > 0; s /= 2)
        for (int l = 0; l < s; l++) acc[l] += acc[l + s];
    return acc[0];
}

/* acc_r[l] for R rows against one fp32 weight row w of K values (R <= ROWS). */
static inline __attribute__((always_inline)) void dot_rows(const float *xf, int64_t K, int R,
                                                           const float *w, float *out) {
    float acc[ROWS][LANES];
    memset(acc, 0, sizeof acc);
    const int64_t k16 = K - K % LANES;
    for (int64_t k = 0; k < k16; k += LANES)
        for (int r = 0; r < R; r++)
            for (int l = 0; l < LANES; l++)
                acc[r][l] = fmaf(xf[r * K + k + l], w[k + l], acc[r][l]);
    for (int64_t k = k16; k < K; k++)
        for (int r = 0; r < R; r++) acc[r][k - k16] = fmaf(xf[r * K + k], w[k], acc[r][k - k16]);
    for (int r = 0; r < R; r++) out[r] = tree16(acc[r]);
}

/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for M rows; w is [N, K] contiguous. Returns 0,
 * or -1 when scratch memory could not be allocated. */
int fixed_order_linear(const void *x, int64_t x_stride, const void *w, const void *bias,
                       void *y, int64_t y_stride, int64_t M, int64_t K, int64_t N, int dtype) {
    float *xf = malloc(sizeof(float) * (size_t)(M * K + 1));
    if (!xf) return -1;
    for (int64_t m = 0; m < M; m++) load_row(x, m * x_stride, K, dtype, xf + m * K);
    const int64_t items = (N + COLS - 1) / COLS;
    int failed = 0;
#pragma omp parallel if (items > 1) reduction(| : failed)
    {
        float *wf = malloc(sizeof(float) * (size_t)(COLS * K + 1));
        const int err = !wf;
        failed = err;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; item++) {
            if (err) continue;
            const int64_t n0 = item * COLS, n1 = n0 + COLS < N ? n0 + COLS : N;
            for (int64_t n = n0; n < n1; n++) load_row(w, n * K, K, dtype, wf + (n - n0) * K);
            float b[COLS];
            if (bias) load_row(bias, n0, n1 - n0, dtype, b);
            for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
                const int R = M - m0 < ROWS ? (int)(M - m0) : ROWS;
                for (int64_t n = n0; n < n1; n++) {
                    float out[ROWS];
                    dot_rows(xf + m0 * K, K, R, wf + (n - n0) * K, out);
                    for (int r = 0; r < R; r++) {
                        float v = out[r] + (bias ? b[n - n0] : 0.0f);
                        const int64_t at = (m0 + r) * y_stride + n;
                        if (dtype == 0) ((float *)y)[at] = v;
                        else ((uint16_t *)y)[at] = f32_to_bf16(v);
                    }
                }
            }
        }
        free(wf);
    }
    free(xf);
    return failed ? -1 : 0;
}

/* RMSNorm of M rows of H values: y = w * dtype(x * 1 / sqrt(mean(x^2) + eps)), the mean's sum
 * in the fixed lane order, each row on its own. Returns 0, or -1 when out of memory. */
int fixed_order_rmsnorm(const void *x, int64_t x_stride, const void *w, void *y,
                        int64_t y_stride, int64_t M, int64_t H, float eps, int dtype) {
    int failed = 0;
#pragma omp parallel for schedule(static) if (M > 1) reduction(| : failed)
    for (int64_t m = 0; m < M; m++) {
        float acc[LANES];
        memset(acc, 0, sizeof acc);
        float *h = malloc(sizeof(float) * (size_t)(H + 1));
        float *wf = malloc(sizeof(float) * (size_t)(H + 1));
        if (!h || !wf) {
            free(h);
            free(wf);
            failed = 1;
            continue;
        }
        load_row(x, m * x_stride, H, dtype, h);
        load_row(w, 0, H, dtype, wf);
        const int64_t h16 = H - H % LANES;
        for (int64_t k = 0; k < h16; k += LANES)
            for (int l = 0; l < LANES; l++) acc[l] = fmaf(h[k + l], h[k + l], acc[l]);
        for (int64_t k = h16; k < H; k++) acc[k - h16] = fmaf(h[k], h[k], acc[k - h16]);
        const float inv = 1.0f / sqrtf(tree16(acc) / (float)H + eps);
        for (int64_t k = 0; k < H; k++) {
            float v = h[k] * inv;
            if (dtype == 1) v = bf16_to_f32(f32_to_bf16(v)); /* h.to(dtype), as the reference */
            v = wf[k] * v;
            if (dtype == 0) ((float *)y)[m * y_stride + k] = v;
            else ((uint16_t *)y)[m * y_stride + k] = f32_to_bf16(v);
        }
        free(h);
        free(wf);
    }
    return failed ? -1 : 0;
}
