// The tensor-core attention kernels' blocks as they are launched: threads and dynamic shared
// memory per block at each head dim. Plain C++, so that the kernels (attention_mma_forward.cuh,
// attention_mma_backward.cuh) and the performance model (model/step_cost.cpp, which works out from
// them how many blocks an SM holds) read the same figures.
#pragma once

#include <cstddef>

namespace pv {

inline constexpr int kAttentionMmaTile = 64;      // rows per tile, on both sides
inline constexpr int kAttentionMmaThreads = 128;  // 4 warps, 16 rows of the block's tile each

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
// The forward: two K and two V tiles (Q is staged in a V buffer), the block's rows' window starts.
constexpr size_t attention_mma_forward_smem_bytes(int hd) {
    return 4 * attention_mma_tile_bytes(hd) + kAttentionMmaTile * sizeof(int);
}
// dK/dV: K, V, two Q and two dO tiles; two buffers of the query tile's lse, D (fp32) and window starts.
constexpr size_t attention_mma_dkv_smem_bytes(int hd, AttentionMmaRows rows = AttentionMmaRows::padded) {
    return 6 * attention_mma_tile_bytes(hd, rows) + 2 * kAttentionMmaTile * (2 * sizeof(float) + sizeof(int));
}
// dQ: two K and two V tiles (Q and dO go through buffer 1 first); 12 + 64 ints of window bounds.
constexpr size_t attention_mma_dq_smem_bytes(int hd) {
    return 4 * attention_mma_tile_bytes(hd) + (12 + kAttentionMmaTile) * sizeof(int);
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

// The dK/dV kernel's work split. A block owns a key tile and walks its G = H/Hkv query heads' query
// tiles from the diagonal on, one step each: key tile z of n = ceil(T/64) has G·(n − z) steps, so
// the grid's first blocks carry G·n steps and its last G. Where the grid is small (one sequence of
// 2048, or a tensor-parallel rank's one KV head), the heaviest blocks run on long after the others
// have ended: the kernel takes their time, 2x (8B, 1 x 2048) to 8x (8B, --tp 8, 1 x 4096) the
// time of its instructions spread over the GPU. There a key tile's steps are split into segments
// of at most L steps, a block each; a key tile of more than one segment has its blocks write fp32
// partial dK and dV, which a second kernel sums in segment order (deterministic). L depends on the
// shape alone, not the device, so every GPU computes the same bits.
//
// The split applies where the heaviest block's G·n steps exceed 1.5x a slot's share of all the
// steps, the slots being 264 (an H100's 132 SMs x 2 blocks, as at hd 128): the grid then ends with
// the heaviest blocks alone on their SMs. Segments hold a third of a slot's share (at least 8 steps,
// so a partial's write and read stay small beside its steps' tile copies).
inline constexpr long long kAttentionDkvBalanceSlots = 264;
inline constexpr long long kAttentionDkvMinSegment = 8;
// Steps per (batch, KV head) over all key tiles: G·n(n + 1)/2.
constexpr long long attention_mma_dkv_steps(int T, int H, int Hkv) {
    const long long n = (T + kAttentionMmaTile - 1) / kAttentionMmaTile;
    return (long long)(H / Hkv) * n * (n + 1) / 2;
}
// L, the most steps a segment holds, or 0 where no key tile is split.
constexpr int attention_mma_dkv_segment_steps(int B, int T, int H, int Hkv) {
    const long long n = (T + kAttentionMmaTile - 1) / kAttentionMmaTile, G = H / Hkv;
    const long long share = (long long)B * Hkv * attention_mma_dkv_steps(T, H, Hkv) / kAttentionDkvBalanceSlots;
    if (2 * G * n <= 3 * share) return 0;
    const long long L = (share + 2) / 3 > kAttentionDkvMinSegment ? (share + 2) / 3 : kAttentionDkvMinSegment;
    return G * n > L ? int(L) : 0;
}
// Blocks (segments) of key tile z: ceil(G·(n − z) / L), 1 unsplit (L = 0).
constexpr int attention_mma_dkv_segments(int n, int z, int G, int L) { return L == 0 ? 1 : (G * (n - z) + L - 1) / L; }
// Per (batch, KV head): the dK/dV grid's blocks, the partial slots (64 x hd fp32 of dK and as many of
// dV) of its split key tiles, those of more than one segment, and how many key tiles are split:
// 0, 1, .., Z − 1 (segments fall with z).
struct AttentionMmaDkvGrid {
    long long blocks = 0, partial_slots = 0;
    int split_tiles = 0;
};
constexpr AttentionMmaDkvGrid attention_mma_dkv_grid(int T, int H, int Hkv, int L) {
    const int n = (T + kAttentionMmaTile - 1) / kAttentionMmaTile;
    AttentionMmaDkvGrid g;
    for (int z = 0; z < n; ++z) {
        const int s = attention_mma_dkv_segments(n, z, H / Hkv, L);
        g.blocks += s;
        if (s > 1) g.partial_slots += s, ++g.split_tiles;
    }
    return g;
}
// Bytes of the partials at this shape (the backward's scratch holds them after D).
constexpr size_t attention_mma_dkv_partial_bytes(int B, int T, int H, int Hkv, int hd) {
    const long long slots =
        attention_mma_dkv_grid(T, H, Hkv, attention_mma_dkv_segment_steps(B, T, H, Hkv)).partial_slots;
    return size_t(B) * size_t(Hkv) * size_t(slots) * size_t(kAttentionMmaTile) * size_t(hd) * 2 * sizeof(float);
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
