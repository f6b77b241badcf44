// Checkpoint tensor I/O and the step directory transaction; the format is described in
// model/checkpoint.h.
#include "model/checkpoint.h"

#include "formats/bnb_checkpoint.h"
#include "formats/dtype_conversion.h"
#include "formats/safetensors.h"
#include "io/durable_file.h"
#include "io/progress.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string_view>
#include <system_error>

namespace pv {
namespace {

namespace fs = std::filesystem;

// ---- names, shapes, layouts ---------------------------------------------------------------

// The HF shape of a part: [rows, cols], or [rows] for a vector.
// The Hugging Face tensor's shape: the whole one, also for a tensor-parallel slice of it.
std::vector<int64_t> hf_shape(const TensorPart& part, const TensorSpec& spec) {
    if (spec.whole_cols() == 1) return {part.whole_rows()};
    return {part.whole_rows(), spec.whole_cols()};
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
        const long long len = slot_elements(s, layout.kind, layout.dtype, layout.double_quant);  // NF4: its slot
        if (slot.offset < 0 || s.rows < 0 || s.cols < 1 || slot.offset + len > layout.padded)
            throw std::invalid_argument(where + ": unit " + std::to_string(u) + ", tensor '" + s.name +
                                        "' lies outside its group of " + std::to_string(layout.padded) +
                                        " elements (build layouts with layout_group)");
        for (const TensorPart& p : s.parts)
            if (p.row_begin < 0 || p.rows < 0 || p.row_begin + p.rows > s.rows)
                throw std::invalid_argument(where + ": unit " + std::to_string(u) + ", tensor '" + s.name +
                                            "': part '" + p.hf_name + "' lies outside its rows");
    }
}

[[noreturn]] void file_error(const std::string& origin, const std::string& what) {
    throw std::runtime_error("checkpoint tensors '" + origin + "': " + what);
}

// The suffix of the RoPE buffer older transformers versions saved with every layer.
const std::string kInvFreq = ".rotary_emb.inv_freq";

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

std::vector<SafeTensorInfo> group_tensor_infos(const std::vector<GroupLayout>& layouts, DType dtype) {
    std::vector<SafeTensorInfo> out;
    for (const GroupLayout& layout : layouts)
        for (const TensorSlot& slot : layout.tensors)
            for (const TensorPart& part : slot.spec.parts)
                out.push_back({part.hf_name, safetensors_dtype(dtype), hf_shape(part, slot.spec), 0, 0});
    return out;
}

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
        // A file holds whole tensors: a tensor-parallel rank's slices are joined first (model/tensor_parallel.h).
        for (const TensorSlot& slot : layouts[u].tensors)
            if (!slot.spec.slice.whole())
                throw std::logic_error(where + ": '" + slot.spec.name + "' is a tensor-parallel slice");
    }

    // Each part's rows straight from its group: nothing is copied but what the file gets.
    struct Source {
        const uint8_t* begin;
        size_t bytes;
    };
    std::vector<Source> sources;
    for (size_t u = 0; u < layouts.size(); ++u)
        for (const TensorSlot& slot : layouts[u].tensors)
            for (const TensorPart& part : slot.spec.parts)
                sources.push_back({groups.units[u].data() + (slot.offset + part.row_begin * slot.spec.cols) * element,
                                   static_cast<size_t>(part.rows * slot.spec.cols) * element});
    write_safetensors_streamed(path, group_tensor_infos(layouts, groups.dtype), metadata,
                               [&](size_t i, const ByteSink& sink) { sink(sources[i].begin, sources[i].bytes); });
}

