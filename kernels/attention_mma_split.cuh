// The tensor-core attention kernels' work split on small grids, device side: which segment of which
// tile a block of a split grid computes, and where its fp32 partials go. The policy (when a grid is
// split, into segments of how many steps) is plain C++ in kernels/attention_mma_blocks.h, shared with
// the performance model; the kernels that split are the forward (attention_mma_forward.cuh: a query
// tile's key tiles), dQ (the same) and dK/dV (a key tile's query heads and query tiles,
// attention_mma_backward.cuh), each followed by a kernel that adds a split tile's partials in
// segment order.
#pragma once

#include "kernels/attention_mma_blocks.h"
#include "kernels/common.cuh"

namespace pv {

// Tiles' segment counts in z order, ceil(group·(n − z) / L), with no division per tile: the count is
// kept with its slack, segments·L − group·(n − z) in [0, L), as z advances (the decode walks up to n
// tiles, a division each would cost a block more than a tile pair of work).
struct AttentionMmaSegments {
    int z, segments, slack, group, steps;
    __device__ AttentionMmaSegments(int n, int group_, int segment_steps)
        : z(0),
          segments((group_ * n + segment_steps - 1) / segment_steps),
          slack(segments * segment_steps - group_ * n),
          group(group_),
          steps(segment_steps) {}
    __device__ void next() {
        ++z, slack += group;
        while (slack >= steps) slack -= steps, --segments;
    }
};

// A split kernel's block: its tile z (the grid's order: dK/dV's key tile z, the forward's and dQ's
// query tile n − 1 − z), its segment of the tile's steps, and its partial slot (−1 where the tile is
// one block: it stores its rows itself), from its index along z: tile 0's segments first
// (attention_mma_segments, kernels/attention_mma_blocks.h, with L = segment_steps). The split tiles
// (more than one segment) come first, so their slots are the running count of their segments.
struct AttentionMmaSplitBlock {
    int z, segment, slot;
};
__device__ inline AttentionMmaSplitBlock attention_mma_split_block(int index, int n, int group, int segment_steps) {
    AttentionMmaSegments tiles(n, group, segment_steps);
    int first_slot = 0;
    for (; index >= tiles.segments; tiles.next()) {
        index -= tiles.segments;
        if (tiles.segments > 1) first_slot += tiles.segments;
    }
    return {tiles.z, index, tiles.segments > 1 ? first_slot + index : -1};
}

// A split tile z's segments and its first partial slot (every tile before a split one is split): what
// the kernels that add the partials start from.
struct AttentionMmaSplitTile {
    int segments, first_slot;
};
__device__ inline AttentionMmaSplitTile attention_mma_split_tile(int z, int n, int group, int segment_steps) {
    AttentionMmaSegments tiles(n, group, segment_steps);
    int first_slot = 0;
    for (; tiles.z < z; tiles.next()) first_slot += tiles.segments;
    return {tiles.segments, first_slot};
}

// Partial slot `slot` of output `tile` (dK/dV: 0 dK, 1 dV; dQ and the forward: 0) of z-grid row `row`
// (b·Hkv + kvh, or b·H + h) among `rows` rows: outputs outer, then rows, then slots, each [64][HD]
// fp32.
template <int HD, class F>
__device__ inline F* attention_mma_partial_tile(F* partial, int tile, long long rows, long long row, int partial_slots,
                                                int slot) {
    return partial + ((tile * rows + row) * partial_slots + slot) * kAttentionMmaTile * HD;
}

// A forward partial slot's rows' running maximum (of the unscaled scores) and sum, [2][64] fp32,
// after every slot's output tile.
template <class F>
__device__ inline F* attention_mma_forward_stats(F* partial, long long rows, long long row, int partial_slots, int slot,
                                                 int hd) {
    return partial + rows * partial_slots * kAttentionMmaTile * hd +
           (row * partial_slots + slot) * 2 * kAttentionMmaTile;
}

// Stores a warp's 16 accumulator rows × HD (C fragments, fp32 as they are) to rows row0 + {g, g + 8}
// of a [64][HD] fp32 tile, skipping rows at or past `limit` (the tile's rows at or past T): a split
// tile's partial.
template <int HD>
__device__ inline void attention_mma_store_partial(float* tile, int row0, int limit, const float (&acc)[HD / 8][4]) {
    const int lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;
    for (int half = 0; half < 2; ++half) {
        if (row0 + g + 8 * half >= limit) continue;
        float* out = tile + (row0 + g + 8 * half) * HD + 2 * t;
        for (int n = 0; n < HD / 8; ++n)
            *reinterpret_cast<float2*>(out + 8 * n) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
    }
}

}  // namespace pv
