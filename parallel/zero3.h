// ZeRO-3 (DESIGN.md §3-4): ZeRO-2, and the parameters sharded too. Rank r keeps only slice r of
// every unit's parameters (initialised alone with Llama::init_params: the same values the whole
// model would have); the optimizer updates the slice in place, so there is no all-gather after
// the update. Before a unit runs, its parameters are all-gathered into a preallocated buffer and
// bound to the model (Parameters::bound).
//
// Buffers (preallocated; nothing is allocated or freed inside a step): two gather buffers the
// size of the largest unit, used by units in turn (unit u in buffer u mod 2), and, with tied
// embeddings, the embedding's own, which holds the gathered embedding from the embedding's
// forward until the head's backward (the head reads wte in both).
//
// Schedule, on the communication stream, each gather behind a fence on the compute stream's work
// so far (which also orders it after the last use of the buffer it overwrites) and announced by
// an event the compute stream waits for before the unit runs:
//   forward:  gather unit 0; before unit u runs, prefetch unit u + 1, so it overlaps unit u.
//   backward: the head's parameters are still in their buffer from its forward; before unit u
//             runs, prefetch unit u − 1. The embedding's backward reads no parameters (its
//             gradient is a scatter of the incoming one), so it is not gathered again.
// Per micro-step that gathers Ψ in the forward and Ψ − Ψ_embedding − Ψ_head in the backward, and
// reduce-scatters Ψ (ZeRO-2's gradients): (3Ψ − Ψ_embedding − Ψ_head)·(N − 1)/N elements, times
// the accumulation A, per optimizer step. Memory (bf16): 16Ψ/N plus the gather buffers and
// ZeRO-2's rotating gradient buffers.
#pragma once

#include "parallel/zero2.h"

namespace pv {

template <class T, class G>
class Zero3 : public Zero2<T, G> {
  public:
    // The model must have been built with Gradients::bound and Parameters::bound; `seed` is its
    // initialisation seed.
    Zero3(Llama<T>& model, Comm& comm, uint64_t seed) : Zero2<T, G>(model, comm) {
        for (int u = 0; u < model.num_units(); ++u) {
            slices_.emplace_back(size_t(this->slice_len(u)), MemoryCategory::parameters);
            model.init_params(u, slices_.back().get(), this->slice_begin(u), this->slice_begin(u) + this->slice_len(u),
                              seed);
        }
        for (int b = 0; b < 2; ++b) gathered_.emplace_back(size_t(this->largest_rotating()), MemoryCategory::comm_buffers);
        if (this->tied()) gathered_.emplace_back(size_t(model.layout(0).padded), MemoryCategory::comm_buffers);
        for (cudaEvent_t& e : ready_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    ~Zero3() override {
        for (cudaEvent_t e : ready_) cudaEventDestroy(e);
    }
    bool holds_whole_model() const override { return false; }  // slices only

    const char* name() const override { return "zero3"; }
    T* owned_params(int u) override { return slices_[size_t(u)].get(); }
    void after_update() override {}  // the optimizer updated the slices themselves

  protected:
    int gather_buffer(int u) const { return u == 0 && this->tied() ? 2 : u % 2; }

    // Starts the all-gather of unit u into its buffer on the communication stream.
    void gather(int u) {
        Comm& c = *this->comm_;
        const int b = gather_buffer(u);
        c.fence_from(this->model_.stream());
        c.all_gather(slices_[size_t(u)].get(), gathered_[size_t(b)].get(), size_t(this->slice_len(u)));
        CUDA_CHECK(cudaEventRecord(ready_[b], c.stream()));
    }
    // Makes the compute stream wait for unit u's gather and binds its parameters.
    void use(int u) {
        const int b = gather_buffer(u);
        CUDA_CHECK(cudaStreamWaitEvent(this->model_.stream(), ready_[b], 0));
        this->model_.bind_params(u, gathered_[size_t(b)].get());
    }

    void before_unit_forward(int u) override {
        if (u == 0) gather(0);
        if (u + 1 < this->model_.num_units()) gather(u + 1);  // prefetch: overlaps unit u
        use(u);
    }

    void before_unit_backward(int u) override {
        Zero2<T, G>::before_unit_backward(u);  // the gradient buffer
        if (u - 1 >= 1) gather(u - 1);         // prefetch (the embedding needs no parameters)
        if (u != this->last() && u >= 1) use(u);  // the head's are still bound from its forward
    }

  private:
    std::vector<DeviceBuffer<T>> slices_;    // per unit: this rank's slice of the parameters
    std::vector<DeviceBuffer<T>> gathered_;  // two rotating gather buffers, then the tied embedding's
    cudaEvent_t ready_[3] = {};
};

}  // namespace pv
