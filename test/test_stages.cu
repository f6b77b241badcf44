// Pipeline stages (parallel/stages.h) and the model's stage of units (Llama's StageUnits): the cut
// is the best one by exhaustive search, the costs add up to the model's, and a stage holds its
// units — and only those, plus the tied embedding on the head's stage — with the same values the
// whole model has.
#include <catch2/catch.hpp>

#include "platform/device_memory.h"
#include "model/flops.h"
#include "model/llama.h"
#include "parallel/stages.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace stages_test {

// The largest stage cost of a cut.
double largest_stage(const std::vector<double>& costs, const std::vector<int>& b) {
    double worst = 0;
    for (size_t s = 0; s + 1 < b.size(); ++s) {
        double c = 0;
        for (int u = b[s]; u < b[s + 1]; ++u) c += costs[size_t(u)];
        worst = std::max(worst, c);
    }
    return worst;
}

// The best largest stage cost over every cut into `stages` non-empty runs, by enumeration.
double best_by_enumeration(const std::vector<double>& costs, int stages) {
    const int n = int(costs.size());
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> b{0};
    std::function<void(int)> extend = [&](int from) {
        if (int(b.size()) == stages) {
            b.push_back(n);
            best = std::min(best, largest_stage(costs, b));
            b.pop_back();
            return;
        }
        for (int next = from + 1; next <= n - (stages - int(b.size())); ++next) {
            b.push_back(next);
            extend(next);
            b.pop_back();
        }
    };
    extend(0);
    return best;
}

template <class T>
std::vector<T> download(const T* p, long long n) {
    std::vector<T> out(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpy(out.data(), p, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
}

}  // namespace stages_test

using namespace stages_test;

TEST_CASE("balance_stages: a worked example, the extremes, and too many stages", "[stages]") {
    // Two stages of [0, 10, 10, 10, 5]: cutting after three units gives max(20, 15) = 20, every
    // other cut more (35, 25, 30).
    REQUIRE(pv::balance_stages({0, 10, 10, 10, 5}, 2) == std::vector<int>{0, 3, 5});
    REQUIRE(pv::balance_stages({0, 10, 10, 10, 5}, 1) == std::vector<int>{0, 5});
    REQUIRE(pv::balance_stages({0, 10, 10, 10, 5}, 5) == std::vector<int>{0, 1, 2, 3, 4, 5});
    REQUIRE_THROWS_WITH(pv::balance_stages({1, 2, 3}, 4), Catch::Contains("run on at most 3 ranks"));
    REQUIRE_THROWS_AS(pv::balance_stages({1, 2, 3}, 0), std::invalid_argument);
    // The slowest stage's share: 20 of the 35 (the cut above), all of it on one stage, 10 of 35
    // on five.
    CHECK(pv::slowest_stage_share({0, 10, 10, 10, 5}, {0, 3, 5}) == Approx(20.0 / 35));
    CHECK(pv::slowest_stage_share({0, 10, 10, 10, 5}, {0, 5}) == 1.0);
    CHECK(pv::slowest_stage_share({0, 10, 10, 10, 5}, {0, 1, 2, 3, 4, 5}) == Approx(10.0 / 35));
    CHECK(pv::slowest_stage({0, 10, 10, 10, 5}, {0, 3, 5}) == 0);   // 20 against 15
    CHECK(pv::slowest_stage({0, 5, 10, 10, 10}, {0, 2, 5}) == 1);   // 5 against 30
    CHECK(pv::slowest_stage({0, 10, 10, 10, 5}, {0, 1, 2, 3, 4, 5}) == 1);  // the first of the equal 10s
}

TEST_CASE("balance_stages finds a cut as good as the best of all cuts", "[stages]") {
    std::mt19937_64 rng(11);
    for (int trial = 0; trial < 200; ++trial) {
        const int n = 1 + int(rng() % 9), stages = 1 + int(rng() % uint64_t(n));
        std::vector<double> costs;
        for (int i = 0; i < n; ++i) costs.push_back(double(rng() % 100));
        const std::vector<int> b = pv::balance_stages(costs, stages);
        INFO("trial " << trial << ": " << n << " units, " << stages << " stages");
        REQUIRE(b.size() == size_t(stages) + 1);
        REQUIRE(b.front() == 0);
        REQUIRE(b.back() == n);
        for (size_t s = 0; s + 1 < b.size(); ++s) REQUIRE(b[s] < b[s + 1]);
        REQUIRE(largest_stage(costs, b) == best_by_enumeration(costs, stages));
    }
}

TEST_CASE("unit costs add up to the model's training FLOPs and parameters", "[stages]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    const auto flops = pv::unit_costs(c, 16, pv::StageBalance::flops);
    const auto params = pv::unit_costs(c, 16, pv::StageBalance::params);
    REQUIRE(flops.size() == size_t(c.num_layers) + 2);
    double f = 0, p = 0;
    for (double x : flops) f += x;
    for (double x : params) p += x;
    CHECK(f == pv::training_flops_per_token(c, 16));
    CHECK(p == double(pv::parameter_count(c)));
    CHECK(flops.front() == 0);  // the embedding is a lookup
    CHECK(params.front() == double(c.vocab_size) * c.hidden_size);
    REQUIRE(pv::parse_stage_balance("params") == pv::StageBalance::params);
    REQUIRE_THROWS_WITH(pv::parse_stage_balance("layers"), Catch::Contains("use flops (the default) or params"));
}

TEST_CASE("a stage of the model holds its units only, with the whole model's values", "[stages][model]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    REQUIRE(c.tie_embeddings);
    const int units = c.num_layers + 2;
    pv::Llama<double> whole(c, pv::whole_model(2, 8, 5));
    auto stage = [](int first, int end) {
        pv::ModelOptions o = pv::whole_model(2, 8, 5);
        o.placement.chunks = {pv::StageUnits{first, end}};
        return o;
    };
    const pv::MemoryStats before = pv::memory_stats();
    {
        // The head's stage: the last block and the head, plus the tied embedding's parameters and
        // gradient (not its arena).
        pv::Llama<double> last(c, stage(units - 2, units));
        const pv::MemoryStats held = pv::memory_stats();
        long long elements = whole.trainable(0).padded;
        for (int u = units - 2; u < units; ++u) elements += whole.trainable(u).padded;
        using C = pv::MemoryCategory;
        CHECK(held.current[size_t(C::parameters)] - before.current[size_t(C::parameters)] ==
              size_t(elements) * sizeof(double));
        CHECK(held.current[size_t(C::gradients)] - before.current[size_t(C::gradients)] ==
              size_t(elements) * sizeof(double));
        CHECK(last.holds(0));
        CHECK_FALSE(last.runs(0));
        for (int u = 1; u < units - 2; ++u) CHECK_FALSE(last.holds(u));
        for (int u : {0, units - 2, units - 1}) {
            INFO("unit " << u);
            CHECK(download(last.params(u), last.trainable(u).padded) ==
                  download(whole.params(u), whole.trainable(u).padded));
        }
        pv::UnitIO<double> io;
        CHECK_THROWS_WITH(last.forward_unit(0, 0, io), Catch::Contains("not in this model's stage"));
        CHECK_THROWS_WITH(last.tensor("layers.0.w_qkv"), Catch::Contains("not held by this model's stage"));
    }
    // A middle stage holds no embedding; an empty or out-of-range stage is refused.
    pv::Llama<double> middle(c, stage(1, 2));
    CHECK_FALSE(middle.holds(0));
    CHECK(middle.holds(1));
    CHECK_THROWS_WITH(pv::Llama<double>(c, stage(2, 2)), Catch::Contains("not a non-empty range"));
}
