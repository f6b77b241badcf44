// PEFT's adapter_config.json, written and read; the format and the rules are in formats/peft_config.h.
#include "formats/peft_config.h"

#include "io/input_file.h"
#include "io/durable_file.h"
#include "io/json_reader.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace pv {
namespace {

using json = nlohmann::json;

// The keys that describe something other than plain LoRA on the seven projections. PEFT writes
// each with the value below when the feature is off (null, false or {}); any other value is a
// feature polevault's adapters do not have, and `what` says which.
struct OffKey {
    const char* key;
    json off;
    const char* what;
};
const std::vector<OffKey>& off_keys() {
    // clang-format off
    static const std::vector<OffKey> keys = {
        {"alora_invocation_tokens", nullptr, "activated LoRA, which applies the adapter only after its invocation tokens"},
        {"alpha_pattern", json::object(), "a lora_alpha per module"},
        {"arrow_config", nullptr, "Arrow routing between several adapters"},
        {"exclude_modules", nullptr, "modules left out of target_modules"},
        {"fan_in_fan_out", false, "a base storing its weights transposed (GPT-2's Conv1D), which no Llama does"},
        {"kasa_config", nullptr, "KaSA, a learned diagonal between A and B"},
        {"layer_replication", nullptr, "repeated layers of the base"},
        {"layers_pattern", nullptr, "adapters on some layers only"},
        {"layers_to_transform", nullptr, "adapters on some layers only"},
        {"lora_bias", false, "a bias on B"},
        {"megatron_config", nullptr, "Megatron's parallel linear layers"},
        {"modules_to_save", nullptr, "whole modules trained and saved beside the adapters"},
        {"monteclora_config", nullptr, "MonteCLoRA, adapters sampled at every step"},
        {"rank_pattern", json::object(), "a rank per module"},
        {"target_parameters", nullptr, "adapters on parameters instead of linear modules"},
        {"trainable_token_indices", nullptr, "trained rows of the embedding"},
        {"use_bdlora", nullptr, "BD-LoRA, block-diagonal A or B"},
        {"use_dora", false, "DoRA, a trained magnitude vector per module"},
        {"use_qalora", false, "QALoRA, a pooled adapter input"},
        {"velora_config", nullptr, "VeLoRA, a compressed backward"},
    };
    // clang-format on
    return keys;
}

// Keys that change nothing polevault does (formats/peft_config.h says why), with the value PEFT
// writes; runtime_config is never written (PEFT drops it on saving).
struct IgnoredKey {
    const char* key;
    json written;
    bool write = true;
};
const std::vector<IgnoredKey>& ignored_keys() {
    static const std::vector<IgnoredKey> keys = {{"auto_mapping", nullptr},      {"corda_config", nullptr},
                                                 {"ensure_weight_tying", false}, {"eva_config", nullptr},
                                                 {"inference_mode", true},       {"loftq_config", json::object()},
                                                 {"lora_ga_config", nullptr},    {"megatron_core", "megatron.core"},
                                                 {"peft_version", nullptr},      {"qalora_group_size", 16},
                                                 {"revision", nullptr},          {"runtime_config", nullptr, false}};
    return keys;
}

// null, false, [] and {}: how PEFT's config holds a feature that is off.
bool is_off(const json& v) {
    return v.is_null() || (v.is_boolean() && !v.get<bool>()) || ((v.is_array() || v.is_object()) && v.empty());
}

std::string seven_modules() {
    std::string all;
    for (const std::string& n : lora_module_names()) all += (all.empty() ? "" : ", ") + n;
    return all;
}

// The module's path within a Llama layer: PEFT matches a target_modules entry against the end of
// every module's full name, so "self_attn.q_proj" selects what "q_proj" does.
std::string module_path(const std::string& name) {
    const bool attention = name == "q_proj" || name == "k_proj" || name == "v_proj" || name == "o_proj";
    return (attention ? "self_attn." : "mlp.") + name;
}

// Reads the keys of one adapter_config.json object (io/json_reader.h); a value of the wrong type
// is a file PEFT did not write.
class Reader : public JsonReader {
  public:
    Reader(const json& root, const std::string& origin) : JsonReader(root, "adapter_config.json", origin) {}

    [[noreturn]] void wrong_type(const std::string& key, const json& v, const std::string& expected) const {
        JsonReader::wrong_type(key, v, expected,
                               "is this a file PEFT wrote? Save the adapter again with PEFT's save_pretrained");
    }
    double number(const std::string& key, double fallback) const {
        const json* v = find(key);
        if (v == nullptr) return fallback;
        if (!v->is_number()) wrong_type(key, *v, "a number");
        return v->get<double>();
    }
    bool boolean(const std::string& key, bool fallback) const {
        const json* v = find(key);
        if (v == nullptr) return fallback;
        if (!v->is_boolean()) wrong_type(key, *v, "true or false");
        return v->get<bool>();
    }
    // A string key; null and absent give `fallback`.
    std::string string(const std::string& key, const std::string& fallback) const {
        const json* v = find(key);
        if (v == nullptr || v->is_null()) return fallback;
        if (!v->is_string()) wrong_type(key, *v, "a string");
        return v->get<std::string>();
    }

