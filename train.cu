// train: the polevault training program, on one rank or under mpirun with a strategy from
// parallel/ (--parallel single|ddp|zero1|zero2|zero3|mp), applied to a model that knows nothing
// of it; rank 0 reports and writes.
//
//   ./train                      trains a small model on the built-in corpus (the project's own
//                                README and headers, embedded at build time), prints one line per
//                                step, evaluates on a held-out tail, saves a checkpoint and ends
//                                with a generated sample
//   ./train --resume DIR         continues a run from a checkpoint, bit for bit
//   ./train sample CHECKPOINT    generates text from a checkpoint
//   ./train prepare FILES --out DIR    tokenizes text or JSON lines into shards
//   ./train --help               every flag with its default (also `train sample --help`, ...)
//
// One optimizer step: the loader gives the step's micro-batches; the number of counted target
// tokens is known before any forward, so every micro-batch's backward scales by 1/count
// (DESIGN.md §4) and gradients accumulate by sum (in the gradient buffers, or in an fp32 buffer
// with --fp32-grad-accumulation); then the global gradient norm, clipping folded into AdamW's
// gradient scale, and the update of every tensor (decay on matrices only by default).
#include "data/loader.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "generate.h"
#include "kernels/device_memory.h"
#include "kernels/glue.cuh"
#include "model/config_json.h"
#include "model/flops.h"
#include "model/freeze.h"
#include "model/llama.h"
#include "optim/optimizer.cuh"
#include "optim/schedule.h"
#include "parallel/strategies.h"
#include "parallel/train_step.h"
#include "parallel/world.h"
#include "train_checkpoint.h"
#include "train_options.h"
#include "train_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>

// The built-in corpus, embedded by the Makefile (build/<flavour>/corpus.o).
extern "C" const char pv_corpus_begin[];
extern "C" const char pv_corpus_end[];

