// Paged decode attention reading K/V in place (torch must first gather a padded copy), from fp32 or bf16
// caches (AVX2/FMA).
#include "cpu_kernels.h"
#include "kernel_common.h"

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
