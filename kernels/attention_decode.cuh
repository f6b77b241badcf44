// Attention of new query rows against a KV cache: the decode step of generation (one row) and the
// prefill of a prompt (many rows), with grouped-query heads (GQA). Inference only: no backward.
//
// Layout. One sequence. The n new rows sit at positions p0 .. p0 + n − 1. Their queries, RoPE
// already applied at those positions, are rows of q with row stride q_stride: query head h of new
// row i starts at q[i·q_stride + h·hd] (the q part of the fused qkv projection, kernels/
// attention.cuh). The cache holds the keys and values of positions 0 .. p0 + n − 1, the new rows'
// own included (attention_decode_store_kv writes them before the attention runs): k_cache[p] and
// v_cache[p] are rows of Hkv·hd elements, RoPE applied to the keys. Query head h reads KV head
// h / (H / Hkv). The output is out[n][H·hd].
//
// Math, with s = 1/sqrt(hd), for new row i at position t = p0 + i and query head h:
//   x_j = s · q·k_j   for keys j ≤ t,        out = Σ_j softmax(x)_j · v_j
// which is row t of the causal attention over the whole sequence (kernels/attention.cuh), computed
// from the cache instead of from the sequence's qkv.
//
// Work split (flash-decoding). One decode row has only H query heads of work, far too little to
// fill a GPU if a block took a whole head, so the keys are cut into chunks: the keys of row i,
// 0..t, go to chunk c = j / chunk, and block (i, head group, c) computes, for each query head of
// its group, the partial softmax state of its keys [c·chunk, min((c + 1)·chunk, t + 1)):
//   m_c = max_j x_j,   l_c = Σ_j exp(x_j − m_c),   o_c = Σ_j exp(x_j − m_c) · v_j     (o_c unnormalised)
// and attention_decode_merge_kernel combines the chunks of each (row, head):
//   m = max_c m_c,   l = Σ_c l_c·exp(m_c − m),   out = Σ_c o_c·exp(m_c − m) / l.
// A chunk past a row's position (a prefill row ends before the last row does) is empty: m_c = −inf,
// l_c = 0, o_c = 0, weight exp(−inf) = 0; chunk 0 always holds key 0, so m is finite. With a single
// chunk the block normalises and writes `out` itself and no merge runs. attention_decode_split
// picks the chunk length so that about kDecodeTargetBlocks blocks run: a decode row gets many
// chunks, a long prefill (already n·Hkv blocks) one.
//
// Inside a block: one warp per query head. The query heads of one KV head (G = H / Hkv of them) are
// served by ceil(G / 8) blocks of up to 8 heads each, so the heads of a block share every K/V tile
// it loads (the point of GQA: K and V are read once per group, not once per head). The block keeps
// its heads' queries in shared memory and walks its key range in tiles of Bk keys (32; 16 for fp64
// at hd 128 and in the generic path, to fit 48 KiB): all threads load K and V [Bk][hd] into shared memory, then lane c of
// each warp computes the score of key c (a dot over hd from shared rows padded so the 32 lanes fall
// in different banks), the warp takes the tile's max (warp_max) and rescales its state (online
// softmax: running max m, a per-lane partial sum l, summed over the warp at the end), writes
// p_c = exp(x_c − m) to its row of a shared [heads][Bk] tile and, after a __syncwarp, accumulates its
// output dims d ≡ lane (mod 32) in registers: o_d ← o_d·α + Σ_c p_c·V[c][d] (hd/32 values per lane;
// hd 64 and 128 are specialised, any other hd ≤ 128 takes the generic path). A __syncthreads
// separates each tile's load from its use and each use from the next load.
//
// Every sum runs in one fixed order and nothing is accumulated across blocks (the merge reads the
// chunks in order), so the result is bitwise deterministic. The partial states are acc_t<T>.
// These are CUDA-core kernels, like kernels/attention.cuh: decode attention reads each cached
// K/V element once per head group and does two FLOPs per element and head, memory-bound.
#pragma once

#include "kernels/attention.cuh"
#include "kernels/common.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace pv {

