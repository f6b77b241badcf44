// Checkpoints of a training run: the device-side model and optimizer state to and from a step_N
// directory (model/checkpoint.h describes the layout and the crash-safe directory commit).
//
//   step_N/model.safetensors     the weights in the run's dtype, Hugging Face names (an HF export)
//   step_N/master.safetensors    bf16 runs: the fp32 master weights
//   step_N/adam_m.safetensors    Adam's m and v in max(T, fp32)
//   step_N/adam_v.safetensors
//   step_N/config.json           the model's shape as a Hugging Face config.json
//   step_N/tokenizer.json        when the run knows its tokenizer
//   step_N/trainer_state.json    step, loader position, RNG seed, every training option
//
// The weights are saved even when a master copy exists: with stochastic rounding they are not a
// function of the master, and they are the exported model either way. Resuming loads every file,
// so a resumed run continues bit for bit.
//
// When the optimizer state (ZeRO) or the parameters (ZeRO-3) are sharded, each field of each
// unit is all-gathered (through `comm`, counted like any collective) into a scratch buffer
// before rank 0 writes it; with model parallelism each unit lives whole on its stage's rank,
// which sends it to rank 0 (ncclSend/ncclRecv, unit by unit, so rank 0 never holds more than one
// unit's field beyond what it writes). Only rank 0 writes, so the ranks need not share a
// filesystem for saving. Loading reads the whole files on every rank (so they must be visible to every rank:
// one machine, or a shared filesystem) and keeps each rank's slice. Tensors are whole and
// unpadded in the files, so a checkpoint loads at any world size.
#pragma once

#include "data/tokenizer.h"
#include "model/llama.h"
#include "optim/optimizer.cuh"
#include "parallel/comm.h"
#include "train_state.h"

#include <optional>
#include <string>

namespace pv {

// step_N under out_dir.
std::string checkpoint_path(const std::string& out_dir, long long step);

// A checkpoint directory from a user's path: a step_N directory itself (it holds
// trainer_state.json), or an output directory whose latest complete checkpoint is taken. Throws
// std::runtime_error saying what was looked for when there is none.
std::string resolve_checkpoint(const std::string& path);

// Collective over `comm` (null: one rank) when the optimizer state is sharded; rank 0 writes.
// param_slices (ZeRO-3): per unit, this rank's slice of the parameters (the optimizer's range),
// gathered instead of reading the model's. unit_owner (model parallelism): per unit, the rank
// that holds it whole (the others hold none of it).
template <class T>
void save_checkpoint(const std::string& dir, Llama<T>& model, const AdamWState<T>& optimizer, const TrainerState& state,
                     const Tokenizer* tokenizer, Comm* comm = nullptr, const std::vector<T*>* param_slices = nullptr,
                     const std::vector<int>* unit_owner = nullptr);

// Loads the weights (into param_slices' ranges when given; only the units the model holds) and
// this rank's range of the optimizer state; returns the trainer state.
template <class T>
TrainerState load_checkpoint(const std::string& dir, Llama<T>& model, AdamWState<T>& optimizer,
                             const std::vector<T*>* param_slices = nullptr);

// Loads only the weights (for sampling), converting from the file's dtype if it differs.
template <class T>
void load_weights(const std::string& dir, Llama<T>& model);

}  // namespace pv
