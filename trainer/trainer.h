// One optimizer step under any strategy (DESIGN.md §2, §4), the loop `train` runs and the parity
// tests run in-process.
//
//   1. The step's counted target tokens are known before any backward: this rank counts its
//      own, an all-reduce of one integer gives the global count C (a step with C = 0 is an
//      error). The first forwards are queued before the host waits for that count, so the
//      device (and a ZeRO all-gather of the previous update, parallel/parameters_replicated.h) is never idle
//      while it travels.
//   2. Each micro-step: forward (its loss sum kept), backward with loss scale 1/C, so that the
//      gradients summed over micro-steps and ranks are those of the global mean loss; the
//      strategy communicates in its hooks. The strategy gives the order (Strategy::run_micro_steps):
//      forward and backward alternate in one slot, or a pipeline runs its schedule's row
//      (parallel/schedule.h: GPipe, 1F1B), a micro-batch's activations in its slot from its
//      forward to its backward. Every schedule runs a unit's backwards in micro-batch order, so
//      gradients accumulate in micro-batch order.
//   3. The strategy completes the owned gradients; the loss (sum over ranks / C) is all-reduced
//      for the log (a pipeline's stages before the last contribute zeros), and with it, in the
//      same all-reduce, each rank's stop request (1 when a stop signal reached it before the step:
//      trainer/signals.h), so every rank learns how many ranks want to stop after this step
//      without a collective of its own; the global gradient
//      norm gives the clipping scale. All of it stays on the device (optim/clip.cuh): the
//      micro-batches' loss sums are added there, and norm and scale land in device memory.
//   4. AdamW updates the owned range of every unit, one launch per unit, reading the scale from
//      device memory; the strategy makes the new parameters visible. Only then does the host
//      wait, once per step, to read the loss and the norm: a step whose loss or norm is not
//      finite has been refused on the device (the update skipped, parameters and state intact)
//      and is reported here, naming the first unit and tensor whose gradient is not finite — or,
//      up to --skip-nonfinite times (set_skip_nonfinite), passed over: the step counter, the data
//      position and the schedule advance as if it had been taken, so a resumed run is identical.
//   5. The checks of trainer/step_checks.h, at no cost in a healthy step: the loss's all-reduce
//      also carries every rank's micro-batch and collective counts (the ranks must agree) and
//      whether its previous update made anything non-finite; the update itself flags the first
//      element it made non-finite (optim/adamw.cuh), read with the figures. Where every rank makes
//      the same update (one rank, DDP) such a step fails at once; where each updates its own slice
//      (ZeRO, a pipeline) the ranks agree on it in the next step's all-reduce, or before a
//      checkpoint (check_updates_finite), so no checkpoint is ever written with non-finite values.
// Every cross-rank number goes through the strategy's Comm, so it is counted like the rest.
// A micro-batch's tokens, targets and (with document masking) positions are uploaded into its
// slot's device buffers and reach the strategy as one DeviceBatch (model/unit_loop.h).
//
// Host and device. The host writes a micro-batch into a pinned staging buffer and queues an
// asynchronous copy to the slot's device buffers on the compute stream, so it can go on filling
// the next micro-batch while the device runs. There are 2 × slots staging buffers, used round
// robin; each has an event recorded after the copy that reads it, and the host waits for that
// event before writing the buffer again (a pinned buffer must not change under a pending copy).
// The step's token count is summed over ranks on the communication stream alone (it does not wait
// for the compute stream). The host waits for the compute stream once per step, after the update
// is queued, to read the step's loss and norm (StepFigures).
//
// What the kernels read per micro-batch or step beyond the batch's arrays is in device memory too:
// the micro-batch's dropout keys (its first global row and the step) travel with its tokens in the
// staging buffer, and the loss scale 1/C is copied once C is known. So the same kernels serve a
// step run eagerly and one whose micro-steps are captured CUDA graphs (use_graphs, --cuda-graphs:
// trainer/micro_step_graphs.h), which give the same bits.
#pragma once

