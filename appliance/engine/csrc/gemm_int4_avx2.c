// The int4 GEMM on CPUs with AVX2 and no AVX512-VNNI (engine/int4.py, prefill sizes): as gemm_int4.c on
// VPDPBUSD, a few panels of 32 outputs at a time are unpacked from torch's AVX2 packing (int4_avx2.h) into
// unsigned quads q in 0..15, [K / 4][32][4] bytes, into a thread's own buffer (cache-resident while every
// row of x meets them), and multiplied against x quantised to int8 per row and weight group: VPMADDUBSW
// takes q as its unsigned operand and x as its signed one, no sign trick needed (the int8 GEMM's), and its
// exact int16 pairs add up in int16 over 8 quads before VPMADDWD widens them: two instructions a product
// vector, not the int8 GEMM's four. Each group's int32 sums are scaled into y as int4_avx2.h says, the
// same bits as the AVX2 GEMV and the VNNI kernels give a row.
//
// A tile is TILE_ROWS rows x 2 vectors of 8 outputs (half a panel): 6 int16 and 6 int32 accumulators
// beside the two weight vectors and a broadcast, within AVX2's 16 registers. Blocking as gemm_int4.c: a
// pass of 512 k over a block of 192 rows of x, OpenMP over slabs of panels.
#include "cpu_kernels.h"
#include "int4_avx2.h"
#include "int4_slabs.h"

_Static_assert(BPANEL == BLOCK_ROWS, "a panel is one block of torch's AVX2 packing, unpacked");
#define TILE_ROWS 3
#define TILE_VECTORS 2  // vectors of 8 outputs a tile
#define ROW_BLOCK 192  // rows of x a pass's tiles meet while its panel slice stays in L1
#define PASS_K 512  // k a tile call covers (its groups one after another)

// Panel p (torch's block p) as [K / 4][32][4] unsigned quads in row order, from `block` ([K][16] bytes).
static void unpack_panel(const uint8_t* block, int64_t K, uint8_t* out) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int64_t kq = 0; kq < K / 4; kq++) {
        __m256i lo, hi;
        block_quads(block + kq * 64, &lo, &hi);
        const __m256i r0 = _mm256_permute2x128_si256(lo, hi, 0x20), r1 = _mm256_permute2x128_si256(lo, hi, 0x31);
        uint8_t* row = out + kq * BPANEL * 4;
        _mm256_storeu_si256((__m256i*)row, _mm256_and_si256(r0, mask));  // rows 0-7
        _mm256_storeu_si256((__m256i*)(row + 32), _mm256_and_si256(r1, mask));  // 8-15
        _mm256_storeu_si256((__m256i*)(row + 64), _mm256_and_si256(_mm256_srli_epi16(r0, 4), mask));  // 16-23
        _mm256_storeu_si256((__m256i*)(row + 96), _mm256_and_si256(_mm256_srli_epi16(r1, 4), mask));  // 24-31
    }
}

