// train: the polevault training program (one rank for now; the parallel strategies plug in
// where `single_forward`/`single_backward` are called).
//
//   ./train            trains a small model on the built-in corpus (the project's own README and
//                      headers, embedded at build time), prints one line per step, evaluates on a
//                      held-out tail, and ends with a generated sample
//   ./train --help     every flag with its default
//
// One optimizer step: the loader gives the step's micro-batches; the number of counted target
// tokens is known before any forward, so every micro-batch's backward scales by 1/count
// (DESIGN.md §4) and gradients accumulate by sum; then the global gradient norm, clipping folded
// into AdamW's gradient scale, and the update of every tensor (decay on matrices only).
#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "kernels/device_memory.h"
#include "kernels/glue.cuh"
#include "model/llama.h"
#include "optim/adamw.cuh"
#include "optim/schedule.h"
#include "parallel/single.h"
#include "train_options.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
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

// Device buffers for one micro-batch's tokens and targets.
struct BatchBuffers {
    int* tokens;
    int* targets;
    size_t count;
    BatchBuffers(size_t n)
        : tokens(static_cast<int*>(device_alloc(n * sizeof(int), MemoryCategory::workspace))),
          targets(static_cast<int*>(device_alloc(n * sizeof(int), MemoryCategory::workspace))), count(n) {}
    ~BatchBuffers() { memory_free(tokens), memory_free(targets); }
    void upload(const DataLoader::MicroBatch& b) {
        CUDA_CHECK(cudaMemcpy(tokens, b.inputs.data(), count * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(targets, b.targets.data(), count * sizeof(int), cudaMemcpyHostToDevice));
    }
};

// AdamW state for one unit: master weights (bf16 only), m and v, all padded like the group.
template <class T>
struct UnitOptimizerState {
    acc_t<T>* master = nullptr;
    acc_t<T>* m = nullptr;
    acc_t<T>* v = nullptr;
};

double mib(size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

template <class T>
int run(const TrainOptions& o, const Tokenizer* tokenizer, std::vector<TokenShard> train_shards,
        std::vector<TokenShard> val_shards, const LlamaConfig& config) {
    using A = acc_t<T>;
    const int accumulation = accumulation_for(o.batch, o.micro_batch, 1);
    const BatchGeometry geometry{o.batch, o.micro_batch, accumulation, 1};
    DataLoader loader(std::move(train_shards), o.seq_len, o.seed);
    DataLoader val_loader(std::move(val_shards), o.seq_len, o.seed + 1);
    LrConfig lr_config;
    lr_config.kind = parse_schedule(o.schedule);
    lr_config.lr = o.lr;
    lr_config.warmup = o.warmup;
    lr_config.final_fraction = o.final_lr_fraction;
    lr_config.total_steps = o.steps;
    if (const auto problems = validate(lr_config); !problems.empty()) throw std::invalid_argument(problems.front());

    Llama<T> model(config, o.micro_batch, o.seq_len, 1, o.seed);
    std::vector<UnitOptimizerState<T>> state(size_t(model.num_units()));
    for (int u = 0; u < model.num_units(); ++u) {
        const size_t n = size_t(model.layout(u).padded);
        UnitOptimizerState<T>& s = state[size_t(u)];
        s.m = static_cast<A*>(device_alloc(n * sizeof(A), MemoryCategory::optimizer_state));
        s.v = static_cast<A*>(device_alloc(n * sizeof(A), MemoryCategory::optimizer_state));
        CUDA_CHECK(cudaMemset(s.m, 0, n * sizeof(A)));
        CUDA_CHECK(cudaMemset(s.v, 0, n * sizeof(A)));
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            s.master = static_cast<A*>(device_alloc(n * sizeof(A), MemoryCategory::optimizer_state));
            init_master(model.params(u), s.master, (long long)n, nullptr);
        }
    }
    BatchBuffers batch(size_t(o.micro_batch) * size_t(o.seq_len));
    A* loss_sum = static_cast<A*>(device_alloc(sizeof(A), MemoryCategory::workspace));
    int* count = static_cast<int*>(device_alloc(sizeof(int), MemoryCategory::workspace));
    double* norm_sq = static_cast<double*>(device_alloc(sizeof(double), MemoryCategory::workspace));
    long long largest_group = 0;
    for (int u = 0; u < model.num_units(); ++u) largest_group = std::max(largest_group, model.layout(u).padded);
    void* norm_scratch = device_alloc(sum_of_squares_scratch_bytes<T>(largest_group), MemoryCategory::workspace);

    std::filesystem::create_directories(o.out_dir);
    FILE* metrics = std::fopen((o.out_dir + "/metrics.jsonl").c_str(), "w");
    if (!metrics) throw std::runtime_error("cannot write " + o.out_dir + "/metrics.jsonl");
    std::printf("model %s: %lld parameters, %d layers, hidden %d, vocab %d, %s; batch %d = micro-batch %d x "
                "accumulation %d; %lld training windows of %d tokens\n",
                config.name.c_str(), parameter_count(config), config.num_layers, config.hidden_size, config.vocab_size,
                o.dtype.c_str(), o.batch, o.micro_batch, accumulation, loader.windows(), o.seq_len);

    auto micro_loss = [&](const DataLoader::MicroBatch& b) {
        batch.upload(b);
        single_forward(model, 0, batch.tokens, batch.targets, loss_sum, count);
        A host_loss;
        CUDA_CHECK(cudaMemcpy(&host_loss, loss_sum, sizeof(A), cudaMemcpyDeviceToHost));
        return double(host_loss);
    };
    auto evaluate = [&] {
        double sum = 0, tokens = 0;
        const BatchGeometry eval_geometry{o.micro_batch, o.micro_batch, 1, 1};
        for (int i = 0; i < o.eval_batches; ++i) {
            const auto b = val_loader.micro_batch(i, 0, eval_geometry, 0);
            sum += micro_loss(b);
            tokens += double(b.targets.size());
        }
        return sum / tokens;
    };

    const auto start = std::chrono::steady_clock::now();
    double first_loss = NAN, last_loss = NAN;
    for (long long step = 0; step < o.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<DataLoader::MicroBatch> micro;
        long long counted = 0;
        for (int j = 0; j < accumulation; ++j) {
            micro.push_back(loader.micro_batch(step, j, geometry, 0));
            for (int t : micro.back().targets) counted += t != kIgnoreIndex;
        }
        if (counted == 0) throw std::runtime_error("step " + std::to_string(step) + " has no counted target tokens");
        model.zero_grads();
        double loss = 0;
        for (const auto& b : micro) {
            loss += micro_loss(b);
            single_backward(model, 0, batch.tokens, batch.targets, 1.0 / double(counted));
        }
        loss /= double(counted);
        // Global gradient norm, deterministic (fixed order over units), padding contributes 0.
        for (int u = 0; u < model.num_units(); ++u) {
            if (u == 0) sum_of_squares(model.grads(u), model.layout(u).padded, norm_sq, norm_scratch, nullptr);
            else sum_of_squares_accumulate(model.grads(u), model.layout(u).padded, norm_sq, norm_scratch, nullptr);
        }
        double host_norm_sq;
        CUDA_CHECK(cudaMemcpy(&host_norm_sq, norm_sq, sizeof(double), cudaMemcpyDeviceToHost));
        const double grad_norm = std::sqrt(host_norm_sq);
        const double scale = clip_scale(grad_norm, o.clip);
        if (!std::isfinite(loss) || !std::isfinite(scale))
            throw std::runtime_error("step " + std::to_string(step) + ": the loss or gradient norm is not finite (loss " +
                                     std::to_string(loss) + ", norm " + std::to_string(grad_norm) +
                                     "); lower --lr or enable --clip");
        const double lr = learning_rate(lr_config, step);
        for (int u = 0; u < model.num_units(); ++u) {
            const UnitOptimizerState<T>& s = state[size_t(u)];
            for (const TensorSlot& t : model.layout(u).tensors) {
                AdamWStep h;
                h.lr = lr;
                h.weight_decay = t.spec.init == Init::normal ? o.weight_decay : 0.0;  // matrices only
                h.t = step + 1;
                h.grad_scale = scale;
                adamw_update<T, T>(model.params(u) + t.offset, s.master ? s.master + t.offset : nullptr,
                                   model.grads(u) + t.offset, s.m + t.offset, s.v + t.offset, t.spec.numel(), h, false,
                                   o.seed, t.id, 0, nullptr);
            }
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double tokens_per_s = double(o.batch) * o.seq_len / (ms * 1e-3);
        const MemoryStats mem = memory_stats();
        if (step == 0) first_loss = loss;
        last_loss = loss;
        std::printf("step %5lld/%lld | loss %.7f | lr %.3e | grad norm %.4f | %8.0f tok/s | %7.1f ms | device memory %.1f MiB "
                    "(peak %.1f MiB)\n",
                    step + 1, o.steps, loss, lr, grad_norm, tokens_per_s, ms, mib(mem.device_current), mib(mem.device_peak));
        std::fprintf(metrics,
                     "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens_per_s\": %.6g, \"ms\": %.6g, "
                     "\"device_bytes\": %zu, \"device_peak_bytes\": %zu}\n",
                     step + 1, loss, lr, grad_norm, tokens_per_s, ms, mem.device_current, mem.device_peak);
        if (o.eval_interval > 0 && ((step + 1) % o.eval_interval == 0 || step + 1 == o.steps)) {
            const double val = evaluate();
            std::printf("          validation loss %.7f\n", val);
            std::fprintf(metrics, "{\"step\": %lld, \"val_loss\": %.9g}\n", step + 1, val);
        }
        std::fflush(stdout);
        std::fflush(metrics);
    }
    std::fclose(metrics);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("trained %lld steps in %.1f s: loss %.4f -> %.4f\n", o.steps, seconds, first_loss, last_loss);

    // A sample: the prompt continued token by token. The context (at most seq_len tokens) fills
    // row 0 of a micro-batch; causal attention makes the padding after it irrelevant.
    if (tokenizer && o.sample_tokens > 0) {
        std::vector<int> context = tokenizer->encode(o.prompt, false);
        std::mt19937_64 rng(o.seed);
        std::vector<T> logits(size_t(config.vocab_size));
        std::string text = o.prompt;
        for (int i = 0; i < o.sample_tokens; ++i) {
            const size_t len = std::min(context.size(), size_t(o.seq_len));
            std::vector<int> window(size_t(o.micro_batch) * size_t(o.seq_len), 0);
            std::copy(context.end() - long(len), context.end(), window.begin());
            CUDA_CHECK(cudaMemcpy(batch.tokens, window.data(), window.size() * sizeof(int), cudaMemcpyHostToDevice));
            single_forward<T>(model, 0, batch.tokens, nullptr, nullptr, nullptr);
            CUDA_CHECK(cudaMemcpy(logits.data(), model.logits(0) + (len - 1) * size_t(config.vocab_size),
                                  logits.size() * sizeof(T), cudaMemcpyDeviceToHost));
            // Temperature, then the smallest set of tokens holding top_p of the probability.
            std::vector<std::pair<double, int>> p(logits.size());
            double max_logit = -INFINITY;
            for (size_t k = 0; k < logits.size(); ++k) max_logit = std::max(max_logit, double(to_acc(logits[k])));
            double total = 0;
            for (size_t k = 0; k < logits.size(); ++k)
                total += p[k].first = std::exp((double(to_acc(logits[k])) - max_logit) / o.temperature), p[k].second = int(k);
            std::sort(p.begin(), p.end(), std::greater<>());
            double kept = 0;
            size_t n = 0;
            while (n < p.size() && (n == 0 || kept < o.top_p * total)) kept += p[n++].first;
            double r = std::uniform_real_distribution<double>(0, kept)(rng);
            int next = p[n - 1].second;
            for (size_t k = 0; k < n; ++k)
                if ((r -= p[k].first) <= 0) {
                    next = p[k].second;
                    break;
                }
            context.push_back(next);
            text += tokenizer->decode({next});
        }
        std::printf("\nsample (temperature %.2f, top-p %.2f):\n%s\n", o.temperature, o.top_p, text.c_str());
    }
    for (auto& s : state) memory_free(s.master), memory_free(s.m), memory_free(s.v);
    for (void* p : {static_cast<void*>(loss_sum), static_cast<void*>(count), static_cast<void*>(norm_sq), norm_scratch})
        memory_free(p);
    return 0;
}

int main_checked(int argc, char** argv) {
    const TrainOptions o = parse_train_options(argc, argv);
    std::unique_ptr<Tokenizer> tokenizer;
    std::vector<TokenShard> train, val;
    if (o.data.empty()) {
        const std::string corpus(pv_corpus_begin, pv_corpus_end);
        std::printf("built-in corpus: %zu bytes of the project's own documentation and sources\n", corpus.size());
        tokenizer = std::make_unique<Tokenizer>(Tokenizer::train(corpus, o.vocab));
        std::filesystem::create_directories(o.out_dir);
        tokenizer->save(o.out_dir + "/tokenizer.json");
        const std::vector<int> ids = tokenizer->encode(corpus, false);
        std::printf("tokenizer: byte-level BPE, %d tokens (saved to %s/tokenizer.json); corpus = %zu tokens\n",
                    tokenizer->vocab_size(), o.out_dir.c_str(), ids.size());
        // The loss of a model that knows only token frequencies: what training must beat to show
        // it uses context.
        std::vector<double> frequency(size_t(tokenizer->vocab_size()), 0.0);
        for (int id : ids) frequency[size_t(id)] += 1.0;
        double entropy = 0;
        for (double f : frequency)
            if (f > 0) entropy -= f / double(ids.size()) * std::log(f / double(ids.size()));
        std::printf("unigram entropy of the corpus: %.4f nats/token\n", entropy);
        // The last 10% is held out for validation.
        const size_t split = ids.size() - ids.size() / 10;
        TokenShard t{uint32_t(tokenizer->vocab_size()), uint32_t(std::max(0, tokenizer->eot_id())), {}};
        TokenShard v = t;
        t.tokens.assign(ids.begin(), ids.begin() + long(split));
        v.tokens.assign(ids.begin() + long(split), ids.end());
        train.push_back(std::move(t));
        val.push_back(std::move(v));
    } else {
        train.push_back(read_shard(o.data));
        val.push_back(o.val_data.empty() ? train.back() : read_shard(o.val_data));
    }
    const int vocab = int(train.front().vocab_size);
    const LlamaConfig config = o.preset.empty() ? default_model(vocab, o.seq_len) : preset(o.preset);
    if (config.vocab_size < vocab)
        throw std::invalid_argument("the model's vocabulary (" + std::to_string(config.vocab_size) +
                                    ") is smaller than the data's (" + std::to_string(vocab) +
                                    "): choose a preset with a larger vocabulary or data tokenized for this model");
    if (o.dtype == "bf16") return run<__nv_bfloat16>(o, tokenizer.get(), std::move(train), std::move(val), config);
    if (o.dtype == "fp32") return run<float>(o, tokenizer.get(), std::move(train), std::move(val), config);
    return run<double>(o, tokenizer.get(), std::move(train), std::move(val), config);
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