inline constexpr int kDecodeMaxHeadsPerBlock = 8;  // query heads (warps) per block
inline constexpr int kDecodeTargetBlocks = 512;    // about four blocks per SM of an H100
inline constexpr int kDecodeMinChunk = 64;         // keys: below this a chunk's set-up outweighs its work

// Keys per tile: 32 (one per lane), or 16 when two 32-row tiles of T do not fit the default
// 48 KiB next to the queries (fp64 at hd 128, and the generic path sized for hd 128).
template <class T>
constexpr int decode_tile(int hd) {
    const size_t ld = size_t(hd + attention_pad<T>());
    const size_t fixed = kDecodeMaxHeadsPerBlock * ld * sizeof(T);  // the queries
    for (int bk : {32, 16})
        if (fixed + 2 * size_t(bk) * ld * sizeof(T) + size_t(kDecodeMaxHeadsPerBlock) * bk * sizeof(acc_t<T>) <=
            kAttentionSmemLimit)
            return bk;
    return 16;
}

template <class T, int HD>
struct DecodeConfig {
    static constexpr int kMaxHd = HD > 0 ? HD : kAttentionMaxGenericHeadDim;
    static constexpr int kDims = (kMaxHd + 31) / 32;  // output dims per lane
    static constexpr int kTile = decode_tile<T>(kMaxHd);
};

// Dynamic shared memory of a block with `heads` query heads: p tile [heads][Bk] (acc), then Q
// [heads][ld], K [Bk][ld], V [Bk][ld] (T).
template <class T, int HD>
constexpr size_t attention_decode_smem_bytes(int heads, int hd) {
    constexpr int bk = DecodeConfig<T, HD>::kTile;
    const size_t ld = size_t(hd + attention_pad<T>());
    return size_t(heads) * bk * sizeof(acc_t<T>) + (size_t(heads) + 2 * bk) * ld * sizeof(T);
}

