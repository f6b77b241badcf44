// Hugging Face config.json reading and writing for LlamaConfig; the format and the rules are in
// formats/config_json.h.
#include "formats/config_json.h"

#include "io/input_file.h"
#include "io/durable_file.h"
#include "io/json_reader.h"
#include "model/checkpoint_files.h"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

namespace pv {
namespace {

using json = nlohmann::json;

// transformers' LlamaConfig defaults for the optional keys (configuration_llama.py).
constexpr int kDefaultMaxPositionEmbeddings = 2048;
constexpr double kDefaultRmsNormEps = 1e-6;
constexpr double kDefaultRopeTheta = 10000.0;

// What a config.json that is not JSON should do.
const char* const kNotJsonFix = "is this a Hugging Face config.json? Re-download or re-export it";

// Reads the keys of one config.json object (io/json_reader.h). Every error names the origin, the
// key, the value and the fix; `name` arguments are the key as a user would search for it
// ("rope_scaling.factor").
class Reader : public JsonReader {
  public:
    Reader(const json& root, const std::string& origin) : JsonReader(root, "config.json", origin) {}

    int as_int(const json& v, const std::string& name) const {
        if (v.is_number_unsigned()) {
            if (v.get<uint64_t>() > static_cast<uint64_t>(INT_MAX))
                fail(name + " = " + json_shown(v) + " is too large: at most " + std::to_string(INT_MAX) +
                     " is supported (is the value corrupt?)");
            return static_cast<int>(v.get<uint64_t>());
        }
        if (v.is_number_integer()) {
            const int64_t i = v.get<int64_t>();
            if (i < INT_MIN || i > INT_MAX)
                fail(name + " = " + json_shown(v) +
                     " is out of range: it must fit in a 32-bit integer (is the value corrupt?)");
            return static_cast<int>(i);
        }
        if (v.is_number_float())
            fail(name + " = " + json_shown(v) +
                 " is not a whole number: it is a count, so write it as an integer "
                 "without a decimal point (e.g. 2048)");
        wrong_type(name, v, "an integer", "write it as a JSON number without quotes (e.g. 2048)");
    }

    double as_double(const json& v, const std::string& name) const {
        if (!v.is_number()) wrong_type(name, v, "a number", "write it as a JSON number without quotes (e.g. 1e-05)");
        return v.get<double>();
    }

    bool as_bool(const json& v, const std::string& name) const {
        if (!v.is_boolean()) wrong_type(name, v, "a boolean", "write true or false, without quotes");
        return v.get<bool>();
    }

    std::string as_string(const json& v, const std::string& name) const {
        if (!v.is_string()) wrong_type(name, v, "a string", "write it in double quotes (e.g. \"llama\")");
        return v.get<std::string>();
    }

    // A required integer: absent or null is an error saying what the key means.
    int required_int(const std::string& key, const std::string& meaning) const {
        const json* v = find(key);
        if (v == nullptr)
            fail("missing required key " + key + " (" + meaning +
                 "): add it with the value from the model's "
                 "published config.json");
        if (v->is_null())
            fail(key + " = null, but it is required (" + meaning +
                 "): set it to the value from the model's "
                 "published config.json");
        return as_int(*v, key);
    }

    // Optional keys: the default when absent; null is the default only where transformers
    // documents None as meaning "derive it" (null_is_default), elsewhere a type error.
    int optional_int(const std::string& key, int fallback, bool null_is_default = false) const {
        const json* v = find(key);
        if (v == nullptr || (null_is_default && v->is_null())) return fallback;
        return as_int(*v, key);
    }
    double optional_double(const std::string& key, double fallback) const {
        const json* v = find(key);
        return v == nullptr ? fallback : as_double(*v, key);
    }
    bool optional_bool(const std::string& key, bool fallback) const {
        const json* v = find(key);
        return v == nullptr ? fallback : as_bool(*v, key);
    }
    std::string optional_string(const std::string& key, const std::string& fallback) const {
        const json* v = find(key);
        return v == nullptr ? fallback : as_string(*v, key);
    }

