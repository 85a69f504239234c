/* Batched LoRA delta on a CPU: each adapter's tokens against its own pool rows, a block of
 * tokens at a time (SGMV-style; built by loader/native_library.py, called from lora_cpu.py).
 *
 * For Linear `lid` and every active step slot: for each fused slice its adapter targets,
 * h = scale * (x @ A[rows, slice]^T) (rank values per token), then y[slice] += h @ B[rows, slice].
 * The pool's rows are read where they lie (A [rows, S, in], B [rows, out]): no gathered or
 * packed copy per step, and no pass per adapter over the batch; a step's cost is
 * tokens x rank x (in + out), whatever the number of distinct adapters.
 *
 * Work items are up to TOKEN_BLOCK tokens of one slot (a slot's tokens are contiguous in
 * `sorted_tokens` from `slot_start`), spread over torch's OpenMP threads. Within an item a chunk
 * of each weight row is converted to fp32 once and used by every token of the block, and the
 * shrink runs four rank rows at once (four independent sums, so the FMA latency is hidden).
 * Each output column belongs to exactly one slice, so y is read, added to and rounded once.
 *
 * dtype codes: 0 = fp32, 1 = bf16 (x and y share one, A and B another). Math is fp32.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_common.h"

#define MAX_RANK 512
#define TOKEN_BLOCK 8 /* tokens of one adapter per work item */
#define COLS 256      /* weight columns converted to fp32 at a time */

/* out[0..3] += x . w_k for four rows w_k of `n` values, `stride` apart. */
static inline __attribute__((always_inline)) void dot4(const float *x, const float *w,
                                                       int64_t stride, int64_t n, float *out) {
    const float *w0 = w, *w1 = w + stride, *w2 = w + 2 * stride, *w3 = w + 3 * stride;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float xi = x[i];
        s0 += xi * w0[i];
        s1 += xi * w1[i];
        s2 += xi * w2[i];
        s3 += xi * w3[i];
    }
    out[0] += s0; out[1] += s1; out[2] += s2; out[3] += s3;
}

static inline __attribute__((always_inline)) float dot1(const float *x, const float *w,
                                                        int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += x[i] * w[i];
    return s;
}

/* h[t][0..r) = x_t . A_j over one chunk of `cols` inputs (w: the chunk's r rows, `cols` apart). */
static void shrink_chunk(const float *xf, int64_t d_in, int64_t n, const float *w, int64_t r,
                         int64_t cols, float *h) {
    for (int64_t t = 0; t < n; t++) {
        const float *xt = xf + t * d_in;
        float *ht = h + t * r;
        int64_t j = 0;
        for (; j + 4 <= r; j += 4) dot4(xt, w + j * cols, cols, cols, ht + j);
        for (; j < r; j++) ht[j] += dot1(xt, w + j * cols, cols);
    }
}

/* sum_j h[j] * w[j][o] for the `cols` outputs of one chunk, added into the token's y row and
 * rounded once; R is a constant at the common ranks so the j sum unrolls. */
#define EXPAND(R)                                                                  \
    do {                                                                           \
        if (act_dtype == 0) {                                                      \
            float *yr = (float *)y_row;                                            \
            for (int64_t o = 0; o < cols; o++) {                                   \
                float acc = 0.0f;                                                  \
                for (int64_t j = 0; j < (R); j++) acc += ht[j] * w[j * cols + o];  \
                yr[o] += acc;                                                      \
            }                                                                      \
        } else {                                                                   \
            uint16_t *yr = (uint16_t *)y_row;                                      \
            for (int64_t o = 0; o < cols; o++) {                                   \
                float acc = 0.0f;                                                  \
                for (int64_t j = 0; j < (R); j++) acc += ht[j] * w[j * cols + o];  \
                yr[o] = f32_to_bf16(bf16_to_f32(yr[o]) + acc);                     \
            }                                                                      \
        }                                                                          \
    } while (0)

static void expand_token(void *y_row, int act_dtype, const float *ht, const float *w,
                         int64_t r, int64_t cols) {
    switch (r) {
        case 8: EXPAND(8); break;
        case 16: EXPAND(16); break;
        default: EXPAND(r); break;
    }
}

/* One LoRA-targeted Linear's fixed arguments (built once by lora_cpu.py's NativeLoraLinear). */
struct lora_linear {
    const void *a_buf;           /* [rows, num_slices, d_in] */
    const void *b_buf;           /* [rows, d_out] (B transposed) */
    int64_t w_dtype;             /* 0 = fp32, 1 = bf16 */
    const int32_t *slice_offsets; /* [num_slices] first output column of each slice */
    const int32_t *slice_sizes;  /* [num_slices] */
    int64_t num_slices, d_in, d_out;
};

/* One step's metadata (adapters/metadata.py's LoraBatchMeta), shared by every Linear. */
struct lora_step {
    const int32_t *sorted_tokens;   /* [T] adapter tokens grouped by slot */
    const int32_t *slot_start;      /* [max_loras] offset of each slot's run in sorted_tokens */
    const int32_t *slot_num_tokens; /* [max_loras] */
    const int32_t *slot_row_start;  /* [max_loras] first pool row of each slot's adapter */
    const int32_t *ranks;           /* [num_linears, max_slices, max_loras] */
    const float *scales;            /* [num_linears, max_slices, max_loras] */
    int64_t max_loras, linear_stride; /* elements between two Linears' ranks (and scales) */
    int64_t num_active, max_rank;   /* slots 0..num_active have tokens; the largest rank */
};

