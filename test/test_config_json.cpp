// Hugging Face config.json: every preset round-trips through the text; the written layout is
// transformers' (typed out by hand here); random shapes and doubles round-trip bit for bit; the
// published config.json files of Llama-3.2-1B(-Instruct), TinyLlama-1.1B (two revisions) and
// SmolLM2-135M parse to the shapes of the presets built from the same numbers; missing optional
// keys take transformers' LlamaConfig defaults; every rejection names the origin, the key, the
// value and the fix; write_hf_config + read_hf_config through a temp file.
//
// LlamaConfig has no operator==; check_same_shape compares it field by field, with exact equality
// for the doubles, and head_dim by its resolved value: head_dim 0 means hidden_size / num_heads,
// so 0 and the explicit quotient are the same shape (the writer always writes the resolved value;
// the reader keeps 0 when the file has no head_dim).
#include "test/error_of.h"
#include "test/temp_dir.h"
#include "formats/config_json.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace config_json_test {

namespace fs = std::filesystem;

using pv::test::TempDir;  // test/temp_dir.h

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every architectural field of the two configs, one CHECK each (name excluded: callers check it).
inline void check_same_shape(const pv::LlamaConfig& got, const pv::LlamaConfig& want) {
    INFO("got '" << got.name << "', want '" << want.name << "'");
    CHECK(got.vocab_size == want.vocab_size);
    CHECK(got.hidden_size == want.hidden_size);
    CHECK(got.num_layers == want.num_layers);
    CHECK(got.num_heads == want.num_heads);
    CHECK(got.num_kv_heads == want.num_kv_heads);
    CHECK(got.head_dim_resolved() == want.head_dim_resolved());
    CHECK(got.ffn_size == want.ffn_size);
    CHECK(got.rms_norm_eps == want.rms_norm_eps);
    CHECK(got.rope_theta == want.rope_theta);
    CHECK(got.rope_scaling.factor == want.rope_scaling.factor);
    CHECK(got.rope_scaling.low_freq_factor == want.rope_scaling.low_freq_factor);
    CHECK(got.rope_scaling.high_freq_factor == want.rope_scaling.high_freq_factor);
    CHECK(got.rope_scaling.original_max_position_embeddings == want.rope_scaling.original_max_position_embeddings);
    CHECK(got.max_seq_len == want.max_seq_len);
    CHECK(got.tie_embeddings == want.tie_embeddings);
}

// A config.json object built key by key, in order, from raw JSON values, so one test can drop or
// replace a single key of an otherwise valid file.
using Fields = std::vector<std::pair<std::string, std::string>>;

// The required keys of a small valid Llama: hidden 48 / 6 heads = head_dim 8.
inline Fields minimal() {
    return {{"model_type", "\"llama\""}, {"vocab_size", "67"},       {"hidden_size", "48"},
            {"intermediate_size", "40"}, {"num_hidden_layers", "2"}, {"num_attention_heads", "6"}};
}

inline Fields with(Fields f, const std::string& key, const std::string& value) {
    for (auto& kv : f)
        if (kv.first == key) {
            kv.second = value;
            return f;
        }
    f.emplace_back(key, value);
    return f;
}

inline Fields without(Fields f, const std::string& key) {
    for (size_t i = 0; i < f.size(); ++i)
        if (f[i].first == key) f.erase(f.begin() + static_cast<std::ptrdiff_t>(i--));
    return f;
}

inline std::string text(const Fields& f) {
    std::string s = "{";
    for (size_t i = 0; i < f.size(); ++i) s += (i ? ", \"" : "\"") + f[i].first + "\": " + f[i].second;
    return s + "}";
}

const std::string kOrigin = "models/test/config.json";

// parse_hf_config(json, kOrigin) throws std::runtime_error whose message names the origin and
// contains every substring.
inline void expect_rejected(const std::string& json, const std::vector<std::string>& substrings) {
    INFO("config.json: " << json);
    std::string message;
    try {
        (void)pv::parse_hf_config(json, kOrigin);
    } catch (const std::runtime_error& e) {
        message = e.what();
    }
    INFO("message: " << message);
    REQUIRE(!message.empty());
    CHECK(message.find("'" + kOrigin + "'") != std::string::npos);
    for (const auto& s : substrings) {
        INFO("expected substring: " << s);
        CHECK(message.find(s) != std::string::npos);
    }
}

