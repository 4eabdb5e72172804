// The 6x16 register tile of the AVX2 packed GEMMs, on fp32 weights (gemm_f32.c) and on bf16 weights widened
// to fp32 (gemm_bf16_fma.c): 6 rows x 16 outputs = 12 accumulators, plus 2 weight vectors and 1 broadcast x
// value: 15 of the 16 ymm registers. A row's update and a row's store.
#pragma once

#include "kernel_common.h"
#include "panel_layout.h"

#define MR 6

// Row i of a tile: x##i[kx] broadcast against the weight vectors w0, w1 into acc##i##0, acc##i##1 (for a
// tile inlined with a constant mr, rows past it vanish).
#define PANEL16_FMA_ROW(i, kx, w0, w1, acc)                                                  \
    if (mr > i) {                                                                            \
        __m256 a = _mm256_broadcast_ss(x##i + (kx));                                         \
        acc##i##0 = _mm256_fmadd_ps(a, w0, acc##i##0);                                       \
        acc##i##1 = _mm256_fmadd_ps(a, w1, acc##i##1);                                       \
    }

// One row of a tile's 16 sums into y: added to the sums of earlier passes (accumulate). A last panel of an
// N not a multiple of 16 stores its nr columns only.
static inline __attribute__((always_inline)) void panel16_store_row(float* yr, __m256 s0, __m256 s1, int nr,
                                                                    int accumulate) {
    if (nr == PANEL) {
        if (accumulate) {
            s0 = _mm256_add_ps(s0, _mm256_loadu_ps(yr));
            s1 = _mm256_add_ps(s1, _mm256_loadu_ps(yr + 8));
        }
        _mm256_storeu_ps(yr, s0);
        _mm256_storeu_ps(yr + 8, s1);
        return;
    }
    float t[PANEL];
    _mm256_storeu_ps(t, s0);
    _mm256_storeu_ps(t + 8, s1);
    for (int j = 0; j < nr; j++) yr[j] = accumulate ? yr[j] + t[j] : t[j];
}
