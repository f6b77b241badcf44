// Checkpoints on the host: parameter groups <-> safetensors files with Hugging Face tensor names,
// and the crash-safe directory transaction that holds them (DESIGN.md §3 "Checkpoints").
//
// A checkpoint is one directory per saved step:
//
//   out_dir/step_N/
//     model.safetensors    the weights in the run's storage type, HF names; the same file is a
//                          Hugging Face model export (with config.json and tokenizer.json beside it)
//     master.safetensors   the fp32 master weights (bf16 runs only: fp32/fp64 runs have none)
//     adam_m.safetensors   AdamW's first moment, in max(T, fp32)
//     adam_v.safetensors   AdamW's second moment, in max(T, fp32)
//     config.json          the model's Hugging Face config
//     tokenizer.json       the tokenizer, when the run knows one
//     trainer_state.json   step, loader position, RNG seed, the run's options; written last and
//                          the marker that makes the directory count as a checkpoint
//
// Every .safetensors file holds every tensor whole and unpadded, under its Hugging Face name and
// HF shape ([rows, cols], a vector [rows]), in unit, tensor, part order. In memory a unit's
// parameters are one flat group with tensors at 64-element-aligned offsets, padded so it splits
// into as many shards as the run has ranks (model/parameters.h), and fused tensors hold several
// HF tensors as row ranges ([Wq; Wk; Wv], [Wgate; Wup]). Neither the padding nor the fusion is a
// property of the model, only of one run's world size and kernels, so the file has neither: a
// fused tensor is split by its parts' row ranges (layers.N.w_qkv -> model.layers.N.self_attn.
// q_proj.weight, k_proj, v_proj), and a run saved at N ranks resumes at M ranks under any
// strategy, or is loaded by Hugging Face. The reader takes any safetensors file with these names,
// a downloaded HF model included (one file or sharded: formats/hf_checkpoint.h), and converts
// dtypes on the way in (file BF16, F16, F32, F64 -> bf16, fp32, fp64: formats/dtype_conversion.h).
//
// Reading is checked, then ranged. check_group_tensors compares a checkpoint's headers with the
// layouts of the whole model — every HF tensor a part needs is there, with the shape config.json
// implies and a float dtype; every tensor in the files belongs to a part or is one Hugging Face
// itself ignores by name — so a rank that will read a slice still refuses a file that does not
// fit the model, and never loads half a model. read_group_ranges then reads, per group, only the
// elements [begin, begin + len) of the padded group a rank keeps (the whole group, a ZeRO-3
// slice, nothing for another pipeline stage's unit): for each tensor part it intersects the
// part's element range [offset + row_begin·cols, + rows·cols) with the wanted range and reads
// that run of the row-major HF tensor, streaming it to the caller in bounded pieces.
//
// The directory transaction: a checkpoint is written into `step_N.tmp/` (begin_checkpoint_dir),
// then committed (commit_checkpoint_dir): every file and the directory are fsynced, the
// directory is renamed to `step_N/` and the parent fsynced. rename(2) is atomic, so a crash at any
// moment leaves either no step_N (a .tmp that latest_checkpoint ignores and the next begin
// removes) or a complete one: a half-written checkpoint never loads. For Hugging Face's
// from_pretrained, pass metadata {"format": "pt"}, which transformers checks for.
// Host code only (g++); no CUDA headers.
#pragma once

#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "model/parameters.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pv {

// One value per parameter element of every unit, in one dtype: the model's weights, the fp32
// master copy, Adam's m or v.
struct HostGroups {
    DType dtype = DType::fp32;
    std::vector<std::vector<uint8_t>> units;  // units[u]: layouts[u].padded elements of `dtype`, the group's bytes
};

// Writes one safetensors file (atomically) with every tensor of every unit under its HF names,
// unpadded, shape [rows, cols] ([rows] for a vector, cols == 1), dtype as stored ("BF16", "F32",
// "F64"), in unit then tensor then part order; metadata passed through. Throws
// std::invalid_argument if the unit count or a unit's byte size does not match the layouts,
// std::runtime_error on I/O failure.
void write_group_tensors(const std::string& path, const std::vector<GroupLayout>& layouts, const HostGroups& groups,
                         const std::map<std::string, std::string>& metadata = {});

// The Hugging Face tensors of the layouts, in file order (unit, tensor, part): name and HF shape.
std::vector<SafeTensorInfo> group_tensor_infos(const std::vector<GroupLayout>& layouts, DType dtype);

// What to do with a tensor of the files that no layout needs.
enum class ExtraTensors {
    refuse,        // our own checkpoint files: every tensor is the model's
    ignore,        // skip whatever is extra
    hugging_face,  // skip what transformers itself skips by name — '*.rotary_emb.inv_freq' (a
                   // buffer older versions saved) and 'lm_head.weight' when the layouts have none
                   // (tied embeddings: the head uses the embedding) — and refuse the rest
};

