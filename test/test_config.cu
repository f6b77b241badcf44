// LlamaConfig: presets validate, parameter counts match the published model sizes, every
// validation error names its field and value, unknown presets are rejected with the known list;
// storage type names (--dtype) parse to the DType and the element type with_dtype dispatches to.
#include "model/config.h"
#include "model/dtype.h"
#include "test/check.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace config_test {

// The messages of validate(c), joined for INFO.
inline std::string joined(const std::vector<std::string>& errors) {
    std::string s;
    for (const auto& e : errors) s += e + "\n";
    return s;
}

// Breaking one field of a valid config gives exactly one message, containing every substring.
inline void expect_one_error(const pv::LlamaConfig& c, const std::vector<std::string>& substrings) {
    const auto errors = pv::validate(c);
    INFO(joined(errors));
    REQUIRE(errors.size() == 1);
    for (const auto& s : substrings) {
        INFO("expected substring: " << s);
        CHECK(errors[0].find(s) != std::string::npos);
    }
}

inline pv::LlamaConfig tiny() { return pv::preset("test-tiny"); }

// A published model's size: the figure its model card or Hub page states, and the exact count of
// the parameters in its safetensors files, which parameter_count must reproduce.
struct Published {
    const char* preset;
    double stated;
    long long exact;
};

}  // namespace config_test

using namespace config_test;

TEST_CASE("preset names are the documented list", "[config]") {
    const std::vector<std::string> expected = {"test-tiny",    "test-tied",      "stories260K",  "host-11m",
                                               "smollm2-135m", "tinyllama-1.1b", "llama-3.2-1b", "llama-2-7b",
                                               "llama-3.1-8b", "codellama-34b",  "llama-2-70b"};
    REQUIRE(pv::preset_names() == expected);
    for (const auto& n : expected) {
        CHECK(pv::preset(n).name == n);
        CHECK(&pv::preset(n) == &pv::preset(n));  // one object per preset, safe to keep a reference
    }
}

TEST_CASE("every preset validates cleanly", "[config]") {
    for (const auto& n : pv::preset_names()) {
        const auto errors = pv::validate(pv::preset(n));
        INFO(n << ":\n" << joined(errors));
        CHECK(errors.empty());
        CHECK_NOTHROW(pv::validate_or_throw(pv::preset(n)));
    }
}

TEST_CASE("derived widths", "[config]") {
    const auto& t = pv::preset("test-tiny");
    CHECK(t.head_dim_resolved() == 8);
    CHECK(t.q_width() == 48);
    CHECK(t.kv_width() == 16);
    CHECK(t.qkv_width() == 80);

    const auto& l2 = pv::preset("llama-2-7b");  // head_dim not set: 4096 / 32
    CHECK(l2.head_dim == 0);
    CHECK(l2.head_dim_resolved() == 128);
    CHECK(l2.qkv_width() == 3 * 4096);

    const auto& l3 = pv::preset("llama-3.1-8b");
    CHECK(l3.q_width() == 4096);
    CHECK(l3.kv_width() == 1024);
    CHECK(l3.qkv_width() == 6144);

    const auto& smol = pv::preset("smollm2-135m");
    CHECK(smol.head_dim_resolved() == 64);
    CHECK(smol.qkv_width() == 576 + 2 * 192);

    // An explicit head_dim makes the attention width differ from hidden_size.
    pv::LlamaConfig c = tiny();
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    REQUIRE(pv::validate(c).empty());
    CHECK(c.q_width() == 64);
    CHECK(c.kv_width() == 32);
    CHECK(c.qkv_width() == 128);
}

TEST_CASE("rope scaling is set exactly for the Llama 3 presets", "[config]") {
    for (const auto& n : pv::preset_names()) {
        const auto& c = pv::preset(n);
        INFO(n);
        CHECK(c.rope_scaling.enabled() == (n == "llama-3.2-1b" || n == "llama-3.1-8b"));
    }
    const auto& a = pv::preset("llama-3.2-1b").rope_scaling;
    CHECK(a.factor == 32.0);
    CHECK(a.low_freq_factor == 1.0);
    CHECK(a.high_freq_factor == 4.0);
    CHECK(a.original_max_position_embeddings == 8192);
    const auto& b = pv::preset("llama-3.1-8b").rope_scaling;
    CHECK(b.factor == 8.0);
    CHECK(b.low_freq_factor == 1.0);
    CHECK(b.high_freq_factor == 4.0);
    CHECK(b.original_max_position_embeddings == 8192);
    CHECK(pv::preset("llama-3.1-8b").rope_theta == 500000.0);
    CHECK(pv::preset("codellama-34b").rope_theta == 1000000.0);
    CHECK(pv::preset("smollm2-135m").rope_theta == 100000.0);
}

