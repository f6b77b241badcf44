// SwiGLU, the gate of the Llama MLP: h = silu(gate) * up, elementwise, with
//   silu(g) = g * sigmoid(g),  sigmoid(g) = 1 / (1 + exp(-g)).
// The MLP computes [gate; up] = x·[Wgate; Wup]ᵀ in one GEMM, so both halves arrive in one buffer
// `gate_up` of shape [N][2·F] (row n: F gate values, then F up values) and the output is [N][F].
//
// Backward, with dh the incoming gradient:
//   dup   = dh * silu(g)
//   dgate = dh * up * silu'(g),   silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
// written into one [N][2·F] buffer in the same layout, ready for the fused backward GEMMs.
// Elementwise, one thread per output element: memory-bound, no reductions, deterministic.
#pragma once

#include "kernels/common.cuh"

namespace pv {

template <class T>
__global__ void swiglu_forward_kernel(const T* gate_up, T* out, long long rows, int ffn) {
    using A = acc_t<T>;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * ffn) return;
    const long long r = i / ffn, f = i % ffn;
    const A g = to_acc(gate_up[r * 2 * ffn + f]);
    const A u = to_acc(gate_up[r * 2 * ffn + ffn + f]);
    const A sig = A(1) / (A(1) + acc_exp(-g));
    out[i] = from_acc<T>(g * sig * u);
}

template <class T>
__global__ void swiglu_backward_kernel(const T* gate_up, const T* dout, T* dgate_up, long long rows, int ffn) {
    using A = acc_t<T>;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * ffn) return;
    const long long r = i / ffn, f = i % ffn;
    const A g = to_acc(gate_up[r * 2 * ffn + f]);
    const A u = to_acc(gate_up[r * 2 * ffn + ffn + f]);
    const A dh = to_acc(dout[i]);
    const A sig = A(1) / (A(1) + acc_exp(-g));
    const A silu = g * sig;
    dgate_up[r * 2 * ffn + f] = from_acc<T>(dh * u * sig * (A(1) + g * (A(1) - sig)));
    dgate_up[r * 2 * ffn + ffn + f] = from_acc<T>(dh * silu);
}

// out[rows][ffn] = silu(gate) * up from gate_up[rows][2·ffn].
template <class T>
void swiglu_forward(const T* gate_up, T* out, long long rows, int ffn, cudaStream_t stream) {
    const int block = 256;
    launch(swiglu_forward_kernel<T>, dim3(ceil_div(rows * ffn, block)), dim3(block), 0, stream, gate_up, out, rows,
           ffn);
    CUDA_CHECK_LAUNCH();
}

// dgate_up[rows][2·ffn] from the forward's input and dout[rows][ffn] (overwritten, not accumulated).
template <class T>
void swiglu_backward(const T* gate_up, const T* dout, T* dgate_up, long long rows, int ffn, cudaStream_t stream) {
    const int block = 256;
    launch(swiglu_backward_kernel<T>, dim3(ceil_div(rows * ffn, block)), dim3(block), 0, stream, gate_up, dout,
           dgate_up, rows, ffn);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
