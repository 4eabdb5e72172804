// int4 weights dequantised into a GEMM's right side (engine/int4.py's tiles past torch's int4 kernel).
// The tiles round as the torch ops that dequantise them without our kernels do, so both paths give the
// same bits: w = q * scale + offset as a product and a sum, each rounded to the tiles' dtype (fp32, or
// bf16 from fp32 arithmetic). This file is compiled with -ffp-contract=off (build_kernels.py): a fused
// multiply-add would round once.
#include "cpu_kernels.h"

// x rounded to the nearest bf16, ties to even (torch's rounding; weights are finite), as an fp32.
static inline float round_bf16(float x) {
    union { float f; uint32_t u; } v = {x};
    v.u = (v.u + 0x7FFFu + ((v.u >> 16) & 1u)) & 0xFFFF0000u;
    return v.f;
}

static inline uint16_t bf16_bits(float x) {
    union { float f; uint32_t u; } v = {round_bf16(x)};
    return (uint16_t)(v.u >> 16);
}

// packed: `blocks` blocks of `rows` weight rows in torch's int4 CPU layout, each [K][rows / 2] bytes; a
// byte's low and high nibbles hold rows j and j + rows / 2 (`halves`) or rows 2j and 2j + 1.
// scale, offset: [K / g][lds] fp32 holding values of the tiles' dtype, column c for weight row c.
// out: [K][ldo] (fp32, or bf16 bits where `bf16`), columns 0 .. blocks * rows: the weight rows transposed.
void int4_tiles(const uint8_t* packed, int64_t blocks, int64_t rows, int64_t K, int halves, const float* scale,
                const float* offset, int64_t lds, int64_t g, void* out, int64_t ldo, int bf16) {
    const int64_t half = rows / 2;
    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; k++) {
        const float* s = scale + (k / g) * lds;
        const float* o = offset + (k / g) * lds;
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t* src = packed + (b * K + k) * half;
            const int64_t c0 = b * rows;
            const float* sb = s + c0;
            const float* ob = o + c0;
            float q[64];  // the block's nibbles in row order (rows <= 64: torch's widest block)
            if (halves) {
                #pragma omp simd
                for (int64_t j = 0; j < half; j++) {
                    q[j] = (float)(src[j] & 0xF);
                    q[j + half] = (float)(src[j] >> 4);
                }
            } else {
                #pragma omp simd
                for (int64_t j = 0; j < half; j++) {
                    q[2 * j] = (float)(src[j] & 0xF);
                    q[2 * j + 1] = (float)(src[j] >> 4);
                }
            }
            if (bf16) {
                uint16_t* dst = (uint16_t*)out + k * ldo + c0;
                #pragma omp simd
                for (int64_t r = 0; r < rows; r++) dst[r] = bf16_bits(round_bf16(q[r] * sb[r]) + ob[r]);
            } else {
                float* dst = (float*)out + k * ldo + c0;
                #pragma omp simd
                for (int64_t r = 0; r < rows; r++) dst[r] = q[r] * sb[r] + ob[r];
            }
        }
    }
}
