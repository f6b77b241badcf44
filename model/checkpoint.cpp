// Checkpoint tensor I/O and the step directory transaction; the format is described in
// model/checkpoint.h.
#include "model/checkpoint.h"

#include "io/durable_file.h"
#include "model/safetensors.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string_view>
#include <system_error>

namespace pv {
namespace {

namespace fs = std::filesystem;

// ---- dtypes and conversion ----------------------------------------------------------------

const char* safetensors_name(DType t) {
    switch (t) {
        case DType::bf16: return "BF16";
        case DType::fp32: return "F32";
        case DType::fp64: return "F64";
    }
    return "?";
}

bool loadable(const std::string& file_dtype) {
    return file_dtype == "BF16" || file_dtype == "F16" || file_dtype == "F32" || file_dtype == "F64";
}

// bf16 is the top half of an fp32 bit pattern. Adding 0x7FFF plus the lowest kept bit before
// truncating rounds to nearest with ties to even (a carry out of the mantissa bumps the exponent,
// which is right, up to Inf for values past bf16's largest finite). NaN is kept apart: its
// payload could lie entirely in the dropped bits, and truncating would turn it into Inf, so the
// quiet bit is set instead.
uint16_t float_to_bf16(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
    return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Every value is exact in fp32.
float f16_to_float(uint16_t h) {
    const bool negative = (h & 0x8000u) != 0;
    const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24
        const float v = std::ldexp(static_cast<float>(mantissa), -24);
        return negative ? -v : v;
    }
    const uint32_t sign = negative ? 0x80000000u : 0u;
    if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // Inf, NaN
    return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

template <typename T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

template <typename T>
void store(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof v);
}

// A file element of a 16- or 32-bit float dtype, as fp32 (exact).
float narrow_source_to_float(const uint8_t* p, const std::string& from) {
    if (from == "BF16") return bf16_to_float(load<uint16_t>(p));
    if (from == "F16") return f16_to_float(load<uint16_t>(p));
    return load<float>(p);  // F32
}

// Converts n elements from the file's dtype `from` (one of loadable()) to `to`.
void convert(const uint8_t* src, const std::string& from, uint8_t* dst, DType to, size_t n) {
    const size_t in = safetensors_dtype_size(from), out = dtype_size(to);
    if (from == safetensors_name(to)) {
        std::memcpy(dst, src, n * out);
        return;
    }
    for (size_t i = 0; i < n; ++i, src += in, dst += out) {
        switch (to) {
            case DType::fp64:  // every source dtype is exact in fp64
                store<double>(dst, static_cast<double>(narrow_source_to_float(src, from)));
                break;
            case DType::fp32:  // F64: the cast rounds to nearest even (the default FP environment)
                store<float>(dst,
                             from == "F64" ? static_cast<float>(load<double>(src)) : narrow_source_to_float(src, from));
                break;
            case DType::bf16:
                // F64 goes through fp32, so it is rounded twice: a double just off a bf16 tie can
                // round onto the tie in fp32 and then to even, one bf16 ulp from the direct
                // rounding. Harmless for weights (bf16's own error is 2^-9 relative) and the same
                // as what torch's .float().bfloat16() does.
                store<uint16_t>(dst, float_to_bf16(from == "F64" ? static_cast<float>(load<double>(src))
                                                                 : narrow_source_to_float(src, from)));
                break;
        }
    }
}

// ---- names, shapes, layouts ---------------------------------------------------------------

// The HF shape of a part: [rows, cols], or [rows] for a vector.
std::vector<int64_t> hf_shape(const TensorPart& part, long long cols) {
    if (cols == 1) return {part.rows};
    return {part.rows, cols};
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// A layout that would index outside its own group is a caller's bug; catch it before any copy.
void check_layout(const std::string& where, size_t u, const GroupLayout& layout) {
    for (const TensorSlot& slot : layout.tensors) {
        const TensorSpec& s = slot.spec;
        if (slot.offset < 0 || s.rows < 0 || s.cols < 1 || slot.offset + s.numel() > layout.padded)
            throw std::invalid_argument(where + ": unit " + std::to_string(u) + ", tensor '" + s.name +
                                        "' lies outside its group of " + std::to_string(layout.padded) +
                                        " elements (build layouts with layout_group)");
        for (const TensorPart& p : s.parts)
            if (p.row_begin < 0 || p.rows < 0 || p.row_begin + p.rows > s.rows)
                throw std::invalid_argument(where + ": unit " + std::to_string(u) + ", tensor '" + s.name +
                                            "': part '" + p.hf_name + "' lies outside its rows");
    }
}

[[noreturn]] void file_error(const std::string& path, const std::string& what) {
    throw std::runtime_error("checkpoint tensors '" + path + "': " + what);
}

// ---- directories --------------------------------------------------------------------------

// The kind io/durable_file.h's errors name: "checkpoint directory '<path>': <what>: <os error>".
constexpr const char* kDirKind = "checkpoint directory";

[[noreturn]] void dir_error(const std::string& path, const std::string& what, const std::string& os_text) {
    throw std::runtime_error(std::string(kDirKind) + " '" + path + "': " + what + ": " + os_text);
}

// "runs/x/step_5/" and "runs/x/step_5" name the same checkpoint; the .tmp goes beside it.
std::string without_trailing_slashes(const std::string& dir) {
    if (dir.empty())
        throw std::invalid_argument("checkpoint directory: the path is empty (pass e.g. 'runs/x/step_100')");
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    if (d == "/")
        throw std::invalid_argument("checkpoint directory: '/' cannot be a checkpoint (pass e.g. 'runs/x/step_100')");
    return d;
}

}  // namespace

void write_group_tensors(const std::string& path, const std::vector<GroupLayout>& layouts, const HostGroups& groups,
                         const std::map<std::string, std::string>& metadata) {
    const std::string where = "write_group_tensors '" + path + "'";
    if (groups.units.size() != layouts.size())
        throw std::invalid_argument(where + ": " + std::to_string(groups.units.size()) + " units of data for " +
                                    std::to_string(layouts.size()) + " layouts (pass one group per unit)");
    const size_t element = dtype_size(groups.dtype);
    for (size_t u = 0; u < layouts.size(); ++u) {
        const size_t need = static_cast<size_t>(layouts[u].padded) * element;
        if (groups.units[u].size() != need)
            throw std::invalid_argument(where + ": unit " + std::to_string(u) + " holds " +
                                        std::to_string(groups.units[u].size()) + " bytes, but its layout needs " +
                                        std::to_string(layouts[u].padded) + " " + dtype_name(groups.dtype) +
                                        " elements = " + std::to_string(need) +
                                        " bytes (were the groups built for another shard count or dtype?)");
        check_layout(where, u, layouts[u]);
    }

    std::vector<SafeTensor> tensors;
    for (size_t u = 0; u < layouts.size(); ++u) {
        for (const TensorSlot& slot : layouts[u].tensors) {
            const long long cols = slot.spec.cols;
            for (const TensorPart& part : slot.spec.parts) {
                const uint8_t* begin = groups.units[u].data() + (slot.offset + part.row_begin * cols) * element;
                tensors.push_back(SafeTensor{part.hf_name, safetensors_name(groups.dtype), hf_shape(part, cols),
                                             std::vector<uint8_t>(begin, begin + part.rows * cols * element)});
            }
        }
    }
    write_safetensors(path, tensors, metadata);
}

HostGroups read_group_tensors(const std::string& path, const std::vector<GroupLayout>& layouts, DType dtype,
                              bool allow_extra) {
    for (size_t u = 0; u < layouts.size(); ++u) check_layout("read_group_tensors '" + path + "'", u, layouts[u]);
    const SafeTensorsFile file = read_safetensors(path);
    std::map<std::string, const SafeTensor*> by_name;
    for (const SafeTensor& t : file.tensors) by_name[t.name] = &t;
    const std::string different =
        "was it written for a different model or configuration? compare config.json with the file";

    HostGroups out;
    out.dtype = dtype;
    const size_t element = dtype_size(dtype);
    std::set<std::string> used;
    out.units.resize(layouts.size());
    for (size_t u = 0; u < layouts.size(); ++u) {
        out.units[u].assign(static_cast<size_t>(layouts[u].padded) * element, 0);  // padding and gaps stay zero
        for (const TensorSlot& slot : layouts[u].tensors) {
            const long long cols = slot.spec.cols;
            for (const TensorPart& part : slot.spec.parts) {
                const auto it = by_name.find(part.hf_name);
                if (it == by_name.end())
                    file_error(path, "tensor '" + part.hf_name + "' is missing (the model's '" + slot.spec.name +
                                         "' needs it; the file holds " + std::to_string(file.tensors.size()) +
                                         " tensors: " + different + ")");
                const SafeTensor& t = *it->second;
                const std::vector<int64_t> expected = hf_shape(part, cols);
                if (t.shape != expected)
                    file_error(path, "tensor '" + part.hf_name + "' has shape " + shape_string(t.shape) +
                                         ", expected " + shape_string(expected) + " (" + different + ")");
                if (!loadable(t.dtype))
                    file_error(path, "tensor '" + part.hf_name + "' has dtype " + t.dtype +
                                         ", which parameters cannot be loaded from (supported: BF16, F16, F32, F64;"
                                         " convert the tensor to one of them)");
                uint8_t* dst = out.units[u].data() + (slot.offset + part.row_begin * cols) * element;
                convert(t.data.data(), t.dtype, dst, dtype, static_cast<size_t>(part.rows * cols));
                used.insert(part.hf_name);
            }
        }
    }
    if (!allow_extra) {
        std::vector<std::string> extra;
        for (const SafeTensor& t : file.tensors)
            if (!used.count(t.name)) extra.push_back(t.name);
        if (!extra.empty())
            file_error(path, "tensor '" + extra.front() + "'" +
                                 (extra.size() > 1 ? " (and " + std::to_string(extra.size() - 1) + " more)" : "") +
                                 " belongs to no parameter of this model (" + different +
                                 "; to ignore extra tensors, such as the lm_head.weight some tied models store,"
                                 " read with allow_extra)");
    }
    return out;
}

std::string begin_checkpoint_dir(const std::string& dir) {
    const std::string tmp = without_trailing_slashes(dir) + ".tmp";
    std::error_code ec;
    if (fs::symlink_status(tmp, ec).type() != fs::file_type::not_found) {
        fs::remove_all(tmp, ec);  // a crash's leftover: never a checkpoint, never reused
        if (ec) dir_error(tmp, "cannot remove the stale temporary directory", ec.message());
    }
    fs::create_directories(tmp, ec);
    if (ec) dir_error(tmp, "cannot create (is the output directory writable?)", ec.message());
    return tmp;
}

void commit_checkpoint_dir(const std::string& dir_in) {
    const std::string dir = without_trailing_slashes(dir_in);
    const std::string tmp = dir + ".tmp";
    std::error_code ec;
    if (!fs::is_directory(tmp, ec))
        dir_error(tmp, "cannot commit: no such directory (call begin_checkpoint_dir and write the files inside it)",
                  ec ? ec.message() : std::string("not found"));

    // Every file's data and every directory entry durable before the rename publishes them.
    fsync_tree(tmp, kDirKind);

    // A re-run of the same step replaces it. A crash between the removal and the rename leaves no
    // step_N, only the complete step_N.tmp: latest_checkpoint then finds the previous step.
    if (fs::exists(fs::symlink_status(dir, ec))) {
        fs::remove_all(dir, ec);
        if (ec) dir_error(dir, "cannot remove the existing checkpoint to replace it", ec.message());
    }
    rename_durably(tmp, dir, kDirKind);
}

std::optional<std::string> latest_checkpoint(const std::string& out_dir, const std::string& marker_file) {
    std::error_code ec;
    const fs::file_status status = fs::status(out_dir, ec);
    if (status.type() == fs::file_type::not_found) return std::nullopt;
    if (ec) dir_error(out_dir, "cannot look for checkpoints", ec.message());
    if (!fs::is_directory(status))
        dir_error(out_dir, "cannot look for checkpoints", "not a directory (pass the run's output directory)");

    std::optional<std::string> best;
    long long best_step = -1;
    std::string best_name;
    const auto consider = [&](const fs::directory_entry& entry) {
        const std::string name = entry.path().filename().string();
        constexpr std::string_view prefix = "step_";
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return;
        const char* digits = name.c_str() + prefix.size();
        const char* end = name.c_str() + name.size();
        if (*digits < '0' || *digits > '9') return;
        long long step = 0;
        const auto [stop, parse_error] = std::from_chars(digits, end, step);
        if (parse_error != std::errc() || stop != end) return;  // step_7.tmp, step_7x, or out of range
        std::error_code ignore;
        if (!fs::is_directory(entry.path(), ignore)) return;
        if (!fs::is_regular_file(entry.path() / marker_file, ignore)) return;  // incomplete: never resumed from
        // On equal steps (step_5, step_05) the lexicographically smaller name wins, whatever the listing order.
        if (step > best_step || (step == best_step && name < best_name)) {
            best_step = step;
            best_name = name;
            best = entry.path().string();
        }
    };
    fs::directory_iterator it(out_dir, ec);
    if (ec) dir_error(out_dir, "cannot list", ec.message());
    while (it != fs::directory_iterator()) {
        consider(*it);
        it.increment(ec);
        if (ec) dir_error(out_dir, "cannot list", ec.message());
    }
    return best;
}

}  // namespace pv
