// The packed int8 GEMM on CPUs without AVX512-VNNI (AVX2): on the VPDPBUSD GEMM's packing (group_panels.h:
// panels of 32 outputs, a k quad per output, stored as q + 128), so one packing serves both GEMMs, and on x
// quantised as that GEMM does (int8 per row and per 512 k, each block scaled to its largest |x|): both give
// the same int32 sums, so the same y, bit for bit. torch's int8 kernel reads a decode step's weights below
// the memory's rate and runs prefill on converted tiles; here every row count reads a byte a weight.
//
// Products are exact: VPMADDUBSW multiplies unsigned by signed bytes and adds each pair into a saturating
// int16, so the stored weights (q + 128, up to 255) against x (up to 127) could reach 2 x 255 x 127 > 32767.
// The weights are flipped back to signed (XOR 0x80: q, one op per weight vector for every row of a tile),
// and the sign trick puts x's sign on them: |x| as the unsigned operand, sign(q, x) = q sgn(x) as the signed
// one, so a pair is at most 2 x 127 x 127 = 32258 (2 x 128 x 127 = 32512 for the -128 a NaN block holds:
// its scale is NaN anyway). VPMADDWD against ones adds the pairs into int32 lanes: a lane holds one output's
// sum over 4 k. No offset to take off (the weights are signed again); a pass's 512 products of at most
// 127 x 128 stay below 2^24, exact in int32 and in fp32.
//
// A tile is mr rows x nv vectors of 8 outputs: 1 row x 2 panels (64 outputs) for one-row steps, which thus
// read two streams at once; 2 rows x a panel; 3-4 rows x half a panel (16 outputs). Each is 8 accumulators,
// beside the weight vector, two broadcasts a row (|x| and x) and the ones. Blocking as the VPDPBUSD GEMM: a
// pass of 512 k over a block of 192 rows, OpenMP over panels.
#include "cpu_kernels.h"
#include "group_panels.h"
#include "quantize_avx2.h"

#define QKC 128  // k quads per pass (512 k): the x block that shares a scale, as in gemm_int8.c
#define TILE_ACC 8  // accumulators a tile: mr x nv
#define ROW_PANELS 2  // panels a one-row tile reads at once

// y[i][8v:8v+8] for tile row i and vector v: the int32 sums times the row's pass scale, added to earlier
// passes' (accumulate), times the outputs' scales (last pass; else NULL); n of the 8 outputs stored.
static inline __attribute__((always_inline)) void store8(float* y, __m256 s, int n, int accumulate,
                                                         const float* scale) {
    if (n >= 8) {
        if (accumulate) s = _mm256_add_ps(s, _mm256_loadu_ps(y));
        if (scale) s = _mm256_mul_ps(s, _mm256_loadu_ps(scale));
        _mm256_storeu_ps(y, s);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, s);
    for (int j = 0; j < n; j++) {
        const float v = accumulate ? y[j] + t[j] : t[j];
        y[j] = scale ? v * scale[j] : v;
    }
}

// Four k of 8 outputs: signed weights w (q) against a row's quad, |x| in xa and x (for its signs) in xs.
static inline __attribute__((always_inline)) __m256i quad_products(__m256i w, __m256i xa, __m256i xs, __m256i ones) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xs)), ones);
}

// A row's quad of |x| (a) and of x (s) in every 32-bit lane.
static inline __attribute__((always_inline)) void broadcast_quads(const uint8_t* xa, const int8_t* xq, __m256i* a,
                                                                  __m256i* s) {
    int32_t qa, qs;
    memcpy(&qa, xa, 4);
    memcpy(&qs, xq, 4);
    *a = _mm256_set1_epi32(qa);
    *s = _mm256_set1_epi32(qs);
}

// 8 outputs' quads of a panel row as signed bytes (q: the stored q + 128 with its top bit flipped back).
static inline __attribute__((always_inline)) __m256i signed_weights(const uint8_t* p, __m256i flip) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)p), flip);
}

