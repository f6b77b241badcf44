// The layout search (`train plan --search`, `--parallel auto`): every way to lay a run out on
// the world — tensor-parallel size and sequence parallelism, pipeline stages, data-parallel ranks
// and their ZeRO stage and shard group, micro-batch, activation checkpointing, CPU offload — sized
// by the memory planner
// (parallel/planner.h, exactly what the run would allocate) and timed by the performance model
// (model/step_cost.h for the kernels, parallel/comm_cost.h for the bytes, the pipeline
// simulator for the bubble), fastest first. DeepSpeed's autotuner runs trials to find this;
// Megatron and torchtitan take it as flags. A prediction, not a measurement. Host code only.
//
// A layout's step, on the rank of its slowest pipeline stage:
//   compute   the micro-steps' forwards and backwards at the rank's tensor-parallel shape (without
//             a pipeline: accumulation × one micro-batch; with one: the simulated 1F1B makespan of
//             the slowest stage's share), the tensor group's all-reduces and all-gathers at the
//             intra-node rate plus a latency each (they sit between the GEMMs: never overlapped),
//             the update of the rank's share of the optimizer state;
//   data      the data-parallel strategy's bytes of the rank's slices (step_wire), each
//             communicator at the rate of the link its ring crosses, hidden behind the compute as
//             polevault schedules it (the gradients' collectives behind the backward, ZeRO-3's
//             gathers also behind the forward, a unit ahead): what exceeds that window adds;
//   offload   the CPU update (28 bytes per owned element through the host's memory, shared by the
//             node's ranks) and the PCIe copies (the gradient down and the parameter up; zero3's
//             offloaded slices up for each gather), not overlapped.
// The pipeline runs the run's schedule (1F1B unless the run names another); each of its sends
// pays the latency too. What is not modelled: kernel launch gaps, the data-parallel collectives'
// latency (hidden behind the backward with their bytes), and frozen tensors' savings in the kernels.
#pragma once

#include "model/step_cost.h"
#include "parallel/planner.h"

#include <functional>
#include <string>
#include <vector>

namespace pv {

// The machines, as the search assumes them (each figure what a ring step or a send reaches, not
// the datasheet's peak; --gpus-per-node, --intra-node-gbs, --inter-node-gbs, --pcie-gbs and
// --host-memory-gbs override them: trainer/auto_layout.h).
struct Interconnect {
    int gpus_per_node = 8;
    // NVLink 4 inside a DGX/HGX H100: 450 GB/s each way (datasheet) at 0.7, what NCCL's rings are
    // commonly reported to reach of a link (bench/trelis_table.cpp uses the same factor).
    double intra_node = 450e9 * 0.7;
    // Between nodes: one 400 Gb/s InfiniBand NDR adapter per GPU (DGX H100: 8 ConnectX-7), 50 GB/s
    // each way, at 0.7.
    double inter_node = 50e9 * 0.7;
    // PCIe 5.0 x16 between a GPU and its host: 64 GB/s each way (specification), at 0.7.
    double pcie = 64e9 * 0.7;
    // A node's host memory bandwidth for the offloaded CPU update, shared by its ranks: 17 GB/s,
    // measured for one rank on a 16-core H100 host (docs/memory.md, offload).
    double host_memory = 17e9;
    // The time of a collective or a send of a few bytes: an assumption of 10 µs, the order
    // nccl-tests report for small all-reduces inside an NVLink node. It is what makes a small
    // model's thousands of tensor-parallel all-reduces cost what they do.
    double latency = 10e-6;
};
// "intra 315 GB/s, inter 35 GB/s, 8 GPUs per node" (the figures a table states).
std::string describe_interconnect(const Interconnect& link);

struct SearchRequest {
    // The model, dtype, groups (LoRA, QLoRA, frozen), sequence length, sample and pipeline
    // schedule of the run; its strategy, micro-batch, accumulation and checkpointing are what the
    // search chooses.
    PlanRequest run;
    int world = 1;
    int batch = 1;  // rows per optimizer step over the whole world (--batch)
    double budget = 0;  // usable device bytes per GPU (GpuMemory::usable)
    double host_budget = 0;  // host bytes a rank may use (0: not checked)
    Interconnect link;
    Device device;
    // Choices the user fixed (0 or empty: searched): --tp, --pipeline-stages, --micro-batch,
    // the strategy, --checkpoint-activations, --offload.
    int tp = 0, pipeline_stages = 0, micro_batch = 0;
    std::string strategy;  // "" or one of ddp, zero1, zero2, zero3, pp, single
    bool checkpointing_fixed = false;  // the run's checkpointing as given (run.checkpointing), else off and the fewest blocks that fit tried
    std::string offload;               // "" searched, else none / optimizer / params
    int shard_group = -1;              // -1 searched, else --shard-group (0: shard over every data-parallel rank)
    int sequence_parallel = -1;        // -1 searched (off and on where tp > 1), else 0 or 1 (--sequence-parallel)
    // The caller's own rules (the trainer's option table): why a layout cannot run, "" when it can.
    // A refused layout is not sized.
    std::function<std::string(const struct LayoutPrediction&)> refuses;
};

// One layout and what it is predicted to cost.
struct LayoutPrediction {
    std::string strategy;  // the --parallel name
    StrategyOptions options;
    int tp = 1, pp = 1, dp = 1;
    int micro_batch = 1, accumulation = 1;  // per data-parallel rank
    ActivationCheckpointing checkpointing;
    double memory = 0;  // the largest rank's device bytes (the planner's)
    // Seconds per optimizer step: the step, and its parts (see the header comment).
    double seconds = 0, compute = 0, tensor_comm = 0, data_comm = 0, offload = 0, bubble = 0;
    double tokens_per_s = 0, mfu = 0;
    // "tp 2 (SP) · pp 1 · dp 4 zero1, micro-batch 2 × 4": the layout in words (SP: sequence-parallel).
    std::string describe() const;
    // The flags that run it: "--parallel zero1 --tp 2 --sequence-parallel --micro-batch 2 --checkpoint-activations".
    std::string flags() const;
};

struct SearchResult {
    std::vector<LayoutPrediction> fitting;  // every layout that fits, fastest first
    int considered = 0;                     // layouts sized (those the strategy checks accept)
    // Nothing fitting: the layout of least memory, to say how far off the best is (memory 0: none ran).
    LayoutPrediction least_memory;
};

// Throws std::invalid_argument when the request cannot be searched (a batch the world cannot
// split, a fixed choice that cannot run here).
SearchResult search_layouts(const SearchRequest& request);

// The top `rows` of a search as a table (layout, memory per GPU, step, tokens/s, MFU, and where
// the time goes), with the figures assumed.
std::string format_search(const SearchRequest& request, const SearchResult& result, int rows = 5);

// The line `--parallel auto` prints: what it runs and why ("tp 2 · dp 4 zero1, micro-batch 2 × 4:
// the fastest of 96 layouts that fit (predicted 1.23 s a step, 26.6k tokens/s), 1.1× the next").
std::string describe_choice(const SearchResult& result);

}  // namespace pv
