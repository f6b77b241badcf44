// Gradients all-reduced (DDP; parallel/policy.h GradientReduction::all_reduce; DESIGN.md §2, §4):
// every rank keeps the full gradients; they are summed over the data-parallel ranks (never
// averaged: the loss is already normalised by the global token count), so every rank then makes
// the same update.
//
// Buckets. A bucket is one unit's trainable group (frozen groups have no gradient and are never
// communicated). On the last micro-step of an optimizer step, as soon as unit u's backward is
// done, its all-reduce is issued on the communication stream behind an event fence (the comm
// stream waits for the compute stream's work so far, without a host stall) and the compute stream
// goes on with the backward of unit u − 1: communication overlaps computation. Earlier micro-steps
// only accumulate: one all-reduce per bucket per optimizer step. The compute stream waits for each
// bucket's collective right before that bucket's norm (Strategy::wait_reduced), the first thing to
// read it: the norms of the buckets reduced first run while the last ones are still on the wire.
// The norm covers every bucket, so the optimizer, and the next step's zeroing of a bucket, come
// after all of them: a bucket is never reused while its collective runs.
//
// The tied embedding. Its gradient is complete only after the embedding's backward, the last
// unit's (the head's backward wrote its part first), so its bucket is necessarily the last, and
// the largest. Splitting it (the head's part reduced early, the embedding's rows later) would add
// a collective of the same size per step; instead it is reduced as its own bucket the moment the
// embedding's backward ends, while the compute stream goes on with the norms of every other
// bucket: only its own norm, the scale and the update wait for it.
//
// Over a data-parallel group of one rank (single, pp's stages) there is nothing to reduce.
#pragma once

#include "parallel/data_parts.h"
#include "parallel/strategy.h"

namespace pv {

template <class T, class G>
class AllReduceGradients : public GradientPart<T, G> {
  public:
    using GradientPart<T, G>::GradientPart;

    void after_unit_backward(int u, bool last) override {
        Strategy<T, G>& s = this->s_;
        Comm* data = s.data_comm();
        if (!data || !last || s.model().trainable(u).padded == 0) return;  // nothing of the unit trains
        data->fence_from(s.model().stream());
        G* g = s.grads(u);
        data->all_reduce(g, g, size_t(s.model().trainable(u).padded));
        s.reduced_on_comm(u);
    }
};

}  // namespace pv
