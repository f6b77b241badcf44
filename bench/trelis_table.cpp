// A published table, predicted. Trelis Research's guide "Multi-GPU fine-tuning with DDP and FSDP"
// measured LoRA fine-tuning on 4 × RTX 6000 Ada (48 GB, PCIe 4.0 x16, no NVLink), running Hugging
// Face transformers + PEFT through accelerate:
//   TinyLlama-1.1B, 1024 rows of 1024 tokens, batch 16, accumulation 2:
//     model parallel (device_map: the layers spread over the 4 GPUs) 3 min 53 s, DDP 59 s
//     (GPU utilisation 24% against 90%)
//   CodeLlama-34B, batch 4, accumulation 4: model parallel 47 min, FSDP 30 min
// This program prints, beside those figures, what polevault's performance model predicts for the
// same runs on that GPU (model/step_cost.h rtx_6000_ada(): datasheet and whitepaper figures, with
// the H100's roofline efficiencies) under naive model parallelism (a pipeline with one micro-batch
// in flight: the guide's), 1F1B, ddp and zero3 (FSDP's counterpart), with the memory each needs
// from the planner. Predictions, not measurements: no RTX 6000 Ada was available to us.
//
// Assumptions, each a choice the guide's table does not state:
//   - the CodeLlama run fine-tunes the same 1024 rows of 1024 tokens;
//   - LoRA of rank 8 on the seven projections, dropout off (the rank moves a prediction by under
//     1%: the adapters' GEMMs are small beside the base's; the program prints rank 64 too);
//   - a collective or a send between two of these GPUs reaches 0.7 of PCIe 4.0 x16's 32 GB/s each
//     way, 22.4 GB/s (NCCL's all-reduce over PCIe 4.0 without NVLink is commonly reported at
//     20-24 GB/s of bus bandwidth; not measured by us);
//   - communication overlaps computation as polevault schedules it: ddp's all-reduce during the
//     backward, zero3's gathers one unit ahead (parallel/parameters_sharded.h), so a step takes the
//     longer of its compute and its wire time; a pipeline's transfers do not overlap.
//
//   build/<flavour>/bench/trelis_table
#include "model/activations.h"
#include "model/config.h"
#include "model/flops.h"
#include "model/step_cost.h"
#include "parallel/comm_cost.h"
#include "parallel/plan.h"
#include "parallel/planner.h"
#include "parallel/schedule.h"
#include "parallel/stages.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace pv;

constexpr int kGpus = 4, kRows = 1024, kSeq = 1024;
constexpr double kRingEfficiency = 0.7;

// One of the guide's runs and its measured times in seconds.
struct GuideRun {
    const char* model;
    int micro_batch, accumulation;
    double mp_seconds, data_parallel_seconds;
    const char* data_parallel;  // what the guide ran against model parallelism
};

struct Setup {
    LlamaConfig config;
    Device device;
    GroupOptions groups;
    int micro_batch, accumulation;
    ActivationCheckpointing checkpointing;
    double link;  // bytes per second a transfer or a ring step reaches
};

// One micro-batch of the whole model on one GPU, forward and backward (with activation
// checkpointing, the recompute in the backward), and the optimizer's update (every adapter): the
// performance model's step of one micro-batch by phase.
PhaseSeconds micro_cost(const Setup& s) {
    StepShape one;
    one.config = s.config, one.batch = s.micro_batch, one.seq_len = kSeq, one.accumulation = 1, one.lora = s.groups.lora;
    one.checkpointing = s.checkpointing;
    return predict_phases(one, KernelSet::now, s.device);
}
double micro_seconds(const PhaseSeconds& p) { return p.forward + p.backward; }

PlanRequest plan_request(const Setup& s, StrategyOptions strategy) {
    PlanRequest q;
    q.config = s.config, q.dtype = DType::bf16, q.groups = s.groups, q.strategy = strategy;
    q.ranks = strategy.kind == StrategyKind::single ? 1 : kGpus;
    q.micro_batch = s.micro_batch, q.seq_len = kSeq, q.accumulation = s.accumulation;
    q.checkpointing = s.checkpointing;
    return q;
}

