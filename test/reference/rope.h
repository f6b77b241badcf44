// fp64 reference for RoPE (kernels/rope.cuh), written from the math, not from the kernel:
// Hugging Face's rotate_half, out = x·cos θ + rotate_half(x)·sin θ, with rotate_half(x) =
// [−x2, x1] for the halves x1, x2 of a head and θ = pos·inv_freq repeated over both halves.
#pragma once

#include <cmath>
#include <vector>

namespace pv::reference {

// x holds `rows` rows of `row_stride` values; returns a copy with the first n_heads·head_dim
// values of each row rotated by +θ (sign +1, the forward) or −θ (sign −1, the backward). Row r
// is at position positions[r] when positions is given, else r % seq_len.
inline std::vector<double> rope_rotate(const std::vector<double>& x, const std::vector<double>& inv_freq, size_t rows,
                                       size_t seq_len, size_t n_heads, size_t head_dim, size_t row_stride, int sign,
                                       const std::vector<int>* positions = nullptr) {
    std::vector<double> out = x;
    const size_t half = head_dim / 2;
    for (size_t r = 0; r < rows; ++r) {
        const long double pos = (long double)(positions ? size_t((*positions)[r]) : r % seq_len);
        for (size_t h = 0; h < n_heads; ++h) {
            const double* in = x.data() + r * row_stride + h * head_dim;
            double* o = out.data() + r * row_stride + h * head_dim;
            for (size_t d = 0; d < head_dim; ++d) {
                const size_t k = d % half;  // the frequency of both halves
                const long double angle = sign * pos * (long double)inv_freq[k];
                const long double rotated = d < half ? -(long double)in[d + half] : (long double)in[d - half];
                o[d] = double((long double)in[d] * std::cos(angle) + rotated * std::sin(angle));
            }
        }
    }
    return out;
}

inline std::vector<double> rope_forward(const std::vector<double>& x, const std::vector<double>& inv_freq, size_t rows,
                                        size_t seq_len, size_t n_heads, size_t head_dim, size_t row_stride,
                                        const std::vector<int>* positions = nullptr) {
    return rope_rotate(x, inv_freq, rows, seq_len, n_heads, head_dim, row_stride, +1, positions);
}

// The gradient with respect to x of <dout, rope_forward(x)>: the transposed rotation, by −θ.
inline std::vector<double> rope_backward(const std::vector<double>& dout, const std::vector<double>& inv_freq,
                                         size_t rows, size_t seq_len, size_t n_heads, size_t head_dim,
                                         size_t row_stride, const std::vector<int>* positions = nullptr) {
    return rope_rotate(dout, inv_freq, rows, seq_len, n_heads, head_dim, row_stride, -1, positions);
}

// llama2.c's (and Meta's original) RoPE, for checkpoints in that order: the interleaved pairs
// (2j, 2j+1) of each head rotated by pos·inv_freq[j] — out[2j] = x[2j]·cos − x[2j+1]·sin,
// out[2j+1] = x[2j]·sin + x[2j+1]·cos (llama2.c's run.c) — otherwise as rope_rotate.
inline std::vector<double> rope_rotate_interleaved(const std::vector<double>& x, const std::vector<double>& inv_freq,
                                                   size_t rows, size_t seq_len, size_t n_heads, size_t head_dim,
                                                   size_t row_stride, int sign) {
    std::vector<double> out = x;
    for (size_t r = 0; r < rows; ++r) {
        const long double pos = (long double)(r % seq_len);
        for (size_t h = 0; h < n_heads; ++h) {
            const double* in = x.data() + r * row_stride + h * head_dim;
            double* o = out.data() + r * row_stride + h * head_dim;
            for (size_t j = 0; j < head_dim / 2; ++j) {
                const long double angle = sign * pos * (long double)inv_freq[j];
                const long double a = in[2 * j], b = in[2 * j + 1];
                o[2 * j] = double(a * std::cos(angle) - b * std::sin(angle));
                o[2 * j + 1] = double(a * std::sin(angle) + b * std::cos(angle));
            }
        }
    }
    return out;
}

}  // namespace pv::reference
