// The performance model's bytes, held against the kernels' own accesses: each kernel of a
// training step runs on the host with every memory access of its code instrumented
// (host/access_meter.h; this file is compiled with -fsanitize=kernel-address callbacks), and the
// distinct device bytes it reads and writes must equal the formula of model/step_cost.h exactly.
// A kernel that reads a buffer twice from DRAM where the model says once, or a formula that
// forgets a buffer, fails here.
//
// Host flavour only (the Makefile builds it there): the instrumentation is GCC's, and the binary
// links no product object that instantiates kernels, so the instrumented copies are the ones run.
#include "host/access_meter.h"
#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/embedding.cuh"
#include "kernels/glue.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"
#include "model/step_cost.h"
#include "optim/adamw.cuh"
#include "test/check.h"

#include <set>

namespace {

using pv::KernelCost;
using pv::host::LaunchTraffic;
using pv::test::DeviceArray;
using pv::test::random_vector;
using bf16 = __nv_bfloat16;

// "void pv::rmsnorm_forward_kernel<__nv_bfloat16>(...)" -> "rmsnorm_forward_kernel".
std::string base_name(const std::string& demangled) {
    std::string s = demangled.substr(0, demangled.find_first_of("<("));
    if (const size_t colon = s.rfind("::"); colon != std::string::npos) s = s.substr(colon + 2);
    if (const size_t space = s.rfind(' '); space != std::string::npos) s = s.substr(space + 1);
    return s;
}

// Runs `work` under the meter and checks its launches, in order, against `predicted`; returns them.
template <class F>
std::vector<LaunchTraffic> check_traffic(const std::vector<KernelCost>& predicted, F&& work) {
    CUDA_CHECK(cudaDeviceSynchronize());
    pv::host::access_meter_start();
    work();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<LaunchTraffic> got = pv::host::access_meter_stop();
    REQUIRE(got.size() == predicted.size());
    for (size_t i = 0; i < got.size(); ++i) {
        INFO("launch " << i << ": " << got[i].kernel << " (" << predicted[i].op << ")");
        CHECK(base_name(got[i].kernel) == predicted[i].kernel);
        CHECK(double(got[i].read_bytes) == predicted[i].read_bytes);
        CHECK(double(got[i].written_bytes) == predicted[i].written_bytes);
        CHECK(got[i].accessed_bytes >= got[i].read_bytes + got[i].written_bytes);
    }
    return got;
}

template <class T>
std::vector<T> random_of(size_t n, uint64_t seed) {
    return random_vector<T>(n, seed);
}

constexpr int t = 2, a = 4;  // bf16 and its float accumulator

}  // namespace

TEST_CASE("the meter sees exactly the bytes a kernel touches", "[traffic]") {
    // A plain copy of 1000 floats through the platform: the platform reports it itself.
    DeviceArray<float> x(random_of<float>(1000, 1)), y(1000);
    CUDA_CHECK(cudaDeviceSynchronize());
    pv::host::access_meter_start();
    CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), 400, cudaMemcpyDeviceToDevice, nullptr));
    CUDA_CHECK(cudaMemsetAsync(y.get() + 500, 0, 40, nullptr));
    pv::add(x.get(), x.get() + 1, y.get(), 10, nullptr);  // reads x[0..11), writes y[0..10)
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = pv::host::access_meter_stop();
    REQUIRE(got.size() == 3);
    CHECK(got[0].kernel == "memcpy");
    CHECK(got[0].read_bytes == 400);
    CHECK(got[0].written_bytes == 400);
    CHECK(got[1].written_bytes == 40);
    CHECK(base_name(got[2].kernel) == "elementwise_kernel");
    CHECK(got[2].read_bytes == 11 * 4);  // overlapping reads count once
    CHECK(got[2].written_bytes == 10 * 4);
    CHECK(got[2].accessed_bytes == 30 * 4);
}

