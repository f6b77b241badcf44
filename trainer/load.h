// Loading tensors into a model on the device, each rank reading only what it keeps (DESIGN.md §3):
// `--init-from DIR` (a Hugging Face model), `--resume` (a checkpoint's weights and optimizer
// state) and `train sample` (a whole model from a checkpoint or a Hugging Face directory).
//
// What a rank keeps comes from its strategy (parallel/strategy.h): elements [local_begin,
// local_begin + local_len) of every padded group — the whole group (single, DDP, ZeRO-1/2), a
// slice of it (ZeRO-3), nothing for a unit of another pipeline stage (mp; the last stage also
// keeps the tied embedding). Optimizer state: the range [begin, end) AdamWState owns. The source
// is first checked against the whole model's layouts on every rank (model/checkpoint.h
// check_group_tensors: missing, misshapen or foreign tensors are refused before anything is
// read, so a model is loaded whole or not at all); then each rank reads, tensor part by tensor
// part, the elements of its ranges only (safetensors is row-major: a slice of a tensor is one
// contiguous run of bytes), converts them to the run's type in bounded pieces and copies each
// piece to the device. Host memory holds one piece at a time (model/checkpoint.h
// kGroupReadPieceBytes), never a whole tensor, let alone the model, so eight ranks of a large
// model on one machine read 1/8 of it each (ZeRO-3) in a few megabytes of host memory each.
// Padding and alignment gaps are zeroed on the device first. An NF4 group (QLoRA's base) is filled
// tensor by tensor: quantised on the device from dense weights, or, from a checkpoint bitsandbytes
// quantised, its fields copied as they are (formats/bnb_checkpoint.h), each rank reading only the
// bytes of its own range.
//
// Header-only (templates over the storage type), so the multi-rank tests load exactly as `train`
// does.
#pragma once

#include "formats/bnb_checkpoint.h"
#include "formats/hf_checkpoint.h"
#include "io/progress.h"
#include "model/checkpoint.h"
#include "model/group_parts.h"
#include "model/llama.h"
#include "model/nf4_slot.cuh"
#include "optim/optimizer.cuh"
#include "parallel/collective_watch.h"
#include "parallel/strategy.h"
#include "model/checkpoint_files.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace pv {

// Which groups a file holds: every group (a model), the base's (LoRA: the frozen groups, which
// the base model's files hold; without LoRA every group is the base), or the trainable ones
// (LoRA's adapter file, the optimizer files).
enum class GroupSet { all, base, trainable };

template <class T>
bool in_set(const Llama<T>& model, int g, GroupSet set) {
    switch (set) {
        case GroupSet::all: return true;
        case GroupSet::trainable: return g == 0;
        case GroupSet::base: return !model.lora().enabled() || g > 0;
    }
    return false;
}

// Which layouts groups_of gives: this rank's (a tensor-parallel rank's hold slices of the block
// matrices), or the whole tensors' (the model's whole_layouts(): what checkpoint files hold).
inline constexpr bool kWholeTensors = true;

// The layouts of the groups in `set`, in unit then group order.
template <class T>
std::vector<GroupLayout> groups_of(const Llama<T>& model, GroupSet set, bool whole_tensors = false) {
    const std::vector<std::vector<GroupLayout>> whole =
        whole_tensors ? model.whole_layouts() : std::vector<std::vector<GroupLayout>>{};
    std::vector<GroupLayout> out;
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g)
            if (in_set(model, g, set)) out.push_back(whole_tensors ? whole[size_t(u)][size_t(g)] : model.group(u, g));
    return out;
}

// Every unit's trainable group (the layouts of the optimizer files).
template <class T>
std::vector<GroupLayout> trainable_groups(const Llama<T>& model, bool whole_tensors = false) {
    return groups_of(model, GroupSet::trainable, whole_tensors);
}

// The file of a checkpoint's weights: model.safetensors, or a LoRA run's adapters in PEFT's file.
inline constexpr const char* kAdapterFile = "adapter_model.safetensors";
template <class T>
std::string weights_file(const Llama<T>& model) {
    return model.lora().enabled() ? kAdapterFile : "model.safetensors";
}

