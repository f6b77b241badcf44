// The memory planner (DESIGN.md §3): every byte a training run allocates on each rank, by
// category, before anything is allocated — what `train plan` prints, what `train` checks before
// it builds the model, and what `--parallel auto` decides from.
//
// It is not a second model of the memory. It walks the same layouts the trainer allocates from:
// model_layouts (each unit's parameter groups, padded for the shards), activation_layout and
// model_workspace_layout (model/llama.h), owned_pieces (optim/optimizer.cuh), and, for the
// strategies' own buffers, the rules their constructors follow (parallel/*.h: ZeRO-2's slices and
// rotating buffers, ZeRO-3's slices and gather buffers, the pipeline's stage inputs). A test runs
// a real step for a grid of models, dtypes, strategies and rank counts and requires the measured
// peak of every model-state category to equal the plan exactly, and the total within 2%
// (test/mpi/test_mpi_planner.cu); `train` reports the same comparison after its first step.
//
// Not counted (they are not polevault's allocations): the CUDA context, cuBLAS's and NCCL's
// own buffers, and the allocator's rounding. The verdict against a GPU's memory reserves them
// (kReservedBytes, kSlackFraction), stated where it is printed. Host code.
#pragma once

#include "model/config.h"
#include "model/llama.h"
#include "model/parameters.h"
#include "parallel/comm_cost.h"
#include "parallel/plan.h"
#include "platform/device_memory.h"

#include <string>
#include <vector>

namespace pv {

// What a run is, as far as memory goes.
struct PlanRequest {
    LlamaConfig config;
    DType dtype = DType::bf16;
    GroupOptions groups;  // frozen tensors, LoRA, NF4
    StrategyOptions strategy;
    int ranks = 1;
    int micro_batch = 1, seq_len = 1;
    int accumulation = 1;                   // micro-steps per optimizer step on a rank
    ActivationCheckpointing checkpointing;  // --checkpoint-activations
    // The sample after the last step (sample_decoder_shape); 0 rows: none.
    int sample_positions = 0, sample_rows = 0;
};

// One row of a rank's table: what it is, the category device_alloc charges it to, bytes.
struct MemoryLine {
    std::string name;
    MemoryCategory category;
    double bytes = 0;
};

struct RankMemory {
    int rank = 0;
    std::string role;  // "every rank", or a pipeline stage's units
    std::vector<MemoryLine> lines;
    double category(MemoryCategory c) const;
    double device_total() const;  // every category but host memory
    double host_total() const;    // the host memory lines (MemoryCategory::pinned_host: pinned and pageable)
};

struct MemoryPlan {
    PlanRequest request;
    std::vector<RankMemory> ranks;  // one per distinct rank: one for data parallelism, one per stage for mp
    const RankMemory& largest() const;
    double peak() const { return largest().device_total(); }
};

// Throws std::invalid_argument when the strategy cannot run on request.ranks ranks.
MemoryPlan plan_memory(const PlanRequest& request);
// The collectives of `rank`'s tensor-parallel group per optimizer step (parallel/comm_cost.h
// tensor_parallel_wire) for this request: its micro-steps of micro_batch × seq_len tokens through
// the units of its pipeline stage (every unit without one), the blocks activation checkpointing
// recomputes, and the blocks whose W_qkv trains (full fine-tuning, not frozen by --freeze). Zero
// without --tp.
TensorWire plan_tensor_wire(const PlanRequest& request, int rank);

// One rank's plan: its stage's units and its tensor-parallel slices (plan_memory plans each
// stage's first rank, which holds the most of its tensor group).
RankMemory plan_rank(const PlanRequest& request, int rank);

// A GPU's memory and what polevault may use of it.
// What a process holds on the device besides polevault's own allocations: the CUDA context,
// cuBLAS/cuBLASLt workspaces, cudaMalloc's rounding. Measured on an H100 80GB (CUDA 13.0, one
// rank; nvidia-smi's used memory less the run's accounted peak): 1.31-1.41 GiB in seven
// Llama-3.2-1B and Llama-3.1-8B runs; 2.24 GiB with --offload optimizer (unexplained). That
// excess and NCCL's buffers on several ranks come out of the slack.
inline constexpr double kReservedBytes = 1.5 * (1 << 30);
inline constexpr double kSlackFraction = 0.02;  // allocation granularity and fragmentation
struct GpuMemory {
    std::string name;  // "h100-80", or "" for a number of bytes
    double bytes = 0;  // the device's memory
    double usable() const { return bytes * (1 - kSlackFraction) - kReservedBytes; }
};
// "h100-80", "a100-80", "a100-40", "l4-24", "rtx4090-24", "rtx3090-24", "t4-16", "rtx6000ada-48", or bytes with an
// optional unit ("80GB", "24GiB", "16e9"); throws std::invalid_argument listing the names.
GpuMemory parse_gpu_memory(const std::string& text);
std::vector<std::string> gpu_names();

// "12.3 GiB", "512.0 MiB", "900 B".
std::string format_bytes(double bytes);

// The plan as a table (one column per distinct rank), its total and, with `gpu`, the verdict.
std::string format_plan(const MemoryPlan& plan, const GpuMemory* gpu);

}  // namespace pv

namespace pv {

// What fits: the planner asked again with one thing changed.
// The largest micro-batch (up to `limit`) whose plan fits in `budget` bytes per rank; 0: none.
int largest_micro_batch(PlanRequest request, double budget, int limit = 1 << 16);
// The smallest rank count (up to 4096) on which `strategy` fits in `budget` per rank; 0: none;
// −1: the strategy refuses these options at every size (mp with --offload, say).
int smallest_world(PlanRequest request, const std::string& strategy, double budget);

// When a plan does not fit: the cheapest changes that would, one per line ("--micro-batch 2
// (61.2 GiB per rank)"), tried in this order: a smaller micro-batch, activation checkpointing, a
// ZeRO stage on these ranks, CPU offload, more ranks, LoRA, QLoRA. Offload, LoRA and QLoRA
// come with activation checkpointing and a smaller micro-batch when they need them to fit
// ("QLoRA: --lora-rank 16 --quantize nf4 --checkpoint-activations --micro-batch 2"). Empty
// when nothing tried fits.
std::vector<std::string> changes_that_fit(const PlanRequest& request, double budget);

// `--checkpoint-activations auto`: the fewest blocks whose recompute makes the request's plan fit
// `budget` per rank (request.checkpointing ignored): off when it fits without (first_blocks 0),
// else the first K blocks of the model (ActivationCheckpointing::first_blocks), K the smallest that
// fits — memory never grows with K (a block that recomputes frees its slots' activations and the
// stage gains at most the one recompute arena), so a bisection finds it; when even every block
// does not fit, every block (the plan then says what else would fit).
ActivationCheckpointing fewest_recomputing_blocks(PlanRequest request, double budget);

}  // namespace pv
