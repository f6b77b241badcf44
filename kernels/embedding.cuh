// Token embedding: the lookup of each token's row of the embedding table.
//
// Shapes (row-major): tokens[N] (int32), wte[V][C], out and dout [N][C].
//
// Forward:   out[n][c] = wte[tokens[n]][c].
//   A token outside [0, V) would read outside the table; instead its whole row of `out` is NaN,
//   so the loss turns NaN and a later check catches the bad data rather than training on
//   garbage. One thread per output element: a memory-bound copy, deterministic.
//
// Backward:  dwte[v][c] += Σ_{n : tokens[n] = v} dout[n][c]   (rows with a bad token are skipped).
//   It ACCUMULATES into dwte: with tied embeddings the head's gradient is already there, and
//   gradient accumulation adds micro-steps. The sum over the positions of one token is a
//   scatter-add; atomics would make it depend on the schedule, so instead:
//   - Each block owns a slice of kEmbeddingBackwardChannels channels and walks the positions in
//     chunks of kEmbeddingBackwardChunk. For each chunk it sorts the keys (token << 32 | position)
//     in shared memory (a bitonic sort; good keys are distinct, so the sorted order is unique),
//     marks where the token changes, and compacts the starts of the runs of equal tokens (a
//     block scan). Bad tokens and the padding of a short chunk get an all-ones key that sorts
//     last and is skipped. Shared memory: 12 bytes per slot, 48 KiB for a full chunk (opt-in).
//   - The warps take the runs round-robin; lane l owns channels c0 + l + 32·j of the slice and
//     sums dout over the run's positions in ascending order in acc_t<T>, then adds the sum to
//     dwte[v][c] once (one rounding to T per token, channel and chunk: exactly once when
//     N <= kEmbeddingBackwardChunk).
//   - No two threads write the same dwte element within a chunk (one warp per run, one lane
//     per channel), and chunks are separated by a barrier of the block that owns the channels,
//     so the order of every addition is fixed: the result is bit-identical under any schedule.
//   Cost: dout is read once (N·C elements) and dwte read and written once per (token, channel)
//   of each chunk. The price of determinism without a scratch buffer is that every block sorts
//   every chunk again: about (C / 64) · N · log²(chunk) / 4 shared-memory compare-exchanges,
//   comparable to the summation itself, and the parallelism is C / 64 blocks (64 for C = 4096).
//   Runs go to warps whole, so a chunk dominated by one token is summed by one warp.
#pragma once

#include "kernels/common.cuh"

namespace pv {

inline constexpr int kEmbeddingBackwardChunk = 4096;   // positions sorted together (a power of two)
inline constexpr int kEmbeddingBackwardChannels = 64;  // channels per block: two per lane
inline constexpr int kEmbeddingBackwardThreads = 256;  // eight warps share out the runs

template <class T>
__global__ void embedding_forward_kernel(const int* tokens, const T* wte, T* out, long long N, int C, int V) {
    using A = acc_t<T>;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * C) return;
    const long long n = i / C;
    const int c = int(i % C);
    const int token = tokens[n];
    out[i] = (token >= 0 && token < V) ? wte[(long long)token * C + c] : from_acc<T>(A(NAN));
}

// The sort key of a sorted slot: the token in the high word, the position within the chunk in
// the low word. kEmbeddingBadKey marks a bad token and the padding past the chunk's end.
inline constexpr unsigned long long kEmbeddingBadKey = ~0ull;

// Whether sorted slot i begins a run of equal tokens.
__device__ inline int embedding_starts_run(const unsigned long long* keys, int i) {
    return i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32);
}

