// The strategy registry and plans (parallel/plan.h): every strategy's placement of the model, the
// option checks and their messages. The strategies themselves run in test/mpi/test_mpi_parallel.
#include "parallel/plan.h"
#include "parallel/planner.h"
#include "model/config.h"

#include "parallel/stages.h"
#include "test/error_of.h"

#include <catch2/catch.hpp>

#include <stdexcept>

using pv::test::error_of;

namespace {

pv::StrategyOptions options(const std::string& name, int in_flight = 0, bool fp32 = false) {
    pv::StrategyOptions o;
    o.kind = pv::strategy_kind(name), o.in_flight = in_flight, o.fp32_grad_accumulation = fp32;
    return o;
}

}  // namespace

TEST_CASE("each strategy plans the model it needs", "[plan]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    REQUIRE(pv::strategy_names() == std::vector<std::string>{"single", "ddp", "zero1", "zero2", "zero3", "pp"});
    CHECK(&pv::strategy_info("mp") == &pv::strategy_info("pp"));  // the pipeline's old name
    const pv::StrategyPlan single = pv::plan_strategy(options("single"), c, 8, 0, 1);
    CHECK(single.placement.shards == 1);
    CHECK(single.data_ranks == 1);
    for (const char* name : {"ddp", "zero1", "zero2", "zero3"}) {
        INFO(name);
        const pv::StrategyPlan p = pv::plan_strategy(options(name), c, 8, 2, 4);
        CHECK(p.data_ranks == 4);
        CHECK(p.data_rank == 2);
        CHECK(p.placement.shards == 4);
        REQUIRE(p.placement.chunks.size() == 1);
        CHECK(p.placement.chunks[0].slots == 1);
        CHECK(p.placement.chunks[0].first == 0);
        CHECK(p.placement.chunks[0].end == -1);
        const bool bound = std::string(name) == "zero2" || std::string(name) == "zero3";
        CHECK((p.placement.gradients == pv::Gradients::bound) == bound);
        CHECK((p.placement.parameters == pv::Parameters::bound) == (std::string(name) == "zero3"));
    }
    // mp: every rank sees the whole batch and holds its stage, with a slot per micro-batch in flight:
    // GPipe's group of 2 on every stage; 1F1B's p - r of the 4 micro-batches on stage r.
    const std::vector<int> bounds = pv::balance_stages(pv::unit_costs(c, 8, pv::StageBalance::flops), 3);
    for (int r = 0; r < 3; ++r) {
        pv::StrategyOptions gpipe = options("pp", 2), one_f_one_b = options("pp");
        gpipe.pipeline = pv::PipelineScheduleKind::gpipe;
        gpipe.micro_per_step = one_f_one_b.micro_per_step = 4;
        const pv::StrategyPlan p = pv::plan_strategy(gpipe, c, 8, r, 3);
        INFO("rank " << r);
        CHECK(p.data_ranks == 1);
        CHECK(p.data_rank == 0);
        CHECK(p.placement.shards == 1);
        CHECK(p.stage_bounds == bounds);
        REQUIRE(p.placement.chunks.size() == 1);
        CHECK(p.placement.chunks[0].slots == 2);
        CHECK(pv::plan_strategy(one_f_one_b, c, 8, r, 3).placement.chunks.at(0).slots == 3 - r);
        CHECK(p.placement.chunks[0].first == bounds[size_t(r)]);
        CHECK(p.placement.chunks[0].end == bounds[size_t(r) + 1]);
    }
    // Interleaved over 2 ranks, 2 chunks each: 4 stages, rank r running stages r and r + 2, each
    // chunk with its own slots (worked by hand in test_pipeline_schedule: 4 and 2, 3 and 1).
    pv::StrategyOptions interleaved = options("pp");
    interleaved.pipeline = pv::PipelineScheduleKind::interleaved, interleaved.chunks = 2, interleaved.micro_per_step = 4;
    const std::vector<int> four = pv::balance_stages(pv::unit_costs(c, 8, pv::StageBalance::flops), 4);
    for (int r = 0; r < 2; ++r) {
        const pv::StrategyPlan p = pv::plan_strategy(interleaved, c, 8, r, 2);
        CHECK(p.stage_bounds == four);
        REQUIRE(p.placement.chunks.size() == 2);
        for (int k = 0; k < 2; ++k) {
            CHECK(p.placement.chunks[size_t(k)].first == four[size_t(r + 2 * k)]);
            CHECK(p.placement.chunks[size_t(k)].end == four[size_t(r + 2 * k + 1)]);
            CHECK(p.placement.chunks[size_t(k)].slots == (r == 0 ? 4 : 3) - 2 * k);
        }
    }
    CHECK(pv::data_ranks_of(options("pp"), 4) == 1);
    CHECK(pv::data_ranks_of(options("zero1"), 4) == 4);
}

