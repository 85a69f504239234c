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
 * bf16 activations against bf16-exact weights (bf16, int8 or fp8 codes) on a CPU with
 * AVX512_BF16 take VDPBF16PS instead, for every row whatever the block (`linear_bf16`).
 * Threads split a projection by output columns only, which never changes a sum's order.
 *
 * Weights may be quantized (`kind`: int8 per channel or grouped, int4 two a byte, fp8 e4m3),
 * read in their codes and decoded row by row; a per-channel scale multiplies the row's dot.
 * dtype: 0 = fp32, 1 = bf16 (x, bias and y share it; a float weight too). Math is fp32, y
 * rounded once.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_common.h"

#define LANES 16
#define ROWS 4    /* rows sharing one pass over a weight row */
#define COLS 16   /* output columns per work item */
/* Multiply-adds from which a projection is split between threads (by output columns, which
 * never changes a sum's order): below, a parallel region's start and join cost more than the
 * halved work saves (each is a barrier, and a long wait on a busy machine). */
#define PARALLEL_MACS (1 << 21)
#define SMALL_WORK 65536 /* elements below which a per-row loop stays on one thread */

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

/* y[m, n] = dot * post + bias, rounded once into y's dtype. */
static inline void store_out(void *y, int64_t y_stride, int64_t m, int64_t n, float dot,
                             float post, float bias, int dtype) {
    const float v = dot * post + bias;
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

/* Weight kinds (`kind`): how row n of a [N, K] weight is stored.
 * W_FLOAT: values in the activations' dtype.
 * W_INT8: int8 codes; `scale` fp32 [N] multiplies the row's dot (group 0), or [N, K/group]
 *         multiplies each code (grouped).
 * W_INT4: codes two a byte [N, K/2], q[2j] in the low nibble; `scale` and `zf` fp32
 *         [N, K/group]: w = (q - 8) * s + zf (symmetric and asymmetric alike).
 * W_FP8:  e4m3 codes; `scale` fp32 [N] multiplies the row's dot. */
enum { W_FLOAT = 0, W_INT8 = 1, W_INT4 = 2, W_FP8 = 3 };

typedef struct {
    int kind;
    const void *w;
    const float *scale, *zf;
    int64_t group;
} weight_t;

/* e4m3 (no infinities; 0x7f / 0xff are NaN) -> fp32, exactly. */
static inline float e4m3_to_f32(uint8_t b) {
    const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if ((b & 0x7f) == 0x7f) return NAN;
    if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return sign ? -v : v;
}

/* The factor that multiplies row n's dot product (per-channel scales), 1 otherwise. */
static inline float post_scale(const weight_t *wt, int64_t n) {
    if ((wt->kind == W_INT8 && wt->group == 0) || wt->kind == W_FP8) return wt->scale[n];
    return 1.0f;
}

/* Row n of the weight as K fp32 values (per-channel scales left for `post_scale`). */
static void decode_row(const weight_t *wt, int64_t n, int64_t K, int dtype, float *dst) {
    if (wt->kind == W_FLOAT) {
        load_row(wt->w, n * K, K, dtype, dst);
    } else if (wt->kind == W_INT8) {
        const int8_t *q = (const int8_t *)wt->w + n * K;
        if (wt->group == 0)
            for (int64_t k = 0; k < K; k++) dst[k] = (float)q[k];
        else
            for (int64_t k = 0; k < K; k++)
                dst[k] = (float)q[k] * wt->scale[n * (K / wt->group) + k / wt->group];
    } else if (wt->kind == W_INT4) {
        const uint8_t *q = (const uint8_t *)wt->w + n * (K / 2);
        const int64_t groups = K / wt->group;
        for (int64_t k = 0; k < K; k++) {
            const int code = k & 1 ? q[k >> 1] >> 4 : q[k >> 1] & 15;
            const int64_t g = n * groups + k / wt->group;
            dst[k] = (float)(code - 8) * wt->scale[g] + wt->zf[g];
        }
    } else {
        const uint8_t *q = (const uint8_t *)wt->w + n * K;
        for (int64_t k = 0; k < K; k++) dst[k] = e4m3_to_f32(q[k]);
    }
}

#if HAVE_DOT_4X4 && defined(__AVX512BF16__) && defined(__AVX512BW__)
/* bf16 activations against bf16-exact weights (bf16 values, int8 and fp8 codes): one
 * VDPBF16PS per 32 inputs, whose fixed per-lane order (lane l sums the products of inputs
 * 2l + 1 then 2l of each block of 32, exact products, each sum rounded) is set by K alone. Every
 * row runs this same code whatever R or the columns beside it; K's tail is zero-padded. */
#define HAVE_BF16_DOT 1
#define BF16_COLS 4

/* tree16_vec of all 16 accumulators at once, the same additions pairing the same lanes (l with
 * l + 8, then + 4, + 2, + 1; a sum's operands only change places, and IEEE addition commutes),
 * by shuffling two vectors' halves together at each level: 15 additions instead of 64. */
static inline __attribute__((always_inline)) __m512 reduce_4x4(__m512 a[ROWS][BF16_COLS]) {
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++) { /* l + 8: b_i = [a_2i | a_2i+1], eight lanes each */
        const __m512 p = a[(2 * i) / 4][(2 * i) % 4], q = a[(2 * i + 1) / 4][(2 * i + 1) % 4];
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x44), _mm512_shuffle_f32x4(p, q, 0xEE));
    }
    for (int m = 0; m < 4; m++) /* l + 4: quarter Q of c_m holds a_4m+Q */
        c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], 0xDD));
    for (int p = 0; p < 2; p++) /* l + 2, within each quarter */
        d[p] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0xEE));
    /* l + 1: element 4Q + i of e is the sum of a_4i+Q */
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}
static inline __attribute__((always_inline)) void acc_bf16(const uint16_t *x, int64_t x_stride,
                                                           int R, const uint16_t *const *w,
                                                           int C, int64_t K,
                                                           __m512 a[ROWS][BF16_COLS]) {
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < BF16_COLS; c++) a[r][c] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh b[BF16_COLS];
        for (int c = 0; c < C; c++) b[c] = (__m512bh)_mm512_loadu_si512(w[c] + k);
        for (int r = 0; r < R; r++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * x_stride + k);
            for (int c = 0; c < C; c++) a[r][c] = _mm512_dpbf16_ps(a[r][c], xv, b[c]);
        }
    }
    if (k < K) { /* the tail, zero-padded: the same step for every row */
        const __mmask32 mask = (__mmask32)((1u << (K - k)) - 1u);
        __m512bh b[BF16_COLS];
        for (int c = 0; c < C; c++)
            b[c] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[c] + k);
        for (int r = 0; r < R; r++) {
            const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * x_stride + k);
            for (int c = 0; c < C; c++) a[r][c] = _mm512_dpbf16_ps(a[r][c], xv, b[c]);
        }
    }
}

