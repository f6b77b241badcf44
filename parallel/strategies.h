// The factory of strategies (parallel/plan.h plans them): `train` and the tests construct a
// strategy only through make_strategy.
#pragma once

#include "model/llama.h"
#include "parallel/ddp.h"
#include "parallel/pp.h"
#include "parallel/plan.h"
#include "parallel/single.h"
#include "parallel/zero1.h"
#include "parallel/zero2.h"
#include "parallel/zero3.h"

#include <memory>
#include <stdexcept>
#include <string>

namespace pv {

// The strategy of `plan` over `model` (built with plan.placement) on `comm` (null for one rank),
// the world communicator: with shard groups smaller than the world (--shard-group), the strategy
// owns the shard and replica communicators split off it (collective over `comm`).
template <class T, class G>
std::unique_ptr<Strategy<T, G>> make_strategy(const StrategyPlan& plan, Llama<T>& model, Comm* comm, uint64_t seed) {
    if (!plan.info->one_rank && !comm)
        throw std::invalid_argument(std::string(plan.info->name) + " needs a communicator of its ranks");
    auto groups = [&]() -> std::unique_ptr<ShardGroups> {
        const int k = plan.placement.shards;
        if (!plan.info->shard_groups || k == comm->size()) return nullptr;
        return std::make_unique<ShardGroups>(*comm, k);
    };
    switch (plan.info->kind) {
        case StrategyKind::single: return std::make_unique<Single<T, G>>(model);
        case StrategyKind::ddp: return std::make_unique<DDP<T, G>>(model, *comm);
        case StrategyKind::zero1: return std::make_unique<Zero1<T, G>>(model, *comm, groups());
        case StrategyKind::zero2: return std::make_unique<Zero2<T, G>>(model, *comm, groups());
        case StrategyKind::zero3:
            return std::make_unique<Zero3<T, G>>(model, *comm, seed, groups(), plan.options.offload == Offload::params);
        case StrategyKind::pp:
            return std::make_unique<PipelineParallel<T, G>>(model, *comm, plan.schedule, plan.stage_bounds);
    }
    throw std::logic_error("make_strategy: unknown strategy");
}

}  // namespace pv