// Block (i, KV head · blocks per group + b, chunk); 32 threads per query head of the block's group
// slice. `heads_per_block` is the group slice's size (the last slice may hold fewer heads).
template <class T, int HD>
__global__ void attention_decode_kernel(const T* q, long long q_stride, const T* k_cache, const T* v_cache, T* out,
                                        acc_t<T>* part_ml, acc_t<T>* part_o, int pos0, int H, int Hkv, int hd_rt,
                                        int heads_per_block, int chunk, int chunks) {
    using A = acc_t<T>;
    using Cfg = DecodeConfig<T, HD>;
    constexpr int Bk = Cfg::kTile, kKeysPerLane = (Bk + 31) / 32;
    const int hd = HD > 0 ? HD : hd_rt;
    const int ld = hd + attention_pad<T>();
    const int G = H / Hkv, blocks_per_group = gridDim.y / Hkv;
    const int i = blockIdx.x, kvh = blockIdx.y / blocks_per_group, c = blockIdx.z;
    const int g0 = (blockIdx.y % blocks_per_group) * heads_per_block;  // first head of the slice, within the group
    const int heads = min(heads_per_block, G - g0);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = kvh * G + g0 + warp;                                   // this warp's query head (when warp < heads)
    const int t = pos0 + i;                                              // the row's position: it sees keys 0..t
    const int k_begin = c * chunk, k_end = min(k_begin + chunk, t + 1);  // empty when k_begin > t
    const long long kv_stride = (long long)Hkv * hd;
    const A scale = A(1) / acc_sqrt(A(hd));

    PV_DYNAMIC_SHARED(A, P);
    T* Qs = reinterpret_cast<T*>(P + heads_per_block * Bk);
    T* Ks = Qs + heads_per_block * ld;
    T* Vs = Ks + Bk * ld;

    // The slice's queries are consecutive heads of the row: one [heads][hd] block of q.
    attention_load_tile(Qs, q + (long long)i * q_stride + (long long)(kvh * G + g0) * hd, hd, 0, heads_per_block, heads,
                        hd, ld);

    A m = acc_neg_infinity<A>();  // running max of the head's scores (identical in every lane)
    A l = 0;                      // running sum of exp(x − m) over this lane's keys
    A o[Cfg::kDims];
    for (int e = 0; e < Cfg::kDims; ++e) o[e] = 0;

    for (int k0 = k_begin; k0 < k_end; k0 += Bk) {
        attention_load_tile(Ks, k_cache + (long long)kvh * hd, kv_stride, k0, Bk, k_end, hd, ld);
        attention_load_tile(Vs, v_cache + (long long)kvh * hd, kv_stride, k0, Bk, k_end, hd, ld);
        __syncthreads();  // Q (first tile), K and V loaded

        if (warp < heads) {  // whole warps: the shuffles below see all 32 lanes
            A x[kKeysPerLane];
            A tile_max = acc_neg_infinity<A>();
            for (int e = 0; e < kKeysPerLane; ++e) {
                const int key = lane + 32 * e;
                x[e] = key < Bk && k0 + key < k_end ? scale * attention_dot(Qs + warp * ld, Ks + key * ld, hd)
                                                    : acc_neg_infinity<A>();
                tile_max = acc_max(tile_max, x[e]);
            }
            // Key k0 is in the range, so m_new is finite; on the first tile alpha = exp(−inf) = 0.
            const A m_new = acc_max(m, warp_max(tile_max));
            const A alpha = acc_exp(m - m_new);
            for (int e = 0; e < kKeysPerLane; ++e) {
                const int key = lane + 32 * e;
                const A p = key < Bk && k0 + key < k_end ? acc_exp(x[e] - m_new) : A(0);
                if (key < Bk) P[warp * Bk + key] = p;
                l = l * alpha + p;
            }
            m = m_new;
            __syncwarp();  // the head's probabilities, written by its 32 lanes, are visible to all

            // Keys outer, dims inner: the dims loop has a compile-time trip count and o[] stays in
            // registers.
            for (int e = 0; e < Cfg::kDims; ++e) o[e] *= alpha;
            const int keys = min(Bk, k_end - k0);
            for (int key = 0; key < keys; ++key) {
                const A p = P[warp * Bk + key];
                const T* v_row = Vs + key * ld + lane;
                for (int e = 0; e < Cfg::kDims; ++e)
                    if (HD > 0 || lane + 32 * e < hd) o[e] += p * to_acc(v_row[32 * e]);
            }
        }
        __syncthreads();  // everyone is done with K, V and P before the next tile overwrites them
    }

    if (warp >= heads) return;
    l = warp_sum(l);
    if (chunks == 1) {  // the whole range: normalise and write (l ≥ 1, the max contributes exp(0))
        const A inv = A(1) / l;
        T* o_row = out + (long long)i * H * hd + (long long)h * hd;
        for (int e = 0; e < Cfg::kDims; ++e) {
            const int d = lane + 32 * e;
            if (HD > 0 || d < hd) o_row[d] = from_acc<T>(o[e] * inv);
        }
        return;
    }
    const long long slot = ((long long)i * H + h) * chunks + c;  // (row, head, chunk)
    if (lane == 0) part_ml[2 * slot] = m, part_ml[2 * slot + 1] = l;
    for (int e = 0; e < Cfg::kDims; ++e) {
        const int d = lane + 32 * e;
        if (HD > 0 || d < hd) part_o[slot * hd + d] = o[e];
    }
}

// One warp per (row, head) pair r = i·H + h: out[r] = Σ_c o_c·exp(m_c − m) / Σ_c l_c·exp(m_c − m),
// chunks in order. Barrier-free (no warp collectives), so surplus warps may leave at once.
template <class T>
__global__ void attention_decode_merge_kernel(const acc_t<T>* part_ml, const acc_t<T>* part_o, T* out, long long pairs,
                                              int hd, int chunks) {
    using A = acc_t<T>;
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= pairs) return;
    const A* ml = part_ml + 2 * r * chunks;
    A m = acc_neg_infinity<A>();
    for (int c = 0; c < chunks; ++c) m = acc_max(m, ml[2 * c]);
    A l = 0;
    for (int c = 0; c < chunks; ++c) l += ml[2 * c + 1] * acc_exp(ml[2 * c] - m);  // an empty chunk adds 0·0
    const A inv = A(1) / l;
    for (int d = lane; d < hd; d += 32) {
        A acc = 0;
        for (int c = 0; c < chunks; ++c) acc += part_o[(r * chunks + c) * hd + d] * acc_exp(ml[2 * c] - m);
        out[r * hd + d] = from_acc<T>(acc * inv);
    }
}

