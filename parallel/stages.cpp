// Balanced pipeline stages (parallel/stages.h). Plain host C++.
#include "parallel/stages.h"

#include "model/flops.h"
#include "model/parameters.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace pv {

StageBalance parse_stage_balance(const std::string& name) {
    if (name == "flops") return StageBalance::flops;
    if (name == "params") return StageBalance::params;
    throw std::invalid_argument("--balance '" + name + "': use flops (the default) or params");
}

std::vector<double> unit_costs(const LlamaConfig& config, int seq_len, StageBalance by) {
    std::vector<double> out;
    for (const UnitSpec& u : model_units(config)) {
        if (by == StageBalance::flops) {
            out.push_back(unit_training_flops_per_token(config, u.kind, seq_len));
        } else {
            double n = 0;
            for (const TensorSpec& t : u.tensors) n += double(t.numel());
            out.push_back(n);
        }
    }
    return out;
}

std::vector<int> balance_stages(const std::vector<double>& costs, int stages) {
    const int n = int(costs.size());
    if (stages < 1 || stages > n)
        throw std::invalid_argument("model parallelism over " + std::to_string(stages) +
                                    " ranks needs at least as many "
                                    "units, and the model has " +
                                    std::to_string(n) + " (the embedding, " + std::to_string(n - 2) +
                                    " blocks, the head): run on at most " + std::to_string(n) +
                                    " ranks, or use --parallel zero3");
    std::vector<double> prefix(size_t(n) + 1, 0.0);
    for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + costs[size_t(i)];
    const double inf = std::numeric_limits<double>::infinity();
    // best[s][i]: the smallest largest cost of units [0, i) in s stages; cut[s][i] where the last begins.
    std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(n) + 1, inf));
    std::vector<std::vector<int>> cut(size_t(stages) + 1, std::vector<int>(size_t(n) + 1, 0));
    best[0][0] = 0;
    for (int s = 1; s <= stages; ++s)
        for (int i = s; i <= n; ++i)
            for (int j = s - 1; j < i; ++j) {
                const double c = std::max(best[size_t(s) - 1][size_t(j)], prefix[size_t(i)] - prefix[size_t(j)]);
                if (c < best[size_t(s)][size_t(i)]) best[size_t(s)][size_t(i)] = c, cut[size_t(s)][size_t(i)] = j;
            }
    std::vector<int> bounds(size_t(stages) + 1);
    bounds[size_t(stages)] = n;
    for (int s = stages; s >= 1; --s) bounds[size_t(s) - 1] = cut[size_t(s)][size_t(bounds[size_t(s)])];
    return bounds;
}

std::vector<int> unit_stages(const std::vector<int>& bounds) {
    std::vector<int> out;
    for (size_t s = 0; s + 1 < bounds.size(); ++s)
        for (int u = bounds[s]; u < bounds[s + 1]; ++u) out.push_back(int(s));
    return out;
}

int slowest_stage(const std::vector<double>& costs, const std::vector<int>& bounds) {
    int slowest = 0;
    double most = -1;
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
        const double c = std::accumulate(costs.begin() + bounds[s], costs.begin() + bounds[s + 1], 0.0);
        if (c > most) most = c, slowest = int(s);
    }
    return slowest;
}

double slowest_stage_share(const std::vector<double>& costs, const std::vector<int>& bounds) {
    const int s = slowest_stage(costs, bounds);
    return std::accumulate(costs.begin() + bounds[size_t(s)], costs.begin() + bounds[size_t(s) + 1], 0.0) /
           std::accumulate(costs.begin(), costs.end(), 0.0);
}

}  // namespace pv
