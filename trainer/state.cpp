// trainer_state.json and metrics trimming (see state.h).
#include "trainer/state.h"

#include "io/durable_file.h"
#include "io/input_file.h"
#include "model/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace pv {

std::string checkpoint_path(const std::string& out_dir, long long step) {
    return (std::filesystem::path(out_dir) / ("step_" + std::to_string(step))).string();
}

std::string resolve_checkpoint(const std::string& path) {
    if (std::filesystem::is_regular_file(std::filesystem::path(path) / kTrainerStateFile)) return path;
    if (auto latest = latest_checkpoint(path, kTrainerStateFile)) return *latest;
    throw std::runtime_error("'" + path + "' is neither a checkpoint (a step_N directory with " + kTrainerStateFile +
                             ") nor an output directory containing one");
}

namespace {

std::string hex64(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace

void write_trainer_state(const std::string& path, const TrainerState& s) {
    nlohmann::json j;
    j["format"] = "polevault-checkpoint";
    j["version"] = 1;
    j["step"] = s.step;
    j["loader"] = {{"position", s.step}, {"samples", s.samples}};
    j["rng"] = {{"seed", s.seed}, {"generator", "Philox4x32-10 keyed by (seed, purpose, tensor, element, step)"}};
    j["dtype"] = s.dtype;
    j["data"] = {
        {"source", s.data_source}, {"train_tokens", s.train_tokens}, {"fingerprint", hex64(s.data_fingerprint)}};
    j["options"] = nlohmann::json::parse(train_options_json(s.options));
    if (s.options.lora_rank > 0)
        j["base"] = {{"path", s.options.init_from}, {"fingerprint", hex64(s.base_fingerprint)}};
    if (s.validation_windows > 0)
        j["validation"] = {{"windows", s.validation_windows}, {"micro_batch", s.validation_micro_batch}};
    if (!s.model_config.empty()) j["model"] = nlohmann::json::parse(s.model_config);
    if (!s.files.empty()) j["files"] = file_digests_json(s.files);
    j["checksum"] = checksum_hex(trainer_state_checksum(j));
    const std::string text = j.dump(2) + "\n";
    write_file_atomically(path, "trainer state", [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

namespace {

// A count the file holds at `pointer`: a JSON integer >= 0 (not 2.5, not "3", not -1).
long long count_at(const nlohmann::json& j, const char* pointer) {
    const nlohmann::json& v = j.at(nlohmann::json::json_pointer(pointer));
    std::string name = pointer + 1;  // "loader.samples" for "/loader/samples"
    std::replace(name.begin(), name.end(), '/', '.');
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<long long>() < 0) ||
        (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(LLONG_MAX)))
        throw std::runtime_error(name + " " + v.dump() + " is not a count (an integer >= 0)");
    return v.get<long long>();
}

// A 64-bit fingerprint the file holds at `pointer` as hexadecimal text (1 to 16 digits).
uint64_t hex_at(const nlohmann::json& j, const char* pointer) {
    const nlohmann::json& v = j.at(nlohmann::json::json_pointer(pointer));
    std::string name = pointer + 1;  // "loader.samples" for "/loader/samples"
    std::replace(name.begin(), name.end(), '/', '.');
    const std::string hex = v.is_string() ? v.get<std::string>() : v.dump();
    if (!v.is_string() || hex.empty() || hex.size() > 16 ||
        hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        throw std::runtime_error(name + " \"" + hex + "\" is not a hexadecimal fingerprint (1 to 16 digits)");
    return std::stoull(hex, nullptr, 16);
}

// A checkpoint's directory is step_N for its step N: a trainer_state.json whose step says otherwise
// (edited, or copied from another checkpoint) would resume at the wrong step on these weights.
void check_step_directory(const std::string& path, long long step) {
    const std::string dir = std::filesystem::path(path).parent_path().filename().string();
    if (dir.rfind("step_", 0) != 0) return;  // a copy under another name: nothing to compare
    const std::string digits = dir.substr(5);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return;
    if (digits != std::to_string(step))
        throw std::runtime_error("step " + std::to_string(step) + " is not its directory's " + dir +
                                 ": the file belongs to another checkpoint; restore " + dir +
                                 "'s own trainer_state.json");
}

}  // namespace

TrainerState read_trainer_state(const std::string& path) {
    const std::string text =
        read_input_file(path, "trainer state", kMaxJsonFileBytes, "is this a polevault checkpoint directory?");
    TrainerState s;
    try {
        const nlohmann::json j = nlohmann::json::parse(text);
        if (j.value("format", "") != "polevault-checkpoint")
            throw std::runtime_error("its \"format\" is not \"polevault-checkpoint\"");
        if (j.at("version").get<int>() != 1)
            throw std::runtime_error("version " + j.at("version").dump() +
                                     " is not 1; use the polevault that wrote it");
        check_trainer_state_checksum(j);
        s.step = count_at(j, "/step");
        s.samples = count_at(j, "/loader/samples");
        if (const long long position = count_at(j, "/loader/position"); position != s.step)
            throw std::runtime_error("loader.position " + std::to_string(position) + " is not its step " +
                                     std::to_string(s.step) + " (the loader's position is the step)");
        const nlohmann::json& seed = j.at("rng").at("seed");
        if (!seed.is_number_unsigned()) throw std::runtime_error("rng.seed " + seed.dump() + " is not an unsigned integer");
        s.seed = seed.get<uint64_t>();
        s.dtype = j.at("dtype").get<std::string>();
        s.data_source = j.at("data").at("source").get<std::string>();
        s.train_tokens = count_at(j, "/data/train_tokens");
        s.data_fingerprint = hex_at(j, "/data/fingerprint");
        s.options = train_options_from_json(j.at("options").dump());
        if (s.dtype != s.options.dtype)
            throw std::runtime_error("dtype \"" + s.dtype + "\" differs from options.dtype \"" + s.options.dtype + "\"");
        if (s.options.lora_rank > 0) s.base_fingerprint = hex_at(j, "/base/fingerprint");
        if (j.contains("validation")) {
            s.validation_windows = count_at(j, "/validation/windows");
            const long long m = count_at(j, "/validation/micro_batch");
            if (m < 1 || m > INT_MAX) throw std::runtime_error("validation.micro_batch " + std::to_string(m) + " is not >= 1");
            s.validation_micro_batch = int(m);
        }
        if (j.contains("model")) {
            if (!j["model"].is_object()) throw std::runtime_error("\"model\" is not an object (a config.json)");
            s.model_config = j["model"].dump();
        }
        if (j.contains("files")) s.files = parse_file_digests(j["files"]);
        if (s.samples != s.step * (long long)s.options.batch)
            throw std::runtime_error("loader.samples " + std::to_string(s.samples) + " is not step " +
                                     std::to_string(s.step) + " x options.batch " + std::to_string(s.options.batch));
        check_step_directory(path, s.step);
    } catch (const std::exception& e) {
        throw std::runtime_error("trainer state '" + path + "': " + e.what());
    }
    return s;
}

uint64_t model_files_fingerprint(const std::string& dir) {
    namespace fs = std::filesystem;
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](const void* data, size_t n) {
        for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
    };
    auto read_bytes = [&](const fs::path& p, size_t max) {
        const InputFile f = open_input_file(p.string(), "base model file", "needed to fingerprint the base model");
        std::string bytes(size_t(std::min<uint64_t>(f.size(), max)), '\0');
        f.pread_exact(bytes.data(), bytes.size(), 0);
        return bytes;
    };
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
    if (ec) throw std::runtime_error("cannot list " + dir + " to fingerprint the base model: " + ec.message());
    std::sort(files.begin(), files.end());
    const std::string config = read_bytes(fs::path(dir) / "config.json", size_t(1) << 20);
    mix(config.data(), config.size());
    for (const fs::path& p : files) {
        const std::string name = p.filename().string();
        const uint64_t size = fs::file_size(p);
        mix(name.data(), name.size());
        mix(&size, sizeof size);
        const std::string head = read_bytes(p, 8);
        uint64_t header = 0;
        for (size_t i = 0; i < head.size(); ++i) header |= uint64_t(uint8_t(head[i])) << (8 * i);
        const std::string json = read_bytes(p, size_t(8 + std::min<uint64_t>(header, uint64_t(100) << 20)));
        mix(json.data(), json.size());
    }
    return h;
}

uint64_t fingerprint_tokens(const std::vector<uint32_t>& tokens, uint64_t h) {
    for (uint32_t t : tokens)
        for (int b = 0; b < 4; ++b) h = (h ^ ((t >> (8 * b)) & 0xFF)) * 0x100000001b3ull;
    return h;
}

MetricsCopy copy_metrics(const std::string& from, const std::string& to, long long step) {
    MetricsCopy c;
    std::ifstream in(from);
    if (!in) return c;
    c.found = true;
    std::string kept, line;
    while (std::getline(in, line)) {
        long long s = -1;
        try {
            s = nlohmann::json::parse(line).at("step").get<long long>();
        } catch (const std::exception&) {
            continue;  // a torn last line from a crash
        }
        if (s <= step)
            kept += line + "\n", ++c.kept;
        else
            ++c.dropped;
    }
    in.close();
    write_file_atomically(to, "metrics", [&](const ByteSink& sink) { sink(kept.data(), kept.size()); });
    return c;
}

}  // namespace pv
