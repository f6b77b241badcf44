// Per-step communication per strategy (parallel/comm_cost.h).
#include "parallel/comm_cost.h"

#include "parallel/plan.h"

#include <stdexcept>

namespace pv {

StepWire step_wire(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                   int ranks, int accumulation, int shard_group) {
    if (strategy == "single") return {};
    if (strategy != "ddp" && strategy != "zero1" && strategy != "zero2" && strategy != "zero3")
        throw std::invalid_argument("step_wire_bytes: no communication model for strategy '" + strategy + "'");
    StrategyOptions options;
    options.name = strategy, options.shard_group = shard_group;
    check_strategy(options, ranks);
    const int k = shards_of(options, ranks);
    const auto layouts = model_layouts(config, dtype, k, groups);
    double psi = 0, psi_all = 0, first = 0, last = 0;
    for (size_t u = 0; u < layouts.size(); ++u) {
        double all = 0;
        for (const GroupLayout& g : layouts[u]) all += double(g.padded);
        psi += double(layouts[u].front().padded);
        psi_all += all;
        if (u == 0) first = all;
        if (u + 1 == layouts.size()) last = all;
    }
    const double n = ranks, t = double(dtype_size(dtype)), A = accumulation;
    const double count_and_loss = 8 + 8.0 * kLossAllReduceDoubles, norms = 8.0 * double(layouts.size());
    const bool hybrid = k != ranks;
    // The shard group's ring (the world's without groups) and what it carries.
    const double ring = (k - 1.0) / k, scalars = hybrid ? norms : count_and_loss + norms;
    double sharded = 0;
    if (strategy == "ddp" || strategy == "zero1")
        sharded = 2 * ring * (psi * t + scalars);
    else if (strategy == "zero2")
        sharded = 2 * ring * scalars + (A + 1) * ring * psi * t;
    else
        sharded = 2 * ring * scalars + A * ring * (2 * psi_all - first - last + psi) * t;
    if (!hybrid) return {sharded, 0, 0};
    const double replicas = n / k;
    return {2 * (n - 1) / n * count_and_loss, sharded, 2 * (replicas - 1) / replicas * psi / k * t};
}

double step_wire_bytes(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                       int ranks, int accumulation, int shard_group) {
    return step_wire(config, dtype, groups, strategy, ranks, accumulation, shard_group).total();
}

}  // namespace pv
