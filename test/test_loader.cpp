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
              "--batch 12 is not --micro-batch 4 × accumulation 2 × ranks 2 = 16: set --batch 16, or "
              "--micro-batch/--accumulation so that their product with the rank count is 12");
    }
    {
        const auto e = pv::validate({0, -1, 0, 0});
        INFO(joined(e));
        REQUIRE(e.size() == 4);
        CHECK(e[0].find("--batch (sequences per optimizer step over all ranks) is 0") != std::string::npos);
        CHECK(e[1].find("--micro-batch (sequences per forward pass on one rank) is -1") != std::string::npos);
        CHECK(e[2].find("--accumulation") != std::string::npos);
        CHECK(e[3].find("the data-parallel rank count (mpirun -np) is 0") != std::string::npos);
        for (const std::string& m : e) CHECK(m.find("micro_batch") == std::string::npos);  // flags, not fields
    }
    CHECK(pv::accumulation_for(16, 4, 2) == 2);
    CHECK(pv::accumulation_for(12, 4, 3) == 1);
    CHECK(pv::accumulation_for(512, 8, 8) == 8);
    {
        const auto m = thrown_message([] { pv::accumulation_for(12, 5, 2); });
        INFO(m);
        CHECK(m.find("--batch 12 is not --micro-batch 5 × accumulation k × ranks 2") != std::string::npos);
        CHECK(m.find("set --batch to a multiple of 10 (e.g. 10 or 20)") != std::string::npos);
        CHECK(m.find("--micro-batch") != std::string::npos);
    }
    CHECK(thrown_message([] { pv::accumulation_for(4, 8, 1); }).find("(e.g. 8)") != std::string::npos);
    CHECK(thrown_message([] { pv::accumulation_for(16, 0, 1); }).find("--micro-batch (sequences per forward pass on "
                                                                     "one rank) is 0") != std::string::npos);

    pv::DataLoader d(counting_shards(1000), 4, 1);
    CHECK(thrown_message([&] { d.micro_batch(0, 0, {12, 4, 2, 2}, 0); }).find("batch 12 is not") != std::string::npos);
    CHECK(thrown_message([&] { d.micro_batch(0, 2, {16, 4, 2, 2}, 0); }).find("micro-step 2") != std::string::npos);
    CHECK(thrown_message([&] { d.micro_batch(0, 0, {16, 4, 2, 2}, 2); }).find("rank 2") != std::string::npos);
    CHECK(thrown_message([&] { d.micro_batch(-1, 0, {16, 4, 2, 2}, 0); }).find("step -1") != std::string::npos);
}

namespace loader_test {

// A document for the packing tests: `length` tokens numbered id·1000 + position (so every token
// names its document and place), splittable (plain text) or not, its tokens counted by `counted`.
struct Doc {
    int id;
    int length;
    bool splittable;
    std::vector<bool> counted;  // empty: all counted
};

constexpr uint32_t kVocab = 1u << 20;
constexpr uint32_t kEos = kVocab - 1;  // the padding token; no document token equals it

inline int tok(int doc, int pos) { return doc * 1000 + pos; }

// The documents as a stream of shards cut at `cuts` (stream positions; a cut may fall inside a
// document, which then continues in the next shard).
inline std::vector<pv::TokenShard> doc_shards(const std::vector<Doc>& docs, std::vector<long long> cuts = {}) {
    pv::TokenShard all{kVocab, kEos, {}, {}};
    for (const Doc& d : docs)
        for (int p = 0; p < d.length; ++p) {
            all.tokens.push_back(uint32_t(tok(d.id, p)));
            const bool counted = d.counted.empty() || d.counted[size_t(p)];
            all.flags.push_back(uint8_t((counted ? pv::kTokenCounted : 0) | (p == 0 ? pv::kTokenStartsDocument : 0) |
                                        (d.splittable ? pv::kTokenSplittable : 0)));
        }
    cuts.push_back((long long)all.tokens.size());
    std::vector<pv::TokenShard> shards;
    long long begin = 0;
    for (long long end : cuts) {
        pv::TokenShard s{kVocab, kEos, {}, {}};
        s.tokens.assign(all.tokens.begin() + begin, all.tokens.begin() + end);
        s.flags.assign(all.flags.begin() + begin, all.flags.begin() + end);
        shards.push_back(std::move(s));
        begin = end;
    }
    return shards;
}

struct Window {
    std::vector<int> inputs, targets, positions;
};

inline Window window_of_loader(const pv::DataLoader& d, long long k) {
    Window w;
    const size_t T = size_t(d.seq_len());
    w.inputs.assign(T, -7), w.targets.assign(T, -7), w.positions.assign(T, -7);  // poisoned
    d.window(k, w.inputs.data(), w.targets.data(), w.positions.data());
    return w;
}

}  // namespace loader_test