// y[0:mr, 0:8 nv] (+)= this pass's kc quads of x rows against nv vectors of 8 outputs; vector v lies in panel
// v / 4 (panels `ps` bytes apart), 32 (v % 4) bytes into each 128-byte panel row of `w`. xa, xq: |x| and x
// as bytes (row stride ldx); xs: each row's scale for this pass (row stride lds). nr: outputs to store.
// Inlined with constant mr and nv. prefetch: the first tile to meet this panel slice, which still comes from
// memory: both lines of each of its panels' rows, BPREFETCH quads ahead (past the end: harmless, no fault).
static inline __attribute__((always_inline)) void int8_avx2_tile_rows(
        const uint8_t* xa, const int8_t* xq, int64_t ldx, const float* xs, int64_t lds, const uint8_t* w,
        int64_t ps, int64_t kc, float* y, int64_t ldy, int accumulate, const float* scale, const int mr,
        const int nv, int nr, const int prefetch) {
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256i c[4][TILE_ACC];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) c[i][v] = _mm256_setzero_si256();
    for (int64_t kq = 0; kq < kc; kq++) {
        const uint8_t* row = w + kq * BPANEL * 4;
        if (prefetch)
            for (int p = 0; p < (nv + 3) / 4; p++)
                for (int line = 0; line < 2; line++)
                    _mm_prefetch((const char*)(row + p * ps + BPREFETCH * BPANEL * 4 + line * 64), _MM_HINT_T0);
        if (2 * mr <= nv) {  // x's broadcasts held, a weight vector at a time: 16 ymm registers at most
            __m256i a[2], s[2];
            for (int i = 0; i < mr; i++) broadcast_quads(xa + i * ldx + 4 * kq, xq + i * ldx + 4 * kq, &a[i], &s[i]);
            for (int v = 0; v < nv; v++) {
                const __m256i q = signed_weights(row + (v / 4) * ps + (v % 4) * 32, flip);
                for (int i = 0; i < mr; i++) c[i][v] = _mm256_add_epi32(c[i][v], quad_products(q, a[i], s[i], ones));
            }
        } else {  // the weight vectors held, a row at a time
            __m256i q[2];
            for (int v = 0; v < nv; v++) q[v] = signed_weights(row + v * 32, flip);
            for (int i = 0; i < mr; i++) {
                __m256i a, s;
                broadcast_quads(xa + i * ldx + 4 * kq, xq + i * ldx + 4 * kq, &a, &s);
                for (int v = 0; v < nv; v++) c[i][v] = _mm256_add_epi32(c[i][v], quad_products(q[v], a, s, ones));
            }
        }
    }
    // Unrolled (constant indices): an accumulator indexed at run time would keep the tile in memory.
    #pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const __m256 rs = _mm256_set1_ps(xs[i * lds]);  // the row's scale for this pass
        #pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            if (8 * v < nr)
                store8(y + i * ldy + 8 * v, _mm256_mul_ps(_mm256_cvtepi32_ps(c[i][v]), rs), nr - 8 * v,
                       accumulate, scale ? scale + 8 * v : NULL);
    }
}

#define INT8_AVX2_TILE(rows, vectors, pf) \
    int8_avx2_tile_rows(xa, xq, ldx, xs, lds, w, ps, kc, y, ldy, accumulate, scale, rows, vectors, nr, pf)
#define INT8_AVX2_TILE_CASES(pf)                                  \
    switch (mr * 16 + nv) {                                       \
        case 1 * 16 + 8: INT8_AVX2_TILE(1, 8, pf); return;        \
        case 1 * 16 + 4: INT8_AVX2_TILE(1, 4, pf); return;        \
        case 2 * 16 + 4: INT8_AVX2_TILE(2, 4, pf); return;        \
        case 3 * 16 + 2: INT8_AVX2_TILE(3, 2, pf); return;        \
        default: INT8_AVX2_TILE(4, 2, pf); return;                \
    }

// The tiles above, for (mr, nv) in (1, 8), (1, 4), (2, 4), (3, 2), (4, 2).
static void int8_avx2_tile(const uint8_t* xa, const int8_t* xq, int64_t ldx, const float* xs, int64_t lds,
                           const uint8_t* w, int64_t ps, int64_t kc, float* y, int64_t ldy, int accumulate,
                           const float* scale, int mr, int nv, int nr, int first) {
    if (first)
        INT8_AVX2_TILE_CASES(1)
    INT8_AVX2_TILE_CASES(0)
}

