// Gradient checks by central differences (DESIGN.md §5), for the fp64 instantiations.
//
// For an op y = f(x1, x2, ...) and a random cotangent g, the scalar L = <g, y> has
// dL/dxi = the op's backward applied to g. numerical_gradient perturbs one input element at a
// time and the test compares the result with the kernel's backward using
// compare(..., kGradTolerance). The derivative uses the fourth-order central stencil
//   f'(x) ≈ [8(f(x+h) − f(x−h)) − (f(x+2h) − f(x−2h))] / 12h
// with h = 1e-4 relative to the element's size: truncation error O(h⁴) ≈ 1e-16 and rounding error
// ≈ ε·|f|/h ≈ 1e-12, so even gradients a thousand times smaller than their tensor's rms are
// measured well inside the 1e-6 tolerance (the two-point stencil's ~1e-10 was not).
#pragma once

#include "test/check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <functional>
#include <numeric>
#include <vector>

namespace pv::test {

inline constexpr double kGradTolerance = 1e-6;

// d/dt f(t) at t = 0 by the fourth-order central stencil with step h.
inline double central_derivative(const std::function<double(double)>& f, double h) {
    return (8.0 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12.0 * h);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// Central-difference gradient of `loss()` with respect to `x` at the elements `indices` (all of
// them when empty). `loss` must read the current contents of `x` (e.g. upload it and run the
// forward); `x` is restored before returning. Entries not in `indices` are left 0.
inline std::vector<double> numerical_gradient(std::vector<double>& x, const std::function<double()>& loss,
                                              std::vector<size_t> indices = {}) {
    if (indices.empty()) {
        indices.resize(x.size());
        std::iota(indices.begin(), indices.end(), size_t(0));
    }
    std::vector<double> grad(x.size(), 0.0);
    for (size_t i : indices) {
        const double saved = x[i];
        grad[i] = central_derivative(
            [&](double t) {
                x[i] = saved + t;
                return loss();
            },
            1e-4 * std::max(1.0, std::fabs(saved)));
        x[i] = saved;
    }
    return grad;
}

// The elements of `got` at `indices`, for comparing sampled coordinates.
inline std::vector<double> gather(const std::vector<double>& v, const std::vector<size_t>& indices) {
    std::vector<double> out;
    out.reserve(indices.size());
    for (size_t i : indices) out.push_back(v[i]);
    return out;
}

// One tensor of a model's flat parameter copy `flat` (elements [offset, offset + numel)), whose
// analytic gradient is `g`, against `loss()` (which must read `flat`): `samples` coordinates drawn
// from `rng` by central differences, then d/dε loss(θ + ε·v) along one random direction v against
// <g, v>. `flat` is restored before returning.
inline void check_tensor_gradient(std::vector<double>& flat, long long offset, long long numel,
                                  const std::vector<double>& g, const std::function<double()>& loss, int samples,
                                  std::mt19937_64& rng) {
    std::vector<size_t> picks;
    for (int k = 0; k < samples && k < numel; ++k) picks.push_back(size_t(offset) + rng() % uint64_t(numel));
    const auto numeric = numerical_gradient(flat, loss, picks);
    std::vector<double> got, want;
    for (size_t i : picks) got.push_back(g[i - size_t(offset)]), want.push_back(numeric[i]);
    const std::string err = compare(got, want, kGradTolerance);
    INFO(err);
    CHECK(err.empty());
    std::vector<double> v(static_cast<size_t>(numel));
    for (auto& x : v) x = double(int64_t(rng() % 2001) - 1000) / 1000.0;
    const std::vector<double> base(flat.begin() + offset, flat.begin() + offset + numel);
    const double directional = central_derivative(
        [&](double e) {
            for (size_t i = 0; i < v.size(); ++i) flat[size_t(offset) + i] = base[i] + e * v[i];
            return loss();
        },
        1e-4);
    for (size_t i = 0; i < v.size(); ++i) flat[size_t(offset) + i] = base[i];
    const double analytic = dot(g, v);
    INFO("directional " << directional << " analytic " << analytic);
    CHECK(std::fabs(directional - analytic) <= kGradTolerance * std::max(1e-3, std::fabs(analytic)));
}

}  // namespace pv::test
