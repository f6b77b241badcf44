// train: the polevault training program, on one rank or under mpirun with a strategy from
// parallel/ (--parallel single|ddp|zero1|zero2|zero3|mp), applied to a model that knows nothing
// of it; rank 0 reports and writes.
//
//   ./train                      trains a small model on the built-in corpus (the project's own
//                                README, docs/ and headers, embedded at build time), prints one line per
//                                step, evaluates on a held-out tail, saves a checkpoint and ends
//                                with a generated sample
//   ./train --resume DIR         continues a run from a checkpoint, bit for bit
//   ./train --init-from HF_DIR   fine-tunes a Hugging Face model (its config, weights, tokenizer)
//   ./train sample DIR           generates text from a checkpoint or a Hugging Face model directory
//                                (a KV cache: the prompt in one pass, then one position per token)
//   ./train eval DIR --data D    the model's loss and perplexity on prepared data
//   ./train prepare FILES --out DIR    tokenizes text or JSON lines into shards
//   ./train convert --from llama2c model.bin --out HF_DIR    a llama2.c checkpoint as a HF model
//   ./train export CHECKPOINT --out HF_DIR                   a checkpoint as a HF model
//   ./train tokenize --tokenizer FILE  prints the token ids of stdin (or, with --decode, the text of ids)
//   ./train plot RUN_DIR...      a run's loss, validation loss, lr and grad norm as a PNG (gnuplot)
//   ./train --run run.yaml       the training flags from a YAML run file (docs/run-files.md)
//   ./train --help               every flag with its default, by group (also `train sample --help`, ...)
//   ./train --version            the commit it was built from and its backend
//
// This file holds the commands and the option checks; trainer/run.cu one training run in phases,
// trainer/trainer.h one optimizer step, trainer/checkpoint.* checkpoints, trainer/run_data.* the
// data and model shape, trainer/generate.* sampling, trainer/evaluate.* evaluation, trainer/model_dir.*
// the model directories sample and eval read.
#include "data/loader.h"
#include "formats/config_json.h"
#include "formats/llama2c.h"
#include "formats/peft_config.h"
#include "io/progress.h"
#include "data/chat.h"
#include "data/examples.h"
#include "data/prepare.h"
#include "model/llama.h"
#include "parallel/plan.h"
#include "parallel/layout_search.h"
#include "parallel/mesh.h"
#include "parallel/planner.h"
#include "model/freeze.h"
#include "parallel/world.h"
#include "model/decoder.h"
#include "trainer/auto_layout.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluate.h"
#include "trainer/export.h"
#include "trainer/generate.h"
#include "trainer/model_dir.h"
#include "trainer/option_rules.h"
#include "trainer/options.h"
#include "trainer/out_dir.h"
#include "trainer/run.h"
#include "trainer/run_data.h"
#include "trainer/signals.h"
#include "trainer/state.h"
#include "trainer/tokenize.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <iostream>
#include <stdexcept>
#include <tuple>

#include <unistd.h>

