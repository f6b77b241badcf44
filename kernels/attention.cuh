// Causal self-attention with grouped-query heads (GQA), flash-style: forward and backward, with
// optional document masking for packed sequences.
//
// Layout. The fused projection output qkv is row-major [B][T][(H + 2·Hkv)·hd]; each row holds H
// query heads, then Hkv key heads, then Hkv value heads, each hd wide (RoPE already applied to q
// and k). Query head h reads KV head h / (H / Hkv). The output is [B][T][H·hd]; the backward's
// dqkv has the layout of qkv and is overwritten, every element (q, k and v parts).
//
// Which keys a query sees. Query row i of sequence b attends to the keys j of the same sequence
// with lo_i ≤ j ≤ i. Without a positions array (null) lo_i = 0: plain causal attention. With
// positions[b][i], each row's position within its document (0 at a document's first token, as
// for RoPE), lo_i = i − positions[b][i], the first row of i's document: packed documents never
// attend across each other. Contract: 0 ≤ positions[b][i] ≤ i. Out of that range the value is
// caller error; it is clamped, never read past: lo_i = clamp(i − positions[b][i], 0, i) (a
// position past i sees back to the sequence start, a negative one only the row itself). So every
// row sees at least itself: its softmax is never empty and lse is finite. Rows need not agree
// (each row's window is its own) and tile skipping below is exact for any array.
//
// Forward, with s = 1/sqrt(hd) and the keys lo_i ≤ j ≤ i:
//   x_ij  = s · q_i·k_j
//   lse_i = log Σ_j exp(x_ij)                 saved as lse[b][h][i] in acc_t<T>, the only statistic
//   P_ij  = exp(x_ij − lse_i)                 (0 outside the window)
//   out_i = Σ_j P_ij v_j
// Backward (FlashAttention-2), with dO the incoming gradient, every sum over the same windows:
//   D_i   = dO_i·out_i                        (attention_backward_dot_kernel, into the scratch)
//   dP_ij = dO_i·v_j,   dS_ij = P_ij (dP_ij − D_i)      (Σ_j P_ij dP_ij = D_i: the softmax backward)
//   dQ_i  = s Σ_j dS_ij k_j
//   dK_j  = s Σ_i dS_ij q_i     and   dV_j = Σ_i P_ij dO_i,   summed over the query heads of KV head j.
//
// How the kernels work. No T×T matrix ever reaches device memory: a block owns a tile of rows
// and streams the other side through shared memory one tile at a time; P is recomputed from the
// saved lse in the backward. Every block has G = 4 threads per owned row (a row's four threads are
// adjacent lanes of one warp), so thread t owns row t / 4 and, within it, lane g = t % 4 owns
//   - the streamed columns c ≡ g (mod 4) of each score tile (their dot products over hd), and
//   - the head dimensions d ≡ g (mod 4) of the row's accumulators, in registers: hd/4 values per
//     accumulator with a compile-time head dim (64 and 128 are specialised), at most 128/4 = 32
//     in the generic path (any other hd ≤ 128, e.g. 8, 32, 48, 96, read at run time).
// A score tile goes from its column owners to its dimension owners through shared memory; since
// a row's four threads share a warp, a __syncwarp is the only barrier between the two phases, and
// a __syncthreads separates each tile load from its use and each use from the next load.
//
// Masking. Whole tiles outside every window of the block are skipped (never loaded); inside the
// tiles that remain, each score is masked by its own row's window (lo_i ≤ j ≤ i) and the
// accumulation loops run over the unmasked range only. Without positions the skipping and the
// masks reduce to the causal ones (lo = 0), with the same arithmetic in the same order.
//
// - attention_forward_kernel: grid (query tile, query head, batch), 4·Br threads. Q tile [Br][hd]
//   stays in shared memory; for each key tile from the one holding the block's smallest lo_i up
//   to the diagonal it loads K and V [Bc][hd], then each thread computes its Bc/4 scores, takes
//   the row max over the 4 lanes (two xor shuffles), rescales (online softmax: running max m,
//   running partial sum l per lane, summed over the lanes once at the end), writes its
//   probabilities into the shared tile S [Br][Bc], and updates its output dims with
//   Σ_c S[r][c]·V[c][d]. lse = m + log l. A row whose window starts past a tile has no score
//   there yet: its max stays −∞ and its rescale factor is 0 (its l and output are still 0), not
//   exp(−∞ + ∞).
// - attention_backward_dot_kernel: D = dO·O per (b, i, h) row, a row per 8 lanes with 16-byte
//   loads at hd 64 in bf16 (16 lanes at hd 128), a warp per row where vectors do not fit.
// - attention_backward_dkv_kernel: grid (key tile, KV head, batch), 4·Bc threads. K and V [Bc][hd]
//   stay in shared memory; the block loops over the query heads sharing the KV head and, for each,
//   over the query tiles from the diagonal up to the last row whose window reaches the key tile
//   (with positions, found once by a scan of the rows after the tile: with documents, the end of
//   the last document the tile touches), loading Q and dO [Br][hd] with their lse, D and lo. Each
//   thread computes P and dS for its Br/4 query rows, both go to shared tiles [Bc][Br], and each
//   thread accumulates dV[c][d] += Σ_r P·dO[r][d] and dK[c][d] += Σ_r dS·Q[r][d] for its dims.
//   The block alone owns these key rows, so the sum over query heads and tiles has a fixed order.
// - attention_backward_dq_kernel: grid (query tile, query head, batch), 4·Br threads. Q and dO
//   [Br][hd] stay; for each key tile from the one holding the block's smallest lo_i up to the
//   diagonal it loads K and V, computes dS for the thread's Bc/4 keys into a shared tile, and
//   accumulates dQ[r][d] += Σ_c dS·K[c][d].
// Every sum runs in one fixed order and nothing is accumulated across blocks (no atomics), so the
// results are bitwise deterministic.
//
// Shared memory. Tiles are kept in T (rows padded to hd + 2 for bf16, hd + 1 otherwise, so
// that the four lanes of a row and the eight rows of a warp fall in different banks); score
// tiles and the backward's per-row lse and D are in acc_t<T>, rows padded to the streamed tile
// + 4; last, one int per query row of a tile (the rows' lo). Each kernel takes the largest of
// the tile pairs (owned, streamed) = (32, 32), (32, 16), (16, 16), (16, 8), (8, 8) whose
// footprint fits the default 48 KiB (attention_pick_tile), so no instantiation needs the opt-in. Per instantiation (the generic path uses hd = 128's tiles;
// a smaller run-time hd uses less memory):
//
//   T     hd    forward Br×Bc, bytes   dK/dV Bc×Br, bytes    dQ Br×Bc, bytes
//   bf16  64    32×32  17,408          32×32  26,496         32×32  21,632
//   bf16  128   32×32  29,696          32×32  42,880         32×32  38,016
//   fp32  64    32×32  29,696          32×32  42,880         32×32  38,016
//   fp32  128   32×16  35,712          16×16  35,776         16×16  34,368
//   fp64  64    32×16  38,528          16×16  38,720         16×16  35,904
//   fp64  128   16×8   34,624           8×8   34,720          8×8   33,824
//
// The accumulation loops run over the streamed rows outside and the thread's dims inside, so the
// inner loop has a compile-time trip count, unrolls, and the accumulators stay in registers
// (ptxas -v: no local memory in any instantiation, at most 190 registers, fp64 generic dK/dV).
// D is computed from `out` as stored (rounded to T), as in FlashAttention-2.
//
// These are CUDA-core kernels (scalar FMAs from shared memory, no tensor cores): simple enough to
// be checked on the host, with the flash structure (tiling, online softmax, recomputation). They
// serve fp32 and fp64 (the oracles' precision) and the head dims the tensor cores do not take.
// For bf16 with 16-byte aligned buffers, attention_forward runs the tensor-core forward of
// kernels/attention_mma_forward.cuh (hd 64 and 128), and attention_backward runs the dot kernel
// above and then the tensor-core dK/dV and dQ kernels of kernels/attention_mma_backward.cuh (hd a
// multiple of 16 from 32 to 128): same contract, same outputs, same D scratch.
#pragma once

