// Ranks that agree on the run before its first step. mpirun starts one command per rank, and an
// MPMD line (`mpirun -np 1 train --lr 1e-3 : -np 1 train --lr 2e-3`), a wrapper script or files that
// differ between nodes can give the ranks different runs; data-parallel replicas then diverge in
// silence and rank 0's is saved. So each rank states what makes its run — the resolved options,
// the fingerprints of its training data and tokenizer, the model's config.json — and every rank
// compares every rank's statement before the first step. Host C++ only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

struct TrainOptions;

// One rank's statement of its run, as JSON text: {"options": {...}, "data": "hex",
// "tokenizer": "hex", "model": {...}}.
std::string run_statement(const TrainOptions& resolved, uint64_t data_fingerprint, uint64_t tokenizer_fingerprint,
                          const std::string& model_config_json);

// Empty when every statement is the same; otherwise what differs, each item by the ranks that hold
// each value ("--lr is 0.001 on rank 0, 0.002 on rank 1"), and the fix.
std::string rank_disagreement(const std::vector<std::string>& statements);

}  // namespace pv
