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

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#if defined(__CUDACC__)

#define PV_BACKEND_NAME "cuda"

// The body of a __host__ __device__ function that must round each operation on its own
// (kernels/common.cuh acc_add, ...): the device's _rn intrinsic, which nvcc never fuses into an
// FMA; in host code the plain operator (g++ contracts nothing in ISO C++ mode).
#if defined(__CUDA_ARCH__)
#define PV_ROUNDED(device_intrinsic, host_expression) return device_intrinsic
#else
#define PV_ROUNDED(device_intrinsic, host_expression) return host_expression
#endif

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

// The warp-level matrix instructions of sm_80+ as inline PTX (the host backend implements the
// same API as warp collectives: host/warp_matrix.h, which documents the fragment layouts).
namespace pv {

// D = A·B + C, mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16. The "memory" clobber keeps the
// compiler from moving shared-memory stores across it.
__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(shared_address(smem_row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(smem_row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(smem_row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(shared_address(smem_row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(smem_row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(smem_row))
                 : "memory");
}

// cp.async.cg.shared.global, 16 bytes. The _ignore_src form takes PTX's ignore-src predicate: when
// it is set, the 16 bytes are zeros and the source is not read (its address need not be valid), so a
// tile's rows past the end of a tensor cost one predicate, where a src-size operand cost a select
// of the size and, to keep an unread address valid, of the 64-bit source too.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* global_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(smem_dst)), "l"(global_src)
                 : "memory");
}
__device__ __forceinline__ void cp_async_16_ignore_src(void* smem_dst, const void* global_src, bool ignore_src) {
    asm volatile(
        "{\n .reg .pred ignore;\n setp.ne.b32 ignore, %2, 0;\n"
        " cp.async.cg.shared.global [%0], [%1], 16, ignore;\n}\n" ::"r"(shared_address(smem_dst)),
        "l"(global_src), "r"(int(ignore_src))
        : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// 2^x in one SFU instruction (ex2.approx.ftz.f32: relative error about 2^-22, a subnormal argument
// or result flushed to zero, 2^-inf = +0), where exp2f adds range handling around it for
// subnormals (attention's softmax needs none: its exponents are at most 0).
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace pv

#else  // the host (CPU) backend

#define PV_BACKEND_NAME "host"
#define PV_ROUNDED(device_intrinsic, host_expression) return host_expression
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
