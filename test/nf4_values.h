// Weights for NF4 tests: random values of awkward sizes, each 64-element block at its own scale
// (2^-6 .. 2^6, so the absmaxes, and the nested scales over them, differ block to block), and
// block 2 all zero when there is one (an absmax of 0). Shared by test_nf4 (the kernels against
// the reference) and test_bnb_checkpoint (tensor parallelism's slices).
#pragma once

#include "kernels/nf4.cuh"
#include "test/check.h"

#include <cmath>
#include <vector>

namespace pv::test {

template <class T>
std::vector<T> nf4_awkward_values(long long n, uint64_t seed) {
    const std::vector<double> x = random_vector<double>(size_t(n), seed, -1.0, 1.0);
    const std::vector<double> scales = random_vector<double>(size_t(pv::nf4_blocks(n)), seed + 1, -6.0, 6.0);
    std::vector<T> v(static_cast<size_t>(n));
    for (long long i = 0; i < n; ++i) {
        const bool zero_block = n > 200 && i >= 128 && i < 192;
        v[size_t(i)] = T(zero_block ? 0.0 : x[size_t(i)] * std::exp2(std::round(scales[size_t(i / 64)])));
    }
    return v;
}

}  // namespace pv::test