#include "data/loader.h"
#include "optim/clip.cuh"
#include "optim/offload.h"
#include "optim/optimizer.cuh"
#include "optim/schedule.h"
#include "parallel/strategy.h"
#include "trainer/micro_step_graphs.h"
#include "trainer/step_checks.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

struct StepResult {
    double loss = 0;        // the global mean loss of the step
    double grad_norm = 0;   // the global gradient norm before clipping
    long long counted = 0;  // the global number of counted target tokens
    bool skipped = false;   // the loss or norm was not finite and the step was passed over (--skip-nonfinite)
    std::string nonfinite;  // then: where the non-finite gradient is (nonfinite_gradient_source)
    long long stop_requests = 0;  // ranks that asked to stop after this step (the same on every rank)
};

template <class T, class G>
class Trainer {
  public:
    using A = acc_t<T>;
    // The optimizer state must cover what the strategy owns (make_optimizer does it).
    Trainer(Strategy<T, G>& strategy, AdamWState<T>& optimizer)
        : s_(strategy),
          opt_(optimizer),
          rows_(strategy.model().rows()),
          tokens_(size_t(rows_ * strategy.slots()), MemoryCategory::workspace),
          targets_(size_t(rows_ * strategy.slots()), MemoryCategory::workspace),
          positions_(size_t(rows_ * strategy.slots()), MemoryCategory::workspace),
          keys_(2 * size_t(strategy.slots()), MemoryCategory::workspace),
          losses_(size_t(strategy.slots()), MemoryCategory::workspace),
          count_(size_t(strategy.slots()), MemoryCategory::workspace),
          sums_(2 * size_t(kStepSums), MemoryCategory::workspace),
          counts_(2, MemoryCategory::workspace),
          loss_scale_(1, MemoryCategory::workspace),
          figures_(1, MemoryCategory::workspace),
          host_figures_(static_cast<StepFigures*>(pinned_host_alloc(sizeof(StepFigures)))),
          host_counts_(static_cast<long long*>(pinned_host_alloc(2 * sizeof(long long)))),
          host_loss_scale_(static_cast<double*>(pinned_host_alloc(sizeof(double)))),
          update_flags_(size_t(strategy.model().num_units()), MemoryCategory::workspace),
          host_flags_(static_cast<unsigned long long*>(
              pinned_host_alloc(size_t(strategy.model().num_units()) * sizeof(unsigned long long)))),
          host_sums_(static_cast<double*>(pinned_host_alloc(2 * size_t(kStepSums) * sizeof(double)))),
          inject_(read_test_hook("POLEVAULT_TEST_INJECT_NONFINITE")),
          diverge_(read_test_hook("POLEVAULT_TEST_DIVERGE")) {
        if (Comm* c = strategy.comm()) collectives_ = c->collectives();
        if (optimizer.on_host())
            offloaded_ =
                std::make_unique<OffloadedAdamW<T, G>>(optimizer, offload_pool(), strategy.params_on_host());
        else if (strategy.params_on_host())
            throw std::invalid_argument(
                "parameters in host memory need the optimizer state there too (--offload "
                "params offloads both)");
        for (int i = 0; i < 2 * strategy.slots(); ++i) {
            Staging st;
            st.keys =
                static_cast<long long*>(pinned_host_alloc(2 * sizeof(long long) + 3 * size_t(rows_) * sizeof(int)));
            st.host = reinterpret_cast<int*>(st.keys + 2);
            CUDA_CHECK(cudaEventCreateWithFlags(&st.read, cudaEventDisableTiming));
            staging_.push_back(st);
        }
    }
    ~Trainer() {
        for (Staging& st : staging_) {
            cudaEventSynchronize(st.read);
            cudaEventDestroy(st.read);
            memory_free(st.keys);
        }
        memory_free(host_figures_);
        memory_free(host_counts_);
        memory_free(host_loss_scale_);
        memory_free(host_flags_);
        memory_free(host_sums_);
    }
    Trainer(const Trainer&) = delete;
    Trainer& operator=(const Trainer&) = delete;

