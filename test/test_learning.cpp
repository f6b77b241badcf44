// Whether training learns: a small model on the built-in corpus must go clearly below what any
// context-free predictor reaches. A whole `train` program in a child process, under one schedule
// (it tests optimisation; its kernels meet every schedule in their own suites).
#include <catch2/catch.hpp>

#include "data/tokenizer.h"
#include "test/temp_dir.h"
#include "test/train_runner.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace train_test;

namespace train_test {

// −Σ p log p of the empirical token distribution: the lowest average loss any predictor that
// ignores context can reach on these tokens (the best such predictor is their own frequencies).
double unigram_entropy(const std::vector<int>& ids) {
    std::map<int, double> counts;
    for (int id : ids) counts[id] += 1.0;
    double h = 0;
    for (const auto& [id, c] : counts) h -= c / double(ids.size()) * std::log(c / double(ids.size()));
    return h;
}

}  // namespace train_test

// The model must use context: its loss on held-out text must go clearly below what any
// context-free predictor could reach. The bound is the unigram entropy, computed here from the
// corpus file the build embedded and the tokenizer the run saved — both of the whole corpus and
// of the held-out tail itself (the tail's own frequencies are the best context-free predictor of
// the tail, so no model without context gets below its entropy). Threshold: 0.3 nats below both.
// The validation loss averages 4 × 16 × 32 = 2048 tokens whose losses spread by about 2.5 nats:
// a standard error of about 2.5 / √2048 ≈ 0.06 for independent tokens, so 0.3 is five of them,
// while a model that learned only frequencies sits at or above the bound. When the model leaves
// the unigram plateau depends on the corpus (it changes with every header added to the project)
// and the seed, so the run is long enough to be past it with room: measured 0.78-0.84 nats below
// with seeds 1 and 2 (small untied model, 150 steps at constant lr 5e-3, about 25 s on 2 cores).
// Not run under ASan ([learning]): it tests optimisation, not memory, and the other train tests
// run the same code there.
TEST_CASE("train: a small model on the built-in corpus goes clearly below the unigram entropy", "[train][learning]") {
    TempDir dir("train_learning");
    // Untied (a separate lm_head learns next-token statistics faster than a tied one), small.
    std::ofstream(dir.file("config.json"))
        << R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 192,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})";
    const Run r = run_train("--config " + dir.file("config.json") +
                            " --vocab 300 --steps 150 --batch 16 "
                            "--micro-batch 16 --seq-len 32 --warmup 5 --lr 5e-3 --schedule constant "
                            "--eval-interval 150 --eval-batches 4 --sample-tokens 0 --out-dir " +
                            dir.file("run"));
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto val = validation_losses(r.output);
    REQUIRE(val.size() == 1);
    const std::string corpus = read_file(build_dir() / "corpus.txt");
    REQUIRE(corpus.size() > 100000);
    const pv::Tokenizer tokenizer =
        pv::Tokenizer::load((fs::path(dir.file("run")) / "step_150" / "tokenizer.json").string());
    const std::vector<int> ids = tokenizer.encode(corpus, false);
    REQUIRE(tokenizer.decode(ids) == corpus);
    // The held-out tail: the last 10% of the corpus's tokens (train.cu's documented split).
    const std::vector<int> tail(ids.end() - long(ids.size() / 10), ids.end());
    const double corpus_entropy = unigram_entropy(ids), tail_entropy = unigram_entropy(tail);
    INFO("validation loss " << val[0] << ", unigram entropy: corpus " << corpus_entropy << ", held-out tail "
                            << tail_entropy);
    REQUIRE(corpus_entropy > 3.5);  // a sanity bound: 300 tokens, far from a degenerate corpus
    REQUIRE(val[0] < corpus_entropy - 0.3);
    REQUIRE(val[0] < tail_entropy - 0.3);
}
