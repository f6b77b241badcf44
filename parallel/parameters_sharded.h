// Parameters sharded (ZeRO-3, with rotating gradients and a sharded optimizer; parallel/policy.h
// ParameterPlacement::sharded; DESIGN.md §3-4). Rank r keeps only slice r of
// every group of every unit — frozen groups too, which are gathered with the unit but never
// reduced or updated (initialised alone with Llama::init_params: the same values the whole
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
// Under a pipeline the same runs per chunk of the rank's units: the chunk's first unit gathered,
// the next ones prefetched within it; a chunk's first backward gathers its unit again (other
// micro-batches' forwards ran since its own); the last stage gathers the tied embedding's copy
// before the head's forward.
// With Ψ the trainable elements and Ψall every group's (frozen ones too), per micro-step that
// gathers Ψall in the forward and Ψall − Ψall_embedding − Ψall_head in the backward, and
// reduce-scatters Ψ (ZeRO-2's gradients): (2Ψall − Ψall_embedding − Ψall_head + Ψ)·(N − 1)/N
// elements, times the accumulation A, per optimizer step; without frozen tensors (3Ψ − Ψ_embedding
// − Ψ_head)·(N − 1)/N. Memory (bf16): 2Ψall/N + 14Ψ/N (16Ψ/N without frozen tensors) plus the
// gather buffers and ZeRO-2's rotating gradient buffers.
//
// Hybrid sharding (--shard-group K): slices of 1/K, gathered within the rank's group of K only.
//
// --offload params (ZeRO-Offload): the slices live in pinned host memory instead (counted as
// MemoryCategory::pinned_host), and each gather buffer gets a device staging buffer of its slice
// size (comm_buffers; zero3_gather_buffers / shards). A gather first copies the unit's slices host
// → device into its buffer's staging, on the communication stream right before the all-gather
// that reads it, so the copy overlaps compute like the gather itself, and a staging buffer is
// rewritten only after the all-gather before it on the same stream. The optimizer (optim/offload.h)
// updates the host slices in place on the CPU (params_on_host). Initialisation writes each slice
// into a staging buffer on the device and downloads it, so nothing beyond the staging is ever
// allocated for it. NF4 groups are refused (their quantisation and loading run on the device).
#pragma once

#include "optim/host_placement.h"
#include "parallel/data_parts.h"
#include "parallel/plan.h"
#include "parallel/strategy.h"

#include <cstring>
#include <map>
#include <stdexcept>
#include <utility>

