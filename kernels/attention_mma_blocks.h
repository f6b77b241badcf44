// The tensor-core attention kernels' blocks as they are launched: threads and dynamic shared
// memory per block at each head dim. Plain C++, so that the kernels (attention_mma_forward.cuh,
// attention_mma_backward.cuh) and the performance model (model/step_cost.cpp, which works out from
// them how many blocks an SM holds) read the same figures.
#pragma once

#include <cstddef>

namespace pv {

inline constexpr int kAttentionMmaTile = 64;      // rows per tile, on both sides
inline constexpr int kAttentionMmaThreads = 128;  // 4 warps, 16 rows of the block's tile each
// A shared tile row holds hd + 8 bf16 elements: the 8 rows one ldmatrix reads start 16 bytes
// apart, on all 32 banks.
inline constexpr int kAttentionMmaRowPad = 8;

constexpr size_t attention_mma_tile_bytes(int hd) {
    return size_t(kAttentionMmaTile) * size_t(hd + kAttentionMmaRowPad) * 2;  // bf16
}
// The forward: two K and two V tiles (Q is staged in a V buffer), the block's rows' window starts.
constexpr size_t attention_mma_forward_smem_bytes(int hd) {
    return 4 * attention_mma_tile_bytes(hd) + kAttentionMmaTile * sizeof(int);
}
// dK/dV: K, V, two Q and two dO tiles; two buffers of the query tile's lse, D (fp32) and window starts.
constexpr size_t attention_mma_dkv_smem_bytes(int hd) {
    return 6 * attention_mma_tile_bytes(hd) + 2 * kAttentionMmaTile * (2 * sizeof(float) + sizeof(int));
}
// dQ: two K and two V tiles (Q and dO go through buffer 1 first); 12 + 64 ints of window bounds.
constexpr size_t attention_mma_dq_smem_bytes(int hd) {
    return 4 * attention_mma_tile_bytes(hd) + (12 + kAttentionMmaTile) * sizeof(int);
}

// Whether the tensor-core kernels' blocks fit a device that lets a block have `shared_per_block`
// bytes of shared memory: everywhere from sm_80 on at hd 64, but the backward's dK/dV block at
// hd 128 (105,984 bytes) is over the 99 KiB of sm_86 and sm_89 (RTX 6000 Ada), which then run the
// CUDA-core backward. The dispatch (kernels/attention.cuh) asks with the device's figure, the
// performance model with its device's.
constexpr bool attention_mma_forward_fits(int hd, size_t shared_per_block) {
    return attention_mma_forward_smem_bytes(hd) <= shared_per_block;
}
constexpr bool attention_mma_backward_fits(int hd, size_t shared_per_block) {
    return attention_mma_dkv_smem_bytes(hd) <= shared_per_block && attention_mma_dq_smem_bytes(hd) <= shared_per_block;
}

}  // namespace pv
