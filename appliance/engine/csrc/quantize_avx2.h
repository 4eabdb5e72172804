// x quantised to int8 in blocks on AVX2 alone, rounded as the AVX-512 quantiser (vnni_tile.h's
// quantize_block) rounds: the packed int8 GEMM (gemm_int8_avx2.c) and the int4 GEMV (gemv_int4_avx2.c) on
// CPUs without AVX512-VNNI thus meet the same int8 x as their VPDPBUSD counterparts.
#pragma once

#include "kernel_common.h"

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline int32_t hsum8_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

// The first n (< 8) lanes of a load mask.
static inline __m256i first_lanes(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// One block of a row of x, its n values in `slots` int8 slots (the rest zero), as quantize_block: scaled
// so that the largest |x| becomes 127 (rounded to nearest even, saturated to int8), into q, their
// magnitudes into qa (unless NULL) and their sum into *sum (unless NULL); returns the block's scale (NaN if
// a NaN is in it).
static float quantize_block_avx2(const float* x, int64_t n, int64_t slots, int8_t* q, uint8_t* qa, int32_t* sum) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 top = _mm256_setzero_ps(), nan = _mm256_setzero_ps();  // MAXPS drops NaNs: they are looked for apart
    for (int64_t k = 0; k < n; k += 8) {
        const __m256 v = n - k >= 8 ? _mm256_loadu_ps(x + k) : _mm256_maskload_ps(x + k, first_lanes(n - k));
        top = _mm256_max_ps(top, _mm256_and_ps(v, magnitude));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    const float largest = _mm256_movemask_ps(nan) ? NAN : hmax8(top);
    const __m256 inv = _mm256_set1_ps(largest > 0.f ? X_LEVELS / largest : 0.f);
    __m256i total = _mm256_setzero_si256();
    for (int64_t k = 0; k < slots; k += 8) {
        const __m256 v = k >= n ? _mm256_setzero_ps()
                         : n - k >= 8 ? _mm256_loadu_ps(x + k)
                                      : _mm256_maskload_ps(x + k, first_lanes(n - k));
        const __m256i i32 = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
        total = _mm256_add_epi32(total, i32);
        const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
        const __m128i i8 = _mm_packs_epi16(i16, i16), a8 = _mm_abs_epi8(i8);
        const int64_t count = slots - k < 8 ? slots - k : 8;  // slots: whole quads, not always whole eights
        memcpy(q + k, &i8, count);
        if (qa != NULL) memcpy(qa + k, &a8, count);
    }
    if (sum != NULL) *sum = hsum8_epi32(total);
    return largest / X_LEVELS;
}