    // Optimizer state for what `strategy` owns, the master copy initialised from the parameters;
    // on_host: in pinned host memory (--offload, optim/offload.h).
    static std::unique_ptr<AdamWState<T>> make_optimizer(Strategy<T, G>& strategy, bool on_host = false) {
        Llama<T>& m = strategy.model();
        std::vector<GroupLayout> layouts;
        for (int u = 0; u < m.num_units(); ++u) layouts.push_back(m.trainable(u));
        const bool sharded = strategy.sharded_optimizer();
        std::vector<bool> held;
        for (int u = 0; u < m.num_units(); ++u) held.push_back(m.holds(u));
        auto opt = std::make_unique<AdamWState<T>>(layouts, sharded ? strategy.shard_rank() : 0,
                                                   sharded ? strategy.shards() : 1, held,
                                                   on_host || strategy.params_on_host());
        for (int u = 0; u < m.num_units(); ++u)
            opt->init_master(u, strategy.owned_params(u), m.stream(), strategy.params_on_host());
        // A checkpoint's state is uploaded with synchronous copies, which do not wait for a
        // non-blocking compute stream: the master copies must be done first.
        CUDA_CHECK(cudaStreamSynchronize(m.stream()));
        return opt;
    }

    // This micro-batch's loss sum, forward only (evaluation): on every rank of its pipeline (a
    // pipeline's last stage has it).
    double forward_loss(const DataLoader::MicroBatch& b) {
        upload_slot(0, b, -1);
        forward_slot(0, b, -1, losses_.get());
        const double local = read_loss(losses_.get());
        Comm* pipe = s_.pipeline_comm();
        return pipe ? sum_over_ranks(local, sums_.get(), pipe) : local;
    }

    // Steps whose loss or gradient norm is not finite are passed over, up to n of them in the life
    // of this trainer (0: the first one ends the run).
    void set_skip_nonfinite(long long n) { skip_budget_ = n; }

    // Each micro-step captured once as a CUDA graph and launched as one from then on (--cuda-graphs;
    // trainer/micro_step_graphs.h), under a pipeline each entry of its row: the same results bit for
    // bit. The model should have its own cuBLAS workspace (ModelOptions::cublas_workspace_bytes).
    void use_graphs() { graphs_ = std::make_unique<MicroStepGraphs<T, G>>(s_); }
    const MicroStepGraphs<T, G>* graphs() const { return graphs_.get(); }
    long long skipped_steps() const { return skipped_; }

    // Before a checkpoint (collective over every rank): fails, naming the step, unit and tensor, if
    // an update since the last check made a parameter or the optimizer state non-finite on any rank.
    // Only sharded updates need the collective; elsewhere step() has failed already.
    void check_updates_finite() {
        Comm* c = s_.comm();
        if (!c || updates_agree()) return;
        const long long first = min_over_ranks(bad_update_, *c, s_.model().stream(), s_.comms());
        if (first != kNoBadUpdate) throw bad_update_error(first);
    }

