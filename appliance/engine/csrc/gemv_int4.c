// The few-row int4 GEMV on CPUs with AVX512-VNNI (engine/int4.py, decode sizes): a step is bound by reading
// the weights, so torch's packed bytes are multiplied where they lie, a 64-row block at a time, with no
// panels in between. torch's AVX-512 packing holds a block k-major, 32 bytes a k, byte j holding rows j
// (low nibble) and j + 32 (high); two 64-byte loads bring 4 k of the block, a dword permute and a byte
// shuffle turn them into each row's 4 k side by side, and two nibble masks give 4 vectors of 16 rows'
// unsigned quads for VPDPBUSD against x quantised to int8 per row and group (int4_groups.h: the quantiser
// and the group scaling the int4 GEMM uses, so a row's outputs are the same bits on either kernel).
// A block's bytes are read front to back, which the hardware prefetcher follows (software prefetches
// ahead measured slower). A short last block (N not a multiple of 64) is first copied into the 64-row
// layout, rows past N zero.
#include "cpu_kernels.h"
#include "int4_groups.h"

#define GEMV_ROWS 4  // x rows that meet a block's quads at a time: 16 int32 and 16 fp32 accumulators

// The 4 k at s (128 bytes of a 64-row block) as each row's quads: q[0] rows 0-15, q[1] 16-31, q[2] 32-47,
// q[3] 48-63 (a row's 4 k in one 32-bit lane, in row order).
static inline VNNI_UNITS __attribute__((always_inline)) void block_quads(const uint8_t* s, __m512i q[4]) {
    // a = k0 | k1, b = k2 | k3: dword d of a k holds rows 4d..4d+3 (and 32 + those in the high nibbles)
    const __m512i a = _mm512_loadu_si512(s), b = _mm512_loadu_si512(s + 64);
    // 128-bit lane l: dword l (lo: rows 4l..) or 4 + l (hi: rows 16 + 4l..) of k0, k1, k2, k3
    const __m512i lo_idx = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(4));
    // a lane's 4 k x 4 rows transposed to 4 rows x 4 k
    const __m512i transpose = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m512i lo = _mm512_shuffle_epi8(_mm512_permutex2var_epi32(a, lo_idx, b), transpose);
    const __m512i hi = _mm512_shuffle_epi8(_mm512_permutex2var_epi32(a, hi_idx, b), transpose);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    q[0] = _mm512_and_si512(lo, mask);
    q[1] = _mm512_and_si512(hi, mask);
    q[2] = _mm512_and_si512(_mm512_srli_epi16(lo, 4), mask);
    q[3] = _mm512_and_si512(_mm512_srli_epi16(hi, 4), mask);
}

// y rows 0..mr-1, outputs 0..nr-1 of a block = x (xq [G][M][g], xs and xz [G][M], from row 0) times the
// block's weights (`block`: [K][32] bytes in the 64-row layout; `pairs`: its first output's (scale, zero)
// pair of group 0, ldsz elements a group). Inlined with a constant mr, so each row count gets only its
// accumulators.
static inline VNNI_UNITS __attribute__((always_inline)) void gemv_block(
        const int8_t* xq, int64_t M, const float* xs, const float* xz, const uint8_t* block, const char* pairs,
        int64_t ldsz, int bf16, int64_t G, int64_t g, float* y, int64_t ldy, int nr, const int mr) {
    const int64_t es = bf16 ? 2 : 4;
    __m512 acc[GEMV_ROWS][4];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < G; gi++) {
        __m512i c[GEMV_ROWS][4];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < 4; j++) c[i][j] = _mm512_setzero_si512();
        const uint8_t* s = block + gi * g * 32;
        const int8_t* x = xq + gi * M * g;
        for (int64_t kq = 0; kq < g / 4; kq++, s += 128) {
            __m512i q[4];
            block_quads(s, q);
            for (int i = 0; i < mr; i++) {
                const __m512i a = group_broadcast(x + i * g + 4 * kq);
                for (int j = 0; j < 4; j++) c[i][j] = _mm512_dpbusd_epi32(c[i][j], q[j], a);
            }
        }
        for (int j = 0; j < 4; j++) {
            __m512 sv, ov;
            const int n = nr - 16 * j;
            if (n <= 0) break;
            int4_scales16(pairs + (gi * ldsz + 32 * j) * es, bf16, n, &sv, &ov);
            for (int i = 0; i < mr; i++)
                acc[i][j] = int4_group_add(c[i][j], _mm512_set1_ps(xs[gi * M + i]), _mm512_set1_ps(xz[gi * M + i]),
                                           sv, ov, acc[i][j]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < 4; j++) {
            const int n = nr - 16 * j;
            if (n <= 0) break;
            _mm512_mask_storeu_ps(y + i * ldy + 16 * j, n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1), acc[i][j]);
        }
}

#define GEMV_CASE(rows) \
    case rows: gemv_block(xq, M, xs, xz, block, pairs, ldsz, bf16, G, g, y, ldy, nr, rows); break;

static VNNI_UNITS void gemv_rows(const int8_t* xq, int64_t M, const float* xs, const float* xz,
                                 const uint8_t* block, const char* pairs, int64_t ldsz, int bf16, int64_t G,
                                 int64_t g, float* y, int64_t ldy, int nr, int mr) {
    switch (mr) { GEMV_CASE(1) GEMV_CASE(2) GEMV_CASE(3) default: GEMV_CASE(4) }
}

int gemv_int4_vnni(const float* x, int64_t ldx, const uint8_t* packed, int tail_halves,
                   const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy, int64_t M,
                   int64_t N, int64_t K, int64_t g) {
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) return -1;
    const int64_t G = K / g, blocks = (N + 63) / 64, full = N / 64, es = sz_bf16 ? 2 : 4;
    uint8_t* tail = full < blocks ? malloc(K * 32) : NULL;
    int4_x xq;
    if ((tail == NULL && full < blocks) || int4_x_quantize(x, ldx, M, K, g, &xq) != 0) {
        free(tail);
        return -2;
    }
    const int4_source w = {packed, N, K, 64, 1, tail_halves};
    if (tail != NULL) int4_tail_block(&w, full * 64, tail);
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t* block = b < full ? packed + b * 64 * K / 2 : tail;
        const int nr = N - b * 64 < 64 ? (int)(N - b * 64) : 64;
        for (int64_t m = 0; m < M; m += GEMV_ROWS)
            gemv_rows(xq.q + m * g, M, xq.scale + m, xq.sum + m, block,
                      (const char*)scales_and_zeros + 2 * b * 64 * es, ldsz, sz_bf16, G, g, y + m * ldy + b * 64, ldy,
                      nr, M - m < GEMV_ROWS ? (int)(M - m) : GEMV_ROWS);
    }
    int4_x_free(&xq);
    free(tail);
    return 0;
}