TEST_CASE("rmsnorm, swiglu, rope and add move the bytes the model says", "[traffic]") {
    const long long N = 37;
    const int C = 96, F = 80;
    DeviceArray<bf16> x(random_of<bf16>(N * C, 2)), w(random_of<bf16>(C, 3)), y(N * C), s(N * C),
        dy(random_of<bf16>(N * C, 4));
    DeviceArray<float> rstd(N);
    DeviceArray<unsigned char> scratch(pv::rmsnorm_backward_scratch_bytes<bf16>(N, C));
    DeviceArray<bf16> dw(random_of<bf16>(C, 5)), dx(N * C), dres(random_of<bf16>(N * C, 6));
    check_traffic(pv::cost::rmsnorm_forward(N, C, t, a),
                  [&] { pv::rmsnorm_forward(x.get(), w.get(), y.get(), rstd.get(), N, C, 1e-5, nullptr); });
    check_traffic(pv::cost::residual_rmsnorm_forward(N, C, t, a), [&] {
        pv::residual_rmsnorm_forward(x.get(), dy.get(), s.get(), w.get(), y.get(), rstd.get(), N, C, 1e-5, nullptr);
    });
    DeviceArray<bf16> copy(N * C);  // the block's output, started from the sum (model/llama.cu)
    check_traffic(pv::cost::residual_rmsnorm_forward(N, C, t, a, true), [&] {
        pv::residual_rmsnorm_forward(x.get(), dy.get(), s.get(), w.get(), y.get(), rstd.get(), N, C, 1e-5, nullptr,
                                     copy.get());
    });
    check_traffic(pv::cost::rmsnorm_backward(N, C, t, a, true), [&] {
        pv::rmsnorm_backward(x.get(), w.get(), rstd.get(), dy.get(), dres.get(), dx.get(), dw.get(), scratch.get(), N,
                             C, nullptr);
    });
    DeviceArray<bf16> gu(random_of<bf16>(N * 2 * F, 7)), h(N * F), dh(random_of<bf16>(N * F, 8)), dgu(N * 2 * F);
    check_traffic(pv::cost::swiglu_forward(N, F, t), [&] { pv::swiglu_forward(gu.get(), h.get(), N, F, nullptr); });
    check_traffic(pv::cost::swiglu_backward(N, F, t),
                  [&] { pv::swiglu_backward(gu.get(), dh.get(), dgu.get(), N, F, nullptr); });
    const int H = 3, Hkv = 1, hd = 16, T = N;
    const int width = (H + 2 * Hkv) * hd;
    DeviceArray<bf16> qkv(random_of<bf16>(N * width, 9));
    std::vector<double> inv_freq(hd / 2);
    for (int i = 0; i < hd / 2; ++i) inv_freq[size_t(i)] = std::pow(10000.0, -2.0 * i / hd);
    // A table of more positions than the rows use: only the rows' positions are read.
    const int P = T + 9;
    DeviceArray<float> table_values(pv::rope_table_values<float>(inv_freq, P));
    const pv::RopeTable<float> table{table_values.get(), P, hd};
    check_traffic(pv::cost::rope(N, H, hd, t, a, false, T),
                  [&] { pv::rope_forward(qkv.get(), table, nullptr, N, T, H, hd, width, nullptr); });
    check_traffic(pv::cost::add(N * C, t), [&] { pv::add(x.get(), dy.get(), y.get(), N * C, nullptr); });
}

namespace {
// An attention call's buffers at B × T with H query and Hkv KV heads of hd: qkv and dout random,
// the outputs, the backward's scratch, and positions of documents of 23 tokens.
struct AttentionBuffers {
    AttentionBuffers(int B, int T, int H, int Hkv, int hd, uint64_t seed)
        : N((long long)B * T),
          qkv(random_of<bf16>(N * (H + 2 * Hkv) * hd, seed)),
          out(N * H * hd),
          dout(random_of<bf16>(N * H * hd, seed + 1)),
          dqkv(N * (H + 2 * Hkv) * hd),
          lse(N * H),
          scratch(pv::attention_scratch_bytes<bf16>(B, T, H, Hkv, hd)),
          pos(documents(N, T)) {}
    static std::vector<int> documents(long long N, int T) {
        std::vector<int> positions(static_cast<size_t>(N));
        for (long long i = 0; i < N; ++i) positions[size_t(i)] = int(i % T) % 23;
        return positions;
    }
    long long N;
    DeviceArray<bf16> qkv, out, dout, dqkv;
    DeviceArray<float> lse;
    DeviceArray<unsigned char> scratch;
    DeviceArray<int> pos;
};
}  // namespace

TEST_CASE("attention moves the bytes the model says, with and without document masks", "[traffic]") {
    const int B = 2, T = 70, H = 4, Hkv = 2, hd = 64;
    AttentionBuffers x(B, T, H, Hkv, hd, 11);
    auto &qkv = x.qkv, &out = x.out, &dout = x.dout, &dqkv = x.dqkv;
    auto& lse = x.lse;
    auto& pos = x.pos;
    auto& scratch = x.scratch;
    for (const bool masked : {false, true}) {
        INFO("document masks: " << masked);
        const int* p = masked ? pos.get() : nullptr;
        check_traffic(pv::cost::attention_forward(B, T, H, Hkv, hd, t, a, masked), [&] {
            pv::attention_forward(qkv.get(), p, out.get(), lse.get(), scratch.get(), B, T, H, Hkv, hd, nullptr);
        });
        check_traffic(pv::cost::attention_forward_cuda_cores(B, T, H, Hkv, hd, t, a, masked), [&] {
            pv::attention_forward_launch<bf16, 64>(qkv.get(), p, out.get(), lse.get(), B, T, H, Hkv, hd, nullptr);
        });
        check_traffic(pv::cost::attention_backward(B, T, H, Hkv, hd, t, a, masked), [&] {
            pv::attention_backward(qkv.get(), p, out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), B, T, H,
                                   Hkv, hd, nullptr);
        });
        check_traffic(pv::cost::attention_backward_cuda_cores(B, T, H, Hkv, hd, t, a, masked), [&] {
            pv::attention_backward_cuda_cores(qkv.get(), p, dout.get(), lse.get(),
                                              static_cast<const float*>(static_cast<void*>(scratch.get())), dqkv.get(),
                                              B, T, H, Hkv, hd, nullptr);
        });
    }
}

