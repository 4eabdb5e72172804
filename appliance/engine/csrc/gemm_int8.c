// GEMMs on int8 weights: for few rows (decode) on torch's layout, where torch's kernel reads the weights
// below the memory's rate (AVX2/FMA, few_rows.h); on CPUs with AVX512-VNNI, on weights packed for VPDPBUSD (activations as int8
// per row and 512 k): half the bytes of bf16 and twice its multiplies an instruction (a target attribute
// and a run-time check: the library still runs on AVX2 alone).
#include "cpu_kernels.h"
#include "few_rows.h"
#include "group_panels.h"
#include "vnni_tile.h"

// Eight int8 weights as fp32.
static inline __m256 load8_i8(const char* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

static inline float load1_i8(const char* p) { return (float)*(const int8_t*)p; }

void linear_int8_f32(const float* x, int64_t ldx, const int8_t* q, const float* scale, float* y, int64_t ldy,
                     int64_t M, int64_t N, int64_t K) {
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < (N + 1) / 2; p++)
        few_rows_pair(x, ldx, (const char*)q, 1, load8_i8, load1_i8, scale, y, ldy, M, N, K, p);
}

void pack_weight_int8(const int8_t* q, int64_t N, int64_t K, int8_t* packed) {
    pack_groups((const char*)q, N, K, 1, 0x80808080u, (char*)packed);
}

// ---- The int8 GEMM on CPUs with AVX512-VNNI: int8 weights in panels as the bf16 ones but a k quad (4
// bytes) per output, stored as unsigned bytes (q + 128), an fp32 scale per output. x is quantised to int8
// per row and per K pass (512 k), each block scaled to its largest |x|, and VPDPBUSD multiplies 4 bytes of
// each into int32 sums: 64 products an instruction, twice VDPBF16PS's, with nothing to widen, so a decode
// step reads half bf16's bytes and a prefill runs twice bf16's multiplies. The weights' offset comes off
// once a pass: sum (q + 128) x = sum q x + 128 sum x, the block's sum of x kept beside its scale. A pass's
// sums cannot overflow: 512 products of at most 255 x 127 stay below 2^24. Each pass adds its sums times
// the block's scale into y; the last also multiplies by the outputs' scales.
#define QKC 128  // k quads per pass (512 k): the x block that shares a scale

// A tile's sums for this pass into y; xs and xoff: each row's scale and 128 x (its block's sum) for this
// pass (row stride lds); scale: the outputs' scales on the last pass.
static inline VNNI_UNITS __attribute__((always_inline)) void int8_tile_rows(
        const int8_t* x, int64_t ldx, const float* xs, const int32_t* xoff, int64_t lds, const uint8_t* panel,
        int64_t kc, float* y, int64_t ldy, int accumulate, const float* scale, const int mr, int nr,
        const int prefetch) {
    __m512i c[BMR][2];
    vnni_tile_sums(x, ldx, panel, kc, c, mr, prefetch);
    for (int i = 0; i < mr; i++) {
        const __m512i off = _mm512_set1_epi32(xoff[i * lds]);
        const __m512i t0 = _mm512_sub_epi32(c[i][0], off), t1 = _mm512_sub_epi32(c[i][1], off);
        const __m512 rs = _mm512_set1_ps(xs[i * lds]);  // the row's scale for this pass
        const __m512 s0 = _mm512_mul_ps(_mm512_cvtepi32_ps(t0), rs), s1 = _mm512_mul_ps(_mm512_cvtepi32_ps(t1), rs);
        store_tile_row(y + i * ldy, s0, s1, nr, accumulate, scale);
    }
}

#define INT8_TILE_CASE(rows, pf) \
    case rows: int8_tile_rows(x, ldx, xs, xoff, lds, panel, kc, y, ldy, accumulate, scale, rows, nr, pf); return;
#define INT8_TILE_CASES(pf)                                                                                        \
    switch (mr) {                                                                                                  \
        INT8_TILE_CASE(1, pf) INT8_TILE_CASE(2, pf) INT8_TILE_CASE(3, pf) INT8_TILE_CASE(4, pf)                    \
        INT8_TILE_CASE(5, pf) INT8_TILE_CASE(6, pf) INT8_TILE_CASE(7, pf)                                          \
        default: int8_tile_rows(x, ldx, xs, xoff, lds, panel, kc, y, ldy, accumulate, scale, BMR, nr, pf); return; \
    }

