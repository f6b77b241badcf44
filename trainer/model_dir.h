// The model directory `train sample` and `train eval` read: a polevault checkpoint — a step_N
// directory (it holds trainer_state.json), or an output directory whose latest checkpoint is
// taken — or a Hugging Face model directory (config.json and safetensors weights, no
// trainer_state.json). Besides the weights (trainer/checkpoint.h: load_weights reads both), the
// commands need from it:
//   - the model's shape: config.json;
//   - the storage type to load into when --dtype is not given: a checkpoint's own dtype; for a
//     Hugging Face directory config.json's torch_dtype (or transformers 5's "dtype"), bfloat16 ->
//     bf16, float32 and float16 -> fp32 (bf16 cannot hold fp16's range), float64 -> fp64, absent ->
//     fp32 (transformers' own default);
//   - a checkpoint's training window (eval's default --seq-len);
//   - tokenizer.json, when present;
//   - the special tokens the model declares: generation_config.json's eos_token_id (an int or a
//     list) and bos_token_id; without that file, config.json's (transformers derives its
//     generation config from the model config the same way). The tokenizer's own EOS is added by
//     the caller.
// Host code only.
#pragma once

#include "model/config.h"
#include "model/lora.h"

#include <string>
#include <vector>

namespace pv {

struct ModelDir {
    std::string path;         // the directory holding the files (the step_N of an output directory)
    bool checkpoint = false;  // a polevault checkpoint (else a Hugging Face directory)
    long long step = 0;       // a checkpoint's step
    LlamaConfig config;
    std::string dtype;         // bf16, fp32 or fp64: the default storage type
    int seq_len = 0;           // a checkpoint's training window; 0 for a Hugging Face directory
    // A checkpoint's validation settings, which `train eval` takes by default so that its loss of
    // the run's validation data is the run's: the document mask, and the windows the run
    // evaluated (--eval-batches × --micro-batch, the first ones in order) and per forward pass.
    bool document_mask = false;
    long long validation_windows = 0;  // 0: a Hugging Face directory, or a run without validation
    int validation_micro_batch = 0;
    std::string tokenizer;     // tokenizer.json's path, empty when there is none
    std::vector<int> eos_ids;  // declared end-of-sequence ids (may be empty)
    int bos_id = -1;           // the declared beginning-of-sequence id, or -1
    // A LoRA checkpoint holds adapters on a base it references (trainer_state.json): the base's
    // directory (checked against the fingerprint the run saved), or none when the base was
    // initialised from `seed`.
    LoraConfig lora;
    bool nf4 = false, double_quant = true;  // QLoRA: the base quantised as it was in training
    std::string base_dir;
    uint64_t seed = 0;
};

// Throws std::runtime_error naming the path and what was looked for when it is neither kind, when a
// LoRA checkpoint's base is missing or its files are no longer the ones trained on, or
// naming the file and key when config.json, generation_config.json or trainer_state.json is
// malformed (a torch_dtype it cannot map names the --dtype flag that overrides it).
ModelDir open_model_dir(const std::string& path);

}  // namespace pv
