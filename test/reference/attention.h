// fp64 reference for causal GQA self-attention (kernels/attention.cuh), written from the math with
// explicit T×T mask, score and probability matrices per (batch, head), not from the kernels.
//
// qkv[B][T][(H + 2·Hkv)·hd]: per row H query heads, Hkv key heads, Hkv value heads; query head h
// uses KV head h / (H / Hkv). Scale s = 1/sqrt(hd). Query i sees key j when mask[i][j]: j ≤ i, and
// with document positions ([B][T], each row's position within its document) also
// j ≥ i − positions[b][i], the lower bound clamped to [0, i] as the kernels' contract says.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace pv::reference {

struct AttentionShape {
    size_t B, T, H, Hkv, hd;
    size_t width() const { return (H + 2 * Hkv) * hd; }  // one row of qkv
    size_t q(size_t b, size_t i, size_t h) const { return (b * T + i) * width() + h * hd; }
    size_t k(size_t b, size_t j, size_t h) const { return (b * T + j) * width() + (H + h / (H / Hkv)) * hd; }
    size_t v(size_t b, size_t j, size_t h) const { return (b * T + j) * width() + (H + Hkv + h / (H / Hkv)) * hd; }
    size_t o(size_t b, size_t i, size_t h) const { return (b * T + i) * H * hd + h * hd; }
};

// mask[i][j] (T×T) of sequence b: whether query i sees key j.
inline std::vector<bool> attention_mask(const AttentionShape& s, size_t b, const std::vector<int>* positions) {
    std::vector<bool> mask(s.T * s.T, false);
    for (size_t i = 0; i < s.T; ++i) {
        long long first = 0;  // the first key of row i
        if (positions) first = std::clamp((long long)i - (*positions)[b * s.T + i], 0LL, (long long)i);
        for (size_t j = size_t(first); j <= i; ++j) mask[i * s.T + j] = true;
    }
    return mask;
}

// P[i][j] (T×T, zero where the mask is false) and lse[i] of one (b, h).
inline void attention_probabilities(const std::vector<double>& qkv, const AttentionShape& s, size_t b, size_t h,
                                    const std::vector<bool>& mask, std::vector<double>& P, std::vector<double>& lse) {
    const double scale = 1.0 / std::sqrt(double(s.hd));
    P.assign(s.T * s.T, 0.0);
    lse.assign(s.T, 0.0);
    for (size_t i = 0; i < s.T; ++i) {
        double mx = -INFINITY;
        for (size_t j = 0; j < s.T; ++j) {
            if (!mask[i * s.T + j]) continue;
            double dot = 0;
            for (size_t d = 0; d < s.hd; ++d) dot += qkv[s.q(b, i, h) + d] * qkv[s.k(b, j, h) + d];
            P[i * s.T + j] = scale * dot;  // scores for now
            mx = std::max(mx, scale * dot);
        }
        double sum = 0;
        for (size_t j = 0; j < s.T; ++j)
            if (mask[i * s.T + j]) sum += std::exp(P[i * s.T + j] - mx);
        lse[i] = mx + std::log(sum);
        for (size_t j = 0; j < s.T; ++j) P[i * s.T + j] = mask[i * s.T + j] ? std::exp(P[i * s.T + j] - lse[i]) : 0.0;
    }
}

// out[B][T][H·hd] and lse[B][H][T]; positions null: plain causal attention.
inline void attention_forward(const std::vector<double>& qkv, const AttentionShape& s, std::vector<double>& out,
                              std::vector<double>& lse, const std::vector<int>* positions = nullptr) {
    out.assign(s.B * s.T * s.H * s.hd, 0.0);
    lse.assign(s.B * s.H * s.T, 0.0);
    std::vector<double> P, l;
    for (size_t b = 0; b < s.B; ++b)
        for (size_t h = 0; h < s.H; ++h) {
            attention_probabilities(qkv, s, b, h, attention_mask(s, b, positions), P, l);
            for (size_t i = 0; i < s.T; ++i) {
                lse[(b * s.H + h) * s.T + i] = l[i];
                for (size_t d = 0; d < s.hd; ++d) {
                    double acc = 0;
                    for (size_t j = 0; j < s.T; ++j) acc += P[i * s.T + j] * qkv[s.v(b, j, h) + d];
                    out[s.o(b, i, h) + d] = acc;
                }
            }
        }
}

// dqkv (layout of qkv) from dout[B][T][H·hd] and the forward's output `out` as the backward
// receives it (in the tests: the kernel's forward output, rounded to T like every other input):
//   dP = dO·Vᵀ,  D_i = dO_i·out_i,  dS = P ∘ (dP − D),  dQ = s·dS·K,  dK = s·dSᵀ·Q,  dV = Pᵀ·dO,
// with dK and dV summed over the query heads sharing a KV head. (With an exact out, D_i equals
// Σ_j P_ij dP_ij, the softmax backward; a rounded out shifts D, and the gradients with it, by far
// more than the kernels' own arithmetic does in bf16.)
inline std::vector<double> attention_backward(const std::vector<double>& qkv, const std::vector<double>& out,
                                              const std::vector<double>& dout, const AttentionShape& s,
                                              const std::vector<int>* positions = nullptr) {
    const double scale = 1.0 / std::sqrt(double(s.hd));
    std::vector<double> dqkv(qkv.size(), 0.0), P, l, dS(s.T * s.T);
    for (size_t b = 0; b < s.B; ++b)
        for (size_t h = 0; h < s.H; ++h) {
            const std::vector<bool> mask = attention_mask(s, b, positions);
            attention_probabilities(qkv, s, b, h, mask, P, l);
            for (size_t i = 0; i < s.T; ++i) {
                double D = 0;
                for (size_t d = 0; d < s.hd; ++d) D += dout[s.o(b, i, h) + d] * out[s.o(b, i, h) + d];
                for (size_t j = 0; j < s.T; ++j) {
                    dS[i * s.T + j] = 0.0;
                    if (!mask[i * s.T + j]) continue;
                    double dp = 0;
                    for (size_t d = 0; d < s.hd; ++d) dp += dout[s.o(b, i, h) + d] * qkv[s.v(b, j, h) + d];
                    dS[i * s.T + j] = P[i * s.T + j] * (dp - D);
                }
            }
            for (size_t i = 0; i < s.T; ++i)
                for (size_t j = 0; j < s.T; ++j)
                    if (mask[i * s.T + j])
                        for (size_t d = 0; d < s.hd; ++d) {
                            dqkv[s.q(b, i, h) + d] += scale * dS[i * s.T + j] * qkv[s.k(b, j, h) + d];
                            dqkv[s.k(b, j, h) + d] += scale * dS[i * s.T + j] * qkv[s.q(b, i, h) + d];
                            dqkv[s.v(b, j, h) + d] += P[i * s.T + j] * dout[s.o(b, i, h) + d];
                        }
        }
    return dqkv;
}

}  // namespace pv::reference
