// fp64 reference for AdamW (optim/adamw.cuh), torch.optim.AdamW semantics, written from the
// formulas, not from the kernel: per element at step t ≥ 1,
//   g = grad·grad_scale;  p -= lr·wd·p;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;
//   p -= lr · (m/(1−β1ᵗ)) / (sqrt(v/(1−β2ᵗ)) + eps).
#pragma once

#include <cmath>
#include <vector>

namespace pv::reference {

struct AdamWHyper {
    double lr;
    double beta1, beta2, eps, weight_decay;
    long long t;  // 1-based
    double grad_scale;
};

// One step on params, m, v (same length as grads), in place.
inline void adamw_step(std::vector<double>& params, std::vector<double>& m, std::vector<double>& v,
                       const std::vector<double>& grads, const AdamWHyper& h) {
    const double bias1 = 1.0 - std::pow(h.beta1, double(h.t));
    const double bias2 = 1.0 - std::pow(h.beta2, double(h.t));
    for (size_t i = 0; i < params.size(); ++i) {
        const double g = grads[i] * h.grad_scale;
        double p = params[i];
        p -= h.lr * h.weight_decay * p;
        m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
        v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
        const double m_hat = m[i] / bias1, v_hat = v[i] / bias2;
        p -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
        params[i] = p;
    }
}

}  // namespace pv::reference
