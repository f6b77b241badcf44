// Command-line parsing for `train` with CLI11: each flag documents itself and its default in
// --help, in groups. The JSON form of TrainOptions (checkpoints) uses nlohmann/json with one field
// list. --run's file (trainer/run_file.h) is applied flag by flag through the same CLI11 options,
// so a run file can set exactly what the command line can, checked the same way.
#include "trainer/options.h"

#include "data/chat.h"
#include "parallel/layout_search.h"
#include "parallel/planner.h"
#include "trainer/option_rules.h"
#include "trainer/run_file.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace pv {

namespace {

// The rates of the layout search's Interconnect a flag can state, in GB/s (0 keeps its figure):
// one row per flag, registered below and applied by apply_link_rate_flags. Here, not in a header
// that nvcc's translation units include: nvcc's front end writes a pointer-to-member declaration
// back with parentheses that g++ then warns about.
struct LinkRateFlag {
    const char* flag;
    double TrainOptions::*option;
    double Interconnect::*rate;  // bytes/s
    const char* help;
};
constexpr LinkRateFlag kLinkRateFlags[] = {
    {"--intra-node-gbs", &TrainOptions::intra_node_gbs, &Interconnect::intra_node,
     "GB/s a collective or a send reaches between two GPUs of a node (0: NVLink 4, 450 at 0.7 = 315)"},
    {"--inter-node-gbs", &TrainOptions::inter_node_gbs, &Interconnect::inter_node,
     "GB/s per GPU between nodes (0: --interconnect's figure)"},
    {"--pcie-gbs", &TrainOptions::pcie_gbs, &Interconnect::pcie,
     "GB/s between a GPU and its host, for offload's copies (0: PCIe 5.0 x16, 64 at 0.7)"},
    {"--host-memory-gbs", &TrainOptions::host_memory_gbs, &Interconnect::host_memory,
     "GB/s of a node's host memory for the offloaded update, shared by its ranks (0: 17, measured on a "
     "16-core H100 host)"},
};

}  // namespace

void apply_link_rate_flags(const TrainOptions& o, Interconnect& link) {
    for (const LinkRateFlag& f : kLinkRateFlags)
        if (o.*f.option > 0) link.*f.rate = o.*f.option * 1e9;
}

// Every training option as JSON (trainer_state.json, the run file's keys), each key its field's
// name, a key missing (an older checkpoint) read as the default. Written out rather than with
// nlohmann's NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT, which takes at most 63 fields.
#define PV_TRAIN_OPTION_FIELDS(X)                                                                                      \
    X(preset)                                                                                                          \
    X(config) X(init_from) X(data) X(val_data) X(vocab) X(steps) X(batch) X(micro_batch) X(accumulation) X(seq_len)    \
        X(lr) X(schedule) X(warmup) X(warmup_ratio) X(epochs) X(schedule_steps) X(final_lr_fraction) X(clip)           \
            X(skip_nonfinite) X(weight_decay) X(decay_norm_weights) X(beta1) X(beta2) X(eps) X(dtype)                  \
                X(stochastic_rounding) X(fp32_grad_accumulation) X(seed) X(parallel) X(interconnect) X(gpus_per_node)  \
                    X(intra_node_gbs) X(inter_node_gbs) X(pcie_gbs) X(host_memory_gbs) X(pipeline_stages) X(in_flight) \
                        X(pipeline_schedule) X(pipeline_chunks) X(balance) X(shard_group) X(tp) X(sequence_parallel)   \
                            X(freeze) X(eval_interval) X(eval_batches) X(out_dir) X(checkpoint_interval) X(resume)     \
                                X(stop_after) X(prompt) X(sample_tokens) X(temperature) X(top_p) X(document_mask)      \
                                    X(lora_rank) X(lora_alpha) X(rslora) X(lora_targets) X(lora_dropout) X(adapter)    \
                                        X(quantize) X(double_quant) X(checkpoint_activations) X(offload)               \
                                            X(keep_checkpoints) X(cuda_graphs)

void to_json(nlohmann::json& j, const TrainOptions& o) {
#define PV_OPTION_TO_JSON(field) j[#field] = o.field;
    PV_TRAIN_OPTION_FIELDS(PV_OPTION_TO_JSON)
#undef PV_OPTION_TO_JSON
}

void from_json(const nlohmann::json& j, TrainOptions& o) {
    const TrainOptions defaults;
#define PV_OPTION_FROM_JSON(field) o.field = j.value(#field, defaults.field);
    PV_TRAIN_OPTION_FIELDS(PV_OPTION_FROM_JSON)
#undef PV_OPTION_FROM_JSON
}

