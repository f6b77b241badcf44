// ZeRO-1 (DESIGN.md §3-4): every rank holds the whole model and its gradients, but the optimizer
// state — fp32 master where it exists, m and v — only for its slice r of each trainable group (1/N
// of it). Frozen groups are neither reduced nor gathered: every rank has them and nobody updates them.
//
// After the last micro-step, each unit's summed gradient goes through a true reduce-scatter, in
// place: rank r's slice of the reduced gradient lands at its own offset in its gradient buffer
// (NCCL's in-place form, recvbuff = sendbuff + r·count), which is exactly where its optimizer
// reads it. Each rank updates its slice of the parameters; an in-place all-gather then writes
// every rank's new slice into every rank's parameters. Per step that moves (N−1)/N·Ψ elements
// twice, the same 2·(N−1)/N·Ψ as DDP's all-reduce, with 12Ψ/N bytes of optimizer state instead of
// 12Ψ (bf16).
//
// With the host NCCL the reduce-scatter sums the same terms in the same order as the all-reduce,
// and the update of an element does not depend on who makes it, so ZeRO-1 and DDP end
// bit-identical.
#pragma once

#include "parallel/strategy.h"

namespace pv {

template <class T, class G>
class Zero1 : public Strategy<T, G> {
  public:
    Zero1(Llama<T>& model, Comm& comm) : Strategy<T, G>(model, &comm) {}
    const char* name() const override { return "zero1"; }
    bool sharded_optimizer() const override { return true; }

    void finish_gradients() override {
        Comm& c = *this->comm_;
        c.fence_from(this->model_.stream());
        for (int u = this->model_.num_units() - 1; u >= 0; --u) {
            if (this->slice_len(u) == 0) continue;  // nothing of the unit trains
            G* g = this->grads(u);
            c.reduce_scatter(g, g + this->slice_begin(u), size_t(this->slice_len(u)));
        }
        c.fence_to(this->model_.stream());
    }

    void after_update() override {
        Comm& c = *this->comm_;
        c.fence_from(this->model_.stream());
        for (int u = 0; u < this->model_.num_units(); ++u) {
            if (this->slice_len(u) == 0) continue;
            T* p = this->model_.params(u);
            c.all_gather(p + this->slice_begin(u), p, size_t(this->slice_len(u)));
        }
        c.fence_to(this->model_.stream());
    }
};

}  // namespace pv
