// The device side of CUDA C++ for kernels compiled by g++ (BACKEND=host). Included only by
// kernels/platform.h, after NVIDIA's headers.
//
// A kernel launch runs each block on one worker OS thread; the block's threads run as fibers
// that switch only at barriers and warp collectives (host/block_runner.cpp). So:
// - threadIdx reads the current fiber's record; blockIdx/blockDim/gridDim the worker's block;
// - __shared__ is `thread_local`: one copy per worker OS thread, i.e. per running block, shared
//   by all fibers of that block (a block-scope thread_local is implicitly static);
// - barriers and warp collectives take a std::source_location default argument so that a
//   diagnostic can name the kernel and line (CUDA's own signatures stay callable unchanged);
// - atomics are real atomics: blocks of one launch run concurrently on several OS threads.
//
// The overload sets mirror what the CUDA headers declare (host-platform-facts.md), so code that
// compiles here compiles under nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

#undef __shared__
#define __shared__ thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace pv::host {

// One emulated CUDA thread as kernel code sees it (the rest lives in block_runner.cpp).
struct ThreadIndex {
    uint3 thread_idx;
};

// What the running block looks like to kernel code on this worker.
struct BlockIndex {
    uint3 block_idx;
    uint3 block_dim;
    uint3 grid_dim;
    unsigned char* dynamic_smem;
};

extern __thread const ThreadIndex* tls_thread;
extern __thread BlockIndex tls_block;

// The kinds of warp collective; the block runner computes every lane's result once all lanes
// of the mask have arrived.
enum class WarpOp : uint8_t {
    shfl_idx,
    shfl_up,
    shfl_down,
    shfl_xor,
    ballot,
    any,
    all,
    sync,
    reduce_add,
    reduce_min,
    reduce_max,
    reduce_and,
    reduce_or,
    reduce_xor,
    exchange  // mma, ldmatrix: host/warp_matrix.h
};

// A barrier over the whole block; returns the count of threads whose predicate was non-zero.
int block_barrier(int predicate, std::source_location site);
// A collective over the lanes of `mask`: `bits` is this lane's value (up to 8 bytes), `arg` the
// source lane / delta / lane mask, `width` the shuffle segment, `is_signed` for reduce min/max.
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, bool is_signed,
                         std::source_location site);
unsigned active_mask();

// The type-erased kernel a launch runs in every thread: invoke(closure).
struct KernelLaunch {
    const void* kernel;  // the kernel's address: names it in diagnostics, keys its attributes
    dim3 grid, block;
    size_t smem_bytes;
    void (*invoke)(const void* closure);
    std::shared_ptr<const void> closure;  // kept alive until the launch has run
    uint64_t sequence = 0;                // the process's n-th launch (keys the schedule's choices)
};
// Validates the configuration (errors as cudaGetLastError reports them) and queues the grid.
void launch_kernel(KernelLaunch launch, cudaStream_t stream);

template <class T>
uint64_t to_bits(T v) {
    // CUDA's bf16/half types are not trivially copyable in C++ terms, but are plain bits.
    static_assert(sizeof(T) <= 8);
    uint64_t b = 0;
    std::memcpy(&b, static_cast<const void*>(&v), sizeof(T));
    return b;
}
template <class T>
T from_bits(uint64_t b) {
    T v;
    std::memcpy(static_cast<void*>(&v), &b, sizeof(T));
    return v;
}

}  // namespace pv::host

// ---- built-in variables -------------------------------------------------------------------
#define threadIdx (static_cast<const uint3&>(::pv::host::tls_thread->thread_idx))
#define blockIdx (static_cast<const uint3&>(::pv::host::tls_block.block_idx))
#define blockDim (static_cast<const uint3&>(::pv::host::tls_block.block_dim))
#define gridDim (static_cast<const uint3&>(::pv::host::tls_block.grid_dim))
constexpr int warpSize = 32;

// ---- launch ---------------------------------------------------------------------------------
// Converts the arguments once to the kernel's parameter types; every emulated thread then calls
// the kernel with its own by-value copies, as CUDA threads each see the parameters.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "launch: wrong number of kernel arguments");
    struct Closure {
        void (*kernel)(P...);
        std::tuple<std::decay_t<P>...> params;
    };
    auto closure = std::make_shared<const Closure>(Closure{kernel, {std::forward<A>(args)...}});
    auto invoke = [](const void* c) {
        const auto* cl = static_cast<const Closure*>(c);
        std::apply(cl->kernel, cl->params);
    };
    ::pv::host::launch_kernel({reinterpret_cast<const void*>(kernel), grid, block, smem_bytes, invoke, closure},
                              stream);
}

// cuda_runtime.h declares this typed convenience overload only for nvcc.
template <class T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

