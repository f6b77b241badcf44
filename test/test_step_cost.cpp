// The performance model's LoRA step (model/step_cost.h) against counts made by hand: the GEMM
// FLOPs of a step, the kernels that drop out when the base is frozen, and the optimizer's
// elements; the recompute of activation checkpointing; the RTX 6000 Ada's figures against the
// peak model/flops.h derives for its SMs; and the tensor-core attention's issue-rate model against
// the kernels' structure and their one measurement.
#include "kernels/attention_mma_blocks.h"
#include "model/step_cost.h"

#include "model/attention_sass.h"

#include "model/config.h"
#include "model/flops.h"
#include "test/hand_built_config.h"

#include <catch2/catch.hpp>

#include <array>
#include <map>
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
    CHECK(zeroed == 2 * 2 * (2 * 6) * 8 * 2);    // per block and micro-batch the whole model's 12 kv rows × 8, bf16
    CHECK(kv_added == 2 * (6 * 8) * 2 * 2 * 2);  // its k and v rows (6 × 8 each), per block and micro-batch
    CHECK(update == 2 + 2);  // one AdamW per unit: the blocks, the embedding, the head (its final norm)
    CHECK(merges == 2);      // one per micro-batch
    CHECK(logits_read == 2 * (15 * 5 * 2 + 15 * 4));  // its 15 rows × 5 columns of bf16 logits and the targets
    const pv::StepPrediction p1 = pv::predict_step(one, pv::KernelSet::now),
                             p2 = pv::predict_step(two, pv::KernelSet::now);
    CHECK(p2.model_flops == Approx(p1.model_flops / 2).epsilon(1e-12));

    two.lora.rank = 4;
    two.lora.targets = {"q_proj", "v_proj", "down_proj"};
    const double adapter_dims = (8 + 6) + (8 + 6) + (6 + 8);
    CHECK(sums(two).gemm_flops ==
          Approx(4 * (2 * slice + head) * tokens + 6 * 4 * adapter_dims * 2 * tokens).epsilon(1e-12));
    // Each micro-batch and block: the whole A of q/v (2·4 × 8) and B of down (8 × 4) zeroed, bf16.
    double shares = 0;
    for (const pv::KernelCost& k : pv::step_kernels(two, pv::KernelSet::now))
        if (k.op == "tensor parallelism: adapter gradient share zeroed") shares += k.written_bytes * k.count;
    CHECK(shares == (2 * 4 * 8 + 8 * 4) * 2 * 2 * 2);
}

// The block's closing residual add (model/llama.cu forward_block): on one rank the MLP norm writes
// the sum twice and the down GEMM reads it back (β = 1), with no add launch; under tensor
// parallelism, and in a recompute, the add stays. The hand-built model: C = 8, F = 12 (the down
// GEMM reads act N × 12 and W 8 × 12), two blocks, 3 × 5 rows a micro-batch, two micro-batches.
TEST_CASE("step cost: one rank's residual add is the down GEMM's beta = 1; tensor parallelism keeps the add",
          "[step_cost]") {
    pv::StepShape one;
    one.config = pv_test::hand_built(true), one.batch = 3, one.seq_len = 5, one.accumulation = 2, one.t = 2;
    const double N = 15, C = 8, F = 12, launches = 2 * 2;  // blocks × micro-batches
    const auto find = [](const pv::StepShape& s, const std::string& op) {
        double count = 0, read = 0, written = 0;
        for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now))
            if (k.op == op) count += k.count, read += k.read_bytes * k.count, written += k.written_bytes * k.count;
        return std::array<double, 3>{count, read, written};
    };
    CHECK(find(one, "residual add")[0] == 0);
    CHECK(find(one, "down projection")[0] == 0);
    const auto gemm = find(one, "down projection, onto the residual");
    CHECK(gemm[0] == launches);
    CHECK(gemm[1] == launches * 2 * (N * F + C * F + N * C));  // act, W_down and the output it adds onto
    const auto norm = find(one, "residual add + rmsnorm (the sum twice)");
    CHECK(norm[0] == launches);
    CHECK(norm[2] == launches * (3 * 2 * N * C + 4 * N));  // the sum twice and y in bf16, rstd in fp32
    CHECK(find(one, "residual add + rmsnorm")[0] == 0);
    pv::StepShape two = one;
    two.tensor = 2;  // the down GEMM holds a share of its output: the add follows the group's sum
    CHECK(find(two, "residual add")[0] == launches);
    CHECK(find(two, "down projection")[0] == launches);
    CHECK(find(two, "residual add + rmsnorm")[0] == launches);
    CHECK(find(two, "down projection, onto the residual")[0] == 0);
    pv::StepShape recompute = one;
    recompute.checkpointing = pv::ActivationCheckpointing{true, 0};  // every block: its sum once more, no down GEMM
    CHECK(find(recompute, "recompute: residual add + rmsnorm")[0] == launches);
    CHECK(find(recompute, "down projection, onto the residual")[0] == launches);
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

