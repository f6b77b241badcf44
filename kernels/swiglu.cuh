// SwiGLU, the gate of the Llama MLP: h = silu(gate) * up, elementwise, with
//   silu(g) = g * sigmoid(g),  sigmoid(g) = 1 / (1 + exp(-g)).
// The MLP computes [gate; up] = x·[Wgate; Wup]ᵀ in one GEMM, so both halves arrive in one buffer
// `gate_up` of shape [N][2·F] (row n: F gate values, then F up values) and the output is [N][F].
//
// Backward, with dh the incoming gradient:
//   dup   = dh * silu(g)
//   dgate = dh * up * silu'(g),   silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
// written into one [N][2·F] buffer in the same layout, ready for the fused backward GEMMs.
// Elementwise, memory-bound, no reductions, deterministic: 16-byte vectors (kernels/vec.cuh) when
// ffn is a multiple of the vector width and the buffers are aligned, one element at a time
// otherwise; the arithmetic per element is the same either way.
// Bytes per launch: forward reads 2·N·F and writes N·F elements; backward reads 3·N·F, writes 2·N·F.
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"

namespace pv {

// sigmoid and silu' in the accumulator type, shared by the forward and the backward.
template <class A>
__device__ inline A swiglu_sigmoid(A g) {
    return A(1) / (A(1) + acc_exp(-g));
}

// The elementwise operations (kernels/vec.cuh) over the N·F outputs: element i is row r = i / F,
// column f = i % F. A chunk of W never crosses a row because the launchers take the vector path
// only when F % W == 0.
template <class T>
struct SwigluForwardOp {
    static constexpr int kWidth = kVec<T>;
    const T* gate_up;
    T* out;
    int ffn;
    template <int W>
    struct In {
        Vec<T, W> g, u;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        const I r = i / ffn, f = i - r * ffn;
        const T* row = gate_up + r * 2 * ffn;
        return {load_vec<W>(row + f), load_vec<W>(row + ffn + f)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& in) const {
        using A = acc_t<T>;
        Vec<T, W> h;
        for (int k = 0; k < W; ++k) {
            const A g = to_acc(in.g.v[k]), u = to_acc(in.u.v[k]);
            h.v[k] = from_acc<T>(g * swiglu_sigmoid(g) * u);
        }
        store_vec<W>(out + i, h);
    }
};

template <class T>
struct SwigluBackwardOp {
    static constexpr int kWidth = kVec<T>;
    const T* gate_up;
    const T* dout;
    T* dgate_up;
    int ffn;
    template <int W>
    struct In {
        Vec<T, W> g, u, dh;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        const I r = i / ffn, f = i - r * ffn;
        const T* row = gate_up + r * 2 * ffn;
        return {load_vec<W>(row + f), load_vec<W>(row + ffn + f), load_vec<W>(dout + i)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& in) const {
        using A = acc_t<T>;
        const I r = i / ffn, f = i - r * ffn;
        Vec<T, W> dg, du;
        for (int k = 0; k < W; ++k) {
            const A g = to_acc(in.g.v[k]), u = to_acc(in.u.v[k]), dh = to_acc(in.dh.v[k]);
            const A sig = swiglu_sigmoid(g);
            const A silu = g * sig;
            dg.v[k] = from_acc<T>(dh * u * sig * (A(1) + g * (A(1) - sig)));
            du.v[k] = from_acc<T>(dh * silu);
        }
        store_vec<W>(dgate_up + r * 2 * ffn + f, dg);
        store_vec<W>(dgate_up + r * 2 * ffn + ffn + f, du);
    }
};

// out[rows][ffn] = silu(gate) * up from gate_up[rows][2·ffn].
template <class T>
void swiglu_forward(const T* gate_up, T* out, long long rows, int ffn, cudaStream_t stream) {
    const bool vector = ffn % kVec<T> == 0 && vec_aligned({gate_up, out});
    launch_elementwise(SwigluForwardOp<T>{gate_up, out, ffn}, rows * ffn, vector, stream);
}

// dgate_up[rows][2·ffn] from the forward's input and dout[rows][ffn] (overwritten, not accumulated).
template <class T>
void swiglu_backward(const T* gate_up, const T* dout, T* dgate_up, long long rows, int ffn, cudaStream_t stream) {
    const bool vector = ffn % kVec<T> == 0 && vec_aligned({gate_up, dout, dgate_up});
    launch_elementwise(SwigluBackwardOp<T>{gate_up, dout, dgate_up, ffn}, rows * ffn, vector, stream);
}

}  // namespace pv
