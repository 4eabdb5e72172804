// The packed bf16 GEMM on CPUs without bf16 units (AVX2/FMA): torch emulates bf16 GEMMs there, far below the
// FMA units' rate (a prefill's GEMMs ran at a sixth of llama.cpp's), and the few-row kernel on torch's layout
// (few_rows.h) rereads x for every pair of weight rows. The weights are packed once as for VDPBF16PS
// (group_panels.h: panels of 32 outputs whose k pairs lie side by side), so one packing serves both GEMMs:
// each 32-bit lane of a panel row holds one output's pair (k, k+1) and widens to fp32 in registers without a
// shuffle, k as the lane shifted up 16 bits, k+1 as the lane with its low 16 bits cleared. A 32-output panel
// is met as two halves of 16 outputs on panel16.h's 6x16 tile, x (fp32) broadcast a value per row;
// blocking as the fp32 GEMM (gemm_f32.c), both halves of a panel row read by one thread. A one-row step
// (decode) reads each panel front to back in one pass instead (fma_one_row): the blocked loop's second
// half-panel pass reads from L1 while memory idles, 12-20 % slower at 7B shapes.
#include "cpu_kernels.h"
#include "group_panels.h"
#include "panel16.h"

#define FKC 128  // k pairs per pass: a 16 KB panel slice stays in L1 beside a tile's x (6 rows of 256 k: 6 KB)
#define FMC 96   // x rows per block: 96 rows of 256 k (96 KB) stay in L2 while the panels stream past

static inline __attribute__((always_inline)) __m256 even_k(__m256i pairs) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
}

// Two shifts rather than a mask: the mask's constant would take the 16th ymm register, and GCC then spills
// accumulators of the 6-row tile every pair.
static inline __attribute__((always_inline)) __m256 odd_k(__m256i pairs) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(pairs, 16), 16));
}

// One k of a pair (even_k or odd_k of p0, p1: the half's 16 outputs) against x##i[kx] for every row of the
// tile, into accumulators acc.
#define PAIR_FMA(widen, kx, acc)                                                                         \
    {                                                                                                    \
        const __m256 w0 = widen(p0), w1 = widen(p1);                                                     \
        PANEL16_FMA_ROW(0, kx, w0, w1, acc) PANEL16_FMA_ROW(1, kx, w0, w1, acc)                          \
        PANEL16_FMA_ROW(2, kx, w0, w1, acc) PANEL16_FMA_ROW(3, kx, w0, w1, acc)                          \
        PANEL16_FMA_ROW(4, kx, w0, w1, acc) PANEL16_FMA_ROW(5, kx, w0, w1, acc)                          \
    }