/* A full block's 16 sums (element 4c + r: row r, column c) times post[c] plus bias[c], rounded
 * to bf16 as f32_to_bf16 does (nearest even; NaN kept quiet), stored at y[r][c]. */
static inline void store_4x4_bf16(uint16_t *y, int64_t y_stride, __m512 e, const float *post,
                                  const float *bias) {
    const __m512i by_col = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512 pv = _mm512_permutexvar_ps(by_col, _mm512_castps128_ps512(_mm_loadu_ps(post)));
    const __m512 bv = _mm512_permutexvar_ps(by_col, _mm512_castps128_ps512(_mm_loadu_ps(bias)));
    const __m512i u = _mm512_castps_si512(_mm512_add_ps(_mm512_mul_ps(e, pv), bv));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i h = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    h = _mm512_srli_epi32(h, 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    h = _mm512_mask_mov_epi32(h, nan,
                              _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    uint16_t t[16];
    _mm256_storeu_si256((__m256i *)t, _mm512_cvtepi32_epi16(h));
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < BF16_COLS; c++) y[r * y_stride + c] = t[c * 4 + r];
}

/* Weight row n as bf16 (exact for the kinds `bf16_exact` accepts), into dst. */
static void decode_row_bf16(const weight_t *wt, int64_t n, int64_t K, uint16_t *dst) {
    if (wt->kind == W_INT8) {
        const int8_t *q = (const int8_t *)wt->w + n * K;
        for (int64_t k = 0; k < K; k++) dst[k] = f32_to_bf16((float)q[k]);
    } else {
        const uint8_t *q = (const uint8_t *)wt->w + n * K;
        for (int64_t k = 0; k < K; k++) dst[k] = f32_to_bf16(e4m3_to_f32(q[k]));
    }
}

static inline int bf16_exact(const weight_t *wt, int dtype) {
    return dtype == 1 && (wt->kind == W_FLOAT || wt->kind == W_FP8 ||
                          (wt->kind == W_INT8 && wt->group == 0));
}

static int linear_bf16(const uint16_t *x, int64_t x_stride, const weight_t *wt,
                       const void *bias, void *y, int64_t y_stride, int64_t M, int64_t K,
                       int64_t N) {
    const int64_t items = (N + COLS - 1) / COLS;
    int failed = 0;
#pragma omp parallel if (items > 1 && M * N * K >= PARALLEL_MACS) reduction(| : failed)
    {
        uint16_t *scratch = NULL;
        if (wt->kind != W_FLOAT) scratch = malloc(sizeof(uint16_t) * (size_t)(COLS * K + 1));
        const int err = wt->kind != W_FLOAT && !scratch;
        failed = err;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; item++) {
            if (err) continue;
            const int64_t n0 = item * COLS, n1 = n0 + COLS < N ? n0 + COLS : N;
            const uint16_t *rows[COLS];
            for (int64_t n = n0; n < n1; n++) {
                if (wt->kind == W_FLOAT) {
                    rows[n - n0] = (const uint16_t *)wt->w + n * K;
                } else {
                    decode_row_bf16(wt, n, K, scratch + (n - n0) * K);
                    rows[n - n0] = scratch + (n - n0) * K;
                }
            }
            float b[COLS], post[COLS];
            for (int64_t n = n0; n < n1; n++) {
                b[n - n0] = bias ? bf16_to_f32(((const uint16_t *)bias)[n]) : 0.0f;
                post[n - n0] = post_scale(wt, n);
            }
            for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
                const int R = M - m0 < ROWS ? (int)(M - m0) : ROWS;
                for (int64_t n = n0; n < n1; n += BF16_COLS) {
                    const int C = n1 - n < BF16_COLS ? (int)(n1 - n) : BF16_COLS;
                    __m512 a[ROWS][BF16_COLS];
                    if (R == ROWS && C == BF16_COLS) { /* constants: sums stay in registers */
                        acc_bf16(x + m0 * x_stride, x_stride, ROWS, rows + (n - n0), BF16_COLS,
                                 K, a);
                        store_4x4_bf16((uint16_t *)y + m0 * y_stride + n, y_stride,
                                       reduce_4x4(a), post + (n - n0), b + (n - n0));
                        continue;
                    } /* else the same operations for each (row, column), fewer of them */
                    acc_bf16(x + m0 * x_stride, x_stride, R, rows + (n - n0), C, K, a);
                    for (int r = 0; r < R; r++)
                        for (int c = 0; c < C; c++)
                            store_out(y, y_stride, m0 + r, n + c, tree16_vec(a[r][c]),
                                      post[n + c - n0], b[n + c - n0], 1);
                }
            }
        }
        free(scratch);
    }
    return failed ? -1 : 0;
}
#else
#define HAVE_BF16_DOT 0
#endif

