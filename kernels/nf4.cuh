// NF4: the 4-bit NormalFloat storage of frozen weights (QLoRA), bit for bit bitsandbytes'
// quantize_4bit(quant_type="nf4", blocksize=64) and dequantize_4bit, with and without double
// quantisation (compress_statistics).
//
// The format of ONE quantised tensor of n elements x[0..n) (its row-major flattening):
//   blocks        B = ceil(n / 64); block b holds x[64b, min(64b + 64, n)) (the last may be short).
//   absmax[b]     fp32 max |x| over block b (exact; inputs are converted to fp32 first: bf16
//                 exactly, fp64 rounded to nearest even, so an fp64 tensor is quantised as the fp32
//                 tensor it rounds to).
//   codes         ceil(n / 2) bytes; element 2i is the HIGH nibble of byte i, element 2i + 1 the
//                 low one. For odd n the last low nibble is 7: bitsandbytes quantises a 0 there.
//   code of x     s = x · fl(1 / absmax) in fp32 (a correctly rounded reciprocal, then a correctly
//                 rounded product: bitsandbytes' CUDA kernels and its CPU path for every block but
//                 a short last one); code = #{ i : s > t_i } over the 15 thresholds t_i of
//                 kNf4Thresholds, so s equal to a threshold takes the lower code. An all-zero
//                 block (absmax 0) gets code 7 (level 0.0) for every element.
//   value         kNf4Levels[code] · absmax in fp32, rounded once to the output type.
// Double quantisation (QLoRA's default) stores, in place of the B absmaxes:
//   offset        the fp32 mean of the B absmaxes, fl(fl(Σ absmax) / fl(B)) with fl(Σ) the
//                 correctly rounded sum (see "offset" below).
//   nested        N = ceil(B / 256) blocks of 256 absmaxes. With v[b] = fl(absmax[b] − offset):
//                 nested_absmax[k] = max |v| over nested block k (fp32), and absmax_codes[b] = the
//                 code of s = v[b] · fl(1 / nested_absmax[k]) in bitsandbytes' signed dynamic map
//                 (kNf4DynamicMap, create_dynamic_map(signed=True), 256 increasing values in
//                 (−1, 1]): the nearer of the two entries around s, judged against their fp32
//                 midpoint fl(a + b) · 0.5, a tie going to the even-indexed entry (nf4_dynamic_code).
//                 A nested block whose v are all 0 gets code 0 (as both bitsandbytes paths do),
//                 which dequantises to exactly the offset.
//   absmax'[b]    fl(fl(kNf4DynamicMap[absmax_codes[b]] · nested_absmax[k]) + offset): two
//                 roundings, never a fused multiply-add; used in place of absmax[b] by the value.
// Stored bytes: ceil(n/2) + 4B, 4.5 bits per parameter; with double quantisation
// ceil(n/2) + B + 4N + 4, 4 + 8/64 + 32/(64·256) = 4.127 bits per parameter for large n.
//
// Where bitsandbytes' CPU path and its CUDA kernels decide differently (read from its source,
// csrc/kernels.cu and backends/{default,cpu}, and found by test/interop/make_nf4_fixtures.py,
// which emulates the CUDA kernels), polevault follows the CUDA kernels, which made the
// checkpoints in the wild, except for the all-zero block, where CUDA's behaviour is a division
// by zero rather than a rule:
//   1. Thresholds. CUDA's decision tree compares s with 15 decimal literals, which the compiler
//      rounds to fp32; the CPU compares with (level[i] + level[i+1]) / 2 computed in fp32. For
//      thresholds 0, 8, 12 and 14 the two differ by one float, so exactly one value of s per
//      threshold gets codes one apart. Neither set is the exact nearest level everywhere (CUDA's
//      misses at thresholds 1, 3, 4, 8, the CPU's at 0, 1, 3, 4, 12, 14). polevault: CUDA's.
//   2. All-zero block. CPU: absmax clamped to 1e-38 for the reciprocal, s = 0, code 7. CUDA:
//      s = 0 · (1/0) = NaN, which its tree sends to code 0 (level −1.0); without double
//      quantisation that still dequantises to 0 (times absmax 0), with it to −absmax', not 0.
//      polevault: code 7, so the block dequantises to exactly 0 either way.
//   3. All-zero short last block: the CPU also stores the clamped absmax, 1e-38. polevault
//      (and CUDA): 0, the block's max |x|.
//   4. Short last block: the CPU computes s = x / absmax there, x · (1/absmax) elsewhere; the two
//      can differ by an ulp and so, at a threshold, by one code. polevault (and CUDA): x · (1/absmax).
//   5. Double quantisation's 8-bit search. CUDA: the binary search described above (nearest by
//      fp32 midpoints; it differs from the exact nearest entry only where s is exactly a midpoint
//      that fp32 rounded and the even entry is the farther one). CPU: s is rounded to a grid of
//      65536 points in [−1, 1] and looked up in a table, so codes within half a grid step of a
//      midpoint can be one off. polevault: CUDA's.
//   Not reproduced, as no other machine can: bitsandbytes builds its CUDA kernels with
//   --use_fast_math, so its 1.0f / absmax is the approximate reciprocal (within an ulp) and it
//   flushes denormal inputs to zero; polevault's arithmetic is IEEE (so are the CPU's and the
//   fixtures'). A pre-quantised checkpoint carries its own codes, so this only matters when
//   polevault quantises a weight itself.
//   The offset: torch's absmax.mean() on the CPU is a float32 sum (a vectorised cascade) divided
//   by the count; on every fixture and 300 random weight-like tensors it equalled the correctly rounded
//   sum divided by the count, which polevault computes: each thread sums its share in
//   double-double (≈106 bits, exact for any realistic spread of absmaxes), then one thread adds
//   the partials in a fixed order and rounds once to fp32 — so the result depends on neither the
//   order nor the device. (torch on CUDA sums in another order and multiplies by 1/count.)
// Non-finite inputs are outside the format (bitsandbytes does not define them either).
//
// Kernels (all deterministic: no atomics; every reduction in a fixed order):
// - nf4_quantize_kernel: one warp per block of 64, each lane two elements (one code byte); the
//   block's absmax by a warp_max, the codes by 15 comparisons each. With double quantisation the
//   absmaxes go to the caller's scratch, then nf4_offset_kernel (one CUDA block: the mean above)
//   and nf4_nested_kernel (one CUDA block of 256 threads per nested block: block_max, then the
//   8-bit search per thread) write the double-quantised fields.
// - nf4_dequantize_kernel, the one the model calls before every GEMM with a quantised weight:
//   memory-bound. A thread loads 16 code bytes at once (one 16-byte load; half an NF4 block, so
//   one absmax') and writes their 32 values as 16-byte stores, when n is a multiple of 32 and the
//   buffers are aligned; otherwise one code byte and its two values at a time. The 16 levels sit
//   in shared memory (threads index them by their codes); absmax' is formed once per chunk. The
//   values are bit for bit those of the one-byte-per-thread kernel. Bytes: reads n/2 code bytes
//   and n/64 absmax fields (fp32, or a byte plus the nested fields), writes n values of T.
//   A tensor-parallel slice (Nf4BlockMap) dequantises the same way, its codes and absmaxes its
//   own, the nested scales indexed by its blocks' numbers in the whole tensor.
// The tables live twice, from one definition: kNf4Levels, kNf4Thresholds, kNf4DynamicMap for
// host code (exports write them as a checkpoint's quant_map and nested_quant_map), and
// __constant__ copies for the kernels. make_nf4_fixtures.py --cpp-tables prints them.
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"
#include "kernels/glue.cuh"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace pv {

