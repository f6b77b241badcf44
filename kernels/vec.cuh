// 16-byte vector access for the bandwidth-bound kernels, and the grid-stride loop they share.
//
// A GPU moves memory fastest in 16-byte transactions per thread (LDG.E.128 / STG.E.128): 8 bf16,
// 4 float or 2 double per instruction instead of one 2-, 4- or 8-byte element. kVec<T> is that
// width in elements. Vec<T, W> is W consecutive elements held in registers; load_vec / store_vec
// move one with a single instruction when W·sizeof(T) is 2, 4, 8 or 16 bytes (several 16-byte
// instructions when it is a larger multiple of 16), and element by element otherwise.
//
// Alignment: a vector access must start on a multiple of its size, or the GPU faults. Our
// allocations and tensor views are 256-byte aligned, but rows of odd widths and views at odd
// offsets need not be, so a launcher decides once, on the host, with vec_aligned(pointers...):
// the vector path when every base is 16-byte aligned (and the shape divides the width where a
// kernel needs that), the scalar path (W = 1) otherwise. The same kernel body serves both: W is a
// template parameter. The host build checks the alignment of every vector access (an assert), so a
// launcher that picks the vector path wrongly fails the tests instead of faulting on a GPU.
//
// elementwise_loop runs an elementwise operation over [0, n): thread g of the grid takes chunks
// (W elements) g, g + S, g + 2S, ... (S = the grid's thread count), kUnroll chunks per trip, all
// loaded before any is computed and stored (the trip counts are compile-time constants, so the
// loops unroll), so each thread has kUnroll·(inputs) 16-byte loads in
// flight (the loads cannot move past the stores by themselves: outputs may alias inputs). The
// n mod W elements past the last whole chunk (the tail) go to the first threads, one each. The
// index type I is int when n allows (32-bit multiplies and divisions are a quarter the cost of
// 64-bit ones), long long otherwise; elementwise_index_fits tells.
//
// An operation (Op) is a struct passed by value to the kernel with
//   template <int W, class I> In<W> load(I i) const;                 read elements [i, i + W)
//   template <int W, class I> void store(I i, const In<W>& in) const; compute and write them
// where In<W> is whatever the operation reads (vectors of its inputs, indices it derived).
#pragma once

#include "kernels/common.cuh"

#include <cassert>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

