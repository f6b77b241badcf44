// A data-parallel strategy is three parts (DESIGN.md §2), which the registry's rows combine
// (parallel/plan.cpp): ddp, zero1, zero2 and zero3 differ only in which of each they take.
//
//   parameters  replicated — every rank holds every parameter (parallel/parameters_replicated.h;
//               with a sharded optimizer it all-gathers the updated slices after each step), or
//               sharded — each rank keeps its slice, gathered per unit just before the unit runs
//               (parallel/parameters_sharded.h: ZeRO-3);
//   gradients   all_reduce — per-unit buckets summed over the data-parallel ranks (parallel/
//               gradients_all_reduce.h: DDP), reduce_scatter — per unit on the last micro-step, in
//               place in full-size gradients (gradients_reduce_scatter.h: ZeRO-1), or rotating —
//               reduce-scattered every micro-step out of two rotating unit buffers into the
//               rank's slices (gradients_rotating.h: ZeRO-2);
//   optimizer   replicated (every rank the whole state) or sharded (its slice: ZeRO-1 and up).
//
// Beside each part, here: what it costs — model-state memory per rank and bytes on the wire per
// optimizer step — so the memory model (memory.h), the communication model (comm_cost.h) and
// the planner (planner.h) ask the parts instead of naming strategies. Host code only.
#pragma once

#include "model/parameters.h"

#include <vector>

namespace pv {

enum class ParameterPlacement { replicated, sharded };
enum class GradientReduction { all_reduce, reduce_scatter, rotating };
enum class OptimizerPlacement { replicated, sharded };

struct DataPolicy {
    ParameterPlacement parameters = ParameterPlacement::replicated;
    GradientReduction gradients = GradientReduction::all_reduce;
    OptimizerPlacement optimizer = OptimizerPlacement::replicated;
    bool sharded_optimizer() const { return optimizer == OptimizerPlacement::sharded; }
    bool sharded_parameters() const { return parameters == ParameterPlacement::sharded; }
    bool rotating_gradients() const { return gradients == GradientReduction::rotating; }
    // What the model must bind from outside (model/placement.h): rotating gradient buffers,
    // gathered parameters.
    bool binds_gradients() const { return rotating_gradients(); }
    bool binds_parameters() const { return sharded_parameters(); }
    // --fp32-grad-accumulation: the full-size gradients are reduced from float buffers; rotating
    // slices are in the storage type.
    bool fp32_accumulation() const { return !rotating_gradients(); }
    // Shards anything, so that --shard-group can group the shards (hybrid sharding).
    bool shards() const { return sharded_optimizer() || sharded_parameters() || rotating_gradients(); }
};

// The sizes the costs are written in, elements (model/parameters.h model_layouts, padded for the
// shards): Ψ the trainable groups', Ψall every group's (frozen, NF4 too); the largest unit that is
// not a tied embedding (its trainable group, and all its groups), the tied embedding's own (0 when
// untied), the first and last units' groups.
struct ModelSizes {
    double psi = 0, psi_all = 0;
    double largest_trainable = 0, largest_unit = 0;
    double embedding_trainable = 0, embedding_all = 0;
    double first_all = 0, last_all = 0;
};

// From a model's layouts (per unit, its groups; the trainable group first), with or without a tied embedding.
ModelSizes model_sizes(const std::vector<std::vector<GroupLayout>>& layouts, bool tied);

// Bytes per rank: `n` the shards, `t` the storage type's bytes, `state` the optimizer's bytes per
// element (fp32 master where there is one, m and v).
struct PartMemory {
    double parameters = 0, gradients = 0, optimizer_state = 0, comm_buffers = 0;
};
PartMemory parameter_memory(ParameterPlacement p, const ModelSizes& m, double n, double t);
PartMemory gradient_memory(GradientReduction g, const ModelSizes& m, double n, double t);
PartMemory optimizer_memory(OptimizerPlacement o, const ModelSizes& m, double n, double state);

// Bytes on the wire per optimizer step within a shard group (ring algorithms: `ring` = (k − 1)/k)
// with `accumulation` micro-steps; the parameters' depend on whether the optimizer is sharded
// (replicated parameters are then all-gathered after the update).
double parameter_wire(const DataPolicy& d, const ModelSizes& m, double ring, double t, double accumulation);
double gradient_wire(GradientReduction g, const ModelSizes& m, double ring, double t, double accumulation);

}  // namespace pv
