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

#include <cmath>
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

}  // namespace pv::test
