// The bytes each rank puts on the wire in one optimizer step, per strategy, from the model's
// padded groups: the figures the comm counters record (parallel/comm.h), as formulas the
// performance model can evaluate at any shape (test/mpi/test_mpi_parallel.cu checks them against
// the counters of real runs). Ring algorithms: an all-reduce of S bytes sends 2·(N−1)/N·S per rank,
// a reduce-scatter or all-gather (N−1)/N·S.
//   ddp, zero1   2·(N−1)/N·(Ψ·t + scalars)       (zero1: reduce-scatter + all-gather of Ψ)
//   zero2        2·(N−1)/N·scalars + (A + 1)·(N−1)/N·Ψ·t   (a reduce-scatter per micro-step)
//   zero3        2·(N−1)/N·scalars + A·(N−1)/N·(2·Ψall − Ψall_first − Ψall_last + Ψ)·t
// Ψ: trainable padded elements, Ψall: every group's, first/last: the embedding's and the head's
// (not gathered again for the backward), A: micro-steps per step, scalars: the token count, the
// loss and one squared norm per unit (8 bytes each). Host code only.
#pragma once

#include "model/config.h"
#include "model/parameters.h"

#include <string>

namespace pv {

// Bytes one rank sends per optimizer step under `strategy` (single, ddp, zero1, zero2, zero3) on
// `ranks` ranks with `accumulation` micro-steps. Throws std::invalid_argument for another strategy.
double step_wire_bytes(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                       int ranks, int accumulation);

}  // namespace pv
