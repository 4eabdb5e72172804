// AVX2/FMA kernels for fp32 LLM inference on CPU, where torch's CPU build is slow:
// - linear on prepacked weights: MKL streams the weights of few-row (decode) GEMMs at a fraction of the
//   memory bandwidth; this kernel is 1.4-3x faster there and on par or better at prefill sizes;
// - paged decode attention reading K/V in place (torch must first gather a padded copy), from fp32 or
//   bf16 caches;
// - weight-only GEMMs for few rows on int8 or bf16 weights (decode), where torch's kernels are 1.4-1.6x
//   slower (int8) or emulate bf16 on CPUs without bf16 units;
// - on CPUs with AVX512-BF16, linear on bf16 weights prepacked for VDPBF16PS: oneDNN streams a decode
//   step's weights at half the memory bandwidth; this kernel is 1.3-2x faster there and on par at
//   prefill sizes (a target attribute and a run-time check: the library still runs on AVX2 alone);
// - on CPUs with AVX512-VNNI, the same on int8 weights (VPDPBUSD, activations as int8 per row and 512 k):
//   half the bytes of bf16 and twice its multiplies an instruction;
// - small per-token ops fused (RMSNorm, rotary, KV-cache write, SwiGLU, argmax), because a decode
//   step would otherwise pay torch's per-op overhead some 400 times.
// Plain C with no argument checks: cpu_ops.cpp registers each as a torch operator and checks shapes,
// dtypes, strides and every block, slot and position id before calling it (cpu_kernels.h). Built by
// appliance/engine/build_kernels.py. Parallel loops use OpenMP, which binds to the libgomp torch has
// already loaded, so torch.set_num_threads governs them too.
#include "cpu_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// The horizontal sums of four vectors, as one 4-lane vector.
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// GEMM: y = x W^T with W repacked once into panels of 16 output columns, [ceil(N/16)][K][16], so the
// inner loop reads each panel front to back and broadcasts one x value per row: a 6x16 register tile
// (12 accumulators + 2 weight vectors + 1 broadcast = 15 of the 16 ymm registers).
#define PANEL 16
#define MR 6
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

// Row i of a tile: x[i][k] broadcast against the panel's two weight vectors at k.
#define FMA_ROW(i)                                                                           \
    if (mr > i) {                                                                            \
        __m256 a = _mm256_broadcast_ss(x##i + k);                                            \
        c##i##0 = _mm256_fmadd_ps(a, w0, c##i##0);                                           \
        c##i##1 = _mm256_fmadd_ps(a, w1, c##i##1);                                           \
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
        FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4) FMA_ROW(5)
    }
    __m256 c[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int i = 0; i < mr; i++) {
        float* yr = y + i * ldy;
        if (nr == PANEL) {
            if (accumulate) {
                c[i][0] = _mm256_add_ps(c[i][0], _mm256_loadu_ps(yr));
                c[i][1] = _mm256_add_ps(c[i][1], _mm256_loadu_ps(yr + 8));
            }
            _mm256_storeu_ps(yr, c[i][0]);
            _mm256_storeu_ps(yr + 8, c[i][1]);
        } else {  // last panel of an N that is not a multiple of 16
            float t[PANEL];
            _mm256_storeu_ps(t, c[i][0]);
            _mm256_storeu_ps(t + 8, c[i][1]);
            for (int j = 0; j < nr; j++) yr[j] = accumulate ? yr[j] + t[j] : t[j];
        }
    }
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

// e^x for 8 lanes (Cephes' expf: x = n ln2 + r, a degree-5 polynomial for e^r, 2^n from the exponent
// bits); within 2 ulp of expf over [-87, 88], saturating outside.
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// K/V cache elements: fp32, or bf16 (the upper half of an fp32: widened by a 16-bit shift). The attention
// kernel below is written once over a loader and its element size; always_inline with a constant loader
// lets the compiler make one specialised copy per cache type.
typedef __m256 (*load8_t)(const char* p);

