// fp64 reference for SwiGLU (kernels/swiglu.cuh), written from the math, not from the kernel.
#pragma once

#include <cmath>
#include <vector>

namespace pv::reference {

// gate_up[rows][2·ffn] -> out[rows][ffn] = silu(gate) * up.
inline std::vector<double> swiglu_forward(const std::vector<double>& gate_up, size_t rows, size_t ffn) {
    std::vector<double> out(rows * ffn);
    for (size_t r = 0; r < rows; ++r)
        for (size_t f = 0; f < ffn; ++f) {
            const double g = gate_up[r * 2 * ffn + f], u = gate_up[r * 2 * ffn + ffn + f];
            out[r * ffn + f] = g / (1.0 + std::exp(-g)) * u;
        }
    return out;
}

// d(gate_up) from dout[rows][ffn].
inline std::vector<double> swiglu_backward(const std::vector<double>& gate_up, const std::vector<double>& dout,
                                           size_t rows, size_t ffn) {
    std::vector<double> d(rows * 2 * ffn);
    for (size_t r = 0; r < rows; ++r)
        for (size_t f = 0; f < ffn; ++f) {
            const double g = gate_up[r * 2 * ffn + f], u = gate_up[r * 2 * ffn + ffn + f];
            const double s = 1.0 / (1.0 + std::exp(-g));
            const double dh = dout[r * ffn + f];
            d[r * 2 * ffn + f] = dh * u * (s + g * s * (1.0 - s));  // d/dg of g·s(g)
            d[r * 2 * ffn + ffn + f] = dh * g * s;
        }
    return d;
}

}  // namespace pv::reference
