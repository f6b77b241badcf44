// Shared helpers for tests: random inputs, device buffers, the error measure of DESIGN.md §5.
//
// Tests are written once for both backends: they only touch device memory through copies,
// never by dereferencing a device pointer on the host.
#pragma once

#include "platform/platform.h"
#include "test/child_process.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <string>
#include <vector>

namespace pv::test {

// Fresh random values in [lo, hi): tests never feed kernels zeros.
template <class T>
std::vector<T> random_vector(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<T> v(n);
    for (auto& x : v) x = T(dist(rng));
    return v;
}

// A device buffer of n elements; freed on scope exit. Poisoned with 0xFF bytes (NaN for every
// floating type) at construction so a kernel that fails to write an output is caught.
template <class T>
class DeviceArray {
  public:
    explicit DeviceArray(size_t n) : n_(n) {
        CUDA_CHECK(cudaMalloc(&ptr_, bytes() ? bytes() : 1));
        poison();
    }
    explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
    ~DeviceArray() { cudaFree(ptr_); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    T* get() const { return ptr_; }
    size_t size() const { return n_; }
    size_t bytes() const { return n_ * sizeof(T); }
    void poison() { CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes())); }
    void upload(const std::vector<T>& host) {
        REQUIRE(host.size() == n_);
        CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> host(n_);
        CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
        return host;
    }

  private:
    T* ptr_ = nullptr;
    size_t n_;
};

// The head's logits [rows][vocab] of a whole model's last forward in `slot`, on the host: the model
// computes them from its saved normed rows (it never holds them whole) into a poisoned buffer.
template <class Model>
auto download_logits(const Model& m, int slot) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(m.embedding_weights())>>;
    DeviceArray<T> out(size_t(m.rows()) * size_t(m.config().vocab_size));
    m.logits(slot, out.get());
    CUDA_CHECK(cudaStreamSynchronize(m.stream()));
    return out.download();
}

// DESIGN.md §5: |x - ref| <= rtol*|ref| + atol*rms(ref), elementwise, with rtol = atol = tol.
// Returns an empty string when every element passes, else a description of the worst one.
inline std::string compare(const std::vector<double>& got, const std::vector<double>& ref, double tol) {
    if (got.size() != ref.size()) return "size mismatch";
    double sq = 0;
    for (double r : ref) sq += r * r;
    const double rms = ref.empty() ? 0.0 : std::sqrt(sq / double(ref.size()));
    size_t worst = 0, failures = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double err = std::fabs(got[i] - ref[i]);
        const double bound = tol * std::fabs(ref[i]) + tol * rms;
        const double excess = std::isnan(got[i]) ? INFINITY : err - bound;
        if (excess > 0) ++failures;
        if (excess > worst_excess) worst_excess = excess, worst = i;
    }
    if (failures == 0) return {};
    return std::to_string(failures) + " of " + std::to_string(ref.size()) + " elements out of tolerance " +
           std::to_string(tol) + "; worst at " + std::to_string(worst) + ": got " + std::to_string(got[worst]) +
           ", expected " + std::to_string(ref[worst]) + " (rms(ref) " + std::to_string(rms) + ")";
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = double(v[i]);
    return out;
}

// The tolerance of DESIGN.md §5 for a storage type.
template <class T>
constexpr double tolerance();
template <>
constexpr double tolerance<double>() {
    return 1e-12;
}
template <>
constexpr double tolerance<float>() {
    return 1e-5;
}
template <>
constexpr double tolerance<__nv_bfloat16>() {
    return 2e-2;
}

}  // namespace pv::test
