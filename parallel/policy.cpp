// What each part of a data-parallel strategy costs (see policy.h).
#include "parallel/policy.h"

#include <algorithm>

namespace pv {

ModelSizes model_sizes(const std::vector<std::vector<GroupLayout>>& layouts, bool tied) {
    ModelSizes m;
    for (size_t u = 0; u < layouts.size(); ++u) {
        double all = 0;
        for (const GroupLayout& g : layouts[u]) all += double(g.padded);
        const double trainable = double(layouts[u].front().padded);
        m.psi += trainable, m.psi_all += all;
        if (u > 0 || !tied) {  // a tied embedding has buffers of its own
            m.largest_trainable = std::max(m.largest_trainable, trainable);
            m.largest_unit = std::max(m.largest_unit, all);
        } else {
            m.embedding_trainable = trainable, m.embedding_all = all;
        }
        if (u == 0) m.first_all = all;
        if (u + 1 == layouts.size()) m.last_all = all;
    }
    return m;
}

// parameters_replicated.h: every parameter. parameters_sharded.h: the slice of every group, and
// the gather buffers — two of the largest unit's groups together, used by units in turn, and a
// tied embedding's own (zero3_gather_buffers in plan.h).
PartMemory parameter_memory(ParameterPlacement p, const ModelSizes& m, double n, double t) {
    PartMemory out;
    if (p == ParameterPlacement::replicated) {
        out.parameters = m.psi_all * t;
    } else {
        out.parameters = m.psi_all / n * t;
        out.comm_buffers = (2 * m.largest_unit + m.embedding_all) * t;
    }
    return out;
}

// gradients_all_reduce.h, gradients_reduce_scatter.h: full-size gradients. gradients_rotating.h:
// the rank's slices, two rotating buffers of the largest trainable group and a tied embedding's own.
PartMemory gradient_memory(GradientReduction g, const ModelSizes& m, double n, double t) {
    PartMemory out;
    out.gradients = g == GradientReduction::rotating
                        ? m.psi / n * t + (2 * m.largest_trainable + m.embedding_trainable) * t
                        : m.psi * t;
    return out;
}

PartMemory optimizer_memory(OptimizerPlacement o, const ModelSizes& m, double n, double state) {
    PartMemory out;
    out.optimizer_state = (o == OptimizerPlacement::sharded ? m.psi / n : m.psi) * state;
    return out;
}

// Replicated parameters move only after a sharded update: one all-gather of the trainable slices.
// Sharded ones are gathered for every micro-step's forward (every group), and again for its
// backward but for the embedding (whose backward reads none) and the head (still bound from its
// forward).
double parameter_wire(const DataPolicy& d, const ModelSizes& m, double ring, double t, double accumulation) {
    if (d.parameters == ParameterPlacement::sharded)
        return accumulation * ring * (2 * m.psi_all - m.first_all - m.last_all) * t;
    return d.sharded_optimizer() ? ring * m.psi * t : 0;
}

// An all-reduce moves 2(k − 1)/k of its data, once per step; a reduce-scatter (k − 1)/k, once per
// step in place or every micro-step out of the rotating buffers.
double gradient_wire(GradientReduction g, const ModelSizes& m, double ring, double t, double accumulation) {
    switch (g) {
        case GradientReduction::all_reduce: return 2 * ring * m.psi * t;
        case GradientReduction::reduce_scatter: return ring * m.psi * t;
        case GradientReduction::rotating: return accumulation * ring * m.psi * t;
    }
    return 0;
}

}  // namespace pv