#define PV_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::pv::host::tls_block.dynamic_smem)

// ---- barriers -------------------------------------------------------------------------------
inline void __syncthreads(std::source_location site = std::source_location::current()) {
    ::pv::host::block_barrier(0, site);
}
inline int __syncthreads_count(int predicate, std::source_location site = std::source_location::current()) {
    return ::pv::host::block_barrier(predicate != 0, site);
}
inline int __syncthreads_and(int predicate, std::source_location site = std::source_location::current()) {
    return ::pv::host::block_barrier(predicate != 0, site) == int(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int predicate, std::source_location site = std::source_location::current()) {
    return ::pv::host::block_barrier(predicate != 0, site) > 0;
}
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location site = std::source_location::current()) {
    ::pv::host::warp_collective(::pv::host::WarpOp::sync, mask, 0, 0, warpSize, false, site);
}
// Every block of a launch runs on the same machine with coherent caches: fences only need to stop
// the compiler and CPU from reordering.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- warp collectives -----------------------------------------------------------------------
inline unsigned __activemask() { return ::pv::host::active_mask(); }
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location site = std::source_location::current()) {
    return unsigned(
        ::pv::host::warp_collective(::pv::host::WarpOp::ballot, mask, predicate != 0, 0, warpSize, false, site));
}
inline int __any_sync(unsigned mask, int predicate, std::source_location site = std::source_location::current()) {
    return int(::pv::host::warp_collective(::pv::host::WarpOp::any, mask, predicate != 0, 0, warpSize, false, site));
}
inline int __all_sync(unsigned mask, int predicate, std::source_location site = std::source_location::current()) {
    return int(::pv::host::warp_collective(::pv::host::WarpOp::all, mask, predicate != 0, 0, warpSize, false, site));
}

// The shuffle overloads CUDA declares (sm_80+): int, unsigned, long, unsigned long, long long,
// unsigned long long, float, double, __half, __half2, __nv_bfloat16, __nv_bfloat162.
#define PV_DEFINE_SHUFFLES(T)                                                                                \
    inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize,                            \
                         std::source_location site = std::source_location::current()) {                      \
        return ::pv::host::from_bits<T>(::pv::host::warp_collective(                                         \
            ::pv::host::WarpOp::shfl_idx, mask, ::pv::host::to_bits(var), srcLane, width, false, site));     \
    }                                                                                                        \
    inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,                  \
                            std::source_location site = std::source_location::current()) {                   \
        return ::pv::host::from_bits<T>(::pv::host::warp_collective(                                         \
            ::pv::host::WarpOp::shfl_up, mask, ::pv::host::to_bits(var), int(delta), width, false, site));   \
    }                                                                                                        \
    inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,                \
                              std::source_location site = std::source_location::current()) {                 \
        return ::pv::host::from_bits<T>(::pv::host::warp_collective(                                         \
            ::pv::host::WarpOp::shfl_down, mask, ::pv::host::to_bits(var), int(delta), width, false, site)); \
    }                                                                                                        \
    inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,                       \
                             std::source_location site = std::source_location::current()) {                  \
        return ::pv::host::from_bits<T>(::pv::host::warp_collective(                                         \
            ::pv::host::WarpOp::shfl_xor, mask, ::pv::host::to_bits(var), laneMask, width, false, site));    \
    }
PV_DEFINE_SHUFFLES(int)
PV_DEFINE_SHUFFLES(unsigned int)
PV_DEFINE_SHUFFLES(long)
PV_DEFINE_SHUFFLES(unsigned long)
PV_DEFINE_SHUFFLES(long long)
PV_DEFINE_SHUFFLES(unsigned long long)
PV_DEFINE_SHUFFLES(float)
PV_DEFINE_SHUFFLES(double)
PV_DEFINE_SHUFFLES(__half)
PV_DEFINE_SHUFFLES(__half2)
PV_DEFINE_SHUFFLES(__nv_bfloat16)
PV_DEFINE_SHUFFLES(__nv_bfloat162)
#undef PV_DEFINE_SHUFFLES

// sm_80 warp reductions: add/min/max on int and unsigned, and/or/xor on unsigned.
#define PV_DEFINE_WARP_REDUCE(name, op, T)                                                                         \
    inline T name(unsigned mask, T value, std::source_location site = std::source_location::current()) {           \
        return T(::pv::host::warp_collective(::pv::host::WarpOp::op, mask, uint64_t(uint32_t(value)), 0, warpSize, \
                                             std::is_signed_v<T>, site));                                          \
    }
