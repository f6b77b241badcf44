// The attention forward on tensor cores, bf16 (FlashAttention-2's structure): the same math,
// masks, layouts and outputs as attention_forward_kernel in kernels/attention.cuh, which
// dispatches here for bf16 with head dim 64 or 128 (other head dims, fp32 and fp64 keep the
// CUDA-core kernels: the oracles' precision).
//
// Math, with s = 1/sqrt(hd), c = s·log2(e) and each row's keys lo_i ≤ j ≤ i
// (kernels/attention_window.cuh):
//   x_ij = q_i·k_j                                  (the scores, unscaled)
//   m_i  = max_j x_ij,  l_i = Σ_j 2^(c·x_ij − c·m_i), both carried online over key tiles
//   out_i = Σ_j 2^(c·x_ij − c·m_i) v_j / l_i,       lse_i = ln 2 · (c·m_i + log2 l_i)   (float, [B][H][T])
// Each exponential is one FFMA (c·x − c·m, c·m once per row and tile) and one MUFU.EX2 with
// flush-to-zero (platform.h exp2_ftz): exponents are at most 0, so no subnormal range handling.
//
// Tiling. A block owns Br = 64 query rows of one (batch, head), its warps WR rows each: 4 warps of
// 16 (warp w rows q0 + 16w .. q0 + 16w + 15), or (template argument RT = 2) 2 warps of 32, two
// 16-row tiles: each K and V fragment a warp loads then feeds two mma, 645 instructions a trip for
// 128 HMMA where 4 warps of 16 rows issue 355 for 64 (9% fewer per HMMA, sm_90), at 255 registers.
// The launcher takes RT = 2 at hd 64 where an SM holds four such blocks, 8 warps (the H100), and
// 16 rows elsewhere (kernels/attention_mma_blocks.h attention_mma_forward_row_tiles: an A100's SM
// would hold 6 warps of them, an sm_86/sm_89 SM 4). At hd 128 32 rows spill (their O alone is 128
// registers a lane: compiled so, 160 bytes of spill stores and 260 of loads). Key tiles of Bc = 64
// rows stream through shared memory, K and V double-buffered with cp.async: at each tile the block
// waits for its copies, meets at one barrier (tile t has landed everywhere, and everyone is done
// with tile t − 1's buffer), issues tile t + 1 into that buffer and computes on tile t while it
// lands. With one row tile Q is staged once in V's second buffer, read into registers, and a second
// barrier (first tile only) frees the buffer; with two (kQShared) Q stays in a buffer of its own and
// each warp reads its fragments from it at every key tile, a k-chunk pair at a time (held, their 32
// registers spill).
// Per key tile and warp and 16-row tile, with mma.m16n8k16 (bf16 in, fp32 accumulate; layouts in
// kernels/mma.cuh):
//   S (16×64) = Q_w (16×hd) · Kᵀ       Q's A fragments by ldmatrix (kept in registers, hd/16 × 4,
//                                      with one row tile); K by ldmatrix.x4, two k-chunks of one
//                                      8-key n-tile per load, for every row tile; 8 accumulator tiles
//   online softmax on the accumulators  each lane holds rows g and g+8 (g = lane/4), columns 2t,
//                                      2t+1 of each n-tile: a row's max and sum over its 4 lanes by
//                                      two xor shuffles; masked scores are −∞ and contribute 0
//                                      (in masked tiles only: below)
//   O (16×hd) += P · V                 P rounded to bf16 straight from the S accumulators into A
//                                      fragments (no shared memory), one mma per V fragment; V by
//                                      ldmatrix.x4.trans
// l is summed per lane (its own columns, unrounded) and over the row's 4 lanes once at the end.
//
// P in one bf16 (FlashAttention-2's choice) adds a 2^-9 relative error per probability — the
// error of plain attention done the standard way (bf16 inputs, fp32 accumulation, P rounded to
// bf16 before P·V), which test_attention holds this kernel to (within 1.25× of that reference's
// error against fp64). The KV-cache decoder keeps P in fp32, and its parity tests against a full
// forward (test_decoder) need the forward that close: attention_forward's p_fp32 runs the CUDA-core
// kernel for them.
//
// Masks and skipping. Key tiles run from the one holding the block's smallest lo to the one
// holding its last row (causal tile skipping; with documents, tiles left of every row's window
// are never loaded). A warp whose rows see no key of a tile skips its math (warp-uniform; the
// result is the same bits as computing it fully masked: alpha = 1 and nothing added). A tile every
// row of the warp sees whole (interior: causal, all but the diagonal tile) runs a body compiled
// without masks or −∞ tests; the others (the diagonal, document boundaries, T) the masked body.
// Per warp and tile at hd 64 on sm_90: 355 instructions interior, 483 masked (16 rows); 645 and 882
// (32 rows) (model/attention_sass.h has the counts, read from single-body instantiations: the Path
// template argument). Heavy
// tiles first: the grid is 1-D, query tile index descending with the block index, so the
// blocks with the most key tiles are dispatched first and the short ones fill the tail.
//
// Small grids. Query tile q's block walks q + 1 key tiles: where the grid is small (a tensor-parallel
// rank's few heads at one sequence) the last query tiles' blocks run on alone. There
// (kernels/attention_mma_blocks.h, attention_mma_query_segment_steps: from the shape alone, so every
// GPU, and a recomputed forward, computes the same bits; hd 64 and 128) the kernel is instantiated
// with kSplit and a query tile's key tiles are split into segments of at most L, a block each; a
// split tile's blocks write their rows' unnormalised output and running maximum and sum in fp32
// (kernels/attention_mma_split.cuh), and attention_mma_forward_combine_kernel merges them in segment
// order into out and lse. The scratch for them is the caller's (attention_forward_scratch_bytes).
//
// Bounds. Query and key rows at or past T are loaded with cp.async's ignore-src (never read;
// zeros in shared memory); key rows past T are masked (j ≤ i < T); query rows past T
// attend like row T − 1 and are never stored. Requires qkv 16-byte aligned and out 4-byte
// aligned (the dispatcher checks; cudaMalloc gives 256).
//
// Shared memory (bf16 rows padded to hd + 8 elements, 16 bytes, so the 8 rows an ldmatrix reads
// fall in distinct banks): K [2][64][hd+8], V [2][64][hd+8], with 32 rows a warp Q [64][hd+8] (with
// 16 Q is staged in V[1]), lo [64] ints:
//   hd 64:  37,120 bytes, 46,336 with 32 rows (under the default 48 KiB)
//   hd 128: 69,888 bytes (opt-in above 48 KiB)
// 128 threads a block (64 with 32 rows); ptxas (sm_90, nvcc 13.0; make ptxas-report): 168
// registers at hd 64 (255 with 32 rows), 227 at hd 128, no local memory (the rows' windows are read
// from shared memory in the tile loop, not held: with P in one bf16 ptxas otherwise spilled at
// hd 128). So an H100 SM holds 12 warps at hd 64 (3 blocks; 8 with 32 rows: 4 blocks) and 8 at hd
// 128 (2 blocks), registers the limit. __launch_bounds__ names one block per SM as the minimum:
// told so, ptxas schedules the tile loop with 13 fewer instructions at hd 128 (566 → 553, NOPs it
// had placed) and 5 fewer in the masked body at hd 64, and the blocks per SM stay as they were. The
// same on the backward kernels cost dK/dV at hd 64 a block per SM (168 → 195 registers), so they
// keep the default.
//
// Global memory per launch (nq = ceil(T/64) query tiles; key tiles per query tile kt_q ≤ q + 1):
//   reads  Q: B·H·T·hd·2 bytes once; K and V: Σ_q kt_q · 64·hd·2 bytes each per (b, h), rows past
//          T not read; positions (if given): 64 ints per block
//   writes out B·T·H·hd·2 bytes, lse B·H·T·4 bytes (each element once; no atomics: deterministic)
// FLOPs per (warp, key tile) computed: 2·WR·64·hd for S and 2·WR·64·hd for P·V on tensor cores,
// the 4·WR·64·hd of the matmul-equivalent count.
#pragma once

