// The few-row weight-only GEMM tile, shared by the int8 (gemm_int8.c) and bf16 (gemm_bf16.c) kernels.
#pragma once

#include "kernel_common.h"

// Weight-only GEMMs for few rows (decode), on weights stored narrower than fp32: int8 rows with one fp32
// scale each (y[m][n] = scale[n] * sum_k x[m][k] * q[n][k]), or bf16 rows (scale 1). A decode step is
// bound by reading the weights; torch's kernels for these types run below the memory roofline past one
// row (int8) or, on CPUs without bf16 units, emulate bf16 at a few GFLOP/s. Here each pair of weight rows
// is read from memory once for all M rows: groups of up to 4 x rows meet it while it sits in L1, each
// weight widened to fp32 in registers. A tile is 2 weight rows x mr x rows, 16 k at a time. The tile is
// written once over a weight loader and element size, like the decode attention kernel.
#define FEW_MR 4

typedef float (*load1_t)(const char* p);

// x[i][k+off:k+off+8] against weight vectors wa, wb into accumulators ca, cb.
#define FEW_FMA(i, off, wa, wb, ca, cb)                         \
    {                                                          \
        __m256 a = _mm256_loadu_ps(x##i + k + off);            \
        ca = _mm256_fmadd_ps(a, wa, ca);                       \
        cb = _mm256_fmadd_ps(a, wb, cb);                       \
    }

// y[i][0], y[i][ldy_n] = the dot products of x rows 0..mr-1 with weight rows w0, w1 (`es`-byte elements
// read through `load`, the K % 8 tail through `load1`), scaled. Inlined with a constant mr, so each row
// count gets only its accumulators. With one or two rows, each output's second 8 k go to accumulators of
// their own (d): one chain per output would leave the FMA latency, not memory, as the bound. A lone last
// weight row passes w1 = w0 and ldy_n = 0 (its second column is the same value, written first and then
// over).
static inline __attribute__((always_inline)) void few_rows_tile(
        const float* x, int64_t ldx, const char* w0, const char* w1, int64_t es, load8_t load, load1_t load1,
        float s0, float s1, int64_t K, float* y, int64_t ldy, int64_t ldy_n, const int mr) {
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, d00 = c00, d01 = c00, d10 = c00, d11 = c00;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 u0 = load(w0 + k * es), u1 = load(w1 + k * es);
        __m256 v0 = load(w0 + (k + 8) * es), v1 = load(w1 + (k + 8) * es);
        if (mr <= 2) {  // 4 accumulators to spare (16 ymm registers): a second chain per output
            FEW_FMA(0, 0, u0, u1, c00, c01) FEW_FMA(0, 8, v0, v1, d00, d01)
            if (mr > 1) { FEW_FMA(1, 0, u0, u1, c10, c11) FEW_FMA(1, 8, v0, v1, d10, d11) }
        } else {  // 8 outputs: chains enough to hide the FMA latency
            FEW_FMA(0, 0, u0, u1, c00, c01) FEW_FMA(0, 8, v0, v1, c00, c01)
            FEW_FMA(1, 0, u0, u1, c10, c11) FEW_FMA(1, 8, v0, v1, c10, c11)
        }
        if (mr > 2) { FEW_FMA(2, 0, u0, u1, c20, c21) FEW_FMA(2, 8, v0, v1, c20, c21) }
        if (mr > 3) { FEW_FMA(3, 0, u0, u1, c30, c31) FEW_FMA(3, 8, v0, v1, c30, c31) }
    }
    if (k + 8 <= K) {
        __m256 u0 = load(w0 + k * es), u1 = load(w1 + k * es);
        FEW_FMA(0, 0, u0, u1, c00, c01)
        if (mr > 1) FEW_FMA(1, 0, u0, u1, c10, c11)
        if (mr > 2) FEW_FMA(2, 0, u0, u1, c20, c21)
        if (mr > 3) FEW_FMA(3, 0, u0, u1, c30, c31)
        k += 8;
    }
    __m256 c[FEW_MR][2] = {{_mm256_add_ps(c00, d00), _mm256_add_ps(c01, d01)},
                           {_mm256_add_ps(c10, d10), _mm256_add_ps(c11, d11)}, {c20, c21}, {c30, c31}};
    const float* xs[FEW_MR] = {x0, x1, x2, x3};
    for (int i = 0; i < mr; i++) {
        float d0 = hsum(c[i][0]), d1 = hsum(c[i][1]);
        for (int64_t t = k; t < K; t++) {  // the K % 8 tail
            d0 += xs[i][t] * load1(w0 + t * es);
            d1 += xs[i][t] * load1(w1 + t * es);
        }
        y[i * ldy + ldy_n] = d1 * s1;
        y[i * ldy] = d0 * s0;
    }
}

// Output columns n, n+1 (pair p) of y [M, N] (row stride ldy) = x [M, K] (row stride ldx) times the
// [N, K] weight w transposed, scaled by `scale` per output (NULL: 1). Called inside each kernel's own
// parallel loop with constant loaders, so that they are inlined (an OpenMP region outlines its body:
// a loader passed into it would stay an indirect call per load).
static inline __attribute__((always_inline)) void few_rows_pair(
        const float* x, int64_t ldx, const char* w, int64_t es, load8_t load, load1_t load1, const float* scale,
        float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t p) {
    const int64_t n = 2 * p, two = n + 1 < N;
    const char *w0 = w + n * K * es, *w1 = two ? w0 + K * es : w0;
    const float s0 = scale ? scale[n] : 1.f, s1 = scale && two ? scale[n + 1] : s0;
    for (int64_t m = 0; m < M; m += FEW_MR) {
        const float* xm = x + m * ldx;
        float* ym = y + m * ldy + n;
        switch (M - m < FEW_MR ? M - m : FEW_MR) {
            case 1: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 1); break;
            case 2: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 2); break;
            case 3: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 3); break;
            default: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 4); break;
        }
    }
}
