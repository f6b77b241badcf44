// Model-state memory per rank, before a run: parameters, gradients, optimizer state and the
// communication buffers each strategy keeps, in bytes, from the same layouts the model allocates
// (model/parameters.h model_layouts: groups padded for the rank count, LoRA adapters, NF4 slots) and
// the buffers each strategy allocates (parallel/*.h). With Ψ the trainable groups' padded elements,
// Ψall every group's (the frozen base and NF4 groups too), t the storage type's bytes, M the fp32
// master's (4 for bf16, else 0), a the optimizer state's element (max(t, 4)):
//   single, ddp  parameters Ψall·t, gradients Ψ·t, optimizer Ψ·(M + 2a)
//   zero1        the optimizer state sharded: Ψ/N·(M + 2a)
//   zero2        gradients sharded too: Ψ/N·t, plus two rotating full-size buffers of the largest
//                unit's trainable group and a tied embedding's own
//   zero3        parameters sharded too: Ψall/N·t, plus gather buffers (two of the largest unit's
//                groups together, a tied embedding's own) in communication buffers
// With hybrid sharding (shard groups of K ranks, parallel/mesh.h) ZeRO's N is K: the
// groups are padded for K shards and every sharded figure is 1/K; the buffers are unchanged.
// The multi-rank tests check the measured peaks per category against these exactly (test/mpi/
// test_mpi_parallel.cu), and docs/lora-qlora.md's table is printed from it (bench/model_state_table.cpp).
// Activations and workspace are not model state; they depend on the batch (the planner's part).
// Host code only.
#pragma once

#include "model/config.h"
#include "model/parameters.h"

#include <string>

namespace pv {

struct ModelStateMemory {
    double parameters = 0, gradients = 0, optimizer_state = 0, comm_buffers = 0;
    double total() const { return parameters + gradients + optimizer_state + comm_buffers; }
};

// Per rank for `strategy` (single, ddp, zero1, zero2 or zero3) on `ranks` ranks, ZeRO sharding
// within groups of `shard_group` ranks (0: all of them; parallel/plan.h's --shard-group); throws
// std::invalid_argument for another strategy, or a rank count or shard group it cannot run on.
ModelStateMemory model_state_memory(const LlamaConfig& config, DType dtype, const GroupOptions& groups,
                                    const std::string& strategy, int ranks, int shard_group = 0);

}  // namespace pv
