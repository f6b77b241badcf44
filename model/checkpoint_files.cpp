// Checking a checkpoint's files before loading (model/checkpoint_files.h).
#include "model/checkpoint_files.h"

#include "formats/config_json.h"
#include "io/checksum.h"
#include "io/input_file.h"
#include "io/progress.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace pv {

namespace fs = std::filesystem;

nlohmann::json file_digests_json(const FileDigests& files) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, digest] : files) j[name] = {{"bytes", digest.bytes}, {"xxh3", checksum_hex(digest.xxh3)}};
    return j;
}

FileDigests parse_file_digests(const nlohmann::json& files) {
    if (!files.is_object()) throw std::runtime_error("\"files\" is not an object of file name -> {bytes, xxh3}");
    FileDigests out;
    for (const auto& [name, f] : files.items()) {
        const std::string field = "files.\"" + name + "\"";
        if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
            name == kTrainerStateFile)
            throw std::runtime_error(field + " is not the name of another file of the checkpoint directory");
        if (!f.is_object() || !f.contains("bytes") || !f["bytes"].is_number_unsigned() || !f.contains("xxh3") ||
            !f["xxh3"].is_string())
            throw std::runtime_error(field + " is not {\"bytes\": <size>, \"xxh3\": \"<16 hex digits>\"}");
        out[name] = {f["bytes"].get<uint64_t>(), parse_checksum_hex(f["xxh3"].get<std::string>(), field + ".xxh3")};
    }
    return out;
}

uint64_t trainer_state_checksum(nlohmann::json state) {
    state.erase("checksum");
    const std::string text = state.dump();
    Xxh3 h;
    h.update(text.data(), text.size());
    return h.digest();
}

void check_trainer_state_checksum(const nlohmann::json& state) {
    if (!state.is_object() || !state.contains("checksum")) return;
    const nlohmann::json& v = state.at("checksum");
    const uint64_t recorded = parse_checksum_hex(v.is_string() ? v.get<std::string>() : v.dump(), "checksum");
    if (recorded != trainer_state_checksum(state))
        throw std::runtime_error("its contents do not match its checksum " + checksum_hex(recorded) +
                                 ": the file was edited or damaged after it was written (a changed step, dtype or "
                                 "option would continue another run than the one saved); restore it from a copy of "
                                 "the checkpoint");
}

FileDigests recorded_file_digests(const std::string& dir) {
    const std::string path = (fs::path(dir) / kTrainerStateFile).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) return {};
    const std::string text = read_input_file(path, "trainer state", kMaxJsonFileBytes);
    try {
        const nlohmann::json j = nlohmann::json::parse(text);
        check_trainer_state_checksum(j);
        if (!j.is_object() || !j.contains("files")) return {};
        return parse_file_digests(j["files"]);
    } catch (const std::exception& e) {
        throw std::runtime_error("trainer state '" + path + "': " + e.what());
    }
}

std::vector<std::string> missing_optimizer_files(const std::string& dir, bool has_master, bool allow_inexact) {
    std::vector<std::string> needed;
    if (has_master) needed.push_back("master.safetensors");
    needed.push_back("adam_m.safetensors");
    needed.push_back("adam_v.safetensors");
    std::vector<std::string> missing;
    for (const std::string& name : needed) {
        std::error_code ec;
        if (fs::exists(fs::path(dir) / name, ec)) continue;
        if (!allow_inexact) {
            const std::string what = name == "master.safetensors"
                                         ? "the fp32 master weights: without them the master would be rebuilt from "
                                           "the rounded bf16 weights"
                                         : "Adam's " + std::string(name == "adam_m.safetensors" ? "first" : "second") +
                                               " moment: without it Adam would restart from zero";
            throw std::runtime_error("checkpoint '" + dir + "' has no " + name + " (" + what +
                                     ", so the resumed run would not continue the saved one bit for bit); restore "
                                     "the file, resume from another checkpoint, or pass " +
                                     kAllowInexactResumeFlag + " to accept the loss of exactness");
        }
        missing.push_back(name);
    }
    return missing;
}

