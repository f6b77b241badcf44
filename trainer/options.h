// The `train` program's command line: its four commands and every flag with its default and
// meaning, filled by CLI11 (train_options.cpp). Host C++ only, so the parser is compiled by g++ on
// both backends.
//
//   train [flags]            train (the default command; no flags: the built-in demo run)
//   train sample [flags]     generate text from a checkpoint or a Hugging Face model directory
//   train eval [flags]       a model's loss and perplexity on prepared data
//   train prepare [flags]    text or JSON-lines files -> token shards + a validation shard
//   train convert --from llama2c FILE --out DIR    a llama2.c checkpoint -> a Hugging Face directory
//   train export CHECKPOINT --out DIR              a checkpoint -> a Hugging Face directory
//   train tokenize [flags]   text on stdin -> its token ids (or ids -> text), as Hugging Face gives them
//   train plot RUN_DIR...    loss, validation loss, learning rate and gradient norm as a PNG
//   train --run run.yaml     the training flags from a YAML file (trainer/run_file.h), flags after it on top
//   train --version          the commit this train was built from and its backend
//
// Resuming: `train --resume DIR` takes every training flag from the checkpoint's
// trainer_state.json and then applies the flags given on this command line on top, so a resumed
// run continues the same trajectory unless the user deliberately changes something (each change
// is reported).
#pragma once

#include "data/prepare.h"
#include "model/activations.h"
#include "model/lora.h"
#include "parallel/plan.h"
#include "trainer/plot.h"
#include "trainer/run_file.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

struct Interconnect;  // parallel/layout_search.h

