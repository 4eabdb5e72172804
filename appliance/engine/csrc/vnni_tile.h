// The VPDPBUSD tile shared by the GEMMs on integer weights packed in panels (group_panels.h) on CPUs with
// AVX512-VNNI: int8 (gemm_int8.c, weights q + 128, a scale per output) and int4 (gemm_int4.c, weights
// q in 0..15, a scale and zero per output and group). Both quantise x to int8 in blocks (one scale a row and
// block, the largest |x| at 127) and multiply a block's 4-byte k quads into int32 sums; each GEMM scales its
// sums into y its own way. A target attribute, not a build flag: the library still runs on AVX2 alone.
#pragma once

#include "group_panels.h"

#define VNNI_UNITS __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// c[i][0..1] = the int32 sums of x rows 0..mr-1 (int8 quads, row stride ldx) against a panel's kc rows of
// 32 unsigned weight quads (as bf16_tile_rows: an 8x32 tile, 16 accumulators; with one or two rows a
// second chain per output, d, hides VPDPBUSD's latency). `prefetch`: the panel is read from memory the
// first time. Inlined with a constant mr, so each row count gets only its accumulators.
static inline VNNI_UNITS __attribute__((always_inline)) void vnni_tile_sums(
        const int8_t* x, int64_t ldx, const uint8_t* panel, int64_t kc, __m512i c[BMR][2], const int mr,
        const int prefetch) {
    __m512i d[2][2];
    for (int i = 0; i < BMR; i++) c[i][0] = c[i][1] = _mm512_setzero_si512();
    d[0][0] = d[0][1] = d[1][0] = d[1][1] = _mm512_setzero_si512();
    int64_t kq = 0;
    if (mr <= 2)
        for (; kq + 2 <= kc; kq += 2) {
            const uint8_t* row = panel + kq * BPANEL * 4;
            if (prefetch)
                for (int line = 0; line < 4; line++)
                    _mm_prefetch((const char*)(row + BPREFETCH * BPANEL * 4 + line * 64), _MM_HINT_T0);
            const __m512i u0 = _mm512_loadu_si512(row), u1 = _mm512_loadu_si512(row + 64);
            const __m512i v0 = _mm512_loadu_si512(row + 128), v1 = _mm512_loadu_si512(row + 192);
            for (int i = 0; i < mr; i++) {
                const __m512i a = group_broadcast(x + i * ldx + 4 * kq), b = group_broadcast(x + i * ldx + 4 * kq + 4);
                c[i][0] = _mm512_dpbusd_epi32(c[i][0], u0, a);
                c[i][1] = _mm512_dpbusd_epi32(c[i][1], u1, a);
                d[i][0] = _mm512_dpbusd_epi32(d[i][0], v0, b);
                d[i][1] = _mm512_dpbusd_epi32(d[i][1], v1, b);
            }
        }
    for (; kq < kc; kq++) {
        const uint8_t* row = panel + kq * BPANEL * 4;
        if (prefetch)
            for (int line = 0; line < 2; line++)
                _mm_prefetch((const char*)(row + BPREFETCH * BPANEL * 4 + line * 64), _MM_HINT_T0);
        const __m512i u0 = _mm512_loadu_si512(row), u1 = _mm512_loadu_si512(row + 64);
        for (int i = 0; i < mr; i++) {
            const __m512i a = group_broadcast(x + i * ldx + 4 * kq);
            c[i][0] = _mm512_dpbusd_epi32(c[i][0], u0, a);
            c[i][1] = _mm512_dpbusd_epi32(c[i][1], u1, a);
        }
    }
    if (mr <= 2)
        for (int i = 0; i < mr; i++) {
            c[i][0] = _mm512_add_epi32(c[i][0], d[i][0]);
            c[i][1] = _mm512_add_epi32(c[i][1], d[i][1]);
        }
}

// One block of a row of x, its n values in `slots` int8 slots (the rest zero): stores them scaled so that
// the largest |x| becomes 127 (rounded to nearest even), puts their sum in *sum and returns the block's
// scale. A NaN makes the scale NaN (the output then is too).
static inline VNNI_UNITS float quantize_block(const float* x, int64_t n, int64_t slots, int8_t* q, int32_t* sum) {
    __m512 top = _mm512_setzero_ps();
    __mmask16 nan = 0;  // MAXPS drops a NaN in one of its operands: they are looked for apart
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 m = n - k >= 16 ? 0xffff : (__mmask16)((1u << (n - k)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
        top = _mm512_max_ps(top, _mm512_abs_ps(v));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    const float largest = nan ? NAN : _mm512_reduce_max_ps(top);
    const __m512 inv = _mm512_set1_ps(largest > 0.f ? X_LEVELS / largest : 0.f);
    __m512i total = _mm512_setzero_si512();
    for (int64_t k = 0; k < slots; k += 16) {
        const __mmask16 in = k >= n ? 0 : n - k >= 16 ? 0xffff : (__mmask16)((1u << (n - k)) - 1);
        const __mmask16 out = slots - k >= 16 ? 0xffff : (__mmask16)((1u << (slots - k)) - 1);
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + k), inv));
        total = _mm512_add_epi32(total, v);
        _mm512_mask_cvtsepi32_storeu_epi8(q + k, out, v);
    }
    *sum = _mm512_reduce_add_epi32(total);
    return largest / X_LEVELS;
}
