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
// Every group of every unit goes to model.safetensors (frozen ones too: the file is the model);
// the optimizer files hold the trainable groups. When the optimizer state (ZeRO) or the
// parameters (ZeRO-3) are sharded, each field of each group is all-gathered (counted like any
// collective) into a scratch buffer
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
#include "parallel/strategy.h"
#include "trainer/state.h"

#include <optional>
#include <string>

namespace pv {

// step_N under out_dir.
std::string checkpoint_path(const std::string& out_dir, long long step);

// A checkpoint directory from a user's path: a step_N directory itself (it holds
// trainer_state.json), or an output directory whose latest complete checkpoint is taken. Throws
// std::runtime_error saying what was looked for when there is none.
std::string resolve_checkpoint(const std::string& path);

// Collective over the strategy's ranks: the strategy brings each group and optimizer field whole
// to rank 0 (parallel/strategy.h), which writes.
template <class T, class G>
void save_checkpoint(const std::string& dir, Strategy<T, G>& strategy, const AdamWState<T>& optimizer,
                     const TrainerState& state, const Tokenizer* tokenizer);

// Loads what this rank keeps of the weights (as the strategy says) and of the optimizer state;
// returns the trainer state.
template <class T, class G>
TrainerState load_checkpoint(const std::string& dir, Strategy<T, G>& strategy, AdamWState<T>& optimizer);

// Loads only the weights (for sampling), converting from the file's dtype if it differs.
template <class T>
void load_weights(const std::string& dir, Llama<T>& model);

}  // namespace pv