inline constexpr int kNf4BlockSize = 64;         // elements per absmax
inline constexpr int kNf4NestedBlockSize = 256;  // absmaxes per nested absmax (double quantisation)
inline constexpr int kNf4CodeOfZero = 7;         // kNf4Levels[7] == 0.0f

// clang-format off
// bitsandbytes' NF4 levels (functional.get_4bit_type("nf4"), float32), increasing.
#define PV_NF4_LEVELS \
    -0x1p+0f, -0x1.647362p-1f, -0x1.0cd66p-1f, -0x1.94654p-2f, \
    -0x1.23449ap-2f, -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0x0p+0f, \
    0x1.45f5fep-4f, 0x1.4995c6p-3f, 0x1.f809bap-3f, 0x1.5a0674p-2f, \
    0x1.c3497p-2f, 0x1.200f56p-1f, 0x1.722766p-1f, 0x1p+0f
// The thresholds of bitsandbytes' CUDA dQuantizeNF4 (csrc/kernels.cu), as the compiler rounds them.
#define PV_NF4_THRESHOLDS \
    -0x1.b239b2p-1f, -0x1.38a4ep-1f, -0x1.d709p-2f, -0x1.5bd4ecp-2f, \
    -0x1.e079d8p-3f, -0x1.1a7178p-3f, -0x1.74f0e2p-5f, 0x1.45f5fep-5f, \
    0x1.ec90c6p-4f, 0x1.a0cfcp-3f, 0x1.2b05a8p-2f, 0x1.8ea7f2p-2f, \
    0x1.00da06p-1f, 0x1.491b5ep-1f, 0x1.b913b2p-1f
