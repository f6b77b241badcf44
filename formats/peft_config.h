// PEFT's adapter_config.json for a LoRA adapter: the file beside adapter_model.safetensors that
// tells Hugging Face PEFT (PeftModel.from_pretrained, LoraConfig.from_pretrained) how to attach the
// adapter to its base model. Written when polevault exports or checkpoints a LoRA run, read when a
// run continues from a PEFT-made adapter (--adapter DIR).
//
// Written: every key PEFT 0.21.2's LoraConfig saves, with sorted keys and a 2-space indent as its
// save_pretrained lays them out (test/data/peft/ holds files written by PEFT itself, and the test
// compares ours with them key by key):
//   peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha (an integer when it is one, as PEFT's
//   int-typed default; rsLoRA conversions make it fractional), lora_dropout, use_rslora,
//   target_modules (the HF module names, sorted: PEFT saves a set in arbitrary order),
//   base_model_name_or_path (null when empty), bias "none", fan_in_fan_out false,
//   init_lora_weights true, inference_mode true (what PEFT writes on saving), rank_pattern {},
//   alpha_pattern {}, loftq_config {}, megatron_core "megatron.core", qalora_group_size 16, and
//   every other key null or false (modules_to_save, layers_to_transform, use_dora, lora_bias, ...).
//   peft_version is null: PEFT fills in its own version on loading, and no PEFT wrote the file.
//
// Read: what PEFT writes (any version that has the keys below; keys it adds later are accepted
// while they hold their "off" value, see below), refusing whatever polevault's adapters cannot
// be — y = x·Wᵀ + s·(drop(x)·Aᵀ)·Bᵀ on the seven Llama projections of every layer, one rank and one
// scale — rather than training something else than the file describes:
//   - peft_type must be "LORA"; task_type "CAUSAL_LM" or null (another task type puts the adapter
//     on another model, under other tensor names).
//   - r (default 8), lora_alpha (8), lora_dropout (0), use_rslora (false): PEFT's defaults when absent.
//   - target_modules: a list of module names, each one of q_proj, k_proj, v_proj, o_proj,
//     gate_proj, up_proj, down_proj or its path within a layer (self_attn.q_proj, mlp.up_proj), in
//     any order, repeats ignored (PEFT matches a list entry against the end of each module's name);
//     the string "all-linear" (any case: PEFT's shorthand, all seven on a Llama); null (PEFT's
//     default for Llama, q_proj and v_proj). Any other string is a regular expression and refused,
//     as is an empty list or a module outside the seven (lm_head, embed_tokens, ...).
//   - Refused unless off: bias other than "none", use_dora, fan_in_fan_out, lora_bias, use_qalora,
//     modules_to_save, exclude_modules, layers_to_transform, layers_pattern, rank_pattern,
//     alpha_pattern, layer_replication, trainable_token_indices, target_parameters,
//     alora_invocation_tokens, megatron_config, and the LoRA variants' configs (use_bdlora,
//     arrow_config, kasa_config, velora_config, monteclora_config).
//   - init_lora_weights: true, false, "gaussian", "orthogonal" or "eva" (they only choose the
//     starting values, which the file's weights replace). "pissa…", "olora", "corda", "lora_ga" and
//     "loftq" also rewrite the base weights, so the adapter belongs to a base that is no longer
//     the named one: refused, with PEFT's conversion to a plain LoRA as the fix; "mica" trains A
//     alone with B frozen: refused.
//   - Ignored: peft_version, revision, inference_mode, auto_mapping, base_model_name_or_path
//     (returned), megatron_core and qalora_group_size (only read with megatron_config / use_qalora,
//     both refused), ensure_weight_tying (ties only modules_to_save and adapters on tied modules;
//     none of the seven is tied), loftq_config, eva_config, corda_config and lora_ga_config (the
//     starting values' settings, see init_lora_weights), runtime_config.
//   - A key not named here (from a newer PEFT) is accepted when it is null, false, [] or {}, the
//     values PEFT gives a feature that is off; otherwise refused, naming it.
// Errors are std::runtime_error starting "adapter_config.json '<origin>': " and naming the key, its
// value and the fix. The result passes validate() (model/lora.h), or its problems are thrown the
// same way.
// Host code only.
#pragma once

#include "model/lora.h"

#include <string>

namespace pv {

// The adapter_config.json text of `lora` on the base at `base_model_name_or_path` (a path or a Hub
// id; empty: null). Throws std::invalid_argument when LoRA is off or `lora` does not validate.
std::string peft_adapter_config_json(const LoraConfig& lora, const std::string& base_model_name_or_path);

// Writes peft_adapter_config_json(...) to `path` atomically (io/durable_file.h). Argument errors
// are thrown before the file is touched.
void write_peft_adapter_config(const std::string& path, const LoraConfig& lora,
                               const std::string& base_model_name_or_path);

struct PeftAdapterConfig {
    LoraConfig lora;                      // targets in lora_module_names() order
    std::string base_model_name_or_path;  // as written; empty when null or absent
};

// Parses adapter_config.json text (above); `origin` goes into every error message.
PeftAdapterConfig parse_peft_adapter_config(const std::string& json_text, const std::string& origin);

// Reads `path`: the file, or a directory holding adapter_config.json. A file that cannot be read is
// a std::runtime_error naming the path and the OS error.
PeftAdapterConfig read_peft_adapter_config(const std::string& path);

}  // namespace pv