// The new rows' keys and values into the cache: k_cache[pos0 + i] = k[i], v_cache[pos0 + i] = v[i]
// for i < n, rows of kv_width elements (k and v rows src_stride apart: the k and v parts of qkv).
template <class T>
__global__ void attention_decode_store_kv_kernel(const T* k, const T* v, long long src_stride, T* k_cache, T* v_cache,
                                                 long long n, int pos0, int kv_width) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * kv_width) return;
    const long long i = idx / kv_width, d = idx % kv_width;
    const long long dst = (pos0 + i) * kv_width + d;
    k_cache[dst] = k[i * src_stride + d];
    v_cache[dst] = v[i * src_stride + d];
}

// ---- launchers ---------------------------------------------------------------------------------

// How one call's keys are split: `chunks` chunks of `chunk` keys (the last row's keys 0..kv_len−1).
struct AttentionDecodeSplit {
    int chunk, chunks;
};

// Query-head slices per KV head and heads per slice (at most kDecodeMaxHeadsPerBlock, balanced).
inline int decode_blocks_per_group(int H, int Hkv) {
    return (H / Hkv + kDecodeMaxHeadsPerBlock - 1) / kDecodeMaxHeadsPerBlock;
}
inline int decode_heads_per_block(int H, int Hkv) {
    const int slices = decode_blocks_per_group(H, Hkv);
    return (H / Hkv + slices - 1) / slices;
}

// The split of a call with n new rows whose last row sees kv_len keys: `chunk` keys per chunk when
// given (> 0; tests use it to force many chunks), else enough chunks, each at least
// kDecodeMinChunk keys and a multiple of 32, for about kDecodeTargetBlocks blocks.
inline AttentionDecodeSplit attention_decode_split(int n, int kv_len, int H, int Hkv, int chunk = 0) {
    if (chunk <= 0) {
        const long long base = (long long)n * Hkv * decode_blocks_per_group(H, Hkv);
        const long long wanted = (kDecodeTargetBlocks + base - 1) / base;  // chunks
        const long long per = (kv_len + wanted - 1) / wanted;
        chunk = int(std::max<long long>(kDecodeMinChunk, (per + 31) / 32 * 32));
    }
    return {chunk, (kv_len + chunk - 1) / chunk};
}

// Scratch of one call: the chunks' partial states, none with a single chunk.
template <class T>
size_t attention_decode_scratch_bytes(int n, int kv_len, int H, int Hkv, int hd, int chunk = 0) {
    const AttentionDecodeSplit s = attention_decode_split(n, kv_len, H, Hkv, chunk);
    if (s.chunks == 1) return 0;
    return size_t(n) * size_t(H) * size_t(s.chunks) * size_t(hd + 2) * sizeof(acc_t<T>);
}

// Scratch enough for every call with the automatic split, n ≤ max_rows and kv_len ≤ max_kv: the
// automatic split never has more than `wanted` chunks, nor more than kv_len / kDecodeMinChunk.
template <class T>
size_t attention_decode_scratch_bound(int max_rows, int max_kv, int H, int Hkv, int hd) {
    size_t most = 0;
    const long long per_row = (long long)Hkv * decode_blocks_per_group(H, Hkv);
    const long long by_length = (max_kv + kDecodeMinChunk - 1) / kDecodeMinChunk;
    for (long long n = 1; n <= max_rows; ++n) {
        const long long wanted = (kDecodeTargetBlocks + n * per_row - 1) / (n * per_row);
        const long long chunks = std::min(wanted, by_length);
        if (chunks > 1) most = std::max(most, size_t(n * H * chunks) * size_t(hd + 2) * sizeof(acc_t<T>));
    }
    return most;
}