// The largest rank's device memory under `strategy`.
double peak_memory(const Setup& s, const StrategyOptions& strategy) {
    return plan_memory(plan_request(s, strategy)).peak();
}

// Activation checkpointing (every block recomputed) when the largest rank does not fit without it,
// as a user would ask for it; true when it was needed.
bool checkpoint_if_needed(Setup& s, const StrategyOptions& strategy) {
    if (peak_memory(s, strategy) <= parse_gpu_memory("rtx6000ada-48").usable()) return false;
    s.checkpointing = ActivationCheckpointing{true, 0};
    return true;
}

struct Prediction {
    std::string name;
    double seconds = 0, memory = 0;
    std::string note;
};

// A pipeline over the 4 GPUs: the table run by the simulator with the slowest stage's forward and
// backward and the residual stream's transfer, then each stage's share of the update; the epoch is
// rows / (micro-batch · micro-batches per step) steps.
Prediction pipeline(const Setup& s, const char* name, PipelineScheduleKind kind, int in_flight, int micro_batch) {
    Setup t = s;
    t.accumulation = s.micro_batch * s.accumulation / micro_batch;  // the same rows per step
    t.micro_batch = micro_batch;
    StrategyOptions o;
    o.kind = StrategyKind::pp, o.pipeline = kind, o.in_flight = in_flight, o.micro_per_step = t.accumulation;
    const bool recompute = checkpoint_if_needed(t, o);
    const PhaseSeconds mc = micro_cost(t);
    const std::vector<double> costs = unit_costs(s.config, kSeq, StageBalance::flops);
    const double share = slowest_stage_share(costs, balance_stages(costs, kGpus));
    const double transfer = double(micro_batch) * kSeq * s.config.hidden_size * 2 / s.link;
    const ScheduleFacts f = simulate_pipeline_schedule(pipeline_schedule_of(o, kGpus), true,
                                                       PipeTimes{mc.forward * share, mc.backward * share, transfer});
    const double steps = double(kRows) / (micro_batch * t.accumulation);
    char note[160];
    std::snprintf(note, sizeof note, "%d micro-batches of %d per step, bubble %.0f%%%s", t.accumulation, micro_batch,
                  100 * f.bubble, recompute ? "; activations recomputed" : "");
    return {name, steps * (f.makespan + mc.update / kGpus), peak_memory(t, o), note};
}

// ddp or zero3 over the 4 GPUs: each step the longer of its compute (its micro-batches and its
// share of the update) and its wire time (parallel/comm_cost.h's bytes at the link's rate).
Prediction data_parallel(Setup s, StrategyKind kind) {
    StrategyOptions o;
    o.kind = kind;
    const bool recompute = checkpoint_if_needed(s, o);
    const PhaseSeconds c = micro_cost(s);
    const std::string name = kind == StrategyKind::ddp ? "ddp" : "zero3";
    const double wire = step_wire_bytes(s.config, DType::bf16, s.groups, name, kGpus, s.accumulation) / s.link;
    const double compute = s.accumulation * micro_seconds(c) + c.update / (kind == StrategyKind::ddp ? 1 : kGpus);
    const double steps = double(kRows) / (s.micro_batch * s.accumulation * kGpus);
    char note[160];
    std::snprintf(note, sizeof note, "per step: compute %.2f s, wire %.2f s%s", compute, wire,
                  recompute ? "; activations recomputed" : "");
    return {name, steps * std::max(compute, wire), peak_memory(s, o), note};
}

std::string minutes(double seconds) {
    char b[32];
    if (seconds < 60)
        std::snprintf(b, sizeof b, "%.0f s", seconds);
    else
        std::snprintf(b, sizeof b, "%d min %02d s", int(seconds) / 60, int(seconds) % 60);
    return b;
}

