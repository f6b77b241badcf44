// --freeze (model/freeze.h): which polevault tensors a set of globs over Hugging Face names
// freezes, on an untied preset (test-tiny: 2 layers, its own lm_head) and a tied one (test-tied:
// 3 layers, lm_head is the embedding); the notes a tied embedding gets; the three refusals (a
// pattern that matches nothing, part of a fused tensor, every tensor) with messages that name the
// problem and the fix; and how the comma-separated flag splits.
#include "model/freeze.h"

#include "model/config.h"

#include <catch2/catch.hpp>

#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace freeze_test {

using Names = std::set<std::string>;

pv::FrozenTensors resolve(const std::string& preset, const std::string& patterns) {
    return pv::resolve_freeze(pv::preset(preset), pv::split_patterns(patterns));
}

Names frozen(const std::string& preset, const std::string& patterns) { return resolve(preset, patterns).names; }

// The message resolve_freeze refuses `patterns` with ("" when it does not refuse them).
std::string refusal(const std::string& preset, const std::string& patterns) {
    try {
        resolve(preset, patterns);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

const std::string kNoMatch = "matches no tensor of this model";
const std::string kEverything = "--freeze freezes every tensor of the model: nothing would train; freeze fewer";
const std::string kTiedEmbedding = "model.embed_tokens.weight is tied to lm_head.weight: lm_head is frozen too";
const std::string kTiedHead = "lm_head.weight is tied to model.embed_tokens.weight: the embedding is frozen too";

}  // namespace freeze_test

using namespace freeze_test;

TEST_CASE("freeze: globs over Hugging Face names select polevault tensors (untied test-tiny)", "[freeze]") {
    const std::string m = "test-tiny";
    REQUIRE(pv::preset(m).num_layers == 2);
    REQUIRE_FALSE(pv::preset(m).tie_embeddings);
    CHECK(frozen(m, "").empty());
    CHECK(resolve(m, "").notes.empty());
    CHECK(frozen(m, "model.embed_tokens.weight") == Names{"wte"});
    CHECK(frozen(m, "model.embed_tokens.*") == Names{"wte"});
    CHECK(frozen(m, "lm_head.weight") == Names{"lm_head"});  // its own tensor here: the embedding stays
    CHECK(frozen(m, "model.norm.weight") == Names{"final_norm"});
    CHECK(frozen(m, "*.input_layernorm.*") == Names{"layers.0.attn_norm", "layers.1.attn_norm"});
    CHECK(frozen(m, "*norm*") ==
          Names{"layers.0.attn_norm", "layers.0.mlp_norm", "layers.1.attn_norm", "layers.1.mlp_norm", "final_norm"});
    CHECK(frozen(m, "model.layers.1.*") == Names{"layers.1.attn_norm", "layers.1.w_qkv", "layers.1.w_o",
                                                 "layers.1.mlp_norm", "layers.1.w_gate_up", "layers.1.w_down"});
    // `*` crosses dots (no FNM_PATHNAME).
    CHECK(frozen(m, "*.self_attn.*") == Names{"layers.0.w_qkv", "layers.0.w_o", "layers.1.w_qkv", "layers.1.w_o"});
    CHECK(frozen(m, "*.mlp.*") ==
          Names{"layers.0.w_gate_up", "layers.0.w_down", "layers.1.w_gate_up", "layers.1.w_down"});
    // A fused tensor is frozen when its parts are all taken, by one pattern or by several together.
    CHECK(frozen(m, "model.layers.0.self_attn.[qkv]_proj.weight") == Names{"layers.0.w_qkv"});
    CHECK(frozen(m, "model.layers.0.mlp.gate_proj.weight,model.layers.0.mlp.up_proj.weight") ==
          Names{"layers.0.w_gate_up"});
    CHECK(frozen(m, "*.q_proj.*,*.k_proj.*,*.v_proj.*") == Names{"layers.0.w_qkv", "layers.1.w_qkv"});
    // Overlapping patterns are fine as long as each matches something.
    CHECK(frozen(m, "model.embed_tokens.*,*.input_layernorm.*,model.layers.0.input_layernorm.weight") ==
          Names{"wte", "layers.0.attn_norm", "layers.1.attn_norm"});
    // Everything but lm_head: one tensor still trains, so this is allowed.
    Names all_but_head;
    for (const char* t : {"attn_norm", "w_qkv", "w_o", "mlp_norm", "w_gate_up", "w_down"})
        for (int l : {0, 1}) all_but_head.insert("layers." + std::to_string(l) + "." + t);
    all_but_head.insert("wte");
    all_but_head.insert("final_norm");
    CHECK(frozen(m, "model.*") == all_but_head);
    for (const char* p : {"model.embed_tokens.*", "lm_head.weight", "model.*", "*norm*"}) {
        INFO(p);
        CHECK(resolve(m, p).notes.empty());  // nothing is tied
    }
}

TEST_CASE("freeze: with tied embeddings the embedding and lm_head freeze together, with a note", "[freeze]") {
    const std::string m = "test-tied";
    REQUIRE(pv::preset(m).num_layers == 3);
    REQUIRE(pv::preset(m).tie_embeddings);
    const pv::FrozenTensors embedding = resolve(m, "model.embed_tokens.weight");
    CHECK(embedding.names == Names{"wte"});
    CHECK(embedding.notes == std::vector<std::string>{kTiedEmbedding});
    const pv::FrozenTensors head = resolve(m, "lm_head.weight");  // no lm_head tensor, yet not "matches nothing"
    CHECK(head.names == Names{"wte"});
    CHECK(head.notes == std::vector<std::string>{kTiedHead});
    const pv::FrozenTensors both = resolve(m, "lm_head.*,model.embed_tokens.*");
    CHECK(both.names == Names{"wte"});
    CHECK(both.notes.size() == 1);  // one tensor, one note
    const pv::FrozenTensors norms = resolve(m, "*.input_layernorm.*,model.norm.weight");
    CHECK(norms.names == Names{"layers.0.attn_norm", "layers.1.attn_norm", "layers.2.attn_norm", "final_norm"});
    CHECK(norms.notes.empty());
    CHECK(frozen(m, "model.layers.2.mlp.*") == Names{"layers.2.w_gate_up", "layers.2.w_down"});
}

TEST_CASE("freeze: a pattern that matches nothing is refused, naming it and what names look like", "[freeze]") {
    for (const auto& [m, patterns, bad] : std::vector<std::tuple<std::string, std::string, std::string>>{
             {"test-tiny", "model.layers.2.*", "model.layers.2.*"},                  // 2 layers: 0 and 1
             {"test-tiny", "model.embed_token.weight", "model.embed_token.weight"},  // a typo
             {"test-tiny", "*.input_layernorm.*,*.q_norm.*", "*.q_norm.*"},          // one of several
             {"test-tied", "model.layers.3.*", "model.layers.3.*"},
             {"test-tiny", "Model.norm.weight", "Model.norm.weight"}}) {  // case matters
        INFO(m << ": " << patterns);
        const std::string what = refusal(m, patterns);
        CHECK_THAT(what, Catch::Contains("--freeze: the pattern '" + bad + "' " + kNoMatch) &&
                             Catch::Contains("model.layers.0.input_layernorm.weight") &&
                             Catch::Contains("check its spelling"));
    }
}

TEST_CASE("freeze: a pattern set taking only part of a fused tensor is refused, naming all its parts", "[freeze]") {
    const std::string qkv =
        "model.layers.0.self_attn.q_proj.weight, model.layers.0.self_attn.k_proj.weight, "
        "model.layers.0.self_attn.v_proj.weight are one fused tensor in polevault (layers.0.w_qkv)";
    const std::string gate_up =
        "model.layers.0.mlp.gate_proj.weight, model.layers.0.mlp.up_proj.weight are one fused "
        "tensor in polevault (layers.0.w_gate_up)";
    const std::string fix = "the patterns take only part of it; freeze all of them or none";
    for (const auto& [m, patterns, fused] : std::vector<std::tuple<std::string, std::string, std::string>>{
             {"test-tiny", "*.q_proj.weight", qkv},
             {"test-tiny", "*.self_attn.[qk]_proj.*", qkv},
             {"test-tied", "model.layers.0.self_attn.v_proj.weight", qkv},
             {"test-tiny", "*.gate_proj.*", gate_up},
             {"test-tied", "model.layers.0.mlp.up_proj.weight,model.norm.weight", gate_up},
             {"test-tiny", "model.layers.1.mlp.gate_proj.weight",
              "model.layers.1.mlp.gate_proj.weight, model.layers.1.mlp.up_proj.weight are one fused tensor in "
              "polevault (layers.1.w_gate_up)"}}) {
        INFO(m << ": " << patterns);
        const std::string what = refusal(m, patterns);
        CHECK_THAT(what, Catch::StartsWith("--freeze: ") && Catch::Contains(fused) && Catch::Contains(fix));
    }
    // All of a fused tensor's parts, however spelled, are fine.
    CHECK(frozen("test-tiny", "*.self_attn.?_proj.weight") ==
          Names{"layers.0.w_qkv", "layers.0.w_o", "layers.1.w_qkv", "layers.1.w_o"});
    CHECK(frozen("test-tiny", "*.self_attn.[vkq]_proj.weight") == Names{"layers.0.w_qkv", "layers.1.w_qkv"});
}

TEST_CASE("freeze: freezing every tensor is refused (nothing would train)", "[freeze]") {
    for (const auto& [m, patterns] : std::vector<std::pair<std::string, std::string>>{
             {"test-tiny", "*"},
             {"test-tiny", "*.weight"},
             {"test-tiny", "model.*,lm_head.weight"},
             {"test-tied", "*"},
             {"test-tied", "model.*"}}) {  // tied: model.* holds every tensor, lm_head included
        INFO(m << ": " << patterns);
        CHECK(refusal(m, patterns) == kEverything);
    }
}

TEST_CASE("freeze: split_patterns drops empty entries and keeps the rest as written", "[freeze]") {
    using V = std::vector<std::string>;
    CHECK(pv::split_patterns("") == V{});
    CHECK(pv::split_patterns(",") == V{});
    CHECK(pv::split_patterns(",,,") == V{});
    CHECK(pv::split_patterns("a") == V{"a"});
    CHECK(pv::split_patterns("a,b") == V{"a", "b"});
    CHECK(pv::split_patterns("a,,b") == V{"a", "b"});
    CHECK(pv::split_patterns("a,b,") == V{"a", "b"});
    CHECK(pv::split_patterns(",a") == V{"a"});
    CHECK(pv::split_patterns("a,b,,c") == V{"a", "b", "c"});
    CHECK(pv::split_patterns("model.embed_tokens.*,*.input_layernorm.*") ==
          V{"model.embed_tokens.*", "*.input_layernorm.*"});
    // No trimming: a space is part of the pattern (and such a pattern then matches nothing and is refused).
    CHECK(pv::split_patterns("a, b") == V{"a", " b"});
    CHECK_THAT(refusal("test-tiny", "model.norm.weight, lm_head.weight"),
               Catch::Contains("the pattern ' lm_head.weight' " + kNoMatch));
}
