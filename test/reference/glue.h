// fp64 references for the glue kernels (kernels/glue.cuh), written from the math, not from the
// kernels. Rounding to a narrower type is done here from its definition (round to nearest, ties
// to even, on a significand of `bits` bits), not with the CUDA conversion functions.
#pragma once

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <vector>

namespace pv::reference {

// x rounded to nearest even with a `bits`-bit significand (24 for fp32, 8 for bf16) and the
// fp32/bf16 exponent range's smallest normal exponent (-126); no overflow handling (test values
// are small).
inline double round_to_significand(double x, int bits) {
    if (x == 0 || !std::isfinite(x)) return x;
    const int e = std::max(std::ilogb(x), -126);         // x = m·2^e with 1 <= |m| < 2
    const double ulp = std::ldexp(1.0, e - (bits - 1));  // spacing of the representable values
    const double q = x / ulp;                            // exact: a power-of-two scaling
    std::fesetround(FE_TONEAREST);
    return std::nearbyint(q) * ulp;  // nearbyint: ties to even
}

// The value a cast into a type with a `bits`-bit significand produces (53: fp64, unchanged).
inline std::vector<double> cast(const std::vector<double>& in, int bits) {
    std::vector<double> out(in.size());
    for (size_t i = 0; i < in.size(); ++i) out[i] = bits >= 53 ? in[i] : round_to_significand(in[i], bits);
    return out;
}

inline std::vector<double> scale(const std::vector<double>& x, double factor) {
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * factor;
    return out;
}

inline std::vector<double> add(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
    return out;
}

inline int count_targets(const std::vector<int>& targets, int ignore_index) {
    int count = 0;
    for (int t : targets) count += t != ignore_index;
    return count;
}

inline double sum_of_squares(const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v * v;
    return s;
}

}  // namespace pv::reference
