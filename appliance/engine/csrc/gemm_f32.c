// The fp32 GEMM on prepacked weights (AVX2/FMA): MKL streams the weights of few-row (decode) GEMMs at a
// fraction of the memory bandwidth, and a decode step is bound by reading them; this kernel streams them
// near the memory's rate and keeps up with MKL at prefill sizes (figures: docs/benchmarks.md).
#include "cpu_kernels.h"
#include "panel16.h"

// GEMM: y = x W^T with W repacked once into panels of 16 output columns, [ceil(N/16)][K][16], so the
// inner loop reads each panel front to back and broadcasts one x value per row: the 6x16 register tile
// of panel16.h.
#define KC 512  // K per pass: a 32 KB panel slice stays in L1 while it meets every row of the x block
#define MC 60   // x rows per block: MC x KC floats (120 KB) stay in L2 while the panels stream past
#define PREFETCH 2048  // floats ahead (8 KB) to prefetch while a panel is read from memory the first time

void pack_weight_f32(const float* w, int64_t N, int64_t K, float* packed) {
    int64_t panels = (N + PANEL - 1) / PANEL;
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < PANEL; j++) {
                int64_t n = p * PANEL + j;
                packed[(p * K + k) * PANEL + j] = n < N ? w[n * K + k] : 0.f;  // zero-padded last panel
            }
}

// y[0:mr, 0:nr] (+)= x[0:mr, 0:kc] . panel[0:kc, 0:nr]. Inlined with a constant mr (see tile), so each
// row count gets its own loop with only that many accumulators: a 2-row remainder costs 2 rows, not 6.
static inline __attribute__((always_inline)) void tile_rows(const float* x, int64_t ldx, const float* panel,
                                                            int64_t kc, float* y, int64_t ldy, int accumulate,
                                                            const int mr, int nr, const int prefetch) {
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx, *x4 = x + 4 * ldx,
                *x5 = x + 5 * ldx;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t k = 0; k < kc; k++) {
        if (prefetch) _mm_prefetch((const char*)(panel + k * PANEL + PREFETCH), _MM_HINT_T0);
        __m256 w0 = _mm256_loadu_ps(panel + k * PANEL), w1 = _mm256_loadu_ps(panel + k * PANEL + 8);
        PANEL16_FMA_ROW(0, k, w0, w1, c) PANEL16_FMA_ROW(1, k, w0, w1, c) PANEL16_FMA_ROW(2, k, w0, w1, c)
        PANEL16_FMA_ROW(3, k, w0, w1, c) PANEL16_FMA_ROW(4, k, w0, w1, c) PANEL16_FMA_ROW(5, k, w0, w1, c)
    }
    __m256 c[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int i = 0; i < mr; i++) panel16_store_row(y + i * ldy, c[i][0], c[i][1], nr, accumulate);
}

// One case per row count, for a constant prefetch flag.
#define TILE_CASES(pf)                                                          \
    switch (mr) {                                                               \
        case 1: tile_rows(x, ldx, panel, kc, y, ldy, accumulate, 1, nr, pf); return; \
        case 2: tile_rows(x, ldx, panel, kc, y, ldy, accumulate, 2, nr, pf); return; \
        case 3: tile_rows(x, ldx, panel, kc, y, ldy, accumulate, 3, nr, pf); return; \
        case 4: tile_rows(x, ldx, panel, kc, y, ldy, accumulate, 4, nr, pf); return; \
        case 5: tile_rows(x, ldx, panel, kc, y, ldy, accumulate, 5, nr, pf); return; \
        default: tile_rows(x, ldx, panel, kc, y, ldy, accumulate, 6, nr, pf); return; \
    }

// first: the first row tile to meet this panel slice, which still comes from memory, so it prefetches
// ahead (prefetches past the panel's end are harmless: they never fault).
static void tile(const float* x, int64_t ldx, const float* panel, int64_t kc, float* y, int64_t ldy,
                 int accumulate, int mr, int nr, int first) {
    if (first)
        TILE_CASES(1)
    TILE_CASES(0)
}

// y[m, n] = sum_k x[m, k] * w[n, k] (torch's linear without bias), w given packed by pack_weight_f32.
// x: [M, K] with row stride ldx; y: [M, N] with row stride ldy.
void linear_packed_f32(const float* x, int64_t ldx, const float* packed, float* y, int64_t ldy,
                       int64_t M, int64_t N, int64_t K) {
    int64_t panels = (N + PANEL - 1) / PANEL;
    #pragma omp parallel
    for (int64_t m1 = 0; m1 < M; m1 += MC) {
        int64_t m2 = m1 + MC < M ? m1 + MC : M;
        #pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; p++) {
            int nr = N - p * PANEL < PANEL ? (int)(N - p * PANEL) : PANEL;
            for (int64_t k0 = 0; k0 < K; k0 += KC) {
                int64_t kc = K - k0 < KC ? K - k0 : KC;
                for (int64_t m0 = m1; m0 < m2; m0 += MR)
                    tile(x + m0 * ldx + k0, ldx, packed + (p * K + k0) * PANEL, kc,
                              y + m0 * ldy + p * PANEL, ldy, k0 > 0, m2 - m0 < MR ? (int)(m2 - m0) : MR, nr,
                              m0 == m1);
            }
        }
    }
}
