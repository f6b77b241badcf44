// Parameter layout: units, their tensors and the placement of tensors in flat groups.
#include "model/parameters.h"

#include <stdexcept>

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

const TensorSlot& GroupLayout::find(const std::string& name) const {
    for (const TensorSlot& t : tensors)
        if (t.spec.name == name) return t;
    throw std::invalid_argument("no tensor named '" + name + "' in this parameter group");
}

GroupLayout layout_group(const std::vector<TensorSpec>& specs, uint32_t first_id, int shards) {
    if (shards < 1) throw std::invalid_argument("layout_group: shards must be >= 1");
    auto round_up = [](long long x, long long m) { return (x + m - 1) / m * m; };
    GroupLayout g;
    g.shards = shards;
    long long offset = 0;
    uint32_t id = first_id;
    for (const TensorSpec& spec : specs) {
        offset = round_up(offset, kTensorAlignment);
        g.tensors.push_back(TensorSlot{spec, id++, offset});
        offset += spec.numel();
    }
    g.used = offset;
    g.padded = round_up(std::max<long long>(offset, 1), kTensorAlignment * shards);
    return g;
}

namespace {

TensorSpec matrix(std::string name, long long rows, long long cols, std::vector<TensorPart> parts) {
    return TensorSpec{std::move(name), rows, cols, Init::normal, std::move(parts)};
}

TensorSpec whole(std::string name, long long rows, long long cols, Init init, std::string hf_name) {
    return TensorSpec{std::move(name), rows, cols, init, {TensorPart{std::move(hf_name), 0, rows}}};
}

}  // namespace

std::vector<UnitSpec> model_units(const LlamaConfig& c) {
    const long long C = c.hidden_size, V = c.vocab_size, F = c.ffn_size;
    const long long q = c.q_width(), kv = c.kv_width();
    std::vector<UnitSpec> units;
    units.push_back({UnitKind::embedding, -1, {whole("wte", V, C, Init::normal, "model.embed_tokens.weight")}});
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        const std::string n = "layers." + std::to_string(l) + ".";
        units.push_back({UnitKind::block,
                         l,
                         {whole(n + "attn_norm", C, 1, Init::ones, p + "input_layernorm.weight"),
                          matrix(n + "w_qkv", q + 2 * kv, C,
                                 {{p + "self_attn.q_proj.weight", 0, q},
                                  {p + "self_attn.k_proj.weight", q, kv},
                                  {p + "self_attn.v_proj.weight", q + kv, kv}}),
                          whole(n + "w_o", C, q, Init::normal, p + "self_attn.o_proj.weight"),
                          whole(n + "mlp_norm", C, 1, Init::ones, p + "post_attention_layernorm.weight"),
                          matrix(n + "w_gate_up", 2 * F, C,
                                 {{p + "mlp.gate_proj.weight", 0, F}, {p + "mlp.up_proj.weight", F, F}}),
                          whole(n + "w_down", C, F, Init::normal, p + "mlp.down_proj.weight")}});
    }
    UnitSpec head{UnitKind::head, -1, {whole("final_norm", C, 1, Init::ones, "model.norm.weight")}};
    if (!c.tie_embeddings) head.tensors.push_back(whole("lm_head", V, C, Init::normal, "lm_head.weight"));
    units.push_back(std::move(head));
    return units;
}

}  // namespace pv