namespace {

// A CLI11 check of a number against a rule (trainer/option_rules.h): the same message as the
// training options' ("must be a finite number in [0, 1]"), NaN and infinities refused.
CLI::Validator number_check(NumberRule rule) {
    return CLI::Validator(
        [rule](const std::string& text) -> std::string {
            double value = NAN;
            try {
                size_t used = 0;
                value = std::stod(text, &used);
                if (used != text.size()) return text + ": not a number";
            } catch (const std::exception&) {
                return text + ": not a number";
            }
            const std::string problem = number_problem(value, rule);
            return problem.empty() ? "" : text + ": " + problem;
        },
        "");
}

// CLI11 reads an integer with strtoll/strtoull in base 0: 2^64 saturates to the type's maximum,
// -1 wraps to 2^64 - 1 for an unsigned option and 010 is octal 8. Every integer option of every
// command reads decimal digits instead, exactly, or is refused; the text is rewritten to its
// canonical form ("007" -> "7") so CLI11's own conversion then agrees.
CLI::Validator integer_text(bool is_unsigned) {
    return CLI::Validator(
        [is_unsigned](std::string& text) -> std::string {
            const char* begin = text.data();
            const char* end = begin + text.size();
            const char* type = is_unsigned ? "an integer in [0, 18446744073709551615]"
                                           : "an integer in [-9223372036854775808, 9223372036854775807]";
            std::from_chars_result r{};
            std::string canonical;
            if (is_unsigned) {
                uint64_t v = 0;
                r = std::from_chars(begin, end, v);
                canonical = std::to_string(v);
            } else {
                int64_t v = 0;
                r = std::from_chars(begin, end, v);
                canonical = std::to_string(v);
            }
            if (r.ec == std::errc::result_out_of_range) return text + ": out of range: must be " + type;
            if (r.ec != std::errc() || r.ptr != end) return text + ": must be " + type + ", in decimal digits";
            text = canonical;
            return "";
        },
        "");
}

// Puts integer_text on every option that takes an integer, in `app` and its subcommands.
void check_integer_texts(CLI::App& app) {
    for (CLI::Option* opt : app.get_options()) {
        if (opt->get_type_size_min() < 1) continue;  // a flag: no value to read
        const std::string type = opt->get_type_name();
        // transform, not check: it may rewrite the text, and runs before the option's own checks.
        if (type == "INT" || type.rfind("INT:", 0) == 0) opt->transform(integer_text(false));
        if (type == "UINT" || type.rfind("UINT:", 0) == 0) opt->transform(integer_text(true));
    }
    for (CLI::App* sub : app.get_subcommands({})) check_integer_texts(*sub);
}

std::string choice_list(const std::vector<std::string>& choices, const char* between = ", ") {
    std::string out;
    for (const std::string& c : choices) out += (out.empty() ? "" : between) + (c.empty() ? std::string("\"\"") : c);
    return out;
}

// A CLI11 check that a value is one of `choices`, with the nearest as a suggestion ("--dtype: bf61
// is not one of bf16, fp32, fp64; did you mean bf16?").
CLI::Validator choice_check(const std::vector<std::string>& choices) {
    return CLI::Validator(
        [choices](const std::string& text) -> std::string {
            if (std::find(choices.begin(), choices.end(), text) != choices.end()) return "";
            return (text.empty() ? std::string("\"\"") : text) + " is not one of " + choice_list(choices) +
                   did_you_mean(text, choices);
        },
        "{" + choice_list(choices, ",") + "}");
}

// An existing directory, or empty (the option's "none", as a run file or a resolved run.yaml writes it).
const CLI::Validator directory_or_empty(
    [](std::string& path) { return path.empty() ? std::string() : CLI::ExistingDirectory(path); }, "DIR");

// The --help groups of the training flags, in the order --help shows them.
const std::vector<std::pair<std::string, std::vector<std::string>>>& train_flag_groups() {
    static const std::vector<std::pair<std::string, std::vector<std::string>>> groups{
        {"Data", {"data", "val-data", "seq-len", "document-mask", "batch", "micro-batch", "accumulation"}},
        {"Model",
         {"preset", "config", "init-from", "vocab", "dtype", "freeze", "checkpoint-activations",
          "no-checkpoint-activations"}},
        {"Optimisation",
         {"steps", "epochs", "lr", "schedule", "warmup", "warmup-ratio", "final-lr-fraction", "clip", "skip-nonfinite",
          "weight-decay", "decay-norm-weights", "beta1", "beta2", "eps", "stochastic-rounding",
          "fp32-grad-accumulation", "seed"}},
        {"LoRA/QLoRA",
         {"lora-rank", "lora-alpha", "rslora", "lora-targets", "lora-dropout", "quantize", "double-quant", "adapter"}},
        {"Parallel",
         {"parallel", "interconnect", "gpus-per-node", "intra-node-gbs", "inter-node-gbs", "pcie-gbs",
          "host-memory-gbs", "gpu-memory", "pipeline-stages", "pipeline-schedule", "pipeline-chunks", "in-flight",
          "balance", "shard-group", "tp", "sequence-parallel", "offload", "collective-timeout", "cuda-graphs"}},
        {"Checkpoints",
         {"checkpoint-interval", "resume", "allow-inexact-resume", "stop-after", "keep-checkpoints", "overwrite-later",
          "extend-schedule", "keep-schedule"}},
        {"Output",
         {"out-dir", "overwrite", "eval-interval", "eval-batches", "prompt", "sample-tokens", "temperature", "top-p"}},
    };
    return groups;
}

// Puts each training flag in its group; a flag in none is a programming error (a new flag must
// say where --help shows it).
void group_train_flags(CLI::App& app) {
    for (CLI::Option* opt : app.get_options()) {
        if (opt->get_lnames().empty() || opt->get_lnames()[0] == "help" || opt->get_lnames()[0] == "run" ||
            opt->get_lnames()[0] == "version" || opt->get_group().empty())  // hidden: an old name refused
            continue;
        bool placed = false;
        for (const auto& [group, names] : train_flag_groups())
            if (std::find(names.begin(), names.end(), opt->get_lnames()[0]) != names.end())
                opt->group(group), placed = true;
        if (!placed) throw std::logic_error("--" + opt->get_lnames()[0] + " is in no --help group (train_flag_groups)");
    }
}

void add_train_flags(CLI::App& app, TrainOptions& o, std::string* run_file = nullptr) {
    if (run_file)
        app.add_option("--run", *run_file,
                       "A YAML run file of training flags (lora_rank: 8, or Hugging Face names such as "
                       "learning_rate): flags on the command line override its values (docs/run-files.md)")
            ->check(CLI::ExistingFile);
    app.add_option(
        "--data", o.data,
        "Training data: a directory made by `train prepare` or one token shard (empty: the built-in corpus)");
    app.add_option("--val-data", o.val_data,
                   "Validation shard (empty: the data directory's val.pvtokens, or the "
                   "built-in corpus's held-out tail)");
    app.add_option("--preset", o.preset, "Model preset (empty: a small default model sized to the tokenizer)");
    app.add_option("--config", o.config, "A Hugging Face config.json giving the model's shape (instead of --preset)");
    app.add_option("--init-from", o.init_from,
                   "Start from a Hugging Face model directory (config.json, model.safetensors or sharded "
                   "safetensors, tokenizer.json): its shape, weights (converted to --dtype) and tokenizer; fresh "
                   "optimizer state, step 0. Not with --preset, --config or --resume")
        ->check(directory_or_empty);
    app.add_option("--vocab", o.vocab, "Vocabulary size of the tokenizer trained on the built-in corpus");
    app.add_option("--steps", o.steps, "Optimizer steps (the learning-rate schedule spans them)");
    app.add_option("--epochs", o.epochs,
                   "Train this many passes over the training data: --steps becomes ceil(epochs x training windows / "
                   "--batch), printed at the start")
        ->excludes("--steps");
    app.add_option("--batch", o.batch,
                   "Global batch: sequences per optimizer step (= micro-batch x accumulation x ranks)");
    app.add_option("--micro-batch", o.micro_batch,
                   "Sequences per forward/backward pass (0: the largest divisor of batch / ranks that is at most 8, "
                   "so the same --batch works at any rank count)");
    app.add_option("--accumulation", o.accumulation,
                   "Micro-batches per optimizer step on each rank (Hugging Face's gradient_accumulation_steps), "
                   "instead of --batch: the global batch becomes micro-batch x accumulation x ranks (needs "
                   "--micro-batch; 0: --batch decides)");
    app.add_option("--seq-len", o.seq_len,
                   "Tokens per sequence (0: from the data's longest example, up to the model's "
                   "max_position_embeddings; the default with --init-from)");
    app.add_flag("--document-mask", o.document_mask,
                 "Let each token attend only to its own document within the sequence, positions restarting at 0 "
                 "at each document (packed chats otherwise see unrelated conversations); the target predicting "
                 "the next document's first token does not count");
    app.add_option("--lr", o.lr, "Peak learning rate");
    app.add_option("--schedule", o.schedule, "Learning-rate schedule after warmup: constant, cosine, linear or wsd")
        ->check(choice_check(option_choices("schedule")));
    app.add_option("--warmup", o.warmup, "Warmup steps (lr * (step + 1) / warmup)");
    app.add_option("--warmup-ratio", o.warmup_ratio,
                   "Warmup as a fraction of the steps (Hugging Face's warmup_ratio: ceil(ratio x steps) steps); "
                   "replaces --warmup when > 0")
        ->excludes("--warmup");
    app.add_flag("--extend-schedule", o.extend_schedule,
                 "With --resume and another --steps: stretch the learning-rate schedule over the new --steps (the "
                 "learning rate jumps to where the new schedule is at the resumed step)");
    app.add_flag("--keep-schedule", o.keep_schedule,
                 "With --resume and another --steps: keep the original schedule; steps past its end run at its "
                 "final learning rate")
        ->excludes("--extend-schedule");
    app.add_option("--final-lr-fraction", o.final_lr_fraction, "Final learning rate as a fraction of the peak");
    app.add_option("--clip", o.clip, "Clip the global gradient norm to this (0: no clipping)");
    app.add_option("--skip-nonfinite", o.skip_nonfinite,
                   "Pass over up to this many steps whose loss or gradient norm is NaN or infinite (nothing is "
                   "updated; the step still counts) before such a step ends the run");
    app.add_option("--weight-decay", o.weight_decay,
                   "AdamW decoupled weight decay (matrices only unless "
                   "--decay-norm-weights)");
    app.add_flag("--decay-norm-weights", o.decay_norm_weights, "Apply weight decay to the RMSNorm weights too");
    app.add_option("--beta1", o.beta1, "AdamW beta1");
    app.add_option("--beta2", o.beta2, "AdamW beta2");
    app.add_option("--eps", o.eps, "AdamW epsilon (outside the square root)");
    app.add_option("--dtype", o.dtype, "Storage type of parameters, activations and gradients: bf16, fp32 or fp64")
        ->check(choice_check(option_choices("dtype")));
    app.add_flag("--stochastic-rounding", o.stochastic_rounding,
                 "bf16: round the fp32 master weights to bf16 stochastically (Philox-keyed, reproducible) instead of "
                 "to nearest");
    app.add_flag("--fp32-grad-accumulation", o.fp32_grad_accumulation,
                 "bf16: accumulate gradients over micro-steps in an fp32 buffer (costs 4 bytes per parameter)");
    app.add_option("--seed", o.seed, "Seed of initialisation, data order, stochastic rounding and sampling");
    std::string strategies;
    for (const StrategyInfo& s : strategy_registry())
        strategies += std::string(strategies.empty() ? "" : ", ") + s.name + " (" + s.help + ")";
    app.add_option("--parallel", o.parallel,
                   "Strategy over the ranks of mpirun: auto (from the memory plan: single on one rank, ddp if the "
                   "replicas fit, else the cheapest ZeRO stage that fits, else pp), " +
                       strategies + "; mp is pp's old name")
        ->transform([](std::string name) { return canonical_strategy_name(name); }, "")
        ->check(choice_check(option_choices("parallel")));
    // The in-flight count's old name, one letter from --micro-batch in spelling and far from it in
    // meaning: refused with the new one (hidden from --help).
    app.add_option_function<std::string>(
           "--microbatches",
           [](const std::string& v) {
               throw CLI::ValidationError("--microbatches", "--microbatches " + v +
                                                                ": the micro-batches in flight per pipeline stage are "
                                                                "now --in-flight " + v);
           },
           "")
        ->group("");
    app.add_option("--interconnect", o.interconnect,
                   "For --parallel auto's layout search: between nodes, fast (one 400 Gb/s InfiniBand adapter per "
                   "GPU, 35 GB/s) or slow (100 Gb/s Ethernet, 8.75 GB/s)")
        ->check(choice_check(option_choices("interconnect")));
    app.add_option("--gpus-per-node", o.gpus_per_node,
                   "For --parallel auto's layout search: GPUs per node, a tensor-parallel group staying in one (0: "
                   "the fewest ranks mpirun put on a node; train plan: 8)")
        ->check(number_check(whole_number(0, 1024)));
    for (const LinkRateFlag& f : kLinkRateFlags)
        app.add_option(f.flag, o.*f.option, std::string("For --parallel auto's layout search: ") + f.help)
            ->check(number_check(real_number(0, 1e6)));
    std::string gpus;
    for (const std::string& g : gpu_names()) gpus += (gpus.empty() ? "" : ", ") + g;
    app.add_option("--gpu-memory", o.gpu_memory,
                   "Memory per rank the plan is checked against: a GPU (" + gpus +
                       ") or bytes (80GiB, 24GB, 16e9); empty: this device's (the host backend: this machine's "
                       "memory shared by its ranks)");
    app.add_option("--freeze", o.freeze,
                   "Keep these tensors fixed: comma-separated globs over Hugging Face tensor names, e.g. "
                   "'model.embed_tokens.*,*.input_layernorm.*' (no gradient, master or optimizer state; gradients "
                   "still flow through them)");
    app.add_option("--lora-rank", o.lora_rank,
                   "LoRA: train rank-r adapters on every targeted linear and freeze the whole base (0: full "
                   "fine-tuning)");
    app.add_option("--lora-alpha", o.lora_alpha, "LoRA: the adapters' scale is alpha / rank (PEFT's lora_alpha)");
    app.add_flag("--rslora", o.rslora, "LoRA: scale by alpha / sqrt(rank) instead (rank-stabilised LoRA)");
    app.add_option("--lora-targets", o.lora_targets,
                   "LoRA: the modules that get adapters, comma-separated from "
                   "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    app.add_option("--lora-dropout", o.lora_dropout,
                   "LoRA: dropout on the adapters' input (Philox-keyed by seed, step and the token's global row: "
                   "the same at every world size)");
    app.add_option("--quantize", o.quantize,
                   "QLoRA: store the frozen base's linear weights (every block's q/k/v/o/gate/up/down) as NF4, "
                   "exactly as bitsandbytes' quantize_4bit, dequantised before each GEMM (needs --lora-rank)")
        ->check(choice_check(option_choices("quantize")));
    app.add_flag("--double-quant,!--no-double-quant", o.double_quant,
                 "NF4: quantise the absmaxes too (8 bits, blocks of 256: 4.127 bits per parameter instead of 4.5)");
    app.add_option("--adapter", o.adapter,
                   "LoRA: continue training a PEFT adapter directory (adapter_config.json, "
                   "adapter_model.safetensors) on the base given by --init-from; its rank, alpha, rsLoRA and "
                   "targets become the run's")
        ->check(directory_or_empty);
    app.add_option("--pipeline-stages", o.pipeline_stages,
                   "ddp/zero1-3: cut the model into this many pipeline stages (outermost on the mesh: stage s is "
                   "ranks s*N/P .. (s+1)*N/P - 1) and replicate each over its N/P ranks, whose gradients the strategy "
                   "reduces as it would without stages; must divide the ranks. 0: --parallel pp's one stage per "
                   "rank, no pipeline otherwise");
    app.add_option(
           "--in-flight", o.in_flight,
           "pipeline: at most this many micro-batches in flight per stage (gpipe: groups of that many forwards, "
           "then their backwards, 1 = naive model parallel; 1f1b: a shorter warm-up). 0: the schedule's own "
           "(gpipe: every micro-batch of the step; 1f1b: p - r on stage r)");
    app.add_option("--pipeline-schedule", o.pipeline_schedule,
                   "pp: the pipeline schedule: 1f1b (warm-up forwards, then one forward and one backward in turn; "
                   "stage r holds at most p - r micro-batches), gpipe (all forwards, then all backwards) or "
                   "interleaved (1f1b over --pipeline-chunks model chunks per rank: a smaller bubble, more "
                   "transfers); the same gradients under each")
        ->check(choice_check(option_choices("pipeline_schedule")));
    app.add_option("--pipeline-chunks", o.pipeline_chunks,
                   "pp with --pipeline-schedule interleaved: model chunks per rank (Megatron's virtual stages; "
                   "rank r runs stages r, r + p, ...). 0: 2");
    app.add_option("--checkpoint-activations", o.checkpoint_activations,
                   "Activation checkpointing: a transformer block keeps only its output during the forward and "
                   "recomputes its activations just before its backward (one more forward of the recomputed "
                   "blocks; the gradients are bitwise the same). Alone: every block recomputes. =N (N >= 2): one "
                   "block in N keeps its activations (0-based block i when i % N == N - 1), the others recompute. "
                   "=auto: the fewest blocks (the first ones) that make the memory plan fit --gpu-memory (none "
                   "when it fits without), chosen again on resume. Default: off")
        ->expected(0, 1)
        ->default_str("0")
        ->option_text("[=N|auto]")
        ->type_name("N|auto")  // not INT: check_integer_texts would refuse "auto"; this reads N itself
        // One transform that checks and converts (CLI11 runs transforms before checks): auto is
        // kCheckpointActivationsAuto, N its canonical decimal text (CLI11 reads 010 as octal).
        ->transform([](const std::string& value) -> std::string {
            if (value == "auto") return std::to_string(kCheckpointActivationsAuto);
            int n = 0;
            const auto r = std::from_chars(value.data(), value.data() + value.size(), n);
            if (r.ec == std::errc() && r.ptr == value.data() + value.size() && (n == 0 || n >= 2))
                return std::to_string(n);
            throw CLI::ValidationError("--checkpoint-activations=" + value +
                                       ": give no value (every block recomputes), N >= 2 (one block in N keeps its "
                                       "activations) or auto (the fewest blocks that fit)");
        });
    app.add_flag_callback(
           "--no-checkpoint-activations", [&o] { o.checkpoint_activations = -1; },
           "Turn activation checkpointing off (a resumed run's setting)")
        ->excludes("--checkpoint-activations");
    app.add_option("--balance", o.balance,
                   "pp: balance the stages by training FLOPs (flops) or by parameter count (params)")
        ->check(choice_check(option_choices("balance")));
    app.add_option("--shard-group", o.shard_group,
                   "zero1/zero2/zero3: shard within groups of this many consecutive ranks and replicate across the "
                   "groups (hybrid sharding, FSDP's HSDP): gradients reduce-scattered within a group then all-reduced "
                   "across groups, parameters gathered within the group only. Must divide the rank count; 0: the "
                   "whole world (plain ZeRO), 1: replication (DDP's traffic, ZeRO's code)");
    app.add_option("--tp", o.tp,
                   "Tensor parallelism (Megatron): groups of this many consecutive ranks split every block's "
                   "matrices (attention by heads, the MLP by its ffn rows and columns) and the embedding and head "
                   "by vocabulary rows, and compute each micro-batch together: two all-reduces per block forward "
                   "and two backward, the vocabulary-parallel cross-entropy gathering 3 values a token; the "
                   "data-parallel strategy (ddp, zero1-3) runs over the groups. Must divide the rank count, the "
                   "query heads and the ffn size, and divide the key/value heads or keep each rank's query heads "
                   "within one of them (which is then replicated); 1: none");
    app.add_flag("--sequence-parallel", o.sequence_parallel,
                 "With --tp: sequence parallelism (Megatron) - between the tensor-parallel regions the residual "
                 "stream, the RMSNorms and the residual adds hold 1/tp of a micro-batch's rows on each rank: the "
                 "norms' outputs all-gathered before the column-parallel linears, the row-parallel linears' "
                 "outputs reduce-scattered (the all-reduces' bytes), activation memory outside the GEMMs divided "
                 "by tp. The micro-batch's tokens (micro-batch x sequence length) must divide by tp");
    app.add_flag("--cuda-graphs", o.cuda_graphs,
                 "Capture each micro-step (its forward and backward, every kernel and GEMM) once as a CUDA graph "
                 "and launch it as one graph from then on: the same results bit for bit, the kernels' launch cost "
                 "paid once. Every strategy: a micro-step's collectives are captured with its kernels, and under "
                 "a pipeline each entry of the schedule (a forward or a backward) is captured alone with the "
                 "transfers before it; the model's cuBLAS handle gets a 32 MiB workspace");
    app.add_option("--offload", o.offload,
                   "CPU offload (ZeRO-Offload): optimizer keeps the fp32 master and Adam m and v of this rank's "
                   "owned range in pinned host memory and runs AdamW on the CPU (single, ddp, zero1-3); params also "
                   "keeps zero3's parameter slices in host memory (zero3 only). none: everything on the device")
        ->check(choice_check(option_choices("offload")));
    app.add_option("--eval-interval", o.eval_interval,
                   "Evaluate on the validation data every this many steps (0: never)");
    app.add_option("--eval-batches", o.eval_batches, "Micro-batches per evaluation");
    app.add_option("--out-dir", o.out_dir, "Output directory (metrics.jsonl, tokenizer.json, step_N checkpoints)");
    app.add_option("--checkpoint-interval", o.checkpoint_interval,
                   "Write a checkpoint every this many steps (0: only at the end)");
    app.add_option("--resume", o.resume,
                   "Continue from a checkpoint: a step_N directory, or an output directory (its latest checkpoint). "
                   "Flags not given are taken from the checkpoint")
        ->check(directory_or_empty);
    app.add_flag("--allow-inexact-resume", o.allow_inexact_resume,
                 "With --resume: accept a checkpoint without master.safetensors, adam_m.safetensors or "
                 "adam_v.safetensors, starting that state fresh (the run then does not continue bit for bit)");
    app.add_option("--stop-after", o.stop_after,
                   "Stop after this many steps of this invocation, writing a checkpoint (0: run to --steps)");
    app.add_option("--keep-checkpoints", o.keep_checkpoints,
                   "Keep only the newest K checkpoints of the output directory, deleting older ones once a newer "
                   "one is complete (0: keep all)");
    app.add_flag("--overwrite-later", o.overwrite_later,
                 "With --resume DIR/step_N: remove DIR's checkpoints after step N and its metrics past step N "
                 "before continuing there (without it, such a branch is refused unless --out-dir names another "
                 "directory)");
    app.add_flag("--overwrite", o.overwrite,
                 "Remove the run already in --out-dir (its metrics.jsonl and step_N checkpoints; nothing else) "
                 "once this run has loaded, instead of refusing to write there");
    app.add_option("--collective-timeout", o.collective_timeout,
                   "Seconds a rank waits in one collective for a rank that does not arrive before every rank stops "
                   "with a message naming it (under mpirun; a single process has no collectives). Not saved in "
                   "checkpoints")
        ->check(number_check(real_number(1, 604800)));
    app.add_option("--prompt", o.prompt, "Prompt of the sample generated at the end");
    app.add_option("--sample-tokens", o.sample_tokens, "Tokens to generate at the end (0: none)");
    app.add_option("--temperature", o.temperature, "Sampling temperature (0: greedy)");
    app.add_option("--top-p", o.top_p, "Nucleus sampling: the smallest set of tokens with this much probability");
    group_train_flags(app);
}

// The model directory both inference commands take (trainer/model_dir.h).
void add_model_argument(CLI::App& app, std::string& model) {
    app.add_option("model", model,
                   "A polevault checkpoint (a step_N directory, or an output directory: its latest checkpoint) or a "
                   "Hugging Face model directory (config.json and safetensors weights)")
        ->required()
        ->check(CLI::ExistingDirectory);
}

void add_dtype_flag(CLI::App& app, std::string& dtype) {
    app.add_option("--dtype", dtype,
                   "Storage type the weights are converted to on load: bf16, fp32 or fp64 (default: a checkpoint's "
                   "own; a Hugging Face model's torch_dtype, bfloat16 -> bf16, float32 and float16 -> fp32)")
        ->check(choice_check({"bf16", "fp32", "fp64"}));
}

void add_sample_flags(CLI::App& app, SampleOptions& o) {
    add_model_argument(app, o.model);
    app.add_option("--prompt", o.prompt,
                   "Text to continue (empty: start from the model's beginning-of-sequence token, else its "
                   "end-of-sequence token)");
    app.add_option("--prompt-ids", o.prompt_ids,
                   "Token ids to continue, comma-separated (instead of --prompt; needs no tokenizer)")
        ->delimiter(',')
        ->excludes(app.get_option("--prompt"));
    app.add_option("--max-tokens", o.max_tokens,
                   "Tokens to generate; prompt + max tokens must fit the model's max_position_embeddings (0: up to " +
                       std::to_string(kDefaultSampleTokens) + ", as many as fit)")
        ->check(number_check(whole_number(0)));
    app.add_option("--temperature", o.temperature, "Sampling temperature (0: greedy)")->check(number_check(real_number(0)));
    app.add_option("--top-p", o.top_p, "Nucleus sampling: the smallest set of tokens with this much probability")
        ->check(number_check(real_number(0, 1, true)));
    app.add_option("--seed", o.seed, "Seed of the sampling");
    add_dtype_flag(app, o.dtype);
    app.add_flag("--print-ids", o.print_ids,
                 "Print the generated token ids as one JSON array on the last line of standard output (works "
                 "without a tokenizer)");
    app.add_flag("--chat", o.chat,
                 "Send --prompt as one user turn in the model's chat format and let the model write the "
                 "assistant's answer");
    app.add_option("--chat-format", o.chat_format,
                   "With --chat: the chat format (" + chat_format_list() +
                       "); default: recognised from the model's tokenizer_config.json chat_template");
}

void add_eval_flags(CLI::App& app, EvalOptions& o) {
    add_model_argument(app, o.model);
    app.add_option("--data", o.data,
                   "Prepared data: a `train prepare` directory (its validation shard, else its training shards) or "
                   "one .pvtokens shard")
        ->required()
        ->check(CLI::ExistingPath);
    add_dtype_flag(app, o.dtype);
    app.add_option("--seq-len", o.seq_len,
                   "Tokens per window (0: a checkpoint's training window, else min(max_position_embeddings, 1024))")
        ->check(number_check(whole_number(0)));
    app.add_option("--batch", o.batch, "Windows per forward pass (0: a checkpoint's micro-batch, else 1)")
        ->check(number_check(whole_number(0)));
    app.add_option("--max-windows", o.max_windows,
                   "Evaluate only the first this many windows (0: all; -1: the windows a checkpoint's run evaluated, "
                   "--eval-batches x --micro-batch, so the loss is its last validation loss; all for a Hugging "
                   "Face model)")
        ->check(number_check(whole_number(-1, 9223372036854775807.0)));
    app.add_flag_callback(
        "--document-mask", [&o] { o.document_mask = 1; },
        "Each window's documents attend only to themselves (default: as the checkpoint was trained)");
    app.add_flag_callback(
           "--no-document-mask", [&o] { o.document_mask = 0; }, "Windows attend across documents")
        ->excludes("--document-mask");
}

void add_prepare_flags(CLI::App& app, PrepareOptions& o) {
    app.add_option("inputs", o.inputs,
                   "Input files: *.jsonl / *.ndjson hold one JSON object per line: {\"text\": ...} (or the --field), "
                   "{\"prompt\": ..., \"completion\": ...} or {\"messages\": [{\"role\": ..., \"content\": ...}]}; "
                   "anything else is plain text, one document per file")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_option("--out", o.out_dir, "Output directory (train_NNNNNN.pvtokens, val.pvtokens, tokenizer.json)")
        ->required();
    app.add_option("--field", o.text_field, "The JSON-lines field holding a document's text");
    app.add_option("--tokenizer", o.tokenizer, "Use this tokenizer.json instead of training one")
        ->check(CLI::ExistingFile);
    app.add_option("--vocab", o.vocab, "Vocabulary size of the tokenizer trained on the inputs")
        ->check(number_check(whole_number(257, 1 << 20)));
    app.add_option("--val-fraction", o.val_fraction, "Fraction of the tokens held out for validation (the tail)")
        ->check(number_check(real_number(0, 0.5)));
    app.add_option("--shard-tokens", o.shard_tokens, "Most tokens per training shard")->check(number_check(whole_number(1, 9223372036854775807.0)));
    app.add_option("--chat-format", o.chat_format,
                   "How chats ({\"messages\": [...]}) are written: " + chat_format_list() +
                       " (default: the tokenizer's own template, chat_template.jinja or tokenizer_config.json's "
                       "chat_template beside --tokenizer)")
        ->check(choice_check(chat_format_names()));
    app.add_option("--chat-template", o.chat_template,
                   "A Jinja chat template file (.jinja) to render chats with, as transformers' apply_chat_template "
                   "does; wins over --chat-format and the tokenizer's own")
        ->check(CLI::ExistingFile);
    app.add_option("--truncate", o.truncate,
                   "Cut a chat or prompt/completion longer than this many tokens to its first this many (give the "
                   "--seq-len you will train with, plus 1); 0: keep it whole, and training leaves out those longer "
                   "than a window")
        ->check(number_check(whole_number(0, 9223372036854775807.0)));
    app.add_flag("--train-on-prompt", o.train_on_prompt,
                 "Train on every token, not only on completions and assistant turns (system, user and prompt "
                 "tokens count too)");
}

void add_convert_flags(CLI::App& app, ConvertOptions& o) {
    app.add_option("--from", o.from, "The format of the input: llama2c (karpathy/llama2.c's model.bin, as run.c reads)")
        ->required()
        ->check(choice_check({"llama2c"}));
    app.add_option("input", o.input, "The checkpoint to convert")->required()->check(CLI::ExistingFile);
    app.add_option("--out", o.out_dir,
                   "Output directory (a new or empty one): config.json, model.safetensors, generation_config.json")
        ->required();
}

void add_export_flags(CLI::App& app, ExportOptions& o) {
    app.add_option("checkpoint", o.checkpoint,
                   "A checkpoint (a step_N directory, or an output directory: its latest checkpoint), or a Hugging "
                   "Face model directory (to convert its dtype or join its shards)")
        ->required()
        ->check(CLI::ExistingDirectory);
    CLI::Option* out = app.add_option("--out", o.out_dir,
                                      "Output directory (a new or empty one): model.safetensors, config.json, "
                                      "tokenizer files, generation_config.json; no optimizer state");
    CLI::Option* peft =
        app.add_option("--peft", o.peft_out,
                       "A LoRA checkpoint's adapters as a PEFT adapter directory "
                       "(adapter_model.safetensors, adapter_config.json) for PeftModel.from_pretrained");
    CLI::Option* merged = app.add_option(
        "--merged", o.merged_out,
        "A LoRA checkpoint's base with the adapters folded in (W + s·B·A) as a Hugging Face model directory");
    app.add_flag("--quantized", o.quantized,
                 "With --merged: every block linear quantised to NF4 and written as bitsandbytes stores it "
                 "(from_pretrained loads a 4-bit model); double quantisation as the run's (on unless QLoRA "
                 "trained --no-double-quant)")
        ->needs(merged);
    out->excludes(peft)->excludes(merged);
    peft->excludes(merged);
    app.callback([&o] {
        if (o.out_dir.empty() && o.peft_out.empty() && o.merged_out.empty())
            throw CLI::RequiredError("one of --out, --peft or --merged");
    });
    app.add_option("--dtype", o.dtype, "Convert the weights to bf16, fp32 or fp64 (default: as stored)")
        ->check(choice_check({"bf16", "fp32", "fp64"}));
}

void add_tokenize_flags(CLI::App& app, TokenizeOptions& o) {
    app.add_option("--tokenizer", o.tokenizer,
                   "A Hugging Face tokenizer.json (tokenizer_config.json beside it gives BOS and EOS)")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_flag("--add-special", o.add_special,
                 "Add the tokens the post-processor adds (BOS for most Llama files), as "
                 "encode(text, add_special_tokens=True)");
    app.add_flag("!--no-parse-special", o.parse_special,
                 "Treat special-token strings in the text (e.g. <|begin_of_text|>) as plain text instead of their ids");
    app.add_flag("--decode", o.decode, "Read a JSON array of ids on stdin and print their text (no newline added)");
    app.add_option("--render", o.render,
                   "Show the first examples of a JSON-lines file as `train prepare` encodes them, the tokens that "
                   "count as training targets wrapped in ⟦ ⟧ (instead of reading stdin)")
        ->check(CLI::ExistingFile);
    app.add_option("--examples", o.render_examples, "With --render: how many examples to show")
        ->check(number_check(whole_number(1)));
    app.add_option("--chat-format", o.chat_format,
                   "With --render: a built-in chat template (" + chat_format_list() +
                       "); default: the tokenizer's own (chat_template.jinja or tokenizer_config.json's)");
    app.add_option("--chat-template", o.chat_template,
                   "With --render: a Jinja chat template file, as prepare --chat-template takes it")
        ->check(CLI::ExistingFile);
    app.add_flag("--train-on-prompt", o.train_on_prompt,
                 "With --render: count the prompt tokens too, as prepare would");
    app.add_flag("--colour", o.colour, "With --render: also show the counted tokens in green (ANSI escapes)");
}

void add_plot_flags(CLI::App& app, PlotOptions& o) {
    app.add_option("runs", o.runs,
                   "Run output directories (each holds metrics.jsonl; its latest checkpoint gives the tokens per "
                   "step), or metrics.jsonl files; several runs share the axes, one colour each")
        ->required()
        ->check(CLI::ExistingPath);
    app.add_option("--out", o.out, "The PNG to write (default: loss.png in the first run's directory)");
    app.add_option("--width", o.width, "Width in pixels")->check(number_check(whole_number(200, 10000)));
    app.add_option("--height", o.height, "Height in pixels")->check(number_check(whole_number(200, 10000)));
}

// The unknown flags and stray arguments CLI11 left over in one command, as one message with the
// nearest known flag (or command) for each: "unknown option --lora-rnak; did you mean --lora-rank?".
std::string extras_message(const CLI::App& app, const std::vector<std::string>& extras) {
    std::vector<std::string> flags, commands;
    for (const CLI::Option* opt : app.get_options())
        for (const std::string& n : opt->get_lnames()) flags.push_back(n);
    for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
    std::string out;
    const auto add = [&](const std::string& line) { out += (out.empty() ? "" : "\n") + line; };
    bool any_flag = false;
    for (const std::string& e : extras) {
        if (e.size() < 2 || e[0] != '-' || std::isdigit(static_cast<unsigned char>(e[1])) || e[1] == '.') continue;
        any_flag = true;
        const std::string name = e.substr(0, e.find('='));
        const std::string bare = name.substr(name.find_first_not_of('-'));
        add("unknown option " + name + (app.get_parent() ? " for `train " + app.get_name() + "`" : "") +
            did_you_mean(bare, flags, "--"));
    }
    if (!any_flag)  // only stray words: a misspelt command, or an argument too many
        for (const std::string& e : extras)
            add(app.get_parent() == nullptr && !commands.empty() && !nearest_name(e, commands).empty()
                    ? "unknown command " + e + did_you_mean(e, commands)
                    : "unexpected argument " + e + (app.get_parent() ? " for `train " + app.get_name() + "`" : ""));
    return out;
}

// --help with the training flags' groups in train_flag_groups' order (CLI11 shows groups in the
// order their first options were added): a command's own groups first, then the training groups.
class GroupedHelp : public CLI::Formatter {
  public:
    // As CLI11's Formatter::make_help (whose make_groups is not virtual), with our make_groups.
    std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
        if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
        return make_description(app) + make_usage(app, name) + make_positionals(app) + grouped(app, mode) +
               make_subcommands(app, mode) + "\n" + make_footer(app);
    }

