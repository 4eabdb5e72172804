// GEMMs on int8 weights: for few rows (decode) on torch's layout, where torch's kernel reads the weights
// below the memory's rate (AVX2/FMA, few_rows.h); on CPUs with AVX512-VNNI, on weights packed for VPDPBUSD (activations as int8
// per row and 512 k): half the bytes of bf16 and twice its multiplies an instruction (a target attribute
// and a run-time check: the library still runs on AVX2 alone).
#include "cpu_kernels.h"
#include "few_rows.h"
#include "group_panels.h"

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
#define VNNI_UNITS __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define QKC 128  // k quads per pass (512 k): the x block that shares a scale
#define X_LEVELS 127.f

// As bf16_tile_rows, on int8 x quads and unsigned weight quads; xs and xoff: each row's scale and
// 128 x (its block's sum) for this pass (row stride lds); scale: the outputs' scales on the last pass.
static inline VNNI_UNITS __attribute__((always_inline)) void int8_tile_rows(
        const int8_t* x, int64_t ldx, const float* xs, const int32_t* xoff, int64_t lds, const uint8_t* panel,
        int64_t kc, float* y, int64_t ldy, int accumulate, const float* scale, const int mr, int nr,
        const int prefetch) {
    __m512i c[BMR][2], d[2][2];
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
    for (int i = 0; i < mr; i++) {
        const __m512i off = _mm512_set1_epi32(xoff[i * lds]);
        __m512i t0 = _mm512_sub_epi32(c[i][0], off), t1 = _mm512_sub_epi32(c[i][1], off);
        if (mr <= 2) {
            t0 = _mm512_add_epi32(t0, d[i][0]);
            t1 = _mm512_add_epi32(t1, d[i][1]);
        }
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

// One block of a row of x, its n values in `slots` int8 slots (the rest zero): stores them scaled so that
// the largest |x| becomes 127 (rounded to nearest even), puts 128 x their sum in *off and returns the
// block's scale. A NaN makes the scale NaN (the output then is too).
static inline VNNI_UNITS float quantize_block(const float* x, int64_t n, int64_t slots, int8_t* q, int32_t* off) {
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
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = 0; k < slots; k += 16) {
        const __mmask16 in = k >= n ? 0 : n - k >= 16 ? 0xffff : (__mmask16)((1u << (n - k)) - 1);
        const __mmask16 out = slots - k >= 16 ? 0xffff : (__mmask16)((1u << (slots - k)) - 1);
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + k), inv));
        sum = _mm512_add_epi32(sum, v);
        _mm512_mask_cvtsepi32_storeu_epi8(q + k, out, v);
    }
    *off = 128 * _mm512_reduce_add_epi32(sum);
    return largest / X_LEVELS;
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
            xs[m * passes + b] = quantize_block(x + m * ldx + k0, K - k0 < slots ? K - k0 : slots, slots,
                                                xq + m * 4 * K4 + k0, xoff + m * passes + b);
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