// ZeRO-2/3's rotating buffers (parallel/gradients_rotating.h), worked by hand: units are bound
// from the head (unit L + 1) down, unit u to buffer (L + 1 − u) mod 2 (a tied embedding to its
// own), and a buffer is zeroed where its previous unit was of another kind. From the second
// micro-step on, per micro-step:
//   untied, 4 layers: buffer 0 holds head, 3, 1 and buffer 1 holds 4, 2, embedding: the head
//     (after block 1), block 3 (after the head), block 4 (after the embedding), the embedding
//     (after block 2) are zeroed: 2 blocks;
//   untied, 3 layers: buffer 0 holds head, 2, embedding and buffer 1 holds 3, 1: the head, block 2
//     and the embedding: 1 block;
//   tied, 4 layers: buffer 0 holds head, 3, 1, buffer 1 holds 4, 2: the head and block 3: 1 block.
// The hand-built model: a block trains 592 elements (q 96, k 48, v 48, o 96, gate, up, down 96
// each, two norms of 8), the head 8 (its norm) + 80 untied (lm_head 10 × 8), the embedding 80.
TEST_CASE("step cost: ZeRO-2/3 zero only the gradient buffers bound where the unit's layout changes", "[step_cost]") {
    struct Case {
        bool tied;
        int layers, zeroed_blocks;
        double zeroed_elements;
    };
    for (const Case& e :
         {Case{false, 4, 2, 2 * 592 + 88 + 80}, Case{false, 3, 1, 592 + 88 + 80}, Case{true, 4, 1, 592 + 8}}) {
        pv::StepShape s;
        s.config = pv_test::hand_built(e.tied), s.config.num_layers = e.layers;
        s.batch = 2, s.seq_len = 4, s.accumulation = 3, s.rotating_gradients = true;
        double zeroed = 0, written_over = 0, added = 0;
        for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now)) {
            if (k.op == "gradient buffers zeroed where the unit's layout changes") zeroed += k.written_bytes * k.count;
            if (k.op == "down backward: dW") {  // C = 8 × 12 (β = 0: not read) from 8 tokens
                const bool reads_c = k.read_bytes == (8.0 * 8 + 12 * 8 + 8 * 12) * 2;
                (reads_c ? added : written_over) += k.count;
            }
        }
        INFO("tied " << e.tied << ", " << e.layers << " layers");
        CHECK(zeroed == e.zeroed_elements * 2 * 3);  // bf16, every micro-step
        CHECK(written_over == double(e.layers - e.zeroed_blocks) * 3);
        CHECK(added == double(e.zeroed_blocks) * 3);
        // Without rotating buffers the first micro-step writes over every block's, the others add.
        s.rotating_gradients = false;
        written_over = added = 0;
        for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now))
            if (k.op == "down backward: dW") (k.read_bytes > (8.0 * 8 + 12 * 8) * 2 ? added : written_over) += k.count;
        CHECK(written_over == e.layers);
        CHECK(added == e.layers * 2.0);
    }
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
    CHECK(d.sms == 142);
    CHECK(d.clock_hz == 2.505e9);
    // The same step's kernels are slower than on an H100 SXM by between the ratio of their memory
    // bandwidths and that of their tensor peaks (each is bound by one or the other), except the
    // tensor-core attention kernels, bound by instruction issue (their grids' dispatch on each
    // device's SMs, at the blocks per SM its shared memory allows).
    pv::StepShape s;
    s.config = pv::preset("tinyllama-1.1b"), s.batch = 4, s.seq_len = 1024, s.lora.rank = 8;
    double ada = 0, h100 = 0;
    int issue_bound = 0;
    for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now)) {
        const double on_ada = pv::predicted_seconds(k, d), on_h100 = pv::predicted_seconds(k);
        if (k.warp_instructions > 0) {
            // Their time follows the grid's dispatch on each device's SMs: never shorter than all
            // their instructions at the device's whole issue rate.
            ++issue_bound;
            CHECK(on_ada >= pv::issue_seconds(k.warp_instructions, k.issue_efficiency, d) * (1 - 1e-12));
            CHECK(on_h100 >= pv::issue_seconds(k.warp_instructions, k.issue_efficiency) * (1 - 1e-12));
        } else {
            ada += on_ada * k.count, h100 += on_h100 * k.count;
        }
    }
    CHECK(issue_bound == 3);  // the forward, dK/dV and dQ kernels (each counted for the 22 layers)
    CHECK(ada / h100 >= 989.4 / 364.2 * 0.999);
    CHECK(ada / h100 <= 3350.0 / 960.0 * 1.001);
}

// The SASS table (model/attention_sass.h, from bench/attention_sass.py) against the kernels'
// structure, counted from their source: per warp and tile-loop trip the forward does S = Q·Kᵀ
// (16 rows × 64 keys × hd: 8 n-tiles × hd/16 k-steps of m16n8k16) and P·V with P in one bf16
// (hd/8 n-tiles × 4 k-steps): hd HMMA for each 16 rows of the warp (32 at hd 64, 16 at 128);
// dK/dV over its tile's four 16-row chunks S, dP (hd/4 each), dV and dK (hd/8 each): 2·hd (with
// swizzled rows too); dQ S, dP and dQ: 1.5·hd for each 16 rows of the warp. And every
// head dim the dispatch sends to tensor cores is listed: the forward at 64 and 128, the backward
// at the multiples of 16 from 32 to 128, its swizzled dK/dV at 128 (kernels/attention.cuh,
// attention_mma_backward.cuh).
TEST_CASE("step cost: the attention SASS table covers the dispatch's head dims, with the kernels' HMMA counts",
          "[step_cost]") {
    std::map<int, int> rows;  // per SASS architecture
    for (const pv::AttentionTileSass& a : pv::kAttentionTileSass) {
        INFO("sm_" << a.sass_arch << " " << a.kernel << " hd " << a.head_dim);
        const std::string k = a.kernel;
        const double hmma_per_hd = k == "forward"          ? 1.0
                                   : k == "forward-32rows" ? 2.0
                                   : k == "dkv-32rows"     ? 4.0
                                   : k.starts_with("dkv")  ? 2.0
                                   : k == "dq-32rows"      ? 3.0
                                                           : 1.5;
        CHECK(a.hmma == hmma_per_hd * a.head_dim);
        CHECK(a.instructions > a.hmma);
        CHECK(a.registers > 0);
        CHECK(a.registers <= 255);
        // A kSplit instantiation exactly where the dispatch splits tiles.
        if (pv::attention_mma_split_supports(a.head_dim)) {
            CHECK(a.split_registers > 0);
            CHECK(a.split_registers <= 255);
        } else {
            CHECK(a.split_registers == 0);
        }
        ++rows[a.sass_arch];
    }
    // The two architectures the CUDA build ships (the Makefile's SASS_ARCHS), each with every kernel:
    // the forward, dK/dV and dQ with warps of 32 rows at hd 64 and the swizzled dK/dV at hd 128
    // (kernels/attention_mma_blocks.h).
    CHECK(rows == std::map<int, int>{{80, 2 + 1 + 2 * 7 + 1 + 1 + 1}, {90, 2 + 1 + 2 * 7 + 1 + 1 + 1}});
    for (int arch : {80, 90}) {
        INFO("sm_" << arch);
        for (int hd = 32; hd <= 128; hd += 16)
            CHECK((pv::attention_tile_instructions("dkv-swizzled", hd, false, arch) > 0) ==
                  pv::attention_mma_dkv_has_swizzled(hd));
        for (int hd : {64, 128}) CHECK(pv::attention_tile_instructions("forward", hd, false, arch) > 0);
        for (int hd = 32; hd <= 128; hd += 16) {  // 32 rows a warp where some device runs them: hd 64
            CHECK((pv::attention_tile_instructions("forward-32rows", hd, false, arch) > 0) == (hd == 64));
            CHECK((pv::attention_tile_instructions("dq-32rows", hd, false, arch) > 0) == (hd == 64));
            CHECK((pv::attention_tile_instructions("dkv-32rows", hd, false, arch) > 0) == (hd == 64));
        }
        for (int hd = 32; hd <= 128; hd += 16) {
            CHECK(pv::attention_tile_instructions("dkv", hd, false, arch) > 0);
            CHECK(pv::attention_tile_instructions("dq", hd, false, arch) > 0);
        }
        // The masked body does what the interior one does, and masks.
        for (const char* k : {"forward", "forward-32rows", "dkv", "dkv-32rows", "dkv-swizzled", "dq", "dq-32rows"})
            for (int hd = 32; hd <= 128; hd += 16)
                if (pv::attention_tile_instructions(k, hd, false, arch) > 0) {
                    INFO(k << " hd " << hd);
                    CHECK(pv::attention_tile_instructions(k, hd, true, arch) >=
                          pv::attention_tile_instructions(k, hd, false, arch));
                }
        CHECK(pv::attention_tile_instructions("forward", 96, false, arch) == 0);  // runs on CUDA cores
        CHECK(pv::attention_tile_instructions("dkv", 16, false, arch) == 0);
    }
    CHECK(pv::attention_tile_instructions("dkv", 64, false, 75) == 0);  // no such SASS in the build
}

