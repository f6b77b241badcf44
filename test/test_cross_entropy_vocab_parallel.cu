// The vocabulary-parallel cross-entropy (kernels/cross_entropy.cuh: cross_entropy_partials,
// cross_entropy_merge_partials, cross_entropy_backward_columns) with its ranks played in one
// process: the [N][V] logits cut into T column blocks (uneven ones too), each block's partials
// computed alone, concatenated in rank order as the all-gather would, and merged. Against the fp64
// reference of the whole rows: the rows' losses, the loss sum and count, and every block's gradient;
// a bad target poisons its row on every rank; and in fp64 the assembled gradient equals central
// differences of the merged loss.
#include <catch2/catch.hpp>

#include "kernels/cross_entropy.cuh"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/cross_entropy.h"

#include <cmath>
#include <random>
#include <vector>

using namespace pv::test;

namespace vocab_parallel_test {

constexpr int kIgnore = -100;

template <class T>
struct Result {
    std::vector<double> row_loss, dlogits;  // dlogits [N][V], assembled from the blocks
    double loss_sum = 0;
    int count = 0;
};

// The logits' columns cut at `cuts` (0 = c_0 < c_1 < … < c_T = V); every "rank" computes its
// partials and, after the merge, its block's gradient with scale.
template <class T>
Result<T> run(const std::vector<T>& logits, const std::vector<int>& targets, long long N, int V,
              const std::vector<int>& cuts, double scale) {
    using A = pv::acc_t<T>;
    const int ranks = int(cuts.size()) - 1;
    DeviceArray<int> d_targets(targets);
    std::vector<pv::CrossEntropyPartial<A>> gathered;
    std::vector<std::vector<T>> blocks;
    for (int r = 0; r < ranks; ++r) {
        const int first = cuts[size_t(r)], width = cuts[size_t(r) + 1] - first;
        std::vector<T> block(size_t(N) * width);
        for (long long n = 0; n < N; ++n)
            for (int j = 0; j < width; ++j) block[size_t(n * width + j)] = logits[size_t(n * V + first + j)];
        DeviceArray<T> d_block(block);
        DeviceArray<pv::CrossEntropyPartial<A>> partials{size_t(N)};
        pv::cross_entropy_partials(d_block.get(), d_targets.get(), partials.get(), N, width, first, nullptr);
        const auto mine = partials.download();
        gathered.insert(gathered.end(), mine.begin(), mine.end());  // rank order, as the all-gather
        blocks.push_back(std::move(block));
    }
    DeviceArray<pv::CrossEntropyPartial<A>> d_gathered(gathered);
    DeviceArray<pv::CrossEntropyStats<A>> stats{size_t(N)};
    DeviceArray<A> row_loss{size_t(N)}, loss_sum{1};
    DeviceArray<int> count{1};
    pv::cross_entropy_merge_partials<T>(d_gathered.get(), ranks, d_targets.get(), stats.get(), row_loss.get(),
                                        loss_sum.get(), count.get(), N, V, kIgnore, nullptr);
    Result<T> out;
    out.row_loss = to_double(row_loss.download());
    out.loss_sum = double(loss_sum.download()[0]);
    out.count = count.download()[0];
    out.dlogits.assign(size_t(N) * V, 0.0);
    for (int r = 0; r < ranks; ++r) {
        const int first = cuts[size_t(r)], width = cuts[size_t(r) + 1] - first;
        DeviceArray<T> d_block(blocks[size_t(r)]);  // in place, as the head does
        pv::cross_entropy_backward_columns(d_block.get(), d_targets.get(), stats.get(), d_block.get(), N, width, first,
                                           V, kIgnore, scale, nullptr);
        const auto d = to_double(d_block.download());
        for (long long n = 0; n < N; ++n)
            for (int j = 0; j < width; ++j) out.dlogits[size_t(n * V + first + j)] = d[size_t(n * width + j)];
    }
    return out;
}

std::vector<int> targets_for(long long N, int V, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int> t(static_cast<size_t>(N));
    for (auto& v : t) v = rng() % 4 == 0 ? kIgnore : int(rng() % uint64_t(V));
    t[0] = 0, t[1] = V - 1;  // the first and the last column (the ends of the first and last block)
    return t;
}

template <class T>
void check_against_reference() {
    const long long N = 9;
    const int V = 37;
    const auto logits = random_vector<T>(size_t(N) * V, 41, -4.0, 4.0);
    const auto targets = targets_for(N, V, 42);
    const auto ref = pv::reference::cross_entropy_forward(to_double(logits), targets, size_t(N), size_t(V), kIgnore);
    const double scale = 1.0 / ref.count;
    const auto ref_d =
        pv::reference::cross_entropy_backward(to_double(logits), targets, size_t(N), size_t(V), kIgnore, scale);
    for (const std::vector<int>& cuts : {std::vector<int>{0, V}, {0, 19, V}, {0, 13, 25, V}, {0, 10, 19, 28, V},
                                         {0, 1, 2, 36, V}}) {
        const Result<T> r = run(logits, targets, N, V, cuts, scale);
        INFO(cuts.size() - 1 << " ranks, blocks from " << cuts[1]);
        CHECK(compare(r.row_loss, ref.row_loss, tolerance<T>()).empty());
        CHECK(compare({r.loss_sum}, {ref.loss_sum}, tolerance<T>()).empty());
        CHECK(r.count == ref.count);
        CHECK(compare(r.dlogits, ref_d, tolerance<T>()).empty());
    }
}

}  // namespace vocab_parallel_test

