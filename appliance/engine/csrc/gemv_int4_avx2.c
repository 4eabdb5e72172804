// The few-row int4 GEMV on CPUs with AVX2 and no AVX512-VNNI (engine/int4.py, decode sizes): as gemv_int4.c
// on VPDPBUSD, torch's packed bytes are multiplied where they lie, here in its AVX2 packing: 32-row blocks,
// k-major, 16 bytes a k, byte j holding rows j (low nibble) and j + 16 (high). Two 32-byte loads bring 4 k
// of a block; four unpacks and four 128-bit lane moves put each row's 4 k side by side in a 32-bit lane
// (lo: rows 0-3 | 8-11, hi: rows 4-7 | 12-15), and two nibble masks give 4 vectors of 8 rows' unsigned
// quads. VPMADDUBSW multiplies them by x's signed quads (x quantised to int8 per row and group as the
// VNNI kernels do) into exact int16 pairs (at most 2 x 15 x 128 = 3840), summed in int16 over up to 8 quads
// (30720 < 32767) before VPMADDWD widens them into int32. A group's int32 sums are put back in row order
// and scaled as int4_groups.h's int4_group_add does (the same operations: the same bits as the VNNI GEMV).
// 16 ymm registers hold 2 rows' int16 sums (8), the quads' two halves, a nibble and the x broadcasts: x rows
// meet a block 2 at a time. A short last block (16 rows) is first copied into the 32-row layout.
#include "cpu_kernels.h"
#include "int4_avx2.h"

#define GEMV_ROWS 2  // x rows that meet a block's quads at a time

// The int32 sums c (lanes in block_quads' order: c[0] rows 0-3 | 8-11, c[1] 4-7 | 12-15, c[2] and c[3]
// the same + 16) in row order: 8 rows a vector.
static inline __attribute__((always_inline)) void rows_in_order(__m256i c[4]) {
    const __m256i r0 = _mm256_permute2x128_si256(c[0], c[1], 0x20), r1 = _mm256_permute2x128_si256(c[0], c[1], 0x31);
    const __m256i r2 = _mm256_permute2x128_si256(c[2], c[3], 0x20), r3 = _mm256_permute2x128_si256(c[2], c[3], 0x31);
    c[0] = r0;
    c[1] = r1;
    c[2] = r2;
    c[3] = r3;
}

// y rows 0..mr-1, outputs 0..nr-1 (16 or 32) of a block = x (xq [G][M][g], xs and xz [G][M], from row 0)
// times the block's weights (`block`: [K][16] bytes in the 32-row layout; `pairs`: its first output's
// (scale, zero) pair of group 0, ldsz elements a group). Inlined with a constant mr.
static inline __attribute__((always_inline)) void gemv_block(
        const int8_t* xq, int64_t M, const float* xs, const float* xz, const uint8_t* block, const char* pairs,
        int64_t ldsz, int bf16, int64_t G, int64_t g, float* y, int64_t ldy, int nr, const int mr) {
    const int64_t es = bf16 ? 2 : 4;
    const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[GEMV_ROWS][4];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t gi = 0; gi < G; gi++) {
        __m256i c[GEMV_ROWS][4];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < 4; j++) c[i][j] = _mm256_setzero_si256();
        const uint8_t* s = block + gi * g * 16;
        const int8_t* x = xq + gi * M * g;
        for (int64_t k0 = 0; k0 < g / 4; k0 += INT16_QUADS) {
            const int64_t k1 = g / 4 - k0 < INT16_QUADS ? g / 4 : k0 + INT16_QUADS;
            __m256i p[GEMV_ROWS][4];
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < 4; j++) p[i][j] = _mm256_setzero_si256();
            for (int64_t kq = k0; kq < k1; kq++, s += 64) {
                __m256i lo, hi;
                block_quads(s, &lo, &hi);
                __m256i a[GEMV_ROWS];
                for (int i = 0; i < mr; i++) {
                    int32_t quad;
                    memcpy(&quad, x + i * g + 4 * kq, 4);
                    a[i] = _mm256_set1_epi32(quad);
                }
                for (int j = 0; j < 4; j++) {
                    const __m256i half = j % 2 ? hi : lo;
                    const __m256i q = _mm256_and_si256(j < 2 ? half : _mm256_srli_epi16(half, 4), mask);
                    for (int i = 0; i < mr; i++) p[i][j] = _mm256_add_epi16(p[i][j], _mm256_maddubs_epi16(q, a[i]));
                }
            }
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < 4; j++) c[i][j] = _mm256_add_epi32(c[i][j], _mm256_madd_epi16(p[i][j], ones));
        }
        for (int i = 0; i < mr; i++) rows_in_order(c[i]);
        for (int j = 0; j < nr / 8; j++) {
            __m256 sv, ov;
            int4_scales8(pairs + (gi * ldsz + 16 * j) * es, bf16, &sv, &ov);
            for (int i = 0; i < mr; i++) {
                const __m256 rs = _mm256_set1_ps(xs[gi * M + i]), rz = _mm256_set1_ps(xz[gi * M + i]);
                acc[i][j] = int4_group_add8(c[i][j], rs, rz, sv, ov, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr / 8; j++) _mm256_storeu_ps(y + i * ldy + 8 * j, acc[i][j]);
}

static void gemv_rows(const int8_t* xq, int64_t M, const float* xs, const float* xz, const uint8_t* block,
                      const char* pairs, int64_t ldsz, int bf16, int64_t G, int64_t g, float* y, int64_t ldy,
                      int nr, int mr) {
    if (mr == 1)
        gemv_block(xq, M, xs, xz, block, pairs, ldsz, bf16, G, g, y, ldy, nr, 1);
    else
        gemv_block(xq, M, xs, xz, block, pairs, ldsz, bf16, G, g, y, ldy, nr, 2);
}

int gemv_int4_avx2(const float* x, int64_t ldx, const uint8_t* packed, int tail_halves,
                   const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy, int64_t M,
                   int64_t N, int64_t K, int64_t g) {
    const int64_t G = K / g, blocks = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, full = N / BLOCK_ROWS, es = sz_bf16 ? 2 : 4;
    uint8_t* tail = full < blocks ? malloc(K * BLOCK_ROWS / 2) : NULL;
    int4_x xq;
    if ((tail == NULL && full < blocks) || int4_x_quantize_avx2(x, ldx, M, K, g, &xq) != 0) {
        free(tail);
        return -2;
    }
    const int4_source w = {packed, N, K, BLOCK_ROWS, 1, tail_halves};
    if (tail != NULL) int4_tail_block(&w, full * BLOCK_ROWS, tail);
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t* block = b < full ? packed + b * BLOCK_ROWS * K / 2 : tail;
        const int nr = N - b * BLOCK_ROWS < BLOCK_ROWS ? (int)(N - b * BLOCK_ROWS) : BLOCK_ROWS;
        for (int64_t m = 0; m < M; m += GEMV_ROWS)
            gemv_rows(xq.q + m * g, M, xq.scale + m, xq.sum + m, block,
                      (const char*)scales_and_zeros + 2 * b * BLOCK_ROWS * es, ldsz, sz_bf16, G, g,
                      y + m * ldy + b * BLOCK_ROWS, ldy, nr, M - m < GEMV_ROWS ? (int)(M - m) : GEMV_ROWS);
    }
    int4_x_free(&xq);
    free(tail);
    return 0;
}
