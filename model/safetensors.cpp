// safetensors writer and reader; the format is described in model/safetensors.h.
#include "model/safetensors.h"

#include "io/durable_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace pv {
namespace {

using json = nlohmann::json;

std::string os_error(int err) { return std::strerror(err); }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw std::runtime_error("safetensors '" + path + "': " + what);
}

[[noreturn]] void invalid(const std::string& path, const std::string& what) {
    throw std::invalid_argument("safetensors '" + path + "': " + what);
}

// A header's structural fault is a foreign or corrupt file; say so and what to do.
const char* const kRewrite = " (the file is corrupt or not a safetensors file; re-export it)";

// product(shape) · element size, or nothing when it overflows or a dimension is negative.
bool byte_size(const std::vector<int64_t>& shape, size_t element, uint64_t& out) {
    uint64_t n = element;
    for (const int64_t d : shape) {
        if (d < 0) return false;
        const auto u = static_cast<uint64_t>(d);
        if (u != 0 && n > std::numeric_limits<uint64_t>::max() / u) return false;
        n *= u;
    }
    out = n;
    return true;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
    static const std::map<std::string, size_t> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
    };
    const auto it = sizes.find(dtype);
    if (it == sizes.end()) {
        std::string known;
        for (const auto& [name, size] : sizes) known += (known.empty() ? "" : ", ") + name;
        throw std::invalid_argument("unknown safetensors dtype '" + dtype + "' (known: " + known + ")");
    }
    return it->second;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (const SafeTensor& t : tensors) {
        if (t.name.empty()) invalid(path, "a tensor has an empty name");
        if (t.name == "__metadata__") invalid(path, "a tensor cannot be named '__metadata__' (reserved)");
        if (header.contains(t.name)) invalid(path, "duplicate tensor name '" + t.name + "'");
        size_t element = 0;
        try {
            element = safetensors_dtype_size(t.dtype);
        } catch (const std::invalid_argument& e) {
            invalid(path, "tensor '" + t.name + "': " + e.what());
        }
        uint64_t bytes = 0;
        if (!byte_size(t.shape, element, bytes))
            invalid(path, "tensor '" + t.name + "': shape " + shape_string(t.shape) +
                              " has a negative dimension or overflows");
        if (bytes != t.data.size())
            invalid(path, "tensor '" + t.name + "': " + std::to_string(t.data.size()) + " bytes of data, but " +
                              t.dtype + " " + shape_string(t.shape) + " needs " + std::to_string(bytes));
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }

    // Pad with spaces so that the buffer (at 8 + N) starts 8-byte aligned.
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    uint8_t prefix[8];
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

    write_file_atomically(path, "safetensors", [&](const ByteSink& sink) {
        sink(prefix, sizeof prefix);
        sink(text.data(), text.size());
        for (const SafeTensor& t : tensors) sink(t.data.data(), t.data.size());
    });
}

const SafeTensor& SafeTensorsFile::at(const std::string& name) const {
    for (const SafeTensor& t : tensors)
        if (t.name == name) return t;
    fail(path, "no tensor named '" + name + "' (the file holds " + std::to_string(tensors.size()) +
                   " tensors; was it written for a different model or configuration?)");
}