    // model_type "llama", or architectures containing LlamaForCausalLM.
    void check_architecture() const {
        const json* type = find("model_type");
        const json* arch = find("architectures");
        const bool has_type = type != nullptr && !type->is_null();
        const bool has_arch = arch != nullptr && !arch->is_null();
        bool llama = false;
        if (has_type && as_string(*type, "model_type") == "llama") llama = true;
        if (has_arch) {
            if (!arch->is_array())
                wrong_type("architectures", *arch, "an array of strings",
                           "write it as a list, e.g. [\"LlamaForCausalLM\"]");
            for (const json& a : *arch)
                if (a.is_string() && a.get<std::string>() == "LlamaForCausalLM") llama = true;
        }
        if (llama) return;
        if (!has_type && !has_arch)
            fail(
                "has neither model_type nor architectures, so nothing says it describes a Llama model: "
                "add \"model_type\": \"llama\" if it does");
        std::string what;
        if (has_type) what = "model_type = " + json_shown(*type);
        if (has_arch) what += (what.empty() ? "" : ", ") + std::string("architectures = ") + json_shown(*arch);
        fail(what +
             ": this is not a Llama model, and polevault reads only LlamaForCausalLM configs "
             "(model_type \"llama\"); choose a Llama-architecture checkpoint");
    }