static inline __m256 load8_f32(const char* p) { return _mm256_loadu_ps((const float*)p); }

static inline __m256 load8_bf16(const char* p) {
    __m128i half = _mm_loadu_si128((const __m128i*)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

// Dot products of 4 (query, key) pairs of length D, two accumulators per pair so that eight FMA
// chains run side by side. Keys are cache rows of `es`-byte elements read through `load`.
static inline __attribute__((always_inline)) __m128 dot4(const float* q0, const char* k0, const float* q1,
        const char* k1, const float* q2, const char* k2, const float* q3, const char* k3, int64_t D,
        int64_t es, load8_t load) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), load(k0 + d * es), a0);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d + 8), load(k0 + (d + 8) * es), b0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), load(k1 + d * es), a1);
        b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d + 8), load(k1 + (d + 8) * es), b1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), load(k2 + d * es), a2);
        b2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d + 8), load(k2 + (d + 8) * es), b2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), load(k3 + d * es), a3);
        b3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d + 8), load(k3 + (d + 8) * es), b3);
    }
    if (d < D) {  // D % 16 == 8
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), load(k0 + d * es), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), load(k1 + d * es), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), load(k2 + d * es), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), load(k3 + d * es), a3);
    }
    return hsum4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2), _mm256_add_ps(a3, b3));
}

static inline __attribute__((always_inline)) float dot(const float* q, const char* k, int64_t D, int64_t es,
                                                      load8_t load) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load(k + d * es), acc);
    return hsum(acc);
}

// Prefetch a token's row (`bytes` of it) ahead of its use: blocks lie anywhere in the pool, so the
// hardware prefetcher cannot guess where the next one starts.
static inline void prefetch_row(const char* row, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) _mm_prefetch(row + c, _MM_HINT_T0);
}