struct TrainOptions {
    // Model and data.
    std::string preset;     // a model preset; empty: the built-in default model sized to the tokenizer
    std::string config;     // a Hugging Face config.json instead of a preset
    std::string init_from;  // a Hugging Face model directory: its config, weights and tokenizer
    std::string data;       // a directory from `train prepare` or a token shard; empty: the built-in corpus
    std::string val_data;   // a validation shard; empty: the data's own (or the built-in corpus's tail)
    std::string freeze;     // comma-separated globs over Hugging Face tensor names to keep fixed (model/freeze.h)
    // LoRA (model/lora.h): adapters on a frozen base; rank 0: full fine-tuning.
    int lora_rank = 0;
    double lora_alpha = 8;
    bool rslora = false;
    std::string lora_targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    double lora_dropout = 0;
    std::string adapter;       // a PEFT adapter directory to continue training (with --init-from its base)
    std::string quantize;      // "nf4": QLoRA, the blocks' linear weights stored as NF4; empty: none
    bool double_quant = true;  // NF4: double-quantise the absmaxes (QLoRA's default)
    int vocab = 512;           // tokenizer vocabulary trained on the built-in corpus
    // Batch and length (DESIGN.md §4: batch = micro_batch x accumulation x ranks).
    long long steps = 250;
    int batch = 16;
    int micro_batch = 0;  // 0: the largest divisor of batch / ranks that is at most 8
    // Micro-steps per optimizer step on each rank (Hugging Face's gradient_accumulation_steps):
    // when > 0, batch = micro_batch x accumulation x ranks, computed once the rank count is known
    // (apply_accumulation), after which it is 0 again and batch holds the result. 0: batch as given.
    int accumulation = 0;
    int seq_len = 64;
    bool document_mask = false;  // attention and positions restricted to each token's own document
    // Optimizer.
    double lr = 2e-3;
    std::string schedule = "cosine";
    int warmup = 20;
    double warmup_ratio = 0;      // > 0: warmup = ceil(ratio × the schedule's steps), instead of --warmup
    double epochs = 0;            // > 0: --steps = ceil(epochs × training windows / --batch)
    long long schedule_steps = 0;  // the schedule's length when it is not --steps (a resume's --keep-schedule)
    double final_lr_fraction = 0.1;
    double clip = 1.0;
    // Steps whose loss or gradient norm is NaN or infinite that are passed over (nothing updated;
    // the step counter, data position and schedule advance) before such a step ends the run; counted
    // per invocation of train.
    long long skip_nonfinite = 0;
    double weight_decay = 0.1;
    bool decay_norm_weights = false;
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    std::string dtype = "bf16";
    bool stochastic_rounding = false;
    bool fp32_grad_accumulation = false;
    uint64_t seed = 1337;
    std::string parallel = "auto";      // auto, single, ddp, zero1, zero2, zero3 or mp (parallel/)
    // The machines --parallel auto's layout search assumes (trainer/auto_layout.h; 0: its figures):
    // "slow" is 100 Gb/s Ethernet between nodes instead of InfiniBand.
    std::string interconnect = "fast";
    int gpus_per_node = 0;       // 0: the fewest ranks mpirun put on one node (a plan: 8)
    double intra_node_gbs = 0;   // GB/s between two GPUs of a node (0: NVLink 4, 450 at 0.7)
    double inter_node_gbs = 0;   // GB/s per GPU between nodes (0: --interconnect's: 35 fast, 8.75 slow)
    double pcie_gbs = 0;         // GB/s between a GPU and its host, for offload's copies (0: PCIe 5 x16, 64 at 0.7)
    double host_memory_gbs = 0;  // GB/s of a node's host memory for the offloaded update (0: 17, measured)
    int pipeline_stages = 0;            // the pipeline's stages, each replicated over ranks / stages (0: pp's one per rank, else none)
    int in_flight = 0;                  // pipeline: most micro-batches in flight per stage (0: the schedule's own)
    std::string pipeline_schedule = "1f1b";  // pp: gpipe, 1f1b or interleaved (parallel/schedule.h)
    int pipeline_chunks = 0;                 // pp, interleaved: model chunks per rank (0: 2)
    std::string balance = "flops";      // pp: balance the stages by flops or params
    int shard_group = 0;                // zero1-3: shard within groups of this many ranks (0: all; HSDP)
    int tp = 1;                         // tensor-parallel group size (parallel/plan.h StrategyOptions::tensor)
    bool sequence_parallel = false;     // --sequence-parallel (StrategyOptions::sequence_parallel)
    bool cuda_graphs = false;           // --cuda-graphs (StrategyOptions::cuda_graphs)
    std::string offload = "none";       // none, optimizer or params (parallel/plan.h Offload)
    // Activation checkpointing (model/llama.h ActivationCheckpointing): −1 off; 0 every block
    // recomputes its forward before its backward (the bare flag); N >= 2 one block in N keeps its
    // activations (block i when i % N == N − 1), the others recompute; kCheckpointActivationsAuto
    // (`auto`, −2 in a checkpoint's options): the fewest blocks the plan needs to fit, resolved
    // into checkpoint_blocks once the layout is known (resolve_auto_checkpointing, trainer/main.cu).
    int checkpoint_activations = -1;
    int checkpoint_blocks = -1;  // auto's choice: the first N blocks recompute (−1: unresolved). Not saved
    // Evaluation, output, checkpoints.
    int eval_interval = 50;
    int eval_batches = 4;
    std::string out_dir = "runs/default";
    long long checkpoint_interval = 0;  // 0: only the final checkpoint
    std::string resume;                 // a step_N checkpoint, or an output directory (its latest)
    long long stop_after = 0;           // stop after this many steps of this invocation (0: run to --steps)
    long long keep_checkpoints = 0;     // keep the newest K complete checkpoints (0: all; trainer/out_dir.h)
    bool overwrite_later = false;       // resuming step_N: remove the output directory's later checkpoints
    bool overwrite = false;             // remove the run already in --out-dir first (trainer/out_dir.h); not saved
    // A resume with another --steps: the schedule stretched over the new steps, or the original one
    // kept (its final learning rate held past its end). This invocation's choice; not saved.
    bool extend_schedule = false, keep_schedule = false;
    // Resume from a checkpoint missing master/adam files, starting their state fresh
    // (model/checkpoint_files.h). This invocation's choice only: not saved in checkpoints.
    bool allow_inexact_resume = false;
    // The memory budget per rank: a GPU's name or bytes (parallel/planner.h); empty: this device's
    // (the host backend: this machine's memory shared by its ranks). Not saved in checkpoints.
    std::string gpu_memory;
    // Every rank ends once one has waited this many seconds in one collective for a rank that does
    // not arrive (parallel/collective_watch.h). Not saved in checkpoints: it changes no result, and a
    // resumed run on other machines may need another.
    double collective_timeout = 600;
    // The sample printed at the end.
    std::string prompt = "The kernel";
    int sample_tokens = 120;
    double temperature = 0.8;
    double top_p = 0.95;
};

// `train plan`: the training flags plus these.
struct PlanOptions {
    int ranks = 1;         // the world size to plan for (instead of mpirun's)
    bool compare = false;  // every strategy side by side
    bool show_schedule = false;  // pp: the pipeline schedule's timeline (parallel/schedule.h)
    bool search = false;         // every layout, the five fastest that fit (parallel/layout_search.h)
};

struct SampleOptions {
    std::string model;            // a checkpoint (step_N or output directory) or a Hugging Face model directory
    std::string prompt;           // text to continue; empty (and no prompt_ids): the model's start token
    std::vector<int> prompt_ids;  // token ids to continue, instead of text
    int max_tokens = 0;           // 0: up to kDefaultSampleTokens, as many as the model's positions allow
    double temperature = 0.8;     // 0: greedy
    double top_p = 0.95;
    uint64_t seed = 1337;
    std::string dtype;        // bf16, fp32 or fp64; empty: the model's own (model_dir.h)
    bool print_ids = false;   // the generated ids as a JSON array on the last line of stdout
    bool chat = false;        // the prompt as one user turn in the model's chat format, then the assistant's turn
    std::string chat_format;  // empty: recognised from the model's tokenizer_config.json
};
inline constexpr int kDefaultSampleTokens = 200;

