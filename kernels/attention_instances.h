// The attention launchers of kernels/attention.cuh, compiled once for every program: their
// instantiations live in model/attention_kernels.cu (the product archive), and a translation unit
// that includes this header instead of attention.cuh calls them there rather than compiling its own
// copy of every kernel (the tensor-core backward alone is 14 kernels, one per head dim and pass).
// That was the largest single cost of the CUDA and host builds in the files that dispatch
// attention (model/llama.cu, test_attention, kernels_bench). A file that must compile the kernels
// itself includes kernels/attention.cuh alone: the traffic test instruments its own copies.
#pragma once

#include "kernels/attention.cuh"

// Every launcher template at the types and head dims programs call it with, as explicit
// instantiations: declarations with EXTERN = extern (below), their definitions with EXTERN empty
// (model/attention_kernels.cu), so the one list serves both.
#define POLEVAULT_ATTENTION_INSTANCES_OF_TYPE(EXTERN, T)                                                               \
    EXTERN template void attention_forward<T>(const T*, const int*, T*, acc_t<T>*, void*, int, int, int, int, int,     \
                                              cudaStream_t, bool);                                                     \
    EXTERN template void attention_backward<T>(const T*, const int*, const T*, const T*, const acc_t<T>*, T*, void*,   \
                                               int, int, int, int, int, cudaStream_t);                                 \
    EXTERN template void attention_backward_cuda_cores<T>(const T*, const int*, const T*, const acc_t<T>*,             \
                                                          const acc_t<T>*, T*, int, int, int, int, int, cudaStream_t); \
    EXTERN template void attention_forward_launch<T, 0>(const T*, const int*, T*, acc_t<T>*, int, int, int, int, int,  \
                                                        cudaStream_t);                                                 \
    EXTERN template void attention_forward_launch<T, 64>(const T*, const int*, T*, acc_t<T>*, int, int, int, int, int, \
                                                         cudaStream_t);                                                \
    EXTERN template void attention_forward_launch<T, 128>(const T*, const int*, T*, acc_t<T>*, int, int, int, int,     \
                                                          int, cudaStream_t);

#define POLEVAULT_ATTENTION_MMA_FORWARD_INSTANCE(EXTERN, HD)                                                        \
    EXTERN template void attention_mma_forward_launch<HD>(const __nv_bfloat16*, const int*, __nv_bfloat16*, float*, \
                                                          int, int, int, int, cudaStream_t, int, float*, int);
#define POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, HD)                                                         \
    EXTERN template void attention_mma_backward_launch<HD>(                                                           \
        const __nv_bfloat16*, const int*, const __nv_bfloat16*, const float*, const float*, __nv_bfloat16*, int, int, \
        int, int, cudaStream_t, AttentionMmaRows, AttentionMmaSplit, float*, int, int);

#define POLEVAULT_ATTENTION_INSTANCES(EXTERN)                    \
    POLEVAULT_ATTENTION_INSTANCES_OF_TYPE(EXTERN, __nv_bfloat16) \
    POLEVAULT_ATTENTION_INSTANCES_OF_TYPE(EXTERN, float)         \
    POLEVAULT_ATTENTION_INSTANCES_OF_TYPE(EXTERN, double)        \
    POLEVAULT_ATTENTION_MMA_FORWARD_INSTANCE(EXTERN, 64)         \
    POLEVAULT_ATTENTION_MMA_FORWARD_INSTANCE(EXTERN, 128)        \
    POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, 32)        \
    POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, 48)        \
    POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, 64)        \
    POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, 80)        \
    POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, 96)        \
    POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, 112)       \
    POLEVAULT_ATTENTION_MMA_BACKWARD_INSTANCE(EXTERN, 128)

namespace pv {

POLEVAULT_ATTENTION_INSTANCES(extern)

}  // namespace pv
