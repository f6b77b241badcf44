// The factory of strategies (parallel/plan.h plans them): `train` and the tests construct a
// strategy only through make_strategy.
#pragma once

#include "model/llama.h"
#include "parallel/ddp.h"
#include "parallel/mesh.h"
#include "parallel/plan.h"
#include "parallel/pp.h"
#include "parallel/single.h"
#include "parallel/zero1.h"
#include "parallel/zero2.h"
#include "parallel/zero3.h"

#include <memory>
#include <stdexcept>
#include <string>

namespace pv {

// The communicators a strategy may ask its mesh for (parallel/strategy.h): the data axes (the
// token count; DDP), the shard and replicate axes (ZeRO, hybrid sharding), the pipeline, and the
// gradient norm's shard and pipeline axes.
// Hybrid sharding's shard and replica groups get communicators of their own whatever their size
// (ZeRO issues its collectives on them even over one rank).
inline std::vector<MeshAxes> strategy_mesh_axes(const StrategyPlan& plan) {
    std::vector<MeshAxes> out = {kDataAxes, axes(MeshAxis::shard), axes(MeshAxis::replicate), axes(MeshAxis::pipeline),
                                 MeshAxis::shard | MeshAxis::pipeline};
    if (plan.info->shard_groups && plan.mesh.replicate > 1)
        out.insert(out.end(), {MeshAxes(MeshAxis::shard) | kOwnComm, MeshAxes(MeshAxis::replicate) | kOwnComm});
    return out;
}

// The strategy of `plan` over `model` (built with plan.placement) on `comm` (null for one rank),
// the world communicator: the mesh of plan.mesh is split off it (collective over `comm`), and a
// pipeline, if the plan has one, applied to the data-parallel policy of its stages.
template <class T, class G>
std::unique_ptr<Strategy<T, G>> make_strategy(const StrategyPlan& plan, Llama<T>& model, Comm* comm, uint64_t seed) {
    if (!plan.info->one_rank && !comm)
        throw std::invalid_argument(std::string(plan.info->name) + " needs a communicator of its ranks");
    auto mesh = [&]() {
        return std::make_unique<Mesh>(comm, plan.mesh, strategy_mesh_axes(plan),
                                      plan.pipelined() && model.config().tie_embeddings);
    };
    std::unique_ptr<Strategy<T, G>> s;
    switch (plan.info->kind) {
        case StrategyKind::single: s = std::make_unique<Single<T, G>>(model); break;
        case StrategyKind::ddp:
        case StrategyKind::pp: s = std::make_unique<DDP<T, G>>(model, mesh()); break;  // pp: data axes of one
        case StrategyKind::zero1: s = std::make_unique<Zero1<T, G>>(model, mesh()); break;
        case StrategyKind::zero2: s = std::make_unique<Zero2<T, G>>(model, mesh()); break;
        case StrategyKind::zero3:
            s = std::make_unique<Zero3<T, G>>(model, mesh(), seed, plan.options.offload == Offload::params);
            break;
    }
    if (!s) throw std::logic_error("make_strategy: unknown strategy");
    std::unique_ptr<Pipeline<T>> pipeline;
    if (plan.pipelined())
        pipeline = std::make_unique<Pipeline<T>>(model, *s->mesh().comm(axes(MeshAxis::pipeline)), plan.schedule,
                                                 plan.stage_bounds);
    s->apply(plan.info->name, std::move(pipeline));
    return s;
}

}  // namespace pv
