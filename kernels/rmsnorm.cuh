// RMSNorm (Llama's normalisation), per row of x[N][C] with a weight w[C]:
//   y[c] = x̂[c] · w[c],   x̂[c] = x[c] · r,   r = rstd = 1 / sqrt(mean_c(x²) + eps).
// The statistics are computed in acc_t<T>; rstd[N] is saved for the backward.
//
// Fused with the residual add (the transformer block's `h = h + branch; y = norm(h)`):
//   s = residual + branch, rounded to T and stored in sum_out;  y = rmsnorm(s).
// The norm reads the ROUNDED s, the same value the backward will see as its x. sum_out may alias
// residual (each element is read and then written by the same thread).
//
// Backward, with dy the incoming gradient and g[c] = w[c] · dy[c]:
//   ∂r/∂x[j] = -½ (mean(x²) + eps)^(-3/2) · 2 x[j] / C = -r³ x[j] / C, so
//   dx[j] = Σ_c g[c] · ∂(x[c] r)/∂x[j] = Σ_c g[c] (δ_cj r + x[c] ∂r/∂x[j])
//         = g[j] r − r³ x[j] / C · Σ_c g[c] x[c]
//         = r · (g[j] − x̂[j] · mean_c(g[c] x̂[c])),
//   dw[c] = Σ_n dy[n][c] · x̂[n][c].
// Both ACCUMULATE: dx into the residual stream's gradient (the branch's gradient arrives there
// first), dweight across micro-steps. For the fused forward, the gradient of residual and of
// branch is the gradient of s: the residual stream's gradient plus this dx.
//
// Kernels:
// - Forward: one warp per row (up to eight rows per block). Each lane sums x² over channels lane,
//   lane + 32, ...; a butterfly warp_sum gives every lane the same total; a second pass over the
//   row (now in cache) writes y. No shared memory or barriers; any C.
// - Backward: one block per row; G = min(N, kRmsnormBackwardBlocks) blocks, block b taking rows
//   b, b + G, b + 2G, ... For each row a block_sum gives mean(g·x̂), then the block writes dx and
//   adds dy·x̂ into a per-block dweight partial in shared memory. Thread t owns channels
//   t, t + blockDim, ..., so each partial element has one writer and a fixed order of rows. The
//   block stores its partial in the caller's scratch[G][C]; a second kernel adds, for each c,
//   scratch[0..G)[c] in order into dweight[c]. Deterministic, no atomics; the scratch is
//   G · C · sizeof(acc_t<T>) bytes (at most 16 MiB for C = 8192 in fp32).
#pragma once

#include "kernels/common.cuh"

namespace pv {

inline constexpr int kRmsnormForwardRows = 8;           // rows (warps) per forward block
inline constexpr int kRmsnormBackwardBlocks = 512;      // at most this many dweight partials
inline constexpr int kRmsnormBackwardMaxThreads = 512;  // threads per row in the backward
inline constexpr int kRmsnormReduceThreads = 256;

// The rows handled by one warp in the forward kernels; whole warps skip past the end.
__device__ inline long long rmsnorm_warp_row() { return (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; }

template <class T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* weight, T* out, acc_t<T>* rstd, long long N, int C,
                                       acc_t<T> eps) {
    using A = acc_t<T>;
    const long long n = rmsnorm_warp_row();
    const int lane = threadIdx.x % 32;
    if (n < N) {  // uniform across the warp, so every lane reaches the shuffles
        const T* xr = x + n * C;
        A sq = 0;
        for (int c = lane; c < C; c += 32) {
            const A v = to_acc(xr[c]);
            sq += v * v;
        }
        const A r = acc_rsqrt(warp_sum(sq) / A(C) + eps);
        for (int c = lane; c < C; c += 32) out[n * C + c] = from_acc<T>(to_acc(xr[c]) * r * to_acc(weight[c]));
        if (lane == 0) rstd[n] = r;
    }
}

template <class T>
__global__ void residual_rmsnorm_forward_kernel(const T* residual, const T* branch, T* sum_out, const T* weight, T* out,
                                                acc_t<T>* rstd, long long N, int C, acc_t<T> eps) {
    using A = acc_t<T>;
    const long long n = rmsnorm_warp_row();
    const int lane = threadIdx.x % 32;
    if (n < N) {
        A sq = 0;
        for (int c = lane; c < C; c += 32) {
            const long long i = n * C + c;
            const T s = from_acc<T>(to_acc(residual[i]) + to_acc(branch[i]));
            sum_out[i] = s;
            const A v = to_acc(s);  // the rounded sum: what the backward sees as x
            sq += v * v;
        }
        const A r = acc_rsqrt(warp_sum(sq) / A(C) + eps);
        for (int c = lane; c < C; c += 32) {
            const long long i = n * C + c;
            out[i] = from_acc<T>(to_acc(sum_out[i]) * r * to_acc(weight[c]));  // this lane's own write
        }
        if (lane == 0) rstd[n] = r;
    }
}

// Dynamic shared memory: the block's dweight partial, C accumulators.
template <class T>
__global__ void rmsnorm_backward_kernel(const T* x, const T* weight, const acc_t<T>* rstd, const T* dout, T* dx,
                                        acc_t<T>* partials, long long N, int C) {
    using A = acc_t<T>;
    PV_DYNAMIC_SHARED(A, dw);
    __shared__ A reduce_scratch[32];
    for (int c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0;  // only this thread touches dw[c]
    for (long long n = blockIdx.x; n < N; n += gridDim.x) {
        const long long row = n * C;
        const A r = rstd[n];
        A dot = 0;  // Σ_c g·x̂
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            dot += to_acc(weight[c]) * to_acc(dout[row + c]) * (to_acc(x[row + c]) * r);
        const A mean = block_sum(dot, reduce_scratch) / A(C);
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const A dy = to_acc(dout[row + c]), xhat = to_acc(x[row + c]) * r;
            dx[row + c] = from_acc<T>(to_acc(dx[row + c]) + (to_acc(weight[c]) * dy - xhat * mean) * r);
            dw[c] += dy * xhat;
        }
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) partials[(long long)blockIdx.x * C + c] = dw[c];
}

// dweight[c] += Σ_b partials[b][c], b = 0, 1, ..., blocks − 1 in that order.
template <class T>
__global__ void rmsnorm_dweight_kernel(const acc_t<T>* partials, T* dweight, int blocks, int C) {
    using A = acc_t<T>;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    A sum = 0;
    for (int b = 0; b < blocks; ++b) sum += partials[(long long)b * C + c];
    dweight[c] = from_acc<T>(to_acc(dweight[c]) + sum);
}

// Warps (rows) per forward block: eight, fewer when there are fewer rows (no idle warps).
inline int rmsnorm_forward_rows_per_block(long long N) {
    return N < kRmsnormForwardRows ? int(N) : kRmsnormForwardRows;
}

// out[N][C] = rmsnorm(x) · weight; rstd[N] saved for the backward.
template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* out, acc_t<T>* rstd, long long N, int C, double eps,
                     cudaStream_t stream) {
    if (N == 0) return;
    const int rows_per_block = rmsnorm_forward_rows_per_block(N);
    launch(rmsnorm_forward_kernel<T>, dim3(ceil_div(N, rows_per_block)), dim3(32 * rows_per_block), 0, stream, x,
           weight, out, rstd, N, C, acc_t<T>(eps));
    CUDA_CHECK_LAUNCH();
}

