// Per-step communication per strategy (parallel/comm_cost.h).
#include "parallel/comm_cost.h"

#include <stdexcept>

namespace pv {

double step_wire_bytes(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                       int ranks, int accumulation) {
    if (strategy == "single") return 0;
    if (strategy != "ddp" && strategy != "zero1" && strategy != "zero2" && strategy != "zero3")
        throw std::invalid_argument("step_wire_bytes: no communication model for strategy '" + strategy + "'");
    const auto layouts = model_layouts(config, dtype, ranks, groups);
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
    const double scalars = 8 + 8 + 8.0 * double(layouts.size()), ring = (n - 1) / n;
    if (strategy == "ddp" || strategy == "zero1") return 2 * ring * (psi * t + scalars);
    if (strategy == "zero2") return 2 * ring * scalars + (A + 1) * ring * psi * t;
    return 2 * ring * scalars + A * ring * (2 * psi_all - first - last + psi) * t;
}

}  // namespace pv