// `groups` groups of g = 4 kc k of an mr x 16 tile into y: y (+)= each group's part as int4_group_add8 says.
// x (rows g bytes apart) steps M g a group, xs and xz M, s and o (the 16 outputs' scales and offsets) sg,
// the panel (quad rows 128 bytes apart, the tile's 16 outputs first) kc quad rows. Inlined with constant mr.
static inline __attribute__((always_inline)) void int4_avx2_tile_rows(
        const int8_t* x, int64_t M, const float* xs, const float* xz, const uint8_t* panel, int64_t kc,
        int64_t groups, const float* s, const float* o, int64_t sg, float* y, int64_t ldy, int accumulate,
        const int mr) {
    const int64_t g = 4 * kc;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t gi = 0; gi < groups; gi++, x += M * g, xs += M, xz += M, s += sg, o += sg) {
        const uint8_t* w = panel + gi * kc * BPANEL * 4;
        __m256i c[TILE_ROWS][TILE_VECTORS];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < TILE_VECTORS; v++) c[i][v] = _mm256_setzero_si256();
        for (int64_t k0 = 0; k0 < kc; k0 += INT16_QUADS) {
            const int64_t k1 = kc - k0 < INT16_QUADS ? kc : k0 + INT16_QUADS;
            __m256i p[TILE_ROWS][TILE_VECTORS];
            for (int i = 0; i < mr; i++)
                for (int v = 0; v < TILE_VECTORS; v++) p[i][v] = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int64_t kq = k0; kq < k1; kq++) {
                __m256i q[TILE_VECTORS];
                for (int v = 0; v < TILE_VECTORS; v++)
                    q[v] = _mm256_loadu_si256((const __m256i*)(w + kq * BPANEL * 4 + 32 * v));
                for (int i = 0; i < mr; i++) {
                    int32_t quad;
                    memcpy(&quad, x + i * g + 4 * kq, 4);
                    const __m256i a = _mm256_set1_epi32(quad);
                    for (int v = 0; v < TILE_VECTORS; v++)
                        p[i][v] = _mm256_add_epi16(p[i][v], _mm256_maddubs_epi16(q[v], a));
                }
            }
            for (int i = 0; i < mr; i++)
                for (int v = 0; v < TILE_VECTORS; v++)
                    c[i][v] = _mm256_add_epi32(c[i][v], _mm256_madd_epi16(p[i][v], ones));
        }
        for (int i = 0; i < mr; i++) {
            const __m256 rs = _mm256_set1_ps(xs[i]), rz = _mm256_set1_ps(xz[i]);
            for (int v = 0; v < TILE_VECTORS; v++) {
                float* yv = y + i * ldy + 8 * v;
                const __m256 prior = accumulate || gi ? _mm256_loadu_ps(yv) : _mm256_setzero_ps();
                _mm256_storeu_ps(yv, int4_group_add8(c[i][v], rs, rz, _mm256_loadu_ps(s + 8 * v),
                                                     _mm256_loadu_ps(o + 8 * v), prior));
            }
        }
    }
}

static void int4_avx2_tile(const int8_t* x, int64_t M, const float* xs, const float* xz, const uint8_t* panel,
                           int64_t kc, int64_t groups, const float* s, const float* o, int64_t sg, float* y,
                           int64_t ldy, int accumulate, int mr) {
    switch (mr) {
        case 1: int4_avx2_tile_rows(x, M, xs, xz, panel, kc, groups, s, o, sg, y, ldy, accumulate, 1); return;
        case 2: int4_avx2_tile_rows(x, M, xs, xz, panel, kc, groups, s, o, sg, y, ldy, accumulate, 2); return;
        default: int4_avx2_tile_rows(x, M, xs, xz, panel, kc, groups, s, o, sg, y, ldy, accumulate, TILE_ROWS);
    }
}

// The slab's scales and offsets z - 8 s, fp32 [G][INT4_SLAB * 32] (0 past the last output), from the weight's
// [G][ldsz] (scale, zero) pairs of fp32 or bf16; `cols` outputs from `first` (a multiple of 16).
static void slab_scales(const char* sz, int64_t ldsz, int bf16, int64_t G, int64_t first, int64_t cols, float* s,
                        float* o) {
    const int64_t es = bf16 ? 2 : 4;
    for (int64_t gi = 0; gi < G; gi++)
        for (int64_t j = 0; j < INT4_SLAB * BPANEL; j += 8) {
            __m256 sv = _mm256_setzero_ps(), ov = sv;
            if (j < cols) int4_scales8(sz + (gi * ldsz + 2 * (first + j)) * es, bf16, &sv, &ov);
            _mm256_storeu_ps(s + gi * INT4_SLAB * BPANEL + j, sv);
            _mm256_storeu_ps(o + gi * INT4_SLAB * BPANEL + j, ov);
        }
}

