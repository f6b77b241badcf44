// fp64 reference for the fused softmax + cross-entropy (kernels/cross_entropy.cuh), written from
// the math, not from the kernel: loss_n = log Σ_j exp(x_j) − x_t, evaluated in long double with
// the max subtracted first, and its gradient softmax − onehot.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace pv::reference {

struct CrossEntropyResult {
    std::vector<double> row_loss;  // [N], 0 for ignored rows
    double loss_sum = 0;           // Σ row_loss
    int count = 0;                 // rows whose target is not ignore_index
};

inline long double cross_entropy_logsumexp(const double* x, size_t V) {
    const long double m = *std::max_element(x, x + V);
    long double s = 0;
    for (size_t j = 0; j < V; ++j) s += std::exp((long double)x[j] - m);
    return m + std::log(s);
}

// logits[N][V], targets[N]; a target outside [0, V) that is not ignore_index gives a NaN loss.
inline CrossEntropyResult cross_entropy_forward(const std::vector<double>& logits, const std::vector<int>& targets,
                                                size_t N, size_t V, int ignore_index) {
    CrossEntropyResult r;
    r.row_loss.assign(N, 0.0);
    long double sum = 0;
    for (size_t n = 0; n < N; ++n) {
        const int t = targets[n];
        if (t == ignore_index) continue;
        ++r.count;
        if (t < 0 || size_t(t) >= V) {
            r.row_loss[n] = std::numeric_limits<double>::quiet_NaN();
        } else {
            const double* x = logits.data() + n * V;
            r.row_loss[n] = double(cross_entropy_logsumexp(x, V) - x[t]);
        }
        sum += r.row_loss[n];
    }
    r.loss_sum = double(sum);
    return r;
}

// d(scale · Σ_n loss_n) / d logits: scale·(softmax − onehot) per counted row, 0 for ignored rows.
inline std::vector<double> cross_entropy_backward(const std::vector<double>& logits, const std::vector<int>& targets,
                                                  size_t N, size_t V, int ignore_index, double scale) {
    std::vector<double> d(N * V, 0.0);
    for (size_t n = 0; n < N; ++n) {
        const int t = targets[n];
        if (t == ignore_index) continue;
        const double* x = logits.data() + n * V;
        const long double lse = cross_entropy_logsumexp(x, V);
        for (size_t j = 0; j < V; ++j) {
            const long double p = std::exp((long double)x[j] - lse);
            d[n * V + j] = double(scale * (p - (int(j) == t ? 1.0L : 0.0L)));
        }
    }
    return d;
}

}  // namespace pv::reference
