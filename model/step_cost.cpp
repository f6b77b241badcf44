// The performance model's formulas and the steps they add up to (model/step_cost.h).
#include "model/step_cost.h"

#include "kernels/attention_mma_blocks.h"
#include "model/attention_sass.h"
#include "model/flops.h"
#include "model/parameters.h"
#include "model/tensor_parallel.h"

#include <algorithm>
#include <stdexcept>
#include <string_view>

namespace pv {

const char* roofline_name(Roofline r) {
    switch (r) {
        case Roofline::cublas_gemm: return "tensor cores (cuBLAS)";
        case Roofline::attention_mma: return "tensor cores (mma.sync)";
        case Roofline::attention_cuda_core: return "CUDA cores";
        case Roofline::memory_vector: return "memory, 16-byte";
        case Roofline::memory_rows: return "memory, RMSNorm rows";
        case Roofline::memory_scalar: return "memory, scalar";
    }
    return "?";
}

// The efficiencies, each with where it comes from. e_mem multiplies the HBM bandwidth, e_unit the
// peak of the unit that does the FLOPs (tensor cores for the first three, CUDA cores otherwise).
// "The H100 run" is the one measurement (docs/speed.md, "Measured on one H100"): b7243bf's CUDA
// build on one H100 80GB HBM3, `kernels_bench --shape llama-3.2-1b --batch 4 --seq 2048` beside
// `train`; a class takes its figure from a kernel measured there whose code has not changed since.
RooflineEfficiency roofline_efficiency(Roofline r) {
    switch (r) {
        case Roofline::cublas_gemm:
            // Measured: the step's cuBLAS bf16 GEMMs ran at 759-788 TF/s on the H100 run; the
            // middle, ~775 TF/s (the figure shared/notes/gpu-review.md's breakdown of that step
            // uses), is 0.783 of 989.4. (Before: 0.7, NVIDIA's published 600-800 TF/s — the step
            // it predicted matched the measured one because the attention, priced at 247 TF/s, was
            // as much too fast as the GEMMs were too slow.) Other shapes (8B's larger GEMMs) are
            // priced at the same fraction: not measured.
            return {0.9, 0.783, "measured: the 1B step's cuBLAS GEMMs at 759-788 TF/s on one H100 (docs/speed.md)"};
        case Roofline::attention_mma:
            // The tensor cores' dense peak is only a bound here (e_unit 1: never reached): these
            // kernels are bound by instruction issue, which predicted_seconds prices from their
            // SASS (attention_issue_efficiency). The 0.25 of the peak assumed before (FA2's
            // 160-330 TF/s) was wrong by 2x: the kernels ran at 114 and 93 TF/s.
            return {0.9, 1.0, "bound by instruction issue: SASS counts (model/attention_sass.h), calibrated"};
        case Roofline::attention_cuda_core:
            // Read from the sm_90 SASS (shared/notes/gpu-review.md): two 16-bit shared loads and two
            // conversions per FMA bound the kernels by the shared-memory pipe at about 16 FMA per
            // clock per SM, ~10 TF/s: 0.15 of the CUDA cores' fp32 peak.
            return {0.9, 0.15, "SASS reading: 2 LDS.U16 per FMA, ~16 FMA/clk/SM = ~10 TF/s"};
        case Roofline::memory_vector:
            // Measured: SwiGLU, an elementwise kernel on 16-byte vectors (kernels/vec.cuh) like
            // the rest of this class, moved 2.8-2.9 TB/s on the H100 run: 0.85 of 3.35. (Before:
            // 0.9, an HBM3 copy's ~3.0 TB/s.) Kernels written since (the fused cross-entropy, the
            // D kernel, AdamW's) are priced at it: not measured.
            return {0.85, 0.5, "measured: SwiGLU's 16-byte elementwise kernel at 2.8-2.9 TB/s on one H100"};
        case Roofline::memory_rows:
            // Measured: the RMSNorm kernels (a warp per row forward, a block per row backward, each
            // row's values in registers between its statistics and its write, no prefetch of the
            // next row) moved 1.2-1.7 TB/s on the H100 run: the middle, 0.43 of 3.35.
            return {0.43, 0.5, "measured: the RMSNorm kernels at 1.2-1.7 TB/s on one H100"};
        case Roofline::memory_scalar:
            // One 2-byte load in flight per thread: by Little's law at ~2048 threads/SM, 132 SMs
            // and ~600 ns of latency, ~1.4 TB/s at best (shared/notes/gpu-review.md).
            return {0.42, 0.5, "one 2-byte load in flight per thread: ~1.4 TB/s by Little's law"};
    }
    throw std::logic_error("roofline_efficiency: unknown roofline");
}

Device rtx_6000_ada() {
    Device d;
    d.sm.shared_bytes = 100 * 1024, d.sm.shared_bytes_per_block = 99 * 1024, d.sm.threads = 1536, d.sm.blocks = 24;
    d.name = "RTX 6000 Ada Generation (48 GB GDDR6)";
    d.hbm_bytes_per_s = 960e9;
    d.tensor_bf16_flops = 364.2e12;
    d.cuda_core_fp32_flops = 91.1e12;
    d.sms = 142;
    d.clock_hz = 2.505e9;
    d.link_bytes_per_s = 32e9;
    d.link = "PCIe 4.0 x16: 32 GB/s each way, no NVLink";
    d.sass_arch = 80;
    return d;
}

double predicted_seconds(const KernelCost& k, const Device& d) {
    const RooflineEfficiency e = roofline_efficiency(k.roofline);
    const bool tensor = k.roofline == Roofline::cublas_gemm || k.roofline == Roofline::attention_mma;
    const double peak = tensor ? d.tensor_bf16_flops : d.cuda_core_fp32_flops;
    const double roofline = std::max(k.bytes() / (d.hbm_bytes_per_s * e.e_mem), k.flops / (peak * e.e_unit));
    return k.warp_instructions > 0 ? std::max(roofline, issue_seconds(k, d)) : roofline;
}

namespace {
const AttentionTileSass* attention_tile_sass(const std::string& kernel, int hd, int sass_arch) {
    for (const AttentionTileSass& a : kAttentionTileSass)
        if (kernel == a.kernel && hd == a.head_dim && sass_arch == a.sass_arch) return &a;
    return nullptr;
}
}  // namespace

int attention_tile_instructions(const std::string& kernel, int hd, bool masked, int sass_arch) {
    const AttentionTileSass* a = attention_tile_sass(kernel, hd, sass_arch);
    return !a ? 0 : masked ? a->masked_instructions : a->instructions;
}

int attention_kernel_registers(const std::string& kernel, int hd, int sass_arch, bool split) {
    const AttentionTileSass* a = attention_tile_sass(kernel, hd, sass_arch);
    return !a ? 0 : split ? a->split_registers : a->registers;
}

namespace {
constexpr double kIssuePerClock = 4;  // four schedulers per SM, one warp instruction per clock each
// The attention kernels of the one measurement (attention_issue_efficiency): their registers per
// thread, from ptxas (nvcc 13, sm_90) on 1a887b9's kernels_bench.cu.
constexpr int kMeasuredForwardRegisters = 186, kMeasuredDkvRegisters = 166, kMeasuredDqRegisters = 134;
// The fewest warps an SM held in that measurement (the forward's 2 blocks of 4): the efficiency
// calibrated there holds from that many warps up.
int calibrated_warps_per_sm() {
    static const int warps = [] {
        const SmLimits h100;
        const int blocks = std::min(
            {resident_blocks(h100, kAttentionMmaThreads, kMeasuredForwardRegisters,
                             attention_mma_forward_smem_bytes(64)),
             resident_blocks(h100, kAttentionMmaThreads, kMeasuredDkvRegisters, attention_mma_dkv_smem_bytes(64)),
             resident_blocks(h100, kAttentionMmaThreads, kMeasuredDqRegisters, attention_mma_dq_smem_bytes(64))});
        return blocks * kAttentionMmaThreads / 32;
    }();
    return warps;
}
}  // namespace

double issue_seconds(double warp_instructions, double efficiency, const Device& d) {
    return warp_instructions / (double(d.sms) * kIssuePerClock * d.clock_hz * efficiency);
}

double issue_seconds(const KernelCost& k, const Device& d) {
    if (k.blocks.empty()) return issue_seconds(k.warp_instructions, k.issue_efficiency, d);
    const int per_sm = resident_blocks(d.sm, k.block_threads, k.block_registers, k.block_shared);
    if (per_sm == 0)
        throw std::invalid_argument("step cost: " + k.kernel + " cannot launch on the " + d.name + ": a block of " +
                                    std::to_string(k.block_threads) + " threads at " +
                                    std::to_string(k.block_registers) + " registers each with " +
                                    std::to_string(k.block_shared) + " bytes of shared memory (the device allows " +
                                    std::to_string(d.sm.shared_bytes_per_block) + " a block, " +
                                    std::to_string(d.sm.registers) + " registers an SM)");
    // An SM issues at the calibrated efficiency while it holds as many warps as the kernels measured
    // then had (2 blocks of 4 warps forward, 3 backward: the same fraction at 8 warps and at 12), and
    // below that each warp at most as fast as there (attention_issue_efficiency).
    const SmIssue sm{kIssuePerClock * d.clock_hz * k.issue_efficiency, calibrated_warps_per_sm()};
    return grid_seconds(k.blocks, d.sms, per_sm, (k.block_threads + 31) / 32, sm);
}

namespace cost {
namespace {

KernelCost kernel(std::string name, std::string op, double read, double written, double flops, Roofline r) {
    KernelCost k;
    k.kernel = std::move(name);
    k.op = std::move(op);
    k.read_bytes = read;
    k.written_bytes = written;
    k.flops = flops;
    k.roofline = r;
    return k;
}

constexpr Roofline kScalar = Roofline::memory_scalar;
constexpr Roofline kVector = Roofline::memory_vector;
constexpr Roofline kRows = Roofline::memory_rows;
constexpr double kAdamWSlotBytes = 40;  // sizeof(AdamWSlot), optim/adamw.cuh

}  // namespace

// rmsnorm_forward_kernel: each row's x read once into registers, the weight read by every warp
// (C distinct elements), y written, one rstd per row.
std::vector<KernelCost> rmsnorm_forward(long long N, int C, int t, int a) {
    const double nc = double(N) * C;
    return {kernel("rmsnorm_forward_kernel", "rmsnorm", nc * t + double(C) * t, nc * t + double(N) * a, 4 * nc, kRows)};
}

// rmsnorm_forward_kernel with a branch: residual and branch read, their sum (twice with `copy`:
// the block's output started from it) and y written, rstd.
std::vector<KernelCost> residual_rmsnorm_forward(long long N, int C, int t, int a, bool copy) {
    const double nc = double(N) * C;
    return {kernel("rmsnorm_forward_kernel", copy ? "residual add + rmsnorm (the sum twice)" : "residual add + rmsnorm",
                   2 * nc * t + double(C) * t, (copy ? 3 : 2) * nc * t + double(N) * a, 5 * nc, kRows)};
}

// rmsnorm_backward_kernel: x, dout, rstd, the weight and the residual's gradient dres read, dx
// written (dx = dres + the norm's share: nothing is copied beforehand) and one partial dweight row
// of C accumulators per block (G = min(N, 264) blocks: kRmsnormBackwardBlocks);
// rmsnorm_dweight_kernel: the G partial rows and dweight read, dweight written.
std::vector<KernelCost> rmsnorm_backward(long long N, int C, int t, int a, bool weight_grad) {
    const double nc = double(N) * C, g = double(std::min<long long>(N, 264));
    std::vector<KernelCost> k{kernel("rmsnorm_backward_kernel", "rmsnorm backward",
                                     3 * nc * t + double(C) * t + double(N) * a, nc * t + g * C * a, 10 * nc, kRows)};
    if (weight_grad)
        k.push_back(kernel("rmsnorm_dweight_kernel", "rmsnorm dweight", g * C * a + double(C) * t, double(C) * t, g * C,
                           kScalar));
    return k;
}

// swiglu (elementwise_kernel, kernels/vec.cuh): gate and up read, h written. Backward: gate, up and
// dh read, dgate and dup written.
std::vector<KernelCost> swiglu_forward(long long N, int F, int t) {
    const double nf = double(N) * F;
    return {kernel("elementwise_kernel", "swiglu", 2 * nf * t, nf * t, 8 * nf, kVector)};
}
std::vector<KernelCost> swiglu_backward(long long N, int F, int t) {
    const double nf = double(N) * F;
    return {kernel("elementwise_kernel", "swiglu backward", 3 * nf * t, 2 * nf * t, 14 * nf, kVector)};
}

// RoPE (elementwise_kernel over pairs): in place over the rotated heads; the table rows of the
// distinct positions the rows sit at (cos and sin of the head_dim/2 pairs, acc_t each); positions
// per row when given.
std::vector<KernelCost> rope(long long N, int heads, int hd, int t, int a, bool positions, long long table_rows) {
    const double x = double(N) * heads * hd;
    return {kernel("elementwise_kernel", "rope", x * t + double(table_rows) * hd * a + (positions ? double(N) * 4 : 0),
                   x * t, 3 * x, kVector)};
}

// elementwise_kernel: a and b read, out written.
std::vector<KernelCost> add(long long n, int t, const std::string& op) {
    return {kernel("elementwise_kernel", op, 2.0 * double(n) * t, double(n) * t, double(n), kVector)};
}

namespace {
// Score pairs (query row, key) a causal flash kernel computes with tiles of `own` rows and `other`
// streamed keys: every tile pair from the first key tile to the diagonal, whole.
double causal_tile_pairs(int T, int own, int other) {
    double pairs = 0;
    for (int q0 = 0; q0 < T; q0 += own) {
        const int q_end = std::min(T, q0 + own);
        const int key_tiles = (q_end - 1) / other + 1;
        pairs += double(q_end - q0) * double(key_tiles) * other;
    }
    return pairs;
}
// 64×64 tile pairs the tensor-core kernels walk per (batch, head): n(n+1)/2, n = ceil(T / 64).
double attention_tile_pairs(int T) {
    const double n = double((T + 63) / 64);
    return n * (n + 1) / 2;
}
// The tensor-core attention kernels' blocks at this shape, in launch order (heaviest first), each
// block's warps running the tile loop once per 64×64 tile pair the block walks: the forward and dQ
// a block per (query tile, head, batch), over the key tiles up to the diagonal; dK/dV a block per
// (key tile, KV head, batch), over its G = H/Hkv query heads' query tiles from the diagonal on. Where
// the shape splits a kernel's tiles (attention_mma_dkv_segment_steps, attention_mma_query_segment_steps)
// a block per segment of at most L of those steps, the grid's z index running over the segments
// tile by tile. The diagonal's pairs (dK/dV: a head's first step; the forward and dQ: a query tile's
// last) run the masked body, the others the interior one (causal attention; document boundaries add
// masked tiles, not priced).
// Every block of one z index does the same work.
std::vector<BlockRun> attention_blocks(const char* kernel, int B, int T, int H, int Hkv, int hd, int interior,
                                       int masked, int segment_steps, int warps) {
    if (interior <= 0 || masked <= 0)
        throw std::invalid_argument(std::string("step cost: no tensor-core attention ") + kernel +
                                    " kernel at head dim " + std::to_string(hd) + " in model/attention_sass.h");
    const int n = attention_mma_tiles(T);
    const std::string name = kernel;
    const bool dkv = name.starts_with("dkv");
    std::vector<BlockRun> grid;
    // Per z index: dK/dV B·Hkv blocks of G steps a tile, the others B·H of 1.
    const int G = dkv ? H / Hkv : 1;
    const long long rows = dkv ? (long long)B * Hkv : (long long)B * H;
    const int L = segment_steps >= 0 ? segment_steps
                  : dkv              ? attention_mma_dkv_segment_steps(B, T, H, Hkv, hd)
                                     : attention_mma_query_segment_steps(B, T, H, hd);
    for (int z = 0; z < n; ++z) {
        // dK/dV: key tile z walks n − z query tiles per query head; the others: query tile n − 1 − z
        // walks n − z key tiles.
        const int pairs = n - z, all = G * pairs, segments = attention_mma_segments(n, z, G, L);
        for (int segment = 0; segment < segments; ++segment) {  // steps [first, first + count)
            const int first = L ? segment * L : 0, count = L ? std::min(L, all - first) : all;
            int diagonal = 0;  // dK/dV: steps that are a head's first query tile; else the last key tile
            for (int i = first; i < first + count; ++i) diagonal += dkv ? i % pairs == 0 : i == pairs - 1;
            grid.push_back({rows, warps * (double(count - diagonal) * interior + double(diagonal) * masked)});
        }
    }
    return grid;
}

// A split kernel's partials (kernels/attention_mma_split.cuh), over its grid's tiles z of more than
// one segment (dK/dV's key tile z; with last_first, the forward's and dQ's query tile n − 1 − z):
// the bytes its blocks write to partial slots, `partial_row` per row before T of each slot, and those
// of the rows it no longer stores itself, `row` each, which the kernel after it reads and writes.
struct SplitBytes {
    double partial = 0, rows = 0;
};
SplitBytes split_bytes(int T, int G, int L, bool last_first, double grid_rows, double partial_row, double row) {
    SplitBytes b;
    const int n = attention_mma_tiles(T);
    for (int z = 0; z < n && L > 0; ++z) {
        const int segments = attention_mma_segments(n, z, G, L);
        if (segments == 1) continue;
        const double rows =
            grid_rows * std::min(kAttentionMmaTile, T - (last_first ? n - 1 - z : z) * kAttentionMmaTile);
        b.partial += segments * rows * partial_row, b.rows += rows * row;
    }
    return b;
}
// Puts the kernel that adds a split kernel's partials after it (k[at]), which writes the partials
// instead of those rows.
void add_partials_kernel(std::vector<KernelCost>& k, size_t at, const SplitBytes& b, const char* name, const char* op) {
    if (b.partial == 0) return;
    k[at].written_bytes += b.partial - b.rows;
    k.insert(k.begin() + long(at) + 1, kernel(name, op, b.partial, b.rows, b.partial / 4, kVector));
}

}  // namespace

AttentionBlock attention_block(const std::string& kernel, int hd) {
    // (the split instantiations take the same block)
    if (kernel == "forward") return {attention_mma_threads(1), attention_mma_forward_smem_bytes(hd, 1)};
    if (kernel == "forward-32rows") return {attention_mma_threads(2), attention_mma_forward_smem_bytes(hd, 2)};
    if (kernel == "dq") return {attention_mma_threads(1), attention_mma_dq_smem_bytes(hd)};
    if (kernel == "dq-32rows") return {attention_mma_threads(2), attention_mma_dq_smem_bytes(hd)};
    if (kernel == "dkv-32rows") return {attention_mma_threads(2), attention_mma_dkv_smem_bytes(hd)};
    return {kAttentionMmaThreads,
            attention_mma_dkv_smem_bytes(
                hd, kernel == "dkv-swizzled" ? AttentionMmaRows::swizzled : AttentionMmaRows::padded)};
}

// The issue-bound part of a tensor-core attention kernel's cost: its blocks, their instructions
// and the registers and shared memory a block takes.
void set_attention_issue(KernelCost& k, const char* kernel, int B, int T, int H, int Hkv, int hd, int interior,
                         int masked, int registers, int segment_steps) {
    const AttentionBlock block = attention_block(kernel, hd);
    k.blocks = attention_blocks(kernel, B, T, H, Hkv, hd, interior, masked, segment_steps, block.threads / 32);
    k.warp_instructions = 0;
    for (const BlockRun& r : k.blocks) k.warp_instructions += double(r.blocks) * r.work;
    k.block_threads = block.threads;
    k.block_registers = registers;
    k.block_shared = block.shared;
}
namespace {
// Today's kernels in the SASS for sass_arch (model/attention_sass.h): where the shape splits the
// kernel's tiles, its kSplit instantiation's registers.
// L: the segment length, −1 the shape's (attention_mma_dkv_segment_steps, attention_mma_query_segment_steps).
void set_attention_issue_now(KernelCost& k, const char* kernel, int B, int T, int H, int Hkv, int hd, int sass_arch,
                             int L = -1) {
    if (L < 0)
        L = std::string_view(kernel).starts_with("dkv") ? attention_mma_dkv_segment_steps(B, T, H, Hkv, hd)
                                                        : attention_mma_query_segment_steps(B, T, H, hd);
    set_attention_issue(k, kernel, B, T, H, Hkv, hd, attention_tile_instructions(kernel, hd, false, sass_arch),
                        attention_tile_instructions(kernel, hd, true, sass_arch),
                        attention_kernel_registers(kernel, hd, sass_arch, L > 0), L);
}
}  // namespace

// attention_forward_kernel (CUDA cores, 32×32 tiles at hd 64/128 in bf16: fp32, fp64 and the
// "before" bf16 step): q, k and v read (every key row is read by some query tile), positions when
// given; out and lse written. 2 matmuls per computed score pair.
std::vector<KernelCost> attention_forward_cuda_cores(int B, int T, int H, int Hkv, int hd, int t, int a,
                                                     bool positions) {
    const double rows = double(B) * T;
    const double read = rows * (H + 2 * Hkv) * hd * t + (positions ? rows * 4 : 0);
    const double written = rows * H * hd * t + rows * H * a;
    const double flops = 4.0 * hd * causal_tile_pairs(T, 32, 32) * B * H;
    return {kernel("attention_forward_kernel", "attention", read, written, flops, Roofline::attention_cuda_core)};
}

// attention_mma_forward_kernel (bf16, hd 64 and 128: kernels/attention_mma_forward.cuh): the same
// bytes; every warp computes whole 64-key tiles up to its query tile's diagonal, rows past T
// included: n(n+1)/2 tile pairs of 64×64 per (batch, head), n = ceil(T/64); per pair S = Q·Kᵀ and
// P·V with P in one bf16: 2 products, 4·hd FLOPs.
// Issue: each of a block's warps runs the tile loop once per such pair, at
// attention_tile_instructions(kernel, hd) instructions a trip, the diagonal's at its masked count
// (prologue and epilogue not counted): the kernel with warps of 32 rows ("forward-32rows", 2 warps)
// where the device's shared memory gives it (attention_mma_forward_row_tiles), else of 16 ("forward",
// 4 warps).
const char* attention_forward_kind(int hd, const Device& d) {
    return attention_mma_forward_row_tiles(hd, d.sm.shared_bytes_per_block) == 2 ? "forward-32rows" : "forward";
}
std::vector<KernelCost> attention_forward(int B, int T, int H, int Hkv, int hd, int t, int a, bool positions,
                                          const Device& d) {
    KernelCost k = attention_forward_cuda_cores(B, T, H, Hkv, hd, t, a, positions).front();
    k.kernel = "attention_mma_forward_kernel";
    k.flops = 4.0 * hd * (attention_tile_pairs(T) * 64.0 * 64.0) * B * H;
    k.roofline = Roofline::attention_mma;
    set_attention_issue_now(k, attention_forward_kind(hd, d), B, T, H, Hkv, hd, d.sass_arch);
    k.issue_efficiency = attention_issue_efficiency().forward;
    // Split (attention_mma_query_segment_steps): the split query tiles' blocks write their rows'
    // unnormalised output and running maximum and sum in fp32, which the combine kernel merges into
    // out and lse.
    std::vector<KernelCost> all = {k};
    add_partials_kernel(all, 0,
                        split_bytes(T, 1, attention_mma_query_segment_steps(B, T, H, hd), true, double(B) * H,
                                    4.0 * (hd + 2), double(hd) * t + a),
                        "attention_mma_forward_combine_kernel", "attention: split rows merged");
    return all;
}

// The CUDA-core dK/dV and dQ kernels (attention_backward_cuda_cores: fp32, fp64, and the "before"
// bf16 step), 32×32 tiles: q, k, v, dout, lse and D read, dk and dv written, recomputing S and dP
// (4 matmuls); dQ: the same reads, dq written (S, dP and dQ: 3 matmuls).
std::vector<KernelCost> attention_backward_cuda_cores(int B, int T, int H, int Hkv, int hd, int t, int a,
                                                      bool positions) {
    const double rows = double(B) * T, qo = rows * H * hd * t, kv = rows * Hkv * hd * t, stats = rows * H * a;
    const double pos = positions ? rows * 4 : 0, pairs = causal_tile_pairs(T, 32, 32) * B * H;
    return {kernel("attention_backward_dkv_kernel", "attention backward: dK, dV", 2 * qo + 2 * kv + 2 * stats + pos,
                   2 * kv, 8.0 * hd * pairs, Roofline::attention_cuda_core),
            kernel("attention_backward_dq_kernel", "attention backward: dQ", 2 * qo + 2 * kv + 2 * stats + pos, qo,
                   6.0 * hd * pairs, Roofline::attention_cuda_core)};
}

KernelCost attention_dot(double rows, int H, int hd, int t, int a, bool vectors) {
    const double qo = rows * H * hd * t;
    return kernel("attention_backward_dot_kernel", "attention backward: D", 2 * qo, rows * H * a, 2.0 * rows * H * hd,
                  vectors && hd * t % 16 == 0 ? kVector : kScalar);
}

namespace {
// Score pairs the tensor-core backward computes per (batch, head): whole 64×64 tile pairs up to the
// diagonal, where the warps skip the 6 of 16 chunks of 16×16 above it.
double mma_backward_pairs(int T) {
    const double n = double((T + 63) / 64);
    return (attention_tile_pairs(T) - n * 6.0 / 16.0) * 64.0 * 64.0;
}
}  // namespace

// attention_backward for bf16 at a head dim that is a multiple of 16 from 32 to 128 (attention_mma_backward.cuh):
// the D kernel, then attention_mma_dkv_kernel (q, k, v, dout, lse and D read, dk and dv written;
// per score pair S, dP, dV and dK, P and dS in one bf16: 8·hd FLOPs) and attention_mma_dq_kernel
// (the same reads, dq written; S, dP, dQ: 6·hd). Their blocks are those the device's shared memory
// gives: the dK/dV rows padded or swizzled, its warps of 16 or 32 keys, dQ's of 16 or 32 rows.
const char* attention_dkv_kind(int hd, const Device& d, int B, int T, int H, int Hkv) {
    if (attention_mma_dkv_rows(hd, d.sm.shared_bytes_per_block) == AttentionMmaRows::swizzled) return "dkv-swizzled";
    return attention_mma_dkv_row_tiles(hd, d.sm.shared_bytes_per_block, B, T, H, Hkv) == 2 ? "dkv-32rows" : "dkv";
}
const char* attention_dq_kind(int hd, const Device& d) {
    return attention_mma_dq_row_tiles(hd, d.sm.shared_bytes_per_block) == 2 ? "dq-32rows" : "dq";
}
std::vector<KernelCost> attention_backward(int B, int T, int H, int Hkv, int hd, int t, int a, bool positions,
                                           const Device& d, int dkv_segment_steps) {
    const double rows = double(B) * T, qo = rows * H * hd * t, kv = rows * Hkv * hd * t, stats = rows * H * a;
    const double pos = positions ? rows * 4 : 0, pairs = mma_backward_pairs(T) * B * H;
    std::vector<KernelCost> k = {
        attention_dot(rows, H, hd, t, a),
        kernel("attention_mma_dkv_kernel", "attention backward: dK, dV", 2 * qo + 2 * kv + 2 * stats + pos, 2 * kv,
               8.0 * hd * pairs, Roofline::attention_mma),
        kernel("attention_mma_dq_kernel", "attention backward: dQ", 2 * qo + 2 * kv + 2 * stats + pos, qo,
               6.0 * hd * pairs, Roofline::attention_mma)};
    // Issue: every tile pair up to the diagonal, each of the block's warps (the chunks above the
    // diagonal that the warps skip are counted: n·6/16 of n(n+1)/2 pairs' inner-loop trips, 2% at
    // T = 2048).
    AttentionMmaSplit split = attention_mma_backward_split(B, T, H, Hkv, hd);
    if (dkv_segment_steps >= 0) split.dkv = dkv_segment_steps;
    set_attention_issue_now(k[1], attention_dkv_kind(hd, d, B, T, H, Hkv), B, T, H, Hkv, hd, d.sass_arch, split.dkv);
    set_attention_issue_now(k[2], attention_dq_kind(hd, d), B, T, H, Hkv, hd, d.sass_arch);
    k[1].issue_efficiency = k[2].issue_efficiency = attention_issue_efficiency().backward;
    // The splits (attention_mma_backward_split): a split kernel's split tiles' blocks write fp32
    // partials (the rows before T of each slot) instead of bf16 rows, which attention_mma_reduce_kernel,
    // launched after it, reads and sums into them.
    add_partials_kernel(k, 2, split_bytes(T, 1, split.dq, true, double(B) * H, 4.0 * hd, double(hd) * t),
                        "attention_mma_reduce_kernel", "attention backward: dQ partials summed");
    add_partials_kernel(k, 1, split_bytes(T, H / Hkv, split.dkv, false, double(B) * Hkv, 2 * 4.0 * hd, 2.0 * hd * t),
                        "attention_mma_reduce_kernel", "attention backward: dK, dV partials summed");
    return k;
}

// cross_entropy_forward_kernel: the logits and the targets read, one loss and one (max, sum) pair
// per row written; cross_entropy_sum_kernel: the row losses and targets read, the sum and count
// written.
std::vector<KernelCost> cross_entropy_forward(long long N, int V, int t, int a) {
    const double nv = double(N) * V;
    std::vector<KernelCost> k = {kernel("cross_entropy_forward_kernel", "cross-entropy", nv * t + double(N) * 4,
                                        double(N) * 3 * a, 4 * nv, kVector)};
    k.push_back(cross_entropy_sum(N, a).front());
    return k;
}
std::vector<KernelCost> cross_entropy_sum(long long N, int a) {
    return {kernel("cross_entropy_sum_kernel", "cross-entropy sum", double(N) * (a + 4), double(a) + 4, double(N),
                   kScalar)};
}
// cross_entropy_loss_and_gradient_kernel: the logits and targets read, the gradient written over
// the logits, a loss and a (max, sum) pair per row; the forward's and the backward's arithmetic.
// A block reads its row twice (the statistics, then the gradient), the second time from L2: a row
// is at most 256 KB (128256 bf16) and the rows in flight (a block each, 1-2 per SM: 132-264 on an
// H100, 33-66 MB at that width) about fill its 50 MB, so the DRAM bytes are counted once.
std::vector<KernelCost> cross_entropy_loss_and_gradient(long long N, int V, int t, int a) {
    const double nv = double(N) * V;
    return {kernel("cross_entropy_loss_and_gradient_kernel", "cross-entropy: loss and gradient", nv * t + double(N) * 4,
                   nv * t + double(N) * 3 * a, 9 * nv, kVector)};
}
// Vocabulary-parallel over `ranks` (a rank's V columns): cross_entropy_partial_kernel reads them
// and the targets and writes a partial (max, sum, target logit) per row; after the all-gather,
// cross_entropy_merge_kernel reads the ranks' partials and the targets and writes a loss and a
// (max, sum) pair per row (the sum kernel after the last chunk is cross_entropy_sum).
std::vector<KernelCost> cross_entropy_vocabulary_parallel_rows(long long N, int V, int ranks, int t, int a) {
    const double nv = double(N) * V;
    return {kernel("cross_entropy_partial_kernel", "cross-entropy: partials", nv * t + double(N) * 4, double(N) * 3 * a,
                   4 * nv, kVector),
            kernel("cross_entropy_merge_kernel", "cross-entropy: merge", double(N) * (3.0 * a * ranks + 4),
                   double(N) * 3 * a, 6.0 * N * ranks, kScalar)};
}
// The backward (elementwise_kernel): logits, targets and the rows' (max, sum) read, the gradient
// written in place.
std::vector<KernelCost> cross_entropy_backward(long long N, int V, int t, int a) {
    const double nv = double(N) * V;
    return {kernel("elementwise_kernel", "cross-entropy backward", nv * t + double(N) * (4 + 2 * a), nv * t, 5 * nv,
                   kVector)};
}

// embedding forward (elementwise_kernel): the tokens and the distinct rows of the table read, out
// written.
std::vector<KernelCost> embedding_forward(long long N, int C, long long distinct, int t) {
    return {kernel("elementwise_kernel", "embedding", double(N) * 4 + double(distinct) * C * t, double(N) * C * t, 0,
                   kVector)};
}

// embedding_sort_kernel (one launch, a block per chunk of up to 4096 positions): the tokens read;
// per chunk its order (chunk ints), the starts of its runs (one per distinct token, plus the end)
// and the run count written. embedding_sum_kernel (a launch per chunk): the run count, run starts
// and order read, each run's token once, dout and the distinct rows of dwte read, those rows
// written. `distinct`: distinct valid tokens per chunk.
std::vector<KernelCost> embedding_backward(long long N, int C, long long distinct, int t) {
    long long chunk = 1;
    while (chunk < N && chunk < 4096) chunk *= 2;
    const double chunks = double((N + chunk - 1) / chunk), per_chunk = double(N) / chunks;
    const double d = double(distinct), rows = d * C * t;
    std::vector<KernelCost> k{kernel("embedding_sort_kernel", "embedding backward: sort", double(N) * 4,
                                     chunks * 4 * (double(chunk) + d + 2), 0, kScalar)};
    const KernelCost sum =
        kernel("embedding_sum_kernel", "embedding backward",
               4 * (1 + (d + 1) + per_chunk + d) + per_chunk * C * t + rows, rows, per_chunk * C, kVector);
    for (double i = 0; i < chunks; ++i) k.push_back(sum);
    return k;
}

std::vector<KernelCost> count_targets(long long N) {
    return {kernel("count_targets_kernel", "count targets", double(N) * 4, 4, double(N), kScalar)};
}

// sum_of_squares_partials_kernel: x read (16-byte loads), one double per block (P = min(ceil(n /
// 2048), 1024));
// sum_of_squares_final_kernel: the partials read (and *out when accumulating), *out written.
std::vector<KernelCost> sum_of_squares(long long n, int g, bool accumulate) {
    const double p = double(std::min<long long>((n + 2047) / 2048, 1024));
    return {kernel("sum_of_squares_partials_kernel", "gradient norm", double(n) * g, p * 8, 2.0 * double(n), kVector),
            kernel("sum_of_squares_final_kernel", "gradient norm: sum", p * 8 + (accumulate ? 8 : 0), 8, p, kScalar)};
}

// adamw_group_kernel (one launch per owned range): the table of its tensor pieces and the device
// gradient scale read; for every element of a tensor (padding is skipped) the parameter (read only
// without a master), master, gradient, m and v read, parameter, master, m and v written.
std::vector<KernelCost> adamw(long long n, int t, int g, int a, int pieces) {
    const double e = double(n);
    const bool master = t < 4;
    const double read = e * (g + 2 * a) + (master ? e * a : e * t) + double(pieces) * kAdamWSlotBytes + 8;
    const double written = e * (t + 2 * a) + (master ? e * a : 0);
    return {kernel("adamw_group_kernel", "AdamW", read, written, 16 * e, kVector)};
}

std::vector<KernelCost> memset(double bytes, const std::string& op) {
    return {kernel("memset", op, 0, bytes, 0, Roofline::memory_vector)};
}
std::vector<KernelCost> memcpy(double bytes, const std::string& op) {
    return {kernel("memcpy", op, bytes, bytes, 0, Roofline::memory_vector)};
}

std::vector<KernelCost> gemm(long long M, long long N, long long K, int t, bool accumulate, const std::string& op) {
    const double m = double(M), n = double(N), k = double(K);
    return {kernel("gemm", op, (m * k + n * k + (accumulate ? m * n : 0)) * t, m * n * t, 2 * m * n * k,
                   Roofline::cublas_gemm)};
}

// The kernels the issue-15 code replaced, where their figures differ from their replacements'.
namespace before {

// The cross-entropy backward before the forward saved each row's statistics: one block per row
// recomputing (max, sum) from the logits, then writing the gradient (cross_entropy_backward_kernel).
std::vector<KernelCost> cross_entropy_backward(long long N, int V, int t) {
    const double nv = double(N) * V;
    return {kernel("cross_entropy_backward_kernel", "cross-entropy backward", nv * t + double(N) * 4, nv * t, 5 * nv,
                   Roofline::memory_scalar)};
}

}  // namespace before

}  // namespace cost

// The one measurement of the tensor-core attention kernels (docs/speed.md, "Measured on one
// H100"): `kernels_bench --shape llama-3.2-1b --batch 4 --seq 2048` on an H100 80GB HBM3 (B 4,
// T 2048, 32 heads, hd 64), 114 TF/s forward and 93 TF/s backward in kernels_bench's FLOPs (4·hd
// per causal score pair forward, 2.5 times that backward, whose time includes the D kernel). The
// kernels it ran (b7243bf's, unchanged to 1a887b9) issued per warp and tile-loop trip 1225
// (forward), 2138 (dK/dV) and 1458 (dQ) instructions: bench/attention_sass.py's count of
// 1a887b9's SASS (nvcc 13, -O3 device code), its inner loops expanded as they ran at hd 64 — the
// backward's four 16-row chunks 4 times, each tile copy loop once (a thread's four 16-byte pieces
// were one trip of its four-way unrolled body), the dK/dV statistics loops once. (Those copy and
// statistics loops are gone; the script refuses loops whose trip count it cannot know.) Their
// registers (kMeasured*Registers: 186, 166, 134) held 2, 3 and 3 blocks per SM; their grids and
// shared memory were today's.
IssueEfficiency attention_issue_efficiency() {
    constexpr int B = 4, T = 2048, H = 32, Hkv = 8, hd = 64;
    constexpr double kForwardFlopsPerS = 114e12, kBackwardFlopsPerS = 93e12;
    constexpr int kForward = 1225, kDkv = 2138, kDq = 1458;
    static const IssueEfficiency e = [] {
        const double flops = 4.0 * hd * (double(T) * (T + 1) / 2) * B * H;
        // The seconds each kernel of then takes at the full issue rate. Those kernels had one body,
        // masked, for every tile.
        const auto full_rate = [](const char* kernel, int trip, int registers) {
            KernelCost k;
            k.kernel = kernel;
            k.issue_efficiency = 1.0;
            cost::set_attention_issue(k, kernel, B, T, H, Hkv, hd, trip, trip, registers,
                                      0);  // (one block a key tile then)
            return issue_seconds(k);
        };
        const double forward = full_rate("forward", kForward, kMeasuredForwardRegisters);
        const double backward =
            full_rate("dkv", kDkv, kMeasuredDkvRegisters) + full_rate("dq", kDq, kMeasuredDqRegisters);
        // The D kernel of that run: a warp per row, one element per load.
        const double d_kernel = predicted_seconds(cost::attention_dot(double(B) * T, H, hd, 2, 4, false));
        return IssueEfficiency{forward / (flops / kForwardFlopsPerS),
                               backward / (2.5 * flops / kBackwardFlopsPerS - d_kernel),
                               "calibrated on the kernels' measured 114 / 93 TF/s (H100, llama-3.2-1b 4 x 2048) "
                               "and their SASS then"};
    }();
    return e;
}

namespace {

void append(std::vector<KernelCost>& out, std::vector<KernelCost> ks, double count = 1) {
    for (KernelCost& k : ks) {
        k.count = count;
        out.push_back(std::move(k));
    }
}

}  // namespace

namespace {

// A targeted module's adapter (model/lora.h lora_linears): its linear, module, input and output widths.
struct Projection {
    int linear;
    std::string module;
    long long in, out;
};

std::vector<Projection> targeted_projections(const LlamaConfig& c, const LoraConfig& lora) {
    std::vector<Projection> out;
    const std::vector<LoraLinearShape> shapes = lora_linears(c, lora);
    for (int k = 0; k < kLoraLinears; ++k)
        for (const LoraPart& p : shapes[size_t(k)].parts) out.push_back({k, p.module, shapes[size_t(k)].in, p.rows});
    return out;
}

// One adapter's GEMMs on N rows (kernels/lora.cuh): forward u = x·Aᵀ, y += s·u·Bᵀ (u alone when
// only_u); backward du = s·dy·B, dB += s·dyᵀ·u, dA += duᵀ·x, dx += du·A.
std::vector<KernelCost> adapter_forward(long long N, const Projection& p, int r, int t, bool only_u = false) {
    const std::string m = p.module;
    std::vector<KernelCost> k = cost::gemm(N, r, p.in, t, false, m + " adapter: u = x·Aᵀ");
    if (!only_u) append(k, cost::gemm(N, p.out, r, t, true, m + " adapter: y += s·u·Bᵀ"));
    return k;
}
std::vector<KernelCost> adapter_backward(long long N, const Projection& p, int r, int t) {
    const std::string m = p.module;
    std::vector<KernelCost> k = cost::gemm(N, r, p.out, t, false, m + " adapter backward: du");
    append(k, cost::gemm(p.out, r, N, t, true, m + " adapter backward: dB"));
    append(k, cost::gemm(r, p.in, N, t, true, m + " adapter backward: dA"));
    append(k, cost::gemm(N, p.in, r, t, true, m + " adapter backward: dx"));
    return k;
}

}  // namespace

// Tensor parallelism's gradient sums: a share added to the gradient after the group's sum.
const char* const kShareAdded = "tensor parallelism: gradient share added";

namespace {
// ZeRO-2/3's rotating gradient buffers (parallel/gradients_rotating.h): which units' buffers are
// zeroed as they are bound, per micro-step once the binding order repeats (a buffer is zeroed
// where its last unit had another layout: here, another kind of unit; a unit bound after one of
// its own kind is written over). Units are bound from the head down, each to the buffer
// rotating_gradient_buffer names (the strategy's own rule, model/parameters.h).
struct RotatingZeroed {
    int blocks = 0;
    bool head = false, embedding = false;
};
RotatingZeroed rotating_zeroed(int L, bool tied) {
    enum Kind { embedding, block, head };
    int occupant[3] = {-1, -1, -1};
    RotatingZeroed z;
    for (int pass = 0; pass < 2; ++pass) {  // the second micro-step is every later one
        z = {};
        for (int u = L + 1; u >= 0; --u) {
            const int kind = u == 0 ? embedding : u == L + 1 ? head : block;
            const int b = rotating_gradient_buffer(u, L + 1, tied);
            if (occupant[b] != kind) {
                if (kind == block) ++z.blocks;
                if (kind == head) z.head = true;
                if (kind == embedding) z.embedding = true;
            }
            occupant[b] = kind;
        }
    }
    return z;
}
}  // namespace

std::vector<KernelCost> step_kernels(const StepShape& s, KernelSet set, const Device& d) {
    const LlamaConfig c = tensor_parallel_shape(s.config, {s.tensor, 0});  // every rank's shape is rank 0's
    const int t = s.t, a = 4, C = c.hidden_size, F = c.ffn_size, V = c.vocab_size, hd = c.head_dim_resolved();
    const int H = c.num_heads, Hkv = c.num_kv_heads, L = c.num_layers;
    const long long N = (long long)s.batch * s.seq_len;
    // The norms' and residual adds' rows: this rank's N/T under sequence parallelism.
    const long long R = s.sequence && s.tensor > 1 ? N / s.tensor : N;
    const double micro = s.accumulation, layers = double(L) * micro;
    const long long distinct = std::min<long long>(std::min<long long>(N, 4096), V);  // per chunk, at most
    const bool now = set == KernelSet::now;
    const bool lora = s.lora.enabled(), full = !lora;  // full: the base weights train
    if (lora && !now) throw std::invalid_argument("step_kernels: LoRA is priced with today's kernels only");
    const std::vector<Projection> targeted = targeted_projections(c, s.lora);
    // A block's trainable elements (its adapters' with LoRA, whose base is frozen), and the model's.
    double block_params = double(c.qkv_width()) * C + double(C) * c.q_width() + 3.0 * C * F + 2.0 * C;
    if (lora) {
        block_params = 0;
        for (const Projection& p : targeted) block_params += double(s.lora.rank) * double(p.in + p.out);
    }
    const double embedding = double(V) * C, head = (c.tie_embeddings ? 0 : double(V) * C) + C;
    const double params = lora ? L * block_params : embedding + L * block_params + head;
    // The base's weight gradient GEMMs, only when it trains. Today's first micro-step writes over
    // the gradient (Llama::discard_grads: β = 0, the old gradient not read); the other micro-steps
    // add to it. ZeRO-2/3: every micro-step binds fresh buffers, written over but where a buffer
    // is zeroed as it is bound (a block after the head or the embedding), whose GEMMs add.
    const RotatingZeroed zeroed = rotating_zeroed(L, c.tie_embeddings);
    const double written_over = !now                   ? 0
                                : s.rotating_gradients ? double(L - zeroed.blocks) / L
                                                       : 1.0 / micro;  // of a block's dW GEMMs
    const auto weight_gradient = [&](std::vector<KernelCost>& k, long long rows, long long cols, const char* op,
                                     double count) {
        if (!full) return;
        const double first = count * written_over;  // count: per micro-step times micro
        if (first > 0) append(k, cost::gemm(rows, cols, N, t, false, op), first);
        if (count > first) append(k, cost::gemm(rows, cols, N, t, true, op), count - first);
    };
    // A block's forward, `count` times; a recompute (activation checkpointing) stops before the
    // down projection, whose output and the residual add's the block keeps, and of the down
    // adapter computes u alone, which its backward reads (model/llama.cu forward_block).
    // Attention on tensor cores where this code has the kernel (bf16, and a head dim the SASS
    // table lists: the dispatch's own instantiations, kernels/attention.cuh), else on CUDA cores.
    // The dispatch's choice (kernels/attention.cuh): tensor cores for bf16 at their head dims, where
    // the device lets their blocks have the shared memory they take.
    const bool mma_forward = now && t == 2 && attention_tile_instructions("forward", hd, false, d.sass_arch) > 0 &&
                             attention_mma_forward_fits(hd, d.sm.shared_bytes_per_block);
    const bool mma_backward = now && t == 2 && attention_tile_instructions("dkv", hd, false, d.sass_arch) > 0 &&
                              attention_mma_backward_fits(hd, d.sm.shared_bytes_per_block);
    const auto block_forward = [&](std::vector<KernelCost>& k, double count, bool recompute) {
        std::vector<KernelCost> f;
        append(f, cost::rmsnorm_forward(R, C, t, a));
        append(f, cost::gemm(N, c.qkv_width(), C, t, false, "q, k, v projection"));
        append(f, cost::rope(N, H, hd, t, a, false, s.seq_len));
        append(f, cost::rope(N, Hkv, hd, t, a, false, s.seq_len));
        append(f, mma_forward ? cost::attention_forward(s.batch, s.seq_len, H, Hkv, hd, t, a, false, d)
                              : cost::attention_forward_cuda_cores(s.batch, s.seq_len, H, Hkv, hd, t, a, false));
        append(f, cost::gemm(N, C, c.q_width(), t, false, "output projection"));
        // The block's closing residual add as the down GEMM's β = 1 (today's kernels only).
        const bool fused_residual = now && residual_add_in_down_gemm(s.tensor, recompute);
        append(f, cost::residual_rmsnorm_forward(R, C, t, a, fused_residual));
        append(f, cost::gemm(N, 2LL * F, C, t, false, "gate, up projection"));
        append(f, cost::swiglu_forward(N, F, t));
        if (fused_residual) {
            append(f, cost::gemm(N, C, F, t, true, "down projection, onto the residual"));
        } else if (!recompute) {
            append(f, cost::gemm(N, C, F, t, false, "down projection"));
            append(f, cost::add(R * C, t));
        }
        for (const Projection& p : targeted)
            append(f, adapter_forward(N, p, s.lora.rank, t, recompute && p.linear == kLoraDown));
        if (recompute)
            for (KernelCost& x : f) x.op = "recompute: " + x.op;
        append(k, std::move(f), count);
    };
    int recomputed = 0;
    for (int i = 0; i < L; ++i) recomputed += s.checkpointing.recomputes(i);
    std::vector<KernelCost> k;
    append(k, cost::count_targets(N), micro);
    // Forward.
    append(k, cost::embedding_forward(N, C, distinct, t), micro);
    block_forward(k, layers, false);
    append(k, cost::rmsnorm_forward(R, C, t, a), micro);
    if (!now) {
        append(k, cost::gemm(N, V, C, t, false, "lm_head"), micro);
        append(k, cost::cross_entropy_forward(N, V, t, a), micro);
    }
    const size_t backward_from = k.size();
    // Backward.
    if (now) {  // the fused linear cross-entropy (model/llama.h): the loss computed with its gradient
        const long long chunk = head_chunk_rows(N, V, t == 2 ? DType::bf16 : t == 4 ? DType::fp32 : DType::fp64);
        const long long chunks = (N + chunk - 1) / chunk, last = N - (chunks - 1) * chunk;
        const auto per_chunk = [&](auto&& kernels) {  // every chunk but the last, then the last
            if (chunks > 1) append(k, kernels(chunk), micro * double(chunks - 1));
            append(k, kernels(last), micro);
        };
        per_chunk([&](long long n) {
            std::vector<KernelCost> h = cost::gemm(n, V, C, t, false, "lm_head (a chunk of rows)");
            if (s.tensor > 1) {
                append(h, cost::cross_entropy_vocabulary_parallel_rows(n, V, s.tensor, t, a));
                append(h, cost::cross_entropy_backward(n, V, t, a));
            } else {
                append(h, cost::cross_entropy_loss_and_gradient(n, V, t, a));
            }
            append(h, cost::gemm(n, C, V, t, false, "lm_head backward: dX"));
            if (full) append(h, cost::gemm(V, C, n, t, true, "lm_head backward: dW"));
            return h;
        });
        append(k, cost::cross_entropy_sum(N, a), micro);
    } else {
        append(k, cost::before::cross_entropy_backward(N, V, t), micro);
        append(k, cost::gemm(N, C, V, t, false, "lm_head backward: dX"), micro);
        weight_gradient(k, V, C, "lm_head backward: dW", micro);
    }
    if (!now) append(k, cost::memset(double(N) * C * t, "head: residual gradient zeroed"), micro);
    append(k, cost::rmsnorm_backward(R, C, t, a, full), micro);
    if (recomputed > 0) block_forward(k, double(recomputed) * micro, true);
    if (!now) append(k, cost::memcpy(double(N) * C * t, "residual gradient copy"), layers);
    append(k, cost::gemm(N, F, C, t, false, "down backward: dX"), layers);
    weight_gradient(k, C, F, "down backward: dW", layers);
    append(k, cost::swiglu_backward(N, F, t), layers);
    append(k, cost::gemm(N, C, 2LL * F, t, false, "gate, up backward: dX"), layers);
    weight_gradient(k, 2LL * F, C, "gate, up backward: dW", layers);
    append(k, cost::rmsnorm_backward(R, C, t, a, full), layers);
    append(k, cost::gemm(N, c.q_width(), C, t, false, "output backward: dX"), layers);
    weight_gradient(k, C, c.q_width(), "output backward: dW", layers);
    if (mma_backward) {
        append(k, cost::attention_backward(s.batch, s.seq_len, H, Hkv, hd, t, a, false, d), layers);
    } else {  // the same D kernel, then the CUDA-core kernels
        append(k, {cost::attention_dot(double(s.batch) * s.seq_len, H, hd, t, a)}, layers);
        append(k, cost::attention_backward_cuda_cores(s.batch, s.seq_len, H, Hkv, hd, t, a, false), layers);
    }
    append(k, cost::rope(N, H, hd, t, a, false, s.seq_len), layers);
    append(k, cost::rope(N, Hkv, hd, t, a, false, s.seq_len), layers);
    append(k, cost::gemm(N, C, c.qkv_width(), t, false, "q, k, v backward: dX"), layers);
    const long long kv_rows = replicated_kv_rows(s.config, s.tensor);  // > 0: the kv heads replicated
    if (kv_rows == 0) {
        weight_gradient(k, c.qkv_width(), C, "q, k, v backward: dW", layers);
    } else if (full) {  // the query rows at once; the key and value rows into the buffer that is summed
        weight_gradient(k, c.q_width(), C, "q backward: dW", layers);
        append(k, cost::memset(double(kv_rows) * C * t, "replicated kv heads: weight gradient share zeroed"), layers);
        append(k, cost::gemm(hd, C, N, t, false, "k, v backward: dW share"), 2 * layers);
        append(k, cost::add((long long)hd * C, t, kShareAdded), 2 * layers);
    }
    append(k, cost::rmsnorm_backward(R, C, t, a, full), layers);
    for (const Projection& p : targeted) append(k, adapter_backward(N, p, s.lora.rank, t), layers);
    if (s.tensor > 1) {  // the gradient sums over the group (model/llama.cu linear_backward), zeroed then added
        const std::vector<LoraLinearShape> shapes = lora_linears(c, s.lora);
        for (int j = 0; j < kLoraLinears; ++j) {
            const LoraLinearShape& a = shapes[size_t(j)];
            if (a.parts.empty()) continue;
            const double whole =
                column_parallel(j) ? double(a.a_rows(s.lora.rank)) * a.in : double(a.b_rows()) * s.lora.rank;
            append(k, cost::memset(whole * t, "tensor parallelism: adapter gradient share zeroed"), layers);
            append(k, cost::add((long long)whole, t, kShareAdded), layers);
        }
        // Replicated kv heads with W_qkv's adapter on k or v: B's gradient into a share, its kv
        // parts copied into the buffer that is summed, every part added back.
        const LoraLinearShape& qkv = shapes[size_t(kLoraQkv)];
        const double kv_b_rows = double(adapter_kv_rows(c, s.lora));
        if (kv_rows > 0 && kv_b_rows > 0) {
            const double r = s.lora.rank;
            append(k, cost::memset(double(c.qkv_width()) * r * t, "replicated kv heads: B gradient share zeroed"),
                   layers);
            append(k, cost::memset(double(kv_rows) * r * t, "replicated kv heads: B gradient sum zeroed"), layers);
            append(k, cost::memcpy(kv_b_rows * r * t, "replicated kv heads: B gradient share copied"), layers);
            for (const LoraPart& p : qkv.parts)
                append(k, cost::add((long long)p.rows * s.lora.rank, t, kShareAdded), layers);
        }
    }
    if (full && R < N) {  // sequence parallelism: each norm weight's gradient share, zeroed then added
        append(k, cost::memset(double(C) * t, "sequence parallelism: norm gradient share zeroed"), 2 * layers + micro);
        append(k, cost::add(C, t, kShareAdded), 2 * layers + micro);
    }
    // What is still zeroed (Llama::discard_grads), now in the backward: of ZeRO-2/3's rotating
    // buffers, those bound where the layout changes, every micro-step; or an untied embedding's
    // gradient.
    if (now) {
        if (s.rotating_gradients) {
            const double elements = zeroed.blocks * block_params + (zeroed.head && full ? head : 0) +
                                    (zeroed.embedding && full && !c.tie_embeddings ? embedding : 0);
            append(k, cost::memset(elements * t, "gradient buffers zeroed where the unit's layout changes"), micro);
        } else if (full && !c.tie_embeddings)  // the scatter-add adds; a tied one is the lm_head's, written over
            append(k, cost::memset(double(V) * C * t, "embedding gradient zeroed"), 1);
    }
    if (full) append(k, cost::embedding_backward(N, C, distinct, t), micro);
    for (size_t i = backward_from; i < k.size(); ++i) k[i].phase = StepPhase::backward;
    const size_t update_from = k.size();
    const auto updates = [&] {  // what follows is the optimizer step's
        for (size_t i = update_from; i < k.size(); ++i) k[i].phase = StepPhase::update;
    };
    // The optimizer step: (before today's code: gradients zeroed,) the norm, the update.
    const double z = s.optimizer_shards;  // each rank's share of the norm and the update
    // LoRA: each block's adapters are its unit's trainable tensors; nothing else trains.
    if (lora) {
        append(k, cost::sum_of_squares((long long)(block_params / z), t, true), L);
        append(k, cost::adamw((long long)(block_params / z), t, t, a, 2 * int(targeted.size())), L);
        updates();
        return k;
    }
    const int head_tensors = c.tie_embeddings ? 1 : 2;
    if (!now) append(k, cost::memset(params * t, "gradients zeroed"), 1);
    append(k, cost::sum_of_squares((long long)(block_params / z), t, true), L);
    append(k, cost::sum_of_squares((long long)(embedding / z), t, true), 1);
    append(k, cost::sum_of_squares((long long)(head / z), t, true), 1);
    if (now) {  // one launch per unit
        append(k, cost::adamw((long long)(block_params / z), t, t, a, 6), L);
        append(k, cost::adamw((long long)(embedding / z), t, t, a, 1), 1);
        append(k, cost::adamw((long long)(head / z), t, t, a, head_tensors), 1);
    } else {  // one launch per tensor: six per block, the embedding, the final norm, an untied lm_head
        const double tensors = 6.0 * L + 1 + head_tensors;
        KernelCost opt = cost::adamw((long long)(params / z), t, t, a, 0)[0];
        opt.op = "AdamW (" + std::to_string(int(tensors)) + " launches)";
        k.push_back(opt);
    }
    if (!now)  // the kernels were scalar: one 2- or 4-byte access in flight per thread
        for (KernelCost& x : k)
            if ((x.roofline == Roofline::memory_vector || x.roofline == Roofline::memory_rows) &&
                x.kernel != "memset" && x.kernel != "memcpy")
                x.roofline = Roofline::memory_scalar;
    updates();
    return k;
}

PhaseSeconds predict_phases(const StepShape& s, KernelSet set, const Device& d) {
    PhaseSeconds p;
    for (const KernelCost& k : step_kernels(s, set, d))
        (k.phase == StepPhase::forward    ? p.forward
         : k.phase == StepPhase::backward ? p.backward
                                          : p.update) += predicted_seconds(k, d) * k.count;
    return p;
}

StepPrediction predict_step(const StepShape& s, KernelSet set, const Device& d) {
    StepPrediction p;
    for (const KernelCost& k : step_kernels(s, set, d)) p.seconds += predicted_seconds(k, d) * k.count;
    p.model_flops =
        training_flops_per_token(s.config, s.seq_len) * double(s.batch) * s.seq_len * s.accumulation / s.tensor;
    p.mfu = p.model_flops / (p.seconds * d.tensor_bf16_flops);
    return p;
}

}  // namespace pv