// bitsandbytes' create_dynamic_map(signed=True): 127 negative values, 0, 127 positive, 1.0.
#define PV_NF4_DYNAMIC_MAP \
    -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df999ap-1f, -0x1.d86666p-1f, \
    -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f, \
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f, \
    -0x1.7accccp-1f, -0x1.73999ap-1f, -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f, \
    -0x1.4f999ap-1f, -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32ccccp-1f, -0x1.2b999ap-1f, \
    -0x1.246668p-1f, -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f, -0x1.006666p-1f, \
    -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f, -0x1.b8ccccp-2f, -0x1.aa6666p-2f, \
    -0x1.9cp-2f, -0x1.8d9998p-2f, -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f, \
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f, -0x1.0cp-2f, -0x1.fb3332p-3f, \
    -0x1.de6666p-3f, -0x1.c1999ap-3f, -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f, \
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, -0x1.93d70ap-4f, -0x1.8851eep-4f, \
    -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f, \
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f6p-5f, \
    -0x1.e51ebap-5f, -0x1.ce147ap-5f, -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f, \
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f, -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f, \
    -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f, \
    -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f, -0x1.e978d4p-8f, -0x1.c49ba6p-8f, \
    -0x1.9fbe76p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f, \
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f, \
    -0x1.78d5p-11f, -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f, \
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f, \
    -0x1.27476ep-21f, 0x0p+0f, 0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f, \
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f, 0x1.19ce0ap-12f, 0x1.8fc506p-12f, \
    0x1.02de02p-11f, 0x1.3dd982p-11f, 0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f, \
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, 0x1.0c49bap-8f, 0x1.3126e8p-8f, \
    0x1.56041ap-8f, 0x1.7ae148p-8f, 0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f, \
    0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, 0x1.d1eb86p-7f, 0x1.170a3ep-6f, \
    0x1.451ebap-6f, 0x1.733334p-6f, 0x1.a147aep-6f, 0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c29p-5f, \
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f, \
    0x1.b70a3ep-5f, 0x1.ce147ap-5f, 0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f, \
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f, 0x1.4eb854p-4f, 0x1.5a3d7p-4f, \
    0x1.65c29p-4f, 0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f, \
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, 0x1.6b3334p-3f, 0x1.88p-3f, \
    0x1.a4ccccp-3f, 0x1.c1999ap-3f, 0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f, \
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626666p-2f, 0x1.70ccccp-2f, \
    0x1.7f3334p-2f, 0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f, \
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f, 0x1.079998p-1f, 0x1.0eccccp-1f, \
    0x1.16p-1f, 0x1.1d3334p-1f, 0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f, \
    0x1.413334p-1f, 0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f, 0x1.5ep-1f, 0x1.653334p-1f, \
    0x1.6c6668p-1f, 0x1.73999ap-1f, 0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f, \
    0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, 0x1.b46666p-1f, 0x1.bb999ap-1f, \
    0x1.c2ccccp-1f, 0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f, \
    0x1.eep-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f
