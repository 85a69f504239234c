/* Paged decode attention on a CPU, reading K/V blocks in place (built by loader/native_library.py).
 *
 * One query token per sequence. Work items are (sequence, KV head) pairs; each item computes
 * the scores of its G = Hq / Hkv query heads against every cached token (one K row read serves
 * all G heads), a softmax in fp32, then the weighted sum of V rows. Rows are found through the
 * block table: token t of sequence s is row t % block_size of block block_tables[s][t / bs].
 * No gathered copy of K/V is made. Caller checks shapes, dtypes and contiguity
 * (paged_attention_cpu.py). The num_seqs x Hkv items are split over torch's OpenMP threads.
 *
 * dtype: 0 = fp32, 1 = bf16 (q, out and the cache share it). Math is fp32.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_common.h"

#define INLINE static inline __attribute__((always_inline))

/* One (sequence, KV head) item; `d` is a compile-time constant at the common head sizes, so
 * the row loops unroll into whole vectors. */
INLINE void attend_item(
    const void *q, void *out, const void *k_cache, const void *v_cache,
    const int32_t *table, int64_t len, int64_t s, int64_t hk, int64_t num_heads,
    int64_t num_kv_heads, const int64_t d, int64_t g, int64_t block_size, float scale,
    int dtype, float *qf, float *acc, float *row, float *scores) {
    for (int64_t j = 0; j < g; j++) {
        load_row(q, (s * num_heads + hk * g + j) * d, d, dtype, qf + j * d);
        for (int64_t i = 0; i < d; i++) qf[j * d + i] *= scale;
    }
    for (int64_t t0 = 0; t0 < len; t0 += block_size) { /* block by block: no division */
        const int64_t first_slot = (int64_t)table[t0 / block_size] * block_size;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t o = 0; o < n; o++) {
            load_row(k_cache, ((first_slot + o) * num_kv_heads + hk) * d, d, dtype, row);
            for (int64_t j = 0; j < g; j++) {
                const float *qj = qf + j * d;
                float dot = 0.0f;
                for (int64_t i = 0; i < d; i++) dot += qj[i] * row[i];
                scores[j * len + t0 + o] = dot;
            }
        }
    }
    for (int64_t j = 0; j < g; j++) { /* softmax in place */
        float *sj = scores + j * len, m = -FLT_MAX, sum = 0.0f; /* finite: fast-math */
        for (int64_t t = 0; t < len; t++) m = sj[t] > m ? sj[t] : m;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; t++) {
            sj[t] = expf(sj[t] - m);
            sum += sj[t];
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t t = 0; t < len; t++) sj[t] *= inv;
    }
    memset(acc, 0, sizeof(float) * (size_t)(g * d));
    for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const int64_t first_slot = (int64_t)table[t0 / block_size] * block_size;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t o = 0; o < n; o++) {
            load_row(v_cache, ((first_slot + o) * num_kv_heads + hk) * d, d, dtype, row);
            for (int64_t j = 0; j < g; j++) {
                const float p = scores[j * len + t0 + o];
                float *aj = acc + j * d;
                for (int64_t i = 0; i < d; i++) aj[i] += p * row[i];
            }
        }
    }
    for (int64_t j = 0; j < g; j++)
        store_row(out, (s * num_heads + hk * g + j) * d, d, dtype, acc + j * d);
}

/* Returns 0, or -1 when scratch memory could not be allocated. Items are split over the
 * OpenMP threads (torch's own pool: the library links the libgomp torch has loaded). */
int paged_decode_attention(
    const void *q, void *out, const void *k_cache, const void *v_cache,
    const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
    int64_t max_seq_len, float scale, int dtype, int64_t num_seqs) {
    const int64_t items = num_seqs * num_kv_heads;
    const int64_t g = num_heads / num_kv_heads, d = head_dim;
    int failed = 0;
#pragma omp parallel if (items > 1) reduction(| : failed)
    {
        float *qf = malloc(sizeof(float) * (size_t)(g * d));
        float *acc = malloc(sizeof(float) * (size_t)(g * d));
        float *row = malloc(sizeof(float) * (size_t)d);
        float *scores = malloc(sizeof(float) * (size_t)(g * (max_seq_len > 0 ? max_seq_len : 1)));
        const int err = !qf || !acc || !row || !scores; /* this thread's */
        failed = err;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; item++) {
            if (err) continue;
            const int64_t s = item / num_kv_heads, hk = item % num_kv_heads;
            const int64_t len = seq_lens[s] < max_seq_len ? seq_lens[s] : max_seq_len;
            const int32_t *table = block_tables + s * bt_stride;
#define ITEM(D) attend_item(q, out, k_cache, v_cache, table, len, s, hk, num_heads, \
                            num_kv_heads, D, g, block_size, scale, dtype, qf, acc, row, scores)
            switch (d) {
                case 32: ITEM(32); break;
                case 64: ITEM(64); break;
                case 128: ITEM(128); break;
                default: ITEM(d); break;
            }
#undef ITEM
        }
        free(qf); free(acc); free(row); free(scores);
    }
    return failed ? -1 : 0;
}

/* Store the step's new K and V rows ([T, Hkv, D], row i at i * row_stride elements) at their
 * cache slots; slot -1 (padding) is skipped. Same dtype on both sides: a plain copy. */
void write_kv(const void *k, const void *v, int64_t k_stride, int64_t v_stride, void *k_cache,
              void *v_cache, const int64_t *slots, int64_t num_tokens, int64_t row_elems,
              int64_t elem_size) {
    const size_t bytes = (size_t)(row_elems * elem_size);
    for (int64_t i = 0; i < num_tokens; i++) {
        if (slots[i] < 0) continue;
        memcpy((char *)k_cache + slots[i] * (int64_t)bytes,
               (const char *)k + i * k_stride * elem_size, bytes);
        memcpy((char *)v_cache + slots[i] * (int64_t)bytes,
               (const char *)v + i * v_stride * elem_size, bytes);
    }
}
