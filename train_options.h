// The `train` program's options: every flag, its default and its meaning, in one struct that
// the command line (CLI11, train_options.cpp) fills. Host C++ only, so the parser is compiled by
// g++ on both backends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

struct TrainOptions {
    // Model and data.
    std::string preset;        // a model preset; empty: the built-in default model sized to the tokenizer
    std::string data;          // a token shard to train on; empty: the built-in corpus
    std::string val_data;      // a validation shard; empty: the built-in corpus's held-out tail
    int vocab = 512;           // tokenizer vocabulary trained on the built-in corpus
    // Batch and length (DESIGN.md §4: batch = micro_batch x accumulation x ranks).
    long long steps = 250;
    int batch = 16;
    int micro_batch = 8;
    int seq_len = 64;
    // Optimizer.
    double lr = 2e-3;
    std::string schedule = "cosine";
    int warmup = 20;
    double final_lr_fraction = 0.1;
    double clip = 1.0;
    double weight_decay = 0.1;
    std::string dtype = "bf16";
    uint64_t seed = 1337;
    // Evaluation, output.
    int eval_interval = 50;
    int eval_batches = 4;
    std::string out_dir = "runs/default";
    // The sample printed at the end.
    std::string prompt = "The kernel";
    int sample_tokens = 120;
    double temperature = 0.8;
    double top_p = 0.95;
};

// Parses argv; prints help or errors and exits (status 0 for --help, 2 for bad flags).
TrainOptions parse_train_options(int argc, char** argv);

}  // namespace pv
