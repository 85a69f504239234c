/* A structured-output bitmask applied to fp32 logits in place (built by
 * loader/native_library.py).
 *
 * Bit j of mask word w allows token 32 * w + j. torch can only read the bits by unpacking every
 * one of them (a [rows, vocab] temporary per step); here a word whose 32 tokens are all allowed
 * costs one compare, and only the forbidden tokens are written. Columns past the mask (padding
 * of the embedding) are disallowed.
 */
#include <math.h>
#include <stdint.h>

void apply_bitmask_rows(float *logits, int64_t rows, int64_t cols, int64_t row_stride,
                        const int32_t *mask, int64_t words, int64_t mask_stride) {
    const int64_t covered = words * 32 < cols ? words * 32 : cols;
    for (int64_t r = 0; r < rows; r++) {
        float *row = logits + r * row_stride;
        const uint32_t *m = (const uint32_t *)(mask + r * mask_stride);
        for (int64_t w = 0; w * 32 < covered; w++) {
            const uint32_t bits = m[w];
            if (bits == 0xffffffffu) continue;
            const int64_t base = w * 32;
            const int64_t n = covered - base < 32 ? covered - base : 32;
            for (int64_t j = 0; j < n; j++)
                if (!((bits >> j) & 1u)) row[base + j] = -INFINITY;
        }
        for (int64_t c = covered; c < cols; c++) row[c] = -INFINITY;
    }
}
