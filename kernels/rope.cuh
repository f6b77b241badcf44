// Rotary position embedding (RoPE), Hugging Face's `rotate_half` convention (DESIGN.md §4).
//
// x is [N][row_stride] row-major, N = batch·seq_len with the rows of one sequence consecutive;
// row n is at position pos = positions[n] when a positions array is given (packed documents
// restart at 0; a KV-cache decode row sits at its true position), else n % seq_len. The first n_heads·head_dim elements of a row are
// n_heads heads of head_dim (even) elements; within a head, with h = head_dim / 2, element i < h
// pairs with element i + h and the pair turns by the angle θ = pos · inv_freq[i]:
//   out[i]     = x[i]·cos θ − x[i+h]·sin θ
//   out[i+h]   = x[i+h]·cos θ + x[i]·sin θ
// Backward: the rotation is orthogonal, so its transpose is the rotation by −θ:
//   dx[i]      = dout[i]·cos θ + dout[i+h]·sin θ
//   dx[i+h]    = dout[i+h]·cos θ − dout[i]·sin θ
// Both run in place, and only on the first n_heads·head_dim elements of each row: the attention
// block keeps [q | k | v] in one row of a fused projection, and rotates q with one call and k
// with a second call on x + q_width (its own head count), leaving v alone.
//
// Inverse frequencies: the caller passes the head_dim / 2 values of inv_freq as acc_t<T> on the
// device; this header only takes the array. They are computed on the host in double by
// rope_inverse_frequencies (model/config.h): theta^(−2i/head_dim), with the optional Llama-3
// frequency scaling of the config's RopeScaling.
//
// Kernel: one thread per (row, head, pair), barrier-free; each thread reads and writes only its
// own two elements, so the in-place update has no races and the result is deterministic.
//
// Precision of the angle: it is formed in acc_t<T> (float for bf16 and fp32, as GPU trainers
// do), but not rounded: pos·inv_freq is kept as the unevaluated sum hi + lo, where lo =
// fma(pos, f, −hi) is the exact rounding error of the product (pos is exact in float below 2^24),
// and cos/sin(hi + lo) are corrected to first order in lo (the second-order term, lo²/2, is
// below 1e-5 even at position 10^5). The rotation is then the exact rotation by pos times the
// float value of inv_freq, up to sinf/cosf's few-ulp error; what remains is the float rounding
// of inv_freq itself (relative 2^-24, i.e. an angle error up to ~pos·6e-8 radians: 5e-4 at
// position 8191 for the fastest frequency), the same as in Hugging Face's fp32 RoPE.
#pragma once

#include "kernels/common.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace pv {

// fma in the accumulator type (float or double), for the exact error of the angle product.
__device__ inline float rope_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ inline double rope_fma(double a, double b, double c) { return fma(a, b, c); }
__device__ inline float rope_sin(float x) { return sinf(x); }
__device__ inline double rope_sin(double x) { return sin(x); }
__device__ inline float rope_cos(float x) { return cosf(x); }
__device__ inline double rope_cos(double x) { return cos(x); }

// Rotates each (i, i + h) pair of every head by `sign`·θ: sign +1 is the forward, −1 the backward.
template <class T>
__global__ void rope_rotate_kernel(T* x, const acc_t<T>* inv_freq, const int* positions, long long rows, int seq_len,
                                   int n_heads, int head_dim, long long row_stride, int sign) {
    using A = acc_t<T>;
    const int half = head_dim / 2;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * n_heads * half) return;
    const int i = int(idx % half);
    const long long head = idx / half;  // (row, head) flattened
    const long long row = head / n_heads;
    T* p = x + row * row_stride + (head % n_heads) * head_dim + i;

    // θ = pos·f as hi + lo (see the header comment), cos/sin corrected to first order in lo.
    const A pos = A(positions ? positions[row] : row % seq_len), f = inv_freq[i];
    const A hi = pos * f, lo = rope_fma(pos, f, -hi);
    const A s_hi = rope_sin(hi), c_hi = rope_cos(hi);
    const A c = c_hi - lo * s_hi;
    const A s = A(sign) * (s_hi + lo * c_hi);

    const A a = to_acc(p[0]), b = to_acc(p[half]);
    p[0] = from_acc<T>(a * c - b * s);
    p[half] = from_acc<T>(b * c + a * s);
}

inline void rope_check_arguments(int head_dim, int seq_len) {
    if (head_dim <= 0 || head_dim % 2 != 0 || seq_len <= 0) {
        std::fprintf(stderr, "polevault: rope: head_dim must be positive and even, seq_len positive (got %d, %d)\n",
                     head_dim, seq_len);
        std::abort();
    }
}

template <class T>
void rope_launch(T* x, const acc_t<T>* inv_freq, const int* positions, long long N, int seq_len, int n_heads,
                 int head_dim, long long row_stride, int sign, cudaStream_t stream) {
    rope_check_arguments(head_dim, seq_len);
    const long long threads = N * n_heads * (head_dim / 2);
    if (threads == 0) return;                                             // an empty grid is a launch error
    const int block = threads >= 256 ? 256 : 32 * ceil_div(threads, 32);  // no idle warps on tiny shapes
    launch(rope_rotate_kernel<T>, dim3(ceil_div(threads, block)), dim3(block), 0, stream, x, inv_freq, positions, N,
           seq_len, n_heads, head_dim, row_stride, sign);
    CUDA_CHECK_LAUNCH();
}

// Rotates, in place, the first n_heads·head_dim elements of each of the N rows of x (rows
// row_stride elements apart; row n at position positions[n], or n % seq_len when positions is
// null). inv_freq: head_dim / 2 device values; positions: N device ints or null.
template <class T>
void rope_forward(T* x, const acc_t<T>* inv_freq, const int* positions, long long N, int seq_len, int n_heads,
                  int head_dim, long long row_stride, cudaStream_t stream) {
    rope_launch(x, inv_freq, positions, N, seq_len, n_heads, head_dim, row_stride, +1, stream);
}

// The backward, in place on the incoming gradient dx: the rotation by −θ.
template <class T>
void rope_backward(T* dx, const acc_t<T>* inv_freq, const int* positions, long long N, int seq_len, int n_heads,
                   int head_dim, long long row_stride, cudaStream_t stream) {
    rope_launch(dx, inv_freq, positions, N, seq_len, n_heads, head_dim, row_stride, -1, stream);
}

}  // namespace pv
