// safetensors writer and reader; the format is described in formats/safetensors.h.
#include "formats/safetensors.h"

#include "io/input_file.h"
#include "io/durable_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

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

// The specification's limit on the JSON header (the Rust reader's MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

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

// pread until `bytes` bytes are in, retrying interrupted and short reads.
void read_at(int fd, const std::string& path, void* dst, uint64_t bytes, uint64_t offset) {
    auto* out = static_cast<uint8_t*>(dst);
    while (bytes > 0) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{1} << 30));
        const ssize_t got = ::pread(fd, out, want, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail(path, "read failed at byte " + std::to_string(offset) + ": " + os_error(errno));
        if (got == 0)
            fail(path, "ends at byte " + std::to_string(offset) +
                           ", before the data its header describes (was it truncated or rewritten while being read?)");
        out += got, bytes -= static_cast<uint64_t>(got), offset += static_cast<uint64_t>(got);
    }
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

uint64_t SafeTensorInfo::numel() const {
    uint64_t n = 1;
    for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
}

void write_safetensors_streamed(const std::string& path, const std::vector<SafeTensorInfo>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<void(size_t index, const ByteSink& sink)>& write_tensor) {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    std::vector<uint64_t> sizes;
    for (const SafeTensorInfo& t : tensors) {
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
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
        sizes.push_back(bytes);
    }

    // Pad with spaces so that the buffer (at 8 + N) starts 8-byte aligned.
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    uint8_t prefix[8];
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

    write_file_atomically(path, "safetensors", [&](const ByteSink& sink) {
        sink(prefix, sizeof prefix);
        sink(text.data(), text.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
            uint64_t written = 0;
            write_tensor(i, [&](const void* data, size_t bytes) {
                written += bytes;
                if (written <= sizes[i]) sink(data, bytes);
            });
            if (written != sizes[i])  // the header would lie about the buffer: never publish the file
                throw std::logic_error("safetensors '" + path + "': tensor '" + tensors[i].name + "' was given " +
                                       std::to_string(written) + " bytes, but " + tensors[i].dtype + " " +
                                       shape_string(tensors[i].shape) + " needs " + std::to_string(sizes[i]));
        }
    });
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    std::vector<SafeTensorInfo> infos;
    for (const SafeTensor& t : tensors) {
        // The data must match the shape before anything is written (a caller's bug, not I/O).
        size_t element = 0;
        uint64_t bytes = 0;
        try {
            element = safetensors_dtype_size(t.dtype);
        } catch (const std::invalid_argument& e) {
            invalid(path, "tensor '" + t.name + "': " + e.what());
        }
        if (byte_size(t.shape, element, bytes) && bytes != t.data.size())
            invalid(path, "tensor '" + t.name + "': " + std::to_string(t.data.size()) + " bytes of data, but " +
                              t.dtype + " " + shape_string(t.shape) + " needs " + std::to_string(bytes));
        infos.push_back({t.name, t.dtype, t.shape, 0, 0});
    }
    write_safetensors_streamed(path, infos, metadata, [&](size_t i, const ByteSink& sink) {
        sink(tensors[i].data.data(), tensors[i].data.size());
    });
}

const SafeTensor& SafeTensorsFile::at(const std::string& name) const {
    for (const SafeTensor& t : tensors)
        if (t.name == name) return t;
    fail(path, "no tensor named '" + name + "' (the file holds " + std::to_string(tensors.size()) +
                   " tensors; was it written for a different model or configuration?)");
}

SafeTensorsReader::SafeTensorsReader(const std::string& path) : path_(path) {
    InputFile file = open_input_file(path, "safetensors file", "check the path");  // regular files only
    const uint64_t size = file.size();
    fd_ = file.release();
    try {
        if (size < 8)
            fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length" + kRewrite);
        uint8_t prefix[8];
        read_at(fd_, path, prefix, 8, 0);
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
        if (n > size - 8)
            fail(path, "header length " + std::to_string(n) + " runs past the end of the " + std::to_string(size) +
                           "-byte file (truncated?)" + kRewrite);
        // The format caps the header at 100 MB; a larger length is corruption, and must not make us
        // allocate whatever it claims.
        if (n > kMaxHeaderBytes)
            fail(path, "header length " + std::to_string(n) + " exceeds the format's limit of " +
                           std::to_string(kMaxHeaderBytes) + " bytes" + kRewrite);
        std::string text(static_cast<size_t>(n), '\0');
        read_at(fd_, path, text.data(), n, 8);
        header_bytes_ = bytes_read_ = 8 + n;
        parse_header(text, size);
    } catch (...) {
        ::close(fd_);
        fd_ = -1;
        throw;
    }
}

