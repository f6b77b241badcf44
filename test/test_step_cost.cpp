// The performance model's LoRA step (model/step_cost.h) against counts made by hand: the GEMM
// FLOPs of a step, the kernels that drop out when the base is frozen, and the optimizer's
// elements; the recompute of activation checkpointing; and the RTX 6000 Ada's figures against the
// peak model/flops.h derives for its SMs.
#include "model/step_cost.h"

#include "model/config.h"
#include "model/flops.h"
#include "test/hand_built_config.h"

#include <catch2/catch.hpp>

#include <string>

namespace step_cost_test {

struct Sums {
    double gemm_flops = 0;
    double adamw_launches = 0;
    bool weight_gradients = false, embedding_backward = false, norm_weight_gradients = false;
};

Sums sums(const pv::StepShape& s) {
    Sums out;
    for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now)) {
        if (k.kernel == "gemm") out.gemm_flops += k.flops * k.count;
        if (k.op.find("dW") != std::string::npos) out.weight_gradients = true;
        if (k.op.find("embedding backward") != std::string::npos) out.embedding_backward = true;
        if (k.kernel == "rmsnorm_dweight_kernel") out.norm_weight_gradients = true;
        if (k.op.find("AdamW") != std::string::npos || k.kernel.find("adamw") != std::string::npos)
            out.adamw_launches += k.count;
    }
    return out;
}

}  // namespace step_cost_test

using namespace step_cost_test;

// Per token, each base weight costs 2 FLOPs forward, 2 for its input gradient and, when it trains,
// 2 for its weight gradient; an adapter of rank r on a linear of `in` inputs and `out` outputs
// costs 2·r·(in + out) forward and 4·r·(in + out) backward (du, dB, dA, dx).
TEST_CASE("step cost: LoRA's GEMMs are the frozen base's forward and input gradients plus the adapters'",
          "[step_cost]") {
    const pv::LlamaConfig c = pv_test::hand_built(true);
    // The matmul weights: per block Wq 8×12, Wk 8×6, Wv 8×6, Wo 12×8, Wgate, Wup 8×12, Wdown 12×8;
    // the head 10×8.
    const double block = 96 + 48 + 48 + 96 + 96 + 96 + 96, head = 80, weights = 2 * block + head;
    pv::StepShape full;
    full.config = c, full.batch = 3, full.seq_len = 5, full.accumulation = 2, full.t = 2;
    const double tokens = 3.0 * 5 * 2;
    const Sums f = sums(full);
    CHECK(f.gemm_flops == Approx(6 * weights * tokens).epsilon(1e-12));
    CHECK(f.weight_gradients);
    CHECK(f.embedding_backward);
    CHECK(f.norm_weight_gradients);

    pv::StepShape lora = full;
    lora.lora.rank = 4;
    lora.lora.targets = {"q_proj", "v_proj", "down_proj"};
    // q: 8 in, 12 out; v: 8 in, 6 out; down: 12 in, 8 out.
    const double adapter_dims = (8 + 12) + (8 + 6) + (12 + 8);
    const Sums l = sums(lora);
    CHECK(l.gemm_flops == Approx(4 * weights * tokens + 6 * 4 * adapter_dims * 2 * tokens).epsilon(1e-12));
    CHECK_FALSE(l.weight_gradients);
    CHECK_FALSE(l.embedding_backward);
    CHECK_FALSE(l.norm_weight_gradients);
    // One AdamW launch per block, over its adapters alone: r·(in + out) per targeted linear.
    CHECK(l.adamw_launches == 2);
    // Each launch is over that block's 4·54 = 216 adapter elements (cost::adamw's bytes for them).
    const pv::KernelCost expected = pv::cost::adamw(4 * 54, 2, 2, 4, 6).front();
    for (const pv::KernelCost& k : pv::step_kernels(lora, pv::KernelSet::now))
        if (k.op.find("AdamW") != std::string::npos || k.kernel.find("adamw") != std::string::npos) {
            CHECK(k.read_bytes == expected.read_bytes);
            CHECK(k.written_bytes == expected.written_bytes);
        }
    // Every target: the seven linears, each with its widths.
    lora.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    const double all_dims = (8 + 12) + (8 + 6) + (8 + 6) + (12 + 8) + (8 + 12) + (8 + 12) + (12 + 8);
    CHECK(sums(lora).gemm_flops == Approx(4 * weights * tokens + 6 * 4 * all_dims * 2 * tokens).epsilon(1e-12));
    // LoRA is priced with today's kernels only.
    CHECK_THROWS_AS(pv::step_kernels(lora, pv::KernelSet::before), std::invalid_argument);
}

