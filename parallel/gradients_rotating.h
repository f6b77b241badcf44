// Gradients sharded (ZeRO-2 and ZeRO-3; parallel/policy.h GradientReduction::rotating; DESIGN.md
// §3-4): a unit's full-size gradient exists only from just before its backward until its
// reduce-scatter has consumed it.
//
// Buffers. Rank r keeps, per unit, only the reduced gradient of its slice r (Ψ/N elements in
// all), accumulated over micro-steps. Full-size gradients live in two rotating buffers the size of
// the largest unit: before unit u's backward one is bound to the unit (Llama's Gradients::bound);
// after it, on the communication stream, the buffer is reduce-scattered in place and
// its slice r added into the slice accumulator; an event then marks the buffer free, and the
// compute stream waits for that event before binding the buffer to the unit after next. So the
// backward of unit u − 1 overlaps the reduce-scatter of unit u, and never more than two
// full-size unit gradients exist. A tied embedding is the exception DESIGN.md §3 names: the
// head's backward already writes the embedding's gradient, so the embedding unit has a buffer of
// its own, bound from the head's backward to the embedding's (on a pipeline's last stage, to its
// copy of the embedding; a first stage without the head binds it at the embedding's backward).
//
// Zeroing. A bound buffer's old values are never read: the unit's backward writes over every
// tensor of its gradient (Llama::discard_grads(u): the weight-gradient GEMMs with β = 0, ...) and
// never touches the padding between and after them, so the padding stays what it was. Where the
// buffer's last unit had the same padding (model/parameters.h same_padding: every block after
// another block) it is still zero and nothing is cleared; where the layout changes (a block after
// the head, the embedding after a block, the head after the embedding) the buffer is zeroed and
// the unit's backward adds to it, as before. So of a step's units, per micro-step, two to four
// are zeroed (the head, an untied embedding and one or two blocks), not all of them; and each
// buffer's first binding in a step (begin_step).
//
// Per optimizer step with accumulation A that is A reduce-scatters per unit: A·(N − 1)/N·Ψ
// elements (Ψ: trainable elements). Memory (bf16): slices 2Ψ/N plus the rotating buffers
// 2·2·max unit (+ the embedding).
//
// Hybrid sharding (--shard-group K): the reduce-scatters run within the rank's group of K, and on
// the last micro-step the accumulated slice is all-reduced over the replicas (the N/K ranks
// holding the same slice), once per step: 2·(N/K−1)/(N/K)·Ψ/K across groups.
//
// Gradients are reduced in the run's storage type; fp32 gradient accumulation is not supported
// here (the slices would have to be float and the reduce-scatter too).
#pragma once

#include "parallel/data_parts.h"
#include "parallel/strategy.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace pv {

template <class T, class G>
class RotatingGradients : public GradientPart<T, G> {
  public:
    // The model must have been built with Gradients::bound.
    explicit RotatingGradients(Strategy<T, G>& s) : GradientPart<T, G>(s) {
        if constexpr (!std::is_same_v<G, T>) {
            throw std::invalid_argument(
                "sharded gradients are reduced in the storage type: drop --fp32-grad-accumulation");
        } else {
            Llama<T>& model = s.model();
            for (int u = 0; u < model.num_units(); ++u)  // (a pipeline's other stages' units: none)
                slices_.emplace_back(size_t(model.holds(u) ? s.slice_len(u) : 0), MemoryCategory::gradients);
            for (int b = 0; b < 2; ++b) rotating_.emplace_back(size_t(largest_rotating()), MemoryCategory::gradients);
            if (tied() && model.holds(0))
                embedding_ = DeviceBuffer<T>(size_t(model.trainable(0).padded), MemoryCategory::gradients);
            for (cudaEvent_t& e : free_) {
                CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
                CUDA_CHECK(cudaEventRecord(e, s.shard_comm()->stream()));
            }
        }
    }
    ~RotatingGradients() override {
        for (cudaEvent_t e : free_) cudaEventDestroy(e);
    }