    int rank() const {
        const json* v = find("r");
        if (v == nullptr) return 8;  // PEFT's default
        if (!v->is_number_integer()) wrong_type("r", *v, "a whole number");
        const bool in_range = v->is_number_unsigned()
                                  ? v->get<unsigned long long>() >= 1 && v->get<unsigned long long>() <= INT_MAX
                                  : v->get<long long>() >= 1 && v->get<long long>() <= INT_MAX;
        if (!in_range)
            fail("r = " + json_shown(*v) + " is not a rank: an adapter's rank is a whole number from 1 up (to " +
                 std::to_string(INT_MAX) + ")");
        return v->get<int>();
    }

    std::vector<std::string> targets() const {
        const json* v = find("target_modules");
        if (v == nullptr || v->is_null()) return {"q_proj", "v_proj"};  // PEFT's default for Llama
        if (v->is_string()) {
            std::string s = v->get<std::string>();
            std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
            if (s == "all-linear") return lora_module_names();
            fail("target_modules = " + json_shown(*v) +
                 " is a regular expression (PEFT matches it against whole module names), which polevault does not "
                 "evaluate: write the modules it selects as a list of names from " +
                 seven_modules() + ", e.g. [\"q_proj\", \"v_proj\"]");
        }
        if (!v->is_array()) wrong_type("target_modules", *v, "a list of module names");
        if (v->empty())
            fail("target_modules = [] puts no adapter anywhere: list the modules it adapts, from " + seven_modules());
        std::vector<std::string> found;
        for (const json& entry : *v) {
            if (!entry.is_string()) wrong_type("target_modules", *v, "a list of module names (strings)");
            const std::string e = entry.get<std::string>();
            bool known = false;
            for (const std::string& name : lora_module_names())
                if (e == name || e == module_path(name)) {
                    known = true;
                    if (std::find(found.begin(), found.end(), name) == found.end()) found.push_back(name);
                }
            if (!known)
                fail("target_modules names '" + e +
                     "', which is not one of the seven Llama projections polevault adapts in every layer (" +
                     seven_modules() + "): keep only those in the list");
        }
        std::vector<std::string> ordered;  // lora_module_names() order
        for (const std::string& name : lora_module_names())
            if (std::find(found.begin(), found.end(), name) != found.end()) ordered.push_back(name);
        return ordered;
    }

    void check_init() const {
        const json* v = find("init_lora_weights");
        if (v == nullptr || v->is_boolean()) return;
        if (!v->is_string()) wrong_type("init_lora_weights", *v, "true, false or the name of an initialisation");
        const std::string init = v->get<std::string>();
        if (init == "gaussian" || init == "orthogonal" || init == "eva") return;
        for (const char* rewrites : {"pissa", "olora", "corda", "lora_ga", "loftq"})
            if (init.rfind(rewrites, 0) == 0)
                fail("init_lora_weights = " + json_shown(*v) +
                     " also rewrote the base model's weights (W − s·B₀A₀), so the "
                     "adapter belongs to a base that is no longer the one it names: convert it to a plain LoRA "
                     "with PEFT (save_pretrained(..., path_initial_model_for_weight_conversion=...)) and use that");
        if (init == "mica")
            fail(
                "init_lora_weights = \"mica\" trains A alone with B frozen, where polevault trains both: merge the "
                "adapter into its base with PEFT (merge_and_unload) and start a new adapter on that");
        fail("init_lora_weights = " + json_shown(*v) +
             " is an initialisation polevault does not know, so it cannot tell whether it changed the base: "
             "convert the adapter to a plain LoRA with PEFT");
    }

    // Every key that is not plain LoRA must hold its "off" value.
    void check_off_keys() const {
        for (auto it = root().begin(); it != root().end(); ++it) {
            const std::string& key = it.key();
            static const char* handled[] = {
                "peft_type",  "task_type",      "r",    "lora_alpha",        "lora_dropout",
                "use_rslora", "target_modules", "bias", "init_lora_weights", "base_model_name_or_path"};
            if (std::find_if(std::begin(handled), std::end(handled), [&](const char* k) { return key == k; }) !=
                std::end(handled))
                continue;
            const auto& ignored = ignored_keys();
            if (std::find_if(ignored.begin(), ignored.end(), [&](const IgnoredKey& k) { return key == k.key; }) !=
                ignored.end())
                continue;
            if (is_off(it.value())) continue;
            const auto& off = off_keys();
            const auto known = std::find_if(off.begin(), off.end(), [&](const OffKey& k) { return key == k.key; });
            if (known != off.end())
                fail(key + " = " + json_shown(it.value()) + " asks for " + known->what +
                     ", which polevault's plain LoRA (one rank and one scale, the same modules in every layer) "
                     "cannot represent: merge the adapter into its base with PEFT (merge_and_unload) and start a new "
                     "adapter on the merged model, or train it again with " +
                     key + " = " + known->off.dump());
            fail(key + " = " + json_shown(it.value()) +
                 " is a setting polevault does not know (from a newer PEFT?), and not an 'off' value (null, false, "
                 "[] or {}), so the adapter may be something else than plain LoRA: save it without the feature");
        }
    }
};

}  // namespace