TEST_CASE("parameter counts of the small models, by hand", "[config]") {
    // test-tiny: V 67, H 48, L 2, q 6·8 = 48, kv 2·8 = 16, F 40, untied.
    //   block = 2·48 (norms) + 48·48 (Wq) + 2·16·48 (Wk, Wv) + 48·48 (Wo) + 3·40·48 (MLP)
    //         = 96 + 2304 + 1536 + 2304 + 5760 = 12000
    //   total = 67·48 (embedding) + 67·48 (lm_head) + 2·12000 + 48 = 3216 + 3216 + 24000 + 48 = 30480
    CHECK(pv::block_parameter_count(pv::preset("test-tiny")) == 12000);
    CHECK(pv::parameter_count(pv::preset("test-tiny")) == 30480);
    // test-tied: V 65, L 3, tied: 65·48 + 3·12000 + 48 = 3120 + 36000 + 48 = 39168
    CHECK(pv::parameter_count(pv::preset("test-tied")) == 39168);
    // stories260K: V 512, H 64, L 5, q 64, kv 4·8 = 32, F 172, tied.
    //   block = 128 + 4096 + 2·2048 + 4096 + 3·172·64 = 128 + 4096 + 4096 + 4096 + 33024 = 45440
    //   total = 512·64 + 5·45440 + 64 = 32768 + 227200 + 64 = 260032 ("260K" in llama2.c's README)
    CHECK(pv::parameter_count(pv::preset("stories260K")) == 260032);
    CHECK(std::abs(pv::parameter_count(pv::preset("stories260K")) - 260e3) / 260e3 < 0.005);
    // host-11m: V 4096, H 384, L 6, q 6·64 = 384, kv 2·64 = 128, F 1024, tied.
    //   block = 2·384 + 384·384 + 2·128·384 + 384·384 + 3·1024·384
    //         = 768 + 147456 + 98304 + 147456 + 1179648 = 1573632
    //   total = 4096·384 + 6·1573632 + 384 = 1572864 + 9441792 + 384 = 11015040
    CHECK(pv::block_parameter_count(pv::preset("host-11m")) == 1573632);
    CHECK(pv::parameter_count(pv::preset("host-11m")) == 11015040);
}