TEST_CASE("packing: a worked example, by hand", "[data][packing]") {
    // T = 7: windows of 8 tokens. A text 5; B chat 4 (b2, b3 count); C chat 9: longer than 8,
    // dropped; D chat 6 (d3..d5 count); E text 10; F chat 8 (f4..f7 count). Greedy packing:
    //   w0 = a0..a4 + 3 pads   (B does not fit the 3 left)
    //   w1 = b0..b3 + 4 pads   (C dropped; D does not fit the 4 left)
    //   w2 = d0..d5 e0 e1      (full, E split)
    //   w3 = e1..e8            (one-token overlap: E continues)
    //   w4 = e8 e9 + 6 pads    (F does not fit the 6 left)
    //   w5 = f0..f7            (exactly full)
    const std::vector<Doc> docs = {
        {1, 5, true, {}},  {2, 4, false, {false, false, true, true}},
        {3, 9, false, {}}, {4, 6, false, {false, false, false, true, true, true}},
        {5, 10, true, {}}, {6, 8, false, {false, false, false, false, true, true, true, true}}};
    const int P = -100;
    const int pad = int(kEos);
    const std::vector<std::vector<int>> inputs = {
        {tok(1, 0), tok(1, 1), tok(1, 2), tok(1, 3), tok(1, 4), pad, pad},
        {tok(2, 0), tok(2, 1), tok(2, 2), tok(2, 3), pad, pad, pad},
        {tok(4, 0), tok(4, 1), tok(4, 2), tok(4, 3), tok(4, 4), tok(4, 5), tok(5, 0)},
        {tok(5, 1), tok(5, 2), tok(5, 3), tok(5, 4), tok(5, 5), tok(5, 6), tok(5, 7)},
        {tok(5, 8), tok(5, 9), pad, pad, pad, pad, pad},
        {tok(6, 0), tok(6, 1), tok(6, 2), tok(6, 3), tok(6, 4), tok(6, 5), tok(6, 6)}};
    const std::vector<std::vector<int>> targets = {
        {tok(1, 1), tok(1, 2), tok(1, 3), tok(1, 4), P, P, P},
        {P, tok(2, 2), tok(2, 3), P, P, P, P},
        {P, P, tok(4, 3), tok(4, 4), tok(4, 5), tok(5, 0), tok(5, 1)},
        {tok(5, 2), tok(5, 3), tok(5, 4), tok(5, 5), tok(5, 6), tok(5, 7), tok(5, 8)},
        {tok(5, 9), P, P, P, P, P, P},
        {P, P, P, tok(6, 4), tok(6, 5), tok(6, 6), tok(6, 7)}};
    const std::vector<std::vector<int>> positions = {{0, 1, 2, 3, 4, 0, 1}, {0, 1, 2, 3, 0, 1, 2},
                                                     {0, 1, 2, 3, 4, 5, 0}, {0, 1, 2, 3, 4, 5, 6},
                                                     {0, 1, 0, 1, 2, 3, 4}, {0, 1, 2, 3, 4, 5, 6}};
    // The same stream cut into shards inside D and inside the dropped C: documents continue.
    for (const auto& cuts : {std::vector<long long>{}, std::vector<long long>{3, 12, 21}}) {
        for (const bool mask : {false, true}) {
            INFO("shards " << cuts.size() + 1 << ", document mask " << mask);
            pv::DataLoader d(doc_shards(docs, cuts), 7, 1, mask);
            REQUIRE(d.packed());
            REQUIRE(d.windows() == 6);
            for (long long k = 0; k < 6; ++k) {
                INFO("window " << k);
                const Window w = window_of_loader(d, k);
                CHECK(w.inputs == inputs[size_t(k)]);
                std::vector<int> expected = targets[size_t(k)];
                if (mask && k == 2) expected[5] = P;  // d5 predicting e0: across documents
                CHECK(w.targets == expected);
                if (mask) CHECK(w.positions == positions[size_t(k)]);
                if (!mask) CHECK(w.positions == std::vector<int>(7, -7));  // untouched without the mask
            }
            const auto& c = d.counts();
            CHECK(c.documents == 6);
            CHECK(c.unsplittable_documents == 4);
            CHECK(c.dropped_documents == 1);
            CHECK(c.dropped_tokens == 9);
            CHECK(c.padding_tokens == 3 + 4 + 6);
            CHECK(c.targets == 6 * 7);
            CHECK(c.counted_targets == (mask ? 22 : 23));
        }
    }
}