// One query token per sequence against that sequence's paged K/V, read in place through its block
// table (no gathered copy). q, out: [B, Hq, D] contiguous fp32; caches: [num_blocks, block_size, Hk, D]
// of `es`-byte elements read through `load`; block_tables: [B, width]; D % 8 == 0. Query heads
// h*g .. h*g+g-1 share KV head h (GQA).
// A task is one sequence's tokens [p0, p1) against all its heads: both passes walk a block token by
// token, every head at once, so each block (contiguous in memory) is read front to back. A task that
// holds a whole sequence writes its output (ob: the sequence's [Hq, D]); one of several writes its
// unnormalised sums there and each row's largest score and sum of exponentials into mx and sum, for
// merge_chunks. Returns 0, or -1 if scratch memory ran out (that task's output is then missing). Called
// inside each kernel's own parallel loop with a constant loader, so that it is inlined (as few_rows_pair
// below).
static inline __attribute__((always_inline)) int decode_task(const float* qb, const char* k_cache,
        const char* v_cache, int64_t es, load8_t load, const int64_t* table, int64_t p0, int64_t p1,
        int64_t Hq, int64_t Hk, int64_t D, int64_t block_size, float scale, float* ob, float* mx_out,
        float* sum_out) {
    const int64_t g = Hq / Hk, stride = Hk * D;  // stride: elements between consecutive tokens
    const int64_t rows = Hq, L = p1 - p0;  // row r reads KV head r / g
    float* scores = malloc(sizeof(float) * rows * L);  // [rows][L]
    int64_t* row = malloc(sizeof(int64_t) * L);  // byte offset of token p0 + i's K/V in a cache
    if (scores == NULL || row == NULL) {  // the caller's parallel loop flags it and goes on
        free(scores);
        free(row);
        return -1;
    }
    for (int64_t i = 0; i < L; i++) {
        const int64_t p = p0 + i;
        row[i] = (table[p / block_size] * block_size + p % block_size) * stride * es;
    }
    const int64_t row_bytes = stride * es;  // what the task reads of a token
    const int64_t kv_head = D * es;  // bytes between a token's KV heads
    // Pass 1: scaled scores. Rows are read in order: each block front to back, the same token of
    // the next block prefetched meanwhile.
    for (int64_t p = 0; p < L; p++) {
        const char* kt = k_cache + row[p];
        if (p + block_size < L) prefetch_row(k_cache + row[p + block_size], row_bytes);
        float* s = scores + p;
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            float v[4];
            __m128 d4 = dot4(qb + r * D, kt + r / g * kv_head, qb + (r + 1) * D, kt + (r + 1) / g * kv_head,
                             qb + (r + 2) * D, kt + (r + 2) / g * kv_head, qb + (r + 3) * D,
                             kt + (r + 3) / g * kv_head, D, es, load);
            _mm_storeu_ps(v, _mm_mul_ps(d4, _mm_set1_ps(scale)));
            for (int j = 0; j < 4; j++) s[(r + j) * L] = v[j];
        }
        for (; r < rows; r++) s[r * L] = dot(qb + r * D, kt + r / g * kv_head, D, es, load) * scale;
    }
    // Softmax per row (max subtracted); the normalisation is applied to the output at the end.
    for (int64_t r = 0; r < rows; r++) {
        float* s = scores + r * L;
        float mx = -INFINITY;
        for (int64_t p = 0; p < L; p++) mx = s[p] > mx ? s[p] : mx;
        int64_t p = 0;
        for (; p + 8 <= L; p += 8)
            _mm256_storeu_ps(s + p, exp256(_mm256_sub_ps(_mm256_loadu_ps(s + p), _mm256_set1_ps(mx))));
        for (; p < L; p++) s[p] = expf(s[p] - mx);
        for (int64_t d = 0; d < D; d++) ob[r * D + d] = 0.f;
        if (mx_out) mx_out[r] = mx;
    }
    // Pass 2: weighted sum of V rows, in the same order (the output rows stay in L1).
    for (int64_t p = 0; p < L; p++) {
        const char* vt = v_cache + row[p];
        if (p + block_size < L) prefetch_row(v_cache + row[p + block_size], row_bytes);
        for (int64_t r = 0; r < rows; r++) {
            __m256 pv = _mm256_set1_ps(scores[r * L + p]);
            const char* vr = vt + r / g * kv_head;
            float* o = ob + r * D;
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(o + d, _mm256_fmadd_ps(pv, load(vr + d * es), _mm256_loadu_ps(o + d)));
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        float sum = 0.f;
        for (int64_t p = 0; p < L; p++) sum += scores[r * L + p];
        if (sum_out)
            sum_out[r] = sum;
        else
            for (int64_t d = 0; d < D; d++) ob[r * D + d] /= sum;
    }
    free(row);
    free(scores);
    return 0;
}

// How a batch's tokens split into tasks. With sequences enough to keep the threads busy, a task is a
// sequence. With fewer, each sequence's tokens split into chunks (whole blocks, at least
// DECODE_CHUNK_MIN tokens) so that every thread gets a few tasks that still read whole blocks: one head
// a task instead would read 256 bytes of every 8 KB token row at 7B (half the memory rate or less).
// first[b]: sequence b's first task (first[B]: the task count); chunk: tokens a task.
#define DECODE_CHUNK_MIN 64
#define DECODE_TASKS_PER_THREAD 2

typedef struct {
    int64_t* first;
    int64_t chunk;
    float* partial;  // split tasks' [Hq, D] sums, then their [Hq] largest scores and [Hq] sums
} DecodePlan;