#include "kernels/attention_mma_backward.cuh"
#include "kernels/attention_mma_forward.cuh"
#include "kernels/attention_window.cuh"
#include "kernels/common.cuh"
#include "kernels/vec.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace pv {

inline constexpr int kAttentionGroup = 4;                // threads per owned row
inline constexpr int kAttentionMaxGenericHeadDim = 128;  // the generic path's bound on hd
inline constexpr size_t kAttentionSmemLimit = 48 * 1024;

// Elements of padding per shared row of T: one 4-byte bank.
template <class T>
__host__ __device__ constexpr int attention_pad() {
    return sizeof(T) < 4 ? int(4 / sizeof(T)) : 1;
}

// A block's tiles: rows it owns (4 threads each) and rows it streams per step.
struct AttentionTile {
    int own, other;
};
enum class AttentionKernel { forward, dkv, dq };

// Dynamic shared memory of a kernel with tile `t` and head dim `hd`; the layouts are in the kernels
// (the ints last: the query rows' lo, t.own of them in the forward and dQ, t.other in dK/dV).
template <class T>
constexpr size_t attention_smem_bytes(AttentionKernel k, AttentionTile t, int hd) {
    const size_t a = sizeof(acc_t<T>), e = sizeof(T), ld = size_t(hd + attention_pad<T>()), i = sizeof(int);
    const size_t score = size_t(t.own) * size_t(t.other + 4) * a;
    switch (k) {
        case AttentionKernel::forward: return score + size_t(t.own + 2 * t.other) * ld * e + size_t(t.own) * i;
        case AttentionKernel::dkv:
            return 2 * score + 2 * size_t(t.other) * a + size_t(2 * t.own + 2 * t.other) * ld * e + size_t(t.other) * i;
        case AttentionKernel::dq: return score + size_t(2 * t.own + 2 * t.other) * ld * e + size_t(t.own) * i;
    }
    return 0;
}

