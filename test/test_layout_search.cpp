// The layout search (parallel/layout_search.h): what it enumerates, that each layout's memory is
// the planner's for the layout its flags name, that its step adds up from the performance model's
// pieces as the header says, that the fixed choices stay fixed and that the ranking is by the step.
#include "parallel/layout_search.h"

#include "model/config.h"
#include "model/flops.h"
#include "model/tensor_parallel.h"
#include "parallel/comm_cost.h"
#include "parallel/plan.h"
#include "test/error_of.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <stdexcept>
#include <set>
#include <tuple>

using pv::test::error_of;

namespace {

constexpr double kUnbounded = 1e18;

pv::SearchRequest tiny_request(int world, int batch) {
    pv::SearchRequest r;
    r.run.config = pv::preset("test-tiny");  // 6 heads, 2 kv heads, ffn 40: tp 1 or 2
    r.run.dtype = pv::DType::bf16;
    r.run.seq_len = 32;
    r.world = world, r.batch = batch, r.budget = kUnbounded;
    return r;
}

// The plan of a layout rebuilt from what it says it is (not from the search's request).
pv::PlanRequest request_of(const pv::SearchRequest& r, const pv::LayoutPrediction& p) {
    pv::PlanRequest q = r.run;
    q.strategy = pv::StrategyOptions{};
    q.strategy.kind = pv::strategy_kind(p.strategy);
    q.strategy.tensor = p.tp;
    q.strategy.sequence_parallel = p.flags().find("--sequence-parallel") != std::string::npos;
    q.strategy.pipeline_stages = p.pp > 1 && p.strategy != "pp" ? p.pp : 0;
    q.strategy.shard_group = p.options.shard_group;
    q.strategy.offload = p.options.offload;
    q.strategy.micro_per_step = p.accumulation;
    q.ranks = r.world, q.micro_batch = p.micro_batch, q.accumulation = p.accumulation;
    q.checkpointing = p.checkpointing;
    return q;
}

}  // namespace

TEST_CASE("the search enumerates every mesh of the world, each layout sized by the planner", "[layout_search]") {
    const pv::SearchRequest r = tiny_request(4, 8);
    const pv::SearchResult all = pv::search_layouts(r);
    REQUIRE(all.fitting.size() == size_t(all.considered));  // an unbounded budget: everything fits
    std::set<std::tuple<int, int, int>> meshes;
    for (const pv::LayoutPrediction& p : all.fitting) {
        INFO(p.describe());
        meshes.insert({p.tp, p.pp, p.dp});
        CHECK(p.tp * p.pp * p.dp == 4);
        CHECK(p.micro_batch * p.accumulation * p.dp == 8);  // every layout trains the same 8 rows a step
        CHECK(p.memory == pv::plan_memory(request_of(r, p)).peak());
        CHECK(p.seconds > 0);
        CHECK(p.tokens_per_s == Approx(8.0 * 32 / p.seconds));
        CHECK(p.mfu == Approx(pv::training_flops_per_token(r.run.config, 32) * 8 * 32 /
                              (p.seconds * 4 * pv::Device{}.tensor_bf16_flops)));
        if (p.tp == 1) CHECK(p.tensor_comm == 0);
        else CHECK(p.tensor_comm > 0);
        if (p.dp == 1) CHECK(p.data_comm == 0);
        else CHECK(p.data_comm > 0);
        if (p.options.offload == pv::Offload::none) CHECK(p.offload == 0);
        else CHECK(p.offload > 0);
        if (p.pp > 1) CHECK(p.bubble > 0);
        else CHECK(p.bubble == 0);
    }
    // tp 4 does not split 6 heads; the rest of the divisors of 4 (pipelines of up to 4 stages over
    // the 2 blocks, the embedding and the head).
    const std::set<std::tuple<int, int, int>> expected{{1, 1, 4}, {1, 2, 2}, {1, 4, 1}, {2, 1, 2}, {2, 2, 1}};
    CHECK(meshes == expected);
    // Fastest first.
    for (size_t i = 1; i < all.fitting.size(); ++i) CHECK(all.fitting[i - 1].seconds <= all.fitting[i].seconds);
    // Every data-parallel strategy and offload, where they can run; with room for every layout none
    // recomputes (the fewest blocks that fit is none).
    std::set<std::string> strategies;
    bool recomputed = false, offloaded_params = false;
    for (const pv::LayoutPrediction& p : all.fitting) {
        strategies.insert(p.strategy);
        recomputed |= p.checkpointing.enabled;
        offloaded_params |= p.options.offload == pv::Offload::params;
        if (p.options.offload == pv::Offload::params) CHECK(p.strategy == "zero3");
    }
    CHECK(strategies == std::set<std::string>{"ddp", "zero1", "zero2", "zero3", "pp"});
    CHECK_FALSE(recomputed);
    CHECK(offloaded_params);
}