using namespace vocab_parallel_test;

TEST_CASE("vocabulary-parallel cross-entropy equals the whole rows' (fp64, fp32, bf16)",
          "[kernels][cross_entropy][tensor_parallel]") {
    check_against_reference<double>();  // DESIGN.md §5's tolerances of each storage type
    check_against_reference<float>();
    check_against_reference<__nv_bfloat16>();
}

TEST_CASE("vocabulary-parallel cross-entropy: a target outside the vocabulary poisons its row on every rank",
          "[kernels][cross_entropy][tensor_parallel]") {
    const long long N = 3;
    const int V = 11;
    const auto logits = random_vector<double>(size_t(N) * V, 7, -2.0, 2.0);
    const std::vector<int> targets = {4, 11, kIgnore};  // 11: one past the whole vocabulary
    const Result<double> r = run(logits, targets, N, V, {0, 6, V}, 0.5);
    CHECK(std::isfinite(r.row_loss[0]));
    CHECK(std::isnan(r.row_loss[1]));
    CHECK(r.row_loss[2] == 0.0);
    for (int j = 0; j < V; ++j) {
        CHECK(std::isnan(r.dlogits[size_t(V + j)]));  // both blocks of row 1
        CHECK(r.dlogits[size_t(2 * V + j)] == 0.0);
    }
}

// L = loss_sum · scale, the merged loss, differentiated by central differences of the logits.
TEST_CASE("vocabulary-parallel cross-entropy backward equals central differences of its merged loss (fp64)",
          "[kernels][cross_entropy][tensor_parallel][gradcheck]") {
    const long long N = 4;
    const int V = 13;
    auto logits = random_vector<double>(size_t(N) * V, 5, -3.0, 3.0);
    const std::vector<int> targets = {12, kIgnore, 0, 6};
    const std::vector<int> cuts = {0, 5, 9, V};
    const double scale = 1.0 / 3;
    const auto numeric =
        numerical_gradient(logits, [&] { return run(logits, targets, N, V, cuts, scale).loss_sum * scale; });
    const Result<double> r = run(logits, targets, N, V, cuts, scale);
    const std::string err = compare(r.dlogits, numeric, kGradTolerance);
    INFO(err);
    CHECK(err.empty());
}
