// --parallel auto and `train plan --search`: the layout search (parallel/layout_search.h) asked
// for a run's options, and its choice written back into them. One request serves both, so the
// layout `train plan --search` ranks first is the one `train --parallel auto` runs.
//
// What the user gave stays fixed: a named --parallel, --tp, --pipeline-stages, --micro-batch,
// --checkpoint-activations (or --no-checkpoint-activations), --offload, --shard-group. Everything
// else is searched, and each layout must pass the trainer's own option rules (trainer/option_rules.h)
// as well as the parallel layer's. Host C++.
#pragma once

#include "parallel/layout_search.h"
#include "trainer/options.h"
#include "trainer/run_file.h"

namespace pv {

// The machines the search assumes: --gpus-per-node (0: `ranks_per_node`, the fewest ranks mpirun
// put on one node, or 8 for a plan), --intra-node-gbs, --inter-node-gbs, --pcie-gbs and
// --host-memory-gbs (0: Interconnect's figures; --interconnect slow: 100 Gb/s Ethernet between
// nodes, 12.5 GB/s at 0.7).
Interconnect interconnect_of(const TrainOptions& o, int ranks_per_node);

// The search for a run of `ranks`: `run` the plan of the resolved options `o` (the model, groups,
// sequence length, sample, schedule), `flags` and `sources` what the user gave (what stays fixed).
SearchRequest layout_search_request(const TrainOptions& o, const TrainOptions& flags, const OptionSources& sources,
                                    const PlanRequest& run, int ranks, const Interconnect& link, double budget,
                                    double host_budget);

// Writes a layout into the options: --parallel, --tp, --pipeline-stages, --shard-group,
// --micro-batch, --checkpoint-activations, --offload (fp32 gradient accumulation dropped where
// the strategy reduces in the storage type and the user did not ask for it).
void apply_layout(TrainOptions& o, const LayoutPrediction& p, const OptionSources& sources);

}  // namespace pv
