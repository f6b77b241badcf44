// The memory planner (parallel/planner.h) against what a real step holds: for a grid of models,
// dtypes, strategies (single on one rank, the others on this job's ranks), full fine-tuning,
// frozen tensors, LoRA and QLoRA, each rank builds the model, strategy, optimizer and trainer the
// way `train` does, runs one optimizer step of two micro-steps, and reads the host platform's
// per-category peaks (platform/device_memory.h). Model states (parameters, gradients, optimizer
// state, communication buffers) and the activations must equal the plan exactly; the device
// total within 2%. Rank 0 prints the accuracy table docs/memory.md quotes.
#include <catch2/catch.hpp>

#include "data/loader.h"
#include "model/activations.h"
#include "model/llama.h"
#include "optim/optimizer.cuh"
#include "parallel/planner.h"
#include "parallel/strategies.h"
#include "parallel/world.h"
#include "platform/device_memory.h"
#include "test/mpi/awkward_model.h"
#include "trainer/compute_stream.h"
#include "trainer/trainer.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace planner_test {

using C = pv::MemoryCategory;
constexpr int kMicro = 2, kSeq = 8, kAccumulation = 2;
int world_rank = 0;  // rank 0 of the job prints

struct Case {
    std::string strategy;
    std::string variant;  // "full", "frozen", "lora", "qlora"
    bool tied = true;
    int microbatches = 1;  // mp: in flight (0: the schedule's own)
    pv::Offload offload = pv::Offload::none;
    pv::ActivationCheckpointing checkpointing{};  // --checkpoint-activations
    pv::PipelineScheduleKind pipeline = pv::PipelineScheduleKind::gpipe;  // mp
    int chunks = 1;  // mp, interleaved: chunks per rank (a model of ranks·chunks blocks)
    int stages = 0;  // ddp, zero1: --pipeline-stages
    int tensor = 1;  // --tp
    int kv_heads = 2;  // of 4 query heads under --tp: 1 is replicated on both ranks of a group of 2
    bool sequence = false;  // --sequence-parallel (with --tp)
};

bool piped(const Case& c) { return c.strategy == "mp" || c.stages > 1; }

// Micro-steps of the step: a pipeline runs the accumulation times its in-flight count (4 with the schedule's own).
int micro_steps(const Case& c) {
    return kAccumulation * (piped(c) ? (c.microbatches > 0 ? c.microbatches : 2) : 1);
}

pv::GroupOptions groups_of(const std::string& variant) {
    pv::GroupOptions g;
    if (variant == "frozen") g.frozen = {"wte", "layers.0.attn_norm", "layers.1.w_gate_up"};
    if (variant == "lora" || variant == "qlora") {
        g.lora.rank = 3, g.lora.alpha = 6, g.lora.dropout = variant == "lora" ? 0.2 : 0.0;
        g.lora.targets = {"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"};
    }
    g.nf4 = variant == "qlora";
    return g;
}

// Random ids: the step's content does not change what it allocates, only that it runs.
std::vector<pv::DataLoader::MicroBatch> batches(int count, int rows, int vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<pv::DataLoader::MicroBatch> out(static_cast<size_t>(count));
    for (auto& m : out)
        for (int i = 0; i < rows; ++i) {
            m.inputs.push_back(int(rng() % uint64_t(vocab)));
            m.targets.push_back(int(rng() % uint64_t(vocab)));
        }
    return out;
}

struct Measured {
    std::array<double, pv::kMemoryCategoryCount> peak{};
    double device_peak = 0;
};