TEST_CASE("strategy options that cannot run are refused with the fix", "[plan]") {
    CHECK(error_of<std::invalid_argument>([] { pv::strategy_info("zero4"); }) ==
          "unknown strategy 'zero4': choose one of single, ddp, zero1, zero2, zero3, pp");
    CHECK(error_of<std::invalid_argument>([] { pv::check_strategy(options("single"), 2); }) ==
          "--parallel single runs on one rank but mpirun started 2: choose --parallel ddp, zero1, zero2, zero3 or pp");
    CHECK(error_of<std::invalid_argument>([] { pv::check_strategy(options("ddp", 4), 2); }) ==
          "--in-flight 4 is for a pipeline (its micro-batches in flight): drop it, or choose --parallel pp or "
          "--pipeline-stages");
    for (const char* name : {"zero2", "zero3"})
        CHECK(error_of<std::invalid_argument>([&] { pv::check_strategy(options(name, 0, true), 2); }) ==
              "--parallel " + std::string(name) +
                  " reduces gradients in the storage type: drop --fp32-grad-accumulation (or use ddp or zero1)");
    for (const char* name : {"single", "ddp", "zero1", "pp"})
        CHECK_NOTHROW(pv::check_strategy(options(name, 0, true), 1));
    // The interleaved schedule needs a stage per chunk: test-tied has 5 units, so 2 ranks take 2 chunks, not 3.
    pv::StrategyOptions three = options("pp");
    three.pipeline = pv::PipelineScheduleKind::interleaved, three.chunks = 3, three.micro_per_step = 4;
    CHECK(error_of<std::invalid_argument>([&] { pv::plan_strategy(three, pv::preset("test-tied"), 8, 0, 2); }) ==
          "the interleaved schedule over 2 stages with 3 chunks each needs 6 stages, and the model has 5 units (the "
          "embedding, 3 blocks, the head): give at most 2 --pipeline-chunks");
    // mp needs at least as many units as ranks.
    CHECK_THROWS_AS(pv::plan_strategy(options("pp"), pv::preset("test-tied"), 8, 0, 9), std::invalid_argument);
}

namespace {

pv::StrategyOptions hybrid(const std::string& name, int shard_group) {
    pv::StrategyOptions o = options(name);
    o.shard_group = shard_group;
    return o;
}

}  // namespace

