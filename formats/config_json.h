// Hugging Face config.json for LlamaConfig: the file every Llama checkpoint on the Hub carries,
// read so a published model's shape comes from its own file, and written next to exported
// safetensors so `transformers` (and anything else that reads the Hub format) loads our models.
//
// Written (LlamaForCausalLM; keys sorted, 2-space indent, a trailing newline: exactly how
// transformers' save_pretrained lays a config.json out, so a diff against a published file shows
// only real differences):
//   architectures ["LlamaForCausalLM"], model_type "llama", vocab_size, hidden_size,
//   intermediate_size (ffn_size), num_hidden_layers (num_layers), num_attention_heads
//   (num_heads), num_key_value_heads (num_kv_heads), head_dim (always the resolved value, as
//   recent transformers versions write it), rms_norm_eps, rope_theta, rope_scaling (null, or
//   {rope_type "llama3", factor, low_freq_factor, high_freq_factor,
//   original_max_position_embeddings}), max_position_embeddings (max_seq_len),
//   tie_word_embeddings, hidden_act "silu", attention_bias false, mlp_bias false, torch_dtype.
// Doubles are written in the shortest form that reads back to the same bits (1e-05, 500000.0).
// Token ids (bos/eos/pad) are not written: a LlamaConfig does not know them; they belong to the
// tokenizer.
//
// Read: what transformers' LlamaConfig accepts for the architecture we implement.
//   - model_type "llama", or architectures containing "LlamaForCausalLM"; anything else is
//     another architecture and is refused by name.
//   - Required: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
//     num_attention_heads. transformers would silently default them to Llama-2-7B's sizes; a
//     file without them is far more likely broken than meant to be a 7B, so we refuse.
//   - Optional, with transformers' LlamaConfig defaults (configuration_llama.py, v4.45–v5):
//     num_key_value_heads = num_attention_heads, head_dim = hidden_size / num_attention_heads
//     (kept as 0 in LlamaConfig so validation still checks the division), rms_norm_eps 1e-6,
//     rope_theta 10000, rope_scaling null, max_position_embeddings 2048,
//     tie_word_embeddings false, hidden_act "silu", attention_bias false, mlp_bias false.
//     null counts as absent for num_key_value_heads, head_dim and rope_scaling, which
//     transformers documents as optional (None); elsewhere null is a type error.
//   - rope_scaling: null, or an object whose rope_type (or the older key "type") is "llama3"
//     with its four numbers, or "default" (no scaling). Other types (linear, dynamic, yarn,
//     longrope, ...) change RoPE in ways our kernels do not implement and are refused.
//   - transformers 5 writes "rope_parameters" {rope_type, rope_theta, ...} instead of
//     rope_theta + rope_scaling; it is read the same way and wins over rope_theta. A file with
//     both a non-null rope_scaling and rope_parameters must agree.
//   - attention_bias / mlp_bias true, or a hidden_act other than "silu", describe weights or
//     math our model does not have, and are refused.
//   - Every other key (initializer_range, token ids, torch_dtype, use_cache, ...) is ignored.
// Every error is a std::runtime_error whose message starts "config.json '<origin>': " and names
// the key, its value (as JSON) and the fix; a wrong JSON type names the key and both types. The
// result must pass validate(): its problems come as validate_or_throw words them (naming the
// origin), as a runtime_error, with the config.json key of each LlamaConfig field they name.
//
// torch_dtype: the storage type the weights were saved in ("bfloat16", "float32", ...; "dtype" in
// transformers 5), which LlamaConfig does not hold; read_hf_torch_dtype returns it as written.
//
// generation_config.json: the file transformers' generate() reads the token ids from (written
// with sorted keys and a 2-space indent, as transformers does):
//   {"bos_token_id": 1, "eos_token_id": 2}        eos_token_id may also be a list ([128001, 128009]:
//                                                   Llama 3 Instruct stops at either); a missing
//                                                   or null key means "none".
// Host code only.
#pragma once

#include "model/config.h"

#include <string>
#include <vector>

namespace pv {

// The config.json text of a LlamaForCausalLM with this shape. torch_dtype is "bfloat16",
// "float32" or "float64". Throws std::invalid_argument for another torch_dtype or a config that
// does not validate.
std::string hf_config_json(const LlamaConfig& c, const std::string& torch_dtype = "bfloat16");

// Parses config.json text (above). `origin` (a path or description) goes into every error message
// and becomes the returned config's name.
LlamaConfig parse_hf_config(const std::string& json_text, const std::string& origin);

// Reads the file at `path` and parses it with origin = path. A file that cannot be read is a
// std::runtime_error naming the path and the OS error.
LlamaConfig read_hf_config(const std::string& path);

// Writes hf_config_json(c, torch_dtype) to `path` atomically (io/durable_file.h). Argument errors
// are thrown before the file is touched.
void write_hf_config(const std::string& path, const LlamaConfig& c, const std::string& torch_dtype = "bfloat16");

// The torch_dtype (or transformers 5's dtype) of the config.json at `path`, as written; empty when
// the file has neither. Throws std::runtime_error when the file cannot be read or is not JSON, or
// the value is not a string.
std::string read_hf_torch_dtype(const std::string& path);

// The token ids of generation_config.json (above): bos −1 and no eos when not given.
struct GenerationConfig {
    int bos_token_id = -1;
    std::vector<int> eos_token_ids;
};

// The file's text; keys with no id are left out.
std::string generation_config_json(const GenerationConfig& g);
// Writes generation_config_json(g) atomically (io/durable_file.h).
void write_generation_config(const std::string& path, const GenerationConfig& g);
// Reads bos_token_id and eos_token_id (an id, a list of ids, or null); other keys are ignored, so
// a config.json's ids (which transformers falls back to) read the same way. Throws
// std::runtime_error naming the file and the key when a value is of another type, or, given the
// model's vocab_size (> 0), when an id (pad_token_id too, in a generation_config.json) is not below
// it: a model directory's ids are checked when it is first read, not by a later command.
GenerationConfig read_generation_config(const std::string& path, int vocab_size = 0);

// A model directory's config.json (read_hf_config), with its generation_config.json, when there is
// one, checked against it (read_generation_config): what `--init-from DIR` reads first.
LlamaConfig read_model_dir_config(const std::string& dir);

}  // namespace pv