// Published config.json files, typed in from the Hugging Face Hub as published.

// meta-llama/Llama-3.2-1B config.json.
const char* const kLlama32_1B = R"json({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
)json";

// meta-llama/Llama-3.2-1B-Instruct config.json: the same shape, a list of eos ids.
const char* const kLlama32_1B_Instruct = R"json({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [
    128001,
    128008,
    128009
  ],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
)json";

// TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json.
const char* const kTinyLlamaChat = R"json({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
}
)json";

// TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json: written by an older
// transformers, without rope_theta or attention_bias (both take the defaults).
const char* const kTinyLlama3T = R"json({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": [
    "LlamaForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)json";

// HuggingFaceTB/SmolLM2-135M config.json: no head_dim (576 / 9 = 64), rope_theta an integer.
const char* const kSmolLM2_135M = R"json({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536,
  "is_llama_config": true,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_interleaved": false,
  "rope_scaling": null,
  "rope_theta": 100000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "vocab_size": 49152
}
)json";

// What hf_config_json must write for llama-3.2-1b, typed by hand: transformers' layout (sorted
// keys, 2-space indent, trailing newline) and its number forms.
const char* const kExpectedLlama32_1B = R"json({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
}
)json";

// And for tinyllama-1.1b in float32: head_dim 2048 / 32 = 64 written although the preset leaves
// it 0, rope_scaling null.
const char* const kExpectedTinyLlamaF32 = R"json({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "vocab_size": 32000
}
)json";

// A random valid shape with doubles that use every mantissa bit.
inline pv::LlamaConfig random_config(std::mt19937_64& rng, int index) {
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    auto log_uniform = [&](double lo, double hi) {
        return std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi))(rng));
    };
    pv::LlamaConfig c;
    c.name = "random-" + std::to_string(index);
    c.vocab_size = uniform(1, 300000);
    c.num_heads = uniform(1, 64);
    std::vector<int> divisors;
    for (int d = 1; d <= c.num_heads; ++d)
        if (c.num_heads % d == 0) divisors.push_back(d);
    c.num_kv_heads = divisors[static_cast<size_t>(uniform(0, static_cast<int>(divisors.size()) - 1))];
    const int head = 2 * uniform(1, 128);
    if (uniform(0, 1) == 0) {
        c.head_dim = 0;
        c.hidden_size = c.num_heads * head;
    } else {
        c.head_dim = head;
        c.hidden_size = uniform(1, 16384);
    }
    c.num_layers = uniform(1, 200);
    c.ffn_size = uniform(1, 60000);
    c.rms_norm_eps = log_uniform(1e-12, 1e-2);
    c.rope_theta = log_uniform(1.0, 1e8);
    if (uniform(0, 1) == 1) {
        c.rope_scaling.factor = log_uniform(1.0, 64.0);
        c.rope_scaling.low_freq_factor = log_uniform(0.1, 4.0);
        c.rope_scaling.high_freq_factor = c.rope_scaling.low_freq_factor + log_uniform(0.01, 16.0);
        c.rope_scaling.original_max_position_embeddings = uniform(1, 1 << 20);
    }
    c.max_seq_len = uniform(1, 1 << 20);
    c.tie_embeddings = uniform(0, 1) == 1;
    return c;
}

}  // namespace config_json_test

using namespace config_json_test;

TEST_CASE("every preset round-trips through config.json text", "[config_json]") {
    for (const std::string& name : pv::preset_names()) {
        const pv::LlamaConfig& p = pv::preset(name);
        for (const char* dtype : {"bfloat16", "float32", "float64"}) {
            INFO(name << " " << dtype);
            const std::string json = pv::hf_config_json(p, dtype);
            CHECK(json.find(std::string("\"torch_dtype\": \"") + dtype + "\"") != std::string::npos);
            const pv::LlamaConfig back = pv::parse_hf_config(json, "round trip of " + name);
            CHECK(back.name == "round trip of " + name);
            check_same_shape(back, p);
            // The writer spells head_dim out, so the reader sees it set explicitly.
            CHECK(back.head_dim == p.head_dim_resolved());
            // Writing the parsed config again gives the same bytes.
            CHECK(pv::hf_config_json(back, dtype) == json);
        }
    }
}