  private:
    std::string grouped(const CLI::App* app, CLI::AppFormatMode mode) const {
        std::vector<std::string> groups, training;
        for (const auto& [group, names] : train_flag_groups()) training.push_back(group);
        for (const std::string& g : app->get_groups())
            if (std::find(training.begin(), training.end(), g) == training.end()) groups.push_back(g);
        const std::vector<std::string> present = app->get_groups();
        for (const std::string& g : training)
            if (std::find(present.begin(), present.end(), g) != present.end()) groups.push_back(g);
        std::string out;
        for (const std::string& group : groups) {
            const std::vector<const CLI::Option*> opts = app->get_options([&](const CLI::Option* opt) {
                return opt->get_group() == group && opt->nonpositional() &&
                       (mode != CLI::AppFormatMode::Sub ||
                        (app->get_help_ptr() != opt && app->get_help_all_ptr() != opt));
            });
            if (!group.empty() && !opts.empty()) out += (out.empty() ? "" : "\n") + make_group(group, false, opts);
        }
        return out;
    }
};

// One parse of the command line with `base` as the training options' starting values.
struct Parsed {
    Command c;
    std::string run_file;             // --run
    std::vector<std::string> given;   // the JSON keys of the training flags given on the command line
};

// A bad flag or value throws std::invalid_argument; --help and --version print and exit 0.
Parsed parse_once(const std::vector<std::string>& args, const TrainOptions& base) {
    Parsed p;
    Command& c = p.c;
    c.train = base;
    CLI::App app{
        "polevault train: trains a Llama-family model. With no arguments it trains a small model on a "
        "built-in corpus (the project's own documentation and sources) and ends with a generated sample."};
    app.name("train");
    app.formatter(std::make_shared<GroupedHelp>());  // before the commands, which inherit it
    app.option_defaults()->always_capture_default();
    app.allow_extras();  // inherited by the commands: their leftovers get a "did you mean" below
    app.set_version_flag("--version", version_text(), "Print polevault's version (its git commit) and backend");
    add_train_flags(app, c.train, &p.run_file);
    CLI::App* plan = app.add_subcommand(
        "plan",
        "Print the memory a training run needs per rank, by category, and whether it fits (takes every "
        "training flag; --ranks instead of mpirun)");
    plan->option_defaults()->always_capture_default();
    add_train_flags(*plan, c.train, &p.run_file);
    plan->add_option("--ranks", c.plan.ranks, "World size to plan for")
        ->check(number_check(whole_number(1, 1 << 20)))
        ->group("Plan");
    plan->add_flag("--show-schedule", c.plan.show_schedule,
                   "--parallel pp: draw the pipeline schedule's timeline, one line per stage (F3: the forward of "
                   "micro-batch 3, B3 its backward, taking two columns; '.' idle)");
    plan->add_flag("--compare", c.plan.compare, "Every strategy side by side")
        ->group("Plan");
    plan->add_flag("--search", c.plan.search,
                   "Every layout of --ranks GPUs (tensor-parallel size, pipeline stages, ZeRO stage and shard group, "
                   "micro-batch, activation checkpointing, offload; those given as flags stay fixed), sized by the "
                   "planner and timed by the performance model: the five fastest that fit")
        ->group("Plan");
    CLI::App* sample = app.add_subcommand(
        "sample", "Generate text from a checkpoint or a Hugging Face model directory, with a KV cache");
    sample->option_defaults()->always_capture_default();
    add_sample_flags(*sample, c.sample);
    CLI::App* eval = app.add_subcommand("eval", "Loss and perplexity of a model on prepared data, every window once");
    eval->option_defaults()->always_capture_default();
    add_eval_flags(*eval, c.eval);
    CLI::App* prepare = app.add_subcommand("prepare",
                                           "Tokenize text or JSON-lines files into training and validation "
                                           "shards (and train a tokenizer unless --tokenizer is given)");
    prepare->option_defaults()->always_capture_default();
    add_prepare_flags(*prepare, c.prepare);
    CLI::App* convert = app.add_subcommand(
        "convert", "Convert another trainer's checkpoint into a Hugging Face model directory (--init-from takes it)");
    convert->option_defaults()->always_capture_default();
    add_convert_flags(*convert, c.convert);
    CLI::App* export_model = app.add_subcommand(
        "export", "Write a checkpoint as a Hugging Face model directory that transformers loads as it is");
    export_model->option_defaults()->always_capture_default();
    add_export_flags(*export_model, c.export_model);
    CLI::App* tokenize = app.add_subcommand(
        "tokenize",
        "Print the token ids of the text on stdin as one JSON array, exactly as Hugging Face's "
        "tokenizer.encode(text, add_special_tokens=False) gives them (special-token strings become their ids)");
    tokenize->option_defaults()->always_capture_default();
    add_tokenize_flags(*tokenize, c.tokenize);
    CLI::App* plot = app.add_subcommand(
        "plot",
        "Draw the training loss, validation loss, learning rate and gradient norm of one or more runs against "
        "steps and tokens, as a PNG (needs gnuplot: apt-get install gnuplot-nox)");
    plot->option_defaults()->always_capture_default();
    add_plot_flags(*plot, c.plot);
    app.require_subcommand(0, 1);
    check_integer_texts(app);
    try {
        std::vector<std::string> reversed(args.rbegin(), args.rend());
        app.parse(reversed);
    } catch (const CLI::CallForHelp& e) {
        std::exit(app.exit(e));
    } catch (const CLI::CallForAllHelp& e) {
        std::exit(app.exit(e));
    } catch (const CLI::CallForVersion& e) {
        std::exit(app.exit(e));
    } catch (const CLI::ParseError& e) {
        throw std::invalid_argument(e.what());
    }
    for (const CLI::App* a : {&app, plan, sample, eval, prepare, convert, export_model, tokenize, plot})
        if ((a == &app || a->parsed()) && a->remaining_size(false) > 0)
            throw std::invalid_argument(extras_message(*a, a->remaining(false)));
    // --warmup alone replaces a warmup ratio the base holds (a checkpoint's, the fine-tuning defaults).
    for (const CLI::App* a : {static_cast<const CLI::App*>(&app), static_cast<const CLI::App*>(plan)})
        if (a->count("--warmup") > 0 && a->count("--warmup-ratio") == 0) c.train.warmup_ratio = 0;
    // --steps alone replaces an epoch count the base holds, likewise.
    for (const CLI::App* a : {static_cast<const CLI::App*>(&app), static_cast<const CLI::App*>(plan)})
        if (a->count("--steps") > 0 && a->count("--epochs") == 0) c.train.epochs = 0;
    if (plan->parsed()) c.kind = Command::Kind::plan;
    if (sample->parsed()) c.kind = Command::Kind::sample;
    if (eval->parsed()) c.kind = Command::Kind::eval;
    if (prepare->parsed()) c.kind = Command::Kind::prepare;
    if (convert->parsed()) c.kind = Command::Kind::convert;
    if (export_model->parsed()) c.kind = Command::Kind::export_model;
    if (tokenize->parsed()) c.kind = Command::Kind::tokenize;
    if (plot->parsed()) c.kind = Command::Kind::plot;
    for (const CLI::App* a : {&app, plan})
        for (const CLI::Option* opt : a->get_options()) {
            if (opt->count() == 0 || opt->get_lnames().empty()) continue;
            std::string name = opt->get_lnames()[0];
            if (name == "no-checkpoint-activations") name = "checkpoint-activations";
            std::replace(name.begin(), name.end(), '-', '_');
            p.given.push_back(name);
        }
    return p;
}