namespace pv {
namespace {

StrategyOptions strategy_options(const TrainOptions& o) {
    return StrategyOptions{o.parallel, o.microbatches, o.balance, o.fp32_grad_accumulation};
}

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

double mib(size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

// What a run trains on: token shards, an optional validation shard, the tokenizer when known.
struct RunData {
    std::vector<TokenShard> train;
    std::optional<TokenShard> val;
    std::unique_ptr<Tokenizer> tokenizer;
    std::string source;
};

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
    LlamaConfig c = !resume_dir.empty()  ? read_hf_config(resume_dir + "/config.json")
                    : !o.config.empty()  ? read_hf_config(o.config)
                    : !o.preset.empty()  ? preset(o.preset)
                                         : default_model(data_vocab, o.seq_len);
    if (c.vocab_size < data_vocab)
        throw std::invalid_argument("the model's vocabulary (" + std::to_string(c.vocab_size) +
                                    ") is smaller than the data's (" + std::to_string(data_vocab) +
                                    "): choose a model with a larger vocabulary or data tokenized for this model");
    return c;
}

// The dense bf16 peak of the GPU for MFU; 0 on the host backend (a CPU has no such peak worth
// quoting) or an unknown GPU.
double device_peak_flops() {
    if (kHostBackend) return 0.0;
    int device = 0, major = 0, minor = 0, sms = 0, clock_khz = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
    return dense_bf16_peak_flops(major, minor, sms, clock_khz);
}

template <class T, class G>
int run_training(const TrainOptions& o, const TrainOptions& requested, RunData data, const LlamaConfig& config,
                 const std::string& resume_dir, World& world) {
    // The strategy decides how the batch is split and how the model is built; it is applied to a
    // model that knows nothing of it.
    const StrategyPlan plan = plan_strategy(strategy_options(o), config, o.seq_len, world.rank(), world.size());
    const bool mp = plan.info->stages;
    const int ranks = plan.data_ranks, data_rank = plan.data_rank;
    const int accumulation = accumulation_for(o.batch, o.micro_batch, ranks);
    const BatchGeometry geometry{o.batch, o.micro_batch, accumulation, ranks};
    uint64_t fingerprint = 0xcbf29ce484222325ull;
    long long train_tokens = 0;
    for (const TokenShard& s : data.train) fingerprint = fingerprint_tokens(s.tokens, fingerprint), train_tokens += (long long)s.tokens.size();
    DataLoader loader(std::move(data.train), o.seq_len, o.seed);
    std::optional<DataLoader> val_loader;
    if (data.val) val_loader.emplace(std::vector<TokenShard>{std::move(*data.val)}, o.seq_len, o.seed + 1);
    LrConfig lr_config;
    lr_config.kind = parse_schedule(o.schedule);
    lr_config.lr = o.lr;
    lr_config.warmup = o.warmup;
    lr_config.final_fraction = o.final_lr_fraction;
    lr_config.total_steps = o.steps;
    if (const auto problems = validate(lr_config); !problems.empty()) throw std::invalid_argument(problems.front());

    const FrozenTensors frozen = resolve_freeze(config, split_patterns(o.freeze));
    for (const std::string& note : frozen.notes) std::printf("freeze: %s\n", note.c_str());
    Llama<T> model(config, ModelOptions{o.micro_batch, o.seq_len, o.seed, frozen.names, plan.placement, nullptr});
    std::unique_ptr<Strategy<T, G>> strategy = make_strategy<T, G>(plan, model, &world.comm(), o.seed);
    std::unique_ptr<AdamWState<T>> optimizer = Trainer<T, G>::make_optimizer(*strategy);
    Trainer<T, G> trainer(*strategy, *optimizer);
    const AdamWSettings adamw{o.beta1, o.beta2, o.eps, o.weight_decay, o.decay_norm_weights, o.stochastic_rounding, o.seed};
    long long start_step = 0;
    if (!resume_dir.empty()) {
        const TrainerState state = load_checkpoint(resume_dir, *strategy, *optimizer);  // what this rank keeps
        start_step = state.step;
        if (state.data_fingerprint != fingerprint || state.train_tokens != train_tokens) {
            if (state.options.data == o.data)
                throw std::runtime_error("the training data differs from the checkpoint's (" +
                                         std::to_string(train_tokens) + " tokens now, " +
                                         std::to_string(state.train_tokens) + " then, or the same count with other "
                                         "tokens): resuming would not continue the same run; restore the data, or pass "
                                         "--data explicitly to continue on other data");
            std::printf("note: training continues on other data than the checkpoint's (%s)\n", o.data.c_str());
        }
        std::printf("resumed from %s at step %lld\n", resume_dir.c_str(), start_step);
    }
    if (start_step >= o.steps)
        throw std::invalid_argument("the checkpoint is at step " + std::to_string(start_step) + " and --steps is " +
                                    std::to_string(o.steps) + ": nothing to do; raise --steps to train further");
    const long long end_step = o.stop_after > 0 ? std::min(o.steps, start_step + o.stop_after) : o.steps;

    const bool writer = world.rank() == 0;
    const std::string metrics_path = o.out_dir + "/metrics.jsonl";
    FILE* metrics = nullptr;
    if (writer) {
        std::filesystem::create_directories(o.out_dir);
        if (start_step > 0) trim_metrics(metrics_path, start_step);
        metrics = std::fopen(metrics_path.c_str(), start_step > 0 ? "a" : "w");
        if (!metrics) throw std::runtime_error("cannot write " + metrics_path);
    }
    const double flops_per_token = training_flops_per_token(config, o.seq_len);
    const double peak = device_peak_flops() * world.size();
    std::printf("model %s: %lld parameters, %d layers, hidden %d, vocab %d, %s; batch %d = micro-batch %d x "
                "accumulation %d x %d rank(s), strategy %s; %lld training windows of %d tokens; %.3g FLOPs per token\n",
                config.name.c_str(), parameter_count(config), config.num_layers, config.hidden_size, config.vocab_size,
                o.dtype.c_str(), o.batch, o.micro_batch, accumulation, ranks, strategy->name(), loader.windows(),
                o.seq_len, flops_per_token);
    const long long trainable = model.tensor_elements(GroupKind::trainable), fixed = model.tensor_elements(GroupKind::frozen);
    std::printf("parameters: %lld trainable (%.2f%%), %lld frozen (%.2f%%)\n", trainable,
                100.0 * double(trainable) / double(trainable + fixed), fixed, 100.0 * double(fixed) / double(trainable + fixed));
    if (mp) {
        const std::vector<int>& stages = plan.stage_bounds;
        std::printf("pipeline: %d stages (balanced by %s):", world.size(), o.balance.c_str());
        for (size_t s = 0; s + 1 < stages.size(); ++s) std::printf(" [units %d-%d]", stages[s], stages[s + 1] - 1);
        std::printf("; %d micro-batch(es) in flight, theoretical bubble (p-1)/(m+p-1) = %.1f%%\n", o.microbatches,
                    100.0 * pipeline_bubble(world.size(), o.microbatches));
    }

    auto evaluate = [&] {
        double sum = 0, counted = 0;
        const BatchGeometry eval_geometry{o.micro_batch, o.micro_batch, 1, 1};
        for (int i = 0; i < o.eval_batches; ++i) {
            const auto b = val_loader->micro_batch(i, 0, eval_geometry, 0);
            sum += trainer.forward_loss(b);
            for (int t : b.targets) counted += t != kIgnoreIndex;
        }
        return sum / counted;
    };
    auto trainer_state = [&](long long steps_done) {
        TrainerState s;
        s.step = steps_done;
        s.samples = steps_done * o.batch;
        s.seed = o.seed;
        s.dtype = o.dtype;
        s.data_source = data.source;
        s.train_tokens = train_tokens;
        s.data_fingerprint = fingerprint;
        s.options = requested;  // as the user gave them (an automatic micro-batch stays automatic)
        s.options.resume.clear();
        s.options.stop_after = 0;
        return s;
    };

    const auto start = std::chrono::steady_clock::now();
    double first_loss = NAN, last_loss = NAN;
    for (long long step = start_step; step < end_step; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<DataLoader::MicroBatch> micro;
        for (int j = 0; j < accumulation; ++j) micro.push_back(loader.micro_batch(step, j, geometry, data_rank));
        const double lr = learning_rate(lr_config, step);
        const StepResult r = trainer.step(micro, lr, step + 1, o.clip, adamw);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double tokens_per_s = double(o.batch) * o.seq_len / (ms * 1e-3);
        const MemoryStats mem = memory_stats();
        if (step == start_step) first_loss = r.loss;
        last_loss = r.loss;
        char mfu[32] = "";
        if (peak > 0) std::snprintf(mfu, sizeof mfu, " | MFU %5.1f%%", 100.0 * tokens_per_s * flops_per_token / peak);
        std::printf("step %5lld/%lld | loss %.7f | lr %.3e | grad norm %.4f | %8.0f tok/s | %7.1f ms%s | device memory "
                    "%.1f MiB (peak %.1f MiB)\n",
                    step + 1, o.steps, r.loss, lr, r.grad_norm, tokens_per_s, ms, mfu, mib(mem.device_current),
                    mib(mem.device_peak));
        if (metrics)
            std::fprintf(metrics,
                         "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, \"tokens_per_s\": %.6g, "
                         "\"ms\": %.6g, \"device_bytes\": %zu, \"device_peak_bytes\": %zu}\n",
                         step + 1, r.loss, lr, r.grad_norm, tokens_per_s, ms, mem.device_current, mem.device_peak);
        if (val_loader && o.eval_interval > 0 && ((step + 1) % o.eval_interval == 0 || step + 1 == o.steps)) {
            const double val = evaluate();
            std::printf("          validation loss %.7f\n", val);
            if (metrics) std::fprintf(metrics, "{\"step\": %lld, \"val_loss\": %.17g}\n", step + 1, val);
        }
        if (metrics) std::fflush(metrics);
        if ((o.checkpoint_interval > 0 && (step + 1) % o.checkpoint_interval == 0) || step + 1 == end_step) {
            const std::string dir = checkpoint_path(o.out_dir, step + 1);
            save_checkpoint(dir, *strategy, *optimizer, trainer_state(step + 1), data.tokenizer.get());
            std::printf("          checkpoint %s\n", dir.c_str());
        }
        std::fflush(stdout);
    }
    if (metrics) std::fclose(metrics);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("trained steps %lld..%lld in %.1f s (%.0f tokens/s): loss %.4f -> %.4f\n", start_step + 1, end_step,
                seconds, double(end_step - start_step) * o.batch * o.seq_len / seconds, first_loss, last_loss);
    if (end_step < o.steps)
        std::printf("stopped after %lld steps; continue with: train --resume %s\n", end_step - start_step, o.out_dir.c_str());

    if (!strategy->holds_whole_model() && o.sample_tokens > 0 && end_step == o.steps)  // one rank alone has not got them
        std::printf("\nsample: %s keeps only part of the parameters on each rank; sample from the checkpoint with: "
                    "train sample %s\n", strategy->name(), checkpoint_path(o.out_dir, end_step).c_str());
    else if (writer && data.tokenizer && o.sample_tokens > 0 && end_step == o.steps) {
        std::printf("\nsample (temperature %.2f, top-p %.2f):\n%s", o.temperature, o.top_p, o.prompt.c_str());
        std::fflush(stdout);
        generate(model, *data.tokenizer, GenerateOptions{o.prompt, o.sample_tokens, o.temperature, o.top_p, o.seed},
                 [](const std::string& piece) { std::fputs(piece.c_str(), stdout), std::fflush(stdout); });
        std::printf("\n");
    }
    return 0;
}

int train_command(const TrainOptions& requested, const std::string& resume_dir, World& world) {
    TrainOptions o = requested;
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
            throw std::invalid_argument("--batch " + std::to_string(o.batch) + " has no micro-batch size that gives a "
                                        "multiple of --microbatches " + std::to_string(o.microbatches) +
                                        " micro-batches: make --batch a multiple of " + std::to_string(o.microbatches));
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
    RunData data = load_run_data(o, resume_dir);
    const LlamaConfig config = model_config(o, int(data.train.front().vocab_size), resume_dir);
    if (o.dtype == "bf16") {
        if (o.fp32_grad_accumulation) return run_training<__nv_bfloat16, float>(o, requested, std::move(data), config, resume_dir, world);
        return run_training<__nv_bfloat16, __nv_bfloat16>(o, requested, std::move(data), config, resume_dir, world);
    }
    if (o.dtype == "fp32") return run_training<float, float>(o, requested, std::move(data), config, resume_dir, world);
    return run_training<double, double>(o, requested, std::move(data), config, resume_dir, world);
}

template <class T>
int sample_with(const SampleOptions& o, const std::string& dir, const TrainerState& state) {
    const LlamaConfig config = read_hf_config(dir + "/config.json");
    if (!std::filesystem::exists(dir + "/tokenizer.json"))
        throw std::runtime_error("checkpoint '" + dir + "' has no tokenizer.json: sampling needs the tokenizer the "
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
    std::printf("prepared %lld documents: %lld training tokens in %zu shard(s), %lld validation tokens, vocabulary %d\n"
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
    World world(&argc, &argv);
    if (world.rank() != 0 && !std::freopen("/dev/null", "w", stdout))  // rank 0 reports; errors from any rank
        throw std::runtime_error("cannot silence the standard output of rank " + std::to_string(world.rank()));
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
            for (const char* fixed : {"preset:", "config:", "vocab:", "dtype:", "batch:", "seq_len:", "seed:", "freeze:"})
                if (change.rfind(fixed, 0) == 0)
                    throw std::invalid_argument("cannot change " + change + " when resuming: the checkpoint's model, "
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
