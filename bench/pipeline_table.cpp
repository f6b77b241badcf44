// Pipeline schedules at a real shape: Llama-2-70B full fine-tuning on 16 H100 SXM (two nodes of 8)
// as a 16-stage pipeline, micro-batch 1 × 4096, 64 micro-batches per step, activation
// checkpointing — GPipe, 1F1B and interleaved 1F1B (V = 2 and 4) side by side: activation slots and memory per
// stage, the bubble, and the predicted step.
//
// Memory: the planner (parallel/planner.h, equal to the measured peaks in test_mpi_planner) for
// every schedule.
//
// Time: the performance model (model/step_cost.h, predict_phases) prices one micro-batch's forward
// and backward of the whole model (the backward with the recompute of activation checkpointing)
// and the optimizer update; the slowest stage takes its share of the training FLOPs of each
// (parallel/stages.h); the residual stream crosses a stage boundary in bytes / link bandwidth
// (NVLink inside a node, the node's InfiniBand between, the slower taken for every boundary). The
// simulator (parallel/schedule.h) runs the table with those durations; the step adds the stage's
// optimizer update. Predictions, not measurements.
//
//   build/<flavour>/bench/pipeline_table
#include "model/config.h"
#include "model/flops.h"
#include "model/step_cost.h"
#include "parallel/planner.h"
#include "parallel/schedule.h"
#include "parallel/stages.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace pv;

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kInfinibandBytesPerS = 50e9;  // NDR 400 Gb/s per GPU between nodes (NVLink's 450 GB/s inside)

struct Row {
    std::string name;
    PipelineSchedule schedule;
    double stage0_activations = 0, peak_memory = 0;
};

}  // namespace

int main() {
    const LlamaConfig config = preset("llama-2-70b");
    const int p = 16, micro = 64, seq = 4096, batch = 1;
    {
        PlanRequest q;
        q.config = config, q.dtype = DType::bf16, q.ranks = p, q.micro_batch = batch, q.seq_len = seq;
        q.accumulation = micro;
        q.strategy.kind = pv::StrategyKind::pp, q.strategy.micro_per_step = micro;
        q.checkpointing = ActivationCheckpointing{true, 0};  // every block recomputed: 70B needs it
        // Time per micro-batch of the whole model, forward and backward (with the recompute), and of
        // the optimizer update.
        StepShape one{config, batch, seq, 1, 2, 1};
        one.checkpointing = q.checkpointing;
        const PhaseSeconds phases = predict_phases(one, KernelSet::now);
        const double update = phases.update;
        const std::vector<double> costs = unit_costs(config, seq, StageBalance::flops);
        const std::vector<int> bounds = balance_stages(costs, p);
        const double share = slowest_stage_share(costs, bounds);
        const double stage_forward = phases.forward * share, stage_backward = phases.backward * share;
        const double transfer = double(batch) * seq * config.hidden_size * 2 / kInfinibandBytesPerS;
        std::printf("## %s, full fine-tuning, bf16, %d stages, micro-batch %d x %d, %d micro-batches per step, every "
                    "block recomputed (activation checkpointing)\n\n",
                    config.name.c_str(), p, batch, seq, micro);
        std::printf("One micro-batch through the slowest stage: %.1f ms (forward %.1f, backward %.1f with the "
                    "recompute); a transfer %.2f ms; the stage's optimizer update %.1f ms.\n\n",
                    (stage_forward + stage_backward) * 1e3, stage_forward * 1e3, stage_backward * 1e3,
                    transfer * 1e3, update / p * 1e3);
        std::vector<Row> rows;
        for (auto [name, kind, in_flight, chunks] : {std::tuple<const char*, PipelineScheduleKind, int, int>{
                                                         "GPipe (all in flight)", PipelineScheduleKind::gpipe, 0, 1},
                                                     {"GPipe, 16 in flight", PipelineScheduleKind::gpipe, 16, 1},
                                                     {"1F1B", PipelineScheduleKind::one_f_one_b, 0, 1},
                                                     {"interleaved 1F1B, V = 2", PipelineScheduleKind::interleaved, 0, 2},
                                                     {"interleaved 1F1B, V = 4", PipelineScheduleKind::interleaved, 0, 4}}) {
            PlanRequest r = q;
            r.strategy.pipeline = kind, r.strategy.in_flight = in_flight, r.strategy.chunks = chunks;
            const MemoryPlan plan = plan_memory(r);
            Row row{name, pipeline_schedule_of(r.strategy, p)};
            row.stage0_activations = plan.ranks.at(0).category(MemoryCategory::activations);
            row.peak_memory = plan.peak();
            rows.push_back(row);
        }
        std::printf("| schedule | in flight, first / last stage | activations, first stage | largest stage's device "
                    "total (fits in an H100's %.1f GiB?) | bubble | predicted step | tokens/s |\n|---|---:|---:|---:|---:|---:|---:|\n",
                    parse_gpu_memory("h100-80").usable() / GiB);
        for (const Row& row : rows) {
            const double v = row.schedule.chunks;
            PipeTimes times{stage_forward / v, stage_backward / v, transfer};
            const ScheduleFacts f = simulate_pipeline_schedule(row.schedule, true, times);
            const double step = f.makespan + update / p;
            std::printf("| %s | %d / %d | %.1f GiB | %.1f GiB, %s | %.1f%% | %.2f s | %.0f |\n", row.name.c_str(),
                        f.peak_in_flight[0], f.peak_in_flight[size_t(p) - 1], row.stage0_activations / GiB,
                        row.peak_memory / GiB,
                        row.peak_memory <= parse_gpu_memory("h100-80").usable() ? "fits" : "does not fit",
                        100 * f.bubble, step, double(micro) * batch * seq / step);
        }
    }
    return 0;
}