// The largest candidate tile that fits the default shared memory (the last one otherwise; the
// config's static_assert then fails).
template <class T>
constexpr AttentionTile attention_pick_tile(AttentionKernel k, int hd) {
    constexpr AttentionTile candidates[] = {{32, 32}, {32, 16}, {16, 16}, {16, 8}, {8, 8}};
    for (const AttentionTile& t : candidates)
        if (attention_smem_bytes<T>(k, t, hd) <= kAttentionSmemLimit) return t;
    return candidates[4];
}

// Compile-time configuration of one instantiation: HD is the head dim (64 or 128), or 0 for the
// generic path (run-time hd ≤ kAttentionMaxGenericHeadDim).
template <class T, int HD>
struct AttentionConfig {
    static constexpr int kMaxHd = HD > 0 ? HD : kAttentionMaxGenericHeadDim;
    static constexpr int kDims = (kMaxHd + kAttentionGroup - 1) / kAttentionGroup;  // accumulators per thread
    static constexpr AttentionTile kForward = attention_pick_tile<T>(AttentionKernel::forward, kMaxHd);
    static constexpr AttentionTile kDkv = attention_pick_tile<T>(AttentionKernel::dkv, kMaxHd);
    static constexpr AttentionTile kDq = attention_pick_tile<T>(AttentionKernel::dq, kMaxHd);
    static_assert(attention_smem_bytes<T>(AttentionKernel::forward, kForward, kMaxHd) <= kAttentionSmemLimit);
    static_assert(attention_smem_bytes<T>(AttentionKernel::dkv, kDkv, kMaxHd) <= kAttentionSmemLimit);
    static_assert(attention_smem_bytes<T>(AttentionKernel::dq, kDq, kMaxHd) <= kAttentionSmemLimit);
};

// Copies rows [row0, row0 + rows) of a global matrix (row stride `stride`, hd wide) into shared
// dst[rows][ld], with zeros for rows at or past `limit` (so padded rows never feed NaN into sums).
// Every thread of the block takes part; the caller puts a barrier between this and any use.
template <class T>
__device__ inline void attention_load_tile(T* dst, const T* src, long long stride, int row0, int rows, int limit,
                                           int hd, int ld) {
    for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x) {
        const int r = idx / hd, d = idx % hd;
        dst[r * ld + d] = row0 + r < limit ? src[(long long)(row0 + r) * stride + d] : from_acc<T>(acc_t<T>(0));
    }
}

// a·b over hd elements of two shared rows, in index order.
template <class T>
__device__ inline acc_t<T> attention_dot(const T* a, const T* b, int hd) {
    acc_t<T> s = 0;
    for (int d = 0; d < hd; ++d) s += to_acc(a[d]) * to_acc(b[d]);
    return s;
}

