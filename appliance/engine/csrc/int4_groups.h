// What the two int4 kernels on AVX512-VNNI share (gemm_int4.c, prefill sizes; gemv_int4.c, a few rows):
// x quantised to int8 per row and weight group (torch's packed weight itself: int4_packing.h), each
// group's (scale, zero) pairs as vectors, and a group's int32 sums scaled into y. With
// w = (q - 8) s + z per group, a group's part of an output is
//   sum_k x w = xs (s sum_k xq q + (z - 8 s) sum_k xq)
// for x = xs xq: each group adds its int32 sums times the row's scale and the outputs' scales, and the
// row's sum times the outputs' offsets z - 8 s. One definition here, so both kernels round alike: a row
// gets the same bits from either.
#pragma once

#include "int4_packing.h"
#include "vnni_tile.h"

// x [M, K] as int8 xq [G][M][g] with a scale xs [G][M] and scale times sum xz [G][M] a row and group of g
// k: group-major, so that a group's rows lie side by side (a block of them stays in L1 while the weights'
// outputs meet it; rows K bytes apart would fall into the same few cache sets).
static VNNI_UNITS void quantize_rows_groups(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t g,
                                           int8_t* xq, float* xs, float* xz) {
    const int64_t G = K / g;
    #pragma omp parallel for schedule(static) if (M * K >= (1 << 17))
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < G; b++) {
            int32_t sum;
            const float scale = quantize_block(x + m * ldx + b * g, g, g, xq + (b * M + m) * g, &sum);
            xs[b * M + m] = scale;
            xz[b * M + m] = scale * (float)sum;
        }
}

// x [M, K] quantised into fresh buffers: 0, or -2 where memory ran out (nothing is then held).
static int int4_x_quantize(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t g, int4_x* out) {
    if (int4_x_alloc(M, K, g, out) != 0) return -2;
    quantize_rows_groups(x, ldx, M, K, g, out->q, out->scale, out->sum);
    return 0;
}

// The scales s and offsets z - 8 s of `n` (0..16) consecutive outputs of a group (0 past them), from their
// (scale, zero) pairs at `pairs`, bf16 (a pair a 32-bit lane) where `bf16`, else fp32.
static inline VNNI_UNITS __attribute__((always_inline)) void int4_scales16(const void* pairs, int bf16, int n,
                                                                          __m512* s, __m512* o) {
    const __mmask16 m = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    __m512 scale, zero;
    if (bf16) {
        const __m512i v = _mm512_maskz_loadu_epi32(m, pairs);
        scale = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        zero = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
    } else {
        const float* p = (const float*)pairs;
        const __mmask16 m0 = n >= 8 ? 0xffff : (__mmask16)((1u << 2 * n) - 1),
                        m1 = n >= 16 ? 0xffff : n <= 8 ? 0 : (__mmask16)((1u << 2 * (n - 8)) - 1);
        const __m512 a = _mm512_maskz_loadu_ps(m0, p), b = _mm512_maskz_loadu_ps(m1, p + 16);
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        scale = _mm512_permutex2var_ps(a, even, b);
        zero = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
    }
    *s = scale;
    *o = _mm512_sub_ps(zero, _mm512_mul_ps(_mm512_set1_ps(8.f), scale));
}

// y + a group's part of 16 outputs: int32 sums c of a row against the outputs' quads, the row's x scale
// rs and scale times sum rz, the outputs' scales s and offsets o.
static inline VNNI_UNITS __attribute__((always_inline)) __m512 int4_group_add(__m512i c, __m512 rs, __m512 rz,
                                                                             __m512 s, __m512 o, __m512 y) {
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(c), rs), s, _mm512_fmadd_ps(rz, o, y));
}
