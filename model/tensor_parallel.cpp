// Tensor parallelism's slices of the block tensors (model/tensor_parallel.h).
#include "model/tensor_parallel.h"

#include "model/nf4_layout.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pv {

namespace {

// The problem with T, or "" when T splits the model.
std::string tensor_parallel_problem(const LlamaConfig& c, int t) {
    const int hq = c.num_heads, hkv = c.num_kv_heads;
    if (t < 1) return "must be at least 1";
    if (hq % t != 0) return "does not divide the " + std::to_string(hq) + " query heads";
    if (c.ffn_size % t != 0) return "does not divide the ffn size " + std::to_string(c.ffn_size);
    const int per_rank = hq / t, group = hq / hkv;
    if (hkv % t != 0 && group % per_rank != 0)
        return "divides neither the " + std::to_string(hkv) + " key/value heads nor leaves each rank's " +
               std::to_string(per_rank) + " query heads within one key/value head's group of " +
               std::to_string(group);
    const long long v = c.vocab_size, rows = (v + t - 1) / t;
    if ((t - 1) * rows >= v)
        return "leaves the last rank none of the vocabulary's " + std::to_string(v) + " rows (" +
               std::to_string(rows) + " a rank)";
    return "";
}

// The rows of a whole tensor's part a slice keeps: Hugging Face rows [begin, begin + count).
struct Keep {
    long long begin = 0, count = 0;
    bool copy = false;  // RowRun::copy
};

// The slice of `whole` made of, for each of its parts, the rows keep(part) of it (the parts'
// order kept), all its columns.
template <class KeepOf>
TensorSpec slice_rows(const TensorSpec& whole, KeepOf keep_of) {
    TensorSpec s = whole;
    s.slice = TensorSlice{whole.rows, whole.cols, 0, {}};
    s.parts.clear();
    long long local = 0;
    for (const TensorPart& p : whole.parts) {
        const Keep k = keep_of(p);
        if (k.begin < 0 || k.begin + k.count > p.rows)
            throw std::logic_error("tensor parallelism: a slice outside part " + p.hf_name + " of " + whole.name);
        s.parts.push_back(TensorPart{p.hf_name, local, k.count, p.hf_row_begin + k.begin, p.whole_rows()});
        s.slice.runs.push_back(RowRun{local, p.row_begin + k.begin, k.count, k.copy});
        local += k.count;
    }
    s.rows = local;
    return s;
}

// The slice of `whole` made of its columns [begin, begin + count), all its rows.
TensorSpec slice_columns(const TensorSpec& whole, long long begin, long long count) {
    TensorSpec s = whole;
    s.slice = TensorSlice{whole.rows, whole.cols, begin, {RowRun{0, 0, whole.rows}}};
    s.cols = count;
    return s;
}

bool names_module(const TensorPart& p, const char* module) {
    return p.hf_name.find(std::string(".") + module + ".") != std::string::npos;
}

}  // namespace

bool tensor_parallel_fits(const LlamaConfig& c, int size) { return tensor_parallel_problem(c, size).empty(); }

void check_tensor_parallel(const LlamaConfig& c, int size) {
    const std::string problem = tensor_parallel_problem(c, size);
    if (problem.empty()) return;
    std::string fits;
    for (int t = 1; t <= c.num_heads; ++t)
        if (tensor_parallel_fits(c, t)) fits += (fits.empty() ? "" : ", ") + std::to_string(t);
    throw std::invalid_argument("tensor parallelism over " + std::to_string(size) + " ranks: " + std::to_string(size) +
                                " " + problem + " of " + (c.name.empty() ? "the model" : c.name) +
                                "; --tp can be " + fits);
}

namespace {

// Why an NF4 base cannot be split over t ranks ("" when it can): the first slice that cuts a block.
std::string nf4_split_problem(const LlamaConfig& c, const LoraConfig& lora, int t) {
    if (!tensor_parallel_fits(c, t)) return "tensor parallelism over " + std::to_string(t) + " ranks does not fit";
    const std::string block = "layers.0.";
    for (int r = 0; r < t; ++r) {  // every block is split alike: the first one's NF4 linears
        const std::vector<UnitSpec> units = tensor_parallel_units(c, lora, TensorParallel{t, r});
        for (const TensorSpec& s : units.at(1).tensors)
            for (const char* linear : kNf4Linears)
                if (s.name == block + linear) try {
                        nf4_part_fields(s, true);
                    } catch (const std::invalid_argument& e) {
                        return e.what();
                    }
    }
    return "";
}

}  // namespace

