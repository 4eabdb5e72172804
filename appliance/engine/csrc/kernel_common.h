// Shared by several kernel families of csrc/ (decode attention, the small ops, the few-row weight-only
// GEMMs): the C headers every kernel file takes, horizontal sums, a vector exp, 8-lane loaders of fp32
// and bf16 elements and bf16 rounding. Everything here is static inline, so each file compiles its own copy.
#pragma once

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The int8 levels x is quantised to in blocks (largest |x| at 127) by every kernel on int8 or int4 weights.
#define X_LEVELS 127.f

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// The horizontal sums of four vectors, as one 4-lane vector.
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// e^x for 8 lanes (Cephes' expf: x = n ln2 + r, a degree-5 polynomial for e^r, 2^n from the exponent
// bits); within 2 ulp of expf over [-87, 88], saturating outside.
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Eight elements as fp32: fp32, or bf16 (the upper half of an fp32: widened by a 16-bit shift). The decode
// attention kernel and the few-row GEMMs are written once over a loader and its element size;
// always_inline with a constant loader lets the compiler make one specialised copy per element type.
typedef __m256 (*load8_t)(const char* p);

static inline __m256 load8_f32(const char* p) { return _mm256_loadu_ps((const float*)p); }

static inline __m256 load8_bf16(const char* p) {
    __m128i half = _mm_loadu_si128((const __m128i*)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

// fp32 lanes rounded to the nearest bf16, ties to even, as torch rounds the result of each bf16 op (a NaN
// becomes torch's quiet NaN); still fp32, its low 16 bits zero.
static inline __m256 round8_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
}

// Eight fp32 lanes rounded to bf16 and stored.
static inline void store8_bf16(uint16_t* p, __m256 v) {
    __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(round8_bf16(v)), 16);
    _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
}

// One element each way, for a loop's tail.
static inline float bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}

static inline uint16_t f32_to_bf16(float x) {
    if (x != x) return 0x7FC0;
    union { float f; uint32_t u; } v = {x};
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

// x rounded to bf16 and widened back.
static inline float round1_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
