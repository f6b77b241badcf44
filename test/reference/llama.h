// fp64 reference for the whole Llama model, forward and backward, composed from the per-op
// references in test/reference/ (plain loops written from the math, independent of the kernels).
// It follows the same unit structure and tensor names as model/ (see model/llama.h), with every
// tensor as its own unpadded vector.
#pragma once

#include "model/config.h"
#include "test/reference/attention.h"
#include "test/reference/cross_entropy.h"
#include "test/reference/embedding.h"
#include "test/reference/lora.h"
#include "test/reference/matmul.h"
#include "test/reference/rmsnorm.h"
#include "test/reference/rope.h"
#include "test/reference/swiglu.h"

#include <cmath>
#include <stdexcept>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace pv::reference {

using Tensors = std::map<std::string, std::vector<double>>;

struct LlamaResult {
    double loss_sum = 0;
    int count = 0;
    std::vector<double> logits;  // [N][V]
    Tensors grads;               // d(loss_sum · loss_scale) / d(tensor), by name
};

// RoPE's inverse frequencies with optional Llama-3 scaling, from the published formula.
inline std::vector<double> llama_inverse_frequencies(const LlamaConfig& c) {
    const int hd = c.head_dim_resolved();
    std::vector<double> f(size_t(hd / 2));
    for (int i = 0; i < hd / 2; ++i) {
        double w = std::pow(c.rope_theta, -2.0 * i / hd);
        if (c.rope_scaling.enabled()) {
            const RopeScaling& s = c.rope_scaling;
            const double wavelen = 2 * M_PI / w, original = s.original_max_position_embeddings;
            if (wavelen > original / s.low_freq_factor) {
                w /= s.factor;
            } else if (wavelen >= original / s.high_freq_factor) {
                const double smooth =
                    (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                w = (1 - smooth) * w / s.factor + smooth * w;
            }
        }
        f[size_t(i)] = w;
    }
    return f;
}

// Columns [begin, begin + width) of every row of a [rows][stride] matrix, and the way back.
inline std::vector<double> columns(const std::vector<double>& m, size_t rows, size_t stride, size_t begin,
                                   size_t width) {
    std::vector<double> out(rows * width);
    for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < width; ++j) out[r * width + j] = m[r * stride + begin + j];
    return out;
}
inline void set_columns(std::vector<double>& m, const std::vector<double>& part, size_t rows, size_t stride,
                        size_t begin, size_t width) {
    for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < width; ++j) m[r * stride + begin + j] = part[r * width + j];
}

// Which components of a head RoPE rotates together: Hugging Face's (i, i + d/2), or the
// interleaved (2i, 2i+1) of llama2.c's and Meta's checkpoints, whose wq and wk rows are in that order.
enum class RopePairs { rotate_half, interleaved };

// LoRA adapters on the model's modules: p holds "layers.N.<module>.lora_A" [r][in] and ".lora_B"
// [rows][r] for every module named, PEFT's per-module tensors (no dropout).
struct LlamaLora {
    size_t rank = 0;
    double scale = 1;
    std::set<std::string> modules;  // "q_proj", ..., "down_proj"
};

