/* Row-wise argmax of 16/32-bit float logits on a CPU (built by loader/native_library.py).
 *
 * torch.argmax is a scalar loop on CPUs, and the engine would otherwise first copy bf16 logits
 * to fp32 (a [64, 32000] copy per step) to use the vectorised amax. Here each row is read once
 * in its own dtype: a vectorised max, then the first index holding it, as torch.argmax returns
 * (a NaN counts as the largest value, the first NaN wins, as in torch).
 *
 * dtype: 0 = fp32, 1 = bf16. Rows are split over torch's OpenMP threads.
 */
#include <stdint.h>
#include <string.h>

/* Floats compared as integers (vectorises without fast-math): flipping the magnitude bits of
 * negatives makes the signed order of the bit patterns the order of the values; -0 is mapped to
 * +0 so the two tie, as they compare equal. NaNs are found by their bits. */
static inline int32_t key32(uint32_t u) {
    const int32_t k = (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) & 0x7fffffffu));
    return u == 0x80000000u ? 0 : k;
}

#define CHUNK 256

static inline uint32_t bits_at(const void *row, int dtype, int64_t i) {
    return dtype == 0 ? ((const uint32_t *)row)[i] : (uint32_t)((const uint16_t *)row)[i] << 16;
}

static inline int is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* Chunk maxima in one vectorised pass; only the winning chunk (or the first chunk holding a
 * NaN) is scanned for the index. */
static int64_t row_argmax(const void *row, int dtype, int64_t n) {
    int32_t best = INT32_MIN;
    int64_t best_start = 0;
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
        const int64_t len = n - c0 < CHUNK ? n - c0 : CHUNK;
        int32_t m = INT32_MIN;
        int nan = 0;
        if (dtype == 0) {
            const uint32_t *v = (const uint32_t *)row + c0;
            for (int64_t i = 0; i < len; i++) {
                const int32_t k = key32(v[i]);
                m = k > m ? k : m;
                nan |= is_nan(v[i]);
            }
        } else {
            const uint16_t *v = (const uint16_t *)row + c0;
            for (int64_t i = 0; i < len; i++) {
                const uint32_t u = (uint32_t)v[i] << 16;
                const int32_t k = key32(u);
                m = k > m ? k : m;
                nan |= is_nan(u);
            }
        }
        if (nan) /* no earlier chunk had one: the first NaN of the row */
            for (int64_t i = 0; i < len; i++)
                if (is_nan(bits_at(row, dtype, c0 + i))) return c0 + i;
        if (m > best) {
            best = m;
            best_start = c0;
        }
    }
    const int64_t end = n - best_start < CHUNK ? n : best_start + CHUNK;
    for (int64_t i = best_start; i < end; i++)
        if (key32(bits_at(row, dtype, i)) == best) return i;
    return 0;
}

void argmax_rows(const void *logits, int dtype, int64_t rows, int64_t cols, int64_t stride,
                 int64_t *out) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t elem = dtype == 0 ? 4 : 2;
        out[r] = row_argmax((const char *)logits + r * stride * elem, dtype, cols);
    }
}