// The rooflines measured on the H100 run (docs/speed.md, "Measured on one H100": cuBLAS GEMMs at
// 759-788 TF/s, SwiGLU at 2.8-2.9 TB/s, the RMSNorm kernels at 1.2-1.7 TB/s) put those kernels
// inside their measured ranges on an H100, and each kernel is in the class of its measured kin.
TEST_CASE("step cost: the measured rooflines price their kernels inside the measured ranges", "[step_cost]") {
    const pv::Device h100;
    const auto inside = [](double x, double lo, double hi) { return x >= lo && x <= hi; };
    const pv::KernelCost gemm = pv::cost::gemm(8192, 8192, 2048, 2, false, "gate, up projection").front();
    CHECK(inside(gemm.flops / pv::predicted_seconds(gemm, h100), 759e12, 788e12));
    const pv::KernelCost swiglu = pv::cost::swiglu_forward(8192, 8192, 2).front();
    CHECK(swiglu.roofline == pv::Roofline::memory_vector);
    CHECK(inside(swiglu.bytes() / pv::predicted_seconds(swiglu, h100), 2.8e12, 2.9e12));
    for (const pv::KernelCost& k : {pv::cost::rmsnorm_forward(8192, 2048, 2, 4).front(),
                                    pv::cost::residual_rmsnorm_forward(8192, 2048, 2, 4).front(),
                                    pv::cost::rmsnorm_backward(8192, 2048, 2, 4, true).front()}) {
        INFO(k.op);
        CHECK(k.roofline == pv::Roofline::memory_rows);
        CHECK(inside(k.bytes() / pv::predicted_seconds(k, h100), 1.2e12, 1.7e12));
    }
}

// The issue efficiencies are what makes the kernels measured then take their measured time: the
// instructions they issued (4 warps per block, each running its tile loop once per 64×64 tile pair
// it walks, n(n+1)/2 pairs per batch and head, n = T/64), their blocks dispatched heaviest first
// on the H100's 132 SMs (2, 3 and 3 a SM at their 186, 166 and 134 registers), at that efficiency
// of each block's share of its SM's issue rate, reproduce 114 TF/s forward and 93 TF/s backward at
// llama-3.2-1b, 4 × 2048 (the backward's time includes the D kernel's predicted time).
TEST_CASE("step cost: the attention issue efficiencies reproduce the measurement they come from", "[step_cost]") {
    const pv::IssueEfficiency e = pv::attention_issue_efficiency();
    const double B = 4, T = 2048, H = 32, hd = 64, n = T / 64, trips = 4 * n * (n + 1) / 2 * B * H;
    const double flops = 4 * hd * (T * (T + 1) / 2) * B * H;  // kernels_bench's forward FLOPs
    const auto then = [&](const char* kernel, int trip, int registers, double efficiency) {
        pv::KernelCost k;
        k.kernel = kernel;
        k.issue_efficiency = efficiency;
        pv::cost::set_attention_issue(k, kernel, 4, 2048, 32, 8, 64, trip, trip, registers);
        CHECK(k.warp_instructions == trips * trip);
        return pv::issue_seconds(k);
    };
    CHECK(flops / then("forward", 1225, 186, e.forward) == Approx(114e12).epsilon(1e-12));
    // That run's D kernel: a warp per row, one element per load (today's loads 16 bytes).
    const pv::KernelCost d = pv::cost::attention_dot(4.0 * 2048, 32, 64, 2, 4, false);
    const pv::KernelCost d_now = pv::cost::attention_backward(4, 2048, 32, 8, 64, 2, 4, false).front();
    REQUIRE(d_now.kernel == "attention_backward_dot_kernel");
    CHECK(d.roofline == pv::Roofline::memory_scalar);
    CHECK(d_now.roofline == pv::Roofline::memory_vector);
    CHECK(pv::cost::attention_dot(4.0 * 2048, 32, 60, 2, 4).roofline == pv::Roofline::memory_scalar);  // 120-byte rows
    const double backward =
        then("dkv", 2138, 166, e.backward) + then("dq", 1458, 134, e.backward) + pv::predicted_seconds(d);
    CHECK(2.5 * flops / backward == Approx(93e12).epsilon(1e-12));
    // The H100's 132 SMs at 1.98 GHz issue 4 instructions per SM per clock.
    CHECK(pv::issue_seconds(132 * 4 * 1.98e9, 1.0) == Approx(1.0).epsilon(1e-15));
    // The kernels then reached a little over half of the issue rate, forward and backward alike.
    CHECK(e.forward > 0.45);
    CHECK(e.forward < 0.7);
    CHECK(e.backward > 0.45);
    CHECK(e.backward < 0.7);
}

