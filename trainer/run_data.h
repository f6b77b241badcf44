// What a training run trains: its data (token shards, validation shard, tokenizer — from a
// `train prepare` directory or the built-in corpus) and its model's shape (from a checkpoint on
// --resume, a Hugging Face directory with --init-from, --config, --preset or the default).
//
// --init-from DIR: the model is DIR's (config.json) and so is the tokenizer (DIR/tokenizer.json):
// the built-in corpus is tokenized with it, and a --data directory must have been prepared with a
// tokenizer whose ids mean the same tokens (its tokenizer.json and DIR's are compared by
// Tokenizer::id_fingerprint: the same vocabulary and added tokens; merges and pre-tokenizer
// settings do not change what an id means),
// else the error names both files. A DIR without tokenizer.json (a converted llama2.c model) takes
// the data's ids as they are.
//
// Data and model are checked against each other before the model is built: the data directory's
// tokenizer.json against its shards (vocabulary size, end-of-sequence id and, for version-4 shards,
// the tokenizer's id fingerprint: a tokenizer swapped in from another preparation is refused, not
// found out at the final sample), --val-data against the training shards (the same vocabulary
// size, end-of-sequence id and recorded fingerprint: data from another tokenizer is refused, not
// evaluated as "validation loss nan"), --init-from's tokenizer against the shards' recorded
// fingerprint when the data directory has no tokenizer.json, and the shards' vocabulary against the model's
// (with read_shard's check of every id against its header, every id has an embedding row). A data directory without tokenizer.json is said up front: the run trains on ids,
// prints no sample, and its checkpoints sample with --prompt-ids/--print-ids only. On resume the
// checkpoint's config.json is compared with the model the saved run built (an edited rope_theta
// is refused, naming the field). Host C++ only.
#pragma once

#include "data/shard.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "trainer/options.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pv {

// What a run trains on: token shards, an optional validation shard, the tokenizer when known.
struct RunData {
    std::vector<TokenShard> train;
    std::optional<TokenShard> val;
    std::unique_ptr<Tokenizer> tokenizer;
    std::string tokenizer_dir;  // the directory its tokenizer.json came from (empty: trained here)
    std::string source;
};

// The run's data: --data (and --val-data), or the built-in corpus with a tokenizer trained on it
// (the checkpoint's tokenizer when resuming from `resume_dir`, the model's with `init_dir`), its
// last 10% held out.
RunData load_run_data(const TrainOptions& o, const std::string& resume_dir, const std::string& init_dir = "");

// The model: the checkpoint's config when resuming, init_dir's config.json, --config, --preset,
// or the default model (4 layers, hidden 128) sized to the data's vocabulary. Throws when the
// data's vocabulary, or the tokenizer's, does not fit the model's.
// The built-in run's model, sized to its tokenizer's vocabulary.
LlamaConfig default_model(int vocab, int seq_len);

LlamaConfig model_config(const TrainOptions& o, const RunData& data, const std::string& resume_dir,
                         const std::string& init_dir = "");

// --seq-len 0 (a fine-tuning run's default, trainer/main.cu): the window that holds the data's
// longest example whole — the longest document that must not be split (a chat, a prompt and
// completion) of the training and validation shards, L tokens, needs a window of L − 1 inputs —
// rounded up to a multiple of 64 and at most the model's max_position_embeddings; 1024 (at most
// that) when every document may be split (plain text). `why` says which.
int seq_len_from_data(const RunData& data, const LlamaConfig& config, std::string* why);

}  // namespace pv
