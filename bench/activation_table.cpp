// docs/memory.md's table of activation memory with and without activation checkpointing, per rank
// on one rank (one slot), in bf16 at sequence length 2048: the activation arenas the model
// allocates (model/activations.h activation_arenas, the figure test_checkpointing checks against
// measured peaks), and the matmul FLOPs the recompute adds as a share of the step's model FLOPs
// (model/flops.h). Workspace (the running unit's transient buffers, the same with or without
// checkpointing) comes on top. Prints a Markdown table.
#include "model/activations.h"
#include "model/config.h"
#include "model/flops.h"

#include <cstdio>
#include <vector>

int main() {
    using namespace pv;
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    constexpr int kSeq = 2048;
    struct Policy {
        const char* name;
        ActivationCheckpointing checkpointing;
    };
    const std::vector<Policy> policies = {
        {"every block", {true, 0}}, {"=2 (one in 2 kept)", {true, 2}}, {"=4 (one in 4 kept)", {true, 4}}};
    std::printf("| model | micro-batch × seq | without |");
    for (const Policy& p : policies) std::printf(" %s |", p.name);
    std::printf("\n|---|---|---:|");
    for (size_t i = 0; i < policies.size(); ++i) std::printf("---:|");
    std::printf("\n");
    const char* models[] = {"llama-3.2-1b", "llama-3.1-8b"};
    for (const char* name : models) {
        const LlamaConfig& c = preset(name);
        for (int micro = 1; micro <= 4; ++micro) {
            const double plain = double(activation_arenas(c, micro, kSeq, DType::bf16, {}, {}).total());
            std::printf("| %s | %d × %d | %.2f GiB |", name, micro, kSeq, plain / GiB);
            for (const Policy& p : policies) {
                const double ckpt =
                    double(activation_arenas(c, micro, kSeq, DType::bf16, {}, p.checkpointing).total());
                std::printf(" %.2f GiB (−%.0f%%) |", ckpt / GiB, 100.0 * (1.0 - ckpt / plain));
            }
            std::printf("\n");
        }
    }
    for (const char* name : models) {
        const LlamaConfig& c = preset(name);
        std::printf("| %s | recompute FLOPs / step's model FLOPs | |", name);
        for (const Policy& p : policies)
            std::printf(" +%.1f%% |", 100.0 * recompute_flops_per_token(c, kSeq, p.checkpointing) /
                                          training_flops_per_token(c, kSeq));
        std::printf("\n");
    }
    const LlamaConfig& c = preset("llama-3.2-1b");
    const double block = double(arena_bytes(activation_layout(c, UnitKind::block, 1, kSeq, DType::bf16)));
    const double head = double(arena_bytes(activation_layout(c, UnitKind::head, 1, kSeq, DType::bf16)));
    const long long chunk = head_chunk_rows(kSeq, c.vocab_size, DType::bf16);
    std::printf(
        "\nllama-3.2-1b, micro-batch 1 x %d, bf16: one block's arena %.1f MiB, its output %.1f MiB, the head's "
        "arena %.1f MiB (its normed rows and row statistics; its logits, %lld rows x %d at a time, %.1f MiB, are the "
        "workspace's)\n",
        kSeq, block / (1 << 20), double(kSeq) * c.hidden_size * 2 / (1 << 20), head / (1 << 20), chunk, c.vocab_size,
        double(chunk) * c.vocab_size * 2 / (1 << 20));
    return 0;
}
