// Token embedding kernels against the fp64 reference (bf16, fp32, fp64), including tokens outside
// the vocabulary; the backward's accumulation, its bit-exact summation order over several chunks,
// a central-difference check of the backward in fp64, and the vocabulary-parallel slices (a table
// of some of the token rows) against the whole table.
#include "kernels/embedding.cuh"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/embedding.h"

#include <algorithm>
#include <tuple>

using namespace pv::test;

namespace embedding_test {

// Tokens drawn from [0, V), so small vocabularies repeat tokens often; with `bad`, every fifth
// position (from the second) gets a token outside [0, V): -1, V, or a large one.
inline std::vector<int> random_tokens(size_t N, int V, uint64_t seed, bool bad) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> dist(0, V - 1);
    std::vector<int> tokens(N);
    for (size_t n = 0; n < N; ++n) tokens[n] = dist(rng);
    if (bad) {
        const int outside[] = {-1, V, 1 << 30};
        for (size_t n = 1; n < N; n += 5) tokens[n] = outside[(n / 5) % 3];
    }
    return tokens;
}

inline bool valid(int token, int V) { return token >= 0 && token < V; }

// embedding_backward with a scratch of its own, poisoned.
template <class T>
void backward(const int* tokens, const T* dout, T* dwte, long long N, int C, int V) {
    DeviceArray<unsigned char> scratch(pv::embedding_backward_scratch_bytes(N));
    pv::embedding_backward(tokens, dout, dwte, N, C, V, scratch.get(), nullptr);
}

// Forward and backward against the reference. The forward runs twice: into poisoned memory
// (every good row must be written) and into random values (every bad row must become NaN).
template <class T>
void check_against_reference(long long N, int C, int V, uint64_t seed) {
    const size_t NC = size_t(N) * C, VC = size_t(V) * C;
    const auto tokens = random_tokens(size_t(N), V, seed, N > 1);
    const auto wte = random_vector<T>(VC, seed + 1);
    const auto dout = random_vector<T>(NC, seed + 2);
    const auto dwte0 = random_vector<T>(VC, seed + 3);
    DeviceArray<int> d_tokens(tokens);
    DeviceArray<T> d_wte(wte), d_dout(dout), d_out(NC), d_dwte(dwte0);
    pv::embedding_forward(d_tokens.get(), d_wte.get(), d_out.get(), N, C, V, nullptr);
    const auto out = to_double(d_out.download());
    d_out.upload(random_vector<T>(NC, seed + 4));
    pv::embedding_forward(d_tokens.get(), d_wte.get(), d_out.get(), N, C, V, nullptr);
    const auto out_again = to_double(d_out.download());
    backward(d_tokens.get(), d_dout.get(), d_dwte.get(), N, C, V);
    const auto dwte = d_dwte.download();

    const auto ref_out = pv::reference::embedding_forward(tokens, to_double(wte), size_t(N), size_t(C), size_t(V));
    auto ref_dwte = to_double(dwte0);
    pv::reference::embedding_backward(tokens, to_double(dout), ref_dwte, size_t(N), size_t(C), size_t(V));

    // Good rows equal the reference (compared as one vector); bad rows are NaN in both runs.
    std::vector<double> got_good, ref_good;
    size_t bad_rows = 0, non_nan = 0;
    for (size_t n = 0; n < size_t(N); ++n)
        for (size_t c = 0; c < size_t(C); ++c) {
            const size_t i = n * C + c;
            if (valid(tokens[n], V)) {
                got_good.push_back(out[i]);
                got_good.push_back(out_again[i]);
                ref_good.push_back(ref_out[i]);
                ref_good.push_back(ref_out[i]);
            } else {
                bad_rows += c == 0;
                non_nan += !std::isnan(out[i]) + !std::isnan(out_again[i]);
            }
        }
    const std::string e_out = compare(got_good, ref_good, tolerance<T>());
    const std::string e_dwte = compare(to_double(dwte), ref_dwte, tolerance<T>());
    // Rows of tokens that never occur are untouched: the same bits as before.
    std::vector<bool> used(size_t(V), false);
    for (int t : tokens)
        if (valid(t, V)) used[size_t(t)] = true;
    size_t changed = 0;
    for (size_t v = 0; v < size_t(V); ++v)
        if (!used[v]) changed += std::memcmp(&dwte[v * C], &dwte0[v * C], size_t(C) * sizeof(T)) != 0;
    INFO("N " << N << " C " << C << " V " << V << " (" << bad_rows << " bad tokens)\nforward: " << e_out
              << "\nbackward: " << e_dwte);
    REQUIRE(e_out.empty());
    REQUIRE(non_nan == 0);
    REQUIRE(e_dwte.empty());
    REQUIRE(changed == 0);
}

