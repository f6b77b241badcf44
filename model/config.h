// The shape of a Llama-family model, its validation, its parameter count, RoPE's inverse frequencies
// and named presets.
//
// A LlamaConfig holds what a Hugging Face config.json says about the architecture and nothing
// about training: the sizes of the embedding, the blocks and the MLP, grouped-query attention
// (num_kv_heads ≤ num_heads, each KV head shared by num_heads / num_kv_heads query heads), the
// RMSNorm epsilon, RoPE's base θ and the optional Llama-3 frequency scaling. Field names follow
// config.json where they can (ffn_size is its intermediate_size, num_layers its
// num_hidden_layers, max_seq_len its max_position_embeddings, tie_embeddings its
// tie_word_embeddings), so a loader maps keys one to one.
//
// One block, with H = hidden_size, d = head_dim, q = num_heads·d, kv = num_kv_heads·d, F = ffn_size:
//   attention  RMSNorm(H) → Wq [q×H], Wk [kv×H], Wv [kv×H] → RoPE, causal attention → Wo [H×q]
//   MLP        RMSNorm(H) → Wgate [F×H], Wup [F×H] → SwiGLU → Wdown [H×F]
// No biases. The model is embedding [V×H] → L blocks → final RMSNorm(H) → lm_head [V×H], where
// lm_head is the embedding itself when tie_embeddings is set. head_dim = 0 means H / num_heads;
// it is set explicitly when q ≠ H is wanted (config.json's head_dim).
//
// RoPE's inverse frequencies are ω_i = rope_theta^(−2i/head_dim), i < head_dim / 2, computed here
// on the host in double (rope_inverse_frequencies); the RoPE kernels (kernels/rope.cuh) only take
// the resulting array. Llama-3 RoPE scaling (rope_type "llama3"), as Hugging Face's
// `_compute_llama3_parameters` (transformers, src/transformers/modeling_rope_utils.py) does it:
// for a frequency with wavelength λ = 2π / ω, with original = original_max_position_embeddings,
//   λ < original / high_freq_factor  →  ω unchanged (high frequencies),
//   λ > original / low_freq_factor   →  ω / factor    (low frequencies),
//   in between, a linear blend in s = (original / λ − low) / (high − low):
//   ω' = (1 − s)·ω / factor + s·ω.
// factor = 0 means no scaling.
//
// Validation reports every problem at once, each message naming the field, its value and the
// fix, because a config usually comes from a user's file and one round trip per mistake is
// tedious. Host code only; no device code and no kernel headers here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pv {

// config.json's rope_scaling object for rope_type "llama3". factor = 0: none.
struct RopeScaling {
    double factor = 0.0;
    double low_freq_factor = 0.0;
    double high_freq_factor = 0.0;
    int original_max_position_embeddings = 0;

    bool enabled() const { return factor != 0.0; }
};

struct LlamaConfig {
    std::string name;  // the preset name, or where the config came from
    int vocab_size = 0;
    int hidden_size = 0;
    int num_layers = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;  // 0: hidden_size / num_heads
    int ffn_size = 0;  // intermediate_size
    double rms_norm_eps = 1e-5;
    double rope_theta = 10000.0;
    RopeScaling rope_scaling;  // factor 0: none
    int max_seq_len = 0;       // max_position_embeddings
    bool tie_embeddings = false;

    // Meaningful for a config that validates; never divides by zero otherwise.
    int head_dim_resolved() const { return head_dim > 0 ? head_dim : (num_heads > 0 ? hidden_size / num_heads : 0); }
    int q_width() const { return num_heads * head_dim_resolved(); }
    int kv_width() const { return num_kv_heads * head_dim_resolved(); }
    // Rows of the fused [Wq; Wk; Wv] weight: the QKV GEMM's output width.
    int qkv_width() const { return q_width() + 2 * kv_width(); }
};

// Upper limits of the sizes validate() accepts, each far above any published Llama's, so that
// no size computed from a config overflows and nothing walks an absurd number of layers.
inline constexpr int kMaxVocabSize = 1 << 22, kMaxHiddenSize = 1 << 16, kMaxLayers = 1 << 10, kMaxHeads = 1 << 10,
                     kMaxHeadDim = 1 << 12, kMaxFfnSize = 1 << 18, kMaxSeqLen = 1 << 24;

// Every problem with the config, empty when it is usable. Each message starts with the field
// and its value ("num_kv_heads = 3 ...") and says how to fix it.
std::vector<std::string> validate(const LlamaConfig& c);

// Throws std::invalid_argument listing all of validate()'s messages, one per line, after a line
// naming the config.
void validate_or_throw(const LlamaConfig& c);

// RoPE's head_dim / 2 inverse frequencies in double, theta^(−2i/head_dim), Llama-3 scaled when
// `scaling` is enabled (the formula above). The caller rounds them to the kernels' accumulator
// type and keeps them on the device.
std::vector<double> rope_inverse_frequencies(int head_dim, double theta, const RopeScaling& scaling);

// The same for a model: head_dim_resolved(), rope_theta and rope_scaling.
std::vector<double> rope_inverse_frequencies(const LlamaConfig& c);

// Parameters of one transformer block: two RMSNorm weights, Wq, Wk, Wv, Wo, Wgate, Wup, Wdown.
long long block_parameter_count(const LlamaConfig& c);

// All parameters, each counted once: the embedding, lm_head unless tied, every block, the final
// RMSNorm. This is what the safetensors files of the published models hold.
long long parameter_count(const LlamaConfig& c);

// A named preset. Throws std::invalid_argument naming the unknown name and listing the known ones.
const LlamaConfig& preset(std::string_view name);

// The preset names, small test models first, then published models by size.
std::vector<std::string> preset_names();

}  // namespace pv