namespace pv {
namespace {

// Checks the options that need no data, resolves the automatic micro-batch, loads the data and
// the model's shape, and trains in the run's storage and gradient types.
// --adapter: the PEFT adapter's configuration becomes the run's LoRA options (a conflicting
// --lora-rank is refused rather than silently replaced).
void apply_adapter_config(TrainOptions& o) {
    if (o.adapter.empty()) return;
    if (o.init_from.empty())
        throw std::invalid_argument("--adapter " + o.adapter +
                                    " needs the base model it was trained on: pass it with --init-from");
    const PeftAdapterConfig a = read_peft_adapter_config(o.adapter);
    if (o.lora_rank != 0 && o.lora_rank != a.lora.rank)
        throw std::invalid_argument("--lora-rank " + std::to_string(o.lora_rank) + " but the adapter " + o.adapter +
                                    " has rank " + std::to_string(a.lora.rank) + ": drop --lora-rank");
    o.lora_rank = a.lora.rank, o.lora_alpha = a.lora.alpha, o.rslora = a.lora.rslora;
    o.lora_targets.clear();
    for (const std::string& t : a.lora.targets) o.lora_targets += (o.lora_targets.empty() ? "" : ",") + t;
}

// The automatic micro-batch (0): the largest divisor of batch / data ranks up to 8; then the
// geometry's checks.
void resolve_micro_batch(TrainOptions& o, int ranks) {
    const int data_ranks = data_ranks_of(strategy_options(o, ranks), ranks);  // pp: every stage sees the whole batch
    if (o.micro_batch > 0 && o.batch % (o.micro_batch * data_ranks) != 0)
        throw std::invalid_argument(
            "--batch " + std::to_string(o.batch) + " is not a whole number of micro-batches on each rank: --batch = "
            "--micro-batch x accumulation x ranks, and --micro-batch " + std::to_string(o.micro_batch) + " x " +
            std::to_string(data_ranks) + " rank(s) = " + std::to_string(o.micro_batch * data_ranks) +
            " does not divide it; make --batch a multiple of " + std::to_string(o.micro_batch * data_ranks) +
            ", or choose a --micro-batch that divides " + std::to_string(o.batch / data_ranks) +
            (o.batch % data_ranks == 0 ? "" : " (after making --batch a multiple of the ranks)"));
    if (o.micro_batch == 0) {
        if (o.batch % data_ranks != 0)
            throw std::invalid_argument("--batch " + std::to_string(o.batch) + " does not split over " +
                                        std::to_string(data_ranks) + " ranks: make --batch a multiple of " +
                                        std::to_string(data_ranks));
        const int per_rank = o.batch / data_ranks;
        for (int m = std::min(8, per_rank); m >= 1 && o.micro_batch == 0; --m)
            if (per_rank % m == 0) o.micro_batch = m;
    }
    accumulation_for(o.batch, o.micro_batch, data_ranks);  // a bad geometry fails before any data is read
}

// The planner's question for these options (resolved: a strategy, a micro-batch) on `ranks`.
PlanRequest plan_request(const TrainOptions& o, const LlamaConfig& config, int ranks) {
    PlanRequest q;
    q.config = config;
    q.dtype = parse_dtype(o.dtype);
    q.groups = GroupOptions{resolve_freeze(config, split_patterns(o.freeze)).names, lora_config(o), o.quantize == "nf4",
                            o.double_quant};
    q.strategy = strategy_options(o, ranks);
    q.ranks = ranks;
    q.micro_batch = o.micro_batch, q.seq_len = o.seq_len;
    q.checkpointing = activation_checkpointing(o);
    if (o.sample_tokens > 0)
        std::tie(q.sample_positions, q.sample_rows) = sample_decoder_shape(config, o.prompt.size(), o.sample_tokens);
    q.accumulation = accumulation_for(o.batch, o.micro_batch, data_ranks_of(q.strategy, ranks));
    return q;
}

// This machine's memory per rank (the host backend runs every rank on one machine), for the
// host-side lines of a plan and the host backend's device budget.
double host_budget(int ranks) { return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / ranks; }

// The memory a rank may use: --gpu-memory, else this GPU's, else (host backend) this machine's
// shared by the ranks (all on one machine, as the host backend runs them).
GpuMemory memory_budget(const TrainOptions& o, int ranks) {
    if (!o.gpu_memory.empty()) return parse_gpu_memory(o.gpu_memory);
    if (!kHostBackend) {
        size_t free_bytes = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
        return {"this GPU", double(total)};
    }
    return {"this machine's memory / " + std::to_string(ranks) + " rank(s)", host_budget(ranks)};
}

// Refuses (std::invalid_argument with the plan's table and the changes that would fit) a run
// whose plan does not fit the budget, before anything is allocated.
void check_plan_fits(const PlanRequest& q, const GpuMemory& gpu) {
    const MemoryPlan plan = plan_memory(q);
    if (plan.peak() > gpu.usable()) {
        std::string changes;
        for (const std::string& c : changes_that_fit(q, gpu.usable())) changes += "\n  " + c;
        throw std::invalid_argument(
            "this run needs " + format_bytes(plan.peak()) + " of device memory per rank, more than the " +
            format_bytes(gpu.usable()) + " it may use on " + gpu.name + ":\n" + format_plan(plan, &gpu) +
            (changes.empty() ? "nothing tried fits (a smaller micro-batch, activation checkpointing, ZeRO or mp, "
                               "CPU offload, more ranks, LoRA, QLoRA): choose a smaller model"
                             : "changes that fit:" + changes));
    }
    const double host = plan.largest().host_total(), budget = host_budget(q.ranks);
    if (host > budget)
        throw std::invalid_argument("this run needs " + format_bytes(host) + " of host memory per rank (" +
                                    "a step's micro-batches and the pinned staging), more than this machine's " +
                                    format_bytes(budget) + " per rank: use a smaller --batch" +
                                    (q.strategy.offload != Offload::none ? ", or drop --offload" : ""));
}

// --checkpoint-activations auto, once the layout is known: the fewest blocks whose recompute makes
// the plan fit `gpu` (parallel/planner.h fewest_recomputing_blocks), into o.checkpoint_blocks, and
// the line saying so. Empty for any other setting, or when --parallel auto's search chose already.
std::string resolve_auto_checkpointing(TrainOptions& o, const LlamaConfig& config, int ranks, const GpuMemory& gpu) {
    if (o.checkpoint_activations != kCheckpointActivationsAuto) return "";
    const int blocks = config.num_layers;
    if (o.checkpoint_blocks < 0) {
        o.checkpoint_blocks = 0;  // the plan without any, which the search starts from
        o.checkpoint_blocks = std::max(fewest_recomputing_blocks(plan_request(o, config, ranks), gpu.usable()).first_blocks, 0);
    }
    const int k = o.checkpoint_blocks;
    const std::string budget =
        "the " + format_bytes(gpu.usable()) + " a rank may use" + (gpu.name.empty() ? "" : " on " + gpu.name);
    const std::string head = "activation checkpointing: auto: ";
    if (k == 0) return head + "no block recomputes (the plan fits " + budget + " without)";
    if (k == blocks && plan_memory(plan_request(o, config, ranks)).peak() > gpu.usable())
        return head + "every block recomputes, and the plan still does not fit " + budget;
    return head + "the first " + std::to_string(k) + " of " + std::to_string(blocks) +
           " blocks recompute, the fewest with which the plan fits " + budget;
}

// --parallel auto, before the model is known: a data-parallel guess for the option and geometry
// checks (single on one rank; zero3 when --offload params needs its slices; else ddp).
void guess_auto_strategy(TrainOptions& o, int ranks) {
    o.parallel = ranks == 1 ? "single" : parse_offload(o.offload) == Offload::params ? "zero3" : "ddp";
}

// The fewest ranks mpirun put on one node: the GPUs per node --parallel auto's search assumes.
int fewest_ranks_per_node() {
    const std::vector<int> nodes = node_of_each_rank();
    std::vector<int> count(nodes.size(), 0);
    for (int n : nodes) ++count[size_t(n)];
    int fewest = 0;
    for (int c : count)
        if (c > 0 && (fewest == 0 || c < fewest)) fewest = c;
    return fewest;
}

// --parallel auto, once the model is known: the layout search's fastest layout that fits
// (trainer/auto_layout.h) written into o, and the line saying what it chose and why. Nothing
// fitting: the layout of least memory, which check_plan_fits then refuses with what would fit.
// `host_memory`: the host bytes a rank may use (0: not checked, a plan for other machines).
std::string choose_auto_layout(TrainOptions& o, const TrainOptions& flags, const OptionSources& sources,
                               const LlamaConfig& config, int ranks, int ranks_per_node, const GpuMemory& gpu,
                               double host_memory) {
    const SearchRequest r = layout_search_request(o, flags, sources, plan_request(o, config, ranks), ranks,
                                                  interconnect_of(o, ranks_per_node), gpu.usable(), host_memory);
    const SearchResult result = search_layouts(r);
    std::string line;
    if (!result.fitting.empty()) {
        apply_layout(o, result.fitting.front(), sources);
        line = describe_choice(result) + "; by hand: " + result.fitting.front().flags();
    } else {
        line = "none of the " + std::to_string(result.considered) + " layouts sized fits";
        if (!result.least_memory.strategy.empty()) {
            apply_layout(o, result.least_memory, sources);
            line += "; the least memory: " + result.least_memory.describe() + ", " +
                    format_bytes(result.least_memory.memory) + " per GPU";
        }
    }
    resolve_micro_batch(o, ranks);
    return line;
}

int train_command(const TrainOptions& requested_flags, const OptionSources& sources, const std::string& resume_dir,
                  World& world, std::optional<OutDirLock>& lock) {
    TrainOptions requested = requested_flags;
    if (resume_dir.empty()) apply_adapter_config(requested);
    TrainOptions o = requested;
    // A resumed run's model is the checkpoint's, whatever it was initialised from.
    const std::string init_dir = resume_dir.empty() ? o.init_from : "";
    // --parallel auto decides from the plan, which needs the model; until then the geometry is
    // checked as a data-parallel run's.
    check_option_rules(o, world.size());  // every rule between options (trainer/option_rules.h)
    const bool automatic = o.parallel == "auto";
    if (automatic) {  // the rules table checked a named strategy; auto's choice is checked here
        guess_auto_strategy(o, world.size());
        check_strategy(strategy_options(o, world.size()), world.size());
    }
    resolve_micro_batch(o, world.size());
    if (o.seq_len == 0 && init_dir.empty())
        throw std::invalid_argument("--seq-len 0 (the window from the data) goes with --init-from; give a --seq-len");
    if (o.lr > 0.1)  // in range (a test may want the update to overflow) but never a working rate
        std::printf("warning: --lr %g is far above the rates Llama-family models train at (1e-5 to 3e-3): AdamW "
                    "moves every weight by up to about --lr per step, and weights are of order 0.02, so the model "
                    "will be destroyed in a few steps\n",
                    o.lr);
    RunData data = load_run_data(o, resume_dir, init_dir);
    const LlamaConfig config = model_config(o, data, resume_dir, init_dir);
    if (o.seq_len == 0) {
        std::string why;
        o.seq_len = seq_len_from_data(data, config, &why);
        requested.seq_len = o.seq_len;  // the checkpoint records the window the run used
        std::printf("--seq-len %d from the data: %s\n", o.seq_len, why.c_str());
    }
    if (o.seq_len > config.max_seq_len)
        throw std::invalid_argument("--seq-len " + std::to_string(o.seq_len) +
                                    " exceeds the model's max_position_embeddings of " +
                                    std::to_string(config.max_seq_len) + ": use a shorter sequence");
    // The memory plan, before anything is allocated (parallel/planner.h).
    const GpuMemory gpu = memory_budget(o, world.size());
    if (automatic && world.size() > 1) {
        const std::string choice =
            choose_auto_layout(o, requested, sources, config, world.size(), fewest_ranks_per_node(), gpu,
                               host_budget(world.size()));
        std::printf("parallel: auto on %d ranks: %s\n", world.size(), choice.c_str());
    }
    if (const std::string line = resolve_auto_checkpointing(o, config, world.size(), gpu); !line.empty())
        std::printf("%s\n", line.c_str());
    check_plan_fits(plan_request(o, config, world.size()), gpu);
    if (o.epochs == 0) (void)lr_config_of(o);  // the schedule's checks, before anything is written
    if (world.rank() == 0 && !lock) lock.emplace(o.out_dir);  // creates the directory
    const RunSources from{resume_dir, init_dir, sources};
    return with_dtype(o.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            if (o.fp32_grad_accumulation)
                return run_training<T, float>(o, requested, std::move(data), config, from, world);
        }
        return run_training<T, T>(o, requested, std::move(data), config, from, world);
    });
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

// The dtype a command runs in: --dtype, else the model directory's own.
std::string run_dtype(const std::string& requested, const ModelDir& m) {
    return requested.empty() ? m.dtype : requested;
}

std::string ids_json(const std::vector<int>& ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
    return s + "]";
}

// The ids generation starts from: --prompt-ids; --prompt encoded (BOS first when the tokenizer
// has one), or with --chat rendered as one user turn of the model's chat format and followed by
// the assistant's header; with neither, the start token alone.
std::vector<int> sample_prompt(const SampleOptions& o, const Tokenizer* tokenizer, const ModelDir& m, int bos,
                               const std::vector<int>& stop_ids) {
    if (!o.prompt_ids.empty()) {
        if (o.chat) throw std::invalid_argument("--chat renders a text prompt: give --prompt instead of --prompt-ids");
        return o.prompt_ids;
    }
    if (!o.chat) {
        if (!o.chat_format.empty()) throw std::invalid_argument("--chat-format goes with --chat");
        if (o.prompt.empty()) return {start_token(bos, stop_ids.empty() ? -1 : stop_ids.front())};
        std::vector<int> ids;
        if (tokenizer->bos_id() >= 0) ids.push_back(tokenizer->bos_id());  // as the post-processor adds it
        const std::vector<int> text = tokenizer->encode(o.prompt, false);
        ids.insert(ids.end(), text.begin(), text.end());
        return ids;
    }
    const ChatFormat format = resolve_chat_format(o.chat_format, tokenizer_config_beside(m.tokenizer));
    check_chat_tokens(*tokenizer, format);
    Example e;
    e.kind = ExampleKind::chat;
    e.messages = {ChatMessage{ChatRole::user, o.prompt}};
    e.where = "--prompt";
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> flags;
    encode_example(*tokenizer, e, ExampleEncoding{format, /*train_on_prompt=*/true}, tokens, flags);
    std::vector<int> ids(tokens.begin(), tokens.end());
    const std::vector<int> header = tokenizer->encode(chat_generation_prompt(format), true);
    ids.insert(ids.end(), header.begin(), header.end());
    return ids;
}

template <class T>
int sample_with(const SampleOptions& o, const ModelDir& m) {
    const LlamaConfig& config = m.config;
    std::unique_ptr<Tokenizer> tokenizer;
    if (!m.tokenizer.empty()) tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(m.tokenizer));
    if (!tokenizer && (!o.print_ids || !o.prompt.empty()))
        throw std::runtime_error("'" + m.path +
                                 "' has no tokenizer.json: without it there is no text to read or print; give the "
                                 "prompt as --prompt-ids and read the output with --print-ids (or copy the model's "
                                 "tokenizer.json into the directory)");
    // The declared end-of-sequence tokens: the tokenizer's and the generation config's.
    std::vector<int> stop_ids = m.eos_ids;
    if (tokenizer && tokenizer->eos_id() >= 0) stop_ids.push_back(tokenizer->eos_id());
    const int bos = tokenizer && tokenizer->bos_id() >= 0 ? tokenizer->bos_id() : m.bos_id;
    GenerateOptions g;
    g.prompt = sample_prompt(o, tokenizer.get(), m, bos, stop_ids);
    const long long positions = config.max_seq_len, prompt = (long long)g.prompt.size();
    if (o.max_tokens == 0) {
        g.max_tokens = int(std::min<long long>(kDefaultSampleTokens, positions - prompt));
        if (g.max_tokens < 1)
            throw std::invalid_argument("the prompt's " + std::to_string(prompt) +
                                        " tokens leave no room in the model's max_position_embeddings of " +
                                        std::to_string(positions) + ": shorten the prompt");
    } else {
        g.max_tokens = o.max_tokens;
        if (prompt >= positions)  // no --max-tokens fits: the prompt is what to change
            throw std::invalid_argument("the prompt's " + std::to_string(prompt) +
                                        " tokens alone fill the model's max_position_embeddings of " +
                                        std::to_string(positions) + ", leaving no room for --max-tokens " +
                                        std::to_string(o.max_tokens) + ": shorten the prompt");
        if (prompt + o.max_tokens > positions)
            throw std::invalid_argument("the prompt's " + std::to_string(prompt) + " tokens + --max-tokens " +
                                        std::to_string(o.max_tokens) + " = " + std::to_string(prompt + o.max_tokens) +
                                        " exceed the model's max_position_embeddings of " + std::to_string(positions) +
                                        ": lower --max-tokens to at most " + std::to_string(positions - prompt));
    }
    g.temperature = o.temperature, g.top_p = o.top_p, g.seed = o.seed, g.stop_ids = stop_ids;

