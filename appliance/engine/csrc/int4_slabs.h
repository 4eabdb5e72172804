// The int4 GEMMs' thread scratch (gemm_int4.c on VPDPBUSD, gemm_int4_avx2.c on AVX2): each thread unpacks
// INT4_SLAB panels of 32 outputs at a time ([K / 4][32][4] unsigned quads each: 256 KB at K = 4096, beside a
// block of x in L2) and holds the slab's scales and offsets z - 8 s, fp32 [G][INT4_SLAB * 32] each.
#pragma once

#include <omp.h>
#include <stdint.h>

#include "panel_layout.h"

#define INT4_SLAB 2  // panels a thread unpacks and multiplies at a time

typedef struct {
    uint8_t* panels;  // INT4_SLAB panels, K * 32 bytes each
    float* scale;  // [G][INT4_SLAB * 32]
    float* offset;  // [G][INT4_SLAB * 32]
} int4_slab;

// Scratch bytes a thread.
static inline int64_t int4_slab_bytes(int64_t K, int64_t G) {
    return INT4_SLAB * K * BPANEL + 2 * (int64_t)sizeof(float) * G * INT4_SLAB * BPANEL;
}

// The calling thread's share of `scratch` (omp_get_max_threads() shares of int4_slab_bytes).
static inline int4_slab int4_thread_slab(char* scratch, int64_t K, int64_t G) {
    char* own = scratch + omp_get_thread_num() * int4_slab_bytes(K, G);
    float* scale = (float*)(own + INT4_SLAB * K * BPANEL);
    return (int4_slab){(uint8_t*)own, scale, scale + G * INT4_SLAB * BPANEL};
}