inline void attention_decode_check(int n, int pos0, int H, int Hkv, int hd, int chunk) {
    if (n < 1 || pos0 < 0 || H < 1 || Hkv < 1 || H % Hkv != 0 || hd < 1 || chunk < 0 ||
        (hd != 64 && hd != 128 && hd > kAttentionMaxGenericHeadDim) ||
        attention_decode_split(n, pos0 + n, H, Hkv, chunk).chunks > 65535) {  // gridDim.z
        std::fprintf(stderr, "polevault: attention_decode: unsupported shape n=%d pos0=%d H=%d Hkv=%d hd=%d chunk=%d\n",
                     n, pos0, H, Hkv, hd, chunk);
        std::abort();
    }
}

template <class T, int HD>
void attention_decode_launch(const T* q, long long q_stride, const T* k_cache, const T* v_cache, T* out, int n,
                             int pos0, int H, int Hkv, int hd, void* scratch, AttentionDecodeSplit s,
                             cudaStream_t stream) {
    using A = acc_t<T>;
    const int slices = decode_blocks_per_group(H, Hkv), heads = decode_heads_per_block(H, Hkv);
    A* part_ml = static_cast<A*>(scratch);
    A* part_o = part_ml == nullptr ? nullptr : part_ml + 2LL * n * H * s.chunks;
    launch(attention_decode_kernel<T, HD>, dim3(n, Hkv * slices, s.chunks), dim3(32 * heads),
           attention_decode_smem_bytes<T, HD>(heads, hd), stream, q, q_stride, k_cache, v_cache, out, part_ml, part_o,
           pos0, H, Hkv, hd, heads, s.chunk, s.chunks);
    CUDA_CHECK_LAUNCH();
    if (s.chunks > 1) {
        const long long pairs = (long long)n * H;
        const int warps = 4;
        launch(attention_decode_merge_kernel<T>, dim3(ceil_div(pairs, warps)), dim3(32 * warps), 0, stream, part_ml,
               part_o, out, pairs, hd, s.chunks);
        CUDA_CHECK_LAUNCH();
    }
}

// out[n][H·hd] for the n new rows at positions pos0.. (layout above). `scratch` holds
// scratch_bytes ≥ attention_decode_scratch_bytes<T>(n, pos0 + n, H, Hkv, hd, chunk) (checked);
// chunk 0 splits automatically.
template <class T>
void attention_decode(const T* q, long long q_stride, const T* k_cache, const T* v_cache, T* out, int n, int pos0,
                      int H, int Hkv, int hd, void* scratch, size_t scratch_bytes, cudaStream_t stream, int chunk = 0) {
    attention_decode_check(n, pos0, H, Hkv, hd, chunk);
    const size_t needed = attention_decode_scratch_bytes<T>(n, pos0 + n, H, Hkv, hd, chunk);
    if (scratch_bytes < needed) {
        std::fprintf(stderr, "polevault: attention_decode: %zu bytes of scratch given, %zu needed (n=%d kv=%d)\n",
                     scratch_bytes, needed, n, pos0 + n);
        std::abort();
    }
    const AttentionDecodeSplit s = attention_decode_split(n, pos0 + n, H, Hkv, chunk);
    if (hd == 64)
        attention_decode_launch<T, 64>(q, q_stride, k_cache, v_cache, out, n, pos0, H, Hkv, hd, scratch, s, stream);
    else if (hd == 128)
        attention_decode_launch<T, 128>(q, q_stride, k_cache, v_cache, out, n, pos0, H, Hkv, hd, scratch, s, stream);
    else
        attention_decode_launch<T, 0>(q, q_stride, k_cache, v_cache, out, n, pos0, H, Hkv, hd, scratch, s, stream);
}

// Stores n rows of keys k and values v (rows src_stride apart, kv_width wide) at cache rows pos0..
template <class T>
void attention_decode_store_kv(const T* k, const T* v, long long src_stride, T* k_cache, T* v_cache, int n, int pos0,
                               int kv_width, cudaStream_t stream) {
    const long long threads = (long long)n * kv_width;
    if (threads == 0) return;
    const int block = 256;
    launch(attention_decode_store_kv_kernel<T>, dim3(ceil_div(threads, block)), dim3(block), 0, stream, k, v,
           src_stride, k_cache, v_cache, (long long)n, pos0, kv_width);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
