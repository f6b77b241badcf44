// --freeze: which of a model's tensors stay fixed while the rest train.
//
// Patterns are shell globs (fnmatch, `*` also matching dots) over Hugging Face tensor names, e.g.
// 'model.embed_tokens.*,*.input_layernorm.*'. polevault fuses some HF tensors into one
// (q/k/v_proj into w_qkv, gate/up_proj into w_gate_up; model/parameters.h), and a tensor is
// either frozen or not, so a pattern must take all of a fused tensor's parts or none. With tied
// embeddings lm_head.weight is model.embed_tokens.weight: freezing either freezes both, and a
// note says so. A pattern that matches nothing is an error (a typo would otherwise train what
// the user meant to keep), and so is freezing every tensor (nothing would train).
// Host code only.
#pragma once

#include "model/config.h"

#include <set>
#include <string>
#include <vector>

namespace pv {

struct FrozenTensors {
    std::set<std::string> names;     // polevault tensor names (model_units) to freeze
    std::vector<std::string> notes;  // what the user should know (a tied lm_head frozen with the embedding)
};

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_patterns(const std::string& comma_separated);

// The tensors of `config` that `patterns` freeze. Throws std::invalid_argument naming the pattern
// and the fix when a pattern matches nothing, takes part of a fused tensor, or freezes everything.
FrozenTensors resolve_freeze(const LlamaConfig& config, const std::vector<std::string>& patterns);

}  // namespace pv