// Tensor parallelism over 2 ranks of the hand-built model (2 query heads, 1 kv head: each rank one
// query head and the kv head replicated): a rank's GEMMs are its slices' — per block Wq 6×8, Wk
// 6×8 and Wv 6×8 (the whole kv head), Wo 8×6, Wgate, Wup 6×8, Wdown 8×6 — and the head's 5 of
// the 10 token rows × 8 (the vocabulary-parallel head, its cross-entropy partials then merged);
// the replicated kv head's weight gradient share is zeroed, and its k and v rows added after the
// sum; LoRA's adapters are the slices' (q: 8 in, 6 out; v: 8 in, 6 out; down: 6 in, 8 out), each
// whole matrix's gradient share zeroed and added; the rank's model FLOPs are half the step's.
TEST_CASE("step cost: a tensor-parallel rank computes its slices, the head's too", "[step_cost][tensor_parallel]") {
    pv::StepShape one;
    one.config = pv_test::hand_built(true), one.batch = 3, one.seq_len = 5, one.accumulation = 2, one.t = 2;
    pv::StepShape two = one;
    two.tensor = 2;
    const double tokens = 3.0 * 5 * 2, slice = 7 * 48, head = 40;
    CHECK(sums(two).gemm_flops == Approx(6 * (2 * slice + head) * tokens).epsilon(1e-12));
    double zeroed = 0, kv_added = 0, update = 0, merges = 0, logits_read = 0;
    for (const pv::KernelCost& k : pv::step_kernels(two, pv::KernelSet::now)) {
        if (k.kernel == "cross_entropy_merge_kernel") merges += k.count;
        if (k.kernel == "cross_entropy_partial_kernel") logits_read += k.read_bytes * k.count;
        CHECK(k.kernel != "cross_entropy_forward_kernel");
        if (k.op == "replicated kv heads: weight gradient share zeroed") zeroed += k.written_bytes * k.count;
        if (k.op == "tensor parallelism: gradient share added") kv_added += k.written_bytes * k.count;
        if (k.kernel.find("adamw") != std::string::npos) update += k.count;
    }
    CHECK(zeroed == 2 * 2 * (2 * 6) * 8 * 2);  // per block and micro-batch the whole model's 12 kv rows × 8, bf16
    CHECK(kv_added == 2 * (6 * 8) * 2 * 2 * 2);  // its k and v rows (6 × 8 each), per block and micro-batch
    CHECK(update == 2 + 2);  // one AdamW per unit: the blocks, the embedding, the head (its final norm)
    CHECK(merges == 2);      // one per micro-batch
    CHECK(logits_read == 2 * (15 * 5 * 2 + 15 * 4));  // its 15 rows × 5 columns of bf16 logits and the targets
    const pv::StepPrediction p1 = pv::predict_step(one, pv::KernelSet::now), p2 = pv::predict_step(two, pv::KernelSet::now);
    CHECK(p2.model_flops == Approx(p1.model_flops / 2).epsilon(1e-12));

    two.lora.rank = 4;
    two.lora.targets = {"q_proj", "v_proj", "down_proj"};
    const double adapter_dims = (8 + 6) + (8 + 6) + (6 + 8);
    CHECK(sums(two).gemm_flops == Approx(4 * (2 * slice + head) * tokens + 6 * 4 * adapter_dims * 2 * tokens).epsilon(1e-12));
    // Each micro-batch and block: the whole A of q/v (2·4 × 8) and B of down (8 × 4) zeroed, bf16.
    double shares = 0;
    for (const pv::KernelCost& k : pv::step_kernels(two, pv::KernelSet::now))
        if (k.op == "tensor parallelism: adapter gradient share zeroed") shares += k.written_bytes * k.count;
    CHECK(shares == (2 * 4 * 8 + 8 * 4) * 2 * 2 * 2);
}

