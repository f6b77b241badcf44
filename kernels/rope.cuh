// Rotary position embedding (RoPE), Hugging Face's `rotate_half` convention (DESIGN.md §4).
//
// x is [N][row_stride] row-major, N = batch·seq_len with the rows of one sequence consecutive;
// row n is at position pos = positions[n] when a positions array is given (packed documents
// restart at 0; a KV-cache decode row sits at its true position), else n % seq_len. The first
// n_heads·head_dim elements of a row are n_heads heads of head_dim (even) elements; within a head, with h = head_dim / 2, element i < h
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
// The table: cos θ and sin θ for every position p < P and pair i < h, θ = p · inv_freq[i], computed
// once per model on the host (rope_table_values: the product and both functions in long double,
// rounded to acc_t<T>) and uploaded; row p of the table holds the h cosines
// then the h sines (head_dim values). The kernels look the angle up instead of evaluating sin
// and cos per element per call. inv_freq comes from rope_inverse_frequencies (model/config.h):
// theta^(−2i/head_dim), with the optional Llama-3 frequency scaling of the config's RopeScaling.
// Precision: cos and sin of the exact angle p · inv_freq(double), rounded once to float for
// bf16/fp32 — closer than Hugging Face's fp32 RoPE, which rounds inv_freq and the product to fp32.
// A position outside [0, P) (a bad document-mask position) makes its pairs NaN rather than read
// outside the table.
//
// Kernel: an elementwise operation (kernels/vec.cuh) over (row, head, pair), W consecutive pairs
// per chunk: 16-byte vectors of x[i..i+W) and x[i+h..i+h+W) and of the table's cos and sin when
// h is a multiple of W and the row stride and base are aligned, one pair otherwise. Each thread
// reads and writes only its own pairs, so the in-place update has no races and the result is
// deterministic. Bytes per call: reads and writes N·n_heads·head_dim elements of x, reads the
// N·head_dim table values of the rows' positions (P·head_dim distinct, cached) and N positions.
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace pv {

// The device table: values[P][head_dim] (cos of the head_dim / 2 pairs, then their sin).
template <class A>
struct RopeTable {
    const A* values = nullptr;
    int positions = 0;  // P
    int head_dim = 0;
};

// The table's values on the host, for positions [0, P) of the pairs of inv_freq.
template <class A>
std::vector<A> rope_table_values(const std::vector<double>& inv_freq, int positions) {
    const size_t half = inv_freq.size();
    std::vector<A> values(size_t(positions) * 2 * half);
    for (int p = 0; p < positions; ++p)
        for (size_t i = 0; i < half; ++i) {
            // In long double: p · f (exact for p < 2^11 with double f, else a 64-bit product) and
            // its cos and sin stay below a double's ulp even at position 10^5.
            const long double angle = (long double)p * (long double)inv_freq[i];
            values[size_t(p) * 2 * half + i] = A(double(std::cos(angle)));
            values[size_t(p) * 2 * half + half + i] = A(double(std::sin(angle)));
        }
    return values;
}

// Rotates each (i, i + h) pair of every head by `sign`·θ: sign +1 is the forward, −1 the backward.
// Element j of the index space is pair p = j % h of head (j / h) % n_heads of row j / (h·n_heads).
template <class T>
struct RopeOp {
    static constexpr int kWidth = kVec<T>;
    T* x;
    RopeTable<acc_t<T>> table;
    const int* positions;
    int seq_len, n_heads, half;
    long long row_stride;
    int sign;
    template <int W>
    struct In {
        Vec<T, W> a, b;
        Vec<acc_t<T>, W> c, s;  // cos and sin of the W angles; NaN at a position outside the table
    };
    // The first element of pair chunk j.
    template <class I>
    __device__ T* pair(I j) const {
        const I head = j / half, p = j - head * half, row = head / n_heads;
        return x + (long long)row * row_stride + (long long)(head - row * n_heads) * (2 * half) + p;
    }
    template <int W, class I>
    __device__ In<W> load(I j) const {
        using A = acc_t<T>;
        const I head = j / half, p = j - head * half, row = head / n_heads;
        const int pos = positions ? positions[row] : int(row % seq_len);
        const T* e = pair(j);
        In<W> in;
        in.a = load_vec<W>(e);
        in.b = load_vec<W>(e + half);
        if (pos >= 0 && pos < table.positions) {
            const A* angles = table.values + (long long)pos * (2 * half) + p;
            in.c = load_vec<W>(angles);
            in.s = load_vec<W>(angles + half);
        } else {
            for (int k = 0; k < W; ++k) in.c.v[k] = in.s.v[k] = A(NAN);
        }
        return in;
    }
    template <int W, class I>
    __device__ void store(I j, const In<W>& in) const {
        using A = acc_t<T>;
        T* e = pair(j);
        Vec<T, W> a, b;
        for (int k = 0; k < W; ++k) {
            const A c = in.c.v[k], s = A(sign) * in.s.v[k];
            const A x0 = to_acc(in.a.v[k]), x1 = to_acc(in.b.v[k]);
            a.v[k] = from_acc<T>(x0 * c - x1 * s);
            b.v[k] = from_acc<T>(x1 * c + x0 * s);
        }
        store_vec<W>(e, a);
        store_vec<W>(e + half, b);
    }
};

template <class T>
void rope_launch(T* x, const RopeTable<acc_t<T>>& table, const int* positions, long long N, int seq_len, int n_heads,
                 int head_dim, long long row_stride, int sign, cudaStream_t stream) {
    if (head_dim <= 0 || head_dim % 2 != 0 || seq_len <= 0 || table.head_dim != head_dim ||
        (positions == nullptr && seq_len > table.positions)) {
        std::fprintf(stderr,
                     "polevault: rope: head_dim must be positive, even and the table's, seq_len positive and, "
                     "without explicit positions, within the table (got head_dim %d, table head_dim %d, seq_len %d, "
                     "table positions %d)\n",
                     head_dim, table.head_dim, seq_len, table.positions);
        std::abort();
    }
    const int half = head_dim / 2;
    const bool vector = half % kVec<T> == 0 && row_stride % kVec<T> == 0 && vec_aligned({x, table.values});
    launch_elementwise(RopeOp<T>{x, table, positions, seq_len, n_heads, half, row_stride, sign}, N * n_heads * half,
                       vector, stream);
}

// Rotates, in place, the first n_heads·head_dim elements of each of the N rows of x (rows
// row_stride elements apart; row n at position positions[n], or n % seq_len when positions is
// null). positions: N device ints or null.
template <class T>
void rope_forward(T* x, const RopeTable<acc_t<T>>& table, const int* positions, long long N, int seq_len, int n_heads,
                  int head_dim, long long row_stride, cudaStream_t stream) {
    rope_launch(x, table, positions, N, seq_len, n_heads, head_dim, row_stride, +1, stream);
}

// The backward, in place on the incoming gradient dx: the rotation by −θ.
template <class T>
void rope_backward(T* dx, const RopeTable<acc_t<T>>& table, const int* positions, long long N, int seq_len, int n_heads,
                   int head_dim, long long row_stride, cudaStream_t stream) {
    rope_launch(dx, table, positions, N, seq_len, n_heads, head_dim, row_stride, -1, stream);
}

}  // namespace pv
