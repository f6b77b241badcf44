// Validation, parameter counts, RoPE's inverse frequencies and presets of LlamaConfig
// (model/config.h). Plain host C++.
#include "model/config.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace pv {

namespace {

// Doubles as a person would write them: 1e-05, 10000, 500000, 0.5.
std::string num(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

// "1, 2, 4 or 8": the num_kv_heads values that divide num_heads.
std::string divisors_of(int n) {
    std::vector<int> d;
    for (int i = 1; i <= n; ++i)
        if (n % i == 0) d.push_back(i);
    std::string s;
    for (size_t i = 0; i < d.size(); ++i) {
        if (i > 0) s += i + 1 == d.size() ? " or " : ", ";
        s += std::to_string(d[i]);
    }
    return s;
}

}  // namespace

std::vector<std::string> validate(const LlamaConfig& c) {
    std::vector<std::string> errors;
    auto positive = [&](const char* field, int value, const char* why) {
        if (value > 0) return true;
        errors.push_back(std::string(field) + " = " + std::to_string(value) + " must be positive: " + why);
        return false;
    };
    positive("vocab_size", c.vocab_size, "set it to the tokenizer's vocabulary size");
    bool hidden_ok =
        positive("hidden_size", c.hidden_size, "set it to the model width (config.json hidden_size)");
    positive("num_layers", c.num_layers, "set it to the number of transformer blocks (config.json num_hidden_layers)");
    bool heads_ok =
        positive("num_heads", c.num_heads, "set it to the number of query heads (config.json num_attention_heads)");
    bool kv_ok = positive("num_kv_heads", c.num_kv_heads,
                                "set it to the number of key/value heads (config.json num_key_value_heads; "
                                "equal to num_heads without grouped-query attention)");
    positive("ffn_size", c.ffn_size, "set it to the MLP width (config.json intermediate_size)");
    positive("max_seq_len", c.max_seq_len,
             "set it to the longest sequence the model takes (config.json max_position_embeddings)");

    // Upper limits, far above any published Llama (405B: hidden 16384, intermediate 53248, 126
    // layers, 128 heads; vocabularies up to 256k; windows up to 10M): a larger value is a damaged or
    // foreign config.json, refused here before any size computed from it allocates memory, or a
    // planner walks a million layers.
    auto at_most = [&](const char* field, int value, int limit, const char* largest) {
        if (value <= limit) return true;
        errors.push_back(std::string(field) + " = " + std::to_string(value) + " exceeds polevault's limit of " +
                         std::to_string(limit) + " (" + largest +
                         "): the config is damaged or not a Llama-family model's; correct the value");
        return false;
    };
    at_most("vocab_size", c.vocab_size, kMaxVocabSize, "the largest published vocabularies have 262144 tokens");
    hidden_ok = at_most("hidden_size", c.hidden_size, kMaxHiddenSize, "Llama 3.1 405B has 16384") && hidden_ok;
    at_most("num_layers", c.num_layers, kMaxLayers, "Llama 3.1 405B has 126");
    heads_ok = at_most("num_heads", c.num_heads, kMaxHeads, "Llama 3.1 405B has 128") && heads_ok;
    kv_ok = at_most("num_kv_heads", c.num_kv_heads, kMaxHeads, "Llama 3.1 405B has 8") && kv_ok;
    at_most("head_dim", c.head_dim, kMaxHeadDim, "Llama models use 64 or 128");
    at_most("ffn_size", c.ffn_size, kMaxFfnSize, "Llama 3.1 405B has 53248");
    at_most("max_seq_len", c.max_seq_len, kMaxSeqLen, "Llama 4 Scout has 10485760");

    if (heads_ok && kv_ok && c.num_heads % c.num_kv_heads != 0)
        errors.push_back("num_kv_heads = " + std::to_string(c.num_kv_heads) + " does not divide num_heads = " +
                         std::to_string(c.num_heads) + ": GQA needs num_heads to be a multiple of num_kv_heads (use " +
                         divisors_of(c.num_heads) + ")");

    if (c.head_dim < 0) {
        errors.push_back("head_dim = " + std::to_string(c.head_dim) +
                         " must be positive, or 0 to derive it as hidden_size / num_heads");
    } else if (c.head_dim > 0) {
        if (c.head_dim % 2 != 0)
            errors.push_back("head_dim = " + std::to_string(c.head_dim) +
                             " is odd: RoPE rotates the channels of each head in pairs, so head_dim "
                             "must be even (choose an even head_dim)");
    } else if (hidden_ok && heads_ok) {
        // hidden_size < num_heads lands here too: the remainder is hidden_size itself.
        if (c.hidden_size % c.num_heads != 0)
            errors.push_back("hidden_size = " + std::to_string(c.hidden_size) +
                             " is not divisible by num_heads = " + std::to_string(c.num_heads) +
                             " and head_dim is not set: set head_dim explicitly or choose hidden_size a multiple "
                             "of num_heads");
        else if (c.head_dim_resolved() % 2 != 0)
            errors.push_back("head_dim = " + std::to_string(c.head_dim_resolved()) + " (hidden_size / num_heads = " +
                             std::to_string(c.hidden_size) + " / " + std::to_string(c.num_heads) +
                             ") is odd: RoPE rotates the channels of each head in pairs, so head_dim "
                             "must be even (set an even head_dim explicitly, or choose hidden_size an even "
                             "multiple of num_heads)");
    }

    // Written so that NaN fails too.
    if (!(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps)))
        errors.push_back(
            "rms_norm_eps = " + num(c.rms_norm_eps) +
            " must be positive and finite: RMSNorm divides by sqrt(mean(x^2) + eps), which is infinite for a zero "
            "row without it (use config.json's rms_norm_eps, typically 1e-5 or 1e-6)");
    if (!(c.rope_theta > 0 && std::isfinite(c.rope_theta)))
        errors.push_back(
            "rope_theta = " + num(c.rope_theta) +
            " must be positive and finite: RoPE's frequencies are rope_theta^(-2i/head_dim) (use config.json's "
            "rope_theta, typically 10000 or 500000)");