// The JSON key of a flag name ("lora-rank" -> "lora_rank").
std::string key_of(std::string flag) {
    std::replace(flag.begin(), flag.end(), '-', '_');
    return flag;
}

// Applies a run file's entries to `o`, one flag at a time through the training flags' own CLI11
// options and then the option's rules, so that each problem names the file, the line and the key.
void apply_run_file(const RunFile& file, TrainOptions& o, OptionSources& sources) {
    for (const RunFileEntry& e : file.entries) {
        const std::string at = file.path + ":" + std::to_string(e.line) + ": " + e.key + ": ";
        CLI::App app;
        add_train_flags(app, o);
        check_integer_texts(app);
        try {
            std::vector<std::string> reversed(e.args.rbegin(), e.args.rend());
            app.parse(reversed);
        } catch (const CLI::ParseError& err) {
            throw std::invalid_argument(at + err.what());
        }
        const std::string key = key_of(e.flag);
        sources.by_key[key] = OptionSource::run_file;
        const nlohmann::json all = o;
        if (all.contains(key)) {
            const nlohmann::json one = {{key, all.at(key)}};
            if (const auto problems = train_option_problems(one); !problems.empty())
                throw std::invalid_argument(at + problems.front());
        }
    }
}

Command parse_train_command(const std::vector<std::string>& args, const TrainOptions& base, OptionSource base_source) {
    Parsed first = parse_once(args, base);
    Command c = std::move(first.c);
    c.train_sources.base_source = base_source;
    if (!first.run_file.empty()) {
        TrainOptions with_file = base;
        const RunFile file = read_run_file(first.run_file, train_flag_specs());
        apply_run_file(file, with_file, c.train_sources);
        c.train_sources.run_file = first.run_file;
        c.notes = file.notes;
        c.train = parse_once(args, with_file).c.train;  // the command line's flags on top of the file's
    }
    for (const std::string& key : first.given) c.train_sources.by_key[key] = OptionSource::command_line;
    if (c.kind == Command::Kind::train || c.kind == Command::Kind::plan) {
        const OptionSource batch_from = c.train_sources.of("batch");
        if (c.train.accumulation > 0 && c.train.micro_batch == 0)
            throw std::invalid_argument("--accumulation " + std::to_string(c.train.accumulation) +
                                        " needs --micro-batch (per_device_train_batch_size): the global batch is "
                                        "micro-batch x accumulation x ranks");
        if (c.train.accumulation > 0 &&
            (batch_from == OptionSource::run_file || batch_from == OptionSource::command_line))
            throw std::invalid_argument("--batch " + std::to_string(c.train.batch) + " and --accumulation " +
                                        std::to_string(c.train.accumulation) +
                                        " both set the global batch (= micro-batch x accumulation x ranks): give one");
        // Every option at once, as the flags, the run file and a resumed checkpoint's file left them.
        if (const auto problems = train_option_problems(c.train); !problems.empty()) {
            std::string all;
            for (const std::string& p : problems) all += (all.empty() ? "" : "\n") + p;
            throw std::invalid_argument(all);
        }
    }
    return c;
}

}  // namespace

