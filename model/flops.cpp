// Training FLOPs per token and the dense bf16 peak of a GPU (model/flops.h). Plain host C++.
#include "model/flops.h"

#include <stdexcept>
#include <string>

namespace pv {

namespace {

// In double: N for a 70B model is exact (< 2^53), and the products never overflow an int.
double block_matmul_weights(const LlamaConfig& c) {
    const double h = c.hidden_size, q = c.q_width(), kv = c.kv_width(), f = c.ffn_size;
    return q * h         // Wq
           + 2 * kv * h  // Wk, Wv
           + h * q       // Wo
           + 3 * f * h;  // Wgate, Wup, Wdown
}

double lm_head_weights(const LlamaConfig& c) {
    return double(c.vocab_size) * c.hidden_size;
}  // also when tied: its GEMM runs anyway

}  // namespace

double matmul_parameter_count(const LlamaConfig& c) {
    validate_or_throw(c);
    return c.num_layers * block_matmul_weights(c) + lm_head_weights(c);
}

double unit_training_flops_per_token(const LlamaConfig& c, UnitKind kind, int seq_len) {
    validate_or_throw(c);
    if (seq_len < 1)
        throw std::invalid_argument("training_flops_per_token: seq_len = " + std::to_string(seq_len) +
                                    " must be positive: pass the training sequence length in tokens");
    switch (kind) {
        case UnitKind::embedding: return 0.0;
        case UnitKind::block:
            return 6.0 * block_matmul_weights(c) + 12.0 * c.num_heads * c.head_dim_resolved() * double(seq_len);
        case UnitKind::head: return 6.0 * lm_head_weights(c);
    }
    return 0.0;
}

double training_flops_per_token(const LlamaConfig& c, int seq_len) {
    return unit_training_flops_per_token(c, UnitKind::embedding, seq_len) +
           c.num_layers * unit_training_flops_per_token(c, UnitKind::block, seq_len) +
           unit_training_flops_per_token(c, UnitKind::head, seq_len);
}

double recompute_flops_per_token(const LlamaConfig& c, int seq_len, const ActivationCheckpointing& checkpointing) {
    // A block's forward is a third of its training FLOPs (2 of 6 per weight, 4 of 12 per score);
    // the recompute leaves out the down projection, 2·ffn·hidden.
    const double block =
        unit_training_flops_per_token(c, UnitKind::block, seq_len) / 3.0 - 2.0 * double(c.ffn_size) * c.hidden_size;
    int recomputed = 0;
    for (int i = 0; i < c.num_layers; ++i) recomputed += checkpointing.recomputes(i);
    return recomputed * block;
}

double dense_bf16_peak_flops(int cc_major, int cc_minor, int sm_count, int clock_khz) {
    if (sm_count <= 0 || clock_khz <= 0)
        throw std::invalid_argument("dense_bf16_peak_flops: sm_count = " + std::to_string(sm_count) +
                                    " and clock_khz = " + std::to_string(clock_khz) +
                                    " must both be positive: pass cudaDevAttrMultiProcessorCount and the "
                                    "tensor-core boost clock in kHz");
    // Dense bf16 FLOPs per clock per SM; the derivations from NVIDIA's published peaks are in flops.h.
    int per_sm_per_clock = 0;
    if (cc_major == 8 && cc_minor == 0)
        per_sm_per_clock = 2048;  // A100
    else if (cc_major == 8 && (cc_minor == 6 || cc_minor == 9))
        per_sm_per_clock = 1024;  // A10, A40, L4, L40S
    else if (cc_major == 9 && cc_minor == 0)
        per_sm_per_clock = 4096;  // H100
    return double(sm_count) * double(clock_khz) * 1e3 * per_sm_per_clock;
}

}  // namespace pv
