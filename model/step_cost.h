// The performance model: every kernel of a training step with the bytes it moves and the FLOPs
// it does, and the time an H100 SXM would take for them.
//
// Bytes. For each kernel, the device bytes it reads and writes, each byte counted once however
// often the kernel touches it: the DRAM traffic when reuse is served on chip (a tile read by
// several blocks stays in the 50 MB L2; a row read twice stays in L1/L2). Each formula is counted
// from the kernel's loops (what each thread loads and stores, over the whole grid) and is checked
// against what the kernel's code really touches: test/traffic/test_kernel_traffic.cu runs every
// kernel on the host with every access instrumented (host/access_meter.h) and requires the
// measured distinct bytes read and written to equal these formulas exactly. GEMMs run in cuBLAS
// (OpenBLAS on the host, not instrumented): A and B read once, C written (and read when β = 1).
//
// FLOPs: multiply-adds count 2. For matrix products they are exact (2·M·N·K); for the
// bandwidth-bound kernels they are an order of magnitude, irrelevant to their time.
//
// Time. A kernel runs on a roofline: max(bytes / (HBM bandwidth · e_mem), FLOPs / (peak of its
// unit · e_unit)), with efficiencies stated and sourced in step_cost.cpp (kRooflines). The
// tensor-core attention kernels are bound by instruction issue instead: their time is also at
// least that of issuing their warps' instructions (model/attention_sass.h, read from the kernels'
// own SASS), block by block as their grid is dispatched on the SMs (model/grid_dispatch.h; blocks
// per SM from ptxas's registers), each SM issuing four instructions per clock (one per scheduler)
// times an issue efficiency calibrated once on their measured speed (attention_issue_efficiency),
// so a change that removes instructions moves the prediction without a GPU. A step is
// the sum of its kernels (one stream: no overlap assumed between kernels) plus the exposed
// communication of its strategy. Host code only.
#pragma once

#include "kernels/attention_mma_blocks.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/grid_dispatch.h"
#include "model/lora.h"

#include <string>
#include <vector>