namespace pv {

// Elements of T in 16 bytes: 8 bf16, 4 float, 2 double.
template <class T>
inline constexpr int kVec = int(16 / sizeof(T));

// Chunks each thread of elementwise_loop loads before it computes.
inline constexpr int kUnroll = 2;

// W consecutive elements of T in registers.
template <class T, int W>
struct Vec {
    T v[W];
};

// The unsigned word of a given size, for one-instruction loads and stores.
template <int Bytes>
struct VecWord;
template <>
struct VecWord<2> {
    using type = unsigned short;
};
template <>
struct VecWord<4> {
    using type = unsigned;
};
template <>
struct VecWord<8> {
    using type = uint2;
};
template <>
struct VecWord<16> {
    using type = uint4;
};

// The host build checks that a vector access is aligned to its size (a GPU would fault).
__host__ __device__ inline void check_vec_alignment(const void* p, int bytes) {
    if constexpr (kHostBackend) assert(reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0);
}

template <int W, class T>
__device__ inline Vec<T, W> load_vec(const T* p) {
    constexpr int bytes = int(sizeof(T)) * W;
    Vec<T, W> out;
    if constexpr (bytes == 2 || bytes == 4 || bytes == 8 || bytes == 16) {
        using Word = typename VecWord<bytes>::type;
        check_vec_alignment(p, bytes);
        const Word w = *reinterpret_cast<const Word*>(p);
        memcpy(static_cast<void*>(&out.v[0]), &w, bytes);
    } else if constexpr (bytes % 16 == 0) {
        check_vec_alignment(p, 16);
        for (int k = 0; k < bytes / 16; ++k) {
            const uint4 w = reinterpret_cast<const uint4*>(p)[k];
            memcpy(reinterpret_cast<unsigned char*>(static_cast<void*>(&out.v[0])) + 16 * k, &w, 16);
        }
    } else {
        for (int k = 0; k < W; ++k) out.v[k] = p[k];
    }
    return out;
}

// The bits of one element, as an unsigned integer of its size.
template <class T>
__device__ inline unsigned long long vec_element_bits(T v) {
    if constexpr (sizeof(T) == 2) {
        unsigned short b;
        memcpy(&b, static_cast<const void*>(&v), 2);
        return b;
    } else if constexpr (sizeof(T) == 4) {
        unsigned b;
        memcpy(&b, static_cast<const void*>(&v), 4);
        return b;
    } else {
        static_assert(sizeof(T) == 8, "vector elements are 2, 4 or 8 bytes");
        unsigned long long b;
        memcpy(&b, static_cast<const void*>(&v), 8);
        return b;
    }
}

// The stores assemble their words from the elements' bits with shifts (little-endian, as both the
// GPU and the host are) and store 16 bytes as one unsigned __int128: copying the Vec's bytes into
// a uint4 let nvcc split the store into per-element or per-word stores (st.global.v2.u16 or
// st.global.u32 where st.global.v4 was meant) in kernels with two output streams; an __int128
// store is one st.global.v2.u64, a 16-byte STG.
template <int W, class T>
__device__ inline void store_vec(T* p, const Vec<T, W>& in) {
    constexpr int bytes = int(sizeof(T)) * W;
    if constexpr (bytes % 4 == 0 && (bytes <= 16 ? (bytes & (bytes - 1)) == 0 : bytes % 16 == 0)) {
        unsigned w[bytes / 4] = {};
        for (int k = 0; k < W; ++k) {
            const unsigned long long b = vec_element_bits(in.v[k]);
            const int at = k * int(sizeof(T));  // byte offset
            if constexpr (sizeof(T) == 8) {
                w[at / 4] = unsigned(b), w[at / 4 + 1] = unsigned(b >> 32);
            } else {
                w[at / 4] |= unsigned(b) << (8 * (at % 4));
            }
        }
        check_vec_alignment(p, bytes < 16 ? bytes : 16);
        if constexpr (bytes == 4) {
            *reinterpret_cast<unsigned*>(p) = w[0];
        } else if constexpr (bytes == 8) {
            *reinterpret_cast<unsigned long long*>(p) = (unsigned long long)w[0] | (unsigned long long)w[1] << 32;
        } else {
            for (int g = 0; g < bytes / 16; ++g) {
                const unsigned __int128 word = (unsigned __int128)w[4 * g] | (unsigned __int128)w[4 * g + 1] << 32 |
                                               (unsigned __int128)w[4 * g + 2] << 64 |
                                               (unsigned __int128)w[4 * g + 3] << 96;
                reinterpret_cast<unsigned __int128*>(p)[g] = word;
            }
        }
    } else {
        for (int k = 0; k < W; ++k) p[k] = in.v[k];
    }
}

// Whether every pointer is 16-byte aligned (null pointers count as aligned: nothing is accessed).
inline bool vec_aligned(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return true;
}

// Whether elementwise_loop may index [0, n) with an int: every index it forms stays below
// n + (the grid's threads)·kUnroll·W <= 2n + ..., so n up to 2^30 is safe.
inline bool elementwise_index_fits(long long n) { return n <= (1LL << 30); }

template <int W, class I, class Op>
__device__ inline void elementwise_loop(const Op& op, I n) {
    using In = typename Op::template In<W>;
    const I chunks = n / W;
    const I stride = I(gridDim.x) * I(blockDim.x);
    const I first = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x);
    for (I c = first; c < chunks; c += kUnroll * stride) {
        In in[kUnroll];
        for (int u = 0; u < kUnroll; ++u)
            if (c + u * stride < chunks) in[u] = op.template load<W>((c + u * stride) * W);
        for (int u = 0; u < kUnroll; ++u)
            if (c + u * stride < chunks) op.template store<W>((c + u * stride) * W, in[u]);
    }
    if constexpr (W > 1)
        for (I i = chunks * W + first; i < n; i += stride) op.template store<1>(i, op.template load<1>(i));
}

template <class Op, int W, class I>
__global__ void elementwise_kernel(Op op, I n) {
    elementwise_loop<W>(op, n);
}

inline constexpr int kElementwiseBlock = 256;

// Runs op over [0, n) with chunks of W = Op::kWidth elements when `vector` (the caller checked
// the alignment and whatever divisibility op needs), of one element otherwise.
template <class Op>
void launch_elementwise(const Op& op, long long n, bool vector, cudaStream_t stream) {
    if (n <= 0) return;  // an empty grid is a launch error
    auto go = [&](auto width, auto index) {
        constexpr int W = decltype(width)::value;
        using I = decltype(index);
        const long long chunks = (n + W - 1) / W;
        const int blocks = ceil_div(chunks, (long long)kElementwiseBlock * kUnroll);
        launch(elementwise_kernel<Op, W, I>, dim3(blocks), dim3(kElementwiseBlock), 0, stream, op, I(n));
        CUDA_CHECK_LAUNCH();
    };
    const bool fits = elementwise_index_fits(n);
    if (vector && fits)
        go(std::integral_constant<int, Op::kWidth>{}, int{});
    else if (vector)
        go(std::integral_constant<int, Op::kWidth>{}, (long long){});
    else if (fits)
        go(std::integral_constant<int, 1>{}, int{});
    else
        go(std::integral_constant<int, 1>{}, (long long){});
}

}  // namespace pv
