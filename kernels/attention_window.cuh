// Which keys a query row of causal attention sees, shared by every attention kernel
// (kernels/attention.cuh states the contract): row i of a sequence attends to keys lo_i ≤ j ≤ i,
// lo_i = 0 without positions, else lo_i = clamp(i − positions[i], 0, i), the first row of i's
// document (0 ≤ positions[i] ≤ i is the caller's contract; other values are clamped, never read past).
#pragma once

#include "platform/platform.h"

namespace pv {

// log2(e): the tensor-core kernels take their exponentials in base 2 (one MUFU.EX2), e^x = 2^(x·log2 e).
inline constexpr float kLog2e = 1.4426950408889634f;

// lo_i, the first key row i attends to: 0 without positions, else i − pos clamped to [0, i].
// `pos` is the sequence's positions, or null. (Written so that no out-of-range value can overflow
// the subtraction.)
__device__ inline int attention_first_key(const int* pos, int i) {
    if (!pos) return 0;
    const int p = pos[i];
    return p <= 0 ? i : p >= i ? 0 : i - p;
}

// The last query row whose window reaches key k_last (row k_last itself at least): a scan of the
// rows past it, reduced over the block. `scratch` holds an int per warp and may be reused at once.
__device__ inline int attention_last_query(const int* pos, int k_last, int T_len, int* scratch) {
    int last = k_last;
    for (int i = k_last + 1 + int(threadIdx.x); i < T_len; i += int(blockDim.x))
        if (attention_first_key(pos, i) <= k_last) last = max(last, i);
    for (int offset = 16; offset > 0; offset /= 2) last = max(last, __shfl_xor_sync(0xffffffffu, last, offset));
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = last;
    __syncthreads();
    for (int w = 0; w < int(blockDim.x / 32); ++w) last = max(last, scratch[w]);
    __syncthreads();  // everyone has read the scratch before it is reused
    return last;
}

}  // namespace pv
