// RMSNorm kernels (plain and fused with the residual add) against the fp64 reference (bf16,
// fp32, fp64), with accumulating gradients, and central-difference checks of the backward in fp64.
#include "kernels/rmsnorm.cuh"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/rmsnorm.h"

using namespace pv::test;

namespace rmsnorm_test {

constexpr double kEps = 1e-5;

// The storage type's rounding, for the reference of the fused add.
template <class T>
double round_to(double v) {
    return double(T(v));
}

// How the backward receives the residual stream's gradient dres: as the output buffer itself
// (dx = dx + share), as a separate buffer (dx, poisoned, = dres + share), or not at all (dx = share).
enum class Dres { aliased, separate, none };

// Forward and backward of the plain norm. Inputs are rounded to T, so the reference sees exactly
// what the kernel sees; dres and dweight start from random values (dweight accumulates), or
// dweight starts poisoned and is written over (dw_write).
template <class T>
void check_plain(long long N, int C, uint64_t seed, Dres mode = Dres::aliased,
                 pv::GradWrite dw_write = pv::GradWrite::add) {
    using A = pv::acc_t<T>;
    const size_t NC = size_t(N) * C;
    const auto x = random_vector<T>(NC, seed, -2.0, 2.0);
    const auto w = random_vector<T>(size_t(C), seed + 1, 0.5, 1.5);
    const auto dout = random_vector<T>(NC, seed + 2);
    const auto dx0 = random_vector<T>(NC, seed + 3);
    const auto dw0 = random_vector<T>(size_t(C), seed + 4);
    DeviceArray<T> d_x(x), d_w(w), d_dout(dout), d_out(NC), d_dres(dx0), d_dx(NC), d_dw{size_t(C)};
    if (mode == Dres::aliased) d_dx.upload(dx0);
    if (dw_write == pv::GradWrite::add) d_dw.upload(dw0);
    const T* dres = mode == Dres::aliased ? d_dx.get() : mode == Dres::separate ? d_dres.get() : nullptr;
    DeviceArray<A> d_rstd{size_t(N)};
    DeviceArray<unsigned char> scratch(pv::rmsnorm_backward_scratch_bytes<T>(N, C));
    pv::rmsnorm_forward(d_x.get(), d_w.get(), d_out.get(), d_rstd.get(), N, C, kEps, nullptr);
    pv::rmsnorm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_dout.get(), dres, d_dx.get(), d_dw.get(), scratch.get(),
                         N, C, nullptr, dw_write);

    const auto ref = pv::reference::rmsnorm_forward(to_double(x), to_double(w), size_t(N), size_t(C), kEps);
    auto ref_dx = mode == Dres::none ? std::vector<double>(NC, 0.0) : to_double(dx0);
    auto ref_dw = dw_write == pv::GradWrite::add ? to_double(dw0) : std::vector<double>(size_t(C), 0.0);
    pv::reference::rmsnorm_backward(to_double(x), to_double(w), to_double(dout), ref_dx, ref_dw, size_t(N), size_t(C),
                                    kEps);
    const std::string e_out = compare(to_double(d_out.download()), ref.out, tolerance<T>());
    const std::string e_rstd = compare(to_double(d_rstd.download()), ref.rstd, tolerance<T>());
    const std::string e_dx = compare(to_double(d_dx.download()), ref_dx, tolerance<T>());
    const std::string e_dw = compare(to_double(d_dw.download()), ref_dw, tolerance<T>());
    INFO("N " << N << " C " << C << " dres mode " << int(mode) << " dweight written over "
              << (dw_write == pv::GradWrite::overwrite) << "\nout: " << e_out << "\nrstd: " << e_rstd
              << "\ndx: " << e_dx << "\ndweight: " << e_dw);
    REQUIRE(e_out.empty());
    REQUIRE(e_rstd.empty());
    REQUIRE(e_dx.empty());
    REQUIRE(e_dw.empty());
}

// The fused residual add + norm, into a separate sum_out and in place (sum_out = residual); with a
// sum_copy (poisoned before) it holds sum_out's bits.
template <class T>
void check_fused(long long N, int C, uint64_t seed) {
    using A = pv::acc_t<T>;
    const size_t NC = size_t(N) * C;
    const auto residual = random_vector<T>(NC, seed, -2.0, 2.0);
    const auto branch = random_vector<T>(NC, seed + 1);
    const auto w = random_vector<T>(size_t(C), seed + 2, 0.5, 1.5);
    const auto ref = pv::reference::residual_rmsnorm_forward(to_double(residual), to_double(branch), to_double(w),
                                                             size_t(N), size_t(C), kEps, round_to<T>);
    for (int variant = 0; variant < 3; ++variant) {
        const bool in_place = variant == 1, copy = variant == 2;
        DeviceArray<T> d_res(residual), d_branch(branch), d_w(w), d_sum(NC), d_out(NC), d_copy(NC);
        DeviceArray<A> d_rstd{size_t(N)};
        T* sum_out = in_place ? d_res.get() : d_sum.get();
        pv::residual_rmsnorm_forward(d_res.get(), d_branch.get(), sum_out, d_w.get(), d_out.get(), d_rstd.get(), N, C,
                                     kEps, nullptr, copy ? d_copy.get() : nullptr);
        const auto sum_bits = in_place ? d_res.download() : d_sum.download();
        if (copy) {
            const auto copied = d_copy.download();
            REQUIRE(std::memcmp(copied.data(), sum_bits.data(), NC * sizeof(T)) == 0);
        }
        const auto sum = to_double(sum_bits);
        const std::string e_sum = compare(sum, ref.sum, tolerance<T>());
        const std::string e_out = compare(to_double(d_out.download()), ref.out, tolerance<T>());
        const std::string e_rstd = compare(to_double(d_rstd.download()), ref.rstd, tolerance<T>());
        INFO("N " << N << " C " << C
                  << (in_place ? " in place"
                      : copy   ? " with a copy"
                               : "")
                  << "\nsum: " << e_sum << "\nout: " << e_out << "\nrstd: " << e_rstd);
        REQUIRE(e_sum.empty());
        REQUIRE(e_out.empty());
        REQUIRE(e_rstd.empty());
    }
}

