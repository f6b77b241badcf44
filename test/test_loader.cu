// The data loader: windows cover the stream with the one-token shift, the order depends only on
// (seed, global sample index) — the same samples for every split of the batch over ranks and
// micro-steps — each epoch is a permutation, and the batch geometry is checked with clear messages.
#include "data/loader.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace loader_test {

// Tokens whose value is their stream position modulo the vocabulary, split into uneven shards
// (including an empty one) so windows cross shard boundaries.
inline std::vector<pv::TokenShard> counting_shards(long long total, uint32_t vocab = 1u << 20) {
    const std::vector<long long> sizes = {total / 3, 0, total / 5, total - total / 3 - total / 5};
    std::vector<pv::TokenShard> shards;
    long long pos = 0;
    for (long long n : sizes) {
        pv::TokenShard s;
        s.vocab_size = vocab;
        s.eot_token = 0;
        for (long long i = 0; i < n; ++i, ++pos) s.tokens.push_back(static_cast<uint32_t>(pos % vocab));
        shards.push_back(std::move(s));
    }
    return shards;
}

// The inputs of every sequence of step `step`, in global order, gathered from all ranks and
// micro-steps of geometry g.
inline std::vector<int> step_inputs(const pv::DataLoader& d, long long step, const pv::BatchGeometry& g) {
    std::vector<int> all;
    for (int r = 0; r < g.world; ++r)
        for (int j = 0; j < g.accumulation; ++j) {
            const auto mb = d.micro_batch(step, j, g, r);
            REQUIRE(mb.inputs.size() == size_t(g.micro_batch) * d.seq_len());
            REQUIRE(mb.targets.size() == mb.inputs.size());
            all.insert(all.end(), mb.inputs.begin(), mb.inputs.end());
        }
    return all;
}

inline std::string joined(const std::vector<std::string>& errors) {
    std::string s;
    for (const auto& e : errors) s += e + "\n";
    return s;
}

template <class F>
std::string thrown_message(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

}  // namespace loader_test

using namespace loader_test;

TEST_CASE("windows cover the data with the one-token shift", "[data]") {
    const int T = 7;
    const long long N = 100;  // W = 99 / 7 = 14; the last 1 + 99 - 98 = 2 tokens fill no window
    pv::DataLoader d(counting_shards(N), T, 1);
    REQUIRE(d.total_tokens() == N);
    REQUIRE(d.windows() == 14);
    std::vector<int> in(T), tg(T), next_in(T), next_tg(T);
    for (long long k = 0; k < d.windows(); ++k) {
        d.window(k, in.data(), tg.data());
        for (int i = 0; i < T; ++i) {
            CHECK(in[i] == k * T + i);  // window k starts at k·T, across shard boundaries
            CHECK(tg[i] == in[i] + 1);
            if (i + 1 < T) CHECK(tg[i] == in[i + 1]);
        }
        if (k + 1 < d.windows()) {
            d.window(k + 1, next_in.data(), next_tg.data());
            CHECK(tg[T - 1] == next_in[0]);  // consecutive windows overlap by one token
        }
    }
    CHECK_THROWS_AS(d.window(14, in.data(), tg.data()), std::invalid_argument);

    // Exactly T+1 tokens give one window; T+T tokens still one; 2T+1 give two.
    CHECK(pv::DataLoader(counting_shards(T + 1), T, 1).windows() == 1);
    CHECK(pv::DataLoader(counting_shards(2 * T), T, 1).windows() == 1);
    CHECK(pv::DataLoader(counting_shards(2 * T + 1), T, 1).windows() == 2);
}

TEST_CASE("micro-batches are the windows of their global samples", "[data]") {
    const int T = 5;
    pv::DataLoader d(counting_shards(403), T, 42);
    const pv::BatchGeometry g{12, 3, 2, 2};
    std::vector<int> in(T), tg(T);
    for (long long step = 0; step < 20; ++step)  // 240 samples: several epochs of 80 windows
        for (int r = 0; r < g.world; ++r)
            for (int j = 0; j < g.accumulation; ++j) {
                const auto mb = d.micro_batch(step, j, g, r);
                for (int i = 0; i < g.micro_batch; ++i) {
                    const long long sample = step * 12 + r * 6 + j * 3 + i;
                    d.window(d.window_of(sample), in.data(), tg.data());
                    CHECK(std::equal(in.begin(), in.end(), mb.inputs.begin() + i * T));
                    CHECK(std::equal(tg.begin(), tg.end(), mb.targets.begin() + i * T));
                }
            }
}