// Where this rank keeps a group's elements: `len` elements of the padded group from `begin`, at
// device pointer `dst` (element begin of the group).
template <class X>
struct DeviceRange {
    X* dst = nullptr;
    long long begin = 0, len = 0;
    bool on_host = false;  // dst is host memory (offloaded optimizer state): filled with memset/memcpy
};

// What one load did on this rank.
struct LoadStats {
    double seconds = 0;
    uint64_t bytes_read = 0;           // from the safetensors files: every header, then the ranges
    uint64_t overflows = 0;            // finite values that became ±Inf in the run's type
    std::vector<std::string> skipped;  // tensors ignored by name (rotary_emb.inv_freq, a tied lm_head)
    std::vector<std::string> dtypes;   // the files' dtypes, each once
    size_t files = 0;
    void add(const LoadStats& o) {
        seconds += o.seconds, bytes_read += o.bytes_read, overflows += o.overflows, files += o.files;
        skipped.insert(skipped.end(), o.skipped.begin(), o.skipped.end());
        for (const std::string& d : o.dtypes)
            if (std::find(dtypes.begin(), dtypes.end(), d) == dtypes.end()) dtypes.push_back(d);
    }
};

// An NF4 tensor pre-quantised by bitsandbytes (formats/bnb_checkpoint.h): the bytes [lo, hi) of its
// slot (byte offsets from the slot's start) copied from its parts' fields as they are, to `dst`
// (the device address of the slot's byte 0), in pieces of kGroupReadPieceBytes: a ZeRO-3 rank
// reads only the fields, and the parts of fields, of its own slice. A tensor-parallel slice reads
// its modules' fields whole into host memory (one tensor at a time) and takes its blocks' fields
// (nf4_slice_fields).
inline void load_bnb_slot(HfCheckpoint& source, const GroupLayout& layout, const TensorSlot& t, long long lo,
                          long long hi, uint8_t* dst) {
    const TensorSpec whole = t.spec.whole_tensor();
    const std::vector<Nf4PartFields> fields = nf4_part_fields(whole, layout.double_quant);
    const bool sliced = !t.spec.slice.whole();
    std::vector<uint8_t> whole_slot(sliced ? size_t(nf4_slot_bytes(whole, layout.double_quant)) : 0);
    const long long from = sliced ? 0 : lo, to = sliced ? (long long)whole_slot.size() : hi;
    for (size_t p = 0; p < fields.size(); ++p) {
        if (fields[p].end <= from || fields[p].codes >= to) continue;
        const TensorPart& part = whole.parts[p];
        const BnbTensor b = check_bnb_tensor(source, part.hf_name, part.rows, whole.cols, layout.double_quant);
        read_bnb_fields(source, b, fields[p], from, to, kGroupReadPieceBytes,
                        [&](long long at, const uint8_t* data, size_t n) {
                            if (sliced)
                                std::memcpy(whole_slot.data() + at, data, n);
                            else
                                CUDA_CHECK(cudaMemcpy(dst + at, data, n, cudaMemcpyHostToDevice));
                        });
    }
    if (!sliced) return;
    std::vector<uint8_t> slot(size_t(nf4_slot_bytes(t.spec, layout.double_quant)), 0);
    nf4_slice_fields(whole, t.spec, layout.double_quant, whole_slot.data(), slot.data());
    CUDA_CHECK(cudaMemcpy(dst + lo, slot.data() + lo, size_t(hi - lo), cudaMemcpyHostToDevice));
}

