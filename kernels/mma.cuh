// Backend-free helpers for kernels built on the warp-level mma.m16n8k16 (platform/platform.h
// declares the instructions: mma_m16n8k16_bf16/_f16, ldmatrix_x{1,2,4}[_trans], cp_async_*).
//
// Fragment layouts (PTX ISA; groupID g = lane / 4, t = lane % 4): a 16×8 fp32 accumulator tile
// C holds c[0], c[1] at (row g, cols 2t, 2t+1) and c[2], c[3] at (row g+8, same cols); a 16×16
// A operand holds a[0] (row g, cols 2t, 2t+1), a[1] (row g+8), a[2] (row g, cols 2t+8, 2t+9),
// a[3] (row g+8, cols 2t+8, 2t+9), two 16-bit values per register, the lower column in the low
// half. So two accumulator tiles side by side (columns 0-7 and 8-15) become one A operand with
// no data movement between lanes: accumulators_to_a_bf16 (how P = softmax(S) feeds P·V).
#pragma once

#include "platform/platform.h"

#include <cstdint>
#include <cstring>

namespace pv {

// Two floats rounded to nearest even into one register of bf16 pairs, `lo` in the low half.
__host__ __device__ inline uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
}

// Two 16×8 accumulator tiles (columns 0-7 in `left`, 8-15 in `right`) rounded to bf16 as the
// 16×16 A operand of the next mma.
__device__ inline void accumulators_to_a_bf16(const float (&left)[4], const float (&right)[4], uint32_t (&a)[4]) {
    a[0] = pack_bf16x2(left[0], left[1]);
    a[1] = pack_bf16x2(left[2], left[3]);
    a[2] = pack_bf16x2(right[0], right[1]);
    a[3] = pack_bf16x2(right[2], right[3]);
}

// The element offset of 16-byte piece c (elements 8c .. 8c + 7) of row r in a shared bf16 tile whose
// rows are LD elements long: at piece c, or with kSwizzle at piece c ^ (r % 8). Swizzled rows need no
// padding against bank conflicts: the same piece of 8 consecutive rows, which one ldmatrix reads,
// lies in 8 different 16-byte bank groups. It takes rows of whole 128-byte lines (LD a multiple of 64).
template <int LD, bool kSwizzle>
__host__ __device__ constexpr int shared_piece(int r, int c) {
    static_assert(!kSwizzle || LD % 64 == 0, "swizzled rows are whole 128-byte lines");
    return r * LD + 8 * (kSwizzle ? c ^ (r & 7) : c);
}

// Rows [row0, row0 + ROWS) of a bf16 matrix (`stride` elements between rows, HD wide from `src`,
// 16-byte aligned) into shared dst[ROWS][LD] with cp.async (each piece where shared_piece<LD,
// kSwizzle> puts it), rows at or past `limit` zeros (cp.async's ignore-src: their source is never
// read, so its address, past the tensor's rows, is left as it is and costs no select). The block's
// THREADS threads take the ROWS·HD/8 16-byte pieces in turn, thread t the pieces t, t + THREADS, ...
// — the same number each, so the trip count is a constant and the loop unrolls: no loop counter,
// branch or bound test in the SASS, the divisions by the row's piece count are by a constant. Not
// committed here.
//
// Where THREADS is a multiple of a row's pieces (head dims 32, 64, 128 at 128 threads) a thread's
// pieces all lie in one column, THREADS / (HD / 8) rows apart: one 64-bit multiply per call finds
// the first and an add steps to each next, where a multiply per piece (the general path, which the
// other head dims take) cost the forward's tile loop at hd 64 about 40 integer instructions.
template <int HD, int ROWS, int LD, int THREADS, bool kSwizzle = false>
__device__ inline void cp_async_rows(__nv_bfloat16* dst, const __nv_bfloat16* src, long long stride, int row0,
                                     int limit) {
    constexpr int pieces = HD / 8;  // 16-byte pieces per row
    static_assert(HD % 8 == 0 && ROWS * pieces % THREADS == 0, "every thread copies the same number of pieces");
    if constexpr (THREADS % pieces == 0) {
        constexpr int apart = THREADS / pieces;  // rows between a thread's pieces
        const int r = int(threadIdx.x) / pieces, c = int(threadIdx.x) % pieces;
        const __nv_bfloat16* p = src + c * 8 + (long long)(row0 + r) * stride;
        const long long step = (long long)apart * stride;
        for (int k = 0; k < ROWS / apart; ++k, p += step)
            cp_async_16_ignore_src(dst + shared_piece<LD, kSwizzle>(r + k * apart, c), p,
                                   row0 + r + k * apart >= limit);
    } else {
        for (int k = 0; k < ROWS * pieces / THREADS; ++k) {
            const int idx = int(threadIdx.x) + k * THREADS, r = idx / pieces, c = idx % pieces, row = row0 + r;
            cp_async_16_ignore_src(dst + shared_piece<LD, kSwizzle>(r, c), src + (long long)row * stride + c * 8,
                                   row >= limit);
        }
    }
}

}  // namespace pv
