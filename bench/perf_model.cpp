// The performance model at real shapes (model/step_cost.h): every kernel of a training step with
// the bytes it moves, the FLOPs it does, the unit it runs on and its predicted H100 SXM time,
// before this code's kernels and now, side by side; the step time and MFU they add up to; and
// each data-parallel strategy's communication (parallel/comm_cost.h, the comm counters' figures)
// at NVLink and at 100 Gb/s Ethernet; one rank's step under --tp; and the dK/dV kernel's time per
// layer at small grids, one block a key tile against its key tiles split into segments
// (kernels/attention_mma_blocks.h); and dK/dV's time per layer at hd 64 with warps of 16 and of 32
// keys, the width the shape takes beside the other; and where dK/dV splits, its time at other segment
// lengths than the rule's. Predictions, not measurements: no GPU runs here.
//
//   build/<flavour>/bench/perf_model [--kernels]    (--kernels: the per-kernel table too)
#include "kernels/attention_mma_blocks.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/step_cost.h"
#include "parallel/comm_cost.h"
#include "parallel/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace pv;

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kNvlinkBytesPerS = 450e9;     // H100 SXM NVLink 4: 900 GB/s total, 450 per direction
constexpr double kEthernetBytesPerS = 12.5e9;  // 100 Gb/s

// The largest micro-batch whose model states (per rank, parallel/memory.h) and activations
// (model/llama.h activation_layout, every unit's arena) fit in `budget` bytes.
int filling_batch(const LlamaConfig& c, const std::string& strategy, int ranks, int seq_len, double budget) {
    const double states = model_state_memory(c, DType::bf16, {}, strategy, ranks).total();
    int best = 0;
    for (int b = 1; b <= 64; ++b) {
        double acts = double(arena_bytes(activation_layout(c, UnitKind::embedding, b, seq_len, DType::bf16))) +
                      double(arena_bytes(activation_layout(c, UnitKind::head, b, seq_len, DType::bf16)));
        acts += c.num_layers * double(arena_bytes(activation_layout(c, UnitKind::block, b, seq_len, DType::bf16)));
        if (states + acts > budget) break;
        best = b;
    }
    return best;
}

// An attention shape of the tables below: batch, sequence, query and KV heads, head dim.
struct AttentionShape {
    const char* name;
    int B, T, H, Hkv, hd;
};

// Kernels grouped by op (their launches summed), before and now.
void print_kernels(const StepShape& s) {
    struct Row {
        double bytes = 0, flops = 0, before = 0, now = 0;
        std::string unit;
    };
    std::map<std::string, Row> rows;
    std::vector<std::string> order;
    for (KernelSet set : {KernelSet::before, KernelSet::now})
        for (const KernelCost& k : step_kernels(s, set)) {
            if (!rows.count(k.op)) order.push_back(k.op);
            Row& r = rows[k.op];
            const double sec = predicted_seconds(k) * k.count;
            (set == KernelSet::before ? r.before : r.now) += sec;
            if (set == KernelSet::now) {
                r.bytes += k.bytes() * k.count;
                r.flops += k.flops * k.count;
                r.unit = roofline_name(k.roofline);
            }
        }
    std::printf("| op | bytes (GB) | GFLOP | unit (now) | before (ms) | now (ms) |\n|---|---:|---:|---|---:|---:|\n");
    for (const std::string& op : order) {
        const Row& r = rows[op];
        std::printf("| %s | %.2f | %.0f | %s | %.3f | %.3f |\n", op.c_str(), r.bytes / 1e9, r.flops / 1e9,
                    r.unit.empty() ? "(gone)" : r.unit.c_str(), r.before * 1e3, r.now * 1e3);
    }
}