std::vector<std::string> check_group_tensors(const HfCheckpoint& source, const std::vector<GroupLayout>& layouts,
                                             ExtraTensors extra) {
    const std::string& origin = source.origin();
    for (size_t u = 0; u < layouts.size(); ++u) check_layout("checkpoint tensors '" + origin + "'", u, layouts[u]);
    const std::string different =
        "was it written for a different model or configuration? compare config.json with the weights";
    std::set<std::string> used;
    bool has_lm_head = false;
    const bool quantizes =
        std::any_of(layouts.begin(), layouts.end(), [](const GroupLayout& l) { return l.kind == GroupKind::nf4; });
    for (const GroupLayout& layout : layouts)
        for (const TensorSlot& slot : layout.tensors) {
            // An NF4 tensor's parts come either all dense (quantised as they load) or all
            // pre-quantised by bitsandbytes (copied as they are): its slot is filled one way.
            size_t quantized = 0;
            for (const TensorPart& part : slot.spec.parts) quantized += is_bnb_quantized(source, part.hf_name);
            if (layout.kind == GroupKind::nf4 && quantized != 0 && quantized != slot.spec.parts.size())
                file_error(origin, "the parts of the model's '" + slot.spec.name +
                                       "' are stored partly as bitsandbytes 4-bit linears and partly dense; "
                                       "polevault fuses them into one NF4 tensor and reads them one way: quantise "
                                       "all of them or none");
            for (const TensorPart& part : slot.spec.parts) {
                has_lm_head |= part.hf_name == "lm_head.weight";
                const SafeTensorInfo* t = source.find(part.hf_name);
                if (!t)
                    file_error(origin, "tensor '" + part.hf_name + "' is missing (the model's '" + slot.spec.name +
                                           "' needs it; the checkpoint holds " +
                                           std::to_string(source.tensors().size()) + " tensors: " + different + ")");
                if (is_bnb_quantized(source, part.hf_name)) {
                    if (layout.kind != GroupKind::nf4) refuse_bnb_into_dense(source, part.hf_name, quantizes);
                    check_bnb_tensor(source, part.hf_name, part.whole_rows(), slot.spec.whole_cols(), layout.double_quant);
                    used.insert(part.hf_name);
                    for (const std::string& c : bnb_companions(part.hf_name, layout.double_quant)) used.insert(c);
                    continue;
                }
                const std::vector<int64_t> expected = hf_shape(part, slot.spec);
                if (t->shape != expected)
                    file_error(origin, "tensor '" + part.hf_name + "' has shape " + shape_string(t->shape) +
                                           ", expected " + shape_string(expected) + " (" + different + ")");
                if (!is_float_dtype(t->dtype))
                    file_error(origin, "tensor '" + part.hf_name + "' has dtype " + t->dtype +
                                           ", which parameters cannot be loaded from (supported: BF16, F16, F32, F64;"
                                           " convert the tensor to one of them)");
                used.insert(part.hf_name);
            }
        }
    std::vector<std::string> skipped, extras;
    for (const SafeTensorInfo* t : source.tensors()) {
        if (used.count(t->name)) continue;
        const bool hf_ignores = (t->name.size() >= kInvFreq.size() &&
                                 t->name.compare(t->name.size() - kInvFreq.size(), kInvFreq.size(), kInvFreq) == 0) ||
                                (t->name == "lm_head.weight" && !has_lm_head);
        if (extra == ExtraTensors::ignore || (extra == ExtraTensors::hugging_face && hf_ignores))
            skipped.push_back(t->name);
        else
            extras.push_back(t->name);
    }
    if (!extras.empty()) {
        const std::string which = "tensor '" + extras.front() + "'" +
                                  (extras.size() > 1 ? " (and " + std::to_string(extras.size() - 1) + " more)" : "") +
                                  " belongs to no parameter of this model (";
        if (extra == ExtraTensors::refuse)
            file_error(origin, which + different +
                                   "; to ignore extra tensors, such as the lm_head.weight some tied models store,"
                                   " read with allow_extra)");
        file_error(origin, which + different +
                               "; polevault loads a Llama model whole or not at all, and skips only what Hugging Face "
                               "itself ignores: rotary_emb.inv_freq, and lm_head.weight with tie_word_embeddings)");
    }
    return skipped;
}

