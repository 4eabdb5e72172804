// The int4 GEMM on CPUs with AVX512-VNNI (engine/int4.py, prefill sizes): int4 weights in torch's packed
// layout unpacked, a few panels at a time, into the int8 GEMM's panels (group_panels.h) as unsigned quads
// q in 0..15, and multiplied by VPDPBUSD (vnni_tile.h) against x quantised to int8 per row and weight
// group, each group's sums scaled into y as int4_groups.h says. A group's sums cannot overflow: 128
// products of at most 15 x 127. The int4 bytes are read once a call and unpacked into a thread's own
// panels (a few hundred KB, cache-resident while every row meets them), so the multiplies, not the
// unpacking, are the cost: twice bf16's products an instruction, as the int8 GEMM.
#include "cpu_kernels.h"
#include "int4_groups.h"
#include "int4_slabs.h"

_Static_assert(BPANEL == 32, "the unpacking writes panels of 32 outputs (a 256-bit vector of nibbles a k)");

#define PASS_K 512  // k a tile call covers (its groups one after another), as the int8 GEMM's pass
#define PASS_GROUPS(g) (PASS_K / (g))

// Four k of 32 rows (row-ordered nibble bytes) as 32 unsigned quads, a panel row.
static inline void store_quads(__m256i r0, __m256i r1, __m256i r2, __m256i r3, uint8_t* out) {
    const __m256i lo01 = _mm256_unpacklo_epi8(r0, r1), hi01 = _mm256_unpackhi_epi8(r0, r1);
    const __m256i lo23 = _mm256_unpacklo_epi8(r2, r3), hi23 = _mm256_unpackhi_epi8(r2, r3);
    // each lane's rows 0-3, 4-7, 8-11, 12-15 (lane 1: 16 rows on), 4 bytes a row
    const __m256i a = _mm256_unpacklo_epi16(lo01, lo23), b = _mm256_unpackhi_epi16(lo01, lo23);
    const __m256i c = _mm256_unpacklo_epi16(hi01, hi23), d = _mm256_unpackhi_epi16(hi01, hi23);
    _mm256_storeu_si256((__m256i*)out, _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256((__m256i*)(out + 32), _mm256_permute2x128_si256(c, d, 0x20));
    _mm256_storeu_si256((__m256i*)(out + 64), _mm256_permute2x128_si256(a, b, 0x31));
    _mm256_storeu_si256((__m256i*)(out + 96), _mm256_permute2x128_si256(c, d, 0x31));
}

// Panel p (weight rows 32p ..) in the panel layout: [K / 4][32][4] quads. A panel inside a full 64-row
// block whose bytes hold rows j and j + 32 (torch's AVX-512 packing) is one nibble of 32 bytes a k, 4 k
// (128 bytes) in a row; any other (a short last block, other packings) is read nibble by nibble.
static void unpack_panel(const int4_source* w, int64_t p, uint8_t* out) {
    const int64_t first = p * BPANEL, K4 = w->K / 4;
    const int64_t start = first / 64 * 64;
    if (w->block_rows == 64 && w->halves && start + 64 <= w->N) {
        const uint8_t* src = w->packed + start * w->K / 2;
        const __m256i mask = _mm256_set1_epi8(0x0F);
        const int shift = first == start ? 0 : 4;
        for (int64_t kq = 0; kq < K4; kq++) {
            const uint8_t* s = src + kq * 4 * 32;
            __m256i r[4];
            for (int t = 0; t < 4; t++)
                r[t] = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i*)(s + 32 * t)), shift),
                                        mask);
            store_quads(r[0], r[1], r[2], r[3], out + kq * BPANEL * 4);
        }
        return;
    }
    for (int64_t kq = 0; kq < K4; kq++)
        for (int j = 0; j < BPANEL; j++)
            for (int t = 0; t < 4; t++) out[(kq * BPANEL + j) * 4 + t] = nibble_at(w, first + j, 4 * kq + t);
}

