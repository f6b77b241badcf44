// One optimizer step under any strategy (DESIGN.md §2, §4), the loop `train` runs and the parity
// tests run in-process.
//
//   1. The step's counted target tokens are known before any backward: this rank counts its
//      own, an all-reduce of one integer gives the global count C (a step with C = 0 is an
//      error). The first forwards are queued before the host waits for that count, so the
//      device (and a ZeRO all-gather of the previous update, parallel/zero1.h) is never idle
//      while it travels.
//   2. Each micro-step: forward (its loss sum kept), backward with loss scale 1/C, so that the
//      gradients summed over micro-steps and ranks are those of the global mean loss; the
//      strategy communicates in its hooks. With S activation slots (a pipeline, parallel/mp.h)
//      the micro-steps run in groups of S: S forwards, then their S backwards in the same order
//      (GPipe); with one slot, forward and backward alternate. Either way gradients accumulate
//      in micro-batch order.
//   3. The strategy completes the owned gradients; the loss (sum over ranks / C) is all-reduced
//      for the log (a pipeline's stages before the last contribute zeros); the global gradient
//      norm gives the clipping scale. All of it stays on the device (optim/clip.cuh): the
//      micro-batches' loss sums are added there, and norm and scale land in device memory.
//   4. AdamW updates the owned range of every unit, one launch per unit, reading the scale from
//      device memory; the strategy makes the new parameters visible. Only then does the host
//      wait, once per step, to read the loss and the norm: a step whose loss or norm is not
//      finite has been refused on the device (the update skipped, parameters and state intact)
//      and is reported here.
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
#pragma once

#include "data/loader.h"
#include "optim/clip.cuh"
#include "optim/offload.h"
#include "optim/optimizer.cuh"
#include "optim/schedule.h"
#include "parallel/strategy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

