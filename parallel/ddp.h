// DDP (DESIGN.md §2, §4): every rank holds the whole model and the whole optimizer state; the
// gradients are summed over ranks (never averaged: the loss is already normalised by the global
// token count), so every rank then makes the same update.
//
// Buckets. A bucket is one unit's trainable group (frozen groups have no gradient and are never
// communicated). On the last micro-step of an optimizer step,
// as soon as unit u's backward is done, its all-reduce is issued on the communication stream
// behind an event fence (the comm stream waits for the compute stream's work so far, without a
// host stall) and the compute stream goes on with the backward of unit u − 1: communication
// overlaps computation. Earlier micro-steps only accumulate: one all-reduce per bucket per
// optimizer step. The compute stream waits for each bucket's collective right before that
// bucket's norm (Strategy::wait_reduced), the first thing to read it: the norms of the buckets
// reduced first run while the last ones are still on the wire. The norm covers every bucket, so
// the optimizer, and the next step's zeroing of a bucket, come after all of them: a bucket is
// never reused while its collective runs.
//
// The tied embedding. Its gradient is complete only after the embedding's backward, the last
// unit's (the head's backward wrote its part first), so its bucket is necessarily the last, and
// the largest. Splitting it (the head's part reduced early, the embedding's rows later) would add
// a collective of the same size per step; instead it is reduced as its own bucket the moment
// the embedding's backward ends, on the higher-priority comm stream, while the compute stream
// goes on with the norms of every other bucket: only its own norm, the scale and the update wait
// for it.
#pragma once

#include "parallel/strategy.h"

namespace pv {

template <class T, class G>
class DDP : public Strategy<T, G> {
  public:
    // Over the mesh's data axes (a group of one — pp's stages — reduces nothing).
    explicit DDP(Llama<T>& model, std::unique_ptr<Mesh> mesh) : Strategy<T, G>(model, std::move(mesh)) {}
    bool sharded_optimizer() const override { return false; }

  protected:
    void finish_reduction() override {}  // each bucket is waited for at its norm
    void after_unit_backward(int u, bool last) override {
        Comm* data = this->data_comm();
        if (!data || !last || this->model_.trainable(u).padded == 0) return;  // nothing of the unit trains
        Comm& c = *data;
        c.fence_from(this->model_.stream());
        G* g = this->grads(u);
        c.all_reduce(g, g, size_t(this->model_.trainable(u).padded));
        this->reduced_on_comm(u);
    }
};

}  // namespace pv
