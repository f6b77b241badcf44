// Fused softmax + cross-entropy against the fp64 reference (bf16, fp32, fp64), with ignored rows,
// logits large enough that a naive exp overflows, bad targets, the in-place backward, a
// central-difference check of the backward in fp64 and the bitwise determinism of loss_sum. The
// one-pass loss and gradient (the fused linear cross-entropy's) on each of those inputs gives the
// bits of the forward followed by the backward: row losses, row statistics and gradient.
//
// The vocabulary-parallel cross-entropy (cross_entropy_partials, cross_entropy_merge_partials,
// cross_entropy_backward_columns) with its ranks played in one process: the [N][V] logits cut into
// T column blocks (uneven ones too), each block's partials computed alone, concatenated in rank
// order as the all-gather would, and merged. Against the fp64 reference of the whole rows: the
// rows' losses, the loss sum and count, and every block's gradient; a bad target poisons its row
// on every rank; and in fp64 the assembled gradient equals central differences of the merged loss.
#include "kernels/cross_entropy.cuh"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/cross_entropy.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace pv::test;

namespace cross_entropy_test {

constexpr int kIgnore = -100;

// Under ThreadSanitizer (make test-tsan) every emulated thread is a fresh fiber context and runs
// ~100 times slower; the races it looks for (the shared-memory merge, the in-place backward) show
// up at small row counts, so that build runs fewer rows (multi-warp blocks stay: V = 4099) and
// samples the gradient check.
constexpr bool kTsanBuild = pv::kThreadSanitizer;
long long rows_for_build(long long rows, long long tsan_rows) { return kTsanBuild ? tsan_rows : rows; }

enum class Ignore { Some, All };

// Targets in [0, V); with Ignore::Some about a quarter of the rows get kIgnore, with Ignore::All
// every row does.
std::vector<int> random_targets(size_t N, int V, Ignore ignore, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> token(0, V - 1), quarter(0, 3);
    std::vector<int> t(N);
    for (auto& v : t) v = (ignore == Ignore::All || quarter(rng) == 0) ? kIgnore : token(rng);
    return t;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The forward's outputs on the host.
template <class T>
struct Forward {
    std::vector<pv::acc_t<T>> row_loss;
    pv::acc_t<T> loss_sum;
    int count;
};

template <class T>
Forward<T> run_forward(const DeviceArray<T>& logits, const DeviceArray<int>& targets, long long N, int V) {
    using A = pv::acc_t<T>;
    DeviceArray<A> row_loss{size_t(N)}, loss_sum{1};
    DeviceArray<int> count{1};
    pv::cross_entropy_forward(logits.get(), targets.get(), row_loss.get(),
                              static_cast<pv::CrossEntropyStats<A>*>(nullptr), loss_sum.get(), count.get(), N, V,
                              kIgnore, nullptr);
    return {row_loss.download(), loss_sum.download()[0], count.download()[0]};
}

// The backward as the model runs it: the forward on the same logits saves each row's (max, sum)
// (into a poisoned buffer), then the backward reads them. `logits` may be `dlogits`.
template <class T>
void run_backward(const T* logits, const int* targets, T* dlogits, long long N, int V, double scale) {
    using A = pv::acc_t<T>;
    DeviceArray<A> row_loss{size_t(N)}, loss_sum{1};
    DeviceArray<int> count{1};
    DeviceArray<pv::CrossEntropyStats<A>> stats{size_t(N)};
    pv::cross_entropy_forward(logits, targets, row_loss.get(), stats.get(), loss_sum.get(), count.get(), N, V, kIgnore,
                              nullptr);
    pv::cross_entropy_backward(logits, targets, stats.get(), dlogits, N, V, kIgnore, scale, nullptr);
}

// The one-pass kernel, in place on a copy of the logits, into poisoned row losses and statistics,
// with the sum after it as the head runs it: each of its outputs the same bits as the forward's
// and the backward's on the same logits (which the callers hold against the fp64 reference).
template <class T>
void check_one_pass(const std::vector<T>& logits, const std::vector<int>& targets, long long N, int V, double scale) {
    using A = pv::acc_t<T>;
    DeviceArray<T> d_logits(logits), d_fused(logits);
    DeviceArray<int> d_targets(targets);
    DeviceArray<A> row_loss{size_t(N)}, loss_sum{1}, fused_loss{size_t(N)}, fused_sum{1};
    DeviceArray<int> count{1}, fused_count{1};
    DeviceArray<pv::CrossEntropyStats<A>> stats{size_t(N)}, fused_stats{size_t(N)};
    pv::cross_entropy_forward(d_logits.get(), d_targets.get(), row_loss.get(), stats.get(), loss_sum.get(), count.get(),
                              N, V, kIgnore, nullptr);
    pv::cross_entropy_backward(d_logits.get(), d_targets.get(), stats.get(), d_logits.get(), N, V, kIgnore, scale,
                               nullptr);
    pv::cross_entropy_loss_and_gradient(d_fused.get(), d_targets.get(), fused_loss.get(), fused_stats.get(), N, V,
                                        kIgnore, scale, nullptr);
    pv::cross_entropy_sum<T>(fused_loss.get(), d_targets.get(), fused_sum.get(), fused_count.get(), N, kIgnore,
                             nullptr);
    INFO("one pass, N " << N << " V " << V);
    REQUIRE(bitwise_equal(fused_loss.download(), row_loss.download()));
    REQUIRE(bitwise_equal(fused_sum.download(), loss_sum.download()));
    REQUIRE(fused_count.download() == count.download());
    REQUIRE(bitwise_equal(fused_stats.download(), stats.download()));
    REQUIRE(bitwise_equal(d_fused.download(), d_logits.download()));
    // The scale read from device memory (a captured step's: DeviceScalar), by both kernels that take
    // it: the same bits.
    const DeviceArray<double> in_memory(std::vector<double>{scale});
    const auto at = pv::DeviceScalar<double>::in_memory(in_memory.get());
    DeviceArray<T> d_captured(logits), d_backward(logits.size()), d_original(logits);
    d_backward.poison();
    pv::cross_entropy_loss_and_gradient(d_captured.get(), d_targets.get(), fused_loss.get(), fused_stats.get(), N, V,
                                        kIgnore, at, nullptr);
    pv::cross_entropy_backward(d_original.get(), d_targets.get(), stats.get(), d_backward.get(), N, V, kIgnore, at,
                               nullptr);
    INFO("the scale in device memory");
    REQUIRE(bitwise_equal(d_captured.download(), d_logits.download()));
    REQUIRE(bitwise_equal(d_backward.download(), d_logits.download()));
}

// Inputs rounded to T, so the reference sees exactly what the kernel sees. Checks the forward, the
// backward out of place, and that the backward in place (dlogits == logits) gives the same bits.
template <class T>
void check_against_reference(long long N, int V, Ignore ignore, uint64_t seed, double lo = -4.0, double hi = 4.0) {
    const auto logits = random_vector<T>(size_t(N) * V, seed, lo, hi);
    const auto targets = random_targets(size_t(N), V, ignore, seed + 1);
    DeviceArray<T> d_logits(logits), d_dlogits(logits.size()), d_inplace(logits);
    DeviceArray<int> d_targets(targets);

    const Forward<T> f = run_forward(d_logits, d_targets, N, V);
    const auto ref = pv::reference::cross_entropy_forward(to_double(logits), targets, size_t(N), size_t(V), kIgnore);
    const double scale = ref.count > 0 ? 1.0 / ref.count : 1.0;
    run_backward(d_logits.get(), d_targets.get(), d_dlogits.get(), N, V, scale);
    run_backward(d_inplace.get(), d_targets.get(), d_inplace.get(), N, V, scale);
    const auto ref_d =
        pv::reference::cross_entropy_backward(to_double(logits), targets, size_t(N), size_t(V), kIgnore, scale);
    const auto dlogits = d_dlogits.download();

    const std::string e1 = compare(to_double(f.row_loss), ref.row_loss, tolerance<T>());
    const std::string e2 = compare({double(f.loss_sum)}, {ref.loss_sum}, tolerance<T>());
    const std::string e3 = compare(to_double(dlogits), ref_d, tolerance<T>());
    INFO("N " << N << " V " << V << " logits in [" << lo << ", " << hi << ") counted " << ref.count
              << "\nrow_loss: " << e1 << "\nloss_sum: " << e2 << "\ndlogits: " << e3);
    REQUIRE(e1.empty());
    REQUIRE(e2.empty());
    REQUIRE(f.count == ref.count);
    REQUIRE(e3.empty());
    REQUIRE(bitwise_equal(d_inplace.download(), dlogits));
    check_one_pass(logits, targets, N, V, scale);
}

}  // namespace cross_entropy_test

using namespace cross_entropy_test;

TEST_CASE("cross-entropy matches the fp64 reference", "[kernels][cross_entropy]") {
    for (long long N : {1LL, 7LL, 33LL, 130LL})
        for (int V : {5, 515, 4099, 520, 4096}) {                 // 520, 4096: the 16-byte paths of every type
            if (kTsanBuild && (N > 7 || N * V > 4099)) continue;  // TSan: 1 row of each V, 7 of the small ones
            const uint64_t seed = uint64_t(N * 10000 + V);
            check_against_reference<double>(N, V, Ignore::Some, seed);
            check_against_reference<float>(N, V, Ignore::Some, seed + 2);
            check_against_reference<__nv_bfloat16>(N, V, Ignore::Some, seed + 4);
        }
}

// Every row ignored: count 0, loss_sum exactly 0, every gradient exactly 0.
TEST_CASE("cross-entropy with every row ignored", "[kernels][cross_entropy]") {
    for (long long N : {1LL, 7LL}) {
        check_against_reference<double>(N, 515, Ignore::All, 50);
        check_against_reference<float>(N, 515, Ignore::All, 51);
        check_against_reference<__nv_bfloat16>(N, 515, Ignore::All, 52);
    }
}

// exp(100) overflows float (and exp(-100) underflows): the max-shifted online sums do not.
TEST_CASE("cross-entropy with logits where a naive exp overflows", "[kernels][cross_entropy][numerics]") {
    const long long N = rows_for_build(33, 7);
    check_against_reference<float>(N, 515, Ignore::Some, 60, -100.0, 100.0);
    check_against_reference<float>(N, 515, Ignore::Some, 61, 85.0, 100.0);     // a naive Σ exp is inf
    check_against_reference<float>(7, 4099, Ignore::Some, 62, -100.0, -85.0);  // a naive Σ exp is 0
    check_against_reference<__nv_bfloat16>(N, 515, Ignore::Some, 63, -100.0, 100.0);
    check_against_reference<double>(N, 515, Ignore::Some, 64, -800.0, 800.0);  // exp(710) overflows double
}

TEST_CASE("cross-entropy at Llama 3's vocabulary size", "[kernels][cross_entropy][numerics]") {
    check_against_reference<float>(rows_for_build(3, 1), 128256, Ignore::Some, 70);
    check_against_reference<__nv_bfloat16>(rows_for_build(2, 1), 128256, Ignore::Some, 71);
}

// A target outside [0, V) that is not ignore_index: that row's loss and gradient are NaN, the row
// is counted, and the other rows are unaffected.
TEST_CASE("cross-entropy marks out-of-range targets with NaN", "[kernels][cross_entropy]") {
    const long long N = 4;
    const int V = 9;
    const auto logits = random_vector<float>(size_t(N) * V, 80);
    const std::vector<int> targets = {2, -1, V, kIgnore};
    DeviceArray<float> d_logits(logits), d_dlogits(logits.size());
    DeviceArray<int> d_targets(targets);
    const Forward<float> f = run_forward(d_logits, d_targets, N, V);
    run_backward(d_logits.get(), d_targets.get(), d_dlogits.get(), N, V, 1.0 / 3);
    const auto d = d_dlogits.download();

    const auto ref =
        pv::reference::cross_entropy_forward(to_double(logits), {2, kIgnore, kIgnore, kIgnore}, 1, V, kIgnore);
    const auto ref_d = pv::reference::cross_entropy_backward(to_double(logits), {2}, 1, V, kIgnore, 1.0 / 3);
    REQUIRE(compare({double(f.row_loss[0])}, {ref.row_loss[0]}, tolerance<float>()).empty());
    REQUIRE(std::isnan(f.row_loss[1]));
    REQUIRE(std::isnan(f.row_loss[2]));
    REQUIRE(f.row_loss[3] == 0.0f);
    REQUIRE(std::isnan(f.loss_sum));
    REQUIRE(f.count == 3);
    REQUIRE(compare(to_double(std::vector<float>(d.begin(), d.begin() + V)), ref_d, tolerance<float>()).empty());
    for (int j = 0; j < V; ++j) {
        INFO("column " << j);
        REQUIRE(std::isnan(d[size_t(V + j)]));
        REQUIRE(std::isnan(d[size_t(2 * V + j)]));
        REQUIRE(d[size_t(3 * V + j)] == 0.0f);
    }
    check_one_pass(logits, targets, N, V, 1.0 / 3);  // NaN where the two passes put NaN (memcmp: the same bits)
}

// L = loss_sum · scale with scale = 1 / count, the step loss of DESIGN.md §4.
TEST_CASE("cross-entropy backward equals central differences of its forward (fp64)",
          "[kernels][cross_entropy][gradcheck]") {
    const long long N = 5;
    const int V = 7;
    auto logits = random_vector<double>(size_t(N) * V, 90, -3.0, 3.0);
    const std::vector<int> targets = {3, kIgnore, 0, 6, 3};
    const double scale = 1.0 / 4;
    DeviceArray<double> d_logits(logits), d_dlogits(logits.size());
    DeviceArray<int> d_targets(targets);
    auto loss = [&] {
        d_logits.upload(logits);
        const Forward<double> f = run_forward(d_logits, d_targets, N, V);
        REQUIRE(f.count == 4);
        return f.loss_sum * scale;
    };
    // Every coordinate, or under TSan every 4th (each forward there costs ~0.1 s).
    std::vector<size_t> indices;
    for (size_t i = 0; i < logits.size(); i += kTsanBuild ? 4 : 1) indices.push_back(i);
    const auto numeric = numerical_gradient(logits, loss, indices);
    d_logits.upload(logits);
    run_backward(d_logits.get(), d_targets.get(), d_dlogits.get(), N, V, scale);
    const std::string err = compare(gather(d_dlogits.download(), indices), gather(numeric, indices), kGradTolerance);
    INFO(err);
    REQUIRE(err.empty());
}

// The same inputs give the same bits: fixed reduction orders, no atomics (under the random
// schedules each launch also runs its threads and blocks in a different order).
TEST_CASE("cross-entropy loss_sum is bitwise deterministic", "[kernels][cross_entropy]") {
    const long long N = rows_for_build(130, 2);
    const int V = 4099;
    const auto logits = random_vector<float>(size_t(N) * V, 100, -6.0, 6.0);
    const auto targets = random_targets(size_t(N), V, Ignore::Some, 101);
    DeviceArray<float> d_logits(logits);
    DeviceArray<int> d_targets(targets);
    const Forward<float> a = run_forward(d_logits, d_targets, N, V);
    const Forward<float> b = run_forward(d_logits, d_targets, N, V);
    REQUIRE(std::memcmp(&a.loss_sum, &b.loss_sum, sizeof(float)) == 0);
    REQUIRE(bitwise_equal(a.row_loss, b.row_loss));
    REQUIRE(a.count == b.count);
}

namespace vocab_parallel_test {

using cross_entropy_test::kIgnore;

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

// [launches]: dozens of launches each (five cuts of the vocabulary, three types; central differences
// through every block), each ~0.3 s under ThreadSanitizer, which runs the bad-target case's launches
// of the same three kernels instead (Makefile, TSAN_TESTS).
TEST_CASE("vocabulary-parallel cross-entropy equals the whole rows' (fp64, fp32, bf16)",
          "[kernels][cross_entropy][tensor_parallel][launches]") {
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
          "[kernels][cross_entropy][tensor_parallel][gradcheck][launches]") {
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
