// Checkpoints of a training run: the device-side model and optimizer state to and from a step_N
// directory (model/checkpoint.h describes the layout and the crash-safe directory commit).
//
//   step_N/model.safetensors     the weights in the run's dtype, Hugging Face names (an HF export)
//   step_N/master.safetensors    bf16 runs: the fp32 master weights
//   step_N/adam_m.safetensors    Adam's m and v in max(T, fp32)
//   step_N/adam_v.safetensors
//   step_N/config.json           the model's shape as a Hugging Face config.json, with torch_dtype
//   step_N/tokenizer.json        when the run knows its tokenizer (with tokenizer_config.json,
//                                chat_template.jinja and special_tokens_map.json when its source
//                                directory has them)
//   step_N/generation_config.json  BOS/EOS ids: the source model's file, else the tokenizer's ids
//   step_N/trainer_state.json    step, loader position, RNG seed, every training option, and
//                                every other file's size and XXH3 checksum (trainer/state.h)
//
// So a checkpoint is also a Hugging Face model directory that transformers loads as it is.
// The weights are saved even when a master copy exists: with stochastic rounding they are not a
// function of the master, and they are the exported model either way. Resuming loads every file,
// so a resumed run continues bit for bit.
//
// Every group of every unit goes to model.safetensors (frozen ones too: the file is the model);
// the optimizer files hold the trainable groups. When the optimizer state (ZeRO) or the
// parameters (ZeRO-3) are sharded, each field of each group is all-gathered (counted like any
// collective) into a scratch buffer
// before rank 0 writes it; with model parallelism each unit lives whole on its stage's rank,
// which sends it to rank 0 (ncclSend/ncclRecv, unit by unit, so rank 0 never holds more than one
// unit's field beyond what it writes). Only rank 0 writes, so the ranks need not share a
// filesystem for saving. Loading (trainer/load.h) has every rank read only the ranges it keeps,
// with pread (so the files must be visible to every rank: one machine, or a shared filesystem).
// Tensors are whole and unpadded in the files, so a checkpoint loads at any world size.
#pragma once

#include "data/tokenizer.h"
#include "model/llama.h"
#include "optim/optimizer.cuh"
#include "parallel/strategy.h"
#include "trainer/export.h"
#include "trainer/load.h"
#include "trainer/model_dir.h"
#include "trainer/state.h"

#include <optional>
#include <string>

namespace pv {

// Collective over the strategy's ranks: the strategy brings each group and optimizer field whole
// to rank 0 (parallel/strategy.h), which writes.
template <class T, class G>
void save_checkpoint(const std::string& dir, Strategy<T, G>& strategy, const AdamWState<T>& optimizer,
                     const TrainerState& state, const ModelFiles& files);

// Loads what this rank keeps of the weights (as the strategy says) and of the optimizer state,
// reading only those ranges (trainer/load.h); returns the trainer state and what was read. First
// the checkpoint is checked (model/checkpoint_files.h): a missing master/adam file is refused
// unless allow_inexact (--allow-inexact-resume: then it starts fresh), and this rank verifies its
// share of the files' checksums. Collective over the strategy's ranks.
template <class T, class G>
TrainerState load_checkpoint(const std::string& dir, Strategy<T, G>& strategy, AdamWState<T>& optimizer,
                             LoadStats* stats = nullptr, bool allow_inexact = false);

// Loads the weights of every unit the model holds from `dir`: a polevault checkpoint or any
// Hugging Face model directory (model.safetensors or sharded; BF16, F16, F32 or F64 tensors,
// converted to T). The model's config must be dir's config.json (read_hf_config).
template <class T>
LoadStats load_weights(const std::string& dir, Llama<T>& model);

// The model of a model directory (trainer/model_dir.h) into `model` (built with m.lora and, for a
// LoRA checkpoint whose base was initialised from the seed, m.seed): the weights, or a LoRA
// checkpoint's base from its directory and its adapters from adapter_model.safetensors.
template <class T>
LoadStats load_model_dir(const ModelDir& m, Llama<T>& model);

// Refuses (std::runtime_error naming the directory, the size and the budget) a model directory
// whose weights alone, in `dtype` ("bf16", "fp32", "fp64"), exceed this machine's memory (host
// backend) or the GPU's free memory: `sample`, `eval` and `export --merged` call it before the
// model is allocated, so an impossible config.json is a message, not an abort while allocating.
void check_model_fits(const ModelDir& m, const std::string& dtype);

// The options of a model for inference on `m`: whole, `batch` × `seq_len`, no gradients, its
// adapters and initialisation seed.
ModelOptions inference_model(const ModelDir& m, int batch, int seq_len);

}  // namespace pv
