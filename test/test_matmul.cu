// The linear-layer GEMMs against the fp64 reference (bf16, fp32, fp64): the forward, the backward
// with overwriting and accumulating dx and accumulating dW, null outputs skipped, and a
// central-difference check of the backward in fp64. Every launch runs on a stream of its own, so
// the deferred-stream schedule checks that the launchers really put the GEMMs on it.
#include "kernels/matmul.cuh"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/matmul.h"

using namespace pv::test;

namespace matmul_test {

class Handle {
  public:
    Handle() { CUBLAS_CHECK(cublasCreate(&handle_)); }
    ~Handle() { cublasDestroy(handle_); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    operator cublasHandle_t() const { return handle_; }

  private:
    cublasHandle_t handle_ = nullptr;
};

// A blocking stream: the synchronous copies of DeviceArray (legacy default stream) wait for it.
class Stream {
  public:
    Stream() { CUDA_CHECK(cudaStreamCreate(&stream_)); }
    ~Stream() { cudaStreamDestroy(stream_); }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    operator cudaStream_t() const { return stream_; }

  private:
    cudaStream_t stream_ = nullptr;
};

struct Shape {
    long long N;
    int in, out;
};

// Row counts 1, 7, 33, 130 with widths that are multiples of nothing, and one square-ish pair.
std::vector<Shape> shapes() {
    std::vector<Shape> s;
    for (long long N : {1LL, 7LL, 33LL, 130LL})
        for (auto [in, out] : {std::pair{64, 192}, std::pair{67, 13}}) s.push_back({N, in, out});
    return s;
}

std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> c(a.size());
    for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
    return c;
}

// Inputs rounded to T, so the reference sees exactly what cuBLAS sees. y starts poisoned (written
// over: beta = 0 must not read it) or random (accumulate: the block's residual add, model/llama.cu).
template <class T>
void check_forward(const Shape& s, bool accumulate, uint64_t seed) {
    const auto x = random_vector<T>(size_t(s.N) * s.in, seed);
    const auto w = random_vector<T>(size_t(s.out) * s.in, seed + 1);
    const auto y0 = random_vector<T>(size_t(s.N) * s.out, seed + 2, -2.0, 2.0);
    DeviceArray<T> d_x(x), d_w(w), d_y(size_t(s.N) * s.out);
    if (accumulate) d_y.upload(y0);
    Handle handle;
    Stream stream;
    pv::matmul_forward(handle, d_x.get(), d_w.get(), d_y.get(), s.N, s.in, s.out, stream, accumulate);
    auto ref = pv::reference::matmul_forward(to_double(x), to_double(w), size_t(s.N), size_t(s.in), size_t(s.out));
    if (accumulate) ref = plus(ref, to_double(y0));
    const std::string err = compare(to_double(d_y.download()), ref, tolerance<T>());
    INFO("N " << s.N << " in " << s.in << " out " << s.out << " accumulate " << accumulate << ": " << err);
    REQUIRE(err.empty());
}

// dx and dW each start poisoned (overwrite: beta = 0 must not read them) or random (accumulate);
// the two modes are independent in the code, and taken together here to keep the case count.
template <class T>
void check_backward(const Shape& s, bool accumulate_dx, uint64_t seed) {
    const pv::GradWrite dw_write = accumulate_dx ? pv::GradWrite::add : pv::GradWrite::overwrite;
    const auto x = random_vector<T>(size_t(s.N) * s.in, seed);
    const auto w = random_vector<T>(size_t(s.out) * s.in, seed + 1);
    const auto dy = random_vector<T>(size_t(s.N) * s.out, seed + 2);
    const auto dw0 = random_vector<T>(w.size(), seed + 3);
    const auto dx0 = random_vector<T>(x.size(), seed + 4);
    DeviceArray<T> d_x(x), d_w(w), d_dy(dy), d_dw(w.size()), d_dx(x.size());
    if (accumulate_dx) d_dx.upload(dx0), d_dw.upload(dw0);
    Handle handle;
    Stream stream;
    pv::matmul_backward(handle, d_dy.get(), d_x.get(), d_w.get(), d_dx.get(), d_dw.get(), s.N, s.in, s.out,
                        accumulate_dx, stream, dw_write);

    const auto N = size_t(s.N), in = size_t(s.in), out = size_t(s.out);
    auto ref_dx = pv::reference::matmul_backward_dx(to_double(dy), to_double(w), N, in, out);
    if (accumulate_dx) ref_dx = plus(ref_dx, to_double(dx0));
    auto ref_dw = pv::reference::matmul_backward_dw(to_double(dy), to_double(x), N, in, out);
    if (accumulate_dx) ref_dw = plus(ref_dw, to_double(dw0));
    const std::string e1 = compare(to_double(d_dx.download()), ref_dx, tolerance<T>());
    const std::string e2 = compare(to_double(d_dw.download()), ref_dw, tolerance<T>());
    INFO("N " << s.N << " in " << s.in << " out " << s.out << " accumulate_dx " << accumulate_dx << "\ndx: " << e1
              << "\ndW: " << e2);
    REQUIRE(e1.empty());
    REQUIRE(e2.empty());
}

// A null dx computes only dW, a null dW only dx, both null nothing.
template <class T>
void check_skipping(uint64_t seed) {
    const Shape s{33, 67, 13};
    const auto N = size_t(s.N), in = size_t(s.in), out = size_t(s.out);
    const auto x = random_vector<T>(N * in, seed);
    const auto w = random_vector<T>(out * in, seed + 1);
    const auto dy = random_vector<T>(N * out, seed + 2);
    const auto dw0 = random_vector<T>(w.size(), seed + 3);
    DeviceArray<T> d_x(x), d_w(w), d_dy(dy), d_dw(dw0), d_dx(x.size());
    Handle handle;
    Stream stream;

    pv::matmul_backward<T>(handle, d_dy.get(), d_x.get(), d_w.get(), nullptr, d_dw.get(), s.N, s.in, s.out, false,
                           stream);
    const auto ref_dw =
        plus(pv::reference::matmul_backward_dw(to_double(dy), to_double(x), N, in, out), to_double(dw0));
    const std::string e1 = compare(to_double(d_dw.download()), ref_dw, tolerance<T>());
    INFO("dx = nullptr, dW: " << e1);
    REQUIRE(e1.empty());

    d_dw.upload(dw0);
    pv::matmul_backward<T>(handle, d_dy.get(), d_x.get(), d_w.get(), d_dx.get(), nullptr, s.N, s.in, s.out, false,
                           stream);
    const auto ref_dx = pv::reference::matmul_backward_dx(to_double(dy), to_double(w), N, in, out);
    const std::string e2 = compare(to_double(d_dx.download()), ref_dx, tolerance<T>());
    INFO("dW = nullptr, dx: " << e2);
    REQUIRE(e2.empty());
    // dW was not touched: bitwise what was uploaded.
    REQUIRE(to_double(d_dw.download()) == to_double(dw0));

    pv::matmul_backward<T>(handle, d_dy.get(), d_x.get(), d_w.get(), nullptr, nullptr, s.N, s.in, s.out, true, stream);
    REQUIRE(to_double(d_dw.download()) == to_double(dw0));
}

}  // namespace matmul_test

