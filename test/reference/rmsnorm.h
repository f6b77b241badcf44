// fp64 reference for RMSNorm and its fused residual form (kernels/rmsnorm.cuh), written from the
// math, not from the kernel.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

namespace pv::reference {

struct RmsnormForward {
    std::vector<double> out;   // [N][C]
    std::vector<double> rstd;  // [N]
};

// out = x · rstd · w per row, rstd = 1 / sqrt(mean(x²) + eps).
inline RmsnormForward rmsnorm_forward(const std::vector<double>& x, const std::vector<double>& w, size_t N, size_t C,
                                      double eps) {
    RmsnormForward f{std::vector<double>(N * C), std::vector<double>(N)};
    for (size_t n = 0; n < N; ++n) {
        double sq = 0;
        for (size_t c = 0; c < C; ++c) sq += x[n * C + c] * x[n * C + c];
        const double r = 1.0 / std::sqrt(sq / double(C) + eps);
        f.rstd[n] = r;
        for (size_t c = 0; c < C; ++c) f.out[n * C + c] = x[n * C + c] * r * w[c];
    }
    return f;
}

struct ResidualRmsnormForward {
    std::vector<double> sum;  // residual + branch, after `round`
    std::vector<double> out;
    std::vector<double> rstd;
};

// sum = round(residual + branch) elementwise, then the norm of sum. `round` stands for the
// storage type's rounding (identity in fp64).
inline ResidualRmsnormForward residual_rmsnorm_forward(
    const std::vector<double>& residual, const std::vector<double>& branch, const std::vector<double>& w, size_t N,
    size_t C, double eps, const std::function<double(double)>& round = [](double v) { return v; }) {
    std::vector<double> sum(N * C);
    for (size_t i = 0; i < N * C; ++i) sum[i] = round(residual[i] + branch[i]);
    auto f = rmsnorm_forward(sum, w, N, C, eps);
    return {std::move(sum), std::move(f.out), std::move(f.rstd)};
}

// Accumulates the gradients of x (dx += ...) and of w (dw += ...) for the incoming dout. rstd is
// recomputed from x; the derivative is taken of the whole expression, rstd's dependence on x
// included:  d(x_c r)/dx_j = δ_cj r − x_c x_j r³ / C.
inline void rmsnorm_backward(const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& dout, std::vector<double>& dx, std::vector<double>& dw,
                             size_t N, size_t C, double eps) {
    for (size_t n = 0; n < N; ++n) {
        const double* xr = &x[n * C];
        const double* dy = &dout[n * C];
        double sq = 0;
        for (size_t c = 0; c < C; ++c) sq += xr[c] * xr[c];
        const double r = 1.0 / std::sqrt(sq / double(C) + eps);
        double gx = 0;  // Σ_c w_c dy_c x_c
        for (size_t c = 0; c < C; ++c) gx += w[c] * dy[c] * xr[c];
        for (size_t j = 0; j < C; ++j) {
            dx[n * C + j] += w[j] * dy[j] * r - xr[j] * r * r * r / double(C) * gx;
            dw[j] += dy[j] * xr[j] * r;
        }
    }
}

}  // namespace pv::reference
