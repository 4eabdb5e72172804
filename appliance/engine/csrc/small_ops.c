// Small per-token ops fused (RMSNorm, rotary, KV-cache write, SwiGLU, argmax; AVX2/FMA), because a decode
// step would otherwise pay torch's per-op overhead some 400 times.
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