    // Every step also starts from the same host state: each buffer's first binding zeroes it (a
    // unit-sized memset a step for each rotating buffer and a tied embedding's), so a step's
    // micro-steps are the same host decisions in every step and --cuda-graphs captures each of them
    // in the first step only, on every rank alike — as NCCL requires of captured collectives
    // (trainer/micro_step_graphs.h).
    void begin_step() override {
        for (auto& s : slices_) CUDA_CHECK(cudaMemsetAsync(s.get(), 0, s.bytes(), this->s_.model().stream()));
        std::fill(std::begin(occupant_), std::end(occupant_), -1);
    }
    void finish() override { this->s_.shard_comm()->fence_to(this->s_.model().stream()); }
    // Every buffer is free: the compute stream has waited for the reduce-scatters before it.
    void begin_micro_step() override {
        for (cudaEvent_t e : free_) CUDA_CHECK(cudaEventRecord(e, this->s_.model().stream()));
    }
    std::vector<int> micro_step_state() const override { return {occupant_, occupant_ + 3}; }
    void set_micro_step_state(const std::vector<int>& state) override {
        std::copy(state.begin(), state.end(), occupant_);
    }
    const G* slice_grads(int u) override { return slices_[size_t(u)].get(); }
    const G* owned_grads(int u) override { return slices_[size_t(u)].get(); }

    // The head writes the embedding's gradient first (on a pipeline's last stage, into its copy);
    // a first stage without the head binds it at the embedding's own backward.
    void before_unit_backward(int u) override {
        if (u == last() && tied()) bind(0);
        if (u > 0 || !tied() || !this->s_.model().runs(last())) bind(u);
    }

    void after_unit_backward(int u, bool last_micro_step) override {
        Strategy<T, G>& s = this->s_;
        Comm& c = *s.shard_comm();
        const int b = buffer_of(u);
        T* full = buffer(b);
        const long long begin = s.slice_begin(u), len = s.slice_len(u);
        if (len == 0) return;  // nothing of the unit trains
        c.fence_from(s.model().stream());
        c.reduce_scatter(full, full + begin, size_t(len));
        if constexpr (std::is_same_v<G, T>) {
            accumulate(slices_[size_t(u)].get(), full + begin, len, c.stream());
            if (Comm* replicas = s.replica_comm(); replicas && last_micro_step)  // the step's sum, on the same stream
                replicas->all_reduce(slices_[size_t(u)].get(), slices_[size_t(u)].get(), size_t(len));
        }
        CUDA_CHECK(cudaEventRecord(free_[b], c.stream()));
    }

  private:
    bool tied() const { return this->s_.model().config().tie_embeddings; }
    int last() const { return this->s_.model().num_units() - 1; }
    // The size of a rotating buffer: the largest unit this rank runs that is not a tied embedding
    // (which has its own).
    long long largest_rotating() const {
        long long largest = 0;
        for (int u = tied() ? 1 : 0; u <= last(); ++u)
            if (this->s_.model().runs(u)) largest = std::max(largest, this->s_.model().trainable(u).padded);
        return largest;
    }
    // Which buffer unit u's gradient is in: 2 = the embedding's own, else a rotating one.
    int buffer_of(int u) const { return rotating_gradient_buffer(u, last(), tied()); }
    T* buffer(int b) { return b == 2 ? embedding_.get() : rotating_[size_t(b)].get(); }

    void bind(int u) {
        Llama<T>& model = this->s_.model();
        const int b = buffer_of(u);
        cudaStream_t compute = model.stream();
        CUDA_CHECK(cudaStreamWaitEvent(compute, free_[b], 0));  // its last reduce-scatter is done
        model.bind_grads(u, buffer(b));
        const int last = occupant_[b];
        if (last >= 0 && same_padding(model.trainable(last), model.trainable(u)))
            model.discard_grads(u);  // its padding is still zero: the backward writes the rest over
        else
            CUDA_CHECK(cudaMemsetAsync(buffer(b), 0, model.trainable(u).bytes(), compute));
        occupant_[b] = u;
    }

    std::vector<DeviceBuffer<G>> slices_;    // per unit: this rank's reduced slice, summed over micro-steps
    std::vector<DeviceBuffer<T>> rotating_;  // two full-size unit gradients
    DeviceBuffer<T> embedding_;              // the tied embedding's own
    cudaEvent_t free_[3] = {};
    int occupant_[3] = {-1, -1, -1};  // the unit each buffer was last bound to (-1: never)
};

}  // namespace pv