TEST_CASE("packing: random documents keep the packing rules", "[data][packing]") {
    std::mt19937_64 rng(99);
    for (int trial = 0; trial < 40; ++trial) {
        const int T = 3 + int(rng() % 14);
        std::vector<Doc> docs;
        const int n = 5 + int(rng() % 40);
        for (int i = 0; i < n; ++i) {
            const bool splittable = rng() % 3 == 0;
            docs.push_back({int(docs.size()) + 1, 1 + int(rng() % (splittable ? 3 * T : T + 4)), splittable, {}});
            if (rng() % 8 == 0) {  // a one-token text, then a chat that fills a window exactly
                docs.push_back({int(docs.size()) + 1, 1, true, {}});
                docs.push_back({int(docs.size()) + 1, T + 1, false, {}});
            }
        }
        if (std::none_of(docs.begin(), docs.end(), [](const Doc& d) { return !d.splittable; }))
            docs[0].splittable = false;
        INFO("trial " << trial << ", T " << T);
        std::vector<pv::TokenShard> shards = doc_shards(docs, {static_cast<long long>(rng() % 10)});
        pv::DataLoader d(shards, T, 5);
        REQUIRE(d.packed());
        // The kept stream: the documents that fit a window or may be split.
        std::vector<int> kept;
        std::vector<const Doc*> owner;  // the document of each kept token
        long long dropped = 0, dropped_tokens = 0;
        for (const Doc& doc : docs) {
            if (!doc.splittable && doc.length > T + 1) {
                ++dropped, dropped_tokens += doc.length;
                continue;
            }
            for (int p = 0; p < doc.length; ++p) kept.push_back(tok(doc.id, p)), owner.push_back(&doc);
        }
        CHECK(d.counts().dropped_documents == dropped);
        CHECK(d.counts().dropped_tokens == dropped_tokens);
        // Every window's real tokens (all counted, no mask: the input, then targets until -100).
        std::vector<std::vector<int>> real;
        long long padding = 0;
        for (long long k = 0; k < d.windows(); ++k) {
            const Window w = window_of_loader(d, k);
            std::vector<int> r = {w.inputs[0]};
            for (int i = 0; i < T && w.targets[size_t(i)] != -100; ++i) r.push_back(w.targets[size_t(i)]);
            for (size_t i = r.size(); i < size_t(T); ++i) CHECK(w.inputs[i] == int(kEos));  // padding after
            for (size_t i = r.size() - 1; i < size_t(T); ++i) CHECK(w.targets[i] == -100);
            padding += T + 1 - long(r.size());
            real.push_back(r);
        }
        CHECK(d.counts().padding_tokens == padding);
        // The windows, the overlap token left out, are the kept stream in order.
        std::vector<int> joined;
        size_t at = 0;  // kept-stream position of the next window's first token
        for (size_t k = 0; k < real.size(); ++k) {
            const auto& r = real[k];
            INFO("window " << k << " of " << real.size());
            REQUIRE(at + r.size() <= kept.size() + 1);
            const bool overlap = k > 0 && at > 0 && kept[at - 1] == r[0];
            // A window of one token has no target and is left out: a one-token document alone
            // in a window (the next document a chat that does not fit beside it).
            if (!overlap && at < kept.size() && kept[at] != r[0]) {
                CHECK(owner[at]->length == 1);
                CHECK(kept[at + 1] % 1000 == 0);
                CHECK(size_t(owner[at + 1]->length) == size_t(T + 1));
                ++at;
            }
            const size_t begin = overlap ? at - 1 : at;
            REQUIRE(begin + r.size() <= kept.size());
            CHECK(std::equal(r.begin(), r.end(), kept.begin() + long(begin)));  // a contiguous run
            const size_t end = begin + r.size();
            // An unsplittable document lies in one window: never cut at either end.
            if (!owner[begin]->splittable) CHECK(r[0] % 1000 == 0);
            if (!owner[end - 1]->splittable) CHECK((r.back() % 1000) + 1 == owner[end - 1]->length);
            if (r.size() < size_t(T + 1) && end < kept.size()) {  // padded, not last: greedy
                CHECK(!owner[end]->splittable);
                CHECK(kept[end] % 1000 == 0);
                CHECK(r.size() + size_t(owner[end]->length) > size_t(T + 1));
            }
            // The next window overlaps by one token exactly when this one cut a document.
            if (k + 1 < real.size()) {
                const bool cut = end < kept.size() && kept[end] % 1000 != 0;
                CHECK((real[k + 1][0] == r.back()) == cut);
                if (cut) CHECK(r.size() == size_t(T + 1));
            }
            at = end;
        }
        // The tail after the last window: nothing, or a lone token (no target) left out.
        CHECK(kept.size() - at <= 1);
    }
}

