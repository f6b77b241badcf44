// Parameter layout: units, their tensors and the placement of tensors in flat groups (model/parameters.h).
#include "model/parameters.h"

#include "model/nf4_layout.h"
#include "model/tensor_parallel.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pv {

size_t dtype_size(DType t) {
    switch (t) {
        case DType::bf16: return 2;
        case DType::fp32: return 4;
        case DType::fp64: return 8;
    }
    return 0;
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::bf16: return "bf16";
        case DType::fp32: return "fp32";
        case DType::fp64: return "fp64";
    }
    return "?";
}

DType parse_dtype(const std::string& name) {
    for (DType t : {DType::bf16, DType::fp32, DType::fp64})
        if (name == dtype_name(t)) return t;
    throw std::invalid_argument("dtype '" + name + "' is not a storage type polevault has: choose bf16, fp32 or fp64");
}

const TensorSlot& GroupLayout::find(const std::string& name) const {
    for (const TensorSlot& t : tensors)
        if (t.spec.name == name) return t;
    throw std::invalid_argument("no tensor named '" + name + "' in this parameter group");
}

long long slot_elements(const TensorSpec& spec, GroupKind kind, DType dtype, bool double_quant) {
    if (kind != GroupKind::nf4) return spec.numel();
    const long long size = (long long)dtype_size(dtype);
    return (nf4_slot_bytes(spec, double_quant) + size - 1) / size;
}

bool same_padding(const GroupLayout& a, const GroupLayout& b) {
    if (a.padded != b.padded || a.dtype != b.dtype || a.tensors.size() != b.tensors.size()) return false;
    for (size_t i = 0; i < a.tensors.size(); ++i)
        if (a.tensors[i].offset != b.tensors[i].offset || a.tensors[i].spec.numel() != b.tensors[i].spec.numel())
            return false;
    return true;
}

GroupLayout layout_group(GroupKind kind, DType dtype, const std::vector<TensorSpec>& specs, int shards,
                         bool double_quant) {
    if (shards < 1) throw std::invalid_argument("layout_group: shards must be >= 1");
    auto round_up = [](long long x, long long m) { return (x + m - 1) / m * m; };
    GroupLayout g;
    g.kind = kind;
    g.dtype = dtype;
    g.shards = shards;
    g.double_quant = kind == GroupKind::nf4 && double_quant;
    // An nf4 slot starts on a 256-byte boundary (its fields' alignment), and so does every shard.
    const long long alignment = kind == GroupKind::nf4
                                    ? std::max(kTensorAlignment, kNf4FieldAlignment / (long long)dtype_size(dtype))
                                    : kTensorAlignment;
    long long offset = 0;
    for (const TensorSpec& spec : specs) {
        offset = round_up(offset, alignment);
        g.tensors.push_back(TensorSlot{spec, offset});
        offset += slot_elements(spec, kind, dtype, g.double_quant);
    }
    g.used = offset;
    g.padded = round_up(offset, alignment * shards);
    return g;
}

std::vector<GroupLayout> layout_unit(const UnitSpec& unit, DType dtype, int shards, const std::set<std::string>& frozen,
                                     const std::set<std::string>& quantized, bool double_quant) {
    std::vector<TensorSpec> trainable, fixed, nf4;
    for (const TensorSpec& t : unit.tensors)
        (quantized.count(t.name) ? nf4 : frozen.count(t.name) ? fixed : trainable).push_back(t);
    std::vector<GroupLayout> groups{layout_group(GroupKind::trainable, dtype, trainable, shards)};
    if (!fixed.empty()) groups.push_back(layout_group(GroupKind::frozen, dtype, fixed, shards));
    if (!nf4.empty()) groups.push_back(layout_group(GroupKind::nf4, dtype, nf4, shards, double_quant));
    return groups;
}

long long TensorSpec::whole_index(long long i) const {
    if (slice.whole()) return i;
    const long long row = i / cols, col = i % cols;
    for (const RowRun& r : slice.runs)
        if (row >= r.local && row < r.local + r.rows)
            return (r.whole + row - r.local) * slice.cols + slice.col_begin + col;
    throw std::logic_error("tensor '" + name + "': local row " + std::to_string(row) +
                           " is in none of its slice's runs");
}

TensorSpec TensorSpec::whole_tensor() const {
    if (slice.whole()) return *this;
    TensorSpec w = *this;
    w.rows = slice.rows, w.cols = slice.cols, w.slice = {};
    for (TensorPart& p : w.parts) {
        // The whole tensor's row of the part's first local row, less the Hugging Face rows before it.
        const long long whole_row = whole_index(p.row_begin * cols) / slice.cols;
        p = TensorPart{p.hf_name, whole_row - p.hf_row_begin, p.whole_rows()};
    }
    return w;
}