PV_DEFINE_WARP_REDUCE(__reduce_add_sync, reduce_add, unsigned)
PV_DEFINE_WARP_REDUCE(__reduce_add_sync, reduce_add, int)
PV_DEFINE_WARP_REDUCE(__reduce_min_sync, reduce_min, unsigned)
PV_DEFINE_WARP_REDUCE(__reduce_min_sync, reduce_min, int)
PV_DEFINE_WARP_REDUCE(__reduce_max_sync, reduce_max, unsigned)
PV_DEFINE_WARP_REDUCE(__reduce_max_sync, reduce_max, int)
PV_DEFINE_WARP_REDUCE(__reduce_and_sync, reduce_and, unsigned)
PV_DEFINE_WARP_REDUCE(__reduce_or_sync, reduce_or, unsigned)
PV_DEFINE_WARP_REDUCE(__reduce_xor_sync, reduce_xor, unsigned)
#undef PV_DEFINE_WARP_REDUCE

// ---- atomics (exactly CUDA's overloads; see host-platform-facts.md) --------------------------
// Relaxed, as CUDA's atomics are: they order nothing else, so under ThreadSanitizer they do not
// hide a race on other memory behind a happens-before edge CUDA does not promise.
namespace pv::host {
inline constexpr auto relaxed = std::memory_order_relaxed;
template <class T>
std::atomic_ref<T> atomic_at(T* address) {
    return std::atomic_ref<T>(*address);
}
// Read-modify-write by compare-and-swap, for the operations std::atomic_ref lacks.
template <class T, class F>
T atomic_update(T* address, F f) {
    auto ref = atomic_at(address);
    T old = ref.load(relaxed);
    while (!ref.compare_exchange_weak(old, f(old), relaxed)) {}
    return old;
}
template <class T, class F>
T atomic_update_bits(T* address, F f) {  // for 16-bit types without atomic_ref support
    static_assert(sizeof(T) == 2);
    auto* raw = reinterpret_cast<unsigned short*>(address);
    unsigned short old_bits = atomic_update(raw, [&](unsigned short bits) {
        const T r = f(from_bits<T>(bits));
        return static_cast<unsigned short>(to_bits(r));
    });
    return from_bits<T>(old_bits);
}
}  // namespace pv::host

inline int atomicAdd(int* a, int v) { return pv::host::atomic_at(a).fetch_add(v, pv::host::relaxed); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return pv::host::atomic_at(a).fetch_add(v, pv::host::relaxed); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
    return pv::host::atomic_at(a).fetch_add(v, pv::host::relaxed);
}
inline float atomicAdd(float* a, float v) { return pv::host::atomic_at(a).fetch_add(v, pv::host::relaxed); }
inline double atomicAdd(double* a, double v) { return pv::host::atomic_at(a).fetch_add(v, pv::host::relaxed); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* a, __nv_bfloat16 v) {
    return pv::host::atomic_update_bits(
        a, [v](__nv_bfloat16 x) { return __float2bfloat16(__bfloat162float(x) + __bfloat162float(v)); });
}
inline __half atomicAdd(__half* a, __half v) {
    return pv::host::atomic_update_bits(a, [v](__half x) { return __float2half(__half2float(x) + __half2float(v)); });
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* a, __nv_bfloat162 v) {
    // CUDA guarantees atomicity per 16-bit half only; one 32-bit CAS is stronger and fine.
    auto* raw = reinterpret_cast<unsigned*>(a);
    const unsigned old = pv::host::atomic_update(raw, [v](unsigned bits) {
        const auto x = pv::host::from_bits<__nv_bfloat162>(bits);
        const __nv_bfloat162 r =
            __floats2bfloat162_rn(__low2float(x) + __low2float(v), __high2float(x) + __high2float(v));
        return unsigned(pv::host::to_bits(r));
    });
    return pv::host::from_bits<__nv_bfloat162>(old);
}
inline int atomicSub(int* a, int v) { return pv::host::atomic_at(a).fetch_sub(v, pv::host::relaxed); }
inline unsigned atomicSub(unsigned* a, unsigned v) { return pv::host::atomic_at(a).fetch_sub(v, pv::host::relaxed); }
inline int atomicExch(int* a, int v) { return pv::host::atomic_at(a).exchange(v, pv::host::relaxed); }
inline unsigned atomicExch(unsigned* a, unsigned v) { return pv::host::atomic_at(a).exchange(v, pv::host::relaxed); }
inline unsigned long long atomicExch(unsigned long long* a, unsigned long long v) {
    return pv::host::atomic_at(a).exchange(v, pv::host::relaxed);
}
inline float atomicExch(float* a, float v) { return pv::host::atomic_at(a).exchange(v, pv::host::relaxed); }
#define PV_DEFINE_ATOMIC_MINMAX(T)                                             \
    inline T atomicMax(T* a, T v) {                                            \
        return pv::host::atomic_update(a, [v](T x) { return x > v ? x : v; }); \
    }                                                                          \
    inline T atomicMin(T* a, T v) {                                            \
        return pv::host::atomic_update(a, [v](T x) { return x < v ? x : v; }); \
    }
