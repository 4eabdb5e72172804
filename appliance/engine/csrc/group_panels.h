// Weights packed in panels of 32 outputs whose k groups of 4 bytes lie side by side, shared by the packed
// bf16 (gemm_bf16.c, VDPBF16PS) and int8 (gemm_int8.c, VPDPBUSD) GEMMs: the packing, the broadcast of an
// x group and the store of a tile row. An 8x32 register tile (16 accumulators) meets each 128-byte panel
// row.
#pragma once

#include "kernel_common.h"
#include "panel_layout.h"

#define BMR 8
#define BMC 192  // x rows per block: 192 KB of x pairs stay in L2 while the panels stream past
#define BPREFETCH 64  // k groups ahead (8 KB) to prefetch while a panel is read from memory the first time

// Packs weights in panels of 32 outputs whose k groups of 4 bytes lie side by side (bf16 pairs, int8
// quads): [ceil(N/32)][ceil(K/g)][32][g] for g = 4 / es elements of `es` bytes, each group XORed with
// `flip` (int8: 0x80 a byte, the weights as the unsigned bytes VPDPBUSD takes; padding is a flipped 0).
static inline __attribute__((always_inline)) void pack_groups(const char* w, int64_t N, int64_t K, int64_t es,
                                                              uint32_t flip, char* packed) {
    const int64_t g = 4 / es, panels = (N + BPANEL - 1) / BPANEL, KG = (K + g - 1) / g, full = K / g;
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int j = 0; j < BPANEL; j++) {
            const int64_t n = p * BPANEL + j;
            char* out = packed + (p * KG * BPANEL + j) * 4;
            const int64_t stride = BPANEL * 4;  // bytes between one output's consecutive groups
            if (n >= N) {  // the last panel's padding rows
                for (int64_t kg = 0; kg < KG; kg++) memcpy(out + kg * stride, &flip, 4);
                continue;
            }
            const char* row = w + n * K * es;
            uint32_t v;
            for (int64_t kg = 0; kg < full; kg++) {
                memcpy(&v, row + kg * 4, 4);
                v ^= flip;
                memcpy(out + kg * stride, &v, 4);
            }
            if (full < KG) {  // K not a multiple of g: its last k beside zeros
                v = 0;
                memcpy(&v, row + full * 4, (K - full * g) * es);
                v ^= flip;
                memcpy(out + full * stride, &v, 4);
            }
        }
}

// 4 bytes of x (a bf16 pair, an int8 quad) in every 32-bit lane, against 16 outputs' groups.
static inline __attribute__((target("avx512f"), always_inline)) __m512i group_broadcast(const void* p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

// One row of a tile's 32 sums into y: added to the sums of earlier passes (accumulate), times the outputs'
// scales (int8 weights' last pass; else NULL). A last panel of an N not a multiple of 32 stores its nr
// columns only.
static inline __attribute__((target("avx512f"), always_inline)) void store_tile_row(
        float* yr, __m512 s0, __m512 s1, int nr, int accumulate, const float* scale) {
    const __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1),
                    m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    if (accumulate) {
        s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(m0, yr));
        s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps(m1, yr + 16));
    }
    if (scale) {
        s0 = _mm512_mul_ps(s0, _mm512_maskz_loadu_ps(m0, scale));
        s1 = _mm512_mul_ps(s1, _mm512_maskz_loadu_ps(m1, scale + 16));
    }
    _mm512_mask_storeu_ps(yr, m0, s0);
    _mm512_mask_storeu_ps(yr + 16, m1, s1);
}