/* One work item: tokens toks[0..n) of the slot whose adapter starts at pool row rs. Scratch:
 * xf [TOKEN_BLOCK, d_in], w [max_rank, COLS], h [TOKEN_BLOCK, MAX_RANK] (all fp32). */
static int block_delta(const void *x, int64_t x_stride, void *y, int64_t y_stride,
                       int act_dtype, const struct lora_linear *lin, const int32_t *ranks,
                       const float *scales, int64_t max_loras, const int32_t *toks, int64_t n,
                       int64_t slot, int64_t rs, int64_t max_rank, float *xf, float *w, float *h) {
    const void *a_buf = lin->a_buf, *b_buf = lin->b_buf;
    const int w_dtype = (int)lin->w_dtype;
    const int64_t num_slices = lin->num_slices, d_in = lin->d_in, d_out = lin->d_out;
    for (int64_t t = 0; t < n; t++) load_row(x, toks[t] * x_stride, d_in, act_dtype, xf + t * d_in);
    const int64_t elem = act_dtype == 0 ? 4 : 2;
    for (int64_t si = 0; si < num_slices; si++) {
        const int64_t r = ranks[si * max_loras + slot];
        if (r <= 0) continue;
        if (r > max_rank) return -2; /* the scratch holds max_rank rows */
        const float scale = scales[si * max_loras + slot];
        const int64_t off = lin->slice_offsets[si], size = lin->slice_sizes[si];
        memset(h, 0, sizeof(float) * (size_t)(n * r));
        for (int64_t c0 = 0; c0 < d_in; c0 += COLS) { /* shrink, a chunk of inputs at a time */
            const int64_t cols = d_in - c0 < COLS ? d_in - c0 : COLS;
            for (int64_t j = 0; j < r; j++)
                load_row(a_buf, ((rs + j) * num_slices + si) * d_in + c0, cols, w_dtype,
                         w + j * cols);
            shrink_chunk(xf + c0, d_in, n, w, r, cols, h);
        }
        for (int64_t k = 0; k < n * r; k++) h[k] *= scale;
        for (int64_t o0 = 0; o0 < size; o0 += COLS) { /* expand, a chunk of outputs at a time */
            const int64_t cols = size - o0 < COLS ? size - o0 : COLS;
            for (int64_t j = 0; j < r; j++)
                load_row(b_buf, (rs + j) * d_out + off + o0, cols, w_dtype, w + j * cols);
            for (int64_t t = 0; t < n; t++) {
                char *y_row = (char *)y + (toks[t] * y_stride + off + o0) * elem;
                expand_token(y_row, act_dtype, h + t * r, w, r, cols);
            }
        }
    }
    return 0;
}

/* Adds the delta of Linear `lid` into y. Returns 0, -1 when scratch memory could not be
 * allocated, -2 past MAX_RANK. Slots' blocks are handed to the OpenMP threads (torch's own
 * pool: the library links the libgomp torch has loaded) as they come free. */
int lora_delta(const void *x, int64_t x_stride, void *y, int64_t y_stride, int64_t act_dtype,
               const struct lora_linear *lin, const struct lora_step *step, int64_t lid) {
    const int64_t num_active = step->num_active, max_rank = step->max_rank;
    if (max_rank > MAX_RANK) return -2;
    if (num_active <= 0 || max_rank <= 0) return 0;
    const int32_t *ranks = step->ranks + lid * step->linear_stride;
    const float *scales = step->scales + lid * step->linear_stride;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(num_active + 1)); /* item prefix */
    if (!first) return -1;
    first[0] = 0;
    for (int64_t s = 0; s < num_active; s++)
        first[s + 1] = first[s] + (step->slot_num_tokens[s] + TOKEN_BLOCK - 1) / TOKEN_BLOCK;
    const int64_t items = first[num_active];
    int rc = 0;
#pragma omp parallel if (items > 1) reduction(min : rc)
    {
        float *xf = malloc(sizeof(float) * (size_t)(TOKEN_BLOCK * lin->d_in));
        float *w = malloc(sizeof(float) * (size_t)(max_rank * COLS));
        float h[TOKEN_BLOCK * MAX_RANK];
        int err = (!xf || !w) ? -1 : 0; /* this thread's; rc is the reduction's copy */
        int64_t slot = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; item++) {
            if (err) continue;
            while (first[slot + 1] <= item) slot++; /* a thread's items come in increasing order */
            const int64_t lo = (item - first[slot]) * TOKEN_BLOCK;
            const int64_t count = step->slot_num_tokens[slot] - lo;
            const int64_t n = count < TOKEN_BLOCK ? count : TOKEN_BLOCK;
            err = block_delta(x, x_stride, y, y_stride, (int)act_dtype, lin, ranks, scales,
                              step->max_loras, step->sorted_tokens + step->slot_start[slot] + lo,
                              n, slot, step->slot_row_start[slot], max_rank, xf, w, h);
        }
        rc = err;
        free(xf); free(w);
    }
    free(first);
    return rc;
}