TEST_CASE("the written text is transformers' layout, byte for byte", "[config_json]") {
    CHECK(pv::hf_config_json(pv::preset("llama-3.2-1b")) == kExpectedLlama32_1B);
    CHECK(pv::hf_config_json(pv::preset("llama-3.2-1b"), "bfloat16") == kExpectedLlama32_1B);
    CHECK(pv::hf_config_json(pv::preset("tinyllama-1.1b"), "float32") == kExpectedTinyLlamaF32);
    // No token ids: a LlamaConfig does not know them.
    const std::string json = pv::hf_config_json(pv::preset("test-tiny"));
    CHECK(json.find("token_id") == std::string::npos);
}

TEST_CASE("random shapes and doubles round-trip exactly", "[config_json]") {
    std::mt19937_64 rng(20240917);
    for (int i = 0; i < 300; ++i) {
        const pv::LlamaConfig c = random_config(rng, i);
        INFO("rms_norm_eps " << c.rms_norm_eps << ", rope_theta " << c.rope_theta);
        REQUIRE(pv::validate(c).empty());
        const pv::LlamaConfig back = pv::parse_hf_config(pv::hf_config_json(c), c.name);
        CHECK(back.name == c.name);
        check_same_shape(back, c);
    }
}

TEST_CASE("published config.json files parse to the presets' shapes", "[config_json]") {
    struct Published {
        const char* origin;
        const char* json;
        const char* preset;
    };
    const Published files[] = {
        {"meta-llama/Llama-3.2-1B", kLlama32_1B, "llama-3.2-1b"},
        {"meta-llama/Llama-3.2-1B-Instruct", kLlama32_1B_Instruct, "llama-3.2-1b"},
        {"TinyLlama/TinyLlama-1.1B-Chat-v1.0", kTinyLlamaChat, "tinyllama-1.1b"},
        {"TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", kTinyLlama3T, "tinyllama-1.1b"},
        {"HuggingFaceTB/SmolLM2-135M", kSmolLM2_135M, "smollm2-135m"},
    };
    for (const Published& f : files) {
        INFO(f.origin);
        const pv::LlamaConfig c = pv::parse_hf_config(f.json, f.origin);
        CHECK(c.name == f.origin);
        check_same_shape(c, pv::preset(f.preset));
    }

    // The numbers typed out, independently of the presets.
    const pv::LlamaConfig l = pv::parse_hf_config(kLlama32_1B, "llama");
    CHECK(l.vocab_size == 128256);
    CHECK(l.hidden_size == 2048);
    CHECK(l.ffn_size == 8192);
    CHECK(l.num_layers == 16);
    CHECK(l.num_heads == 32);
    CHECK(l.num_kv_heads == 8);
    CHECK(l.head_dim == 64);
    CHECK(l.rms_norm_eps == 1e-5);
    CHECK(l.rope_theta == 500000.0);
    CHECK(l.rope_scaling.factor == 32.0);
    CHECK(l.rope_scaling.low_freq_factor == 1.0);
    CHECK(l.rope_scaling.high_freq_factor == 4.0);
    CHECK(l.rope_scaling.original_max_position_embeddings == 8192);
    CHECK(l.max_seq_len == 131072);
    CHECK(l.tie_embeddings);

    const pv::LlamaConfig t = pv::parse_hf_config(kTinyLlama3T, "tiny");
    CHECK(t.head_dim == 0);  // not in the file: derived, 2048 / 32
    CHECK(t.head_dim_resolved() == 64);
    CHECK(t.rope_theta == 10000.0);  // not in the file: transformers' default
    CHECK_FALSE(t.rope_scaling.enabled());
    CHECK_FALSE(t.tie_embeddings);

    const pv::LlamaConfig s = pv::parse_hf_config(kSmolLM2_135M, "smol");
    CHECK(s.rope_theta == 100000.0);  // written as the integer 100000
    CHECK(s.head_dim_resolved() == 64);
    CHECK(s.tie_embeddings);
}