// `groups` passes of an mr x 32 tile into y, one a group of g = 4 kc k: y (+)= rs (sums s) + rz o per
// output, rs and rz each row's x scale and x scale times sum for the group, s and o the outputs' scales
// and offsets. x (rows g bytes apart) steps M g a group, xs and xz M, s and o sg, the panel kc quad rows.
// One call covers PASS_K k: a call a group would cost as much again as the group's products.
static inline VNNI_UNITS __attribute__((always_inline)) void int4_tile_rows(
        const int8_t* x, int64_t M, const float* xs, const float* xz, const uint8_t* panel, int64_t kc,
        int64_t groups, const float* s, const float* o, int64_t sg, float* y, int64_t ldy, int accumulate,
        const int mr, int nr, const int prefetch) {
    const int64_t g = 4 * kc;
    const __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1),
                    m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    for (int64_t gi = 0; gi < groups; gi++, x += M * g, xs += M, xz += M, s += sg, o += sg) {
        __m512i c[BMR][2];
        vnni_tile_sums(x, g, panel + gi * kc * BPANEL * 4, kc, c, mr, prefetch);
        const __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16);
        const __m512 o0 = _mm512_loadu_ps(o), o1 = _mm512_loadu_ps(o + 16);
        for (int i = 0; i < mr; i++) {
            float* yr = y + i * ldy;
            const __m512 rs = _mm512_set1_ps(xs[i]), rz = _mm512_set1_ps(xz[i]);
            __m512 y0 = accumulate || gi ? _mm512_maskz_loadu_ps(m0, yr) : _mm512_setzero_ps();
            __m512 y1 = accumulate || gi ? _mm512_maskz_loadu_ps(m1, yr + 16) : _mm512_setzero_ps();
            y0 = int4_group_add(c[i][0], rs, rz, s0, o0, y0);
            y1 = int4_group_add(c[i][1], rs, rz, s1, o1, y1);
            _mm512_mask_storeu_ps(yr, m0, y0);
            _mm512_mask_storeu_ps(yr + 16, m1, y1);
        }
    }
}

#define INT4_TILE_CASE(rows, pf) \
    case rows: int4_tile_rows(x, M, xs, xz, panel, kc, groups, s, o, sg, y, ldy, accumulate, rows, nr, pf); return;
#define INT4_TILE_CASES(pf)                                                                                   \
    switch (mr) {                                                                                             \
        INT4_TILE_CASE(1, pf) INT4_TILE_CASE(2, pf) INT4_TILE_CASE(3, pf) INT4_TILE_CASE(4, pf)               \
        INT4_TILE_CASE(5, pf) INT4_TILE_CASE(6, pf) INT4_TILE_CASE(7, pf)                                     \
        default: int4_tile_rows(x, M, xs, xz, panel, kc, groups, s, o, sg, y, ldy, accumulate, BMR, nr, pf); \
            return;                                                                                           \
    }

static VNNI_UNITS void int4_tile(const int8_t* x, int64_t M, const float* xs, const float* xz,
                                 const uint8_t* panel, int64_t kc, int64_t groups, const float* s, const float* o,
                                 int64_t sg, float* y, int64_t ldy, int accumulate, int mr, int nr, int first) {
    if (first)
        INT4_TILE_CASES(1)
    INT4_TILE_CASES(0)
}

