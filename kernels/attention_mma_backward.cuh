// The attention backward on tensor cores, bf16 with fp32 accumulators: FlashAttention-2's
// recomputation scheme with every product a warp MMA (mma.m16n8k16, kernels/mma.cuh). The math,
// the layouts, the document windows and the D scratch are those of kernels/attention.cuh (its
// header comment); attention_backward dispatches here for bf16 at head dims that are multiples of
// 16 from 32 to 128 (each its own instantiation), when qkv, dout and dqkv are 16-byte aligned.
//
// With s = 1/sqrt(hd), P_ij = exp(s·q_i·k_j − lse_i) on the window lo_i ≤ j ≤ i and 0 elsewhere:
//   D_i  = dO_i·O_i                  attention_backward_dot_kernel (kernels/attention.cuh)
//   dP   = dO·Vᵀ,  dS = P∘(dP − D)
//   dV   = Pᵀ·dO,  dK = s·dSᵀ·Q      attention_mma_dkv_kernel, per key tile
//   dQ   = s·dS·K                    attention_mma_dq_kernel, per query tile
// FlashAttention-2 computes dQ in the dK/dV loop with atomic adds, whose order changes the bits
// from run to run. Here every output row is owned by one block that sums in a fixed order
// (DESIGN.md §4: deterministic), so the dQ kernel recomputes S, P, dP and dS: 7 products per
// visited (query, key) tile pair (S, dP, dV, dK; S, dP, dQ) instead of 5.
//
// Tiles. Both kernels have 4 warps (128 threads) and tiles of 64 rows on each side; each warp owns
// 16 rows of the block's tile and walks the other side's tile in chunks of 16 rows, so a chunk's
// scores are one 16×16 accumulator per warp (two m16n8 fragments, 8 floats a lane). At hd 64 on a
// device whose SM holds four 2-warp dQ blocks (H100, A100: kernels/attention_mma_blocks.h
// attention_mma_dq_row_tiles) dQ's block has 2 warps of 32 rows, two 16-row tiles each, every K and
// V fragment feeding both: 6% fewer instructions per HMMA in the interior tiles, 12% in the
// masked. Likewise dK/dV's at hd 64 on an H100, where the grid is large enough
// (attention_mma_dkv_row_tiles): 2 warps of 32 keys, every Q and dO fragment feeding both key
// tiles: 7% fewer instructions per block and tile pair (13% masked). Their products need no shared
// memory: the C fragments of P and dS, rounded to bf16 in pairs, are exactly the A fragment of the
// next product (the m16n8k16 layouts line up), so
//   dK/dV, warp rows = keys:     Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ  (A = K, V; B = Q, dO rows via ldmatrix)
//                                dV += Pᵀ·dO, dK += dSᵀ·Q (B = dO, Q via ldmatrix.trans)
//   dQ,   warp rows = queries:   S = Q·Kᵀ, dP = dO·Vᵀ    (A = Q, dO in registers; B = K, V rows)
//                                dQ += dS·K              (B = K via ldmatrix.trans)
// Precision. P and dS enter their products rounded to one bf16 each (FlashAttention-2's choice):
// the tensor-core work is 7 matmul-equivalents (S, dP, dV, dK; S, dP, dQ). The rounding of the
// large P of a row's first keys, up to 2^-9 of terms near 1, does not cancel when the sum does:
// single elements of dV and dQ can miss the fp64 reference by a few
// percent of its rms, as plain attention done the standard way (P and dS rounded to bf16 before
// their products, fp32 accumulation) does — test_attention holds these kernels within 1.25× of
// that reference's error against fp64.
//
// The streamed tiles are double-buffered: cp.async copies the next tile (16-byte pieces; rows at or
// past T are zero-filled, never read) while the warps compute on the current one. The per-row
// scalars of a query tile (lse, D, lo) go through registers, loaded a step before they are stored
// into the other buffer, so their latency too passes behind a step's compute (lse and D are fp32
// rows at (b·H + h)·T, 16-byte aligned only when T is a multiple of 4: cp.async's 16-byte pieces
// would need that). Shared rows are hd + 8 elements long, so the 8 rows one ldmatrix reads start 16
// bytes apart: all 32 banks, no conflict; or, in the dK/dV kernel at hd 128 where the device has
// too little shared memory for that, hd elements long with their 16-byte pieces swizzled
// (kernels/attention_mma_blocks.h, AttentionMmaRows).
//
// Exponentials. P = 2^(c·s − log2(e)·lse) with c = s·log2(e) and lse in base 2 once per row as it is
// loaded: one FFMA and one MUFU.EX2 with flush-to-zero (platform.h exp2_ftz) per element, no
// range handling, no branch; the mask is a select after it, from one bit per element.
//
// Masking and skipping. Key tiles and query tiles outside every window of the block are never
// visited (as in kernels/attention.cuh: causal, or by positions). Each kernel's tile loop has two
// bodies, chosen per warp and tile pair: an interior one without masks, for pairs in which every
// row of the warp's tile sees every key (causal: every pair off the diagonal; with documents, none
// of the rows' windows starting inside the keys), and a masked one for the others. In that one a
// warp skips a 16×16 chunk in which none of its elements is in a window (one vote: no work, the
// same result, since masked elements add exact zeros), and masks each remaining element by its
// own row's window and by T. The interior body's four chunks are written out where that costs no
// blocks per SM and no spills (attention_mma_chunks). Per warp and tile pair at hd 64 (sm_90,
// model/attention_sass.h): dK/dV 527 instructions interior, 808 masked (978 and 1,405 for 32 keys a
// warp); dQ 360 and 600 (674 and 1,072 for 32 rows a warp). dK/dV's steps (query head, query tile)
// advance by additions, not by a division and a remainder of the step index.
// Heavy tiles first: the grid puts the tile index in z (the slowest), and
// causal attention's heaviest tiles (dK/dV: the first key tiles; dQ: the last query tiles) get the
// lowest block indices.
//
// Small grids. Key tile z's dK/dV block walks G·(n − z) steps, the first G·n, and query tile q's dQ
// block q + 1 key tiles: where a grid is small (one sequence, a tensor-parallel rank's few heads) its
// first blocks run on alone and the kernel takes up to 8x its balanced time (model/step_cost.cpp).
// There (kernels/attention_mma_blocks.h, attention_mma_backward_split: from the shape alone, so every
// GPU computes the same bits; head dims 64 and 128) the kernel is instantiated with kSplit and a
// tile's steps are split into segments of at most L, a block each, in tile order along z; a split
// tile's blocks write their fp32 sums to partial slots, and attention_mma_reduce_kernel adds them in
// segment order, scales dK or dQ and stores in bf16. The sums' order differs from the unsplit
// kernel's (fp32 partials added), so the bits do too; deterministic either way. A segment that
// documents leave without steps writes zeros.
//
// Per launch, with n = ceil(T/64) tiles, Hkv KV heads, G = H/Hkv, every byte bf16 unless said:
//   dK/dV, grid (Hkv, B, n) (split: the z extent the segments), 128 threads (64 with 32 keys a
//     warp): reads its K and V
//     tiles once; for each of its G query heads (its segment's steps) and each query tile from its
//     diagonal to the last row that sees it, the Q and dO tiles (64·hd each) and 64 floats of lse,
//     64 of D (and 64 positions); with positions first the positions past the tile (the scan for
//     the last query row). Writes its dK and dV rows once (split: the rows before T of its slot,
//     hd floats each, of both).
//   dQ, grid (H, B, n) (split: the segments), 128 threads (64 with 32 rows a warp): reads its Q and
//     dO tiles, lse and D of its rows once; then for each key tile from the block's smallest lo to
//     the diagonal (split: in its segment) the K and V tiles. Writes dQ once (split: its slot's rows
//     before T in fp32).
// Causal, no documents: n(n+1)/2 tile pairs per (b, h), each costing 12·64²·hd tensor FLOPs in
// dK/dV (S, dP, dV, dK) and 6·64²·hd in dQ; on the diagonal tile the warps skip the 6 of 16
// chunks above it. Useful work (what a FLOP count of attention credits): 5 products.
//
// Shared memory per block (bytes; above 48 KiB the launcher opts in, cudaFuncSetAttribute):
//   kernel   hd 64     hd 128    contents
//   dK/dV    56,832    105,984   K, V, 2×Q, 2×dO [64][hd+8] bf16; 2×(lse, D, lo)[64] fp32/int
//   dQ       37,168    69,936    2×K, 2×V [64][hd+8] (Q, dO go through buffer 1 first); 76 ints
// Up to hd 64 the dK/dV warps keep their K and V fragments in registers (16 + 16 at hd 64); above,
// they read them from shared memory per chunk (at hd 128, 64 more registers next to the 128
// accumulators would spill). Other head dims: (6·64·(hd + 8)·2 + 1,536) and (4·64·(hd + 8)·2 + 304)
// (kernels/attention_mma_blocks.h). dK/dV at hd 128 is over the 99 KiB (101,376 bytes) a block may
// have on sm_86 and sm_89: there it runs with swizzled rows (99,840 bytes), the same products in the
// same order (the same bits), for 14% more instructions per interior tile pair in the sm_80 code
// those GPUs run (961 against 840; 1,043 against 869 at sm_90: the lanes' swizzled column offsets
// are recomputed per chunk, and written out the chunks spill there; model/attention_sass.h).
#pragma once