TEST_CASE("the search keeps what fits in the budget and names the least memory when nothing does",
          "[layout_search]") {
    pv::SearchRequest r = tiny_request(4, 8);
    const pv::SearchResult all = pv::search_layouts(r);
    std::vector<double> memory;
    for (const pv::LayoutPrediction& p : all.fitting) memory.push_back(p.memory);
    std::sort(memory.begin(), memory.end());
    r.budget = memory[memory.size() / 2];
    const pv::SearchResult half = pv::search_layouts(r);
    // Each layout without checkpointing that fits, and each that does not once again with the fewest
    // blocks recomputed that make it fit: K blocks fit, K - 1 do not (--checkpoint-activations auto).
    const size_t plain = size_t(std::count_if(memory.begin(), memory.end(), [&](double m) { return m <= r.budget; }));
    size_t recomputing = 0;
    for (const pv::LayoutPrediction& p : half.fitting) {
        INFO(p.describe());
        CHECK(p.memory <= r.budget);
        if (!p.checkpointing.enabled) continue;
        ++recomputing;
        const int k = p.checkpointing.first_blocks;
        REQUIRE(k >= 1);
        CHECK(p.flags().find("--checkpoint-activations auto") != std::string::npos);
        pv::PlanRequest fewer = request_of(r, p);
        fewer.checkpointing = pv::ActivationCheckpointing{k > 1, 0, k - 1};
        CHECK(pv::plan_memory(fewer).peak() > r.budget);
    }
    CHECK(recomputing > 0);
    CHECK(half.fitting.size() == plain + recomputing);
    CHECK(half.considered >= all.considered);
    CHECK(half.least_memory.memory > r.budget);
    r.budget = memory.front() / 2;
    const pv::SearchResult none = pv::search_layouts(r);
    CHECK(none.fitting.empty());
    // The least memory: a layout with every block recomputed, below the least without.
    CHECK(none.least_memory.checkpointing.enabled);
    CHECK(none.least_memory.memory < memory.front());
    CHECK(pv::format_search(r, none).find("none fits: the least memory") != std::string::npos);
    CHECK(pv::describe_choice(none) == "no layout fits");
}