struct EvalOptions {
    std::string model;  // as SampleOptions::model
    std::string data;   // a `train prepare` directory (its validation shard, else its training shards) or one shard
    std::string dtype;  // empty: the model's own
    int seq_len = 0;    // 0: a checkpoint's training window, else min(max_position_embeddings, 1024)
    int batch = 0;      // windows per forward pass; 0: a checkpoint's micro-batch, else 1
    long long max_windows = -1;  // 0: every window; -1: a checkpoint's validation windows, else every one
    int document_mask = -1;      // 1 on, 0 off, -1: a checkpoint's setting, else off
};

struct ConvertOptions {
    std::string from = "llama2c";  // the source format (llama2c: karpathy/llama2.c's run.c format)
    std::string input;
    std::string out_dir;
};

struct ExportOptions {
    std::string checkpoint;  // a step_N directory, an output directory (its latest), or a model directory
    std::string out_dir;     // --out: a Hugging Face model directory
    std::string peft_out;    // --peft: a LoRA checkpoint's adapters as a PEFT adapter directory
    std::string merged_out;  // --merged: a LoRA checkpoint's base with the adapters folded in
    bool quantized = false;  // --quantized (with --merged): the block linears as bitsandbytes NF4
    std::string dtype;       // bf16, fp32 or fp64; empty: as stored
};

// `train tokenize`: what the model sees of a text. Reads stdin whole; writes one line.
struct TokenizeOptions {
    std::string tokenizer;      // a tokenizer.json (tokenizer_config.json beside it is read too)
    bool add_special = false;   // add the post-processor's tokens (BOS), as add_special_tokens=True
    bool parse_special = true;  // special-token strings in the text become their ids
    bool decode = false;        // stdin holds a JSON array of ids: print their text instead
    // --render FILE.jsonl: the file's first examples as prepare encodes them, counted tokens marked.
    std::string render;
    int render_examples = 3;
    std::string chat_format;    // empty: the tokenizer's own template
    std::string chat_template;  // --chat-template FILE: overrides both
    bool train_on_prompt = false;
    bool colour = false;
};

struct Command {
    enum class Kind { train, plan, sample, eval, prepare, convert, export_model, tokenize, plot } kind = Kind::train;
    TrainOptions train;
    PlanOptions plan;
    SampleOptions sample;
    EvalOptions eval;
    PrepareOptions prepare;
    ConvertOptions convert;
    ExportOptions export_model;
    TokenizeOptions tokenize;
    PlotOptions plot;
    // Where each training option's value came from (defaults, a checkpoint, --run's file, the command line).
    OptionSources train_sources;
    // Keys of the run file accepted and ignored ("FILE:LINE: logging_steps ignored: ..."), to print once.
    std::vector<std::string> notes;
};

// Parses argv; prints help or errors and exits (status 0 for --help and --version, 2 for bad
// flags or a bad run file). Training flags not given keep the values of --run's file, else those
// in `base` (the defaults, or a checkpoint's options on resume: base_source says which).
Command parse_command(int argc, char** argv, const TrainOptions& base = {},
                      OptionSource base_source = OptionSource::default_value);
// The same for arguments without the program's name, throwing std::invalid_argument with the
// message parse_command would print instead of exiting (--help and --version still print and exit).
Command parse_arguments(const std::vector<std::string>& args, const TrainOptions& base = {},
                        OptionSource base_source = OptionSource::default_value);

// --accumulation: sets batch = micro_batch x accumulation x ranks and accumulation to 0 (nothing
// when it is 0); `sources` learns where batch came from. Throws std::invalid_argument naming the
// flags when the product does not fit an int.
void apply_accumulation(TrainOptions& o, int ranks, OptionSources* sources = nullptr);

// Every training flag as a run file sees it, in --help's order (trainer/run_file.h).
std::vector<FlagSpec> train_flag_specs();

// "polevault <git describe> (<backend> backend)" (trainer/version.cpp; the Makefile bakes the commit in).
std::string version_text();

// The training options as a JSON object (for trainer_state.json) and back; doubles round-trip
// exactly. from_json throws std::runtime_error naming a key of the wrong type.
std::string train_options_json(const TrainOptions& o);
TrainOptions train_options_from_json(const std::string& json);
// The LoRA options among them, checked (std::invalid_argument naming the flag).
LoraConfig lora_config(const TrainOptions& o);
// The strategy options among them (parallel/plan.h).
// `ranks`: the world, which sets a pipeline's micro-batches per step (--batch over the data-parallel ranks).
StrategyOptions strategy_options(const TrainOptions& o, int ranks);
// --checkpoint-activations auto, as TrainOptions::checkpoint_activations holds it.
inline constexpr int kCheckpointActivationsAuto = -2;
// The activation checkpointing among them, checked (std::invalid_argument naming the flag); `auto`
// as resolved (checkpoint_blocks), off while it is not yet.
ActivationCheckpointing activation_checkpointing(const TrainOptions& o);
// The link rates among them (--intra-node-gbs, --inter-node-gbs, --pcie-gbs, --host-memory-gbs;
// 0 keeps the figure) written into the layout search's machine.
void apply_link_rate_flags(const TrainOptions& o, Interconnect& link);

// "--flag: old -> new" for every option that differs, for reporting overrides on resume.
std::vector<std::string> train_options_diff(const TrainOptions& before, const TrainOptions& after);

}  // namespace pv