// sum_out = residual + branch (rounded to T; may alias residual), out = rmsnorm(sum_out) · weight.
template <class T>
void residual_rmsnorm_forward(const T* residual, const T* branch, T* sum_out, const T* weight, T* out, acc_t<T>* rstd,
                              long long N, int C, double eps, cudaStream_t stream) {
    if (N == 0) return;
    const int rows_per_block = rmsnorm_forward_rows_per_block(N);
    launch(residual_rmsnorm_forward_kernel<T>, dim3(ceil_div(N, rows_per_block)), dim3(32 * rows_per_block), 0, stream,
           residual, branch, sum_out, weight, out, rstd, N, C, acc_t<T>(eps));
    CUDA_CHECK_LAUNCH();
}

// The number of dweight partials (blocks) of the backward for N rows.
inline int rmsnorm_backward_blocks(long long N) { return int(N < kRmsnormBackwardBlocks ? N : kRmsnormBackwardBlocks); }

// Bytes of the scratch rmsnorm_backward needs for N rows of C channels.
template <class T>
size_t rmsnorm_backward_scratch_bytes(long long N, int C) {
    return size_t(rmsnorm_backward_blocks(N)) * size_t(C) * sizeof(acc_t<T>);
}

// dx[N][C] += the gradient of x; dweight[C] += the gradient of weight (both accumulate; a null
// dweight, a frozen weight, skips the weight's reduction). `scratch` holds
// rmsnorm_backward_scratch_bytes<T>(N, C) bytes.
template <class T>
void rmsnorm_backward(const T* x, const T* weight, const acc_t<T>* rstd, const T* dout, T* dx, T* dweight,
                      void* scratch, long long N, int C, cudaStream_t stream) {
    using A = acc_t<T>;
    if (N == 0 || C == 0) return;
    const int blocks = rmsnorm_backward_blocks(N);
    const int rounded = ceil_div(C, 32) * 32;
    const int threads = rounded < kRmsnormBackwardMaxThreads ? rounded : kRmsnormBackwardMaxThreads;
    const size_t smem = size_t(C) * sizeof(A);
    // 48 KiB less the static reduce_scratch is the most a launch may take without opting in.
    if (smem + 32 * sizeof(A) > 48 * 1024)
        CUDA_CHECK(
            cudaFuncSetAttribute(rmsnorm_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    A* partials = static_cast<A*>(scratch);
    launch(rmsnorm_backward_kernel<T>, dim3(blocks), dim3(threads), smem, stream, x, weight, rstd, dout, dx, partials,
           N, C);
    CUDA_CHECK_LAUNCH();
    if (dweight == nullptr) return;
    launch(rmsnorm_dweight_kernel<T>, dim3(ceil_div(C, kRmsnormReduceThreads)), dim3(kRmsnormReduceThreads), 0, stream,
           partials, dweight, blocks, C);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