    // One optimizer step at 1-based step t over this rank's micro-batches. `stop_requested`: this
    // rank's vote to stop after this step (a signal, trainer/signals.h), summed over the ranks in
    // the loss all-reduce into StepResult::stop_requests, so every rank stops after the same step.
    StepResult step(const std::vector<DataLoader::MicroBatch>& batches, double lr, long long t, double clip,
                    const AdamWSettings& adamw, bool stop_requested = false) {
        note_training_step(t);  // names the step of a collective that times out (collective_watch.h)
        Llama<T>& m = s_.model();
        std::vector<DataLoader::MicroBatch> with_extra;  // the divergence hook's: the last one twice
        if (diverge_.fires(t, s_.comm() ? s_.comm()->rank() : 0))
            with_extra = batches, with_extra.push_back(batches.back());
        const std::vector<DataLoader::MicroBatch>& micro = with_extra.empty() ? batches : with_extra;
        StepResult r;
        long long local = 0;
        for (const auto& b : micro)
            for (int target : b.targets) local += target != kIgnoreIndex;
        cudaStream_t stream = m.stream();
        if (losses_.size() < micro.size()) {
            losses_ = DeviceBuffer<A>(micro.size(), MemoryCategory::workspace);
            if (graphs_) graphs_->clear();  // their forwards wrote the old array's loss slots
        }
        s_.begin_step();
        CUDA_CHECK(cudaMemsetAsync(losses_.get(), 0, micro.size() * sizeof(A), stream));
        bool have_count = false;  // the backward needs the count (its loss scale): one integer all-reduce
        const auto scale = DeviceScalar<double>::in_memory(loss_scale_.get());
        // With --cuda-graphs every micro-step runs as a captured graph: its forward with its backward,
        // or under a pipeline each entry of the row alone (a forward's backward comes entries later),
        // with the transfers before it (parallel/pp.h).
        const bool pipelined = s_.pipelined();
        s_.run_micro_steps(int(micro.size()), [&](const PipeStep& e, bool last) {
            const size_t m = size_t(e.micro);
            const bool positions = !micro[m].positions.empty();
            if (!e.backward) {
                upload_slot(e.slot, micro[m], t);
                if (!graphs_) forward_slot(e.slot, micro[m], t, losses_.get() + m);
                if (graphs_ && pipelined)
                    graphs_->run({int(m), false, positions, false, {}},
                                 [&] { forward_slot(e.slot, micro[m], t, losses_.get() + m); });
                return;
            }
            if (!have_count) {  // after this rank's first forwards: the device is busy while it travels
                r.counted = s_.data_comm() ? count_over_ranks(local, *s_.data_comm()) : local;
                if (r.counted == 0)
                    throw std::runtime_error("step " + std::to_string(t) + " has no counted target tokens");
                have_count = true;
                *host_loss_scale_ = 1.0 / double(r.counted);  // (its last copy is done: the last step waited)
                CUDA_CHECK(cudaMemcpyAsync(loss_scale_.get(), host_loss_scale_, sizeof(double), cudaMemcpyHostToDevice,
                                           stream));
            }
            const DeviceBatch batch = device_batch(size_t(e.slot), micro[m], t);
            if (!graphs_) return s_.backward(e.slot, batch, scale, last);
            graphs_->run({int(m), last, positions, true, {}}, [&] {
                if (!pipelined) forward_slot(e.slot, micro[m], t, losses_.get() + m);
                s_.backward(e.slot, batch, scale, last);
            });
        });
        s_.finish_gradients();
        if (inject_.fires(t, s_.comm() ? s_.comm()->rank() : 0)) inject_nonfinite_gradient(s_, inject_.tensor);
        sum_losses(losses_.get(), int(micro.size()), sums_.get() + kLossSum, stream);  // in micro-batch order
        if (!s_.counts_loss())  // a tensor-parallel group computes one loss: its first rank counts it
            CUDA_CHECK(cudaMemsetAsync(sums_.get() + kLossSum, 0, sizeof(double), stream));
        const double* loss_sum = sums_.get() + kLossSum;
        Comm* c = s_.comm();
        if (c) {  // over the ranks, in rank order, with the checks' terms (trainer/step_checks.h)
            const double micro_count = double(micro.size()), collectives = double(c->collectives() - collectives_);
            collectives_ = c->collectives();
            host_sums_[kMicro] = micro_count, host_sums_[kMicroSq] = micro_count * micro_count;
            host_sums_[kCollectives] = collectives, host_sums_[kCollectivesSq] = collectives * collectives;
            host_sums_[kBadUpdate] = bad_update_ != kNoBadUpdate;
            host_sums_[kStopRequests] = stop_requested;
            CUDA_CHECK(cudaMemcpyAsync(sums_.get() + kMicro, host_sums_ + kMicro, (kStepSums - kMicro) * sizeof(double),
                                       cudaMemcpyHostToDevice, stream));
            c->fence_from(stream);
            c->all_reduce(sums_.get(), sums_.get() + kStepSums, kStepSums);
            c->fence_to(stream);
            loss_sum = sums_.get() + kStepSums + kLossSum;
            CUDA_CHECK(cudaMemcpyAsync(host_sums_ + kStepSums, sums_.get() + kStepSums, kStepSums * sizeof(double),
                                       cudaMemcpyDeviceToHost, stream));
        }
        StepFigures* figures = figures_.get();
        const double* unit_norms = s_.unit_norms_sq();
        step_figures(loss_sum, unit_norms, m.num_units(), clip, figures, stream);
        const int units = m.num_units();
        if (offloaded_) {  // the CPU update (optim/offload.h), the host waiting on its copies
            std::fill(host_flags_, host_flags_ + units, kAdamWAllFinite);
            offloaded_->step([&](int u) { return s_.owned_params(u); }, [&](int u) { return s_.owned_grads(u); }, adamw,
                             lr, t, &figures->scale, stream, [&](cudaEvent_t e) { wait_event_polling(e, s_.comms()); },
                             host_flags_);
        } else {
            CUDA_CHECK(cudaMemsetAsync(update_flags_.get(), 0xFF, update_flags_.bytes(), stream));  // kAdamWAllFinite
            for (int u = 0; u < units; ++u)
                opt_.update_unit(u, s_.owned_params(u), s_.owned_grads(u), adamw, lr, t, 1.0, stream, &figures->scale,
                                 update_flags_.get() + u);
            CUDA_CHECK(cudaMemcpyAsync(host_flags_, update_flags_.get(), update_flags_.bytes(), cudaMemcpyDeviceToHost,
                                       stream));
        }
        s_.after_update();
        CUDA_CHECK(cudaMemcpyAsync(host_figures_, figures, sizeof(StepFigures), cudaMemcpyDeviceToHost, stream));
        wait_polling(stream, s_.comms());  // the step's one wait
        r.loss = host_figures_->loss_sum / double(r.counted);
        r.grad_norm = host_figures_->grad_norm;
        r.stop_requests = c ? std::llround(host_sums_[kStepSums + kStopRequests]) : stop_requested;
        if (c) {
            const double* all = host_sums_ + kStepSums;
            if (!all_equal(all[kMicro], all[kMicroSq], c->size()) ||
                !all_equal(all[kCollectives], all[kCollectivesSq], c->size()))
                throw ranks_out_of_step(t, *c, host_sums_[kMicro], host_sums_[kCollectives]);
            if (all[kBadUpdate] > 0) check_updates_finite();  // the previous update's: fails on every rank
        }
        if (!std::isfinite(r.loss) || !std::isfinite(host_figures_->scale)) {  // refused on the device
            r.nonfinite = nonfinite_gradient_source(s_, unit_norms);
            if (skipped_ >= skip_budget_) throw nonfinite_step_error(t, r, clip);
            ++skipped_;
            r.skipped = true;
            return r;
        }
        for (int u = 0; u < units && bad_update_ == kNoBadUpdate; ++u)
            if (host_flags_[u] != kAdamWAllFinite)
                bad_update_ = encode_bad_update(u, opt_.begin(u) + (long long)host_flags_[u]);
        updated_step_ = t;
        if (bad_update_ != kNoBadUpdate && (!c || updates_agree())) throw bad_update_error(bad_update_);
        return r;
    }