    Llama<T> model(config, inference_model(m, 1, 1));
    load_model_dir(m, model);
    Decoder<T> decoder(model, int(prompt) + g.max_tokens - 1, int(prompt));
    std::optional<TokenStreamDecoder> text;  // the generated text, printed as each character completes
    if (tokenizer) {  // the prompt as given (not the start token an empty prompt begins from), or the rendered chat
        const std::string shown = o.chat                 ? tokenizer->decode(g.prompt)
                                  : o.prompt_ids.empty() ? o.prompt
                                                         : tokenizer->decode(o.prompt_ids);
        std::fputs(shown.c_str(), stdout);
        std::fflush(stdout);
        text.emplace(*tokenizer, g.prompt, /*skip_special=*/true);
    }
    const GenerateResult r = generate(decoder, g, [&](int id) {
        if (!text) return;
        // A padding row of an embedding larger than the tokenizer has no text: show its id.
        const std::string piece = id < tokenizer->vocab_size() ? text->push(id) : "[id " + std::to_string(id) + "]";
        std::fputs(piece.c_str(), stdout), std::fflush(stdout);
    });
    if (text) std::printf("%s\n", text->finish().c_str());
    if (o.print_ids) std::printf("%s\n", ids_json(r.ids).c_str());
    std::fflush(stdout);
    std::fprintf(stderr,
                 "prefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s (%.1f tokens/s)%s\n",
                 prompt, r.prefill_seconds, double(prompt) / r.prefill_seconds, r.decode_steps(), r.decode_seconds,
                 r.decode_steps() > 0 ? double(r.decode_steps()) / r.decode_seconds : 0.0,
                 r.stopped ? "; stopped at an end-of-sequence token" : "");
    return 0;
}