/* y[m, n] = sum_k x[m, k] * w[n, k] (* per-channel scale) (+ bias[n]) for M rows; w is [N, K]
 * in one of the kinds above. Returns 0, or -1 when scratch memory could not be allocated. */
int fixed_order_linear(const void *x, int64_t x_stride, int kind, const void *w,
                       const float *scale, const float *zf, int64_t group, const void *bias,
                       void *y, int64_t y_stride, int64_t M, int64_t K, int64_t N, int dtype) {
    const weight_t wt = {kind, w, scale, zf, group};
#if HAVE_BF16_DOT
    if (bf16_exact(&wt, dtype))
        return linear_bf16((const uint16_t *)x, x_stride, &wt, bias, y, y_stride, M, K, N);
#endif
    float *xf = malloc(sizeof(float) * (size_t)(M * K + 1));
    if (!xf) return -1;
    for (int64_t m = 0; m < M; m++) load_row(x, m * x_stride, K, dtype, xf + m * K);
    const int64_t items = (N + COLS - 1) / COLS;
    int failed = 0;
#pragma omp parallel if (items > 1 && M * N * K >= PARALLEL_MACS) reduction(| : failed)
    {
        float *wf = malloc(sizeof(float) * (size_t)(COLS * K + 1));
        const int err = !wf;
        failed = err;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; item++) {
            if (err) continue;
            const int64_t n0 = item * COLS, n1 = n0 + COLS < N ? n0 + COLS : N;
            for (int64_t n = n0; n < n1; n++) decode_row(&wt, n, K, dtype, wf + (n - n0) * K);
            float b[COLS], post[COLS];
            for (int64_t n = n0; n < n1; n++) {
                b[n - n0] = 0.0f;
                if (bias) load_row(bias, n, 1, dtype, b + (n - n0));
                post[n - n0] = post_scale(&wt, n);
            }
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
                                          post[n + c - n0], b[n + c - n0], dtype);
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
                        store_out(y, y_stride, m0 + r, n, out[r], post[n - n0], b[n - n0],
                                  dtype);
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
#pragma omp parallel for schedule(static) if (M > 1 && M * H >= SMALL_WORK) reduction(| : failed)
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

/* e^x from IEEE adds and multiplies alone (range reduction by ln 2 in two parts, a degree-6
 * polynomial, 2^n through the exponent bits), within 2 ulp for |x| < 87. Built without
 * reassociation or contraction, the compiler's vector code for it does the same operations in
 * the same order as its scalar code, so an element's bits never depend on which loop (vector
 * body or tail) or thread computes it, as libm's scalar and vector variants could. */
static inline float exp_fixed(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

#define SILU_CHUNK 64

/* y[m, i] = silu(x[m, i]) * x[m, I + i] (gate, then up, side by side in x), each element by the
 * same operations (`exp_fixed`) whatever the loop or thread. bf16: silu rounded to bf16, then
 * the product, as the reference's two ops. */
void fixed_order_silu_mul(const void *x, int64_t x_stride, void *y, int64_t y_stride, int64_t M,
                          int64_t I, int dtype) {
#pragma omp parallel for schedule(static) if (M > 1 && M * I >= SMALL_WORK)
    for (int64_t m = 0; m < M; m++) {
        float g[SILU_CHUNK], u[SILU_CHUNK], out[SILU_CHUNK];
        for (int64_t i0 = 0; i0 < I; i0 += SILU_CHUNK) {
            const int64_t n = I - i0 < SILU_CHUNK ? I - i0 : SILU_CHUNK;
            load_row(x, m * x_stride + i0, n, dtype, g);
            load_row(x, m * x_stride + I + i0, n, dtype, u);
            if (dtype == 0) {
                for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + exp_fixed(-g[i])) * u[i];
            } else {
                for (int64_t i = 0; i < n; i++) {
                    const float s = bf16_to_f32(f32_to_bf16(g[i] / (1.0f + exp_fixed(-g[i]))));
                    out[i] = s * u[i];
                }
            }
            store_row(y, m * y_stride + i0, n, dtype, out);
        }
    }
}

/* y[m, :] = sigmoid(g[m]) * x[m, :] (a shared expert's gate), sigmoid by the same scalar code
 * for every row; bf16: sigmoid rounded to bf16, then the product, as torch's two ops. g is
 * one value per row at g[m * g_stride]. */
void fixed_order_sigmoid_scale(const void *g, int64_t g_stride, const void *x, int64_t x_stride,
                               void *y, int64_t y_stride, int64_t M, int64_t H, int dtype) {
    for (int64_t m = 0; m < M; m++) {
        float gv;
        load_row(g, m * g_stride, 1, dtype, &gv);
        float s = 1.0f / (1.0f + expf(-gv));
        if (dtype == 1) s = bf16_to_f32(f32_to_bf16(s));
        for (int64_t h = 0; h < H; h++) {
            float v;
            load_row(x, m * x_stride + h, 1, dtype, &v);
            v = s * v;
            store_row(y, m * y_stride + h, 1, dtype, &v);
        }
    }
}