#include "kernels/attention_mma_blocks.h"
#include "kernels/attention_mma_split.cuh"
#include "kernels/attention_window.cuh"
#include "kernels/common.cuh"
#include "kernels/mma.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace pv {

inline constexpr int kMmaAttentionBr = kAttentionMmaTile;          // query rows per block
inline constexpr int kMmaAttentionBc = kAttentionMmaTile;          // key rows per tile
inline constexpr int kMmaAttentionThreads = kAttentionMmaThreads;  // the combine kernel's block

// The block at head dim HD whose warps own RT 16-row tiles of the query tile each
// (kernels/attention_mma_blocks.h, which the performance model reads too: 2 at hd 64 on an H100,
// else 1).
template <int HD, int RT = 1>
struct MmaAttentionForwardConfig {
    static_assert(HD % 32 == 0 && HD <= 128, "head dim: a multiple of 32 up to 128");
    static_assert(RT == 1 || RT == 2, "16 or 32 rows a warp");
    static constexpr int kRowTiles = RT;
    static constexpr int kThreads = attention_mma_threads(RT);
    static constexpr int kWarpRows = 16 * kRowTiles;
    // With two row tiles Q's fragments are read from shared memory at every key tile (held, their
    // 32 more registers spill); one row tile holds them, Q staged in V's second buffer.
    static constexpr bool kQShared = kRowTiles > 1;
    static_assert(kThreads / 32 * kWarpRows == kMmaAttentionBr && kThreads >= kMmaAttentionBr,
                  "the warps cover the query tile, and a thread a row can fill its window start");
    static_assert(kQShared || kMmaAttentionBr <= kMmaAttentionBc, "Q is staged in a V buffer");
    static constexpr int kLd = HD + 8;  // shared row stride, elements
    static_assert(kLd == HD + kAttentionMmaRowPad && sizeof(__nv_bfloat16) == 2,
                  "the block attention_mma_blocks.h describes to the performance model");
    static constexpr size_t kSmemBytes = attention_mma_forward_smem_bytes(HD, RT);
};

