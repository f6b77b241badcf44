// Activation checkpointing (model/llama.h ActivationCheckpointing) on one rank: a model whose
// blocks recompute their forward before their backward gives bitwise the loss and gradients of the
// plain model — fp64, fp32 and bf16, full fine-tuning, LoRA with dropout (its Philox mask drawn
// again in the recompute) and QLoRA (NF4) — with two micro-batches in flight in two slots, so the
// second forward overwrites the recompute arena the first one's backward must fill again. And
// the activation memory it holds: what activation_arenas predicts, which the test derives
// independently from the per-unit layouts, and less than without checkpointing.
// The multi-rank strategies (zero3, mp with GPipe, ...) are tested in test/mpi/test_mpi_parallel.cu.
#include "model/llama.h"
#include "model/unit_loop.h"
#include "test/check.h"

#include <cstring>
#include <random>

using namespace pv::test;

namespace checkpointing_test {

constexpr int kB = 2, kT = 8;
const pv::StageUnits kWholeTwoSlots{0, -1, 2};  // every unit, two micro-batches in flight

struct Result {
    std::vector<std::vector<unsigned char>> loss_bits;  // per slot: the loss sum's bytes
    std::vector<std::vector<unsigned char>> grads;      // per unit: the trainable group's gradient bytes
    size_t activations = 0;                             // the activations category's peak while the model lived
};

template <class T>
std::vector<unsigned char> bytes_of(const T* device, size_t n) {
    std::vector<unsigned char> out(n * sizeof(T));
    CUDA_CHECK(cudaMemcpy(out.data(), device, out.size(), cudaMemcpyDeviceToHost));
    return out;
}

// Two micro-batches as GPipe runs them (forward 0, forward 1, backward 0, backward 1), their
// gradients accumulated; random tokens, some targets ignored, the LoRA dropout keyed by step 3.
template <class T>
Result run(const pv::LlamaConfig& c, pv::ModelOptions o, const pv::ActivationCheckpointing& checkpointing) {
    o.batch = kB, o.seq_len = kT, o.seed = 11, o.placement.chunks = {kWholeTwoSlots}, o.checkpointing = checkpointing;
    const size_t before = pv::memory_stats().current[size_t(pv::MemoryCategory::activations)];
    pv::reset_memory_peaks();
    Result r;
    {
        pv::Llama<T> m(c, o);
        std::mt19937_64 rng(5);
        std::vector<std::unique_ptr<DeviceArray<int>>> arrays;
        std::vector<pv::DeviceBatch> batches;
        for (int s = 0; s < 2; ++s) {
            std::vector<int> tokens(kB * kT), targets(kB * kT);
            for (int i = 0; i < kB * kT; ++i) {
                tokens[size_t(i)] = int(rng() % uint64_t(c.vocab_size));
                targets[size_t(i)] = rng() % 4 == 0 ? pv::kIgnoreIndex : int(rng() % uint64_t(c.vocab_size));
            }
            arrays.push_back(std::make_unique<DeviceArray<int>>(tokens));
            arrays.push_back(std::make_unique<DeviceArray<int>>(targets));
            batches.push_back(pv::DeviceBatch{arrays[arrays.size() - 2]->get(), arrays.back()->get(), nullptr,
                                              (long long)s * kB * kT, 3});
        }
        DeviceArray<pv::acc_t<T>> loss(2);
        DeviceArray<int> count(2);
        m.zero_grads();
        for (int s = 0; s < 2; ++s) pv::single_forward(m, s, batches[size_t(s)], loss.get() + s, count.get() + s);
        for (int s = 0; s < 2; ++s) pv::single_backward(m, s, batches[size_t(s)], 1.0 / 20);
        CUDA_CHECK(cudaDeviceSynchronize());
        for (int s = 0; s < 2; ++s) r.loss_bits.push_back(bytes_of(loss.get() + s, 1));
        for (int u = 0; u < m.num_units(); ++u)
            r.grads.push_back(m.grads(u) ? bytes_of(m.grads(u), size_t(m.trainable(u).padded))
                                         : std::vector<unsigned char>{});
        r.activations = pv::memory_stats().peak[size_t(pv::MemoryCategory::activations)] - before;
    }
    return r;
}

pv::ActivationCheckpointing every_block() { return {true, 0}; }
pv::ActivationCheckpointing keep_every(int n) { return {true, n}; }

// The loss and every gradient bit for bit the plain model's, for each policy; and a gradient
// that is not all zeros (identical zeros would prove nothing).
template <class T>
void check_bitwise(const pv::LlamaConfig& c, const pv::ModelOptions& o) {
    const Result plain = run<T>(c, o, {});
    bool moved = false;
    for (const auto& g : plain.grads)
        for (unsigned char b : g) moved |= b != 0;
    REQUIRE(moved);
    // auto's choice too: the first block, the first two (pv::ActivationCheckpointing::first_blocks).
    for (const pv::ActivationCheckpointing& policy : {every_block(), keep_every(2), keep_every(3),
                                                      pv::ActivationCheckpointing{true, 0, 1},
                                                      pv::ActivationCheckpointing{true, 0, 2}}) {
        INFO("keep_every " << policy.keep_every << ", first blocks " << policy.first_blocks);
        const Result ckpt = run<T>(c, o, policy);
        CHECK(ckpt.loss_bits == plain.loss_bits);
        REQUIRE(ckpt.grads.size() == plain.grads.size());
        for (size_t u = 0; u < plain.grads.size(); ++u) {
            INFO("unit " << u);
            CHECK(ckpt.grads[u] == plain.grads[u]);
        }
        if (policy.first_blocks != 1) CHECK(ckpt.activations < plain.activations);  // one block: the same bytes
        else CHECK(ckpt.activations <= plain.activations);
    }
}

pv::ModelOptions lora_options(bool nf4) {
    pv::ModelOptions o;
    o.lora.rank = 3, o.lora.alpha = 6, o.lora.dropout = 0.25;
    o.lora.targets = {"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"};
    o.nf4 = nf4;
    return o;
}

}  // namespace checkpointing_test