static VNNI_UNITS void int8_tile(const int8_t* x, int64_t ldx, const float* xs, const int32_t* xoff, int64_t lds,
                                 const uint8_t* panel, int64_t kc, float* y, int64_t ldy, int accumulate,
                                 const float* scale, int mr, int nr, int first) {
    if (first)
        INT8_TILE_CASES(1)
    INT8_TILE_CASES(0)
}

// x [M, K] fp32 as int8 quads xq [M, 4 K4] (K padded with 0 to whole quads), per-pass scales xs [M, passes]
// and offsets xoff [M, passes] (128 x the block's sum of xq), a block of QKC quads each. Threads only for
// prefill sizes: a decode step's few rows take microseconds, less than waking the threads.
static VNNI_UNITS void quantize_rows_int8(const float* x, int64_t ldx, int64_t M, int64_t K, int8_t* xq, float* xs,
                                          int32_t* xoff) {
    const int64_t K4 = (K + 3) / 4, passes = (K4 + QKC - 1) / QKC;
    #pragma omp parallel for schedule(static) if (M * K >= (1 << 17))
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < passes; b++) {
            const int64_t k0 = 4 * b * QKC, slots = 4 * K4 - k0 < 4 * QKC ? 4 * K4 - k0 : 4 * QKC;
            int32_t sum;
            xs[m * passes + b] = quantize_block(x + m * ldx + k0, K - k0 < slots ? K - k0 : slots, slots,
                                                xq + m * 4 * K4 + k0, &sum);
            xoff[m * passes + b] = 128 * sum;
        }
}

static VNNI_UNITS void linear_packed_int8_units(const int8_t* xq, const float* xs, const int32_t* xoff,
                                                const uint8_t* packed, const float* scale, float* y, int64_t ldy,
                                                int64_t M, int64_t N, int64_t K) {
    const int64_t panels = (N + BPANEL - 1) / BPANEL, K4 = (K + 3) / 4, passes = (K4 + QKC - 1) / QKC;
    #pragma omp parallel
    for (int64_t m1 = 0; m1 < M; m1 += BMC) {
        const int64_t m2 = m1 + BMC < M ? m1 + BMC : M;
        #pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; p++) {
            const int nr = N - p * BPANEL < BPANEL ? (int)(N - p * BPANEL) : BPANEL;
            for (int64_t k0 = 0; k0 < K4; k0 += QKC) {
                const int64_t kc = K4 - k0 < QKC ? K4 - k0 : QKC, pass = k0 / QKC;
                const float* last = k0 + kc == K4 ? scale + p * BPANEL : NULL;
                for (int64_t m0 = m1; m0 < m2; m0 += BMR)
                    int8_tile(xq + m0 * 4 * K4 + 4 * k0, 4 * K4, xs + m0 * passes + pass, xoff + m0 * passes + pass,
                              passes, packed + (p * K4 + k0) * BPANEL * 4, kc, y + m0 * ldy + p * BPANEL, ldy, k0 > 0,
                              last, m2 - m0 < BMR ? (int)(m2 - m0) : BMR, nr, m0 == m1);
            }
        }
    }
}

int linear_packed_int8(const float* x, int64_t ldx, const int8_t* packed, const float* scale, float* y,
                       int64_t ldy, int64_t M, int64_t N, int64_t K) {
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) return -1;
    const int64_t K4 = (K + 3) / 4, passes = (K4 + QKC - 1) / QKC;
    int8_t* xq = malloc(M * 4 * K4);
    float* xs = malloc(sizeof(float) * M * passes);
    int32_t* xoff = malloc(sizeof(int32_t) * M * passes);
    if (xq == NULL || xs == NULL || xoff == NULL) {
        free(xq);
        free(xs);
        free(xoff);
        return -2;
    }
    quantize_rows_int8(x, ldx, M, K, xq, xs, xoff);
    linear_packed_int8_units(xq, xs, xoff, (const uint8_t*)packed, scale, y, ldy, M, N, K);
    free(xq);
    free(xs);
    free(xoff);
    return 0;
}
