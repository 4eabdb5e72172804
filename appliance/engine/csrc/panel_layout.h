// The packed weights' layout, written here alone: output columns per panel of the fp32 GEMM (panel16.h's
// tile: two 8-lane vectors) and of the bf16 and int8 GEMMs (group_panels.h: two 16-lane vectors of 4-byte k
// groups), and the shape of a packed weight. The kernels pack and read by it, cpu_ops.cpp checks against it,
// and cpu_kernels.py asks the built library for it (`torch.ops.appliance.packed_shape`).
#pragma once

#include <stdint.h>

#define PANEL 16   // fp32: [ceil(N/16)][K][16], one k at a time
#define BPANEL 32  // bf16 and int8: [ceil(N/32)][ceil(K/g)][32][g], g k side by side in 4 bytes

// The packed shape of an [N, K] weight of `es`-byte elements (4: fp32; 2: bf16 pairs; 1: int8 quads).
static inline void packed_shape(int64_t N, int64_t K, int64_t es, int64_t shape[3]) {
    if (es == 4) {
        shape[0] = (N + PANEL - 1) / PANEL, shape[1] = K, shape[2] = PANEL;
        return;
    }
    const int64_t g = 4 / es;
    shape[0] = (N + BPANEL - 1) / BPANEL, shape[1] = (K + g - 1) / g, shape[2] = g * BPANEL;
}
