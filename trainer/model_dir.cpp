// Model directories for sampling and evaluation (see model_dir.h).
#include "trainer/model_dir.h"

#include "model/checkpoint.h"
#include "model/config_json.h"
#include "trainer/state.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace pv {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read '" + path + "'");
    std::stringstream text;
    text << f.rdbuf();
    try {
        return json::parse(text.str());
    } catch (const json::exception& e) {
        throw std::runtime_error("'" + path + "' is not valid JSON: " + e.what());
    }
}

// A token id key: absent or null -> nothing; an int -> it; a list of ints -> them.
std::vector<int> token_ids(const json& j, const char* key, const std::string& file) {
    if (!j.contains(key) || j.at(key).is_null()) return {};
    const json& v = j.at(key);
    auto one = [&](const json& x) {
        if (!x.is_number_integer() || x.get<long long>() < 0)
            throw std::runtime_error("'" + file + "': \"" + key + "\" holds " + x.dump() +
                                     ", which is not a token id (a non-negative integer)");
        return x.get<int>();
    };
    if (v.is_array()) {
        std::vector<int> out;
        for (const json& x : v) out.push_back(one(x));
        return out;
    }
    return {one(v)};
}

std::string dtype_of_torch(const json& config, const std::string& file) {
    const char* key = config.contains("torch_dtype") ? "torch_dtype" : config.contains("dtype") ? "dtype" : nullptr;
    if (!key || config.at(key).is_null()) return "fp32";
    const json& v = config.at(key);
    const std::string name = v.is_string() ? v.get<std::string>() : v.dump();
    if (name == "bfloat16") return "bf16";
    if (name == "float32" || name == "float16") return "fp32";
    if (name == "float64") return "fp64";
    throw std::runtime_error("'" + file + "': \"" + key + "\" is " + v.dump() +
                             ", which polevault does not load; choose a storage type with --dtype bf16|fp32|fp64");
}

}  // namespace

ModelDir open_model_dir(const std::string& given) {
    ModelDir m;
    if (!fs::is_directory(given)) throw std::runtime_error("'" + given + "' is not a directory");
    if (fs::is_regular_file(fs::path(given) / kTrainerStateFile)) {
        m.path = given, m.checkpoint = true;
    } else if (auto latest = latest_checkpoint(given, kTrainerStateFile)) {
        m.path = *latest, m.checkpoint = true;
    } else if (fs::is_regular_file(fs::path(given) / "config.json")) {
        m.path = given;
    } else {
        throw std::runtime_error("'" + given + "' is neither a polevault checkpoint (a step_N directory with " +
                                 kTrainerStateFile +
                                 ", or an output directory holding one) nor a Hugging Face model directory "
                                 "(config.json with safetensors weights)");
    }
    const std::string config_path = (fs::path(m.path) / "config.json").string();
    m.config = read_hf_config(config_path);
    const json config = read_json(config_path);
    if (m.checkpoint) {
        const TrainerState state = read_trainer_state((fs::path(m.path) / kTrainerStateFile).string());
        m.step = state.step, m.dtype = state.dtype, m.seq_len = state.options.seq_len;
    } else {
        m.dtype = dtype_of_torch(config, config_path);
    }
    if (fs::is_regular_file(fs::path(m.path) / "tokenizer.json"))
        m.tokenizer = (fs::path(m.path) / "tokenizer.json").string();
    const std::string generation_path = (fs::path(m.path) / "generation_config.json").string();
    const bool generation = fs::is_regular_file(generation_path);
    const json ids = generation ? read_json(generation_path) : config;
    const std::string ids_file = generation ? generation_path : config_path;
    m.eos_ids = token_ids(ids, "eos_token_id", ids_file);
    const std::vector<int> bos = token_ids(ids, "bos_token_id", ids_file);
    if (bos.size() > 1) throw std::runtime_error("'" + ids_file + "': \"bos_token_id\" must be one id, not a list");
    m.bos_id = bos.empty() ? -1 : bos.front();
    return m;
}

}  // namespace pv
