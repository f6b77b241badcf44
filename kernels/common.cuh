// What every kernel header shares: storage types and their accumulator types, conversions,
// warp and block reductions, and a few math overloads that read the same in float and double.
//
// Storage type T (parameters, activations, gradients) is __nv_bfloat16, float or double; its
// accumulator type acc_t<T> is float for the first two and double for fp64 (DESIGN.md §4).
// Kernels load T into acc_t<T>, compute there, and round once on store (round to nearest even).
#pragma once

#include "platform/platform.h"

#include <cstdint>
#include <type_traits>

namespace pv {

// How a backward writes a weight gradient: added to what the buffer holds (micro-steps and tied
// weights add into one buffer), or written over it — the step's first writer, so the optimizer
// needs no memset before the step (Llama::discard_grads). An overwrite does not read the old
// contents: a buffer of NaN is fine.
enum class GradWrite { add, overwrite };

// A scalar kernel argument given by value, or, where `at` is set, read from device memory when the
// kernel runs. A CUDA graph launches its kernels with the arguments they were captured with; a
// value that changes between launches of one graph (a step's loss scale, a micro-batch's dropout
// key) is written to device memory before each launch and read through `at`.
// The most shared memory one block may opt in to on the current device (227 KiB on sm_90, 163 KiB
// on sm_80, 99 KiB on sm_86 and sm_89): a kernel whose block needs more cannot launch there.
inline size_t device_shared_bytes_per_block() {
    int device = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return size_t(bytes);
}

template <class X>
struct DeviceScalar {
    X value{};
    const X* at = nullptr;
    DeviceScalar() = default;
    DeviceScalar(X v) : value(v) {}  // NOLINT(google-explicit-constructor): a value is the common case
    static DeviceScalar in_memory(const X* p) {
        DeviceScalar s;
        s.at = p;
        return s;
    }
    __device__ X get() const { return at ? *at : value; }
};

template <class T>
struct Accumulator {
    using type = float;
};
template <>
struct Accumulator<double> {
    using type = double;
};
template <class T>
using acc_t = typename Accumulator<T>::type;

// Conversions between storage and accumulator types.
template <class T>
__host__ __device__ inline acc_t<T> to_acc(T v) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __bfloat162float(v);
    } else {
        return v;
    }
}
template <class T>
__host__ __device__ inline T from_acc(acc_t<T> v) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __float2bfloat16(v);  // round to nearest even
    } else {
        return T(v);
    }
}

// Math in the accumulator type (float or double), one name for both.
__device__ inline float acc_exp(float x) { return expf(x); }
__device__ inline double acc_exp(double x) { return exp(x); }
__device__ inline float acc_log(float x) { return logf(x); }
__device__ inline double acc_log(double x) { return log(x); }
__host__ __device__ inline float acc_sqrt(float x) { return sqrtf(x); }  // host too: optim/adamw_cpu.h
__host__ __device__ inline double acc_sqrt(double x) { return sqrt(x); }
__device__ inline float acc_rsqrt(float x) { return rsqrtf(x); }
__device__ inline double acc_rsqrt(double x) { return rsqrt(x); }
// Arithmetic rounded once per operation, never fused into an FMA: nvcc contracts a·b + c into
// one FMA wherever its optimiser sees fit, which differs between two kernels inlining the same
// expression (measured on an H100: AdamW's per-tensor and multi-tensor kernels disagreed in the
// last bit). Code whose result must not depend on where it is compiled (or must equal a CPU
// loop, where g++ never contracts in ISO C++ mode) spells its operations with these.
__host__ __device__ inline float acc_add(float a, float b) { PV_ROUNDED(__fadd_rn(a, b), a + b); }
__host__ __device__ inline double acc_add(double a, double b) { PV_ROUNDED(__dadd_rn(a, b), a + b); }
__host__ __device__ inline float acc_sub(float a, float b) { PV_ROUNDED(__fsub_rn(a, b), a - b); }
__host__ __device__ inline double acc_sub(double a, double b) { PV_ROUNDED(__dsub_rn(a, b), a - b); }
__host__ __device__ inline float acc_mul(float a, float b) { PV_ROUNDED(__fmul_rn(a, b), a * b); }
__host__ __device__ inline double acc_mul(double a, double b) { PV_ROUNDED(__dmul_rn(a, b), a * b); }
__host__ __device__ inline float acc_div(float a, float b) { PV_ROUNDED(__fdiv_rn(a, b), a / b); }
__host__ __device__ inline double acc_div(double a, double b) { PV_ROUNDED(__ddiv_rn(a, b), a / b); }
__device__ inline float acc_max(float a, float b) { return fmaxf(a, b); }
__device__ inline double acc_max(double a, double b) { return fmax(a, b); }
template <class A>
__device__ inline A acc_neg_infinity() {
    return -A(INFINITY);
}

// The sum over a full warp; every lane gets it. The butterfly order is fixed, so the result is
// deterministic.
template <class A>
__device__ inline A warp_sum(A v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
template <class A>
__device__ inline A warp_max(A v) {
    for (int offset = 16; offset > 0; offset /= 2) v = acc_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The sum over a block whose size is a multiple of 32 (up to 1024); every thread gets it.
// `scratch` is shared memory of at least 32 elements; it may be reused right after the call
// (the trailing barrier is part of the function).
template <class A>
__device__ inline A block_sum(A v, A* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    A total = 0;
    for (int w = 0; w < warps; ++w) total += scratch[w];  // the same order in every thread
    __syncthreads();
    return total;
}
template <class A>
__device__ inline A block_max(A v, A* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    A total = scratch[0];
    for (int w = 1; w < warps; ++w) total = acc_max(total, scratch[w]);
    __syncthreads();
    return total;
}

// Ceiling division for grid sizes.
__host__ __device__ constexpr inline int ceil_div(long long a, long long b) { return int((a + b - 1) / b); }

// cuBLAS's names for a storage type.
template <class T>
constexpr cudaDataType cuda_data_type() {
    if constexpr (std::is_same_v<T, double>)
        return CUDA_R_64F;
    else if constexpr (std::is_same_v<T, float>)
        return CUDA_R_32F;
    else
        return CUDA_R_16BF;
}
template <class T>
constexpr cublasComputeType_t cublas_compute_type() {
    return std::is_same_v<T, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
}

}  // namespace pv
