// Activation arenas: the layouts every unit's slot and the recompute arena hold (model/activations.h).
#include "model/activations.h"

#include <algorithm>

namespace pv {

namespace {

size_t acc_size(DType t) { return t == DType::fp64 ? 8 : 4; }
size_t aligned(size_t at) { return (at + 255) / 256 * 256; }

}  // namespace

long long head_chunk_rows(long long rows, long long columns, DType dtype, long long requested) {
    if (rows <= 0 || columns <= 0) return 0;
    if (requested > 0) return std::min(requested, rows);
    const long long most = std::max<long long>(1, kHeadChunkBytes / (columns * (long long)dtype_size(dtype)));
    const long long chunks = (rows + most - 1) / most;
    return (rows + chunks - 1) / chunks;  // equal chunks: the last no longer than the others
}

long long head_chunks(long long rows, long long columns, DType dtype, long long requested) {
    const long long each = head_chunk_rows(rows, columns, dtype, requested);
    return each > 0 ? (rows + each - 1) / each : 0;
}

std::vector<ActivationBuffer> activation_layout(const LlamaConfig& c, UnitKind kind, int batch, int seq_len,
                                                DType dtype, const LoraConfig& lora, int sequence_shards) {
    const long long N = (long long)batch * seq_len, C = c.hidden_size;
    const long long R = N / sequence_shards;  // the residual stream's rows (model/placement.h)
    const size_t t = dtype_size(dtype), a = acc_size(dtype);
    switch (kind) {
        case UnitKind::embedding: return {{"out", R * C, t}};
        case UnitKind::block: {
            std::vector<ActivationBuffer> buffers = {{"out", R * C, t},
                                                     {"h1", N * C, t},
                                                     {"rstd1", R, a},
                                                     {"qkv", N * c.qkv_width(), t},
                                                     {"att", N * c.q_width(), t},
                                                     {"lse", (long long)batch * c.num_heads * seq_len, a},
                                                     {"x2", R * C, t},
                                                     {"h2", N * C, t},
                                                     {"rstd2", R, a},
                                                     {"gate_up", N * 2LL * c.ffn_size, t},
                                                     {"act", N * c.ffn_size, t}};
            const auto shapes = lora_linears(c, lora);
            for (int k = 0; k < kLoraLinears; ++k)  // an empty buffer for a linear without adapter
                buffers.push_back({"lora_u_" + lora_a_name(k).substr(7), N * shapes[size_t(k)].a_rows(lora.rank), t});
            return buffers;
        }
        case UnitKind::head:  // the logits are the workspace's, a chunk of rows at a time
            return {{"h", N * C, t},
                    {"rstd", R, a},
                    {"row_loss", N, a},
                    {"row_stats", N, 2 * a}};
    }
    return {};
}

std::vector<size_t> arena_offsets(const std::vector<ActivationBuffer>& buffers) {
    std::vector<size_t> offsets;
    size_t at = 0;
    for (const auto& b : buffers) offsets.push_back(aligned(at)), at = offsets.back() + b.bytes();
    return offsets;
}

size_t arena_bytes(const std::vector<ActivationBuffer>& buffers) {
    return buffers.empty() ? 0 : arena_offsets(buffers).back() + buffers.back().bytes();
}

std::vector<ActivationBuffer> slot_arena_layout(const LlamaConfig& c, int u, int batch, int seq_len, DType dtype,
                                                const LoraConfig& lora, const ActivationCheckpointing& checkpointing,
                                                int sequence_shards) {
    const UnitKind kind = u == 0 ? UnitKind::embedding : u <= c.num_layers ? UnitKind::block : UnitKind::head;
    std::vector<ActivationBuffer> layout = activation_layout(c, kind, batch, seq_len, dtype, lora, sequence_shards);
    if (kind == UnitKind::block && checkpointing.recomputes(u - 1)) layout.resize(1);  // "out", the first buffer
    return layout;
}

std::vector<ActivationBuffer> recompute_arena_layout(const LlamaConfig& c, int batch, int seq_len, DType dtype,
                                                     const LoraConfig& lora, int sequence_shards) {
    std::vector<ActivationBuffer> layout =
        activation_layout(c, UnitKind::block, batch, seq_len, dtype, lora, sequence_shards);
    layout[0].elements = 0;  // "out", kept in the block's own arena; the buffers keep their indices
    return layout;
}

ActivationArenas activation_arenas(const LlamaConfig& c, int batch, int seq_len, DType dtype, const LoraConfig& lora,
                                   const ActivationCheckpointing& checkpointing,
                                   const std::vector<StageUnits>& chunks, int sequence_shards) {
    const int units = c.num_layers + 2;
    ActivationArenas out;
    out.slot_bytes.assign(size_t(units), 0);
    out.slots.assign(size_t(units), 0);
    for (const StageUnits& stage : chunks)
    for (int u = stage.first; u < (stage.end < 0 ? units : stage.end); ++u) {
        out.slot_bytes[size_t(u)] = arena_bytes(slot_arena_layout(c, u, batch, seq_len, dtype, lora, checkpointing, sequence_shards));
        out.slots[size_t(u)] = stage.slots;
        if (u >= 1 && u <= c.num_layers && checkpointing.recomputes(u - 1))
            out.recompute_bytes = arena_bytes(recompute_arena_layout(c, batch, seq_len, dtype, lora, sequence_shards));
    }
    return out;
}

}  // namespace pv
