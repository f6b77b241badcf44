// Model FLOPs per trained token and the GPU's dense bf16 peak: the two halves of model FLOPs
// utilisation (MFU = tokens/s · training_flops_per_token / (ranks · peak)).
//
// FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B; torchtitan's get_num_flop_per_token):
//   6·N + 12·L·H·d·T
// N counts the weights every token is multiplied by: per block Wq, Wk, Wv, Wo, Wgate, Wup, Wdown,
// plus lm_head [V×H] — also when it is tied to the embedding, because the head's GEMM is done
// whatever the weight is shared with. The embedding lookup (a gather, no multiplies) and the
// RMSNorm weights (elementwise) are left out. Each weight costs 2 FLOPs per token in the forward
// pass (a multiply and an add) and 4 in the backward (the input gradient and the weight
// gradient): 6·N. The attention scores QKᵀ and their application to V cost 2·2·T·d FLOPs per
// head per token forward, ×3 with the backward: 12·L·H·d·T, H the query heads, d head_dim, T the
// sequence length. It counts the whole T×T score matrix, as PaLM and torchtitan do, although a
// causal mask makes half of it unnecessary: our MFU then compares with theirs. Work outside
// matmuls (softmax, norms, RoPE, SwiGLU, the cross-entropy) and activation recomputation are
// not model FLOPs, so MFU is a fraction of what the hardware could do for this model.
//
// The peak is sm_count · clock · (dense bf16 tensor-core FLOPs per clock per SM). The per-SM
// figures are NVIDIA's published dense (no 2:4 sparsity) bf16 peaks divided by their SM counts and
// boost clocks:
//   8.0 A100         312 TFLOPS / (108 SMs · 1410 MHz) = 2049 → 2048 (A100 whitepaper, "NVIDIA
//                    A100 Tensor Core GPU Architecture", 2020: 256 FP16 FMA/clock per tensor core,
//                    4 per SM)
//   9.0 H100 SXM5    989.4 TFLOPS / (132 SMs · 1830 MHz) = 4096.0 (H100 whitepaper, "NVIDIA H100
//                    Tensor Core GPU Architecture", 2022: twice Ampere's rate per SM; H100 PCIe
//                    756 TFLOPS / (114 · 1620 MHz) = 4094)
//   8.6 A10, A40     A10 datasheet 125 TFLOPS / (72 · 1695 MHz) = 1024;
//                    A40 datasheet 149.7 TFLOPS / (84 · 1740 MHz) = 1024
//   8.9 L4, L40S     L4 datasheet 121 TFLOPS (242 with sparsity) / (58 · 2040 MHz) = 1023;
//                    L40S datasheet 362.05 TFLOPS / (142 · 2520 MHz) = 1012, exactly 1024 at
//                    2490 MHz (the L40's boost clock, which the datasheet figure evidently uses)
// (Robert Crovella derives the A100 and H100 rates the same way on the NVIDIA developer forum,
// "How to calculate the Tensor Core FP16 performance of H100?", 2023.)
// Other compute capabilities return 0 and the caller prints no MFU: 7.x has no bf16 tensor
// cores; Blackwell (10.0) has a published 2.25 PFLOPS dense bf16 for B200 but no published
// tensor-core clock, so its per-SM rate cannot be derived (a guess would make MFU look precise
// when it is not).
//
// Two caveats, both about what the caller passes in and knows:
// - clock_khz must be the clock the published peak assumes. cudaDevAttrClockRate reports the
//   maximum boost clock, which on Hopper is above the tensor-core boost clock NVIDIA's peaks use
//   (H100 SXM: 1980 vs 1830 MHz, a peak 8% too high and an MFU 8% too low; H100 PCIe: 1755 vs
//   1620 MHz). On Ampere and Ada the two agree.
// - The rate is the full one of the data-center parts. GeForce cards of the same compute
//   capability (RTX 30xx at 8.6, RTX 40xx at 8.9) and the L40 accumulate bf16 in fp32 at half
//   that rate (L40: 181.05 TFLOPS = 142 · 2490 MHz · 512), so on them the MFU shown is half the
//   true one. The compute capability alone cannot tell them apart.
// Host code only.
#pragma once

#include "model/activations.h"
#include "model/config.h"
#include "model/parameters.h"

namespace pv {

// N above: the matmul weights of every block and lm_head (counted even when tied), without the
// embedding lookup and the RMSNorm weights. Validates the config first (std::invalid_argument).
double matmul_parameter_count(const LlamaConfig& c);

// 6·N + 12·num_layers·num_heads·head_dim·seq_len: the sum of unit_training_flops_per_token over
// the model's units. Throws std::invalid_argument for an invalid config or seq_len < 1.
double training_flops_per_token(const LlamaConfig& c, int seq_len);

// One unit's share: a block 6·(its matmul weights) + 12·num_heads·head_dim·seq_len, the head
// 6·vocab·hidden, the embedding 0 (a gather). What model parallelism balances its stages by.
double unit_training_flops_per_token(const LlamaConfig& c, UnitKind kind, int seq_len);

// The matmul FLOPs per token activation checkpointing adds (model/activations.h): each recomputing
// block's forward, 2·(its matmul weights but Wdown) + 4·num_heads·head_dim·seq_len. Not model
// FLOPs: MFU leaves them out (the trainer prints them apart).
double recompute_flops_per_token(const LlamaConfig& c, int seq_len, const ActivationCheckpointing& checkpointing);

// The dense bf16 tensor-core peak in FLOP/s: sm_count · clock_khz·1e3 · the per-SM rate above,
// 0 for a compute capability without a derived rate. Throws std::invalid_argument when sm_count
// or clock_khz is not positive.
double dense_bf16_peak_flops(int cc_major, int cc_minor, int sm_count, int clock_khz);

}  // namespace pv
