#include "parallel/layout_search.h"

#include "model/flops.h"
#include "model/tensor_parallel.h"
#include "parallel/comm_cost.h"
#include "parallel/plan.h"
#include "parallel/schedule.h"
#include "parallel/stages.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <tuple>

namespace pv {

namespace {

std::vector<int> divisors(int n) {
    std::vector<int> d;
    for (int i = 1; i <= n; ++i)
        if (n % i == 0) d.push_back(i);
    return d;
}

// "1.63 s", "412 ms", "10.7 µs": a predicted time at a glance, whatever the model's size.
std::string seconds_text(double s) {
    if (s == 0) return "0";
    char b[32];
    if (s >= 1) std::snprintf(b, sizeof b, "%.3g s", s);
    else if (s >= 1e-3) std::snprintf(b, sizeof b, "%.3g ms", s * 1e3);
    else std::snprintf(b, sizeof b, "%.3g µs", s * 1e6);
    return b;
}

std::string gbs(double bytes_per_s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f GB/s", bytes_per_s / 1e9);
    return b;
}

// What a rank of stage `stage` (every unit without bounds) holds: its trainable elements, the
// model's, and the bytes of all its groups' shards. The stage's share of the data-parallel traffic
// and of the optimizer, and what zero3's offloaded slices copy up.
struct StageElements {
    double stage_trainable = 0, all_trainable = 0, stage_bytes = 0;
};
StageElements stage_elements(const PlanRequest& q, int shards, const std::vector<int>& bounds, int stage) {
    GroupOptions g = q.groups;
    g.tensor = {q.strategy.tensor, 0};
    const std::vector<std::vector<GroupLayout>> layouts = model_layouts(q.config, q.dtype, shards, g);
    StageElements e;
    const int first = bounds.empty() ? 0 : bounds[size_t(stage)];
    const int last = bounds.empty() ? int(layouts.size()) : bounds[size_t(stage) + 1];
    for (int u = 0; u < int(layouts.size()); ++u)
        for (const GroupLayout& group : layouts[size_t(u)]) {
            const bool here = u >= first && u < last;
            if (group.trainable()) {
                e.all_trainable += double(group.shard_numel());
                if (here) e.stage_trainable += double(group.shard_numel());
            }
            if (here) e.stage_bytes += double(group.bytes()) / group.shards;
        }
    return e;
}

// The time a layout's step takes (the header comment's model), filled into p.
void price(const SearchRequest& r, const PlanRequest& q, LayoutPrediction& p) {
    const Interconnect& link = r.link;
    const int gpn = link.gpus_per_node;
    StepShape one;
    one.config = q.config;
    one.batch = p.micro_batch, one.seq_len = q.seq_len, one.accumulation = 1;
    one.t = int(dtype_size(q.dtype));
    one.lora = q.groups.lora;
    one.checkpointing = q.checkpointing;
    one.tensor = p.tp;
    one.sequence = q.strategy.sequence_parallel;
    const StrategyInfo& info = strategy_info(q.strategy.kind);
    const int shards = info.policy.shards() ? shards_of(q.strategy, r.world) : 1;
    one.optimizer_shards = shards;
    one.rotating_gradients = info.policy.rotating_gradients();
    const PhaseSeconds phases = predict_phases(one, KernelSet::now, r.device);

    // The slowest stage (every unit without a pipeline) and its share of the model's FLOPs.
    std::vector<int> bounds;
    int slow = 0;
    double share = 1;
    if (p.pp > 1) {
        const std::vector<double> costs = unit_costs(q.config, q.seq_len, q.strategy.balance);
        bounds = balance_stages(costs, p.pp);
        slow = slowest_stage(costs, bounds);
        share = slowest_stage_share(costs, bounds);
    }
    const int stage_first_rank = slow * (r.world / p.pp);
    const TensorWire tw = plan_tensor_wire(q, stage_first_rank);
    p.tensor_comm =
        tw.bytes / link.intra_node + double(tw.all_reduces + tw.all_gathers + tw.reduce_scatters) * link.latency;
    const StageElements e = stage_elements(q, shards, bounds, slow);
    const double param_share = e.all_trainable > 0 ? e.stage_trainable / e.all_trainable : 0;

    // Compute, with the tensor group's collectives between the GEMMs.
    double update = phases.update * param_share;
    if (p.pp > 1) {
        const double tp_micro = p.tensor_comm / p.accumulation;  // half in the forward, half in the backward
        const bool crosses = r.world > gpn;
        const double rows = double(p.micro_batch) * q.seq_len / (q.strategy.sequence_parallel ? p.tp : 1);
        const double transfer = rows * q.config.hidden_size * one.t /
                                    (crosses ? link.inter_node : link.intra_node) +
                                link.latency;
        const PipeTimes times{phases.forward * share + tp_micro / 2, phases.backward * share + tp_micro / 2, transfer};
        const ScheduleFacts f = simulate_pipeline_schedule(pipeline_schedule_of(q.strategy, p.pp), true, times);
        p.bubble = f.bubble;
        p.compute = f.makespan;
    } else {
        p.compute = p.accumulation * (phases.forward + phases.backward) + p.tensor_comm;
    }

    // The data-parallel strategy's bytes of the rank's slices, by communicator and the link its ring crosses.
    if (p.dp > 1) {
        GroupOptions slices = q.groups;
        slices.tensor = {p.tp, 0};
        const StepWire w = step_wire(q.config, q.dtype, slices, p.strategy, p.dp, p.accumulation,
                                     q.strategy.shard_group);
        const double shard_span = double(p.tp) * (q.strategy.shard_group > 0 ? q.strategy.shard_group : p.dp);
        const double dp_span = double(p.tp) * p.dp;
        p.data_comm = param_share * (w.world / (dp_span > gpn ? link.inter_node : link.intra_node) +
                                     w.shard / (shard_span > gpn ? link.inter_node : link.intra_node) +
                                     w.replica / (dp_span > gpn ? link.inter_node : link.intra_node));
    }

    // CPU offload: the update on the host, the copies over PCIe.
    if (q.strategy.offload != Offload::none) {
        const double ranks_per_node = std::min(gpn, r.world);
        update = 0;
        p.offload = e.stage_trainable * 28 / (link.host_memory / ranks_per_node) +
                    e.stage_trainable * 2 * one.t / link.pcie;
        if (q.strategy.offload == Offload::params) p.offload += p.accumulation * 2 * e.stage_bytes / link.pcie;
    }
    // Gradient collectives hide behind the backward (ddp's buckets, ZeRO's reduce-scatters as each
    // unit's gradient is done); ZeRO-3's gathers also behind the forward, a unit ahead.
    const double window = p.compute * (p.strategy == "zero3" ? 1.0 : phases.backward / (phases.forward + phases.backward));
    p.compute += update;
    p.seconds = p.compute + std::max(0.0, p.data_comm - window) + p.offload;
    const double tokens = double(r.batch) * q.seq_len;
    p.tokens_per_s = tokens / p.seconds;
    p.mfu = training_flops_per_token(q.config, q.seq_len) * tokens /
            (p.seconds * r.world * r.device.tensor_bf16_flops);
}

}  // namespace

std::string describe_interconnect(const Interconnect& link) {
    char latency[32];
    std::snprintf(latency, sizeof latency, "%.0f µs", link.latency * 1e6);
    return std::to_string(link.gpus_per_node) + " GPUs per node; collectives and sends reach " +
           gbs(link.intra_node) + " inside a node, " + gbs(link.inter_node) + " between nodes, " + latency +
           " each; PCIe " +
           gbs(link.pcie) + "; the offloaded update " + gbs(link.host_memory) + " of host memory per node";
}

std::string LayoutPrediction::describe() const {
    std::string s = "tp " + std::to_string(tp) + (options.sequence_parallel ? " (SP)" : "") + " · pp " +
                    std::to_string(pp) + " · dp " + std::to_string(dp) + " " + strategy;
    if (options.shard_group > 0) s += " (shard groups of " + std::to_string(options.shard_group) + ")";
    s += ", micro-batch " + std::to_string(micro_batch) + " × " + std::to_string(accumulation);
    if (checkpointing.enabled && checkpointing.first_blocks >= 0)
        s += ", " + std::to_string(checkpointing.first_blocks) + " blocks recomputed";
    else if (checkpointing.enabled)
        s += ", recomputed";
    if (options.offload != Offload::none) s += std::string(", offload ") + offload_name(options.offload);
    return s;
}

std::string LayoutPrediction::flags() const {
    std::string s = "--parallel " + strategy;
    if (tp > 1) s += " --tp " + std::to_string(tp);
    if (options.sequence_parallel) s += " --sequence-parallel";
    if (pp > 1 && strategy != "pp") s += " --pipeline-stages " + std::to_string(pp);
    if (options.shard_group > 0) s += " --shard-group " + std::to_string(options.shard_group);
    s += " --micro-batch " + std::to_string(micro_batch);
    if (checkpointing.enabled) s += checkpointing.first_blocks >= 0 ? " --checkpoint-activations auto" : " --checkpoint-activations";
    if (options.offload != Offload::none) s += std::string(" --offload ") + offload_name(options.offload);
    return s;
}

SearchResult search_layouts(const SearchRequest& r) {
    if (r.world < 1 || r.batch < 1)
        throw std::invalid_argument("the layout search needs a world of 1 rank or more and a --batch of 1 or more");
    if (r.link.gpus_per_node < 1)
        throw std::invalid_argument("--gpus-per-node " + std::to_string(r.link.gpus_per_node) + ": give 1 or more");
    const LlamaConfig& c = r.run.config;
    const int gpn = r.link.gpus_per_node;
    SearchResult out;
    out.least_memory.memory = 0;
    double least = -1;
    std::string last_problem;
    for (int tp : divisors(r.world)) {
        if (r.tp > 0 && tp != r.tp) continue;
        // A tensor group on one node: the innermost axis, tp consecutive ranks within a node's gpn.
        if (tp > 1 && (gpn % tp != 0 || !tensor_parallel_fits(c, tp))) continue;
        // QLoRA: a slice of a block linear holds whole NF4 blocks of its module, or the tp is not tried.
        if (tp > 1 && r.run.groups.nf4 && !nf4_tensor_parallel_fits(c, r.run.groups.lora, tp)) continue;
        for (int pp : divisors(r.world / tp)) {
            if (r.pipeline_stages > 0 && pp != r.pipeline_stages) continue;
            if (pp > c.num_layers + 2) continue;  // a stage per unit at most
            const int dp = r.world / tp / pp;
            if (r.batch % dp != 0) continue;  // each data-parallel rank its whole rows
            std::vector<std::string> strategies;
            if (r.world == 1) strategies = {"single"};
            else if (dp == 1) strategies = {pp > 1 ? "pp" : "ddp"};
            else strategies = {"ddp", "zero1", "zero2", "zero3"};
            for (const std::string& name : strategies) {
                if (!r.strategy.empty() && canonical_strategy_name(r.strategy) != name) continue;
                const StrategyInfo& info = strategy_info(name);
                std::vector<int> shard_groups{0};
                if (r.shard_group >= 0) {
                    if (r.shard_group > 0 && !info.policy.shards()) continue;  // a shard group is ZeRO's
                    shard_groups = {r.shard_group};
                } else if (info.policy.shards()) {  // hybrid: shards within a node, replicas across
                    for (int k : divisors(dp))
                        if (k > 1 && k < dp && tp * k == gpn) shard_groups.push_back(k);
                }
                std::vector<Offload> offloads{Offload::none};
                if (r.offload.empty()) {
                    if (info.policy.shards() || name == "ddp" || name == "single") offloads.push_back(Offload::optimizer);
                    if (name == "zero3") offloads.push_back(Offload::params);
                } else {
                    offloads = {parse_offload(r.offload)};
                }
                for (int shard_group : shard_groups)
                    for (Offload offload : offloads)
                        for (int m : divisors(r.batch / dp)) {
                            if (r.micro_batch > 0 && m != r.micro_batch) continue;
                            const int accumulation = r.batch / dp / m;
                            // Not fixed: off, then the fewest blocks recomputed that fit (the planner's
                            // --checkpoint-activations auto), marked here by first_blocks = -2.
                            std::vector<ActivationCheckpointing> checkpointings{r.run.checkpointing};
                            if (!r.checkpointing_fixed)
                                checkpointings = {ActivationCheckpointing{false, 0}, ActivationCheckpointing{true, 0, -2}};
                            std::vector<bool> sequences{false};
                            if (tp > 1 && r.sequence_parallel != 0) sequences.push_back(true);
                            if (r.sequence_parallel == 1) sequences.erase(sequences.begin());
                            for (const ActivationCheckpointing& ck : checkpointings)
                            for (bool sequence : sequences) {
                                PlanRequest q = r.run;
                                q.strategy = with_strategy(r.run.strategy, info.kind);
                                q.strategy.tensor = tp;
                                q.strategy.sequence_parallel = sequence;
                                q.strategy.pipeline_stages = pp > 1 && name != "pp" ? pp : 0;
                                q.strategy.shard_group = shard_group;
                                q.strategy.offload = offload;
                                q.strategy.micro_per_step = accumulation;
                                q.strategy.cuda_graphs = r.run.strategy.cuda_graphs;  // (its workspace)
                                q.ranks = r.world;
                                q.micro_batch = m;
                                q.accumulation = accumulation;
                                q.checkpointing = ck;
                                LayoutPrediction p;
                                p.strategy = name, p.options = q.strategy;
                                p.tp = tp, p.pp = pp, p.dp = dp;
                                p.micro_batch = m, p.accumulation = accumulation;
                                p.checkpointing = ck;
                                double host = 0;
                                try {
                                    check_strategy(q.strategy, r.world);
                                    if (ck.first_blocks == -2) {  // the fewest that fit; none: the "off" layout
                                        q.checkpointing = p.checkpointing = fewest_recomputing_blocks(q, r.budget);
                                        if (!q.checkpointing.enabled) continue;
                                    }
                                    if (r.refuses) {
                                        const std::string problem = r.refuses(p);
                                        if (!problem.empty()) throw std::invalid_argument(problem);
                                    }
                                    const MemoryPlan plan = plan_memory(q);
                                    p.memory = plan.peak();
                                    host = plan.largest().host_total();
                                } catch (const std::invalid_argument& e) {
                                    last_problem = e.what();
                                    continue;  // a combination the strategies or the caller refuse
                                }
                                ++out.considered;
                                if (p.memory > r.budget || (r.host_budget > 0 && host > r.host_budget)) {
                                    if (least < 0 || p.memory < least) least = p.memory, out.least_memory = p;
                                    continue;
                                }
                                price(r, q, p);
                                out.fitting.push_back(p);
                            }
                        }
            }
        }
    }
    if (out.considered == 0)
        throw std::invalid_argument("no layout of " + c.name + " runs on " + std::to_string(r.world) +
                                    " rank(s) with these fixed choices" +
                                    (last_problem.empty() ? std::string(": none divides the world and the batch")
                                                          : ": " + last_problem));
    std::stable_sort(out.fitting.begin(), out.fitting.end(),
                     [](const LayoutPrediction& a, const LayoutPrediction& b) {
                         // equal steps: the one with less traffic to hide, then less memory
                         const double sa = a.compute + a.data_comm, sb = b.compute + b.data_comm;
                         return std::tie(a.seconds, sa, a.memory) < std::tie(b.seconds, sb, b.memory);
                     });
    return out;
}

std::string format_search(const SearchRequest& r, const SearchResult& result, int rows) {
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    std::string s;
    char line[512];
    std::snprintf(line, sizeof line,
                  "search: %d layouts of %s on %d GPU(s) sized, %zu fit in %.1f GiB per GPU (%s); predicted on %s\n",
                  result.considered, r.run.config.name.c_str(), r.world, result.fitting.size(), r.budget / GiB,
                  describe_interconnect(r.link).c_str(), r.device.name);
    s += line;
    if (result.fitting.empty()) {
        std::snprintf(line, sizeof line, "none fits: the least memory is %.1f GiB per GPU (%s)\n",
                      result.least_memory.memory / GiB, result.least_memory.describe().c_str());
        return s + line;
    }
    s += "| # | layout | memory per GPU | step | tokens/s | MFU | compute | tensor comm | data comm | "
         "offload | bubble |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (int i = 0; i < rows && i < int(result.fitting.size()); ++i) {
        const LayoutPrediction& p = result.fitting[size_t(i)];
        std::snprintf(line, sizeof line, "| %d | %s | %s | %s | %.4g | %.1f%% | %s | %s | %s | %s | %.0f%% |\n", i + 1,
                      p.describe().c_str(), format_bytes(p.memory).c_str(), seconds_text(p.seconds).c_str(),
                      p.tokens_per_s, 100 * p.mfu, seconds_text(p.compute).c_str(),
                      seconds_text(p.tensor_comm).c_str(), seconds_text(p.data_comm).c_str(),
                      seconds_text(p.offload).c_str(), 100 * p.bubble);
        s += line;
    }
    return s;
}

std::string describe_choice(const SearchResult& result) {
    if (result.fitting.empty()) return "no layout fits";
    const LayoutPrediction& best = result.fitting.front();
    char line[512];
    std::snprintf(line, sizeof line,
                  "%s: the fastest of the %zu layouts that fit (predicted %s a step, %.4g tokens/s, %.1f%% MFU, %s "
                  "per GPU)",
                  best.describe().c_str(), result.fitting.size(), seconds_text(best.seconds).c_str(),
                  best.tokens_per_s, 100 * best.mfu, format_bytes(best.memory).c_str());
    std::string s = line;
    if (result.fitting.size() > 1) {
        std::snprintf(line, sizeof line, ", %.2fx the next (%s)", result.fitting[1].seconds / best.seconds,
                      result.fitting[1].describe().c_str());
        s += line;
    }
    return s;
}

}  // namespace pv
