// Token embedding: the lookup of each token's row of the embedding table.
//
// Shapes (row-major): tokens[N] (int32), wte[V][C], out and dout [N][C].
//
// Forward:   out[n][c] = wte[tokens[n]][c].
//   A token outside [0, V) would read outside the table; instead its whole row of `out` is NaN,
//   so the loss turns NaN and a later check catches the bad data rather than training on
//   garbage. A memory-bound copy in 16-byte vectors (kernels/vec.cuh; element by element when C
//   is not a multiple of the width), deterministic. Bytes: reads N tokens (once per chunk, cached)
//   and N·C table elements, writes N·C.
//
// Backward:  dwte[v][c] += Σ_{n : tokens[n] = v} dout[n][c]   (rows with a bad token are skipped).
//   It ACCUMULATES into dwte: with tied embeddings the head's gradient is already there, and
//   gradient accumulation adds micro-steps. The sum over the positions of one token is a
//   scatter-add; atomics would make it depend on the schedule, so instead, per chunk of
//   kEmbeddingBackwardChunk positions:
//   - Sort (one launch, one block per chunk): the keys (token << 32 | position) are sorted in
//     shared memory (a bitonic sort; good keys are distinct, so the sorted order is unique), the
//     starts of the runs of equal tokens compacted (a block scan), and the chunk's order and run
//     starts written to a device scratch. Bad tokens and the padding of a short chunk get an
//     all-ones key that sorts last and is left out of the runs. Shared memory: 8 bytes per slot,
//     32 KiB for a full chunk.
//   - Sum (one launch per chunk, in chunk order on the stream): a grid of (channel slices ×
//     groups of runs) blocks; a slice is 32 lanes of one 16-byte vector each (8 bf16 channels;
//     one channel per lane when C is not a multiple of the vector width), and the warps of all
//     groups take the runs round-robin. A lane sums dout over its run's positions in ascending
//     order in acc_t<T>, then adds the sum to dwte[v][c] once (one rounding to T per token,
//     channel and chunk: exactly once when N <= kEmbeddingBackwardChunk).
//   - No two threads write the same dwte element within a launch (one warp per run, one lane per
//     channel), and the launches of successive chunks are ordered by the stream, so the order
//     of every addition is fixed by the data alone: the result is bit-identical under any
//     schedule and grid size, and equal to the one-block-per-64-channels kernel this replaced.
//   The sum's grid fills the GPU: C/(32·W) slices × up to 1024/slices groups (8 × 128 blocks of
//   eight warps at C = 2048 in bf16, where the old kernel launched 32 blocks).
//   Bytes: reads N tokens and N·C dout elements, reads and writes dwte once per (token, channel)
//   of each chunk, and 4·(2·chunk + 2) bytes of scratch per chunk written and read.
//
// A slice of the vocabulary (tensor parallelism's vocabulary-parallel embedding, model/
// tensor_parallel.h): the table holds the token rows [first, first + V) of a whole_V vocabulary.
// The forward writes a token's row when it is among them, zeros when it is another good token (the
// group's sum then holds every row once, exactly) and NaN for a bad one on every rank; the
// backward adds to the rows held and skips the other tokens. first = 0, whole_V = V: the whole.
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"

namespace pv {

inline constexpr int kEmbeddingBackwardChunk = 4096;         // positions sorted together (a power of two)
inline constexpr int kEmbeddingBackwardThreads = 256;        // eight warps per block
inline constexpr int kEmbeddingBackwardTargetBlocks = 1024;  // about eight blocks per SM of an H100

// The forward as an elementwise operation (kernels/vec.cuh) over the N·C outputs: element i is
// position n = i / C, channel c = i % C; a chunk never crosses a row (vectors only when C % W == 0).
template <class T>
struct EmbeddingForwardOp {
    static constexpr int kWidth = kVec<T>;
    const int* tokens;
    const T* wte;
    T* out;
    int C, V;
    int first, whole_V;  // the table's token rows [first, first + V) of the whole vocabulary
    template <int W>
    struct In {
        Vec<T, W> row;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        const I n = i / C, c = i - n * C;
        const int token = tokens[n], local = token - first;
        if (local >= 0 && local < V) return {load_vec<W>(wte + (long long)local * C + c)};
        In<W> other;
        const bool good = token >= 0 && token < whole_V;  // another rank's row, or a bad token
        for (int k = 0; k < W; ++k) other.row.v[k] = from_acc<T>(good ? acc_t<T>(0) : acc_t<T>(NAN));
        return other;
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& in) const {
        store_vec<W>(out + i, in.row);
    }
};

// The sort key of a sorted slot: the token in the high word, the position within the chunk in
// the low word. kEmbeddingBadKey marks a bad token and the padding past the chunk's end.
inline constexpr unsigned long long kEmbeddingBadKey = ~0ull;

// Whether sorted slot i begins a run of equal tokens.
__device__ inline int embedding_starts_run(const unsigned long long* keys, int i) {
    return i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32);
}

