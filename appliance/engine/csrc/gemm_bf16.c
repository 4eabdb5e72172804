// GEMMs on bf16 weights: for few rows (decode) on torch's layout, where torch emulates bf16 on CPUs
// without bf16 units (AVX2/FMA, few_rows.h; VDPBF16PS where the CPU has AVX512-BF16); on CPUs with
// AVX512-BF16, on weights prepacked for VDPBF16PS: oneDNN streams a decode step's weights well below the
// memory bandwidth, which bounds a decode step; this kernel streams them faster and keeps up at prefill
// sizes (figures: docs/benchmarks.md; a target attribute and a run-time check: the library still runs on
// AVX2 alone).
#include "cpu_kernels.h"
#include "few_rows.h"
#include "group_panels.h"

static inline float load1_bf16(const char* p) {
    uint32_t bits = (uint32_t)(*(const uint16_t*)p) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// ---- The bf16-weight GEMM on CPUs with AVX512-BF16: VDPBF16PS multiplies 32 bf16 pairs into 16 fp32 sums
// per instruction, so neither operand is widened. Compiled for that unit alone (a target attribute) and
// chosen at run time; x rows are rounded to bf16 first (exact for a bf16 engine's activations).
#define BF16_UNITS __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// y[i][0], y[i][ldy_n] = the dot products of bf16 rows xb[0..mr-1] (row stride K) with weight rows w0,
// w1, 32 k a pass; the K % 32 tail in fp32. Inlined with a constant mr, as few_rows_tile.
static inline BF16_UNITS __attribute__((always_inline)) void dp_tile(const uint16_t* xb, const uint16_t* w0,
        const uint16_t* w1, int64_t K, float* y, int64_t ldy, int64_t ldy_n, const int mr) {
    __m512 c[FEW_MR][2];
    for (int i = 0; i < FEW_MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh a = (__m512bh)_mm512_loadu_si512(w0 + k), b = (__m512bh)_mm512_loadu_si512(w1 + k);
        for (int i = 0; i < mr; i++) {
            __m512bh xi = (__m512bh)_mm512_loadu_si512(xb + i * K + k);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], xi, a);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], xi, b);
        }
    }
    for (int i = 0; i < mr; i++) {
        float d0 = _mm512_reduce_add_ps(c[i][0]), d1 = _mm512_reduce_add_ps(c[i][1]);
        for (int64_t t = k; t < K; t++) {
            float xv = bf16_to_f32(xb[i * K + t]);
            d0 += xv * bf16_to_f32(w0[t]);
            d1 += xv * bf16_to_f32(w1[t]);
        }
        y[i * ldy + ldy_n] = d1;
        y[i * ldy] = d0;
    }
}

// x [M, K] fp32 rounded to bf16 (nearest even) into xb [M, K].
static BF16_UNITS void round_rows_bf16(const float* x, int64_t ldx, int64_t M, int64_t K, uint16_t* xb) {
    for (int64_t m = 0; m < M; m++) {
        const float* row = x + m * ldx;
        uint16_t* out = xb + m * K;
        int64_t k = 0;
        for (; k + 16 <= K; k += 16)
            _mm256_storeu_si256((__m256i*)(out + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row + k)));
        for (; k < K; k++) {
            uint32_t bits;
            memcpy(&bits, row + k, sizeof bits);
            out[k] = (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // nearest even (finite values)
        }
    }
}