// x [M, K] fp32 as int8 quads xq [M, 4 K4] and their magnitudes xa (K padded with 0 to whole quads), and
// per-pass scales xs [M, passes]. Threads only for prefill sizes (see gemm_int8.c).
static void quantize_rows_int8_avx2(const float* x, int64_t ldx, int64_t M, int64_t K, int8_t* xq, uint8_t* xa,
                                    float* xs) {
    const int64_t K4 = (K + 3) / 4, passes = (K4 + QKC - 1) / QKC;
    #pragma omp parallel for schedule(static) if (M * K >= (1 << 17))
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < passes; b++) {
            const int64_t k0 = 4 * b * QKC, slots = 4 * K4 - k0 < 4 * QKC ? 4 * K4 - k0 : 4 * QKC;
            xs[m * passes + b] = quantize_block_avx2(x + m * ldx + k0, K - k0 < slots ? K - k0 : slots, slots,
                                                     xq + m * 4 * K4 + k0, xa + m * 4 * K4 + k0, NULL);
        }
}

static void linear_packed_int8_avx2_tiles(const int8_t* xq, const uint8_t* xa, const float* xs,
                                          const uint8_t* packed, const float* scale, float* y, int64_t ldy,
                                          int64_t M, int64_t N, int64_t K) {
    const int64_t panels = (N + BPANEL - 1) / BPANEL, K4 = (K + 3) / 4, passes = (K4 + QKC - 1) / QKC;
    const int64_t ps = K4 * BPANEL * 4;  // bytes a panel
    const int64_t group = M == 1 ? ROW_PANELS : 1, groups = (panels + group - 1) / group;
    #pragma omp parallel
    for (int64_t m1 = 0; m1 < M; m1 += BMC) {
        const int64_t m2 = m1 + BMC < M ? m1 + BMC : M;
        #pragma omp for schedule(static) nowait
        for (int64_t g = 0; g < groups; g++) {
            const int64_t p = g * group, n0 = p * BPANEL;
            const int width = (int)(N - n0 < group * BPANEL ? N - n0 : group * BPANEL);  // outputs of the group
            for (int64_t k0 = 0; k0 < K4; k0 += QKC) {
                const int64_t kc = K4 - k0 < QKC ? K4 - k0 : QKC, pass = k0 / QKC;
                const float* last = k0 + kc == K4 ? scale + n0 : NULL;
                const uint8_t* w = packed + p * ps + k0 * BPANEL * 4;
                for (int64_t m0 = m1; m0 < m2;) {
                    const int mr = m2 - m0 < 4 ? (int)(m2 - m0) : 4;
                    const int8_t* xqm = xq + m0 * 4 * K4 + 4 * k0;
                    const uint8_t* xam = xa + m0 * 4 * K4 + 4 * k0;
                    const float* xsm = xs + m0 * passes + pass;
                    float* ym = y + m0 * ldy + n0;
                    if (mr <= 2) {  // a panel (or, for one row, the group's panels) a tile
                        const int nv = mr == 1 && width > BPANEL ? 8 : 4;
                        int8_avx2_tile(xam, xqm, 4 * K4, xsm, passes, w, ps, kc, ym, ldy, k0 > 0, last, mr, nv,
                                       width, m0 == m1);
                    } else {  // half a panel a tile
                        for (int h = 0; h < 2 && width > h * 16; h++)
                            int8_avx2_tile(xam, xqm, 4 * K4, xsm, passes, w + h * 64, ps, kc, ym + h * 16, ldy,
                                           k0 > 0, last ? last + h * 16 : NULL, mr, 2, width - h * 16,
                                           m0 == m1 && h == 0);
                    }
                    m0 += mr;
                }
            }
        }
    }
}

int linear_packed_int8_avx2(const float* x, int64_t ldx, const int8_t* packed, const float* scale, float* y,
                            int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const int64_t K4 = (K + 3) / 4, passes = (K4 + QKC - 1) / QKC;
    int8_t* xq = malloc(M * 4 * K4);
    uint8_t* xa = malloc(M * 4 * K4);
    float* xs = malloc(sizeof(float) * M * passes);
    if (xq == NULL || xa == NULL || xs == NULL) {
        free(xq);
        free(xa);
        free(xs);
        return -2;
    }
    quantize_rows_int8_avx2(x, ldx, M, K, xq, xa, xs);
    linear_packed_int8_avx2_tiles(xq, xa, xs, (const uint8_t*)packed, scale, y, ldy, M, N, K);
    free(xq);
    free(xa);
    free(xs);
    return 0;
}
