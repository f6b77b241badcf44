// Model-state memory per rank (parallel/memory.h).
#include "parallel/memory.h"

#include "parallel/plan.h"

#include <algorithm>
#include <stdexcept>

namespace pv {

ModelStateMemory model_state_memory(const LlamaConfig& config, DType dtype, const GroupOptions& groups,
                                    const std::string& strategy, int ranks, int shard_group) {
    const bool single = strategy == "single", ddp = strategy == "ddp", z1 = strategy == "zero1",
               z2 = strategy == "zero2", z3 = strategy == "zero3";
    if (!(single || ddp || z1 || z2 || z3))
        throw std::invalid_argument("model_state_memory: strategy '" + strategy +
                                    "' is not one of single, ddp, zero1, zero2, zero3");
    if (ranks < 1 || (single && ranks != 1))
        throw std::invalid_argument("model_state_memory: " + strategy + " on " + std::to_string(ranks) + " ranks");
    StrategyOptions options;
    options.name = strategy, options.shard_group = shard_group;
    check_strategy(options, ranks);  // a shard group that cannot tile the ranks
    const int shards = shards_of(options, ranks);
    const auto layouts = model_layouts(config, dtype, shards, groups);
    const double t = double(dtype_size(dtype)), n = shards;
    const double master = dtype == DType::bf16 ? 4 : 0, a = std::max(t, 4.0);
    const bool tied = config.tie_embeddings;
    double psi = 0, psi_all = 0, largest_trainable = 0, largest_unit = 0;
    for (size_t u = 0; u < layouts.size(); ++u) {
        double all = 0;
        for (const GroupLayout& g : layouts[u]) all += double(g.padded);
        const double trainable = double(layouts[u].front().padded);
        psi += trainable, psi_all += all;
        if (u > 0 || !tied) {  // a tied embedding has buffers of its own
            largest_trainable = std::max(largest_trainable, trainable);
            largest_unit = std::max(largest_unit, all);
        }
    }
    double embedding_trainable = double(layouts.front().front().padded), embedding_all = 0;
    for (const GroupLayout& g : layouts.front()) embedding_all += double(g.padded);
    if (!tied) embedding_trainable = embedding_all = 0;
    ModelStateMemory m;
    m.parameters = (z3 ? psi_all / n : psi_all) * t;
    m.gradients = z2 || z3 ? psi / n * t + (2 * largest_trainable + embedding_trainable) * t : psi * t;
    m.optimizer_state = (z1 || z2 || z3 ? psi / n : psi) * (master + 2 * a);
    m.comm_buffers = z3 ? (2 * largest_unit + embedding_all) * t : 0;
    return m;
}

}  // namespace pv