TEST_CASE("a data-parallel layout's step adds up from the performance model and the wire bytes",
          "[layout_search]") {
    // ddp on 2 ranks of different nodes (1 GPU per node): the all-reduce at the inter-node rate,
    // hidden behind the backward as far as it lasts.
    pv::SearchRequest r = tiny_request(2, 4);
    r.link.gpus_per_node = 1, r.link.intra_node = 1e12, r.link.inter_node = 2e6;
    r.strategy = "ddp", r.micro_batch = 1, r.offload = "none";
    pv::SearchResult result = pv::search_layouts(r);
    REQUIRE(result.fitting.size() == 1);  // off (nothing to recompute with room for all); tp 2 would cross the nodes
    // And with the first block recomputing, as auto would give it: its recompute priced.
    pv::SearchRequest recompute = r;
    recompute.checkpointing_fixed = true, recompute.run.checkpointing = pv::ActivationCheckpointing{true, 0, 1};
    const pv::SearchResult recomputed = pv::search_layouts(recompute);
    REQUIRE(recomputed.fitting.size() == 1);
    REQUIRE(recomputed.fitting.front().compute > result.fitting.front().compute);
    result.fitting.push_back(recomputed.fitting.front());
    for (const pv::LayoutPrediction& p : result.fitting) {
        INFO(p.describe());
        CHECK(p.tp == 1);
        pv::StepShape s;
        s.config = r.run.config, s.batch = 1, s.seq_len = 32, s.accumulation = 1, s.t = 2;
        s.checkpointing = p.checkpointing;
        const pv::PhaseSeconds phases = pv::predict_phases(s, pv::KernelSet::now);
        const double compute = 2 * (phases.forward + phases.backward);
        const double wire = pv::step_wire_bytes(r.run.config, pv::DType::bf16, {}, "ddp", 2, 2) / 2e6;
        CHECK(p.accumulation == 2);
        CHECK(p.compute == Approx(compute + phases.update).epsilon(1e-12));
        CHECK(p.data_comm == Approx(wire).epsilon(1e-12));
        CHECK(p.seconds == Approx(compute + phases.update + std::max(0.0, wire - 2 * phases.backward)).epsilon(1e-12));
        CHECK(p.flags() == std::string("--parallel ddp --micro-batch 1") +
                               (p.checkpointing.enabled ? " --checkpoint-activations auto" : ""));
    }
    // The same ranks in one node: the intra-node rate, and tp 2 joins.
    r.link.gpus_per_node = 2;
    const pv::SearchResult node = pv::search_layouts(r);
    bool tp2 = false;
    for (const pv::LayoutPrediction& p : node.fitting) {
        tp2 |= p.tp == 2;
        if (p.tp == 1) CHECK(p.data_comm == Approx(pv::step_wire_bytes(r.run.config, pv::DType::bf16, {}, "ddp", 2, 2) / 1e12));
    }
    CHECK(tp2);
}

TEST_CASE("a tensor-parallel layout pays its group's collectives at the intra-node rate", "[layout_search]") {
    pv::SearchRequest r = tiny_request(2, 2);
    r.tp = 2, r.micro_batch = 1, r.offload = "none", r.link.intra_node = 1e6;
    r.checkpointing_fixed = true;  // off, as r.run has it
    r.sequence_parallel = 0;
    const pv::SearchResult result = pv::search_layouts(r);
    REQUIRE(result.fitting.size() == 1);  // ddp over one data-parallel rank
    const pv::LayoutPrediction& p = result.fitting.front();
    CHECK(p.strategy == "ddp");
    CHECK(p.flags() == "--parallel ddp --tp 2 --micro-batch 1");
    const pv::PlanRequest q = request_of(r, p);
    const pv::TensorWire wire = pv::plan_tensor_wire(q, 0);
    CHECK(p.tensor_comm ==
          Approx(wire.bytes / 1e6 + double(wire.all_reduces + wire.all_gathers) * r.link.latency).epsilon(1e-12));
    pv::StepShape s;
    s.config = r.run.config, s.batch = 1, s.seq_len = 32, s.accumulation = 1, s.t = 2, s.tensor = 2;
    const pv::PhaseSeconds phases = pv::predict_phases(s, pv::KernelSet::now);
    CHECK(p.seconds == Approx(2 * (phases.forward + phases.backward) + p.tensor_comm + phases.update).epsilon(1e-12));
}