TEST_CASE("missing optional keys take transformers' LlamaConfig defaults", "[config_json]") {
    SECTION("absent") {
        const pv::LlamaConfig c = pv::parse_hf_config(text(minimal()), "minimal");
        CHECK(c.name == "minimal");
        CHECK(c.vocab_size == 67);
        CHECK(c.hidden_size == 48);
        CHECK(c.ffn_size == 40);
        CHECK(c.num_layers == 2);
        CHECK(c.num_heads == 6);
        CHECK(c.num_kv_heads == 6);  // num_attention_heads
        CHECK(c.head_dim == 0);      // hidden_size / num_attention_heads ...
        CHECK(c.head_dim_resolved() == 8);
        CHECK(c.rms_norm_eps == 1e-6);
        CHECK(c.rope_theta == 10000.0);
        CHECK_FALSE(c.rope_scaling.enabled());
        CHECK(c.rope_scaling.factor == 0.0);
        CHECK(c.max_seq_len == 2048);
        CHECK_FALSE(c.tie_embeddings);
    }
    SECTION("null where transformers documents None") {
        Fields f = with(minimal(), "num_key_value_heads", "null");
        f = with(f, "head_dim", "null");
        f = with(f, "rope_scaling", "null");
        const pv::LlamaConfig c = pv::parse_hf_config(text(f), "nulls");
        CHECK(c.num_kv_heads == 6);
        CHECK(c.head_dim == 0);
        CHECK_FALSE(c.rope_scaling.enabled());
    }
    SECTION("architectures alone identify a Llama; unknown keys are ignored") {
        Fields f = without(minimal(), "model_type");
        f = with(f, "architectures", "[\"LlamaForCausalLM\"]");
        f = with(f, "eos_token_id", "[1, 2, 3]");
        f = with(f, "pad_token_id", "null");
        f = with(f, "torch_dtype", "\"float16\"");
        f = with(f, "some_future_key", "{\"nested\": [1, {\"x\": null}]}");
        const pv::LlamaConfig c = pv::parse_hf_config(text(f), "arch");
        CHECK(c.num_kv_heads == 6);
        // model_type another name, architectures Llama: accepted (the architecture decides).
        f = with(f, "model_type", "\"llama_custom\"");
        CHECK_NOTHROW(pv::parse_hf_config(text(f), "arch"));
    }
    SECTION("explicit values win over the defaults") {
        Fields f = with(minimal(), "num_key_value_heads", "2");
        f = with(f, "head_dim", "10");
        f = with(f, "rms_norm_eps", "3.5e-7");
        f = with(f, "rope_theta", "250000");
        f = with(f, "max_position_embeddings", "77");
        f = with(f, "tie_word_embeddings", "true");
        f = with(f, "hidden_act", "\"silu\"");
        f = with(f, "attention_bias", "false");
        f = with(f, "mlp_bias", "false");
        const pv::LlamaConfig c = pv::parse_hf_config(text(f), "explicit");
        CHECK(c.num_kv_heads == 2);
        CHECK(c.head_dim == 10);
        CHECK(c.rms_norm_eps == 3.5e-7);
        CHECK(c.rope_theta == 250000.0);
        CHECK(c.max_seq_len == 77);
        CHECK(c.tie_embeddings);
    }
}

TEST_CASE("rope_scaling and rope_parameters forms", "[config_json]") {
    const std::string llama3 =
        "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 0.5, \"high_freq_factor\": 2.5, "
        "\"original_max_position_embeddings\": 4096}";
    SECTION("llama3 under rope_type") {
        const pv::LlamaConfig c = pv::parse_hf_config(text(with(minimal(), "rope_scaling", llama3)), "r");
        CHECK(c.rope_scaling.factor == 8.0);
        CHECK(c.rope_scaling.low_freq_factor == 0.5);
        CHECK(c.rope_scaling.high_freq_factor == 2.5);
        CHECK(c.rope_scaling.original_max_position_embeddings == 4096);
    }
    SECTION("llama3 under the older key \"type\"") {
        const std::string old =
            "{\"type\": \"llama3\", \"factor\": 16, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
            "\"original_max_position_embeddings\": 8192}";
        const pv::LlamaConfig c = pv::parse_hf_config(text(with(minimal(), "rope_scaling", old)), "r");
        CHECK(c.rope_scaling.factor == 16.0);
        CHECK(c.rope_scaling.low_freq_factor == 1.0);
        CHECK(c.rope_scaling.high_freq_factor == 4.0);
        CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
    }
    SECTION("rope_type default is no scaling") {
        const pv::LlamaConfig c =
            pv::parse_hf_config(text(with(minimal(), "rope_scaling", "{\"rope_type\": \"default\"}")), "r");
        CHECK_FALSE(c.rope_scaling.enabled());
    }
    SECTION("transformers 5 rope_parameters, whose rope_theta wins") {
        Fields f = with(minimal(), "rope_theta", "1234.0");
        f = with(f, "rope_parameters",
                 "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, \"low_freq_factor\": 1.0, "
                 "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}");
        const pv::LlamaConfig c = pv::parse_hf_config(text(f), "v5");
        CHECK(c.rope_theta == 500000.0);
        CHECK(c.rope_scaling.factor == 32.0);
        CHECK(c.rope_scaling.low_freq_factor == 1.0);
        CHECK(c.rope_scaling.high_freq_factor == 4.0);
        CHECK(c.rope_scaling.original_max_position_embeddings == 8192);

        const pv::LlamaConfig d = pv::parse_hf_config(
            text(with(minimal(), "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 100000.0}")), "v5");
        CHECK(d.rope_theta == 100000.0);
        CHECK_FALSE(d.rope_scaling.enabled());

        // Both keys, agreeing: fine.
        Fields both = with(minimal(), "rope_scaling", llama3);
        both = with(both, "rope_parameters", llama3);
        CHECK(pv::parse_hf_config(text(both), "both").rope_scaling.factor == 8.0);
    }
}