    const RopeScaling& s = c.rope_scaling;
    if (!(s.factor >= 0 && std::isfinite(s.factor))) {
        errors.push_back("rope_scaling.factor = " + num(s.factor) +
                         " must be 0 (no scaling) or positive and finite (Llama 3 uses 8 or 32)");
    } else if (s.factor > 0) {
        if (s.original_max_position_embeddings <= 0)
            errors.push_back("rope_scaling.original_max_position_embeddings = " +
                             std::to_string(s.original_max_position_embeddings) +
                             " must be positive when rope_scaling.factor = " + num(s.factor) +
                             ": it is the context length of pre-training (8192 for Llama 3), or set factor to 0 for "
                             "no scaling");
        if (!(s.low_freq_factor > 0 && std::isfinite(s.low_freq_factor)))
            errors.push_back("rope_scaling.low_freq_factor = " + num(s.low_freq_factor) +
                             " must be positive when rope_scaling.factor = " + num(s.factor) +
                             ": wavelengths above original_max_position_embeddings / low_freq_factor are scaled "
                             "(Llama 3 uses 1)");
        if (!(s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor)))
            errors.push_back("rope_scaling.high_freq_factor = " + num(s.high_freq_factor) +
                             " must be greater than rope_scaling.low_freq_factor = " + num(s.low_freq_factor) +
                             ": the blend between them divides by their difference (Llama 3 uses low 1, high 4)");
    }
    return errors;
}

void validate_or_throw(const LlamaConfig& c) {
    const auto errors = validate(c);
    if (errors.empty()) return;
    std::string msg = "invalid model config '" + c.name + "' (" + std::to_string(errors.size()) +
                      (errors.size() == 1 ? " problem):" : " problems):");
    for (const auto& e : errors) msg += "\n  " + e;
    throw std::invalid_argument(msg);
}

long long block_parameter_count(const LlamaConfig& c) {
    const long long h = c.hidden_size, q = c.q_width(), kv = c.kv_width(), f = c.ffn_size;
    return 2 * h         // attention and MLP RMSNorm weights
           + q * h       // Wq
           + 2 * kv * h  // Wk, Wv
           + h * q       // Wo
           + 3 * f * h;  // Wgate, Wup, Wdown
}

long long parameter_count(const LlamaConfig& c) {
    const long long embedding = (long long)c.vocab_size * c.hidden_size;
    return embedding                                  // token embedding
           + (c.tie_embeddings ? 0 : embedding)       // lm_head, unless it is the embedding
           + c.num_layers * block_parameter_count(c)  // blocks
           + c.hidden_size;                           // final RMSNorm
}