// Sequence parallelism under tp 2: searched, the same layout with it and without; with it the
// planner's smaller activations, the group's reduce-scatters paying the latency like the others,
// the kernels' norms at half the rows; given, only it.
TEST_CASE("the search tries sequence parallelism under tensor parallelism", "[layout_search]") {
    pv::SearchRequest r = tiny_request(2, 2);
    r.tp = 2, r.micro_batch = 1, r.offload = "none", r.link.intra_node = 1e6;
    r.checkpointing_fixed = true;
    const pv::SearchResult result = pv::search_layouts(r);
    REQUIRE(result.fitting.size() == 2);
    const pv::LayoutPrediction* sp = nullptr;
    const pv::LayoutPrediction* plain = nullptr;
    for (const pv::LayoutPrediction& p : result.fitting)
        (p.flags().find("--sequence-parallel") != std::string::npos ? sp : plain) = &p;
    REQUIRE(sp);
    REQUIRE(plain);
    CHECK(sp->flags() == "--parallel ddp --tp 2 --sequence-parallel --micro-batch 1");
    CHECK(sp->describe().find("tp 2 (SP)") == 0);
    CHECK(sp->memory == pv::plan_memory(request_of(r, *sp)).peak());
    CHECK(sp->memory < plain->memory);
    const pv::TensorWire wire = pv::plan_tensor_wire(request_of(r, *sp), 0);
    REQUIRE(wire.reduce_scatters > 0);
    CHECK(sp->tensor_comm ==
          Approx(wire.bytes / 1e6 + double(wire.all_reduces + wire.all_gathers + wire.reduce_scatters) *
                                        r.link.latency)
              .epsilon(1e-12));
    pv::StepShape s;
    s.config = r.run.config, s.batch = 1, s.seq_len = 32, s.accumulation = 1, s.t = 2, s.tensor = 2, s.sequence = true;
    const pv::PhaseSeconds phases = pv::predict_phases(s, pv::KernelSet::now);
    CHECK(sp->seconds == Approx(2 * (phases.forward + phases.backward) + sp->tensor_comm + phases.update).epsilon(1e-12));
    s.sequence = false;
    const pv::PhaseSeconds without = pv::predict_phases(s, pv::KernelSet::now);
    CHECK(phases.forward < without.forward);  // the norms and the residual adds on half the rows
    r.sequence_parallel = 1;
    const pv::SearchResult given = pv::search_layouts(r);
    REQUIRE(given.fitting.size() == 1);
    CHECK(given.fitting.front().flags() == sp->flags());
}

TEST_CASE("the search keeps the choices given and refuses what cannot run", "[layout_search]") {
    pv::SearchRequest r = tiny_request(4, 8);
    r.strategy = "zero1", r.pipeline_stages = 2, r.micro_batch = 2;
    const pv::SearchResult fixed = pv::search_layouts(r);
    REQUIRE(!fixed.fitting.empty());
    for (const pv::LayoutPrediction& p : fixed.fitting) {
        CHECK(p.strategy == "zero1");
        CHECK(p.pp == 2);
        CHECK(p.micro_batch == 2);
        CHECK(p.flags().find("--pipeline-stages 2") != std::string::npos);
    }
    // --cuda-graphs: every layout captures (a pipeline its row's entries), and every one found keeps the flag.
    pv::SearchRequest graphs = tiny_request(4, 8);
    graphs.run.strategy.cuda_graphs = true;
    const pv::SearchResult captured = pv::search_layouts(graphs);
    REQUIRE(!captured.fitting.empty());
    std::set<std::string> capturing;
    bool tensor_parallel = false, pipeline = false;
    for (const pv::LayoutPrediction& p : captured.fitting) {
        INFO(p.describe());
        capturing.insert(p.strategy);
        tensor_parallel = tensor_parallel || p.tp > 1;
        pipeline = pipeline || p.pp > 1;
        CHECK(p.options.cuda_graphs);
    }
    CHECK(capturing == std::set<std::string>{"ddp", "zero1", "zero2", "zero3", "pp"});
    CHECK(tensor_parallel);
    CHECK(pipeline);
    pv::SearchRequest odd = tiny_request(4, 3);  // 3 rows split over 4 data-parallel ranks: none
    odd.tp = 1, odd.pipeline_stages = 1;
    CHECK(error_of<std::invalid_argument>([&] { pv::search_layouts(odd); }).find("no layout of test-tiny runs on 4 rank(s)") !=
          std::string::npos);
    pv::SearchRequest nodes = tiny_request(4, 8);
    nodes.link.gpus_per_node = 0;
    CHECK(error_of<std::invalid_argument>([&] { pv::search_layouts(nodes); }) == "--gpus-per-node 0: give 1 or more");
}