// Checks the checkpoint against the layouts as described above. Returns the names of the tensors
// skipped (ExtraTensors::ignore / hugging_face). An NF4 group's parts may also be bitsandbytes
// 4-bit linears (formats/bnb_checkpoint.h: their companion tensors then belong to them, and every
// field is checked against the slot); such a linear read into any other group is refused, naming
// the flags that read it (--quantize nf4). Throws std::runtime_error naming the checkpoint,
// the tensor and the fix: a missing tensor, a shape that contradicts the layouts (config.json), a
// dtype parameters cannot be read from, a tensor that belongs to nothing.
std::vector<std::string> check_group_tensors(const HfCheckpoint& source, const std::vector<GroupLayout>& layouts,
                                             ExtraTensors extra = ExtraTensors::refuse);

// Elements [begin, begin + len) of a padded group.
struct ElementRange {
    long long begin = 0, len = 0;
};

// Receives `count` converted elements for group `group`, which belong at element `at` of the
// group's range (at 0 = the range's first element).
using GroupSink = std::function<void(size_t group, long long at, const uint8_t* data, long long count)>;

// Reads the tensor elements inside ranges[k] of every group k from `source` (checked with
// check_group_tensors), converted to `dtype`, streamed to `sink` in pieces of at most
// kGroupReadPieceBytes. Alignment gaps and padding inside a range are never delivered: the caller
// zeroes them. Returns how many finite values overflowed `dtype`.
uint64_t read_group_ranges(HfCheckpoint& source, const std::vector<GroupLayout>& layouts,
                           const std::vector<ElementRange>& ranges, DType dtype, const GroupSink& sink);
inline constexpr size_t kGroupReadPieceBytes = size_t{32} << 20;

// Reads a whole file (ours, or any with these HF names) into padded groups of `dtype`, padding
// zero: check_group_tensors (extra tensors refused unless allow_extra, e.g. a tied HF model that
// also stores lm_head.weight) then read_group_ranges over every whole group. For tests and tools;
// the loaders stream (trainer/load.h).
HostGroups read_group_tensors(const std::string& path, const std::vector<GroupLayout>& layouts, DType dtype,
                              bool allow_extra = false);

// Removes a stale `dir.tmp` if any, creates `dir.tmp` (and missing parents) and returns its path;
// the checkpoint's files are then written inside it.
std::string begin_checkpoint_dir(const std::string& dir);

// begin_checkpoint_dir for a directory the user names (`train convert --out`, `train export
// --out`): refuses, naming the fix, when `dir` exists and is not an empty directory, so nothing
// of the user's is replaced.
std::string begin_new_model_dir(const std::string& dir);

// fsyncs every regular file in `dir.tmp` and the directory itself, removes an existing `dir` (a
// re-run of the same step), renames `dir.tmp` to `dir` and fsyncs the parent directory
// (io/durable_file.h: every fsync failure is an error). Throws std::runtime_error naming the path
// and the OS error on any failure.
void commit_checkpoint_dir(const std::string& dir);

// Writes the checkpoint `dir` as one transaction: begin_checkpoint_dir, then `write` fills the
// temporary directory it is given, then commit_checkpoint_dir. On any failure (a full disk, a
// file-size limit, ...) the temporary directory is removed — the checkpoints already there are
// never touched — and std::runtime_error says what failed, that the checkpoint needs about
// `bytes` bytes in the directory it goes to, and the space free there (statvfs).
void write_checkpoint_dir(const std::string& dir, uint64_t bytes,
                          const std::function<void(const std::string& tmp)>& write);

// A complete checkpoint directory of an output directory and its step.
struct CheckpointDir {
    long long step = 0;
    std::string path;
};

// Every complete checkpoint among the directories out_dir/step_N (N decimal digits; step_N.tmp
// and anything else ignored; a step_N counts only if it contains the regular file `marker_file`,
// e.g. "trainer_state.json"), by step, equal steps (step_5, step_05) in name order; empty if
// out_dir does not exist. Throws std::runtime_error if out_dir exists but cannot be listed.
std::vector<CheckpointDir> list_checkpoints(const std::string& out_dir, const std::string& marker_file);

// The complete checkpoint with the largest N (list_checkpoints; on equal steps the first name);
// nullopt if there is none or out_dir does not exist.
std::optional<std::string> latest_checkpoint(const std::string& out_dir, const std::string& marker_file);

// The step_N.tmp directories in out_dir (paths): checkpoints whose writing never finished.
std::vector<std::string> checkpoint_temporaries(const std::string& out_dir);

}  // namespace pv
