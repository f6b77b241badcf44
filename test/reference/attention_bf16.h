// Plain attention done the standard way in bf16, for deriving the bf16 tolerance of the
// tensor-core kernels (test_attention): what a straightforward implementation with bf16 inputs
// computes, not what the kernels compute. Inputs are bf16 values (given as doubles, already
// rounded); every sum is accumulated in fp32 in index order; the probabilities P and the score
// gradients dS are rounded to bf16 before the products that take them (P·V, Pᵀ·dO, dS·K, dSᵀ·Q),
// as bf16 GEMMs take their operands; the outputs are rounded to bf16, as they are stored.
//   S_ij = s·q_i·k_j (fp32),  m_i = max_j S_ij,  p_ij = exp(S_ij − m_i),  l_i = Σ_j p_ij (fp32),
//   out_i = (Σ_j bf16(p_ij)·v_j) / l_i,            lse_i = m_i + log l_i
//   P_ij = exp(S_ij − lse_i),  dP_ij = dO_i·v_j,  D_i = dO_i·out_i,  dS_ij = P_ij·(dP_ij − D_i)
//   dV_j = Σ_i bf16(P_ij)·dO_i,  dQ_i = s·Σ_j bf16(dS_ij)·k_j,  dK_j = s·Σ_i bf16(dS_ij)·q_i
// with the window of test/reference/attention.h (attention_mask) and its GQA head mapping.
#pragma once

#include "test/reference/attention.h"
#include "test/reference/glue.h"

#include <cmath>
#include <vector>

namespace pv::reference {

inline float bf16_round(float x) { return float(round_to_significand(double(x), 8)); }

// out[B][T][H·hd] and lse[B][H][T], each output rounded to bf16 (lse stays fp32).
inline void attention_forward_bf16(const std::vector<double>& qkv, const AttentionShape& s, std::vector<double>& out,
                                   std::vector<double>& lse, const std::vector<int>* positions = nullptr) {
    const float scale = 1.0f / std::sqrt(float(s.hd));
    out.assign(s.B * s.T * s.H * s.hd, 0.0);
    lse.assign(s.B * s.H * s.T, 0.0);
    std::vector<float> p(s.T), acc(s.hd);
    for (size_t b = 0; b < s.B; ++b) {
        const std::vector<bool> mask = attention_mask(s, b, positions);
        for (size_t h = 0; h < s.H; ++h)
            for (size_t i = 0; i < s.T; ++i) {
                float mx = -INFINITY;
                for (size_t j = 0; j < s.T; ++j) {
                    if (!mask[i * s.T + j]) continue;
                    float dot = 0;
                    for (size_t d = 0; d < s.hd; ++d) dot += float(qkv[s.q(b, i, h) + d]) * float(qkv[s.k(b, j, h) + d]);
                    p[j] = scale * dot;
                    mx = std::max(mx, p[j]);
                }
                float l = 0;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (size_t j = 0; j < s.T; ++j) {
                    if (!mask[i * s.T + j]) continue;
                    const float e = std::exp(p[j] - mx);
                    l += e;
                    const float rounded = bf16_round(e);
                    for (size_t d = 0; d < s.hd; ++d) acc[d] += rounded * float(qkv[s.v(b, j, h) + d]);
                }
                for (size_t d = 0; d < s.hd; ++d) out[s.o(b, i, h) + d] = bf16_round(acc[d] / l);
                lse[(b * s.H + h) * s.T + i] = mx + std::log(l);
            }
    }
}

// dqkv (layout of qkv, rounded to bf16) from dout, the forward's `out` and `lse` as the backward
// receives them (the same inputs the kernels get).
inline std::vector<double> attention_backward_bf16(const std::vector<double>& qkv, const std::vector<double>& out,
                                                   const std::vector<double>& lse, const std::vector<double>& dout,
                                                   const AttentionShape& s,
                                                   const std::vector<int>* positions = nullptr) {
    const float scale = 1.0f / std::sqrt(float(s.hd));
    std::vector<float> acc(qkv.size(), 0.0f);  // dQ, dK, dV in fp32, summed over the query heads of a KV head
    std::vector<float> P(s.T * s.T), dS(s.T * s.T);
    for (size_t b = 0; b < s.B; ++b) {
        const std::vector<bool> mask = attention_mask(s, b, positions);
        for (size_t h = 0; h < s.H; ++h) {
            for (size_t i = 0; i < s.T; ++i) {
                float D = 0;
                for (size_t d = 0; d < s.hd; ++d) D += float(dout[s.o(b, i, h) + d]) * float(out[s.o(b, i, h) + d]);
                const float lse_i = float(lse[(b * s.H + h) * s.T + i]);
                for (size_t j = 0; j < s.T; ++j) {
                    P[i * s.T + j] = dS[i * s.T + j] = 0.0f;
                    if (!mask[i * s.T + j]) continue;
                    float dot = 0, dp = 0;
                    for (size_t d = 0; d < s.hd; ++d) {
                        dot += float(qkv[s.q(b, i, h) + d]) * float(qkv[s.k(b, j, h) + d]);
                        dp += float(dout[s.o(b, i, h) + d]) * float(qkv[s.v(b, j, h) + d]);
                    }
                    const float p = std::exp(scale * dot - lse_i);
                    P[i * s.T + j] = bf16_round(p);
                    dS[i * s.T + j] = bf16_round(p * (dp - D));
                }
            }
            for (size_t i = 0; i < s.T; ++i)
                for (size_t j = 0; j < s.T; ++j)
                    if (mask[i * s.T + j])
                        for (size_t d = 0; d < s.hd; ++d) {
                            acc[s.q(b, i, h) + d] += dS[i * s.T + j] * float(qkv[s.k(b, j, h) + d]);
                            acc[s.k(b, j, h) + d] += dS[i * s.T + j] * float(qkv[s.q(b, i, h) + d]);
                            acc[s.v(b, j, h) + d] += P[i * s.T + j] * float(dout[s.o(b, i, h) + d]);
                        }
        }
    }
    std::vector<double> dqkv(qkv.size());
    for (size_t b = 0; b < s.B; ++b)
        for (size_t i = 0; i < s.T; ++i)
            for (size_t c = 0; c < s.width(); ++c) {
                const size_t at = (b * s.T + i) * s.width() + c;
                const bool value = c >= (s.H + s.Hkv) * s.hd;  // dV carries no scale
                dqkv[at] = bf16_round(value ? acc[at] : scale * acc[at]);
            }
    return dqkv;
}

}  // namespace pv::reference