template <class T, class G>
Measured run_step(const Case& c, const pv::LlamaConfig& config, pv::Comm* comm) {
    const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
    const pv::MemoryStats before = pv::memory_stats();
    pv::reset_memory_peaks();
    {
        pv::StrategyOptions so;
        so.kind = pv::strategy_kind(c.strategy), so.in_flight = piped(c) ? c.microbatches : 0, so.fp32_grad_accumulation = !std::is_same_v<G, T>;
        so.offload = c.offload, so.pipeline = c.pipeline, so.micro_per_step = micro_steps(c);
        so.chunks = c.chunks, so.pipeline_stages = c.stages, so.tensor = c.tensor, so.sequence_parallel = c.sequence;
        const pv::StrategyPlan plan = pv::plan_strategy(so, config, kSeq, rank, ranks);
        const pv::GroupOptions groups = groups_of(c.variant);
        pv::ModelOptions mo;
        mo.batch = kMicro, mo.seq_len = kSeq, mo.seed = 42, mo.frozen = groups.frozen, mo.lora = groups.lora;
        mo.nf4 = groups.nf4, mo.placement = plan.placement, mo.checkpointing = c.checkpointing;
        pv::ComputeStream stream;
        mo.stream = stream.get();
        pv::Llama<T> model(config, mo);
        auto s = pv::make_strategy<T, G>(plan, model, comm, 42);
        auto optimizer = pv::Trainer<T, G>::make_optimizer(*s, c.offload != pv::Offload::none);
        pv::Trainer<T, G> trainer(*s, *optimizer);
        trainer.step(batches(micro_steps(c), kMicro * kSeq, config.vocab_size, 7), 1e-3, 1, 1.0, pv::AdamWSettings{});
        s->settle_parameters();
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    const pv::MemoryStats after = pv::memory_stats();
    Measured m;
    for (int k = 0; k < pv::kMemoryCategoryCount; ++k)
        m.peak[size_t(k)] = double(after.peak[size_t(k)]) - double(before.current[size_t(k)]);
    m.device_peak = double(after.device_peak) - double(before.device_current);
    return m;
}

// Plans and runs one case; returns the rank's relative error of the device total.
template <class T, class G>
double check_case(const Case& c, pv::Comm* comm, const char* dtype) {
    const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
    pv::LlamaConfig config = pv::test::awkward_model(ranks, c.tied, c.chunks > 1 ? ranks * c.chunks : 2);
    if (c.tensor > 1) config.num_heads = 4, config.num_kv_heads = c.kv_heads, config.ffn_size = 34;  // 17 each of 2
    // QLoRA under --tp 2: slices of whole NF4 blocks (o_proj 128 columns, 64 a rank; down_proj 256, 128).
    if (c.tensor > 1 && c.variant == "qlora") config.hidden_size = 64, config.head_dim = 32, config.ffn_size = 256;
    pv::PlanRequest q;
    q.config = config, q.dtype = pv::dtype_of<T>(), q.groups = groups_of(c.variant);
    q.strategy.kind = pv::strategy_kind(c.strategy), q.strategy.in_flight = piped(c) ? c.microbatches : 0, q.strategy.pipeline = c.pipeline;
    q.strategy.chunks = c.chunks, q.strategy.pipeline_stages = c.stages, q.strategy.tensor = c.tensor;
    q.strategy.sequence_parallel = c.sequence;
    q.strategy.fp32_grad_accumulation = !std::is_same_v<G, T>;
    q.strategy.offload = c.offload;
    q.checkpointing = c.checkpointing;
    q.ranks = ranks, q.micro_batch = kMicro, q.seq_len = kSeq;
    q.accumulation = micro_steps(c);
    const pv::MemoryPlan plan = pv::plan_memory(q);
    // One plan per pipeline stage (one without a pipeline): this rank's stage's first rank, which
    // bounds every rank of its stage; and this rank's own plan (under --tp the last rank of a group
    // may hold fewer vocabulary rows), which the measured peaks equal.
    const pv::RankMemory& stage = plan.ranks.at(size_t(pv::mesh_coords(pv::mesh_of(q.strategy, ranks), rank).pipeline));
    const pv::RankMemory mine = pv::plan_rank(q, rank);
    const Measured m = run_step<T, G>(c, config, comm);
    INFO(c.strategy << (c.stages > 1 ? " over " + std::to_string(c.stages) + " stages" : "")
                    << (c.tensor > 1 ? " with --tp " + std::to_string(c.tensor) : "")
                    << (c.sequence ? " --sequence-parallel" : "") << " on " << ranks
                    << " rank(s), rank " << rank << ", " << dtype << ", offload "
                    << pv::offload_name(c.offload) << (std::is_same_v<G, T> ? "" : " fp32 accumulation") << ", "
                    << c.variant << (c.tied ? ", tied" : "")
                    << (c.checkpointing.enabled ? ", checkpointing every " + std::to_string(c.checkpointing.keep_every)
                                                : "")
                    << "\n"
                    << pv::format_plan(plan, nullptr));
    for (C k : {C::parameters, C::gradients, C::optimizer_state, C::comm_buffers, C::activations}) {
        INFO(pv::category_name(k));
        CHECK(m.peak[size_t(k)] == mine.category(k));
        CHECK(stage.category(k) >= mine.category(k));
    }
    // A pipeline's activations from the schedule's simulator, not from the slots the planner and
    // the model share: each chunk holds as many micro-batches as the simulator counts in flight in
    // it at most (1F1B: min(p − r, M) on stage r; interleaved: each chunk its own), each one the
    // arenas of the chunk's units (at its tensor-parallel shape) and, past stage 0, the stream it
    // received (this rank's rows of it under sequence parallelism).
    if (piped(c) && !c.checkpointing.enabled) {
        pv::StrategyOptions so = q.strategy;
        so.micro_per_step = q.accumulation;
        const pv::StrategyPlan sp = pv::plan_strategy(so, config, kSeq, rank, ranks);
        const pv::ScheduleFacts facts = pv::simulate_pipeline_schedule(sp.schedule);
        const int r = pv::mesh_coords(sp.mesh, rank).pipeline;
        const pv::LlamaConfig shape = pv::tensor_parallel_shape(config, sp.placement.tensor);  // its slices'
        const int rows_split = c.sequence ? c.tensor : 1;
        double expected = 0;
        for (size_t k = 0; k < sp.placement.chunks.size(); ++k) {
            const pv::StageUnits& units = sp.placement.chunks[k];
            double one = units.first > 0 ? double(kMicro) * kSeq / rows_split * config.hidden_size * sizeof(T) : 0;
            for (int u = units.first; u < units.end; ++u)
                one += double(pv::arena_bytes(pv::slot_arena_layout(shape, u, kMicro, kSeq, pv::dtype_of<T>(),
                                                                    q.groups.lora, {}, rows_split)));
            expected += facts.chunk_peak[size_t(r)][k] * one;
        }
        CHECK(m.peak[size_t(C::activations)] == expected);
    }
    // Host memory: every pinned line; "a step's micro-batches" is the loader's pageable vectors,
    // which the platform does not count.
    double pageable = 0;
    for (const pv::MemoryLine& l : mine.lines)
        if (l.name == "a step's micro-batches") pageable += l.bytes;
    CHECK(m.peak[size_t(C::pinned_host)] == mine.category(C::pinned_host) - pageable);
    const double error = (mine.device_total() - m.device_peak) / m.device_peak;
    INFO("device total: plan " << mine.device_total() << ", measured peak " << m.device_peak);
    CHECK(std::abs(error) <= 0.02);
    if (world_rank == 0)
        std::printf(
            "planner: %-10s %d rank(s) %-5s %-6s %-17s plan %9.0f B, measured %9.0f B (%+.2f%%); workspace "
            "plan %.0f, measured %.0f\n",
            (c.strategy + (c.tensor > 1 ? " tp " + std::to_string(c.tensor) : "") + (c.sequence ? " sp" : "")).c_str(),
            ranks, dtype,
            c.variant.c_str(),
            c.checkpointing.enabled               ? "checkpointing"
            : c.offload == pv::Offload::params    ? "offload params"
            : c.offload == pv::Offload::optimizer ? "offload optimizer"
            : std::is_same_v<G, T>                ? ""
                                                  : "fp32 accumulation",
            mine.device_total(), m.device_peak, 100 * error, mine.category(C::workspace), m.peak[size_t(C::workspace)]);
    return error;
}

}  // namespace planner_test

