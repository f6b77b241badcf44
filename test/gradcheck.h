// Gradient checks by central differences (DESIGN.md §5), for the fp64 instantiations.
//
// For an op y = f(x1, x2, ...) and a random cotangent g, the scalar L = <g, y> has
// dL/dxi = the op's backward applied to g. numerical_gradient perturbs one input element at a
// time, L(x + h e_i) - L(x - h e_i) over 2h, and the test compares that with the kernel's
// backward using compare(..., kGradTolerance). h is relative to the element's size: fp64 central
// differences then carry ~1e-10 truncation and rounding error, far below the 1e-6 tolerance.
#pragma once

#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

namespace pv::test {

inline constexpr double kGradTolerance = 1e-6;

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
        const double h = 1e-6 * std::max(1.0, std::fabs(saved));
        x[i] = saved + h;
        const double up = loss();
        x[i] = saved - h;
        const double down = loss();
        x[i] = saved;
        grad[i] = (up - down) / (2 * h);
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