Command parse_arguments(const std::vector<std::string>& args, const TrainOptions& base, OptionSource base_source) {
    return parse_train_command(args, base, base_source);
}

Command parse_command(int argc, char** argv, const TrainOptions& base, OptionSource base_source) {
    try {
        return parse_train_command(std::vector<std::string>(argv + 1, argv + argc), base, base_source);
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "%s\nRun with --help for more information.\n", e.what());
        std::exit(2);
    }
}

void apply_accumulation(TrainOptions& o, int ranks, OptionSources* sources) {
    if (o.accumulation <= 0) return;
    const long long batch = (long long)o.micro_batch * o.accumulation * ranks;
    if (batch > INT_MAX)
        throw std::invalid_argument("--micro-batch " + std::to_string(o.micro_batch) + " x --accumulation " +
                                    std::to_string(o.accumulation) + " x " + std::to_string(ranks) +
                                    " ranks = " + std::to_string(batch) + " sequences per step: too many");
    if (sources) {
        sources->by_key["batch"] = sources->of("accumulation");
        sources->notes["batch"] = "--micro-batch " + std::to_string(o.micro_batch) + " x --accumulation " +
                                  std::to_string(o.accumulation) + " x " + std::to_string(ranks) + " rank(s)";
    }
    o.batch = int(batch);
    o.accumulation = 0;
}

