// The platform header: the one file in polevault that knows which backend it is built for.
//
// Product code includes this header and then writes ordinary CUDA C++ (threadIdx, __shared__,
// __syncthreads, warp shuffles, atomics, __nv_bfloat16) against NVIDIA's own headers. It launches
// kernels with
//
//     launch(kernel, grid, block, dynamic_smem_bytes, stream, args...);
//
// instead of kernel<<<grid, block, smem, stream>>>(args...), and declares dynamic shared memory
// with PV_DYNAMIC_SHARED(T, name) instead of `extern __shared__ T name[]`.
//
// - Under nvcc (BACKEND=cuda) launch() is the triple-chevron launch and PV_DYNAMIC_SHARED the
//   usual extern array; nothing else changes.
// - Under g++ (BACKEND=host) the device-side names come from host/device_api.h and the runtime,
//   cuBLAS and NCCL functions are implemented on the CPU in host/*.cpp with NVIDIA's signatures.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#if defined(__CUDACC__)

#define PV_BACKEND_NAME "cuda"

// One untyped extern array shared by every kernel: `extern __shared__ T name[]` with different T
// in different kernels is a redeclaration error under nvcc, so each kernel casts this one.
#define PV_DYNAMIC_SHARED(T, name)                                    \
    extern __shared__ __align__(16) unsigned char pv_dynamic_smem_[]; \
    T* name = reinterpret_cast<T*>(pv_dynamic_smem_)

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "launch: wrong number of kernel arguments");
    kernel<<<grid, block, smem_bytes, stream>>>(std::forward<A>(args)...);
}

#else  // the host (CPU) backend

#define PV_BACKEND_NAME "host"
#include "host/device_api.h"

#endif

namespace pv {

// True when the build runs kernels on the CPU emulation (tests use this only to decide which
// host-only diagnostics they can exercise, never to change what product code does).
constexpr bool kHostBackend =
#if defined(__CUDACC__)
    false;
#else
    true;
#endif

// True in the ThreadSanitizer build (test-tsan), where every emulated thread costs a fresh fiber:
// tests run their smallest shapes there.
constexpr bool kThreadSanitizer =
#if defined(POLEVAULT_TSAN)
    true;
#else
    false;
#endif

// True in the ASan/UBSan build (test-asan).
constexpr bool kAddressSanitizer =
#if defined(__SANITIZE_ADDRESS__)
    true;
#else
    false;
#endif

[[noreturn]] inline void fail_cuda_call(const char* what, const char* error, const char* file, int line) {
    std::fprintf(stderr, "polevault: %s failed: %s (%s:%d)\n", what, error, file, line);
    std::fflush(stderr);
    std::abort();
}

}  // namespace pv

// Checks a CUDA runtime call; on failure prints the call, the error and the source line, then aborts.
#define CUDA_CHECK(call)                                                                                          \
    do {                                                                                                          \
        const cudaError_t pv_err_ = (call);                                                                       \
        if (pv_err_ != cudaSuccess) ::pv::fail_cuda_call(#call, cudaGetErrorString(pv_err_), __FILE__, __LINE__); \
    } while (0)

// Checks a cuBLAS call the same way.
#define CUBLAS_CHECK(call)                                                                  \
    do {                                                                                    \
        const cublasStatus_t pv_st_ = (call);                                               \
        if (pv_st_ != CUBLAS_STATUS_SUCCESS)                                                \
            ::pv::fail_cuda_call(#call, cublasGetStatusString(pv_st_), __FILE__, __LINE__); \
    } while (0)

// Checks that the last kernel launch was accepted (launch configuration errors).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
