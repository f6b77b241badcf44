// How a model instance is laid out for a strategy: what the strategy decides (parallel/plan.h)
// and the model obeys without knowing why. Host code only.
#pragma once

#include <vector>

namespace pv {

// Gradients: none (inference), owned (one buffer per unit's trainable group, allocated here) or
// bound (the caller binds a buffer to a unit before its backward: ZeRO-2/3 keep only a few
// full-size gradient buffers alive and rotate them through the units). Parameters: owned
// (allocated and initialised here) or bound (ZeRO-3: each rank keeps a slice of every group,
// initialised with init_params, and binds a gathered copy of a unit's groups before using it).
enum class Gradients { none, owned, bound };
enum class Parameters { owned, bound };

// A run of units a model holds: [first, end) (end −1: to the last unit), with `slots` activation
// arenas per unit (micro-batches whose forward has run and backward has not). A pipeline gives each
// rank one contiguous stage, or with the interleaved schedule several (its chunks, in unit order,
// each with its own slots: parallel/schedule.h); the model then allocates parameters, gradients
// and activation arenas for those units only. A rank with the head of a model with tied embeddings
// also holds the embedding's parameters and gradients (the head multiplies by wte), but no arena
// for it.
struct StageUnits {
    int first = 0;
    int end = -1;
    int slots = 1;
};

// This rank's place in its tensor-parallel group (model/tensor_parallel.h): it holds slice `rank`
// of `size` of every block tensor.
// sequence: sequence parallelism (Megatron-LM, Korthikanti et al. 2022) — between the
// tensor-parallel regions the residual stream, the norms and the residual adds hold the rank's rows
// [rank·N/size, (rank + 1)·N/size) of the micro-batch's N, gathered before each column-parallel
// linear and reduce-scattered after each row-parallel one.
struct TensorParallel {
    int size = 1;
    int rank = 0;
    bool sequence = false;
    // The residual stream's rows on this rank, of a micro-batch's `rows`.
    long long stream_rows(long long rows) const { return sequence ? rows / size : rows; }
};

// How a strategy needs the model built (parallel/strategies.h decides it): groups splittable
// into `shards`, the units held and their activation slots, its tensor-parallel slice, and which
// buffers are bound from outside.
struct Placement {
    int shards = 1;
    TensorParallel tensor{};
    std::vector<StageUnits> chunks = std::vector<StageUnits>(1);  // the units held: every one by default
    Gradients gradients = Gradients::owned;
    Parameters parameters = Parameters::owned;
};

}  // namespace pv