// Activation checkpointing: each recomputing block's forward again, less the down projection (of
// its adapter only u = x·Aᵀ, which the backward reads): per token 2 FLOPs per weight of Wq, Wk, Wv,
// Wo, Wgate and Wup, 2·r·(in + out) per other adapter. keep_every 2 over two blocks recomputes
// block 0 only.
TEST_CASE("step cost: activation checkpointing adds the recomputing blocks' forward but the down projection",
          "[step_cost]") {
    pv::StepShape plain;
    plain.config = pv_test::hand_built(true), plain.batch = 3, plain.seq_len = 5, plain.accumulation = 2;
    const double tokens = 3.0 * 5 * 2, recomputed_weights = 96 + 48 + 48 + 96 + 96 + 96;
    auto recompute_gemm_flops = [](const pv::StepShape& s) {
        double sum = 0;
        for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now))
            if (k.kernel == "gemm" && k.op.rfind("recompute: ", 0) == 0) sum += k.flops * k.count;
        return sum;
    };
    CHECK(recompute_gemm_flops(plain) == 0);
    pv::StepShape every = plain, half = plain;
    every.checkpointing = pv::ActivationCheckpointing{true, 0};
    half.checkpointing = pv::ActivationCheckpointing{true, 2};
    CHECK(recompute_gemm_flops(every) == Approx(2 * recomputed_weights * tokens * 2).epsilon(1e-12));
    CHECK(recompute_gemm_flops(half) == Approx(2 * recomputed_weights * tokens).epsilon(1e-12));
    CHECK(sums(every).gemm_flops - sums(plain).gemm_flops == Approx(recompute_gemm_flops(every)).epsilon(1e-12));
    CHECK(pv::predict_step(every, pv::KernelSet::now).seconds > pv::predict_step(plain, pv::KernelSet::now).seconds);
    // By phase: the recompute is in the backward; the forward and the update are unchanged.
    const pv::PhaseSeconds a = pv::predict_phases(plain, pv::KernelSet::now);
    const pv::PhaseSeconds b = pv::predict_phases(every, pv::KernelSet::now);
    CHECK(a.forward + a.backward + a.update ==
          Approx(pv::predict_step(plain, pv::KernelSet::now).seconds).epsilon(1e-12));
    CHECK(b.forward + b.backward + b.update ==
          Approx(pv::predict_step(every, pv::KernelSet::now).seconds).epsilon(1e-12));
    CHECK(b.forward == a.forward);
    CHECK(b.update == a.update);
    CHECK(b.backward > a.backward);
    CHECK(a.forward > 0);
    CHECK(a.update > 0);
    // Model FLOPs (MFU's numerator) leave the recompute out.
    CHECK(pv::predict_step(every, pv::KernelSet::now).model_flops ==
          pv::predict_step(plain, pv::KernelSet::now).model_flops);
    pv::StepShape lora = every;
    lora.lora.rank = 4;
    // q: 8 in, 12 out; v: 8 in, 6 out, both whole; down (12 in): its u = x·Aᵀ alone, 2·r·12.
    lora.lora.targets = {"q_proj", "v_proj", "down_proj"};
    CHECK(recompute_gemm_flops(lora) ==
          Approx((2 * recomputed_weights + 2 * 4 * ((8 + 12) + (8 + 6)) + 2 * 4 * 12) * tokens * 2).epsilon(1e-12));
}

// A LoRA step is the full step less the weight gradients: at a real shape its predicted time is
// between two thirds and all of the full step's (the GEMMs are most of it; the adapters add little).
TEST_CASE("step cost: a LoRA step of TinyLlama takes about two thirds of its full fine-tuning step", "[step_cost]") {
    pv::StepShape full;
    full.config = pv::preset("tinyllama-1.1b"), full.batch = 4, full.seq_len = 1024;
    pv::StepShape lora = full;
    lora.lora.rank = 8;
    const double f = pv::predict_step(full, pv::KernelSet::now).seconds;
    const double l = pv::predict_step(lora, pv::KernelSet::now).seconds;
    CHECK(l > 0.6 * f);
    CHECK(l < 0.8 * f);
}

// The RTX 6000 Ada's dense bf16 peak is what model/flops.h derives for compute capability 8.9
// from its 142 SMs at its 2505 MHz boost clock (NVIDIA's datasheet).
TEST_CASE("step cost: the RTX 6000 Ada's figures", "[step_cost]") {
    const pv::Device d = pv::rtx_6000_ada();
    CHECK(d.tensor_bf16_flops == Approx(pv::dense_bf16_peak_flops(8, 9, 142, 2505000)).epsilon(1e-3));
    CHECK(d.cuda_core_fp32_flops == Approx(18176.0 * 2 * 2.505e9).epsilon(1e-3));
    CHECK(d.hbm_bytes_per_s == 960e9);
    CHECK(d.link_bytes_per_s == 32e9);
    // The same step is slower than on an H100 SXM by between the ratio of their memory
    // bandwidths and that of their tensor peaks (each kernel is bound by one or the other).
    pv::StepShape s;
    s.config = pv::preset("tinyllama-1.1b"), s.batch = 4, s.seq_len = 1024, s.lora.rank = 8;
    const double ratio = pv::predict_step(s, pv::KernelSet::now, d).seconds / pv::predict_step(s, pv::KernelSet::now).seconds;
    CHECK(ratio >= 989.4 / 364.2 * 0.999);
    CHECK(ratio <= 3350.0 / 960.0 * 1.001);
}