// Shapes: single row and channel, sizes that divide neither a warp nor a block, more rows than
// the backward has blocks (rows per block > 1), and the largest hidden sizes (fp64 needs the
// shared-memory opt-in for C = 8192); widths that are multiples of every vector width (64, 1032,
// 4096, 8192: the 16-byte path, in one segment and in several) and widths that are not; more
// rows than the backward has blocks on the 16-byte path (1100 × 128: each block loads its next row
// while it finishes one) and in rows of several segments (520 × 2051: no prefetch, rows read
// twice). test-tsan looks for races at tiny shapes (DESIGN.md §5),
// where every emulated thread costs a fresh fiber: there the small shapes only (the bit-identity
// test below still has several rows per block).
using Shapes = std::vector<std::pair<long long, int>>;
const Shapes kShapes = pv::kThreadSanitizer ? Shapes{{1, 1}, {7, 67}, {33, 130}, {5, 64}}
                                            : Shapes{{1, 1},    {7, 67},   {33, 130}, {130, 33},   {515, 45},  {5, 64},
                                                     {9, 1032}, {3, 4096}, {2, 8192}, {1100, 128}, {520, 2051}};

}  // namespace rmsnorm_test

using namespace rmsnorm_test;

TEST_CASE("rmsnorm forward and backward match the fp64 reference", "[kernels][rmsnorm]") {
    for (auto [N, C] : kShapes) {
        check_plain<double>(N, C, 10);
        check_plain<float>(N, C, 20);
        check_plain<__nv_bfloat16>(N, C, 30);
    }
}

TEST_CASE("rmsnorm backward writes dres + its share, from a separate dres or none", "[kernels][rmsnorm]") {
    // One row a block; several, the next loaded ahead; several, in segments (not under TSan).
    Shapes shapes{{7, 67}, {5, 64}};
    if (!pv::kThreadSanitizer) shapes.insert(shapes.end(), {{1100, 64}, {520, 2051}});
    for (auto [N, C] : shapes)
        for (Dres mode : {Dres::separate, Dres::none}) {
            check_plain<double>(N, C, 110, mode);
            check_plain<float>(N, C, 120, mode);
            check_plain<__nv_bfloat16>(N, C, 130, mode);
        }
}

TEST_CASE("rmsnorm backward writes dweight over a poisoned buffer when told to", "[kernels][rmsnorm]") {
    for (auto [N, C] : {std::pair{7LL, 67}, std::pair{5LL, 64}}) {
        check_plain<float>(N, C, 140, Dres::aliased, pv::GradWrite::overwrite);
        check_plain<__nv_bfloat16>(N, C, 150, Dres::aliased, pv::GradWrite::overwrite);
    }
}

TEST_CASE("residual + rmsnorm forward matches the fp64 reference, also in place", "[kernels][rmsnorm]") {
    for (auto [N, C] : kShapes) {
        check_fused<double>(N, C, 40);
        check_fused<float>(N, C, 50);
        check_fused<__nv_bfloat16>(N, C, 60);
    }
}

TEST_CASE("rmsnorm backward is bit-identical when run twice", "[kernels][rmsnorm]") {
    const long long N = 515;  // more rows than the backward has blocks
    const int C = 31;
    const auto x = random_vector<float>(size_t(N) * C, 70, -2.0, 2.0);
    const auto w = random_vector<float>(size_t(C), 71, 0.5, 1.5);
    const auto dout = random_vector<float>(x.size(), 72);
    const auto dx0 = random_vector<float>(x.size(), 73);
    const auto dw0 = random_vector<float>(size_t(C), 74);
    DeviceArray<float> d_x(x), d_w(w), d_dout(dout), d_out(x.size()), d_rstd{size_t(N)};
    DeviceArray<unsigned char> scratch(pv::rmsnorm_backward_scratch_bytes<float>(N, C));
    pv::rmsnorm_forward(d_x.get(), d_w.get(), d_out.get(), d_rstd.get(), N, C, kEps, nullptr);
    std::vector<std::vector<float>> dx(2), dw(2);
    for (int run = 0; run < 2; ++run) {
        DeviceArray<float> d_dx(dx0), d_dw(dw0);
        pv::rmsnorm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_dout.get(), d_dx.get(), d_dx.get(), d_dw.get(),
                             scratch.get(), N, C, nullptr);
        dx[run] = d_dx.download();
        dw[run] = d_dw.download();
    }
    REQUIRE(std::memcmp(dx[0].data(), dx[1].data(), dx[0].size() * sizeof(float)) == 0);
    REQUIRE(std::memcmp(dw[0].data(), dw[1].data(), dw[0].size() * sizeof(float)) == 0);
}