uint64_t read_group_ranges(HfCheckpoint& source, const std::vector<GroupLayout>& layouts,
                           const std::vector<ElementRange>& ranges, DType dtype, const GroupSink& sink) {
    if (ranges.size() != layouts.size())
        throw std::invalid_argument("read_group_ranges: " + std::to_string(ranges.size()) + " ranges for " +
                                    std::to_string(layouts.size()) + " groups");
    const size_t element = dtype_size(dtype);
    const long long piece = static_cast<long long>(kGroupReadPieceBytes / element);
    std::vector<uint8_t> buffer;
    uint64_t overflows = 0;
    for (size_t k = 0; k < layouts.size(); ++k) {
        const ElementRange r = ranges[k];
        if (r.begin < 0 || r.len < 0 || r.begin + r.len > layouts[k].padded)
            throw std::invalid_argument("read_group_ranges: range [" + std::to_string(r.begin) + ", " +
                                        std::to_string(r.begin + r.len) + ") outside group " + std::to_string(k) +
                                        " of " + std::to_string(layouts[k].padded) + " elements");
        for (const TensorSlot& slot : layouts[k].tensors)
            for (const TensorPart& part : slot.spec.parts) {
                // The part's elements in the group, intersected with the range. They are the
                // Hugging Face tensor's rows from hf_row_begin, each of them whole or (a
                // tensor-parallel slice of columns) its columns from col_begin: one run of the
                // file per piece, or per row of a column slice.
                const long long cols = slot.spec.cols, hf_cols = slot.spec.whole_cols();
                const long long col_begin = slot.spec.slice.whole() ? 0 : slot.spec.slice.col_begin;
                const long long first = slot.offset + part.row_begin * cols;
                const long long lo = std::max(first, r.begin);
                const long long hi = std::min(first + part.rows * cols, r.begin + r.len);
                for (long long at = lo; at < hi;) {
                    const long long row = (at - first) / cols, col = (at - first) % cols;
                    const long long n = std::min(piece, cols == hf_cols ? hi - at : std::min(cols - col, hi - at));
                    const long long in_file = (part.hf_row_begin + row) * hf_cols + col_begin + col;
                    buffer.resize(static_cast<size_t>(n) * element);
                    overflows += source.read(part.hf_name, static_cast<uint64_t>(in_file), static_cast<uint64_t>(n),
                                             dtype, buffer.data());
                    sink(k, at - r.begin, buffer.data(), n);
                    at += n;
                }
            }
    }
    return overflows;
}

