// The one place that knows every strategy (DESIGN.md §2): the registry of their names and what
// each needs, the validation of the options against it, and how the model must be built for it
// (model/placement.h: shards, stage, activation slots, which buffers are bound from outside).
// parallel/strategies.h constructs them; `train` and the tests use only these two. Host code only.
//
// Adding a data-parallel strategy: one row in the registry (plan.cpp) combining the parts of
// parallel/policy.h; a new part: its class in its own file beside the others (parallel/
// gradients_*.h, parameters_*.h), its costs in policy.cpp, and its case in make_strategy.
#pragma once

#include "model/config.h"
#include "model/placement.h"
#include "parallel/mesh_shape.h"
#include "parallel/policy.h"
#include "parallel/schedule.h"
#include "parallel/stages.h"

#include <string>
#include <vector>

namespace pv {

enum class StrategyKind { single, ddp, zero1, zero2, zero3, pp };

// What a strategy is and needs, known before any model exists.
struct StrategyInfo {
    StrategyKind kind;
    const char* name;
    const char* help;
    bool one_rank;      // runs on exactly one rank
    bool stages;        // a pipeline over every rank, nothing data parallel (pp)
    DataPolicy policy;  // its parts (parallel/policy.h): parameters, gradients, optimizer state
};

// Every strategy, in the order --help lists them.
const std::vector<StrategyInfo>& strategy_registry();
std::vector<std::string> strategy_names();
// Throws std::invalid_argument listing the names when `name` is none of them (or an old name).
const StrategyInfo& strategy_info(const std::string& name);
const StrategyInfo& strategy_info(StrategyKind kind);
// The kind of a strategy's name (strategy_info's checks).
inline StrategyKind strategy_kind(const std::string& name) { return strategy_info(name).kind; }
// A strategy's current name: "mp" (model parallel, the pipeline's name before 1F1B) is "pp".
std::string canonical_strategy_name(const std::string& name);

// --offload (ZeRO-Offload, optim/offload.h): where the optimizer state and, for zero3, the
// parameter slices live. optimizer: the owned range's fp32 master, Adam m and v in pinned host
// memory, AdamW on the CPU; params: that, and zero3's parameter slices in pinned host memory too.
enum class Offload { none, optimizer, params };
const char* offload_name(Offload o);
// "none", "optimizer" or "params"; throws std::invalid_argument naming them otherwise.
Offload parse_offload(const std::string& name);

// A run's parallel options, parsed (the flags' strings are TrainOptions').
struct StrategyOptions {
    StrategyKind kind = StrategyKind::single;
    // The pipeline's stages (the mesh's pipeline axis; parallel/pp.h): pp runs one per rank; ddp and
    // zero1-3 replicate each of these stages over ranks / stages data-parallel ranks. 0: pp's every
    // rank, else no pipeline.
    int pipeline_stages = 0;
    PipelineScheduleKind pipeline = PipelineScheduleKind::one_f_one_b;  // pp: the schedule (parallel/schedule.h)
    int in_flight = 0;       // pp: at most this many micro-batches in flight per stage (0: the schedule's own)
    int micro_per_step = 1;  // pipeline: micro-batches per optimizer step on each data-parallel rank
    int chunks = 1;          // pp: model chunks per rank (the interleaved schedule's V; else 1)
    StageBalance balance = StageBalance::flops;  // pipeline: how the stages are balanced (parallel/stages.h)
    bool fp32_grad_accumulation = false;
    int shard_group = 0;  // zero1-3: shard over groups of this many consecutive ranks (0: every data-parallel rank)
    Offload offload = Offload::none;
    // --tp: the ranks of a tensor-parallel group (the mesh's innermost axis; model/tensor_parallel.h),
    // each holding 1/tensor of every block matrix and computing on the same micro-batch.
    int tensor = 1;
    // --sequence-parallel: the residual stream between the tensor-parallel regions split by rows
    // over the group (model/placement.h TensorParallel::sequence); needs tensor > 1.
    bool sequence_parallel = false;
    // --cuda-graphs: each micro-step (a pipeline's: each entry of its row) captured once and
    // launched as a CUDA graph (trainer/micro_step_graphs.h), under every strategy. The model's
    // cuBLAS handle then has a workspace of its own (kCublasGraphWorkspaceBytes).
    bool cuda_graphs = false;
};

// Options `o` carried over to the strategy `name`: what that strategy cannot take (--in-flight
// without a pipeline, fp32 accumulation under rotating gradients, a shard group without shards,
// pipeline stages under single or pp) dropped. For the planner's what-ifs.
StrategyOptions with_strategy(StrategyOptions o, StrategyKind kind);

// Throws std::invalid_argument naming the problem and the fix when the options cannot run on
// `ranks` ranks. Cheap: no model needed.
void check_strategy(const StrategyOptions& o, int ranks);

// The mesh of options `o` on `ranks` ranks (parallel/mesh.h): the pipeline's stages outermost,
// then hybrid sharding's replicas, then the shards, then the tensor-parallel groups (--tp).
// Throws std::invalid_argument (check_strategy's).
MeshShape mesh_of(const StrategyOptions& o, int ranks);
// Whether the options run a pipeline (pp, or a data-parallel strategy over --pipeline-stages > 1).
bool has_pipeline(const StrategyOptions& o);

// A strategy decided for this rank: its geometry and how the model must be built.
struct StrategyPlan {
    const StrategyInfo* info = nullptr;
    StrategyOptions options;
    int rank = 0, ranks = 1;            // the world
    MeshShape mesh;                     // the world's layout (parallel/mesh.h)
    int data_rank = 0, data_ranks = 1;  // the batch is split over data_ranks (1: every rank sees it all)
    std::vector<int> stage_bounds;      // pipeline: unit boundaries of every stage (p·V of them; stage rank r runs r, r + p, …)
    PipelineSchedule schedule;          // pipeline: the table, checked by the simulator
    Placement placement;
    bool pipelined() const { return mesh.pipeline > 1 || info->stages; }
};

// Checks the options and plans the strategy for rank `rank` of `ranks` with this model (with --tp,
// that it splits the model: check_tensor_parallel).
StrategyPlan plan_strategy(const StrategyOptions& o, const LlamaConfig& config, int seq_len, int rank, int ranks);

// The pipeline table of options `o` (with a pipeline) on `ranks` ranks, checked by the
// simulator; throws std::invalid_argument naming what cannot be scheduled.
PipelineSchedule pipeline_schedule_of(const StrategyOptions& o, int ranks);

// The data-parallel ranks of a strategy on `ranks` ranks (before a model exists): the mesh's data axes.
int data_ranks_of(const StrategyOptions& o, int ranks);

// The ranks the model's groups are split over (Placement::shards): the mesh's shard axis — a ZeRO
// strategy's shard group (the data-parallel ranks unless --shard-group says fewer), else the
// data-parallel ranks.
int shards_of(const StrategyOptions& o, int ranks);

// ZeRO-3's gather buffers (parallel/parameters_sharded.h), in elements: two of the largest unit's groups
// together (the tied embedding excluded), then, with tied embeddings, the embedding's own.
// unit_elements[u]: unit u's groups' padded sizes summed. With --offload params each buffer has a
// device staging buffer of its slice (these sizes divided by the shards): the host slice is copied
// there before the all-gather. Shared by Zero3's constructor and the planner.
std::vector<long long> zero3_gather_buffers(const std::vector<long long>& unit_elements, bool tied);

}  // namespace pv