namespace {

// A matrix (decayed, N(0, 0.02²)) made of HF row ranges, a whole matrix, an RMSNorm weight.
TensorSpec fused(std::string name, long long rows, long long cols, std::vector<TensorPart> parts) {
    return TensorSpec{std::move(name), rows, cols, Init::normal, true, std::move(parts)};
}

TensorSpec matrix(std::string name, long long rows, long long cols, std::string hf_name) {
    return TensorSpec{std::move(name), rows, cols, Init::normal, true, {TensorPart{std::move(hf_name), 0, rows}}};
}

TensorSpec norm(std::string name, long long rows, std::string hf_name) {
    return TensorSpec{std::move(name), rows, 1, Init::ones, false, {TensorPart{std::move(hf_name), 0, rows}}};
}

// A block's adapters (model/lora.h): per targeted linear a stacked A [P·r][in] and B [out_P][r],
// whose parts are PEFT's per-module lora_A / lora_B tensors.
void add_adapters(UnitSpec& block, const std::string& n, const std::string& p,
                  const std::vector<LoraLinearShape>& shapes, int r) {
    for (int k = 0; k < kLoraLinears; ++k) {
        const LoraLinearShape& s = shapes[size_t(k)];
        if (s.parts.empty()) continue;
        std::vector<TensorPart> a_parts, b_parts;
        for (size_t i = 0; i < s.parts.size(); ++i) {
            a_parts.push_back({p + s.parts[i].module + ".lora_A.weight", (long long)i * r, r});
            b_parts.push_back({p + s.parts[i].module + ".lora_B.weight", s.parts[i].b_begin, s.parts[i].rows});
        }
        block.tensors.push_back(
            TensorSpec{n + lora_a_name(k), s.a_rows(r), s.in, Init::uniform_fan_in, true, std::move(a_parts)});
        block.tensors.push_back(TensorSpec{n + lora_b_name(k), s.b_rows(), r, Init::zeros, true, std::move(b_parts)});
    }
}

}  // namespace

std::set<std::string> base_tensor_names(const LlamaConfig& config) {
    std::set<std::string> names;
    for (const UnitSpec& u : model_units(config))
        for (const TensorSpec& t : u.tensors) names.insert(t.name);
    return names;
}

std::vector<std::vector<GroupLayout>> model_layouts(const LlamaConfig& config, DType dtype, int shards,
                                                    const GroupOptions& o) {
    std::set<std::string> frozen = o.frozen;  // with adapters, the whole base is frozen
    if (o.lora.enabled())
        for (const std::string& name : base_tensor_names(config)) frozen.insert(name);
    std::set<std::string> quantized;  // QLoRA: every block linear, as bitsandbytes' Linear4bit layers
    if (o.nf4) {
        if (!o.lora.enabled())
            throw std::invalid_argument(
                "NF4 quantisation stores a frozen base: it needs LoRA adapters to train (--lora-rank)");
        for (int l = 0; l < config.num_layers; ++l)
            for (const char* t : kNf4Linears)
                quantized.insert("layers." + std::to_string(l) + "." + t);
        check_nf4_tensor_parallel(config, o.lora, o.tensor.size);
    }
    std::vector<std::vector<GroupLayout>> out;
    for (const UnitSpec& unit : tensor_parallel_units(config, o.lora, o.tensor))
        out.push_back(layout_unit(unit, dtype, shards, frozen, quantized, o.double_quant));
    return out;
}

std::vector<UnitSpec> model_units(const LlamaConfig& c, const LoraConfig& lora) {
    const long long C = c.hidden_size, V = c.vocab_size, F = c.ffn_size;
    const long long q = c.q_width(), kv = c.kv_width();
    std::vector<UnitSpec> units;
    units.push_back({UnitKind::embedding, -1, {matrix("wte", V, C, "model.embed_tokens.weight")}});
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        const std::string n = "layers." + std::to_string(l) + ".";
        UnitSpec block{UnitKind::block, l, std::vector<TensorSpec>(kBlockTensors)};
        block.tensors[kAttnNorm] = norm(n + "attn_norm", C, p + "input_layernorm.weight");
        block.tensors[kWQkv] = fused(n + "w_qkv", q + 2 * kv, C,
                                     {{p + "self_attn.q_proj.weight", 0, q},
                                      {p + "self_attn.k_proj.weight", q, kv},
                                      {p + "self_attn.v_proj.weight", q + kv, kv}});
        block.tensors[kWO] = matrix(n + "w_o", C, q, p + "self_attn.o_proj.weight");
        block.tensors[kMlpNorm] = norm(n + "mlp_norm", C, p + "post_attention_layernorm.weight");
        block.tensors[kWGateUp] =
            fused(n + "w_gate_up", 2 * F, C, {{p + "mlp.gate_proj.weight", 0, F}, {p + "mlp.up_proj.weight", F, F}});
        block.tensors[kWDown] = matrix(n + "w_down", C, F, p + "mlp.down_proj.weight");
        units.push_back(std::move(block));
    }
    UnitSpec head{UnitKind::head, -1, {norm("final_norm", C, "model.norm.weight")}};
    if (!c.tie_embeddings) head.tensors.push_back(matrix("lm_head", V, C, "lm_head.weight"));
    units.push_back(std::move(head));
    uint32_t id = 0;
    for (UnitSpec& u : units)
        for (TensorSpec& t : u.tensors) t.id = id++;
    if (lora.enabled()) {  // ids after every base tensor's
        const auto shapes = lora_linears(c, lora);
        for (UnitSpec& u : units) {
            if (u.kind != UnitKind::block) continue;
            const std::string l = std::to_string(u.layer);
            add_adapters(u, "layers." + l + ".", kPeftKeyPrefix + std::string("model.layers.") + l + ".", shapes,
                         lora.rank);
            for (size_t i = kBlockTensors; i < u.tensors.size(); ++i) u.tensors[i].id = id++;
        }
    }
    return units;
}

}  // namespace pv