#include "kernels/attention_mma_blocks.h"
#include "kernels/attention_mma_split.cuh"
#include "kernels/attention_window.cuh"
#include "kernels/common.cuh"
#include "kernels/mma.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

namespace pv {

// The head dims with a tensor-core backward: multiples of 16 from 32 to 128, one instantiation
// each. (16 would work too; no model has it, and the tests' tiny models, which do, run faster in
// the host emulation on the CUDA-core kernels.)
inline bool attention_mma_backward_supports(int hd) { return hd % 16 == 0 && hd >= 32 && hd <= 128; }

// Elements per shared row (kernels/attention_mma_blocks.h: tiles, threads, shared memory per block),
// and whether HD has a swizzled dK/dV kernel: constants the device code can read (the header's
// functions are host code).
template <int HD, AttentionMmaRows Rows>
inline constexpr int kAttentionMmaLd = attention_mma_row_elements(HD, Rows);
template <int HD>
inline constexpr bool kAttentionMmaDkvHasSwizzled = attention_mma_dkv_has_swizzled(HD);
template <int RT>
inline constexpr int kAttentionMmaThreadsOf = attention_mma_threads(RT);
template <int HD, int RT>
inline constexpr bool kAttentionMmaHasRowTiles = attention_mma_has_row_tiles(HD, RT);
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded>
__host__ __device__ constexpr int attention_mma_ld() {
    return kAttentionMmaLd<HD, Rows>;
}
static_assert(sizeof(__nv_bfloat16) == 2, "attention_mma_blocks.h counts bf16 elements of 2 bytes");

// Copies rows [row0, row0 + 64) of a global bf16 matrix (row stride `stride` elements, HD wide,
// 16-byte aligned) into a shared [64][HD] tile laid out as Rows says with cp.async, zero-filling
// the rows at or past `limit` (their source is never read). Every thread of the block (Threads of
// them) issues its share; the caller commits and waits.
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded, int Threads = kAttentionMmaThreads>
__device__ inline void attention_mma_load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, long long stride, int row0,
                                               int limit) {
    cp_async_rows<HD, kAttentionMmaTile, attention_mma_ld<HD, Rows>(), Threads, Rows == AttentionMmaRows::swizzled>(
        dst, src, stride, row0, limit);
}

// The address of piece p ∈ {0, 1} (columns col0 + 8p .. + 7) of row row0 + r (r < 16) of a shared
// tile, for a 16×16 block at (row0, col0): row0 a multiple of 8 and col0 of 16, as every block of
// these kernels is. Swizzled (shared_piece), piece col0/8 + p of a row ≡ r (mod 8) lies at
// (col0/8 + p) ^ (r % 8) = (col0/8) ^ (p ^ r % 8), col0/8 being even. Written as
// (col0 & ~63) + ((col0 & 63) ^ 8·(p ^ r % 8)), the lane's part takes 4 values per kind of read
// across a row of 128 columns, not 8 (with the XOR of the whole col0, ptxas spilled at hd 128 for
// sm_90).
template <int HD, AttentionMmaRows Rows>
__device__ inline const __nv_bfloat16* attention_mma_piece(const __nv_bfloat16* tile, int row0, int col0, int r,
                                                           int p) {
    constexpr int LD = attention_mma_ld<HD, Rows>();
    if constexpr (Rows == AttentionMmaRows::padded)
        return tile + (row0 + r) * LD + col0 + 8 * p;
    else
        return tile + (row0 + r) * LD + (col0 & ~63) + ((col0 & 63) ^ (8 * (p ^ (r & 7))));
}

// The shared-memory row of this lane's ldmatrix_x4 address for a 16×16 block at (row0, col0) of a
// tile. Matrix m = lane / 8 gets row lane % 8 of its 8×8 block.
//  - "rows then cols" (m → rows 8·(m%2), cols 8·(m/2)): an A fragment of a row-major 16×16 block,
//    and with .trans the B fragments (two n-tiles) of a k-major [k][n] block.
//  - "cols then rows" (m → rows 8·(m/2), cols 8·(m%2)): the B fragments (two n-tiles) of an
//    n-major [n][k] block without .trans.
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded>
__device__ inline const __nv_bfloat16* attention_mma_rows_then_cols(const __nv_bfloat16* tile, int row0, int col0) {
    const int lane = int(threadIdx.x) % 32;
    return attention_mma_piece<HD, Rows>(tile, row0, col0, (lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4);
}
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded>
__device__ inline const __nv_bfloat16* attention_mma_cols_then_rows(const __nv_bfloat16* tile, int row0, int col0) {
    const int lane = int(threadIdx.x) % 32;
    return attention_mma_piece<HD, Rows>(tile, row0, col0, (lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1);
}

// c0 += A·B0 and c1 += A·B1: one A fragment (16×16) against the two n-tiles of the B fragments one
// ldmatrix_x4 gave (b[0..1] the first, b[2..3] the second).
__device__ inline void attention_mma_two_tiles(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[4]) {
    const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    mma_m16n8k16_bf16(c0, a, b0, c0);
    mma_m16n8k16_bf16(c1, a, b1, c1);
}

// acc[n-tile] += A·B, A the 16×16 operand of two m16n8 C fragments side by side (columns 0–7 and
// 8–15: P or dS, kernels/mma.cuh accumulators_to_a_bf16), over one 16-row chunk of a k-major tile
// [k][HD]: the B fragments of n-tiles 2p and 2p+1 (columns 16p..16p+15) come from one
// ldmatrix_x4_trans. The second form does it for RT row tiles' A at once, each B fragment feeding all.
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded>
__device__ inline void attention_mma_accumulate(float (&acc)[HD / 8][4], const float (&c)[2][4],
                                                const __nv_bfloat16* tile, int k0) {
    uint32_t a[4];
    accumulators_to_a_bf16(c[0], c[1], a);
    for (int p = 0; p < HD / 16; ++p) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, attention_mma_rows_then_cols<HD, Rows>(tile, k0, 16 * p));
        attention_mma_two_tiles(acc[2 * p], acc[2 * p + 1], a, b);
    }
}
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded, int RT>
__device__ inline void attention_mma_accumulate(float (&acc)[RT][HD / 8][4], const float (&c)[RT][2][4],
                                                const __nv_bfloat16* tile, int k0) {
    uint32_t a[RT][4];
    for (int rt = 0; rt < RT; ++rt) accumulators_to_a_bf16(c[rt][0], c[rt][1], a[rt]);
    for (int p = 0; p < HD / 16; ++p) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, attention_mma_rows_then_cols<HD, Rows>(tile, k0, 16 * p));
        for (int rt = 0; rt < RT; ++rt) attention_mma_two_tiles(acc[rt][2 * p], acc[rt][2 * p + 1], a[rt], b);
    }
}

