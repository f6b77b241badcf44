// What a training run trains: its data (token shards, validation shard, tokenizer — from a
// `train prepare` directory or the built-in corpus) and its model's shape. Host C++ only.
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
    std::string source;
};

// The run's data: --data (and --val-data), or the built-in corpus with a tokenizer trained on it
// (the checkpoint's tokenizer when resuming from `resume_dir`), its last 10% held out.
RunData load_run_data(const TrainOptions& o, const std::string& resume_dir);

// The model: the checkpoint's config when resuming, --config, --preset, or the default model
// (4 layers, hidden 128) sized to the data's vocabulary. Throws when the data's vocabulary does
// not fit the model's.
LlamaConfig model_config(const TrainOptions& o, int data_vocab, const std::string& resume_dir);

}  // namespace pv