// Returns -1 (nothing written) if the bf16 copy of x cannot be allocated.
static BF16_UNITS int linear_bf16w_dp(const float* x, int64_t ldx, const uint16_t* w, float* y, int64_t ldy,
                                      int64_t M, int64_t N, int64_t K) {
    uint16_t* xb = malloc(sizeof(uint16_t) * M * K);
    if (xb == NULL) return -1;
    round_rows_bf16(x, ldx, M, K, xb);
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < (N + 1) / 2; p++) {
        const int64_t n = 2 * p, two = n + 1 < N;
        const uint16_t *w0 = w + n * K, *w1 = two ? w0 + K : w0;
        for (int64_t m = 0; m < M; m += FEW_MR) {
            const uint16_t* xm = xb + m * K;
            float* ym = y + m * ldy + n;
            switch (M - m < FEW_MR ? M - m : FEW_MR) {
                case 1: dp_tile(xm, w0, w1, K, ym, ldy, two, 1); break;
                case 2: dp_tile(xm, w0, w1, K, ym, ldy, two, 2); break;
                case 3: dp_tile(xm, w0, w1, K, ym, ldy, two, 3); break;
                default: dp_tile(xm, w0, w1, K, ym, ldy, two, 4); break;
            }
        }
    }
    free(xb);
    return 0;
}

void linear_bf16w_f32(const float* x, int64_t ldx, const uint16_t* w, float* y, int64_t ldy, int64_t M, int64_t N,
                      int64_t K, int bf16_units) {
    if (bf16_units && __builtin_cpu_supports("avx512bf16") && linear_bf16w_dp(x, ldx, w, y, ldy, M, N, K) == 0)
        return;
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < (N + 1) / 2; p++)
        few_rows_pair(x, ldx, (const char*)w, 2, load8_bf16, load1_bf16, NULL, y, ldy, M, N, K, p);
}

// ---- The packed bf16 GEMM on CPUs with AVX512-BF16: y = x W^T with W repacked once into panels of 32
// outputs whose k pairs lie side by side, [ceil(N/32)][ceil(K/2)][32][2], so that one VDPBF16PS takes
// a broadcast x pair against 16 outputs' pairs and its sums are the outputs themselves (no horizontal
// sums). An 8x32 register tile (16 accumulators) meets each 128-byte panel row; blocking as the fp32
// GEMM (gemm_f32.c). x comes as bf16 pairs (a bf16 engine's activations, no rounding).
#define BKC 256  // k pairs per pass: a 32 KB panel slice stays in L1 while it meets every row of the x block

void pack_weight_bf16(const uint16_t* w, int64_t N, int64_t K, uint16_t* packed) {
    pack_groups((const char*)w, N, K, 2, 0, (char*)packed);
}

static inline BF16_UNITS __m512bh pair_broadcast(const uint16_t* p) { return (__m512bh)group_broadcast(p); }

// y[0:mr, 0:nr] (+)= x[0:mr, 0:2kc] . panel[0:kc]. Inlined with a constant mr (see bf16_tile). One or two
// rows make 2 or 4 dependency chains, too few to hide VDPBF16PS's latency: they take two k pairs a pass
// into a second set of accumulators (d).
static inline BF16_UNITS __attribute__((always_inline)) void bf16_tile_rows(
        const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t kc, float* y, int64_t ldy, int accumulate,
        const int mr, int nr, const int prefetch) {
    __m512 c[BMR][2], d[2][2];
    for (int i = 0; i < BMR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    d[0][0] = d[0][1] = d[1][0] = d[1][1] = _mm512_setzero_ps();
    int64_t kp = 0;
    if (mr <= 2)
        for (; kp + 2 <= kc; kp += 2) {
            const uint16_t* row = panel + kp * BPANEL * 2;
            if (prefetch)
                for (int line = 0; line < 4; line++)
                    _mm_prefetch((const char*)(row + BPREFETCH * BPANEL * 2 + line * 32), _MM_HINT_T0);
            __m512bh u0 = (__m512bh)_mm512_loadu_si512(row), u1 = (__m512bh)_mm512_loadu_si512(row + 32);
            __m512bh v0 = (__m512bh)_mm512_loadu_si512(row + 64), v1 = (__m512bh)_mm512_loadu_si512(row + 96);
            for (int i = 0; i < mr; i++) {
                __m512bh a = pair_broadcast(x + i * ldx + 2 * kp), b = pair_broadcast(x + i * ldx + 2 * kp + 2);
                c[i][0] = _mm512_dpbf16_ps(c[i][0], a, u0);
                c[i][1] = _mm512_dpbf16_ps(c[i][1], a, u1);
                d[i][0] = _mm512_dpbf16_ps(d[i][0], b, v0);
                d[i][1] = _mm512_dpbf16_ps(d[i][1], b, v1);
            }
        }
    for (; kp < kc; kp++) {
        const uint16_t* row = panel + kp * BPANEL * 2;
        if (prefetch)
            for (int line = 0; line < 2; line++)
                _mm_prefetch((const char*)(row + BPREFETCH * BPANEL * 2 + line * 32), _MM_HINT_T0);
        __m512bh u0 = (__m512bh)_mm512_loadu_si512(row), u1 = (__m512bh)_mm512_loadu_si512(row + 32);
        for (int i = 0; i < mr; i++) {
            __m512bh a = pair_broadcast(x + i * ldx + 2 * kp);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], a, u0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], a, u1);
        }
    }
    for (int i = 0; i < mr; i++) {
        __m512 s0 = c[i][0], s1 = c[i][1];
        if (mr <= 2) {
            s0 = _mm512_add_ps(s0, d[i][0]);
            s1 = _mm512_add_ps(s1, d[i][1]);
        }
        store_tile_row(y + i * ldy, s0, s1, nr, accumulate, NULL);
    }
}

