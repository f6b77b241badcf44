// fp64 reference for the linear-layer GEMMs (kernels/matmul.cuh), written from the math as plain
// row-major loops, not from the cuBLAS mapping.
#pragma once

#include <vector>

namespace pv::reference {

// y[N][out] = x[N][in] · W[out][in]ᵀ.
inline std::vector<double> matmul_forward(const std::vector<double>& x, const std::vector<double>& w, size_t N,
                                          size_t in, size_t out) {
    std::vector<double> y(N * out);
    for (size_t n = 0; n < N; ++n)
        for (size_t o = 0; o < out; ++o) {
            double s = 0;
            for (size_t i = 0; i < in; ++i) s += x[n * in + i] * w[o * in + i];
            y[n * out + o] = s;
        }
    return y;
}

// dx[N][in] = dy[N][out] · W[out][in].
inline std::vector<double> matmul_backward_dx(const std::vector<double>& dy, const std::vector<double>& w, size_t N,
                                              size_t in, size_t out) {
    std::vector<double> dx(N * in);
    for (size_t n = 0; n < N; ++n)
        for (size_t i = 0; i < in; ++i) {
            double s = 0;
            for (size_t o = 0; o < out; ++o) s += dy[n * out + o] * w[o * in + i];
            dx[n * in + i] = s;
        }
    return dx;
}

// dW[out][in] = dy[N][out]ᵀ · x[N][in] (the contribution only; the kernel adds it to dW).
inline std::vector<double> matmul_backward_dw(const std::vector<double>& dy, const std::vector<double>& x, size_t N,
                                              size_t in, size_t out) {
    std::vector<double> dw(out * in);
    for (size_t o = 0; o < out; ++o)
        for (size_t i = 0; i < in; ++i) {
            double s = 0;
            for (size_t n = 0; n < N; ++n) s += dy[n * out + o] * x[n * in + i];
            dw[o * in + i] = s;
        }
    return dw;
}

}  // namespace pv::reference