// y[0:mr, 0:nr] (+)= x[0:mr, 0:2kc] . the 16 outputs of half h of a panel slice of kc pairs; tail: one
// more pair whose second k is past K (its weight is the packing's zero, its x is not read). Inlined with a
// constant mr (see fma_tile). Up to 3 rows, the odd k go to accumulators of their own (d): one chain per
// output would leave the FMA latency, not the loads, as the bound.
static inline __attribute__((always_inline)) void fma_tile_rows(
        const float* x, int64_t ldx, const uint16_t* panel, int h, int64_t kc, int tail, float* y, int64_t ldy,
        int accumulate, const int mr, int nr, const int prefetch) {
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx, *x4 = x + 4 * ldx,
                *x5 = x + 5 * ldx;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m256 d00 = c00, d01 = c00, d10 = c00, d11 = c00, d20 = c00, d21 = c00, d30 = c00, d31 = c00, d40 = c00,
           d41 = c00, d50 = c00, d51 = c00;  // used up to 3 rows only
    const uint16_t* half = panel + h * PANEL * 2;
    int64_t kp = 0;
    for (; kp < kc; kp++) {
        if (prefetch)  // both halves' lines: the second half reads them next
            for (int line = 0; line < 2; line++)
                _mm_prefetch((const char*)(panel + (kp + BPREFETCH) * BPANEL * 2 + line * 32), _MM_HINT_T0);
        const __m256i p0 = _mm256_loadu_si256((const __m256i*)(half + kp * BPANEL * 2)),
                      p1 = _mm256_loadu_si256((const __m256i*)(half + kp * BPANEL * 2 + 16));
        PAIR_FMA(even_k, 2 * kp, c)
        if (mr <= 3)
            PAIR_FMA(odd_k, 2 * kp + 1, d)
        else
            PAIR_FMA(odd_k, 2 * kp + 1, c)
    }
    if (tail) {
        const __m256i p0 = _mm256_loadu_si256((const __m256i*)(half + kp * BPANEL * 2)),
                      p1 = _mm256_loadu_si256((const __m256i*)(half + kp * BPANEL * 2 + 16));
        PAIR_FMA(even_k, 2 * kp, c)
    }
    __m256 c[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    const __m256 d[3][2] = {{d00, d01}, {d10, d11}, {d20, d21}};
    for (int i = 0; i < mr; i++) {
        if (mr <= 3) {
            c[i][0] = _mm256_add_ps(c[i][0], d[i][0]);
            c[i][1] = _mm256_add_ps(c[i][1], d[i][1]);
        }
        panel16_store_row(y + i * ldy, c[i][0], c[i][1], nr, accumulate);
    }
}

#define FMA_TILE_CASE(rows, pf) \
    case rows: fma_tile_rows(x, ldx, panel, h, kc, tail, y, ldy, accumulate, rows, nr, pf); return;
#define FMA_TILE_CASES(pf)                                                                               \
    switch (mr) {                                                                                        \
        FMA_TILE_CASE(1, pf) FMA_TILE_CASE(2, pf) FMA_TILE_CASE(3, pf) FMA_TILE_CASE(4, pf)              \
        FMA_TILE_CASE(5, pf)                                                                             \
        default: fma_tile_rows(x, ldx, panel, h, kc, tail, y, ldy, accumulate, MR, nr, pf); return;      \
    }

// prefetch: the first row tile to meet this panel slice, which still comes from memory (prefetches past
// the panel's end are harmless: they never fault).
static void fma_tile(const float* x, int64_t ldx, const uint16_t* panel, int h, int64_t kc, int tail, float* y,
                     int64_t ldy, int accumulate, int mr, int nr, int prefetch) {
    if (prefetch)
        FMA_TILE_CASES(1)
    FMA_TILE_CASES(0)
}

// One row: a panel's 32 outputs at once, every k pair of the panel in one sequential pass (its 128-byte rows
// front to back), so memory streams without pause; the sums stay in registers across K.
static void fma_one_row(const float* x, const uint16_t* panel, int64_t K2, int64_t full, float* y, int nr) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, d0 = c0, d1 = c0, d2 = c0, d3 = c0;
    int64_t kp = 0;
    for (; kp < full; kp++) {
        _mm_prefetch((const char*)(panel + (kp + BPREFETCH) * BPANEL * 2), _MM_HINT_T0);
        _mm_prefetch((const char*)(panel + (kp + BPREFETCH) * BPANEL * 2 + 32), _MM_HINT_T0);
        const uint16_t* row = panel + kp * BPANEL * 2;
        const __m256i p0 = _mm256_loadu_si256((const __m256i*)row), p1 = _mm256_loadu_si256((const __m256i*)(row + 16)),
                      p2 = _mm256_loadu_si256((const __m256i*)(row + 32)), p3 = _mm256_loadu_si256((const __m256i*)(row + 48));
        const __m256 a = _mm256_broadcast_ss(x + 2 * kp), b = _mm256_broadcast_ss(x + 2 * kp + 1);
        c0 = _mm256_fmadd_ps(a, even_k(p0), c0);
        c1 = _mm256_fmadd_ps(a, even_k(p1), c1);
        c2 = _mm256_fmadd_ps(a, even_k(p2), c2);
        c3 = _mm256_fmadd_ps(a, even_k(p3), c3);
        d0 = _mm256_fmadd_ps(b, odd_k(p0), d0);
        d1 = _mm256_fmadd_ps(b, odd_k(p1), d1);
        d2 = _mm256_fmadd_ps(b, odd_k(p2), d2);
        d3 = _mm256_fmadd_ps(b, odd_k(p3), d3);
    }
    if (kp < K2) {  // an odd K's last pair: its second weight is the packing's zero, its x is not read
        const uint16_t* row = panel + kp * BPANEL * 2;
        const __m256 a = _mm256_broadcast_ss(x + 2 * kp);
        c0 = _mm256_fmadd_ps(a, even_k(_mm256_loadu_si256((const __m256i*)row)), c0);
        c1 = _mm256_fmadd_ps(a, even_k(_mm256_loadu_si256((const __m256i*)(row + 16))), c1);
        c2 = _mm256_fmadd_ps(a, even_k(_mm256_loadu_si256((const __m256i*)(row + 32))), c2);
        c3 = _mm256_fmadd_ps(a, even_k(_mm256_loadu_si256((const __m256i*)(row + 48))), c3);
    }
    panel16_store_row(y, _mm256_add_ps(c0, d0), _mm256_add_ps(c1, d1), nr < PANEL ? nr : PANEL, 0);
    if (nr > PANEL)
        panel16_store_row(y + PANEL, _mm256_add_ps(c2, d2), _mm256_add_ps(c3, d3), nr - PANEL, 0);
}

void linear_packed_bf16_fma(const float* x, int64_t ldx, const uint16_t* packed, float* y, int64_t ldy, int64_t M,
                            int64_t N, int64_t K) {
    const int64_t panels = (N + BPANEL - 1) / BPANEL, K2 = (K + 1) / 2, full = K / 2;
    if (M == 1) {
        #pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < panels; p++)
            fma_one_row(x, packed + p * K2 * BPANEL * 2, K2, full, y + p * BPANEL,
                        N - p * BPANEL < BPANEL ? (int)(N - p * BPANEL) : BPANEL);
        return;
    }
    #pragma omp parallel
    for (int64_t m1 = 0; m1 < M; m1 += FMC) {
        const int64_t m2 = m1 + FMC < M ? m1 + FMC : M;
        #pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; p++) {
            const int nr = N - p * BPANEL < BPANEL ? (int)(N - p * BPANEL) : BPANEL;
            for (int64_t k0 = 0; k0 < K2; k0 += FKC) {
                const int64_t kc = K2 - k0 < FKC ? K2 - k0 : FKC;
                const int tail = k0 + kc > full;  // an odd K's last pair, in the last pass
                for (int64_t m0 = m1; m0 < m2; m0 += MR)
                    for (int h = 0; h < 2 && nr > h * PANEL; h++)
                        fma_tile(x + m0 * ldx + 2 * k0, ldx, packed + (p * K2 + k0) * BPANEL * 2, h, kc - tail,
                                 tail, y + m0 * ldy + p * BPANEL + h * PANEL, ldy, k0 > 0,
                                 m2 - m0 < MR ? (int)(m2 - m0) : MR, nr - h * PANEL < PANEL ? nr - h * PANEL : PANEL,
                                 m0 == m1 && h == 0);
            }
        }
    }
}