#define BF16_TILE_CASE(rows, pf) \
    case rows: bf16_tile_rows(x, ldx, panel, kc, y, ldy, accumulate, rows, nr, pf); return;
#define BF16_TILE_CASES(pf)                                                                              \
    switch (mr) {                                                                                        \
        BF16_TILE_CASE(1, pf) BF16_TILE_CASE(2, pf) BF16_TILE_CASE(3, pf) BF16_TILE_CASE(4, pf)          \
        BF16_TILE_CASE(5, pf) BF16_TILE_CASE(6, pf) BF16_TILE_CASE(7, pf)                                \
        default: bf16_tile_rows(x, ldx, panel, kc, y, ldy, accumulate, BMR, nr, pf); return;             \
    }

static BF16_UNITS void bf16_tile(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t kc, float* y,
                                 int64_t ldy, int accumulate, int mr, int nr, int first) {
    if (first)
        BF16_TILE_CASES(1)
    BF16_TILE_CASES(0)
}

static BF16_UNITS void linear_packed_bf16_units(const uint16_t* x, int64_t ldx, const uint16_t* packed, float* y,
                                                int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const int64_t panels = (N + BPANEL - 1) / BPANEL, K2 = (K + 1) / 2;
    #pragma omp parallel
    for (int64_t m1 = 0; m1 < M; m1 += BMC) {
        const int64_t m2 = m1 + BMC < M ? m1 + BMC : M;
        #pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; p++) {
            const int nr = N - p * BPANEL < BPANEL ? (int)(N - p * BPANEL) : BPANEL;
            for (int64_t k0 = 0; k0 < K2; k0 += BKC) {
                const int64_t kc = K2 - k0 < BKC ? K2 - k0 : BKC;
                for (int64_t m0 = m1; m0 < m2; m0 += BMR)
                    bf16_tile(x + m0 * ldx + 2 * k0, ldx, packed + (p * K2 + k0) * BPANEL * 2, kc,
                              y + m0 * ldy + p * BPANEL, ldy, k0 > 0, m2 - m0 < BMR ? (int)(m2 - m0) : BMR, nr,
                              m0 == m1);
            }
        }
    }
}

int linear_packed_bf16(const uint16_t* x, int64_t ldx, const uint16_t* packed, float* y, int64_t ldy, int64_t M,
                       int64_t N, int64_t K) {
    if (!__builtin_cpu_supports("avx512bf16")) return -1;
    linear_packed_bf16_units(x, ldx, packed, y, ldy, M, N, K);
    return 0;
}