void SafeTensorsReader::parse_header(const std::string& text, uint64_t size) {
    const std::string& path = path_;
    json header;
    try {
        header = json::parse(text);
    } catch (const json::exception& e) {
        fail(path, std::string("header is not valid JSON: ") + e.what() + kRewrite);
    }
    if (!header.is_object()) fail(path, std::string("header is not a JSON object") + kRewrite);

    const uint64_t base = header_bytes_;
    const uint64_t buffer = size - base;
    struct Span {
        uint64_t begin, end;
        size_t index;
    };
    std::vector<Span> spans;
    std::vector<SafeTensorInfo> listed;
    for (const auto& [key, value] : header.items()) {
        if (key == "__metadata__") {
            if (!value.is_object()) fail(path, std::string("__metadata__ is not a JSON object") + kRewrite);
            for (const auto& [k, v] : value.items()) {
                if (!v.is_string()) fail(path, "__metadata__ entry '" + k + "' is not a string" + kRewrite);
                metadata_[k] = v.get<std::string>();
            }
            continue;
        }
        const std::string where = "tensor '" + key + "': ";
        if (!value.is_object()) fail(path, where + "entry is not a JSON object" + kRewrite);
        for (const char* field : {"dtype", "shape", "data_offsets"})
            if (!value.contains(field)) fail(path, where + "missing \"" + field + "\"" + kRewrite);
        SafeTensorInfo t;
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
        t.offset = base + begin;
        t.bytes = end - begin;
        spans.push_back({begin, end, listed.size()});
        listed.push_back(std::move(t));
    }

    // The tensors must tile the buffer exactly: sorted by offset, each starts where the last ended.
    // Zero-sized tensors sort before a non-empty one at the same offset so that they tile too.
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    for (const Span& s : spans) {
        SafeTensorInfo& t = listed[s.index];
        if (s.begin < at)
            fail(path, "tensor '" + t.name + "': data_offsets [" + std::to_string(s.begin) + ", " +
                           std::to_string(s.end) + "] overlap the previous tensor, which ends at " +
                           std::to_string(at) + kRewrite);
        if (s.begin > at)
            fail(path, "tensor '" + t.name + "': data_offsets [" + std::to_string(s.begin) + ", " +
                           std::to_string(s.end) + "] leave a gap after byte " + std::to_string(at) + kRewrite);
        at = s.end;
        by_name_[t.name] = tensors_.size();
        tensors_.push_back(std::move(t));
    }
    if (at != buffer)
        fail(path, std::to_string(buffer - at) + " trailing bytes after the last tensor (which ends at " +
                       std::to_string(at) + " of the " + std::to_string(buffer) + "-byte buffer)" + kRewrite);
}

SafeTensorsReader::~SafeTensorsReader() {
    if (fd_ >= 0) ::close(fd_);
}

SafeTensorsReader::SafeTensorsReader(SafeTensorsReader&& other) noexcept { *this = std::move(other); }

SafeTensorsReader& SafeTensorsReader::operator=(SafeTensorsReader&& other) noexcept {
    if (this == &other) return *this;
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
    by_name_ = std::move(other.by_name_);
    header_bytes_ = other.header_bytes_;
    bytes_read_ = other.bytes_read_;
    return *this;
}

const SafeTensorInfo* SafeTensorsReader::find(const std::string& name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafeTensorsReader::read(const SafeTensorInfo& t, uint64_t offset, uint64_t bytes, void* dst) {
    if (offset > t.bytes || bytes > t.bytes - offset)
        throw std::out_of_range("safetensors '" + path_ + "': bytes [" + std::to_string(offset) + ", " +
                                std::to_string(offset + bytes) + ") lie outside tensor '" + t.name + "' (" +
                                std::to_string(t.bytes) + " bytes)");
    read_at(fd_, path_, dst, bytes, t.offset + offset);
    bytes_read_ += bytes;
}

SafeTensorsFile read_safetensors(const std::string& path) {
    SafeTensorsReader reader(path);
    SafeTensorsFile file;
    file.path = path;
    file.metadata = reader.metadata();
    for (const SafeTensorInfo& t : reader.tensors()) {
        SafeTensor out{t.name, t.dtype, t.shape, std::vector<uint8_t>(static_cast<size_t>(t.bytes))};
        reader.read(t, 0, t.bytes, out.data.data());
        file.tensors.push_back(std::move(out));
    }
    return file;
}

}  // namespace pv