struct StepResult {
    double loss = 0;        // the global mean loss of the step
    double grad_norm = 0;   // the global gradient norm before clipping
    long long counted = 0;  // the global number of counted target tokens
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
          losses_(size_t(strategy.slots()), MemoryCategory::workspace),
          count_(size_t(strategy.slots()), MemoryCategory::workspace),
          sums_(2, MemoryCategory::workspace),
          counts_(2, MemoryCategory::workspace),
          figures_(1, MemoryCategory::workspace),
          host_figures_(static_cast<StepFigures*>(pinned_host_alloc(sizeof(StepFigures)))),
          host_counts_(static_cast<long long*>(pinned_host_alloc(2 * sizeof(long long)))) {
        if (optimizer.on_host())
            offloaded_ =
                std::make_unique<OffloadedAdamW<T, G>>(optimizer, cpu_threads_per_rank(), strategy.params_on_host());
        else if (strategy.params_on_host())
            throw std::invalid_argument(
                "parameters in host memory need the optimizer state there too (--offload "
                "params offloads both)");
        for (int i = 0; i < 2 * strategy.slots(); ++i) {
            Staging st;
            st.host = static_cast<int*>(pinned_host_alloc(3 * size_t(rows_) * sizeof(int)));
            CUDA_CHECK(cudaEventCreateWithFlags(&st.read, cudaEventDisableTiming));
            staging_.push_back(st);
        }
    }
    ~Trainer() {
        for (Staging& st : staging_) {
            cudaEventSynchronize(st.read);
            cudaEventDestroy(st.read);
            memory_free(st.host);
        }
        memory_free(host_figures_);
        memory_free(host_counts_);
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

    // This micro-batch's loss sum, forward only (evaluation): on every rank, also in a pipeline.
    double forward_loss(const DataLoader::MicroBatch& b) {
        forward_slot(0, b, -1, losses_.get());
        const double local = read_loss(losses_.get());
        return s_.data_comm() == s_.comm() ? local
                                           : sum_over_ranks(local, sums_.get());  // a pipeline's last stage has it
    }

    // One optimizer step at 1-based step t over this rank's micro-batches.
    StepResult step(const std::vector<DataLoader::MicroBatch>& micro, double lr, long long t, double clip,
                    const AdamWSettings& adamw) {
        Llama<T>& m = s_.model();
        StepResult r;
        long long local = 0;
        for (const auto& b : micro)
            for (int target : b.targets) local += target != kIgnoreIndex;
        cudaStream_t stream = m.stream();
        if (losses_.size() < micro.size()) losses_ = DeviceBuffer<A>(micro.size(), MemoryCategory::workspace);
        s_.begin_step();
        CUDA_CHECK(cudaMemsetAsync(losses_.get(), 0, micro.size() * sizeof(A), stream));
        const size_t slots = size_t(s_.slots());
        for (size_t first = 0; first < micro.size(); first += slots) {
            const size_t n = std::min(slots, micro.size() - first);
            for (size_t k = 0; k < n; ++k) forward_slot(int(k), micro[first + k], t, losses_.get() + first + k);
            if (first == 0) {  // the backward needs the count (its loss scale): one integer all-reduce
                r.counted = s_.data_comm() ? count_over_ranks(local, *s_.data_comm()) : local;
                if (r.counted == 0)
                    throw std::runtime_error("step " + std::to_string(t) + " has no counted target tokens");
            }
            for (size_t k = 0; k < n; ++k)
                s_.backward(int(k), device_batch(k, micro[first + k], t), 1.0 / double(r.counted),
                            first + k + 1 == micro.size());
        }
        s_.finish_gradients();
        sum_losses(losses_.get(), int(micro.size()), sums_.get(), stream);  // in micro-batch order
        const double* loss_sum = sums_.get();
        if (Comm* c = s_.comm()) {  // over the ranks, in rank order
            c->fence_from(stream);
            c->all_reduce(sums_.get(), sums_.get() + 1, 1);
            c->fence_to(stream);
            loss_sum = sums_.get() + 1;
        }
        StepFigures* figures = figures_.get();
        step_figures(loss_sum, s_.unit_norms_sq(), m.num_units(), clip, figures, stream);
        if (offloaded_)  // the CPU update (optim/offload.h), the host waiting on its copies
            offloaded_->step([&](int u) { return s_.owned_params(u); }, [&](int u) { return s_.owned_grads(u); }, adamw,
                             lr, t, &figures->scale, stream, [&](cudaEvent_t e) { wait_event_polling(e, s_.comms()); });
        else
            for (int u = 0; u < m.num_units(); ++u)
                opt_.update_unit(u, s_.owned_params(u), s_.owned_grads(u), adamw, lr, t, 1.0, stream, &figures->scale);
        s_.after_update();
        CUDA_CHECK(cudaMemcpyAsync(host_figures_, figures, sizeof(StepFigures), cudaMemcpyDeviceToHost, stream));
        wait_polling(stream, s_.comms());  // the step's one wait
        r.loss = host_figures_->loss_sum / double(r.counted);
        r.grad_norm = host_figures_->grad_norm;
        if (!std::isfinite(r.loss) || !std::isfinite(host_figures_->scale))
            throw std::runtime_error("step " + std::to_string(t) + ": the loss or gradient norm is not finite (loss " +
                                     std::to_string(r.loss) + ", norm " + std::to_string(r.grad_norm) +
                                     "); lower --lr or enable --clip");
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
    // Slot k's device arrays of micro-batch b (uploaded by forward_slot); positions only when b
    // has them (document masking), else null: plain causal attention. `step`: the training step
    // (keys the adapters' dropout with the batch's global rows), −1 for evaluation.
    DeviceBatch device_batch(size_t k, const DataLoader::MicroBatch& b, long long step) {
        return {tokens(k), targets(k), b.positions.empty() ? nullptr : positions(k),
                b.first_sample * s_.model().seq_len(), step};
    }
    // Uploads the micro-batch into its slot and runs its forward; the loss sum stays on the device
    // (zero on ranks without the head).
    void forward_slot(int slot, const DataLoader::MicroBatch& b, long long step, A* loss) {
        Llama<T>& m = s_.model();
        const size_t k = size_t(slot), n = size_t(rows_);
        for (const std::vector<int>* field : {&b.inputs, &b.targets, &b.positions})
            if (field->size() != n && !(field == &b.positions && field->empty()))
                throw std::logic_error("a micro-batch field holds " + std::to_string(field->size()) +
                                       " values; the model takes batch × seq_len = " + std::to_string(n));
        Staging& st = staging_[next_staging_++ % staging_.size()];
        CUDA_CHECK(cudaEventSynchronize(st.read));  // the copy that last read this buffer is done
        int* host = st.host;
        std::copy(b.inputs.begin(), b.inputs.end(), host);
        std::copy(b.targets.begin(), b.targets.end(), host + n);
        std::copy(b.positions.begin(), b.positions.end(), host + 2 * n);
        cudaStream_t stream = m.stream();
        CUDA_CHECK(cudaMemcpyAsync(tokens(k), host, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(targets(k), host + n, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        if (!b.positions.empty())
            CUDA_CHECK(cudaMemcpyAsync(positions(k), host + 2 * n, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaEventRecord(st.read, stream));
        CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(A), m.stream()));
        s_.forward(slot, device_batch(k, b, step), loss, count_.get() + k);
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
    DeviceBuffer<A> losses_;                          // per micro-batch of the step: its loss sum
    DeviceBuffer<int> count_;
    DeviceBuffer<double> sums_;
    DeviceBuffer<long long> counts_;
    DeviceBuffer<StepFigures> figures_;
    StepFigures* host_figures_;  // pinned: where the step's figures are read back
    long long* host_counts_;     // pinned: this rank's count and the sum over ranks
    struct Staging {
        int* host = nullptr;         // pinned [3][rows]: tokens, targets, positions
        cudaEvent_t read = nullptr;  // recorded after the copies that read it
    };
    std::vector<Staging> staging_;
    size_t next_staging_ = 0;
};

}  // namespace pv