// A grid every tensor-core kernel splits (kernels/attention_mma_blocks.h: B 1, T 600, H 2, Hkv 1,
// L 8 for each): their blocks write fp32 partials for the split tiles (the forward's and dQ's include
// the last, ragged query tile: the rows before T), which a kernel after each reads and merges into
// their rows.
TEST_CASE("the split forward, dK/dV and dQ move the bytes the model says", "[traffic]") {
    const int B = 1, T = 600, H = 2, Hkv = 1, hd = 64;
    REQUIRE(pv::attention_mma_dkv_segment_steps(B, T, H, Hkv, hd) == 8);
    REQUIRE(pv::attention_mma_query_segment_steps(B, T, H, hd) == 8);
    AttentionBuffers x(B, T, H, Hkv, hd, 21);
    auto &qkv = x.qkv, &out = x.out, &dout = x.dout, &dqkv = x.dqkv;
    auto& lse = x.lse;
    auto& pos = x.pos;
    auto& scratch = x.scratch;
    for (const bool masked : {false, true}) {  // (with documents some segments have no steps: zeros)
        INFO("document masks: " << masked);
        const int* p = masked ? pos.get() : nullptr;
        const std::vector<KernelCost> forward = pv::cost::attention_forward(B, T, H, Hkv, hd, t, a, masked);
        REQUIRE(forward.size() == 2);
        CHECK(forward[1].kernel == "attention_mma_forward_combine_kernel");
        check_traffic(forward, [&] {
            pv::attention_forward(qkv.get(), p, out.get(), lse.get(), scratch.get(), B, T, H, Hkv, hd, nullptr);
        });
        const std::vector<KernelCost> predicted = pv::cost::attention_backward(B, T, H, Hkv, hd, t, a, masked);
        REQUIRE(predicted.size() == 5);
        CHECK(predicted[2].kernel == "attention_mma_reduce_kernel");
        CHECK(predicted[4].kernel == "attention_mma_reduce_kernel");
        check_traffic(predicted, [&] {
            pv::attention_backward(qkv.get(), p, out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), B, T, H,
                                   Hkv, hd, nullptr);
        });
    }
}

// dK/dV with warps of 32 keys (kernels/attention_mma_blocks.h attention_mma_dkv_row_tiles) runs where
// the device holds four of its 2-warp blocks an SM (the host reports an H100's shared memory) and the
// grid is large enough: 480 one-tile (batch, KV head) rows, the heaviest block's one step against a
// slot's share of 480 / 528. There the model prices that kernel and the public path launches it (the
// launch's template arguments name its row tiles), moving the bytes the model says; a grid half as
// large keeps 16 keys in both.
TEST_CASE("dK/dV's warps of 32 keys: where the model prices them, the public path launches them", "[traffic]") {
    const int T = 64, H = 8, Hkv = 8, hd = 64;
    for (const int B : {60, 30}) {
        INFO("B " << B);
        const int row_tiles = pv::attention_mma_dkv_row_tiles(hd, pv::device_shared_bytes_per_block(), B, T, H, Hkv);
        REQUIRE(row_tiles == (B == 60 ? 2 : 1));
        CHECK(std::string(pv::cost::attention_dkv_kind(hd, pv::Device{}, B, T, H, Hkv)) ==
              (row_tiles == 2 ? "dkv-32rows" : "dkv"));
        AttentionBuffers x(B, T, H, Hkv, hd, 23);
        const std::vector<KernelCost> predicted = pv::cost::attention_backward(B, T, H, Hkv, hd, t, a, false);
        const std::vector<LaunchTraffic> got = check_traffic(predicted, [&] {
            pv::attention_backward(x.qkv.get(), nullptr, x.out.get(), x.dout.get(), x.lse.get(), x.dqkv.get(),
                                   x.scratch.get(), B, T, H, Hkv, hd, nullptr);
        });
        REQUIRE(got.size() == 3);
        INFO(got[1].kernel);
        CHECK(base_name(got[1].kernel) == "attention_mma_dkv_kernel");
        CHECK(got[1].kernel.find("false, " + std::to_string(row_tiles) + ">(") != std::string::npos);
    }
}

