// fp64 reference for the token embedding (kernels/embedding.cuh), written from the math, not from
// the kernel.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

namespace pv::reference {

// out[N][C] = wte[tokens[n]]; a token outside [0, V) gives a row of NaN.
inline std::vector<double> embedding_forward(const std::vector<int>& tokens, const std::vector<double>& wte, size_t N,
                                             size_t C, size_t V) {
    std::vector<double> out(N * C, std::numeric_limits<double>::quiet_NaN());
    for (size_t n = 0; n < N; ++n) {
        const int t = tokens[n];
        if (t < 0 || size_t(t) >= V) continue;
        for (size_t c = 0; c < C; ++c) out[n * C + c] = wte[size_t(t) * C + c];
    }
    return out;
}

// dwte[V][C] += Σ_{n : tokens[n] = v} dout[n]; tokens outside [0, V) are skipped. Accumulates.
inline void embedding_backward(const std::vector<int>& tokens, const std::vector<double>& dout,
                               std::vector<double>& dwte, size_t N, size_t C, size_t V) {
    for (size_t n = 0; n < N; ++n) {
        const int t = tokens[n];
        if (t < 0 || size_t(t) >= V) continue;
        for (size_t c = 0; c < C; ++c) dwte[size_t(t) * C + c] += dout[n * C + c];
    }
}

}  // namespace pv::reference
