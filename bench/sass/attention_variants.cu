// The tensor-core attention kernels with one tile body each (Path 1: the interior tiles' body
// only, 2: the masked tiles' only), for bench/attention_sass.py, which counts a trip through each
// body in their SASS (a loop with both is hard to read there: nvcc may give it two back edges or
// merge the bodies' common tails). Compiled by bench/ptxas_report.sh alone; no program runs these
// (hence not in bench/, whose every .cu file is a program the Makefile builds).
// Every head dim model/attention_kernels.cu instantiates must be here (the script checks).
#include "kernels/attention_mma_backward.cuh"
#include "kernels/attention_mma_forward.cuh"

namespace pv {

#define POLEVAULT_ATTENTION_FORWARD_BODY(HD, PATH)                                                                    \
    template __global__ void attention_mma_forward_kernel<HD, PATH>(const __nv_bfloat16*, const int*, __nv_bfloat16*, \
                                                                    float*, int, int, int, int, int, float*, int);
#define POLEVAULT_ATTENTION_BACKWARD_BODY(HD, PATH)                                                                    \
    template __global__ void attention_mma_dkv_kernel<HD, PATH>(const __nv_bfloat16*, const int*,                      \
                                                                const __nv_bfloat16*, const float*, const float*,      \
                                                                __nv_bfloat16*, int, int, int, int, float*, int);      \
    template __global__ void attention_mma_dq_kernel<HD, PATH>(const __nv_bfloat16*, const int*, const __nv_bfloat16*, \
                                                               const float*, const float*, __nv_bfloat16*, int, int,   \
                                                               int, int, float*, int);
// The dK/dV kernel with swizzled shared rows (the head dims attention_mma_dkv_has_swizzled names).
#define POLEVAULT_ATTENTION_DKV_SWIZZLED_BODY(HD, PATH)                                                               \
    template __global__ void attention_mma_dkv_kernel<HD, PATH, AttentionMmaRows::swizzled>(                          \
        const __nv_bfloat16*, const int*, const __nv_bfloat16*, const float*, const float*, __nv_bfloat16*, int, int, \
        int, int, float*, int);
// The forward with warps of 32 rows (two 16-row tiles: the head dims attention_mma_forward_row_tiles
// gives 2 on some device, 64).
#define POLEVAULT_ATTENTION_FORWARD_32_ROWS_BODY(HD, PATH)                     \
    template __global__ void attention_mma_forward_kernel<HD, PATH, false, 2>( \
        const __nv_bfloat16*, const int*, __nv_bfloat16*, float*, int, int, int, int, int, float*, int);
// dQ with warps of 32 rows (attention_mma_dq_row_tiles gives 2 on some device at hd 64).
#define POLEVAULT_ATTENTION_DQ_32_ROWS_BODY(HD, PATH)                                                                 \
    template __global__ void attention_mma_dq_kernel<HD, PATH, false, 2>(                                             \
        const __nv_bfloat16*, const int*, const __nv_bfloat16*, const float*, const float*, __nv_bfloat16*, int, int, \
        int, int, float*, int);
// dK/dV with warps of 32 keys (attention_mma_dkv_row_tiles gives 2 on some device at hd 64).
#define POLEVAULT_ATTENTION_DKV_32_ROWS_BODY(HD, PATH)                                                                \
    template __global__ void attention_mma_dkv_kernel<HD, PATH, AttentionMmaRows::padded, false, 2>(                  \
        const __nv_bfloat16*, const int*, const __nv_bfloat16*, const float*, const float*, __nv_bfloat16*, int, int, \
        int, int, float*, int);
#define POLEVAULT_ATTENTION_FORWARD_BODIES(HD) \
    POLEVAULT_ATTENTION_FORWARD_BODY(HD, 1)    \
    POLEVAULT_ATTENTION_FORWARD_BODY(HD, 2)
#define POLEVAULT_ATTENTION_BACKWARD_BODIES(HD) \
    POLEVAULT_ATTENTION_BACKWARD_BODY(HD, 1)    \
    POLEVAULT_ATTENTION_BACKWARD_BODY(HD, 2)

POLEVAULT_ATTENTION_FORWARD_BODIES(64)
POLEVAULT_ATTENTION_FORWARD_BODIES(128)
POLEVAULT_ATTENTION_FORWARD_32_ROWS_BODY(64, 1)
POLEVAULT_ATTENTION_FORWARD_32_ROWS_BODY(64, 2)
POLEVAULT_ATTENTION_DQ_32_ROWS_BODY(64, 1)
POLEVAULT_ATTENTION_DQ_32_ROWS_BODY(64, 2)
POLEVAULT_ATTENTION_DKV_32_ROWS_BODY(64, 1)
POLEVAULT_ATTENTION_DKV_32_ROWS_BODY(64, 2)
POLEVAULT_ATTENTION_BACKWARD_BODIES(32)
POLEVAULT_ATTENTION_BACKWARD_BODIES(48)
POLEVAULT_ATTENTION_BACKWARD_BODIES(64)
POLEVAULT_ATTENTION_BACKWARD_BODIES(80)
POLEVAULT_ATTENTION_BACKWARD_BODIES(96)
POLEVAULT_ATTENTION_BACKWARD_BODIES(112)
POLEVAULT_ATTENTION_BACKWARD_BODIES(128)
POLEVAULT_ATTENTION_DKV_SWIZZLED_BODY(128, 1)
POLEVAULT_ATTENTION_DKV_SWIZZLED_BODY(128, 2)

}  // namespace pv