TEST_CASE("parameter counts match the published model sizes", "[config]") {
    const Published published[] = {
        // SmolLM2-135M: 134.5M, the safetensors total of HuggingFaceTB/SmolLM2-135M (134,515,008;
        // the Hub page rounds it to 135M). 49152·576 + 30·3,540,096 + 576, tied.
        {"smollm2-135m", 134.5e6, 134'515'008LL},
        // TinyLlama 1.1B: "1.1B" on the TinyLlama/TinyLlama-1.1B-Chat-v1.0 card; the safetensors
        // hold 1,100,048,384. 2·32000·2048 + 22·44,044,288 + 2048.
        {"tinyllama-1.1b", 1.100e9, 1'100'048'384LL},
        // Llama 3.2 1B: 1.24B on the meta-llama/Llama-3.2-1B Hub page, "1.23B" in Meta's model card
        // table; the safetensors hold 1,235,814,400. 128256·2048 + 16·60,821,504 + 2048, tied.
        {"llama-3.2-1b", 1.236e9, 1'235'814'400LL},
        // Llama 2 7B: 6.74B on the meta-llama/Llama-2-7b-hf Hub page (6,738,415,616).
        // 2·32000·4096 + 32·202,383,360 + 4096.
        {"llama-2-7b", 6.74e9, 6'738'415'616LL},
        // Llama 3.1 8B: 8.03B on the meta-llama/Llama-3.1-8B Hub page (8,030,261,248).
        // 2·128256·4096 + 32·218,112,000 + 4096.
        {"llama-3.1-8b", 8.03e9, 8'030'261'248LL},
        // Code Llama 34B: 33.7B on the codellama/CodeLlama-34b-hf Hub page (33,743,970,304, also the
        // num_parameters Together lists for Phind-CodeLlama-34B, the same architecture).
        // 2·32000·8192 + 48·692,076,544 + 8192.
        {"codellama-34b", 33.7e9, 33'743'970'304LL},
        // Llama 2 70B: 69B on the meta-llama/Llama-2-70b-hf Hub page (68,976,648,192).
        // 2·32000·8192 + 80·855,654,400 + 8192.
        {"llama-2-70b", 68.98e9, 68'976'648'192LL},
    };
    for (const auto& p : published) {
        const auto& c = pv::preset(p.preset);
        const long long n = pv::parameter_count(c);
        INFO(p.preset << ": parameter_count " << n << ", published " << p.stated);
        CHECK(std::abs(double(n) - p.stated) / p.stated < 0.005);
        CHECK(n == p.exact);
        // The total is the sum of its parts.
        const long long emb = (long long)c.vocab_size * c.hidden_size;
        CHECK(n == emb * (c.tie_embeddings ? 1 : 2) + c.num_layers * pv::block_parameter_count(c) + c.hidden_size);
    }
}

TEST_CASE("GQA: num_kv_heads must divide num_heads", "[config]") {
    pv::LlamaConfig c = tiny();
    c.hidden_size = 64;
    c.num_heads = 8;
    c.head_dim = 0;
    c.num_kv_heads = 3;
    expect_one_error(c, {"num_kv_heads = 3", "does not divide num_heads = 8", "use 1, 2, 4 or 8"});
    c.num_kv_heads = 16;  // more KV heads than query heads
    expect_one_error(c, {"num_kv_heads = 16", "num_heads = 8"});
    c.num_kv_heads = 8;  // plain multi-head attention
    CHECK(pv::validate(c).empty());
    c.num_kv_heads = 1;  // multi-query attention
    CHECK(pv::validate(c).empty());
}

TEST_CASE("head_dim: derived only from a divisible hidden_size, even, not negative", "[config]") {
    pv::LlamaConfig c = tiny();
    c.hidden_size = 100;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 0;
    expect_one_error(
        c, {"hidden_size = 100", "not divisible by num_heads = 8", "head_dim is not set", "set head_dim explicitly"});
    c.head_dim = 10;  // an explicit head_dim makes it valid: q_width 80 ≠ hidden_size 100
    CHECK(pv::validate(c).empty());
    CHECK(c.q_width() == 80);

    c.hidden_size = 4;  // fewer channels than heads
    c.head_dim = 0;
    expect_one_error(c, {"hidden_size = 4", "num_heads = 8"});

    c = tiny();
    c.head_dim = 7;
    expect_one_error(c, {"head_dim = 7", "odd", "RoPE"});
    c.head_dim = -4;
    expect_one_error(c, {"head_dim = -4", "must be positive, or 0"});
    c.hidden_size = 54;  // derived 54 / 6 = 9
    c.head_dim = 0;
    expect_one_error(c, {"head_dim = 9", "hidden_size / num_heads", "odd"});
}

TEST_CASE("non-positive sizes are named with their value", "[config]") {
    struct Case {
        const char* field;
        int pv::LlamaConfig::*member;
    };
    const Case cases[] = {
        {"vocab_size", &pv::LlamaConfig::vocab_size},     {"hidden_size", &pv::LlamaConfig::hidden_size},
        {"num_layers", &pv::LlamaConfig::num_layers},     {"num_heads", &pv::LlamaConfig::num_heads},
        {"num_kv_heads", &pv::LlamaConfig::num_kv_heads}, {"ffn_size", &pv::LlamaConfig::ffn_size},
        {"max_seq_len", &pv::LlamaConfig::max_seq_len},
    };
    for (const auto& k : cases) {
        for (int v : {0, -3}) {
            pv::LlamaConfig c = tiny();  // head_dim is explicit, so no derived-head_dim message follows
            c.*k.member = v;
            INFO(k.field << " = " << v);
            expect_one_error(c, {std::string(k.field) + " = " + std::to_string(v), "must be positive"});
        }
    }
}

// A hostile config.json (issue 28, rows 4 and 5): sizes whose products overflow, or a million
// layers a planner would walk for minutes, are refused by validate() naming field, value and limit.
TEST_CASE("sizes beyond any trainable model are refused naming the field, the value and the limit", "[config]") {
    struct Case {
        const char* field;
        int pv::LlamaConfig::*member;
        int value;
        const char* limit;
    };
    const Case cases[] = {
        {"vocab_size", &pv::LlamaConfig::vocab_size, 2000000000, "4194304"},
        {"hidden_size", &pv::LlamaConfig::hidden_size, 1000000000, "65536"},
        {"num_layers", &pv::LlamaConfig::num_layers, 1000000, "1024"},
        {"num_heads", &pv::LlamaConfig::num_heads, 1000000, "1024"},
        {"num_kv_heads", &pv::LlamaConfig::num_kv_heads, 1000000, "1024"},
        {"head_dim", &pv::LlamaConfig::head_dim, 1 << 30, "4096"},
        {"ffn_size", &pv::LlamaConfig::ffn_size, 2147483647, "262144"},
        {"max_seq_len", &pv::LlamaConfig::max_seq_len, 1 << 30, "16777216"},
    };
    for (const auto& k : cases) {
        pv::LlamaConfig c = tiny();
        c.*k.member = k.value;
        INFO(k.field << " = " << k.value);
        expect_one_error(c, {std::string(k.field) + " = " + std::to_string(k.value),
                             std::string("exceeds polevault's limit of ") + k.limit});
    }
}

TEST_CASE("rms_norm_eps and rope_theta must be positive", "[config]") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    pv::LlamaConfig c = tiny();
    c.rms_norm_eps = 0;
    expect_one_error(c, {"rms_norm_eps = 0", "must be positive"});
    c.rms_norm_eps = -1e-6;
    expect_one_error(c, {"rms_norm_eps = -1e-06"});
    c.rms_norm_eps = nan;
    expect_one_error(c, {"rms_norm_eps = nan"});

    c = tiny();
    c.rope_theta = 0;
    expect_one_error(c, {"rope_theta = 0", "must be positive"});
    c.rope_theta = -10000;
    expect_one_error(c, {"rope_theta = -10000"});
    c.rope_theta = std::numeric_limits<double>::infinity();
    expect_one_error(c, {"rope_theta = inf"});
}

TEST_CASE("rope scaling: its parameters are checked only when factor > 0", "[config]") {
    pv::LlamaConfig c = tiny();
    c.rope_scaling = {
        .factor = 0, .low_freq_factor = -5, .high_freq_factor = -9, .original_max_position_embeddings = -1};
    CHECK_FALSE(c.rope_scaling.enabled());
    CHECK(pv::validate(c).empty());  // factor 0: no scaling, the rest is ignored

    const pv::RopeScaling good{
        .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position_embeddings = 8192};
    c.rope_scaling = good;
    CHECK(c.rope_scaling.enabled());
    CHECK(pv::validate(c).empty());

    c.rope_scaling.original_max_position_embeddings = 0;
    expect_one_error(c, {"rope_scaling.original_max_position_embeddings = 0", "rope_scaling.factor = 8"});

    c.rope_scaling = good;
    c.rope_scaling.high_freq_factor = 1;
    c.rope_scaling.low_freq_factor = 4;
    expect_one_error(c, {"rope_scaling.high_freq_factor = 1", "rope_scaling.low_freq_factor = 4", "greater"});
    c.rope_scaling.high_freq_factor = 4;  // equal: the blend would divide by zero
    expect_one_error(c, {"rope_scaling.high_freq_factor = 4", "rope_scaling.low_freq_factor = 4"});

    c.rope_scaling = good;
    c.rope_scaling.low_freq_factor = 0;
    expect_one_error(c, {"rope_scaling.low_freq_factor = 0", "must be positive"});

    c.rope_scaling = good;
    c.rope_scaling.factor = -1;
    expect_one_error(c, {"rope_scaling.factor = -1"});
}

TEST_CASE("validation reports every problem at once; validate_or_throw joins them", "[config]") {
    pv::LlamaConfig c = tiny();
    c.name = "my-model";
    c.num_kv_heads = 4;  // 6 % 4 ≠ 0
    c.head_dim = 7;
    c.rms_norm_eps = 0;
    c.rope_scaling = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position_embeddings = 0};
    const auto errors = pv::validate(c);
    INFO(joined(errors));
    REQUIRE(errors.size() == 4);
    try {
        pv::validate_or_throw(c);
        FAIL("validate_or_throw accepted an invalid config");
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("my-model") != std::string::npos);
        CHECK(what.find("4 problems") != std::string::npos);
        for (const auto& m : errors) CHECK(what.find(m) != std::string::npos);
    }
}

TEST_CASE("unknown preset names are rejected with the list of known ones", "[config]") {
    for (const char* bad : {"llama-4", "", "LLAMA-2-7B", "test-tiny "}) {
        INFO("name '" << bad << "'");
        REQUIRE_THROWS_AS(pv::preset(bad), std::invalid_argument);
        try {
            pv::preset(bad);
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find("'" + std::string(bad) + "'") != std::string::npos);
            for (const auto& n : pv::preset_names()) CHECK(what.find(n) != std::string::npos);
        }
    }
}

TEST_CASE("storage type names parse to their DType and element type; others name the value and the choices",
          "[config]") {
    for (pv::DType t : {pv::DType::bf16, pv::DType::fp32, pv::DType::fp64}) {
        INFO(pv::dtype_name(t));
        CHECK(pv::parse_dtype(pv::dtype_name(t)) == t);
        CHECK(pv::with_dtype(t, [](auto tag) { return sizeof(typename decltype(tag)::type); }) == pv::dtype_size(t));
        CHECK(pv::with_dtype(pv::dtype_name(t),
                             [](auto tag) { return pv::dtype_of<typename decltype(tag)::type>(); }) == t);
    }
    for (const char* bad : {"fp16", "", "BF16", "float32", "bf16 "}) {
        INFO("name '" << bad << "'");
        try {
            (void)pv::parse_dtype(bad);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            CHECK(what.find("'" + std::string(bad) + "'") != std::string::npos);
            CHECK(what.find("bf16, fp32 or fp64") != std::string::npos);
        }
        CHECK_THROWS_AS(pv::with_dtype(bad, [](auto) { return 0; }), std::invalid_argument);
    }
}
