// The tensor-core attention kernels' blocks as they are launched: threads and dynamic shared
// memory per block at each head dim. Plain C++, so that the kernels (attention_mma_forward.cuh,
// attention_mma_backward.cuh) and the performance model (model/step_cost.cpp, which works out from
// them how many blocks an SM holds) read the same figures.
#pragma once

#include <cstddef>

namespace pv {

inline constexpr int kAttentionMmaTile = 64;      // rows per tile, on both sides
inline constexpr int kAttentionMmaThreads = 128;  // 4 warps, 16 rows of the block's tile each (each
                                                  // kernel at hd 64 on some GPUs: 2 of 32, below)

// How a shared [64][hd] bf16 tile's rows lie in shared memory. The 8 rows one ldmatrix reads must
// fall on different banks:
//  - padded: a row holds hd + 8 elements, so those rows start 16 bytes apart (all 32 banks);
//  - swizzled: a row holds hd elements, and 16-byte piece c of row r is stored at piece c ^ (r % 8),
//    so the same piece of 8 consecutive rows lies in 8 different 16-byte bank groups. It needs rows
//    of whole 128-byte lines (hd a multiple of 64) and saves 1 KiB a tile; the dK/dV block at
//    hd 128 uses it where its padded block does not fit the device (sm_86, sm_89).
enum class AttentionMmaRows { padded, swizzled };
inline constexpr int kAttentionMmaRowPad = 8;

// The head dims with a swizzled dK/dV kernel: 128 alone, the one head dim whose padded block is over
// the 99 KiB (101,376 bytes) a block may have on sm_86 and sm_89, the least of any GPU from sm_80
// on. (Swizzling needs hd % 64 == 0; at hd 64 the padded block takes 56,832 bytes.)
constexpr bool attention_mma_dkv_has_swizzled(int hd) { return hd == 128; }
constexpr int attention_mma_row_elements(int hd, AttentionMmaRows rows) {
    return rows == AttentionMmaRows::padded ? hd + kAttentionMmaRowPad : hd;
}
constexpr size_t attention_mma_tile_bytes(int hd, AttentionMmaRows rows = AttentionMmaRows::padded) {
    return size_t(kAttentionMmaTile) * size_t(attention_mma_row_elements(hd, rows)) * 2;  // bf16
}
// The forward: two K and two V tiles, the block's rows' window starts, and with two 16-row tiles a
// warp (below) a Q tile the warps read their fragments from at every key tile (with one, each holds
// its fragments in registers: Q is staged in a V buffer).
constexpr size_t attention_mma_forward_smem_bytes(int hd, int row_tiles = 1) {
    return (row_tiles > 1 ? 5 : 4) * attention_mma_tile_bytes(hd) + kAttentionMmaTile * sizeof(int);
}
// dQ: two K and two V tiles (Q and dO go through buffer 1 first); 12 + 64 ints of window bounds.
constexpr size_t attention_mma_dq_smem_bytes(int hd) {
    return 4 * attention_mma_tile_bytes(hd) + (12 + kAttentionMmaTile) * sizeof(int);
}

// Warps of 32 rows. The forward's and dQ's blocks own a 64-row query tile, dK/dV's a 64-row key
// tile, their warps `row_tiles` 16-row tiles each: 4 warps of 16 rows, or at hd 64 on a device whose
// SM holds 4 blocks of 2 warps of 32 rows (8 warps: the calibrated rate holds from 8 an SM), 2 of 32
// — each fragment of the other side's tile a warp loads then feeds two mma: 9% fewer instructions
// per mma in the forward, 6% in dQ's interior tiles (12% in its masked ones), 7% in dK/dV's (13%).
// At up to 255 registers 4 such blocks fill an SM's 64 Ki; where shared memory holds fewer (the
// forward: an A100's SM 3 blocks, 6 warps, an sm_86/sm_89 SM 2; dQ: sm_86/sm_89 2; dK/dV: both 2),
// too few warps hide the latencies and the kernel keeps 16 rows, as hd 128 does everywhere (32 rows'
// accumulators spill there). An SM's shared memory is a block's opt-in limit and the 1 KiB a block
// reserves (228, 164, 100 KiB).
inline constexpr size_t kAttentionMmaBlockReserve = 1024;
constexpr int attention_mma_row_tiles(int hd, size_t block_smem_32_rows, size_t shared_per_block) {
    return hd == 64 &&
                   4 * (block_smem_32_rows + kAttentionMmaBlockReserve) <= shared_per_block + kAttentionMmaBlockReserve
               ? 2
               : 1;
}
// The kernels compiled with warps of `row_tiles` 16-row tiles at head dim hd: 1 everywhere, 2 at 64.
constexpr bool attention_mma_has_row_tiles(int hd, int row_tiles) {
    return row_tiles == 1 || (row_tiles == 2 && hd == 64);
}
constexpr int attention_mma_threads(int row_tiles) { return kAttentionMmaThreads / row_tiles; }
// The forward's 32-row block: 46,336 bytes at hd 64 (H100: 2 warps of 32 rows; A100, sm_86/sm_89: 16).
constexpr int attention_mma_forward_row_tiles(int hd, size_t shared_per_block) {
    return attention_mma_row_tiles(hd, attention_mma_forward_smem_bytes(hd, 2), shared_per_block);
}
// dQ's, the same block either way: 37,168 bytes at hd 64 (H100 and A100: 32 rows; sm_86/sm_89: 16).
constexpr int attention_mma_dq_row_tiles(int hd, size_t shared_per_block) {
    return attention_mma_row_tiles(hd, attention_mma_dq_smem_bytes(hd), shared_per_block);
}
// dK/dV: K, V, two Q and two dO tiles; two buffers of the query tile's lse, D (fp32) and window starts.
constexpr size_t attention_mma_dkv_smem_bytes(int hd, AttentionMmaRows rows = AttentionMmaRows::padded) {
    return 6 * attention_mma_tile_bytes(hd, rows) + 2 * kAttentionMmaTile * (2 * sizeof(float) + sizeof(int));
}
// dK/dV's warps, by the same rule: 56,832 bytes at hd 64 (H100: 32 keys; A100, sm_86/sm_89: 16);
// and at a shape, below, only where its grid is large enough.
constexpr int attention_mma_dkv_row_tiles(int hd, size_t shared_per_block) {
    return attention_mma_row_tiles(hd, attention_mma_dkv_smem_bytes(hd), shared_per_block);
}
// The dK/dV block's rows on a device that lets a block have `shared_per_block` bytes of shared
// memory: padded where that block fits (everywhere from sm_80 on up to hd 112, and on sm_80 and
// sm_90 at hd 128), else swizzled (hd 128 on sm_86 and sm_89: 99,840 bytes where the padded block
// takes 105,984 of their 101,376).
constexpr AttentionMmaRows attention_mma_dkv_rows(int hd, size_t shared_per_block) {
    return attention_mma_dkv_smem_bytes(hd) <= shared_per_block || !attention_mma_dkv_has_swizzled(hd)
               ? AttentionMmaRows::padded
               : AttentionMmaRows::swizzled;
}

// The work split on small grids. Each tensor-core kernel has a grid whose block z (of n =
// ceil(T/64), heaviest first) walks group·(n − z) steps: dK/dV's block owns key tile z and walks its
// G = H/Hkv query heads' query tiles from the diagonal on (group G, a block per KV head); the
// forward's and dQ's own query tile n − 1 − z and walk the key tiles up to the diagonal (group 1, a
// block per query head). So the grid's first blocks carry group·n steps and its last group. Where the grid is small
// (one sequence of 2048, or a tensor-parallel rank's few heads), the heaviest blocks run on long
// after the others have ended: the kernel takes their time, 2x (dK/dV at 8B, 1 x 2048) to 8x (8B,
// --tp 8, 1 x 4096) the time of its instructions spread over the GPU. There a block's steps are
// split into segments of at most L steps, a block each; a tile of more than one segment has its
// blocks write fp32 partial sums, which a second kernel adds in segment order (deterministic). L
// depends on the shape alone, not the device, so every GPU computes the same bits.
//
// A grid is split where its heaviest block's group·n steps exceed 1.5x a slot's share of all the
// steps, the slots being 264 (an H100's 132 SMs x 2 blocks, as at hd 128): the grid then ends with
// the heaviest blocks alone on their SMs. Segments hold a third of a slot's share (at least 8 steps,
// so a partial's write and read stay small beside its steps' tile copies). The kernels' shares are
// the same (B·Hkv·G = B·H), so where all split they split by the same L; a query tile's heaviest
// block is G times lighter than a key tile's, so the forward and dQ split less often (and together:
// one policy). Head dims 64 and 128 alone (every Llama-family checkpoint's; the forward's) have split
// kernels: each is an instantiation of its own.
inline constexpr long long kAttentionSplitBalanceSlots = 264;
inline constexpr long long kAttentionSplitMinSegment = 8;
constexpr bool attention_mma_split_supports(int hd) { return hd == 64 || hd == 128; }
// L for `blocks` blocks per z index (B·Hkv or B·H) of `group` steps per tile, or 0: no split.
constexpr int attention_mma_segment_steps(long long blocks, int n, int group) {
    const long long share = blocks * group * ((long long)n * (n + 1) / 2) / kAttentionSplitBalanceSlots;
    if (2LL * group * n <= 3 * share) return 0;
    const long long L = (share + 2) / 3 > kAttentionSplitMinSegment ? (share + 2) / 3 : kAttentionSplitMinSegment;
    return (long long)group * n > L ? int(L) : 0;
}
constexpr int attention_mma_tiles(int T) { return (T + kAttentionMmaTile - 1) / kAttentionMmaTile; }
// Each kernel's L at a shape (0: not split).
constexpr int attention_mma_dkv_segment_steps(int B, int T, int H, int Hkv, int hd) {
    return attention_mma_split_supports(hd)
               ? attention_mma_segment_steps((long long)B * Hkv, attention_mma_tiles(T), H / Hkv)
               : 0;
}
// The forward's and dQ's: a query tile's key tiles.
constexpr int attention_mma_query_segment_steps(int B, int T, int H, int hd) {
    return attention_mma_split_supports(hd) ? attention_mma_segment_steps((long long)B * H, attention_mma_tiles(T), 1)
                                            : 0;
}
// dK/dV's warps at a shape: 32 keys where the device has them (above) and the grid is large enough.
// A 2-warp block issues from 2 of its SM's 4 schedulers at most, so a block takes about twice as long
// as a 4-warp block's; where the heaviest blocks (the first key tiles, G·n steps) outlast a slot's
// share of all the steps (at 4 blocks on each of an H100's 132 SMs) by more than 1.2x, they make the
// kernel's tail, and 16 keys a warp finish first. The performance model's grid dispatch
// (model/grid_dispatch.h) put the 32-key kernel at −18% at Llama-3.2-1B's 4 x 2048 (a heaviest block
// of 1.0 shares), −13% at 2 x 4096 (1.02), −6% at 7 x 1024 (1.11), but +13% at 6 x 1024 (1.29) and
// +47% at 2 x 2048 (2.0). Both give the same bits (each key row's products in the same order), so the
// choice may follow the shape.
inline constexpr long long kAttentionMmaWideSlots = 132 * 4;
constexpr int attention_mma_dkv_row_tiles(int hd, size_t shared_per_block, int B, int T, int H, int Hkv) {
    const long long n = attention_mma_tiles(T), G = H / Hkv;
    const long long heaviest = G * n, steps = (long long)B * Hkv * G * (n * (n + 1) / 2);
    return attention_mma_dkv_row_tiles(hd, shared_per_block) == 2 && 5 * heaviest * kAttentionMmaWideSlots <= 6 * steps
               ? 2
               : 1;
}
// Blocks (segments) of tile z: ceil(group·(n − z) / L), 1 unsplit (L = 0).
constexpr int attention_mma_segments(int n, int z, int group, int L) {
    return L == 0 ? 1 : (group * (n - z) + L - 1) / L;
}
// Per z-grid row (a (batch, KV head) of dK/dV, a (batch, query head) of dQ): the blocks, the partial
// slots (64 x hd fp32 of each output) of the split tiles, those of more than one segment, and how
// many tiles are split: z = 0, 1, .., Z − 1 (segments fall with z).
struct AttentionMmaSplitGrid {
    long long blocks = 0, partial_slots = 0;
    int split_tiles = 0;
};
constexpr AttentionMmaSplitGrid attention_mma_split_grid(int n, int group, int L) {
    AttentionMmaSplitGrid g;
    for (int z = 0; z < n; ++z) {
        const int s = attention_mma_segments(n, z, group, L);
        g.blocks += s;
        if (s > 1) g.partial_slots += s, ++g.split_tiles;
    }
    return g;
}
// Both kernels' splits at a shape, and the bytes of their partials: dK/dV's two outputs a slot, dQ's
// one. The backward's scratch holds the larger after D, one at a time (dK/dV's are summed before
// the dQ kernel runs).
struct AttentionMmaSplit {
    int dkv = 0, dq = 0;  // segment steps, 0: one block a tile
};
constexpr AttentionMmaSplit attention_mma_backward_split(int B, int T, int H, int Hkv, int hd) {
    return {attention_mma_dkv_segment_steps(B, T, H, Hkv, hd), attention_mma_query_segment_steps(B, T, H, hd)};
}
constexpr size_t attention_mma_partial_bytes(int B, int T, int H, int Hkv, int hd, AttentionMmaSplit split) {
    const int n = attention_mma_tiles(T);
    const size_t tile = size_t(kAttentionMmaTile) * size_t(hd) * sizeof(float);
    const size_t dkv =
        size_t(B) * size_t(Hkv) * size_t(attention_mma_split_grid(n, H / Hkv, split.dkv).partial_slots) * 2 * tile;
    const size_t dq = size_t(B) * size_t(H) * size_t(attention_mma_split_grid(n, 1, split.dq).partial_slots) * tile;
    return dkv > dq ? dkv : dq;
}
constexpr size_t attention_mma_partial_bytes(int B, int T, int H, int Hkv, int hd) {
    return attention_mma_partial_bytes(B, T, H, Hkv, hd, attention_mma_backward_split(B, T, H, Hkv, hd));
}
// The forward's partials: per (batch, query head) slot the unnormalised output [64][hd], then each
// slot's rows' running maximum and sum [2][64] after all the outputs, fp32.
constexpr size_t attention_mma_forward_partial_bytes(int B, int T, int H, int hd, int L) {
    const long long slots = attention_mma_split_grid(attention_mma_tiles(T), 1, L).partial_slots;
    return size_t(B) * size_t(H) * size_t(slots) * size_t(kAttentionMmaTile) * size_t(hd + 2) * sizeof(float);
}
constexpr size_t attention_mma_forward_partial_bytes(int B, int T, int H, int hd) {
    return attention_mma_forward_partial_bytes(B, T, H, hd, attention_mma_query_segment_steps(B, T, H, hd));
}

// Whether the tensor-core kernels' blocks fit such a device. The dispatch (kernels/attention.cuh)
// asks with the device's figure and runs the CUDA-core kernels where they do not; the performance
// model asks with its device's.
constexpr bool attention_mma_forward_fits(int hd, size_t shared_per_block) {
    return attention_mma_forward_smem_bytes(hd) <= shared_per_block;
}
constexpr bool attention_mma_backward_fits(int hd, size_t shared_per_block) {
    return attention_mma_dkv_smem_bytes(hd, attention_mma_dkv_rows(hd, shared_per_block)) <= shared_per_block &&
           attention_mma_dq_smem_bytes(hd) <= shared_per_block;
}

}  // namespace pv
