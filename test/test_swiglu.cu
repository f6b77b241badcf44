// SwiGLU kernels against the fp64 reference (bf16, fp32, fp64) and a central-difference check
// of the backward in fp64.
#include "kernels/swiglu.cuh"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/swiglu.h"

using namespace pv::test;

namespace swiglu_test {

// Inputs rounded to T, so the reference sees exactly what the kernel sees.
template <class T>
void check_against_reference(long long rows, int ffn, uint64_t seed) {
    const auto gate_up = random_vector<T>(size_t(rows) * 2 * ffn, seed, -4.0, 4.0);
    const auto dout = random_vector<T>(size_t(rows) * ffn, seed + 1);
    DeviceArray<T> d_gate_up(gate_up), d_dout(dout), d_out(size_t(rows) * ffn), d_dgate_up(gate_up.size());
    pv::swiglu_forward(d_gate_up.get(), d_out.get(), rows, ffn, nullptr);
    pv::swiglu_backward(d_gate_up.get(), d_dout.get(), d_dgate_up.get(), rows, ffn, nullptr);
    const auto ref_out = pv::reference::swiglu_forward(to_double(gate_up), size_t(rows), size_t(ffn));
    const auto ref_d = pv::reference::swiglu_backward(to_double(gate_up), to_double(dout), size_t(rows), size_t(ffn));
    const std::string e1 = compare(to_double(d_out.download()), ref_out, tolerance<T>());
    const std::string e2 = compare(to_double(d_dgate_up.download()), ref_d, tolerance<T>());
    INFO("rows " << rows << " ffn " << ffn << "\nforward: " << e1 << "\nbackward: " << e2);
    REQUIRE(e1.empty());
    REQUIRE(e2.empty());
}

}  // namespace swiglu_test

using namespace swiglu_test;

TEST_CASE("swiglu matches the fp64 reference", "[kernels][swiglu]") {
    // Widths that are multiples of every vector width (24, 64: the 16-byte path) and widths that
    // are not (1, 33, 70; 172 is one for fp32 and fp64, not for bf16).
    for (auto [rows, ffn] : {std::pair{1LL, 1}, std::pair{7LL, 33}, std::pair{33LL, 172}, std::pair{130LL, 70},
                             std::pair{5LL, 24}, std::pair{9LL, 64}}) {
        check_against_reference<double>(rows, ffn, 10);
        check_against_reference<float>(rows, ffn, 11);
        check_against_reference<__nv_bfloat16>(rows, ffn, 12);
    }
}

TEST_CASE("swiglu backward equals central differences of its forward (fp64)", "[kernels][swiglu][gradcheck]") {
    const long long rows = 5;
    const int ffn = 7;
    auto gate_up = random_vector<double>(size_t(rows) * 2 * ffn, 20, -3.0, 3.0);
    const auto g = random_vector<double>(size_t(rows) * ffn, 21);
    DeviceArray<double> d_gate_up(gate_up), d_g(g), d_out(g.size()), d_grad(gate_up.size());
    auto loss = [&] {
        d_gate_up.upload(gate_up);
        pv::swiglu_forward(d_gate_up.get(), d_out.get(), rows, ffn, nullptr);
        return dot(d_out.download(), g);
    };
    const auto numeric = numerical_gradient(gate_up, loss);
    d_gate_up.upload(gate_up);
    pv::swiglu_backward(d_gate_up.get(), d_g.get(), d_grad.get(), rows, ffn, nullptr);
    const std::string err = compare(d_grad.download(), numeric, kGradTolerance);
    INFO(err);
    REQUIRE(err.empty());
}