TEST_CASE("packing is stateless and splits over ranks and micro-steps as before", "[data][packing]") {
    std::vector<Doc> docs;
    std::mt19937_64 rng(7);
    for (int i = 0; i < 300; ++i) {
        const bool splittable = i % 4 == 0;
        Doc doc{i + 1, 2 + int(rng() % 20), splittable, {}};
        for (int p = 0; p < doc.length; ++p) doc.counted.push_back(splittable || p > doc.length / 2);
        docs.push_back(doc);
    }
    const auto shards = doc_shards(docs, {100, 1000, 1001});
    pv::DataLoader a(shards, 16, 3, true), b(shards, 16, 3, true);
    REQUIRE(a.packed());
    const long long W = a.windows();
    REQUIRE(W > 40);
    // Samples are windows in the shuffled order, an epoch a permutation, any access order.
    std::set<long long> epoch;
    for (long long g = 0; g < W; ++g) epoch.insert(a.window_of(g));
    CHECK(epoch.size() == size_t(W));
    for (long long g : {3 * W + 5, 2LL, W, 7 * W - 1}) CHECK(b.window_of(g) == a.window_of(g));
    // Micro-batches hold the windows of their global samples, with their positions; the samples
    // of a step do not depend on how the batch is split.
    const std::vector<pv::BatchGeometry> geometries = {{8, 2, 4, 1}, {8, 2, 2, 2}, {8, 1, 1, 8}, {8, 4, 1, 2}};
    for (long long step = 0; step < 3 * W / 8; ++step) {
        std::vector<int> reference_positions;
        const auto reference = step_inputs(a, step, geometries[0]);
        for (const auto& g : geometries) {
            INFO("step " << step << ", world " << g.world);
            CHECK(step_inputs(b, step, g) == reference);
            for (int r = 0; r < g.world; ++r)
                for (int j = 0; j < g.accumulation; ++j) {
                    const auto mb = b.micro_batch(step, j, g, r);
                    REQUIRE(mb.positions.size() == mb.inputs.size());
                    for (int i = 0; i < g.micro_batch; ++i) {
                        const long long sample = step * 8 + r * (8 / g.world) + j * g.micro_batch + i;
                        const Window w = window_of_loader(a, a.window_of(sample));
                        const auto row = [&](const std::vector<int>& v) {
                            return std::vector<int>(v.begin() + i * 16, v.begin() + (i + 1) * 16);
                        };
                        CHECK(row(mb.inputs) == w.inputs);
                        CHECK(row(mb.targets) == w.targets);
                        CHECK(row(mb.positions) == w.positions);
                    }
                }
        }
    }
    // Without the mask, micro-batches carry no positions.
    pv::DataLoader plain(shards, 16, 3);
    CHECK(plain.micro_batch(0, 0, {8, 2, 4, 1}, 0).positions.empty());
}