// How many blocks an SM holds, by the CUDA occupancy rules worked by hand (compute capability 9.0:
// 65,536 registers allocated per warp in units of 8 a thread, 228 KiB of shared memory with 1 KiB
// reserved per block, 2,048 threads, 32 blocks; 8.9: 99 KiB a block, 100 KiB an SM).
TEST_CASE("step cost: resident blocks per SM", "[step_cost]") {
    const pv::SmLimits h100;
    CHECK(pv::resident_blocks(h100, 128, 186, 37120) == 2);  // 192 × 32 = 6,144 a warp: 10 warps
    CHECK(pv::resident_blocks(h100, 128, 166, 56832) == 3);  // 12 warps; shared: 233,472 / 57,856 = 4
    CHECK(pv::resident_blocks(h100, 128, 255, 0) == 2);      // 256 × 32: 8 warps
    CHECK(pv::resident_blocks(h100, 128, 32, 102400) == 2);  // shared: 233,472 / 103,424
    CHECK(pv::resident_blocks(h100, 1024, 16, 0) == 2);      // threads
    CHECK(pv::resident_blocks(h100, 32, 16, 0) == 32);       // the block limit
    CHECK(pv::resident_blocks(h100, 128, 1, 0) == 16);       // 8 registers at least: threads bind
    CHECK(pv::resident_blocks(h100, 1024, 128, 0) == 0);     // 32 warps of 4,096 registers: no
    CHECK(pv::resident_blocks(h100, 128, 32, 227 * 1024 + 1) == 0);
    const pv::SmLimits ada = pv::rtx_6000_ada().sm;
    CHECK(pv::resident_blocks(ada, 128, 168, 37120) == 2);   // shared: 102,400 / 38,144
    CHECK(pv::resident_blocks(ada, 128, 246, 105984) == 0);  // dK/dV at hd 128: over 99 KiB
    CHECK(pv::resident_blocks(ada, 512, 32, 0) == 3);        // 1,536 threads
}

// The dispatch, worked by hand: blocks spread over the SMs in launch order, each SM's rate shared
// by its blocks, an SM below full_warps warps slower in proportion, and an ended block's place
// taken by the next in launch order.
TEST_CASE("step cost: a grid's dispatch", "[step_cost]") {
    const pv::SmIssue one{1.0, 4};  // 1 instruction a second from 4 warps on
    // One SM, two blocks of 4 warps at a time: both run at 1/2.
    CHECK(pv::grid_seconds({{2, 1.0}}, 1, 2, 4, one) == 2.0);
    // Heaviest first: 3 and 1 share the SM (1/2 each); at 2 the 1 has ended and the next 1 starts
    // beside the 3's remaining 2; at 4 it ends (the 3 has 1 left), the last 1 starts: both end at 6.
    CHECK(pv::grid_seconds({{1, 3.0}, {3, 1.0}}, 1, 2, 4, one) == Approx(6.0));
    // Lightest first: two 1s end at 2; the third 1 and the 3 start then (1/2 each): the 1 ends at 4,
    // and the 3, with 2 left, runs alone at the full rate until 6.
    CHECK(pv::grid_seconds({{3, 1.0}, {1, 3.0}}, 1, 2, 4, one) == Approx(6.0));
    // Alone below full_warps: a block of 4 warps where 8 are needed for the full rate runs at 1/2.
    CHECK(pv::grid_seconds({{1, 3.0}}, 1, 2, 4, pv::SmIssue{1.0, 8}) == Approx(6.0));
    // Two SMs: the blocks go one to each before a second to either.
    CHECK(pv::grid_seconds({{2, 5.0}}, 2, 4, 4, one) == Approx(5.0));
    CHECK(pv::grid_seconds({{4, 5.0}}, 2, 4, 4, one) == Approx(10.0));
    // Heaviest first over two SMs, one block each at a time: 4 | 1+1+1+1 → 4; lightest first
    // 1, 1 then 1, 1 then the 4 starting at 2 → 6.
    CHECK(pv::grid_seconds({{1, 4.0}, {4, 1.0}}, 2, 1, 4, one) == Approx(4.0));
    CHECK(pv::grid_seconds({{4, 1.0}, {1, 4.0}}, 2, 1, 4, one) == Approx(6.0));
    CHECK(pv::grid_seconds({}, 3, 1, 4, one) == 0.0);
    CHECK_THROWS_AS(pv::grid_seconds({{1, 1.0}}, 0, 1, 4, one), std::invalid_argument);
}