int sample_command(const SampleOptions& o) {
    const ModelDir m = open_model_dir(o.model);
    const std::string dtype = run_dtype(o.dtype, m);
    check_model_fits(m, dtype);
    std::fprintf(stderr, "sampling from %s (%s, %s)\n", m.path.c_str(),
                 m.checkpoint ? ("step " + std::to_string(m.step)).c_str() : "Hugging Face model", dtype.c_str());
    return with_dtype(dtype, [&](auto tag) { return sample_with<typename decltype(tag)::type>(o, m); });
}

template <class T>
int eval_with(const ModelDir& m, std::vector<TokenShard> shards, int seq_len, int batch, long long max_windows,
              bool document_mask) {
    // The seed orders training only; eval reads the windows in order.
    const DataLoader data(std::move(shards), seq_len, 0, document_mask);
    Llama<T> model(m.config, inference_model(m, batch, seq_len));
    load_model_dir(m, model);
    const auto t0 = std::chrono::steady_clock::now();
    const EvalResult r = evaluate_windows(model, data, max_windows);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "evaluated %lld windows of %d tokens in %.1f s (%.0f tokens/s)\n", r.windows, seq_len, seconds,
                 double(r.windows) * seq_len / seconds);
    std::printf("loss %.17g perplexity %.17g tokens %lld windows %lld\n", r.loss(), std::exp(r.loss()), r.tokens,
                r.windows);
    return 0;
}

