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
// loss all-reduce's kLossAllReduceDoubles (the loss, the per-step checks' terms, the stop votes) and one squared
// norm per unit (8 bytes each).
//
// Hybrid sharding (shard groups of K ranks, R = N/K replicas; parallel/mesh.h) counts
// three communicators apart. Ψ and Ψall are then padded for K shards.
//   world        the count and the loss all-reduce: 2·(N−1)/N·(8 + 8·kLossAllReduceDoubles)
//   shard group  the ZeRO formulas above with K for N, the scalars being the norms alone (8 per unit)
//   replicas     one all-reduce of each rank's slices per step: 2·(R−1)/R·Ψ/K·t
// Host code only.
#pragma once

#include "model/config.h"
#include "model/lora.h"
#include "model/parameters.h"

#include <string>

namespace pv {

// The doubles of the all-reduce that sums a step's loss (trainer/trainer.h): the loss sum and the
// per-step checks' terms (trainer/step_checks.h StepSum, which must match it).
inline constexpr int kLossAllReduceDoubles = 7;

// Bytes one rank sends per optimizer step, by communicator: without shard groups everything is
// the world's.
struct StepWire {
    double world = 0, shard = 0, replica = 0;
    double total() const { return world + shard + replica; }
};

// Bytes one rank sends per optimizer step under `strategy` (single, ddp, zero1, zero2, zero3) on
// `ranks` ranks with `accumulation` micro-steps, ZeRO sharding within groups of `shard_group`
// ranks (0: all of them). Throws std::invalid_argument for another strategy or a shard group that
// cannot run (parallel/plan.h check_strategy).
StepWire step_wire(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                   int ranks, int accumulation, int shard_group = 0);
// Their total.
double step_wire_bytes(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                       int ranks, int accumulation, int shard_group = 0);

// Tensor parallelism's all-reduces (--tp T; model/llama.h's seam, parallel/tensor_parallel.h) over
// one rank's tensor-parallel group in `micro_steps` micro-batches of `rows` tokens through the
// `blocks` blocks its stage holds (all of them without a pipeline), `recomputed` of which the
// backward recomputes (activation checkpointing). Per block and micro-batch:
// two of rows·hidden elements in the forward (after W_o and W_down) and two in the backward (the
// input gradients of W_qkv and W_gate_up), one more when the block is recomputed (after W_o: the
// recompute skips the down projection); with LoRA, one per adapted linear of the adapter matrix
// every rank holds whole (a column-parallel base's A, P·r × hidden; a row-parallel one's B,
// hidden × r). When T replicates the kv heads (model/tensor_parallel.h), one more per block and
// micro-batch of the whole model's kv rows (replicated_kv_rows) × hidden for each of the
// `trained_qkv` blocks whose W_qkv trains, and × r for W_qkv's adapter when it adapts k or v.
// The vocabulary-parallel embedding and head (model/tensor_parallel.h), when this rank's stage
// holds them: one all-reduce of rows·hidden after the embedding's lookup; the head's input gradient
// one more, and all-gathers of each rank's cross-entropy partials (3 accumulator values a row:
// 8 bytes each in fp64, 4 otherwise): one per chunk of the head's logits, as a training step's
// backward computes the loss a chunk of rows at a time (model/activations.h head_chunks;
// `head_chunk`: the rows of a chunk as ModelOptions::head_chunk_rows requests them, 0 the default). Bytes by the ring: 2·(T−1)/T of an all-reduce, (T−1)× an
// all-gather's send. Zero for T = 1.
//
// Sequence parallelism (`sequence.on`, --sequence-parallel; model/llama.h sum_rows, whole_rows):
// each of those all-reduces of rows·hidden becomes a reduce-scatter (this rank's rows/T of the
// sum), and before each column-parallel linear in the forward (h1, h2: 2 per block, 2 more when
// recomputed) and each row-parallel linear's backward (their output gradients: 2 per block) the
// rows are all-gathered — as many bytes each as a reduce-scatter, (T−1)/T of rows·hidden, so a
// block moves what the all-reduces moved. The head all-gathers its normed input in the forward,
// the embedding its output gradient in the backward when it trains (`sequence.embedding_trains`),
// and each RMSNorm weight that trains (`sequence.trained_norms` of those held: two per block, the
// head's one) is all-reduced once per micro-batch, hidden elements: its gradient from this rank's
// rows is a share.
struct TensorWire {
    long long all_reduces = 0;
    long long all_gathers = 0;
    long long reduce_scatters = 0;
    double bytes = 0;
};
struct TensorSequence {
    bool on = false;
    int trained_norms = 0;
    bool embedding_trains = false;
};
TensorWire tensor_parallel_wire(const LlamaConfig& config, DType dtype, const LoraConfig& lora, int tensor,
                                long long rows, int micro_steps, int blocks, int recomputed, int trained_qkv,
                                bool embedding, bool head, const TensorSequence& sequence = {},
                                long long head_chunk = 0);

}  // namespace pv