// --shard-group K: the batch still splits over every rank, the groups are padded for K shards.
TEST_CASE("hybrid sharding plans K shards over N data-parallel ranks; shard groups that cannot work are refused",
          "[plan][hybrid]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    for (const char* name : {"zero1", "zero2", "zero3"}) {
        INFO(name);
        for (const auto& [k, shards] : std::vector<std::pair<int, int>>{{0, 4}, {4, 4}, {2, 2}, {1, 1}}) {
            INFO("--shard-group " << k);
            const pv::StrategyPlan p = pv::plan_strategy(hybrid(name, k), c, 8, 3, 4);
            CHECK(p.data_ranks == 4);
            CHECK(p.data_rank == 3);
            CHECK(p.placement.shards == shards);
            CHECK(pv::shards_of(hybrid(name, k), 4) == shards);
        }
    }
    CHECK(pv::shards_of(options("ddp"), 4) == 4);
    CHECK(pv::shards_of(options("pp"), 4) == 1);
    CHECK(error_of<std::invalid_argument>([] { pv::check_strategy(hybrid("zero3", 3), 4); }) ==
          "--shard-group 3 does not divide the 4 ranks into whole groups: give a divisor of 4 (0: the whole world), "
          "or start a multiple of 3 ranks");
    CHECK(error_of<std::invalid_argument>([] { pv::check_strategy(hybrid("zero1", 8), 4); }) ==
          "--shard-group 8 is larger than the 4 rank(s) mpirun started: give at most 4 (0: the whole world), or start "
          "more ranks");
    CHECK(error_of<std::invalid_argument>([] { pv::check_strategy(hybrid("zero2", -2), 4); }) ==
          "--shard-group -2: a shard group has at least one rank; give 1 to 4 (0: the whole world)");
    for (const char* name : {"single", "ddp", "pp"})
        CHECK(error_of<std::invalid_argument>([&] { pv::check_strategy(hybrid(name, 1), 1); }) ==
              "--shard-group 1 is for --parallel zero1, zero2 or zero3 (sharding within groups of ranks); drop it, or "
              "choose one of them instead of --parallel " +
                  std::string(name));
    CHECK_THROWS_AS(pv::plan_strategy(hybrid("zero3", 3), c, 8, 0, 4), std::invalid_argument);
}

