// The run's data and model shape (trainer/run_data.h).
#include "trainer/run_data.h"

#include "data/prepare.h"
#include "io/input_file.h"
#include "model/config_json.h"
#include "model/checkpoint_files.h"
#include "trainer/state.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

// The built-in corpus, embedded by the Makefile (build/<flavour>/corpus.o).
extern "C" const char pv_corpus_begin[];
extern "C" const char pv_corpus_end[];

namespace pv {

namespace {

// The built-in corpus: a tokenizer trained on it (or the checkpoint's, on resume), the last 10%
// held out for validation.
RunData builtin_data(const TrainOptions& o, const std::string& resume_dir, const std::string& init_dir) {
    RunData d;
    d.source = "built-in corpus";
    const std::string corpus(pv_corpus_begin, pv_corpus_end);
    std::printf("built-in corpus: %zu bytes of the project's own documentation and sources\n", corpus.size());
    d.tokenizer_dir = !resume_dir.empty() ? resume_dir : init_dir;
    if (!init_dir.empty() && resume_dir.empty() && !std::filesystem::exists(init_dir + "/tokenizer.json"))
        throw std::runtime_error("--init-from " + init_dir +
                                 ": the model has no tokenizer.json, so the built-in corpus cannot be tokenized for "
                                 "it; pass --data with data prepared for this model (`train prepare --tokenizer`)");
    d.tokenizer =
        std::make_unique<Tokenizer>(d.tokenizer_dir.empty() ? Tokenizer::train(corpus, o.vocab)
                                                            : Tokenizer::load(d.tokenizer_dir + "/tokenizer.json"));
    const std::vector<int> ids = d.tokenizer->encode(corpus, false);
    std::printf("tokenizer: byte-level BPE, %d tokens; corpus = %zu tokens\n", d.tokenizer->vocab_size(), ids.size());
    // The loss of a model that knows only token frequencies: what training must beat to show it
    // uses context.
    std::vector<double> frequency(size_t(d.tokenizer->vocab_size()), 0.0);
    for (int id : ids) frequency[size_t(id)] += 1.0;
    double entropy = 0;
    for (double f : frequency)
        if (f > 0) entropy -= f / double(ids.size()) * std::log(f / double(ids.size()));
    std::printf("unigram entropy of the corpus: %.4f nats/token\n", entropy);
    const size_t split = ids.size() - ids.size() / 10;
    TokenShard t{uint32_t(d.tokenizer->vocab_size()), uint32_t(std::max(0, d.tokenizer->eos_id())), {}, {}};
    TokenShard v = t;
    t.tokens.assign(ids.begin(), ids.begin() + long(split));
    v.tokens.assign(ids.begin() + long(split), ids.end());
    d.train.push_back(std::move(t));
    d.val = std::move(v);
    return d;
}

// The id -> token mapping of a tokenizer.json: the model's vocabulary and the added tokens' ids
// and texts. Two files with the same mapping give the same ids the same meaning, however they
// are laid out (a rewritten file, a different pre-tokenizer or merge list).
nlohmann::json token_meaning(const std::string& path) {
    const std::string text = read_input_file(path, "tokenizer", kMaxJsonFileBytes);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(path + " is not valid JSON (" + e.what() + ")");
    }
    nlohmann::json meaning = nlohmann::json::object();
    if (j.is_object() && j.contains("model") && j["model"].is_object() && j["model"].contains("vocab"))
        meaning["vocab"] = j["model"]["vocab"];
    nlohmann::json added = nlohmann::json::array();
    if (j.is_object() && j.contains("added_tokens") && j["added_tokens"].is_array())
        for (const auto& t : j["added_tokens"])
            if (t.is_object()) added.push_back({t.value("id", -1), t.value("content", std::string())});
    std::sort(added.begin(), added.end());
    meaning["added"] = added;
    return meaning;
}

// --data prepared with another tokenizer than the model's is an error naming both files.
void check_same_tokenizer(const std::string& data_tokenizer, const std::string& model_dir) {
    const std::string model_tokenizer = model_dir + "/tokenizer.json";
    if (!std::filesystem::exists(model_tokenizer)) {
        std::printf("note: %s has no tokenizer.json; the data's token ids (tokenizer %s) are taken as the model's\n",
                    model_dir.c_str(), data_tokenizer.c_str());
        return;
    }
    if (token_meaning(data_tokenizer) != token_meaning(model_tokenizer))
        throw std::runtime_error("--data was prepared with " + data_tokenizer + ", whose token ids differ from " +
                                 model_tokenizer +
                                 "'s (the model's): the model would read other tokens than the data holds; prepare "
                                 "the data with `train prepare --tokenizer " +
                                 model_tokenizer + " ...`");
}

// A --val-data shard must come from the training data's tokenizer: the same vocabulary size and
// end-of-sequence id (ids of another tokenizer mean other tokens, or none: a loss of nan).
void check_val_matches(const TokenShard& val, const std::string& val_name, const TokenShard& train,
                       const std::string& train_name) {
    if (val.vocab_size == train.vocab_size && val.eot_token == train.eot_token) return;
    throw std::runtime_error("--val-data " + val_name + " has vocab_size " + std::to_string(val.vocab_size) +
                             " and eot_token " + std::to_string(val.eot_token) + ", but the training data (" +
                             train_name + ") has vocab_size " + std::to_string(train.vocab_size) + " and eot_token " +
                             std::to_string(train.eot_token) +
                             ": it was tokenized with another tokenizer; prepare the validation text with the "
                             "training data's tokenizer (`train prepare --tokenizer DATA/tokenizer.json`)");
}

// The data directory's tokenizer.json must be the one its shards were written with (`train
// prepare` writes the tokenizer's vocabulary size and EOS id into every shard header).
void check_tokenizer_matches(const Tokenizer& tokenizer, const std::string& tokenizer_path, const TokenShard& shard,
                             const std::string& shard_name) {
    const uint32_t eos = uint32_t(std::max(0, tokenizer.eos_id()));
    if (uint32_t(tokenizer.vocab_size()) == shard.vocab_size && eos == shard.eot_token) return;
    throw std::runtime_error(tokenizer_path + " has " + std::to_string(tokenizer.vocab_size()) +
                             " tokens and end-of-sequence id " + std::to_string(eos) + ", but " + shard_name +
                             " was written with vocab_size " + std::to_string(shard.vocab_size) + " and eot_token " +
                             std::to_string(shard.eot_token) +
                             ": the tokenizer is not the one the shards were prepared with (its ids would decode to "
                             "other text); put the matching tokenizer.json back, or re-run `train prepare` into an "
                             "empty directory");
}

}  // namespace

