// The run's data and model shape (trainer/run_data.h).
#include "trainer/run_data.h"

#include "data/prepare.h"
#include "formats/config_json.h"
#include "io/checksum.h"
#include "model/checkpoint_files.h"
#include "trainer/state.h"

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
    TokenShard t{uint32_t(d.tokenizer->vocab_size()), uint32_t(std::max(0, d.tokenizer->eos_id())), {}, {},
                 d.tokenizer->id_fingerprint()};
    TokenShard v = t;
    t.tokens.assign(ids.begin(), ids.begin() + long(split));
    v.tokens.assign(ids.begin() + long(split), ids.end());
    d.train.push_back(std::move(t));
    d.val = std::move(v);
    return d;
}

// --data prepared with another tokenizer than the model's is an error naming both files.
void check_same_tokenizer(const Tokenizer& data, const std::string& data_path, const Tokenizer& model,
                          const std::string& model_path) {
    if (data.id_fingerprint() == model.id_fingerprint()) return;
    throw std::runtime_error("--data was prepared with " + data_path + ", whose token ids differ from " + model_path +
                             "'s (the model's): the model would read other tokens than the data holds; prepare "
                             "the data with `train prepare --tokenizer " +
                             model_path + " ...`");
}

// Shards that record their tokenizer (version 4) without a tokenizer.json beside them must still
// be the model's.
void check_shards_for_model(const TokenShard& shard, const std::string& shard_name, const Tokenizer& model,
                            const std::string& model_path) {
    if (shard.tokenizer == 0 || shard.tokenizer == model.id_fingerprint()) return;
    throw std::runtime_error(shard_name + " was made with tokenizer " + checksum_hex(shard.tokenizer) +
                             ", whose token ids differ from " + model_path + "'s (the model's, " +
                             checksum_hex(model.id_fingerprint()) +
                             "): the model would read other tokens than the data holds; prepare the data with "
                             "`train prepare --tokenizer " +
                             model_path + " ...`");
}

// A --val-data shard must come from the training data's tokenizer: the same vocabulary size and
// end-of-sequence id, and the same fingerprint where both record one (ids of another tokenizer
// mean other tokens, or none: a loss of nan).
void check_val_matches(const TokenShard& val, const std::string& val_name, const TokenShard& train,
                       const std::string& train_name) {
    const auto describe = [](const TokenShard& s) {
        return "vocab_size " + std::to_string(s.vocab_size) + " and eot_token " + std::to_string(s.eot_token) +
               (s.tokenizer != 0 ? " (tokenizer " + checksum_hex(s.tokenizer) + ")" : "");
    };
    const bool fingerprints_differ = val.tokenizer != 0 && train.tokenizer != 0 && val.tokenizer != train.tokenizer;
    if (val.vocab_size == train.vocab_size && val.eot_token == train.eot_token && !fingerprints_differ) return;
    throw std::runtime_error("--val-data " + val_name + " has " + describe(val) + ", but the training data (" +
                             train_name + ") has " + describe(train) +
                             ": it was tokenized with another tokenizer; prepare the validation text with the "
                             "training data's tokenizer (`train prepare --tokenizer DATA/tokenizer.json`)");
}