// The dispatch of an attention grid, worked by hand: at B 1, T 128, one head, the forward has two
// blocks (query tiles 1 and 0, the heavier first), one on each of two SMs, so the time is the
// heavier block's — on an H100 at hd 64 2 warps (of 32 rows) through one interior and one masked
// trip — alone on its SM.
TEST_CASE("step cost: an attention grid's blocks and their time", "[step_cost]") {
    const pv::IssueEfficiency e = pv::attention_issue_efficiency();
    const pv::KernelCost f = pv::cost::attention_forward(1, 128, 1, 1, 64, 2, 4, false).front();
    REQUIRE(f.blocks.size() == 2);
    const int I = pv::attention_tile_instructions("forward-32rows", 64),
              M = pv::attention_tile_instructions("forward-32rows", 64, true);
    CHECK(f.blocks[0].blocks == 1);
    CHECK(f.blocks[0].work == 2.0 * (I + M));
    CHECK(f.blocks[1].work == 2.0 * M);
    CHECK(f.block_threads == 64);
    CHECK(f.block_registers == pv::attention_kernel_registers("forward-32rows", 64));
    // Two K, two V and a Q tile of 64 rows of 72 bf16, and 64 ints.
    CHECK(f.block_shared == 5 * 64 * 72 * 2 + 64 * 4);
    // Each block alone on its SM: 2 warps, a quarter of the 8 the efficiency was measured at.
    CHECK(pv::issue_seconds(f) == Approx(2.0 * (I + M) / (4 * 1.98e9 * e.forward * 0.25)).epsilon(1e-12));
    // At hd 128 4 warps of 16 rows, Q staged in a V buffer.
    const pv::KernelCost f128 = pv::cost::attention_forward(1, 128, 1, 1, 128, 2, 4, false).front();
    CHECK(f128.blocks[1].work == 4.0 * pv::attention_tile_instructions("forward", 128, true));
    CHECK(f128.block_threads == 128);
    CHECK(f128.block_shared == 4 * 64 * 136 * 2 + 64 * 4);
    // On the RTX 6000 Ada (100 KiB an SM: two 32-row blocks of 46,336 bytes, 4 warps) hd 64 keeps
    // 4 warps of 16 rows too, in its sm_80 code; and an A100's 164 KiB hold three (6 warps).
    const pv::Device ada = pv::rtx_6000_ada();
    const pv::KernelCost fa = pv::cost::attention_forward(1, 128, 1, 1, 64, 2, 4, false, ada).front();
    CHECK(fa.blocks[1].work == 4.0 * pv::attention_tile_instructions("forward", 64, true, 80));
    CHECK(fa.block_threads == 128);
    CHECK(fa.block_shared == 4 * 64 * 72 * 2 + 64 * 4);
    CHECK(pv::attention_mma_forward_row_tiles(64, 227 * 1024) == 2);
    CHECK(pv::attention_mma_forward_row_tiles(64, 163 * 1024) == 1);
    CHECK(pv::attention_mma_forward_row_tiles(64, 99 * 1024) == 1);
    CHECK(pv::attention_mma_forward_row_tiles(128, 227 * 1024) == 1);
    // dK/dV: a block per (key tile, KV head, batch), each over the G query heads of its KV head.
    const auto b = pv::cost::attention_backward(2, 128, 4, 2, 64, 2, 4, false);
    const int Ik = pv::attention_tile_instructions("dkv", 64), Mk = pv::attention_tile_instructions("dkv", 64, true);
    REQUIRE(b[1].blocks.size() == 2);
    CHECK(b[1].blocks[0].blocks == 2 * 2);
    CHECK(b[1].blocks[0].work == 4.0 * 2 * (Ik + Mk));  // key tile 0: query tiles 0 and 1, two heads
    CHECK(b[1].blocks[1].work == 4.0 * 2 * Mk);
    CHECK(b[1].block_threads == 128);
    // On the H100 at hd 64, where the grid is large enough (its heaviest block, G·n steps, at most
    // 1.2x a slot's share of the steps over 132 SMs x 4 blocks), 2 warps of 32 keys: its block's
    // shared memory the same (K, V, two Q and two dO tiles, two buffers of 64 lse, D and window
    // starts). 1B at 4 x 2048: 4·32 = 128 steps against 4·8·4·528 / 528 = 128; at 3 x 2048 against 96.
    CHECK(pv::attention_mma_dkv_row_tiles(64, 227 * 1024, 4, 2048, 32, 8) == 2);
    CHECK(pv::attention_mma_dkv_row_tiles(64, 227 * 1024, 3, 2048, 32, 8) == 1);
    CHECK(pv::attention_mma_dkv_row_tiles(64, 227 * 1024, 2, 4096, 32, 8) == 2);  // 256 against 252
    CHECK(pv::attention_mma_dkv_row_tiles(64, 227 * 1024, 1, 4096, 32, 8) == 1);  // 256 against 126
    const pv::KernelCost wide = pv::cost::attention_backward(4, 2048, 32, 8, 64, 2, 4, false)[1];
    const int Iw = pv::attention_tile_instructions("dkv-32rows", 64),
              Mw = pv::attention_tile_instructions("dkv-32rows", 64, true);
    CHECK(wide.blocks[0].blocks == 4 * 8);
    CHECK(wide.blocks[0].work == 2.0 * 4 * (31 * Iw + Mw));  // key tile 0: 32 query tiles, 4 heads
    CHECK(wide.block_threads == 64);
    CHECK(wide.block_registers == pv::attention_kernel_registers("dkv-32rows", 64));
    CHECK(wide.block_shared == 6 * 64 * 72 * 2 + 2 * 64 * 12);
    // Four such blocks take 231,424 bytes with their reserves: an H100's SM holds them, an A100's
    // 164 KiB not (there and on sm_86/sm_89 4 warps of 16 keys, in the sm_80 code); hd 128 keeps 16.
    CHECK(pv::attention_mma_dkv_row_tiles(64, 227 * 1024) == 2);
    CHECK(pv::attention_mma_dkv_row_tiles(64, 163 * 1024) == 1);
    CHECK(pv::attention_mma_dkv_row_tiles(64, 99 * 1024) == 1);
    CHECK(pv::attention_mma_dkv_row_tiles(128, 227 * 1024) == 1);
    CHECK(pv::attention_mma_dkv_row_tiles(64, 163 * 1024, 4, 2048, 32, 8) == 1);
    CHECK(pv::attention_mma_dkv_row_tiles(128, 227 * 1024, 4, 2048, 32, 8) == 1);
    const pv::KernelCost ka = pv::cost::attention_backward(4, 2048, 32, 8, 64, 2, 4, false, ada)[1];
    CHECK(ka.block_threads == 128);
    CHECK(ka.block_registers == pv::attention_kernel_registers("dkv", 64, 80));
    // dQ: a block per (query tile, head, batch), on the H100 at hd 64 2 warps of 32 rows (its block's
    // shared memory the same: two K and two V tiles, 76 ints); query tile 1 (the heavier, first)
    // walks an interior and a diagonal key tile, query tile 0 the diagonal.
    const int Iq = pv::attention_tile_instructions("dq-32rows", 64),
              Mq = pv::attention_tile_instructions("dq-32rows", 64, true);
    REQUIRE(b[2].blocks.size() == 2);
    CHECK(b[2].blocks[0].blocks == 2 * 4);
    CHECK(b[2].blocks[0].work == 2.0 * (Iq + Mq));
    CHECK(b[2].blocks[1].work == 2.0 * Mq);
    CHECK(b[2].block_threads == 64);
    CHECK(b[2].block_registers == pv::attention_kernel_registers("dq-32rows", 64));
    CHECK(b[2].block_shared == 4 * 64 * 72 * 2 + 76 * 4);
    // Four such blocks take 152,768 bytes with their reserves: an A100's SM holds them, an sm_89's
    // 100 KiB not (there 4 warps of 16 rows, in its sm_80 code); hd 128 keeps 16 rows.
    CHECK(pv::attention_mma_dq_row_tiles(64, 227 * 1024) == 2);
    CHECK(pv::attention_mma_dq_row_tiles(64, 163 * 1024) == 2);
    CHECK(pv::attention_mma_dq_row_tiles(64, 99 * 1024) == 1);
    CHECK(pv::attention_mma_dq_row_tiles(128, 227 * 1024) == 1);
    const pv::KernelCost qa = pv::cost::attention_backward(2, 128, 4, 2, 64, 2, 4, false, ada)[2];
    CHECK(qa.blocks[1].work == 4.0 * pv::attention_tile_instructions("dq", 64, true, 80));
    CHECK(qa.block_threads == 128);
    CHECK(pv::cost::attention_backward(2, 128, 4, 2, 128, 2, 4, false)[2].block_threads == 128);
}