// --tp T: the mesh's innermost axis; the batch splits over the data-parallel ranks of each
// tensor position, the groups over its shards.
TEST_CASE("tensor parallelism plans T consecutive ranks per group; what cannot run is refused", "[plan][tensor]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");  // 6 query heads, 2 key/value heads, ffn 40
    for (const char* name : {"ddp", "zero1", "zero3"}) {
        INFO(name);
        pv::StrategyOptions o = options(name);
        o.tensor = 2;
        const pv::StrategyPlan p = pv::plan_strategy(o, c, 8, 3, 4);  // rank 3 of 4: shard 1, tensor 1
        CHECK(p.mesh == pv::MeshShape{1, 1, 2, 2});
        CHECK(p.data_ranks == 2);
        CHECK(p.data_rank == 1);
        CHECK(p.placement.shards == 2);
        CHECK(p.placement.tensor.size == 2);
        CHECK(p.placement.tensor.rank == 1);
        CHECK(pv::data_ranks_of(o, 4) == 2);
    }
    // With a pipeline: pp's stages are the tensor positions' ranks; --pipeline-stages under zero1
    // takes the data-parallel ranks from what is left (8 ranks: 2 stages × 2 data × 2 tensor).
    {
        pv::StrategyOptions o = options("pp");
        o.tensor = 2;
        const pv::StrategyPlan p = pv::plan_strategy(o, c, 8, 3, 4);  // stage 1, tensor 1
        CHECK(p.mesh == pv::MeshShape{2, 1, 1, 2});
        CHECK(p.placement.tensor.rank == 1);
        CHECK(p.placement.chunks.front().first > 0);  // the second stage's units
        pv::StrategyOptions z = options("zero1");
        z.tensor = 2, z.pipeline_stages = 2;
        CHECK(pv::plan_strategy(z, c, 8, 5, 8).mesh == pv::MeshShape{2, 1, 2, 2});
    }
    auto refusal = [&](const std::string& name, int tensor, int ranks, void (*more)(pv::StrategyOptions&)) {
        pv::StrategyOptions o = options(name);
        o.tensor = tensor;
        more(o);
        return error_of<std::invalid_argument>([&] { pv::plan_strategy(o, c, 8, 0, ranks); });
    };
    auto none = [](pv::StrategyOptions&) {};
    CHECK(refusal("ddp", 3, 4, none) ==
          "--tp 3 does not divide the 4 ranks mpirun started into whole tensor-parallel groups: give a divisor of 4, "
          "or start a multiple of 3 ranks");
    CHECK(refusal("ddp", 0, 4, none) == "--tp 0: give the ranks of a tensor-parallel group, 1 or more (1: none)");
    CHECK(refusal("single", 2, 2, none) ==
          "--tp 2 needs a strategy over several ranks: choose --parallel ddp (or zero1, zero2, zero3) with it; at 2 "
          "ranks that is 1 data-parallel group(s) of 2");
    CHECK(refusal("zero3", 2, 2, none) ==
          "--tp 2 on 2 ranks leaves one data-parallel rank, nothing for --parallel zero3 to shard: choose --parallel "
          "ddp, or start 4 ranks or more (a multiple of 2)");
    {  // CPU offload of the slices plans like any other
        pv::StrategyOptions o = options("zero3");
        o.tensor = 2, o.offload = pv::Offload::params;
        CHECK(pv::plan_strategy(o, c, 8, 3, 4).placement.tensor.rank == 1);
    }
    CHECK(refusal("zero1", 2, 4, [](pv::StrategyOptions& o) { o.shard_group = 4; }) ==
          "--shard-group 4 is larger than the 2 data-parallel ranks (the ranks over --tp 2): give at most 2 (0: the "
          "whole world), or start more ranks");
    // Sequence parallelism rides on a tensor group, and reaches the model's placement.
    CHECK(refusal("ddp", 1, 2, [](pv::StrategyOptions& o) { o.sequence_parallel = true; }) ==
          "--sequence-parallel splits the rows over a tensor-parallel group: give --tp 2 or more, or leave it out");
    {
        pv::StrategyOptions o = options("ddp");
        o.tensor = 2, o.sequence_parallel = true;
        CHECK(pv::plan_strategy(o, c, 8, 1, 2).placement.tensor.sequence);
        CHECK_FALSE(pv::plan_strategy(options("ddp"), c, 8, 1, 2).placement.tensor.sequence);
    }
    // The model's heads and ffn must split (model/tensor_parallel.h check_tensor_parallel).
    CHECK(refusal("ddp", 3, 3, none) ==
          "tensor parallelism over 3 ranks: 3 does not divide the ffn size 40 of test-tied; --tp can be 1, 2");
}

