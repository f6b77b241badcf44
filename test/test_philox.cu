// Philox4x32-10 against Random123's published known-answer vectors, and the initialiser built
// on it: device values equal the host function's, shards reproduce the whole tensor, and the
// values look like a standard normal.
#include "kernels/philox.cuh"
#include "test/check.h"

using namespace pv::test;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[philox]") {
    struct Kat {
        pv::Philox4 counter;
        uint32_t key0, key1;
        pv::Philox4 expected;
    };
    const Kat kats[] = {
        {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
        {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
         0xffffffffu,
         0xffffffffu,
         {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
        {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
         0xa4093822u,
         0x299f31d0u,
         {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
    };
    for (const Kat& k : kats) {
        const pv::Philox4 got = pv::philox4x32_10(k.counter, k.key0, k.key1);
        for (int i = 0; i < 4; ++i) REQUIRE(got.v[i] == k.expected.v[i]);
    }
}

TEST_CASE("init_normal: device values equal the host function, independent of sharding", "[philox]") {
    const long long n = 10007;
    const uint64_t seed = 0x5eed1234abcdull;
    const uint32_t tensor = 7;
    DeviceArray<double> whole{size_t(n)}, part_a{5000}, part_b{size_t(n - 5000)};
    pv::init_normal(whole.get(), n, 0.02, seed, tensor, 0, nullptr);
    pv::init_normal(part_a.get(), 5000, 0.02, seed, tensor, 0, nullptr);
    pv::init_normal(part_b.get(), n - 5000, 0.02, seed, tensor, 5000, nullptr);
    const auto w = whole.download(), a = part_a.download(), b = part_b.download();
    std::vector<double> host(static_cast<size_t>(n));
    for (long long i = 0; i < n; ++i)
        host[size_t(i)] = 0.02 * pv::philox_normal(seed, pv::RandomPurpose::init, tensor, uint64_t(i));
    const std::string err = compare(w, host, 1e-12);  // device log/cos may differ from the host's by an ulp
    INFO(err);
    REQUIRE(err.empty());
    for (long long i = 0; i < n; ++i) REQUIRE(w[size_t(i)] == (i < 5000 ? a[size_t(i)] : b[size_t(i - 5000)]));
    // Another tensor id or seed gives other values.
    DeviceArray<double> other{size_t(n)};
    pv::init_normal(other.get(), n, 0.02, seed, tensor + 1, 0, nullptr);
    const auto o = other.download();
    int equal = 0;
    for (long long i = 0; i < n; ++i) equal += o[size_t(i)] == w[size_t(i)];
    REQUIRE(equal == 0);
}

// A tensor-parallel slice's block — rows [2, 5) and columns [3, 7) of a 7 × 10 tensor — gets the
// whole tensor's values there, from the block's start or from inside it (a shard of the slice).
TEST_CASE("init_normal and init_uniform of a block of rows and columns equal the whole tensor there", "[philox]") {
    const uint64_t seed = 99;
    const uint32_t tensor = 4;
    DeviceArray<double> whole{70}, block{12}, tail{7}, uniform_whole{70}, uniform_block{12};
    pv::init_normal(whole.get(), 70, 0.02, seed, tensor, 0, nullptr);
    pv::init_normal(block.get(), 12, 0.02, seed, tensor, pv::WholeIndex{0, 4, 10, 3, 2}, nullptr);
    pv::init_normal(tail.get(), 7, 0.02, seed, tensor, pv::WholeIndex{5, 4, 10, 3, 2}, nullptr);  // from (1, 1)
    pv::init_uniform(uniform_whole.get(), 70, 0.5, seed, tensor, pv::WholeIndex{}, nullptr);
    pv::init_uniform(uniform_block.get(), 12, 0.5, seed, tensor, pv::WholeIndex{0, 4, 10, 3, 2}, nullptr);
    const auto w = whole.download(), b = block.download(), t = tail.download();
    const auto uw = uniform_whole.download(), ub = uniform_block.download();
    for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 4; ++c) {
            INFO("block row " << r << ", column " << c);
            CHECK(b[size_t(r * 4 + c)] == w[size_t((2 + r) * 10 + 3 + c)]);
            CHECK(ub[size_t(r * 4 + c)] == uw[size_t((2 + r) * 10 + 3 + c)]);
            if (r * 4 + c >= 5) CHECK(t[size_t(r * 4 + c - 5)] == b[size_t(r * 4 + c)]);
        }
}

TEST_CASE("init_normal looks like N(0, std^2) in every storage type", "[philox]") {
    const long long n = 200000;
    DeviceArray<float> f{size_t(n)};
    DeviceArray<__nv_bfloat16> b{size_t(n)};
    pv::init_normal(f.get(), n, 0.02, 42, 3, 0, nullptr);
    pv::init_normal(b.get(), n, 0.02, 42, 3, 0, nullptr);
    for (const auto& v : {to_double(f.download()), to_double(b.download())}) {
        double mean = 0, sq = 0, within_one = 0;
        for (double x : v) mean += x, sq += x * x, within_one += std::fabs(x) < 0.02;
        mean /= double(n);
        const double std_dev = std::sqrt(sq / double(n) - mean * mean);
        REQUIRE(std::fabs(mean) < 0.02 * 0.01);
        REQUIRE(std::fabs(std_dev / 0.02 - 1.0) < 0.01);
        REQUIRE(std::fabs(within_one / double(n) - 0.6827) < 0.005);  // one-sigma mass of a normal
    }
}
