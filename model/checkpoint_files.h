// What a checkpoint must hold before anything is loaded from it: every file a bit-exact resume
// needs, each with the size and XXH3-64 checksum trainer_state.json recorded when it was written
// (trainer/state.h "files"), and a config.json that still describes the model the run built.
// (In model/, beside the checkpoint format, so every loader and the tests link it.)
//
// Verification reads whole files, so on a multi-rank resume the files are dealt out over the
// ranks (file i, in name order, to rank i mod ranks): a 70B checkpoint is read once across the
// job, not once per rank. A rank that finds a bad file throws; `train` turns that into
// abort_all_ranks, which ends every rank with the message. Checkpoints of older builds record no
// checksums: nothing to verify (said once, by the caller). Host C++ only.
//
// Bit-exact resume needs model.safetensors (or a LoRA run's adapter_model.safetensors), Adam's
// adam_m and adam_v and, for a bf16 run, the fp32 master.safetensors. Without master the run would
// rebuild it from the rounded bf16 weights, without m and v it would restart Adam's moments: the
// run continues, but not the run that was saved. That is refused, naming the file and the flag
// --allow-inexact-resume that accepts it.
#pragma once

#include "io/checksum.h"

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <string>
#include <vector>

namespace pv {

// The file that marks a complete checkpoint and holds its state (trainer/state.h).
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

// trainer_state.json's own "checksum": XXH3-64 of the compact JSON text of the state without that
// key (keys in order, as nlohmann dumps them), so reformatting the file keeps it valid and changing
// any value does not. check_trainer_state_checksum throws std::runtime_error when a state holding a
// checksum does not match it (a state without one is an older build's: nothing to verify). Every
// reader of the file checks it first: the "files" it records are trusted only if it matches.
uint64_t trainer_state_checksum(nlohmann::json state);
void check_trainer_state_checksum(const nlohmann::json& state);

// A checkpoint's files by name (no directory part): size and checksum as written.
using FileDigests = std::map<std::string, FileDigest>;

// trainer_state.json's "files" object and back: {"name": {"bytes": N, "xxh3": "16 hex digits"}}.
// Parsing throws std::runtime_error naming the field ("files.\"model.safetensors\".xxh3") and what
// was expected; a name with a directory part, "." or "..", or trainer_state.json itself is refused.
nlohmann::json file_digests_json(const FileDigests& files);
FileDigests parse_file_digests(const nlohmann::json& files);

// The "files" a directory's trainer_state.json records; empty when there is no trainer_state.json
// (a Hugging Face directory) or it records none (an older build). Errors name the file.
FileDigests recorded_file_digests(const std::string& dir);

inline constexpr const char* kAllowInexactResumeFlag = "--allow-inexact-resume";

// The optimizer's files a bit-exact resume needs (master.safetensors first when the run keeps a
// master copy, then adam_m and adam_v), each missing one refused naming it and the flag, unless
// `allow_inexact`; returns the names of those missing (then allowed: their state starts fresh).
std::vector<std::string> missing_optimizer_files(const std::string& dir, bool has_master, bool allow_inexact);

// Checks this rank's share of `files` (index mod ranks == rank, in name order):
// present, regular, of the recorded size and checksum. Files named in `absent_ok` may be missing.
// Throws std::runtime_error naming the file, what differs and the fix.
void verify_checkpoint_files(const std::string& dir, const FileDigests& files, int rank, int ranks,
                             const std::vector<std::string>& absent_ok = {});

// A file of a directory that may be a polevault checkpoint, verified before anything in it is
// used (its numbers size the model: config.json, generation_config.json): when the directory's
// trainer_state.json records the file, its size and checksum must match. Throws as above.
void verify_recorded_file(const std::string& path);

// The same for every recorded file but the weights (*.safetensors, verified as they are loaded):
// config.json, tokenizer.json, generation_config.json, ..., whose numbers size what is built.
void verify_model_dir_metadata(const std::string& dir);

// For a model directory that may be a polevault checkpoint (train sample, export, --init-from):
// when it holds trainer_state.json listing files, verify_checkpoint_files over this rank's share.
// Returns whether there was anything to verify.
bool verify_model_dir_files(const std::string& dir, int rank = 0, int ranks = 1);

// On resume: refuses a checkpoint whose config.json differs from the model the run that wrote it
// built (`model_config`, trainer_state.json's "model"; empty: an older build, nothing to compare),
// naming each field that differs and both values.
void check_checkpoint_config(const std::string& dir, const std::string& model_config);

}  // namespace pv
