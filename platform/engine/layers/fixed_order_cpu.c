/* Batch-invariant CPU kernels for the deterministic mode (built by loader/native_library.py).
 *
 * Every reduction here has one fixed order, set by the reduced length alone: never by the
 * number of rows, a row's place in the batch, the thread that computes it, or a buffer's
 * alignment. A dot product of length K keeps 16 lane sums (lane l takes k = l, l + 16, ...,
 * in order, with a fused multiply-add each), then adds the lanes in one fixed pairwise tree.
 * The library is built with -fno-associative-math and -ffp-contract=off, so the compiler may
 * vectorise across the independent lanes but never reorder a lane's own sums. With AVX-512
 * the full 4-row blocks run as vector FMAs on the same lanes, then the same tree (`dot_4x4`);
 * any other row runs the portable lanes: both give the same bits (a test holds them equal).
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

/* y[m, n] = dot + bias, rounded once into y's dtype. */
static inline void store_out(void *y, int64_t y_stride, int64_t m, int64_t n, float dot,
                             float bias, int dtype) {
    const float v = dot + bias;
    if (dtype == 0) ((float *)y)[m * y_stride + n] = v;
    else ((uint16_t *)y)[m * y_stride + n] = f32_to_bf16(v);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>

/* tree16 on the 16 lanes of one vector, in the same order (l + 8, then + 4, + 2, + 1). */
static inline float tree16_vec(__m512 a) {
    const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

/* dot_rows for ROWS rows and NCOL weight rows at once, the same lane sums with vector FMAs:
 * one weight load serves four rows, one row load four columns. K must be a multiple of 16. */
#define NCOL 4
static inline void dot_4x4(const float *xf, int64_t K, const float *w, int64_t w_stride,
                           float out[NCOL][ROWS]) {
    __m512 a[ROWS][NCOL];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NCOL; c++) a[r][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += LANES) {
        __m512 b[NCOL];
        for (int c = 0; c < NCOL; c++) b[c] = _mm512_loadu_ps(w + c * w_stride + k);
        for (int r = 0; r < ROWS; r++) {
            const __m512 xv = _mm512_loadu_ps(xf + r * K + k);
            for (int c = 0; c < NCOL; c++) a[r][c] = _mm512_fmadd_ps(xv, b[c], a[r][c]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NCOL; c++) out[c][r] = tree16_vec(a[r][c]);
}
#define HAVE_DOT_4X4 1
#else
#define HAVE_DOT_4X4 0
#endif

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
                int64_t n = n0;
                if (HAVE_DOT_4X4 && R == ROWS && K % LANES == 0) {
#if HAVE_DOT_4X4
                    for (; n + NCOL <= n1; n += NCOL) {
                        float out[NCOL][ROWS];
                        dot_4x4(xf + m0 * K, K, wf + (n - n0) * K, K, out);
                        for (int c = 0; c < NCOL; c++)
                            for (int r = 0; r < ROWS; r++)
                                store_out(y, y_stride, m0 + r, n + c, out[c][r],
                                          bias ? b[n + c - n0] : 0.0f, dtype);
                    }
#endif
                }
                for (; n < n1; n++) {
                    float out[ROWS];
                    if (R == ROWS) /* a constant R: the lane sums stay in registers */
                        dot_rows(xf + m0 * K, K, ROWS, wf + (n - n0) * K, out);
                    else /* the same sums, one row at a time */
                        for (int r = 0; r < R; r++)
                            dot_rows(xf + (m0 + r) * K, K, 1, wf + (n - n0) * K, out + r);
                    for (int r = 0; r < R; r++)
                        store_out(y, y_stride, m0 + r, n, out[r], bias ? b[n - n0] : 0.0f, dtype);
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

/* y[m, i] = silu(x[m, i]) * x[m, I + i] (gate, then up, side by side in x), every element by the
 * same scalar code (libm's expf, never a vector variant), so no element's bits depend on which
 * thread or loop tail computes it. bf16: silu rounded to bf16, then the product, as the
 * reference's two ops. */
void fixed_order_silu_mul(const void *x, int64_t x_stride, void *y, int64_t y_stride, int64_t M,
                          int64_t I, int dtype) {
#pragma omp parallel for schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++) {
        for (int64_t i = 0; i < I; i++) {
            float g, u;
            if (dtype == 0) {
                g = ((const float *)x)[m * x_stride + i];
                u = ((const float *)x)[m * x_stride + I + i];
            } else {
                g = bf16_to_f32(((const uint16_t *)x)[m * x_stride + i]);
                u = bf16_to_f32(((const uint16_t *)x)[m * x_stride + I + i]);
            }
            float s = g / (1.0f + expf(-g));
            if (dtype == 0) {
                ((float *)y)[m * y_stride + i] = s * u;
            } else {
                s = bf16_to_f32(f32_to_bf16(s));
                ((uint16_t *)y)[m * y_stride + i] = f32_to_bf16(s * u);
            }
        }
    }
}
