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
