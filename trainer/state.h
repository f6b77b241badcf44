// trainer_state.json: what a checkpoint needs besides tensors to continue a run exactly, and the
// metrics file's trimming on resume. Host C++ only.
//
//   {"format": "polevault-checkpoint", "version": 1,
//    "step": 10,                                  optimizer steps done (the next is step + 1)
//    "loader": {"position": 10, "samples": 160},  the loader is stateless (data/loader.h): its
//                                                 position is the step; samples = step · batch
//    "rng": {"seed": 1337, "generator": "..."},   every random number is Philox keyed by
//                                                 (seed, purpose, tensor, element, step), so the
//                                                 seed and the step are the whole RNG state
//    "dtype": "bf16",
//    "data": {"source": "...", "train_tokens": N, "fingerprint": "0123abcd..."},
//    "options": {...every training flag...},
//    "model": {...},                              the model's config.json as the run built it
//    "files": {"model.safetensors": {"bytes": N, "xxh3": "0123456789abcdef"}, ...},
//    "checksum": "0123456789abcdef"}             XXH3-64 of the compact JSON of all the rest
//
// "files" lists every other file of the checkpoint with its size and XXH3-64 checksum
// (io/checksum.h), computed while it was written (io/durable_file.h WriteRecorder), never by a
// second read; resume and load verify them (model/checkpoint_files.h), so a flipped bit, a
// truncation or an edited header is refused naming the file. "model" lets a resume name the field
// of an edited config.json. Checkpoints of older builds have neither: nothing to verify.
//
// The data fingerprint (FNV-1a over the training tokens) lets a resumed run notice that its data
// changed, which would silently break the continuation.
#pragma once

#include "io/checksum.h"
#include "model/checkpoint_files.h"
#include "trainer/options.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pv {

struct TrainerState {
    long long step = 0;
    long long samples = 0;
    uint64_t seed = 0;
    std::string dtype;
    std::string data_source;
    long long train_tokens = 0;
    uint64_t data_fingerprint = 0;
    TrainOptions options;
    // A LoRA run's base model, which its checkpoints reference instead of copying: the directory
    // (options.init_from; empty: initialised from the seed) and a fingerprint of its files.
    uint64_t base_fingerprint = 0;
    // The run's validation (trainer/run.cu): how many windows of the validation data it evaluated
    // (the first ones, in order) in forward passes of how many; 0: no validation data.
    long long validation_windows = 0;
    int validation_micro_batch = 0;
    // The model's config.json text (hf_config_json) as the run built it; empty: an older build.
    std::string model_config;
    // Every other file of the checkpoint by name (no directory part): size and checksum as written.
    FileDigests files;
};

// A fingerprint of a Hugging Face model directory's files: config.json's bytes and, for every
// .safetensors file in name order, its name, size and header (names, dtypes, shapes, offsets) —
// what changes when the weights are replaced, re-converted or re-sharded, read in a few KB even for
// a 70B model (the tensor data itself is not hashed). Throws std::runtime_error naming the path when
// the directory cannot be read.
uint64_t model_files_fingerprint(const std::string& dir);

// step_N under out_dir.
std::string checkpoint_path(const std::string& out_dir, long long step);

// A checkpoint directory from a user's path: a step_N directory itself (it holds
// trainer_state.json), or an output directory whose latest complete checkpoint is taken. Throws
// std::runtime_error saying what was looked for when there is none.
std::string resolve_checkpoint(const std::string& path);

// Writes path atomically (tmp, fsync, rename), with "checksum": trainer_state_checksum of the rest
// (model/checkpoint_files.h);
// reads and validates it (std::runtime_error naming the file and the problem): the checksum when
// present (older builds wrote none), loader.position and loader.samples against the step and the
// batch, and the step against the name of a step_N directory holding the file.
void write_trainer_state(const std::string& path, const TrainerState& s);
TrainerState read_trainer_state(const std::string& path);

// FNV-1a 64 over the tokens' int32 values, chained across calls through `h`.
uint64_t fingerprint_tokens(const std::vector<uint32_t>& tokens, uint64_t h = 0xcbf29ce484222325ull);

// Writes `to` (atomically) with the lines of the metrics.jsonl `from` whose steps are ≤ step (a
// line torn by a crash is dropped): a resumed run then appends after them, so the file never holds
// two histories. `from` == `to` trims the file in place; a branch copies its parent's history. A
// missing `from` writes nothing (found false).
struct MetricsCopy {
    bool found = false;
    long long kept = 0;     // lines of steps ≤ step
    long long dropped = 0;  // lines of later steps
};
MetricsCopy copy_metrics(const std::string& from, const std::string& to, long long step);

}  // namespace pv