// Where the padded dK/dV block cannot launch (at hd 128 it takes 105,984 bytes of shared memory,
// more than sm_89's 99 KiB) the dispatch and the model both run it with swizzled rows (99,840
// bytes); where not even that fits, both run the CUDA-core backward.
TEST_CASE("step cost: the RTX 6000 Ada runs the dK/dV kernel with swizzled rows at hd 128", "[step_cost]") {
    using pv::AttentionMmaRows;
    const size_t h100 = 227 * 1024, ada = 99 * 1024, less = 96 * 1024;
    CHECK(pv::attention_mma_dkv_rows(128, h100) == AttentionMmaRows::padded);
    CHECK(pv::attention_mma_dkv_rows(128, ada) == AttentionMmaRows::swizzled);
    CHECK(pv::attention_mma_dkv_rows(112, ada) == AttentionMmaRows::padded);
    CHECK(pv::attention_mma_dkv_rows(64, less) == AttentionMmaRows::padded);
    CHECK(pv::attention_mma_backward_fits(128, h100));
    CHECK(pv::attention_mma_backward_fits(128, ada));
    CHECK_FALSE(pv::attention_mma_backward_fits(128, less));  // 99,840 bytes even swizzled
    CHECK(pv::attention_mma_backward_fits(112, ada));
    CHECK(pv::attention_mma_forward_fits(128, ada));
    pv::StepShape s;
    // (4 sequences: a grid whose key tiles are not split, attention_mma_backward_split)
    s.config = pv::preset("llama-3.1-8b"), s.batch = 4, s.seq_len = 1024, s.lora.rank = 8;
    const auto dkv_kernels = [&](const pv::Device& d) {
        std::vector<pv::KernelCost> dkv;
        int cuda_core_backward = 0, mma_forward = 0;
        for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now, d)) {
            if (k.kernel == "attention_mma_dkv_kernel") dkv.push_back(k);
            cuda_core_backward += k.kernel == "attention_backward_dkv_kernel";
            mma_forward += k.kernel == "attention_mma_forward_kernel";
            CHECK(pv::predicted_seconds(k, d) > 0);
        }
        CHECK(mma_forward > 0);
        CHECK((cuda_core_backward > 0) == dkv.empty());
        return dkv;
    };
    const pv::Device on_ada = pv::rtx_6000_ada();
    const auto swizzled = dkv_kernels(on_ada), padded = dkv_kernels(pv::Device{});
    REQUIRE(swizzled.size() == padded.size());
    REQUIRE_FALSE(padded.empty());
    // Same blocks, each priced with the swizzled kernel's instructions, registers and shared memory
    // in the SASS the Ada runs (the build's sm_80 code), the H100's with the padded kernel's sm_90.
    REQUIRE(on_ada.sass_arch == 80);
    const int interior = pv::attention_tile_instructions("dkv-swizzled", 128, false, 80),
              masked = pv::attention_tile_instructions("dkv-swizzled", 128, true, 80);
    REQUIRE(interior > pv::attention_tile_instructions("dkv", 128, false, 80));
    REQUIRE(masked != pv::attention_tile_instructions("dkv-swizzled", 128, true, 90));  // the arch is seen
    const int n = 1024 / 64, group = 32 / 8;
    REQUIRE(pv::attention_mma_dkv_segment_steps(4, 1024, 32, 8, 128) == 0);
    CHECK(swizzled[0].block_shared == pv::attention_mma_dkv_smem_bytes(128, AttentionMmaRows::swizzled));
    CHECK(swizzled[0].block_registers == pv::attention_kernel_registers("dkv-swizzled", 128, 80));
    CHECK(padded[0].block_shared == pv::attention_mma_dkv_smem_bytes(128));
    REQUIRE(swizzled[0].blocks.size() == size_t(n));
    REQUIRE(padded[0].blocks.size() == size_t(n));
    const int h100_interior = pv::attention_tile_instructions("dkv", 128, false, 90),
              h100_masked = pv::attention_tile_instructions("dkv", 128, true, 90);
    for (int z = 0; z < n; ++z) {  // key tile z: n − z query tiles of each of the group's query heads
        CHECK(swizzled[0].blocks[size_t(z)].work == 4.0 * group * ((n - z - 1) * interior + masked));
        CHECK(padded[0].blocks[size_t(z)].work == 4.0 * group * ((n - z - 1) * h100_interior + h100_masked));
    }
    // The H100's padded kernel priced on the Ada is refused by name.
    CHECK_THROWS_WITH(pv::predicted_seconds(padded[0], on_ada),
                      Catch::Contains("attention_mma_dkv_kernel cannot launch on the RTX 6000 Ada") &&
                          Catch::Contains("105984 bytes of shared memory"));
    // Below even the swizzled block, the CUDA-core backward.
    pv::Device smaller = on_ada;
    smaller.sm.shared_bytes_per_block = less;
    CHECK(dkv_kernels(smaller).empty());
}

