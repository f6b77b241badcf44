// What every strategy shares (DESIGN.md §2): the loop over units, and the hooks where a strategy
// adds communication. A strategy is applied to a model that knows nothing about it.
//
// One micro-step runs forward over the units (embedding, blocks, head) and backward in reverse,
// the residual stream's gradient passed between the model's two buffers. After each unit's
// backward the strategy's `after_unit_backward` runs: DDP starts that unit's gradient all-reduce
// there (a bucket), overlapping the backward of the units below.
//
// Gradients. G is the type gradients are reduced and the optimizer reads: T, or float with fp32
// gradient accumulation for bf16, where each micro-step's bf16 gradients of a unit are added into
// a float buffer right after the unit's backward (so a DDP bucket can reduce the float sums as
// soon as the last micro-step's unit is done). A unit's group is written by that unit's backward
// and, for the tied embedding, earlier by the head's; the embedding unit runs last, so "after
// unit u's backward" is always after every write to group u.
//
// Ownership. Rank r of N owns slice r of every unit's padded group ([r·len, (r+1)·len), len =
// padded/N): ZeRO keeps optimizer state only there; DDP keeps all of it, but every strategy forms
// the global gradient norm the same way — each rank the squares of its slice, in unit order,
// then a sum over ranks in rank order — so DDP and ZeRO clip by bit-identical scales.
#pragma once

#include "kernels/glue.cuh"
#include "model/llama.h"
#include "parallel/comm.h"
#include "parallel/unit_loop.h"

#include <memory>
#include <vector>

namespace pv {

template <class T, class G>
class Strategy {
  public:
    // comm: null for the single strategy. The model's groups must split into comm->size() shards.
    Strategy(Llama<T>& model, Comm* comm) : model_(model), comm_(comm) {
        static_assert(std::is_same_v<G, T> || std::is_same_v<G, float>, "gradients are T or float");
        if constexpr (!std::is_same_v<G, T>)
            for (int u = 0; u < model.num_units(); ++u)
                grad32_.emplace_back(size_t(model.layout(u).padded), MemoryCategory::gradients);
        long long largest = 0;
        for (int u = 0; u < model.num_units(); ++u) largest = std::max(largest, model.layout(u).padded);
        norm_scratch_ = DeviceBuffer<uint8_t>(sum_of_squares_scratch_bytes<G>(largest), MemoryCategory::workspace);
    }
    virtual ~Strategy() = default;
    Strategy(const Strategy&) = delete;
    Strategy& operator=(const Strategy&) = delete;

    virtual const char* name() const = 0;
    Llama<T>& model() { return model_; }
    Comm* comm() { return comm_; }
    int rank() const { return comm_ ? comm_->rank() : 0; }
    int ranks() const { return comm_ ? comm_->size() : 1; }

    // The slice of unit u's group this rank owns.
    long long slice_len(int u) const { return model_.layout(u).padded / ranks(); }
    long long slice_begin(int u) const { return slice_len(u) * rank(); }
    // The range the optimizer of this rank updates: everything, or the slice (ZeRO).
    virtual bool sharded_optimizer() const = 0;
    long long owned_begin(int u) const { return sharded_optimizer() ? slice_begin(u) : 0; }
    long long owned_len(int u) const { return sharded_optimizer() ? slice_len(u) : model_.layout(u).padded; }

    // The start of an optimizer step: gradients to zero.
    virtual void begin_step() {
        model_.zero_grads();
        for (auto& g : grad32_) CUDA_CHECK(cudaMemsetAsync(g.get(), 0, g.bytes(), model_.stream()));
    }

    // One micro-step's forward (loss sum and count of this micro-batch into the device scalars).
    void forward(int slot, const int* tokens, const int* targets, acc_t<T>* loss_sum, int* count) {
        single_forward(model_, slot, tokens, targets, loss_sum, count, [&](int u) { before_unit_forward(u); });
    }

    // One micro-step's backward; `last` marks the last micro-step of the optimizer step.
    void backward(int slot, const int* tokens, const int* targets, double loss_scale, bool last) {
        if (!grad32_.empty()) model_.zero_grads();  // each micro-step's T gradients, then added up
        single_backward(
            model_, slot, tokens, targets, loss_scale, [&](int u) { before_unit_backward(u); },
            [&](int u) {
            if constexpr (!std::is_same_v<G, T>)
                accumulate(grad32_[size_t(u)].get(), model_.grads(u), model_.layout(u).padded, model_.stream());
            after_unit_backward(u, last);
        });
    }

    // After the last micro-step: the owned range's gradients are complete and reduced, on the
    // compute stream's timeline.
    virtual void finish_gradients() = 0;

    // Unit u's full gradient buffer (where it has one), and the reduced gradient of this rank's
    // slice and of the range its optimizer owns (element owned_begin).
    G* grads(int u) {
        if constexpr (std::is_same_v<G, T>) return model_.grads(u);
        else return grad32_[size_t(u)].get();
    }
    virtual const G* slice_grads(int u) { return grads(u) + slice_begin(u); }
    // The parameters of the owned range, which the optimizer updates (ZeRO-3: the rank's slice).
    virtual T* owned_params(int u) { return model_.params(u) + owned_begin(u); }
    virtual const G* owned_grads(int u) { return grads(u) + owned_begin(u); }

    // The squared global gradient norm (header comment), written to `out` (one device double;
    // `scratch` a second one) and returned.
    double global_grad_norm_sq(double* out, double* scratch) {
        for (int u = 0; u < model_.num_units(); ++u)  // with one rank the slice is the group
            sum_of_squares_launch(slice_grads(u), slice_len(u), out, norm_scratch_.get(), u > 0, model_.stream());
        if (comm_) {
            comm_->fence_from(model_.stream());
            comm_->all_reduce(out, scratch, 1);
            comm_->fence_to(model_.stream());
            out = scratch;
        }
        double host = 0;
        CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof(double), cudaMemcpyDeviceToHost, model_.stream()));
        CUDA_CHECK(cudaStreamSynchronize(model_.stream()));
        return host;
    }

    // After the optimizer has updated the owned ranges: every rank sees every new parameter.
    virtual void after_update() {}

  protected:
    virtual void before_unit_forward(int /*u*/) {}
    virtual void before_unit_backward(int /*u*/) {}
    virtual void after_unit_backward(int /*u*/, bool /*last*/) {}

    Llama<T>& model_;
    Comm* comm_;
    std::vector<DeviceBuffer<float>> grad32_;
    DeviceBuffer<uint8_t> norm_scratch_;
};

}  // namespace pv