std::string peft_adapter_config_json(const LoraConfig& lora, const std::string& base_model_name_or_path) {
    if (!lora.enabled())
        throw std::invalid_argument("adapter_config.json: LoRA is off (rank " + std::to_string(lora.rank) +
                                    "), so there is no adapter to describe");
    const std::vector<std::string> problems = validate(lora);
    if (!problems.empty()) {
        std::string all;
        for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
        throw std::invalid_argument("adapter_config.json: the LoRA configuration is not valid: " + all);
    }
    json j = json::object();
    for (const OffKey& k : off_keys()) j[k.key] = k.off;
    for (const IgnoredKey& k : ignored_keys())
        if (k.write) j[k.key] = k.written;
    j["peft_type"] = "LORA";
    j["task_type"] = "CAUSAL_LM";
    j["base_model_name_or_path"] = base_model_name_or_path.empty() ? json(nullptr) : json(base_model_name_or_path);
    j["r"] = lora.rank;
    // PEFT's lora_alpha is an int unless it was made fractional (rsLoRA conversions multiply by √2).
    const bool whole = lora.alpha == std::floor(lora.alpha) && lora.alpha < 9e15;
    j["lora_alpha"] = whole ? json(static_cast<long long>(lora.alpha)) : json(lora.alpha);
    j["lora_dropout"] = lora.dropout;
    j["use_rslora"] = lora.rslora;
    std::vector<std::string> targets = lora.targets;
    std::sort(targets.begin(), targets.end());
    j["target_modules"] = targets;
    j["bias"] = "none";
    j["init_lora_weights"] = true;
    return j.dump(2) + "\n";  // nlohmann's objects keep their keys sorted, as PEFT's sort_keys=True
}

void write_peft_adapter_config(const std::string& path, const LoraConfig& lora,
                               const std::string& base_model_name_or_path) {
    const std::string text = peft_adapter_config_json(lora, base_model_name_or_path);  // throws before writing
    write_file_atomically(path, "adapter_config.json", [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

PeftAdapterConfig parse_peft_adapter_config(const std::string& json_text, const std::string& origin) {
    const json root = parse_json_object(json_text, "adapter_config.json", origin,
                                        "save the adapter again with PEFT's save_pretrained");
    const Reader r(root, origin);

    const json* type = r.find("peft_type");
    if (type == nullptr) r.fail("has no peft_type, which every PEFT adapter config has: is this the right file?");
    if (*type != "LORA")
        r.fail("peft_type = " + json_shown(*type) +
               " is not a LoRA adapter (\"LORA\"), the only kind polevault trains");
    const std::string task = r.string("task_type", "CAUSAL_LM");
    if (task != "CAUSAL_LM")
        r.fail("task_type = \"" + task +
               "\" puts the adapter on another model than a causal language model, under "
               "other tensor names: polevault reads CAUSAL_LM adapters (task_type \"CAUSAL_LM\" or null)");
    const std::string bias = r.string("bias", "none");
    if (bias != "none")
        r.fail("bias = \"" + bias +
               "\" trains the base's biases beside the adapters, where polevault trains the "
               "adapters alone: save the adapter with bias \"none\"");
    r.check_init();
    r.check_off_keys();

    PeftAdapterConfig out;
    LoraConfig& l = out.lora;
    l.rank = r.rank();
    l.alpha = r.number("lora_alpha", 8);
    if (!(std::isfinite(l.alpha) && l.alpha > 0))
        r.fail("lora_alpha = " + json_shown(*r.find("lora_alpha")) +
               " must be a positive number (the scale is alpha / r)");
    l.dropout = r.number("lora_dropout", 0);
    if (!(l.dropout >= 0 && l.dropout < 1))
        r.fail("lora_dropout = " + json_shown(*r.find("lora_dropout")) + " must be in [0, 1)");
    l.rslora = r.boolean("use_rslora", false);
    l.targets = r.targets();
    out.base_model_name_or_path = r.string("base_model_name_or_path", "");

    const std::vector<std::string> problems = validate(l);
    if (!problems.empty()) r.fail(problems.front());
    return out;
}

PeftAdapterConfig read_peft_adapter_config(const std::string& path) {
    std::error_code ec;
    const std::string file =
        std::filesystem::is_directory(path, ec) ? (std::filesystem::path(path) / "adapter_config.json").string() : path;
    const std::string text =
        read_input_file(file, "adapter_config.json", kMaxJsonFileBytes,
                        "a PEFT adapter directory holds adapter_config.json beside adapter_model.safetensors");
    return parse_peft_adapter_config(text, file);
}

}  // namespace pv