// A small grid's tiles split into segments (kernels/attention_mma_blocks.h): 8B under --tp 8 at
// 1 x 4096, a rank's 4 query heads and 1 KV head. Unsplit, key tile z's dK/dV block walks 4(64 − z)
// steps and query tile q's dQ (and forward) block q + 1 key tiles, and the first blocks run alone long after the
// rest; split into segments of at most L = 11 steps, 786 and 876 blocks (test_attention works the
// policy by hand). Each block's work by hand: its steps' interior and diagonal (dK/dV: a head's
// first step; dQ: the last key tile; masked) tile pairs, 4 warps each; the same instructions in all
// as unsplit, spread so each kernel ends within a block of the balanced time; and the reduce kernels
// read the partials the split tiles wrote.
TEST_CASE("step cost: a small grid's tiles split into segments, priced block by block", "[step_cost]") {
    const int B = 1, T = 4096, H = 4, Hkv = 1, hd = 128, n = 64, G = 4, L = 11;
    REQUIRE(pv::attention_mma_dkv_segment_steps(B, T, H, Hkv, hd) == L);
    REQUIRE(pv::attention_mma_query_segment_steps(B, T, H, hd) == L);
    const auto k = pv::cost::attention_backward(B, T, H, Hkv, hd, 2, 4, false);
    REQUIRE(k.size() == 5);  // in launch order: D, dK/dV, its reduce, dQ, its reduce
    const pv::KernelCost &dkv = k[1], &dq = k[3];
    REQUIRE(dkv.kernel == "attention_mma_dkv_kernel");
    REQUIRE(dq.kernel == "attention_mma_dq_kernel");
    // kernel: dK/dV (G steps a tile, the diagonal a head's first) or dQ (1, the diagonal the last).
    const auto check_blocks = [&](const pv::KernelCost& kernel, const char* kind, int group, long long rows,
                                  size_t blocks) {
        INFO(kind);
        const bool is_dkv = group > 1;
        const double I = pv::attention_tile_instructions(kind, hd), M = pv::attention_tile_instructions(kind, hd, true);
        std::vector<double> want;
        double total = 0;
        for (int z = 0; z < n; ++z) {
            const int steps = group * (n - z);
            for (int first = 0; first < steps; first += L) {
                double diagonal = 0, interior = 0;
                for (int i = first; i < std::min(steps, first + L); ++i)
                    ((is_dkv ? i % (n - z) == 0 : i == n - z - 1) ? diagonal : interior) += 1;
                want.push_back(4 * (interior * I + diagonal * M));
                total += rows * want.back();
            }
        }
        REQUIRE(want.size() == blocks);
        REQUIRE(kernel.blocks.size() == want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            INFO("block " << i);
            CHECK(kernel.blocks[i].blocks == rows);
            CHECK(kernel.blocks[i].work == want[i]);
        }
        // The unsplit kernel's instructions: 4 warps, group·n(n+1)/2 tile pairs per row, group·n of
        // them diagonal.
        CHECK(kernel.warp_instructions == rows * 4.0 * ((group * n * (n + 1) / 2 - group * n) * I + group * n * M));
        CHECK(total == kernel.warp_instructions);
        const double balanced = pv::issue_seconds(kernel.warp_instructions, kernel.issue_efficiency);
        const double longest = pv::issue_seconds(4.0 * (L * I), kernel.issue_efficiency) * 132;  // one block alone
        CHECK(pv::predicted_seconds(kernel) < balanced + longest);
        CHECK(pv::predicted_seconds(kernel) < 1.5 * balanced);
    };
    check_blocks(dkv, "dkv", G, 1, 786);
    check_blocks(dq, "dq", 1, H, 876 / H);
    // The split kernels' registers (the blocks an SM holds), not the unsplit ones'.
    CHECK(dkv.block_registers == pv::attention_kernel_registers("dkv", hd, 90, true));
    CHECK(dq.block_registers == pv::attention_kernel_registers("dq", hd, 90, true));
    // The reduce kernels: fp32 partials read (dK/dV: both outputs' 784 slots of 64 x 128; dQ: 208
    // slots a head), the split tiles' bf16 rows written (62 key tiles' dK and dV; 53 query tiles' dQ of
    // each head); each kernel writes the partials instead of those rows.
    const pv::KernelCost &dkv_reduce = k[2], &dq_reduce = k[4];
    CHECK(dkv_reduce.kernel == "attention_mma_reduce_kernel");
    CHECK(dkv_reduce.read_bytes == 784.0 * 64 * 128 * 2 * 4);
    CHECK(dkv_reduce.written_bytes == 62.0 * 64 * 128 * 2 * 2);
    CHECK(dkv.written_bytes == 2.0 * T * Hkv * hd * 2 - dkv_reduce.written_bytes + dkv_reduce.read_bytes);
    CHECK(dq_reduce.kernel == "attention_mma_reduce_kernel");
    CHECK(dq_reduce.read_bytes == 208.0 * H * 64 * 128 * 4);
    CHECK(dq_reduce.written_bytes == 53.0 * H * 64 * 128 * 2);
    CHECK(dq.written_bytes == 1.0 * T * H * hd * 2 - dq_reduce.written_bytes + dq_reduce.read_bytes);
    // The forward splits its query tiles as dQ does (the same blocks, its own instructions); the
    // combine kernel reads each slot's output and its rows' maximum and sum, and writes the 53 split
    // query tiles' bf16 rows and fp32 lse of each head.
    const auto f = pv::cost::attention_forward(B, T, H, Hkv, hd, 2, 4, false);
    REQUIRE(f.size() == 2);
    REQUIRE(f[0].kernel == "attention_mma_forward_kernel");
    check_blocks(f[0], "forward", 1, H, 876 / H);
    CHECK(f[0].block_registers == pv::attention_kernel_registers("forward", hd, 90, true));
    CHECK(f[1].kernel == "attention_mma_forward_combine_kernel");
    CHECK(f[1].read_bytes == 208.0 * H * 64 * (128 + 2) * 4);
    CHECK(f[1].written_bytes == 53.0 * H * 64 * (128 * 2 + 4));
    CHECK(f[0].written_bytes == T * H * (hd * 2.0 + 4) - f[1].written_bytes + f[1].read_bytes);
    // Four sequences at 1024: no split, and no reduce or combine kernel; the unsplit kernels' registers.
    const auto whole = pv::cost::attention_backward(4, 1024, 32, 8, hd, 2, 4, false);
    CHECK(whole.size() == 3);
    CHECK(whole[1].block_registers == pv::attention_kernel_registers("dkv", hd, 90));
    CHECK(pv::cost::attention_forward(4, 1024, 32, 8, hd, 2, 4, false).size() == 1);
}