int eval_command(const EvalOptions& o) {
    const ModelDir m = open_model_dir(o.model);
    const std::string dtype = run_dtype(o.dtype, m);
    check_model_fits(m, dtype);
    DataSet set = load_dataset(o.data);
    const bool validation = set.val.has_value();
    std::vector<TokenShard> shards;
    if (validation)
        shards.push_back(std::move(*set.val));
    else
        shards = std::move(set.train);
    long long tokens = 0;
    for (const TokenShard& s : shards) {
        tokens += (long long)s.tokens.size();
        if (s.vocab_size > uint32_t(m.config.vocab_size))
            throw std::invalid_argument("the data's vocabulary (" + std::to_string(s.vocab_size) +
                                        ") is larger than the model's (" + std::to_string(m.config.vocab_size) +
                                        "): the data was tokenized for another model");
    }
    const int seq_len = o.seq_len > 0 ? o.seq_len : m.seq_len > 0 ? m.seq_len : std::min(m.config.max_seq_len, 1024);
    if (seq_len > m.config.max_seq_len)
        throw std::invalid_argument("--seq-len " + std::to_string(seq_len) +
                                    " exceeds the model's max_position_embeddings of " +
                                    std::to_string(m.config.max_seq_len) + ": use a shorter window");
    if (tokens < (long long)seq_len + 1)
        throw std::invalid_argument("the data has " + std::to_string(tokens) + " tokens, fewer than one window of " +
                                    std::to_string(seq_len) + " + 1 = " + std::to_string(seq_len + 1) +
                                    ": 0 windows to evaluate; use a shorter --seq-len or more data");
    // A checkpoint's own validation settings by default (trainer/model_dir.h): the same windows,
    // mask and forward-pass size give the run's last validation loss.
    const bool document_mask = o.document_mask >= 0 ? o.document_mask == 1 : m.document_mask;
    const long long max_windows = o.max_windows >= 0 ? o.max_windows : m.validation_windows;
    const int batch = o.batch > 0 ? o.batch : m.validation_micro_batch > 0 ? m.validation_micro_batch : 1;
    std::fprintf(stderr, "evaluating %s (%s, %s) on %s (%s, %lld tokens), windows of %d tokens%s, %s\n",
                 m.path.c_str(), m.checkpoint ? ("step " + std::to_string(m.step)).c_str() : "Hugging Face model",
                 dtype.c_str(), o.data.c_str(), validation ? "validation shard" : "training shards", tokens, seq_len,
                 document_mask ? ", document mask on" : "",
                 max_windows > 0 ? ("the first " + std::to_string(max_windows) +
                                    (o.max_windows < 0 ? " (the run's validation windows; --max-windows 0 for all)" : ""))
                                       .c_str()
                                 : "every window");
    return with_dtype(dtype, [&](auto tag) {
        return eval_with<typename decltype(tag)::type>(m, std::move(shards), seq_len, batch, max_windows,
                                                       document_mask);
    });
}

// The model a plan is for, without reading data: --init-from's or --resume's config.json,
// --config, --preset, or the default model at the built-in tokenizer's --vocab.
LlamaConfig plan_config(const TrainOptions& o) {
    if (!o.resume.empty()) return read_hf_config(resolve_checkpoint(o.resume) + "/config.json");
    if (!o.init_from.empty()) return read_hf_config(o.init_from + "/config.json");
    if (!o.config.empty()) return read_hf_config(o.config);
    if (!o.preset.empty()) return preset(o.preset);
    return default_model(o.vocab, o.seq_len);
}

// `train plan --search`: every layout of --ranks GPUs, the five fastest that fit, what stays
// fixed as --parallel auto keeps it (trainer/auto_layout.h).
void print_layout_search(const TrainOptions& o, const TrainOptions& flags, const OptionSources& sources,
                         const LlamaConfig& config, int ranks, const GpuMemory& gpu) {
    const SearchRequest r = layout_search_request(o, flags, sources, plan_request(o, config, ranks), ranks,
                                                  interconnect_of(o, 0), gpu.usable(), 0);
    const SearchResult result = search_layouts(r);
    std::printf("\n%s", format_search(r, result).c_str());
    if (!result.fitting.empty())
        std::printf("fastest: %s\nrun it with: %s\n", describe_choice(result).c_str(),
                    result.fitting.front().flags().c_str());
}