// What `train plan` prints of a tensor group's traffic (plan_tensor_wire), counted here by hand
// from the request: per micro-step 4 all-reduces of rows·hidden per block, one more per
// recomputed block, two for the vocabulary-parallel embedding and head, one of the whole model's
// kv rows × hidden per block whose W_qkv trains (one kv head, replicated over the pair), and one
// all-gather of 3 fp32 values a row from each rank.
TEST_CASE("the plan counts a tensor group's collectives from the request: checkpointing, --freeze",
          "[plan][tensor]") {
    pv::PlanRequest q;
    q.config = pv::preset("test-tied");
    q.config.num_kv_heads = 1;  // replicated over --tp 2
    q.dtype = pv::DType::bf16;
    q.strategy = options("ddp");
    q.strategy.tensor = 2;
    q.ranks = 4, q.micro_batch = 2, q.seq_len = 8, q.accumulation = 3;
    q.checkpointing = pv::ActivationCheckpointing{true, 2};  // blocks 0, 2, ... recompute
    q.groups.frozen = {"layers.0.w_qkv"};
    const long long L = q.config.num_layers, C = q.config.hidden_size, rows = 16, micro = 3;
    const long long hd = q.config.head_dim_resolved(), kv_rows = 2 * hd;
    long long recomputed = 0;
    for (long long b = 0; b < L; ++b) recomputed += b % 2 == 0;
    REQUIRE(L >= 2);
    const pv::TensorWire w = pv::plan_tensor_wire(q, 0);
    CHECK(w.all_reduces == micro * (4 * L + recomputed + 2) + micro * (L - 1));
    CHECK(w.all_gathers == micro);
    const double elements = double(micro * (4 * L + recomputed + 2) * rows * C + micro * (L - 1) * kv_rows * C);
    CHECK(w.bytes == Approx(1.0 * elements * 2 + double(micro) * 1 * rows * 3 * 4).epsilon(1e-12));
    // With LoRA the base trains nowhere: no kv weight-gradient sums (the adapters' are counted
    // by test_mpi_tensor_parallel).
    q.groups.lora.rank = 2, q.groups.lora.alpha = 4, q.groups.lora.targets = {"o_proj"};
    CHECK(pv::plan_tensor_wire(q, 0).all_reduces == micro * (4 * L + recomputed + 2) + micro * L);  // B of o
    // Over a pipeline of 2 stages (pp at 4 ranks): each stage's blocks, the embedding's all-reduce
    // on the first, the head's all-reduce and all-gather on the last.
    q.strategy = options("pp");
    q.strategy.tensor = 2;
    const pv::StrategyPlan first = pv::plan_strategy(q.strategy, q.config, q.seq_len, 0, 4);
    const long long first_blocks = first.placement.chunks.front().end - 1;  // units [0, end): the embedding first
    REQUIRE((first_blocks >= 1 && first_blocks < L));
    long long recomputed_first = 0;
    for (long long b = 0; b < first_blocks; ++b) recomputed_first += b % 2 == 0;
    const pv::TensorWire w0 = pv::plan_tensor_wire(q, 0), w1 = pv::plan_tensor_wire(q, 2);
    CHECK(w0.all_reduces == micro * (4 * first_blocks + recomputed_first + 1) + micro * first_blocks);
    CHECK(w0.all_gathers == 0);
    CHECK(w1.all_reduces ==
          micro * (4 * (L - first_blocks) + (recomputed - recomputed_first) + 1) + micro * (L - first_blocks));
    CHECK(w1.all_gathers == micro);
    q.strategy.tensor = 1;
    CHECK(pv::plan_tensor_wire(q, 0).all_reduces == 0);
}

// Sequence parallelism's collectives from the request, counted here by hand: per micro-step and
// block 4 reduce-scatters and 4 all-gathers of rows·hidden (2 more gathers and a scatter when
// recomputed), the embedding's scatter and (trained) gather, the head's gather and scatter, the
// cross-entropy's gather, and one all-reduce of hidden elements per trained norm weight (--freeze
// takes layers.1.mlp_norm and wte out: one norm and the embedding's gather fewer).
TEST_CASE("the plan counts sequence parallelism's collectives from the request: checkpointing, --freeze",
          "[plan][tensor]") {
    pv::PlanRequest q;
    q.config = pv::preset("test-tied");
    q.dtype = pv::DType::bf16;
    q.strategy = options("ddp");
    q.strategy.tensor = 2, q.strategy.sequence_parallel = true;
    q.ranks = 4, q.micro_batch = 2, q.seq_len = 8, q.accumulation = 3;
    q.checkpointing = pv::ActivationCheckpointing{true, 2};  // blocks 0, 2, ... recompute
    const long long L = q.config.num_layers, C = q.config.hidden_size, rows = 16, micro = 3;
    REQUIRE(L >= 2);
    long long recomputed = 0;
    for (long long b = 0; b < L; ++b) recomputed += b % 2 == 0;
    const auto check = [&](long long norms, long long embedding_gather) {
        const pv::TensorWire w = pv::plan_tensor_wire(q, 0);
        const long long scatters = micro * (4 * L + recomputed + 2);
        const long long gathers = micro * (4 * L + 2 * recomputed + 1 + embedding_gather);
        CHECK(w.reduce_scatters == scatters);
        CHECK(w.all_gathers == gathers + micro);  // + the cross-entropy's partials
        CHECK(w.all_reduces == micro * norms);
        // bf16: (T − 1) of this rank's rows/2 for a gather or a scatter, 2·(T−1)/T of a norm.
        const double bytes = double(scatters + gathers) * (rows / 2) * C * 2 + double(micro * norms) * C * 2 +
                             double(micro) * rows * 3 * 4;
        CHECK(w.bytes == Approx(bytes).epsilon(1e-12));
    };
    check(2 * L + 1, 1);
    q.groups.frozen = {"layers.1.mlp_norm", "wte"};
    check(2 * L, 0);
    // A micro-batch's rows that the group does not split: refused, the fix named.
    q.micro_batch = 1, q.seq_len = 7;
    CHECK_THROWS_WITH(pv::plan_memory(q), Catch::Contains("micro-batch x seq-len) divisible by it"));
}