// c[2] += A·Bᵀ for k-step ks (head dims 16·ks..16·ks+15) where B's 16 rows (the chunk's two
// n-tiles) start at row r0 of an n-major tile [rows][HD]. The second form for RT row tiles' A.
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded>
__device__ inline void attention_mma_score_step(float (&c)[2][4], const uint32_t (&a)[4], const __nv_bfloat16* tile,
                                                int r0, int ks) {
    uint32_t b[4];
    ldmatrix_x4(b, attention_mma_cols_then_rows<HD, Rows>(tile, r0, 16 * ks));
    attention_mma_two_tiles(c[0], c[1], a, b);
}
template <int HD, AttentionMmaRows Rows = AttentionMmaRows::padded, int RT>
__device__ inline void attention_mma_score_step(float (&c)[RT][2][4], const uint32_t (&a)[RT][4],
                                                const __nv_bfloat16* tile, int r0, int ks) {
    uint32_t b[4];
    ldmatrix_x4(b, attention_mma_cols_then_rows<HD, Rows>(tile, r0, 16 * ks));
    for (int rt = 0; rt < RT; ++rt) attention_mma_two_tiles(c[rt][0], c[rt][1], a[rt], b);
}

// Stores a warp's 16 accumulator rows × HD (C fragments, scaled, rounded to bf16 in pairs) to
// rows row0 + {g, g + 8} of a global matrix (row stride `stride`), skipping rows at or past T.
template <int HD>
__device__ inline void attention_mma_store_rows(__nv_bfloat16* dst, long long stride, int row0, int T_len,
                                                const float (&acc)[HD / 8][4], float scale) {
    const int lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;
    for (int half = 0; half < 2; ++half) {
        const int row = row0 + g + 8 * half;
        if (row >= T_len) continue;
        __nv_bfloat16* out = dst + row * stride + 2 * t;
        for (int n = 0; n < HD / 8; ++n)
            *reinterpret_cast<__nv_bfloat162*>(out + 8 * n) =
                __floats2bfloat162_rn(scale * acc[n][2 * half], scale * acc[n][2 * half + 1]);
    }
}

// Calls chunk(c0, tag) for the tile's four chunks of 16 rows, c0 = 0, 16, 32, 48: a loop, or with
// kUnroll written out (a fold; no pragma, so the host compiler runs the same code). Written out,
// each chunk's shared-memory addresses are constant offsets from registers set once a tile, and the
// compiler may keep operands that do not depend on the chunk (the dK/dV kernel's K and V fragments)
// across all four: fewer instructions, more registers.
template <bool kUnroll, class Chunk, class Tag>
__device__ inline void attention_mma_chunks(Chunk&& chunk, Tag tag) {
    if constexpr (kUnroll) {
        const auto each = [&]<int... C>(std::integer_sequence<int, C...>) { (chunk(16 * C, tag), ...); };
        each(std::make_integer_sequence<int, kAttentionMmaTile / 16>{});
    } else {
        for (int c0 = 0; c0 < kAttentionMmaTile; c0 += 16) chunk(c0, tag);
    }
}

// ---- dK, dV ------------------------------------------------------------------------------------

