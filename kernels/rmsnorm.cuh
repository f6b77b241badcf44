// RMSNorm (Llama's normalisation), per row of x[N][C] with a weight w[C]:
//   y[c] = x̂[c] · w[c],   x̂[c] = x[c] · r,   r = rstd = 1 / sqrt(mean_c(x²) + eps).
// The statistics are computed in acc_t<T>; rstd[N] is saved for the backward.
//
// Fused with the residual add (the transformer block's `h = h + branch; y = norm(h)`):
//   s = residual + branch, rounded to T and stored in sum_out;  y = rmsnorm(s).
// The norm reads the ROUNDED s, the same value the backward will see as its x. sum_out may alias
// residual (each element is read and then written by the same thread). An optional sum_copy gets s
// too: the block keeps s for its backward and starts its output from it, which the down
// projection's GEMM then adds onto (β = 1) — the block's closing residual add, fused (model/llama.cu).
//
// Backward, with dy the incoming gradient and g[c] = w[c] · dy[c]:
//   ∂r/∂x[j] = -½ (mean(x²) + eps)^(-3/2) · 2 x[j] / C = -r³ x[j] / C, so
//   dx[j] = Σ_c g[c] · ∂(x[c] r)/∂x[j] = Σ_c g[c] (δ_cj r + x[c] ∂r/∂x[j])
//         = g[j] r − r³ x[j] / C · Σ_c g[c] x[c]
//         = r · (g[j] − x̂[j] · mean_c(g[c] x̂[c])),
//   dw[c] = Σ_n dy[n][c] · x̂[n][c].
// The backward WRITES dx = dres + the norm's gradient, where dres is the gradient the residual
// stream already carries past the norm (the block's `h = x + branch(norm(x))`: dL/dx = dL/dh +
// the norm's share), so no copy of dres into dx is needed first; dres may be dx itself. dweight
// ACCUMULATES across micro-steps. For the fused forward, the gradient of residual and of branch
// is the gradient of s: the residual stream's gradient plus the norm's share.
//
// Kernels (16-byte vectors, kernels/vec.cuh, when C is a multiple of the vector width and the
// bases are aligned; one element at a time otherwise — the forward's W = 1 path adds in the order
// of the one-element-per-thread kernel it replaced, so its results are bit for bit that kernel's):
// - Forward: one warp per row (up to eight rows per block). Lane l holds the chunks (W elements)
//   l, l + 32, ... in registers, sums their squares, a butterfly warp_sum gives every lane the
//   total, and the lane writes y from its registers: the row is read once (a row longer than
//   32·kRmsnormForwardChunks chunks is done in segments and read twice, the second time from
//   cache). No shared memory or barriers; any C. The registers a lane holds follow the row (8
//   chunks up to 2048 bf16 channels, 16 past that) and the plain norm holds none for a branch:
//   registers bound how many blocks an SM runs at once, and so how much traffic is in flight.
//   Bytes: reads N·C + C (weight, cached) elements, writes N·C + N·sizeof(acc) (rstd); the fused
//   form reads 2·N·C and writes 2·N·C (3·N·C with sum_copy).
// - Backward: one block per row; G = min(N, kRmsnormBackwardBlocks) blocks, block b taking rows
//   b, b + G, b + 2G, ... Thread t holds x, dy and dres of chunks t, t + blockDim, ... in
//   registers, and the block's next row is loaded before this row is finished (two rows in
//   flight a block: the loads of one overlap the barriers and writes of the other);
//   a block_sum gives mean(g·x̂), then the block writes dx and adds dy·x̂ into a per-block dweight
//   partial in shared memory. Each partial element has one writer and a fixed order of rows. The
//   block stores its partial in the caller's scratch[G][C]; a second kernel adds, for each c,
//   scratch[0..G)[c] in order into dweight[c]. Deterministic, no atomics; the scratch is
//   G · C · sizeof(acc_t<T>) bytes (at most 8.25 MiB for C = 8192 in fp32).
//   Bytes: reads x, dy (and dres) N·C each, writes dx N·C, writes and then reads G·C partials
//   in acc_t, reads and writes dweight C.
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"