// The data directory's tokenizer.json must be the one its shards were written with (`train
// prepare` writes the tokenizer's vocabulary size, EOS id and, from version 4, its id fingerprint
// into every shard header).
void check_tokenizer_matches(const Tokenizer& tokenizer, const std::string& tokenizer_path, const TokenShard& shard,
                             const std::string& shard_name) {
    const uint32_t eos = uint32_t(std::max(0, tokenizer.eos_id()));
    std::string mismatch;
    if (uint32_t(tokenizer.vocab_size()) != shard.vocab_size || eos != shard.eot_token)
        mismatch = tokenizer_path + " has " + std::to_string(tokenizer.vocab_size()) + " tokens and end-of-sequence id " +
                   std::to_string(eos) + ", but " + shard_name + " was written with vocab_size " +
                   std::to_string(shard.vocab_size) + " and eot_token " + std::to_string(shard.eot_token);
    else if (shard.tokenizer != 0 && shard.tokenizer != tokenizer.id_fingerprint())
        mismatch = tokenizer_path + " has the shards' vocabulary size and end-of-sequence id, but its ids mean other " +
                   "tokens: its fingerprint is " + checksum_hex(tokenizer.id_fingerprint()) + ", and " + shard_name +
                   " was written with tokenizer " + checksum_hex(shard.tokenizer);
    if (mismatch.empty()) return;
    throw std::runtime_error(mismatch +
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
        d.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(set.tokenizer_path));
        check_tokenizer_matches(*d.tokenizer, set.tokenizer_path, d.train.front(), set.train_paths.front());
        d.tokenizer_dir = std::filesystem::path(set.tokenizer_path).parent_path().string();
    }
    // The model's tokenizer: a resumed checkpoint's or an --init-from directory's. Data prepared with
    // another is refused for both (a resume may change its data, never the meaning of its ids).
    const std::string model_dir = !resume_dir.empty() ? resume_dir : init_dir;
    const std::string model_tokenizer_path = model_dir + "/tokenizer.json";
    if (!model_dir.empty() && std::filesystem::exists(model_tokenizer_path)) {
        // The model's own tokenizer files when the data's mean the same, so its
        // tokenizer_config.json travels with the checkpoints too.
        auto model_tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(model_tokenizer_path));
        if (d.tokenizer)
            check_same_tokenizer(*d.tokenizer, set.tokenizer_path, *model_tokenizer, model_tokenizer_path);
        else
            check_shards_for_model(d.train.front(), set.train_paths.front(), *model_tokenizer, model_tokenizer_path);
        d.tokenizer = std::move(model_tokenizer);
        d.tokenizer_dir = model_dir;
    } else if (!model_dir.empty() && d.tokenizer) {
        std::printf("note: %s has no tokenizer.json; the data's token ids (tokenizer %s) are taken as the model's\n",
                    model_dir.c_str(), set.tokenizer_path.c_str());
    }
    if (!d.tokenizer) {
        std::printf(
            "note: --data %s has no tokenizer.json, so this run knows token ids but no text: it prints no sample at "
            "the end, and its checkpoints sample with `train sample CKPT --prompt-ids ... --print-ids` only (put "
            "the tokenizer.json the data was prepared with into the data directory to have text)\n",
            o.data.c_str());
    }
    return d;
}

int seq_len_from_data(const RunData& data, const LlamaConfig& config, std::string* why) {
    long long longest = 0;  // tokens of the longest document that must be packed whole
    const auto scan = [&](const TokenShard& s) {
        long long length = 0;
        bool whole = false;
        for (size_t i = 0; i < s.flags.size(); ++i) {
            if (s.flags[i] & kTokenStartsDocument) {
                if (whole) longest = std::max(longest, length);
                length = 0, whole = !(s.flags[i] & kTokenSplittable);
            }
            ++length;
        }
        if (whole) longest = std::max(longest, length);
    };
    for (const TokenShard& s : data.train) scan(s);
    if (data.val) scan(*data.val);
    const int limit = config.max_seq_len;
    if (longest == 0) {
        *why = "the data is plain text (any window length fits it); the model takes up to " + std::to_string(limit);
        return std::min(limit, 1024);
    }
    const long long rounded = (longest - 1 + 63) / 64 * 64;
    *why = "its longest example is " + std::to_string(longest) + " tokens" +
           (longest - 1 > limit ? ", more than the model's max_position_embeddings " + std::to_string(limit) +
                                      ": longer examples are left out (counted below)"
                                : "; the model takes up to " + std::to_string(limit));
    return int(std::min<long long>(limit, std::max<long long>(rounded, 1)));
}

LlamaConfig model_config(const TrainOptions& o, const RunData& data, const std::string& resume_dir,
                         const std::string& init_dir) {
    const int data_vocab = int(data.train.front().vocab_size);  // ≤ 2^31 − 1 (read_shard checks)
    if (!resume_dir.empty())
        check_checkpoint_config(resume_dir, read_trainer_state(resume_dir + "/" + kTrainerStateFile).model_config);
    LlamaConfig c = !resume_dir.empty() ? read_hf_config(resume_dir + "/config.json")
                    : !init_dir.empty() ? read_model_dir_config(init_dir)
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
