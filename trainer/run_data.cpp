// The run's data and model shape (trainer/run_data.h).
#include "trainer/run_data.h"

#include "data/prepare.h"
#include "model/config_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

// The built-in corpus, embedded by the Makefile (build/<flavour>/corpus.o).
extern "C" const char pv_corpus_begin[];
extern "C" const char pv_corpus_end[];

namespace pv {

namespace {

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

// The built-in corpus: a tokenizer trained on it (or the checkpoint's, on resume), the last 10%
// held out for validation.
RunData builtin_data(const TrainOptions& o, const std::string& resume_dir) {
    RunData d;
    d.source = "built-in corpus";
    const std::string corpus(pv_corpus_begin, pv_corpus_end);
    std::printf("built-in corpus: %zu bytes of the project's own documentation and sources\n", corpus.size());
    d.tokenizer = std::make_unique<Tokenizer>(resume_dir.empty() ? Tokenizer::train(corpus, o.vocab)
                                                                 : Tokenizer::load(resume_dir + "/tokenizer.json"));
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
    TokenShard t{uint32_t(d.tokenizer->vocab_size()), uint32_t(std::max(0, d.tokenizer->eot_id())), {}};
    TokenShard v = t;
    t.tokens.assign(ids.begin(), ids.begin() + long(split));
    v.tokens.assign(ids.begin() + long(split), ids.end());
    d.train.push_back(std::move(t));
    d.val = std::move(v);
    return d;
}

}  // namespace

RunData load_run_data(const TrainOptions& o, const std::string& resume_dir) {
    if (o.data.empty()) return builtin_data(o, resume_dir);
    RunData d;
    d.source = o.data;
    DataSet set = load_dataset(o.data);
    d.train = std::move(set.train);
    d.val = std::move(set.val);
    if (!o.val_data.empty()) d.val = read_shard(o.val_data);
    if (!set.tokenizer_path.empty()) d.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(set.tokenizer_path));
    return d;
}

LlamaConfig model_config(const TrainOptions& o, int data_vocab, const std::string& resume_dir) {
    LlamaConfig c = !resume_dir.empty() ? read_hf_config(resume_dir + "/config.json")
                    : !o.config.empty() ? read_hf_config(o.config)
                    : !o.preset.empty() ? preset(o.preset)
                                        : default_model(data_vocab, o.seq_len);
    if (c.vocab_size < data_vocab)
        throw std::invalid_argument("the model's vocabulary (" + std::to_string(c.vocab_size) +
                                    ") is smaller than the data's (" + std::to_string(data_vocab) +
                                    "): choose a model with a larger vocabulary or data tokenized for this model");
    return c;
}

}  // namespace pv
