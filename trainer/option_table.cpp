// The rules between options (trainer/option_rules.h option_rules): one table. Apart from
// option_rules.cpp because it reads TrainOptions' fields and the parallel layer's checks, which the
// file readers' fuzz targets (which check a checkpoint's options by their JSON form) do not link.
#include "parallel/plan.h"
#include "trainer/option_rules.h"
#include "trainer/options.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

const std::vector<OptionRule>& option_rules() {
    static const std::vector<OptionRule> rules{
        {"--parallel auto, --shard-group",
         [](const TrainOptions& o, int) -> std::string {
             if (o.parallel != "auto" || o.shard_group == 0) return "";
             return "--shard-group " + std::to_string(o.shard_group) +
                    " shards a ZeRO stage: choose it with --parallel zero1, zero2 or zero3";
         }},
        {"--fp32-grad-accumulation, --dtype",
         [](const TrainOptions& o, int) -> std::string {
             if (!o.fp32_grad_accumulation || o.dtype == "bf16") return "";
             return "--fp32-grad-accumulation is for --dtype bf16 (" + o.dtype +
                    " gradients already accumulate in their own type); drop the flag";
         }},
        {"--stochastic-rounding, --dtype",
         [](const TrainOptions& o, int) -> std::string {
             if (!o.stochastic_rounding || o.dtype == "bf16") return "";
             return "--stochastic-rounding is for --dtype bf16 (" + o.dtype +
                    " parameters are their own master and are never rounded); drop the flag";
         }},
        {"--freeze, --lora-rank",
         [](const TrainOptions& o, int) -> std::string {
             if (o.lora_rank == 0 || o.freeze.empty()) return "";
             return "--freeze " + o.freeze + " with --lora-rank " + std::to_string(o.lora_rank) +
                    ": LoRA freezes the whole base already and trains only the adapters; drop --freeze (or "
                    "--lora-rank for full fine-tuning with frozen tensors)";
         }},
        {"--quantize, --lora-rank",
         [](const TrainOptions& o, int) -> std::string {
             if (o.quantize != "nf4" || o.lora_rank != 0) return "";
             return "--quantize nf4 stores the frozen base of a LoRA run (QLoRA): add --lora-rank";
         }},
        {"--quantize, --offload",
         [](const TrainOptions& o, int) -> std::string {
             if (o.quantize != "nf4" || o.offload != "params") return "";
             return "--offload params with --quantize nf4: the NF4 base is quantised and loaded on the device; use "
                    "--offload optimizer";
         }},
        {"--pipeline-chunks, --pipeline-schedule",
         [](const TrainOptions& o, int) -> std::string {
             if (o.pipeline_chunks == 0 || o.pipeline_schedule == "interleaved") return "";
             return "--pipeline-chunks " + std::to_string(o.pipeline_chunks) +
                    " is for --pipeline-schedule interleaved: drop it, or choose that schedule";
         }},
        {"--sequence-parallel, --tp, --micro-batch, --seq-len",
         [](const TrainOptions& o, int) -> std::string {
             const long long rows = (long long)o.micro_batch * o.seq_len;
             if (!o.sequence_parallel || o.tp <= 1 || rows % o.tp == 0) return "";
             return "--sequence-parallel over --tp " + std::to_string(o.tp) + " splits a micro-batch's " +
                    std::to_string(rows) + " tokens (--micro-batch " + std::to_string(o.micro_batch) +
                    " x --seq-len " + std::to_string(o.seq_len) + ") by rows, which " + std::to_string(o.tp) +
                    " does not divide: give a micro-batch or sequence length that makes a multiple of " +
                    std::to_string(o.tp);
         }},
        // The parallel layer's rules (parallel/plan.h check_strategy): a strategy's flags against
        // each other and against the world size.
        {"--parallel and its flags, the ranks",
         [](const TrainOptions& o, int ranks) -> std::string {
             if (o.parallel == "auto") return "";  // checked once auto has chosen
             try {
                 check_strategy(strategy_options(o, ranks), ranks);
             } catch (const std::invalid_argument& e) {
                 return e.what();
             }
             return "";
         }},
    };
    return rules;
}

void check_option_rules(const TrainOptions& o, int ranks) {
    for (const OptionRule& r : option_rules())
        if (std::string p = r.problem(o, ranks); !p.empty()) throw std::invalid_argument(p);
}

}  // namespace pv