SafeTensorsFile read_safetensors(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, "cannot open: " + os_error(errno) + " (check the path)");
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (in.bad()) fail(path, "read failed: " + os_error(errno));

    if (bytes.size() < 8)
        fail(path,
             "file is " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length" + kRewrite);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
    if (n > bytes.size() - 8)
        fail(path, "header length " + std::to_string(n) + " runs past the end of the " + std::to_string(bytes.size()) +
                       "-byte file (truncated?)" + kRewrite);
    const std::string text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(n));

    json header;
    try {
        header = json::parse(text);
    } catch (const json::exception& e) {
        fail(path, std::string("header is not valid JSON: ") + e.what() + kRewrite);
    }
    if (!header.is_object()) fail(path, std::string("header is not a JSON object") + kRewrite);

    const uint64_t base = 8 + n;
    const uint64_t buffer = bytes.size() - base;
    SafeTensorsFile file;
    file.path = path;
    struct Span {
        uint64_t begin, end;
        size_t index;
    };
    std::vector<Span> spans;
    for (const auto& [key, value] : header.items()) {
        if (key == "__metadata__") {
            if (!value.is_object()) fail(path, std::string("__metadata__ is not a JSON object") + kRewrite);
            for (const auto& [k, v] : value.items()) {
                if (!v.is_string()) fail(path, "__metadata__ entry '" + k + "' is not a string" + kRewrite);
                file.metadata[k] = v.get<std::string>();
            }
            continue;
        }
        const std::string where = "tensor '" + key + "': ";
        if (!value.is_object()) fail(path, where + "entry is not a JSON object" + kRewrite);
        for (const char* field : {"dtype", "shape", "data_offsets"})
            if (!value.contains(field)) fail(path, where + "missing \"" + field + "\"" + kRewrite);
        SafeTensor t;
        t.name = key;
        if (!value["dtype"].is_string()) fail(path, where + "\"dtype\" is not a string" + kRewrite);
        t.dtype = value["dtype"].get<std::string>();
        size_t element = 0;
        try {
            element = safetensors_dtype_size(t.dtype);
        } catch (const std::invalid_argument& e) {
            fail(path, where + e.what() + " (written by a newer safetensors? convert the tensor to a supported dtype)");
        }
        const json& shape = value["shape"];
        if (!shape.is_array()) fail(path, where + "\"shape\" is not an array" + kRewrite);
        for (const json& d : shape) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0)
                fail(path, where + "\"shape\" " + shape.dump() + " holds something other than a non-negative integer" +
                               kRewrite);
            t.shape.push_back(d.get<int64_t>());
        }
        const json& offsets = value["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
            !offsets[1].is_number_unsigned())
            fail(path,
                 where + "\"data_offsets\" " + offsets.dump() + " is not a pair of non-negative integers" + kRewrite);
        const auto begin = offsets[0].get<uint64_t>();
        const auto end = offsets[1].get<uint64_t>();
        if (begin > end || end > buffer)
            fail(path, where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                           "] lie outside the " + std::to_string(buffer) + "-byte data buffer (truncated?)" + kRewrite);
        uint64_t expected = 0;
        if (!byte_size(t.shape, element, expected))
            fail(path, where + "shape " + shape_string(t.shape) + " overflows" + kRewrite);
        if (end - begin != expected)
            fail(path, where + "data_offsets span " + std::to_string(end - begin) + " bytes, but " + t.dtype + " " +
                           shape_string(t.shape) + " needs " + std::to_string(expected) + kRewrite);
        spans.push_back({begin, end, file.tensors.size()});
        file.tensors.push_back(std::move(t));
    }

    // The tensors must tile the buffer exactly: sorted by offset, each starts where the last ended.
    // Zero-sized tensors sort before a non-empty one at the same offset so that they tile too.
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    std::vector<SafeTensor> ordered;
    ordered.reserve(spans.size());
    for (const Span& s : spans) {
        SafeTensor& t = file.tensors[s.index];
        if (s.begin < at)
            fail(path, "tensor '" + t.name + "': data_offsets [" + std::to_string(s.begin) + ", " +
                           std::to_string(s.end) + "] overlap the previous tensor, which ends at " +
                           std::to_string(at) + kRewrite);
        if (s.begin > at)
            fail(path, "tensor '" + t.name + "': data_offsets [" + std::to_string(s.begin) + ", " +
                           std::to_string(s.end) + "] leave a gap after byte " + std::to_string(at) + kRewrite);
        t.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(base + s.begin),
                      bytes.begin() + static_cast<std::ptrdiff_t>(base + s.end));
        at = s.end;
        ordered.push_back(std::move(t));
    }
    if (at != buffer)
        fail(path, std::to_string(buffer - at) + " trailing bytes after the last tensor (which ends at " +
                       std::to_string(at) + " of the " + std::to_string(buffer) + "-byte buffer)" + kRewrite);
    file.tensors = std::move(ordered);
    return file;
}

}  // namespace pv
