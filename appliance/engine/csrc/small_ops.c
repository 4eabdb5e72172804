// Small per-token ops fused (RMSNorm, rotary, KV-cache write, SwiGLU, argmax; AVX2/FMA), because a decode
// step would otherwise pay torch's per-op overhead some 400 times. The bf16 ops compute in fp32 and round
// to bf16 where torch's bf16 path (layers.py) rounds, so either path gives the same tokens.
#include "cpu_kernels.h"
#include "kernel_common.h"

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

// k_cache/v_cache viewed as [slots, width]: row slots[t] <- k[t] / v[t] (rows of stride ldk / ldv), elements
// of `elem` bytes (fp32 or bf16: a copy either way).
void write_kv_rows(const void* k, int64_t ldk, const void* v, int64_t ldv, const int64_t* slots, void* k_cache,
                   void* v_cache, int64_t T, int64_t width, int64_t elem) {
    const int64_t row = width * elem;
    #pragma omp parallel for schedule(static) if (T * width > 65536)
    for (int64_t t = 0; t < T; t++) {
        memcpy((char*)k_cache + slots[t] * row, (const char*)k + t * ldk * elem, row);
        memcpy((char*)v_cache + slots[t] * row, (const char*)v + t * ldv * elem, row);
    }
}

// silu(g) = g / (1 + e^-g), torch's formula. Where e^-g passes exp256's range (g < -88.3) it is the square
// of e^(-g/2), so it overflows to inf where expf does and silu goes to -0 (NaN at -inf) as torch's does.
static inline __m256 silu8(__m256 g) {
    __m256 neg = _mm256_sub_ps(_mm256_setzero_ps(), g);
    __m256 e = exp256(neg);
    __m256 big = _mm256_cmp_ps(neg, _mm256_set1_ps(88.3f), _CMP_GT_OQ);
    if (_mm256_movemask_ps(big)) {
        __m256 h = exp256(_mm256_mul_ps(neg, _mm256_set1_ps(0.5f)));
        e = _mm256_blendv_ps(e, _mm256_mul_ps(h, h), big);
    }
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
}

// Elements of es bytes (4: fp32, 2: bf16), 8 lanes or one: loaded as fp32, fp32 rounded to the element type
// (still fp32; a no-op for fp32) and stored rounded. An op written once over es and inlined with a constant
// es keeps one branch of each.
static inline __m256 load8(const void* p, int64_t i, int64_t es) {
    return es == 2 ? load8_bf16((const char*)p + 2 * i) : load8_f32((const char*)p + 4 * i);
}
static inline float load1(const void* p, int64_t i, int64_t es) {
    return es == 2 ? bf16_to_f32(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}
static inline __m256 round8(__m256 v, int64_t es) { return es == 2 ? round8_bf16(v) : v; }
static inline float round1(float x, int64_t es) { return es == 2 ? round1_bf16(x) : x; }
static inline void store8(void* p, int64_t i, __m256 v, int64_t es) {
    if (es == 2) store8_bf16((uint16_t*)p + i, v);
    else _mm256_storeu_ps((float*)p + i, v);
}
static inline void store1(void* p, int64_t i, float x, int64_t es) {
    if (es == 2) ((uint16_t*)p)[i] = f32_to_bf16(x);
    else ((float*)p)[i] = x;
}

// One row of SwiGLU: o[i] = round(silu(g[i])) * u[i], silu rounded as torch's bf16 path rounds it.
static inline __attribute__((always_inline)) void silu_mul_row(const void* g, const void* u, void* o, int64_t I,
                                                               int64_t es) {
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) store8(o, i, _mm256_mul_ps(round8(silu8(load8(g, i, es)), es), load8(u, i, es)), es);
    for (; i < I; i++) {
        const float gi = load1(g, i, es);
        store1(o, i, round1(gi / (1.f + expf(-gi)), es) * load1(u, i, es), es);
    }
}