using namespace planner_test;

TEST_CASE("the memory planner equals the measured peaks of a real step", "[planner]") {
    pv::World world(nullptr, nullptr);
    pv::Comm* comm = &world.comm();
    world_rank = world.rank();
    for (const std::string strategy : {"single", "ddp", "zero1", "zero2", "zero3", "mp"}) {
        pv::Comm* c = strategy == "single" ? nullptr : comm;
        for (const std::string variant : {"full", "frozen"}) {
            check_case<double, double>({strategy, variant}, c, "fp64");
            check_case<__nv_bfloat16, __nv_bfloat16>({strategy, variant, variant == "full"}, c, "bf16");
        }
        check_case<float, float>({strategy, "lora"}, c, "fp32");
        check_case<__nv_bfloat16, __nv_bfloat16>({strategy, "qlora", false}, c, "bf16");
        if (strategy != "zero2" && strategy != "zero3") check_case<__nv_bfloat16, float>({strategy, "full"}, c, "bf16");
    }
    check_case<float, float>({"mp", "full", true, 2}, comm, "fp32");  // two micro-batches in flight
    // 1F1B: stage r holds min(p - r, 4) micro-batches' activations (its own slots), fewer than GPipe's 4.
    const auto f1b1 = pv::PipelineScheduleKind::one_f_one_b;
    check_case<float, float>({"mp", "full", true, 0, pv::Offload::none, {}, f1b1}, comm, "fp32");
    check_case<__nv_bfloat16, __nv_bfloat16>({"mp", "qlora", false, 0, pv::Offload::none, {}, f1b1}, comm, "bf16");
    check_case<double, double>({"mp", "lora", true, 0, pv::Offload::none, {true, 2}, f1b1}, comm, "fp64");
    // Interleaved: two chunks per rank, each with its own slots and received inputs.
    const auto interleaved = pv::PipelineScheduleKind::interleaved;
    check_case<float, float>({"mp", "full", true, 0, pv::Offload::none, {}, interleaved, 2}, comm, "fp32");
    check_case<__nv_bfloat16, __nv_bfloat16>({"mp", "qlora", false, 0, pv::Offload::none, {true, 2}, interleaved, 2},
                                             comm, "bf16");
    // CPU offload: the optimizer state as host lines, none of it on the device, the staging.
    using O = pv::Offload;
    check_case<__nv_bfloat16, __nv_bfloat16>({"single", "full", true, 1, O::optimizer}, nullptr, "bf16");
    check_case<__nv_bfloat16, float>({"zero1", "full", true, 1, O::optimizer}, comm, "bf16");
    check_case<double, double>({"zero3", "frozen", true, 1, O::optimizer}, comm, "fp64");
    check_case<__nv_bfloat16, __nv_bfloat16>({"zero3", "lora", false, 1, O::optimizer}, comm, "bf16");
    check_case<__nv_bfloat16, __nv_bfloat16>({"zero3", "full", true, 1, O::params}, comm, "bf16");
    check_case<double, double>({"zero3", "frozen", false, 1, O::params}, comm, "fp64");
    // Activation checkpointing: every block recomputed (0) or one in two kept, with LoRA, QLoRA and
    // GPipe's two slots sharing one recompute arena.
    const pv::ActivationCheckpointing every{true, 0}, half{true, 2};
    check_case<__nv_bfloat16, __nv_bfloat16>({"single", "full", true, 1, O::none, every}, nullptr, "bf16");
    check_case<double, double>({"ddp", "lora", true, 1, O::none, half}, comm, "fp64");
    check_case<__nv_bfloat16, __nv_bfloat16>({"zero3", "qlora", false, 1, O::none, every}, comm, "bf16");
    check_case<float, float>({"mp", "full", true, 2, O::none, every}, comm, "fp32");
    check_case<__nv_bfloat16, __nv_bfloat16>({"zero1", "full", true, 1, O::optimizer, every}, comm, "bf16");
    // Tensor parallelism over 2 ranks: each rank's slices, activations and workspace (its heads and
    // ffn share); at 4 ranks 2 data-parallel ranks of it.
    check_case<double, double>({"ddp", "full", false, 1, O::none, {}, f1b1, 1, 0, 2}, comm, "fp64");
    check_case<__nv_bfloat16, __nv_bfloat16>({"ddp", "frozen", true, 1, O::none, every, f1b1, 1, 0, 2}, comm, "bf16");
    check_case<float, float>({"ddp", "lora", true, 1, O::none, half, f1b1, 1, 0, 2}, comm, "fp32");
    check_case<double, double>({"ddp", "lora", false, 1, O::none, {}, f1b1, 1, 0, 2, 1}, comm, "fp64");  // kv replicated
    // QLoRA: each rank's NF4 slots (its blocks' codes and absmaxes, its modules' nested scales whole).
    check_case<__nv_bfloat16, __nv_bfloat16>({"ddp", "qlora", false, 1, O::none, every, f1b1, 1, 0, 2}, comm, "bf16");
    // Sequence parallelism: the residual stream, its gradients and the norms' statistics at N/T rows.
    check_case<__nv_bfloat16, __nv_bfloat16>({"ddp", "full", true, 1, O::none, {}, f1b1, 1, 0, 2, 2, true}, comm,
                                             "bf16");
    check_case<double, double>({"ddp", "lora", false, 1, O::none, half, f1b1, 1, 0, 2, 1, true}, comm, "fp64");
    if (world.size() % 4 == 0) {  // ZeRO needs more than one data-parallel rank to shard over
        check_case<__nv_bfloat16, __nv_bfloat16>({"zero3", "full", true, 1, O::none, every, f1b1, 1, 0, 2}, comm,
                                                 "bf16");
        check_case<__nv_bfloat16, float>({"zero1", "frozen", false, 1, O::none, {}, f1b1, 1, 0, 2}, comm, "bf16");
        check_case<double, double>({"zero3", "lora", false, 1, O::none, {}, f1b1, 1, 0, 2}, comm, "fp64");
        check_case<float, float>({"zero2", "full", true, 1, O::none, {}, f1b1, 1, 0, 2, 1}, comm, "fp32");
        // CPU offload of the slices: the optimizer under zero1, zero3's parameters too.
        check_case<__nv_bfloat16, __nv_bfloat16>({"zero1", "full", false, 1, O::optimizer, {}, f1b1, 1, 0, 2}, comm,
                                                 "bf16");
        check_case<double, double>({"zero3", "frozen", true, 1, O::params, {}, f1b1, 1, 0, 2}, comm, "fp64");
    }
    // Tensor × pipeline parallelism at 4 ranks: two 1F1B stages, each a tensor-parallel pair (the
    // last stage's tied embedding copy a vocabulary slice too).
    if (world.size() % 4 == 0) {
        check_case<double, double>({"mp", "full", false, 2, O::none, {}, f1b1, 1, 0, 2}, comm, "fp64");
        check_case<__nv_bfloat16, __nv_bfloat16>({"mp", "lora", true, 2, O::none, half, f1b1, 1, 0, 2}, comm, "bf16");
        check_case<float, float>({"mp", "full", false, 2, O::none, {}, f1b1, 1, 0, 2, 2, true}, comm, "fp32");
    }
    // Pipeline × data parallelism (4 ranks and more): two 1F1B stages, each replicated under ddp or zero1.
    if (world.size() % 4 == 0) {
        check_case<__nv_bfloat16, __nv_bfloat16>({"zero1", "full", true, 0, O::none, {}, f1b1, 1, 2}, comm, "bf16");
        check_case<double, double>({"ddp", "lora", true, 0, O::none, half, f1b1, 1, 2}, comm, "fp64");
        check_case<__nv_bfloat16, float>({"zero1", "frozen", false, 0, O::none, {}, f1b1, 1, 2}, comm, "bf16");
        check_case<__nv_bfloat16, __nv_bfloat16>({"zero2", "full", true, 0, O::none, {}, f1b1, 1, 2}, comm, "bf16");
        check_case<double, double>({"zero3", "full", true, 0, O::none, {}, f1b1, 1, 2}, comm, "fp64");
        check_case<__nv_bfloat16, __nv_bfloat16>({"zero3", "qlora", false, 0, O::none, half, f1b1, 1, 2}, comm, "bf16");
    }
}