// `train plan`: the memory per rank by category, the verdict, what fits.
int plan_command(const TrainOptions& given, const OptionSources& sources, const PlanOptions& p) {
    TrainOptions flags = given;
    apply_accumulation(flags, p.ranks);  // --accumulation: the global batch at --ranks
    TrainOptions o = flags;
    apply_adapter_config(o);
    const LlamaConfig config = plan_config(o);
    if (o.seq_len == 0 && !o.data.empty()) {  // from the data, as the run will take it
        DataSet set = load_dataset(o.data);
        RunData data;
        data.train = std::move(set.train), data.val = std::move(set.val);
        std::string why;
        o.seq_len = seq_len_from_data(data, config, &why);
        std::printf("--seq-len %d from the data: %s\n", o.seq_len, why.c_str());
    } else if (o.seq_len == 0) {
        o.seq_len = std::min(config.max_seq_len, 2048);
        std::printf("--seq-len: the run takes it from --data (its longest example); planned here at %d (give --data "
                    "or --seq-len for the run's own)\n",
                    o.seq_len);
    }
    if (o.seq_len > config.max_seq_len)
        throw std::invalid_argument("--seq-len " + std::to_string(o.seq_len) +
                                    " exceeds the model's max_position_embeddings of " +
                                    std::to_string(config.max_seq_len) + ": use a shorter sequence");
    const GpuMemory gpu = parse_gpu_memory(o.gpu_memory.empty() ? "h100-80" : o.gpu_memory);
    const std::string requested_strategy = o.parallel;
    check_option_rules(o, p.ranks);
    if (o.parallel == "auto") {  // as in train_command: the rules table checked a named strategy
        guess_auto_strategy(o, p.ranks);
        check_strategy(strategy_options(o, p.ranks), p.ranks);
    }
    resolve_micro_batch(o, p.ranks);
    std::string choice = "one rank";
    if (requested_strategy == "auto" && p.ranks > 1)
        choice = choose_auto_layout(o, flags, sources, config, p.ranks, 0, gpu, 0);  // another machine's host
    const std::string auto_checkpointing = resolve_auto_checkpointing(o, config, p.ranks, gpu);
    const PlanRequest q = plan_request(o, config, p.ranks);
    std::printf(
        "plan: model %s (%lld parameters), %s, %s on %d rank(s), micro-batch %d x %d tokens, %d micro-step(s) "
        "per step%s\n",
        config.name.c_str(), parameter_count(config), o.dtype.c_str(), o.parallel.c_str(), p.ranks, o.micro_batch,
        o.seq_len, q.accumulation, q.groups.lora.enabled() ? (q.groups.nf4 ? ", QLoRA" : ", LoRA") : "");
    if (requested_strategy == "auto")
        std::printf("--parallel auto: %s\n", choice.c_str());
    if (!auto_checkpointing.empty()) std::printf("%s\n", auto_checkpointing.c_str());
    const MemoryPlan plan = plan_memory(q);
    std::printf("%s", format_plan(plan, &gpu).c_str());
    if (p.ranks > 1) std::printf("mesh: %s\n%s", describe_mesh(mesh_of(q.strategy, p.ranks)).c_str(),
                                 draw_mesh(mesh_of(q.strategy, p.ranks)).c_str());
    if (q.strategy.tensor > 1) {  // per pipeline stage (one without a pipeline): its first rank's group
        const int stages = mesh_of(q.strategy, p.ranks).pipeline;
        for (int s = 0; s < stages; ++s) {
            const TensorWire w = plan_tensor_wire(q, s * (p.ranks / stages));
            std::printf("tensor parallelism%s%s: per step %lld all-reduces, %lld all-gathers and %lld "
                        "reduce-scatters within each group of %d ranks, %.2f GB sent per rank (parallel/comm_cost.h)\n",
                        q.strategy.sequence_parallel ? " with sequence parallelism" : "",
                        stages > 1 ? (" (stage " + std::to_string(s) + ")").c_str() : "", w.all_reduces,
                        w.all_gathers, w.reduce_scatters, q.strategy.tensor, w.bytes / 1e9);
        }
    }
    if (has_pipeline(q.strategy)) {
        const PipelineSchedule schedule = pipeline_schedule_of(q.strategy, mesh_of(q.strategy, p.ranks).pipeline);
        std::printf("pipeline: %s\n", describe_pipeline_schedule(schedule).c_str());
        if (p.show_schedule) std::printf("%s", draw_pipeline_schedule(schedule).c_str());
    } else if (p.show_schedule) {
        std::printf("--show-schedule: --parallel %s runs no pipeline (each micro-batch's forward, then its backward)\n",
                    o.parallel.c_str());
    }
    if (const int m = largest_micro_batch(q, gpu.usable()); m > 0)
        std::printf("largest micro-batch that fits: %d\n", m);
    else
        std::printf("largest micro-batch that fits: none (micro-batch 1 does not fit either)\n");
    std::printf("smallest world size that fits:");
    for (const StrategyInfo& s : strategy_registry()) {
        const int n = smallest_world(q, s.name, gpu.usable());
        std::printf(" %s %s%s", s.name,
                    n > 0    ? std::to_string(n).c_str()
                    : n == 0 ? "none up to 4096"
                             : "cannot run these options",
                    &s == &strategy_registry().back() ? "\n" : ",");
    }
    const bool fits = plan.peak() <= gpu.usable();
    std::vector<std::string> changes;
    if (!fits) changes = changes_that_fit(q, gpu.usable());
    for (const std::string& c : changes) std::printf("would fit: %s\n", c.c_str());
    if (p.compare) {
        std::printf("\nevery strategy on %d rank(s):\n", p.ranks);
        for (const StrategyInfo& s : strategy_registry()) {
            PlanRequest alt = q;
            alt.strategy = with_strategy(q.strategy, s.kind);
            try {
                const MemoryPlan a = plan_memory(alt);
                std::printf("  %-6s %12s per rank (largest rank)  %s\n", s.name, format_bytes(a.peak()).c_str(),
                            a.peak() <= gpu.usable() ? "fits" : "does not fit");
            } catch (const std::invalid_argument& e) {
                std::printf("  %-6s cannot run: %s\n", s.name, e.what());
            }
        }
    }
    if (p.search) print_layout_search(o, flags, sources, config, p.ranks, gpu);
    if (fits) return 0;
    // Exit status 1: scripts and schedulers see that this run cannot start as given.
    std::printf("\ndoes not fit: this run needs %s per rank, %s usable on %s; %s\n", format_bytes(plan.peak()).c_str(),
                format_bytes(gpu.usable()).c_str(), gpu.name.empty() ? "the --gpu-memory given" : gpu.name.c_str(),
                changes.empty() ? "none of the changes tried (smaller micro-batches, activation checkpointing, ZeRO, "
                                  "offload, more ranks up to 4096, LoRA, QLoRA) fits either"
                                : "the changes above would fit");
    return 1;
}

int prepare_command(const PrepareOptions& o) {
    const PreparedData p = prepare_data(o);
    std::printf(
        "prepared %lld documents (%lld text, %lld prompt/completion, %lld chat%s%s): %lld training tokens in %zu "
        "shard(s), %lld validation tokens, vocabulary %d\n"
        "  %lld of the %lld tokens count as targets (%.1f%%)%s\n"
        "  tokenizer  %s\n  validation %s\n",
        p.documents, p.text_documents, p.prompt_completion_documents, p.chat_documents,
        p.chat_format.empty() ? "" : " in format ", p.chat_format.c_str(), p.train_tokens, p.train_shards.size(),
        p.val_tokens, p.vocab_size, p.counted_tokens, p.train_tokens + p.val_tokens,
        100.0 * double(p.counted_tokens) / double(p.train_tokens + p.val_tokens),
        o.train_on_prompt || p.documents == p.text_documents ? "" : ": completions and assistant turns",
        p.tokenizer_path.c_str(), p.val_shard.c_str());
    for (const std::string& s : p.train_shards) std::printf("  training   %s\n", s.c_str());
    if (o.truncate > 0)
        std::printf("  --truncate %lld: %lld example(s) cut to %lld tokens, %lld left out (nothing counted in "
                    "their first %lld tokens)\n",
                    o.truncate, p.truncated_documents, o.truncate, p.dropped_documents, o.truncate);
    std::printf("train on it with: train --data %s\n", o.out_dir.c_str());
    return 0;
}