namespace pv {

inline constexpr int kRmsnormForwardRows = 8;           // rows (warps) per forward block
// At most this many backward blocks (dweight partials): two an SM on an H100 (132 SMs), where a
// block of up to 256 threads takes 84 registers a thread (sm_90, make ptxas-report), so every
// block is resident at once and none waits for a second wave (512 blocks at the old kernel's 128
// registers ran 1.9 waves of 2048 channels). At 4096 channels a 512-thread block fills an SM's
// registers alone: two waves, where 512 blocks ran 3.9.
inline constexpr int kRmsnormBackwardBlocks = 264;
inline constexpr int kRmsnormBackwardMaxThreads = 512;  // threads per row in the backward
inline constexpr int kRmsnormReduceThreads = 256;
// Chunks (W elements) each thread keeps in registers between a row's statistics and its write, at
// most: in the forward 16 vectors of 16 bytes (64 registers; a warp holds 512·W channels: 4096 in
// bf16); in the backward 4 each of x, dy and dres, for this row and the next, on the one-element
// path, 2 on the 16-byte path (a 512-thread block holds 1024·W channels: 8192 in bf16). A longer
// row is processed in segments and read a second time (from L1/L2).
inline constexpr int kRmsnormForwardChunks = 16;
inline constexpr int kRmsnormBackwardChunks = 4;

// The rows handled by one warp in the forward kernels; whole warps skip past the end.
__device__ inline long long rmsnorm_warp_row() { return (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; }

// Forward, plain (Fused false: the input is x) or fused with the residual add (the input is
// s = round(x + branch), stored to sum_out, which may alias x, and to sum_copy, which the launcher
// sets to sum_out when the caller wants no copy). One warp per row; lane l holds the chunks
// l, l + 32, ... of a segment of 32·K chunks in registers, so a row that fits one segment
// is read from memory once. K is the launcher's: the fewest chunks a lane needs for the row
// (kRmsnormForwardChunks at most), so the registers a block takes, which bound how many blocks an
// SM holds, follow the row's width and not the longest row's; Fused is a template argument so the
// plain norm does not hold registers for a branch it never reads. With W = 1 the lanes sum their
// squares in the order of the one-element-per-thread kernel this replaced (channels l, l + 32, ...).
template <class T, int W, int K, bool Fused>
__global__ void __launch_bounds__(32 * kRmsnormForwardRows)
    rmsnorm_forward_kernel(const T* x, const T* branch, T* sum_out, T* sum_copy, const T* weight, T* out,
                           acc_t<T>* rstd, long long N, int C, acc_t<T> eps) {
    using A = acc_t<T>;
    const long long n = rmsnorm_warp_row();
    const int lane = threadIdx.x % 32;
    if (n >= N) return;  // uniform across the warp, so every lane reaches the shuffles
    const long long row = n * C;
    const int chunks = C / W, per_segment = 32 * K, segments = (chunks + per_segment - 1) / per_segment;
    Vec<T, W> v[K];
    A sq = 0;
    for (int s = 0; s < segments; ++s)
        for (int k = 0; k < K; ++k) {
            const int j = s * per_segment + k * 32 + lane;
            if (j >= chunks) continue;
            const long long i = row + (long long)j * W;
            v[k] = load_vec<W>(x + i);
            if constexpr (Fused) {  // the residual add, rounded to T before the statistics
                const Vec<T, W> b = load_vec<W>(branch + i);
                for (int e = 0; e < W; ++e) v[k].v[e] = from_acc<T>(to_acc(v[k].v[e]) + to_acc(b.v[e]));
                store_vec<W>(sum_out + i, v[k]);
                store_vec<W>(sum_copy + i, v[k]);  // sum_out again when there is no copy: no branch
            }
            for (int e = 0; e < W; ++e) {
                const A a = to_acc(v[k].v[e]);
                sq += a * a;
            }
        }
    const A r = acc_rsqrt(warp_sum(sq) / A(C) + eps);
    const T* input = Fused ? sum_out : x;  // the second read of a long row: this lane's own values
    for (int s = 0; s < segments; ++s)
        for (int k = 0; k < K; ++k) {
            const int j = s * per_segment + k * 32 + lane;
            if (j >= chunks) continue;
            const long long i = row + (long long)j * W;
            if (segments > 1) v[k] = load_vec<W>(input + i);
            const Vec<T, W> w = load_vec<W>(weight + (long long)j * W);
            Vec<T, W> y;
            for (int e = 0; e < W; ++e) y.v[e] = from_acc<T>(to_acc(v[k].v[e]) * r * to_acc(w.v[e]));
            store_vec<W>(out + i, y);
        }
    if (lane == 0) rstd[n] = r;
}

// One row's chunks j = k·blockDim + threadIdx (k < K, j < chunks) of x, dy and (when dres is
// given) dres into registers: the backward's loads, issued together.
template <class T, int W, int K>
__device__ inline void rmsnorm_backward_load(Vec<T, W> (&xs)[K], Vec<T, W> (&dys)[K], Vec<T, W> (&ds)[K], const T* x,
                                             const T* dout, const T* dres, long long row, int first, int chunks) {
    for (int k = 0; k < K; ++k) {
        const int j = first + k * int(blockDim.x) + int(threadIdx.x);
        if (j >= chunks) continue;
        const long long i = row + (long long)j * W;
        xs[k] = load_vec<W>(x + i);
        dys[k] = load_vec<W>(dout + i);
        if (dres) ds[k] = load_vec<W>(dres + i);
    }
}

// Backward: one block per row (rows b, b + G, ...). Thread t holds chunks t, t + blockDim, ... of
// a segment of blockDim·K chunks of x, dy and dres in registers between the dot product and the
// write. dx = dres + the norm's gradient (dres null: zero; dres may alias dx).
// A row that fits one segment (`held`: up to 8192 channels in bf16) is read once, and the
// block's next row is loaded before this row's block sum and write: its loads are in flight while
// this row waits at the barriers, so each block keeps two rows of traffic outstanding instead of
// stalling on every row's loads. A longer row is processed in segments and read twice.
// Dynamic shared memory: the block's dweight partial, C accumulators; thread t adds only to the
// channels of its own chunks, rows in a fixed order.
template <class T, int W, int K>
__global__ void __launch_bounds__(kRmsnormBackwardMaxThreads)
    rmsnorm_backward_kernel(const T* x, const T* weight, const acc_t<T>* rstd, const T* dout, const T* dres, T* dx,
                            acc_t<T>* partials, long long N, int C) {
    using A = acc_t<T>;
    PV_DYNAMIC_SHARED(A, dw);
    __shared__ A reduce_scratch[32];
    for (int c = threadIdx.x * W; c < C; c += blockDim.x * W)
        for (int e = 0; e < W && c + e < C; ++e) dw[c + e] = 0;  // only this thread touches its chunks
    const int chunks = C / W, per_segment = int(blockDim.x) * K, segments = (chunks + per_segment - 1) / per_segment;
    const bool held = segments == 1;
    // Zero-initialised: every read follows a load, but the compiler cannot see that through `held`
    // (a few moves a thread, once).
    Vec<T, W> xv[K]{}, dyv[K]{}, dv[K]{};  // this row
    Vec<T, W> xn[K]{}, dyn[K]{}, dn[K]{};  // the block's next row (held rows)
    long long n = blockIdx.x;
    if (held && n < N) rmsnorm_backward_load<T, W, K>(xv, dyv, dv, x, dout, dres, n * C, 0, chunks);
    for (; n < N; n += gridDim.x) {
        const long long row = n * C, next = n + gridDim.x;
        if (held && next < N) rmsnorm_backward_load<T, W, K>(xn, dyn, dn, x, dout, dres, next * C, 0, chunks);
        const A r = rstd[n];
        A dot = 0;  // Σ_c g·x̂
        for (int s = 0; s < segments; ++s) {
            if (!held) rmsnorm_backward_load<T, W, K>(xv, dyv, dv, x, dout, nullptr, row, s * per_segment, chunks);
            for (int k = 0; k < K; ++k) {
                const int j = s * per_segment + k * int(blockDim.x) + int(threadIdx.x);
                if (j >= chunks) continue;
                const Vec<T, W> w = load_vec<W>(weight + (long long)j * W);
                for (int e = 0; e < W; ++e) dot += to_acc(w.v[e]) * to_acc(dyv[k].v[e]) * (to_acc(xv[k].v[e]) * r);
            }
        }
        const A mean = block_sum(dot, reduce_scratch) / A(C);
        for (int s = 0; s < segments; ++s) {
            if (!held) rmsnorm_backward_load<T, W, K>(xv, dyv, dv, x, dout, dres, row, s * per_segment, chunks);
            for (int k = 0; k < K; ++k) {
                const int j = s * per_segment + k * int(blockDim.x) + int(threadIdx.x);
                if (j >= chunks) continue;
                const Vec<T, W> w = load_vec<W>(weight + (long long)j * W);
                Vec<T, W> out;
                for (int e = 0; e < W; ++e) {
                    const A dy = to_acc(dyv[k].v[e]), xhat = to_acc(xv[k].v[e]) * r;
                    const A d0 = dres ? to_acc(dv[k].v[e]) : A(0);
                    out.v[e] = from_acc<T>(d0 + (to_acc(w.v[e]) * dy - xhat * mean) * r);
                    dw[j * W + e] += dy * xhat;
                }
                store_vec<W>(dx + row + (long long)j * W, out);
            }
        }
        if (held)
            for (int k = 0; k < K; ++k) xv[k] = xn[k], dyv[k] = dyn[k], dv[k] = dn[k];
    }
    for (int c = threadIdx.x * W; c < C; c += blockDim.x * W)
        for (int e = 0; e < W && c + e < C; ++e) partials[(long long)blockIdx.x * C + c + e] = dw[c + e];
}

// dweight[c] += Σ_b partials[b][c], b = 0, 1, ..., blocks − 1 in that order (= when not
// `accumulate`: the old value is not read).
template <class T>
__global__ void rmsnorm_dweight_kernel(const acc_t<T>* partials, T* dweight, int blocks, int C, bool accumulate) {
    using A = acc_t<T>;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    A sum = 0;
    for (int b = 0; b < blocks; ++b) sum += partials[(long long)b * C + c];
    dweight[c] = from_acc<T>(accumulate ? to_acc(dweight[c]) + sum : sum);
}

// Warps (rows) per forward block: eight, fewer when there are fewer rows (no idle warps).
inline int rmsnorm_forward_rows_per_block(long long N) {
    return N < kRmsnormForwardRows ? int(N) : kRmsnormForwardRows;
}

// Whether rows of C channels go in 16-byte vectors: C a multiple of the width, bases aligned
// (rows then start aligned too).
template <class T>
bool rmsnorm_vector(int C, std::initializer_list<const void*> pointers) {
    return C % kVec<T> == 0 && vec_aligned(pointers);
}

// The forward launch of both public forwards (branch null: the plain norm). Chunks a lane holds:
// 8 when the row fits 32·8 chunks (up to 2048 channels in bf16), kRmsnormForwardChunks otherwise
// (and always for the plain norm's one-element path, which only odd widths take; the fused one holds
// 8, where 16 spilled at the 32 registers ptxas gives it).
template <class T>
void rmsnorm_forward_launch(const T* x, const T* branch, T* sum_out, T* sum_copy, const T* weight, T* out,
                            acc_t<T>* rstd, long long N, int C, double eps, cudaStream_t stream) {
    constexpr int V = kVec<T>, K = kRmsnormForwardChunks, Short = kRmsnormForwardChunks / 2;
    if (N == 0) return;
    const int rows_per_block = rmsnorm_forward_rows_per_block(N);
    auto go = [&](auto kernel) {
        launch(kernel, dim3(ceil_div(N, rows_per_block)), dim3(32 * rows_per_block), 0, stream, x, branch, sum_out,
               sum_copy, weight, out, rstd, N, C, acc_t<T>(eps));
        CUDA_CHECK_LAUNCH();
    };
    const bool fused = branch != nullptr;
    // Without a copy the kernel stores the sum to sum_out twice (the second store finds its line in
    // cache: no traffic); a branch instead spilled the one-element path's registers (ptxas-report).
    if (fused && !sum_copy) sum_copy = sum_out;
    if (!rmsnorm_vector<T>(C, {x, branch, sum_out, sum_copy, weight, out})) {
        fused ? go(rmsnorm_forward_kernel<T, 1, Short, true>) : go(rmsnorm_forward_kernel<T, 1, K, false>);
    } else if (C / V <= 32 * Short) {
        fused ? go(rmsnorm_forward_kernel<T, V, Short, true>) : go(rmsnorm_forward_kernel<T, V, Short, false>);
    } else {
        fused ? go(rmsnorm_forward_kernel<T, V, K, true>) : go(rmsnorm_forward_kernel<T, V, K, false>);
    }
}

// out[N][C] = rmsnorm(x) · weight; rstd[N] saved for the backward.
template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* out, acc_t<T>* rstd, long long N, int C, double eps,
                     cudaStream_t stream) {
    rmsnorm_forward_launch<T>(x, nullptr, nullptr, nullptr, weight, out, rstd, N, C, eps, stream);
}

// sum_out = residual + branch (rounded to T; may alias residual), out = rmsnorm(sum_out) · weight;
// sum_copy, unless null, gets sum_out's values too (it may alias neither input nor sum_out).
template <class T>
void residual_rmsnorm_forward(const T* residual, const T* branch, T* sum_out, const T* weight, T* out, acc_t<T>* rstd,
                              long long N, int C, double eps, cudaStream_t stream, T* sum_copy = nullptr) {
    rmsnorm_forward_launch<T>(residual, branch, sum_out, sum_copy, weight, out, rstd, N, C, eps, stream);
}

// The number of dweight partials (blocks) of the backward for N rows.
inline int rmsnorm_backward_blocks(long long N) { return int(N < kRmsnormBackwardBlocks ? N : kRmsnormBackwardBlocks); }

// Bytes of the scratch rmsnorm_backward needs for N rows of C channels.
template <class T>
size_t rmsnorm_backward_scratch_bytes(long long N, int C) {
    return size_t(rmsnorm_backward_blocks(N)) * size_t(C) * sizeof(acc_t<T>);
}

// dx[N][C] = dres + the gradient of x through the norm (written, not accumulated: dres is the
// gradient already flowing in the residual stream — null for none — and may be dx itself);
// dweight[C] += the gradient of weight (accumulates across micro-steps, or is written over when
// `dweight_write` says so; a null dweight, a frozen weight, skips the weight's reduction).
// `scratch` holds rmsnorm_backward_scratch_bytes<T>(N, C) bytes.
template <class T>
void rmsnorm_backward(const T* x, const T* weight, const acc_t<T>* rstd, const T* dout, const T* dres, T* dx,
                      T* dweight, void* scratch, long long N, int C, cudaStream_t stream,
                      GradWrite dweight_write = GradWrite::add) {
    using A = acc_t<T>;
    constexpr int V = kVec<T>, Max = kRmsnormBackwardMaxThreads;
    if (N == 0 || C == 0) return;
    const int blocks = rmsnorm_backward_blocks(N);
    const bool vector = rmsnorm_vector<T>(C, {x, weight, dout, dres, dx});
    const int chunks = vector ? C / V : C;
    // Chunks a thread holds: 1 when the row fits `Max` threads, else 2 (in segments past 2·Max);
    // kRmsnormBackwardChunks on the one-element path. (Four 16-byte chunks of this row and the
    // next take a bf16 thread past the 128 registers 512 threads may have.)
    const int K = !vector ? kRmsnormBackwardChunks : chunks <= Max ? 1 : 2;
    const int rounded = ceil_div(ceil_div(chunks, K), 32) * 32;
    const int threads = rounded < Max ? rounded : Max;
    const size_t smem = size_t(C) * sizeof(A);
    A* partials = static_cast<A*>(scratch);
    auto go = [&](auto kernel) {
        // 48 KiB less the static reduce_scratch is the most a launch may take without opting in.
        if (smem + 32 * sizeof(A) > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        launch(kernel, dim3(blocks), dim3(threads), smem, stream, x, weight, rstd, dout, dres, dx, partials, N, C);
        CUDA_CHECK_LAUNCH();
    };
    if (!vector)
        go(rmsnorm_backward_kernel<T, 1, kRmsnormBackwardChunks>);
    else if (K == 1)
        go(rmsnorm_backward_kernel<T, V, 1>);
    else
        go(rmsnorm_backward_kernel<T, V, 2>);
    if (dweight == nullptr) return;
    launch(rmsnorm_dweight_kernel<T>, dim3(ceil_div(C, kRmsnormReduceThreads)), dim3(kRmsnormReduceThreads), 0, stream,
           partials, dweight, blocks, C, dweight_write == GradWrite::add);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