// clang-format on

inline constexpr float kNf4Levels[16] = {PV_NF4_LEVELS};
inline constexpr float kNf4Thresholds[15] = {PV_NF4_THRESHOLDS};
inline constexpr float kNf4DynamicMap[256] = {PV_NF4_DYNAMIC_MAP};
static __constant__ const float kNf4LevelsDevice[16] = {PV_NF4_LEVELS};
static __constant__ const float kNf4ThresholdsDevice[15] = {PV_NF4_THRESHOLDS};
static __constant__ const float kNf4DynamicMapDevice[256] = {PV_NF4_DYNAMIC_MAP};
#undef PV_NF4_LEVELS
#undef PV_NF4_THRESHOLDS
#undef PV_NF4_DYNAMIC_MAP

// ---- the layout of one tensor --------------------------------------------------------------------

__host__ __device__ constexpr long long nf4_blocks(long long n) { return (n + kNf4BlockSize - 1) / kNf4BlockSize; }
__host__ __device__ constexpr long long nf4_nested_blocks(long long n) {
    return (nf4_blocks(n) + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize;
}
__host__ __device__ constexpr long long nf4_code_bytes(long long n) { return (n + 1) / 2; }

// Every byte a quantised tensor stores (the codes and the absmax fields, the offset included).
constexpr long long nf4_stored_bytes(long long n, bool double_quant) {
    const long long fields = double_quant ? nf4_blocks(n) * 1 + nf4_nested_blocks(n) * 4 + 4 : nf4_blocks(n) * 4;
    return nf4_code_bytes(n) + fields;
}

// A tensor-parallel slice of a quantised tensor (model/nf4_layout.h): its codes and absmaxes are
// those of the whole tensor's blocks it covers, but double quantisation's nested scales and offset
// belong to the whole tensor, whose block numbers index them. Local block j is whole block
// first + (j / run)·stride + j % run: one run for a block of rows (stride unused), one run per row
// for a block of columns. run = 0: the tensor is whole (block j is block j).
struct Nf4BlockMap {
    long long first = 0, run = 0, stride = 0;
    __host__ __device__ long long whole_block(long long j) const {
        return run == 0 ? j : first + (j / run) * stride + j % run;
    }
};

// Where the fields of one quantised tensor live (device pointers). Plain: codes and absmax.
// Double quantisation: codes, absmax_codes, nested_absmax and offset (absmax unused).
struct Nf4Tensor {
    uint8_t* codes = nullptr;         // nf4_code_bytes(n)
    float* absmax = nullptr;          // nf4_blocks(n)
    uint8_t* absmax_codes = nullptr;  // nf4_blocks(n)
    float* nested_absmax = nullptr;   // nf4_nested_blocks(n)
    float* offset = nullptr;          // 1
    long long n = 0;
    bool double_quant = false;
    Nf4BlockMap blocks{};  // a slice's blocks in the whole tensor (nested_absmax is the whole tensor's)
};

struct Nf4ConstTensor {
    const uint8_t* codes = nullptr;
    const float* absmax = nullptr;
    const uint8_t* absmax_codes = nullptr;
    const float* nested_absmax = nullptr;
    const float* offset = nullptr;
    long long n = 0;
    bool double_quant = false;
    Nf4BlockMap blocks{};

    Nf4ConstTensor() = default;
    Nf4ConstTensor(const Nf4Tensor& t)  // implicit: a read-only view of the same fields
        : codes(t.codes),
          absmax(t.absmax),
          absmax_codes(t.absmax_codes),
          nested_absmax(t.nested_absmax),
          offset(t.offset),
          n(t.n),
          double_quant(t.double_quant),
          blocks(t.blocks) {}
};

// ---- the two searches -----------------------------------------------------------------------------

// The NF4 code of a scaled value s: how many of the 15 thresholds it exceeds (NaN: none).
__host__ __device__ inline int nf4_code(float s, const float* thresholds) {
    int code = 0;
    for (int i = 0; i < 15; ++i) code += s > thresholds[i] ? 1 : 0;
    return code;
}

// The code of s in the 256-entry dynamic map: entries i and i + 1 are divided at their fp32
// midpoint m_i = fl(map[i] + map[i+1]) · 0.5, and s is past m_i when s > m_i (i even) or
// s >= m_i (i odd), so s equal to a midpoint goes to the even-indexed entry. The code is the
// number of midpoints s is past (they increase, so a binary search of 8 steps finds it; NaN is
// past none). This is the decision of bitsandbytes' CUDA dQuantize, written as a count.
__host__ __device__ inline int nf4_dynamic_code(float s, const float* map) {
    int lo = 0, hi = 255;  // the code lies in [lo, hi]
    while (lo < hi) {
        const int i = (lo + hi) / 2;
        const float midpoint = (map[i] + map[i + 1]) * 0.5f;  // an add then a multiply: never fused
        const bool past = i % 2 == 0 ? s > midpoint : s >= midpoint;
        if (past)
            lo = i + 1;
        else
            hi = i;
    }
    return lo;
}

// ---- quantisation ---------------------------------------------------------------------------------

inline constexpr int kNf4QuantizeWarps = 8;  // blocks of 64 per CUDA block
inline constexpr int kNf4OffsetThreads = 256;

template <class T>
__global__ void nf4_quantize_kernel(const T* x, long long n, uint8_t* codes, float* absmax) {
    const long long block = (long long)blockIdx.x * kNf4QuantizeWarps + threadIdx.x / 32;
    if (block >= nf4_blocks(n)) return;  // whole warps: the shuffles below see every lane
    const int lane = threadIdx.x % 32;
    const long long i = block * kNf4BlockSize + 2 * lane;  // this lane's elements: i and i + 1
    const float x0 = i < n ? cast_value<T, float>(x[i]) : 0.0f;
    const float x1 = i + 1 < n ? cast_value<T, float>(x[i + 1]) : 0.0f;  // odd n: the 0 bitsandbytes pads with
    const float a = warp_max(fmaxf(fabsf(x0), fabsf(x1)));
    if (lane == 0) absmax[block] = a;
    if (i >= n) return;
    int c0 = kNf4CodeOfZero, c1 = kNf4CodeOfZero;
    if (a > 0) {
        const float r = __frcp_rn(a);
        c0 = nf4_code(x0 * r, kNf4ThresholdsDevice);
        c1 = nf4_code(x1 * r, kNf4ThresholdsDevice);
    }
    codes[i / 2] = uint8_t(c0 << 4 | c1);
}

// (hi, lo) += (x_hi, x_lo): double-double addition (Knuth's two-sum, then renormalisation).
// Only additions and subtractions, so no compiler may fuse them.
__host__ __device__ inline void nf4_dd_add(double& hi, double& lo, double x_hi, double x_lo) {
    const double s = hi + x_hi;
    const double v = s - hi;
    const double error = (hi - (s - v)) + (x_hi - v);  // exactly hi + x_hi − s
    const double t = error + lo + x_lo;
    hi = s + t;
    lo = t - (hi - s);
}

// hi + lo (|lo| at most half an ulp of hi) rounded once to fp32, to nearest even: fl(hi) is
// that, unless hi lies exactly halfway between two floats and lo breaks the tie.
__host__ __device__ inline float nf4_dd_to_float(double hi, double lo) {
    float f = float(hi);
    const double d = hi - double(f);  // exact
    if (d != 0 && lo != 0) {
        const float g = nextafterf(f, d > 0 ? INFINITY : -INFINITY);
        if (double(g) - hi == d && (lo > 0) == (d > 0)) f = g;
    }
    return f;
}

// *offset = the mean of absmax[0..blocks): one CUDA block; thread t sums absmax[t], absmax[t +
// kNf4OffsetThreads], ... in double-double, thread 0 adds the partials in thread order.
__global__ inline void nf4_offset_kernel(const float* absmax, long long blocks, float* offset) {
    __shared__ double partial_hi[kNf4OffsetThreads], partial_lo[kNf4OffsetThreads];
    double hi = 0, lo = 0;
    for (long long b = threadIdx.x; b < blocks; b += kNf4OffsetThreads) nf4_dd_add(hi, lo, absmax[b], 0.0);
    partial_hi[threadIdx.x] = hi;
    partial_lo[threadIdx.x] = lo;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int t = 1; t < kNf4OffsetThreads; ++t) nf4_dd_add(hi, lo, partial_hi[t], partial_lo[t]);
    *offset = __fdiv_rn(nf4_dd_to_float(hi, lo), float(blocks));
}