TEST_CASE("every rejection names the origin, the key, the value and the fix", "[config_json]") {
    SECTION("not JSON, not an object") {
        expect_rejected("{\"model_type\": \"llama\",", {"not valid JSON", "re-export"});
        expect_rejected("", {"not valid JSON"});
        expect_rejected("[1, 2]", {"an array", "JSON object"});
    }
    SECTION("another architecture") {
        expect_rejected(text(with(minimal(), "model_type", "\"mistral\"")),
                        {"model_type = \"mistral\"", "not a Llama model", "LlamaForCausalLM"});
        Fields f = with(minimal(), "model_type", "\"qwen2\"");
        f = with(f, "architectures", "[\"Qwen2ForCausalLM\"]");
        expect_rejected(text(f),
                        {"model_type = \"qwen2\"", "architectures = [\"Qwen2ForCausalLM\"]", "not a Llama model"});
        expect_rejected(text(without(minimal(), "model_type")),
                        {"neither model_type nor architectures", "\"model_type\": \"llama\""});
        expect_rejected(text(with(minimal(), "model_type", "7")), {"model_type = 7", "expected a string"});
        expect_rejected(text(with(without(minimal(), "model_type"), "architectures", "\"LlamaForCausalLM\"")),
                        {"architectures = \"LlamaForCausalLM\"", "a string", "expected an array of strings"});
    }
    SECTION("a required key missing or null") {
        for (const char* key :
             {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
            INFO(key);
            expect_rejected(text(without(minimal(), key)),
                            {std::string("missing required key ") + key, "published config.json"});
            expect_rejected(text(with(minimal(), key, "null")), {std::string(key) + " = null", "required"});
        }
    }
    SECTION("a key of the wrong JSON type") {
        expect_rejected(text(with(minimal(), "hidden_size", "\"48\"")),
                        {"hidden_size = \"48\"", "is a string, expected an integer", "without quotes"});
        expect_rejected(text(with(minimal(), "vocab_size", "67.5")),
                        {"vocab_size = 67.5", "not a whole number", "integer"});
        expect_rejected(text(with(minimal(), "num_hidden_layers", "true")),
                        {"num_hidden_layers = true", "a boolean, expected an integer"});
        expect_rejected(text(with(minimal(), "num_key_value_heads", "[2]")),
                        {"num_key_value_heads = [2]", "an array, expected an integer"});
        expect_rejected(text(with(minimal(), "max_position_embeddings", "null")),
                        {"max_position_embeddings = null", "expected an integer"});
        expect_rejected(text(with(minimal(), "rms_norm_eps", "\"1e-5\"")),
                        {"rms_norm_eps = \"1e-5\"", "a string, expected a number", "without quotes"});
        expect_rejected(text(with(minimal(), "rope_theta", "{}")), {"rope_theta = {}", "expected a number"});
        expect_rejected(text(with(minimal(), "tie_word_embeddings", "1")),
                        {"tie_word_embeddings = 1", "an integer, expected a boolean", "true or false"});
        expect_rejected(text(with(minimal(), "attention_bias", "\"false\"")),
                        {"attention_bias = \"false\"", "expected a boolean"});
        expect_rejected(text(with(minimal(), "hidden_act", "0")), {"hidden_act = 0", "expected a string"});
        expect_rejected(text(with(minimal(), "rope_scaling", "8.0")),
                        {"rope_scaling = 8.0", "expected an object or null", "rope_type"});
        expect_rejected(text(with(minimal(), "rope_scaling",
                                  "{\"rope_type\": \"llama3\", \"factor\": \"8\", \"low_freq_factor\": 1, "
                                  "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}")),
                        {"rope_scaling.factor = \"8\"", "expected a number"});
        expect_rejected(text(with(minimal(), "rope_scaling",
                                  "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                                  "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192.5}")),
                        {"rope_scaling.original_max_position_embeddings = 8192.5", "not a whole number"});
    }
    SECTION("integers out of range") {
        expect_rejected(text(with(minimal(), "vocab_size", "10000000000")),
                        {"vocab_size = 10000000000", "too large", "2147483647"});
        expect_rejected(text(with(minimal(), "num_key_value_heads", "-10000000000")),
                        {"num_key_value_heads = -10000000000", "out of range"});
    }
    SECTION("unsupported RoPE scaling") {
        for (const char* type : {"linear", "dynamic", "yarn", "longrope"}) {
            INFO(type);
            expect_rejected(text(with(minimal(), "rope_scaling",
                                      std::string("{\"rope_type\": \"") + type + "\", \"factor\": 2.0}")),
                            {std::string("rope_scaling.rope_type = \"") + type + "\"", "not supported", "only llama3",
                             "rope_scaling null"});
        }
        expect_rejected(text(with(minimal(), "rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}")),
                        {"rope_scaling.type = \"linear\"", "only llama3"});
        expect_rejected(text(with(minimal(), "rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4.0}")),
                        {"rope_parameters.rope_type = \"yarn\"", "only llama3"});
        expect_rejected(text(with(minimal(), "rope_scaling", "{\"factor\": 2.0}")),
                        {"rope_scaling = {\"factor\":2.0}", "has no rope_type", "\"llama3\""});
        expect_rejected(text(with(minimal(), "rope_scaling", "{\"rope_type\": 3}")),
                        {"rope_scaling.rope_type = 3", "expected a string"});
    }
    SECTION("llama3 scaling missing a field, or with factor 0") {
        const Fields full = {{"rope_type", "\"llama3\""},
                             {"factor", "8.0"},
                             {"low_freq_factor", "1.0"},
                             {"high_freq_factor", "4.0"},
                             {"original_max_position_embeddings", "8192"}};
        for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
            INFO(key);
            expect_rejected(text(with(minimal(), "rope_scaling", text(without(full, key)))),
                            {std::string("is missing ") + key, "llama3 scaling needs"});
        }
        expect_rejected(text(with(minimal(), "rope_scaling", text(with(full, "factor", "0")))),
                        {"rope_scaling.factor = 0", "must be positive", "null for no scaling"});
    }
    SECTION("rope_scaling and rope_parameters that disagree") {
        const std::string a =
            "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
            "\"original_max_position_embeddings\": 8192}";
        Fields f = with(minimal(), "rope_scaling", a);
        f = with(f, "rope_parameters", "{\"rope_type\": \"default\"}");
        expect_rejected(text(f), {"rope_scaling = ", "rope_parameters = ", "disagree", "remove rope_scaling"});
    }
    SECTION("biases and activations the model does not have") {
        expect_rejected(text(with(minimal(), "attention_bias", "true")),
                        {"attention_bias = true", "no biases", "attention_bias false"});
        expect_rejected(text(with(minimal(), "mlp_bias", "true")), {"mlp_bias = true", "no biases", "mlp_bias false"});
        expect_rejected(text(with(minimal(), "hidden_act", "\"gelu\"")),
                        {"hidden_act = \"gelu\"", "not supported", "hidden_act \"silu\""});
    }
    SECTION("head_dim given as zero or negative") {
        expect_rejected(text(with(minimal(), "head_dim", "0")),
                        {"head_dim = 0", "must be positive", "remove head_dim"});
        expect_rejected(text(with(minimal(), "head_dim", "-8")), {"head_dim = -8", "must be positive"});
    }
    SECTION("a shape that does not validate") {
        expect_rejected(text(with(minimal(), "num_key_value_heads", "4")),
                        {"invalid model config", "num_kv_heads = 4 does not divide num_heads = 6",
                         "(in config.json num_heads is num_attention_heads, num_kv_heads is num_key_value_heads)"});
        expect_rejected(text(with(minimal(), "hidden_size", "50")),
                        {"invalid model config", "hidden_size = 50 is not divisible by num_heads = 6"});
        Fields f = with(minimal(), "rms_norm_eps", "0");
        f = with(f, "vocab_size", "0");
        expect_rejected(text(f), {"(2 problems)", "rms_norm_eps = 0", "vocab_size = 0"});
        expect_rejected(text(with(minimal(), "rope_scaling",
                                  "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, "
                                  "\"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}")),
                        {"rope_scaling.high_freq_factor = 1 must be greater than rope_scaling.low_freq_factor = 4"});
    }
}

TEST_CASE("hf_config_json rejects a torch_dtype or config it cannot write", "[config_json]") {
    REQUIRE_THROWS_AS(pv::hf_config_json(pv::preset("test-tiny"), "float16"), std::invalid_argument);
    REQUIRE_THROWS_WITH(pv::hf_config_json(pv::preset("test-tiny"), "float16"),
                        Catch::Contains("'float16'") && Catch::Contains("\"bfloat16\", \"float32\" or \"float64\""));
    pv::LlamaConfig bad = pv::preset("test-tiny");
    bad.name = "broken";
    bad.num_kv_heads = 4;
    REQUIRE_THROWS_AS(pv::hf_config_json(bad), std::invalid_argument);
    REQUIRE_THROWS_WITH(pv::hf_config_json(bad), Catch::Contains("'broken'") && Catch::Contains("num_kv_heads = 4"));
}

TEST_CASE("write_hf_config and read_hf_config through a file", "[config_json]") {
    TempDir dir;
    const std::string path = dir.file("config.json");
    const pv::LlamaConfig& p = pv::preset("llama-3.2-1b");
    pv::write_hf_config(path, p);
    CHECK_FALSE(fs::exists(path + ".tmp"));
    CHECK(read_text(path) == kExpectedLlama32_1B);
    const pv::LlamaConfig back = pv::read_hf_config(path);
    CHECK(back.name == path);
    check_same_shape(back, p);

    // Overwrites an existing file whole, in the requested dtype.
    pv::write_hf_config(path, pv::preset("tinyllama-1.1b"), "float32");
    CHECK(read_text(path) == kExpectedTinyLlamaF32);
    check_same_shape(pv::read_hf_config(path), pv::preset("tinyllama-1.1b"));

    // Argument errors leave the file alone.
    CHECK_THROWS_AS(pv::write_hf_config(path, p, "int8"), std::invalid_argument);
    CHECK(read_text(path) == kExpectedTinyLlamaF32);
    CHECK_FALSE(fs::exists(path + ".tmp"));

    // A published file read from disk; its errors name the path.
    const std::string published = dir.file("smollm2.json");
    { std::ofstream(published, std::ios::binary) << kSmolLM2_135M; }
    check_same_shape(pv::read_hf_config(published), pv::preset("smollm2-135m"));
    const std::string mistral = dir.file("mistral.json");
    { std::ofstream(mistral, std::ios::binary) << text(with(minimal(), "model_type", "\"mistral\"")); }
    REQUIRE_THROWS_AS(pv::read_hf_config(mistral), std::runtime_error);
    REQUIRE_THROWS_WITH(pv::read_hf_config(mistral),
                        Catch::Contains("'" + mistral + "'") && Catch::Contains("\"mistral\""));

    const std::string missing = dir.file("nope/config.json");
    REQUIRE_THROWS_AS(pv::read_hf_config(missing), std::runtime_error);
    REQUIRE_THROWS_WITH(pv::read_hf_config(missing), Catch::Contains("'" + missing + "'") &&
                                                         Catch::Contains("cannot open") &&
                                                         Catch::Contains("No such file"));
    REQUIRE_THROWS_WITH(pv::read_hf_config(dir.path.string()),
                        Catch::Contains("is a directory") && Catch::Contains("config.json file inside it"));
    const std::string fifo = dir.file("fifo.json");  // refused at once, not waited on
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    REQUIRE_THROWS_WITH(pv::read_hf_config(fifo), Catch::Contains(fifo) && Catch::Contains("FIFO"));
    // Writing into a directory that does not exist fails with the atomic writer's message.
    REQUIRE_THROWS_AS(pv::write_hf_config(missing, p), std::runtime_error);
    REQUIRE_THROWS_WITH(pv::write_hf_config(missing, p), Catch::Contains("config.json '"));
}

TEST_CASE("generation_config.json: written as transformers reads it, read back with one or several EOS ids",
          "[config_json]") {
    const pv::test::TempDir temp("genconfig");
    const std::string dir = temp.path.string(), path = temp.file("generation_config.json");
    CHECK(pv::generation_config_json({1, {2}}) == "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2\n}\n");
    CHECK(pv::generation_config_json({-1, {128001, 128009}}) ==
          "{\n  \"eos_token_id\": [\n    128001,\n    128009\n  ]\n}\n");
    pv::write_generation_config(path, {128000, {128001, 128008, 128009}});
    pv::GenerationConfig g = pv::read_generation_config(path);
    CHECK(g.bos_token_id == 128000);
    CHECK(g.eos_token_ids == std::vector<int>{128001, 128008, 128009});
    std::ofstream(path) << "{\"bos_token_id\": null, \"eos_token_id\": 2, \"do_sample\": true, \"temperature\": 0.6}";
    g = pv::read_generation_config(path);
    CHECK(g.bos_token_id == -1);
    CHECK(g.eos_token_ids == std::vector<int>{2});
    std::ofstream(path) << "{\"eos_token_id\": \"</s>\"}";
    try {
        (void)pv::read_generation_config(path);
        FAIL("read a string as a token id");
    } catch (const std::runtime_error& e) {
        CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("eos_token_id") && Catch::Contains("token id"));
    }
    // torch_dtype, and transformers 5's dtype.
    std::ofstream(dir + "/config.json") << pv::hf_config_json(pv::preset("test-tiny"), "float32");
    CHECK(pv::read_hf_torch_dtype(dir + "/config.json") == "float32");
    std::ofstream(dir + "/config.json") << "{\"dtype\": \"bfloat16\"}";
    CHECK(pv::read_hf_torch_dtype(dir + "/config.json") == "bfloat16");
    std::ofstream(dir + "/config.json") << "{\"model_type\": \"llama\"}";
    CHECK(pv::read_hf_torch_dtype(dir + "/config.json").empty());
}