// Forward (and, when `backward`, backward with loss scale `loss_scale`) of the model on a batch
// of B sequences of T tokens; targets equal to -100 are ignored. `positions` ([B·T], each token's
// position within its document; null: row % T) place RoPE and restrict attention to each document.
inline LlamaResult llama_forward_backward(const LlamaConfig& c, const Tensors& p, const std::vector<int>& tokens,
                                          const std::vector<int>& targets, size_t B, size_t T, double loss_scale,
                                          bool backward = true, const std::vector<int>* positions = nullptr,
                                          RopePairs pairs = RopePairs::rotate_half, const LlamaLora* lora = nullptr) {
    const size_t N = B * T, C = size_t(c.hidden_size), V = size_t(c.vocab_size), F = size_t(c.ffn_size);
    const size_t hd = size_t(c.head_dim_resolved()), H = size_t(c.num_heads), Hkv = size_t(c.num_kv_heads);
    const size_t qw = H * hd, kvw = Hkv * hd, W = qw + 2 * kvw;
    const double eps = c.rms_norm_eps;
    const AttentionShape shape{B, T, H, Hkv, hd};
    const auto freqs = llama_inverse_frequencies(c);
    auto at = [&](const std::string& name) -> const std::vector<double>& { return p.at(name); };
    auto rope = [&](const std::vector<double>& x, size_t heads, size_t width, int sign) {
        if (pairs == RopePairs::interleaved) {
            if (positions) throw std::invalid_argument("reference llama: interleaved RoPE takes no positions");
            return rope_rotate_interleaved(x, freqs, N, T, heads, hd, width, sign);
        }
        return sign > 0 ? rope_forward(x, freqs, N, T, heads, hd, width, positions)
                        : rope_backward(x, freqs, N, T, heads, hd, width, positions);
    };

    // The modules of each linear and their output rows: (module, in, out, begin, rows).
    struct Module {
        const char* name;
        size_t in, out, begin, rows;
    };
    const std::vector<Module> qkv_modules = {
        {"q_proj", C, W, 0, qw}, {"k_proj", C, W, qw, kvw}, {"v_proj", C, W, qw + kvw, kvw}};
    const std::vector<Module> o_modules = {{"o_proj", qw, C, 0, C}};
    const std::vector<Module> gu_modules = {{"gate_proj", C, 2 * F, 0, F}, {"up_proj", C, 2 * F, F, F}};
    const std::vector<Module> down_modules = {{"down_proj", F, C, 0, C}};
    auto adapters_forward = [&](const std::string& n, const std::vector<Module>& mods, const std::vector<double>& in,
                                std::vector<double>& y) {
        if (!lora) return;
        for (const Module& m : mods)
            if (lora->modules.count(m.name))
                lora_forward({N, m.in, m.out, m.begin, m.rows, lora->rank, lora->scale}, in,
                             p.at(n + m.name + ".lora_A"), p.at(n + m.name + ".lora_B"), y);
    };

    struct Layer {
        std::vector<double> x, h1, qkv, att, x2, h2, gu, act;
    };
    std::vector<Layer> layers(size_t(c.num_layers));
    std::vector<double> x = embedding_forward(tokens, at("wte"), N, C, V);
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string n = "layers." + std::to_string(l) + ".";
        Layer& L = layers[size_t(l)];
        L.x = x;
        L.h1 = rmsnorm_forward(x, at(n + "attn_norm"), N, C, eps).out;
        L.qkv = matmul_forward(L.h1, at(n + "w_qkv"), N, C, W);
        adapters_forward(n, qkv_modules, L.h1, L.qkv);
        set_columns(L.qkv, rope(columns(L.qkv, N, W, 0, qw), H, qw, +1), N, W, 0, qw);
        set_columns(L.qkv, rope(columns(L.qkv, N, W, qw, kvw), Hkv, kvw, +1), N, W, qw, kvw);
        std::vector<double> lse;
        attention_forward(L.qkv, shape, L.att, lse, positions);
        auto proj = matmul_forward(L.att, at(n + "w_o"), N, qw, C);
        adapters_forward(n, o_modules, L.att, proj);
        auto r = residual_rmsnorm_forward(x, proj, at(n + "mlp_norm"), N, C, eps);
        L.x2 = r.sum;
        L.h2 = r.out;
        L.gu = matmul_forward(L.h2, at(n + "w_gate_up"), N, C, 2 * F);
        adapters_forward(n, gu_modules, L.h2, L.gu);
        L.act = swiglu_forward(L.gu, N, F);
        auto down = matmul_forward(L.act, at(n + "w_down"), N, F, C);
        adapters_forward(n, down_modules, L.act, down);
        for (size_t i = 0; i < N * C; ++i) x[i] = L.x2[i] + down[i];
    }
    const std::string lm = c.tie_embeddings ? "wte" : "lm_head";
    const auto hN = rmsnorm_forward(x, at("final_norm"), N, C, eps).out;
    LlamaResult result;
    result.logits = matmul_forward(hN, at(lm), N, C, V);
    const auto ce = cross_entropy_forward(result.logits, targets, N, V, -100);
    result.loss_sum = ce.loss_sum;
    result.count = ce.count;
    if (!backward) return result;

    Tensors& g = result.grads;
    for (const auto& [name, value] : p) g[name].assign(value.size(), 0.0);
    auto adapters_backward = [&](const std::string& n, const std::vector<Module>& mods, const std::vector<double>& dy,
                                 const std::vector<double>& in, std::vector<double>& dx_in) {
        if (!lora) return;
        for (const Module& m : mods)
            if (lora->modules.count(m.name)) {
                const std::string a = n + m.name + ".lora_A", b = n + m.name + ".lora_B";
                lora_backward({N, m.in, m.out, m.begin, m.rows, lora->rank, lora->scale}, dy, in, p.at(a), p.at(b),
                              dx_in, g[a], g[b]);
            }
    };
    const auto dlogits = cross_entropy_backward(result.logits, targets, N, V, -100, loss_scale);
    const auto dhN = matmul_backward_dx(dlogits, at(lm), N, C, V);
    const auto dlm = matmul_backward_dw(dlogits, hN, N, C, V);
    for (size_t i = 0; i < dlm.size(); ++i) g[lm][i] += dlm[i];
    std::vector<double> dx(N * C, 0.0);
    rmsnorm_backward(x, at("final_norm"), dhN, dx, g["final_norm"], N, C, eps);
    for (int l = c.num_layers - 1; l >= 0; --l) {
        const std::string n = "layers." + std::to_string(l) + ".";
        const Layer& L = layers[size_t(l)];
        auto add_to = [&](const std::string& name, const std::vector<double>& d) {
            for (size_t i = 0; i < d.size(); ++i) g[name][i] += d[i];
        };
        // MLP branch: out = x2 + act·W_downᵀ.
        std::vector<double> dx2 = dx;
        auto dact = matmul_backward_dx(dx, at(n + "w_down"), N, F, C);
        adapters_backward(n, down_modules, dx, L.act, dact);
        add_to(n + "w_down", matmul_backward_dw(dx, L.act, N, F, C));
        const auto dgu = swiglu_backward(L.gu, dact, N, F);
        auto dh2 = matmul_backward_dx(dgu, at(n + "w_gate_up"), N, C, 2 * F);
        adapters_backward(n, gu_modules, dgu, L.h2, dh2);
        add_to(n + "w_gate_up", matmul_backward_dw(dgu, L.h2, N, C, 2 * F));
        rmsnorm_backward(L.x2, at(n + "mlp_norm"), dh2, dx2, g[n + "mlp_norm"], N, C, eps);
        // Attention branch: x2 = x + att·W_oᵀ.
        auto datt = matmul_backward_dx(dx2, at(n + "w_o"), N, qw, C);
        adapters_backward(n, o_modules, dx2, L.att, datt);
        add_to(n + "w_o", matmul_backward_dw(dx2, L.att, N, qw, C));
        auto dqkv = attention_backward(L.qkv, L.att, datt, shape, positions);
        set_columns(dqkv, rope(columns(dqkv, N, W, 0, qw), H, qw, -1), N, W, 0, qw);
        set_columns(dqkv, rope(columns(dqkv, N, W, qw, kvw), Hkv, kvw, -1), N, W, qw, kvw);
        auto dh1 = matmul_backward_dx(dqkv, at(n + "w_qkv"), N, C, W);
        adapters_backward(n, qkv_modules, dqkv, L.h1, dh1);
        add_to(n + "w_qkv", matmul_backward_dw(dqkv, L.h1, N, C, W));
        dx = dx2;
        rmsnorm_backward(L.x, at(n + "attn_norm"), dh1, dx, g[n + "attn_norm"], N, C, eps);
    }
    embedding_backward(tokens, dx, g["wte"], N, C, V);
    return result;
}

}  // namespace pv::reference