// An NF4 group's range (model/nf4_layout.h), tensor by tensor. A tensor bitsandbytes quantised is
// copied field by field (load_bnb_slot). A dense one whose slot overlaps the range is read whole in
// X, quantised on the device (its statistics span the tensor) and the overlap copied — one tensor at
// a time, so neither the host nor the device ever holds more than one dense tensor of the base.
template <class X>
uint64_t load_nf4_range(HfCheckpoint& source, const GroupLayout& layout, const DeviceRange<X>& range) {
    uint64_t overflows = 0;
    for (const TensorSlot& t : layout.tensors) {
        const long long len = slot_elements(t.spec, layout.kind, layout.dtype, layout.double_quant);
        const long long lo = std::max(range.begin, t.offset), hi = std::min(range.begin + range.len, t.offset + len);
        if (lo >= hi) continue;
        if (is_bnb_quantized(source, t.spec.parts.front().hf_name)) {  // all parts then (check_group_tensors)
            const long long x = sizeof(X);
            load_bnb_slot(source, layout, t, (lo - t.offset) * x, (hi - t.offset) * x,
                          reinterpret_cast<uint8_t*>(range.dst) + (t.offset - range.begin) * x);
            continue;
        }
        const TensorSpec whole = t.spec.whole_tensor();  // a tensor-parallel slice: quantised whole, then cut
        const std::vector<GroupLayout> dense = {layout_group(GroupKind::frozen, dtype_of<X>(), {whole}, 1)};
        DeviceBuffer<X> values(size_t(whole.numel()), MemoryCategory::workspace),
            slot(size_t(len), MemoryCategory::workspace);
        overflows += read_group_ranges(
            source, dense, {{0, whole.numel()}}, dtype_of<X>(),
            [&](size_t, long long at, const uint8_t* data, long long n) {
                CUDA_CHECK(cudaMemcpy(values.get() + at, data, size_t(n) * sizeof(X), cudaMemcpyHostToDevice));
            });
        nf4_quantize_slice_slot(t.spec, layout.double_quant, values.get(), slot.get(), nullptr);
        CUDA_CHECK(cudaMemcpy(range.dst + (lo - range.begin), slot.get() + (lo - t.offset), size_t(hi - lo) * sizeof(X),
                              cudaMemcpyDeviceToDevice));
    }
    return overflows;
}

// What the values of a checkpoint's file must be, checked as they stream in (on resume): weights and
// master copies finite; Adam's m finite; Adam's v, a running mean of squares, finite and not
// negative. A checkpoint that breaks it was written by a run that had diverged, or was damaged, and
// would train into NaN; it is refused naming the file, the tensor and the element. The weights of
// a model to start from (--init-from) must be finite too (pretrained): a NaN there would surface only
// as a non-finite first step.
enum class ValueCheck { none, finite, finite_nonnegative, pretrained };

// Throws if one of the n values of group `layout` from element `first` breaks `check`.
template <class X>
void check_values(const std::string& file, const GroupLayout& layout, long long first, const X* values, long long n,
                  ValueCheck check) {
    if (check == ValueCheck::none) return;
    for (long long i = 0; i < n; ++i) {
        const double x = double(to_acc(values[i]));
        const bool finite = std::isfinite(x);
        if (finite && !(check == ValueCheck::finite_nonnegative && x < 0)) continue;
        char value[40];
        std::snprintf(value, sizeof value, "%g", x);
        if (check == ValueCheck::pretrained)
            throw std::runtime_error(file + ": " + group_element_name(layout, first + i) + " is " + value +
                                     " in the run's dtype (not finite): a model to start from must hold finite "
                                     "weights; the file is damaged or the model had diverged (or the value overflows "
                                     "the run's --dtype); use an intact copy of the model");
        throw std::runtime_error(
            file + ": " + group_element_name(layout, first + i) + " is " + value +
            (finite ? " (Adam's v is a running mean of squares: never negative)" : " (not finite)") +
            ": this checkpoint was written by a run that had diverged, or the file is damaged; "
            "resume from an earlier checkpoint");
    }
}