// The default model: small enough that a 2-core CPU trains it in a few minutes.
LlamaConfig default_model(int vocab, int seq_len) {
    LlamaConfig c;
    c.name = "default";
    c.vocab_size = vocab;
    c.hidden_size = 128;
    c.num_layers = 4;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.ffn_size = 352;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.max_seq_len = seq_len;
    c.tie_embeddings = true;
    return c;
}

RunData load_run_data(const TrainOptions& o, const std::string& resume_dir, const std::string& init_dir) {
    if (o.data.empty()) return builtin_data(o, resume_dir, init_dir);
    RunData d;
    d.source = o.data;
    DataSet set = load_dataset(o.data);
    d.train = std::move(set.train);
    d.val = std::move(set.val);
    if (!o.val_data.empty()) {
        d.val = read_shard(o.val_data);
        check_val_matches(*d.val, o.val_data, d.train.front(), set.train_paths.front());
    }
    if (!set.tokenizer_path.empty()) {
        const Tokenizer data_tokenizer = Tokenizer::load(set.tokenizer_path);
        check_tokenizer_matches(data_tokenizer, set.tokenizer_path, d.train.front(), set.train_paths.front());
    }
    if (!init_dir.empty() && !set.tokenizer_path.empty()) check_same_tokenizer(set.tokenizer_path, init_dir);
    // The model's own tokenizer files when the data's mean the same, so its tokenizer_config.json
    // travels with the checkpoints too.
    const std::string tokenizer_path = !init_dir.empty() && std::filesystem::exists(init_dir + "/tokenizer.json")
                                           ? init_dir + "/tokenizer.json"
                                           : set.tokenizer_path;
    if (!tokenizer_path.empty()) {
        d.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_path));
        d.tokenizer_dir = std::filesystem::path(tokenizer_path).parent_path().string();
    } else {
        std::printf(
            "note: --data %s has no tokenizer.json, so this run knows token ids but no text: it prints no sample at "
            "the end, and its checkpoints sample with `train sample CKPT --prompt-ids ... --print-ids` only (put "
            "the tokenizer.json the data was prepared with into the data directory to have text)\n",
            o.data.c_str());
    }
    return d;
}

LlamaConfig model_config(const TrainOptions& o, const RunData& data, const std::string& resume_dir,
                         const std::string& init_dir) {
    const int data_vocab = int(data.train.front().vocab_size);  // ≤ 2^31 − 1 (read_shard checks)
    if (!resume_dir.empty())
        check_checkpoint_config(resume_dir, read_trainer_state(resume_dir + "/" + kTrainerStateFile).model_config);
    LlamaConfig c = !resume_dir.empty() ? read_hf_config(resume_dir + "/config.json")
                    : !init_dir.empty() ? read_hf_config(init_dir + "/config.json")
                    : !o.config.empty() ? read_hf_config(o.config)
                    : !o.preset.empty() ? preset(o.preset)
                                        : default_model(data_vocab, o.seq_len);
    // Every token id is below its shard's vocab_size (read_shard), every shard's vocab_size is the
    // first training shard's (load_dataset, check_val_matches), and that is at most the model's
    // (below): so every id of the training and validation data has an embedding row.
    // A tokenizer with fewer tokens than the embedding has rows is fine (padding rows, as many
    // published models have); one with more would produce ids the model has no row for.
    if (data.tokenizer && data.tokenizer->vocab_size() > c.vocab_size)
        throw std::invalid_argument("the tokenizer (" +
                                    (data.tokenizer_dir.empty() ? std::string("trained here") : data.tokenizer_dir) +
                                    ") has " + std::to_string(data.tokenizer->vocab_size()) +
                                    " tokens, more than the model's vocab_size " + std::to_string(c.vocab_size) + " (" +
                                    c.name + "): its larger ids have no embedding row; use the model's own tokenizer");
    if (c.vocab_size < data_vocab)
        throw std::invalid_argument("the model's vocabulary (" + std::to_string(c.vocab_size) +
                                    ") is smaller than the data's (" + std::to_string(data_vocab) +
                                    "): choose a model with a larger vocabulary or data tokenized for this model");
    return c;
}

}  // namespace pv
