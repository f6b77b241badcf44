// The factory of strategies (parallel/plan.h plans them): `train` and the tests construct a
// strategy only through make_strategy.
#pragma once

#include "model/llama.h"
#include "parallel/gradients_all_reduce.h"
#include "parallel/gradients_reduce_scatter.h"
#include "parallel/gradients_rotating.h"
#include "parallel/mesh.h"
#include "parallel/parameters_replicated.h"
#include "parallel/parameters_sharded.h"
#include "parallel/plan.h"
#include "parallel/pp.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel.h"

#include <memory>
#include <stdexcept>
#include <string>

namespace pv {

// The communicators a strategy may ask its mesh for (parallel/strategy.h): the data axes (the
// token count; DDP), the shard and replicate axes (ZeRO, hybrid sharding), the pipeline, the
// tensor axis (the model's tensor-parallel sums), and the gradient norm's shard, pipeline and
// tensor axes.
// Hybrid sharding's shard and replica groups get communicators of their own whatever their size
// (ZeRO issues its collectives on them even over one rank).
inline std::vector<MeshAxes> strategy_mesh_axes(const StrategyPlan& plan) {
    std::vector<MeshAxes> out = {kDataAxes,
                                 axes(MeshAxis::shard),
                                 axes(MeshAxis::replicate),
                                 axes(MeshAxis::pipeline),
                                 MeshAxis::shard | MeshAxis::pipeline,
                                 axes(MeshAxis::tensor),
                                 MeshAxis::shard | MeshAxis::tensor,
                                 MeshAxis::shard | MeshAxis::pipeline | MeshAxis::tensor};
    if (plan.info->policy.shards() && plan.mesh.replicate > 1)
        out.insert(out.end(), {MeshAxes(MeshAxis::shard) | kOwnComm, MeshAxes(MeshAxis::replicate) | kOwnComm});
    return out;
}

// The strategy of `plan` over `model` (built with plan.placement) on `comm` (null for one rank),
// the world communicator: the mesh of plan.mesh split off it (collective over `comm`), the parts
// its registry row names (parallel/policy.h), and a pipeline, if the plan has one, applied to it.
template <class T, class G>
std::unique_ptr<Strategy<T, G>> make_strategy(const StrategyPlan& plan, Llama<T>& model, Comm* comm, uint64_t seed) {
    if (!plan.info->one_rank && !comm)
        throw std::invalid_argument(std::string(plan.info->name) + " needs a communicator of its ranks");
    const DataPolicy& policy = plan.info->policy;
    auto mesh = plan.info->one_rank
                    ? std::make_unique<Mesh>(nullptr, MeshShape{}, std::vector<MeshAxes>{})
                    : std::make_unique<Mesh>(comm, plan.mesh, strategy_mesh_axes(plan),
                                             plan.pipelined() && model.config().tie_embeddings);
    auto s = std::make_unique<Strategy<T, G>>(model, std::move(mesh), policy);
    std::unique_ptr<GradientPart<T, G>> gradients;
    switch (policy.gradients) {
        case GradientReduction::all_reduce: gradients = std::make_unique<AllReduceGradients<T, G>>(*s); break;
        case GradientReduction::reduce_scatter: gradients = std::make_unique<ReduceScatterGradients<T, G>>(*s); break;
        case GradientReduction::rotating: gradients = std::make_unique<RotatingGradients<T, G>>(*s); break;
    }
    std::unique_ptr<ParameterPart<T, G>> parameters;
    if (policy.sharded_parameters())
        parameters = std::make_unique<ShardedParameters<T, G>>(*s, seed, plan.options.offload == Offload::params);
    else
        parameters = std::make_unique<ReplicatedParameters<T, G>>(*s, policy.sharded_optimizer());
    std::unique_ptr<Pipeline<T>> pipeline;
    if (plan.pipelined())
        pipeline = std::make_unique<Pipeline<T>>(model, *s->mesh().comm(axes(MeshAxis::pipeline)), plan.schedule,
                                                 plan.stage_bounds);
    s->apply(plan.info->name, std::move(gradients), std::move(parameters), std::move(pipeline));
    if (Comm* t = s->tensor_comm()) {
        model.bind_tensor_reduce(tensor_group_sum<T>(*t, model.stream()));
        model.bind_tensor_gather(tensor_group_gather<acc_t<T>>(*t, model.stream()));
        if (plan.placement.tensor.sequence)
            model.bind_tensor_sequence(tensor_group_gather<T>(*t, model.stream()),
                                       tensor_group_reduce_scatter<T>(*t, model.stream()));
    }
    return s;
}

}  // namespace pv
