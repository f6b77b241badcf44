// train: the polevault training program, on one rank or under mpirun with a strategy from
// parallel/ (--parallel single|ddp|zero1|zero2|zero3|mp), applied to a model that knows nothing
// of it; rank 0 reports and writes.
//
//   ./train                      trains a small model on the built-in corpus (the project's own
//                                README and headers, embedded at build time), prints one line per
//                                step, evaluates on a held-out tail, saves a checkpoint and ends
//                                with a generated sample
//   ./train --resume DIR         continues a run from a checkpoint, bit for bit
//   ./train --init-from HF_DIR   fine-tunes a Hugging Face model (its config, weights, tokenizer)
//   ./train sample CHECKPOINT    generates text from a checkpoint
//   ./train prepare FILES --out DIR    tokenizes text or JSON lines into shards
//   ./train convert --from llama2c model.bin --out HF_DIR    a llama2.c checkpoint as a HF model
//   ./train export CHECKPOINT --out HF_DIR                   a checkpoint as a HF model
//   ./train --help               every flag with its default (also `train sample --help`, ...)
//
// This file holds the commands and the option checks; trainer/run.cu one training run in phases,
// trainer/trainer.h one optimizer step, trainer/checkpoint.* checkpoints, trainer/run_data.* the
// data and model shape, trainer/generate.* sampling.
#include "data/loader.h"
#include "data/prepare.h"
#include "model/config_json.h"
#include "model/llama.h"
#include "model/llama2c.h"
#include "parallel/plan.h"
#include "parallel/world.h"
#include "trainer/checkpoint.h"
#include "trainer/export.h"
#include "trainer/generate.h"
#include "trainer/options.h"
#include "trainer/run.h"
#include "trainer/run_data.h"
#include "trainer/state.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace pv {
namespace {

// Checks the options that need no data, resolves the automatic micro-batch, loads the data and
// the model's shape, and trains in the run's storage and gradient types.
int train_command(const TrainOptions& requested, const std::string& resume_dir, World& world) {
    TrainOptions o = requested;
    // A resumed run's model is the checkpoint's, whatever it was initialised from.
    const std::string init_dir = resume_dir.empty() ? o.init_from : "";
    check_strategy(strategy_options(o), world.size());
    const int data_ranks = data_ranks_of(strategy_options(o), world.size());  // mp: every stage sees the whole batch
    const bool mp = strategy_info(o.parallel).stages;
    if (o.micro_batch == 0) {  // auto: the largest divisor of batch / ranks up to 8 (mp: that fills the pipeline)
        if (o.batch % data_ranks != 0)
            throw std::invalid_argument("--batch " + std::to_string(o.batch) + " does not split over " +
                                        std::to_string(data_ranks) + " ranks: make --batch a multiple of " +
                                        std::to_string(data_ranks));
        const int per_rank = o.batch / data_ranks;
        for (int m = std::min(8, per_rank); m >= 1 && o.micro_batch == 0; --m)
            if (per_rank % m == 0 && per_rank / m % o.microbatches == 0) o.micro_batch = m;
        if (o.micro_batch == 0)
            throw std::invalid_argument("--batch " + std::to_string(o.batch) +
                                        " has no micro-batch size that gives a "
                                        "multiple of --microbatches " +
                                        std::to_string(o.microbatches) + " micro-batches: make --batch a multiple of " +
                                        std::to_string(o.microbatches));
    }
    if (mp && o.batch % o.micro_batch == 0 && o.batch / o.micro_batch % o.microbatches != 0)
        throw std::invalid_argument("--batch " + std::to_string(o.batch) + " / --micro-batch " +
                                    std::to_string(o.micro_batch) + " = " + std::to_string(o.batch / o.micro_batch) +
                                    " micro-batches per step do not fill whole pipeline rounds of --microbatches " +
                                    std::to_string(o.microbatches) + ": make that count a multiple of it");
    if (o.fp32_grad_accumulation && o.dtype != "bf16")
        throw std::invalid_argument("--fp32-grad-accumulation is for --dtype bf16 (" + o.dtype +
                                    " gradients already accumulate in their own type); drop the flag");
    if (o.stochastic_rounding && o.dtype != "bf16")
        throw std::invalid_argument("--stochastic-rounding is for --dtype bf16 (" + o.dtype +
                                    " parameters are their own master and are never rounded); drop the flag");
    accumulation_for(o.batch, o.micro_batch, data_ranks);  // a bad geometry fails before any data is read
    RunData data = load_run_data(o, resume_dir, init_dir);
    const LlamaConfig config = model_config(o, data, resume_dir, init_dir);
    const RunSources from{resume_dir, init_dir};
    if (o.dtype == "bf16") {
        if (o.fp32_grad_accumulation)
            return run_training<__nv_bfloat16, float>(o, requested, std::move(data), config, from, world);
        return run_training<__nv_bfloat16, __nv_bfloat16>(o, requested, std::move(data), config, from, world);
    }
    if (o.dtype == "fp32") return run_training<float, float>(o, requested, std::move(data), config, from, world);
    return run_training<double, double>(o, requested, std::move(data), config, from, world);
}

// --init-from takes the model from its directory: nothing else may say what the model is.
void check_init_from(const TrainOptions& o) {
    if (o.init_from.empty()) return;
    if (!o.resume.empty())
        throw std::invalid_argument("--init-from " + o.init_from + " and --resume " + o.resume +
                                    " both say where the weights come from: --resume continues a run (its checkpoint "
                                    "has the model and optimizer state), --init-from starts a new one; pass one");
    if (!o.config.empty() || !o.preset.empty())
        throw std::invalid_argument("--init-from " + o.init_from + " takes the model's shape from " + o.init_from +
                                    "/config.json; drop " +
                                    (o.config.empty() ? "--preset " + o.preset : "--config " + o.config));
}

int convert_command(const ConvertOptions& o) {
    const LlamaConfig c = convert_llama2c(o.input, o.out_dir);
    std::printf(
        "converted %s (llama2.c) -> %s: %lld parameters, %d layers, hidden %d, %d heads (%d KV), vocab %d, %s "
        "embeddings, q/k rows permuted to rotate_half order; config.json, model.safetensors (F32), "
        "generation_config.json (bos 1, eos 2); no tokenizer\n"
        "train from it with: train --init-from %s --data DIR (data prepared with the model's tokenizer)\n",
        o.input.c_str(), o.out_dir.c_str(), parameter_count(c), c.num_layers, c.hidden_size, c.num_heads,
        c.num_kv_heads, c.vocab_size, c.tie_embeddings ? "tied" : "untied", o.out_dir.c_str());
    return 0;
}

template <class T>
int sample_with(const SampleOptions& o, const std::string& dir, const TrainerState& state) {
    const LlamaConfig config = read_hf_config(dir + "/config.json");
    if (!std::filesystem::exists(dir + "/tokenizer.json"))
        throw std::runtime_error("checkpoint '" + dir +
                                 "' has no tokenizer.json: sampling needs the tokenizer the "
                                 "model was trained with (copy it into the checkpoint directory)");
    const Tokenizer tokenizer = Tokenizer::load(dir + "/tokenizer.json");
    Llama<T> model(config, whole_model(1, state.options.seq_len, o.seed, Gradients::none));
    load_weights(dir, model);
    std::printf("%s", o.prompt.c_str());
    std::fflush(stdout);
    generate(model, tokenizer, GenerateOptions{o.prompt, o.max_tokens, o.temperature, o.top_p, o.seed},
             [](const std::string& piece) { std::fputs(piece.c_str(), stdout), std::fflush(stdout); });
    std::printf("\n");
    return 0;
}

int sample_command(const SampleOptions& o) {
    const std::string dir = resolve_checkpoint(o.checkpoint);
    const TrainerState state = read_trainer_state(dir + "/" + kTrainerStateFile);
    std::fprintf(stderr, "sampling from %s (step %lld, %s)\n", dir.c_str(), state.step, state.dtype.c_str());
    if (state.dtype == "bf16") return sample_with<__nv_bfloat16>(o, dir, state);
    if (state.dtype == "fp32") return sample_with<float>(o, dir, state);
    return sample_with<double>(o, dir, state);
}

int prepare_command(const PrepareOptions& o) {
    const PreparedData p = prepare_data(o);
    std::printf(
        "prepared %lld documents: %lld training tokens in %zu shard(s), %lld validation tokens, vocabulary %d\n"
        "  tokenizer  %s\n  validation %s\n",
        p.documents, p.train_tokens, p.train_shards.size(), p.val_tokens, p.vocab_size, p.tokenizer_path.c_str(),
        p.val_shard.c_str());
    for (const std::string& s : p.train_shards) std::printf("  training   %s\n", s.c_str());
    std::printf("train on it with: train --data %s\n", o.out_dir.c_str());
    return 0;
}

int main_checked(int argc, char** argv) {
    Command c = parse_command(argc, argv);
    if (c.kind == Command::Kind::sample) return sample_command(c.sample);
    if (c.kind == Command::Kind::prepare) return prepare_command(c.prepare);
    if (c.kind == Command::Kind::convert) return convert_command(c.convert);
    if (c.kind == Command::Kind::export_model) return export_model(c.export_model), 0;
    World world(&argc, &argv);
    if (world.rank() != 0 && !std::freopen("/dev/null", "w", stdout))  // rank 0 reports; errors from any rank
        throw std::runtime_error("cannot silence the standard output of rank " + std::to_string(world.rank()));
    check_init_from(c.train);  // the command line's own flags, before a checkpoint's fill in the rest
    std::string resume_dir;
    if (!c.train.resume.empty()) {
        // The checkpoint's options, then this command line's flags on top.
        resume_dir = resolve_checkpoint(c.train.resume);
        const TrainOptions saved = read_trainer_state(resume_dir + "/" + kTrainerStateFile).options;
        c = parse_command(argc, argv, saved);
        // Leaving a pipeline for another strategy drops its micro-batches in flight (unless given again).
        if (c.train.parallel != "mp" && c.train.microbatches == saved.microbatches) c.train.microbatches = 1;
        TrainOptions compare = c.train;
        compare.resume = saved.resume;
        compare.stop_after = saved.stop_after;
        for (const std::string& change : train_options_diff(saved, compare)) {
            for (const char* fixed :
                 {"preset:", "config:", "init_from:", "vocab:", "dtype:", "batch:", "seq_len:", "seed:", "freeze:"})
                if (change.rfind(fixed, 0) == 0)
                    throw std::invalid_argument("cannot change " + change +
                                                " when resuming: the checkpoint's model, "
                                                "data order and batches depend on it; start a new run instead");
            std::printf("resume: %s (from the command line)\n", change.c_str());
        }
    }
    try {
        return train_command(c.train, resume_dir, world);
    } catch (const std::exception& e) {
        if (world.size() > 1) abort_all_ranks(std::string("train: ") + e.what());  // never leave the others waiting
        throw;
    }
}

}  // namespace
}  // namespace pv

int main(int argc, char** argv) {
    try {
        return pv::main_checked(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "train: %s\n", e.what());
        return 1;
    }
}
