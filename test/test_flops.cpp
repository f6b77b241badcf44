// FLOPs per token and dense bf16 peaks: N and the per-token FLOPs of a hand-built config and of
// Llama-2-7B and Llama-3.1-8B written out from their published shapes and parameter counts, tied
// and untied heads, the published peaks of A100, H100 and the Ampere/Ada data-center parts,
// unknown architectures, and every rejection.
#include "model/flops.h"
#include "model/config.h"
#include "test/hand_built_config.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace flops_test {

using pv_test::hand_built;

// |actual / expected − 1| ≤ tolerance.
inline bool within(double actual, double expected, double tolerance) {
    return std::abs(actual / expected - 1.0) <= tolerance;
}

// f() throws std::invalid_argument whose message contains every substring.
template <class F>
void expect_rejected(F f, const std::vector<std::string>& substrings) {
    std::string message;
    try {
        f();
    } catch (const std::invalid_argument& e) {
        message = e.what();
    }
    INFO("message: " << message);
    REQUIRE(!message.empty());
    for (const auto& s : substrings) {
        INFO("expected substring: " << s);
        CHECK(message.find(s) != std::string::npos);
    }
}

}  // namespace flops_test

using namespace flops_test;

TEST_CASE("flops: a hand-built config, counted by hand", "[flops]") {
    // Per block, H = 8, q = 12, kv = 6, F = 12:
    //   Wq 12·8 = 96, Wk 6·8 = 48, Wv 6·8 = 48, Wo 8·12 = 96,
    //   Wgate 12·8 = 96, Wup 12·8 = 96, Wdown 8·12 = 96          → 576
    // 2 blocks → 1152; lm_head 10·8 = 80                        → N = 1232
    const auto untied = hand_built(false);
    CHECK(pv::matmul_parameter_count(untied) == 1232.0);
    // 6·1232 = 7392; attention 12·L·H·d·T = 12·2·2·6·5 = 1440  → 8832 at T = 5
    CHECK(pv::training_flops_per_token(untied, 5) == 8832.0);
    // at T = 16: 12·2·2·6·16 = 4608                              → 12000
    CHECK(pv::training_flops_per_token(untied, 16) == 12000.0);
    // T = 1 leaves almost only the weights: 7392 + 12·2·2·6 = 7680.
    CHECK(pv::training_flops_per_token(untied, 1) == 7680.0);
}

TEST_CASE("flops: activation checkpointing adds each recomputed block's forward but its down projection",
          "[flops][checkpointing]") {
    // Per block forward, the hand-built config above: 2·(576 − Wdown 96) = 960, attention
    // 4·H·d·T = 4·2·6·5 = 240 at T = 5 → 1200 per recomputed block.
    const auto c = hand_built(false);
    CHECK(pv::recompute_flops_per_token(c, 5, {}) == 0.0);
    CHECK(pv::recompute_flops_per_token(c, 5, {true, 0}) == 2400.0);  // both blocks
    CHECK(pv::recompute_flops_per_token(c, 5, {true, 2}) == 1200.0);  // block 1 keeps its activations
    CHECK(pv::recompute_flops_per_token(c, 5, {true, 3}) == 2400.0);  // block 2 would keep: there is none
}

TEST_CASE("flops: a tied lm_head still counts; the embedding and norms never do", "[flops]") {
    const auto untied = hand_built(false), tied = hand_built(true);
    CHECK(pv::matmul_parameter_count(tied) == pv::matmul_parameter_count(untied));
    CHECK(pv::training_flops_per_token(tied, 7) == pv::training_flops_per_token(untied, 7));
    // Against config.h's count of stored parameters: untied = N + embedding 10·8 + norms
    // (2 per block + final) 5·8 = 1232 + 80 + 40; tied = N + 40 (the head is the embedding).
    CHECK(pv::parameter_count(untied) == 1352);
    CHECK(pv::parameter_count(tied) == 1272);
    for (const char* name : {"smollm2-135m", "llama-3.2-1b", "stories260K"}) {
        const auto& c = pv::preset(name);
        INFO(name);
        REQUIRE(c.tie_embeddings);
        const double h = c.hidden_size, norms = (2.0 * c.num_layers + 1) * h;
        // Stored: embedding (= lm_head) + matmuls except lm_head + norms.
        CHECK(pv::matmul_parameter_count(c) == double(pv::parameter_count(c)) - norms);
    }
}

