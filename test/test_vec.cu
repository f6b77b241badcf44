// The 16-byte vector helpers (kernels/vec.cuh): elementwise_loop covers every element exactly
// once, in chunks of the vector width up to the tail and one element at a time in the tail, for
// every tail length and for 32- and 64-bit indices; the glue kernels built on it (add, cast,
// accumulate) equal a plain host loop bit for bit on odd sizes and on bases one element off
// 16-byte alignment (where they must take the scalar path: a vector access there would fault on a
// GPU, and the host build asserts on it).
#include "kernels/glue.cuh"
#include "kernels/vec.cuh"
#include "test/check.h"

#include <cstring>

using namespace pv::test;

namespace vec_test {

// Records, for each element, how many times it was visited and the chunk width that visited it.
struct MarkOp {
    static constexpr int kWidth = 8;
    int* hits;
    int* width;
    template <int W>
    struct In {};
    template <int W, class I>
    __device__ In<W> load(I) const {
        return {};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>&) const {
        for (int k = 0; k < W; ++k) {
            atomicAdd(&hits[i + k], 1);
            width[i + k] = W;
        }
    }
};

void check_coverage(long long n, bool vector) {
    DeviceArray<int> hits(std::vector<int>(size_t(n), 0)), width{size_t(n)};
    pv::launch_elementwise(MarkOp{hits.get(), width.get()}, n, vector, nullptr);
    const auto h = hits.download(), w = width.download();
    const long long whole = vector ? n / MarkOp::kWidth * MarkOp::kWidth : 0;
    for (long long i = 0; i < n; ++i) {
        INFO("n " << n << " vector " << vector << " element " << i);
        REQUIRE(h[size_t(i)] == 1);
        REQUIRE(w[size_t(i)] == (i < whole ? MarkOp::kWidth : 1));
    }
}

// Bitwise equality of two vectors of T.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// add, cast and accumulate on n elements starting `offset` elements into their buffers, against a
// plain loop with the same per-element arithmetic; the elements around the range stay untouched.
template <class T>
void check_glue_at(long long n, int offset, uint64_t seed) {
    using A = pv::acc_t<T>;
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;  // at least as wide as T
    const size_t total = size_t(n + offset + 3);
    const auto a = random_vector<T>(total, seed), b = random_vector<T>(total, seed + 1);
    const auto acc = random_vector<Acc>(total, seed + 2);
    DeviceArray<T> da(a), db(b), dout(total);
    DeviceArray<Acc> dacc(acc);
    DeviceArray<float> dcast(total);
    const auto poison = dout.download();
    pv::add(da.get() + offset, db.get() + offset, dout.get() + offset, n, nullptr);
    pv::cast(da.get() + offset, dcast.get() + offset, n, nullptr);
    pv::accumulate(dacc.get() + offset, da.get() + offset, n, nullptr);
    auto want_out = poison;
    auto want_cast = dcast.download();  // poison outside the range, overwritten inside below
    auto want_acc = acc;
    for (long long i = offset; i < offset + n; ++i) {
        want_out[size_t(i)] = pv::from_acc<T>(A(pv::to_acc(a[size_t(i)]) + pv::to_acc(b[size_t(i)])));
        want_cast[size_t(i)] = float(pv::to_acc(a[size_t(i)]));  // exact or one rounding
        want_acc[size_t(i)] = Acc(acc[size_t(i)] + Acc(pv::to_acc(a[size_t(i)])));
    }
    INFO("n " << n << " offset " << offset << " element size " << sizeof(T));
    CHECK(same_bits(dout.download(), want_out));
    CHECK(same_bits(dcast.download(), want_cast));
    CHECK(same_bits(dacc.download(), want_acc));
}

// Copies floats in chunks of 8 (32 bytes: two 16-byte words per access).
struct CopyOp {
    static constexpr int kWidth = 8;
    const float* in;
    float* out;
    template <int W>
    struct In {
        pv::Vec<float, W> x;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        return {pv::load_vec<W>(in + i)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& x) const {
        pv::store_vec<W>(out + i, x.x);
    }
};

}  // namespace vec_test

using namespace vec_test;

TEST_CASE("elementwise_loop visits every element once, vectors then a scalar tail", "[kernels][vec]") {
    // Every tail length 0..7 after zero, one and several whole chunks, and sizes spanning trips of
    // the unrolled grid-stride loop.
    for (long long whole : {0LL, 8LL, 64LL, 8LL * pv::kElementwiseBlock * pv::kUnroll + 8})
        for (long long tail = 0; tail < 8; ++tail)
            if (whole + tail > 0)
                for (bool vector : {true, false}) check_coverage(whole + tail, vector);
}

TEST_CASE("vec_aligned accepts 16-byte aligned bases only", "[kernels][vec]") {
    DeviceArray<__nv_bfloat16> x(64);
    CHECK(pv::vec_aligned({x.get(), x.get() + 8, nullptr}));
    for (int off = 1; off < 8; ++off) CHECK_FALSE(pv::vec_aligned({x.get(), x.get() + off}));
}

TEST_CASE("vector glue kernels equal a plain loop on odd sizes and misaligned bases", "[kernels][vec]") {
    uint64_t seed = 1;
    for (long long whole : {0LL, 16LL, 4096LL})
        for (long long tail = 0; tail < 8; ++tail)
            for (int offset : {0, 1, 8})
                if (whole + tail > 0) {
                    check_glue_at<__nv_bfloat16>(whole + tail, offset, seed++);
                    check_glue_at<float>(whole + tail, offset, seed++);
                    check_glue_at<double>(whole + tail, offset, seed++);
                }
}

TEST_CASE("load_vec and store_vec move vectors wider than 16 bytes whole", "[kernels][vec]") {
    // Vec<float, 8> is two 16-byte words.
    const auto in = random_vector<float>(16, 5);
    DeviceArray<float> din(in), dout(16);
    pv::launch_elementwise(CopyOp{din.get(), dout.get()}, 16, true, nullptr);
    CHECK(same_bits(dout.download(), in));
}

// A launcher that picked the vector path for a misaligned base: the host build must stop it (a
// GPU would fault with a misaligned-address error).
TEST_CASE("vec: a vector access off 16-byte alignment", "[.][vec-child]") {
    DeviceArray<float> x(64), y(64);
    pv::launch_elementwise(CopyOp{x.get() + 1, y.get()}, 32, true, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("the host build stops a misaligned vector access", "[kernels][vec][host-only]") {
    REQUIRE_DIES_WITH("vec: a vector access off 16-byte alignment", "check_vec_alignment");
}