std::vector<double> rope_inverse_frequencies(int head_dim, double theta, const RopeScaling& scaling) {
    const double pi = 3.14159265358979323846;
    std::vector<double> inv_freq(size_t(head_dim / 2));
    for (int i = 0; i < head_dim / 2; ++i) {
        double f = std::pow(theta, -2.0 * i / head_dim);
        if (scaling.enabled()) {
            const double original = scaling.original_max_position_embeddings;
            const double low_wavelen = original / scaling.low_freq_factor;    // longer: fully scaled
            const double high_wavelen = original / scaling.high_freq_factor;  // shorter: untouched
            const double wavelen = 2 * pi / f;
            if (wavelen > low_wavelen) {
                f = f / scaling.factor;
            } else if (wavelen >= high_wavelen) {
                const double s = (original / wavelen - scaling.low_freq_factor) /
                                 (scaling.high_freq_factor - scaling.low_freq_factor);
                f = (1 - s) * f / scaling.factor + s * f;
            }
        }
        inv_freq[size_t(i)] = f;
    }
    return inv_freq;
}

std::vector<double> rope_inverse_frequencies(const LlamaConfig& c) {
    return rope_inverse_frequencies(c.head_dim_resolved(), c.rope_theta, c.rope_scaling);
}

namespace {

// Presets. The published models' values are their config.json files on the Hugging Face Hub
// (repository named above each); rope_theta is 10000 where an older config.json omits it
// (transformers' default, which later revisions of those files write out).
const std::vector<LlamaConfig>& presets() {
    // The table keeps one preset per group of rows, as the published configs read.
    // clang-format off
    static const std::vector<LlamaConfig> all = {
        // Small models for tests: GQA with 3 query heads per KV head, head_dim set explicitly, sizes
        // that divide no tile size, an odd vocabulary. test-tied differs in tying, vocab and depth.
        {.name = "test-tiny", .vocab_size = 67, .hidden_size = 48, .num_layers = 2, .num_heads = 6,
         .num_kv_heads = 2, .head_dim = 8, .ffn_size = 40, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
         .rope_scaling = {}, .max_seq_len = 32, .tie_embeddings = false},
        {.name = "test-tied", .vocab_size = 65, .hidden_size = 48, .num_layers = 3, .num_heads = 6,
         .num_kv_heads = 2, .head_dim = 8, .ffn_size = 40, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
         .rope_scaling = {}, .max_seq_len = 32, .tie_embeddings = true},
        // karpathy/llama2.c README, "stories260K" (huggingface.co/karpathy/tinyllamas/stories260K):
        // dim 64, n_layers 5, n_heads 8, n_kv_heads 4, vocab 512, max_seq_len 512; hidden_dim 172
        // from model.py (multiple_of 4: 2/3 · 4 · 64 = 170 → 172); norm_eps 1e-5; θ 10000; the
        // classifier shares the embedding.
        {.name = "stories260K", .vocab_size = 512, .hidden_size = 64, .num_layers = 5, .num_heads = 8,
         .num_kv_heads = 4, .head_dim = 0, .ffn_size = 172, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
         .rope_scaling = {}, .max_seq_len = 512, .tie_embeddings = true},
        // A host-sized model for throughput benchmarks on a CPU (bench/train_throughput.sh): GPT-2-
        // small-like proportions at 1/2 width and 1/2 depth, a 4096-token vocabulary, tied. Not a
        // published model.
        {.name = "host-11m", .vocab_size = 4096, .hidden_size = 384, .num_layers = 6, .num_heads = 6,
         .num_kv_heads = 2, .head_dim = 64, .ffn_size = 1024, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
         .rope_scaling = {}, .max_seq_len = 1024, .tie_embeddings = true},
        // HuggingFaceTB/SmolLM2-135M config.json: hidden_size 576, intermediate_size 1536,
        // num_hidden_layers 30, num_attention_heads 9, num_key_value_heads 3, head_dim 64,
        // vocab_size 49152, max_position_embeddings 8192, rms_norm_eps 1e-05, rope_theta 100000,
        // rope_scaling null, tie_word_embeddings true.
        {.name = "smollm2-135m", .vocab_size = 49152, .hidden_size = 576, .num_layers = 30, .num_heads = 9,
         .num_kv_heads = 3, .head_dim = 64, .ffn_size = 1536, .rms_norm_eps = 1e-5, .rope_theta = 100000.0,
         .rope_scaling = {}, .max_seq_len = 8192, .tie_embeddings = true},
        // TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T (and -Chat-v1.0) config.json:
        // hidden_size 2048, intermediate_size 5632, num_hidden_layers 22, num_attention_heads 32,
        // num_key_value_heads 4, vocab_size 32000, max_position_embeddings 2048, rms_norm_eps 1e-05,
        // rope_theta 10000.0, rope_scaling null, tie_word_embeddings false.
        {.name = "tinyllama-1.1b", .vocab_size = 32000, .hidden_size = 2048, .num_layers = 22, .num_heads = 32,
         .num_kv_heads = 4, .head_dim = 0, .ffn_size = 5632, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
         .rope_scaling = {}, .max_seq_len = 2048, .tie_embeddings = false},
        // meta-llama/Llama-3.2-1B config.json: hidden_size 2048, intermediate_size 8192,
        // num_hidden_layers 16, num_attention_heads 32, num_key_value_heads 8, head_dim 64,
        // vocab_size 128256, max_position_embeddings 131072, rms_norm_eps 1e-05, rope_theta 500000.0,
        // rope_scaling {factor 32.0, low_freq_factor 1.0, high_freq_factor 4.0,
        // original_max_position_embeddings 8192, rope_type "llama3"}, tie_word_embeddings true.
        {.name = "llama-3.2-1b", .vocab_size = 128256, .hidden_size = 2048, .num_layers = 16, .num_heads = 32,
         .num_kv_heads = 8, .head_dim = 64, .ffn_size = 8192, .rms_norm_eps = 1e-5, .rope_theta = 500000.0,
         .rope_scaling = {.factor = 32.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                          .original_max_position_embeddings = 8192},
         .max_seq_len = 131072, .tie_embeddings = true},
        // meta-llama/Llama-2-7b-hf config.json: hidden_size 4096, intermediate_size 11008,
        // num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 32, vocab_size 32000,
        // max_position_embeddings 4096, rms_norm_eps 1e-05 (the -chat-hf variant has 1e-06),
        // rope_scaling null, tie_word_embeddings false.
        {.name = "llama-2-7b", .vocab_size = 32000, .hidden_size = 4096, .num_layers = 32, .num_heads = 32,
         .num_kv_heads = 32, .head_dim = 0, .ffn_size = 11008, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
         .rope_scaling = {}, .max_seq_len = 4096, .tie_embeddings = false},
        // meta-llama/Llama-3.1-8B config.json: hidden_size 4096, intermediate_size 14336,
        // num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, head_dim 128,
        // vocab_size 128256, max_position_embeddings 131072, rms_norm_eps 1e-05, rope_theta 500000.0,
        // rope_scaling {factor 8.0, low_freq_factor 1.0, high_freq_factor 4.0,
        // original_max_position_embeddings 8192, rope_type "llama3"}, tie_word_embeddings false.
        {.name = "llama-3.1-8b", .vocab_size = 128256, .hidden_size = 4096, .num_layers = 32, .num_heads = 32,
         .num_kv_heads = 8, .head_dim = 128, .ffn_size = 14336, .rms_norm_eps = 1e-5, .rope_theta = 500000.0,
         .rope_scaling = {.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                          .original_max_position_embeddings = 8192},
         .max_seq_len = 131072, .tie_embeddings = false},
        // codellama/CodeLlama-34b-hf config.json: hidden_size 8192, intermediate_size 22016,
        // num_hidden_layers 48, num_attention_heads 64, num_key_value_heads 8, vocab_size 32000,
        // max_position_embeddings 16384, rms_norm_eps 1e-05, rope_theta 1000000, rope_scaling null,
        // tie_word_embeddings false.
        {.name = "codellama-34b", .vocab_size = 32000, .hidden_size = 8192, .num_layers = 48, .num_heads = 64,
         .num_kv_heads = 8, .head_dim = 0, .ffn_size = 22016, .rms_norm_eps = 1e-5, .rope_theta = 1000000.0,
         .rope_scaling = {}, .max_seq_len = 16384, .tie_embeddings = false},
        // meta-llama/Llama-2-70b-hf config.json: hidden_size 8192, intermediate_size 28672,
        // num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8, vocab_size 32000,
        // max_position_embeddings 4096, rms_norm_eps 1e-05, rope_scaling null,
        // tie_word_embeddings false.
        {.name = "llama-2-70b", .vocab_size = 32000, .hidden_size = 8192, .num_layers = 80, .num_heads = 64,
         .num_kv_heads = 8, .head_dim = 0, .ffn_size = 28672, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
         .rope_scaling = {}, .max_seq_len = 4096, .tie_embeddings = false},
    };
    // clang-format on
    return all;
}

}  // namespace

const LlamaConfig& preset(std::string_view name) {
    for (const auto& c : presets())
        if (c.name == name) return c;
    std::string known;
    for (const auto& c : presets()) known += (known.empty() ? "" : ", ") + c.name;
    throw std::invalid_argument("unknown model preset '" + std::string(name) + "'; known presets: " + known);
}

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const auto& c : presets()) names.push_back(c.name);
    return names;
}

}  // namespace pv