// The planner's decisions (parallel/planner.h): names, the auto rule, the changes that fit.
// --checkpoint-activations auto: the fewest blocks (the first ones) whose recompute makes the plan
// fit, each budget set from the plan of a known count so the answer is known without the function.
TEST_CASE("auto checkpointing recomputes the fewest blocks that fit", "[plan][planner][checkpointing]") {
    pv::PlanRequest q;
    q.config = pv::preset("llama-3.2-1b");  // 16 blocks
    q.micro_batch = 4, q.seq_len = 2048;
    const auto peak_with = [&](int k) {
        pv::PlanRequest r = q;
        r.checkpointing = pv::ActivationCheckpointing{k > 0, 0, k};
        return pv::plan_memory(r).peak();
    };
    // Memory never grows with the blocks recomputed; from the second on each saves some (the first
    // frees its one slot's activations and adds the recompute arena: the same bytes).
    std::vector<double> peaks;
    for (int k = 0; k <= 16; ++k) peaks.push_back(peak_with(k));
    CHECK(peaks[1] == peaks[0]);
    for (int k = 2; k <= 16; ++k) REQUIRE(peaks[size_t(k)] < peaks[size_t(k) - 1]);
    // The first blocks: first_blocks counts them.
    const pv::ActivationCheckpointing five{true, 0, 5};
    for (int b = 0; b < 16; ++b) CHECK(five.recomputes(b) == (b < 5));
    for (int k : {2, 5, 11, 16}) {
        for (double budget : {peaks[size_t(k)], peaks[size_t(k) - 1] - 1}) {
            int fewest = 0;  // by a scan, not a bisection
            while (peaks[size_t(fewest)] > budget) ++fewest;
            INFO(k << " blocks, budget " << budget << ": the fewest " << fewest);
            const pv::ActivationCheckpointing got = pv::fewest_recomputing_blocks(q, budget);
            CHECK(got.enabled);
            CHECK(got.first_blocks == fewest);
            CHECK(fewest == k);
        }
    }
    const pv::ActivationCheckpointing none = pv::fewest_recomputing_blocks(q, peak_with(0));
    CHECK_FALSE(none.enabled);
    CHECK(none.first_blocks == 0);
    const pv::ActivationCheckpointing all = pv::fewest_recomputing_blocks(q, peak_with(16) / 2);  // nothing fits
    CHECK(all.enabled);
    CHECK(all.first_blocks == 16);
    // The issue's case: Llama-3.1-8B QLoRA r 16 at 4 x 2048 fits an H100 without recomputing.
    pv::PlanRequest qlora = q;
    qlora.config = pv::preset("llama-3.1-8b");
    qlora.groups.lora.rank = 16, qlora.groups.lora.alpha = 32, qlora.groups.nf4 = true;
    CHECK_FALSE(pv::fewest_recomputing_blocks(qlora, pv::parse_gpu_memory("h100-80").usable()).enabled);
}