std::vector<FlagSpec> train_flag_specs() {
    CLI::App app;
    TrainOptions o;
    add_train_flags(app, o);
    std::vector<FlagSpec> specs;
    for (const CLI::Option* opt : app.get_options()) {
        if (opt->get_lnames().empty() || opt->get_lnames()[0] == "help" || opt->get_group().empty()) continue;
        FlagSpec f;
        f.name = opt->get_lnames()[0];
        f.type = opt->get_type_name();
        f.group = opt->get_group();
        f.list = f.name == "lora-targets" || f.name == "freeze";
        if (opt->get_expected_max() == 0) {
            f.kind = FlagSpec::Kind::flag;
            for (const std::string& n : opt->get_lnames())
                if (n != f.name) f.negation = n;
        } else if (opt->get_expected_min() == 0) {
            f.kind = FlagSpec::Kind::optional_value;
        }
        specs.push_back(f);
    }
    // --help's order: by group, then as added.
    std::vector<FlagSpec> ordered;
    for (const auto& [group, names] : train_flag_groups())
        for (const FlagSpec& f : specs)
            if (f.group == group) ordered.push_back(f);
    return ordered;
}

std::string train_options_json(const TrainOptions& o) { return nlohmann::json(o).dump(2); }

// The file's options are checked as they are written, before conversion: every key one of ours
// with the type of its default, every value within its flag's rules, so the file can never set
// what the command line could not (2.5 micro-batches, dtype "int8", beta1 5).
TrainOptions train_options_from_json(const std::string& text) {
    try {
        nlohmann::json j = nlohmann::json::parse(text);
        if (!j.is_object()) throw std::runtime_error("not a JSON object");
        // Older checkpoints' names: "microbatches" is "in_flight", strategy "mp" is "pp".
        if (j.contains("microbatches") && !j.contains("in_flight"))
            j["in_flight"] = j["microbatches"], j.erase("microbatches");
        if (j.contains("parallel") && j["parallel"].is_string())
            j["parallel"] = canonical_strategy_name(j["parallel"].get<std::string>());
        const nlohmann::json defaults = TrainOptions{};
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (!defaults.contains(it.key()))
                throw std::runtime_error("\"" + it.key() + "\" is not an option of this polevault");
            const nlohmann::json& want = defaults.at(it.key());
            const bool same = want.is_number() ? it->is_number() && (want.is_number_float() || it->is_number_integer())
                                               : want.type() == it->type();
            if (!same || (want.is_number_unsigned() && !it->is_number_unsigned()))
                throw std::runtime_error("\"" + it.key() + "\" is " + it->dump() + "; expected " +
                                         (want.is_number_unsigned() ? std::string("an unsigned integer")
                                          : want.is_number_integer() ? std::string("an integer")
                                                                     : std::string("a ") + want.type_name()));
        }
        if (const auto problems = train_option_problems(j); !problems.empty()) throw std::runtime_error(problems.front());
        TrainOptions o = j.get<TrainOptions>();
        if (const auto problems = train_option_problems(o); !problems.empty()) throw std::runtime_error(problems.front());
        return o;
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(std::string("training options: ") + e.what());
    } catch (const std::runtime_error& e) {
        throw std::runtime_error(std::string("training options: ") + e.what());
    }
}