// A resume with another --steps (or --epochs) changes the learning-rate schedule's length: the user
// says how (--extend-schedule, --keep-schedule), told what each does to the next step's learning
// rate; refused otherwise. --keep-schedule fixes the schedule at the checkpoint's.
void check_schedule_change(const TrainOptions& saved, long long step, TrainOptions& o) {
    const bool changed = o.steps != saved.steps || o.epochs != saved.epochs;
    if (!changed && (o.extend_schedule || o.keep_schedule))
        throw std::invalid_argument(std::string(o.extend_schedule ? "--extend-schedule" : "--keep-schedule") +
                                    " goes with a --resume that changes --steps (or --epochs): drop it");
    if (!changed) return;
    if (saved.epochs > 0 || o.epochs > 0) {
        if (o.keep_schedule)
            throw std::invalid_argument("--keep-schedule with --epochs: the schedule's steps are counted from the data "
                                        "when the run starts; give --extend-schedule");
        if (!o.extend_schedule)
            throw std::invalid_argument("--epochs changes the learning-rate schedule's length on --resume: give "
                                        "--extend-schedule to stretch it over the new epochs");
        o.schedule_steps = 0;
        return;
    }
    const LrConfig before = lr_config_of(saved);
    TrainOptions stretched = o;
    stretched.schedule_steps = 0;
    const LrConfig after = lr_config_of(stretched);
    char text[160];
    std::snprintf(text, sizeof text, "step %lld's learning rate becomes %.3e (%.3e in the schedule it was trained with)",
                  step + 1, learning_rate(after, step), learning_rate(before, step));
    if (o.keep_schedule) {
        o.schedule_steps = before.total_steps;
        std::printf("resume: --keep-schedule: the learning-rate schedule stays the checkpoint's %lld steps; steps past "
                    "it run at its final learning rate %.3e\n",
                    before.total_steps, learning_rate(before, before.total_steps));
        return;
    }
    if (o.extend_schedule) {
        o.schedule_steps = 0;
        std::printf("resume: --extend-schedule: the learning-rate schedule now spans %lld steps; %s\n", o.steps, text);
        return;
    }
    throw std::invalid_argument(
        "--steps " + std::to_string(o.steps) + " with --resume: the checkpoint's learning-rate schedule spans " +
        std::to_string(before.total_steps) + " steps. Say what happens to it: --extend-schedule stretches it over " +
        std::to_string(o.steps) + " steps (" + text + "), --keep-schedule keeps it (steps past " +
        std::to_string(before.total_steps) + " run at its final learning rate)");
}

// A fine-tuning run's defaults (--init-from, a new run): what the flags not given take instead of the
// built-in demo's. `first` is the command line parsed over the demo's defaults.
TrainOptions fine_tuning_defaults(const TrainOptions& first) {
    TrainOptions d;
    d.lr = first.lora_rank > 0 ? 2e-4 : 2e-5;  // the usual LoRA and full fine-tuning rates
    d.warmup = 0, d.warmup_ratio = 0.03;       // Hugging Face's common warmup_ratio
    d.seq_len = 0;                             // the data's longest example (trainer/run_data.h)
    d.document_mask = true;                    // packed examples never see each other
    d.sample_tokens = 0;                       // no closing sample continuing the demo's prompt
    return d;
}

// The fine-tuning defaults a run took (the flags that differ from the demo's): one line.
std::string fine_tuning_note(const TrainOptions& demo, const TrainOptions& o) {
    std::string taken;
    const auto add = [&](bool differs, const std::string& what) {
        if (differs) taken += (taken.empty() ? "" : ", ") + what;
    };
    char lr[32];
    std::snprintf(lr, sizeof lr, "%g", o.lr);
    add(demo.lr != o.lr, std::string("--lr ") + lr + (o.lora_rank > 0 ? " (LoRA)" : " (full fine-tuning)"));
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%g", o.warmup_ratio);
    add(demo.warmup_ratio != o.warmup_ratio, std::string("--warmup-ratio ") + ratio);
    add(demo.seq_len != o.seq_len, "--seq-len from the data");
    add(demo.document_mask != o.document_mask, "--document-mask");
    add(demo.sample_tokens != o.sample_tokens, "no closing sample (--sample-tokens N asks for one)");
    return taken.empty() ? "" : "fine-tuning defaults (--init-from): " + taken + "; a flag given overrides each";
}

// The run file's keys accepted and ignored (logging_steps), once.
void print_notes(const Command& c) {
    for (const std::string& n : c.notes) std::printf("%s\n", n.c_str());
}

