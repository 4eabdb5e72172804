// torch's packed int4 weight as our int4 kernels read it, with no vector code of any ISA (the AVX512-VNNI
// kernels, int4_groups.h, and the AVX2 GEMV, gemv_int4_avx2.c, include it): where a row's nibbles lie, a
// short last block copied into a full block's layout, and the buffers of x quantised per row and group.
#pragma once

#include <stdint.h>
#include <stdlib.h>

// The int4 weight: torch's packed bytes and where a row's nibbles lie in them.
typedef struct {
    const uint8_t* packed;  // [N][K / 2] bytes as torch's int4 CPU packing writes them
    int64_t N, K, block_rows;  // blocks of block_rows rows, each [K][block_rows / 2] bytes; the last may be short
    int halves, tail_halves;  // a byte holds rows j and j + rows / 2 (else 2j and 2j + 1): full blocks, the last
} int4_source;

// The nibble of weight row n at k (0 past the last row: padding).
static inline uint8_t nibble_at(const int4_source* w, int64_t n, int64_t k) {
    if (n >= w->N) return 0;
    const int64_t start = n / w->block_rows * w->block_rows, r = n - start;
    const int64_t rows = w->N - start < w->block_rows ? w->N - start : w->block_rows, half = rows / 2;
    const int halves = rows == w->block_rows ? w->halves : w->tail_halves;
    const uint8_t byte = w->packed[start * w->K / 2 + k * half + (halves ? r % half : r / 2)];
    return (halves ? r >= half : r & 1) ? byte >> 4 : byte & 0xF;
}

// The short last block of w (rows from `first`) in a full block's layout with halves: [K][block_rows / 2]
// bytes, byte j holding rows j and j + block_rows / 2, rows past N zero.
static void int4_tail_block(const int4_source* w, int64_t first, uint8_t* out) {
    const int64_t half = w->block_rows / 2;
    for (int64_t k = 0; k < w->K; k++)
        for (int64_t j = 0; j < half; j++)
            out[k * half + j] = nibble_at(w, first + j, k) | nibble_at(w, first + j + half, k) << 4;
}

// x quantised per row and group of g k in buffers of its own, as the int4 kernels take it.
typedef struct {
    int8_t* q;  // [G][M][g]: group-major, so that a group's rows lie side by side
    float* scale;  // [G][M]: a row and group's scale
    float* sum;  // [G][M]: that scale times the group's sum of q
} int4_x;

static void int4_x_free(int4_x* x) {
    free(x->q);
    free(x->scale);
    free(x->sum);
}

// Fresh buffers for x [M, K] in groups of g: 0, or -2 where memory ran out (nothing is then held).
static int int4_x_alloc(int64_t M, int64_t K, int64_t g, int4_x* out) {
    out->q = malloc(M * K);
    out->scale = malloc(sizeof(float) * M * (K / g));
    out->sum = malloc(sizeof(float) * M * (K / g));
    if (out->q == NULL || out->scale == NULL || out->sum == NULL) {
        int4_x_free(out);
        return -2;
    }
    return 0;
}