// The max and the sum over a row's four lanes (adjacent lanes of one warp); every lane gets the
// same bits (the butterfly adds the same pairs in each lane, and + is commutative).
template <class A>
__device__ inline A attention_group_max(A v) {
    v = acc_max(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return acc_max(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
template <class A>
__device__ inline A attention_group_sum(A v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The smallest lo over the block's rows, one value per row (a row's 4 lanes hold the same):
// written to lo_s[rows] (kept there), then read by every thread.
__device__ inline int attention_rows_min(int lo, int* lo_s, int rows) {
    if (threadIdx.x % kAttentionGroup == 0) lo_s[threadIdx.x / kAttentionGroup] = lo;
    __syncthreads();
    int smallest = lo_s[0];
    for (int r = 1; r < rows; ++r) smallest = min(smallest, lo_s[r]);
    return smallest;
}

// ---- forward -----------------------------------------------------------------------------------

// Block (query tile, h, b), 4·Br threads; thread owns query row r = t/4, keys c ≡ g and dims d ≡ g
// (mod 4), g = t%4. Shared: S[Br][Bc+4] (acc), then Q[Br][ld], K[Bc][ld], V[Bc][ld] (T), lo[Br] (int).
template <class T, int HD>
__global__ void attention_forward_kernel(const T* qkv, const int* positions, T* out, acc_t<T>* lse, int T_len, int H,
                                         int Hkv, int hd_rt) {
    using A = acc_t<T>;
    using Cfg = AttentionConfig<T, HD>;
    constexpr int G = kAttentionGroup, Br = Cfg::kForward.own, Bc = Cfg::kForward.other, ldS = Bc + 4;
    const int hd = HD > 0 ? HD : hd_rt;
    const int ld = hd + attention_pad<T>();
    const int q0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (H / Hkv);
    const long long stride = (long long)(H + 2 * Hkv) * hd;
    const T* rows = qkv + (long long)b * T_len * stride;
    const T* q = rows + (long long)h * hd;
    const T* k = rows + (long long)(H + kvh) * hd;
    const T* v = rows + (long long)(H + Hkv + kvh) * hd;
    const A scale = A(1) / acc_sqrt(A(hd));

    PV_DYNAMIC_SHARED(A, S);
    T* Qs = reinterpret_cast<T*>(S + Br * ldS);
    T* Ks = Qs + Br * ld;
    T* Vs = Ks + Bc * ld;
    int* lo_s = reinterpret_cast<int*>(Vs + Bc * ld);
    const int* pos = positions ? positions + (long long)b * T_len : nullptr;

    const int r = threadIdx.x / G, g = threadIdx.x % G;
    const int i = q0 + r;
    // A padding row (i ≥ T_len, zero q) attends like row T_len-1: finite values, never stored.
    const int i_eff = min(i, T_len - 1);
    const int lo = attention_first_key(pos, i_eff);  // the row's keys are lo..i_eff
    attention_load_tile(Qs, q, stride, q0, Br, T_len, hd, ld);

    A m = acc_neg_infinity<A>();  // running max of the row's scores (identical in its 4 lanes)
    A l = 0;                      // running sum of exp(x - m) over this lane's keys
    A o[Cfg::kDims];
    for (int e = 0; e < Cfg::kDims; ++e) o[e] = 0;

    // Key tiles from the one holding the block's smallest lo up to the tile's last row.
    const int first = pos ? attention_rows_min(lo, lo_s, Br) / Bc : 0;
    const int tiles = (min(q0 + Br, T_len) - 1) / Bc + 1;
    for (int t = first; t < tiles; ++t) {
        const int k0 = t * Bc;
        attention_load_tile(Ks, k, stride, k0, Bc, T_len, hd, ld);
        attention_load_tile(Vs, v, stride, k0, Bc, T_len, hd, ld);
        __syncthreads();  // Q (first tile), K and V loaded

        A x[Bc / G];
        A tile_max = acc_neg_infinity<A>();
        for (int e = 0; e < Bc / G; ++e) {
            const int c = g + G * e, j = k0 + c;
            x[e] = lo <= j && j <= i_eff ? scale * attention_dot(Qs + r * ld, Ks + c * ld, hd) : acc_neg_infinity<A>();
            tile_max = acc_max(tile_max, x[e]);
        }
        // Until the tile holding lo the row has no score: m_new = −∞, and alpha is 0 (l and o are
        // still 0) rather than exp(−∞ + ∞). From then on m_new is finite; alpha = 0 on that tile.
        const A m_new = acc_max(m, attention_group_max(tile_max));
        const A alpha = m_new == acc_neg_infinity<A>() ? A(0) : acc_exp(m - m_new);
        A sum = 0;
        for (int e = 0; e < Bc / G; ++e) {
            const int c = g + G * e, j = k0 + c;
            const A p = lo <= j && j <= i_eff ? acc_exp(x[e] - m_new) : A(0);
            S[r * ldS + c] = p;
            sum += p;
        }
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();  // the row's probabilities, written by its 4 lanes, are visible to all 4

        // Keys outer, dims inner: the dims loop has a compile-time trip count, so it unrolls and
        // o[] stays in registers. Masked keys (p = 0) are skipped.
        for (int e = 0; e < Cfg::kDims; ++e) o[e] *= alpha;
        const int c_begin = max(0, lo - k0), c_end = min(Bc, i_eff - k0 + 1);
        for (int c = c_begin; c < c_end; ++c) {
            const A p = S[r * ldS + c];
            const T* v_row = Vs + c * ld + g;
            for (int e = 0; e < Cfg::kDims; ++e)
                if (HD > 0 || g + G * e < hd) o[e] += p * to_acc(v_row[G * e]);
        }
        __syncthreads();  // everyone is done with K, V and S before the next tile overwrites them
    }

    l = attention_group_sum(l);  // ≥ 1: the row max contributes exp(0) (every row sees itself)
    if (i < T_len) {
        const A inv = A(1) / l;
        T* o_row = out + ((long long)b * T_len + i) * H * hd + (long long)h * hd;
        for (int e = 0; e < Cfg::kDims; ++e) {
            const int d = g + G * e;
            if (HD > 0 || d < hd) o_row[d] = from_acc<T>(o[e] * inv);
        }
        if (g == 0) lse[((long long)b * H + h) * T_len + i] = m + acc_log(l);
    }
}

// ---- backward ----------------------------------------------------------------------------------

// D[b][h][i] = dO·O over one head's row, rows in out's order. A row is L consecutive lanes of a
// warp (L a power of two, 32 / L rows per warp), each lane reading W consecutive elements of out
// and of dout per step: W = kVec<T> (16-byte loads) when hd is a multiple of it and the buffers
// are 16-byte aligned, so that hd 64 in bf16 is 8 lanes with one 16-byte load of each; W = 1 and
// L = 32 otherwise (one warp per row). The lanes' partial sums meet by shuffles within the row.
template <class T, int W>
__global__ void attention_backward_dot_kernel(const T* out, const T* dout, acc_t<T>* D, int B, int T_len, int H, int hd,
                                              int L) {
    using A = acc_t<T>;
    const long long rows = (long long)B * T_len * H;
    const int lane = threadIdx.x % 32, in_row = lane % L;
    const long long n = ((long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * (32 / L) + lane / L;
    A s = 0;
    if (n < rows)
        for (int d = W * in_row; d < hd; d += W * L) {
            const Vec<T, W> o = load_vec<W>(out + n * hd + d), g = load_vec<W>(dout + n * hd + d);
            for (int k = 0; k < W; ++k) s += to_acc(o.v[k]) * to_acc(g.v[k]);
        }
    for (int offset = L / 2; offset > 0; offset /= 2)  // every lane of the warp takes part, valid row or not
        s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (n < rows && in_row == 0) {
        const long long h = n % H, bi = n / H, i = bi % T_len, b = bi / T_len;
        D[(b * H + h) * T_len + i] = s;
    }
}

// Block (key tile, KV head, batch), 4·Bc threads; thread owns key row c = t/4, query rows r ≡ g and
// dims d ≡ g (mod 4). Shared: P[Bc][Br+4], dS[Bc][Br+4], lse[Br], D[Br] (acc), then K[Bc][ld],
// V[Bc][ld], Q[Br][ld], dO[Br][ld] (T), lo[Br] (int). Writes the k and v parts of dqkv for its key
// rows.
template <class T, int HD>
__global__ void attention_backward_dkv_kernel(const T* qkv, const int* positions, const T* dout, const acc_t<T>* lse,
                                              const acc_t<T>* D, T* dqkv, int T_len, int H, int Hkv, int hd_rt) {
    using A = acc_t<T>;
    using Cfg = AttentionConfig<T, HD>;
    constexpr int G = kAttentionGroup, Bc = Cfg::kDkv.own, Br = Cfg::kDkv.other, ldS = Br + 4;
    const int hd = HD > 0 ? HD : hd_rt;
    const int ld = hd + attention_pad<T>();
    const int k0 = blockIdx.x * Bc, kvh = blockIdx.y, b = blockIdx.z;
    const int group = H / Hkv;
    const long long stride = (long long)(H + 2 * Hkv) * hd, dstride = (long long)H * hd;
    const T* rows = qkv + (long long)b * T_len * stride;
    const T* drows = dout + (long long)b * T_len * dstride;
    const A scale = A(1) / acc_sqrt(A(hd));

    PV_DYNAMIC_SHARED(A, P);
    A* dS = P + Bc * ldS;
    A* lse_s = dS + Bc * ldS;
    A* D_s = lse_s + Br;
    T* Ks = reinterpret_cast<T*>(D_s + Br);
    T* Vs = Ks + Bc * ld;
    T* Qs = Vs + Bc * ld;
    T* dOs = Qs + Br * ld;
    int* lo_s = reinterpret_cast<int*>(dOs + Br * ld);
    static_assert(Bc / 8 <= Br, "lo_s doubles as the per-warp scratch of attention_last_query");
    const int* pos = positions ? positions + (long long)b * T_len : nullptr;

    const int c = threadIdx.x / G, g = threadIdx.x % G;
    const int j = k0 + c;
    attention_load_tile(Ks, rows + (long long)(H + kvh) * hd, stride, k0, Bc, T_len, hd, ld);
    attention_load_tile(Vs, rows + (long long)(H + Hkv + kvh) * hd, stride, k0, Bc, T_len, hd, ld);

    A dk[Cfg::kDims], dv[Cfg::kDims];
    for (int e = 0; e < Cfg::kDims; ++e) dk[e] = dv[e] = 0;

    // Query rows k0 ≤ i < q_end can see a key of the tile; the rows past q_end contribute nothing.
    const int q_end = pos ? attention_last_query(pos, min(k0 + Bc, T_len) - 1, T_len, lo_s) + 1 : T_len;
    const int q_tiles = (q_end - 1) / Br + 1;
    for (int hh = 0; hh < group; ++hh) {  // the query heads of this KV head, in order
        const int h = kvh * group + hh;
        const A* lse_h = lse + ((long long)b * H + h) * T_len;
        const A* D_h = D + ((long long)b * H + h) * T_len;
        for (int qt = k0 / Br; qt < q_tiles; ++qt) {  // query tiles from the diagonal on
            const int q0 = qt * Br;
            attention_load_tile(Qs, rows + (long long)h * hd, stride, q0, Br, T_len, hd, ld);
            attention_load_tile(dOs, drows + (long long)h * hd, dstride, q0, Br, T_len, hd, ld);
            for (int r = threadIdx.x; r < Br; r += blockDim.x) {
                lse_s[r] = q0 + r < T_len ? lse_h[q0 + r] : A(0);
                D_s[r] = q0 + r < T_len ? D_h[q0 + r] : A(0);
                lo_s[r] = q0 + r < T_len ? attention_first_key(pos, q0 + r) : 0;
            }
            __syncthreads();  // K, V (first step), Q, dO, lse, D and lo loaded

            for (int e = 0; e < Br / G; ++e) {
                const int r = g + G * e, i = q0 + r;
                A p = 0, ds = 0;
                if (i < T_len && lo_s[r] <= j && j <= i) {
                    p = acc_exp(scale * attention_dot(Qs + r * ld, Ks + c * ld, hd) - lse_s[r]);
                    ds = p * (attention_dot(dOs + r * ld, Vs + c * ld, hd) - D_s[r]);
                }
                P[c * ldS + r] = p;
                dS[c * ldS + r] = ds;
            }
            __syncwarp();  // the key row's P and dS, written by its 4 lanes, are visible to all 4

            // Query rows outer, dims inner (unrolled: dk[] and dv[] stay in registers); only rows
            // with j ≤ i < q_end contribute (rows in that range outside their window add P = dS = 0).
            const int r_begin = max(0, j - q0), r_end = min(Br, q_end - q0);
            for (int r = r_begin; r < r_end; ++r) {
                const A p = P[c * ldS + r], ds = dS[c * ldS + r];
                const T* do_row = dOs + r * ld + g;
                const T* q_row = Qs + r * ld + g;
                for (int e = 0; e < Cfg::kDims; ++e)
                    if (HD > 0 || g + G * e < hd) {
                        dv[e] += p * to_acc(do_row[G * e]);
                        dk[e] += ds * to_acc(q_row[G * e]);
                    }
            }
            __syncthreads();  // everyone is done with Q, dO, P and dS before the next load
        }
    }

    if (j < T_len) {
        T* dk_row = dqkv + ((long long)b * T_len + j) * stride + (long long)(H + kvh) * hd;
        T* dv_row = dqkv + ((long long)b * T_len + j) * stride + (long long)(H + Hkv + kvh) * hd;
        for (int e = 0; e < Cfg::kDims; ++e) {
            const int d = g + G * e;
            if (HD > 0 || d < hd) {
                dk_row[d] = from_acc<T>(scale * dk[e]);
                dv_row[d] = from_acc<T>(dv[e]);
            }
        }
    }
}

// Block (query tile, h, b), 4·Br threads; thread owns query row r = t/4, keys c ≡ g and dims d ≡ g
// (mod 4). Shared: dS[Br][Bc+4] (acc), then Q[Br][ld], dO[Br][ld], K[Bc][ld], V[Bc][ld] (T),
// lo[Br] (int). Writes the q part of dqkv for its rows.
template <class T, int HD>
__global__ void attention_backward_dq_kernel(const T* qkv, const int* positions, const T* dout, const acc_t<T>* lse,
                                             const acc_t<T>* D, T* dqkv, int T_len, int H, int Hkv, int hd_rt) {
    using A = acc_t<T>;
    using Cfg = AttentionConfig<T, HD>;
    constexpr int G = kAttentionGroup, Br = Cfg::kDq.own, Bc = Cfg::kDq.other, ldS = Bc + 4;
    const int hd = HD > 0 ? HD : hd_rt;
    const int ld = hd + attention_pad<T>();
    const int q0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (H / Hkv);
    const long long stride = (long long)(H + 2 * Hkv) * hd, dstride = (long long)H * hd;
    const T* rows = qkv + (long long)b * T_len * stride;
    const A scale = A(1) / acc_sqrt(A(hd));

    PV_DYNAMIC_SHARED(A, dS);
    T* Qs = reinterpret_cast<T*>(dS + Br * ldS);
    T* dOs = Qs + Br * ld;
    T* Ks = dOs + Br * ld;
    T* Vs = Ks + Bc * ld;
    int* lo_s = reinterpret_cast<int*>(Vs + Bc * ld);
    const int* pos = positions ? positions + (long long)b * T_len : nullptr;

    const int r = threadIdx.x / G, g = threadIdx.x % G;
    const int i = q0 + r;
    const bool valid = i < T_len;
    const int lo = attention_first_key(pos, min(i, T_len - 1));  // the row's keys are lo..i
    const A lse_i = valid ? lse[((long long)b * H + h) * T_len + i] : A(0);
    const A D_i = valid ? D[((long long)b * H + h) * T_len + i] : A(0);
    attention_load_tile(Qs, rows + (long long)h * hd, stride, q0, Br, T_len, hd, ld);
    attention_load_tile(dOs, dout + (long long)b * T_len * dstride + (long long)h * hd, dstride, q0, Br, T_len, hd, ld);

    A dq[Cfg::kDims];
    for (int e = 0; e < Cfg::kDims; ++e) dq[e] = 0;

    // Key tiles from the one holding the block's smallest lo up to the tile's last row.
    const int first = pos ? attention_rows_min(lo, lo_s, Br) / Bc : 0;
    const int tiles = (min(q0 + Br, T_len) - 1) / Bc + 1;
    for (int t = first; t < tiles; ++t) {
        const int k0 = t * Bc;
        attention_load_tile(Ks, rows + (long long)(H + kvh) * hd, stride, k0, Bc, T_len, hd, ld);
        attention_load_tile(Vs, rows + (long long)(H + Hkv + kvh) * hd, stride, k0, Bc, T_len, hd, ld);
        __syncthreads();  // Q, dO (first tile), K and V loaded

        for (int e = 0; e < Bc / G; ++e) {
            const int c = g + G * e;
            A ds = 0;
            if (valid && lo <= k0 + c && k0 + c <= i) {
                const A p = acc_exp(scale * attention_dot(Qs + r * ld, Ks + c * ld, hd) - lse_i);
                ds = p * (attention_dot(dOs + r * ld, Vs + c * ld, hd) - D_i);
            }
            dS[r * ldS + c] = ds;
        }
        __syncwarp();  // the row's dS, written by its 4 lanes, is visible to all 4

        // Keys outer, dims inner (unrolled: dq[] stays in registers); masked keys are skipped.
        const int c_begin = max(0, lo - k0), c_end = valid ? min(Bc, i - k0 + 1) : 0;
        for (int c = c_begin; c < c_end; ++c) {
            const A ds = dS[r * ldS + c];
            const T* k_row = Ks + c * ld + g;
            for (int e = 0; e < Cfg::kDims; ++e)
                if (HD > 0 || g + G * e < hd) dq[e] += ds * to_acc(k_row[G * e]);
        }
        __syncthreads();  // everyone is done with K, V and dS before the next tile overwrites them
    }

    if (valid) {
        T* dq_row = dqkv + ((long long)b * T_len + i) * stride + (long long)h * hd;
        for (int e = 0; e < Cfg::kDims; ++e) {
            const int d = g + G * e;
            if (HD > 0 || d < hd) dq_row[d] = from_acc<T>(scale * dq[e]);
        }
    }
}

// ---- launchers ---------------------------------------------------------------------------------

inline void attention_check_shape(int B, int T_len, int H, int Hkv, int hd) {
    if (B < 1 || T_len < 1 || H < 1 || Hkv < 1 || H % Hkv != 0 || hd < 1 ||
        (hd != 64 && hd != 128 && hd > kAttentionMaxGenericHeadDim)) {
        std::fprintf(stderr, "polevault: attention: unsupported shape B=%d T=%d H=%d Hkv=%d hd=%d\n", B, T_len, H, Hkv,
                     hd);
        std::abort();
    }
}

template <class T, int HD>
void attention_forward_launch(const T* qkv, const int* positions, T* out, acc_t<T>* lse, int B, int T_len, int H,
                              int Hkv, int hd, cudaStream_t stream) {
    constexpr AttentionTile tile = AttentionConfig<T, HD>::kForward;
    launch(attention_forward_kernel<T, HD>, dim3(ceil_div(T_len, tile.own), H, B), dim3(kAttentionGroup * tile.own),
           attention_smem_bytes<T>(AttentionKernel::forward, tile, hd), stream, qkv, positions, out, lse, T_len, H, Hkv,
           hd);
    CUDA_CHECK_LAUNCH();
}

// The forward's scratch: for bf16 on tensor cores, a small grid's split partials
// (kernels/attention_mma_blocks.h: none at a head dim without a split kernel); none otherwise.
template <class T>
size_t attention_forward_scratch_bytes(int B, int T_len, int H, int hd) {
    return std::is_same_v<T, __nv_bfloat16> ? attention_mma_forward_partial_bytes(B, T_len, H, hd) : 0;
}

// out[B][T][H·hd] and lse[B][H][T] from qkv[B][T][(H + 2·Hkv)·hd]. positions: [B][T] device ints,
// each row's position within its document (document masking, header comment), or null for plain
// causal attention. `scratch` holds attention_forward_scratch_bytes<T>(B, T_len, H, hd) (null where
// that is 0). p_fp32: bf16 keeps P in fp32 (the CUDA-core kernel), where the tensor cores round it
// to one bf16 before P·V (kernels/attention_mma_forward.cuh): for the KV-cache decoder's parity
// tests, whose decoder keeps P in fp32.
template <class T>
void attention_forward(const T* qkv, const int* positions, T* out, acc_t<T>* lse, void* scratch, int B, int T_len,
                       int H, int Hkv, int hd, cudaStream_t stream, bool p_fp32 = false) {
    attention_check_shape(B, T_len, H, Hkv, hd);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        if (!p_fp32 && attention_mma_forward_supported(qkv, out, hd))  // tensor cores (attention_mma_forward.cuh)
            return attention_mma_forward(qkv, positions, out, lse, B, T_len, H, Hkv, hd, stream,
                                         static_cast<float*>(scratch));
    }
    if (hd == 64)
        attention_forward_launch<T, 64>(qkv, positions, out, lse, B, T_len, H, Hkv, hd, stream);
    else if (hd == 128)
        attention_forward_launch<T, 128>(qkv, positions, out, lse, B, T_len, H, Hkv, hd, stream);
    else
        attention_forward_launch<T, 0>(qkv, positions, out, lse, B, T_len, H, Hkv, hd, stream);
}

// The backward's scratch: D[B][H][T] in acc_t<T>, and for bf16 on the tensor-core backward the
// split kernels' partials after it (16-byte aligned; kernels/attention_mma_blocks.h).
template <class T>
size_t attention_backward_d_bytes(int B, int T_len, int H) {
    return (size_t(B) * size_t(T_len) * size_t(H) * sizeof(acc_t<T>) + 15) / 16 * 16;
}
// The split kernels' partials in the scratch (after D).
template <class T>
float* attention_backward_partials(void* scratch, int B, int T_len, int H) {
    return reinterpret_cast<float*>(static_cast<char*>(scratch) + attention_backward_d_bytes<T>(B, T_len, H));
}
template <class T>
size_t attention_backward_scratch_bytes(int B, int T_len, int H, int Hkv, int hd) {
    const bool partials = std::is_same_v<T, __nv_bfloat16> && attention_mma_backward_supports(hd);
    return attention_backward_d_bytes<T>(B, T_len, H) +
           (partials ? attention_mma_partial_bytes(B, T_len, H, Hkv, hd) : 0);
}
// One scratch for both passes (the model's workspace: its forward and backward kernels run in
// order on one stream, so neither pass's partials outlive its own kernels).
template <class T>
size_t attention_scratch_bytes(int B, int T_len, int H, int Hkv, int hd) {
    return std::max(attention_forward_scratch_bytes<T>(B, T_len, H, hd),
                    attention_backward_scratch_bytes<T>(B, T_len, H, Hkv, hd));
}

template <class T>
void attention_backward_dot(const T* out, const T* dout, acc_t<T>* D, int B, int T_len, int H, int hd,
                            cudaStream_t stream) {
    constexpr int block = 128, W = kVec<T>;
    const bool vector = hd % W == 0 && vec_aligned({out, dout});
    int L = 32;  // lanes per row: a warp for one-element loads, else the fewest (a power of two) that cover its vectors
    if (vector)
        for (L = 1; L < 32 && L * W < hd;) L *= 2;
    const long long rows = (long long)B * T_len * H, rows_per_block = (block / 32) * (32 / L);
    launch(vector ? attention_backward_dot_kernel<T, W> : attention_backward_dot_kernel<T, 1>,
           dim3(ceil_div(rows, rows_per_block)), dim3(block), 0, stream, out, dout, D, B, T_len, H, hd, L);
    CUDA_CHECK_LAUNCH();
}

template <class T, int HD>
void attention_backward_launch(const T* qkv, const int* positions, const T* dout, const acc_t<T>* lse,
                               const acc_t<T>* D, T* dqkv, int B, int T_len, int H, int Hkv, int hd,
                               cudaStream_t stream) {
    using Cfg = AttentionConfig<T, HD>;
    launch(attention_backward_dkv_kernel<T, HD>, dim3(ceil_div(T_len, Cfg::kDkv.own), Hkv, B),
           dim3(kAttentionGroup * Cfg::kDkv.own), attention_smem_bytes<T>(AttentionKernel::dkv, Cfg::kDkv, hd), stream,
           qkv, positions, dout, lse, D, dqkv, T_len, H, Hkv, hd);
    CUDA_CHECK_LAUNCH();
    launch(attention_backward_dq_kernel<T, HD>, dim3(ceil_div(T_len, Cfg::kDq.own), H, B),
           dim3(kAttentionGroup * Cfg::kDq.own), attention_smem_bytes<T>(AttentionKernel::dq, Cfg::kDq, hd), stream,
           qkv, positions, dout, lse, D, dqkv, T_len, H, Hkv, hd);
    CUDA_CHECK_LAUNCH();
}

// The CUDA-core dK/dV and dQ kernels, any type and head dim, with D already in `D` (what
// attention_backward runs for fp32, fp64 and the bf16 cases the tensor cores do not take).
template <class T>
void attention_backward_cuda_cores(const T* qkv, const int* positions, const T* dout, const acc_t<T>* lse,
                                   const acc_t<T>* D, T* dqkv, int B, int T_len, int H, int Hkv, int hd,
                                   cudaStream_t stream) {
    if (hd == 64)
        attention_backward_launch<T, 64>(qkv, positions, dout, lse, D, dqkv, B, T_len, H, Hkv, hd, stream);
    else if (hd == 128)
        attention_backward_launch<T, 128>(qkv, positions, dout, lse, D, dqkv, B, T_len, H, Hkv, hd, stream);
    else
        attention_backward_launch<T, 0>(qkv, positions, dout, lse, D, dqkv, B, T_len, H, Hkv, hd, stream);
}

// dqkv (layout of qkv, every element overwritten) from the forward's qkv, positions (the same as
// the forward's, or null), out and lse and the gradient dout[B][T][H·hd]. `scratch` holds
// attention_backward_scratch_bytes<T>(B, T_len, H, Hkv, hd).
template <class T>
void attention_backward(const T* qkv, const int* positions, const T* out, const T* dout, const acc_t<T>* lse, T* dqkv,
                        void* scratch, int B, int T_len, int H, int Hkv, int hd, cudaStream_t stream) {
    attention_check_shape(B, T_len, H, Hkv, hd);
    acc_t<T>* D = static_cast<acc_t<T>*>(scratch);
    attention_backward_dot(out, dout, D, B, T_len, H, hd, stream);
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        if (attention_mma_backward_applies(qkv, dout, dqkv, hd))
            return attention_mma_backward(qkv, positions, dout, lse, D, dqkv, B, T_len, H, Hkv, hd, stream,
                                          attention_backward_partials<T>(scratch, B, T_len, H));
    attention_backward_cuda_cores(qkv, positions, dout, lse, D, dqkv, B, T_len, H, Hkv, hd, stream);
}

}  // namespace pv
