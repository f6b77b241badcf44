// Pipeline stages for model parallelism (parallel/pp.h): the model's units cut into contiguous
// runs, one per rank, so that the slowest stage — which sets the pipeline's pace — is as fast as
// it can be.
//
// Each unit gets a cost: its training FLOPs per token (model/flops.h: a block's matmuls and
// attention, the head's lm_head GEMM, nothing for the embedding lookup), or with --balance params
// its parameter count (which balances memory instead: the embedding and the head are heavy by
// parameters, light or moderate by FLOPs). The cut minimises the largest stage cost over every
// partition into non-empty contiguous stages (dynamic programming over (stage, last unit),
// O(stages · units²)); among equal optima the earliest cut points win, so every rank computes
// the same stages.
#pragma once

#include "model/config.h"

#include <string>
#include <vector>

namespace pv {

enum class StageBalance { flops, params };
StageBalance parse_stage_balance(const std::string& name);  // "flops" | "params", else invalid_argument

// The cost of each of the model's units (embedding, blocks, head) under `by`.
std::vector<double> unit_costs(const LlamaConfig& config, int seq_len, StageBalance by);

// Boundaries b[0] = 0 < b[1] < ... < b[stages] = costs.size(): stage s is units [b[s], b[s+1]).
// Throws std::invalid_argument when there are fewer units than stages.
std::vector<int> balance_stages(const std::vector<double>& costs, int stages);

// Per unit, the stage that holds it, from the boundaries balance_stages returns.
std::vector<int> unit_stages(const std::vector<int>& bounds);

// The stage of the highest cost under those boundaries (the first of equals).
int slowest_stage(const std::vector<double>& costs, const std::vector<int>& bounds);

// The slowest stage's share of the total cost under those boundaries: the fraction of a
// micro-batch's time its stage takes (the performance model's pipelines, bench/).
double slowest_stage_share(const std::vector<double>& costs, const std::vector<int>& bounds);

}  // namespace pv