namespace pv {

// Where a kernel's time goes and how well it uses it (efficiencies in step_cost.cpp).
enum class Roofline {
    cublas_gemm,          // cuBLAS bf16 GEMM on tensor cores
    attention_mma,        // our flash attention on tensor cores (mma.sync, FA2 structure)
    attention_cuda_core,  // our flash attention on CUDA cores (scalar FMAs from shared memory)
    memory_vector,        // bandwidth-bound, 16-byte accesses, several in flight per thread
    memory_rows,          // bandwidth-bound row kernels with a reduction per row (RMSNorm)
    memory_scalar,        // bandwidth-bound, one 2- or 4-byte access in flight per thread
};
const char* roofline_name(Roofline r);

// Where in a step a kernel runs: the micro-batches' forwards, their backwards (with any
// recompute of activation checkpointing), or the optimizer step after them.
enum class StepPhase { forward, backward, update };

struct KernelCost {
    std::string kernel;  // the kernel function's name as the host meter reports it, or memset/memcpy/gemm
    std::string op;      // what it does in the step
    double read_bytes = 0, written_bytes = 0, flops = 0;
    Roofline roofline = Roofline::memory_scalar;
    // Issue-bound kernels (the tensor-core attention): the instructions all warps of the launch
    // issue, and the fraction of the issue rate they reach (0: not priced by issue).
    double warp_instructions = 0, issue_efficiency = 0;
    // Their blocks: threads, registers per thread (from ptxas) and shared memory per block, and the
    // warp instructions each block issues, in launch order. The issue time is then the grid's
    // dispatch on the SMs (model/grid_dispatch.h: blocks spread in launch order, each SM's rate
    // shared by the blocks it holds); without blocks, warp_instructions over the whole GPU's rate.
    int block_threads = 0, block_registers = 0;
    size_t block_shared = 0;
    std::vector<BlockRun> blocks;
    double count = 1;                      // launches of it per step with these figures
    StepPhase phase = StepPhase::forward;  // set by step_kernels
    double bytes() const { return read_bytes + written_bytes; }
};

// A GPU's figures the model uses; the default is the H100 SXM5. The roofline efficiencies
// (step_cost.cpp) are the H100's for every device: a prediction for another GPU assumes cuBLAS and
// our kernels reach the same fraction of its peaks.
struct Device {
    const char* name = "H100 SXM5 (80 GB HBM3)";
    double hbm_bytes_per_s = 3.35e12;       // datasheet
    double tensor_bf16_flops = 989.4e12;    // dense bf16, model/flops.h
    double cuda_core_fp32_flops = 66.9e12;  // datasheet: 132 SMs · 128 FP32 lanes · 2 · 1.98 GHz
    int sms = 132;                          // datasheet
    double clock_hz = 1.98e9;               // boost clock (the clock an H100 reports under load)
    SmLimits sm;                            // compute capability 9.0's
    // The SASS of the CUDA build this GPU runs (the Makefile's SASS_ARCHS, 80 and 90: a GPU runs the
    // newest one of its major version not above its compute capability), whose attention kernels'
    // instruction counts and registers (model/attention_sass.h) price their issue.
    int sass_arch = 90;
    // The link between two GPUs, one direction, as published (what a collective reaches of it is
    // the user's assumption, stated where it is used): NVLink 4, 900 GB/s both ways (datasheet).
    double link_bytes_per_s = 450e9;
    const char* link = "NVLink 4: 450 GB/s each way";
};
// The RTX 6000 Ada Generation (48 GB GDDR6, PCIe 4.0 x16, no NVLink), from NVIDIA's datasheet
// ("NVIDIA RTX 6000 Ada Generation", 2022) and the Ada whitepaper ("NVIDIA Ada GPU Architecture",
// 2023, appendix table of the RTX 6000 Ada):
//   tensor bf16, dense, FP32 accumulate  364.2 TFLOPS (whitepaper; the datasheet's 1,457 TFLOPS is
//                                        FP8 with sparsity, 4x that: 142 SMs · 1024 FLOP/clk · 2.505 GHz)
//   fp32 CUDA cores                      91.1 TFLOPS (datasheet: 18,176 cores · 2 · 2.505 GHz)
//   memory                               960 GB/s (datasheet)
//   SMs, clock                           142 at 2505 MHz boost (datasheet); the issue-bound
//                                        attention kernels are priced with the sm_80 SASS's
//                                        instruction counts and registers (compute capability 8.9
//                                        runs the build's sm_80 code) and the H100's issue efficiency
//   link                                 PCIe 4.0 x16: 32 GB/s each way (64 GB/s both, datasheet)
//   per SM (compute capability 8.9)      65,536 registers, 100 KiB shared memory (99 KiB a block),
//                                        1,536 threads, 24 blocks (CUDA C++ Programming Guide)
Device rtx_6000_ada();

// Predicted seconds of one kernel launch (count ignored), and the efficiencies behind it.
double predicted_seconds(const KernelCost& k, const Device& d = {});
struct RooflineEfficiency {
    double e_mem, e_unit;
    const char* source;
};
RooflineEfficiency roofline_efficiency(Roofline r);

// The tensor-core attention kernels' issue-rate model. Instructions one warp issues per trip of a
// kernel's tile loop ("forward", "forward-32rows", "dkv", "dkv-32rows", "dkv-swizzled", "dq", "dq-32rows") at
// head dim hd in the SASS for sass_arch (Device::sass_arch), from model/attention_sass.h, through
// an interior tile or (masked) one with masks (the diagonal's); 0 where the kernel has no such
// instantiation (that head dim runs on the CUDA-core kernels).
int attention_tile_instructions(const std::string& kernel, int hd, bool masked = false, int sass_arch = 90);
// Seconds to issue `warp_instructions` at `efficiency` of the device's issue rate.
double issue_seconds(double warp_instructions, double efficiency, const Device& d = {});
// Seconds to issue an issue-bound kernel's instructions at its efficiency: its blocks dispatched
// on the device's SMs (as many resident per SM as resident_blocks allows), or, without blocks, its
// warp_instructions over the whole GPU's rate. Throws, naming the kernel and the limit, when one of
// its blocks cannot launch on the device.
double issue_seconds(const KernelCost& k, const Device& d = {});
// Registers per thread of a tensor-core attention kernel ("forward", "forward-32rows", "dkv",
// "dkv-32rows", "dkv-swizzled", "dq", "dq-32rows") at head dim hd in the SASS for sass_arch (model/attention_sass.h,
// from ptxas), the instantiation a block per tile or, with split, the one that splits tiles into
// segments; 0 where it has no such instantiation.
int attention_kernel_registers(const std::string& kernel, int hd, int sass_arch = 90, bool split = false);
// The fraction of the issue rate the kernels reach, forward and backward (dK/dV and dQ), from
// their one measurement: the seconds their instructions of then would take at the full issue rate
// over the seconds they took (step_cost.cpp states the measurement and the counts).
struct IssueEfficiency {
    double forward, backward;
    const char* source;
};
IssueEfficiency attention_issue_efficiency();

// Per-kernel formulas, one per launch, counted from the kernels' loops. t: the storage type's
// bytes, a: its accumulator's (acc_t<T>). N rows of C channels; see each kernel header.
namespace cost {
std::vector<KernelCost> rmsnorm_forward(long long N, int C, int t, int a);
std::vector<KernelCost> residual_rmsnorm_forward(long long N, int C, int t, int a, bool copy = false);
std::vector<KernelCost> rmsnorm_backward(long long N, int C, int t, int a, bool weight_grad);
std::vector<KernelCost> swiglu_forward(long long N, int F, int t);
std::vector<KernelCost> swiglu_backward(long long N, int F, int t);
// table_rows: the distinct positions of the N rows (the RoPE table's rows read).
std::vector<KernelCost> rope(long long N, int heads, int hd, int t, int a, bool positions, long long table_rows);
std::vector<KernelCost> add(long long n, int t, const std::string& op = "residual add");
// bf16 at head dims 64 and 128: the tensor-core forward with the warps the device's shared memory
// gives it (attention_forward_kind), its issue priced from the SASS it runs (Device::sass_arch).
std::vector<KernelCost> attention_forward(int B, int T, int H, int Hkv, int hd, int t, int a, bool positions,
                                          const Device& d = {});
// "forward-32rows" where the device runs the forward with warps of 32 rows at head dim hd
// (kernels/attention_mma_blocks.h attention_mma_forward_row_tiles: hd 64 on an H100), else "forward".
const char* attention_forward_kind(int hd, const Device& d = {});
// A tensor-core attention kernel's block as launched (kernels/attention_mma_blocks.h): its threads
// (every warp runs the tile loop once per 64×64 tile pair the block walks; "forward-32rows",
// "dkv-32rows" and "dq-32rows" 2 warps, the others 4) and dynamic shared memory.
struct AttentionBlock {
    int threads = 0;
    size_t shared = 0;
};
AttentionBlock attention_block(const std::string& kernel, int hd);
// Sets k's issue-bound figures for a tensor-core attention kernel ("forward", "forward-32rows", "dkv",
// "dkv-32rows", "dkv-swizzled", "dq", "dq-32rows": model/attention_sass.h) at this
// shape: its blocks in launch order, heaviest first (attention_block's warps each, each running the
// tile loop once per 64×64 tile pair the block walks, `interior` instructions a trip and `masked` for
// the diagonal's), `registers` per thread and the kernel's shared memory per block. attention_forward
// and attention_backward pass today's kernels' counts (model/attention_sass.h); the calibration
// passes those of the kernels it measured. The kernels' blocks are their tiles' segments
// of at most segment_steps steps (0: one block a tile; −1: the shape's split,
// attention_mma_dkv_segment_steps or attention_mma_query_segment_steps).
void set_attention_issue(KernelCost& k, const char* kernel, int B, int T, int H, int Hkv, int hd, int interior,
                         int masked, int registers, int segment_steps = -1);
// The CUDA-core forward.
std::vector<KernelCost> attention_forward_cuda_cores(int B, int T, int H, int Hkv, int hd, int t, int a,
                                                     bool positions);
// bf16 at a head dim that is a multiple of 16 from 32 to 128: the D kernel and the tensor-core kernels
// with the blocks the device's shared memory gives them (attention_dkv_kind, attention_dq_kind), their
// issue priced from the SASS it runs (Device::sass_arch). dkv_segment_steps: dK/dV's tiles cut into
// segments of at most that many steps (0: one block a tile), in place of the shape's split (−1,
// attention_mma_dkv_segment_steps): how perf_model prices other segment lengths.
std::vector<KernelCost> attention_backward(int B, int T, int H, int Hkv, int hd, int t, int a, bool positions,
                                           const Device& d = {}, int dkv_segment_steps = -1);
// "dkv-swizzled" where the device's shared memory is too small for the padded dK/dV block
// (kernels/attention_mma_blocks.h attention_mma_dkv_rows: hd 128 on sm_86/sm_89), "dkv-32rows" where
// the device runs dK/dV with warps of 32 keys at this shape (attention_mma_dkv_row_tiles: hd 64 on an
// H100, a grid large enough), else "dkv".
const char* attention_dkv_kind(int hd, const Device& d, int B, int T, int H, int Hkv);
// "dq-32rows" where the device runs dQ with warps of 32 rows at head dim hd (attention_mma_dq_row_tiles:
// hd 64 on an H100 or A100), else "dq".
const char* attention_dq_kind(int hd, const Device& d = {});
// D = rowwise dO·O (attention_backward_dot_kernel) over `rows` rows of H heads: out and dout read, D
// written; 16-byte loads where a row is whole 16-byte vectors (the model's buffers are aligned),
// else a warp per row of one-element loads. `vectors` false prices the latter: the kernel of the
// run the attention issue efficiencies are calibrated on.
KernelCost attention_dot(double rows, int H, int hd, int t, int a, bool vectors = true);
// The CUDA-core dK/dV and dQ kernels (without the D kernel).
std::vector<KernelCost> attention_backward_cuda_cores(int B, int T, int H, int Hkv, int hd, int t, int a,
                                                      bool positions);
std::vector<KernelCost> cross_entropy_forward(long long N, int V, int t, int a);
std::vector<KernelCost> cross_entropy_backward(long long N, int V, int t, int a);
// The fused linear cross-entropy's one pass over a chunk of N rows (loss and gradient, no sum), and
// the sum of all the rows' losses after the last chunk.
std::vector<KernelCost> cross_entropy_loss_and_gradient(long long N, int V, int t, int a);
std::vector<KernelCost> cross_entropy_sum(long long N, int a);
// The vocabulary-parallel rows of a chunk: partials and merge (no sum).
std::vector<KernelCost> cross_entropy_vocabulary_parallel_rows(long long N, int V, int ranks, int t, int a);
// distinct: the number of distinct valid tokens among the N.
std::vector<KernelCost> embedding_forward(long long N, int C, long long distinct, int t);
std::vector<KernelCost> embedding_backward(long long N, int C, long long distinct, int t);
std::vector<KernelCost> count_targets(long long N);
std::vector<KernelCost> sum_of_squares(long long n, int g, bool accumulate);
// One AdamW launch over the n tensor elements of an owned range made of `pieces` tensor pieces:
// parameters t, gradients g bytes, master (when t < 4) and m, v in a.
std::vector<KernelCost> adamw(long long n, int t, int g, int a, int pieces);
std::vector<KernelCost> memset(double bytes, const std::string& op);
std::vector<KernelCost> memcpy(double bytes, const std::string& op);
// y[M][N] = x[M][K]·W[N][K]ᵀ (+ the backward's two, dW accumulating).
std::vector<KernelCost> gemm(long long M, long long N, long long K, int t, bool accumulate, const std::string& op);
// The kernels the issue-15 code replaced, where their figures differ from their replacements'
// (held against those kernels by test_kernel_traffic until they were replaced: git history).
namespace before {
std::vector<KernelCost> cross_entropy_backward(long long N, int V, int t);
}  // namespace before
}  // namespace cost

// The shape of one training step of one rank: micro-batch `batch` × `seq_len`, `accumulation`
// micro-steps per optimizer step, storage bytes t (bf16: 2); under ZeRO each rank forms the norm
// of and updates 1/optimizer_shards of the parameters. Full fine-tuning, or with `lora` enabled
// LoRA: the base frozen (no weight gradients: every dW GEMM, the embedding's backward and the
// norms' weight gradients drop out), each targeted projection's adapter adding its six small GEMMs
// (model/lora.h), the optimizer over the adapters alone. LoRA's dropout is not priced (its
// elementwise passes over each targeted input: price with dropout 0).
struct StepShape {
    LlamaConfig config;
    int batch = 1, seq_len = 2048, accumulation = 1;
    int t = 2;
    int optimizer_shards =
        1;  // ranks the optimizer state is split over (ZeRO: its shard group, by default the world; else 1)
    // ZeRO-2/3 (parallel/gradients_rotating.h): each micro-step's backward writes over freshly
    // bound full-size gradient buffers, but zeroes those bound where the unit's layout changes (the
    // head, an untied embedding, one or two blocks); the other policies' first micro-step writes over
    // the gradient and the others add.
    bool rotating_gradients = false;
    LoraConfig lora{};  // rank 0: full fine-tuning
    // Each recomputing block runs its forward again before its backward, less the down projection
    // and the residual add (their output is what the block keeps): model/activations.h.
    ActivationCheckpointing checkpointing{};
    // --tp: one rank of a tensor-parallel group of this size, which computes at its shape
    // (model/tensor_parallel.h tensor_parallel_shape: its heads, ffn and vocabulary rows; rank 0's,
    // the most rows) and whose adapters and optimizer step are its slices'; the cross-entropy
    // vocabulary-parallel (partials, merge); plus each micro-batch's
    // gradient sums of LoRA's whole matrices and of replicated kv heads (a zeroing and an
    // accumulate per sum). The group's all-reduces are communication (parallel/comm_cost.h
    // tensor_parallel_wire), not priced here; model_flops is the rank's 1/T of the step's.
    int tensor = 1;
    // --sequence-parallel (with tensor > 1): the norms and the residual adds on the rank's N/T rows,
    // and each trained norm weight's gradient share zeroed and added (its sum is communication).
    bool sequence = false;
};

// Which kernels: those of the issue-15 code (now), or those it replaced (before), for the
// side-by-side comparison.
enum class KernelSet { before, now };

// Every launch of one optimizer step (count = launches with those figures), on device d: its
// shared memory per block decides, as in the dispatch, whether attention runs on tensor cores.
std::vector<KernelCost> step_kernels(const StepShape& s, KernelSet set, const Device& d = {});

struct StepPrediction {
    double seconds = 0;      // the sum of the kernels' predicted times
    double model_flops = 0;  // model/flops.h's training FLOPs of the step's tokens
    double mfu = 0;          // model_flops / (seconds · peak)
};
StepPrediction predict_step(const StepShape& s, KernelSet set, const Device& d = {});

// The same seconds by phase (forward + backward + update = predict_step's): what a pipeline
// schedule's simulator takes for a stage's forward and backward (bench/pipeline_table.cpp,
// bench/trelis_table.cpp), per micro-batch when s.accumulation is 1.
struct PhaseSeconds {
    double forward = 0, backward = 0, update = 0;
};
PhaseSeconds predict_phases(const StepShape& s, KernelSet set, const Device& d = {});

}  // namespace pv
