/* Helpers every native CPU kernel shares (on the include path of loader/native_library.py's
 * builds, and part of each library's cache key). */
#ifndef LORAPLEX_NATIVE_COMMON_H
#define LORAPLEX_NATIVE_COMMON_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* A row of `d` fp32 (dtype 0) or bf16 (dtype 1) values starting at element `index`, as fp32. */
static inline __attribute__((always_inline)) void load_row(const void *base, int64_t index,
                                                           int64_t d, int dtype, float *dst) {
    if (dtype == 0) {
        memcpy(dst, (const float *)base + index, (size_t)d * sizeof(float));
    } else {
        const uint16_t *p = (const uint16_t *)base + index;
        for (int64_t i = 0; i < d; i++) dst[i] = bf16_to_f32(p[i]);
    }
}

/* `d` fp32 values stored at element `index` as fp32 (dtype 0) or bf16 (dtype 1). */
static inline __attribute__((always_inline)) void store_row(void *base, int64_t index, int64_t d,
                                                            int dtype, const float *src) {
    if (dtype == 0) {
        memcpy((float *)base + index, src, (size_t)d * sizeof(float));
    } else {
        uint16_t *p = (uint16_t *)base + index;
        for (int64_t i = 0; i < d; i++) p[i] = f32_to_bf16(src[i]);
    }
}

#endif
