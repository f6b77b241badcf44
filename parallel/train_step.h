// One optimizer step under any strategy (DESIGN.md §2, §4), the loop `train` runs and the parity
// tests run in-process.
//
//   1. The step's counted target tokens are known before any forward: this rank counts its own,
//      an all-reduce of one integer gives the global count C (a step with C = 0 is an error).
//   2. Each micro-step: forward (its loss sum kept), backward with loss scale 1/C, so that the
//      gradients summed over micro-steps and ranks are those of the global mean loss; the
//      strategy communicates in its hooks.
//   3. The strategy completes the owned gradients; the loss (sum over ranks / C) is all-reduced
//      for the log; the global gradient norm gives the clipping scale.
//   4. AdamW updates the owned range of every unit; the strategy makes the new parameters visible.
// Every cross-rank number goes through the strategy's Comm, so it is counted like the rest.
#pragma once

#include "data/loader.h"
#include "optim/optimizer.cuh"
#include "optim/schedule.h"
#include "parallel/strategy.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

struct StepResult {
    double loss = 0;       // the global mean loss of the step
    double grad_norm = 0;  // the global gradient norm before clipping
    long long counted = 0; // the global number of counted target tokens
};

template <class T, class G>
class Trainer {
  public:
    using A = acc_t<T>;
    // The optimizer state must cover what the strategy owns (make_optimizer does it).
    Trainer(Strategy<T, G>& strategy, AdamWState<T>& optimizer)
        : s_(strategy), opt_(optimizer), tokens_(size_t(strategy.model().rows()), MemoryCategory::workspace),
          targets_(size_t(strategy.model().rows()), MemoryCategory::workspace), loss_(1, MemoryCategory::workspace),
          count_(1, MemoryCategory::workspace), scalars_(2, MemoryCategory::workspace),
          sums_(2, MemoryCategory::workspace), counts_(2, MemoryCategory::workspace) {}

    // Optimizer state for what `strategy` owns, the master copy initialised from the parameters.
    static std::unique_ptr<AdamWState<T>> make_optimizer(Strategy<T, G>& strategy) {
        Llama<T>& m = strategy.model();
        std::vector<GroupLayout> layouts;
        for (int u = 0; u < m.num_units(); ++u) layouts.push_back(m.layout(u));
        const bool sharded = strategy.sharded_optimizer();
        auto opt = std::make_unique<AdamWState<T>>(layouts, sharded ? strategy.rank() : 0, sharded ? strategy.ranks() : 1);
        for (int u = 0; u < m.num_units(); ++u) opt->init_master(u, strategy.owned_params(u), m.stream());
        return opt;
    }

    // This micro-batch's loss sum, forward only (evaluation, and inside step).
    double forward_loss(const DataLoader::MicroBatch& b) {
        Llama<T>& m = s_.model();
        CUDA_CHECK(cudaMemcpy(tokens_.get(), b.inputs.data(), tokens_.bytes(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(targets_.get(), b.targets.data(), targets_.bytes(), cudaMemcpyHostToDevice));
        s_.forward(0, tokens_.get(), targets_.get(), loss_.get(), count_.get());
        A host = 0;
        CUDA_CHECK(cudaMemcpyAsync(&host, loss_.get(), sizeof(A), cudaMemcpyDeviceToHost, m.stream()));
        CUDA_CHECK(cudaStreamSynchronize(m.stream()));
        return double(host);
    }

    // One optimizer step at 1-based step t over this rank's micro-batches.
    StepResult step(const std::vector<DataLoader::MicroBatch>& micro, double lr, long long t, double clip,
                    const AdamWSettings& adamw) {
        Llama<T>& m = s_.model();
        StepResult r;
        long long local = 0;
        for (const auto& b : micro)
            for (int target : b.targets) local += target != kIgnoreIndex;
        r.counted = sum_over_ranks(local, counts_.get());  // one integer all-reduce
        if (r.counted == 0) throw std::runtime_error("step " + std::to_string(t) + " has no counted target tokens");
        s_.begin_step();
        double loss_sum = 0;
        for (size_t j = 0; j < micro.size(); ++j) {
            loss_sum += forward_loss(micro[j]);
            s_.backward(0, tokens_.get(), targets_.get(), 1.0 / double(r.counted), j + 1 == micro.size());
        }
        s_.finish_gradients();
        r.loss = sum_over_ranks(loss_sum, sums_.get()) / double(r.counted);
        r.grad_norm = std::sqrt(s_.global_grad_norm_sq(scalars_.get(), scalars_.get() + 1));
        const double scale = clip_scale(r.grad_norm, clip);
        if (!std::isfinite(r.loss) || !std::isfinite(scale))
            throw std::runtime_error("step " + std::to_string(t) + ": the loss or gradient norm is not finite (loss " +
                                     std::to_string(r.loss) + ", norm " + std::to_string(r.grad_norm) +
                                     "); lower --lr or enable --clip");
        for (int u = 0; u < m.num_units(); ++u)
            opt_.update_unit(u, s_.owned_params(u), s_.owned_grads(u), adamw, lr, t, scale, m.stream());
        s_.after_update();
        CUDA_CHECK(cudaStreamSynchronize(m.stream()));
        return r;
    }

    // Σ over ranks of one number, in rank order (the number itself with one rank); `device` is
    // two elements of scratch.
    template <class X>
    X sum_over_ranks(X x, X* device) {
        Comm* c = s_.comm();
        if (!c) return x;
        Llama<T>& m = s_.model();
        CUDA_CHECK(cudaMemcpyAsync(device, &x, sizeof(X), cudaMemcpyHostToDevice, m.stream()));
        c->fence_from(m.stream());
        c->all_reduce(device, device + 1, 1);
        c->fence_to(m.stream());
        X out = 0;
        CUDA_CHECK(cudaMemcpyAsync(&out, device + 1, sizeof(X), cudaMemcpyDeviceToHost, m.stream()));
        CUDA_CHECK(cudaStreamSynchronize(m.stream()));
        return out;
    }

  private:
    Strategy<T, G>& s_;
    AdamWState<T>& opt_;
    DeviceBuffer<int> tokens_, targets_;
    DeviceBuffer<A> loss_;
    DeviceBuffer<int> count_;
    DeviceBuffer<double> scalars_, sums_;
    DeviceBuffer<long long> counts_;
};

}  // namespace pv