TEST_CASE("the planner's GPU names, --parallel auto and the changes it proposes", "[plan][planner]") {
    CHECK(pv::parse_gpu_memory("h100-80").bytes == 80.0 * (1ull << 30));
    CHECK(pv::parse_gpu_memory("24GiB").bytes == 24.0 * (1ull << 30));
    CHECK(pv::parse_gpu_memory("16e9").bytes == 16e9);
    CHECK_THROWS_WITH(pv::parse_gpu_memory("h100"), Catch::Contains("rtx4090-24"));
    CHECK_THROWS(pv::parse_gpu_memory("-3GB"));
    pv::PlanRequest q;
    q.config = pv::preset("llama-2-7b");
    q.micro_batch = 1, q.seq_len = 4096, q.ranks = 8;
    const double budget = pv::parse_gpu_memory("h100-80").usable();
    auto peak = [&](const std::string& s) {
        pv::PlanRequest r = q;
        r.strategy.kind = pv::strategy_kind(s);
        return pv::plan_memory(r).peak();
    };
    // 7B full fine-tuning: ddp's replicas do not fit an H100, zero1's sharded optimizer does.
    REQUIRE(peak("ddp") > budget);
    REQUIRE(peak("zero1") <= budget);
    // ZeRO shrinks memory stage by stage.
    CHECK(peak("zero3") < peak("zero2"));
    CHECK(peak("zero2") < peak("zero1"));
    pv::PlanRequest one = q;
    one.ranks = 1;
    // One rank of a 7B full fine-tune does not fit; LoRA does, and a smaller micro-batch is proposed first.
    one.strategy.kind = pv::StrategyKind::single, one.micro_batch = 4;
    REQUIRE(pv::plan_memory(one).peak() > budget);
    const auto changes = pv::changes_that_fit(one, budget);
    REQUIRE(!changes.empty());
    bool lora = false;
    for (const std::string& s : changes) lora = lora || s.find("--lora-rank 16") != std::string::npos;
    CHECK(lora);
    CHECK(pv::largest_micro_batch(one, budget) == 0);  // full fine-tuning of 7B never fits one H100
    // 7B full fine-tuning on one rank, micro-batch 1 with every block recomputed: 2 + 2 bytes per
    // parameter of weights and gradients (25 GiB) plus the activations fit an 80 GB GPU once the
    // 12 bytes per parameter of optimizer state (75 GiB) leave it, and only then.
    pv::PlanRequest tight = one;
    tight.micro_batch = 1, tight.checkpointing = pv::ActivationCheckpointing{true, 0};
    REQUIRE(pv::plan_memory(tight).peak() > budget);
    const auto offload = pv::changes_that_fit(tight, budget);
    bool proposed = false;
    for (const std::string& s : offload) proposed = proposed || s.find("--offload optimizer") != std::string::npos;
    CHECK(proposed);
    tight.strategy.offload = pv::Offload::optimizer;
    CHECK(pv::plan_memory(tight).peak() <= budget);
    // mp refuses offload at every world size: -1, not "none fits".
    CHECK(pv::smallest_world(tight, "pp", budget) == -1);
    CHECK(pv::smallest_world(tight, "zero3", budget) == 2);
    // ddp of 7B at 8 ranks does not fit; tensor parallelism over pairs does, and is proposed with
    // the figure its plan gives (32 heads and ffn 11008 split by 2).
    pv::PlanRequest ddp = q;
    ddp.strategy.kind = pv::StrategyKind::ddp;
    REQUIRE(pv::plan_memory(ddp).peak() > budget);
    pv::PlanRequest tp2 = ddp;
    tp2.strategy.tensor = 2;
    REQUIRE(pv::plan_memory(tp2).peak() <= budget);
    const auto tp = pv::changes_that_fit(ddp, budget);
    CHECK(std::find(tp.begin(), tp.end(), "--tp 2 (" + pv::format_bytes(pv::plan_memory(tp2).peak()) + " per rank)") !=
          tp.end());
}