TEST_CASE("all documents splittable: the windows are today's, flags only mask targets", "[data][packing]") {
    // Plain-text documents with explicit flags, some tokens not counted: the same windows as
    // version-1 data (k·T, T+1 long, overlapping by one), whatever the document boundaries.
    std::vector<Doc> docs;
    for (int i = 0; i < 30; ++i) {
        Doc doc{i + 1, 1 + (i * 7) % 11, true, {}};
        for (int p = 0; p < doc.length; ++p) doc.counted.push_back((p + i) % 4 != 0);
        docs.push_back(doc);
    }
    const auto shards = doc_shards(docs, {17, 40});
    std::vector<int> stream;
    std::vector<uint8_t> flags;
    for (const auto& s : shards) {
        stream.insert(stream.end(), s.tokens.begin(), s.tokens.end());
        flags.insert(flags.end(), s.flags.begin(), s.flags.end());
    }
    const long long N = (long long)stream.size();
    for (const bool mask : {false, true}) {
        for (const int T : {1, 5, 16}) {
            INFO("T " << T << ", mask " << mask);
            pv::DataLoader d(shards, T, 2, mask);
            CHECK(!d.packed());
            REQUIRE(d.windows() == (N - 1) / T);
            CHECK(d.counts().padding_tokens == 0);
            long long counted = 0;
            for (long long k = 0; k < d.windows(); ++k) {
                const Window w = window_of_loader(d, k);
                int position = 0;
                for (int i = 0; i < T; ++i) {
                    const long long p = k * T + i;
                    CHECK(w.inputs[size_t(i)] == stream[size_t(p)]);
                    const bool start_next = flags[size_t(p + 1)] & pv::kTokenStartsDocument;
                    const bool counts = (flags[size_t(p + 1)] & pv::kTokenCounted) && !(mask && start_next);
                    CHECK(w.targets[size_t(i)] == (counts ? stream[size_t(p + 1)] : -100));
                    counted += counts;
                    if (i > 0 && (flags[size_t(p)] & pv::kTokenStartsDocument)) position = 0;
                    if (mask) CHECK(w.positions[size_t(i)] == position);
                    ++position;
                }
            }
            CHECK(d.counts().counted_targets == counted);
        }
    }
}

TEST_CASE("version-1 data with the document mask: documents end at each EOT", "[data][packing]") {
    // counting_shards' tokens are their positions modulo 13 with eot_token 0: a document starts
    // after each 0.
    auto shards = counting_shards(200, 13);
    pv::DataLoader d(shards, 10, 1, true), unmasked(shards, 10, 1);
    CHECK(!d.packed());
    // Starts: position 0, and after each 0 but the last token: 1, 14, 27, ..., 196.
    CHECK(d.counts().documents == 1 + 16);
    for (long long k = 0; k < d.windows(); ++k) {
        const Window w = window_of_loader(d, k), u = window_of_loader(unmasked, k);
        CHECK(w.inputs == u.inputs);
        for (int i = 0; i < 10; ++i) {
            const long long p = k * 10 + i;
            CHECK(w.inputs[size_t(i)] == p % 13);
            CHECK(u.targets[size_t(i)] == (p + 1) % 13);                         // everything counts
            CHECK(w.targets[size_t(i)] == (p % 13 == 0 ? -100 : (p + 1) % 13));  // EOT predicts across
            // The position counts from the document's start, or from the window's when later.
            const long long start = p == 0 ? 0 : (p - 1) / 13 * 13 + 1;
            CHECK(w.positions[size_t(i)] == p - std::max(start, k * 10));
        }
    }
}

TEST_CASE("packing errors name the problem and the fix", "[data][packing]") {
    // Every document is a chat longer than a window: nothing to train on.
    const auto m = thrown_message([] { pv::DataLoader(doc_shards({{1, 12, false, {}}, {2, 20, false, {}}}), 8, 1); });
    INFO(m);
    CHECK(m.find("no window of 9 tokens") != std::string::npos);
    CHECK(m.find("2 of its 2 documents") != std::string::npos);
    CHECK(m.find("--seq-len") != std::string::npos);
    auto shards = doc_shards({{1, 5, false, {}}, {2, 5, true, {}}});
    shards[0].flags.pop_back();
    CHECK(thrown_message([&] { pv::DataLoader(shards, 4, 1); }).find("9 flags for 10 tokens") != std::string::npos);
    // A document continued across shards must keep its kind.
    auto mixed = doc_shards({{1, 6, false, {}}, {2, 5, true, {}}}, {3});
    mixed[1].flags[0] |= pv::kTokenSplittable;
    CHECK(thrown_message([&] { pv::DataLoader(mixed, 4, 1); }).find("shard 1 continues") != std::string::npos);
}