PV_DEFINE_ATOMIC_MINMAX(int)
PV_DEFINE_ATOMIC_MINMAX(unsigned)
PV_DEFINE_ATOMIC_MINMAX(long long)
PV_DEFINE_ATOMIC_MINMAX(unsigned long long)
#undef PV_DEFINE_ATOMIC_MINMAX
#define PV_DEFINE_ATOMIC_CAS(T)                                                        \
    inline T atomicCAS(T* a, T compare, T v) {                                         \
        pv::host::atomic_at(a).compare_exchange_strong(compare, v, pv::host::relaxed); \
        return compare;                                                                \
    }
PV_DEFINE_ATOMIC_CAS(int)
PV_DEFINE_ATOMIC_CAS(unsigned)
PV_DEFINE_ATOMIC_CAS(unsigned long long)
PV_DEFINE_ATOMIC_CAS(unsigned short)
#undef PV_DEFINE_ATOMIC_CAS
#define PV_DEFINE_ATOMIC_BITS(T)                                                                     \
    inline T atomicAnd(T* a, T v) { return pv::host::atomic_at(a).fetch_and(v, pv::host::relaxed); } \
    inline T atomicOr(T* a, T v) { return pv::host::atomic_at(a).fetch_or(v, pv::host::relaxed); }   \
    inline T atomicXor(T* a, T v) { return pv::host::atomic_at(a).fetch_xor(v, pv::host::relaxed); }
PV_DEFINE_ATOMIC_BITS(int)
PV_DEFINE_ATOMIC_BITS(unsigned)
PV_DEFINE_ATOMIC_BITS(unsigned long long)
#undef PV_DEFINE_ATOMIC_BITS
// ((old >= limit) ? 0 : old + 1) and (((old == 0) || (old > limit)) ? limit : old - 1), as CUDA defines them.
inline unsigned atomicInc(unsigned* a, unsigned limit) {
    return pv::host::atomic_update(a, [limit](unsigned x) { return x >= limit ? 0u : x + 1; });
}
inline unsigned atomicDec(unsigned* a, unsigned limit) {
    return pv::host::atomic_update(a, [limit](unsigned x) { return (x == 0 || x > limit) ? limit : x - 1; });
}

// ---- device math intrinsics -----------------------------------------------------------------
// The fast-math intrinsics compute the precise value here; tests compare with tolerances that
// cover the GPU's approximations.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x), *c = std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double x) { return std::sqrt(x); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(unsigned(x)); }
inline int __clzll(long long x) { return std::countl_zero((unsigned long long)x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(unsigned(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero((unsigned long long)x) + 1; }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
template <class T>
T __ldg(const T* p) {
    return *p;
}
// CUDA's min/max overloads for one type (it also has mixed signed/unsigned ones; here those are
// ambiguous, which only asks for an explicit cast that nvcc accepts too).
#define PV_DEFINE_MIN_MAX(T)                         \
    inline T min(T a, T b) { return b < a ? b : a; } \
    inline T max(T a, T b) { return a < b ? b : a; }
PV_DEFINE_MIN_MAX(int)
PV_DEFINE_MIN_MAX(unsigned)
PV_DEFINE_MIN_MAX(long)
PV_DEFINE_MIN_MAX(unsigned long)
PV_DEFINE_MIN_MAX(long long)
PV_DEFINE_MIN_MAX(unsigned long long)
#undef PV_DEFINE_MIN_MAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
// bf16 arithmetic missing from cuda_bf16.h on the host (its device-only functions).
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return __float2bfloat16(std::fma(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}
inline __nv_bfloat16 hexp(__nv_bfloat16 x) { return __float2bfloat16(std::exp(__bfloat162float(x))); }
inline __nv_bfloat16 hsqrt(__nv_bfloat16 x) { return __float2bfloat16(std::sqrt(__bfloat162float(x))); }
inline __nv_bfloat16 hrsqrt(__nv_bfloat16 x) { return __float2bfloat16(1.0f / std::sqrt(__bfloat162float(x))); }
long long clock64();
inline void __nanosleep(unsigned) {}

namespace pv {
// platform.h's ex2.approx.ftz.f32 (the SFU's 2^x, inline PTX there): exactly rounded here, a
// subnormal result flushed to zero as the GPU's is.
inline float exp2_ftz(float x) {
    const float y = std::exp2(x);
    return y < 0x1p-126f ? 0.0f : y;
}
}  // namespace pv

// ---- warp-level matrix instructions (mma, ldmatrix, cp.async) --------------------------------
#include "host/warp_matrix.h"