namespace {

// Checks one file against what trainer_state.json recorded for it.
void verify_file(const std::string& path, const FileDigest& recorded) {
    const std::string fix = "; restore it, or resume from another checkpoint";
    const FileDigest found = digest_file(path, "checkpoint file");
    if (found.bytes != recorded.bytes)
        throw std::runtime_error("checkpoint file '" + path + "' is " + std::to_string(found.bytes) + " bytes, but " +
                                 kTrainerStateFile + " records " + std::to_string(recorded.bytes) +
                                 ": it was truncated or replaced after the checkpoint was written" + fix);
    if (found.xxh3 != recorded.xxh3)
        throw std::runtime_error("checkpoint file '" + path + "' has XXH3 checksum " + checksum_hex(found.xxh3) +
                                 ", but " + kTrainerStateFile + " records " + checksum_hex(recorded.xxh3) +
                                 ": its bytes changed after the checkpoint was written (a flipped bit, an edited "
                                 "header or value)" +
                                 fix);
}

}  // namespace

void verify_checkpoint_files(const std::string& dir, const FileDigests& files, int rank, int ranks,
                             const std::vector<std::string>& absent_ok) {
    double bytes = 0;  // of the files this rank verifies
    int counted = 0;
    for (const auto& [name, recorded] : files)
        if (counted++ % ranks == rank) bytes += double(recorded.bytes);
    Progress progress("verifying the checksums of " + dir, bytes);  // digest_file reports to it
    int index = 0;
    for (const auto& [name, recorded] : files) {  // std::map: name order, the same on every rank
        if (index++ % ranks != rank) continue;
        const std::string path = (fs::path(dir) / name).string();
        std::error_code ec;
        if (!fs::exists(fs::symlink_status(path, ec))) {
            if (std::find(absent_ok.begin(), absent_ok.end(), name) != absent_ok.end()) continue;
            throw std::runtime_error("checkpoint file '" + path + "' is missing (" + kTrainerStateFile +
                                     " lists it as written with the checkpoint); restore it, or resume from "
                                     "another checkpoint");
        }
        verify_file(path, recorded);
    }
}

void verify_recorded_file(const std::string& path) {
    const fs::path p(path);
    const FileDigests files = recorded_file_digests(p.parent_path().empty() ? "." : p.parent_path().string());
    const auto it = files.find(p.filename().string());
    if (it != files.end()) verify_file(path, it->second);
}

void verify_model_dir_metadata(const std::string& dir) {
    FileDigests files = recorded_file_digests(dir);
    std::erase_if(files, [](const auto& f) { return f.first.ends_with(".safetensors"); });
    verify_checkpoint_files(dir, files, 0, 1);
}

bool verify_model_dir_files(const std::string& dir, int rank, int ranks) {
    const FileDigests files = recorded_file_digests(dir);
    if (files.empty()) return false;
    verify_checkpoint_files(dir, files, rank, ranks);
    return true;
}

void check_checkpoint_config(const std::string& dir, const std::string& model_config) {
    if (model_config.empty()) return;  // an older build's checkpoint
    const std::string path = (fs::path(dir) / "config.json").string();
    // Both through the same parser and writer, so only what the model uses is compared. Parsed
    // without its checksum (read_hf_config would refuse the edit by it first): naming the fields
    // edited says more, and nothing is sized from it here.
    const nlohmann::json now = nlohmann::json::parse(
        hf_config_json(parse_hf_config(read_input_file(path, "config.json", kMaxJsonFileBytes), path)));
    const nlohmann::json then =
        nlohmann::json::parse(hf_config_json(parse_hf_config(model_config, std::string(kTrainerStateFile) + " model")));
    std::string differences;
    for (const auto& [key, value] : then.items()) {
        const nlohmann::json other = now.contains(key) ? now[key] : nlohmann::json();
        if (other != value)
            differences += std::string(differences.empty() ? "" : ", ") + key + " " + other.dump() +
                           " (the run that wrote it used " + value.dump() + ")";
    }
    for (const auto& [key, value] : now.items())
        if (!then.contains(key))
            differences +=
                std::string(differences.empty() ? "" : ", ") + key + " " + value.dump() + " (not in the run)";
    if (!differences.empty())
        throw std::runtime_error(path + " was edited after the checkpoint was written: " + differences +
                                 "; resuming would train another model than the one saved. Restore the file (" +
                                 kTrainerStateFile + " \"model\" holds the original), or start a new run with " +
                                 "--init-from " + dir + " and the changed config");
}

}  // namespace pv
