// Our C kernels for CPU inference, one file a family: gemm_f32.c (the packed fp32 GEMM), gemm_bf16.c and
// gemm_int8.c (GEMMs on bf16 and int8 weights: few rows on torch's layout, packed on AVX-512 units),
// gemm_int4.c (the int4 GEMM on AVX512-VNNI, unpacking torch's int4 layout into the int8 GEMM's panels),
// gemv_int4.c (its few-row GEMV, reading that layout where it lies), gemv_int4_avx2.c and gemm_int4_avx2.c
// (the few-row GEMV and the GEMM on AVX2 alone, on torch's AVX2 int4 layout),
// gemm_bf16_fma.c (the packed bf16 GEMM on AVX2/FMA, for CPUs without bf16 units), gemm_int8_avx2.c (the
// packed int8 GEMM on AVX2, for CPUs without AVX512-VNNI),
// decode_attention.c (paged decode attention), small_ops.c (RMSNorm, rotary, KV write, SwiGLU, argmax);
// shared helpers in kernel_common.h, few_rows.h, group_panels.h, vnni_tile.h, int4_packing.h, int4_groups.h,
// int4_avx2.h, int4_slabs.h, quantize_avx2.h and panel16.h. Plain C with no argument checks: cpu_ops.cpp
// registers each as a torch operator and checks shapes, dtypes, strides and every block, slot and position id
// before calling it. Built into one library by appliance/engine/build_kernels.py.
// Parallel loops use OpenMP, which binds to the libgomp torch has already loaded, so
// torch.set_num_threads governs them too.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void pack_weight_f32(const float* w, int64_t N, int64_t K, float* packed);
void linear_packed_f32(const float* x, int64_t ldx, const float* packed, float* y, int64_t ldy, int64_t M,
                       int64_t N, int64_t K);
int paged_decode_attention_f32(const float* q, const float* k_cache, const float* v_cache,
                               const int64_t* block_tables, int64_t width, const int64_t* context_lens,
                               float* out, int64_t B, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size,
                               float scale);
int paged_decode_attention_bf16(const float* q, const uint16_t* k_cache, const uint16_t* v_cache,
                                const int64_t* block_tables, int64_t width, const int64_t* context_lens,
                                float* out, int64_t B, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size,
                                float scale);
void rms_norm_f32(const float* x, int64_t ldx, const float* w, float eps, float* out, int64_t M, int64_t D);
void rotary_f32(float* q, int64_t ldq, float* k, int64_t ldk, const int64_t* positions, const float* cos_t,
                const float* sin_t, int64_t T, int64_t Hq, int64_t Hk, int64_t D);
void write_kv_rows(const void* k, int64_t ldk, const void* v, int64_t ldv, const int64_t* slots, void* k_cache,
                   void* v_cache, int64_t T, int64_t width, int64_t elem);
void silu_mul_f32(const float* x, float* out, int64_t M, int64_t I);
void rms_norm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, float eps, uint16_t* out, int64_t M,
                   int64_t D);
void rotary_bf16(uint16_t* q, int64_t ldq, uint16_t* k, int64_t ldk, const int64_t* positions,
                 const uint16_t* cos_t, const uint16_t* sin_t, int64_t T, int64_t Hq, int64_t Hk, int64_t D);
void silu_mul_bf16(const uint16_t* x, uint16_t* out, int64_t M, int64_t I);
void argmax_rows_f32(const float* x, int64_t M, int64_t N, int64_t* out);
void linear_int8_f32(const float* x, int64_t ldx, const int8_t* q, const float* scale, float* y, int64_t ldy,
                     int64_t M, int64_t N, int64_t K);
// int4_tiles.c: int4 weights in torch's packed layout dequantised to fp32 or bf16 columns (engine/int4.py).
void int4_tiles(const uint8_t* packed, int64_t blocks, int64_t rows, int64_t K, int halves, const float* scale,
                const float* offset, int64_t lds, int64_t g, void* out, int64_t ldo, int bf16);