// The options as values (a NaN stays a NaN here; only its text form would be null).
std::vector<std::string> train_option_problems(const TrainOptions& o) {
    std::vector<std::string> problems = train_option_problems(nlohmann::json(o));
    try {
        if (problems.empty()) lora_config(o);  // the adapters' own rules (targets, rank with alpha)
    } catch (const std::invalid_argument& e) {
        problems.push_back(e.what());
    }
    return problems;
}

LoraConfig lora_config(const TrainOptions& o) {
    LoraConfig l;
    l.rank = o.lora_rank;
    l.alpha = o.lora_alpha;
    l.rslora = o.rslora;
    l.dropout = o.lora_dropout;
    l.targets = parse_lora_targets(o.lora_targets);
    if (const auto problems = validate(l); !problems.empty()) throw std::invalid_argument(problems.front());
    return l;
}

StrategyOptions strategy_options(const TrainOptions& o, int ranks) {
    StrategyOptions s;
    s.kind = strategy_kind(o.parallel);
    s.pipeline_stages = o.pipeline_stages;
    s.pipeline = parse_pipeline_schedule(o.pipeline_schedule);
    s.chunks = s.pipeline == PipelineScheduleKind::interleaved ? (o.pipeline_chunks > 0 ? o.pipeline_chunks : 2) : 1;
    s.in_flight = o.in_flight;
    s.balance = parse_stage_balance(o.balance);
    s.fp32_grad_accumulation = o.fp32_grad_accumulation;
    s.shard_group = o.shard_group;
    s.offload = parse_offload(o.offload);
    s.tensor = o.tp;
    s.sequence_parallel = o.sequence_parallel;
    s.cuda_graphs = o.cuda_graphs;
    const int per_step = o.micro_batch * data_ranks_of(s, ranks);
    s.micro_per_step = per_step > 0 && o.batch % per_step == 0 ? std::max(1, o.batch / per_step) : 1;
    return s;
}

ActivationCheckpointing activation_checkpointing(const TrainOptions& o) {
    if (o.checkpoint_activations == kCheckpointActivationsAuto)
        return ActivationCheckpointing{o.checkpoint_blocks > 0, 0, std::max(o.checkpoint_blocks, 0)};
    if (o.checkpoint_activations < -1 || o.checkpoint_activations == 1)
        throw std::invalid_argument("--checkpoint-activations=" + std::to_string(o.checkpoint_activations) +
                                    ": give no value (every block recomputes), N >= 2 (one block in N keeps its "
                                    "activations), auto (the fewest blocks that fit), or --no-checkpoint-activations");
    return ActivationCheckpointing{o.checkpoint_activations >= 0, std::max(o.checkpoint_activations, 0)};
}

std::vector<std::string> train_options_diff(const TrainOptions& before, const TrainOptions& after) {
    const nlohmann::json a = before, b = after;
    std::vector<std::string> out;
    for (auto it = a.begin(); it != a.end(); ++it)
        if (b.at(it.key()) != it.value())
            out.push_back(flag_of(it.key()) + ": " + it.value().dump() + " -> " + b.at(it.key()).dump());
    return out;
}

}  // namespace pv
