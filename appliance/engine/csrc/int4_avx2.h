// What the two int4 kernels on AVX2 alone share (gemv_int4_avx2.c, a few rows; gemm_int4_avx2.c, prefill
// sizes), both on torch's AVX2 packing: 32-row blocks, k-major, 16 bytes a k, byte j holding rows j (low
// nibble) and j + 16 (high). Here: 4 k of a block as each row's quads, each group's (scale, zero) pairs as
// vectors, x quantised per row and group, and a group's int32 sums scaled into y, with the operations of
// int4_groups.h (its AVX-512 twin): a row gets the same bits from every int4 kernel of ours.
#pragma once

#include "int4_packing.h"
#include "quantize_avx2.h"

#define BLOCK_ROWS 32  // torch's AVX2 int4 packing: rows a block
#define INT16_QUADS 8  // k quads whose VPMADDUBSW pairs (at most 2 x 15 x 128 = 3840) add up in int16: 30720

// The 4 k at s (64 bytes of a 32-row block) as each row's quads, in two vectors: lo holds rows 0-3 and
// 8-11 in its low nibbles (16 + those in the high ones), hi rows 4-7 and 12-15 (a row's 4 k in a 32-bit lane).
static inline __attribute__((always_inline)) void block_quads(const uint8_t* s, __m256i* lo, __m256i* hi) {
    const __m256i a = _mm256_loadu_si256((const __m256i*)s), b = _mm256_loadu_si256((const __m256i*)(s + 32));
    const __m256i c = _mm256_permute2x128_si256(a, b, 0x20), d = _mm256_permute2x128_si256(a, b, 0x31);  // k0|k2, k1|k3
    // byte pairs (k0, k1) of bytes 0-7 | (k2, k3) of them; the same of bytes 8-15
    const __m256i e = _mm256_unpacklo_epi8(c, d), f = _mm256_unpackhi_epi8(c, d);
    const __m256i g = _mm256_permute2x128_si256(e, f, 0x20), h = _mm256_permute2x128_si256(e, f, 0x31);
    *lo = _mm256_unpacklo_epi16(g, h);
    *hi = _mm256_unpackhi_epi16(g, h);
}

// The scales s and offsets z - 8 s of 8 consecutive outputs of a group, from their (scale, zero) pairs at
// `pairs`, bf16 (a pair a 32-bit lane) where `bf16`, else fp32: as int4_groups.h's int4_scales16.
static inline __attribute__((always_inline)) void int4_scales8(const char* pairs, int bf16, __m256* s, __m256* o) {
    __m256 scale, zero;
    if (bf16) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)pairs);
        scale = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        zero = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
    } else {
        const __m256 a = _mm256_loadu_ps((const float*)pairs), b = _mm256_loadu_ps((const float*)pairs + 8);
        // lanes: pairs 0, 1, 4, 5 | 2, 3, 6, 7, then the 64-bit halves in order
        const __m256d even = _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
        const __m256d odd = _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
        scale = _mm256_castpd_ps(_mm256_permute4x64_pd(even, _MM_SHUFFLE(3, 1, 2, 0)));
        zero = _mm256_castpd_ps(_mm256_permute4x64_pd(odd, _MM_SHUFFLE(3, 1, 2, 0)));
    }
    *s = scale;
    *o = _mm256_sub_ps(zero, _mm256_mul_ps(_mm256_set1_ps(8.f), scale));
}

// y + a group's part of 8 outputs, as int4_groups.h's int4_group_add: int32 sums c of a row against the
// outputs' quads, the row's x scale rs and scale times sum rz, the outputs' scales s and offsets o.
static inline __attribute__((always_inline)) __m256 int4_group_add8(__m256i c, __m256 rs, __m256 rz, __m256 s,
                                                                    __m256 o, __m256 y) {
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), rs), s, _mm256_fmadd_ps(rz, o, y));
}

// x [M, K] quantised per row and group into fresh buffers, as int4_groups.h's int4_x_quantize: 0, or -2
// where memory ran out. Threads only for prefill sizes.
static int int4_x_quantize_avx2(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t g, int4_x* out) {
    if (int4_x_alloc(M, K, g, out) != 0) return -2;
    const int64_t G = K / g;
    #pragma omp parallel for schedule(static) if (M * K >= (1 << 17))
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < G; b++) {
            int32_t sum;
            const float scale = quantize_block_avx2(x + m * ldx + b * g, g, g, out->q + (b * M + m) * g, NULL, &sum);
            out->scale[b * M + m] = scale;
            out->sum[b * M + m] = scale * (float)sum;
        }
    return 0;
}
