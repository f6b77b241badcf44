// Hugging Face model directories and ranged tensor reads (formats/hf_checkpoint.h).
#include "formats/hf_checkpoint.h"

#include "formats/dtype_conversion.h"
#include "io/input_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace pv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
    throw std::runtime_error("model '" + origin + "': " + what);
}

std::string read_text(const std::string& path, const std::string& origin) {
    try {
        return read_input_file(path, "file", kMaxJsonFileBytes);
    } catch (const std::runtime_error& e) {
        fail(origin, e.what());
    }
}

// A shard's name from the index: a file inside the directory, never a path out of it.
void check_shard_name(const std::string& index, const std::string& tensor, const std::string& file) {
    const fs::path p(file);
    bool escapes = file.empty() || p.is_absolute();
    for (const fs::path& part : p) escapes |= part == "..";
    if (escapes)
        fail(index, "weight_map maps '" + tensor + "' to \"" + file +
                        "\", which is not a file inside the model directory (the index is corrupt; re-save the model)");
}

}  // namespace

HfCheckpoint HfCheckpoint::open_file(const std::string& path) {
    HfCheckpoint c;
    c.origin_ = path;
    c.readers_.push_back(std::make_unique<SafeTensorsReader>(path));
    for (const SafeTensorInfo& t : c.readers_.front()->tensors()) {
        c.by_name_[t.name] = {0, &t};
        c.order_.push_back(&t);
    }
    return c;
}

HfCheckpoint HfCheckpoint::open_dir(const std::string& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(dir, "is not a directory (pass a Hugging Face model directory)");
    const fs::path single = fs::path(dir) / kSafetensorsFile, index = fs::path(dir) / kSafetensorsIndexFile;
    if (fs::exists(single, ec)) {
        HfCheckpoint c = open_file(single.string());
        c.origin_ = dir;
        return c;
    }
    if (!fs::exists(index, ec)) {
        for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.bin"})
            if (fs::exists(fs::path(dir) / pickle, ec))
                fail(dir, std::string("holds ") + pickle +
                              " (PyTorch pickle weights), which polevault does not read: save the model as "
                              "safetensors, e.g. model.save_pretrained(dir) with a recent transformers");
        fail(dir, std::string("has neither ") + kSafetensorsFile + " nor " + kSafetensorsIndexFile +
                      " (is this a Hugging Face model directory?)");
    }

    const std::string where = index.string();
    json j;
    try {
        j = json::parse(read_text(where, dir));
    } catch (const json::exception& e) {
        fail(where, std::string("not valid JSON (") + e.what() + "); re-save the model");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail(where, "has no \"weight_map\" object naming each tensor's file (the index is corrupt; re-save the model)");
    std::map<std::string, std::set<std::string>> by_file;  // file -> the tensors the index puts there
    for (const auto& [tensor, file] : j["weight_map"].items()) {
        if (!file.is_string())
            fail(where,
                 "weight_map entry '" + tensor + "' is " + file.dump() + ", not a file name (re-save the model)");
        check_shard_name(where, tensor, file.get<std::string>());
        by_file[file.get<std::string>()].insert(tensor);
    }
    if (by_file.empty()) fail(where, "weight_map is empty: the model has no tensors (re-save the model)");

    HfCheckpoint c;
    c.origin_ = dir;
    for (const auto& [file, names] : by_file) {  // file order: the shards' numbering
        const std::string path = (fs::path(dir) / file).string();
        if (!fs::exists(path, ec))
            fail(dir, "the index maps '" + *names.begin() + "' to " + file +
                          ", which is missing (an incomplete download? fetch every shard the index names)");
        c.readers_.push_back(std::make_unique<SafeTensorsReader>(path));
    }
    // Every tensor the index names is where it says, then every shard holds only those.
    size_t k = 0;
    for (const auto& [file, names] : by_file) {
        for (const std::string& name : names)
            if (!c.readers_[k]->find(name))
                fail(dir, "the index maps '" + name + "' to " + file +
                              ", which does not hold it (the index and the shards do not belong together; "
                              "re-download the model)");
        ++k;
    }
    k = 0;
    for (const auto& [file, names] : by_file) {
        for (const SafeTensorInfo& t : c.readers_[k]->tensors()) {
            if (!names.count(t.name))
                fail(dir,
                     file + " holds '" + t.name + "', which the index " +
                         (j["weight_map"].contains(t.name) ? "puts in " + j["weight_map"][t.name].get<std::string>()
                                                           : std::string("does not list")) +
                         " (a stale or mixed-up shard; re-download the model)");
            c.by_name_[t.name] = {k, &t};
            c.order_.push_back(&t);
        }
        ++k;
    }
    return c;
}

std::vector<std::string> HfCheckpoint::files() const {
    std::vector<std::string> out;
    for (const auto& r : readers_) out.push_back(r->path());
    return out;
}

const SafeTensorInfo* HfCheckpoint::find(const std::string& name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second.second;
}

const std::string& HfCheckpoint::file_of(const std::string& name) const {
    const auto it = by_name_.find(name);
    if (it == by_name_.end()) fail(origin_, "has no tensor '" + name + "'");
    return readers_[it->second.first]->path();
}

uint64_t HfCheckpoint::read(const std::string& name, uint64_t first, uint64_t count, DType to, void* dst) {
    const auto it = by_name_.find(name);
    if (it == by_name_.end()) fail(origin_, "has no tensor '" + name + "'");
    SafeTensorsReader& reader = *readers_[it->second.first];
    const SafeTensorInfo& t = *it->second.second;
    if (!is_float_dtype(t.dtype))
        fail(reader.path(), "tensor '" + name + "' has dtype " + t.dtype +
                                ", which parameters cannot be loaded from (supported: BF16, F16, F32, F64; convert "
                                "the tensor to one of them)");
    if (first > t.numel() || count > t.numel() - first)
        fail(reader.path(), "elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
                                ") lie outside tensor '" + name + "' of " + std::to_string(t.numel()) + " elements");
    const size_t in = safetensors_dtype_size(t.dtype), out = dtype_size(to);
    const uint64_t chunk = kReadChunkBytes / in;
    auto* target = static_cast<uint8_t*>(dst);
    uint64_t overflows = 0;
    for (uint64_t done = 0; done < count;) {
        const uint64_t n = std::min(chunk, count - done);
        staging_.resize(static_cast<size_t>(n * in));
        reader.read(t, (first + done) * in, n * in, staging_.data());
        overflows += convert_elements(staging_.data(), t.dtype, target + done * out, to, static_cast<size_t>(n));
        done += n;
    }
    return overflows;
}

void HfCheckpoint::read_bytes(const std::string& name, uint64_t offset, uint64_t bytes, void* dst) const {
    const auto it = by_name_.find(name);
    if (it == by_name_.end()) fail(origin_, "has no tensor '" + name + "'");
    SafeTensorsReader& reader = *readers_[it->second.first];
    const SafeTensorInfo& t = *it->second.second;
    if (offset > t.bytes || bytes > t.bytes - offset)
        fail(reader.path(), "bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                                ") lie outside tensor '" + name + "' of " + std::to_string(t.bytes) + " bytes");
    reader.read(t, offset, bytes, dst);
}

uint64_t HfCheckpoint::bytes_read() const {
    uint64_t n = 0;
    for (const auto& r : readers_) n += r->bytes_read();
    return n;
}

uint64_t HfCheckpoint::header_bytes() const {
    uint64_t n = 0;
    for (const auto& r : readers_) n += r->header_bytes();
    return n;
}

}  // namespace pv