// The backward's summation order, written out sequentially: per chunk of positions, per token
// and channel, the sum in acc_t<T> over the chunk's positions in ascending order, added to dwte
// with one rounding. A race or a schedule-dependent order in the kernel breaks the bits.
template <class T>
std::vector<T> sequential_backward(const std::vector<int>& tokens, const std::vector<T>& dout, std::vector<T> dwte,
                                   long long N, int C, int V) {
    using A = pv::acc_t<T>;
    const long long chunk = pv::kEmbeddingBackwardChunk;
    for (long long start = 0; start < N; start += chunk) {
        const long long end = std::min(N, start + chunk);
        for (int v = 0; v < V; ++v) {
            bool seen = false;
            std::vector<A> sum(size_t(C), A(0));
            for (long long n = start; n < end; ++n)
                if (tokens[size_t(n)] == v) {
                    seen = true;
                    for (int c = 0; c < C; ++c) sum[size_t(c)] += pv::to_acc(dout[size_t(n * C + c)]);
                }
            if (seen)
                for (int c = 0; c < C; ++c) {
                    T& w = dwte[size_t(v) * C + c];
                    w = pv::from_acc<T>(pv::to_acc(w) + sum[size_t(c)]);
                }
        }
    }
    return dwte;
}

// Many repeats of few tokens over three chunks: run twice, both bit-identical to the sequential
// order (and so to each other), and within tolerance of the fp64 reference.
template <class T>
void check_deterministic(uint64_t seed, int C) {
    const long long N = 2LL * pv::kEmbeddingBackwardChunk + 37;
    const int V = 13;
    const auto tokens = random_tokens(size_t(N), V, seed, true);
    const auto dout = random_vector<T>(size_t(N) * C, seed + 1);
    const auto dwte0 = random_vector<T>(size_t(V) * C, seed + 2);
    DeviceArray<int> d_tokens(tokens);
    DeviceArray<T> d_dout(dout);
    const auto expected = sequential_backward(tokens, dout, dwte0, N, C, V);
    auto ref = to_double(dwte0);
    pv::reference::embedding_backward(tokens, to_double(dout), ref, size_t(N), size_t(C), size_t(V));
    for (int run = 0; run < 2; ++run) {
        DeviceArray<T> d_dwte(dwte0);
        backward(d_tokens.get(), d_dout.get(), d_dwte.get(), N, C, V);
        const auto got = d_dwte.download();
        const std::string err = compare(to_double(got), ref, tolerance<T>());
        INFO("C " << C << " run " << run << ": " << err);
        REQUIRE(std::memcmp(got.data(), expected.data(), got.size() * sizeof(T)) == 0);
        REQUIRE(err.empty());
    }
}

// Tensor parallelism's vocabulary-parallel embedding (model/tensor_parallel.h): T ranks holding
// the token rows [r·P, min(V, (r+1)·P)), P = ⌈V/T⌉ (the last rank fewer). Each rank's forward into
// poisoned memory, summed over the ranks, is the whole table's forward bit for bit (one rank's row
// and zeros; NaN for a bad token on every rank); each rank's backward is the whole backward's rows
// bit for bit, and leaves its other rows alone.
template <class T>
void check_vocabulary_slices(long long N, int C, int V, int ranks, uint64_t seed) {
    const size_t NC = size_t(N) * C;
    const auto tokens = random_tokens(size_t(N), V, seed, true);
    const auto wte = random_vector<T>(size_t(V) * C, seed + 1);
    const auto dout = random_vector<T>(NC, seed + 2);
    const auto dwte0 = random_vector<T>(size_t(V) * C, seed + 3);
    DeviceArray<int> d_tokens(tokens);
    DeviceArray<T> d_wte(wte), d_dout(dout), d_out(NC), d_dwte(dwte0);
    pv::embedding_forward(d_tokens.get(), d_wte.get(), d_out.get(), N, C, V, nullptr);
    const auto whole_out = d_out.download();
    backward(d_tokens.get(), d_dout.get(), d_dwte.get(), N, C, V);
    const auto whole_dwte = d_dwte.download();

    const int rows = (V + ranks - 1) / ranks;
    std::vector<pv::acc_t<T>> sum(NC, pv::acc_t<T>(0));
    for (int r = 0; r < ranks; ++r) {
        const int first = r * rows, count = std::min(V, first + rows) - first;
        INFO("N " << N << " C " << C << " V " << V << ": rank " << r << " of " << ranks << ", rows " << first
                  << " + " << count);
        REQUIRE(count > 0);
        const std::vector<T> mine(wte.begin() + ptrdiff_t(first) * C, wte.begin() + ptrdiff_t(first + count) * C);
        const std::vector<T> mine0(dwte0.begin() + ptrdiff_t(first) * C,
                                   dwte0.begin() + ptrdiff_t(first + count) * C);
        DeviceArray<T> d_mine(mine), d_part(NC), d_dmine(mine0);
        d_part.upload(random_vector<T>(NC, seed + 4 + uint64_t(r)));  // poison: every element must be written
        pv::embedding_forward_rows(d_tokens.get(), d_mine.get(), d_part.get(), N, C, count, first, V, nullptr);
        const auto part = d_part.download();
        for (size_t i = 0; i < NC; ++i) sum[i] += pv::to_acc(part[i]);
        DeviceArray<unsigned char> scratch(pv::embedding_backward_scratch_bytes(N));
        pv::embedding_backward_rows(d_tokens.get(), d_dout.get(), d_dmine.get(), N, C, count, first, scratch.get(),
                                    nullptr);
        const auto dmine = d_dmine.download();
        REQUIRE(std::memcmp(dmine.data(), whole_dwte.data() + size_t(first) * C, dmine.size() * sizeof(T)) == 0);
    }
    size_t off = 0;
    for (size_t i = 0; i < NC; ++i) {
        const T got = pv::from_acc<T>(sum[i]);
        const bool nan = std::isnan(double(pv::to_acc(whole_out[i])));
        off += nan ? !std::isnan(double(sum[i])) : std::memcmp(&got, &whole_out[i], sizeof(T)) != 0;
    }
    INFO("N " << N << " C " << C << " V " << V << " over " << ranks << " ranks");
    REQUIRE(off == 0);
}

