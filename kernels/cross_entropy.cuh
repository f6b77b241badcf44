// Fused softmax + cross-entropy over the vocabulary, the last op of the model.
//
// logits is [N][V] row-major, targets[N] the next-token ids. For a row n with target t:
//   loss_n = logsumexp(logits[n]) − logits[n][t],   logsumexp(x) = m + log Σ_j exp(x_j − m),
// with m = max_j x_j, so no exp overflows whatever the logits' magnitude. A row whose target is
// ignore_index has loss 0 and is not counted. A target outside [0, V) that is not ignore_index is
// a data error: that row's loss (and, in the backward, its whole gradient row) is NaN, so it
// surfaces in loss_sum instead of reading out of bounds; the row is counted.
// The forward writes row_loss[N], loss_sum = Σ_n row_loss[n] and count = #counted rows.
//
// Backward of L = scale · Σ_n loss_n (scale = 1 / the step's global count of counted tokens,
// passed in by the caller: DESIGN.md §4, the count covers all micro-steps and ranks):
//   dlogits[n][j] = scale · (softmax(logits[n])_j − [j == t])  for counted rows, 0 for ignored.
// The probabilities are recomputed from the logits and the forward's per-row (max, sum); nothing
// V-sized is kept from the forward.
//
// Kernels:
// - Forward: one block per row. Each thread walks the row in 16-byte chunks (8 bf16; one logit
//   at a time when V is not a multiple of the width), kUnroll chunks loaded before they are
//   added, keeping an online (max, sum) pair — sum = Σ exp(x − max), rescaled when the max
//   grows; the pairs are merged by warp shuffles and across warps through shared memory, in a
//   fixed order, so every thread gets the same (max, sum). Thread 0 writes the row's loss and the
//   pair itself (row_stats), which the backward reuses: the logits are read once for the
//   statistics, once for the gradient — two passes over N·V in all, where recomputing the
//   statistics in the backward took three.
// - Sum: a second, single-block kernel sums row_loss in a fixed order: no atomics, so the loss is
//   bitwise reproducible.
// - Backward: an elementwise pass over N·V in 16-byte vectors (kernels/vec.cuh): each chunk is
//   read, turned into its gradient with the row's saved (max, sum) and written back by the same
//   thread, so dlogits may alias logits (in place, as llm.c does, saving an N·V buffer).
// - Loss and gradient in one pass (cross_entropy_loss_and_gradient, the fused linear
//   cross-entropy's step: model/llama.cu's head computes its logits a chunk of rows at a time and
//   never holds all N·V): one block per row computes the row's (max, sum) as the forward does, its
//   loss from them, and then, in place, the gradient as the backward does — the same bits as the
//   forward kernel followed by the backward (the same statistics, the same formula per element),
//   with the row read twice (the second time from L2: a row is at most 256 KB, and the rows in
//   flight about fill an H100's 50 MB) and written once. It needs the loss scale up front, so the
//   head runs it in its backward, where the scale is known.
// Bits: the scalar paths (V not a multiple of the vector width) add the logits in the order of
// the kernels these replaced and give the same loss and gradient bit for bit; the vector paths
// change each thread's order of additions, so the float loss can differ in the last bits (the
// gradient formula per element, given the row's statistics, is unchanged).
// Bytes: forward reads N·V logits and N targets, writes N losses and N stats (2·acc); backward
// reads N·V logits, N targets and N stats, writes N·V; the one-pass kernel reads N·V logits (twice,
// once from L2) and N targets, writes N·V, N losses and N stats.
// V may be anything from 1 to the 128256 of Llama 3 (odd sizes included).
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"

#include <cfloat>