// Checks `source` against `layouts` (whole), then fills each device range from it: zeroed, then
// the tensor elements inside it streamed in pieces, each piece's values checked by `check` first.
// ranges[k] belongs to layouts[k].
template <class X>
LoadStats load_group_ranges(HfCheckpoint& source, const std::vector<GroupLayout>& layouts,
                            const std::vector<DeviceRange<X>>& ranges, ExtraTensors extra,
                            ValueCheck check = ValueCheck::none) {
    const auto start = std::chrono::steady_clock::now();
    LoadStats stats;
    stats.skipped = check_group_tensors(source, layouts, extra);
    const std::vector<std::string> files = source.files();
    stats.files = files.size();
    // The other ranks may reach their next collective long before this one's disk is done: not a
    // stall (parallel/collective_watch.h).
    const LongHostWork reading("reading weights from " + (files.empty() ? std::string("?") : files.front()) +
                               (files.size() > 1 ? " and " + std::to_string(files.size() - 1) + " more file(s)" : ""));
    for (const SafeTensorInfo* t : source.tensors())
        if (std::find(stats.dtypes.begin(), stats.dtypes.end(), t->dtype) == stats.dtypes.end())
            stats.dtypes.push_back(t->dtype);
    CUDA_CHECK(cudaDeviceSynchronize());  // nothing queued earlier (initialisation) may land after the load
    std::vector<ElementRange> wanted;
    double total = 0;  // bytes of this rank's ranges, in the run's type
    for (const DeviceRange<X>& r : ranges) total += double(r.len) * sizeof(X);
    Progress progress("loading weights from " + (files.empty() ? std::string("?") : files.front()) +
                          (files.size() > 1 ? " and " + std::to_string(files.size() - 1) + " more" : ""),
                      total);
    for (size_t k = 0; k < ranges.size(); ++k) {
        const DeviceRange<X>& r = ranges[k];
        if (r.len > 0 && r.on_host) std::memset(static_cast<void*>(r.dst), 0, size_t(r.len) * sizeof(X));
        if (r.len > 0 && !r.on_host) CUDA_CHECK(cudaMemset(r.dst, 0, size_t(r.len) * sizeof(X)));  // padding, gaps
        const bool nf4 = layouts[k].kind == GroupKind::nf4;  // quantised below, tensor by tensor
        wanted.push_back({r.begin, nf4 ? 0 : r.len});
    }
    stats.overflows = read_group_ranges(
        source, layouts, wanted, dtype_of<X>(), [&](size_t k, long long at, const uint8_t* data, long long n) {
            if (check != ValueCheck::none)
                check_values(check == ValueCheck::pretrained ? source.origin() : source.files().front(), layouts[k], ranges[k].begin + at, reinterpret_cast<const X*>(data),
                             n, check);
            if (ranges[k].on_host)
                std::memcpy(static_cast<void*>(ranges[k].dst + at), data, size_t(n) * sizeof(X));
            else
                CUDA_CHECK(cudaMemcpy(ranges[k].dst + at, data, size_t(n) * sizeof(X), cudaMemcpyHostToDevice));
            progress.advance(double(n) * sizeof(X));
        });
    for (size_t k = 0; k < ranges.size(); ++k)
        if (layouts[k].kind == GroupKind::nf4) {  // read and quantised tensor by tensor
            stats.overflows += load_nf4_range(source, layouts[k], ranges[k]);
            progress.advance(double(ranges[k].len) * sizeof(X));
        }
    // A copy from pageable memory may return before its DMA lands, and the zero fills are
    // asynchronous: nothing on a non-blocking stream may read the parameters before they finish.
    CUDA_CHECK(cudaDeviceSynchronize());
    stats.bytes_read = source.bytes_read();
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
}

// The parameters of every group in `set` this rank keeps, as the strategy says (in groups_of order).
template <class T, class G>
std::vector<DeviceRange<T>> param_ranges(Strategy<T, G>& s, GroupSet set = GroupSet::all) {
    std::vector<DeviceRange<T>> out;
    for (int u = 0; u < s.model().num_units(); ++u)
        for (int g = 0; g < s.model().num_groups(u); ++g)
            if (in_set(s.model(), g, set))
                out.push_back({s.local_params(u, g), s.local_begin(u, g), s.local_len(u, g), s.params_on_host()});
    return out;
}

// The range of every unit's trainable group this rank's optimizer owns, of one field.
template <class T>
std::vector<DeviceRange<acc_t<T>>> optimizer_ranges(AdamWState<T>& o, typename AdamWState<T>::Field f) {
    std::vector<DeviceRange<acc_t<T>>> out;
    for (int u = 0; u < o.num_units(); ++u)
        out.push_back({o.data(u, f), o.begin(u), o.end(u) - o.begin(u), o.on_host()});
    return out;
}

