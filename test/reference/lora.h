// fp64 reference for one LoRA adapter on one Hugging Face module (PEFT's layout: A [r][in],
// B [rows][r]), written from the math as plain loops, independent of polevault's fused stacking
// (kernels/lora.cuh). The module's output is columns [begin, begin + rows) of a [N][out] tensor.
//   forward:  y[:, begin + o] += s · Σ_j (Σ_i d[n][i]·A[j][i]) · B[o][j]      (d = x·mask)
//   backward: dB += s·dyᵀ·u, du = s·dy·B, dA += duᵀ·d, dx += (du·A)·mask
// `mask` (empty: none) is the dropout's keep/(1 − p) factor per element of x.
#pragma once

#include <vector>

namespace pv::reference {

struct LoraModule {
    size_t N, in, out, begin, rows, rank;
    double scale;
};

inline std::vector<double> lora_input(const std::vector<double>& x, const std::vector<double>& mask) {
    if (mask.empty()) return x;
    std::vector<double> d(x.size());
    for (size_t i = 0; i < x.size(); ++i) d[i] = x[i] * mask[i];
    return d;
}

inline void lora_forward(const LoraModule& m, const std::vector<double>& x, const std::vector<double>& A,
                         const std::vector<double>& B, std::vector<double>& y, const std::vector<double>& mask = {}) {
    const std::vector<double> d = lora_input(x, mask);
    for (size_t n = 0; n < m.N; ++n) {
        std::vector<double> u(m.rank, 0.0);
        for (size_t j = 0; j < m.rank; ++j)
            for (size_t i = 0; i < m.in; ++i) u[j] += d[n * m.in + i] * A[j * m.in + i];
        for (size_t o = 0; o < m.rows; ++o) {
            double s = 0;
            for (size_t j = 0; j < m.rank; ++j) s += u[j] * B[o * m.rank + j];
            y[n * m.out + m.begin + o] += m.scale * s;
        }
    }
}

inline void lora_backward(const LoraModule& m, const std::vector<double>& dy, const std::vector<double>& x,
                          const std::vector<double>& A, const std::vector<double>& B, std::vector<double>& dx,
                          std::vector<double>& dA, std::vector<double>& dB, const std::vector<double>& mask = {}) {
    const std::vector<double> d = lora_input(x, mask);
    for (size_t n = 0; n < m.N; ++n) {
        std::vector<double> u(m.rank, 0.0), du(m.rank, 0.0);
        for (size_t j = 0; j < m.rank; ++j)
            for (size_t i = 0; i < m.in; ++i) u[j] += d[n * m.in + i] * A[j * m.in + i];
        for (size_t o = 0; o < m.rows; ++o) {
            const double g = dy[n * m.out + m.begin + o];
            for (size_t j = 0; j < m.rank; ++j) {
                dB[o * m.rank + j] += m.scale * g * u[j];
                du[j] += m.scale * g * B[o * m.rank + j];
            }
        }
        for (size_t j = 0; j < m.rank; ++j)
            for (size_t i = 0; i < m.in; ++i) dA[j * m.in + i] += du[j] * d[n * m.in + i];
        for (size_t i = 0; i < m.in; ++i) {
            double s = 0;
            for (size_t j = 0; j < m.rank; ++j) s += du[j] * A[j * m.in + i];
            dx[n * m.in + i] += mask.empty() ? s : s * mask[n * m.in + i];
        }
    }
}

}  // namespace pv::reference