// Block (KV head, batch, key tile), or with kSplit (KV head, batch, segment of a key tile's steps:
// segment_steps, partial, partial_slots as attention_mma_backward_launch says), 4 warps; warp w
// owns key rows k0 + 16w .. + 15 — or with RT = 2 (hd 64 on an H100: attention_mma_dkv_row_tiles)
// 2 warps, warp w key rows k0 + 32w .. + 31, two 16-key tiles whose products share each Q and dO
// fragment (plain and transposed) and each row's lse and D. Shared: K, V,
// Q[2], dO[2] [64][LD] (bf16, rows as Rows says), then lse[2][64], D[2][64] (float), lo[2][64] (int).
// Path: 0 (what programs run) picks each tile pair's body; 1 and 2 compile only the interior or
// only the masked body, for bench/sass/attention_variants.cu alone (bench/attention_sass.py counts
// them: a loop with two bodies is hard to read from SASS). Both row layouts compute the same
// products in the same order: their results are the same bits.
template <int HD, int Path = 0, AttentionMmaRows Rows = AttentionMmaRows::padded, bool kSplit = false, int RT = 1>
__global__ void __launch_bounds__(kAttentionMmaThreadsOf<RT>)
    attention_mma_dkv_kernel(const __nv_bfloat16* qkv, const int* positions, const __nv_bfloat16* dout,
                             const float* lse, const float* D, __nv_bfloat16* dqkv, int T_len, int H, int Hkv,
                             int segment_steps, float* partial, int partial_slots) {
    using bf16 = __nv_bfloat16;
    constexpr int Bt = kAttentionMmaTile, LD = attention_mma_ld<HD, Rows>(), KS = HD / 16;
    static_assert(Rows == AttentionMmaRows::padded || kAttentionMmaDkvHasSwizzled<HD>,
                  "no swizzled dK/dV at this head dim");
    static_assert(kAttentionMmaHasRowTiles<HD, RT>, "no dK/dV kernel with these row tiles a warp");
    constexpr int Threads = kAttentionMmaThreadsOf<RT>;
    // The warp's K and V fragments held through the loop up to hd 64 with 16 keys a warp; with 32
    // they and the doubled accumulators spill (152 bytes stored at hd 64), so they are read per chunk.
    constexpr bool kKvInRegisters = HD <= 64 && RT == 1;
    // The interior body's chunks written out (attention_mma_chunks) where ptxas then keeps the blocks
    // per SM and spills nothing: at hd 64, 640 → 547 instructions per tile pair, 168 registers either
    // way. At hd 80 it took 243 registers (3 blocks per SM → 2), at 112 and 128 it spilled, and with
    // 32 keys a warp at hd 64 it spilled too (200 bytes stored).
    constexpr bool kUnrollInterior = (HD <= 64 || HD == 96) && RT == 1;
    const int kvh = blockIdx.x, b = blockIdx.y, group = H / Hkv, n = (T_len + Bt - 1) / Bt;
    // This block's key tile and segment of its steps (key tile 0 first, the heaviest). Its partial
    // slot is worked out again at the end, rather than held through the loop.
    const AttentionMmaSplitBlock block =
        kSplit ? attention_mma_split_block(int(blockIdx.z), n, group, segment_steps) : AttentionMmaSplitBlock{};
    const int k0 = (kSplit ? block.z : int(blockIdx.z)) * Bt, segment = block.segment;
    const long long stride = (long long)(H + 2 * Hkv) * HD, dstride = (long long)H * HD;
    const bf16* rows = qkv + (long long)b * T_len * stride;
    const bf16* drows = dout + (long long)b * T_len * dstride;
    const int* pos = positions ? positions + (long long)b * T_len : nullptr;
    const float scale = 1.0f / sqrtf(float(HD)), scale_log2 = kLog2e * scale;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;

    PV_DYNAMIC_SHARED(bf16, Ks);
    bf16* Vs = Ks + Bt * LD;
    bf16* Qs = Vs + Bt * LD;                                     // [2][Bt][LD]
    bf16* dOs = Qs + 2 * Bt * LD;                                // [2][Bt][LD]
    float* lse_s = reinterpret_cast<float*>(dOs + 2 * Bt * LD);  // [2][Bt]
    float* D_s = lse_s + 2 * Bt;                                 // [2][Bt]
    int* lo_s = reinterpret_cast<int*>(D_s + 2 * Bt);            // [2][Bt]

    // Query rows k0 ≤ i < q_end can see a key of the tile (j ≤ i: none before the diagonal).
    const int q_end = pos ? attention_last_query(pos, min(k0 + Bt, T_len) - 1, T_len, lo_s) + 1 : T_len;
    const int q_first = k0 / Bt, q_tiles = (q_end - 1) / Bt + 1 - q_first;
    // (query head, query tile) pairs, heads outer: a fixed order. A segment takes steps
    // [segment·L, segment·L + L) of them (documents may leave a trailing segment none).
    const int all_steps = group * q_tiles, step0 = kSplit ? segment * segment_steps : 0;
    const int steps = kSplit ? min(segment_steps, all_steps - step0) : all_steps;
    const int q_begin = q_first * Bt, q_stop = q_begin + q_tiles * Bt;

    // The steps in order: query tiles q_begin, q_begin + Bt, .. of query head kvh·group, then of the
    // next head. A step is its head's row offset (h·HD in qkv and dout, h·T_len in lse and D) and
    // its tile's first row, advanced by additions: no division in the loop.
    struct Step {
        long long head_col, head_row;  // h·HD, (b·H + h)·T_len
        int q0;
    };
    const auto next_step = [&](Step st) {
        st.q0 += Bt;
        if (st.q0 == q_stop) st.q0 = q_begin, st.head_col += HD, st.head_row += T_len;
        return st;
    };
    // A step's statistics, one row per thread (threads r < Bt): its row's lse, D and first key,
    // loaded into registers a step before they are stored, so the loads' latency passes behind a
    // step's compute instead of stalling the warps that issue them (a load and its store in one
    // place made warps 0 and 1 wait for memory every step).
    static_assert(Bt <= Threads, "one statistics row per thread at most");
    const int stat_row = int(threadIdx.x);
    float lse_next = 0.0f, D_next = 0.0f;
    int lo_next = 0;
    const auto load_statistics = [&](const Step& st) {
        const int i = st.q0 + stat_row;
        if (stat_row < Bt && i < T_len) {
            const long long at = st.head_row + i;
            lse_next = lse[at], D_next = D[at], lo_next = attention_first_key(pos, i);
        } else {  // rows at or past T: zeros (P = 1, dS = 0 against their zero-filled Q and dO)
            lse_next = 0.0f, D_next = 0.0f, lo_next = 0;
        }
    };
    const auto store_statistics = [&](int buf) {
        if (stat_row < Bt) {
            lse_s[buf * Bt + stat_row] = kLog2e * lse_next;  // base 2: P = 2^(c·s − log2e·lse)
            D_s[buf * Bt + stat_row] = D_next;
            lo_s[buf * Bt + stat_row] = lo_next;
        }
    };
    // Loads step st's Q and dO tiles into `buf` (cp.async).
    auto prefetch = [&](const Step& st, int buf) {
        attention_mma_load_tile<HD, Rows, Threads>(Qs + buf * Bt * LD, rows + st.head_col, stride, st.q0, T_len);
        attention_mma_load_tile<HD, Rows, Threads>(dOs + buf * Bt * LD, drows + st.head_col, dstride, st.q0, T_len);
    };
    // The first step: head step0 / q_tiles of the group, its query tile step0 % q_tiles (one division
    // a block, outside the loop).
    const int h_first = kvh * group + (kSplit && steps > 0 ? step0 / q_tiles : 0);
    Step now{(long long)h_first * HD, ((long long)b * H + h_first) * T_len,
             q_begin + (kSplit && steps > 0 ? step0 % q_tiles : 0) * Bt};
    Step ahead = next_step(now);  // the step prefetch loads next
    if (!kSplit || steps > 0) {   // (an empty segment loads nothing and writes zeros)
        attention_mma_load_tile<HD, Rows, Threads>(Ks, rows + (long long)(H + kvh) * HD, stride, k0, T_len);
        attention_mma_load_tile<HD, Rows, Threads>(Vs, rows + (long long)(H + Hkv + kvh) * HD, stride, k0, T_len);
        prefetch(now, 0);
        cp_async_commit();
        load_statistics(now);
        store_statistics(0);
        if (steps > 1) load_statistics(ahead);  // in registers until step 0 stores them into buffer 1
    }

    // The warp's key rows: j = k0 + kw + 16·rt + g + 8·half for row tile rt's accumulator elements
    // 2·half + {0, 1}.
    const int kw = 16 * RT * warp, j0 = k0 + kw + g;
    uint32_t k_frag[kKvInRegisters ? KS : 1][4], v_frag[kKvInRegisters ? KS : 1][4];
    float dk[RT][HD / 8][4] = {}, dv[RT][HD / 8][4] = {};

    for (int s = 0; s < steps; ++s) {
        const int buf = s & 1, q0 = now.q0;
        if (s + 1 < steps) {  // the next step's tiles load while this one computes
            prefetch(ahead, buf ^ 1);
            store_statistics(buf ^ 1);  // step s + 1's, loaded during step s − 1 (or before the loop)
            ahead = next_step(ahead);
            if (s + 2 < steps) load_statistics(ahead);  // step s + 2's, stored at step s + 1
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // this step's tiles (and K, V at the first) are visible to every warp
        if constexpr (kKvInRegisters)
            if (s == 0)
                for (int ks = 0; ks < KS; ++ks) {
                    ldmatrix_x4(k_frag[ks], attention_mma_rows_then_cols<HD, Rows>(Ks, kw, 16 * ks));
                    ldmatrix_x4(v_frag[ks], attention_mma_rows_then_cols<HD, Rows>(Vs, kw, 16 * ks));
                }
        const bf16* Q = Qs + buf * Bt * LD;
        const bf16* dO = dOs + buf * Bt * LD;
        const float* lse_b = lse_s + buf * Bt;
        const float* D_b = D_s + buf * Bt;
        const int* lo_b = lo_s + buf * Bt;

        // One chunk of 16 query rows (columns of Sᵀ) against the warp's 16·RT keys. Masked: bit
        // 8·rt + 4·nt + 2·half + e of `in` says whether element (row tile rt, n-tile nt, 2·half + e),
        // key j0 + 16·rt + 8·half against query row q0 + c0 + 8·nt + 2t + e, is in its row's window;
        // a chunk the warp sees none of is skipped. Interior chunks have no such test.
        const auto chunk = [&](int c0, auto masked_tag) {
            constexpr bool kMasked = decltype(masked_tag)::value;
            unsigned in = ~0u;
            if constexpr (kMasked) {
                in = 0;
                for (int nt = 0; nt < 2; ++nt)
                    for (int e = 0; e < 2; ++e) {
                        const int r = c0 + 8 * nt + 2 * t + e, i = q0 + r, lo = lo_b[r];
                        for (int rt = 0; rt < RT; ++rt)
                            for (int half = 0; half < 2; ++half) {
                                const int j = j0 + 16 * rt + 8 * half;
                                in |= unsigned(i < T_len && lo <= j && j <= i) << (8 * rt + 4 * nt + 2 * half + e);
                            }
                    }
                if (!__any_sync(0xffffffffu, in != 0)) return;  // the whole 16×16 chunk is masked for this warp
            }
            float st[RT][2][4] = {}, dpt[RT][2][4] = {};  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, per row tile
            for (int ks = 0; ks < KS; ++ks) {
                uint32_t ka[RT][4], va[RT][4];
                for (int rt = 0; rt < RT; ++rt) {
                    if constexpr (kKvInRegisters) {
                        for (int x = 0; x < 4; ++x) ka[rt][x] = k_frag[ks][x], va[rt][x] = v_frag[ks][x];
                    } else {
                        ldmatrix_x4(ka[rt], attention_mma_rows_then_cols<HD, Rows>(Ks, kw + 16 * rt, 16 * ks));
                        ldmatrix_x4(va[rt], attention_mma_rows_then_cols<HD, Rows>(Vs, kw + 16 * rt, 16 * ks));
                    }
                }
                if constexpr (RT == 1) {  // (the 16-key kernel's code as it was: ptxas schedules it alike)
                    attention_mma_score_step<HD, Rows>(st[0], ka[0], Q, c0, ks);
                    attention_mma_score_step<HD, Rows>(dpt[0], va[0], dO, c0, ks);
                } else {  // each B fragment feeds every row tile
                    attention_mma_score_step<HD, Rows, RT>(st, ka, Q, c0, ks);
                    attention_mma_score_step<HD, Rows, RT>(dpt, va, dO, c0, ks);
                }
            }
            // Pᵀ and dSᵀ in place: one FFMA and one MUFU.EX2 per P, then (masked) a select: a masked
            // element's P and so its dS exact zeros (its exponent, computed anyway, may be anything).
            for (int nt = 0; nt < 2; ++nt)
                for (int x = 0; x < 4; ++x) {
                    const int r = c0 + 8 * nt + 2 * t + (x & 1);
                    for (int rt = 0; rt < RT; ++rt) {  // (row r's lse and D read once for all)
                        float p = exp2_ftz(fmaf(st[rt][nt][x], scale_log2, -lse_b[r]));
                        if constexpr (kMasked) p = in >> (8 * rt + 4 * nt + x) & 1 ? p : 0.0f;
                        st[rt][nt][x] = p;
                        dpt[rt][nt][x] = p * (dpt[rt][nt][x] - D_b[r]);
                    }
                }
            if constexpr (RT == 1) {
                attention_mma_accumulate<HD, Rows>(dv[0], st[0], dO, c0);  // dV += Pᵀ·dO
                attention_mma_accumulate<HD, Rows>(dk[0], dpt[0], Q, c0);  // dK += dSᵀ·Q
            } else {
                attention_mma_accumulate<HD, Rows, RT>(dv, st, dO, c0);
                attention_mma_accumulate<HD, Rows, RT>(dk, dpt, Q, c0);
            }
        };
        // Interior: every row of the query tile sees all of the warp's keys (causal: every query
        // tile past the diagonal's) ... Rows at or past T need no mask: their Q and dO rows are
        // zero-filled and their lse and D zeros, so P = 1 and dS = 0 there, and Pᵀ·dO and dSᵀ·Q add
        // exact zeros.
        bool interior = q0 >= k0 + kw + 16 * RT - 1;
        if (pos && interior) {  // ... and no row's window starts after the warp's first key
            int lo_max = max(lo_b[lane], lo_b[lane + 32]);
            for (int offset = 16; offset > 0; offset /= 2)
                lo_max = max(lo_max, __shfl_xor_sync(0xffffffffu, lo_max, offset));
            interior = lo_max <= k0 + kw;
        }
        if (Path == 1 || (Path == 0 && interior))
            attention_mma_chunks<kUnrollInterior>(chunk, std::false_type{});
        else
            attention_mma_chunks<false>(chunk, std::true_type{});
        __syncthreads();  // every warp is done with this buffer before step s + 2's copies land in it
        now = next_step(now);
    }

    if (const int slot = kSplit ? attention_mma_split_block(int(blockIdx.z), n, group, segment_steps).slot : -1;
        slot >= 0) {
        // A split key tile: this segment's sums, unscaled, for the reduce kernel.
        const long long grid_rows = (long long)gridDim.y * Hkv, row = (long long)b * Hkv + kvh;
        for (int rt = 0; rt < RT; ++rt) {
            attention_mma_store_partial<HD>(
                attention_mma_partial_tile<HD>(partial, 0, grid_rows, row, partial_slots, slot), kw + 16 * rt,
                T_len - k0, dk[rt]);
            attention_mma_store_partial<HD>(
                attention_mma_partial_tile<HD>(partial, 1, grid_rows, row, partial_slots, slot), kw + 16 * rt,
                T_len - k0, dv[rt]);
        }
    } else {
        bf16* out = dqkv + (long long)b * T_len * stride;
        for (int rt = 0; rt < RT; ++rt) {
            attention_mma_store_rows<HD>(out + (long long)(H + kvh) * HD, stride, k0 + kw + 16 * rt, T_len, dk[rt],
                                         scale);
            attention_mma_store_rows<HD>(out + (long long)(H + Hkv + kvh) * HD, stride, k0 + kw + 16 * rt, T_len,
                                         dv[rt], 1.0f);
        }
    }
}

// The split tiles' sums (attention_mma_blocks.h): block (z, head, batch) adds tile z's segments'
// partials in segment order for each output, scales dK or dQ by 1/sqrt(hd), rounds to bf16 and
// stores the rows before T. dK/dV (kDq false): key tile z of KV head blockIdx.y, dK and dV; dQ: query
// tile n − 1 − z of query head blockIdx.y. A thread takes 4 consecutive columns of a row at a time
// (16-byte loads).
template <int HD, bool kDq>
__global__ void __launch_bounds__(kAttentionMmaThreads)
    attention_mma_reduce_kernel(const float* partial, __nv_bfloat16* dqkv, int T_len, int H, int Hkv, int segment_steps,
                                int partial_slots) {
    constexpr int Bt = kAttentionMmaTile, kOutputs = kDq ? 1 : 2;
    const int z = blockIdx.x, head = blockIdx.y, b = blockIdx.z, n = (T_len + Bt - 1) / Bt;
    const int heads = kDq ? H : Hkv, group = kDq ? 1 : H / Hkv;
    const AttentionMmaSplitTile tile = attention_mma_split_tile(z, n, group, segment_steps);
    const int segments = tile.segments, first_slot = tile.first_slot, row0 = (kDq ? n - 1 - z : z) * Bt;
    const long long grid_rows = (long long)gridDim.z * heads, row = (long long)b * heads + head;
    const long long stride = (long long)(H + 2 * Hkv) * HD;
    __nv_bfloat16* out = dqkv + (long long)b * T_len * stride + (long long)(kDq ? head : H + head) * HD;
    const float scale = 1.0f / sqrtf(float(HD));
    for (int e = 4 * int(threadIdx.x); e < kOutputs * Bt * HD; e += 4 * kAttentionMmaThreads) {
        const int output = e / (Bt * HD), at = e % (Bt * HD), r = row0 + at / HD;
        if (r >= T_len) continue;
        const float* p =
            attention_mma_partial_tile<HD>(partial, output, grid_rows, row, partial_slots, first_slot) + at;
        float4 sum = *reinterpret_cast<const float4*>(p);
        for (int s = 1; s < segments; ++s) {
            const float4 x = *reinterpret_cast<const float4*>(p + (long long)s * Bt * HD);
            sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
        }
        const float k = output == 0 ? scale : 1.0f;  // dK, dQ scaled; dV not
        __nv_bfloat16* o = out + r * stride + (long long)output * Hkv * HD + at % HD;
        *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(k * sum.x, k * sum.y);
        *reinterpret_cast<__nv_bfloat162*>(o + 2) = __floats2bfloat162_rn(k * sum.z, k * sum.w);
    }
}

// ---- dQ ----------------------------------------------------------------------------------------

// Block (query head, batch, query tile), or with kSplit (query head, batch, segment of a query tile's
// key tiles: segment_steps, partial, partial_slots as attention_mma_backward_launch says),
// attention_mma_threads(RT) threads: warp w owns query rows q0 + WR·w .. + WR − 1 (WR = 16·RT: 4 warps
// of 16 rows, or with RT = 2 two of 32, each K and V fragment feeding both 16-row tiles), their Q and
// dO fragments in registers. Shared: K[2], V[2] [64][HD + 8] (bf16), then ints: each warp's smallest
// lo [4], its interior key tiles' range [4][2] and the rows' lo [64] (read per tile and per masked
// chunk, not held: the registers are short). Each row's sums are the same products in the same order
// whatever RT: the same bits.
template <int HD, int Path = 0, bool kSplit = false, int RT = 1>  // Path as in the dK/dV kernel
__global__ void __launch_bounds__(kAttentionMmaThreadsOf<RT>)
    attention_mma_dq_kernel(const __nv_bfloat16* qkv, const int* positions, const __nv_bfloat16* dout, const float* lse,
                            const float* D, __nv_bfloat16* dqkv, int T_len, int H, int Hkv, int segment_steps,
                            float* partial, int partial_slots) {
    using bf16 = __nv_bfloat16;
    static_assert(kAttentionMmaHasRowTiles<HD, RT>, "warps of 32 rows: hd 64 alone (attention_mma_blocks.h)");
    constexpr int Bt = kAttentionMmaTile, LD = attention_mma_ld<HD>(), KS = HD / 16;
    constexpr int kThreads = kAttentionMmaThreadsOf<RT>, WR = 16 * RT;
    constexpr AttentionMmaRows kPadded = AttentionMmaRows::padded;
    // The interior body's chunks written out (attention_mma_chunks) at every head dim but 112, where
    // ptxas then spilled: at hd 128, 610 → 561 instructions per tile pair (222 → 255 registers, 2 blocks
    // per SM either way); at hd 64, 386 → 375. With 32 rows a warp they spill (60 bytes stored, 52
    // loaded at hd 64): a loop.
    constexpr bool kUnrollInterior = HD != 112 && RT == 1;
    const int h = blockIdx.x, b = blockIdx.y, n = (T_len + Bt - 1) / Bt;
    // This block's query tile (the last first: the heaviest) and segment of its key tiles; its partial
    // slot is worked out again at the end, rather than held through the loop.
    const AttentionMmaSplitBlock block = kSplit ? attention_mma_split_block(int(blockIdx.z), n, 1, segment_steps)
                                                : AttentionMmaSplitBlock{int(blockIdx.z), 0, -1};
    const int q0 = (n - 1 - block.z) * Bt;
    const int kvh = h / (H / Hkv);
    const long long stride = (long long)(H + 2 * Hkv) * HD, dstride = (long long)H * HD;
    const bf16* rows = qkv + (long long)b * T_len * stride;
    const bf16* k_src = rows + (long long)(H + kvh) * HD;
    const bf16* v_src = rows + (long long)(H + Hkv + kvh) * HD;
    const int* pos = positions ? positions + (long long)b * T_len : nullptr;
    const float scale = 1.0f / sqrtf(float(HD)), scale_log2 = kLog2e * scale;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;

    PV_DYNAMIC_SHARED(bf16, Ks);                               // [2][Bt][LD]
    bf16* Vs = Ks + 2 * Bt * LD;                               // [2][Bt][LD]
    int* lo_min_s = reinterpret_cast<int*>(Vs + 2 * Bt * LD);  // [4]
    int* interior_s = lo_min_s + 4;                            // [4][2]
    int* lo_s = interior_s + 8;                                // [64]

    // The warp's query rows i = q0 + WR·warp + 16·rt + g + 8·half, with their lse (base 2: P = 2^(c·s −
    // log2e·lse)), D and first key.
    const int qw = WR * warp;
    float lse_r[RT][2], D_r[RT][2];
    int lo_min = T_len;  // the smallest first key over the block's rows below T
    int lo_max = 0;      // the largest over the warp's rows
    for (int rt = 0; rt < RT; ++rt)
        for (int half = 0; half < 2; ++half) {
            const int r = qw + 16 * rt + g + 8 * half, i = q0 + r;
            const long long at = ((long long)b * H + h) * T_len + i;
            lse_r[rt][half] = i < T_len ? kLog2e * lse[at] : 0.0f;
            D_r[rt][half] = i < T_len ? D[at] : 0.0f;
            const int lo = i < T_len ? attention_first_key(pos, i) : 0;
            if (t == 0) lo_s[r] = lo;
            if (i < T_len) lo_min = min(lo_min, lo);
            lo_max = max(lo_max, lo);
        }
    for (int offset = 16; offset > 0; offset /= 2) {
        lo_min = min(lo_min, __shfl_xor_sync(0xffffffffu, lo_min, offset));
        lo_max = max(lo_max, __shfl_xor_sync(0xffffffffu, lo_max, offset));
    }
    // Key tiles every row of the warp sees whole are interior: lo_max .. its first row. (Rows at or
    // past T, if the warp has any, need no mask: their dQ rows are never written.) Read from shared
    // memory per tile: held in registers, they made ptxas spill at hd 80 and 128.
    if (lane == 0) lo_min_s[warp] = lo_min, interior_s[2 * warp] = lo_max, interior_s[2 * warp + 1] = q0 + qw;

    // Q and dO go through buffer 1 (free until the second key tile) into registers.
    attention_mma_load_tile<HD, kPadded, kThreads>(Ks + Bt * LD, rows + (long long)h * HD, stride, q0, T_len);
    attention_mma_load_tile<HD, kPadded, kThreads>(
        Vs + Bt * LD, dout + (long long)b * T_len * dstride + (long long)h * HD, dstride, q0, T_len);
    cp_async_commit();
    __syncthreads();  // lo_min_s, interior_s and lo_s written
    for (int w = 0; w < kThreads / 32; ++w) lo_min = min(lo_min, lo_min_s[w]);
    // Key tiles from the one holding the block's smallest lo up to the diagonal; split, those of them in
    // the segment's [segment·L, segment·L + L) (documents may leave a segment none: it writes zeros).
    int first = lo_min / Bt, last = (min(q0 + Bt, T_len) - 1) / Bt;
    if constexpr (kSplit)
        first = max(first, block.segment * segment_steps), last = min(last, (block.segment + 1) * segment_steps - 1);
    if (!kSplit || first <= last) {
        attention_mma_load_tile<HD, kPadded, kThreads>(Ks, k_src, stride, first * Bt, T_len);
        attention_mma_load_tile<HD, kPadded, kThreads>(Vs, v_src, stride, first * Bt, T_len);
    }
    cp_async_commit();
    cp_async_wait<1>();  // Q and dO landed (the first key tile may still be in flight)
    __syncthreads();
    uint32_t q_frag[KS][RT][4], do_frag[KS][RT][4];
    for (int ks = 0; ks < KS; ++ks)
        for (int rt = 0; rt < RT; ++rt) {
            ldmatrix_x4(q_frag[ks][rt], attention_mma_rows_then_cols<HD>(Ks + Bt * LD, qw + 16 * rt, 16 * ks));
            ldmatrix_x4(do_frag[ks][rt], attention_mma_rows_then_cols<HD>(Vs + Bt * LD, qw + 16 * rt, 16 * ks));
        }
    __syncthreads();  // every warp has its fragments before buffer 1 is overwritten

    float dq[RT][HD / 8][4] = {};
    for (int kt = first; kt <= last; ++kt) {
        const int buf = (kt - first) % 2, k0 = kt * Bt;
        if (kt < last) {  // the next key tile loads while this one computes
            attention_mma_load_tile<HD, kPadded, kThreads>(Ks + (1 - buf) * Bt * LD, k_src, stride, k0 + Bt, T_len);
            attention_mma_load_tile<HD, kPadded, kThreads>(Vs + (1 - buf) * Bt * LD, v_src, stride, k0 + Bt, T_len);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // this key tile is visible to every warp
        const bf16* K = Ks + buf * Bt * LD;
        const bf16* V = Vs + buf * Bt * LD;

        // One chunk of 16 keys (columns of S) against the warp's query rows; the mask as in the dK/dV
        // kernel (bit 8·rt + 4·nt + 2·half + e: row tile rt's row half against key k0 + c0 + 8·nt + 2t + e).
        const auto chunk = [&](int c0, auto masked_tag) {
            constexpr bool kMasked = decltype(masked_tag)::value;
            unsigned in = ~0u;
            if constexpr (kMasked) {
                in = 0;
                // The rows' first keys, read per chunk: volatile, so that the compiler does not hold
                // them across the tile (at hd 128 two more registers spill).
                const volatile int* lo_v = lo_s + qw + g;
                for (int rt = 0; rt < RT; ++rt) {
                    const int lo[2] = {lo_v[16 * rt], lo_v[16 * rt + 8]};
                    for (int nt = 0; nt < 2; ++nt)
                        for (int x = 0; x < 4; ++x) {
                            const int half = x >> 1, i = q0 + qw + 16 * rt + g + 8 * half;
                            const int j = k0 + c0 + 8 * nt + 2 * t + (x & 1);
                            in |= unsigned(i < T_len && lo[half] <= j && j <= i) << (8 * rt + 4 * nt + x);
                        }
                }
                if (!__any_sync(0xffffffffu, in != 0)) return;  // the whole chunk is masked for this warp
            }
            float s[RT][2][4] = {}, dp[RT][2][4] = {};  // S = Q·Kᵀ and dP = dO·Vᵀ
            for (int ks = 0; ks < KS; ++ks) {
                attention_mma_score_step<HD>(s, q_frag[ks], K, c0, ks);
                attention_mma_score_step<HD>(dp, do_frag[ks], V, c0, ks);
            }
            for (int rt = 0; rt < RT; ++rt)
                for (int nt = 0; nt < 2; ++nt)  // dS in place, as in the dK/dV kernel
                    for (int x = 0; x < 4; ++x) {
                        const int half = x >> 1;
                        float p = exp2_ftz(fmaf(s[rt][nt][x], scale_log2, -lse_r[rt][half]));
                        if constexpr (kMasked) p = in >> (8 * rt + 4 * nt + x) & 1 ? p : 0.0f;
                        dp[rt][nt][x] = p * (dp[rt][nt][x] - D_r[rt][half]);
                    }
            attention_mma_accumulate<HD>(dq, dp, K, c0);  // dQ += dS·K
        };
        if (Path == 1 || (Path == 0 && k0 >= interior_s[2 * warp] && k0 + Bt - 1 <= interior_s[2 * warp + 1]))
            attention_mma_chunks<kUnrollInterior>(chunk, std::false_type{});
        else
            attention_mma_chunks<false>(chunk, std::true_type{});
        __syncthreads();  // every warp is done with this buffer before the tile after next lands in it
    }

    const int slot = kSplit ? attention_mma_split_block(int(blockIdx.z), n, 1, segment_steps).slot : -1;
    for (int rt = 0; rt < RT; ++rt)
        if (slot >= 0)
            attention_mma_store_partial<HD>(attention_mma_partial_tile<HD>(partial, 0, (long long)gridDim.y * H,
                                                                           (long long)b * H + h, partial_slots, slot),
                                            qw + 16 * rt, T_len - q0, dq[rt]);  // unscaled, for the reduce kernel
        else
            attention_mma_store_rows<HD>(dqkv + (long long)b * T_len * stride + (long long)h * HD, stride,
                                         q0 + qw + 16 * rt, T_len, dq[rt], scale);
}

// ---- launcher ----------------------------------------------------------------------------------

// Whether the tensor-core backward can take these buffers: a supported head dim, every pointer
// 16-byte aligned (cp.async; the row strides then are too, multiples of 16 elements), and blocks
// whose shared memory the device allows (attention_mma_backward_fits).
inline bool attention_mma_backward_applies(const void* qkv, const void* dout, const void* dqkv, int hd) {
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return attention_mma_backward_supports(hd) && aligned(qkv) && aligned(dout) && aligned(dqkv) &&
           attention_mma_backward_fits(hd, device_shared_bytes_per_block());
}

// Launches `kernel` with `threads` a block and `smem` bytes of dynamic shared memory, opting in above
// 48 KiB.
template <class Kernel, class... Args>
void attention_mma_backward_run(Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, Args... args) {
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch(kernel, grid, dim3(unsigned(threads)), smem, stream, args...);
    CUDA_CHECK_LAUNCH();
}

// dqkv from qkv, positions (or null), dout, the forward's lse and D (the scratch the dot kernel
// filled): the dK/dV kernel with its shared rows laid out as dkv_rows says (swizzled only at the
// head dims attention_mma_dkv_has_swizzled names), then the dQ kernel, at head dim HD. Each splits
// its tiles into segments of at most split.dkv and split.dq steps (0: none; attention_mma_backward_split,
// head dims attention_mma_split_supports alone), whose partials go to `partial` and a reduce kernel
// sums after it: attention_mma_split_grid(n, group, L).partial_slots per (batch, KV head) of 64 x HD
// floats for dK, as many for dV; per (batch, query head) for dQ; attention_mma_partial_bytes holds
// the larger, reused. dK/dV's and dQ's warps own dkv_row_tiles and dq_row_tiles 16-row tiles each
// (attention_mma_dkv_row_tiles, attention_mma_dq_row_tiles: 2 at hd 64 alone; dK/dV's with padded
// rows).
template <int HD>
void attention_mma_backward_launch(const __nv_bfloat16* qkv, const int* positions, const __nv_bfloat16* dout,
                                   const float* lse, const float* D, __nv_bfloat16* dqkv, int B, int T_len, int H,
                                   int Hkv, cudaStream_t stream, AttentionMmaRows dkv_rows, AttentionMmaSplit split,
                                   float* partial, int dq_row_tiles, int dkv_row_tiles) {
    const auto refuse = [&](const char* kernel, int row_tiles, const char* rows) {
        std::fprintf(stderr,
                     "polevault: attention_mma_backward: no %s kernel with %d row tiles a warp at head dim %d%s\n",
                     kernel, row_tiles, HD, rows);
        std::abort();
    };
    if (!attention_mma_has_row_tiles(HD, dq_row_tiles)) refuse("dQ", dq_row_tiles, "");
    if (!attention_mma_has_row_tiles(HD, dkv_row_tiles)) refuse("dK/dV", dkv_row_tiles, "");
    if (dkv_row_tiles > 1 && dkv_rows != AttentionMmaRows::padded) refuse("dK/dV", dkv_row_tiles, " and swizzled rows");
    const int n = ceil_div(T_len, kAttentionMmaTile);
    const AttentionMmaSplitGrid dkv_grid = attention_mma_split_grid(n, H / Hkv, split.dkv),
                                dq_grid = attention_mma_split_grid(n, 1, split.dq);
    if ((split.dkv > 0 || split.dq > 0) && !attention_mma_split_supports(HD)) {
        std::fprintf(stderr, "polevault: attention_mma_backward: no split kernels at head dim %d\n", HD);
        std::abort();
    }
    if ((dkv_grid.partial_slots > 0 || dq_grid.partial_slots > 0) && !partial) {
        std::fprintf(stderr, "polevault: attention_mma_backward: the split needs its partials' scratch\n");
        std::abort();
    }
    const auto run = [&](auto kernel, dim3 grid, int threads, size_t smem, int L, const AttentionMmaSplitGrid& g) {
        attention_mma_backward_run(kernel, grid, threads, smem, stream, qkv, positions, dout, lse, D, dqkv, T_len, H,
                                   Hkv, L, partial, int(g.partial_slots));
    };
    const auto reduce = [&](auto kernel, int heads, int L, const AttentionMmaSplitGrid& g) {
        if (g.partial_slots > 0)
            attention_mma_backward_run(kernel, dim3(unsigned(g.split_tiles), heads, B), kAttentionMmaThreads, 0, stream,
                                       partial, dqkv, T_len, H, Hkv, L, int(g.partial_slots));
    };
    constexpr AttentionMmaRows kPadded = AttentionMmaRows::padded, kSwizzled = AttentionMmaRows::swizzled;
    constexpr bool kSplits = attention_mma_split_supports(HD);
    const dim3 dkv_dims(Hkv, B, unsigned(dkv_grid.blocks));
    const auto dkv = [&](auto rows_tag, auto row_tiles_tag) {
        constexpr AttentionMmaRows rows = decltype(rows_tag)::value;
        constexpr int RT = decltype(row_tiles_tag)::value;
        constexpr int threads = attention_mma_threads(RT);
        const size_t smem = attention_mma_dkv_smem_bytes(HD, rows);
        if constexpr (kSplits)
            if (split.dkv > 0)
                return run(attention_mma_dkv_kernel<HD, 0, rows, true, RT>, dkv_dims, threads, smem, split.dkv,
                           dkv_grid);
        run(attention_mma_dkv_kernel<HD, 0, rows, false, RT>, dkv_dims, threads, smem, split.dkv, dkv_grid);
    };
    using OneRowTile = std::integral_constant<int, 1>;
    if (dkv_rows == kPadded) {
        bool ran = false;
        if constexpr (attention_mma_has_row_tiles(HD, 2))
            if (dkv_row_tiles == 2)
                dkv(std::integral_constant<AttentionMmaRows, kPadded>{}, std::integral_constant<int, 2>{}), ran = true;
        if (!ran) dkv(std::integral_constant<AttentionMmaRows, kPadded>{}, OneRowTile{});
    } else if constexpr (attention_mma_dkv_has_swizzled(HD)) {
        dkv(std::integral_constant<AttentionMmaRows, kSwizzled>{}, OneRowTile{});
    } else {
        std::fprintf(stderr, "polevault: attention_mma_backward: no swizzled dK/dV kernel at head dim %d\n", HD);
        std::abort();
    }
    if constexpr (kSplits) reduce(attention_mma_reduce_kernel<HD, false>, Hkv, split.dkv, dkv_grid);
    const dim3 dq_dims(H, B, unsigned(dq_grid.blocks));
    const size_t dq_smem = attention_mma_dq_smem_bytes(HD);
    const auto dq = [&](auto row_tiles_tag) {
        constexpr int RT = decltype(row_tiles_tag)::value;
        constexpr int threads = attention_mma_threads(RT);
        if constexpr (kSplits)
            if (split.dq > 0) {
                run(attention_mma_dq_kernel<HD, 0, true, RT>, dq_dims, threads, dq_smem, split.dq, dq_grid);
                return reduce(attention_mma_reduce_kernel<HD, true>, H, split.dq, dq_grid);
            }
        run(attention_mma_dq_kernel<HD, 0, false, RT>, dq_dims, threads, dq_smem, split.dq, dq_grid);
    };
    if constexpr (attention_mma_has_row_tiles(HD, 2))
        if (dq_row_tiles == 2) return dq(std::integral_constant<int, 2>{});
    dq(std::integral_constant<int, 1>{});
}

// The same at a run-time head dim (attention_mma_backward_supports(hd)) with the dK/dV rows, the
// splits and dQ's and dK/dV's row tiles named.
inline void attention_mma_backward(const __nv_bfloat16* qkv, const int* positions, const __nv_bfloat16* dout,
                                   const float* lse, const float* D, __nv_bfloat16* dqkv, int B, int T_len, int H,
                                   int Hkv, int hd, cudaStream_t stream, AttentionMmaRows dkv_rows,
                                   AttentionMmaSplit split, float* partial, int dq_row_tiles, int dkv_row_tiles) {
    auto go = [&](auto hd_tag) {
        attention_mma_backward_launch<decltype(hd_tag)::value>(qkv, positions, dout, lse, D, dqkv, B, T_len, H, Hkv,
                                                               stream, dkv_rows, split, partial, dq_row_tiles,
                                                               dkv_row_tiles);
    };
    switch (hd) {
        case 32: return go(std::integral_constant<int, 32>{});
        case 48: return go(std::integral_constant<int, 48>{});
        case 64: return go(std::integral_constant<int, 64>{});
        case 80: return go(std::integral_constant<int, 80>{});
        case 96: return go(std::integral_constant<int, 96>{});
        case 112: return go(std::integral_constant<int, 112>{});
        case 128: return go(std::integral_constant<int, 128>{});
    }
    std::fprintf(stderr, "polevault: attention_mma_backward: head dim %d is not a multiple of 16 in [32, 128]\n", hd);
    std::abort();
}

// The same with the dK/dV rows and the row tiles the current device's shared memory gives
// (attention_mma_dkv_rows, attention_mma_dq_row_tiles, attention_mma_dkv_row_tiles) and the shape's splits
// (attention_mma_backward_split); `partial` holds attention_mma_partial_bytes(B, T_len, H, Hkv, hd).
inline void attention_mma_backward(const __nv_bfloat16* qkv, const int* positions, const __nv_bfloat16* dout,
                                   const float* lse, const float* D, __nv_bfloat16* dqkv, int B, int T_len, int H,
                                   int Hkv, int hd, cudaStream_t stream, float* partial) {
    const size_t shared = device_shared_bytes_per_block();
    attention_mma_backward(qkv, positions, dout, lse, D, dqkv, B, T_len, H, Hkv, hd, stream,
                           attention_mma_dkv_rows(hd, shared), attention_mma_backward_split(B, T_len, H, Hkv, hd),
                           partial, attention_mma_dq_row_tiles(hd, shared),
                           attention_mma_dkv_row_tiles(hd, shared, B, T_len, H, Hkv));
}

}  // namespace pv
