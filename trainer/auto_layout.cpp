#include "trainer/auto_layout.h"

#include "parallel/plan.h"
#include "trainer/option_rules.h"

#include <stdexcept>

namespace pv {

namespace {

// The user said it: on the command line or in the run file (a checkpoint's value is the user's
// flag of the first run only where it differs from the default, which the callers test).
bool given(const OptionSources& sources, const char* key) {
    const OptionSource s = sources.of(key);
    return s == OptionSource::command_line || s == OptionSource::run_file;
}

}  // namespace

Interconnect interconnect_of(const TrainOptions& o, int ranks_per_node) {
    Interconnect link;
    link.gpus_per_node = o.gpus_per_node > 0 ? o.gpus_per_node : ranks_per_node > 0 ? ranks_per_node : 8;
    if (o.interconnect == "slow") link.inter_node = 12.5e9 * 0.7;  // 100 Gb/s Ethernet at 0.7
    apply_link_rate_flags(o, link);  // after --interconnect: a stated rate overrides it
    return link;
}

SearchRequest layout_search_request(const TrainOptions& o, const TrainOptions& flags, const OptionSources& sources,
                                    const PlanRequest& run, int ranks, const Interconnect& link, double budget,
                                    double host_budget) {
    SearchRequest r;
    r.run = run;
    r.world = ranks, r.batch = o.batch, r.budget = budget, r.host_budget = host_budget;
    r.link = link;
    r.tp = flags.tp > 1 || given(sources, "tp") ? flags.tp : 0;
    r.pipeline_stages = flags.pipeline_stages;
    r.micro_batch = flags.micro_batch;
    r.strategy = flags.parallel == "auto" ? "" : canonical_strategy_name(flags.parallel);
    // auto is searched as the default is: off, or the fewest blocks that fit.
    r.checkpointing_fixed = flags.checkpoint_activations != kCheckpointActivationsAuto &&
                            (flags.checkpoint_activations >= 0 || given(sources, "checkpoint_activations"));
    r.offload = flags.offload != "none" || given(sources, "offload") ? flags.offload : "";
    r.shard_group = flags.shard_group > 0 || given(sources, "shard_group") ? flags.shard_group : -1;
    r.sequence_parallel = flags.sequence_parallel ? 1 : -1;  // a flag: given on, else searched
    // Each layout as the run would take it, through every rule of the option table.
    r.refuses = [o, sources, ranks](const LayoutPrediction& p) -> std::string {
        TrainOptions t = o;
        apply_layout(t, p, sources);
        try {
            check_option_rules(t, ranks);
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "";
    };
    return r;
}

void apply_layout(TrainOptions& o, const LayoutPrediction& p, const OptionSources& sources) {
    o.parallel = p.strategy;
    o.tp = p.tp;
    o.sequence_parallel = p.options.sequence_parallel;
    o.pipeline_stages = p.pp > 1 && p.strategy != "pp" ? p.pp : 0;
    o.shard_group = p.options.shard_group;
    o.micro_batch = p.micro_batch;
    if (p.checkpointing.first_blocks > 0) {  // the search's fewest blocks: what auto resolves to
        o.checkpoint_activations = kCheckpointActivationsAuto;
        o.checkpoint_blocks = p.checkpointing.first_blocks;
    } else if (!p.checkpointing.enabled && o.checkpoint_activations == kCheckpointActivationsAuto) {
        o.checkpoint_blocks = 0;  // auto, and it fits without
    } else if (p.checkpointing.enabled != (o.checkpoint_activations >= 0)) {  // a given N (one block in N) stays
        o.checkpoint_activations = p.checkpointing.enabled ? 0 : -1;
    }
    o.offload = offload_name(p.options.offload);
    if (o.fp32_grad_accumulation && !strategy_info(p.strategy).policy.fp32_accumulation() &&
        !given(sources, "fp32_grad_accumulation"))
        o.fp32_grad_accumulation = false;  // a default (fine-tuning's), not the user's: the strategy reduces in bf16
}

}  // namespace pv