bool nf4_tensor_parallel_fits(const LlamaConfig& c, const LoraConfig& lora, int size) {
    return size == 1 || nf4_split_problem(c, lora, size).empty();
}

void check_nf4_tensor_parallel(const LlamaConfig& c, const LoraConfig& lora, int size) {
    if (size == 1) return;
    const std::string problem = nf4_split_problem(c, lora, size);
    if (problem.empty()) return;
    std::string fits;
    for (int t = 1; t <= c.num_heads; ++t)
        if (nf4_tensor_parallel_fits(c, lora, t)) fits += (fits.empty() ? "" : ", ") + std::to_string(t);
    throw std::invalid_argument(problem + ": QLoRA (--quantize nf4) over " + std::to_string(size) +
                                " tensor-parallel ranks cannot split " + (c.name.empty() ? "the model" : c.name) +
                                "; --tp can be " + fits + " with --quantize nf4 (or train LoRA on a dense base)");
}

bool kv_heads_replicated(const LlamaConfig& c, int size) { return c.num_kv_heads % size != 0; }

long long replicated_kv_rows(const LlamaConfig& c, int size) {
    return kv_heads_replicated(c, size) ? 2LL * c.num_kv_heads * c.head_dim_resolved() : 0;
}

HeadSlice tensor_parallel_heads(const LlamaConfig& c, TensorParallel tp) {
    check_tensor_parallel(c, tp.size);
    if (tp.rank < 0 || tp.rank >= tp.size)
        throw std::invalid_argument("tensor parallelism: rank " + std::to_string(tp.rank) + " of a group of " +
                                    std::to_string(tp.size));
    HeadSlice h;
    h.q_count = c.num_heads / tp.size;
    h.q_first = tp.rank * h.q_count;
    if (!kv_heads_replicated(c, tp.size)) {
        h.kv_count = c.num_kv_heads / tp.size;
        h.kv_first = tp.rank * h.kv_count;
    } else {  // this rank's query heads all read one kv head (check_tensor_parallel)
        const int group = c.num_heads / c.num_kv_heads;
        h.kv_count = 1;
        h.kv_first = h.q_first / group;
        h.kv_copy = h.q_first % group != 0;  // the head's first reader holds it at its first query head
    }
    return h;
}

VocabSlice tensor_parallel_vocab(const LlamaConfig& c, TensorParallel tp) {
    if (tp.size == 1) return {0, c.vocab_size};
    tensor_parallel_heads(c, tp);  // checks T and the rank
    const long long rows = (c.vocab_size + tp.size - 1) / tp.size, first = tp.rank * rows;
    return {first, std::min<long long>(c.vocab_size, first + rows) - first};
}

LlamaConfig tensor_parallel_shape(const LlamaConfig& c, TensorParallel tp) {
    LlamaConfig s = c;
    s.head_dim = c.head_dim_resolved();
    if (tp.size == 1) return s;
    const HeadSlice h = tensor_parallel_heads(c, tp);
    s.num_heads = h.q_count, s.num_kv_heads = h.kv_count, s.ffn_size = c.ffn_size / tp.size;
    s.vocab_size = int(tensor_parallel_vocab(c, tp).count);
    return s;
}

std::vector<UnitSpec> tensor_parallel_units(const LlamaConfig& c, const LoraConfig& lora, TensorParallel tp) {
    std::vector<UnitSpec> units = model_units(c, lora);
    if (tp.size == 1) return units;
    const HeadSlice h = tensor_parallel_heads(c, tp);
    const long long hd = c.head_dim_resolved(), f = c.ffn_size / tp.size, f_first = tp.rank * f;
    // The Hugging Face rows a column-parallel weight (or its LoRA B) keeps of each module.
    const auto keep = [&](const TensorPart& p) {
        if (names_module(p, "q_proj")) return Keep{h.q_first * hd, h.q_count * hd};
        if (names_module(p, "k_proj") || names_module(p, "v_proj"))
            return Keep{h.kv_first * hd, h.kv_count * hd, h.kv_copy};
        if (names_module(p, "gate_proj") || names_module(p, "up_proj")) return Keep{f_first, f};
        throw std::logic_error("tensor parallelism: no rule for " + p.hf_name);
    };
    const VocabSlice vocab = tensor_parallel_vocab(c, tp);
    const auto token_rows = [&](const TensorPart&) { return Keep{vocab.first, vocab.count}; };
    for (UnitSpec& u : units) {
        if (u.kind != UnitKind::block) {  // the embedding and the head: their token rows
            for (TensorSpec& t : u.tensors)
                if (t.name == "wte" || t.name == "lm_head") t = slice_rows(t, token_rows);
            continue;
        }
        const std::string n = "layers." + std::to_string(u.layer) + ".";
        for (TensorSpec& t : u.tensors) {
            if (t.name == n + "w_qkv" || t.name == n + "w_gate_up" || t.name == n + lora_b_name(kLoraQkv) ||
                t.name == n + lora_b_name(kLoraGateUp))
                t = slice_rows(t, keep);  // column-parallel: rows (a B: its output rows)
            else if (t.name == n + "w_o" || t.name == n + lora_a_name(kLoraO))
                t = slice_columns(t, h.q_first * hd, h.q_count * hd);  // row-parallel: the heads' columns
            else if (t.name == n + "w_down" || t.name == n + lora_a_name(kLoraDown))
                t = slice_columns(t, f_first, f);
            // Otherwise replicated: the norms, a column-parallel adapter's A, a row-parallel one's B.
        }
    }
    return units;
}