TEST_CASE("cross-entropy, embedding, the norm and AdamW move the bytes the model says", "[traffic]") {
    const long long N = 45;
    const int V = 301, C = 64;  // V + 3 = 304: a multiple of the 16-byte width
    std::vector<int> targets(static_cast<size_t>(N)), tokens(static_cast<size_t>(N));
    std::set<int> distinct;
    for (long long i = 0; i < N; ++i) {
        targets[size_t(i)] = int((i * 37) % V);
        tokens[size_t(i)] = int((i * i) % 29);  // repeats: the table's rows are read once each
        distinct.insert(tokens[size_t(i)]);
    }
    DeviceArray<int> d_targets(targets), d_tokens(tokens), count(1);
    for (const int vocab : {V, V + 3}) {  // the scalar path, then the 16-byte one
        INFO("vocabulary " << vocab);
        DeviceArray<bf16> logits(random_of<bf16>(N * vocab, 13));
        DeviceArray<float> row_loss(N), loss(1), stats(2 * N);
        auto* row_stats = reinterpret_cast<pv::CrossEntropyStats<float>*>(stats.get());
        check_traffic(pv::cost::cross_entropy_forward(N, vocab, t, a), [&] {
            pv::cross_entropy_forward(logits.get(), d_targets.get(), row_loss.get(), row_stats, loss.get(), count.get(),
                                      N, vocab, -100, nullptr);
        });
        check_traffic(pv::cost::cross_entropy_backward(N, vocab, t, a), [&] {
            pv::cross_entropy_backward(logits.get(), d_targets.get(), row_stats, logits.get(), N, vocab, -100, 0.01,
                                       nullptr);
        });
        std::vector<KernelCost> one_pass = pv::cost::cross_entropy_loss_and_gradient(N, vocab, t, a);
        for (const KernelCost& k : pv::cost::cross_entropy_sum(N, a)) one_pass.push_back(k);
        check_traffic(one_pass, [&] {
            pv::cross_entropy_loss_and_gradient(logits.get(), d_targets.get(), row_loss.get(), row_stats, N, vocab,
                                                -100, 0.01, nullptr);
            pv::cross_entropy_sum<bf16>(row_loss.get(), d_targets.get(), loss.get(), count.get(), N, -100, nullptr);
        });
    }
    check_traffic(pv::cost::count_targets(N),
                  [&] { pv::count_targets(d_targets.get(), N, -100, count.get(), nullptr); });
    const long long U = (long long)distinct.size();
    DeviceArray<bf16> wte(random_of<bf16>(size_t(V) * C, 14)), emb(N * C), demb(random_of<bf16>(N * C, 15));
    DeviceArray<unsigned char> emb_scratch(pv::embedding_backward_scratch_bytes(N));
    check_traffic(pv::cost::embedding_forward(N, C, U, t),
                  [&] { pv::embedding_forward(d_tokens.get(), wte.get(), emb.get(), N, C, V, nullptr); });
    check_traffic(pv::cost::embedding_backward(N, C, U, t), [&] {
        pv::embedding_backward(d_tokens.get(), demb.get(), wte.get(), N, C, V, emb_scratch.get(), nullptr);
    });

    const long long n = 5000;  // three partial blocks
    DeviceArray<bf16> g(random_of<bf16>(n, 16)), p(random_of<bf16>(n, 17));
    DeviceArray<double> norm(1);
    DeviceArray<unsigned char> norm_scratch(pv::sum_of_squares_scratch_bytes<bf16>(n));
    check_traffic(pv::cost::sum_of_squares(n, t, true),
                  [&] { pv::sum_of_squares_accumulate(g.get(), n, norm.get(), norm_scratch.get(), nullptr); });
    DeviceArray<float> master(random_of<float>(n, 18)), m(random_of<float>(n, 19)),
        v(random_vector<float>(n, 20, 0.1, 1.0));
    pv::AdamWStep h;
    h.lr = 1e-3;
    h.t = 3;
    // An owned range of two tensor pieces with padding between them, which is never touched.
    const pv::AdamWTable table({{0, 3000, 17, 1, true}, {3072, 4990, 0, 2, false}});
    static_assert(sizeof(pv::AdamWSlot) == 40, "the model counts 40 bytes per slot");
    DeviceArray<double> scale(std::vector<double>{0.5});
    check_traffic(pv::cost::adamw(3000 + 1918, t, t, a, 2), [&] {
        pv::adamw_update_group<bf16, bf16>(p.get(), master.get(), g.get(), m.get(), v.get(), table, h, false,
                                           scale.get(), false, 0, nullptr);
    });
}