// Rows [row0, row0 + ROWS) of a [T][stride] bf16 matrix (hd = HD wide from `src`) into shared
// dst[ROWS][HD + 8] with cp.async by the block's threads (RT as in the config), zero-filled at or
// past T_len. Not committed here.
template <int HD, int ROWS, int RT>
__device__ inline void mma_attention_load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, long long stride, int row0,
                                               int T_len) {
    using Config = MmaAttentionForwardConfig<HD, RT>;
    cp_async_rows<HD, ROWS, Config::kLd, Config::kThreads>(dst, src, stride, row0, T_len);
}

// The max and sum over the 4 lanes holding one row (adjacent lanes): every lane gets the same bits.
__device__ inline float mma_row_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float mma_row_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Grid: ceil(T/64)·H·B blocks (1-D, heaviest query tiles first; with kSplit a query tile's segments
// of at most segment_steps key tiles, attention_mma_split_grid(n, 1, segment_steps).blocks·H·B, the
// split tiles' partials to `partial`, partial_slots a (batch, head): attention_mma_forward_launch),
// MmaAttentionForwardConfig<HD, RT>::kThreads threads (RT: each warp's 16-row tiles).
// Path: 0 (what programs run) picks each tile's body; 1 and 2 compile only the interior or only the
// masked body, for bench/sass/attention_variants.cu alone (bench/attention_sass.py counts them).
template <int HD, int Path = 0, bool kSplit = false, int RT = 1>
__global__ void __launch_bounds__(MmaAttentionForwardConfig<HD, RT>::kThreads, 1)
    attention_mma_forward_kernel(const __nv_bfloat16* qkv, const int* positions, __nv_bfloat16* out, float* lse,
                                 int T_len, int H, int Hkv, int B, int segment_steps, float* partial,
                                 int partial_slots) {
    using bf16 = __nv_bfloat16;
    using Config = MmaAttentionForwardConfig<HD, RT>;
    constexpr int Br = kMmaAttentionBr, Bc = kMmaAttentionBc, ld = Config::kLd;
    constexpr int KC = HD / 16;                                    // k-chunks of Q·Kᵀ
    constexpr int NT = HD / 8;                                     // n-tiles of O
    constexpr int WR = Config::kWarpRows;                          // a warp's rows
    constexpr bool kQShared = Config::kQShared;
    const int q_tiles = ceil_div(T_len, Br), heads = H * B;
    // This block's query tile (the last first: the heaviest) and, split, its segment of the key tiles
    // (the partial slot is worked out again at the end, rather than held through the loop).
    const int zi = int(blockIdx.x) / heads;
    const AttentionMmaSplitBlock block =
        kSplit ? attention_mma_split_block(zi, q_tiles, 1, segment_steps) : AttentionMmaSplitBlock{zi, 0, -1};
    const int q0 = (q_tiles - 1 - block.z) * Br;
    const int h = int(blockIdx.x) % heads % H, b = int(blockIdx.x) % heads / H;
    const int kvh = h / (H / Hkv);
    const long long stride = (long long)(H + 2 * Hkv) * HD;
    const bf16* rows = qkv + (long long)b * T_len * stride;
    const bf16* q = rows + (long long)h * HD;
    const bf16* k = rows + (long long)(H + kvh) * HD;
    const bf16* v = rows + (long long)(H + Hkv + kvh) * HD;
    const int* pos = positions ? positions + (long long)b * T_len : nullptr;

    PV_DYNAMIC_SHARED(bf16, Ks);        // [2][Bc][ld]
    bf16* const Vs = Ks + 2 * Bc * ld;  // [2][Bc][ld]
    // [Br][ld]: its own buffer (kQShared), or staged in V's second buffer until in registers
    bf16* const Qs = kQShared ? Vs + 2 * Bc * ld : Vs + Bc * ld;
    int* const lo_s = reinterpret_cast<int*>(kQShared ? Qs + Br * ld : Vs + 2 * Bc * ld);

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t4 = lane % 4;
    // Q and the first key tile are in flight while the rows' windows are worked out.
    mma_attention_load_tile<HD, Br, RT>(Qs, q, stride, q0, T_len);
    if (threadIdx.x < Br) lo_s[threadIdx.x] = attention_first_key(pos, min(q0 + int(threadIdx.x), T_len - 1));
    __syncthreads();
    int block_lo = lo_s[0], warp_lo = lo_s[WR * warp], warp_lo_max = warp_lo;
    for (int r = 1; r < Br; ++r) block_lo = min(block_lo, lo_s[r]);
    for (int r = 1; r < WR; ++r)
        warp_lo = min(warp_lo, lo_s[WR * warp + r]), warp_lo_max = max(warp_lo_max, lo_s[WR * warp + r]);
    const int warp_hi = min(q0 + WR * warp + WR - 1, T_len - 1);  // the warp's last key (rows past T: T − 1)
    // Keys every row of the warp sees: warp_lo_max .. the warp's first row (or T − 1). A tile inside
    // that range is an interior tile, computed without a mask.
    const int warp_all_hi = min(q0 + WR * warp, T_len - 1);
    // Row r of the warp's WR: this lane's rows are r = 16·rt + g + 8·half. Row r sees keys
    // lo_s[WR·warp + r] .. i_eff(r); read in the tile loop, not held: the loop needs every register.
    const auto i_eff = [&](int r) { return min(q0 + WR * warp + r, T_len - 1); };

    // Split, the key tiles in the segment's [segment·L, segment·L + L) (documents may leave a segment
    // none: it writes an empty partial, m = −∞ and l = 0).
    int first = block_lo / Bc, last = (min(q0 + Br, T_len) - 1) / Bc;
    if constexpr (kSplit)
        first = max(first, block.segment * segment_steps), last = min(last, (block.segment + 1) * segment_steps - 1);
    if (!kSplit || first <= last) {
        mma_attention_load_tile<HD, Bc, RT>(Ks, k, stride, first * Bc, T_len);
        mma_attention_load_tile<HD, Bc, RT>(Vs, v, stride, first * Bc, T_len);
    }
    cp_async_commit();

    // Scores stay unscaled (m too); 2^(s·scale_log2 − m·scale_log2) is one FFMA and one MUFU.
    const float scale_log2 = kLog2e / sqrtf(float(HD));
    uint32_t qf[kQShared ? 1 : KC][4];  // Q's A fragments, held (one row tile)
    float o[RT][NT][4], m[RT][2], l[RT][2];
    for (int rt = 0; rt < RT; ++rt) {
        for (int n = 0; n < NT; ++n)
            for (int e = 0; e < 4; ++e) o[rt][n][e] = 0.0f;
        m[rt][0] = m[rt][1] = -INFINITY, l[rt][0] = l[rt][1] = 0.0f;
    }
    // This lane's ldmatrix row of Q's A fragments (row tile 0; tile rt is 16·rt rows on).
    const bf16* const q_lane = Qs + (WR * warp + lane % 16) * ld + 8 * (lane / 16);

    // One key tile of the warp's rows: S = Q·Kᵀ, the online softmax, O += P·V. Masked: the tile
    // holds a key some row of the warp must not see (its window's start or end, or T, falls in
    // it); those scores become −∞ and a row that has seen no key yet keeps m = −∞. Interior tiles
    // are compiled without either test.
    // Kl and Vl: this lane's first ldmatrix row of the tile's K and V buffers (k_lane, v_lane below).
    const auto tile = [&](const bf16* Kl, const bf16* Vl, int k0, auto masked_tag) {
        constexpr bool kMasked = decltype(masked_tag)::value;
        // S = Q·Kᵀ: n-tile n holds keys k0 + 8n .. k0 + 8n + 7; each K fragment feeds every row tile.
        float s[RT][Bc / 8][4];
        for (int rt = 0; rt < RT; ++rt)
            for (int n = 0; n < Bc / 8; ++n)
                for (int e = 0; e < 4; ++e) s[rt][n][e] = 0.0f;
        if constexpr (kQShared) {
            for (int c = 0; c < KC; c += 2) {  // Q's fragments for dims 16c + 0..31, then every n-tile's keys
                uint32_t qa[RT][2][4];
                for (int rt = 0; rt < RT; ++rt) {
                    ldmatrix_x4(qa[rt][0], q_lane + 16 * rt * ld + c * 16);
                    ldmatrix_x4(qa[rt][1], q_lane + 16 * rt * ld + c * 16 + 16);
                }
                for (int n = 0; n < Bc / 8; ++n) {
                    uint32_t kb[4];
                    ldmatrix_x4(kb, Kl + 8 * n * ld + c * 16);
                    const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
                    for (int rt = 0; rt < RT; ++rt) {
                        mma_m16n8k16_bf16(s[rt][n], qa[rt][0], b0, s[rt][n]);
                        mma_m16n8k16_bf16(s[rt][n], qa[rt][1], b1, s[rt][n]);
                    }
                }
            }
        } else {
            for (int n = 0; n < Bc / 8; ++n)
                for (int c = 0; c < KC; c += 2) {  // matrices: this n-tile's keys × dims 16c + 0..31
                    uint32_t kb[4];
                    ldmatrix_x4(kb, Kl + 8 * n * ld + c * 16);
                    const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
                    mma_m16n8k16_bf16(s[0][n], qf[c], b0, s[0][n]);
                    mma_m16n8k16_bf16(s[0][n], qf[c + 1], b1, s[0][n]);
                }
        }
        // Online softmax, per row tile and row half (accumulator elements 2·half and 2·half + 1).
        for (int rt = 0; rt < RT; ++rt)
            for (int half = 0; half < 2; ++half) {
                const int r = 16 * rt + g + 8 * half;  // of the warp's rows
                float tile_max = -INFINITY;
                for (int n = 0; n < Bc / 8; ++n)
                    for (int e = 0; e < 2; ++e) {
                        float& x = s[rt][n][2 * half + e];
                        if constexpr (kMasked) {
                            const int j = k0 + 8 * n + 2 * t4 + e;
                            x = lo_s[WR * warp + r] <= j && j <= i_eff(r) ? x : -INFINITY;
                        }
                        tile_max = fmaxf(tile_max, x);
                    }
                const float m_new = fmaxf(m[rt][half], mma_row_max(tile_max));
                // Until a row's first key m_new = −∞: its offset is 0 instead, so that every 2^(−∞ − 0) = 0
                // (alpha too: l and o are still 0) rather than 2^(−∞ + ∞).
                const float offset = kMasked && m_new == -INFINITY ? 0.0f : m_new * scale_log2;
                const float alpha = exp2_ftz(fmaf(m[rt][half], scale_log2, -offset));
                float sum = 0.0f;
                for (int n = 0; n < Bc / 8; ++n)
                    for (int e = 0; e < 2; ++e) {
                        float& x = s[rt][n][2 * half + e];
                        x = exp2_ftz(fmaf(x, scale_log2, -offset));
                        sum += x;
                    }
                l[rt][half] = l[rt][half] * alpha + sum;
                m[rt][half] = m_new;
                for (int n = 0; n < NT; ++n) o[rt][n][2 * half] *= alpha, o[rt][n][2 * half + 1] *= alpha;
            }
        // O += P·V: k-chunk c is keys 16c .. 16c + 15 (S tiles 2c and 2c + 1); each V fragment feeds
        // every row tile.
        for (int c = 0; c < Bc / 16; ++c) {
            uint32_t p[RT][4];
            for (int rt = 0; rt < RT; ++rt) accumulators_to_a_bf16(s[rt][2 * c], s[rt][2 * c + 1], p[rt]);
            for (int n = 0; n < NT; n += 2) {  // matrices: keys 16c + 0..7, 8..15 × dims 8n + 0..15
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, Vl + 16 * c * ld + 8 * n);
                const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
                for (int rt = 0; rt < RT; ++rt) {
                    mma_m16n8k16_bf16(o[rt][n], p[rt], b0, o[rt][n]);
                    mma_m16n8k16_bf16(o[rt][n + 1], p[rt], b1, o[rt][n + 1]);
                }
            }
        }
    };

    // Each lane's ldmatrix rows in buffer 0 of K (keys lane % 8, dims 8·(lane / 8) + ...) and of V
    // (keys lane % 16, dims 8·(lane / 16) + ...), and the offset of the buffer tile kt is in (0 or
    // Bc·ld elements), toggled each tile: no per-tile multiply for the buffer or the lane.
    const bf16* const k_lane = Ks + (lane % 8) * ld + 8 * (lane / 8);
    const bf16* const v_lane = Vs + (lane % 8 + 8 * ((lane / 8) % 2)) * ld + 8 * (lane / 16);
    int buf_off = 0;
    for (int kt = first; kt <= last; ++kt, buf_off = Bc * ld - buf_off) {
        const int k0 = kt * Bc;
        cp_async_wait<0>();  // this thread's copies of tile kt (and Q) have landed
        __syncthreads();     // ... and everyone's; and everyone is done with tile kt − 1's buffer
        if constexpr (!kQShared) {
            if (kt == first) {
                for (int c = 0; c < KC; ++c) ldmatrix_x4(qf[c], q_lane + c * 16);
                __syncthreads();  // Q is in every warp's registers: its buffer may be refilled
            }
        }
        if (kt < last) {  // the next tile into the other buffer, in flight while this one is used
            mma_attention_load_tile<HD, Bc, RT>(Ks + (Bc * ld - buf_off), k, stride, k0 + Bc, T_len);
            mma_attention_load_tile<HD, Bc, RT>(Vs + (Bc * ld - buf_off), v, stride, k0 + Bc, T_len);
            cp_async_commit();
        }
        if (Path == 1 || (Path == 0 && k0 >= warp_lo_max && k0 + Bc - 1 <= warp_all_hi))
            tile(k_lane + buf_off, v_lane + buf_off, k0, std::false_type{});
        else if (k0 <= warp_hi && k0 + Bc - 1 >= warp_lo)  // some row of the warp sees a key here
            tile(k_lane + buf_off, v_lane + buf_off, k0, std::true_type{});
    }

    if constexpr (kSplit) {
        cp_async_wait<0>();  // (an empty segment's Q copies)
        if (const int slot = attention_mma_split_block(zi, q_tiles, 1, segment_steps).slot; slot >= 0) {
            // A split query tile: this segment's output unnormalised, each row's maximum (of the
            // unscaled scores) and sum, for attention_mma_forward_combine_kernel.
            const long long rows = (long long)B * H, row = (long long)b * H + h;
            float* stats = attention_mma_forward_stats(partial, rows, row, partial_slots, slot, HD);
            for (int rt = 0; rt < RT; ++rt) {
                attention_mma_store_partial<HD>(
                    attention_mma_partial_tile<HD>(partial, 0, rows, row, partial_slots, slot), WR * warp + 16 * rt,
                    T_len - q0, o[rt]);
                for (int half = 0; half < 2; ++half) {
                    const float total = mma_row_sum(l[rt][half]);
                    const int r = WR * warp + 16 * rt + g + 8 * half;
                    if (t4 == 0 && q0 + r < T_len) stats[r] = m[rt][half], stats[Br + r] = total;
                }
            }
            return;
        }
    }
    for (int rt = 0; rt < RT; ++rt)
        for (int half = 0; half < 2; ++half) {
            const float total = mma_row_sum(l[rt][half]);  // ≥ 1: every row sees itself
            const int i = q0 + WR * warp + 16 * rt + g + 8 * half;
            if (i >= T_len) continue;
            const float inv = 1.0f / total;
            bf16* o_row = out + ((long long)b * T_len + i) * H * HD + (long long)h * HD;
            for (int n = 0; n < NT; ++n)
                *reinterpret_cast<uint32_t*>(o_row + 8 * n + 2 * t4) =
                    pack_bf16x2(o[rt][n][2 * half] * inv, o[rt][n][2 * half + 1] * inv);
            if (t4 == 0)
                lse[((long long)b * H + h) * T_len + i] =
                    0.6931471805599453f * (m[rt][half] * scale_log2 + log2f(total));
        }
}