void print_step(const char* label, const StepShape& s, const std::string& strategy, int ranks, bool kernels) {
    const StepPrediction before = predict_step(s, KernelSet::before), now = predict_step(s, KernelSet::now);
    std::printf("\n## %s: %s, micro-batch %d x %d, %s on %d H100 SXM\n\n", label, s.config.name.c_str(), s.batch,
                s.seq_len, strategy.c_str(), ranks);
    if (kernels) print_kernels(s);
    std::printf("\n| | compute (ms) | MFU |\n|---|---:|---:|\n");
    std::printf("| before | %.1f | %.1f%% |\n| now | %.1f | %.1f%% |\n", before.seconds * 1e3, 100 * before.mfu,
                now.seconds * 1e3, 100 * now.mfu);
    if (ranks > 1) {
        const double wire = step_wire_bytes(s.config, DType::bf16, {}, strategy, ranks, s.accumulation);
        for (const auto& [link, rate] :
             {std::pair{"NVLink 450 GB/s", kNvlinkBytesPerS}, {"Ethernet 100 Gb/s", kEthernetBytesPerS}}) {
            const double comm = wire / rate;
            // No overlap: compute + communication; full overlap: the larger of the two.
            const double serial = now.seconds + comm, overlapped = std::max(now.seconds, comm);
            std::printf("| %s: %.2f GB sent per rank, %.1f ms | step %.1f-%.1f ms | MFU %.1f-%.1f%% |\n", link,
                        wire / 1e9, comm * 1e3, overlapped * 1e3, serial * 1e3,
                        100 * now.model_flops / (serial * Device{}.tensor_bf16_flops),
                        100 * now.model_flops / (overlapped * Device{}.tensor_bf16_flops));
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    const bool kernels = argc > 1 && std::strcmp(argv[1], "--kernels") == 0;
    const Device d;
    std::printf("# Predicted step times on an %s (performance model, model/step_cost.h)\n", d.name);
    std::printf(
        "\nRooflines: time = max(bytes / (%.2f TB/s x e_mem), FLOPs / (peak x e_unit)); tensor peak %.1f TF/s, "
        "CUDA-core fp32 peak %.1f TF/s.\n\n| roofline | e_mem | e_unit | source |\n|---|---:|---:|---|\n",
        d.hbm_bytes_per_s / 1e12, d.tensor_bf16_flops / 1e12, d.cuda_core_fp32_flops / 1e12);
    for (Roofline r : {Roofline::cublas_gemm, Roofline::attention_mma, Roofline::attention_cuda_core,
                       Roofline::memory_vector, Roofline::memory_rows, Roofline::memory_scalar}) {
        const RooflineEfficiency e = roofline_efficiency(r);
        std::printf("| %s | %.2f | %.2f | %s |\n", roofline_name(r), e.e_mem, e.e_unit, e.source);
    }
    const IssueEfficiency issue = attention_issue_efficiency();
    std::printf(
        "\nThe tensor-core attention kernels are also priced by instruction issue: the instructions their "
        "warps issue (model/attention_sass.h: per warp and tile at hd 64, forward %d (%d on the diagonal, "
        "with masks; on an H100 its warps own 32 rows: %d (%d)), dK/dV %d (%d) (on an H100 at a grid large "
        "enough, warps of 32 keys: %d (%d)), dQ %d (%d) (on an H100 or "
        "A100, warps of 32 rows: %d (%d))), their grids "
        "dispatched block by block on %d SMs (blocks per "
        "SM from ptxas's registers) that each issue 4 per clock x %.2f GHz x an issue efficiency of "
        "%.3f forward, %.3f backward (%s).\n",
        attention_tile_instructions("forward", 64), attention_tile_instructions("forward", 64, true),
        attention_tile_instructions("forward-32rows", 64), attention_tile_instructions("forward-32rows", 64, true),
        attention_tile_instructions("dkv", 64), attention_tile_instructions("dkv", 64, true),
        attention_tile_instructions("dkv-32rows", 64), attention_tile_instructions("dkv-32rows", 64, true),
        attention_tile_instructions("dq", 64), attention_tile_instructions("dq", 64, true),
        attention_tile_instructions("dq-32rows", 64), attention_tile_instructions("dq-32rows", 64, true), d.sms,
        d.clock_hz / 1e9, issue.forward, issue.backward, issue.source);
    const double budget = 72 * GiB;  // 80 GB less the CUDA context, workspace and the allocator's slack
    StepShape one{preset("llama-3.2-1b"), 4, 2048, 1, 2};
    print_step("The issue's reference", one, "single", 1, kernels);
    {  // the pair measured in docs/speed.md: two micro-batches a step, without and with every block recomputed
        StepShape plain = one, recomputed = one;
        plain.accumulation = recomputed.accumulation = 2;
        recomputed.checkpointing = ActivationCheckpointing{true, 0};
        const double a = predict_step(plain, KernelSet::now).seconds;
        const double b = predict_step(recomputed, KernelSet::now).seconds;
        std::printf("\nTwo micro-batches a step: %.1f ms; with every block recomputed (--checkpoint-activations) "
                    "%.1f ms, %+.1f%%.\n",
                    a * 1e3, b * 1e3, 100 * (b / a - 1));
    }
    StepShape fill = one;
    fill.batch = filling_batch(one.config, "single", 1, 2048, budget);
    print_step("Micro-batch filling 72 GiB", fill, "single", 1, kernels);
    for (const char* strategy : {"ddp", "zero3"}) {
        StepShape s = fill;
        s.batch = filling_batch(one.config, strategy, 8, 2048, budget);
        s.optimizer_shards = std::string(strategy) == "ddp" ? 1 : 8;
        s.rotating_gradients = std::string(strategy) == "zero3";
        print_step("Data parallel", s, strategy, 8, false);
    }
    StepShape big{preset("llama-3.1-8b"), 1, 2048, 1, 2};
    big.batch = filling_batch(big.config, "zero3", 8, 2048, budget);
    big.optimizer_shards = 8, big.rotating_gradients = true;
    print_step("Full fine-tuning of 8B needs sharding", big, "zero3", 8, kernels);
    {  // one rank of a tensor-parallel group: its slices' kernels, and the group's all-reduces over NVLink
        StepShape tp{preset("llama-3.1-8b"), 1, 4096, 8, 2};
        tp.checkpointing = ActivationCheckpointing{true, 0};
        std::printf("\n## Tensor parallelism (--tp T): %s, 8 micro-batches of 1 x 4096, every block recomputed, "
                    "one rank of the group\n\nThe group's all-reduces over NVLink 450 GB/s (parallel/comm_cost.h "
                    "tensor_parallel_wire: the blocks' and the vocabulary-parallel embedding's and head's), and "
                    "ddp's gradient all-reduce of the rank's slices over its 8/T data-parallel ranks, also over "
                    "NVLink (step_wire_bytes of the slices' groups).\n\n"
                    "| T | compute (ms) | all-reduces + all-gathers per step | GB sent per rank | NVLink (ms) | "
                    "ddp over 8/T: GB, ms | step (ms), overlapped - serial | MFU |\n"
                    "|---:|---:|---:|---:|---:|---:|---:|---:|\n",
                    tp.config.name.c_str());
        for (int t : {1, 2, 4, 8}) {
            tp.tensor = t;
            const StepPrediction p = predict_step(tp, KernelSet::now);
            const TensorWire w = tensor_parallel_wire(tp.config, DType::bf16, {}, t, 4096, tp.accumulation,
                                                      tp.config.num_layers, tp.config.num_layers,
                                                      tp.config.num_layers, true, true);
            GroupOptions slices;
            slices.tensor = {t, 0};  // the rank's slices (rank 0's: the most vocabulary rows)
            const double dp_bytes = t < 8 ? step_wire_bytes(tp.config, DType::bf16, slices, "ddp", 8 / t, 1) : 0;
            const double tensor_comm = w.bytes / kNvlinkBytesPerS, dp_comm = dp_bytes / kNvlinkBytesPerS;
            const double comm = tensor_comm + dp_comm, serial = p.seconds + comm;
            const double overlapped = std::max(p.seconds, comm), peak = Device{}.tensor_bf16_flops;
            std::printf("| %d | %.1f | %lld + %lld | %.2f | %.1f | %.2f, %.1f | %.1f - %.1f | %.1f-%.1f%% |\n", t,
                        p.seconds * 1e3, w.all_reduces, w.all_gathers, w.bytes / 1e9, tensor_comm * 1e3,
                        dp_bytes / 1e9, dp_comm * 1e3, overlapped * 1e3, serial * 1e3,
                        100 * p.model_flops / (serial * peak), 100 * p.model_flops / (overlapped * peak));
        }
    }
    {  // the attention kernels' splits on small grids (kernels/attention_mma_blocks.h), per layer
        std::printf(
            "\n## Attention on small grids: tiles split into segments, per layer\n\n"
            "| shape | H / Hkv, hd | kernel | segment steps | blocks, one a tile | time (ms) | blocks, "
            "split | time (ms) | merge (ms) | partials (MB) |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for (const AttentionShape& x :
             {AttentionShape{"8B, 1 x 2048", 1, 2048, 32, 8, 128}, AttentionShape{"1B, 1 x 2048", 1, 2048, 32, 8, 64},
              AttentionShape{"8B --tp 8, 1 x 4096", 1, 4096, 4, 1, 128},
              AttentionShape{"8B --tp 8, 1 x 8192", 1, 8192, 4, 1, 128},
              AttentionShape{"70B --tp 8, 1 x 4096", 1, 4096, 8, 1, 128},
              AttentionShape{"1B, 4 x 2048", 4, 2048, 32, 8, 64},
              AttentionShape{"70B, 1 x 4096", 1, 4096, 64, 8, 128}}) {
            const std::vector<KernelCost> forward = cost::attention_forward(x.B, x.T, x.H, x.Hkv, x.hd, 2, 4, false);
            const std::vector<KernelCost> k = cost::attention_backward(x.B, x.T, x.H, x.Hkv, x.hd, 2, 4, false);
            const AttentionMmaSplit split = attention_mma_backward_split(x.B, x.T, x.H, x.Hkv, x.hd);
            const auto blocks = [](const KernelCost& c) {
                long long n = 0;
                for (const BlockRun& r : c.blocks) n += r.blocks;
                return n;
            };
            // Each kernel and the one that merges its partials where it splits, in launch order: the
            // forward and its combine; D, dK/dV and its reduce, dQ and its reduce. The forward's split is
            // dQ's.
            const auto row = [&](const char* kind, const char* label, const KernelCost& kernel, int L,
                                 const KernelCost* merge) {
                KernelCost whole = kernel;  // the same kernel, one block a tile
                cost::set_attention_issue(
                    whole, kind, x.B, x.T, x.H, x.Hkv, x.hd, attention_tile_instructions(kind, x.hd),
                    attention_tile_instructions(kind, x.hd, true), attention_kernel_registers(kind, x.hd), 0);
                std::printf("| %s | %d / %d, %d | %s | %d | %lld | %.3f | %lld | %.3f | %.3f | %.1f |\n", x.name, x.H,
                            x.Hkv, x.hd, label, L, blocks(whole), predicted_seconds(whole) * 1e3, blocks(kernel),
                            predicted_seconds(kernel) * 1e3, merge ? predicted_seconds(*merge) * 1e3 : 0.0,
                            merge ? merge->read_bytes / 1e6 : 0.0);
            };
            row(cost::attention_forward_kind(x.hd), "forward", forward[0], split.dq, split.dq ? &forward[1] : nullptr);
            row(cost::attention_dkv_kind(x.hd, Device{}, x.B, x.T, x.H, x.Hkv), "dK/dV", k[1], split.dkv,
                split.dkv ? &k[2] : nullptr);
            const size_t dq = split.dkv ? 3 : 2;
            row(cost::attention_dq_kind(x.hd), "dQ", k[dq], split.dq, split.dq ? &k[dq + 1] : nullptr);
        }
    }
    {  // dK/dV's warps at hd 64 on this device: 16 or 32 keys, chosen per shape (attention_mma_dkv_row_tiles)
        std::printf(
            "\n## dK/dV's warps at hd 64: 16 or 32 keys by the shape, per layer\n\n"
            "32 keys where the heaviest block's steps are at most 1.2x a slot's share of all the steps "
            "(%lld slots: 4 blocks on each of 132 SMs); both widths priced by the grid dispatch.\n\n"
            "| B x T, H / Hkv | heaviest block / a slot's share | 16 keys (ms) | 32 keys (ms) | 32 / 16 | "
            "taken |\n|---|---:|---:|---:|---:|---:|\n",
            kAttentionMmaWideSlots);
        struct Shape {
            int B, T, H, Hkv;
        };
        const int hd = 64;
        for (const Shape& x :
             {Shape{8, 2048, 32, 8}, Shape{6, 2048, 32, 8}, Shape{4, 2048, 32, 8}, Shape{2, 4096, 32, 8},
              Shape{1, 8192, 32, 8}, Shape{1, 12288, 32, 8}, Shape{7, 1024, 32, 8}, Shape{6, 1024, 32, 8},
              Shape{3, 2048, 32, 8}, Shape{2, 2048, 32, 8}, Shape{1, 2048, 32, 8}}) {
            const long long n = attention_mma_tiles(x.T), G = x.H / x.Hkv;
            const double share = double(x.B) * x.Hkv * G * (n * (n + 1) / 2) / double(kAttentionMmaWideSlots);
            const bool split = attention_mma_backward_split(x.B, x.T, x.H, x.Hkv, hd).dkv > 0;
            double ms[2];
            for (int w = 0; w < 2; ++w) {
                const char* kind = w ? "dkv-32rows" : "dkv";
                KernelCost k = cost::attention_backward(x.B, x.T, x.H, x.Hkv, hd, 2, 4, false, d)[1];
                cost::set_attention_issue(k, kind, x.B, x.T, x.H, x.Hkv, hd, attention_tile_instructions(kind, hd),
                                          attention_tile_instructions(kind, hd, true),
                                          attention_kernel_registers(kind, hd, d.sass_arch, split));
                ms[w] = predicted_seconds(k) * 1e3;
            }
            std::printf(
                "| %d x %d, %d / %d%s | %.2f | %.3f | %.3f | %+.1f%% | %s |\n", x.B, x.T, x.H, x.Hkv,
                split ? " (split)" : "", double(G * n) / share, ms[0], ms[1], 100 * (ms[1] / ms[0] - 1),
                std::string(cost::attention_dkv_kind(hd, d, x.B, x.T, x.H, x.Hkv)) == "dkv-32rows" ? "32" : "16");
        }
    }
    {  // dK/dV's segment length where a grid splits: the rule's (a third of a slot's share) against others
        std::printf(
            "\n## dK/dV's segment length on small grids, per layer\n\nThe dK/dV kernel and the one that "
            "sums its partials, their tiles cut into segments of at most L steps: the rule's L (a third of "
            "a slot's share at %lld slots), half a share and a whole one, and one block a tile.\n\n"
            "| shape | H / Hkv, hd | a slot's share (steps) | L = share / 3 (the rule) | L = share / 2 | "
            "L = share | unsplit |\n|---|---|---:|---:|---:|---:|---:|\n",
            kAttentionSplitBalanceSlots);
        for (const AttentionShape& x :
             {AttentionShape{"8B, 1 x 1024", 1, 1024, 32, 8, 128}, AttentionShape{"8B, 1 x 2048", 1, 2048, 32, 8, 128},
              AttentionShape{"1B, 1 x 2048", 1, 2048, 32, 8, 64},
              AttentionShape{"8B --tp 2, 1 x 2048", 1, 2048, 16, 4, 128},
              AttentionShape{"8B --tp 4, 1 x 4096", 1, 4096, 8, 2, 128},
              AttentionShape{"8B --tp 8, 1 x 4096", 1, 4096, 4, 1, 128},
              AttentionShape{"8B --tp 8, 1 x 8192", 1, 8192, 4, 1, 128},
              AttentionShape{"70B --tp 8, 1 x 4096", 1, 4096, 8, 1, 128}}) {
            const long long n = attention_mma_tiles(x.T), G = x.H / x.Hkv;
            const long long share = (long long)x.B * x.Hkv * G * (n * (n + 1) / 2) / kAttentionSplitBalanceSlots;
            const int rule = attention_mma_dkv_segment_steps(x.B, x.T, x.H, x.Hkv, x.hd);
            // The kernel and, where it splits, the sum of its partials after it.
            const auto ms = [&](int L) {
                const std::vector<KernelCost> k =
                    cost::attention_backward(x.B, x.T, x.H, x.Hkv, x.hd, 2, 4, false, d, L);
                double s = predicted_seconds(k[1]);
                if (k[2].op == "attention backward: dK, dV partials summed") s += predicted_seconds(k[2]);
                return s * 1e3;
            };
            std::printf("| %s | %d / %d, %d | %lld | %.3f ms (L %d) | %.3f ms | %.3f ms | %.3f ms |\n", x.name, x.H,
                        x.Hkv, x.hd, share, ms(rule), rule, ms(int(share / 2)), ms(int(share)), ms(0));
        }
    }
    return 0;
}