void table(const GuideRun& g, int rank) {
    Setup s;
    s.config = preset(g.model);
    s.device = rtx_6000_ada();
    s.groups.lora.rank = rank;
    s.micro_batch = g.micro_batch, s.accumulation = g.accumulation;
    s.link = s.device.link_bytes_per_s * kRingEfficiency;
    const GpuMemory gpu = parse_gpu_memory("rtx6000ada-48");
    const PhaseSeconds c = micro_cost(s);
    std::printf("## %s, LoRA rank %d, bf16, %d rows of %d tokens, micro-batch %d, accumulation %d\n\n", g.model, rank,
                kRows, kSeq, g.micro_batch, g.accumulation);
    std::printf("One micro-batch of the whole model on one GPU: %.3f s (%.3f s with every block recomputed); the "
                "update: %.1f ms. A run whose largest GPU does not fit recomputes activations.\n\n",
                micro_seconds(c), [&] {
                    Setup r = s;
                    r.checkpointing = ActivationCheckpointing{true, 0};
                    return micro_seconds(micro_cost(r));
                }(),
                c.update * 1e3);
    std::vector<Prediction> rows;
    rows.push_back(pipeline(s, "naive model parallel (pp, one micro-batch in flight)", PipelineScheduleKind::gpipe,
                            1, g.micro_batch));
    rows.push_back(pipeline(s, "pp 1F1B", PipelineScheduleKind::one_f_one_b, 0, g.micro_batch));
    rows.push_back(pipeline(s, "pp 1F1B, micro-batch 1", PipelineScheduleKind::one_f_one_b, 0, 1));
    rows.push_back(data_parallel(s, StrategyKind::ddp));
    rows.push_back(data_parallel(s, StrategyKind::zero3));
    const double naive_s = rows.front().seconds;
    std::printf("| run | guide (HF + accelerate) | polevault predicts | / naive model parallel | largest GPU's "
                "memory (48 GiB: fits?) | |\n|---|---:|---:|---:|---:|---|\n");
    for (const Prediction& p : rows) {
        std::string guide = "";
        if (&p == &rows.front()) guide = minutes(g.mp_seconds);
        if (p.name == g.data_parallel) guide = minutes(g.data_parallel_seconds) + " (" + g.data_parallel + ")";
        const bool fits = p.memory <= gpu.usable();
        char ratio[16] = "-";
        if (fits) std::snprintf(ratio, sizeof ratio, "%.2f", p.seconds / naive_s);
        std::printf("| %s | %s | %s | %s | %.1f GiB, %s | %s |\n", p.name.c_str(), guide.c_str(),
                    fits ? minutes(p.seconds).c_str() : "-", ratio, p.memory / (1 << 30),
                    fits ? "fits" : "does not fit", p.note.c_str());
    }
    std::printf("\nThe guide's ratio: %s / model parallel = %.2f.\n\n", g.data_parallel,
                g.data_parallel_seconds / g.mp_seconds);
}

}  // namespace

int main() {
    const Device d = rtx_6000_ada();
    std::printf("# Trelis Research's multi-GPU LoRA table, predicted for %d x %s\n\n", kGpus, d.name);
    std::printf("Device: %.1f TFLOPS dense bf16, %.0f GB/s memory, %s; collectives and sends at %.1f GB/s (%.1f of "
                "the link). Predictions from the performance model, not measurements.\n\n",
                d.tensor_bf16_flops / 1e12, d.hbm_bytes_per_s / 1e9, d.link, d.link_bytes_per_s * kRingEfficiency / 1e9,
                kRingEfficiency);
    const GuideRun tiny{"tinyllama-1.1b", 16, 2, 3 * 60 + 53, 59, "ddp"};
    const GuideRun code{"codellama-34b", 4, 4, 47 * 60, 30 * 60, "zero3"};
    table(tiny, 8);
    table(code, 8);
    std::printf("LoRA rank 64 instead of 8 (the adapters' share of the time):\n\n");
    table(tiny, 64);
    return 0;
}
