// PEFT's adapter_config.json (formats/peft_config.h). The fixtures in test/data/peft/ were written by
// PEFT itself (test/interop/make_peft_config_fixtures.py, which lists the settings each was made
// with; the expected values below are those settings, typed out again):
//   - PEFT's files read as the settings PEFT was given, and polevault's file for the same settings
//     holds exactly PEFT's keys and values (only peft_version differs: null in ours), laid out as
//     PEFT lays them out;
//   - every LoRA configuration (each target subset, fractional alphas, dropout, rsLoRA) round-trips;
//   - every refusal (in PEFT's own files, and in q_v.json with one key changed) names the file, the
//     key and its value; the forms PEFT accepts for the same meaning (module paths, "all-linear" in
//     any case, null targets, absent keys, off values, initialisations that change only the starting
//     values) are read as PEFT reads them;
//   - write_peft_adapter_config and read_peft_adapter_config through a file and a directory.
#include "test/error_of.h"
#include "test/temp_dir.h"
#include "formats/peft_config.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace peft_config_test {

using json = nlohmann::json;
using pv::test::error_of;

const std::string kDir = "test/data/peft/";  // tests run from the repository root

std::string fixture(const std::string& name) {
    std::ifstream in(kDir + name, std::ios::binary);
    INFO(kDir + name << " is missing: run the tests from the repository root");
    REQUIRE(in);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::vector<std::string> kSeven = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

pv::LoraConfig lora(int rank, double alpha, bool rslora, double dropout, std::vector<std::string> targets) {
    pv::LoraConfig l;
    l.rank = rank;
    l.alpha = alpha;
    l.rslora = rslora;
    l.dropout = dropout;
    l.targets = std::move(targets);
    return l;
}

void check_same(const pv::LoraConfig& got, const pv::LoraConfig& expected) {
    CHECK(got.rank == expected.rank);
    CHECK(got.alpha == expected.alpha);  // exact: a double written and read back
    CHECK(got.rslora == expected.rslora);
    CHECK(got.dropout == expected.dropout);
    CHECK(got.targets == expected.targets);
}

// q_v.json parsed, with `key` set to `value` (or erased when `value` is the string "<absent>").
std::string q_v_with(const std::string& key, const json& value) {
    json j = json::parse(fixture("q_v.json"));
    if (value == "<absent>")
        j.erase(key);
    else
        j[key] = value;
    return j.dump(2);
}

pv::PeftAdapterConfig parse(const std::string& text) { return pv::parse_peft_adapter_config(text, "origin.json"); }

std::string refusal(const std::string& text) {
    return error_of<std::runtime_error>([&] { parse(text); });
}

TEST_CASE("PEFT's own adapter_config.json files read as the settings PEFT was given", "[peft_config]") {
    SECTION("q_v.json: r 4, lora_alpha 8, q_proj and v_proj, on polevault/tiny-llama") {
        const pv::PeftAdapterConfig c = parse(fixture("q_v.json"));
        check_same(c.lora, lora(4, 8, false, 0, {"q_proj", "v_proj"}));
        CHECK(c.base_model_name_or_path == "polevault/tiny-llama");
    }
    SECTION("all_linear_rslora.json: r 8, lora_alpha 16, dropout 0.05, rsLoRA, all seven in PEFT's set order") {
        const std::string text = fixture("all_linear_rslora.json");
        // PEFT's set order, not polevault's: the reader must not depend on the order.
        REQUIRE(json::parse(text)["target_modules"].get<std::vector<std::string>>() != kSeven);
        const pv::PeftAdapterConfig c = parse(text);
        check_same(c.lora, lora(8, 16, true, 0.05, kSeven));
        CHECK(c.base_model_name_or_path == "polevault/tiny-llama");
        CHECK(c.lora.scale() == 16 / std::sqrt(8.0));
    }
    SECTION("config_all_linear.json: target_modules the string \"all-linear\", no base") {
        const pv::PeftAdapterConfig c = parse(fixture("config_all_linear.json"));
        check_same(c.lora, lora(16, 32, false, 0, kSeven));
        CHECK(c.base_model_name_or_path.empty());
    }
}

TEST_CASE("polevault's adapter_config.json holds PEFT's keys and values, laid out as PEFT lays them out",
          "[peft_config]") {
    struct Case {
        const char* file;
        pv::LoraConfig lora;
    };
    const Case cases[] = {{"q_v.json", lora(4, 8, false, 0, {"v_proj", "q_proj"})},
                          {"all_linear_rslora.json", lora(8, 16, true, 0.05, kSeven)}};
    for (const Case& c : cases) {
        INFO(c.file);
        const std::string peft_text = fixture(c.file);
        json peft = json::parse(peft_text);
        // PEFT writes sorted keys with a 2-space indent (nlohmann's dump(2)), and no final newline.
        CHECK(peft.dump(2) == peft_text);

        const std::string ours_text = pv::peft_adapter_config_json(c.lora, "polevault/tiny-llama");
        REQUIRE(ours_text.back() == '\n');
        const json ours = json::parse(ours_text);
        CHECK(ours.dump(2) + "\n" == ours_text);

        // The two differences: PEFT records its version (ours is null: PEFT fills its own in on
        // loading) and saves target_modules in its set's order (ours sorted).
        CHECK(peft["peft_version"] == "0.21.2");
        CHECK(ours["peft_version"].is_null());
        peft["peft_version"] = nullptr;
        auto targets = peft["target_modules"].get<std::vector<std::string>>();
        std::sort(targets.begin(), targets.end());
        CHECK(ours["target_modules"] == json(targets));
        peft["target_modules"] = targets;
        INFO("differences (JSON patch from PEFT's to ours): " << json::diff(peft, ours).dump());
        CHECK(ours == peft);
        // Types as PEFT writes them: == above compares numbers by value.
        CHECK(ours["r"].is_number_integer());
        CHECK(ours["lora_alpha"].is_number_integer());
        CHECK(ours["lora_dropout"].is_number_float());
        CHECK(ours["lora_dropout"].dump() == peft["lora_dropout"].dump());
    }
}

TEST_CASE("every LoRA configuration round-trips through adapter_config.json", "[peft_config]") {
    const double alphas[] = {8, 16 * std::sqrt(2.0), 0.1, 3, 1e-3, 12345.678};
    const double dropouts[] = {0, 0.05, 0.1, 0.999};
    int n = 0;
    for (int subset = 1; subset < (1 << 7); ++subset) {  // every non-empty set of targets
        std::vector<std::string> targets;
        for (int m = 0; m < 7; ++m)
            if (subset & (1 << m)) targets.push_back(kSeven[size_t(m)]);
        const pv::LoraConfig l =
            lora(1 + subset % 64, alphas[subset % 6], subset % 3 == 0, dropouts[subset % 4], targets);
        const std::string base = subset % 5 == 0 ? "" : "/models/base-" + std::to_string(subset);
        INFO("subset " << subset);
        const pv::PeftAdapterConfig back = parse(pv::peft_adapter_config_json(l, base));
        check_same(back.lora, l);
        CHECK(back.base_model_name_or_path == base);
        ++n;
    }
    CHECK(n == 127);
    // A fractional alpha is written as a number with a fraction, a whole one as an integer.
    CHECK(json::parse(pv::peft_adapter_config_json(lora(4, 11.5, false, 0, kSeven), ""))["lora_alpha"] == 11.5);
    CHECK(json::parse(pv::peft_adapter_config_json(lora(4, 11, false, 0, kSeven), ""))["base_model_name_or_path"]
              .is_null());
}

TEST_CASE("the writer refuses a configuration that is no adapter", "[peft_config]") {
    CHECK_THAT(error_of<std::invalid_argument>([] { pv::peft_adapter_config_json(lora(0, 8, false, 0, kSeven), ""); }),
               Catch::Contains("LoRA is off"));
    CHECK_THAT(
        error_of<std::invalid_argument>([] { pv::peft_adapter_config_json(lora(4, 8, false, 1.0, kSeven), ""); }),
        Catch::Contains("--lora-dropout"));
    CHECK_THAT(
        error_of<std::invalid_argument>([] { pv::peft_adapter_config_json(lora(4, 8, false, 0, {"lm_head"}), ""); }),
        Catch::Contains("lm_head"));
    CHECK_THAT(error_of<std::invalid_argument>([] { pv::peft_adapter_config_json(lora(4, -1, false, 0, kSeven), ""); }),
               Catch::Contains("--lora-alpha"));
}

TEST_CASE("PEFT's own files of what polevault cannot train are refused, naming the key and the fix", "[peft_config]") {
    struct Case {
        const char* file;
        std::vector<const char*> says;
    };
    const Case cases[] = {
        {"regex.json", {"target_modules = \".*\\\\.(q|v)_proj\"", "regular expression", "as a list"}},
        {"dora.json", {"use_dora = true", "DoRA", "merge_and_unload", "use_dora = false"}},
        {"pissa.json", {"init_lora_weights = \"pissa\"", "path_initial_model_for_weight_conversion"}},
        {"layers.json", {"layers_to_transform = [0,2]", "some layers only", "layers_to_transform = null"}},
    };
    for (const Case& c : cases) {
        INFO(c.file);
        const std::string message = refusal(fixture(c.file));
        CHECK_THAT(message, Catch::StartsWith("adapter_config.json 'origin.json': "));
        for (const char* s : c.says) CHECK_THAT(message, Catch::Contains(s));
    }
}

TEST_CASE("every setting polevault cannot represent is refused by name, with its value", "[peft_config]") {
    struct Case {
        const char* key;
        json value;
        const char* says;  // besides "<key> = <value>"
    };
    // clang-format off
    const std::vector<Case> cases = {
        {"peft_type", "IA3", "not a LoRA adapter"},
        {"peft_type", "<absent>", "has no peft_type"},
        {"task_type", "SEQ_CLS", "CAUSAL_LM"},
        {"bias", "all", "bias \"none\""},
        {"bias", "lora_only", "bias \"none\""},
        {"use_dora", true, "DoRA"},
        {"fan_in_fan_out", true, "transposed"},
        {"lora_bias", true, "bias on B"},
        {"use_qalora", true, "QALoRA"},
        {"modules_to_save", json::array({"lm_head"}), "whole modules"},
        {"exclude_modules", json::array({"q_proj"}), "left out"},
        {"exclude_modules", ".*0.*", "left out"},
        {"layers_to_transform", 1, "some layers only"},
        {"layers_pattern", "layers", "some layers only"},
        {"rank_pattern", {{"model.layers.0.self_attn.q_proj", 8}}, "a rank per module"},
        {"alpha_pattern", {{"q_proj", 32}}, "a lora_alpha per module"},
        {"layer_replication", json::array({json::array({0, 2})}), "repeated layers"},
        {"trainable_token_indices", json::array({1, 2}), "embedding"},
        {"target_parameters", json::array({"mlp.experts.down_proj"}), "parameters"},
        {"alora_invocation_tokens", json::array({5, 6}), "invocation tokens"},
        {"megatron_config", {{"tensor_model_parallel_size", 2}}, "Megatron"},
        {"use_bdlora", {{"nblocks", 2}}, "block-diagonal"},
        {"arrow_config", {{"top_k", 3}}, "Arrow"},
        {"kasa_config", {{"beta", 1}}, "KaSA"},
        {"velora_config", {{"num_groups", 2}}, "VeLoRA"},
        {"monteclora_config", {{"num_samples", 4}}, "MonteCLoRA"},
        {"a_future_feature", 3, "does not know"},
        {"a_future_feature", "on", "does not know"},
        {"target_modules", json::array({"lm_head"}), "seven Llama projections"},
        {"target_modules", json::array({"q_proj", "embed_tokens"}), "'embed_tokens'"},
        {"target_modules", json::array({"model.layers.0.self_attn.q_proj"}), "in every layer"},
        {"target_modules", json::array(), "no adapter anywhere"},
        {"target_modules", "q_proj|v_proj", "regular expression"},
        {"target_modules", json::array({1}), "list of module names"},
        {"target_modules", 5, "list of module names"},
        {"r", 0, "whole number from 1"},
        {"r", -4, "whole number from 1"},
        {"r", 4.5, "a whole number"},
        {"r", "4", "a whole number"},
        {"r", nullptr, "a whole number"},
        {"r", 4294967296LL, "whole number from 1"},
        {"lora_alpha", 0, "positive"},
        {"lora_alpha", -8, "positive"},
        {"lora_alpha", "8", "a number"},
        {"lora_alpha", nullptr, "a number"},
        {"lora_dropout", 1.0, "[0, 1)"},
        {"lora_dropout", -0.1, "[0, 1)"},
        {"lora_dropout", "0.1", "a number"},
        {"use_rslora", "true", "true or false"},
        {"use_rslora", 1, "true or false"},
        {"init_lora_weights", "olora", "rewrote the base"},
        {"init_lora_weights", "corda", "rewrote the base"},
        {"init_lora_weights", "loftq", "rewrote the base"},
        {"init_lora_weights", "lora_ga", "rewrote the base"},
        {"init_lora_weights", "pissa_niter_4", "rewrote the base"},
        {"init_lora_weights", "mica", "B frozen"},
        {"init_lora_weights", "a_new_init", "does not know"},
        {"init_lora_weights", 3, "true, false or the name"},
    };
    // clang-format on
    for (const Case& c : cases) {
        INFO(c.key << " = " << c.value.dump());
        const std::string message = refusal(q_v_with(c.key, c.value));
        CHECK_THAT(message, Catch::StartsWith("adapter_config.json 'origin.json': "));
        if (c.value != "<absent>" && std::string(c.key) != "target_modules")
            CHECK_THAT(message, Catch::Contains(std::string(c.key) + " = " + c.value.dump()));
        CHECK_THAT(message, Catch::Contains(c.key));
        CHECK_THAT(message, Catch::Contains(c.says));
    }
    SECTION("not JSON, or not an object") {
        CHECK_THAT(refusal("{\"peft_type\": \"LORA\","), Catch::Contains("not valid JSON"));
        CHECK_THAT(refusal("[1, 2]"), Catch::Contains("is an array") && Catch::Contains("JSON object"));
    }
}

TEST_CASE("the forms PEFT reads the same way are read as PEFT reads them", "[peft_config]") {
    const pv::LoraConfig q_v = lora(4, 8, false, 0, {"q_proj", "v_proj"});
    SECTION("target_modules as paths within a layer, repeated, in any order") {
        const json t = json::array({"mlp.down_proj", "self_attn.q_proj", "q_proj", "mlp.down_proj", "up_proj"});
        CHECK(parse(q_v_with("target_modules", t)).lora.targets ==
              std::vector<std::string>{"q_proj", "up_proj", "down_proj"});
    }
    SECTION("\"all-linear\" in any case; null and absent are PEFT's Llama default, q_proj and v_proj") {
        CHECK(parse(q_v_with("target_modules", "ALL-Linear")).lora.targets == kSeven);
        CHECK(parse(q_v_with("target_modules", nullptr)).lora.targets == q_v.targets);
        CHECK(parse(q_v_with("target_modules", "<absent>")).lora.targets == q_v.targets);
    }
    SECTION("absent keys take PEFT's defaults") {
        check_same(parse(q_v_with("r", "<absent>")).lora, lora(8, 8, false, 0, q_v.targets));
        check_same(parse(q_v_with("lora_alpha", "<absent>")).lora, q_v);
        check_same(parse(q_v_with("lora_dropout", "<absent>")).lora, q_v);
        check_same(parse(q_v_with("use_rslora", "<absent>")).lora, q_v);
        check_same(parse(R"({"peft_type": "LORA"})").lora, lora(8, 8, false, 0, q_v.targets));
        CHECK(parse(q_v_with("base_model_name_or_path", "<absent>")).base_model_name_or_path.empty());
    }
    SECTION("a fractional lora_alpha (PEFT's rsLoRA conversions write one)") {
        CHECK(parse(q_v_with("lora_alpha", 11.313708498984761)).lora.alpha == 11.313708498984761);
    }
    SECTION("task_type null; initialisations that only choose the starting values") {
        check_same(parse(q_v_with("task_type", nullptr)).lora, q_v);
        for (const json& init : {json(false), json("gaussian"), json("orthogonal"), json("eva")}) {
            INFO(init.dump());
            check_same(parse(q_v_with("init_lora_weights", init)).lora, q_v);
        }
    }
    SECTION("off values of the refused keys and of unknown keys; ignored keys with any value") {
        for (const json& off : {json(nullptr), json(false), json::array(), json::object()}) {
            INFO(off.dump());
            check_same(parse(q_v_with("a_future_feature", off)).lora, q_v);
            check_same(parse(q_v_with("modules_to_save", off)).lora, q_v);
            check_same(parse(q_v_with("layers_to_transform", off)).lora, q_v);
        }
        const std::vector<std::pair<const char*, json>> ignored = {
            {"inference_mode", false},
            {"revision", "main"},
            {"megatron_core", "my.megatron"},
            {"qalora_group_size", 32},
            {"loftq_config", {{"loftq_bits", 4}}},
            {"eva_config", {{"rho", 2.0}}},
            {"ensure_weight_tying", true},
            {"auto_mapping", {{"base_model_class", "LlamaForCausalLM"}}},
            {"runtime_config", {{"ephemeral_gpu_offload", false}}},
            {"peft_version", "0.99.0"}};
        for (const auto& [key, value] : ignored) {
            INFO(key << " = " << value.dump());
            check_same(parse(q_v_with(key, value)).lora, q_v);
        }
    }
}

TEST_CASE("write_peft_adapter_config and read_peft_adapter_config through a file", "[peft_config]") {
    pv::test::TempDir dir("peft_config");
    const pv::LoraConfig l = lora(16, 32, true, 0.1, {"k_proj", "o_proj", "down_proj"});
    pv::write_peft_adapter_config(dir.file("adapter_config.json"), l, "/bases/llama");
    for (const std::string& path : {dir.file("adapter_config.json"), dir.path.string()}) {
        INFO(path);
        const pv::PeftAdapterConfig back = pv::read_peft_adapter_config(path);
        check_same(back.lora, l);
        CHECK(back.base_model_name_or_path == "/bases/llama");
    }
    // A refused configuration leaves no file behind.
    CHECK_THROWS_AS(pv::write_peft_adapter_config(dir.file("other.json"), lora(0, 8, false, 0, kSeven), ""),
                    std::invalid_argument);
    CHECK(!std::filesystem::exists(dir.file("other.json")));
    const std::string missing = error_of<std::runtime_error>([&] { pv::read_peft_adapter_config(dir.file("none")); });
    CHECK_THAT(missing, Catch::Contains(dir.file("none")) && Catch::Contains("cannot open"));
    std::filesystem::create_directory(dir.path / "empty");
    const std::string empty_dir =
        error_of<std::runtime_error>([&] { pv::read_peft_adapter_config((dir.path / "empty").string()); });
    CHECK_THAT(empty_dir, Catch::Contains("adapter_config.json") && Catch::Contains("cannot open"));
}

}  // namespace peft_config_test