long long adapter_kv_rows(const LlamaConfig& c, const LoraConfig& lora) {
    const std::vector<LoraLinearShape> linears = lora_linears(c, lora);  // empty without LoRA
    long long rows = 0;
    if (!linears.empty())
        for (const LoraPart& p : linears[size_t(kLoraQkv)].parts) rows += p.out_begin >= c.q_width() ? p.rows : 0;
    return rows;
}

std::vector<std::pair<long long, long long>> counted_ranges(const GroupLayout& g, int rank) {
    if (rank == 0) return {{0, g.padded}};
    std::vector<std::pair<long long, long long>> ranges;
    const auto add = [&](long long begin, long long end) {
        if (!ranges.empty() && ranges.back().second == begin)
            ranges.back().second = end;
        else
            ranges.push_back({begin, end});
    };
    for (const TensorSlot& t : g.tensors) {
        if (t.spec.slice.whole()) continue;  // rank 0's
        for (const RowRun& run : t.spec.slice.runs)
            if (!run.copy) add(t.offset + run.local * t.spec.cols, t.offset + (run.local + run.rows) * t.spec.cols);
    }
    return ranges;
}

std::vector<uint8_t> join_tensor_slices(const GroupLayout& whole, const std::vector<GroupLayout>& slices,
                                        const std::vector<const uint8_t*>& slice_bytes, size_t element) {
    if (slices.size() != slice_bytes.size() || slices.empty())
        throw std::invalid_argument("join_tensor_slices: " + std::to_string(slices.size()) + " layouts for " +
                                    std::to_string(slice_bytes.size()) + " slices");
    std::vector<uint8_t> out(size_t(whole.padded) * element, 0);
    long long written = 0;  // elements of whole tensors, each counted once
    for (size_t r = 0; r < slices.size(); ++r)
        for (const TensorSlot& t : slices[r].tensors) {
            if (t.spec.slice.whole() && r != 0) continue;  // a copy of rank 0's
            const TensorSlot& w = whole.find(t.spec.name);
            if (t.spec.whole_numel() != w.spec.numel() || t.spec.whole_cols() != w.spec.cols)
                throw std::invalid_argument("join_tensor_slices: '" + t.spec.name + "' is a slice of another shape");
            // A row of the slice is a run of one row of the whole tensor (its columns from col_begin);
            // a copy's rows come from the rank that counts them.
            const size_t row_bytes = size_t(t.spec.cols) * element;
            const std::vector<RowRun> all{RowRun{0, 0, t.spec.rows}};
            for (const RowRun& run : t.spec.slice.whole() ? all : t.spec.slice.runs) {
                if (run.copy) continue;
                for (long long row = run.local; row < run.local + run.rows; ++row)
                    std::memcpy(out.data() + size_t(w.offset + t.spec.whole_index(row * t.spec.cols)) * element,
                                slice_bytes[r] + size_t(t.offset + row * t.spec.cols) * element, row_bytes);
                written += run.rows * t.spec.cols;
            }
        }
    long long expected = 0;
    for (const TensorSlot& w : whole.tensors) expected += w.spec.numel();
    if (written != expected)
        throw std::invalid_argument("join_tensor_slices: the slices hold " + std::to_string(written) + " of the " +
                                    std::to_string(expected) + " elements of the whole tensors");
    return out;
}

}  // namespace pv