    // One rope_scaling or rope_parameters object (`name` is its key) as a RopeScaling; factor 0
    // for rope_type "default". Sets *theta when the object carries rope_theta (transformers 5).
    RopeScaling rope(const json& obj, const std::string& name, double* theta) const {
        if (!obj.is_object())
            wrong_type(
                name, obj, "an object or null",
                "write null for plain RoPE, or {\"rope_type\": \"llama3\", \"factor\": ..., \"low_freq_factor\": ..., "
                "\"high_freq_factor\": ..., \"original_max_position_embeddings\": ...}");
        std::string type_key = "rope_type";
        const json* type = find(obj, type_key);
        if (type == nullptr) type = find(obj, type_key = "type");  // the key before transformers 4.43
        if (type == nullptr)
            fail(name + " = " + json_shown(obj) +
                 " has no rope_type: set rope_type to \"llama3\" (with factor, "
                 "low_freq_factor, high_freq_factor and original_max_position_embeddings), or set " +
                 name + " to null for plain RoPE");
        const std::string kind = as_string(*type, name + "." + type_key);
        if (const json* t = find(obj, "rope_theta"); t != nullptr && theta != nullptr)
            *theta = as_double(*t, name + ".rope_theta");
        if (kind == "default") return {};
        if (kind != "llama3")
            fail(name + "." + type_key + " = \"" + kind +
                 "\" is not supported: polevault supports only llama3 "
                 "RoPE scaling (rope_type \"llama3\") or none (" +
                 name +
                 " null), and its RoPE kernel does not "
                 "implement '" +
                 kind + "'; choose a model with llama3 scaling or none");
        auto field = [&](const std::string& key) -> const json& {
            const json* v = find(obj, key);
            if (v == nullptr)
                fail(name + " (rope_type \"llama3\") is missing " + key +
                     ": llama3 scaling needs factor, "
                     "low_freq_factor, high_freq_factor and original_max_position_embeddings (Llama 3.1 uses 8, 1, 4 "
                     "and 8192); add it from the model's published config.json");
            return *v;
        };
        RopeScaling s;
        s.factor = as_double(field("factor"), name + ".factor");
        s.low_freq_factor = as_double(field("low_freq_factor"), name + ".low_freq_factor");
        s.high_freq_factor = as_double(field("high_freq_factor"), name + ".high_freq_factor");
        s.original_max_position_embeddings =
            as_int(field("original_max_position_embeddings"), name + ".original_max_position_embeddings");
        // LlamaConfig reads factor 0 as "no scaling"; a llama3 object saying 0 is a mistake, not that.
        if (s.factor == 0.0)
            fail(name +
                 ".factor = 0 with rope_type \"llama3\": the factor divides the low frequencies, so it must be "
                 "positive (Llama 3.1 uses 8, Llama 3.2 uses 32); set " +
                 name + " to null for no scaling");
        return s;
    }
};

bool same_scaling(const RopeScaling& a, const RopeScaling& b) {
    return a.factor == b.factor && a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
           a.original_max_position_embeddings == b.original_max_position_embeddings;
}

}  // namespace

std::string hf_config_json(const LlamaConfig& c, const std::string& torch_dtype) {
    if (torch_dtype != "bfloat16" && torch_dtype != "float32" && torch_dtype != "float64")
        throw std::invalid_argument(
            "config.json torch_dtype '" + torch_dtype +
            "' is not a storage type polevault writes: use \"bfloat16\", \"float32\" or \"float64\"");
    validate_or_throw(c);  // a config.json for a model that cannot exist helps nobody

    // nlohmann::json keeps object keys sorted, which is also how transformers writes them.
    json j = json::object();
    j["architectures"] = json::array({"LlamaForCausalLM"});
    j["model_type"] = "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.ffn_size;
    j["num_hidden_layers"] = c.num_layers;
    j["num_attention_heads"] = c.num_heads;
    j["num_key_value_heads"] = c.num_kv_heads;
    j["head_dim"] = c.head_dim_resolved();
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    if (c.rope_scaling.enabled()) {
        j["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", c.rope_scaling.factor},
                             {"low_freq_factor", c.rope_scaling.low_freq_factor},
                             {"high_freq_factor", c.rope_scaling.high_freq_factor},
                             {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
    } else {
        j["rope_scaling"] = nullptr;
    }
    j["max_position_embeddings"] = c.max_seq_len;
    j["tie_word_embeddings"] = c.tie_embeddings;
    j["hidden_act"] = "silu";
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["torch_dtype"] = torch_dtype;
    // Doubles print in nlohmann's shortest round-trip form (1e-05, 500000.0); a trailing newline
    // as transformers writes.
    return j.dump(2) + "\n";
}

LlamaConfig parse_hf_config(const std::string& json_text, const std::string& origin) {
    const json root = parse_json_object(json_text, "config.json", origin, kNotJsonFix);
    const Reader r(root, origin);
    r.check_architecture();

    LlamaConfig c;
    c.name = origin;
    c.vocab_size = r.required_int("vocab_size", "the number of tokens the embedding holds");
    c.hidden_size = r.required_int("hidden_size", "the model width");
    c.ffn_size = r.required_int("intermediate_size", "the MLP width");
    c.num_layers = r.required_int("num_hidden_layers", "the number of transformer blocks");
    c.num_heads = r.required_int("num_attention_heads", "the number of query heads");
    c.num_kv_heads = r.optional_int("num_key_value_heads", c.num_heads, true);
    c.head_dim = r.optional_int("head_dim", 0, true);
    if (r.find("head_dim") != nullptr && !r.find("head_dim")->is_null() && c.head_dim <= 0)
        r.fail("head_dim = " + std::to_string(c.head_dim) +
               " must be positive: set the per-head width, or remove "
               "head_dim (or write null) to derive it as hidden_size / num_attention_heads");
    c.rms_norm_eps = r.optional_double("rms_norm_eps", kDefaultRmsNormEps);
    c.max_seq_len = r.optional_int("max_position_embeddings", kDefaultMaxPositionEmbeddings);
    c.tie_embeddings = r.optional_bool("tie_word_embeddings", false);

    c.rope_theta = r.optional_double("rope_theta", kDefaultRopeTheta);
    const json* scaling = r.find("rope_scaling");
    const json* parameters = r.find("rope_parameters");
    const bool has_scaling = scaling != nullptr && !scaling->is_null();
    if (has_scaling) c.rope_scaling = r.rope(*scaling, "rope_scaling", nullptr);
    if (parameters != nullptr && !parameters->is_null()) {
        // transformers 5's form; its rope_theta wins over the top-level key, as there.
        const RopeScaling from_parameters = r.rope(*parameters, "rope_parameters", &c.rope_theta);
        if (has_scaling && !same_scaling(from_parameters, c.rope_scaling))
            r.fail("rope_scaling = " + json_shown(*scaling) + " and rope_parameters = " + json_shown(*parameters) +
                   " disagree: transformers 5 reads only rope_parameters; remove rope_scaling or make the two agree");
        c.rope_scaling = from_parameters;
    }

    const std::string act = r.optional_string("hidden_act", "silu");
    if (act != "silu")
        r.fail("hidden_act = \"" + act +
               "\" is not supported: polevault's MLP is SwiGLU, silu(gate)·up; choose a "
               "model with hidden_act \"silu\"");
    if (r.optional_bool("attention_bias", false))
        r.fail(
            "attention_bias = true is not supported: polevault's attention projections have no biases, so the "
            "checkpoint's q/k/v/o bias weights would have nowhere to go; choose a model with attention_bias false");
    if (r.optional_bool("mlp_bias", false))
        r.fail(
            "mlp_bias = true is not supported: polevault's MLP projections have no biases, so the checkpoint's "
            "gate/up/down bias weights would have nowhere to go; choose a model with mlp_bias false");

    try {
        validate_or_throw(c);
    } catch (const std::invalid_argument& e) {
        // validate() speaks LlamaConfig's field names; give the config.json key of each one named.
        static const std::pair<const char*, const char*> renamed[] = {
            {"num_layers", "num_hidden_layers"},        {"num_heads", "num_attention_heads"},
            {"num_kv_heads", "num_key_value_heads"},    {"ffn_size", "intermediate_size"},
            {"max_seq_len", "max_position_embeddings"}, {"tie_embeddings", "tie_word_embeddings"}};
        std::string message = e.what();  // names the origin: it is c.name
        std::string keys;
        for (const auto& [ours, theirs] : renamed)
            if (message.find(std::string(ours) + " = ") != std::string::npos)
                keys += (keys.empty() ? "" : ", ") + std::string(ours) + " is " + theirs;
        if (!keys.empty()) message += "\n  (in config.json " + keys + ")";
        throw std::runtime_error(message);
    }
    return c;
}

LlamaConfig read_hf_config(const std::string& path) {
    auto fail = [&](const std::string& what) -> void {
        throw std::runtime_error("config.json '" + path + "': " + what);
    };
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail("is a directory: pass the config.json file inside it");
    verify_recorded_file(path);  // a checkpoint's: its sizes are trusted only once its checksum matches
    return parse_hf_config(read_input_file(path, "config.json", kMaxJsonFileBytes, "check the path"), path);
}

namespace {

// The JSON object in the file at `path`; `kind` names the file in errors.
json read_json_object(const std::string& path, const std::string& kind) {
    verify_recorded_file(path);  // a checkpoint's, as read_hf_config
    const std::string text = read_input_file(path, kind, kMaxJsonFileBytes, "check the path");
    return parse_json_object(text, kind, path, "is this a Hugging Face " + kind + "? Re-download or re-export it");
}

}  // namespace

std::string read_hf_torch_dtype(const std::string& path) {
    const json j = read_json_object(path, "config.json");
    const JsonReader r(j, "config.json", path);
    for (const char* key : {"torch_dtype", "dtype"}) {
        const json* v = r.find(key);
        if (v == nullptr || v->is_null()) continue;
        if (!v->is_string())
            r.fail(std::string(key) + " = " + json_shown(*v) + " is not a string (write e.g. \"bfloat16\")");
        return v->get<std::string>();
    }
    return "";
}

std::string generation_config_json(const GenerationConfig& g) {
    json j = json::object();
    if (g.bos_token_id >= 0) j["bos_token_id"] = g.bos_token_id;
    if (g.eos_token_ids.size() == 1) j["eos_token_id"] = g.eos_token_ids.front();
    if (g.eos_token_ids.size() > 1) j["eos_token_id"] = g.eos_token_ids;
    return j.dump(2) + "\n";
}

void write_generation_config(const std::string& path, const GenerationConfig& g) {
    const std::string text = generation_config_json(g);
    write_file_atomically(path, "generation_config.json",
                          [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

GenerationConfig read_generation_config(const std::string& path, int vocab_size) {
    const std::string kind = std::filesystem::path(path).filename().string();  // also a config.json's ids
    const json j = read_json_object(path, kind);
    const JsonReader r(j, kind, path);
    auto id = [&](const json& v, const std::string& key) {
        if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > INT_MAX)
            r.fail(key + " = " + json_shown(v) + " is not a token id (a non-negative integer)");
        if (vocab_size > 0 && v.get<long long>() >= vocab_size)
            r.fail(key + " = " + json_shown(v) + " is not a token of this model, whose ids are 0 to " +
                   std::to_string(vocab_size - 1) + " (config.json vocab_size " + std::to_string(vocab_size) +
                   "); correct the id or remove the key");
        return v.get<int>();
    };
    GenerationConfig g;
    if (const auto it = j.find("bos_token_id"); it != j.end() && !it->is_null())
        g.bos_token_id = id(*it, "bos_token_id");
    if (const auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
        if (it->is_array())
            for (const json& e : *it) g.eos_token_ids.push_back(id(e, "eos_token_id"));
        else
            g.eos_token_ids.push_back(id(*it, "eos_token_id"));
    }
    // Checked, not kept: transformers pads with it. Only generation_config.json's (Llama 1's
    // config.json says -1 for "none").
    if (const auto it = j.find("pad_token_id"); kind == "generation_config.json" && it != j.end() && !it->is_null())
        id(*it, "pad_token_id");
    return g;
}

LlamaConfig read_model_dir_config(const std::string& dir) {
    const std::filesystem::path d(dir);
    LlamaConfig c = read_hf_config((d / "config.json").string());
    std::error_code ec;
    if (std::filesystem::exists(d / "generation_config.json", ec))
        read_generation_config((d / "generation_config.json").string(), c.vocab_size);
    return c;
}

void write_hf_config(const std::string& path, const LlamaConfig& c, const std::string& torch_dtype) {
    const std::string text = hf_config_json(c, torch_dtype);  // throws before the file is touched
    write_file_atomically(path, "config.json", [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

}  // namespace pv