// SwiGLU: out[m, i] = silu(x[m, i]) * x[m, I + i] for x [M, 2I].
void silu_mul_f32(const float* x, float* out, int64_t M, int64_t I) {
    #pragma omp parallel for schedule(static) if (M * I > 65536)
    for (int64_t m = 0; m < M; m++) silu_mul_row(x + m * 2 * I, x + m * 2 * I + I, out + m * I, I, 4);
}

void silu_mul_bf16(const uint16_t* x, uint16_t* out, int64_t M, int64_t I) {
    #pragma omp parallel for schedule(static) if (M * I > 65536)
    for (int64_t m = 0; m < M; m++) silu_mul_row(x + m * 2 * I, x + m * 2 * I + I, out + m * I, I, 2);
}

// rms_norm_f32 for bf16 x, w and out: x normalised in fp32, rounded to bf16, times w, rounded again. Not
// written once with rms_norm_f32: the two add the squares in different orders (here lanes pairwise, then the
// tail; there as the compiler vectorises its reduction), so one kernel would change the bits of one.
void rms_norm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, float eps, uint16_t* out, int64_t M,
                   int64_t D) {
    #pragma omp parallel for schedule(static) if (M * D > 65536)
    for (int64_t m = 0; m < M; m++) {
        const uint16_t* xr = x + m * ldx;
        uint16_t* o = out + m * D;
        __m256 acc = _mm256_setzero_ps();
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) {
            __m256 v = load8_bf16((const char*)(xr + d));
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum(acc);
        for (; d < D; d++) ss += bf16_to_f32(xr[d]) * bf16_to_f32(xr[d]);
        float r = 1.f / sqrtf(ss / (float)D + eps);
        __m256 rv = _mm256_set1_ps(r);
        for (d = 0; d + 8 <= D; d += 8) {
            __m256 h = round8_bf16(_mm256_mul_ps(load8_bf16((const char*)(xr + d)), rv));
            store8_bf16(o + d, _mm256_mul_ps(load8_bf16((const char*)(w + d)), h));
        }
        for (; d < D; d++) o[d] = f32_to_bf16(bf16_to_f32(w[d]) * round1_bf16(bf16_to_f32(xr[d]) * r));
    }
}

// rotary_f32 for bf16 q, k and tables: each product rounded to bf16, then their sum.
void rotary_bf16(uint16_t* q, int64_t ldq, uint16_t* k, int64_t ldk, const int64_t* positions,
                 const uint16_t* cos_t, const uint16_t* sin_t, int64_t T, int64_t Hq, int64_t Hk, int64_t D) {
    int64_t half = D / 2;
    #pragma omp parallel for schedule(static) if (T > 64)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t* c = cos_t + positions[t] * D;
        const uint16_t* s = sin_t + positions[t] * D;
        for (int64_t h = 0; h < Hq + Hk; h++) {
            uint16_t* x = h < Hq ? q + t * ldq + h * D : k + t * ldk + (h - Hq) * D;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                __m256 x1 = load8_bf16((const char*)(x + i)), x2 = load8_bf16((const char*)(x + i + half));
                __m256 c1 = load8_bf16((const char*)(c + i)), s1 = load8_bf16((const char*)(s + i));
                __m256 c2 = load8_bf16((const char*)(c + i + half)), s2 = load8_bf16((const char*)(s + i + half));
                store8_bf16(x + i, _mm256_sub_ps(round8_bf16(_mm256_mul_ps(x1, c1)), round8_bf16(_mm256_mul_ps(x2, s1))));
                store8_bf16(x + i + half,
                            _mm256_add_ps(round8_bf16(_mm256_mul_ps(x2, c2)), round8_bf16(_mm256_mul_ps(x1, s2))));
            }
            for (; i < half; i++) {
                float x1 = bf16_to_f32(x[i]), x2 = bf16_to_f32(x[i + half]);
                x[i] = f32_to_bf16(round1_bf16(x1 * bf16_to_f32(c[i])) - round1_bf16(x2 * bf16_to_f32(s[i])));
                x[i + half] = f32_to_bf16(round1_bf16(x2 * bf16_to_f32(c[i + half])) +
                                          round1_bf16(x1 * bf16_to_f32(s[i + half])));
            }
        }
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