// Issue 28 row 6: a model directory's generation_config.json is checked against its config.json
// when the directory is first read (read_model_dir_config: --init-from), every id in [0, vocab_size).
TEST_CASE("read_model_dir_config: generation_config.json's ids must be tokens of the model", "[config_json]") {
    const pv::test::TempDir temp("model_dir_ids");
    const std::string dir = temp.path.string(), gen = temp.file("generation_config.json");
    std::ofstream(dir + "/config.json") << pv::hf_config_json(pv::preset("test-tiny"));  // vocab_size 67
    const auto refused = [&](const std::string& text, const std::vector<std::string>& says) {
        std::ofstream(gen, std::ios::trunc) << text;
        const std::string what = pv::test::error_of<std::runtime_error>([&] { pv::read_model_dir_config(dir); });
        INFO(text << "\n" << what);
        CHECK_THAT(what, Catch::Contains("generation_config.json '" + gen + "'"));
        for (const std::string& s : says) CHECK_THAT(what, Catch::Contains(s));
    };
    refused("{\"eos_token_id\": 1000000000000}", {"eos_token_id = 1000000000000", "is not a token id"});
    refused("{\"eos_token_id\": [-5, 2]}", {"eos_token_id = -5", "is not a token id"});
    refused("{\"eos_token_id\": [2, 67]}",
            {"eos_token_id = 67 is not a token of this model, whose ids are 0 to 66 (config.json vocab_size 67)"});
    refused("{\"bos_token_id\": 70, \"eos_token_id\": 2}", {"bos_token_id = 70"});
    refused("{\"pad_token_id\": 67, \"eos_token_id\": 2}", {"pad_token_id = 67"});
    std::ofstream(gen, std::ios::trunc) << "{\"bos_token_id\": 0, \"eos_token_id\": [66, 1], \"pad_token_id\": null}";
    CHECK(pv::read_model_dir_config(dir).vocab_size == 67);
    fs::remove(gen);  // none: nothing to check
    CHECK(pv::read_model_dir_config(dir).vocab_size == 67);
}