// The split forward's query tiles (attention_mma_blocks.h): block (z, head, batch) merges query tile
// n − 1 − z's segments in segment order. With c = log2(e)/sqrt(hd), M = max_s m_s and weights
// w_s = 2^(c·m_s − c·M) (0 for a segment whose row saw no key: m_s = −∞):
//   l = Σ_s w_s·l_s,   out = Σ_s w_s·O_s / l (bf16),   lse = ln 2·(c·M + log2 l)
// Threads 0..63 work out a row's c·M and 1/l (and its lse) into shared memory; then each thread takes
// 4 consecutive columns of a row at a time (16-byte loads), reading the segments' maxima again.
template <int HD>
__global__ void __launch_bounds__(kMmaAttentionThreads)
    attention_mma_forward_combine_kernel(const float* partial, __nv_bfloat16* out, float* lse, int T_len, int H,
                                         int segment_steps, int partial_slots) {
    constexpr int Bt = kAttentionMmaTile;
    const int z = blockIdx.x, h = blockIdx.y, b = blockIdx.z, n = (T_len + Bt - 1) / Bt;
    const AttentionMmaSplitTile tile = attention_mma_split_tile(z, n, 1, segment_steps);
    const int row0 = (n - 1 - z) * Bt;
    const long long rows = (long long)gridDim.z * H, row = (long long)b * H + h;
    const float* o = attention_mma_partial_tile<HD>(partial, 0, rows, row, partial_slots, tile.first_slot);
    const float* stats = attention_mma_forward_stats(partial, rows, row, partial_slots, tile.first_slot, HD);
    const float scale_log2 = kLog2e / sqrtf(float(HD));
    __shared__ float max_s[Bt], inv_s[Bt];  // c·M and 1/l per row
    if (const int r = int(threadIdx.x); r < Bt && row0 + r < T_len) {
        float M = -INFINITY;
        for (int s = 0; s < tile.segments; ++s) M = fmaxf(M, stats[s * 2 * Bt + r]);
        const float cM = M * scale_log2;  // finite: every row sees itself in some segment
        float l = 0.0f;
        for (int s = 0; s < tile.segments; ++s)
            l += exp2_ftz(fmaf(stats[s * 2 * Bt + r], scale_log2, -cM)) * stats[s * 2 * Bt + Bt + r];
        max_s[r] = cM, inv_s[r] = 1.0f / l;
        lse[((long long)b * H + h) * T_len + row0 + r] = 0.6931471805599453f * (cM + log2f(l));
    }
    __syncthreads();
    for (int e = 4 * int(threadIdx.x); e < Bt * HD; e += 4 * kMmaAttentionThreads) {
        const int r = e / HD;
        if (row0 + r >= T_len) continue;
        float4 sum = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < tile.segments; ++s) {
            const float w = exp2_ftz(fmaf(stats[s * 2 * Bt + r], scale_log2, -max_s[r]));
            const float4 x = *reinterpret_cast<const float4*>(o + (long long)s * Bt * HD + e);
            sum.x += w * x.x, sum.y += w * x.y, sum.z += w * x.z, sum.w += w * x.w;
        }
        const float inv = inv_s[r];
        __nv_bfloat16* o_row = out + ((long long)b * T_len + row0 + r) * H * HD + (long long)h * HD + e % HD;
        *reinterpret_cast<uint32_t*>(o_row) = pack_bf16x2(sum.x * inv, sum.y * inv);
        *reinterpret_cast<uint32_t*>(o_row + 2) = pack_bf16x2(sum.z * inv, sum.w * inv);
    }
}