    // Σ over the ranks of `c` (default: the strategy's communicator) of one number, in rank order
    // (the number itself with one rank); `device` is two elements of scratch.
    template <class X>
    X sum_over_ranks(X x, X* device, Comm* c = nullptr) {
        if (!c) c = s_.comm();
        if (!c) return x;
        Llama<T>& m = s_.model();
        CUDA_CHECK(cudaMemcpyAsync(device, &x, sizeof(X), cudaMemcpyHostToDevice, m.stream()));
        c->fence_from(m.stream());
        c->all_reduce(device, device + 1, 1);
        c->fence_to(m.stream());
        X out = 0;
        CUDA_CHECK(cudaMemcpyAsync(&out, device + 1, sizeof(X), cudaMemcpyDeviceToHost, m.stream()));
        wait_polling(m.stream(), s_.comms());
        return out;
    }

  private:
    // Whether every rank makes the same update (one rank, DDP), so that their flags agree.
    bool updates_agree() { return !s_.sharded_optimizer() && s_.holds_whole_model(); }

    std::runtime_error bad_update_error(long long first) const {
        return std::runtime_error(
            "step " + std::to_string(updated_step_) +
            ": the AdamW update made a parameter or the optimizer state non-finite (first at " +
            bad_update_place(s_, first) +
            "); the run cannot continue, no checkpoint is written with non-finite values and the last one is intact: "
            "resume from it with a lower --lr");
    }
    std::runtime_error nonfinite_step_error(long long t, const StepResult& r, double clip) const {
        char figures[96];
        std::snprintf(figures, sizeof figures, "loss %.7g, gradient norm %.7g", r.loss, r.grad_norm);
        return std::runtime_error(
            "step " + std::to_string(t) + ": the loss or gradient norm is not finite (" + figures + "; " + r.nonfinite +
            "); nothing was updated, the last checkpoint is intact. Lower --lr" + (clip > 0 ? "" : ", enable --clip") +
            " or pass over such steps with --skip-nonfinite N" +
            (skip_budget_ > 0 ? " (all " + std::to_string(skip_budget_) + " used)" : ""));
    }