TEST_CASE("flops: Llama-2-7B and Llama-3.1-8B from their published shapes", "[flops]") {
    SECTION("Llama-2-7B: 32 layers, hidden 4096, 32 heads of 128, ffn 11008, vocab 32000") {
        // Per block: Wq, Wk, Wv, Wo 4·4096·4096 = 67,108,864; MLP 3·4096·11008 = 135,266,304;
        // sum 202,375,168; ×32 = 6,476,005,376; lm_head 32000·4096 = 131,072,000.
        const double n = 6476005376.0 + 131072000.0;  // 6,607,077,376
        // The same from the published size, 6,738,415,616 parameters (meta-llama/Llama-2-7b-hf):
        // minus the embedding 131,072,000 and the RMSNorm weights (2·32 + 1)·4096 = 266,240.
        CHECK(n == 6738415616.0 - 131072000.0 - 266240.0);
        const auto& c = pv::preset("llama-2-7b");
        CHECK(pv::matmul_parameter_count(c) == n);
        // At T = 4096: 6N = 39,642,464,256; 12·32·32·128·4096 = 6,442,450,944; total
        // 46,084,915,200 ≈ 4.6e10 FLOPs per token (the attention term is 14% of it).
        CHECK(pv::training_flops_per_token(c, 4096) == 46084915200.0);
        CHECK(6 * n + 6442450944.0 == 46084915200.0);
        // At T = 2048 the attention term halves: 39,642,464,256 + 3,221,225,472.
        CHECK(pv::training_flops_per_token(c, 2048) == 42863689728.0);
    }
    SECTION("Llama-3.1-8B: GQA with 8 KV heads of 128, ffn 14336, vocab 128256") {
        // Per block: Wq and Wo 2·4096·4096 = 33,554,432; Wk and Wv 2·1024·4096 = 8,388,608;
        // MLP 3·14336·4096 = 176,160,768; sum 218,103,808; ×32 = 6,979,321,856;
        // lm_head 128256·4096 = 525,336,576.
        const double n = 6979321856.0 + 525336576.0;  // 7,504,658,432
        // From the published 8,030,261,248 (meta-llama/Llama-3.1-8B): minus the embedding and the
        // 65 RMSNorm weights of 4096.
        CHECK(n == 8030261248.0 - 525336576.0 - 266240.0);
        const auto& c = pv::preset("llama-3.1-8b");
        CHECK(pv::matmul_parameter_count(c) == n);
        // At T = 8192: 6N = 45,027,950,592; 12·32·32·128·8192 = 12,884,901,888 (query heads, not KV).
        CHECK(pv::training_flops_per_token(c, 8192) == 57912852480.0);
    }
}

TEST_CASE("flops: dense bf16 peaks match NVIDIA's published figures", "[flops]") {
    // A100: 108 SMs at 1410 MHz, 312 TFLOPS; exactly 108 · 1.41e9 · 2048 = 311,869,440,000,000.
    const double a100 = pv::dense_bf16_peak_flops(8, 0, 108, 1410000);
    CHECK(within(a100, 312e12, 0.005));
    CHECK(a100 == 311869440000000.0);
    // H100 SXM5: 132 SMs at 1830 MHz, 989.4 TFLOPS; H100 PCIe: 114 SMs at 1620 MHz, 756 TFLOPS.
    CHECK(within(pv::dense_bf16_peak_flops(9, 0, 132, 1830000), 989.4e12, 0.005));
    CHECK(within(pv::dense_bf16_peak_flops(9, 0, 114, 1620000), 756e12, 0.005));
    // Ampere and Ada data-center datasheets: A10 72 SMs at 1695 MHz, 125 TFLOPS; A40 84 at
    // 1740 MHz, 149.7; L4 58 at 2040 MHz, 121 (242 with sparsity); L40S 142 at 2490 MHz, 362.05.
    CHECK(within(pv::dense_bf16_peak_flops(8, 6, 72, 1695000), 125e12, 0.005));
    CHECK(within(pv::dense_bf16_peak_flops(8, 6, 84, 1740000), 149.7e12, 0.005));
    CHECK(within(pv::dense_bf16_peak_flops(8, 9, 58, 2040000), 121e12, 0.005));
    CHECK(within(pv::dense_bf16_peak_flops(8, 9, 142, 2490000), 362.05e12, 0.005));
    // Linear in the SM count and the clock.
    CHECK(pv::dense_bf16_peak_flops(9, 0, 66, 1830000) * 2 == pv::dense_bf16_peak_flops(9, 0, 132, 1830000));
    CHECK(pv::dense_bf16_peak_flops(8, 0, 108, 705000) * 2 == a100);
}

TEST_CASE("flops: unknown architectures have no peak", "[flops]") {
    CHECK(pv::dense_bf16_peak_flops(7, 0, 80, 1530000) == 0.0);    // V100: no bf16 tensor cores
    CHECK(pv::dense_bf16_peak_flops(7, 5, 40, 1590000) == 0.0);    // T4
    CHECK(pv::dense_bf16_peak_flops(8, 7, 16, 1300000) == 0.0);    // Jetson Orin: no published rate used
    CHECK(pv::dense_bf16_peak_flops(9, 1, 132, 1830000) == 0.0);   // no such part
    CHECK(pv::dense_bf16_peak_flops(10, 0, 148, 1965000) == 0.0);  // B200: no published tensor clock
    CHECK(pv::dense_bf16_peak_flops(12, 0, 170, 2600000) == 0.0);  // consumer Blackwell
    CHECK(pv::dense_bf16_peak_flops(0, 0, 1, 1) == 0.0);
}

TEST_CASE("flops: rejections name the argument and the fix", "[flops]") {
    expect_rejected([] { (void)pv::training_flops_per_token(hand_built(false), 0); },
                    {"training_flops_per_token", "seq_len = 0", "must be positive"});
    expect_rejected([] { (void)pv::training_flops_per_token(hand_built(false), -3); }, {"seq_len = -3"});
    auto broken = hand_built(false);
    broken.num_kv_heads = 0;
    expect_rejected([&] { (void)pv::matmul_parameter_count(broken); }, {"hand", "num_kv_heads = 0"});
    expect_rejected([&] { (void)pv::training_flops_per_token(broken, 8); }, {"hand", "num_kv_heads = 0"});
    expect_rejected([] { (void)pv::dense_bf16_peak_flops(9, 0, 0, 1830000); },
                    {"dense_bf16_peak_flops", "sm_count = 0", "must both be positive"});
    expect_rejected([] { (void)pv::dense_bf16_peak_flops(8, 0, 108, -1); }, {"clock_khz = -1"});
    // Checked before the architecture: a zero clock is a caller's bug even on an unknown GPU.
    expect_rejected([] { (void)pv::dense_bf16_peak_flops(7, 0, 80, 0); }, {"clock_khz = 0"});
}
