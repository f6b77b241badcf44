// LoRA adapters (Hu et al., 2021) as PEFT builds them: beside a frozen linear y = x·Wᵀ, a trainable
// low-rank update
//   y = x·Wᵀ + s·(drop(x)·Aᵀ)·Bᵀ,   A [r][in], B [out][r], s = alpha/r (rsLoRA: alpha/√r)
// with A ~ U(−1/√in, 1/√in) (PEFT's default, kaiming-uniform with a = √5), B = 0 (so training
// starts from the base model exactly) and dropout on the adapter's input only.
//
// Targets are Hugging Face module names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
// down_proj. polevault fuses [Wq; Wk; Wv] and [Wgate; Wup] (model/parameters.h), and its adapters
// are fused the same way: the targeted parts' A matrices stacked into one A [P·r][in], their B
// matrices stacked by output rows into one B [out_P][r] (out_P = the targeted parts' rows). The
// update of a fused linear is then one GEMM u = drop(x)·Aᵀ ([N][P·r], all parts at once, reading x
// once) and one small GEMM per part, y[:, part p] += s·u[:, p]·B_pᵀ, written straight into the
// part's columns of y. That is the block-diagonal B without its zeros: the same FLOPs as three
// separate adapters, one read of x instead of three, and no [out][P·r] matrix with (P−1)/P zeros.
// Each part keeps its own A and B rows, so the adapters are exactly PEFT's per-module ones (their
// TensorParts name them: model.layers.N.self_attn.q_proj.lora_A.weight, ...).
//
// Dropout draws one mask per fused input (q, k and v share it, where PEFT draws three): the stacked
// GEMM needs one input. It is keyed by (seed, dropout, A's tensor id, the token's global row and
// column, step) (kernels/philox.cuh), so it is the same at every world size and under every strategy.
// Host code only.
#pragma once

#include "model/config.h"

#include <string>
#include <vector>

namespace pv {

struct LoraConfig {
    int rank = 0;         // 0: no adapters
    double alpha = 8;     // PEFT's default lora_alpha
    bool rslora = false;  // scale alpha/√r instead of alpha/r
    double dropout = 0;   // on the adapter's input, in [0, 1)
    std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    bool enabled() const { return rank > 0; }
    double scale() const;
};

// The seven module names, in the order above.
const std::vector<std::string>& lora_module_names();

// Problems with `lora` (empty when it is usable): rank < 0, alpha not positive and finite, dropout
// outside [0, 1), an unknown or repeated target, no target.
std::vector<std::string> validate(const LoraConfig& lora);

// "q_proj,v_proj" -> targets, checked: throws std::invalid_argument naming an unknown module and
// listing the known ones.
std::vector<std::string> parse_lora_targets(const std::string& comma_separated);

// The block's four linears, in forward order, with the parts (HF modules) each fuses.
enum LoraLinear { kLoraQkv, kLoraO, kLoraGateUp, kLoraDown, kLoraLinears };

// The targeted parts of one linear: output rows [out_begin, out_begin + rows) of the base weight,
// and its HF module ("self_attn.q_proj"). Part p's A is rows [p·r, (p+1)·r) of the stacked A, its B
// rows [b_begin, b_begin + rows) of the stacked B.
struct LoraPart {
    std::string module;  // "self_attn.q_proj"
    int out_begin = 0, rows = 0;
    int b_begin = 0;
};
struct LoraLinearShape {
    int in = 0, out = 0;          // the base weight's shape [out][in]
    std::vector<LoraPart> parts;  // targeted parts only; empty: no adapter on this linear
    int a_rows(int rank) const { return int(parts.size()) * rank; }
    int b_rows() const { return parts.empty() ? 0 : parts.back().b_begin + parts.back().rows; }
};

// The adapter shapes of a block of `config` under `lora` (all empty when LoRA is off).
std::vector<LoraLinearShape> lora_linears(const LlamaConfig& config, const LoraConfig& lora);

// polevault's names of a block's adapter tensors: "lora_a_qkv", "lora_b_qkv", ... for linear k.
std::string lora_a_name(int linear);
std::string lora_b_name(int linear);

}  // namespace pv