    // Σ over the ranks of `c` of this rank's count, on c's stream only (no wait for the compute
    // stream: the previous step's last collectives may still be running beside it).
    long long count_over_ranks(long long local, Comm& c) {
        host_counts_[0] = local;
        CUDA_CHECK(cudaMemcpyAsync(counts_.get(), host_counts_, sizeof(long long), cudaMemcpyHostToDevice, c.stream()));
        c.all_reduce(counts_.get(), counts_.get() + 1, 1);
        CUDA_CHECK(cudaMemcpyAsync(host_counts_ + 1, counts_.get() + 1, sizeof(long long), cudaMemcpyDeviceToHost,
                                   c.stream()));
        c.synchronize();
        return host_counts_[1];
    }

    int* tokens(size_t slot) { return tokens_.get() + slot * size_t(rows_); }
    int* targets(size_t slot) { return targets_.get() + slot * size_t(rows_); }
    int* positions(size_t slot) { return positions_.get() + slot * size_t(rows_); }
    long long* keys(size_t slot) { return keys_.get() + 2 * slot; }
    // Slot k's device arrays of micro-batch b (uploaded by upload_slot); positions only when b
    // has them (document masking), else null: plain causal attention. `step`: the training step
    // (keys the adapters' dropout with the batch's global rows), −1 for evaluation. A training
    // step reads its losses after its backwards, so the head computes each loss in its backward,
    // with the gradient, in one pass over the logits (model/llama.h).
    DeviceBatch device_batch(size_t k, const DataLoader::MicroBatch& b, long long step) {
        return {tokens(k),
                targets(k),
                b.positions.empty() ? nullptr : positions(k),
                b.first_sample * s_.model().seq_len(),
                step,
                step >= 0,
                keys(k)};
    }
    // Uploads the micro-batch into its slot: its ids and its dropout keys (device_batch's first_row
    // and step, which the kernels read from there).
    void upload_slot(int slot, const DataLoader::MicroBatch& b, long long step) {
        const size_t k = size_t(slot), n = size_t(rows_);
        for (const std::vector<int>* field : {&b.inputs, &b.targets, &b.positions})
            if (field->size() != n && !(field == &b.positions && field->empty()))
                throw std::logic_error("a micro-batch field holds " + std::to_string(field->size()) +
                                       " values; the model takes batch × seq_len = " + std::to_string(n));
        Staging& st = staging_[next_staging_++ % staging_.size()];
        CUDA_CHECK(cudaEventSynchronize(st.read));  // the copy that last read this buffer is done
        const DeviceBatch batch = device_batch(k, b, step);
        st.keys[0] = batch.first_row, st.keys[1] = batch.step;
        int* host = st.host;
        std::copy(b.inputs.begin(), b.inputs.end(), host);
        std::copy(b.targets.begin(), b.targets.end(), host + n);
        std::copy(b.positions.begin(), b.positions.end(), host + 2 * n);
        cudaStream_t stream = s_.model().stream();
        CUDA_CHECK(cudaMemcpyAsync(keys(k), st.keys, 2 * sizeof(long long), cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(tokens(k), host, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(targets(k), host + n, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        if (!b.positions.empty())
            CUDA_CHECK(cudaMemcpyAsync(positions(k), host + 2 * n, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaEventRecord(st.read, stream));
    }
    // The forward of the micro-batch upload_slot put in the slot; the loss sum stays on the device
    // (zero on ranks without the head). Device work only: a captured micro-step holds it.
    void forward_slot(int slot, const DataLoader::MicroBatch& b, long long step, A* loss) {
        CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(A), s_.model().stream()));
        s_.forward(slot, device_batch(size_t(slot), b, step), loss, count_.get() + size_t(slot));
    }
    double read_loss(const A* loss) {
        Llama<T>& m = s_.model();
        A host = 0;
        CUDA_CHECK(cudaMemcpyAsync(&host, loss, sizeof(A), cudaMemcpyDeviceToHost, m.stream()));
        wait_polling(m.stream(), s_.comms());  // a forward may communicate (zero3, a pipeline)
        return double(host);
    }

    Strategy<T, G>& s_;
    AdamWState<T>& opt_;
    std::unique_ptr<OffloadedAdamW<T, G>> offloaded_;  // with the state on the host
    long long rows_;
    DeviceBuffer<int> tokens_, targets_, positions_;  // [slots][rows] each
    DeviceBuffer<long long> keys_;                    // [slots][2]: first_row, step (DeviceBatch::dropout_keys)
    DeviceBuffer<A> losses_;                          // per micro-batch of the step: its loss sum
    DeviceBuffer<int> count_;
    DeviceBuffer<double> sums_;
    DeviceBuffer<long long> counts_;
    DeviceBuffer<double> loss_scale_;  // the step's 1 / C, which the head's backward reads
    DeviceBuffer<StepFigures> figures_;
    StepFigures* host_figures_;                      // pinned: where the step's figures are read back
    long long* host_counts_;                         // pinned: this rank's count and the sum over ranks
    double* host_loss_scale_;                        // pinned: the loss scale's upload
    DeviceBuffer<unsigned long long> update_flags_;  // per unit: the update's first non-finite element
    unsigned long long* host_flags_;                 // pinned: where they are read back (the CPU update's own)
    double* host_sums_;                              // pinned [2][kStepSums]: this rank's terms, the sums
    long long collectives_ = 0;                      // the world's collective count at the previous step
    long long bad_update_ = kNoBadUpdate;            // this rank's first non-finite update, encoded
    long long updated_step_ = 0;                     // the last step whose update ran
    long long skip_budget_ = 0, skipped_ = 0;
    TestHook inject_, diverge_;
    std::unique_ptr<MicroStepGraphs<T, G>> graphs_;  // --cuda-graphs (null: eager)
    struct Staging {
        long long* keys = nullptr;   // pinned [2], then host: the dropout keys (one allocation)
        int* host = nullptr;         // pinned [3][rows]: tokens, targets, positions
        cudaEvent_t read = nullptr;  // recorded after the copies that read it
    };
    std::vector<Staging> staging_;
    size_t next_staging_ = 0;
};

}  // namespace pv