// The scratch of one chunk in the sort's output: order[chunk] (the position within the chunk of
// each sorted slot), run_start[chunk + 1] (the first sorted slot of each run of a good token, then
// the number of good slots), runs (the number of runs of good tokens).
struct EmbeddingChunkOrder {
    int* order;
    int* run_start;
    int* runs;
};

__host__ __device__ inline EmbeddingChunkOrder embedding_chunk_order(void* scratch, int chunk, long long k) {
    int* base = static_cast<int*>(scratch) + k * (2LL * chunk + 2);
    return {base, base + chunk, base + 2 * chunk + 1};
}

// Sort: block k sorts chunk k's keys in shared memory and writes its order and runs to scratch.
// Dynamic shared memory: keys[chunk] (8 bytes each).
__global__ inline void embedding_sort_kernel(const int* tokens, long long N, int V, int first, int chunk,
                                             void* scratch) {
    PV_DYNAMIC_SHARED(unsigned long long, keys);
    __shared__ int warp_totals[32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    const long long start = (long long)blockIdx.x * chunk;
    const long long count = N - start < chunk ? N - start : chunk;
    const EmbeddingChunkOrder out = embedding_chunk_order(scratch, chunk, blockIdx.x);
    for (int i = tid; i < chunk; i += blockDim.x) {
        const int token = i < count ? tokens[start + i] - first : -1;  // the table's row
        keys[i] = (token >= 0 && token < V) ? ((unsigned long long)token << 32) | unsigned(i) : kEmbeddingBadKey;
    }
    __syncthreads();

    // Bitonic sort, ascending. Pair p of a stage compares slots i and i + j, where i has bit j
    // clear; the direction alternates with bit k of i.
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

    // Starts of the runs of equal tokens (the bad keys form the last run): count in this thread's
    // slots, exclusive scan over the block, then write the starts in order.
    const int per_thread = ceil_div(chunk, blockDim.x);
    const int seg_begin = min(tid * per_thread, chunk), seg_end = min(seg_begin + per_thread, chunk);
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
    for (int i = seg_begin; i < seg_end; ++i) {
        out.order[i] = int(keys[i] & 0xffffffffu);
        if (embedding_starts_run(keys, i)) out.run_start[slot++] = i;
    }
    // The bad keys sort last: if there are any, their run is not summed, and its start (already
    // written above) is the end of the good slots.
    __syncthreads();
    if (tid == 0) {
        const bool bad_run = keys[chunk - 1] == kEmbeddingBadKey;
        *out.runs = bad_run ? runs - 1 : runs;
        if (!bad_run) out.run_start[runs] = chunk;
    }
}

// Sum: for one chunk, block (s, g) of the grid takes channel slice s (32 lanes of W channels) and
// the runs g + G·(warp + warps·i): lane l of the warp sums dout over the run's positions in
// ascending order in acc_t<T> for its W channels and adds the sum to dwte once. One warp per run
// and one lane per channel: no two threads write the same element within the launch.
template <class T, int W>
__global__ void embedding_sum_kernel(const int* tokens, const T* dout, T* dwte, long long start, int C, int first,
                                     int chunk, long long k, const void* scratch) {
    using A = acc_t<T>;
    const EmbeddingChunkOrder in = embedding_chunk_order(const_cast<void*>(scratch), chunk, k);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const long long c = ((long long)blockIdx.x * 32 + lane) * W;
    if (c >= C) return;  // no barriers below
    const int runs = *in.runs;
    for (int r = blockIdx.y + gridDim.y * warp; r < runs; r += gridDim.y * warps) {
        const int begin = in.run_start[r], end = in.run_start[r + 1];
        A sum[W] = {};
        for (int i = begin; i < end; ++i) {  // positions in ascending order
            const Vec<T, W> d = load_vec<W>(dout + (start + in.order[i]) * C + c);
            for (int e = 0; e < W; ++e) sum[e] += to_acc(d.v[e]);
        }
        T* row = dwte + (long long)(tokens[start + in.order[begin]] - first) * C + c;
        Vec<T, W> w = load_vec<W>(row);
        for (int e = 0; e < W; ++e) w.v[e] = from_acc<T>(to_acc(w.v[e]) + sum[e]);
        store_vec<W>(row, w);
    }
}

// out[N][C] = wte[tokens[n] − first] for the tokens in [first, first + V), 0 for the other tokens
// of [0, whole_V), NaN for the rest.
template <class T>
void embedding_forward_rows(const int* tokens, const T* wte, T* out, long long N, int C, int V, int first,
                            int whole_V, cudaStream_t stream) {
    const bool vector = C % kVec<T> == 0 && vec_aligned({wte, out});
    launch_elementwise(EmbeddingForwardOp<T>{tokens, wte, out, C, V, first, whole_V}, N * C, vector, stream);
}

// out[N][C] = wte[tokens[n]]; rows whose token is outside [0, V) are NaN.
template <class T>
void embedding_forward(const int* tokens, const T* wte, T* out, long long N, int C, int V, cudaStream_t stream) {
    embedding_forward_rows(tokens, wte, out, N, C, V, 0, V, stream);
}

// The positions sorted together, for N positions: the smallest power of two holding them, up
// to kEmbeddingBackwardChunk.
inline int embedding_backward_chunk(long long N) {
    int chunk = 1;
    while (chunk < N && chunk < kEmbeddingBackwardChunk) chunk *= 2;
    return chunk;
}

// Bytes of the device scratch embedding_backward needs for N positions.
inline size_t embedding_backward_scratch_bytes(long long N) {
    const int chunk = embedding_backward_chunk(N);
    return size_t((N + chunk - 1) / chunk) * size_t(2 * chunk + 2) * sizeof(int);
}

// dwte[V][C] (the token rows [first, first + V)) += the sum of dout's rows per token among them
// (accumulates; other tokens skipped; deterministic). `scratch` holds
// embedding_backward_scratch_bytes(N) bytes.
template <class T>
void embedding_backward_rows(const int* tokens, const T* dout, T* dwte, long long N, int C, int V, int first,
                             void* scratch, cudaStream_t stream) {
    if (N * C == 0) return;
    const int chunk = embedding_backward_chunk(N);
    const long long chunks = (N + chunk - 1) / chunk;
    const size_t smem = size_t(chunk) * sizeof(unsigned long long);
    // 48 KiB less the static warp_totals is the most a launch may take without opting in.
    if (smem + 32 * sizeof(int) > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(embedding_sort_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch(embedding_sort_kernel, dim3(unsigned(chunks)), dim3(kEmbeddingBackwardThreads), smem, stream, tokens, N, V,
           first, chunk, scratch);
    CUDA_CHECK_LAUNCH();

    auto sum = [&](auto kernel, int width) {
        const int slices = ceil_div(C, 32LL * width);
        const int warps = kEmbeddingBackwardThreads / 32;
        for (long long k = 0; k < chunks; ++k) {  // stream order: chunk k's additions before k + 1's
            const long long count = N - k * chunk < chunk ? N - k * chunk : chunk;
            // Enough blocks to fill a large GPU; never more than one warp per position.
            const long long by_runs = ceil_div(count, warps);
            const long long by_fill = ceil_div(kEmbeddingBackwardTargetBlocks, slices);
            const int groups = int(by_runs < by_fill ? by_runs : by_fill);
            launch(kernel, dim3(slices, groups), dim3(kEmbeddingBackwardThreads), 0, stream, tokens, dout, dwte,
                   k * chunk, C, first, chunk, k, static_cast<const void*>(scratch));
            CUDA_CHECK_LAUNCH();
        }
    };
    if (C % kVec<T> == 0 && vec_aligned({dout, dwte}))
        sum(embedding_sum_kernel<T, kVec<T>>, kVec<T>);
    else
        sum(embedding_sum_kernel<T, 1>, 1);
}

// dwte[V][C] += the sum of dout's rows per token (accumulates; bad tokens skipped; deterministic).
// `scratch` holds embedding_backward_scratch_bytes(N) bytes.
template <class T>
void embedding_backward(const int* tokens, const T* dout, T* dwte, long long N, int C, int V, void* scratch,
                        cudaStream_t stream) {
    embedding_backward_rows(tokens, dout, dwte, N, C, V, 0, scratch, stream);
}

}  // namespace pv
