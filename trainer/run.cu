// One training run, in phases (trainer/run.h): TrainingRun builds everything in its constructor
// (data loaders, schedule, the strategy's plan, the model, the strategy, the weights of
// --init-from, the optimizer), then run() resumes, opens the metrics, prints the header, trains
// step by step and finishes.
#include "trainer/run.h"

#include "data/loader.h"
#include "formats/config_json.h"
#include "io/durable_file.h"
#include "kernels/glue.cuh"
#include "model/flops.h"
#include "model/freeze.h"
#include "model/llama.h"
#include "model/tensor_parallel.h"
#include "optim/optimizer.cuh"
#include "optim/schedule.h"
#include "parallel/strategies.h"
#include "platform/device_memory.h"
#include "trainer/checkpoint.h"
#include "trainer/compute_stream.h"
#include "trainer/generate.h"
#include "trainer/metrics_json.h"
#include "trainer/out_dir.h"
#include "trainer/signals.h"
#include "trainer/rank_agreement.h"
#include "trainer/state.h"
#include "trainer/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace pv {

namespace {

double mib(size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

// "H:MM:SS" of a duration in seconds (hours grow as needed).
std::string clock_text(double seconds) {
    const long long s = std::llround(std::max(0.0, seconds));
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    return text;
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

// Every rank's load figures (seconds, bytes read, overflows) on every rank, in rank order:
// collective over the world (an all-gather of 3 doubles per rank, outside any step).
std::vector<std::array<double, 3>> gather_load_stats(World& world, const LoadStats& s) {
    const std::array<double, 3> mine{s.seconds, double(s.bytes_read), double(s.overflows)};
    std::vector<std::array<double, 3>> all(size_t(world.size()));
    if (world.size() == 1) return {mine};
    DeviceBuffer<double> buffer(3 * size_t(world.size()), MemoryCategory::workspace);
    double* slot = buffer.get() + 3 * world.rank();
    CUDA_CHECK(cudaMemcpy(slot, mine.data(), sizeof mine, cudaMemcpyHostToDevice));
    world.comm().all_gather(slot, buffer.get(), 3);
    world.comm().synchronize();
    CUDA_CHECK(cudaMemcpy(all.data(), buffer.get(), buffer.bytes(), cudaMemcpyDeviceToHost));
    return all;
}

// "what: ...; rank 0 read N bytes in T s" (one rank), or a line per rank; rank 0 prints.
void report_load(World& world, const std::string& what, const LoadStats& s) {
    const auto all = gather_load_stats(world, s);
    auto rank_line = [&](int r) {
        const auto& f = all[size_t(r)];
        char line[160];
        std::snprintf(
            line, sizeof line, "rank %d read %.0f bytes in %.3f s%s", r, f[1], f[0],
            f[2] > 0 ? (", " + std::to_string((long long)f[2]) + " values overflowed (now inf)").c_str() : "");
        return std::string(line);
    };
    std::printf("%s", what.c_str());
    if (!s.skipped.empty()) {
        std::printf("; skipped %zu tensor(s) Hugging Face ignores too (%s%s)", s.skipped.size(), s.skipped[0].c_str(),
                    s.skipped.size() > 1 ? ", ..." : "");
    }
    if (world.size() == 1) {
        std::printf("; %s\n", rank_line(0).c_str());
        return;
    }
    std::printf("\n");
    for (int r = 0; r < world.size(); ++r) std::printf("  %s\n", rank_line(r).c_str());
}

// "2 files (BF16, F16)": what a load read.
std::string files_read(const LoadStats& s) {
    std::string dtypes;
    for (const std::string& d : s.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d;
    return std::to_string(s.files) + (s.files == 1 ? " file" : " files") + " (" + dtypes + ")";
}

static_assert(kIgnoreTarget == kIgnoreIndex, "the loader's masked target is the cross-entropy's ignore index");

// The fingerprint chained over a shard's flags too (none: version-1 data, whose fingerprint stays
// what it was), so re-preparing with other masks counts as other data.
uint64_t fingerprint_flags(const std::vector<uint8_t>& flags, uint64_t h) {
    std::vector<uint32_t> chunk;
    for (size_t begin = 0; begin < flags.size(); begin += chunk.size()) {
        chunk.assign(flags.begin() + long(begin), flags.begin() + long(std::min(flags.size(), begin + (1u << 20))));
        h = fingerprint_tokens(chunk, h);
    }
    return h;
}

// One line on what the data gives: documents, windows, packing and what counts.
void print_data(const char* name, const DataLoader& d) {
    const DataLoader::Counts& c = d.counts();
    std::printf("%s data: %lld documents, %lld tokens, %lld windows of %d tokens", name, c.documents, d.total_tokens(),
                d.windows(), d.seq_len() + 1);
    if (d.packed())
        std::printf(" (%lld chats or prompts packed whole, %lld padding tokens)",
                    c.unsplittable_documents - c.dropped_documents, c.padding_tokens);
    std::printf("; %lld of %lld targets count (%.1f%%)%s\n", c.counted_targets, c.targets,
                100.0 * double(c.counted_targets) / double(std::max(1LL, c.targets)),
                d.document_mask() ? ", document mask on" : "");
    if (c.dropped_documents > 0)
        std::printf(
            "%s data: dropped %lld chats or prompts longer than %d tokens (%lld tokens): raise --seq-len to train on "
            "them\n",
            name, c.dropped_documents, d.seq_len() + 1, c.dropped_tokens);
}


// Values in range but absurd for this data: a step of more windows than the data has would repeat
// them within the step (refused); evaluation batches beyond the validation set are capped at one
// pass over it (said, with the figures).
void check_batch_fits_data(const TrainOptions& o, long long train_windows, long long val_windows) {
    if (o.batch > train_windows)
        throw std::invalid_argument("--batch " + std::to_string(o.batch) + " is more than the " +
                                    std::to_string(train_windows) + " windows of " + std::to_string(o.seq_len + 1) +
                                    " tokens the training data has: each step would repeat windows; use --batch " +
                                    std::to_string(train_windows) + " or less (or more data, or a shorter --seq-len)");
    const long long asked = (long long)o.eval_batches * o.micro_batch;
    if (val_windows > 0 && o.eval_interval > 0 && asked > val_windows)
        std::printf("note: --eval-batches %d x micro-batch %d = %lld windows, but the validation data has %lld: each "
                    "evaluation takes all %lld once (%lld micro-batches)\n",
                    o.eval_batches, o.micro_batch, asked, val_windows, val_windows,
                    (val_windows + o.micro_batch - 1) / o.micro_batch);
}

template <class T, class G>
class TrainingRun {
  public:
    TrainingRun(const TrainOptions& o, const TrainOptions& requested, RunData data, const LlamaConfig& config,
                const RunSources& from, World& world)
        : o_(o),
          requested_(requested),
          config_(config),
          resume_dir_(from.resume_dir),
          init_dir_(from.init_dir),
          option_sources_(from.options),
          world_(world),
          plan_(plan_strategy(strategy_options(o, world.size()), config, o.seq_len, world.rank(), world.size())),
          accumulation_(accumulation_for(o.batch, o.micro_batch, plan_.data_ranks)),
          geometry_{o.batch, o.micro_batch, accumulation_, plan_.data_ranks},
          lr_(lr_config_of(o)),
          adamw_{o.beta1, o.beta2, o.eps, o.weight_decay, o.decay_norm_weights, o.stochastic_rounding, o.seed},
          source_(data.source),
          tokenizer_(std::move(data.tokenizer)),
          tokenizer_dir_(data.tokenizer_dir),
          data_eos_(int(data.train.front().eot_token)) {
        for (const TokenShard& s : data.train) {
            fingerprint_ = fingerprint_tokens(s.tokens, fingerprint_), train_tokens_ += (long long)s.tokens.size();
            fingerprint_ = fingerprint_flags(s.flags, fingerprint_);
        }
        // Before anything is allocated: every rank runs the same run (trainer/rank_agreement.h).
        const std::string statement = run_statement(o_, fingerprint_, tokenizer_ ? tokenizer_->id_fingerprint() : 0,
                                                    hf_config_json(config));
        if (const std::string problem = rank_disagreement(world.all_texts(statement)); !problem.empty())
            throw std::invalid_argument(problem);
        loader_.emplace(std::move(data.train), o.seq_len, o.seed, o.document_mask);
        if (o_.epochs > 0) {  // the steps of that many passes over the training windows
            const double windows = double(loader_->windows());
            o_.steps = std::max(1LL, (long long)std::ceil(o_.epochs * windows / double(o_.batch) - 1e-9));
            lr_ = lr_config_of(o_);
            std::printf("--epochs %g: %lld steps (%.0f training windows of %d tokens, --batch %d per step)\n",
                        o_.epochs, o_.steps, windows, o_.seq_len, o_.batch);
        }
        if (data.val)
            val_loader_.emplace(std::vector<TokenShard>{std::move(*data.val)}, o.seq_len, o.seed + 1, o.document_mask);
        check_batch_fits_data(o_, loader_->windows(), val_loader_ ? val_loader_->windows() : 0);
        // The strategy decides how the model is built and is applied to a model that knows nothing of it.
        const FrozenTensors frozen = resolve_freeze(config, split_patterns(o.freeze));
        for (const std::string& note : frozen.notes) std::printf("freeze: %s\n", note.c_str());
        ModelOptions model_options{
            o.micro_batch,       o.seq_len,      o.seed,          frozen.names,   lora_config(o),
            o.quantize == "nf4", o.double_quant, plan_.placement, compute_.get(), activation_checkpointing(o)};
        if (plan_.options.cuda_graphs) model_options.cublas_workspace_bytes = kCublasGraphWorkspaceBytes;
        model_ = std::make_unique<Llama<T>>(config, model_options);
        strategy_ = make_strategy<T, G>(plan_, *model_, &world.comm(), o.seed);
        // --init-from: the pretrained weights over the initial ones, each rank what it keeps, before
        // the optimizer takes its master copy from them.
        if (!init_dir_.empty()) {
            const LoadStats stats = load_pretrained(init_dir_, *strategy_);
            report_load(world,
                        std::string(model_->lora().enabled() ? "base" : "init") + " from " + init_dir_ + ": " +
                            files_read(stats) + " -> " + dtype_name(dtype_of<T>()),
                        stats);
        }
        // --adapter: a PEFT adapter's A and B over the initial ones (only when starting a run).
        if (!o.adapter.empty() && resume_dir_.empty()) {
            HfCheckpoint source = HfCheckpoint::open_file(o.adapter + "/" + kAdapterFile);
            const LoadStats stats =
                load_group_ranges(source, groups_of(*model_, GroupSet::trainable),
                                  param_ranges(*strategy_, GroupSet::trainable), ExtraTensors::refuse);
            report_load(world, "adapter from " + o.adapter + ": " + files_read(stats), stats);
        }
        // A LoRA checkpoint references its base instead of holding it: a resumed run reloads the
        // base from the same files, and refuses them if they are no longer what it trained on.
        if (model_->lora().enabled() && !o.init_from.empty()) base_fingerprint_ = model_files_fingerprint(o.init_from);
        if (model_->lora().enabled() && !resume_dir_.empty()) {
            const TrainerState saved = read_trainer_state(resume_dir_ + "/" + kTrainerStateFile);
            if (saved.base_fingerprint != base_fingerprint_)
                throw std::runtime_error("the base model " + o.init_from + " is not the one " + resume_dir_ +
                                         " was trained on (its files' fingerprint differs): its adapters belong to "
                                         "that base; restore the original files");
            if (!o.init_from.empty()) {
                const LoadStats stats = load_pretrained(o.init_from, *strategy_);
                report_load(world, "base from " + o.init_from + ": " + files_read(stats), stats);
            }
        }
        optimizer_ = Trainer<T, G>::make_optimizer(*strategy_, parse_offload(o.offload) != Offload::none);
        if (parse_offload(o.offload) != Offload::none) std::printf("%s\n", describe_offload_pool().c_str());
        trainer_ = std::make_unique<Trainer<T, G>>(*strategy_, *optimizer_);
        trainer_->set_skip_nonfinite(o.skip_nonfinite);
        if (plan_.options.cuda_graphs) trainer_->use_graphs();
    }

    int run() {
        test_signal_hook(0);  // the loading phase's answer to a stop signal (trainer/signals.h)
        resume();
        open_metrics();
        print_header();
        set_signal_phase(SignalPhase::training);
        train_steps();
        set_signal_phase(SignalPhase::finished);
        finish();
        return 0;
    }

  private:
    // Loads the checkpoint (what this rank keeps) and checks the data is the checkpoint's.
    void resume() {
        if (!resume_dir_.empty()) {
            LoadStats stats;
            const TrainerState state = load_checkpoint(resume_dir_, *strategy_, *optimizer_, &stats, o_.allow_inexact_resume);
            report_load(world_, "resume: " + files_read(stats), stats);
            start_step_ = state.step;
            if (state.data_fingerprint != fingerprint_ || state.train_tokens != train_tokens_) {
                if (state.options.data == o_.data)
                    throw std::runtime_error("the training data differs from the checkpoint's (" +
                                             std::to_string(train_tokens_) + " tokens now, " +
                                             std::to_string(state.train_tokens) +
                                             " then, or the same count with other "
                                             "tokens): resuming would not continue the same run; restore the data, or "
                                             "pass --data explicitly to continue on other data");
                std::printf("note: training continues on other data than the checkpoint's (%s)\n", o_.data.c_str());
            }
            std::printf("resumed from %s at step %lld\n", resume_dir_.c_str(), start_step_);
        }
        if (start_step_ >= o_.steps)
            throw std::invalid_argument("the checkpoint is at step " + std::to_string(start_step_) +
                                        " and --steps is " + std::to_string(o_.steps) +
                                        ": nothing to do; raise --steps to train further");
        end_step_ = o_.stop_after > 0 ? std::min(o_.steps, start_step_ + o_.stop_after) : o_.steps;
    }

    // Rank 0 prepares the output directory (trainer/out_dir.h) and writes metrics.jsonl: from
    // scratch, or after the history up to the checkpoint's step on resume.
    void open_metrics() {
        if (!writer()) return;
        if (o_.overwrite)
            for (const std::string& line : remove_run(o_.out_dir)) std::printf("%s\n", line.c_str());
        for (const std::string& line : prepare_out_dir(o_.out_dir, resume_dir_, start_step_, o_.overwrite_later))
            std::printf("%s\n", line.c_str());
        // The options as resolved, as a run file (trainer/run_file.h): `train --run OUT/run.yaml`
        // repeats the run. As the user gave them (an automatic micro-batch stays automatic).
        const std::string yaml = resolved_run_yaml(requested_, option_sources_, &o_);
        write_file_atomically(o_.out_dir + "/run.yaml", "resolved options",
                              [&](const ByteSink& sink) { sink(yaml.data(), yaml.size()); });
        const std::string path = o_.out_dir + "/metrics.jsonl";
        metrics_.emplace(path, "metrics", start_step_ == 0);  // every record's write checked (io/durable_file.h)
        check_room_for_checkpoint(o_.out_dir, checkpoint_size());
    }

    // One checkpoint's tensors (trainer/checkpoint.cu): the weights (a LoRA run's adapters only)
    // and the optimizer's state of the trainable ones, each a file.
    CheckpointSize checkpoint_size() const {
        const unsigned long long trainable = model_->tensor_elements(GroupKind::trainable),
                                 all = trainable + model_->tensor_elements(GroupKind::frozen);
        const unsigned long long weights = (model_->lora().enabled() ? trainable : all) * sizeof(T),
                                 moment = trainable * sizeof(acc_t<T>);
        const int fields = AdamWState<T>::kHasMaster ? 3 : 2;
        CheckpointSize size{weights + fields * moment, std::max(weights, moment), ""};
        size.largest_file = weights >= moment ? weights_file(*model_) : "adam_m.safetensors";
        return size;
    }

    void print_header() {
        if (lr_.warmup > 0 && lr_.warmup >= lr_.total_steps)
            std::printf(
                "warning: --warmup %d is the whole run's %lld steps: the learning rate rises all the way and reaches "
                "--lr only at the last step; lower --warmup, or give --warmup-ratio (e.g. 0.03)\n",
                lr_.warmup, lr_.total_steps);
        print_data("training", *loader_);
        if (val_loader_) print_data("validation", *val_loader_);
        const LlamaConfig& c = config_;
        std::printf(
            "model %s: %lld parameters, %d layers, hidden %d, vocab %d, %s; batch %d = micro-batch %d x "
            "accumulation %d x %d rank(s), strategy %s%s; %lld training windows of %d tokens; %.3g FLOPs per "
            "token\n",
            c.name.c_str(), parameter_count(c), c.num_layers, c.hidden_size, c.vocab_size, o_.dtype.c_str(), o_.batch,
            o_.micro_batch, accumulation_, plan_.data_ranks, strategy_->name(), hybrid_label().c_str(),
            loader_->windows(), o_.seq_len, training_flops_per_token(c, o_.seq_len));
        const long long trainable = model_->tensor_elements(GroupKind::trainable);
        const long long fixed = model_->tensor_elements(GroupKind::frozen);
        std::printf("parameters: %lld trainable (%.2f%%), %lld frozen (%.2f%%)\n", trainable,
                    100.0 * double(trainable) / double(trainable + fixed), fixed,
                    100.0 * double(fixed) / double(trainable + fixed));
        if (model_->quantized()) {
            const long long n = model_->nf4_tensor_elements();
            const size_t bytes = memory_stats().current[size_t(MemoryCategory::parameters)];
            std::printf("NF4 (QLoRA): %lld base weights in 4-bit NF4%s; parameters on this rank %.1f MiB\n", n,
                        o_.double_quant ? " with double-quantised absmaxes" : "", mib(bytes));
        }
        if (const LoraConfig& l = model_->lora(); l.enabled()) {
            std::string targets;
            for (const std::string& t : l.targets) targets += (targets.empty() ? "" : ",") + t;
            std::printf("LoRA: rank %d, alpha %g, scale %g%s, dropout %g, on %s; the base is frozen (%s)\n", l.rank,
                        l.alpha, l.scale(), l.rslora ? " (rsLoRA)" : "", l.dropout, targets.c_str(),
                        o_.init_from.empty() ? "initialised from the seed" : o_.init_from.c_str());
        }
        if (const ActivationCheckpointing ckpt = activation_checkpointing(o_); ckpt.enabled) {
            int recomputed = 0;
            for (int i = 0; i < c.num_layers; ++i) recomputed += ckpt.recomputes(i);
            const auto bytes = [&](const ActivationCheckpointing& a) {
                const TensorParallel& tp = plan_.placement.tensor;  // this rank's slice and rows
                return mib(activation_arenas(tensor_parallel_shape(c, tp), o_.micro_batch, o_.seq_len, dtype_of<T>(),
                                             model_->lora(), a, plan_.placement.chunks, tp.sequence ? tp.size : 1)
                               .total());
            };
            std::printf(
                "activation checkpointing: %d of %d blocks recompute their forward before their backward; "
                "activation arenas on this rank %.2f MiB (%.2f MiB without); +%.1f%% FLOPs per step (recompute, "
                "not counted in MFU)\n",
                recomputed, c.num_layers, bytes(ckpt), bytes({}),
                100.0 * recompute_flops_per_token(c, o_.seq_len, ckpt) / training_flops_per_token(c, o_.seq_len));
        }
        if (under_open_mpi()) {
            const int t = mpirun_kill_grace_seconds();
            std::printf(
                "stop signals: Ctrl-C or SIGTERM to mpirun leaves the ranks %d s to finish the step and write its "
                "checkpoint (twice Open MPI's odls_base_sigkill_timeout, %d s)%s\n",
                2 * t, t, t < 30 ? "; lengthen it with mpirun --mca odls_base_sigkill_timeout 60" : "");
        }
        if (world_.size() > 1) {
            std::printf("mesh: %s\n", describe_mesh(plan_.mesh).c_str());
            if (!strategy_->mesh().warning().empty()) std::printf("warning: %s\n", strategy_->mesh().warning().c_str());
            const int t = plan_.mesh.tensor, kv = config_.num_kv_heads;
            if (t > 1 && kv_heads_replicated(config_, t))
                std::printf("tensor parallelism: --tp %d does not split the %d key/value head%s, so each is replicated "
                            "on the %d ranks whose query heads read it (Megatron's rule); their gradients are summed "
                            "over the group\n",
                            t, kv, kv == 1 ? "" : "s", t / kv);  // T/Hkv: model/tensor_parallel.h
            if (t > 1) {
                const VocabSlice first = tensor_parallel_vocab(config_, {t, 0});
                const VocabSlice last = tensor_parallel_vocab(config_, {t, t - 1});
                std::printf("tensor parallelism: the embedding and the head split by vocabulary rows, %lld a rank",
                            first.count);
                if (last.count != first.count)
                    std::printf(" (the last %lld: the %d tokens padded to %lld, padding rows stored nowhere)",
                                last.count, config_.vocab_size, first.count * t);
                std::printf("\n");
            }
            if (plan_.placement.tensor.sequence)
                std::printf("sequence parallelism: the residual stream, the norms and the residual adds hold %lld of "
                            "a micro-batch's %lld rows a rank, gathered before the column-parallel linears and "
                            "reduce-scattered after the row-parallel ones\n",
                            model_->stream_rows(), model_->rows());
        }
        if (plan_.pipelined()) {
            const std::vector<int>& stages = plan_.stage_bounds;
            std::printf("pipeline: %d stages (balanced by %s):", plan_.mesh.pipeline, o_.balance.c_str());
            for (size_t s = 0; s + 1 < stages.size(); ++s) std::printf(" [units %d-%d]", stages[s], stages[s + 1] - 1);
            std::printf("; %s\n", describe_pipeline_schedule(plan_.schedule).c_str());
        }
    }

    void train_steps() {
        const double flops_per_token = training_flops_per_token(config_, o_.seq_len);
        const double peak = device_peak_flops() * world_.size();
        start_ = std::chrono::steady_clock::now();
        for (long long step = start_step_; step < end_step_; ++step) {
            const auto t0 = std::chrono::steady_clock::now();
            std::vector<DataLoader::MicroBatch> micro;
            for (int j = 0; j < accumulation_; ++j)
                micro.push_back(loader_->micro_batch(step, j, geometry_, plan_.data_rank));
            const double lr = learning_rate(lr_, step);
            test_signal_hook(step + 1);
            const StepResult r = trainer_->step(micro, lr, step + 1, o_.clip, adamw_, stop_signal() != 0);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (step == start_step_) first_loss_ = r.loss, first_step_end_ = std::chrono::steady_clock::now();
            last_loss_ = r.loss;
            log_step(step, r, lr, ms, flops_per_token, peak);
            if (val_loader_ && o_.eval_interval > 0 && ((step + 1) % o_.eval_interval == 0 || step + 1 == o_.steps)) {
                const double val = evaluate(), perplexity = std::exp(val);
                std::printf("          validation loss %.7f (perplexity %.2f)\n", val, perplexity);
                if (metrics_)
                    metrics_line("{\"step\": %lld, \"val_loss\": %s, \"val_ppl\": %s}\n", step + 1,
                                 json_number(val).c_str(), json_number(perplexity).c_str());
            }
            // A stop signal on any rank (trainer/signals.h): this step is the last, with its checkpoint.
            if (r.stop_requests > 0) stop_requests_ = r.stop_requests, end_step_ = step + 1;
            if ((o_.checkpoint_interval > 0 && (step + 1) % o_.checkpoint_interval == 0) || step + 1 == end_step_) {
                const std::string dir = checkpoint_path(o_.out_dir, step + 1);
                trainer_->check_updates_finite();  // never a checkpoint with non-finite values
                save_checkpoint(dir, *strategy_, *optimizer_, trainer_state(step + 1),
                                ModelFiles{tokenizer_.get(), tokenizer_dir_,
                                           resume_dir_.empty() ? init_dir_ : resume_dir_, data_eos_});
                std::printf("          checkpoint %s\n", dir.c_str());
                if (writer())  // only now that it is complete (--keep-checkpoints)
                    for (const std::string& old : prune_checkpoints(o_.out_dir, step + 1, o_.keep_checkpoints))
                        std::printf("          removed %s (--keep-checkpoints %lld)\n", old.c_str(),
                                    o_.keep_checkpoints);
            }
            std::fflush(stdout);
        }
        if (metrics_) metrics_->close(), metrics_.reset();
    }

    // The step line and its metrics.jsonl record.
    void log_step(long long step, const StepResult& r, double lr, double ms, double flops_per_token, double peak) {
        const double tokens_per_s = double(o_.batch) * o_.seq_len / (ms * 1e-3);
        const MemoryStats mem = memory_stats();
        char mfu[32] = "";
        if (peak > 0) std::snprintf(mfu, sizeof mfu, " | MFU %5.1f%%", 100.0 * tokens_per_s * flops_per_token / peak);
        // Elapsed: this invocation's training so far. ETA to --steps: the mean wall time per step
        // since the first step of this invocation (which pays for warming up), evaluations and
        // checkpoints included; unknown after the first step.
        const auto now = std::chrono::steady_clock::now();
        const long long after_first = step - start_step_;
        const std::string eta = after_first > 0
                                    ? clock_text(std::chrono::duration<double>(now - first_step_end_).count() /
                                                 double(after_first) * double(o_.steps - (step + 1)))
                                    : "?";
        std::printf(
            "step %5lld/%lld | loss %.7f | lr %.3e | grad norm %.4f | %8.0f tok/s | %7.1f ms%s | %s elapsed, ETA "
            "%s | device memory %.1f MiB (peak %.1f MiB)\n",
            step + 1, o_.steps, r.loss, lr, r.grad_norm, tokens_per_s, ms, mfu,
            clock_text(std::chrono::duration<double>(now - start_).count()).c_str(), eta.c_str(),
            mib(mem.device_current), mib(mem.device_peak));
        if (r.skipped)
            std::printf(
                "          skipped step %lld: the loss or gradient norm is not finite (%s); nothing was updated "
                "(%lld of --skip-nonfinite %lld)\n",
                step + 1, r.nonfinite.c_str(), trainer_->skipped_steps(), o_.skip_nonfinite);
        if (metrics_)
            metrics_line("{\"step\": %lld, \"loss\": %s, \"lr\": %.17g, \"grad_norm\": %s, \"tokens_per_s\": %.6g, "
                         "\"ms\": %.6g, \"device_bytes\": %zu, \"device_peak_bytes\": %zu%s}\n",
                         step + 1, json_number(r.loss).c_str(), lr, json_number(r.grad_norm).c_str(), tokens_per_s, ms,
                         mem.device_current, mem.device_peak, r.skipped ? ", \"skipped\": true" : "");
    }

    // The windows a validation reads: the first --eval-batches × --micro-batch of the validation
    // data, in order (all of them when there are fewer) — the windows `train eval` reads by default
    // from the checkpoint, so that its loss is this one (trainer/model_dir.h).
    long long validation_windows() const {
        return std::min<long long>((long long)o_.eval_batches * o_.micro_batch, val_loader_->windows());
    }

    // The mean loss per counted target over the validation windows, in forward passes of
    // --micro-batch windows (the last one padded with rows that count nothing).
    double evaluate() {
        double sum = 0, counted = 0;
        const size_t width = size_t(o_.seq_len), rows = size_t(o_.micro_batch);
        const long long windows = validation_windows();
        for (long long first = 0; first < windows; first += o_.micro_batch) {
            DataLoader::MicroBatch b;
            b.inputs.assign(rows * width, 0);
            b.targets.assign(rows * width, kIgnoreIndex);
            if (val_loader_->document_mask())
                for (size_t i = 0; i < rows * width; ++i) b.positions.push_back(int(i % width));
            for (size_t r = 0; r < rows && first + (long long)r < windows; ++r)
                val_loader_->window(first + (long long)r, b.inputs.data() + r * width, b.targets.data() + r * width,
                                    b.positions.empty() ? nullptr : b.positions.data() + r * width);
            sum += trainer_->forward_loss(b);
            for (int t : b.targets) counted += t != kIgnoreIndex;
        }
        return sum / counted;
    }

    TrainerState trainer_state(long long steps_done) const {
        TrainerState s;
        s.step = steps_done;
        s.samples = steps_done * o_.batch;
        s.seed = o_.seed;
        s.dtype = o_.dtype;
        s.data_source = source_;
        s.train_tokens = train_tokens_;
        s.data_fingerprint = fingerprint_;
        s.options = requested_;  // as the user gave them (an automatic micro-batch stays automatic)
        s.options.resume.clear();
        s.options.stop_after = 0;
        s.options.overwrite_later = false;
        s.options.overwrite = false;
        s.base_fingerprint = base_fingerprint_;
        if (val_loader_ && o_.eval_interval > 0)
            s.validation_windows = validation_windows(), s.validation_micro_batch = o_.micro_batch;
        return s;
    }

    // The summary line, and the sample continuing --prompt when the run is complete.
    void finish() {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        std::printf("trained steps %lld..%lld in %.1f s (%.0f tokens/s): loss %.4f -> %.4f\n", start_step_ + 1,
                    end_step_, seconds, double(end_step_ - start_step_) * o_.batch * o_.seq_len / seconds, first_loss_,
                    last_loss_);
        if (const auto* g = trainer_->graphs(); g && g->captured() > 0)
            std::printf("cuda graphs: %zu %s captured, %zu nodes in the largest, launched %lld times\n", g->captured(),
                        strategy_->pipelined() ? "pipeline entries (a forward or a backward)" : "micro-step(s)",
                        g->largest_nodes(), g->launches());
        if (stop_requests_ > 0 && end_step_ < o_.steps) {
            const int here = stop_signal();
            std::printf(
                "stopped by %s on %lld of %d rank(s) after step %lld, checkpoint %s written; continue with: "
                "train --resume %s\n",
                here == SIGCONT ? "mpirun (its SIGCONT)" : here ? signal_name(here) : "a stop signal", stop_requests_, world_.size(), end_step_,
                checkpoint_path(o_.out_dir, end_step_).c_str(), o_.out_dir.c_str());
            return;
        }
        if (end_step_ < o_.steps)
            std::printf("stopped after %lld steps; continue with: train --resume %s\n", end_step_ - start_step_,
                        o_.out_dir.c_str());
        if (o_.sample_tokens == 0 || end_step_ != o_.steps) return;
        if (stop_requests_ > 0 || stop_signal()) {  // at the last step: the run is complete, the sample skipped
            std::printf("a stop signal at the last step: the final checkpoint is written; no sample\n");
            return;
        }
        if (!strategy_->holds_whole_model()) {  // one rank alone has not got the parameters
            std::printf(
                "\nsample: %s%s keeps only part of the parameters on each rank; sample from the checkpoint with: "
                "train sample %s\n",
                strategy_->name(), plan_.mesh.tensor > 1 ? (" with --tp " + std::to_string(plan_.mesh.tensor)).c_str() : "",
                checkpoint_path(o_.out_dir, end_step_).c_str());
        } else if (writer() && !tokenizer_) {
            std::printf("\nno sample: the data has no tokenizer.json, so there is no text to print; sample token ids "
                        "with: train sample %s --prompt-ids ID,... --print-ids\n",
                        checkpoint_path(o_.out_dir, end_step_).c_str());
        } else if (writer() && tokenizer_) {
            strategy_->settle_parameters();  // the decoder reads them on its own
            std::printf("\nsample (temperature %.2f, top-p %.2f):\n%s", o_.temperature, o_.top_p, o_.prompt.c_str());
            std::fflush(stdout);
            generate_text(*model_, *tokenizer_, o_.prompt, o_.sample_tokens, o_.temperature, o_.top_p, o_.seed,
                          [](const std::string& piece) { std::fputs(piece.c_str(), stdout), std::fflush(stdout); });
            std::printf("\n");
        }
    }

    bool writer() const { return world_.rank() == 0; }
    // ", sharded within groups of K ranks, N/K replicas" under hybrid sharding, else nothing.
    std::string hybrid_label() const {
        const int k = plan_.placement.shards;
        if (!plan_.info->policy.shards() || k == plan_.data_ranks) return "";
        return ", sharded within groups of " + std::to_string(k) + " rank(s), " + std::to_string(plan_.data_ranks / k) +
               " replicas";
    }

    TrainOptions o_;  // --epochs sets its steps once the training windows are counted
    const TrainOptions requested_;
    const LlamaConfig config_;
    const std::string resume_dir_, init_dir_;
    const OptionSources option_sources_;
    World& world_;
    const StrategyPlan plan_;
    const int accumulation_;
    const BatchGeometry geometry_;
    LrConfig lr_;
    const AdamWSettings adamw_;
    const std::string source_;
    std::unique_ptr<Tokenizer> tokenizer_;
    const std::string tokenizer_dir_;
    const int data_eos_;  // the data's document separator: the EOS of a run without a tokenizer
    uint64_t fingerprint_ = 0xcbf29ce484222325ull;
    long long train_tokens_ = 0;
    uint64_t base_fingerprint_ = 0;  // a LoRA run's base files (0: a base initialised from the seed)
    std::optional<DataLoader> loader_, val_loader_;
    ComputeStream compute_;  // the model's stream; outlives everything that queues work on it
    std::unique_ptr<Llama<T>> model_;
    std::unique_ptr<Strategy<T, G>> strategy_;
    std::unique_ptr<AdamWState<T>> optimizer_;
    std::unique_ptr<Trainer<T, G>> trainer_;
    long long start_step_ = 0, end_step_ = 0;
    long long stop_requests_ = 0;  // ranks that asked to stop (a signal): the run ended at end_step_
    std::optional<AppendedFile> metrics_;
    // One metrics.jsonl record, formatted as printf does, written whole or an error.
    template <class... A>
    void metrics_line(const char* format, A... args) {
        const int n = std::snprintf(nullptr, 0, format, args...);
        std::string line(size_t(n) + 1, '\0');
        std::snprintf(line.data(), line.size(), format, args...);
        line.pop_back();
        metrics_->write(line);
    }
    std::chrono::steady_clock::time_point start_, first_step_end_;  // this invocation's training; its first step's end
    double first_loss_ = NAN, last_loss_ = NAN;
};

}  // namespace

// The learning-rate schedule: over --steps, or the schedule a resume kept (--keep-schedule); the
// warmup in steps, or from --warmup-ratio as Hugging Face counts it (ceil(ratio × steps)).
LrConfig lr_config_of(const TrainOptions& o) {
    LrConfig c;
    c.kind = parse_schedule(o.schedule);
    c.lr = o.lr;
    c.total_steps = o.schedule_steps > 0 ? o.schedule_steps : o.steps;
    c.warmup = o.warmup_ratio > 0 ? int(std::ceil(o.warmup_ratio * double(c.total_steps) - 1e-9)) : o.warmup;
    c.final_fraction = o.final_lr_fraction;
    if (c.warmup > c.total_steps)
        throw std::invalid_argument("--warmup " + std::to_string(c.warmup) + " is more than the run's " +
                                    std::to_string(c.total_steps) +
                                    " steps: the learning rate would never reach --lr; lower --warmup, or give "
                                    "--warmup-ratio (e.g. 0.03: 3% of the steps)");
    if (const auto problems = validate(c); !problems.empty()) throw std::invalid_argument(problems.front());
    return c;
}

template <class T, class G>
int run_training(const TrainOptions& o, const TrainOptions& requested, RunData data, const LlamaConfig& config,
                 const RunSources& from, World& world) {
    return TrainingRun<T, G>(o, requested, std::move(data), config, from, world).run();
}

template int run_training<__nv_bfloat16, __nv_bfloat16>(const TrainOptions&, const TrainOptions&, RunData,
                                                        const LlamaConfig&, const RunSources&, World&);
template int run_training<__nv_bfloat16, float>(const TrainOptions&, const TrainOptions&, RunData, const LlamaConfig&,
                                                const RunSources&, World&);
template int run_training<float, float>(const TrainOptions&, const TrainOptions&, RunData, const LlamaConfig&,
                                        const RunSources&, World&);
template int run_training<double, double>(const TrainOptions&, const TrainOptions&, RunData, const LlamaConfig&,
                                          const RunSources&, World&);

}  // namespace pv
