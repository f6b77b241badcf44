// Activation arenas, host side (DESIGN.md §3): what each unit keeps for its backward, per
// micro-batch slot, and with activation checkpointing what a recomputing block keeps instead —
// the layouts the model (model/llama.cu) allocates and resolves its typed views from, and the
// memory planner sizes without a model. Host code only.
//
// Activation checkpointing (--checkpoint-activations): a recomputing block keeps only its output,
// the residual stream the next unit reads, in its slot's arena; its other activations live in one
// recompute arena shared by the model's recomputing blocks and by all slots (one backward runs at
// a time: a block's recompute and backward are one call, Llama::backward_unit). The block's
// forward fills it and the next block's forward overwrites it; its backward first fills it again
// by re-running the forward on the same input, parameters and dropout keys (everything but the
// down projection, whose product the backward does not read). With deterministic kernels the
// recomputed activations are bitwise the forward's, so the gradients are the plain model's.
// Memory per slot: the embedding's and the head's arenas, each kept block's arena, each
// recomputing block's output [N][C]; plus one block arena (without its output) for them all.
// Extra compute: one forward of each recomputing block, less its down projection.
#pragma once

#include "model/config.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "model/placement.h"

#include <cstddef>
#include <string>
#include <vector>

namespace pv {

// One buffer of an arena: name, element count and element size.
struct ActivationBuffer {
    std::string name;
    long long elements = 0;
    size_t element_bytes = 0;
    size_t bytes() const { return size_t(elements) * element_bytes; }
};

// The activations one unit keeps for its backward, for a micro-batch of batch x seq_len tokens in
// storage type `dtype` (statistics in its accumulator type), in the order of model/llama.h's typed
// views (the output first, for the embedding and a block); with LoRA a block also keeps each
// adapter's u = drop(x)·Aᵀ. The memory planner uses this too. sequence_shards > 1 (sequence
// parallelism, model/placement.h TensorParallel): the residual stream's buffers and the norms'
// statistics hold N / sequence_shards rows (out, rstd1, x2, rstd2; the head's rstd); the norms'
// outputs (h1, h2, the head's h) are kept gathered, N rows, for the weight gradients.
std::vector<ActivationBuffer> activation_layout(const LlamaConfig& c, UnitKind kind, int batch, int seq_len,
                                                DType dtype, const LoraConfig& lora = {}, int sequence_shards = 1);

// The head's logits are computed this many rows at a time (model/llama.h, the fused linear
// cross-entropy; the workspace's "logits" buffer holds one chunk, rows × columns of the dtype):
// `requested` when positive (at most rows), else the fewest equal chunks of at most
// kHeadChunkBytes — all the rows at once when they fit, e.g. Llama 2's 32000 columns at 4 × 2048 in
// bf16 (500 MiB); Llama 3's 128256 at 4 × 2048: 4 chunks of 2048 rows (501 MiB each, where the
// whole logits took 2.0 GiB in every activation slot).
inline constexpr long long kHeadChunkBytes = 512LL << 20;
long long head_chunk_rows(long long rows, long long columns, DType dtype, long long requested = 0);
// How many chunks of head_chunk_rows cover `rows`.
long long head_chunks(long long rows, long long columns, DType dtype, long long requested = 0);

// Bytes of one activation arena holding `buffers` (each buffer 256-byte aligned): what a unit's
// slot allocates in the activations category.
size_t arena_bytes(const std::vector<ActivationBuffer>& buffers);
// Each buffer's offset in such an arena (buffers back to back, each start 256-byte aligned).
std::vector<size_t> arena_offsets(const std::vector<ActivationBuffer>& buffers);

// Which blocks recompute (see the top of this file). keep_every = 0: every block; N >= 1: block i
// (0-based, counting every block of the model, whatever the stage) keeps its whole arena when
// i % N == N − 1 — one block in N, the last of each group of N, so with N dividing num_layers the
// last block, whose backward follows its forward at once, keeps its own (N = 1 keeps every block:
// no checkpointing). first_blocks >= 0 instead: blocks [0, first_blocks) recompute and the others
// keep theirs — what `--checkpoint-activations auto` chooses, the fewest blocks that make the plan
// fit (parallel/planner.h fewest_recomputing_blocks); any choice of which blocks saves the same
// memory on one rank, and the first ones are those a pipeline's first stage, which holds the most
// micro-batches, keeps longest.
struct ActivationCheckpointing {
    bool enabled = false;
    int keep_every = 0;
    int first_blocks = -1;
    bool recomputes(int block) const {
        if (!enabled) return false;
        if (first_blocks >= 0) return block < first_blocks;
        return !(keep_every > 0 && block % keep_every == keep_every - 1);
    }
};

// The arena of one slot of unit u (model_units order): activation_layout, or for a block that
// recomputes, its output alone.
std::vector<ActivationBuffer> slot_arena_layout(const LlamaConfig& c, int u, int batch, int seq_len, DType dtype,
                                                const LoraConfig& lora, const ActivationCheckpointing& checkpointing,
                                                int sequence_shards = 1);
// The recompute arena: a block's activation_layout without the output (the recompute writes none).
std::vector<ActivationBuffer> recompute_arena_layout(const LlamaConfig& c, int batch, int seq_len, DType dtype,
                                                     const LoraConfig& lora, int sequence_shards = 1);

// What a model allocates in the activations category, computed without a model (the memory
// planner's figure; the Llama constructor allocates exactly these): per unit, one slot's arena
// and the slots of the chunk holding it (0 and 0 for a unit outside the chunks held), and the
// recompute arena (0 when no block held recomputes). A pipeline's received inputs
// (parallel/pp.h) are not the model's.
struct ActivationArenas {
    std::vector<size_t> slot_bytes;  // per unit of the model
    std::vector<int> slots;          // per unit of the model
    size_t recompute_bytes = 0;
    size_t total() const {
        size_t sum = recompute_bytes;
        for (size_t u = 0; u < slot_bytes.size(); ++u) sum += slot_bytes[u] * size_t(slots[u]);
        return sum;
    }
};
ActivationArenas activation_arenas(const LlamaConfig& c, int batch, int seq_len, DType dtype, const LoraConfig& lora,
                                   const ActivationCheckpointing& checkpointing,
                                   const std::vector<StageUnits>& chunks = {StageUnits{}}, int sequence_shards = 1);
inline ActivationArenas activation_arenas(const LlamaConfig& c, int batch, int seq_len, DType dtype,
                                          const LoraConfig& lora, const ActivationCheckpointing& checkpointing,
                                          StageUnits stage, int sequence_shards = 1) {
    return activation_arenas(c, batch, seq_len, dtype, lora, checkpointing, std::vector<StageUnits>{stage},
                             sequence_shards);
}

}  // namespace pv