TEST_CASE("the order does not depend on the world size or accumulation", "[data]") {
    const int T = 16;
    pv::DataLoader d(counting_shards(16 * 97 + 5), T, 7);  // W = 97, not a multiple of the batch
    const std::vector<pv::BatchGeometry> geometries = {{8, 2, 4, 1}, {8, 2, 2, 2}, {8, 1, 4, 2}, {8, 2, 1, 4},
                                                       {8, 1, 2, 4}, {8, 8, 1, 1}, {8, 1, 1, 8}};
    for (long long step = 0; step < 30; ++step) {  // 240 samples: crosses two epoch boundaries
        const auto reference = step_inputs(d, step, geometries[0]);
        std::set<int> firsts;
        for (size_t i = 0; i < reference.size(); i += T) firsts.insert(reference[i]);
        const bool crosses_epoch = step * 8 / 97 != (step * 8 + 7) / 97;
        CHECK((firsts.size() == 8 || crosses_epoch));  // disjoint within an epoch
        for (size_t k = 1; k < geometries.size(); ++k) {
            INFO("step " << step << ", world " << geometries[k].world << ", accumulation "
                         << geometries[k].accumulation);
            CHECK(step_inputs(d, step, geometries[k]) == reference);
        }
    }
}

TEST_CASE("ranks read disjoint windows that together make the global batch", "[data]") {
    const int T = 4;
    pv::DataLoader d(counting_shards(4 * 64 + 1), T, 3);  // W = 64: one epoch is exactly 4 steps of 16
    const pv::BatchGeometry g{16, 2, 2, 4};
    std::set<long long> seen;
    for (long long step = 0; step < 4; ++step)
        for (int r = 0; r < g.world; ++r)
            for (int j = 0; j < g.accumulation; ++j) {
                const auto mb = d.micro_batch(step, j, g, r);
                for (int i = 0; i < g.micro_batch; ++i) {
                    const long long w = mb.inputs[i * T] / T;
                    CHECK(seen.insert(w).second);
                }
            }
    CHECK(seen.size() == 64);
}

TEST_CASE("an epoch visits every window exactly once, in a fresh order each epoch", "[data]") {
    for (long long W : {1LL, 2LL, 7LL, 33LL, 130LL, 1000LL}) {
        INFO("W = " << W);
        pv::DataLoader d(counting_shards(3 * W + 1), 3, 11);
        REQUIRE(d.windows() == W);
        std::vector<std::vector<long long>> epochs;
        for (long long e = 0; e < 3; ++e) {
            std::vector<long long> order;
            for (long long i = 0; i < W; ++i) order.push_back(d.window_of(e * W + i));
            std::vector<long long> sorted = order;
            std::sort(sorted.begin(), sorted.end());
            for (long long i = 0; i < W; ++i) CHECK(sorted[i] == i);
            epochs.push_back(order);
        }
        if (W >= 7) {
            CHECK(epochs[0] != epochs[1]);
            CHECK(epochs[1] != epochs[2]);
            std::vector<long long> identity(W);
            for (long long i = 0; i < W; ++i) identity[i] = i;
            CHECK(epochs[0] != identity);
        }
    }
}

TEST_CASE("the order depends only on the seed and the global index", "[data]") {
    const long long W = 200;
    auto shards = counting_shards(8 * W + 1);
    pv::DataLoader a(shards, 8, 5), b(shards, 8, 5), c(shards, 8, 6);
    std::vector<long long> oa, ob, oc;
    for (long long g = 0; g < 3 * W; ++g) {
        oa.push_back(a.window_of(g));
        oc.push_back(c.window_of(g));
    }
    // b reads the same indices in a scrambled order (epochs interleaved): its cache must not matter.
    for (long long g : {450LL, 3LL, 250LL, 599LL, 0LL, 199LL, 200LL}) CHECK(b.window_of(g) == oa[g]);
    for (long long g = 3 * W - 1; g >= 0; --g) ob.push_back(b.window_of(g));
    std::reverse(ob.begin(), ob.end());
    CHECK(oa == ob);
    CHECK(oa != oc);  // a different seed gives a different order
    const pv::BatchGeometry g1{8, 4, 2, 1};
    for (long long step : {0LL, 17LL, 74LL})
        CHECK(step_inputs(a, step, g1) == step_inputs(b, step, g1));  // resuming at a step number
}

