// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011), usable from host and device code alike.
//
// A counter-based generator is a keyed bijection of a 128-bit counter: the n-th random value of
// a stream is a pure function of (key, n), with no state to carry from one draw to the next.
// polevault keys every random number by (seed, purpose, tensor id, element index[, step]) — never
// by rank or by how a tensor is sharded — so initialisation, dropout and stochastic rounding give
// the same bits at every world size and with every strategy (DESIGN.md §4).
//
// Round function (10 rounds), with the 32x32->64 products of the paper's multipliers:
//   (hi0, lo0) = M0 · c0,  (hi1, lo1) = M1 · c2
//   c' = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0),  then the key is bumped by the Weyl constants.
// Known-answer vectors from the Random123 distribution are checked in test/test_philox.cu.
#pragma once

#include "kernels/common.cuh"

#include <cstdint>

namespace pv {

struct Philox4 {
    uint32_t v[4];
};

__host__ __device__ inline Philox4 philox4x32_10(Philox4 counter, uint32_t key0, uint32_t key1) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = uint64_t(M0) * c0, p1 = uint64_t(M1) * c2;
        const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
        c0 = hi1 ^ c1 ^ key0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ key1;
        c3 = lo0;
        key0 += W0;
        key1 += W1;
    }
    return Philox4{{c0, c1, c2, c3}};
}

// What a random number is for; part of the counter so purposes never share values.
enum class RandomPurpose : uint32_t { init = 1, dropout = 2, stochastic_rounding = 3, data = 4, sampling = 5 };

// The four 32-bit words for (seed, purpose, tensor, element, step).
__host__ __device__ inline Philox4 philox_draw(uint64_t seed, RandomPurpose purpose, uint32_t tensor, uint64_t element,
                                               uint32_t step = 0) {
    const Philox4 counter{{uint32_t(element), uint32_t(element >> 32), tensor, (uint32_t(purpose) << 24) ^ step}};
    return philox4x32_10(counter, uint32_t(seed), uint32_t(seed >> 32));
}

// A standard normal value for (seed, purpose, tensor, element), by Box-Muller on the first two
// words, in double (the same function on host and device, so host-side checks reproduce it).
__host__ __device__ inline double philox_normal(uint64_t seed, RandomPurpose purpose, uint32_t tensor,
                                                uint64_t element) {
    const Philox4 r = philox_draw(seed, purpose, tensor, element);
    const double u1 = (double(r.v[0]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]: log is finite
    const double u2 = double(r.v[1]) * (1.0 / 4294967296.0);          // [0, 1)
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// A uniform value in [0, 1) for (seed, purpose, tensor, element, step), from the first word.
__host__ __device__ inline double philox_uniform(uint64_t seed, RandomPurpose purpose, uint32_t tensor,
                                                 uint64_t element, uint32_t step = 0) {
    return double(philox_draw(seed, purpose, tensor, element, step).v[0]) * (1.0 / 4294967296.0);
}

// Which element of the whole tensor the i-th value written is: e = first + i counts along a block
// of `cols` columns, row first_row + e / cols and column col_begin + e % cols of a tensor
// whole_cols wide. A run of whole rows (cols = whole_cols, col_begin = 0, first_row = 0) is
// first + i itself: a ZeRO shard passes its offset; a tensor-parallel slice (model/
// tensor_parallel.h) passes its block, and gets the values the whole tensor has there.
struct WholeIndex {
    long long first = 0, cols = 1, whole_cols = 1, col_begin = 0, first_row = 0;
    __host__ __device__ long long operator()(long long i) const {
        const long long e = first + i;
        return (first_row + e / cols) * whole_cols + col_begin + e % cols;
    }
};

// x[i] = std · N(0, 1) keyed by (seed, init, tensor, where(i)), rounded to T.
template <class T>
__global__ void init_normal_kernel(T* x, long long n, double std_dev, uint64_t seed, uint32_t tensor,
                                   WholeIndex where) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = T(std_dev * philox_normal(seed, RandomPurpose::init, tensor, uint64_t(where(i))));
}

// Fills x[0, n) with the normal values of `tensor`'s elements where(0), …, where(n − 1).
template <class T>
void init_normal(T* x, long long n, double std_dev, uint64_t seed, uint32_t tensor, WholeIndex where,
                 cudaStream_t stream) {
    if (n == 0) return;
    launch(init_normal_kernel<T>, dim3(ceil_div(n, 256)), dim3(256), 0, stream, x, n, std_dev, seed, tensor, where);
    CUDA_CHECK_LAUNCH();
}
// Elements [first_element, first_element + n) of the whole tensor.
template <class T>
void init_normal(T* x, long long n, double std_dev, uint64_t seed, uint32_t tensor, long long first_element,
                 cudaStream_t stream) {
    init_normal(x, n, std_dev, seed, tensor, WholeIndex{first_element}, stream);
}

// x[i] = U(−bound, bound) keyed by (seed, init, tensor, where(i)), rounded to T.
template <class T>
__global__ void init_uniform_kernel(T* x, long long n, double bound, uint64_t seed, uint32_t tensor,
                                    WholeIndex where) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = T(bound * (2.0 * philox_uniform(seed, RandomPurpose::init, tensor, uint64_t(where(i))) - 1.0));
}

// init_normal's uniform twin (LoRA's A): the same values whatever slice is asked for.
template <class T>
void init_uniform(T* x, long long n, double bound, uint64_t seed, uint32_t tensor, WholeIndex where,
                  cudaStream_t stream) {
    if (n == 0) return;
    launch(init_uniform_kernel<T>, dim3(ceil_div(n, 256)), dim3(256), 0, stream, x, n, bound, seed, tensor, where);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
