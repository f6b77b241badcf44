// Causal GQA attention (kernels/attention.cuh) against the fp64 reference (bf16, fp32, fp64),
// central-difference checks of the backward in fp64, bitwise determinism, and that the backward
// writes (not accumulates into) every element of dqkv.
//
// The default suite covers every sequence length (1, 7, 33, 130), head dim (8 generic, 64, 128
// specialised) and head grouping ((1,1), (4,2), (9,3) as in SmolLM2) with a rotating choice of the
// rest; "[.full]" runs the whole cross product (make test-full, or `test_attention "[full]"`).
// Under ThreadSanitizer the suite shrinks to small shapes (kTsanBuild).
#include "kernels/attention.cuh"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/attention.h"

#include <cstring>

using namespace pv::test;

namespace attention_test {

using pv::reference::AttentionShape;

// Under ThreadSanitizer (make test-tsan) every emulated thread is a fresh fiber context and runs
// ~100 times slower. The races it looks for (a tile load against its use, a reuse before every
// thread is done, the score tile between a row's lanes) show up with two or three tiles per
// kernel, so that build runs only T = 33 with two query heads per KV head, for every type and
// head-dim instantiation, and skips the other cases (arithmetic, not races).
constexpr bool kTsanBuild = pv::kThreadSanitizer;

// The kernels' outputs for one shape: forward, then backward with the forward's out and lse.
template <class T>
struct Run {
    std::vector<T> out, dqkv;
    std::vector<pv::acc_t<T>> lse;
};

template <class T>
Run<T> run(const std::vector<T>& qkv, const std::vector<T>& dout, const AttentionShape& s) {
    using A = pv::acc_t<T>;
    const int B = int(s.B), T_len = int(s.T), H = int(s.H), Hkv = int(s.Hkv), hd = int(s.hd);
    DeviceArray<T> d_qkv(qkv), d_dout(dout), d_out(dout.size()), d_dqkv(qkv.size());
    DeviceArray<A> d_lse(s.B * s.H * s.T);
    DeviceArray<unsigned char> scratch(pv::attention_backward_scratch_bytes<T>(B, T_len, H));
    pv::attention_forward(d_qkv.get(), d_out.get(), d_lse.get(), B, T_len, H, Hkv, hd, nullptr);
    pv::attention_backward(d_qkv.get(), d_out.get(), d_dout.get(), d_lse.get(), d_dqkv.get(), scratch.get(), B, T_len,
                           H, Hkv, hd, nullptr);
    return {d_out.download(), d_dqkv.download(), d_lse.download()};
}

std::string describe(const AttentionShape& s) {
    return "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " H " + std::to_string(s.H) + " Hkv " +
           std::to_string(s.Hkv) + " hd " + std::to_string(s.hd);
}

// Inputs rounded to T, so the reference sees exactly what the kernels see. q and k in [-2, 2]
// give scores up to a few units: peaked rows that exercise the online softmax's rescaling.
template <class T>
void check_against_reference(const AttentionShape& s, uint64_t seed) {
    const auto qkv = random_vector<T>(s.B * s.T * s.width(), seed, -2.0, 2.0);
    const auto dout = random_vector<T>(s.B * s.T * s.H * s.hd, seed + 1);
    const Run<T> got = run(qkv, dout, s);
    std::vector<double> ref_out, ref_lse;
    pv::reference::attention_forward(to_double(qkv), s, ref_out, ref_lse);
    // The backward's inputs include the forward's output, rounded to T: the reference gets it too
    // (checked against the reference forward just below).
    const auto ref_dqkv = pv::reference::attention_backward(to_double(qkv), to_double(got.out), to_double(dout), s);
    const std::string e1 = compare(to_double(got.out), ref_out, tolerance<T>());
    const std::string e2 = compare(to_double(got.lse), ref_lse, tolerance<T>());
    const std::string e3 = compare(to_double(got.dqkv), ref_dqkv, tolerance<T>());
    INFO(describe(s) << "\nout: " << e1 << "\nlse: " << e2 << "\ndqkv: " << e3);
    REQUIRE(e1.empty());
    REQUIRE(e2.empty());
    REQUIRE(e3.empty());
}

void check_all_types(const AttentionShape& s, uint64_t seed) {
    check_against_reference<double>(s, seed);
    check_against_reference<float>(s, seed + 2);
    check_against_reference<__nv_bfloat16>(s, seed + 4);
}

constexpr size_t kLengths[] = {1, 7, 33, 130};
constexpr size_t kHeadDims[] = {8, 64, 128};
constexpr std::pair<size_t, size_t> kHeads[] = {{1, 1}, {4, 2}, {9, 3}};

// Exhaustive central differences of L = <g, out> with respect to every element of qkv, against
// the backward given dout = g (fp64).
void gradcheck(const AttentionShape& s, uint64_t seed) {
    const int B = int(s.B), T_len = int(s.T), H = int(s.H), Hkv = int(s.Hkv), hd = int(s.hd);
    auto qkv = random_vector<double>(s.B * s.T * s.width(), seed, -2.0, 2.0);
    const auto g = random_vector<double>(s.B * s.T * s.H * s.hd, seed + 1);
    DeviceArray<double> d_qkv(qkv), d_g(g), d_out(g.size()), d_lse(s.B * s.H * s.T), d_grad(qkv.size());
    DeviceArray<unsigned char> scratch(pv::attention_backward_scratch_bytes<double>(B, T_len, H));
    auto loss = [&] {
        d_qkv.upload(qkv);
        pv::attention_forward(d_qkv.get(), d_out.get(), d_lse.get(), B, T_len, H, Hkv, hd, nullptr);
        return dot(d_out.download(), g);
    };
    const auto numeric = numerical_gradient(qkv, loss);
    d_qkv.upload(qkv);
    pv::attention_forward(d_qkv.get(), d_out.get(), d_lse.get(), B, T_len, H, Hkv, hd, nullptr);
    pv::attention_backward(d_qkv.get(), d_out.get(), d_g.get(), d_lse.get(), d_grad.get(), scratch.get(), B, T_len, H,
                           Hkv, hd, nullptr);
    const std::string err = compare(d_grad.download(), numeric, kGradTolerance);
    INFO(describe(s) << "\n" << err);
    REQUIRE(err.empty());
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Two runs give identical bits; the backward overwrites every element of dqkv, whether it held
// NaN (poison) or finite garbage before.
template <class T>
void check_deterministic_and_overwrites(const AttentionShape& s, uint64_t seed) {
    const int B = int(s.B), T_len = int(s.T), H = int(s.H), Hkv = int(s.Hkv), hd = int(s.hd);
    const auto qkv = random_vector<T>(s.B * s.T * s.width(), seed, -2.0, 2.0);
    const auto dout = random_vector<T>(s.B * s.T * s.H * s.hd, seed + 1);
    const Run<T> first = run(qkv, dout, s), second = run(qkv, dout, s);
    REQUIRE(same_bits(first.out, second.out));
    REQUIRE(same_bits(first.lse, second.lse));
    REQUIRE(same_bits(first.dqkv, second.dqkv));
    size_t unwritten = 0;  // dqkv was poisoned with NaN
    for (T x : first.dqkv) unwritten += !std::isfinite(double(x));
    REQUIRE(unwritten == 0);

    DeviceArray<T> d_qkv(qkv), d_dout(dout), d_out(first.out), d_dqkv(random_vector<T>(qkv.size(), seed + 2, 1e3, 2e3));
    DeviceArray<pv::acc_t<T>> d_lse(first.lse);
    DeviceArray<unsigned char> scratch(pv::attention_backward_scratch_bytes<T>(B, T_len, H));
    pv::attention_backward(d_qkv.get(), d_out.get(), d_dout.get(), d_lse.get(), d_dqkv.get(), scratch.get(), B, T_len,
                           H, Hkv, hd, nullptr);
    REQUIRE(same_bits(d_dqkv.download(), first.dqkv));
}

}  // namespace attention_test

using namespace attention_test;

TEST_CASE("attention matches the fp64 reference", "[kernels][attention]") {
    // Every length and head dim; head groupings and batch sizes rotate through the combinations.
    if (kTsanBuild) {
        for (size_t hd : kHeadDims) check_all_types({1, 33, 2, 1, hd}, 200 + hd);
        return;
    }
    size_t n = 0;
    for (size_t T_len : kLengths)
        for (size_t hd : kHeadDims) {
            const auto [H, Hkv] = kHeads[n % 3];
            const size_t B = 1 + (n / 3 + n) % 2;
            check_all_types({B, T_len, H, Hkv, hd}, 100 + 10 * n);
            ++n;
        }
}

TEST_CASE("attention with generic head dims matches the fp64 reference", "[kernels][attention]") {
    // Head dims of the generic path other than 8: not a multiple of 4, and two common ones.
    if (kTsanBuild) return;
    check_all_types({2, 33, 4, 2, 3}, 300);
    check_all_types({1, 40, 2, 1, 48}, 310);
    check_all_types({1, 17, 3, 1, 96}, 320);
}

TEST_CASE("attention matches the fp64 reference: full cross product", "[kernels][attention][.full]") {
    uint64_t seed = 1000;
    for (size_t T_len : kLengths)
        for (size_t hd : kHeadDims)
            for (auto [H, Hkv] : kHeads)
                for (size_t B : {1, 2}) {
                    check_all_types({B, T_len, H, Hkv, hd}, seed);
                    seed += 10;
                }
}

TEST_CASE("attention backward equals central differences of its forward (fp64)", "[kernels][attention][gradcheck]") {
    if (kTsanBuild) return;
    gradcheck({1, 7, 4, 2, 8}, 400);   // generic path, GQA
    gradcheck({1, 5, 2, 1, 64}, 410);  // specialised hd = 64
}

TEST_CASE("attention backward equals central differences at hd 128 (fp64)", "[kernels][attention][gradcheck][.full]") {
    gradcheck({1, 20, 3, 1, 128}, 420);  // several 8-row tiles of the fp64 hd = 128 instantiation
}

TEST_CASE("attention is bitwise deterministic and overwrites every element of dqkv", "[kernels][attention]") {
    if (kTsanBuild) return;
    check_deterministic_and_overwrites<__nv_bfloat16>({2, 130, 4, 2, 64}, 500);
    check_deterministic_and_overwrites<float>({1, 70, 9, 3, 128}, 510);
    check_deterministic_and_overwrites<double>({1, 33, 4, 2, 8}, 520);
}
