// The GEMMs of a linear layer without bias, through cublasGemmEx. Row-major tensors:
//   x[N][in], W[out][in], y[N][out]   (N = tokens, e.g. batch × sequence)
//
// Forward:   y  = x·Wᵀ                  y[n][o]  = Σ_i x[n][i] · W[o][i]
// Backward, with dy the incoming gradient:
//            dx = dy·W   (or dx += dy·W) dx[n][i] = Σ_o dy[n][o] · W[o][i]
//            dW += dyᵀ·x                 dW[o][i] += Σ_n dy[n][o] · x[n][i]
// Weight gradients accumulate (micro-steps and tied weights add into one buffer) or, for the
// step's first writer, overwrite (GradWrite, kernels/common.cuh: beta = 0, so no memset is needed
// before the step). The input gradient overwrites by default (beta = 0: the old contents are
// not read, so a NaN-poisoned dx is fine) or accumulates (x feeds several layers, e.g. the
// normalised input of Wq, Wk and Wv). Either product is skipped when its output pointer is null:
// frozen weights (a LoRA base) need no dW, and an input nobody differentiates needs no dx.
//
// cuBLAS is column-major. A row-major X[r][c] is the column-major matrix Xᵀ with leading
// dimension c, so each row-major product is computed as its transpose:
//   y = x·Wᵀ    <=>  yᵀ[out×N] = W·xᵀ:   GemmEx(OP_T, OP_N, m=out, n=N, k=in,  A=W ld in,  B=x ld in,   C=y ld out)
//   dx = dy·W   <=>  dxᵀ[in×N] = Wᵀ·dyᵀ: GemmEx(OP_N, OP_N, m=in,  n=N, k=out, A=W ld in,  B=dy ld out, C=dx ld in)
//   dW += dyᵀ·x <=>  dWᵀ[in×out] += xᵀ·dy: GemmEx(OP_N, OP_T, m=in, n=out, k=N, A=x ld in, B=dy ld out, C=dW ld in, β=1)
// (the column-major A = W ld in is Wᵀ, so OP_T gives W; B = x ld in is xᵀ; and so on.)
//
// Types: A, B and C are all T (cuda_data_type<T>()); the compute type is cublas_compute_type<T>():
// COMPUTE_32F for bf16 and fp32 (fp32 accumulation, bf16 C rounded once), COMPUTE_64F for fp64.
// The scalars alpha and beta have the compute type's precision: float for 32F, double for 64F.
// Determinism: cuBLAS documents bitwise-identical results run to run for a given toolkit version,
// architecture and SM count, provided only one stream uses a handle's workspace at a time (else
// give each stream its own handle or workspace, or set CUBLAS_WORKSPACE_CONFIG). So callers
// that run GEMMs on concurrent streams use one handle per stream: these launchers set the
// handle's stream on every call and would otherwise share its workspace between streams.
//
// cuBLAS dimensions are int: N must fit (checked; it is micro-batch × sequence length, far below
// 2^31 for any run here), and in, out are ints already.
#pragma once

#include "kernels/common.cuh"

#include <climits>