static int plan_decode(const int64_t* context_lens, int64_t B, int64_t Hq, int64_t D, int64_t block_size,
                       DecodePlan* plan) {
    const int64_t threads = omp_get_max_threads();
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) longest = context_lens[b] > longest ? context_lens[b] : longest;
    int64_t chunk = longest;  // a sequence a task
    if (B < 2 * threads) {
        chunk = (longest * B + DECODE_TASKS_PER_THREAD * threads - 1) / (DECODE_TASKS_PER_THREAD * threads);
        chunk = chunk < DECODE_CHUNK_MIN ? DECODE_CHUNK_MIN : chunk;
        chunk = (chunk + block_size - 1) / block_size * block_size;
    }
    plan->chunk = chunk;
    plan->first = malloc(sizeof(int64_t) * (B + 1));
    plan->partial = NULL;
    if (plan->first == NULL) return -1;
    plan->first[0] = 0;
    for (int64_t b = 0; b < B; b++) plan->first[b + 1] = plan->first[b] + (context_lens[b] + chunk - 1) / chunk;
    if (plan->first[B] > B) {  // some sequence splits
        plan->partial = malloc(sizeof(float) * plan->first[B] * Hq * (D + 2));
        if (plan->partial == NULL) {
            free(plan->first);
            return -1;
        }
    }
    return 0;
}

// The output of each split sequence from its chunks' partial results: for each row,
// o = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c, M the largest m_c.
static void merge_chunks(const DecodePlan* plan, int64_t B, int64_t Hq, int64_t D, float* out) {
    const int64_t tasks = plan->first[B];
    const float* mx = plan->partial + tasks * Hq * D;
    const float* sum = mx + tasks * Hq;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * Hq; i++) {
        const int64_t b = i / Hq, r = i % Hq, c0 = plan->first[b], c1 = plan->first[b + 1];
        if (c1 - c0 == 1) continue;  // written in place
        float m = -INFINITY, total = 0.f;
        for (int64_t c = c0; c < c1; c++) m = mx[c * Hq + r] > m ? mx[c * Hq + r] : m;
        float* o = out + i * D;
        for (int64_t d = 0; d < D; d++) o[d] = 0.f;
        for (int64_t c = c0; c < c1; c++) {
            const float w = expf(mx[c * Hq + r] - m);
            const float* oc = plan->partial + (c * Hq + r) * D;
            total += w * sum[c * Hq + r];
            for (int64_t d = 0; d < D; d++) o[d] += w * oc[d];
        }
        for (int64_t d = 0; d < D; d++) o[d] /= total;
    }
}

// The exported kernels, one per cache element type. A macro, not a shared function: the OpenMP loop must
// sit where the loader is a constant, or its outlined body would call the loader indirectly (decode_task).
#define PAGED_DECODE_ATTENTION(name, elem, load)                                                                \
    int name(const float* q, const elem* k_cache, const elem* v_cache, const int64_t* block_tables,           \
             int64_t width, const int64_t* context_lens, float* out, int64_t B, int64_t Hq, int64_t Hk,       \
             int64_t D, int64_t block_size, float scale) {                                                    \
        DecodePlan plan;                                                                                      \
        if (plan_decode(context_lens, B, Hq, D, block_size, &plan)) return -1;                                \
        const int64_t tasks = plan.first[B];                                                                  \
        int failed = 0;                                                                                       \
        _Pragma("omp parallel for schedule(dynamic, 1)")                                                      \
        for (int64_t task = 0; task < tasks; task++) {                                                        \
            int64_t b = 0;                                                                                    \
            while (plan.first[b + 1] <= task) b++;                                                            \
            const int64_t c = task - plan.first[b], whole = plan.first[b + 1] - plan.first[b] == 1;           \
            const int64_t p0 = c * plan.chunk, L = context_lens[b];                                           \
            float* partial = plan.partial ? plan.partial + task * Hq * D : NULL;                              \
            float* mx = partial ? plan.partial + tasks * Hq * D + task * Hq : NULL;                           \
            if (decode_task(q + b * Hq * D, (const char*)k_cache, (const char*)v_cache, sizeof(elem), load,    \
                            block_tables + b * width, p0, p0 + plan.chunk < L ? p0 + plan.chunk : L, Hq, Hk,   \
                            D, block_size, scale, whole ? out + b * Hq * D : partial, whole ? NULL : mx,      \
                            whole ? NULL : mx + tasks * Hq)) {                                                \
                _Pragma("omp atomic write")                                                                   \
                failed = 1;                                                                                   \
            }                                                                                                 \
        }                                                                                                     \
        if (plan.partial) merge_chunks(&plan, B, Hq, D, out);                                                 \
        free(plan.partial);                                                                                   \
        free(plan.first);                                                                                     \
        return failed ? -1 : 0;                                                                               \
    }

