// ZeRO-1 (DESIGN.md §3-4): every rank holds the whole model and its gradients, but the optimizer
// state — fp32 master where it exists, m and v — only for its slice r of each trainable group (1/N
// of it). Frozen groups are neither reduced nor gathered: every rank has them and nobody updates them.
//
// Overlap. On the last micro-step, as soon as unit u's backward is done, its summed gradient
// goes through a true reduce-scatter on the comm stream, in place: rank r's slice of the reduced
// gradient lands at its own offset in its gradient buffer (NCCL's in-place form, recvbuff =
// sendbuff + r·count), which is exactly where its optimizer reads it. The backward of the units
// below runs meanwhile, as DDP's buckets do (the compute stream waits for unit u's reduce-scatter
// only at unit u's norm; the tied embedding's, necessarily last, as in ddp.h). Each rank then
// updates its slice of the parameters, and an in-place all-gather per unit writes every rank's new
// slice into every rank's parameters — queued on the comm stream and left running: the next
// step's forward of unit u waits for unit u's all-gather alone (an event), so the gathers of the
// later units overlap the forward of the earlier ones. Whoever reads parameters outside the
// compute stream calls settle_parameters first (checkpoints do). Per step that moves (N−1)/N·Ψ
// elements twice, the same 2·(N−1)/N·Ψ as DDP's all-reduce, with 12Ψ/N bytes of optimizer state
// instead of 12Ψ (bf16).
//
// With the host NCCL the reduce-scatter sums the same terms in the same order as the all-reduce,
// and the update of an element does not depend on who makes it, so ZeRO-1 and DDP end
// bit-identical.
//
// Hybrid sharding (--shard-group K: the mesh's shard axis of K, replicate axis of N/K; parallel/mesh.h): the slices are 1/K, the reduce-
// scatter and the all-gather run within the rank's group of K, and between them the group-reduced
// slice is all-reduced over the N/K ranks holding the same slice (the replica communicator),
// in place: (K−1)/K·Ψ twice within the group and 2·(N/K−1)/(N/K)·Ψ/K across groups per step.
// Every group then holds the same reduced slice and makes the same update.
#pragma once

#include "parallel/strategy.h"

namespace pv {

template <class T, class G>
class Zero1 : public Strategy<T, G> {
  public:
    Zero1(Llama<T>& model, std::unique_ptr<Mesh> mesh) : Strategy<T, G>(model, std::move(mesh)) {}
    bool sharded_optimizer() const override { return true; }

    Zero1(const Zero1&) = delete;
    Zero1& operator=(const Zero1&) = delete;
    ~Zero1() override {
        for (cudaEvent_t e : gathered_) cudaEventDestroy(e);
    }

    void after_update() override {
        Comm& c = *this->shard_comm();
        c.fence_from(this->model_.stream());  // every unit's update
        for (int u = 0; u < this->model_.num_units(); ++u) {
            if (this->slice_len(u) == 0 || !this->model_.holds(u)) continue;  // nothing to train, or another stage's
            T* p = this->model_.params(u);
            c.all_gather(p + this->slice_begin(u), p, size_t(this->slice_len(u)));
            CUDA_CHECK(cudaEventRecord(gathered(u), c.stream()));
            gather_pending_[size_t(u)] = true;
        }
    }

    void settle_parameters() override {
        wait_polling(this->shard_comm()->stream(), this->comms());  // the gathers ran on it
        gather_pending_.assign(gather_pending_.size(), false);
    }

  protected:
    void finish_reduction() override {}  // each unit's reduce-scatter is waited for at its norm
    void before_unit_forward(int u) override {
        if (gather_pending_.empty() || !gather_pending_[size_t(u)]) return;
        CUDA_CHECK(cudaStreamWaitEvent(this->model_.stream(), gathered_[size_t(u)], 0));
        gather_pending_[size_t(u)] = false;
    }
    void after_unit_backward(int u, bool last) override {
        if (!last || this->slice_len(u) == 0) return;  // accumulating, or nothing of the unit trains
        Comm& c = *this->shard_comm();
        c.fence_from(this->model_.stream());
        G* slice = this->grads(u) + this->slice_begin(u);
        c.reduce_scatter(this->grads(u), slice, size_t(this->slice_len(u)));
        if (Comm* replicas = this->replica_comm())  // on the same stream: after the reduce-scatter
            replicas->all_reduce(slice, slice, size_t(this->slice_len(u)));
        this->reduced_on_comm(u);
    }

  private:
    cudaEvent_t gathered(int u) {
        if (gathered_.empty()) {
            gathered_.resize(size_t(this->model_.num_units()));
            for (cudaEvent_t& e : gathered_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            gather_pending_.assign(gathered_.size(), false);
        }
        return gathered_[size_t(u)];
    }
    std::vector<cudaEvent_t> gathered_;  // per unit: its parameters' all-gather done (created on first use)
    std::vector<bool> gather_pending_;   // recorded and not yet waited for
};

}  // namespace pv