TEST_CASE("too little data for one window is an error that says so", "[data]") {
    for (long long n : {0LL, 1LL, 8LL}) {
        const auto m = thrown_message([&] { pv::DataLoader(counting_shards(n), 8, 1); });
        INFO(m);
        CHECK(m.find("the data has " + std::to_string(n) + " tokens; a sequence length of 8 needs at least 9") !=
              std::string::npos);
    }
    CHECK_THROWS_AS(pv::DataLoader({}, 8, 1), std::invalid_argument);
    CHECK(thrown_message([] { pv::DataLoader(counting_shards(100), 0, 1); }).find("sequence length 0") !=
          std::string::npos);
    auto shards = counting_shards(100);
    shards[2].vocab_size = 5;
    CHECK(thrown_message([&] { pv::DataLoader(shards, 4, 1); }).find("shard 2 has vocab_size 5") != std::string::npos);
}

TEST_CASE("batch geometry validation names the flags and the fix", "[data]") {
    CHECK(pv::validate({16, 4, 2, 2}).empty());
    CHECK(pv::validate({1, 1, 1, 1}).empty());
    {
        const auto e = pv::validate({12, 4, 2, 2});
        INFO(joined(e));
        REQUIRE(e.size() == 1);
        CHECK(e[0] ==
              "batch 12 is not micro_batch 4 × accumulation 2 × ranks 2 = 16: set --batch 16, or "
              "--micro-batch/--accumulation so that their product with the rank count is 12");
    }
    {
        const auto e = pv::validate({0, -1, 0, 0});
        INFO(joined(e));
        REQUIRE(e.size() == 4);
        CHECK(e[0].find("batch is 0") != std::string::npos);
        CHECK(e[0].find("--batch") != std::string::npos);
        CHECK(e[1].find("micro_batch is -1") != std::string::npos);
        CHECK(e[1].find("--micro-batch") != std::string::npos);
        CHECK(e[2].find("--accumulation") != std::string::npos);
        CHECK(e[3].find("ranks is 0") != std::string::npos);
    }
    CHECK(pv::accumulation_for(16, 4, 2) == 2);
    CHECK(pv::accumulation_for(12, 4, 3) == 1);
    CHECK(pv::accumulation_for(512, 8, 8) == 8);
    {
        const auto m = thrown_message([] { pv::accumulation_for(12, 5, 2); });
        INFO(m);
        CHECK(m.find("batch 12 is not micro_batch 5 × accumulation k × ranks 2") != std::string::npos);
        CHECK(m.find("set --batch to a multiple of 10 (e.g. 10 or 20)") != std::string::npos);
        CHECK(m.find("--micro-batch") != std::string::npos);
    }
    CHECK(thrown_message([] { pv::accumulation_for(4, 8, 1); }).find("(e.g. 8)") != std::string::npos);
    CHECK(thrown_message([] { pv::accumulation_for(16, 0, 1); }).find("micro_batch is 0") != std::string::npos);

    pv::DataLoader d(counting_shards(1000), 4, 1);
    CHECK(thrown_message([&] { d.micro_batch(0, 0, {12, 4, 2, 2}, 0); }).find("batch 12 is not") != std::string::npos);
    CHECK(thrown_message([&] { d.micro_batch(0, 2, {16, 4, 2, 2}, 0); }).find("micro-step 2") != std::string::npos);
    CHECK(thrown_message([&] { d.micro_batch(0, 0, {16, 4, 2, 2}, 2); }).find("rank 2") != std::string::npos);
    CHECK(thrown_message([&] { d.micro_batch(-1, 0, {16, 4, 2, 2}, 0); }).find("step -1") != std::string::npos);
}