PAGED_DECODE_ATTENTION(paged_decode_attention_f32, float, load8_f32)
PAGED_DECODE_ATTENTION(paged_decode_attention_bf16, uint16_t, load8_bf16)

// ---- Small per-token ops, fused so that a decode step does not pay torch's per-op overhead ~400 times.

// out[m] = w * x[m] / sqrt(mean(x[m]^2) + eps), as Llama's RMSNorm in fp32. Rows of x: stride ldx.
void rms_norm_f32(const float* x, int64_t ldx, const float* w, float eps, float* out, int64_t M, int64_t D) {
    #pragma omp parallel for schedule(static) if (M * D > 65536)
    for (int64_t m = 0; m < M; m++) {
        const float* xr = x + m * ldx;
        float* o = out + m * D;
        float ss = 0.f;
        #pragma omp simd reduction(+:ss)
        for (int64_t d = 0; d < D; d++) ss += xr[d] * xr[d];
        float r = 1.f / sqrtf(ss / (float)D + eps);
        for (int64_t d = 0; d < D; d++) o[d] = w[d] * (xr[d] * r);
    }
}

// Neox-style rotary embedding in place on q [T, Hq, D] and k [T, Hk, D] (rows of stride ldq / ldk,
// heads contiguous): x1, x2 = halves; x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. cos/sin: [P, D].
void rotary_f32(float* q, int64_t ldq, float* k, int64_t ldk, const int64_t* positions, const float* cos_t,
                const float* sin_t, int64_t T, int64_t Hq, int64_t Hk, int64_t D) {
    int64_t half = D / 2;
    #pragma omp parallel for schedule(static) if (T > 64)
    for (int64_t t = 0; t < T; t++) {
        const float* c = cos_t + positions[t] * D;
        const float* s = sin_t + positions[t] * D;
        for (int64_t h = 0; h < Hq + Hk; h++) {
            float* x = h < Hq ? q + t * ldq + h * D : k + t * ldk + (h - Hq) * D;
            for (int64_t i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i + half] + x1 * s[i + half];
            }
        }
    }
}

// k_cache/v_cache viewed as [slots, width]: row slots[t] <- k[t] / v[t] (rows of stride ldk / ldv).
void write_kv_f32(const float* k, int64_t ldk, const float* v, int64_t ldv, const int64_t* slots,
                  float* k_cache, float* v_cache, int64_t T, int64_t width) {
    #pragma omp parallel for schedule(static) if (T * width > 65536)
    for (int64_t t = 0; t < T; t++) {
        memcpy(k_cache + slots[t] * width, k + t * ldk, sizeof(float) * width);
        memcpy(v_cache + slots[t] * width, v + t * ldv, sizeof(float) * width);
    }
}

// SwiGLU: out[m, i] = silu(x[m, i]) * x[m, I + i] for x [M, 2I].
void silu_mul_f32(const float* x, float* out, int64_t M, int64_t I) {
    #pragma omp parallel for schedule(static) if (M * I > 65536)
    for (int64_t m = 0; m < M; m++) {
        const float* g = x + m * 2 * I;
        float* o = out + m * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            __m256 sig = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_add_ps(_mm256_set1_ps(1.f), e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(g + I + i)));
        }
        for (; i < I; i++) o[i] = g[i] / (1.f + expf(-g[i])) * g[I + i];
    }
}