using namespace checkpointing_test;

TEST_CASE("checkpointed blocks give bitwise the plain model's loss and gradients: fp64, fp32, bf16",
          "[model][checkpointing]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");  // 3 blocks: keep_every 2 keeps block 1 only
    check_bitwise<double>(c, {});
    check_bitwise<float>(c, {});
    check_bitwise<__nv_bfloat16>(c, {});
}

TEST_CASE("checkpointing with LoRA (dropout on) and QLoRA (NF4) is bitwise the plain model", "[model][checkpointing]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    check_bitwise<double>(c, lora_options(false));
    check_bitwise<__nv_bfloat16>(c, lora_options(false));
    check_bitwise<__nv_bfloat16>(c, lora_options(true));
    check_bitwise<float>(c, lora_options(true));
}

// Measured against a figure the test derives from the per-unit layouts alone: the embedding's
// and the head's arenas and each kept block's per slot, a recomputed block's output per slot, and
// one block arena without its output for all recomputed blocks together.
TEST_CASE("checkpointing holds the activations activation_arenas predicts: kept inputs plus one block's arena",
          "[model][checkpointing][memory]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    for (const pv::ModelOptions& o : {pv::ModelOptions{}, lora_options(false)}) {
        const pv::DType dt = pv::DType::fp32;
        auto bytes = [&](pv::UnitKind kind) {
            return pv::arena_bytes(pv::activation_layout(c, kind, kB, kT, dt, o.lora));
        };
        const size_t embedding = bytes(pv::UnitKind::embedding), head = bytes(pv::UnitKind::head),
                     block = bytes(pv::UnitKind::block);
        const size_t out = size_t(kB) * kT * size_t(c.hidden_size) * 4, out_aligned = (out + 255) / 256 * 256;
        const size_t plain = 2 * (embedding + head + 3 * block);
        const size_t every = 2 * (embedding + head + 3 * out) + (block - out_aligned);
        const size_t keep2 = 2 * (embedding + head + 2 * out + block) + (block - out_aligned);
        INFO("LoRA " << o.lora.enabled() << ": plain " << plain << ", every block " << every << ", keep every 2 "
                     << keep2);
        CHECK(pv::activation_arenas(c, kB, kT, dt, o.lora, {}, kWholeTwoSlots).total() == plain);
        CHECK(pv::activation_arenas(c, kB, kT, dt, o.lora, every_block(), kWholeTwoSlots).total() == every);
        CHECK(pv::activation_arenas(c, kB, kT, dt, o.lora, keep_every(2), kWholeTwoSlots).total() == keep2);
        CHECK(pv::activation_arenas(c, kB, kT, dt, o.lora, keep_every(1), kWholeTwoSlots).total() ==
              plain);  // keeps all
        CHECK(run<float>(c, o, {}).activations == plain);
        CHECK(run<float>(c, o, every_block()).activations == every);
        CHECK(run<float>(c, o, keep_every(2)).activations == keep2);
        CHECK(every < plain);
    }
}

TEST_CASE("a stage allocates arenas for its own units only, the recompute arena when one of them recomputes",
          "[model][checkpointing][memory]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");  // units: embedding, blocks 0-2 (units 1-3), head
    const pv::DType dt = pv::DType::bf16;
    const pv::ActivationArenas a = pv::activation_arenas(c, kB, kT, dt, {}, keep_every(2), pv::StageUnits{2, 3, 3});
    REQUIRE(a.slot_bytes.size() == 5);
    CHECK(a.slot_bytes[0] == 0);
    CHECK(a.slot_bytes[1] == 0);
    CHECK(a.slot_bytes[2] == pv::arena_bytes(pv::activation_layout(c, pv::UnitKind::block, kB, kT, dt)));  // kept
    CHECK(a.slot_bytes[3] == 0);
    CHECK(a.recompute_bytes == 0);  // block 1 keeps its arena: nothing to recompute on this stage
    CHECK(a.total() == 3 * a.slot_bytes[2]);
    const pv::ActivationArenas b = pv::activation_arenas(c, kB, kT, dt, {}, keep_every(2), pv::StageUnits{3, -1, 3});
    CHECK(b.slot_bytes[3] == size_t(kB) * kT * size_t(c.hidden_size) * 2);  // block 2's output (a multiple of 256)
    CHECK(b.recompute_bytes > 0);
}
