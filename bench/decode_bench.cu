// Generation throughput: tokens/s of greedy decoding with the KV cache (model/decoder.h: the
// prompt in one pass, then one new position per token) against recomputing a whole window of
// prompt + tokens rows for every token (what `train sample` did before the cache), on one model
// shape with random weights. Prefill and decode are timed apart; the baseline's tokens/s counts
// the same generated tokens.
//
//   decode_bench [--shape NAME] [--dtype bf16|fp32|fp64] [--prompt P] [--tokens N] [--no-baseline]
//
// --shape is a preset (model/config.h) or "default", the model `./train` trains by default (4
// layers, hidden 128, 4 heads with 2 KV heads of 32, vocab 512, 64 positions). Defaults: default,
// bf16, a 4-token prompt and 60 tokens (the default model's 64 positions). On a GPU use e.g.
// --shape smollm2-135m --prompt 512 --tokens 256. On the host backend the times are CPU times.
#include "model/decoder.h"
#include "model/llama.h"
#include "model/sampling.h"
#include "model/unit_loop.h"
#include "platform/device_memory.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace decode_bench {

struct Options {
    std::string shape = "default", dtype = "bf16";
    int prompt = 4, tokens = 60;
    bool baseline = true;
};

[[noreturn]] void usage(const char* problem) {
    std::fprintf(stderr,
                 "decode_bench: %s\nusage: decode_bench [--shape NAME|default] [--dtype bf16|fp32|fp64] [--prompt P] "
                 "[--tokens N] [--no-baseline]\n",
                 problem);
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") usage("times generation with and without the KV cache");
        if (a == "--no-baseline") {
            o.baseline = false;
            continue;
        }
        if (i + 1 >= argc) usage(("missing value after " + a).c_str());
        const std::string v = argv[++i];
        if (a == "--shape")
            o.shape = v;
        else if (a == "--dtype")
            o.dtype = v;
        else if (a == "--prompt")
            o.prompt = std::atoi(v.c_str());
        else if (a == "--tokens")
            o.tokens = std::atoi(v.c_str());
        else
            usage(("unknown option " + a).c_str());
    }
    if (o.prompt < 1 || o.tokens < 2) usage("--prompt must be at least 1 and --tokens at least 2");
    try {
        (void)pv::parse_dtype(o.dtype);
    } catch (const std::invalid_argument& e) {
        usage(e.what());
    }
    return o;
}

// trainer/run_data.cpp's default model with the default run's vocabulary and window.
pv::LlamaConfig default_model() {
    pv::LlamaConfig c;
    c.name = "default";
    c.vocab_size = 512, c.hidden_size = 128, c.num_layers = 4, c.num_heads = 4, c.num_kv_heads = 2;
    c.head_dim = 32, c.ffn_size = 352, c.max_seq_len = 64, c.tie_embeddings = true;
    return c;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class T>
void run(const pv::LlamaConfig& c, const Options& o) {
    const int total = o.prompt + o.tokens;
    std::vector<int> prompt;
    for (int i = 0; i < o.prompt; ++i) prompt.push_back((i * 7919 + 13) % c.vocab_size);
    // Weights from the model's own initialisation (Philox, seed 1): the same in both runs.
    pv::Llama<T> model(c, pv::whole_model(1, total, 1, pv::Gradients::none));
    std::printf("%s, %s, prompt %d tokens, %d generated%s\n", c.name.c_str(), o.dtype.c_str(), o.prompt, o.tokens,
                pv::kHostBackend ? "  [host CPU emulation: CPU times]" : "");

    // With the cache. A first short run warms up (worker threads, first touches).
    {
        pv::Decoder<T> warm(model, total, o.prompt);
        warm.prefill(prompt);
    }
    pv::Decoder<T> decoder(model, total, o.prompt);
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<double>* logits = &decoder.prefill(prompt);
    const double prefill = seconds_since(t0);
    std::vector<int> cached;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.tokens; ++i) {
        if (i > 0) logits = &decoder.step(cached.back());
        cached.push_back(pv::sample_token(*logits, 0.0, 1.0, 0.0));
    }
    const double decode = seconds_since(t0);
    std::printf("  KV cache:      prefill %8.1f tokens/s (%.4f s)   decode %8.1f tokens/s (%d steps in %.3f s)\n",
                o.prompt / prefill, prefill, (o.tokens - 1) / decode, o.tokens - 1, decode);

    if (!o.baseline) return;
    // Without: every token recomputes a forward over the whole window (the context, then padding).
    pv::DeviceBuffer<int> tokens(size_t(total), pv::MemoryCategory::workspace);
    std::vector<int> seq = prompt, window(size_t(total), 0), recomputed;
    std::vector<T> row(size_t(c.vocab_size));
    pv::DeviceBuffer<T> window_logits(size_t(total) * row.size(), pv::MemoryCategory::workspace);  // the window's [N][V]
    std::vector<double> scores(row.size());
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.tokens; ++i) {
        std::copy(seq.begin(), seq.end(), window.begin());
        CUDA_CHECK(cudaMemcpy(tokens.get(), window.data(), window.size() * sizeof(int), cudaMemcpyHostToDevice));
        pv::single_forward<T>(model, 0, pv::DeviceBatch{tokens.get()}, nullptr, nullptr);
        model.logits(0, window_logits.get());
        CUDA_CHECK(cudaMemcpyAsync(row.data(), window_logits.get() + (seq.size() - 1) * row.size(), row.size() * sizeof(T),
                                   cudaMemcpyDeviceToHost, model.stream()));
        CUDA_CHECK(cudaStreamSynchronize(model.stream()));
        for (size_t k = 0; k < row.size(); ++k) scores[k] = double(pv::to_acc(row[k]));
        recomputed.push_back(pv::sample_token(scores, 0.0, 1.0, 0.0));
        seq.push_back(recomputed.back());
    }
    const double full = seconds_since(t0);
    const double with_cache = (o.tokens - 1) / decode, without = o.tokens / full;
    std::printf("  recomputation: %8.1f tokens/s (%d tokens in %.3f s, a %d-row forward each); the cache: %.1fx\n",
                without, o.tokens, full, total, with_cache / without);
    std::printf("  greedy tokens %s\n", cached == recomputed ? "identical" : "DIFFER (rounding: compare in fp64)");
}

}  // namespace decode_bench

int main(int argc, char** argv) {
    using namespace decode_bench;
    const Options o = parse(argc, argv);
    const pv::LlamaConfig c = o.shape == "default" ? default_model() : pv::preset(o.shape);
    if (o.prompt + o.tokens > c.max_seq_len) {
        std::fprintf(stderr, "decode_bench: prompt %d + tokens %d exceed %s's %d positions\n", o.prompt, o.tokens,
                     c.name.c_str(), c.max_seq_len);
        return 2;
    }
    pv::with_dtype(o.dtype, [&](auto tag) { run<typename decltype(tag)::type>(c, o); });
    return 0;
}