// Index of each row's maximum for x [M, N], as torch.argmax: the first on ties, the first NaN if any.
void argmax_rows_f32(const float* x, int64_t M, int64_t N, int64_t* out) {
    #pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const float* r = x + m * N;
        __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
        int64_t n = 0;
        for (; n + 8 <= N; n += 8) {
            __m256 v = _mm256_loadu_ps(r + n);
            mx = _mm256_max_ps(mx, v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        float best = -INFINITY, lanes[8];
        _mm256_storeu_ps(lanes, mx);
        for (int i = 0; i < 8; i++) best = lanes[i] > best ? lanes[i] : best;
        int has_nan = _mm256_movemask_ps(nan) != 0;
        for (; n < N; n++) {
            if (r[n] != r[n]) has_nan = 1;
            else if (r[n] > best) best = r[n];
        }
        int64_t i = 0;
        if (has_nan) while (r[i] == r[i]) i++;
        else while (r[i] != best) i++;
        out[m] = i;
    }
}

// Weight-only GEMMs for few rows (decode), on weights stored narrower than fp32: int8 rows with one fp32
// scale each (y[m][n] = scale[n] * sum_k x[m][k] * q[n][k]), or bf16 rows (scale 1). A decode step is
// bound by reading the weights; torch's kernels for these types run below the memory roofline past one
// row (int8) or, on CPUs without bf16 units, emulate bf16 at a few GFLOP/s. Here each pair of weight rows
// is read from memory once for all M rows: groups of up to 4 x rows meet it while it sits in L1, each
// weight widened to fp32 in registers. A tile is 2 weight rows x mr x rows, 16 k at a time. The tile is
// written once over a weight loader and element size, like the attention kernel above.
#define FEW_MR 4

typedef float (*load1_t)(const char* p);

// Eight int8 weights as fp32.
static inline __m256 load8_i8(const char* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

static inline float load1_i8(const char* p) { return (float)*(const int8_t*)p; }

static inline float load1_bf16(const char* p) {
    uint32_t bits = (uint32_t)(*(const uint16_t*)p) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// x[i][k+off:k+off+8] against weight vectors wa, wb into accumulators ca, cb.
#define FEW_FMA(i, off, wa, wb, ca, cb)                         \
    {                                                          \
        __m256 a = _mm256_loadu_ps(x##i + k + off);            \
        ca = _mm256_fmadd_ps(a, wa, ca);                       \
        cb = _mm256_fmadd_ps(a, wb, cb);                       \
    }

// y[i][0], y[i][ldy_n] = the dot products of x rows 0..mr-1 with weight rows w0, w1 (`es`-byte elements
// read through `load`, the K % 8 tail through `load1`), scaled. Inlined with a constant mr, so each row
// count gets only its accumulators. With one or two rows, each output's second 8 k go to accumulators of
// their own (d): one chain per output would leave the FMA latency, not memory, as the bound. A lone last
// weight row passes w1 = w0 and ldy_n = 0 (its second column is the same value, written first and then
// over).
static inline __attribute__((always_inline)) void few_rows_tile(
        const float* x, int64_t ldx, const char* w0, const char* w1, int64_t es, load8_t load, load1_t load1,
        float s0, float s1, int64_t K, float* y, int64_t ldy, int64_t ldy_n, const int mr) {
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, d00 = c00, d01 = c00, d10 = c00, d11 = c00;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 u0 = load(w0 + k * es), u1 = load(w1 + k * es);
        __m256 v0 = load(w0 + (k + 8) * es), v1 = load(w1 + (k + 8) * es);
        if (mr <= 2) {  // 4 accumulators to spare (16 ymm registers): a second chain per output
            FEW_FMA(0, 0, u0, u1, c00, c01) FEW_FMA(0, 8, v0, v1, d00, d01)
            if (mr > 1) { FEW_FMA(1, 0, u0, u1, c10, c11) FEW_FMA(1, 8, v0, v1, d10, d11) }
        } else {  // 8 outputs: chains enough to hide the FMA latency
            FEW_FMA(0, 0, u0, u1, c00, c01) FEW_FMA(0, 8, v0, v1, c00, c01)
            FEW_FMA(1, 0, u0, u1, c10, c11) FEW_FMA(1, 8, v0, v1, c10, c11)
        }
        if (mr > 2) { FEW_FMA(2, 0, u0, u1, c20, c21) FEW_FMA(2, 8, v0, v1, c20, c21) }
        if (mr > 3) { FEW_FMA(3, 0, u0, u1, c30, c31) FEW_FMA(3, 8, v0, v1, c30, c31) }
    }
    if (k + 8 <= K) {
        __m256 u0 = load(w0 + k * es), u1 = load(w1 + k * es);
        FEW_FMA(0, 0, u0, u1, c00, c01)
        if (mr > 1) FEW_FMA(1, 0, u0, u1, c10, c11)
        if (mr > 2) FEW_FMA(2, 0, u0, u1, c20, c21)
        if (mr > 3) FEW_FMA(3, 0, u0, u1, c30, c31)
        k += 8;
    }
    __m256 c[FEW_MR][2] = {{_mm256_add_ps(c00, d00), _mm256_add_ps(c01, d01)},
                           {_mm256_add_ps(c10, d10), _mm256_add_ps(c11, d11)}, {c20, c21}, {c30, c31}};
    const float* xs[FEW_MR] = {x0, x1, x2, x3};
    for (int i = 0; i < mr; i++) {
        float d0 = hsum(c[i][0]), d1 = hsum(c[i][1]);
        for (int64_t t = k; t < K; t++) {  // the K % 8 tail
            d0 += xs[i][t] * load1(w0 + t * es);
            d1 += xs[i][t] * load1(w1 + t * es);
        }
        y[i * ldy + ldy_n] = d1 * s1;
        y[i * ldy] = d0 * s0;
    }
}

// Output columns n, n+1 (pair p) of y [M, N] (row stride ldy) = x [M, K] (row stride ldx) times the
// [N, K] weight w transposed, scaled by `scale` per output (NULL: 1). Called inside each kernel's own
// parallel loop with constant loaders, so that they are inlined (an OpenMP region outlines its body:
// a loader passed into it would stay an indirect call per load).
static inline __attribute__((always_inline)) void few_rows_pair(
        const float* x, int64_t ldx, const char* w, int64_t es, load8_t load, load1_t load1, const float* scale,
        float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t p) {
    const int64_t n = 2 * p, two = n + 1 < N;
    const char *w0 = w + n * K * es, *w1 = two ? w0 + K * es : w0;
    const float s0 = scale ? scale[n] : 1.f, s1 = scale && two ? scale[n + 1] : s0;
    for (int64_t m = 0; m < M; m += FEW_MR) {
        const float* xm = x + m * ldx;
        float* ym = y + m * ldy + n;
        switch (M - m < FEW_MR ? M - m : FEW_MR) {
            case 1: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 1); break;
            case 2: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 2); break;
            case 3: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 3); break;
            default: few_rows_tile(xm, ldx, w0, w1, es, load, load1, s0, s1, K, ym, ldy, two, 4); break;
        }
    }
}

