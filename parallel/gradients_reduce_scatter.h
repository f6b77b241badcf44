// Gradients reduce-scattered once per step (ZeRO-1; parallel/policy.h GradientReduction::
// reduce_scatter; DESIGN.md §3-4): every rank keeps full-size gradients, summed over the
// micro-steps; on the last micro-step, as soon as unit u's backward is done, its gradient goes
// through a true reduce-scatter on the comm stream, in place: rank r's slice of the reduced
// gradient lands at its own offset in its gradient buffer (NCCL's in-place form, recvbuff =
// sendbuff + r·count), which is exactly where its sharded optimizer reads it. The backward of the
// units below runs meanwhile, as DDP's buckets do (the compute stream waits for unit u's
// reduce-scatter only at unit u's norm; the tied embedding's, necessarily last, as in
// gradients_all_reduce.h).
//
// With the host NCCL the reduce-scatter sums the same terms in the same order as the all-reduce,
// and the update of an element does not depend on who makes it, so ZeRO-1 and DDP end
// bit-identical.
//
// Hybrid sharding (--shard-group K: the mesh's shard axis of K, replicate axis of N/K; parallel/
// mesh.h): the reduce-scatter runs within the rank's group of K, and after it the group-reduced
// slice is all-reduced over the N/K ranks holding the same slice, in place, on the same stream:
// (K−1)/K·Ψ within the group and 2·(N/K−1)/(N/K)·Ψ/K across groups per step. Every group then
// holds the same reduced slice and makes the same update.
#pragma once

#include "parallel/data_parts.h"
#include "parallel/strategy.h"

namespace pv {

template <class T, class G>
class ReduceScatterGradients : public GradientPart<T, G> {
  public:
    using GradientPart<T, G>::GradientPart;

    void after_unit_backward(int u, bool last) override {
        Strategy<T, G>& s = this->s_;
        if (!last || s.slice_len(u) == 0) return;  // accumulating, or nothing of the unit trains
        Comm& c = *s.shard_comm();
        c.fence_from(s.model().stream());
        G* slice = s.grads(u) + s.slice_begin(u);
        c.reduce_scatter(s.grads(u), slice, size_t(s.slice_len(u)));
        if (Comm* replicas = s.replica_comm())  // on the same stream: after the reduce-scatter
            replicas->all_reduce(slice, slice, size_t(s.slice_len(u)));
        s.reduced_on_comm(u);
    }
};

}  // namespace pv