int main_checked(int argc, char** argv) {
    Command c = parse_command(argc, argv);
    // --init-from starts a fine-tuning run: the flags not given take fine-tuning's defaults.
    std::string fine_tuning;
    if ((c.kind == Command::Kind::train || c.kind == Command::Kind::plan) && !c.train.init_from.empty() &&
        c.train.resume.empty()) {
        const TrainOptions demo = c.train;
        c = parse_command(argc, argv, fine_tuning_defaults(demo));
        fine_tuning = fine_tuning_note(demo, c.train);
    }
    if (!fine_tuning.empty() && c.kind == Command::Kind::plan) std::printf("%s\n", fine_tuning.c_str());
    if (c.kind == Command::Kind::plan) print_notes(c);
    if (c.kind == Command::Kind::plan) return plan_command(c.train, c.train_sources, c.plan);
    if (c.kind == Command::Kind::sample) return sample_command(c.sample);
    if (c.kind == Command::Kind::eval) return eval_command(c.eval);
    if (c.kind == Command::Kind::prepare) return prepare_command(c.prepare);
    if (c.kind == Command::Kind::convert) return convert_command(c.convert);
    if (c.kind == Command::Kind::export_model) return export_model(c.export_model), 0;
    if (c.kind == Command::Kind::tokenize) return tokenize_command(c.tokenize, std::cin, std::cout);
    if (c.kind == Command::Kind::plot) return std::printf("plot: %s\n", plot_runs(c.plot).c_str()), 0;
    check_file_size_limit();  // before MPI_Init, which fails under a tiny one saying nothing of it (trainer/out_dir.h)
    install_stop_signals();  // before MPI starts its threads (trainer/signals.h)
    World world(&argc, &argv);
    if (world.rank() != 0 && !std::freopen("/dev/null", "w", stdout))  // rank 0 reports; errors from any rank
        throw std::runtime_error("cannot silence the standard output of rank " + std::to_string(world.rank()));
    Progress::set_enabled(world.rank() == 0);  // rank 0 reports the progress of long operations (io/progress.h)
    print_notes(c);
    apply_accumulation(c.train, world.size(), &c.train_sources);
    if (!fine_tuning.empty()) std::printf("%s\n", fine_tuning.c_str());
    check_init_from(c.train);  // the command line's own flags, before a checkpoint's fill in the rest
    std::string resume_dir;
    long long saved_step = 0;
    if (!c.train.resume.empty()) {
        // The checkpoint's options, then this command line's flags on top.
        resume_dir = resolve_checkpoint(c.train.resume);
        const TrainerState saved_state = read_trainer_state(resume_dir + "/" + kTrainerStateFile);
        saved_step = saved_state.step;
        const TrainOptions& saved = saved_state.options;
        c = parse_command(argc, argv, saved, OptionSource::checkpoint);
        apply_accumulation(c.train, world.size(), &c.train_sources);
        // Another strategy or world size drops the checkpoint's pipeline stages (unless given again):
        // the checkpoint is whole either way.
        if (c.train.pipeline_stages == saved.pipeline_stages && saved.pipeline_stages > 0 &&
            (c.train.parallel != saved.parallel || world.size() % saved.pipeline_stages != 0 ||
             world.size() == saved.pipeline_stages))
            c.train.pipeline_stages = 0;
        // Leaving a pipeline for another strategy drops its micro-batches in flight (unless given again).
        if (c.train.parallel != "pp" && c.train.pipeline_stages <= 1 && c.train.in_flight == saved.in_flight)
            c.train.in_flight = 0;
        // Leaving the interleaved schedule drops its chunks (unless given again).
        if (c.train.pipeline_schedule != "interleaved" && c.train.pipeline_chunks == saved.pipeline_chunks)
            c.train.pipeline_chunks = 0;
        // Another world size that --tp does not divide drops the checkpoint's tensor
        // parallelism (unless given again): the checkpoint holds whole tensors either way.
        if (c.train.tp == saved.tp && saved.tp > 1 && world.size() % saved.tp != 0)
            c.train.tp = 1;
        // No tensor parallelism drops the checkpoint's sequence parallelism (unless given again).
        if (c.train.tp <= 1 && c.train.sequence_parallel && c.train_sources.of("sequence_parallel") == OptionSource::checkpoint)
            c.train.sequence_parallel = false;
        // Leaving ZeRO drops its shard group (unless given again): the checkpoint is whole either way.
        if (c.train.parallel != "auto" && !strategy_info(c.train.parallel).policy.shards() &&
            c.train.shard_group == saved.shard_group)
            c.train.shard_group = 0;
        check_schedule_change(saved, saved_state.step, c.train);
        TrainOptions compare = c.train;
        compare.resume = saved.resume;
        compare.stop_after = saved.stop_after;
        for (const std::string& change : train_options_diff(saved, compare)) {
            for (const char* fixed :
                 {"--preset:", "--config:", "--init-from:", "--vocab:", "--dtype:", "--batch:", "--seq-len:", "--seed:",
                  "--freeze:", "--document-mask:", "--lora-rank:", "--lora-alpha:", "--rslora:", "--lora-targets:",
                  "--quantize:", "--double-quant:"})
                if (change.rfind(fixed, 0) == 0)
                    throw std::invalid_argument("cannot change " + change +
                                                " when resuming: the checkpoint's model, "
                                                "data order and batches depend on it; start a new run instead");
            if (change.rfind("--schedule-steps:", 0) == 0) continue;  // said by check_schedule_change
            const bool harmless = change.rfind("--checkpoint-activations:", 0) == 0;
            std::string key = change.substr(2, change.find(':') - 2);  // "--seq-len: ..." -> seq_len
            std::replace(key.begin(), key.end(), '-', '_');
            std::printf("resume: %s (from the %s%s)\n", change.c_str(), source_name(c.train_sources.of(key)),
                        harmless ? "; recomputing activations leaves every gradient bit the same" : "");
        }
    }
    // Rank 0 holds the output directory's lock (trainer/out_dir.h) until it exits: taken here,
    // before anything there is checked or loaded, when the directory exists; otherwise once the
    // options have passed their checks (train_command), so a refused run creates nothing.
    std::optional<OutDirLock> lock;
    try {
        check_out_dir(c.train.out_dir);
        if (world.rank() == 0 && std::filesystem::is_directory(c.train.out_dir)) lock.emplace(c.train.out_dir);
        if (!resume_dir.empty()) {
            check_branch(resume_dir, saved_step, c.train.out_dir, c.train.overwrite_later, c.train.overwrite);
        } else if (c.train.overwrite_later) {
            throw std::invalid_argument(
                "--overwrite-later goes with --resume DIR/step_N (it removes DIR's later checkpoints): drop it");
        } else {
            check_no_run(c.train.out_dir, c.train.overwrite, "");
        }
    } catch (const std::exception& e) {
        if (world.size() > 1) abort_all_ranks(std::string("train: ") + e.what());  // any rank: never leave the others waiting
        throw;
    }
    world.watch_collectives(c.train.collective_timeout);  // every rank, once its options are known
    try {
        return train_command(c.train, c.train_sources, resume_dir, world, lock);
    } catch (const std::exception& e) {
        if (world.size() > 1) abort_all_ranks(std::string("train: ") + e.what());  // never leave the others waiting
        throw;
    }
}

}  // namespace
}  // namespace pv

int main(int argc, char** argv) {
    pv::ignore_file_size_signal();  // a file-size limit becomes a write error with a message
    try {
        return pv::main_checked(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "train: %s\n", e.what());
        return 1;
    }
}