// The slab's scales and offsets z - 8 s, fp32 [G][INT4_SLAB * 32] (0 past the last output), from the weight's
// [G][ldsz] (scale, zero) pairs of fp32 or bf16.
static VNNI_UNITS void slab_scales(const void* sz, int64_t ldsz, int bf16, int64_t G, int64_t first, int64_t cols,
                                   float* s, float* o) {
    const int64_t es = bf16 ? 2 : 4;
    for (int64_t gi = 0; gi < G; gi++)
        for (int64_t j = 0; j < INT4_SLAB * BPANEL; j += 16) {
            __m512 sv = _mm512_setzero_ps(), ov = sv;
            if (j < cols)
                int4_scales16((const char*)sz + (gi * ldsz + 2 * (first + j)) * es, bf16,
                              cols - j < 16 ? (int)(cols - j) : 16, &sv, &ov);
            _mm512_storeu_ps(s + gi * INT4_SLAB * BPANEL + j, sv);
            _mm512_storeu_ps(o + gi * INT4_SLAB * BPANEL + j, ov);
        }
}

static VNNI_UNITS void linear_int4_units(const int8_t* xq, const float* xs, const float* xz, const int4_source* w,
                                         const void* sz, int64_t ldsz, int sz_bf16, int64_t g, float* y, int64_t ldy,
                                         int64_t M, char* scratch) {
    const int64_t N = w->N, K = w->K, G = K / g, panels = (N + BPANEL - 1) / BPANEL;
    const int64_t slabs = (panels + INT4_SLAB - 1) / INT4_SLAB, panel_bytes = K * BPANEL;
    #pragma omp parallel
    {
        const int4_slab own = int4_thread_slab(scratch, K, G);
        uint8_t* wq = own.panels;
        float *s = own.scale, *o = own.offset;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t slab = 0; slab < slabs; slab++) {
            const int64_t p0 = slab * INT4_SLAB, np = panels - p0 < INT4_SLAB ? panels - p0 : INT4_SLAB;
            for (int64_t q = 0; q < np; q++) unpack_panel(w, p0 + q, wq + q * panel_bytes);
            slab_scales(sz, ldsz, sz_bf16, G, p0 * BPANEL, N - p0 * BPANEL, s, o);
            for (int64_t m1 = 0; m1 < M; m1 += BMC) {
                const int64_t m2 = m1 + BMC < M ? m1 + BMC : M;
                for (int64_t q = 0; q < np; q++) {
                    const int64_t p = p0 + q;
                    const int nr = N - p * BPANEL < BPANEL ? (int)(N - p * BPANEL) : BPANEL;
                    for (int64_t g0 = 0; g0 < G; g0 += PASS_GROUPS(g)) {
                        const int64_t groups = G - g0 < PASS_GROUPS(g) ? G - g0 : PASS_GROUPS(g);
                        for (int64_t m0 = m1; m0 < m2; m0 += BMR)
                            int4_tile(xq + (g0 * M + m0) * g, M, xs + g0 * M + m0, xz + g0 * M + m0,
                                      wq + q * panel_bytes + g0 * g / 4 * BPANEL * 4, g / 4, groups,
                                      s + (g0 * INT4_SLAB + q) * BPANEL, o + (g0 * INT4_SLAB + q) * BPANEL,
                                      INT4_SLAB * BPANEL, y + m0 * ldy + p * BPANEL, ldy, g0 > 0,
                                      m2 - m0 < BMR ? (int)(m2 - m0) : BMR, nr, m0 == m1);
                    }
                }
            }
        }
    }
}

int linear_int4_vnni(const float* x, int64_t ldx, const uint8_t* packed, int64_t block_rows, int halves,
                     int tail_halves, const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy,
                     int64_t M, int64_t N, int64_t K, int64_t g) {
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) return -1;
    const int64_t G = K / g, threads = omp_get_max_threads();
    char* scratch = malloc(threads * int4_slab_bytes(K, G));
    int4_x xq;
    if (scratch == NULL || int4_x_quantize(x, ldx, M, K, g, &xq) != 0) {
        free(scratch);
        return -2;
    }
    const int4_source w = {packed, N, K, block_rows, halves, tail_halves};
    linear_int4_units(xq.q, xq.scale, xq.sum, &w, scales_and_zeros, ldsz, sz_bf16, g, y, ldy, M, scratch);
    int4_x_free(&xq);
    free(scratch);
    return 0;
}