// y [M, N] = x Wᵀ for x fp32 [M, K] (row stride ldx) and int4 weights in torch's packed layout (blocks of
// block_rows rows, a byte holding rows j and j + rows / 2 where `halves`, else 2j and 2j + 1; tail_halves
// for a short last block) with (scale, zero) pairs [K / g][ldsz / 2] (bf16 where sz_bf16, else fp32), on
// VPDPBUSD with x quantised to int8 per row and group. -1 (nothing written) on a CPU without AVX512-VNNI,
// -2 if scratch memory ran out.
int linear_int4_vnni(const float* x, int64_t ldx, const uint8_t* packed, int64_t block_rows, int halves,
                     int tail_halves, const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy,
                     int64_t M, int64_t N, int64_t K, int64_t g);
// The same product for a few rows (decode), read from torch's AVX-512 packing (64-row blocks, a byte holding
// rows j and j + 32; tail_halves for a short last block) where it lies, the outputs the same bits as
// linear_int4_vnni's. -1 (nothing written) on a CPU without AVX512-VNNI, -2 if scratch memory ran out.
int gemv_int4_vnni(const float* x, int64_t ldx, const uint8_t* packed, int tail_halves,
                   const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy, int64_t M,
                   int64_t N, int64_t K, int64_t g);
// The same product for a few rows on AVX2 alone, read from torch's AVX2 packing (32-row blocks, a byte
// holding rows j and j + 16; tail_halves for a short last block) where it lies, the outputs the same bits as
// gemv_int4_vnni's. -2 if scratch memory ran out.
int gemv_int4_avx2(const float* x, int64_t ldx, const uint8_t* packed, int tail_halves,
                   const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy, int64_t M,
                   int64_t N, int64_t K, int64_t g);
// The same product for prefill sizes on AVX2 alone (gemm_int4_avx2.c: the AVX2 packing unpacked into panels),
// the same bits. -2 if scratch memory ran out.
int linear_int4_avx2(const float* x, int64_t ldx, const uint8_t* packed, int tail_halves,
                     const void* scales_and_zeros, int64_t ldsz, int sz_bf16, float* y, int64_t ldy, int64_t M,
                     int64_t N, int64_t K, int64_t g);
// bf16_units: use AVX512-BF16 where the CPU has it (0: the AVX2 path everywhere; tests compare the two).
void linear_bf16w_f32(const float* x, int64_t ldx, const uint16_t* w, float* y, int64_t ldy, int64_t M, int64_t N,
                      int64_t K, int bf16_units);
// bf16 weights packed in 32-output panels of k pairs; x bf16 [M, K] rows padded to an even K (ldx even).
void pack_weight_bf16(const uint16_t* w, int64_t N, int64_t K, uint16_t* packed);
// y = x Wᵀ (fp32 x [M, K] with row stride ldx, any K) for bf16 weights packed by pack_weight_bf16, widened
// to fp32 in registers (AVX2/FMA: any CPU these kernels run on).
void linear_packed_bf16_fma(const float* x, int64_t ldx, const uint16_t* packed, float* y, int64_t ldy, int64_t M,
                            int64_t N, int64_t K);
// int8 weights packed in 32-output panels of k quads, as unsigned bytes (q + 128).
void pack_weight_int8(const int8_t* q, int64_t N, int64_t K, int8_t* packed);
// -1 (nothing written) on a CPU without AVX512-BF16.
int linear_packed_bf16(const uint16_t* x, int64_t ldx, const uint16_t* packed, float* y, int64_t ldy, int64_t M,
                       int64_t N, int64_t K);
// y = (x qᵀ) · scale per output for x fp32 [M, K] (row stride ldx) and q int8 packed by pack_weight_int8.
// Nothing written and -1 on a CPU without AVX512-VNNI, -2 if scratch memory ran out.
int linear_packed_int8(const float* x, int64_t ldx, const int8_t* packed, const float* scale, float* y,
                       int64_t ldy, int64_t M, int64_t N, int64_t K);
// The same product on AVX2 alone (VPMADDUBSW, the same quantised x: the same y). -2 if scratch memory ran out.
int linear_packed_int8_avx2(const float* x, int64_t ldx, const int8_t* packed, const float* scale, float* y,
                            int64_t ldy, int64_t M, int64_t N, int64_t K);

#ifdef __cplusplus
}
#endif