// Whether the tensor-core forward takes this call: bf16 (the caller's type), hd 64 or 128, the
// alignment its 16-byte copies and 4-byte stores need, and a block the device's shared memory holds.
inline bool attention_mma_forward_supported(const void* qkv, const void* out, int hd) {
    return (hd == 64 || hd == 128) && reinterpret_cast<uintptr_t>(qkv) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(out) % 4 == 0 && attention_mma_forward_fits(hd, device_shared_bytes_per_block());
}

// The forward at head dim HD with warps of RT 16-row tiles, its query tiles' key tiles split into
// segments of at most segment_steps (0: none; attention_mma_query_segment_steps), whose partials go
// to `partial` (attention_mma_forward_partial_bytes) and the combine kernel merges.
template <int HD, int RT>
void attention_mma_forward_rows(const __nv_bfloat16* qkv, const int* positions, __nv_bfloat16* out, float* lse, int B,
                                int T_len, int H, int Hkv, cudaStream_t stream, int segment_steps, float* partial) {
    using Config = MmaAttentionForwardConfig<HD, RT>;
    constexpr size_t smem = Config::kSmemBytes;
    static_assert(attention_mma_split_supports(HD), "the forward's head dims all have a split kernel");
    if constexpr (smem > 48 * 1024) {  // once per process and instantiation: the opt-in above the default limit
        static const bool opted_in = [] {
            CUDA_CHECK(cudaFuncSetAttribute(attention_mma_forward_kernel<HD, 0, false, RT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
            CUDA_CHECK(cudaFuncSetAttribute(attention_mma_forward_kernel<HD, 0, true, RT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
            return true;
        }();
        (void)opted_in;
    }
    const AttentionMmaSplitGrid grid = attention_mma_split_grid(ceil_div(T_len, kMmaAttentionBr), 1, segment_steps);
    if (grid.partial_slots > 0 && !partial) {
        std::fprintf(stderr, "polevault: attention_mma_forward: the split needs its partials' scratch\n");
        std::abort();
    }
    const dim3 blocks(unsigned(grid.blocks * H * B));
    if (segment_steps > 0) {
        launch(attention_mma_forward_kernel<HD, 0, true, RT>, blocks, dim3(Config::kThreads), smem, stream, qkv,
               positions, out, lse, T_len, H, Hkv, B, segment_steps, partial, int(grid.partial_slots));
        CUDA_CHECK_LAUNCH();
        if (grid.partial_slots > 0) {
            launch(attention_mma_forward_combine_kernel<HD>, dim3(unsigned(grid.split_tiles), H, B),
                   dim3(kMmaAttentionThreads), 0, stream, static_cast<const float*>(partial), out, lse, T_len, H,
                   segment_steps, int(grid.partial_slots));
            CUDA_CHECK_LAUNCH();
        }
        return;
    }
    launch(attention_mma_forward_kernel<HD, 0, false, RT>, blocks, dim3(Config::kThreads), smem, stream, qkv, positions,
           out, lse, T_len, H, Hkv, B, 0, static_cast<float*>(nullptr), 0);
    CUDA_CHECK_LAUNCH();
}

// The same at head dim HD with the row tiles named (attention_mma_forward_row_tiles: 2 only at hd 64).
template <int HD>
void attention_mma_forward_launch(const __nv_bfloat16* qkv, const int* positions, __nv_bfloat16* out, float* lse, int B,
                                  int T_len, int H, int Hkv, cudaStream_t stream, int segment_steps, float* partial,
                                  int row_tiles) {
    if constexpr (attention_mma_has_row_tiles(HD, 2))
        if (row_tiles == 2)
            return attention_mma_forward_rows<HD, 2>(qkv, positions, out, lse, B, T_len, H, Hkv, stream, segment_steps,
                                                     partial);
    if (row_tiles != 1) {
        std::fprintf(stderr, "polevault: attention_mma_forward: no kernel with %d row tiles a warp at head dim %d\n",
                     row_tiles, HD);
        std::abort();
    }
    attention_mma_forward_rows<HD, 1>(qkv, positions, out, lse, B, T_len, H, Hkv, stream, segment_steps, partial);
}

// The launch at a run-time head dim (64 or 128) with the split and the row tiles named, with the
// split named, and with the shape's split (attention_mma_query_segment_steps; `partial` holds
// attention_mma_forward_partial_bytes) — the last two with the row tiles this device's shared memory
// gives (attention_mma_forward_row_tiles).
inline void attention_mma_forward(const __nv_bfloat16* qkv, const int* positions, __nv_bfloat16* out, float* lse, int B,
                                  int T_len, int H, int Hkv, int hd, cudaStream_t stream, int segment_steps,
                                  float* partial, int row_tiles) {
    if (hd == 64)
        return attention_mma_forward_launch<64>(qkv, positions, out, lse, B, T_len, H, Hkv, stream, segment_steps,
                                                partial, row_tiles);
    attention_mma_forward_launch<128>(qkv, positions, out, lse, B, T_len, H, Hkv, stream, segment_steps, partial,
                                      row_tiles);
}
inline void attention_mma_forward(const __nv_bfloat16* qkv, const int* positions, __nv_bfloat16* out, float* lse, int B,
                                  int T_len, int H, int Hkv, int hd, cudaStream_t stream, int segment_steps,
                                  float* partial) {
    attention_mma_forward(qkv, positions, out, lse, B, T_len, H, Hkv, hd, stream, segment_steps, partial,
                          attention_mma_forward_row_tiles(hd, device_shared_bytes_per_block()));
}
inline void attention_mma_forward(const __nv_bfloat16* qkv, const int* positions, __nv_bfloat16* out, float* lse, int B,
                                  int T_len, int H, int Hkv, int hd, cudaStream_t stream, float* partial) {
    attention_mma_forward(qkv, positions, out, lse, B, T_len, H, Hkv, hd, stream,
                          attention_mma_query_segment_steps(B, T_len, H, hd), partial);
}

}  // namespace pv
