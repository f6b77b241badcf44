// Parameter layout: units and groups for every preset, alignment, padding for shards, and the
// Hugging Face tensors inside fused ones.
#include "model/parameters.h"

#include <catch2/catch.hpp>

#include <set>

TEST_CASE("every preset's units hold exactly its parameters, aligned and padded for any shard count", "[parameters]") {
    for (const std::string& name : pv::preset_names()) {
        const pv::LlamaConfig& c = pv::preset(name);
        INFO(name);
        const auto units = pv::model_units(c);
        REQUIRE(units.size() == size_t(c.num_layers) + 2);
        REQUIRE(units.front().kind == pv::UnitKind::embedding);
        REQUIRE(units.back().kind == pv::UnitKind::head);
        for (int shards : {1, 2, 3, 4, 8}) {
            long long total = 0;
            std::set<uint32_t> ids;
            for (const auto& unit : units) {
                const pv::GroupLayout g =
                    pv::layout_group(pv::GroupKind::trainable, pv::DType::bf16, unit.tensors, shards);
                REQUIRE(g.padded % (pv::kTensorAlignment * shards) == 0);
                REQUIRE(g.shard_numel() % pv::kTensorAlignment == 0);
                REQUIRE(g.padded >= g.used);
                long long end = 0;
                for (const pv::TensorSlot& t : g.tensors) {
                    REQUIRE(t.offset % pv::kTensorAlignment == 0);
                    REQUIRE(t.offset >= end);  // no overlap
                    end = t.offset + t.spec.numel();
                    total += t.spec.numel();
                    REQUIRE(ids.insert(t.spec.id).second);
                    // The HF parts tile the tensor's rows exactly.
                    long long row = 0;
                    for (const pv::TensorPart& p : t.spec.parts) {
                        REQUIRE(p.row_begin == row);
                        row += p.rows;
                    }
                    REQUIRE(row == t.spec.rows);
                }
                REQUIRE(end == g.used);
            }
            REQUIRE(total == pv::parameter_count(c));
        }
    }
}

TEST_CASE("fused tensors name their Hugging Face parts; tied models have no lm_head", "[parameters]") {
    const pv::LlamaConfig& c = pv::preset("smollm2-135m");
    const auto units = pv::model_units(c);
    const pv::TensorSpec& qkv = units[1].tensors[1];
    REQUIRE(qkv.name == "layers.0.w_qkv");
    REQUIRE(qkv.rows == c.q_width() + 2LL * c.kv_width());
    REQUIRE(qkv.parts.size() == 3);
    REQUIRE(qkv.parts[1].hf_name == "model.layers.0.self_attn.k_proj.weight");
    REQUIRE(qkv.parts[1].row_begin == c.q_width());
    REQUIRE(units.back().tensors.size() == 1);  // tied: the final norm only
    const auto untied = pv::model_units(pv::preset("test-tiny"));
    REQUIRE(untied.back().tensors.size() == 2);
    REQUIRE(untied.back().tensors[1].parts[0].hf_name == "lm_head.weight");
}