void linear_int8_f32(const float* x, int64_t ldx, const int8_t* q, const float* scale, float* y, int64_t ldy,
                     int64_t M, int64_t N, int64_t K) {
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < (N + 1) / 2; p++)
        few_rows_pair(x, ldx, (const char*)q, 1, load8_i8, load1_i8, scale, y, ldy, M, N, K, p);
}

// ---- The bf16-weight GEMM on CPUs with AVX512-BF16: VDPBF16PS multiplies 32 bf16 pairs into 16 fp32 sums
// per instruction, so neither operand is widened. Compiled for that unit alone (a target attribute) and
// chosen at run time; x rows are rounded to bf16 first (exact for a bf16 engine's activations).
#define BF16_UNITS __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline BF16_UNITS float bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

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
// GEMM above. x comes as bf16 pairs (a bf16 engine's activations, no rounding).
#define BPANEL 32
#define BMR 8
#define BKC 256  // k pairs per pass: a 32 KB panel slice stays in L1 while it meets every row of the x block
#define BMC 192  // x rows per block: 192 KB of x pairs stay in L2 while the panels stream past
#define BPREFETCH 64  // k groups ahead (8 KB) to prefetch while a panel is read from memory the first time

// Packs weights in panels of 32 outputs whose k groups of 4 bytes lie side by side (bf16 pairs, int8
// quads): [ceil(N/32)][ceil(K/g)][32][g] for g = 4 / es elements of `es` bytes, each group XORed with
// `flip` (int8: 0x80 a byte, the weights as the unsigned bytes VPDPBUSD takes; padding is a flipped 0).
static inline __attribute__((always_inline)) void pack_groups(const char* w, int64_t N, int64_t K, int64_t es,
                                                              uint32_t flip, char* packed) {
    const int64_t g = 4 / es, panels = (N + BPANEL - 1) / BPANEL, KG = (K + g - 1) / g, full = K / g;
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int j = 0; j < BPANEL; j++) {
            const int64_t n = p * BPANEL + j;
            char* out = packed + (p * KG * BPANEL + j) * 4;
            const int64_t stride = BPANEL * 4;  // bytes between one output's consecutive groups
            if (n >= N) {  // the last panel's padding rows
                for (int64_t kg = 0; kg < KG; kg++) memcpy(out + kg * stride, &flip, 4);
                continue;
            }
            const char* row = w + n * K * es;
            uint32_t v;
            for (int64_t kg = 0; kg < full; kg++) {
                memcpy(&v, row + kg * 4, 4);
                v ^= flip;
                memcpy(out + kg * stride, &v, 4);
            }
            if (full < KG) {  // K not a multiple of g: its last k beside zeros
                v = 0;
                memcpy(&v, row + full * 4, (K - full * g) * es);
                v ^= flip;
                memcpy(out + full * stride, &v, 4);
            }
        }
}