// One CUDA block of kNf4NestedBlockSize threads per nested block, one absmax per thread.
__global__ inline void nf4_nested_kernel(const float* absmax, long long blocks, const float* offset,
                                         uint8_t* absmax_codes, float* nested_absmax) {
    __shared__ float scratch[32];
    const long long b = (long long)blockIdx.x * kNf4NestedBlockSize + threadIdx.x;
    const float v = b < blocks ? __fsub_rn(absmax[b], *offset) : 0.0f;
    const float m = block_max(fabsf(v), scratch);  // every thread reaches it
    if (threadIdx.x == 0) nested_absmax[blockIdx.x] = m;
    if (b >= blocks) return;
    absmax_codes[b] = uint8_t(m > 0 ? nf4_dynamic_code(v * __frcp_rn(m), kNf4DynamicMapDevice) : 0);
}

// Checks that a tensor's description can hold n elements; throws std::invalid_argument naming
// what is wrong.
inline void nf4_check(const Nf4ConstTensor& t, long long n, const char* caller) {
    const std::string where = std::string(caller) + ": ";
    if (n < 0) throw std::invalid_argument(where + "negative element count " + std::to_string(n));
    if (t.n != n)
        throw std::invalid_argument(where + "the Nf4Tensor describes " + std::to_string(t.n) + " elements, not " +
                                    std::to_string(n) + ": pass the count it was laid out for");
    if (n == 0) return;
    if (!t.codes) throw std::invalid_argument(where + "the Nf4Tensor has no codes buffer");
    if (t.double_quant && (!t.absmax_codes || !t.nested_absmax || !t.offset))
        throw std::invalid_argument(
            where + "a double-quantised Nf4Tensor needs absmax_codes, nested_absmax and offset buffers");
    if (!t.double_quant && !t.absmax) throw std::invalid_argument(where + "the Nf4Tensor has no absmax buffer");
}

