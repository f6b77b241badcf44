// Per-step communication per strategy (parallel/comm_cost.h).
#include "parallel/comm_cost.h"

#include "model/activations.h"
#include "model/tensor_parallel.h"
#include "parallel/plan.h"
#include "parallel/policy.h"

#include <stdexcept>

namespace pv {

StepWire step_wire(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                   int ranks, int accumulation, int shard_group) {
    const StrategyInfo& info = strategy_info(strategy);
    if (info.one_rank) return {};
    if (info.stages)
        throw std::invalid_argument("step_wire_bytes: no communication model for strategy '" + strategy +
                                    "' (a pipeline sends activations, not parameters)");
    StrategyOptions options;
    options.kind = info.kind, options.shard_group = shard_group;
    check_strategy(options, ranks);
    const int k = shards_of(options, ranks);
    const ModelSizes m = model_sizes(model_layouts(config, dtype, k, groups), config.tie_embeddings);
    const double n = ranks, t = double(dtype_size(dtype)), A = accumulation;
    const double count_and_loss = 8 + 8.0 * kLossAllReduceDoubles, norms = 8.0 * double(config.num_layers + 2);
    const bool hybrid = k != ranks;
    // The shard group's ring (the world's without groups) and what it carries: the parts' bytes,
    // the norms, and without groups the count and loss too.
    const double ring = (k - 1.0) / k, scalars = hybrid ? norms : count_and_loss + norms;
    const double sharded = 2 * ring * scalars + gradient_wire(info.policy.gradients, m, ring, t, A) +
                           parameter_wire(info.policy, m, ring, t, A);
    if (!hybrid) return {sharded, 0, 0};
    // Across the replicas: each rank's reduced gradient slice, all-reduced once per step.
    const double replicas = n / k;
    return {2 * (n - 1) / n * count_and_loss, sharded, 2 * (replicas - 1) / replicas * m.psi / k * t};
}

TensorWire tensor_parallel_wire(const LlamaConfig& config, DType dtype, const LoraConfig& lora, int tensor,
                                long long rows, int micro_steps, int blocks_held, int recomputed, int trained_qkv,
                                bool embedding, bool head, const TensorSequence& sequence, long long head_chunk) {
    if (tensor <= 1) return {};
    const double t = double(dtype_size(dtype)), ring = 2.0 * (tensor - 1) / tensor;
    const double activation = double(rows) * config.hidden_size;
    const double blocks = blocks_held, micro = micro_steps;
    TensorWire w;
    w.all_reduces = (long long)(micro * (4 * blocks + recomputed));
    double elements = micro * (4 * blocks + recomputed) * activation;
    const std::vector<LoraLinearShape> linears = lora_linears(config, lora);
    for (int k = 0; k < kLoraLinears; ++k) {
        const LoraLinearShape& s = linears[size_t(k)];
        if (s.parts.empty()) continue;
        const bool column = column_parallel(k);  // the whole matrix: A (column-parallel) or B
        w.all_reduces += (long long)(micro * blocks);
        elements += micro * blocks * (column ? double(s.a_rows(lora.rank)) * s.in : double(s.b_rows()) * lora.rank);
    }
    const double kv_rows = double(replicated_kv_rows(config, tensor));
    if (kv_rows > 0) {  // the replicated kv heads' weight gradient rows (and their adapter's B)
        w.all_reduces += (long long)(micro * trained_qkv);
        elements += micro * trained_qkv * kv_rows * config.hidden_size;
        if (adapter_kv_rows(config, lora) > 0) {
            w.all_reduces += (long long)(micro * blocks);
            elements += micro * blocks * kv_rows * lora.rank;
        }
    }
    const int vocab = int(embedding) + int(head);  // the embedding's rows, the head's input gradient
    w.all_reduces += (long long)(micro * vocab);
    elements += micro * vocab * activation;
    if (sequence.on) {  // the activations' all-reduces become reduce-scatters, plus the gathers
        const double summed = 4 * blocks + recomputed + vocab;
        const double gathered = 4 * blocks + 2 * recomputed + int(head) + int(embedding && sequence.embedding_trains);
        w.all_reduces -= (long long)(micro * summed);
        elements -= micro * summed * activation;
        w.reduce_scatters = (long long)(micro * summed);
        w.all_gathers = (long long)(micro * gathered);
        w.bytes = micro * (summed + gathered) * (tensor - 1) / tensor * activation * t;
        w.all_reduces += (long long)(micro * sequence.trained_norms);  // the norms' weight gradients
        elements += micro * sequence.trained_norms * config.hidden_size;
    }
    w.bytes += ring * elements * t;
    if (head) {  // the cross-entropy's partials, a chunk of rows at a time
        const int columns = tensor_parallel_shape(config, {tensor, 0}).vocab_size;  // rank 0's, the most
        w.all_gathers += micro_steps * head_chunks(rows, columns, dtype, head_chunk);
        w.bytes += micro * (tensor - 1) * double(rows) * 3 * (dtype == DType::fp64 ? 8 : 4);
    }
    return w;
}

double step_wire_bytes(const LlamaConfig& config, DType dtype, const GroupOptions& groups, const std::string& strategy,
                       int ranks, int accumulation, int shard_group) {
    return step_wire(config, dtype, groups, strategy, ranks, accumulation, shard_group).total();
}

}  // namespace pv