TEST_CASE("rmsnorm backward equals central differences of its forward (fp64)", "[kernels][rmsnorm][gradcheck]") {
    for (auto [N, C] : {std::pair{5LL, 7}, std::pair{2LL, 37}}) {
        auto x = random_vector<double>(size_t(N) * C, 80, -2.0, 2.0);
        auto w = random_vector<double>(size_t(C), 81, 0.5, 1.5);
        const auto g = random_vector<double>(x.size(), 82);
        const auto dx0 = random_vector<double>(x.size(), 83);
        const auto dw0 = random_vector<double>(size_t(C), 84);
        DeviceArray<double> d_x(x), d_w(w), d_g(g), d_out(x.size()), d_rstd{size_t(N)}, d_dx(dx0), d_dw(dw0);
        DeviceArray<unsigned char> scratch(pv::rmsnorm_backward_scratch_bytes<double>(N, C));
        auto loss = [&] {
            d_x.upload(x);
            d_w.upload(w);
            pv::rmsnorm_forward(d_x.get(), d_w.get(), d_out.get(), d_rstd.get(), N, C, kEps, nullptr);
            return dot(d_out.download(), g);
        };
        const auto numeric_dx = numerical_gradient(x, loss);
        const auto numeric_dw = numerical_gradient(w, loss);
        loss();  // the forward at the unperturbed point, for rstd
        pv::rmsnorm_backward(d_x.get(), d_w.get(), d_rstd.get(), d_g.get(), d_dx.get(), d_dx.get(), d_dw.get(),
                             scratch.get(), N, C, nullptr);
        auto dx = d_dx.download(), dw = d_dw.download();
        for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];  // the kernel accumulates
        for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
        const std::string e_dx = compare(dx, numeric_dx, kGradTolerance);
        const std::string e_dw = compare(dw, numeric_dw, kGradTolerance);
        INFO("N " << N << " C " << C << "\ndx: " << e_dx << "\ndweight: " << e_dw);
        REQUIRE(e_dx.empty());
        REQUIRE(e_dw.empty());
    }
}

// L = <g_out, out> + <g_sum, sum_out>: the gradient of residual and of branch is g_sum (already
// in the residual stream's gradient) plus the norm's backward at x = sum_out.
TEST_CASE("residual + rmsnorm: gradients of residual and branch equal central differences (fp64)",
          "[kernels][rmsnorm][gradcheck]") {
    const long long N = 4;
    const int C = 9;
    auto residual = random_vector<double>(size_t(N) * C, 90, -2.0, 2.0);
    auto branch = random_vector<double>(residual.size(), 91);
    const auto w = random_vector<double>(size_t(C), 92, 0.5, 1.5);
    const auto g_out = random_vector<double>(residual.size(), 93);
    const auto g_sum = random_vector<double>(residual.size(), 94);
    const auto dw0 = random_vector<double>(size_t(C), 95);
    DeviceArray<double> d_res(residual), d_branch(branch), d_w(w), d_sum(residual.size()), d_out(residual.size()),
        d_rstd{size_t(N)}, d_g_out(g_out), d_grad(g_sum), d_dw(dw0);
    DeviceArray<unsigned char> scratch(pv::rmsnorm_backward_scratch_bytes<double>(N, C));
    auto loss = [&] {
        d_res.upload(residual);
        d_branch.upload(branch);
        pv::residual_rmsnorm_forward(d_res.get(), d_branch.get(), d_sum.get(), d_w.get(), d_out.get(), d_rstd.get(), N,
                                     C, kEps, nullptr);
        return dot(d_out.download(), g_out) + dot(d_sum.download(), g_sum);
    };
    const auto numeric_res = numerical_gradient(residual, loss);
    const auto numeric_branch = numerical_gradient(branch, loss);
    loss();
    pv::rmsnorm_backward(d_sum.get(), d_w.get(), d_rstd.get(), d_g_out.get(), d_grad.get(), d_grad.get(), d_dw.get(),
                         scratch.get(), N, C, nullptr);
    const auto grad = d_grad.download();
    const std::string e_res = compare(grad, numeric_res, kGradTolerance);
    const std::string e_branch = compare(grad, numeric_branch, kGradTolerance);
    INFO("residual: " << e_res << "\nbranch: " << e_branch);
    REQUIRE(e_res.empty());
    REQUIRE(e_branch.empty());
}