// Dynamic shared memory: keys[chunk] (8 bytes each), then run_starts[chunk] (ints).
template <class T>
__global__ void embedding_backward_kernel(const int* tokens, const T* dout, T* dwte, long long N, int C, int V,
                                          int chunk) {
    using A = acc_t<T>;
    constexpr int kPerLane = kEmbeddingBackwardChannels / 32;
    PV_DYNAMIC_SHARED(unsigned long long, keys);
    int* run_starts = reinterpret_cast<int*>(keys + chunk);
    __shared__ int warp_totals[32];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    const int c0 = blockIdx.x * kEmbeddingBackwardChannels;
    const int per_thread = ceil_div(chunk, blockDim.x);  // the slots each thread scans for run starts
    const int seg_begin = min(tid * per_thread, chunk), seg_end = min(seg_begin + per_thread, chunk);

    for (long long start = 0; start < N; start += chunk) {
        const long long count = N - start < chunk ? N - start : chunk;
        for (int i = tid; i < chunk; i += blockDim.x) {
            const int token = i < count ? tokens[start + i] : -1;
            keys[i] = (token >= 0 && token < V) ? ((unsigned long long)token << 32) | unsigned(i) : kEmbeddingBadKey;
        }
        __syncthreads();

        // Bitonic sort, ascending. Pair p of a stage compares slots i and i + j, where i has bit
        // j clear; the direction alternates with bit k of i.
        for (int k = 2; k <= chunk; k *= 2) {
            for (int j = k / 2; j > 0; j /= 2) {
                for (int p = tid; p < chunk / 2; p += blockDim.x) {
                    const int i = 2 * j * (p / j) + p % j;
                    const unsigned long long a = keys[i], b = keys[i + j];
                    if ((a > b) == ((i & k) == 0)) keys[i] = b, keys[i + j] = a;
                }
                __syncthreads();
            }
        }

        // Starts of the runs of equal tokens (the bad keys form the last run): count in this
        // thread's slots, exclusive scan over the block, then write the starts in order.
        int mine = 0;
        for (int i = seg_begin; i < seg_end; ++i) mine += embedding_starts_run(keys, i);
        int inclusive = mine;
        for (int offset = 1; offset < 32; offset *= 2) {
            const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
            if (lane >= offset) inclusive += up;
        }
        if (lane == 31) warp_totals[warp] = inclusive;
        __syncthreads();
        int before = 0, runs = 0;
        for (int w = 0; w < warps; ++w) {
            if (w < warp) before += warp_totals[w];
            runs += warp_totals[w];
        }
        int slot = before + inclusive - mine;
        for (int i = seg_begin; i < seg_end; ++i)
            if (embedding_starts_run(keys, i)) run_starts[slot++] = i;
        __syncthreads();

        for (int r = warp; r < runs; r += warps) {
            const int begin = run_starts[r], end = r + 1 < runs ? run_starts[r + 1] : chunk;
            if (keys[begin] != kEmbeddingBadKey) {
                const long long token = (long long)(keys[begin] >> 32);
                A sum[kPerLane] = {};
                for (int i = begin; i < end; ++i) {  // positions in ascending order
                    const long long n = start + (long long)(keys[i] & 0xffffffffu);
                    for (int j = 0; j < kPerLane; ++j)
                        if (c0 + lane + 32 * j < C) sum[j] += to_acc(dout[n * C + c0 + lane + 32 * j]);
                }
                for (int j = 0; j < kPerLane; ++j)
                    if (c0 + lane + 32 * j < C) {
                        T* w = dwte + token * C + c0 + lane + 32 * j;
                        *w = from_acc<T>(to_acc(*w) + sum[j]);
                    }
            }
        }
        // The next chunk overwrites keys and run_starts, and may add to the same dwte elements
        // from other warps: everything above must be finished first.
        __syncthreads();
    }
}

// out[N][C] = wte[tokens[n]]; rows whose token is outside [0, V) are NaN.
template <class T>
void embedding_forward(const int* tokens, const T* wte, T* out, long long N, int C, int V, cudaStream_t stream) {
    if (N * C == 0) return;
    const int block = 256;
    launch(embedding_forward_kernel<T>, dim3(ceil_div(N * C, block)), dim3(block), 0, stream, tokens, wte, out, N, C,
           V);
    CUDA_CHECK_LAUNCH();
}

// dwte[V][C] += the sum of dout's rows per token (accumulates; bad tokens skipped; deterministic).
template <class T>
void embedding_backward(const int* tokens, const T* dout, T* dwte, long long N, int C, int V, cudaStream_t stream) {
    if (N * C == 0) return;
    int chunk = 1;  // the smallest power of two holding the positions, up to the fixed chunk
    while (chunk < N && chunk < kEmbeddingBackwardChunk) chunk *= 2;
    const size_t smem = size_t(chunk) * (sizeof(unsigned long long) + sizeof(int));
    // 48 KiB less the static warp_totals is the most a launch may take without opting in.
    if (smem + 32 * sizeof(int) > 48 * 1024)
        CUDA_CHECK(
            cudaFuncSetAttribute(embedding_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch(embedding_backward_kernel<T>, dim3(ceil_div(C, kEmbeddingBackwardChannels)), dim3(kEmbeddingBackwardThreads),
           smem, stream, tokens, dout, dwte, N, C, V, chunk);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
