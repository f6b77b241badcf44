// The strategy registry, checks and placement (parallel/plan.h).
#include "parallel/plan.h"

#include "model/tensor_parallel.h"
#include "parallel/stages.h"

#include <algorithm>
#include <stdexcept>

namespace pv {

namespace {

// kind, name, help; one_rank, stages; the parts {parameters, gradients, optimizer}.
using P = ParameterPlacement;
using Gr = GradientReduction;
using O = OptimizerPlacement;
const std::vector<StrategyInfo> kStrategies = {
    {StrategyKind::single, "single", "one rank", true, false, {P::replicated, Gr::all_reduce, O::replicated}},
    {StrategyKind::ddp, "ddp", "replicas, gradients all-reduced in per-unit buckets", false, false,
     {P::replicated, Gr::all_reduce, O::replicated}},
    {StrategyKind::zero1, "zero1", "optimizer state sharded, gradients reduce-scattered", false, false,
     {P::replicated, Gr::reduce_scatter, O::sharded}},
    {StrategyKind::zero2, "zero2", "gradients sharded too, reduce-scattered unit by unit during the backward", false,
     false, {P::replicated, Gr::rotating, O::sharded}},
    {StrategyKind::zero3, "zero3", "parameters sharded too, each unit all-gathered just before it runs", false, false,
     {P::sharded, Gr::rotating, O::sharded}},
    {StrategyKind::pp, "pp",
     "pipeline parallel: each rank runs a contiguous stage of the layers, the residual stream sent between stages", false,
     true, {P::replicated, Gr::all_reduce, O::replicated}},
};

}  // namespace

const std::vector<StrategyInfo>& strategy_registry() { return kStrategies; }

std::vector<std::string> strategy_names() {
    std::vector<std::string> out;
    for (const StrategyInfo& s : kStrategies) out.push_back(s.name);
    return out;
}

const StrategyInfo& strategy_info(const std::string& given) {
    const std::string name = canonical_strategy_name(given);
    std::string names;
    for (const StrategyInfo& s : kStrategies) {
        if (name == s.name) return s;
        names += (names.empty() ? "" : ", ") + std::string(s.name);
    }
    throw std::invalid_argument("unknown strategy '" + name + "': choose one of " + names);
}

const StrategyInfo& strategy_info(StrategyKind kind) {
    for (const StrategyInfo& s : kStrategies)
        if (s.kind == kind) return s;
    throw std::logic_error("strategy_info: a kind with no registry row");
}

std::string canonical_strategy_name(const std::string& name) { return name == "mp" ? "pp" : name; }

StrategyOptions with_strategy(StrategyOptions o, StrategyKind kind) {
    const StrategyInfo& s = strategy_info(kind);
    o.kind = kind;
    if (s.one_rank || s.stages) o.pipeline_stages = 0;
    if (!has_pipeline(o)) o.in_flight = 0;
    if (!s.policy.fp32_accumulation()) o.fp32_grad_accumulation = false;
    if (!s.policy.shards()) o.shard_group = 0;
    if (s.one_rank) o.tensor = 1, o.sequence_parallel = false;
    return o;
}

bool has_pipeline(const StrategyOptions& o) { return strategy_info(o.kind).stages || o.pipeline_stages > 1; }

MeshShape mesh_of(const StrategyOptions& o, int ranks) {
    const StrategyInfo& s = strategy_info(o.kind);
    check_strategy(o, ranks);
    MeshShape m;
    if (s.one_rank) return m;
    m.tensor = o.tensor;
    m.pipeline = s.stages ? ranks / m.tensor : std::max(1, o.pipeline_stages);
    const int dp = ranks / (m.pipeline * m.tensor);
    m.shard = s.policy.shards() && o.shard_group > 0 ? o.shard_group : dp;
    m.replicate = dp / m.shard;
    return m;
}

int data_ranks_of(const StrategyOptions& o, int ranks) { return mesh_of(o, ranks).data(); }

int shards_of(const StrategyOptions& o, int ranks) { return mesh_of(o, ranks).shard; }

const char* offload_name(Offload o) {
    return o == Offload::params ? "params" : o == Offload::optimizer ? "optimizer" : "none";
}

Offload parse_offload(const std::string& name) {
    for (Offload o : {Offload::none, Offload::optimizer, Offload::params})
        if (name == offload_name(o)) return o;
    throw std::invalid_argument("--offload " + name + ": give none, optimizer or params");
}

void check_strategy(const StrategyOptions& o, int ranks) {
    const StrategyInfo& s = strategy_info(o.kind);
    const bool pipeline = has_pipeline(o);
    if (o.sequence_parallel && o.tensor <= 1)
        throw std::invalid_argument("--sequence-parallel splits the rows over a tensor-parallel group: give --tp 2 or "
                                    "more, or leave it out");
    if (o.tensor != 1) {
        const std::string t = "--tp " + std::to_string(o.tensor);
        if (o.tensor < 1)
            throw std::invalid_argument(t + ": give the ranks of a tensor-parallel group, 1 or more (1: none)");
        if (ranks % o.tensor != 0)
            throw std::invalid_argument(t + " does not divide the " + std::to_string(ranks) +
                                        " ranks mpirun started into whole tensor-parallel groups: give a divisor of " +
                                        std::to_string(ranks) + ", or start a multiple of " +
                                        std::to_string(o.tensor) + " ranks");
        if (s.one_rank)
            throw std::invalid_argument(t + " needs a strategy over several ranks: choose --parallel ddp (or zero1, "
                                            "zero2, zero3) with it; at " + std::to_string(ranks) + " ranks that is " +
                                        std::to_string(ranks / o.tensor) + " data-parallel group(s) of " +
                                        std::to_string(o.tensor));
        ranks /= o.tensor;  // what the data-parallel and pipeline checks below divide: each tensor position's ranks
        if (s.policy.shards() && ranks == 1)
            throw std::invalid_argument(t + " on " + std::to_string(o.tensor) +
                                        " ranks leaves one data-parallel rank, nothing for --parallel " + s.name +
                                        " to shard: choose --parallel ddp, or start " + std::to_string(2 * o.tensor) +
                                        " ranks or more (a multiple of " + std::to_string(o.tensor) + ")");
    }
    if (o.pipeline_stages != 0) {
        const std::string p = "--pipeline-stages " + std::to_string(o.pipeline_stages);
        if (o.pipeline_stages < 0)
            throw std::invalid_argument(p + ": give the pipeline's stages, 1 or more (0: pp's one per rank, else none)");
        if (s.stages && o.pipeline_stages != ranks)
            throw std::invalid_argument(p + " with --parallel pp, which runs one stage on each of the " +
                                        std::to_string(ranks) +
                                        " ranks: drop it, or replicate each stage over data-parallel ranks with "
                                        "--parallel ddp, zero1, zero2 or zero3 and " + p);
        if (o.pipeline_stages > ranks)
            throw std::invalid_argument(p + " needs at least " + std::to_string(o.pipeline_stages) + " ranks and mpirun started " +
                                        std::to_string(ranks) + ": give at most " + std::to_string(ranks) +
                                        ", or start more ranks");
        if (ranks % o.pipeline_stages != 0)
            throw std::invalid_argument(p + " does not divide the " + std::to_string(ranks) +
                                        " ranks into equal data-parallel groups per stage: give a divisor of " +
                                        std::to_string(ranks) + ", or start a multiple of " +
                                        std::to_string(o.pipeline_stages) + " ranks");
        if (!s.stages && o.pipeline_stages > 1 && o.pipeline_stages == ranks)
            throw std::invalid_argument(p + " on " + std::to_string(ranks) + " ranks leaves one rank per stage, nothing for --parallel " +
                                        s.name + " to replicate: choose --parallel pp (a pipeline alone), or fewer stages");
    }
    if (o.in_flight > 0 && !pipeline)
        throw std::invalid_argument("--in-flight " + std::to_string(o.in_flight) +
                                    " is for a pipeline (its micro-batches in flight): drop it, or choose --parallel pp "
                                    "or --pipeline-stages");
    if (o.in_flight < 0)
        throw std::invalid_argument("--in-flight " + std::to_string(o.in_flight) +
                                    ": give the micro-batches in flight per stage, or 0 for the schedule's own");
    if (s.one_rank && ranks > 1) {
        std::vector<std::string> names;
        for (const StrategyInfo& t : kStrategies)
            if (!t.one_rank) names.push_back(t.name);
        std::string others;
        for (size_t i = 0; i < names.size(); ++i)
            others += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
        throw std::invalid_argument("--parallel " + std::string(s.name) + " runs on one rank but mpirun started " +
                                    std::to_string(ranks) + ": choose --parallel " + others);
    }
    if (o.fp32_grad_accumulation && !s.policy.fp32_accumulation())
        throw std::invalid_argument("--parallel " + std::string(s.name) +
                                    " reduces gradients in the storage type: drop "
                                    "--fp32-grad-accumulation (or use ddp or zero1)");
    // Offloading needs an optimizer that updates whole owned ranges between steps: not a pipeline's
    // stages, and parameters live in host memory only as zero3's slices.
    if (o.offload != Offload::none && pipeline)
        throw std::invalid_argument("--offload " + std::string(offload_name(o.offload)) +
                                    " is not supported with a pipeline (--parallel pp or --pipeline-stages): choose "
                                    "single, ddp, zero1, zero2 or zero3 without stages, or drop --offload");
    if (o.offload == Offload::params && s.kind != StrategyKind::zero3)
        throw std::invalid_argument("--offload params keeps zero3's parameter slices in host memory; --parallel " +
                                    std::string(s.name) +
                                    " keeps whole parameters on the device: choose --parallel zero3, or "
                                    "--offload optimizer");
    if (o.shard_group != 0) {
        const std::string k = "--shard-group " + std::to_string(o.shard_group);
        const int stages = std::max(1, o.pipeline_stages);
        const std::string per_stage = stages > 1   ? " data-parallel ranks of each of the " + std::to_string(stages) +
                                                         " pipeline stages"
                                      : o.tensor > 1 ? " data-parallel ranks (the ranks over --tp " +
                                                         std::to_string(o.tensor) + ")"
                                                     : "";
        ranks /= stages;  // the ranks sharding one stage
        if (!s.policy.shards())
            throw std::invalid_argument(k +
                                        " is for --parallel zero1, zero2 or zero3 (sharding within groups of "
                                        "ranks); drop it, or choose one of them instead of --parallel " +
                                        std::string(s.name));
        if (o.shard_group < 0)
            throw std::invalid_argument(k + ": a shard group has at least one rank; give 1 to " +
                                        std::to_string(ranks) + " (0: the whole world)");
        if (o.shard_group > ranks)
            throw std::invalid_argument(k + " is larger than the " + std::to_string(ranks) +
                                        (per_stage.empty() ? " rank(s) mpirun started" : per_stage) + ": give at most " +
                                        std::to_string(ranks) + " (0: the whole world), or start more ranks");
        if (ranks % o.shard_group != 0)
            throw std::invalid_argument(k + " does not divide the " + std::to_string(ranks) +
                                        (per_stage.empty() ? " ranks" : per_stage) +
                                        " into whole groups: give a divisor of " + std::to_string(ranks) +
                                        " (0: the whole world), or start a multiple of " +
                                        std::to_string(o.shard_group) + " ranks");
    }
}

StrategyPlan plan_strategy(const StrategyOptions& o, const LlamaConfig& config, int seq_len, int rank, int ranks) {
    StrategyPlan p;
    p.info = &strategy_info(o.kind);
    p.options = o;
    p.rank = rank, p.ranks = ranks;
    p.mesh = mesh_of(o, ranks);  // checks the options
    p.data_ranks = p.mesh.data();
    p.data_rank = mesh_data_rank(p.mesh, rank);
    p.placement.shards = p.mesh.shard;
    p.placement.tensor = {p.mesh.tensor, mesh_coords(p.mesh, rank).tensor, o.sequence_parallel};
    if (p.mesh.tensor > 1) check_tensor_parallel(config, p.mesh.tensor);
    p.placement.gradients = p.info->policy.binds_gradients() ? Gradients::bound : Gradients::owned;
    p.placement.parameters = p.info->policy.binds_parameters() ? Parameters::bound : Parameters::owned;
    if (p.pipelined()) {
        // P·V stages (V chunks per stage rank: the interleaved schedule); pipeline rank r runs stages r, r + P, …
        const int stages = p.mesh.pipeline, units = config.num_layers + 2, r = mesh_coords(p.mesh, rank).pipeline;
        if (o.chunks > 1 && stages * o.chunks > units)
            throw std::invalid_argument("the interleaved schedule over " + std::to_string(stages) + " stages with " +
                                        std::to_string(o.chunks) + " chunks each needs " +
                                        std::to_string(stages * o.chunks) + " stages, and the model has " +
                                        std::to_string(units) + " units (the embedding, " +
                                        std::to_string(config.num_layers) + " blocks, the head): give at most " +
                                        std::to_string(std::max(units / stages, 1)) + " --pipeline-chunks" +
                                        (units / stages < 2 ? ", or choose --pipeline-schedule 1f1b" : ""));
        p.stage_bounds = balance_stages(unit_costs(config, seq_len, o.balance), stages * o.chunks);
        p.schedule = pipeline_schedule_of(o, stages);
        p.placement.chunks.clear();
        for (int c = 0, s = r; s < stages * o.chunks; ++c, s += stages)
            p.placement.chunks.push_back(StageUnits{p.stage_bounds[size_t(s)], p.stage_bounds[size_t(s) + 1],
                                                    p.schedule.slots[size_t(r)][size_t(c)]});
    }
    return p;
}

PipelineSchedule pipeline_schedule_of(const StrategyOptions& o, int ranks) {
    PipelineSchedule s = make_pipeline_schedule(o.pipeline, ranks, o.micro_per_step, o.chunks, o.in_flight);
    try {
        simulate_pipeline_schedule(s);
    } catch (const std::logic_error& e) {
        throw std::invalid_argument(std::string("the ") + pipeline_schedule_name(o.pipeline) + " schedule of " +
                                    std::to_string(ranks) + " stages and " + std::to_string(o.micro_per_step) +
                                    " micro-batches cannot run: " + e.what());
    }
    return s;
}

std::vector<long long> zero3_gather_buffers(const std::vector<long long>& unit_elements, bool tied) {
    long long largest = 0;
    for (size_t u = tied ? 1 : 0; u < unit_elements.size(); ++u) largest = std::max(largest, unit_elements[u]);
    std::vector<long long> out = {largest, largest};
    if (tied && !unit_elements.empty()) out.push_back(unit_elements[0]);
    return out;
}

}  // namespace pv