using namespace matmul_test;

TEST_CASE("matmul forward matches the fp64 reference, written over or added onto y", "[kernels][matmul]") {
    for (const Shape& s : shapes())
        for (bool accumulate : {false, true}) {
            check_forward<double>(s, accumulate, 10);
            check_forward<float>(s, accumulate, 11);
            check_forward<__nv_bfloat16>(s, accumulate, 12);
        }
}

TEST_CASE("matmul backward: dx overwrites or accumulates, dW accumulates", "[kernels][matmul]") {
    for (const Shape& s : shapes())
        for (bool accumulate_dx : {false, true}) {
            check_backward<double>(s, accumulate_dx, 20);
            check_backward<float>(s, accumulate_dx, 21);
            check_backward<__nv_bfloat16>(s, accumulate_dx, 22);
        }
}

TEST_CASE("matmul backward skips a null dx or dW", "[kernels][matmul]") {
    check_skipping<double>(30);
    check_skipping<float>(31);
    check_skipping<__nv_bfloat16>(32);
}

TEST_CASE("matmul backward equals central differences of its forward (fp64)", "[kernels][matmul][gradcheck]") {
    const long long N = 7;
    const int in = 5, out = 3;
    auto x = random_vector<double>(size_t(N) * in, 40);
    auto w = random_vector<double>(size_t(out) * in, 41);
    const auto g = random_vector<double>(size_t(N) * out, 42);
    const auto dw0 = random_vector<double>(w.size(), 43);
    DeviceArray<double> d_x(x), d_w(w), d_g(g), d_y(g.size()), d_dx(x.size()), d_dw(dw0);
    Handle handle;
    Stream stream;
    auto loss = [&] {
        d_x.upload(x);
        d_w.upload(w);
        pv::matmul_forward(handle, d_x.get(), d_w.get(), d_y.get(), N, in, out, stream);
        return dot(d_y.download(), g);
    };
    const auto numeric_x = numerical_gradient(x, loss);
    const auto numeric_w = numerical_gradient(w, loss);
    d_x.upload(x);
    d_w.upload(w);
    pv::matmul_backward(handle, d_g.get(), d_x.get(), d_w.get(), d_dx.get(), d_dw.get(), N, in, out, false, stream);
    auto dw = d_dw.download();
    for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];  // the contribution dW gained
    const std::string ex = compare(d_dx.download(), numeric_x, kGradTolerance);
    const std::string ew = compare(dw, numeric_w, kGradTolerance);
    INFO("dx: " << ex << "\ndW: " << ew);
    REQUIRE(ex.empty());
    REQUIRE(ew.empty());
}

// Run in a child by the next test: a row count cuBLAS cannot take must abort, not wrap.
TEST_CASE("matmul: rows past INT_MAX", "[.][matmul-child]") {
    Handle handle;
    pv::matmul_forward<float>(handle, nullptr, nullptr, nullptr, 1LL << 31, 8, 8, nullptr);
}

TEST_CASE("matmul refuses a row count outside cuBLAS's int range", "[kernels][matmul]") {
    REQUIRE_DIES_WITH("matmul: rows past INT_MAX", "row count N outside cuBLAS's int range");
}