// The Hugging Face model in `dir` (model.safetensors or sharded) into the parameters this rank
// keeps under the strategy, converted to T: every group, or with LoRA the base's (the adapters
// keep their initialisation). Tensors Hugging Face ignores by name are skipped; anything else
// that does not fit is refused before any weight is written.
template <class T, class G>
LoadStats load_pretrained(const std::string& dir, Strategy<T, G>& s) {
    const auto start = std::chrono::steady_clock::now();
    verify_model_dir_files(dir, s.comm() ? s.comm()->rank() : 0, s.comm() ? s.comm()->size() : 1);  // a checkpoint
    HfCheckpoint source = HfCheckpoint::open_dir(dir);
    LoadStats stats = load_group_ranges(source, groups_of(s.model(), GroupSet::base), param_ranges(s, GroupSet::base),
                                        ExtraTensors::hugging_face, ValueCheck::pretrained);
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
}

// The weights of every unit `model` holds (whole groups), from a polevault checkpoint or any
// Hugging Face directory (single or sharded, any float dtype), converted to T.
// `set` picks the groups (LoRA: the base from its directory, the adapters from a checkpoint's file).
template <class T>
LoadStats load_model_weights(HfCheckpoint& source, Llama<T>& model, GroupSet set = GroupSet::all,
                             ExtraTensors extra = ExtraTensors::hugging_face) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<DeviceRange<T>> ranges;
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g)
            if (in_set(model, g, set))
                ranges.push_back({model.group_params(u, g), 0, model.holds(u) ? model.group(u, g).padded : 0});
    LoadStats stats = load_group_ranges(source, groups_of(model, set), ranges, extra);
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
}

template <class T>
LoadStats load_model_weights(const std::string& dir, Llama<T>& model) {
    verify_model_dir_files(dir);  // a polevault checkpoint's recorded checksums
    HfCheckpoint source = HfCheckpoint::open_dir(dir);
    return load_model_weights(source, model);
}

// A checkpoint's weights and optimizer state (model/checkpoint.h's files), this rank's ranges of
// each. The optimizer files named in `absent` (accepted missing: --allow-inexact-resume,
// model/checkpoint_files.h) are not read: a missing master is initialised from the loaded
// weights, missing moments keep their fresh zeros. Any other missing file is an error.
template <class T, class G>
LoadStats load_checkpoint_tensors(const std::string& dir, Strategy<T, G>& s, AdamWState<T>& optimizer,
                                  const std::vector<std::string>& absent = {}) {
    using Field = typename AdamWState<T>::Field;
    const auto start = std::chrono::steady_clock::now();
    Llama<T>& model = s.model();
    // A LoRA checkpoint holds the adapters only; the caller loads the base from its own files.
    const GroupSet held = model.lora().enabled() ? GroupSet::trainable : GroupSet::all;
    HfCheckpoint weights = HfCheckpoint::open_file(dir + "/" + weights_file(model));
    LoadStats stats = load_group_ranges(weights, groups_of(model, held), param_ranges(s, held), ExtraTensors::refuse,
                                        ValueCheck::finite);
    const auto is_absent = [&](const std::string& file) {
        return std::find(absent.begin(), absent.end(), file) != absent.end();
    };
    auto field = [&](const char* file, Field f) {
        if (is_absent(file)) return;
        HfCheckpoint source = HfCheckpoint::open_file(dir + "/" + file);
        stats.add(load_group_ranges(source, trainable_groups(model), optimizer_ranges(optimizer, f),
                                    ExtraTensors::refuse,
                                    f == Field::v ? ValueCheck::finite_nonnegative : ValueCheck::finite));
    };
    if constexpr (AdamWState<T>::kHasMaster) {
        if (!is_absent("master.safetensors")) {
            field("master.safetensors", Field::master);
        } else {
            for (int u = 0; u < model.num_units(); ++u)
                optimizer.init_master(u, s.owned_params(u), model.stream(), s.params_on_host());
        }
    }
    field("adam_m.safetensors", Field::m);
    field("adam_v.safetensors", Field::v);
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
}

}  // namespace pv