// y [M, N] = x Wᵀ from x quantised (int4_x) and the blocks of W (`tail`: the last block in a full one's
// layout where N is not a multiple of 32, else NULL); `scratch`: int4_slabs.h's, a share a thread.
static void linear_int4_avx2_slabs(const int4_x* xq, const uint8_t* packed, const uint8_t* tail, const char* sz,
                                   int64_t ldsz, int sz_bf16, int64_t g, float* y, int64_t ldy, int64_t M,
                                   int64_t N, int64_t K, char* scratch) {
    const int64_t G = K / g, panels = (N + BPANEL - 1) / BPANEL, full = N / BPANEL;
    const int64_t slabs = (panels + INT4_SLAB - 1) / INT4_SLAB, panel_bytes = K * BPANEL, pass_groups = PASS_K / g;
    #pragma omp parallel
    {
        const int4_slab own = int4_thread_slab(scratch, K, G);
        uint8_t* wq = own.panels;
        float *s = own.scale, *o = own.offset;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t slab = 0; slab < slabs; slab++) {
            const int64_t p0 = slab * INT4_SLAB, np = panels - p0 < INT4_SLAB ? panels - p0 : INT4_SLAB;
            for (int64_t q = 0; q < np; q++)
                unpack_panel(p0 + q < full ? packed + (p0 + q) * BPANEL * K / 2 : tail, K, wq + q * panel_bytes);
            slab_scales(sz, ldsz, sz_bf16, G, p0 * BPANEL, N - p0 * BPANEL, s, o);
            for (int64_t m1 = 0; m1 < M; m1 += ROW_BLOCK) {
                const int64_t m2 = m1 + ROW_BLOCK < M ? m1 + ROW_BLOCK : M;
                for (int64_t q = 0; q < np; q++) {
                    const int64_t n0 = (p0 + q) * BPANEL;
                    for (int64_t h = 0; h < 2 && n0 + 16 * h < N; h++)  // N is a multiple of 16
                        for (int64_t g0 = 0; g0 < G; g0 += pass_groups) {
                            const int64_t groups = G - g0 < pass_groups ? G - g0 : pass_groups;
                            const int64_t so = g0 * INT4_SLAB * BPANEL + q * BPANEL + 16 * h;
                            for (int64_t m0 = m1; m0 < m2; m0 += TILE_ROWS)
                                int4_avx2_tile(xq->q + (g0 * M + m0) * g, M, xq->scale + g0 * M + m0,
                                               xq->sum + g0 * M + m0, wq + q * panel_bytes + g0 * g * BPANEL + 64 * h,
                                               g / 4, groups, s + so, o + so, INT4_SLAB * BPANEL,
                                               y + m0 * ldy + n0 + 16 * h, ldy, g0 > 0,
                                               m2 - m0 < TILE_ROWS ? (int)(m2 - m0) : TILE_ROWS);
                        }
                }
            }
        }
    }
}

int linear_int4_avx2(const float* x, int64_t ldx, const uint8_t* packed, int tail_halves,
                     const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy, int64_t M,
                     int64_t N, int64_t K, int64_t g) {
    const int64_t G = K / g, threads = omp_get_max_threads(), full = N / BPANEL;
    char* scratch = malloc(threads * int4_slab_bytes(K, G));
    uint8_t* tail = full * BPANEL < N ? malloc(K * BPANEL / 2) : NULL;
    int4_x xq;
    if (scratch == NULL || (tail == NULL && full * BPANEL < N) || int4_x_quantize_avx2(x, ldx, M, K, g, &xq) != 0) {
        free(scratch);
        free(tail);
        return -2;
    }
    if (tail != NULL) {
        const int4_source w = {packed, N, K, BLOCK_ROWS, 1, tail_halves};
        int4_tail_block(&w, full * BPANEL, tail);
    }
    linear_int4_avx2_slabs(&xq, packed, tail, (const char*)scales_and_zeros, ldsz, sz_bf16, g, y, ldy, M, N, K,
                           scratch);
    int4_x_free(&xq);
    free(scratch);
    free(tail);
    return 0;
}
