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

// The rates of the search's Interconnect a flag can state, in GB/s (0 keeps the figure above): one
// row per flag, which trainer/options.cpp registers and interconnect_of applies. In this header,
// not in auto_layout.cpp, because the fuzz build links options.o without the search.
struct LinkRateFlag {
    const char* flag;
    double TrainOptions::*option;
    double Interconnect::*rate;  // bytes/s
    const char* help;
};
inline constexpr LinkRateFlag kLinkRateFlags[] = {
    {"--intra-node-gbs", &TrainOptions::intra_node_gbs, &Interconnect::intra_node,
     "GB/s a collective or a send reaches between two GPUs of a node (0: NVLink 4, 450 at 0.7 = 315)"},
    {"--inter-node-gbs", &TrainOptions::inter_node_gbs, &Interconnect::inter_node,
     "GB/s per GPU between nodes (0: --interconnect's figure)"},
    {"--pcie-gbs", &TrainOptions::pcie_gbs, &Interconnect::pcie,
     "GB/s between a GPU and its host, for offload's copies (0: PCIe 5.0 x16, 64 at 0.7)"},
    {"--host-memory-gbs", &TrainOptions::host_memory_gbs, &Interconnect::host_memory,
     "GB/s of a node's host memory for the offloaded update, shared by its ranks (0: 17, measured on a "
     "16-core H100 host)"},
};

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