HostGroups read_group_tensors(const std::string& path, const std::vector<GroupLayout>& layouts, DType dtype,
                              bool allow_extra) {
    for (size_t u = 0; u < layouts.size(); ++u) check_layout("read_group_tensors '" + path + "'", u, layouts[u]);
    HfCheckpoint source = HfCheckpoint::open_file(path);
    check_group_tensors(source, layouts, allow_extra ? ExtraTensors::ignore : ExtraTensors::refuse);
    HostGroups out;
    out.dtype = dtype;
    const size_t element = dtype_size(dtype);
    std::vector<ElementRange> whole;
    for (const GroupLayout& l : layouts) {
        out.units.emplace_back(static_cast<size_t>(l.padded) * element, 0);  // padding and gaps stay zero
        whole.push_back({0, l.padded});
    }
    read_group_ranges(source, layouts, whole, dtype, [&](size_t k, long long at, const uint8_t* data, long long n) {
        std::memcpy(out.units[k].data() + static_cast<size_t>(at) * element, data, static_cast<size_t>(n) * element);
    });
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

std::string begin_new_model_dir(const std::string& dir) {
    std::error_code ec;
    const fs::file_status status = fs::symlink_status(dir, ec);
    if (status.type() != fs::file_type::not_found && !(fs::is_directory(status) && fs::is_empty(dir, ec) && !ec))
        throw std::runtime_error("output directory '" + dir +
                                 "' already exists and is not an empty directory: choose a new --out, or remove it "
                                 "first (nothing is overwritten)");
    return begin_checkpoint_dir(dir);
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

namespace {

// N of a directory name "step_N" (N decimal digits, in range); nullopt for anything else.
std::optional<long long> step_of_name(std::string_view name) {
    constexpr std::string_view prefix = "step_";
    if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return std::nullopt;
    const char* digits = name.data() + prefix.size();
    const char* end = name.data() + name.size();
    if (*digits < '0' || *digits > '9') return std::nullopt;
    long long step = 0;
    const auto [stop, parse_error] = std::from_chars(digits, end, step);
    if (parse_error != std::errc() || stop != end) return std::nullopt;  // step_7.tmp, step_7x, or out of range
    return step;
}

// Calls f(entry) for every entry of out_dir; false if out_dir does not exist.
template <class F>
bool for_each_entry(const std::string& out_dir, F&& f) {
    std::error_code ec;
    const fs::file_status status = fs::status(out_dir, ec);
    if (status.type() == fs::file_type::not_found) return false;
    if (ec) dir_error(out_dir, "cannot look for checkpoints", ec.message());
    if (!fs::is_directory(status))
        dir_error(out_dir, "cannot look for checkpoints", "not a directory (pass the run's output directory)");
    fs::directory_iterator it(out_dir, ec);
    if (ec) dir_error(out_dir, "cannot list", ec.message());
    while (it != fs::directory_iterator()) {
        f(*it);
        it.increment(ec);
        if (ec) dir_error(out_dir, "cannot list", ec.message());
    }
    return true;
}

std::string format_bytes_exact(uint64_t bytes) {
    char text[64];
    std::snprintf(text, sizeof text, "%llu bytes (%.1f MiB)", static_cast<unsigned long long>(bytes),
                  double(bytes) / (1024.0 * 1024.0));
    return text;
}

}  // namespace

void write_checkpoint_dir(const std::string& dir, uint64_t bytes,
                          const std::function<void(const std::string& tmp)>& write) {
    const std::string tmp = without_trailing_slashes(dir) + ".tmp";
    try {
        begin_checkpoint_dir(dir);
        Progress progress("writing checkpoint " + dir, double(bytes));  // the files' writes report to it
        write(tmp);
        commit_checkpoint_dir(dir);
    } catch (const std::exception& e) {
        std::error_code ec;
        fs::remove_all(tmp, ec);  // what was written of it is no checkpoint; the earlier ones stay
        const std::string parent = fs::path(without_trailing_slashes(dir)).parent_path().string();
        const std::string where = parent.empty() ? "." : parent;
        std::string free_text = "unknown";
        struct statvfs fs_stats {};
        if (::statvfs(where.c_str(), &fs_stats) == 0)
            free_text = format_bytes_exact(uint64_t(fs_stats.f_bavail) * uint64_t(fs_stats.f_frsize));
        throw std::runtime_error(std::string(e.what()) + "\ncheckpoint " + without_trailing_slashes(dir) +
                                 " was not written (" +
                                 (ec ? "its temporary " + tmp + " could not be removed: " + ec.message()
                                     : "its temporary directory is removed") +
                                 "; the checkpoints before it are intact): it needs about " +
                                 format_bytes_exact(bytes) + " in " + where + ", which has " + free_text +
                                 " free; free space there, raise the file-size limit (ulimit -f), or choose "
                                 "another --out-dir");
    }
}

std::vector<CheckpointDir> list_checkpoints(const std::string& out_dir, const std::string& marker_file) {
    std::vector<CheckpointDir> out;
    for_each_entry(out_dir, [&](const fs::directory_entry& entry) {
        const std::optional<long long> step = step_of_name(entry.path().filename().string());
        std::error_code ignore;
        if (!step || !fs::is_directory(entry.path(), ignore)) return;
        if (!fs::is_regular_file(entry.path() / marker_file, ignore)) return;  // incomplete: never resumed from
        out.push_back({*step, entry.path().string()});
    });
    std::sort(out.begin(), out.end(), [](const CheckpointDir& a, const CheckpointDir& b) {
        return a.step != b.step ? a.step < b.step : a.path < b.path;
    });
    return out;
}

std::optional<std::string> latest_checkpoint(const std::string& out_dir, const std::string& marker_file) {
    const std::vector<CheckpointDir> all = list_checkpoints(out_dir, marker_file);
    if (all.empty()) return std::nullopt;
    // On equal steps (step_5, step_05) the lexicographically smaller name wins, whatever the listing order.
    auto first_of_last = all.end() - 1;
    while (first_of_last != all.begin() && (first_of_last - 1)->step == all.back().step) --first_of_last;
    return first_of_last->path;
}

std::vector<std::string> checkpoint_temporaries(const std::string& out_dir) {
    std::vector<std::string> out;
    for_each_entry(out_dir, [&](const fs::directory_entry& entry) {
        const std::string name = entry.path().filename().string();
        constexpr std::string_view suffix = ".tmp";
        if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            return;
        std::error_code ignore;
        if (step_of_name(std::string_view(name).substr(0, name.size() - suffix.size())) &&
            fs::is_directory(fs::symlink_status(entry.path(), ignore)))
            out.push_back(entry.path().string());
    });
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace pv