namespace pv {

// The online softmax statistics of a set of values: max and Σ exp(x − max).
template <class A>
struct CrossEntropyStats {
    A max;
    A sum;
};

// The "empty set": the lowest finite value, not −∞, so that merging two empty sets (or adding a
// −∞ logit) computes exp(lowest − lowest) = 1 times a zero sum, never exp(−∞ + ∞) = NaN.
__device__ inline float cross_entropy_lowest(float) { return -FLT_MAX; }
__device__ inline double cross_entropy_lowest(double) { return -DBL_MAX; }

// Merges (m2, s2) into (m, s). Commutative bit for bit (max and the two-term sum are), so both
// lanes of a butterfly step get the same result.
template <class A>
__device__ inline CrossEntropyStats<A> cross_entropy_merge(CrossEntropyStats<A> a, CrossEntropyStats<A> b) {
    const A m = acc_max(a.max, b.max);
    return {m, a.sum * acc_exp(a.max - m) + b.sum * acc_exp(b.max - m)};
}

// One logit into a thread's running (max, sum): the max grows, or the sum gains exp(v − max).
template <class A>
__device__ inline void cross_entropy_add(CrossEntropyStats<A>& st, A v) {
    if (v > st.max) {
        st.sum = st.sum * acc_exp(st.max - v) + A(1);
        st.max = v;
    } else {
        st.sum += acc_exp(v - st.max);  // a NaN logit lands here and makes the sum NaN
    }
}

// Every thread's (max, sum) over the row `x` of length V, merged over the block; every thread gets
// the same result. Thread t takes the chunks (W logits) t, t + blockDim, ... in order, kUnroll
// chunks loaded before any is added (several 16-byte loads in flight). With W = 1 a thread adds
// the logits t, t + blockDim, ..., the order of the scalar kernel this replaced: the same bits.
// `scratch` holds 32 pairs of shared memory; it may be reused after the call.
template <int W, class T>
__device__ inline CrossEntropyStats<acc_t<T>> cross_entropy_row_stats(const T* x, int V,
                                                                      CrossEntropyStats<acc_t<T>>* scratch) {
    using A = acc_t<T>;
    CrossEntropyStats<A> st{cross_entropy_lowest(A(0)), A(0)};
    const int chunks = V / W, stride = int(blockDim.x);
    for (int j = threadIdx.x; j < chunks; j += kUnroll * stride) {
        Vec<T, W> v[kUnroll];
        for (int u = 0; u < kUnroll; ++u)
            if (j + u * stride < chunks) v[u] = load_vec<W>(x + (j + u * stride) * W);
        for (int u = 0; u < kUnroll; ++u)
            if (j + u * stride < chunks)
                for (int e = 0; e < W; ++e) cross_entropy_add(st, to_acc(v[u].v[e]));
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const CrossEntropyStats<A> other{__shfl_xor_sync(0xffffffffu, st.max, offset),
                                         __shfl_xor_sync(0xffffffffu, st.sum, offset)};
        st = cross_entropy_merge(st, other);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    if (lane == 0) scratch[warp] = st;
    __syncthreads();
    CrossEntropyStats<A> total = scratch[0];
    for (int w = 1; w < warps; ++w) total = cross_entropy_merge(total, scratch[w]);  // same order everywhere
    __syncthreads();
    return total;
}

// One block per row: row_loss[n] and, when row_stats is not null, the row's (max, sum) for the
// backward.
template <class T, int W>
__global__ void cross_entropy_forward_kernel(const T* logits, const int* targets, acc_t<T>* row_loss,
                                             CrossEntropyStats<acc_t<T>>* row_stats, int V, int ignore_index) {
    using A = acc_t<T>;
    __shared__ CrossEntropyStats<A> scratch[32];
    const long long row = blockIdx.x;
    const T* x = logits + row * V;
    const int t = targets[row];
    const CrossEntropyStats<A> st = cross_entropy_row_stats<W>(x, V, &scratch[0]);
    if (threadIdx.x == 0) {
        A loss;
        if (t == ignore_index)
            loss = A(0);
        else if (t < 0 || t >= V)
            loss = A(NAN);
        else
            loss = st.max + acc_log(st.sum) - to_acc(x[t]);
        row_loss[row] = loss;
        if (row_stats) row_stats[row] = st;
    }
}

// One block: loss_sum = Σ row_loss and count = #(targets != ignore_index), each thread summing a
// fixed strided subset, then a fixed-order block reduction.
template <class T>
__global__ void cross_entropy_sum_kernel(const acc_t<T>* row_loss, const int* targets, acc_t<T>* loss_sum, int* count,
                                         long long N, int ignore_index) {
    using A = acc_t<T>;
    __shared__ A scratch[32];
    __shared__ int count_scratch[32];
    A sum = 0;
    int counted = 0;
    for (long long n = threadIdx.x; n < N; n += blockDim.x) {
        sum += row_loss[n];
        counted += targets[n] != ignore_index;
    }
    sum = block_sum(sum, &scratch[0]);
    counted = block_sum(counted, &count_scratch[0]);
    if (threadIdx.x == 0) {
        *loss_sum = sum;
        *count = counted;
    }
}

// The gradient of W consecutive logits x of one row, whose first is column j of the whole
// vocabulary: scale·exp(x − max)/sum − [column == t]·scale, all NaN for a target outside
// [0, whole_V) (a bad target poisons its whole row), all 0 for an ignored row (st unread). The one
// formula of the backward and of the one-pass kernel, so the two give the same bits.
template <class T, int W>
__device__ inline Vec<T, W> cross_entropy_gradient(const Vec<T, W>& x, CrossEntropyStats<acc_t<T>> st, int j, int t,
                                                   int ignore_index, int whole_V, acc_t<T> scale) {
    using A = acc_t<T>;
    Vec<T, W> d;
    if (t == ignore_index) {
        for (int e = 0; e < W; ++e) d.v[e] = from_acc<T>(A(0));
        return d;
    }
    const A bad = (t < 0 || t >= whole_V) ? A(NAN) : A(0);
    const A norm = scale / st.sum;
    for (int e = 0; e < W; ++e) {
        const A p = acc_exp(to_acc(x.v[e]) - st.max);
        d.v[e] = from_acc<T>(p * norm - (j + e == t ? scale : A(0)) + bad);
    }
    return d;
}

// The backward as an elementwise operation (kernels/vec.cuh) over the N·V logits, with the rows'
// statistics from the forward: element i is row n = i / V, column j = i % V, and
// dlogits = scale·exp(x − max)/sum − [j == t]·scale (NaN for a bad target, 0 for an ignored row).
// Each chunk is read whole before it is written, by the thread that writes it: dlogits may be
// logits. Chunks never cross a row (vectors only when V % W == 0).
template <class T>
struct CrossEntropyBackwardOp {
    static constexpr int kWidth = kVec<T>;
    const T* logits;
    const int* targets;
    const CrossEntropyStats<acc_t<T>>* row_stats;
    T* dlogits;
    int V, ignore_index;
    DeviceScalar<double> scale;  // read once a store (converted as the host would: bits unchanged)
    int first = 0;    // the logits' first column in the whole vocabulary (vocabulary-parallel: the rank's)
    int whole_V = 0;  // the whole vocabulary
    template <int W>
    struct In {
        Vec<T, W> x;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        return {load_vec<W>(logits + i)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& in) const {
        const I n = i / V;
        const int j0 = int(i - n * V), t = targets[n];
        store_vec<W>(dlogits + i,
                     cross_entropy_gradient(in.x, t == ignore_index ? CrossEntropyStats<acc_t<T>>{} : row_stats[n],
                                            first + j0, t, ignore_index, whole_V, acc_t<T>(scale.get())));
    }
};

// Threads per row: a multiple of 32 giving each thread about 16 logits or more (the N rows in flight
// keep the GPU busy), at most 1024 (from V = 16384 on; Llama 3's 128256 gives 126 each).
inline int cross_entropy_block_size(int V) { return V >= 16384 ? 1024 : 32 * ceil_div(V, 16 * 32); }

// One block per row, in place: the row's (max, sum) and loss as cross_entropy_forward_kernel computes
// them (row_loss, row_stats), then the row's gradient as CrossEntropyBackwardOp computes it, over
// the logits. Every thread reads the target's logit before the barrier that precedes the writes.
template <class T, int W>
__global__ void cross_entropy_loss_and_gradient_kernel(T* logits, const int* targets, acc_t<T>* row_loss,
                                                       CrossEntropyStats<acc_t<T>>* row_stats, int V, int ignore_index,
                                                       DeviceScalar<double> loss_scale) {
    using A = acc_t<T>;
    const A scale = A(loss_scale.get());
    __shared__ CrossEntropyStats<A> scratch[32];
    const long long row = blockIdx.x;
    T* x = logits + row * V;
    const int t = targets[row];
    const CrossEntropyStats<A> st = cross_entropy_row_stats<W>(x, V, &scratch[0]);
    const bool counted = t != ignore_index, bad = t < 0 || t >= V;
    const A target = counted && !bad ? to_acc(x[t]) : A(0);
    __syncthreads();  // the target's logit is read everywhere before any thread overwrites it
    if (threadIdx.x == 0) {
        row_loss[row] = !counted ? A(0) : bad ? A(NAN) : st.max + acc_log(st.sum) - target;
        row_stats[row] = st;
    }
    for (int j = threadIdx.x; j < V / W; j += blockDim.x)
        store_vec<W>(x + j * W, cross_entropy_gradient(load_vec<W>(x + j * W), st, j * W, t, ignore_index, V, scale));
}

// *loss_sum = Σ row_loss and *count = the counted rows, in a fixed order. A warp per 32 rows, at
// most 8 (the sum is a few microseconds at any N); N < 2^31 (grid size).
template <class T>
void cross_entropy_sum(const acc_t<T>* row_loss, const int* targets, acc_t<T>* loss_sum, int* count, long long N,
                       int ignore_index, cudaStream_t stream) {
    const int sum_block = N >= 256 ? 256 : 32 * ceil_div(N > 0 ? N : 1, 32);
    launch(cross_entropy_sum_kernel<T>, dim3(1), dim3(sum_block), 0, stream, row_loss, targets, loss_sum, count, N,
           ignore_index);
    CUDA_CHECK_LAUNCH();
}

// The rows' part of cross_entropy_forward alone: row_loss[N] and row_stats[N] (may be null), no
// sum — a caller computing the logits a chunk of rows at a time sums all N once at the end.
template <class T>
void cross_entropy_rows(const T* logits, const int* targets, acc_t<T>* row_loss, CrossEntropyStats<acc_t<T>>* row_stats,
                        long long N, int V, int ignore_index, cudaStream_t stream) {
    if (N == 0) return;
    auto go = [&](auto kernel) {
        launch(kernel, dim3(unsigned(N)), dim3(cross_entropy_block_size(V)), 0, stream, logits, targets, row_loss,
               row_stats, V, ignore_index);
        CUDA_CHECK_LAUNCH();
    };
    if (V % kVec<T> == 0 && vec_aligned({logits}))
        go(cross_entropy_forward_kernel<T, kVec<T>>);
    else
        go(cross_entropy_forward_kernel<T, 1>);
}

// row_loss[N] (0 for ignored rows), *loss_sum = Σ row_loss (fixed order), *count = the number of
// counted rows; loss_sum and count are single device values. row_stats[N] (may be null: a forward
// with no backward to follow) receives each row's (max, sum) for cross_entropy_backward.
template <class T>
void cross_entropy_forward(const T* logits, const int* targets, acc_t<T>* row_loss,
                           CrossEntropyStats<acc_t<T>>* row_stats, acc_t<T>* loss_sum, int* count, long long N, int V,
                           int ignore_index, cudaStream_t stream) {
    cross_entropy_rows(logits, targets, row_loss, row_stats, N, V, ignore_index, stream);
    cross_entropy_sum<T>(row_loss, targets, loss_sum, count, N, ignore_index, stream);
}

// The loss and the gradient in one pass over [N][V] logits (the whole vocabulary), in place:
// row_loss[N] and row_stats[N] as cross_entropy_rows writes them, and the logits overwritten by
// dlogits as cross_entropy_backward writes them with `scale`, bit for bit. No sum: the caller
// sums the rows (cross_entropy_sum) once all of them are done.
template <class T>
void cross_entropy_loss_and_gradient(T* logits, const int* targets, acc_t<T>* row_loss,
                                     CrossEntropyStats<acc_t<T>>* row_stats, long long N, int V, int ignore_index,
                                     DeviceScalar<double> scale, cudaStream_t stream) {
    if (N == 0) return;
    auto go = [&](auto kernel) {
        launch(kernel, dim3(unsigned(N)), dim3(cross_entropy_block_size(V)), 0, stream, logits, targets, row_loss,
               row_stats, V, ignore_index, scale);
        CUDA_CHECK_LAUNCH();
    };
    if (V % kVec<T> == 0 && vec_aligned({logits}))
        go(cross_entropy_loss_and_gradient_kernel<T, kVec<T>>);
    else
        go(cross_entropy_loss_and_gradient_kernel<T, 1>);
}

// Vocabulary-parallel cross-entropy (Megatron-LM's, for a tensor-parallel lm_head): a rank holds
// columns [first, first + V) of the whole [N][whole_V] logits, and the full rows never meet. Each
// rank computes its columns' partial (max, Σ exp(x − max)) and the target's logit when the target
// is among its columns (0 otherwise); the group all-gathers the partials ([ranks][N], rank order:
// 3 values a row, not V); every rank merges them in rank order — the same bits everywhere — into
// the row's statistics and loss (loss = max + log Σ − x_t), and its backward is the ordinary one
// on its columns with the merged statistics (first, whole_V). The caller does the all-gather.
template <class A>
struct CrossEntropyPartial {
    CrossEntropyStats<A> stats;
    A target;  // the target's logit if this rank holds its column, else 0
};

template <class T, int W>
__global__ void cross_entropy_partial_kernel(const T* logits, const int* targets,
                                             CrossEntropyPartial<acc_t<T>>* partials, int V, int first) {
    using A = acc_t<T>;
    __shared__ CrossEntropyStats<A> scratch[32];
    const long long row = blockIdx.x;
    const T* x = logits + row * V;
    const int t = targets[row] - first;
    const CrossEntropyStats<A> st = cross_entropy_row_stats<W>(x, V, &scratch[0]);
    if (threadIdx.x == 0) partials[row] = {st, t >= 0 && t < V ? to_acc(x[t]) : A(0)};
}

// One thread per row: the ranks' partials merged in rank order into row_stats and row_loss (0 for
// an ignored row, NaN for a target outside [0, whole_V)).
template <class A>
__global__ void cross_entropy_merge_kernel(const CrossEntropyPartial<A>* partials, int ranks, const int* targets,
                                           CrossEntropyStats<A>* row_stats, A* row_loss, long long N, int whole_V,
                                           int ignore_index) {
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    CrossEntropyStats<A> st = partials[row].stats;
    A target = partials[row].target;
    for (int r = 1; r < ranks; ++r) {
        st = cross_entropy_merge(st, partials[r * N + row].stats);
        target += partials[r * N + row].target;  // one rank's logit, zeros from the others: exact
    }
    const int t = targets[row];
    row_stats[row] = st;
    row_loss[row] = t == ignore_index ? A(0) : (t < 0 || t >= whole_V) ? A(NAN) : st.max + acc_log(st.sum) - target;
}

// Step 1 on each rank: partials[N] of its V columns starting at column `first`.
template <class T>
void cross_entropy_partials(const T* logits, const int* targets, CrossEntropyPartial<acc_t<T>>* partials, long long N,
                            int V, int first, cudaStream_t stream) {
    if (N == 0) return;
    auto go = [&](auto kernel) {
        launch(kernel, dim3(unsigned(N)), dim3(cross_entropy_block_size(V)), 0, stream, logits, targets, partials, V,
               first);
        CUDA_CHECK_LAUNCH();
    };
    if (V % kVec<T> == 0 && vec_aligned({logits}))
        go(cross_entropy_partial_kernel<T, kVec<T>>);
    else
        go(cross_entropy_partial_kernel<T, 1>);
}

// The rows' part of cross_entropy_merge_partials alone (row_stats, row_loss; no sum): for a caller
// that merges a chunk of rows at a time and sums all of them once at the end.
template <class T>
void cross_entropy_merge_rows(const CrossEntropyPartial<acc_t<T>>* partials, int ranks, const int* targets,
                              CrossEntropyStats<acc_t<T>>* row_stats, acc_t<T>* row_loss, long long N, int whole_V,
                              int ignore_index, cudaStream_t stream) {
    if (N == 0) return;
    launch(cross_entropy_merge_kernel<acc_t<T>>, dim3(unsigned(ceil_div(N, 256))), dim3(256), 0, stream, partials,
           ranks, targets, row_stats, row_loss, N, whole_V, ignore_index);
    CUDA_CHECK_LAUNCH();
}

// Step 3, after the all-gather: `partials` holds every rank's [N], rank after rank. Writes
// row_stats (for cross_entropy_backward with this rank's first and whole_V), row_loss, and the
// loss sum and count as cross_entropy_forward does.
template <class T>
void cross_entropy_merge_partials(const CrossEntropyPartial<acc_t<T>>* partials, int ranks, const int* targets,
                                  CrossEntropyStats<acc_t<T>>* row_stats, acc_t<T>* row_loss, acc_t<T>* loss_sum,
                                  int* count, long long N, int whole_V, int ignore_index, cudaStream_t stream) {
    cross_entropy_merge_rows<T>(partials, ranks, targets, row_stats, row_loss, N, whole_V, ignore_index, stream);
    cross_entropy_sum<T>(row_loss, targets, loss_sum, count, N, ignore_index, stream);
}

// The backward on a rank's V columns starting at `first` of a whole_V vocabulary, with the merged
// statistics: cross_entropy_backward's formula, the one-hot at the target's column if it is here.
template <class T>
void cross_entropy_backward_columns(const T* logits, const int* targets, const CrossEntropyStats<acc_t<T>>* row_stats,
                                    T* dlogits, long long N, int V, int first, int whole_V, int ignore_index,
                                    DeviceScalar<double> scale, cudaStream_t stream) {
    const bool vector = V % kVec<T> == 0 && vec_aligned({logits, dlogits});
    launch_elementwise(
        CrossEntropyBackwardOp<T>{logits, targets, row_stats, dlogits, V, ignore_index, scale, first, whole_V}, N * V,
        vector, stream);
}

// dlogits[N][V] = (softmax(logits) − onehot(target))·scale for counted rows, 0 for ignored rows;
// scale is 1 / (the global count of counted tokens); row_stats are the forward's on the same
// logits. dlogits may equal logits (in place).
template <class T>
void cross_entropy_backward(const T* logits, const int* targets, const CrossEntropyStats<acc_t<T>>* row_stats,
                            T* dlogits, long long N, int V, int ignore_index, DeviceScalar<double> scale,
                            cudaStream_t stream) {
    cross_entropy_backward_columns(logits, targets, row_stats, dlogits, N, V, 0, V, ignore_index, scale, stream);
}

}  // namespace pv