// Scratch bytes nf4_quantize needs (4-byte aligned): the fp32 absmaxes before double quantisation.
inline size_t nf4_quantize_scratch_bytes(long long n, bool double_quant) {
    return double_quant ? size_t(nf4_blocks(n)) * sizeof(float) : 0;
}

// Quantises x[0..n) (bf16, fp32, or fp64 rounded to fp32 first) into `out`, whose fields must be
// laid out for n and out.double_quant. `scratch`: nf4_quantize_scratch_bytes(n, out.double_quant)
// bytes (none, nullptr allowed, without double quantisation), kept until the stream has run the
// work (it is read by the later kernels). n = 0 writes nothing.
template <class T>
void nf4_quantize(const T* x, long long n, const Nf4Tensor& out, void* scratch, cudaStream_t stream) {
    nf4_check(out, n, "nf4_quantize");
    if (n == 0) return;
    if (out.blocks.run != 0)  // a slice's statistics span the whole tensor (model/nf4_slot.cuh)
        throw std::invalid_argument("nf4_quantize: the Nf4Tensor is a slice of a larger tensor; quantise the whole "
                                    "tensor and take the slice's fields (nf4_slice_fields)");
    if (out.double_quant && !scratch)
        throw std::invalid_argument(
            "nf4_quantize: double quantisation needs nf4_quantize_scratch_bytes(n, true) "
            "bytes of scratch");
    const long long blocks = nf4_blocks(n);
    float* absmax = out.double_quant ? static_cast<float*>(scratch) : out.absmax;
    launch(nf4_quantize_kernel<T>, dim3(ceil_div(blocks, kNf4QuantizeWarps)), dim3(32 * kNf4QuantizeWarps), 0, stream,
           x, n, out.codes, absmax);
    CUDA_CHECK_LAUNCH();
    if (!out.double_quant) return;
    launch(nf4_offset_kernel, dim3(1), dim3(kNf4OffsetThreads), 0, stream, absmax, blocks, out.offset);
    CUDA_CHECK_LAUNCH();
    launch(nf4_nested_kernel, dim3(ceil_div(blocks, kNf4NestedBlockSize)), dim3(kNf4NestedBlockSize), 0, stream,
           static_cast<const float*>(absmax), blocks, static_cast<const float*>(out.offset), out.absmax_codes,
           out.nested_absmax);
    CUDA_CHECK_LAUNCH();
}