namespace pv {

// The scalar type of a compute type: alpha and beta are read as this.
template <class T>
using matmul_scalar_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// N as cuBLAS's int dimension; a row count past INT_MAX would wrap silently, so it aborts instead.
inline int matmul_rows(long long N, const char* what) {
    if (N < 0 || N > INT_MAX) fail_cuda_call(what, "row count N outside cuBLAS's int range", __FILE__, __LINE__);
    return int(N);
}

// The three products on strided row-major operands (element (r, c) of a matrix at p[r·ld + c]), with
// scale factors: what a LoRA adapter needs to read and write column ranges of a fused tensor
// (kernels/lora.cuh). matmul_forward and matmul_backward below are these with dense operands.
//   gemm_x_wt:  y  = alpha·x·Wᵀ  + beta·y     x[N][in], W[out][in], y[N][out]
//   gemm_dy_w:  dx = alpha·dy·W  + beta·dx    dy[N][out], W[out][in], dx[N][in]
//   gemm_dyt_x: dW = alpha·dyᵀ·x + beta·dW    dy[N][out], x[N][in], dW[out][in]
// beta = 0 does not read the output (a poisoned buffer is fine).
// One cublasGemmEx in T with T's compute type and scalars, on `stream`: C = alpha·op(A)·op(B) + beta·C
// (column-major, as cuBLAS sees the row-major operands; see the mapping above).
template <class T>
void gemm_ex(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, double alpha,
             const T* a, int lda, const T* b, int ldb, double beta, T* c, int ldc, cudaStream_t stream) {
    using S = matmul_scalar_t<T>;
    const S sa = S(alpha), sb = S(beta);
    constexpr cudaDataType type = cuda_data_type<T>();
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    CUBLAS_CHECK(cublasGemmEx(handle, op_a, op_b, m, n, k, &sa, a, type, lda, b, type, ldb, &sb, c, type, ldc,
                              cublas_compute_type<T>(), CUBLAS_GEMM_DEFAULT));
}

// The beta of a weight gradient's GEMM: 1 adds to the buffer, 0 writes over it unread.
inline double beta_of(GradWrite mode) { return mode == GradWrite::add ? 1.0 : 0.0; }

template <class T>
void gemm_x_wt(cublasHandle_t handle, const T* x, int ldx, const T* w, int ldw, T* y, int ldy, long long N, int in,
               int out, double alpha, double beta, cudaStream_t stream) {
    gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, matmul_rows(N, "gemm_x_wt"), in, alpha, w, ldw, x, ldx, beta, y, ldy,
            stream);
}

template <class T>
void gemm_dy_w(cublasHandle_t handle, const T* dy, int lddy, const T* w, int ldw, T* dx, int lddx, long long N, int in,
               int out, double alpha, double beta, cudaStream_t stream) {
    gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, in, matmul_rows(N, "gemm_dy_w"), out, alpha, w, ldw, dy, lddy, beta, dx,
            lddx, stream);
}

template <class T>
void gemm_dyt_x(cublasHandle_t handle, const T* dy, int lddy, const T* x, int ldx, T* dw, int lddw, long long N, int in,
                int out, double alpha, double beta, cudaStream_t stream) {
    gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_T, in, out, matmul_rows(N, "gemm_dyt_x"), alpha, x, ldx, dy, lddy, beta, dw,
            lddw, stream);
}

// y[N][out] = x[N][in] · W[out][in]ᵀ, or y += it when `accumulate` (one rounding of the sum: the
// GEMM's β = 1 epilogue), on `stream` (the handle's stream is set to it).
template <class T>
void matmul_forward(cublasHandle_t handle, const T* x, const T* w, T* y, long long N, int in, int out,
                    cudaStream_t stream, bool accumulate = false) {
    gemm_x_wt(handle, x, in, w, in, y, out, N, in, out, 1.0, accumulate ? 1.0 : 0.0, stream);
}

// From dy[N][out] and the forward's x[N][in], W[out][in]:
//   dW[out][in] += dyᵀ·x, or = when dw_write overwrites   (skipped when dw is null)
//   dx[N][in]    = dy·W, or += when accumulate_dx         (skipped when dx is null)
// on `stream` (the handle's stream is set to it).
template <class T>
void matmul_backward(cublasHandle_t handle, const T* dy, const T* x, const T* w, T* dx, T* dw, long long N, int in,
                     int out, bool accumulate_dx, cudaStream_t stream, GradWrite dw_write = GradWrite::add) {
    if (dx != nullptr) gemm_dy_w(handle, dy, out, w, in, dx, in, N, in, out, 1.0, accumulate_dx ? 1.0 : 0.0, stream);
    if (dw != nullptr) gemm_dyt_x(handle, dy, out, x, in, dw, in, N, in, out, 1.0, beta_of(dw_write), stream);
}

}  // namespace pv