// perf_model prices dK/dV at segment lengths other than the shape's (its table "dK/dV's segment
// length on small grids"): at the shape above, L = 31 (a slot's whole share) gives key tile z
// ceil(4(64 − z) / 31) blocks, the partials of the tiles cut in more than one, and dQ as before; −1
// is the shape's own split and 0 one block a tile (no reduce kernel after dK/dV).
TEST_CASE("step cost: dK/dV priced at another segment length", "[step_cost]") {
    const int B = 1, T = 4096, H = 4, Hkv = 1, hd = 128, n = 64, G = 4, L = 31;
    const auto shape = pv::cost::attention_backward(B, T, H, Hkv, hd, 2, 4, false);
    const auto own = pv::cost::attention_backward(B, T, H, Hkv, hd, 2, 4, false, {}, -1);
    REQUIRE(own.size() == shape.size());
    for (size_t i = 0; i < own.size(); ++i) CHECK(pv::predicted_seconds(own[i]) == pv::predicted_seconds(shape[i]));
    const auto other = pv::cost::attention_backward(B, T, H, Hkv, hd, 2, 4, false, {}, L);
    REQUIRE(other.size() == 5);  // D, dK/dV, its reduce, dQ (the shape's split), its reduce
    long long blocks = 0, slots = 0, split_tiles = 0;
    for (int z = 0; z < n; ++z) {
        const int segments = (G * (n - z) + L - 1) / L;
        blocks += segments;
        if (segments > 1) slots += segments, ++split_tiles;
    }
    long long priced = 0;
    for (const pv::BlockRun& r : other[1].blocks) priced += r.blocks;
    CHECK(priced == blocks);
    CHECK(other[1].warp_instructions == shape[1].warp_instructions);  // the same steps, other blocks
    CHECK(other[1].block_registers == pv::attention_kernel_registers("dkv", hd, 90, true));
    CHECK(other[2].kernel == "attention_mma_reduce_kernel");
    CHECK(other[2].read_bytes == double(slots) * 64 * hd * 2 * 4);
    CHECK(other[2].written_bytes == double(split_tiles) * 64 * hd * 2 * 2);
    CHECK(pv::predicted_seconds(other[3]) == pv::predicted_seconds(shape[3]));
    const auto whole = pv::cost::attention_backward(B, T, H, Hkv, hd, 2, 4, false, {}, 0);
    REQUIRE(whole.size() == 4);  // D, dK/dV, dQ, dQ's reduce
    CHECK(whole[1].blocks.size() == size_t(n));
    CHECK(whole[1].block_registers == pv::attention_kernel_registers("dkv", hd, 90));
    CHECK(whole[2].kernel == "attention_mma_dq_kernel");
    CHECK(pv::predicted_seconds(whole[1]) > 2 * pv::predicted_seconds(other[1]));  // 64 blocks on 132 SMs
}

// Today's kernels are priced by their own instructions: the forward's time at the 1B shape is its
// table entry's instructions over the issue rate (issue, not bytes or the tensor peak, binds), so
// fewer instructions per trip predict proportionally less time. Per (batch, head) the n diagonal
// tile pairs run the masked body and the other n(n−1)/2 the interior one (each by 4 warps; the
// forward's, dK/dV's and dQ's by 2 at hd 64 on the H100, each trip 32 rows).
TEST_CASE("step cost: a tensor-core attention kernel's time follows its SASS instructions", "[step_cost]") {
    const pv::IssueEfficiency e = pv::attention_issue_efficiency();
    const double n = 2048 / 64, interior_trips = 4 * n * (n - 1) / 2 * 4 * 32, diagonal_trips = 4 * n * 4 * 32;
    const auto trips = [&](const char* kernel) {
        const double warps = std::string(kernel).ends_with("-32rows") ? 0.5 : 1.0;  // of 4
        return warps * (interior_trips * pv::attention_tile_instructions(kernel, 64) +
                        diagonal_trips * pv::attention_tile_instructions(kernel, 64, true));
    };
    const pv::KernelCost f = pv::cost::attention_forward(4, 2048, 32, 8, 64, 2, 4, false).front();
    CHECK(std::string(pv::cost::attention_forward_kind(64)) == "forward-32rows");  // on the H100
    CHECK(f.warp_instructions == trips("forward-32rows"));
    CHECK(pv::attention_tile_instructions("forward-32rows", 64, true) >
          pv::attention_tile_instructions("forward-32rows", 64));
    CHECK(f.issue_efficiency == e.forward);
    // Issue binds, and the grid's tail makes it longer than its instructions over the whole GPU's
    // rate, but not by more than its heaviest block.
    const double spread = pv::issue_seconds(trips("forward-32rows"), e.forward);
    CHECK(pv::predicted_seconds(f) == pv::issue_seconds(f));
    CHECK(pv::predicted_seconds(f) > spread);
    CHECK(pv::predicted_seconds(f) < spread * 1.3);
    pv::KernelCost fewer = f;
    for (pv::BlockRun& r : fewer.blocks) r.work /= 2;
    CHECK(pv::predicted_seconds(fewer) == Approx(pv::predicted_seconds(f) / 2).epsilon(1e-12));
    const auto b = pv::cost::attention_backward(4, 2048, 32, 8, 64, 2, 4, false);
    REQUIRE(b.size() == 3);
    CHECK(std::string(pv::cost::attention_dkv_kind(64, pv::Device{}, 4, 2048, 32, 8)) == "dkv-32rows");
    CHECK(b[1].warp_instructions == trips("dkv-32rows"));
    CHECK(std::string(pv::cost::attention_dq_kind(64)) == "dq-32rows");
    CHECK(b[2].warp_instructions == trips("dq-32rows"));
    CHECK(b[1].issue_efficiency == e.backward);
    // A head dim without a tensor-core kernel is refused by name, and a step at one is priced on
    // the CUDA-core kernels.
    CHECK_THROWS_WITH(pv::cost::attention_forward(1, 64, 2, 2, 96, 2, 4, false),
                      Catch::Contains("no tensor-core attention forward kernel at head dim 96"));
    pv::StepShape s;
    s.config = pv_test::hand_built(true), s.batch = 1, s.seq_len = 64;
    for (const pv::KernelCost& k : pv::step_kernels(s, pv::KernelSet::now))
        if (k.kernel.find("attention") != std::string::npos && k.kernel != "attention_backward_dot_kernel")
            CHECK((k.roofline == pv::Roofline::attention_mma) ==
                  (pv::attention_tile_instructions(k.kernel.find("forward") != std::string::npos ? "forward" : "dkv",
                                                   s.config.head_dim_resolved()) > 0));
}