// ---- dequantisation -------------------------------------------------------------------------------

inline constexpr int kNf4DequantizeThreads = 256;
// Code bytes per thread and trip in the vector path: one 16-byte load, 32 values (half an NF4
// block, so one absmax) written as 16-byte stores.
inline constexpr int kNf4DequantizeBytes = 16;

// Thread g takes the chunks of B code bytes g, g + S, ... (S = the grid's threads). B is
// kNf4DequantizeBytes when n is a multiple of 2·B and the buffers are aligned, else 1 (one byte,
// two values, the last one cut at an odd n). The value arithmetic is the same either way.
template <class T, int B>
__global__ void nf4_dequantize_kernel(Nf4ConstTensor in, T* out) {
    __shared__ float levels[16];
    if (threadIdx.x < 16) levels[threadIdx.x] = kNf4LevelsDevice[threadIdx.x];
    __syncthreads();
    const long long chunks = nf4_code_bytes(in.n) / B;  // whole: B > 1 only when 2·B divides n
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
        const long long byte = c * B;
        const long long block = byte / (kNf4BlockSize / 2);  // the same block for all B bytes
        const float absmax = in.double_quant ? __fadd_rn(__fmul_rn(kNf4DynamicMapDevice[in.absmax_codes[block]],
                                                                   in.nested_absmax[in.blocks.whole_block(block) /
                                                                                    kNf4NestedBlockSize]),
                                                         *in.offset)
                                             : in.absmax[block];
        const Vec<uint8_t, B> codes = load_vec<B>(in.codes + byte);
        if constexpr (B == 1) {
            const unsigned code = codes.v[0];
            out[2 * byte] = cast_value<float, T>(levels[code >> 4] * absmax);
            if (2 * byte + 1 < in.n) out[2 * byte + 1] = cast_value<float, T>(levels[code & 15] * absmax);
        } else {
            Vec<T, 2 * B> values;
            for (int k = 0; k < B; ++k) {
                const unsigned code = codes.v[k];
                values.v[2 * k] = cast_value<float, T>(levels[code >> 4] * absmax);
                values.v[2 * k + 1] = cast_value<float, T>(levels[code & 15] * absmax);
            }
            store_vec<2 * B>(out + 2 * byte, values);
        }
    }
}

// out[0..n) = the values of `in` (laid out for n), rounded once to T.
template <class T>
void nf4_dequantize(const Nf4ConstTensor& in, T* out, long long n, cudaStream_t stream) {
    nf4_check(in, n, "nf4_dequantize");
    if (n == 0) return;
    auto go = [&](auto kernel, int bytes_per_chunk) {
        const long long chunks = nf4_code_bytes(n) / bytes_per_chunk;
        launch(kernel, dim3(ceil_div(chunks, kNf4DequantizeThreads)), dim3(kNf4DequantizeThreads), 0, stream, in, out);
        CUDA_CHECK_LAUNCH();
    };
    if (n % (2 * kNf4DequantizeBytes) == 0 && vec_aligned({in.codes, out}))
        go(nf4_dequantize_kernel<T, kNf4DequantizeBytes>, kNf4DequantizeBytes);
    else
        go(nf4_dequantize_kernel<T, 1>, 1);
}

}  // namespace pv