// Shapes (N, C, V): one of each, sizes that divide no block, a large vocabulary, widths that are
// multiples of every vector width (64, 200 in fp32/fp64, 520: the 16-byte paths, 520 in more than
// one channel slice). test-tsan looks
// for races at tiny shapes (DESIGN.md §5), where every emulated thread costs a fresh fiber.
using Shapes = std::vector<std::tuple<long long, int, int>>;
const Shapes kShapes = pv::kThreadSanitizer ? Shapes{{1, 1, 1}, {7, 67, 5}, {33, 130, 50}, {9, 64, 5}}
                                            : Shapes{{1, 1, 1},  {7, 67, 5},       {33, 130, 50}, {130, 33, 7},
                                                     {9, 64, 5}, {300, 200, 1000}, {70, 520, 9}};

}  // namespace embedding_test

using namespace embedding_test;

TEST_CASE("embedding forward and backward match the fp64 reference", "[kernels][embedding]") {
    for (auto [N, C, V] : kShapes) {
        check_against_reference<double>(N, C, V, 10);
        check_against_reference<float>(N, C, V, 20);
        check_against_reference<__nv_bfloat16>(N, C, V, 30);
    }
}

TEST_CASE("embedding backward is bit-identical across runs and chunks", "[kernels][embedding]") {
    for (int C : {67, 72}) {  // one channel per lane, and 16-byte vectors
        check_deterministic<double>(40, C);
        check_deterministic<float>(50, C);
        check_deterministic<__nv_bfloat16>(60, C);
    }
}

TEST_CASE("embedding backward equals central differences of its forward (fp64)", "[kernels][embedding][gradcheck]") {
    const long long N = 9;
    const int C = 5, V = 4;  // nine positions over four tokens: repeats, and possibly unused rows
    const auto tokens = random_tokens(size_t(N), V, 70, false);
    auto wte = random_vector<double>(size_t(V) * C, 71);
    const auto g = random_vector<double>(size_t(N) * C, 72);
    const auto dwte0 = random_vector<double>(wte.size(), 73);
    DeviceArray<int> d_tokens(tokens);
    DeviceArray<double> d_wte(wte), d_g(g), d_out(g.size()), d_dwte(dwte0);
    auto loss = [&] {
        d_wte.upload(wte);
        pv::embedding_forward(d_tokens.get(), d_wte.get(), d_out.get(), N, C, V, nullptr);
        return dot(d_out.download(), g);
    };
    const auto numeric = numerical_gradient(wte, loss);
    backward(d_tokens.get(), d_g.get(), d_dwte.get(), N, C, V);
    auto grad = d_dwte.download();
    for (size_t i = 0; i < grad.size(); ++i) grad[i] -= dwte0[i];  // the kernel accumulates
    const std::string err = compare(grad, numeric, kGradTolerance);
    INFO(err);
    REQUIRE(err.empty());
}

TEST_CASE("vocabulary-parallel embedding slices sum to the whole table's lookup and split its gradient",
          "[kernels][embedding][tensor_parallel]") {
    // (N, C, V, T): V a multiple of T, not one (the last rank fewer rows), vectors and scalars.
    // Under TSan the smallest alone (DESIGN.md §5: tiny shapes there).
    using Split = std::tuple<long long, int, int, int>;
    const std::vector<Split> splits = pv::kThreadSanitizer ? std::vector<Split>{{9, 8, 10, 3}}
                                                            : std::vector<Split>{{33, 64, 40, 4}, {70, 67, 37, 4},
                                                                                 {9, 8, 10, 3}, {130, 24, 7, 2}};
    for (auto [N, C, V, T] : splits) {
        check_vocabulary_slices<double>(N, C, V, T, 80);
        check_vocabulary_slices<float>(N, C, V, T, 90);
        check_vocabulary_slices<__nv_bfloat16>(N, C, V, T, 100);
    }
}
