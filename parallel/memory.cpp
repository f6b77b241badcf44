// Model-state memory per rank (parallel/memory.h).
#include "parallel/memory.h"

#include "parallel/plan.h"
#include "parallel/policy.h"

#include <algorithm>
#include <stdexcept>

namespace pv {

ModelStateMemory model_state_memory(const LlamaConfig& config, DType dtype, const GroupOptions& groups,
                                    const std::string& strategy, int ranks, int shard_group) {
    const StrategyInfo& info = strategy_info(strategy);
    StrategyOptions options;
    options.kind = info.kind, options.shard_group = shard_group;
    if (info.stages)
        throw std::invalid_argument("model_state_memory: " + strategy +
                                    " holds a stage's units per rank: ask the planner (parallel/planner.h)");
    check_strategy(options, ranks);  // a rank count or shard group it cannot run on
    const int shards = shards_of(options, ranks);
    const ModelSizes m = model_sizes(model_layouts(config, dtype, shards, groups), config.tie_embeddings);
    const double t = double(dtype_size(dtype)), n = shards;
    const double state = (dtype == DType::bf16 ? 4 : 0) + 2 * std::max(t, 4.0);  // fp32 master, m and v
    ModelStateMemory out;
    for (const PartMemory& p : {parameter_memory(info.policy.parameters, m, n, t),
                                gradient_memory(info.policy.gradients, m, n, t),
                                optimizer_memory(info.policy.optimizer, m, n, state)}) {
        out.parameters += p.parameters, out.gradients += p.gradients;
        out.optimizer_state += p.optimizer_state, out.comm_buffers += p.comm_buffers;
    }
    return out;
}

}  // namespace pv