void pack_weight_bf16(const uint16_t* w, int64_t N, int64_t K, uint16_t* packed) {
    pack_groups((const char*)w, N, K, 2, 0, (char*)packed);
}

void pack_weight_int8(const int8_t* q, int64_t N, int64_t K, int8_t* packed) {
    pack_groups((const char*)q, N, K, 1, 0x80808080u, (char*)packed);
}

// 4 bytes of x (a bf16 pair, an int8 quad) in every 32-bit lane, against 16 outputs' groups.
static inline __attribute__((target("avx512f"), always_inline)) __m512i group_broadcast(const void* p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

static inline BF16_UNITS __m512bh pair_broadcast(const uint16_t* p) { return (__m512bh)group_broadcast(p); }

// One row of a tile's 32 sums into y: added to the sums of earlier passes (accumulate), times the outputs'
// scales (int8 weights' last pass; else NULL). A last panel of an N not a multiple of 32 stores its nr
// columns only.
static inline __attribute__((target("avx512f"), always_inline)) void store_tile_row(
        float* yr, __m512 s0, __m512 s1, int nr, int accumulate, const float* scale) {
    const __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1),
                    m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    if (accumulate) {
        s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(m0, yr));
        s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps(m1, yr + 16));
    }
    if (scale) {
        s0 = _mm512_mul_ps(s0, _mm512_maskz_loadu_ps(m0, scale));
        s1 = _mm512_mul_ps(s1, _mm512_maskz_loadu_ps(m1, scale + 16));
    }
    _mm512_mask_storeu_ps(yr, m0, s0);
    _mm512_mask_storeu_ps(yr + 16, m1, s1);
}

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
