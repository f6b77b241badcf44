// Command-line parsing for `train` with CLI11: each flag documents itself and its default in
// --help.
#include "train_options.h"

#include <CLI/CLI.hpp>

#include <cstdlib>

namespace pv {

TrainOptions parse_train_options(int argc, char** argv) {
    TrainOptions o;
    CLI::App app{
        "polevault train: trains a Llama-family model. With no arguments it trains a small model on a "
        "built-in corpus (the project's own documentation and sources) and ends with a generated sample."};
    app.option_defaults()->always_capture_default();
    app.add_option("--preset", o.preset, "Model preset (empty: a small default model sized to the tokenizer)");
    app.add_option("--data", o.data, "Token shard to train on (empty: the built-in corpus)");
    app.add_option("--val-data", o.val_data, "Validation shard (empty: the built-in corpus's held-out tail)");
    app.add_option("--vocab", o.vocab, "Vocabulary size of the tokenizer trained on the built-in corpus")->check(CLI::Range(257, 1 << 20));
    app.add_option("--steps", o.steps, "Optimizer steps")->check(CLI::PositiveNumber);
    app.add_option("--batch", o.batch, "Global batch: sequences per optimizer step (= micro-batch x accumulation x ranks)")
        ->check(CLI::PositiveNumber);
    app.add_option("--micro-batch", o.micro_batch, "Sequences per forward/backward pass")->check(CLI::PositiveNumber);
    app.add_option("--seq-len", o.seq_len, "Tokens per sequence")->check(CLI::PositiveNumber);
    app.add_option("--lr", o.lr, "Peak learning rate")->check(CLI::NonNegativeNumber);
    app.add_option("--schedule", o.schedule, "Learning-rate schedule after warmup: constant, cosine, linear or wsd");
    app.add_option("--warmup", o.warmup, "Warmup steps (lr * (step + 1) / warmup)")->check(CLI::NonNegativeNumber);
    app.add_option("--final-lr-fraction", o.final_lr_fraction, "Final learning rate as a fraction of the peak")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--clip", o.clip, "Clip the global gradient norm to this (0: no clipping)")->check(CLI::NonNegativeNumber);
    app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (matrices only)")->check(CLI::NonNegativeNumber);
    app.add_option("--dtype", o.dtype, "Storage type of parameters, activations and gradients: bf16, fp32 or fp64")
        ->check(CLI::IsMember({"bf16", "fp32", "fp64"}));
    app.add_option("--seed", o.seed, "Seed of initialisation, data order and sampling");
    app.add_option("--eval-interval", o.eval_interval, "Evaluate on the validation data every this many steps (0: never)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--eval-batches", o.eval_batches, "Micro-batches per evaluation")->check(CLI::PositiveNumber);
    app.add_option("--out-dir", o.out_dir, "Output directory (metrics.jsonl, tokenizer.json)");
    app.add_option("--prompt", o.prompt, "Prompt of the sample generated at the end");
    app.add_option("--sample-tokens", o.sample_tokens, "Tokens to generate at the end (0: none)")->check(CLI::NonNegativeNumber);
    app.add_option("--temperature", o.temperature, "Sampling temperature")->check(CLI::PositiveNumber);
    app.add_option("--top-p", o.top_p, "Nucleus sampling: the smallest set of tokens with this much probability")
        ->check(CLI::Range(0.0, 1.0));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        std::exit(app.exit(e));
    }
    return o;
}

}  // namespace pv