namespace pv {

template <class T, class G>
class ShardedParameters : public ParameterPart<T, G> {
  public:
    // The model must have been built with Parameters::bound; `seed` is its initialisation seed.
    // offload_params: the slices in pinned host memory (header comment).
    ShardedParameters(Strategy<T, G>& s, uint64_t seed, bool offload_params)
        : ParameterPart<T, G>(s), offload_(offload_params) {
        Llama<T>& model = s.model();
        std::vector<long long> elements;  // the units this rank holds (a pipeline's stage)
        for (int u = 0; u < model.num_units(); ++u) elements.push_back(model.holds(u) ? unit_elements(u) : 0);
        for (long long n : zero3_gather_buffers(elements, tied())) {
            gathered_.emplace_back(size_t(n), MemoryCategory::comm_buffers);
            if (offload_) staging_.emplace_back(size_t(n / s.shards()), MemoryCategory::comm_buffers);
        }
        slices_.resize(size_t(model.num_units()));
        for (int u = 0; u < model.num_units(); ++u)
            for (int g = 0; g < model.num_groups(u) && model.holds(u); ++g) {
                const long long begin = s.slice_begin(u, g), len = s.slice_len(u, g);
                if (!offload_) {
                    slices_[size_t(u)].emplace_back(size_t(len), MemoryCategory::parameters);
                    model.init_params(u, g, slices_[size_t(u)].back().get(), begin, begin + len, seed);
                    continue;
                }
                if (model.group(u, g).kind == GroupKind::nf4)
                    throw std::invalid_argument(
                        "--offload params with NF4 groups (QLoRA): the NF4 base is "
                        "quantised on the device; use --offload optimizer");
                // The CPU update writes them in place: placed as the optimizer state is.
                T* host = static_cast<T*>(host_alloc_first_touched(size_t(len) * sizeof(T), offload_pool()));
                host_slices_.push_back(host);
                slices_[size_t(u)].emplace_back();
                host_[{u, g}] = host;
                if (len == 0) continue;
                T* scratch = staging_[size_t(gather_buffer(u))].get();  // holds the unit's slices
                model.init_params(u, g, scratch, begin, begin + len, seed);
                CUDA_CHECK(cudaStreamSynchronize(model.stream()));
                CUDA_CHECK(cudaMemcpy(host, scratch, size_t(len) * sizeof(T), cudaMemcpyDeviceToHost));
            }
        for (cudaEvent_t& e : ready_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    ~ShardedParameters() override {
        for (cudaEvent_t e : ready_) cudaEventDestroy(e);
        if (offload_) cudaStreamSynchronize(this->s_.shard_comm()->stream());  // no copy may outlive the slices
        for (T* p : host_slices_) memory_free(p);
    }
    bool whole() const override { return false; }  // slices only

    // The optimizer updates the slices themselves: nothing to gather after it.
    T* owned_params(int u) override { return local_params(u, 0); }
    bool on_host() const override { return offload_; }
    T* local_params(int u, int g) override {
        if (!this->s_.model().holds(u)) return nullptr;  // another stage's
        return offload_ ? host_.at({u, g}) : slices_[size_t(u)][size_t(g)].get();
    }
    long long local_begin(int u, int g) override { return this->s_.slice_begin(u, g); }
    long long local_len(int u, int g) override { return this->s_.model().holds(u) ? this->s_.slice_len(u, g) : 0; }

  private:
    Llama<T>& model() const { return this->s_.model(); }
    bool tied() const { return this->s_.model().config().tie_embeddings; }
    int last() const { return this->s_.model().num_units() - 1; }
    int gather_buffer(int u) const { return u == 0 && tied() ? 2 : u % 2; }
    // Unit u's groups back to back in a gather buffer: their padded sizes summed.
    long long unit_elements(int u) const {
        long long n = 0;
        for (int g = 0; g < this->s_.model().num_groups(u); ++g) n += this->s_.model().group(u, g).padded;
        return n;
    }

    // Starts the all-gather of unit u's groups (frozen ones too) into its buffer on the
    // communication stream.
    void gather(int u) {
        Comm& c = *this->s_.shard_comm();
        T* buffer = gathered_[size_t(gather_buffer(u))].get();
        T* staged = offload_ ? staging_[size_t(gather_buffer(u))].get() : nullptr;
        c.fence_from(model().stream());
        for (int g = 0; g < model().num_groups(u); ++g) {
            const long long len = this->s_.slice_len(u, g);
            const T* slice = local_params(u, g);
            if (offload_ && len > 0) {  // host -> device staging first, on the same stream
                CUDA_CHECK(cudaMemcpyAsync(staged, slice, size_t(len) * sizeof(T), cudaMemcpyHostToDevice, c.stream()));
                slice = staged;
                staged += len;
            }
            if (len > 0) c.all_gather(slice, buffer, size_t(len));
            buffer += model().group(u, g).padded;
        }
        CUDA_CHECK(cudaEventRecord(ready_[gather_buffer(u)], c.stream()));
    }
    // Makes the compute stream wait for unit u's gather and binds its groups.
    void use(int u) {
        const int b = gather_buffer(u);
        CUDA_CHECK(cudaStreamWaitEvent(model().stream(), ready_[b], 0));
        T* buffer = gathered_[size_t(b)].get();
        for (int g = 0; g < model().num_groups(u); ++g) {
            model().bind_params(u, g, buffer);
            buffer += model().group(u, g).padded;
        }
    }

  public:
    // Within a chunk (the whole model without a pipeline): its first unit gathered, each next one
    // prefetched. On a pipeline's last stage the head reads the tied embedding's copy: gathered
    // into the embedding's buffer before the head's forward, and bound until its backward.
    void before_unit_forward(int u) override {
        const StageUnits chunk = this->s_.chunk_of(u);
        if (u == chunk.first) gather(u);
        if (u == last() && tied() && !model().runs(0)) gather(0), use(0);
        if (u + 1 < chunk.end) gather(u + 1);  // prefetch: overlaps unit u
        use(u);
    }

    // Without a pipeline the head's parameters are still bound from its forward, which came just
    // before; in a pipeline other micro-batches' forwards came between, so a chunk's first
    // backward gathers its unit again. Then each unit prefetches the one below (the embedding's
    // backward reads no parameters).
    void before_unit_backward(int u) override {
        const StageUnits chunk = this->s_.chunk_of(u);
        const bool again = this->s_.pipelined() && u == chunk.end - 1 && u >= 1;
        if (again) gather(u);
        if (u - 1 >= std::max(1, chunk.first)) gather(u - 1);
        if (u >= 1 && (again || u != last())) use(u);
    }

  private:
    bool offload_ = false;
    std::vector<std::vector<DeviceBuffer<T>>> slices_;  // per unit, per group: this rank's slice of the parameters
    std::map<std::pair<int, int>, T*> host_;            // offloaded: (unit, group) -> the slice in pinned host memory
    std::vector<T*> host_slices_;                       // offloaded: every host slice, to free
    std::vector<DeviceBuffer<T>> gathered_;             // two rotating gather buffers, then the tied embedding's
    std::vector<DeviceBuffer<T>> staging_;              // offloaded: per gather buffer, its slice's device staging
    cudaEvent_t ready_[3] = {};
};

}  // namespace pv