TEST_CASE("the search asks the caller's rules, checks host memory, keeps a shard group and the run's schedule",
          "[layout_search]") {
    pv::SearchRequest r = tiny_request(4, 8);
    const pv::SearchResult all = pv::search_layouts(r);
    // The caller refuses every tensor-parallel layout: none is sized, and the rest are as before.
    r.refuses = [](const pv::LayoutPrediction& p) { return p.tp > 1 ? std::string("no tp here") : std::string(); };
    const pv::SearchResult no_tp = pv::search_layouts(r);
    const long with_tp = std::count_if(all.fitting.begin(), all.fitting.end(),
                                       [](const pv::LayoutPrediction& p) { return p.tp > 1; });
    REQUIRE(with_tp > 0);
    CHECK(no_tp.considered == all.considered - int(with_tp));
    for (const pv::LayoutPrediction& p : no_tp.fitting) CHECK(p.tp == 1);
    r.refuses = [](const pv::LayoutPrediction&) { return std::string("nothing runs"); };
    CHECK(error_of<std::invalid_argument>([&] { pv::search_layouts(r); }).find(": nothing runs") != std::string::npos);
    r.refuses = nullptr;
    // Host memory: a budget below what offload's pinned state needs drops the offloaded layouts.
    double least_offload_host = -1;
    for (const pv::LayoutPrediction& p : all.fitting) {
        const double host = pv::plan_memory(request_of(r, p)).largest().host_total();
        if (p.options.offload != pv::Offload::none && (least_offload_host < 0 || host < least_offload_host))
            least_offload_host = host;
    }
    REQUIRE(least_offload_host > 0);
    r.host_budget = least_offload_host / 2;
    for (const pv::LayoutPrediction& p : pv::search_layouts(r).fitting) {
        INFO(p.describe());
        CHECK(pv::plan_memory(request_of(r, p)).largest().host_total() <= r.host_budget);
        CHECK(p.options.offload == pv::Offload::none);
    }
    r.host_budget = 0;
    // A shard group given stays: only ZeRO, over data-parallel ranks in groups of 2.
    r.shard_group = 2;
    const pv::SearchResult grouped = pv::search_layouts(r);
    REQUIRE(!grouped.fitting.empty());
    for (const pv::LayoutPrediction& p : grouped.fitting) {
        INFO(p.describe());
        CHECK(p.options.shard_group == 2);
        CHECK(p.dp % 2 == 0);
        CHECK(pv::strategy_info(p.strategy).policy.shards());
        CHECK(p.flags().find("--shard-group 2") != std::string::npos);
    }
    r.shard_group = -1;
    // The run's pipeline schedule: GPipe holds every micro-batch in flight, so its layouts never
    // need less memory than 1F1B's, and its bubble is its own.
    r.pipeline_stages = 2, r.strategy = "ddp", r.micro_batch = 1, r.offload = "none";
    const pv::SearchResult one_f_one_b = pv::search_layouts(r);
    r.run.strategy.pipeline = pv::PipelineScheduleKind::gpipe;
    const pv::SearchResult gpipe = pv::search_layouts(r);
    REQUIRE(gpipe.fitting.size() == one_f_one_b.fitting.size());
    for (const pv::LayoutPrediction& p : gpipe.fitting) CHECK(p.options.pipeline == pv::PipelineScheduleKind::gpipe);
    double most_gpipe = 0, most_1f1b = 0;
    for (const pv::LayoutPrediction& p : gpipe.fitting) most_gpipe = std::max(most_gpipe, p.memory);
    for (const pv::LayoutPrediction& p : one_f_one_b.fitting) most_1f1b = std::max(most_1f1b, p.memory);
    CHECK(most_gpipe > most_1f1b);
}
