// Tensor parallelism in the model (model/tensor_parallel.h, Llama's tensor_reduce seam) against
// the whole model on one rank: every rank of the job is one rank of a tensor-parallel group of the
// world's size. From the same seed, in fp64, each rank's slice of every block tensor starts equal
// to the whole tensor's elements there; after two micro-batches forward and backward (random
// tokens, ignored targets) the loss equals the whole model's within 1e-12 relative, and every
// gradient — a slice's against the whole gradient's elements, the replicated embedding, norms and
// head against theirs — within 1e-10 relative to the gradient's largest element. Multi-head and
// grouped-query attention, tied and untied embeddings, with and without activation checkpointing;
// LoRA on every linear with dropout (the adapters' B set to values keyed by their whole index, so
// that A's gradient is not zero: a replicated A or B's gradient shares summed over the group, each
// row-parallel input's mask keyed as the whole input's), alone and with checkpointing. Replicated
// key/value heads (T above or not dividing them): their rows' gradient shares summed over the group.
// Sequence parallelism (the residual stream's rows split over the group, gathered and
// reduce-scattered at the regions' borders, the norms' weight gradients summed): the same checks,
// with and without checkpointing, LoRA and replicated kv heads. QLoRA: the same checks on an NF4
// base whose modules each rank holds whole blocks of (the loss proves the dequantised slices are the
// whole modules' values there).
#include <catch2/catch.hpp>

#include "model/llama.h"
#include "model/lora.h"
#include "model/tensor_parallel.h"
#include "model/unit_loop.h"
#include "parallel/comm_cost.h"
#include "parallel/tensor_parallel.h"
#include "parallel/world.h"
#include "test/check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace tensor_parallel_mpi_test {

using pv::test::DeviceArray;

constexpr int kBatch = 2, kSeq = 7;
constexpr int kSeqSequence = 6;  // sequence parallelism: 12 rows, which 2 and 4 ranks split

// Sizes that split over 2 and 4 ranks but line up with nothing else: head_dim 6 with hidden 20
// (so q width 6·heads ≠ hidden), ffn 28 (7 per rank at 4), a vocabulary of 37.
pv::LlamaConfig model(int kv_heads, bool tied) {
    pv::LlamaConfig c;
    c.name = "tp-test";
    c.vocab_size = 37, c.hidden_size = 20, c.num_layers = 2, c.num_heads = 8, c.num_kv_heads = kv_heads;
    c.head_dim = 6, c.ffn_size = 28, c.max_seq_len = 16, c.tie_embeddings = tied;
    return c;
}

// QLoRA: every slice must hold whole 64-element NF4 blocks of its module (model/nf4_layout.h), so
// the widths are multiples of 64 at 2 and 4 ranks: hidden 128, q width 8·32 = 256 (W_o's columns,
// 64 a rank at 4), ffn 512 (W_down's columns, 128 a rank at 4). The modules span several nested
// blocks of 256 absmaxes (W_down 1,024 blocks, W_o 512), so a row-parallel slice's blocks index
// scales that are not its own.
pv::LlamaConfig qlora_model(int kv_heads) {
    pv::LlamaConfig c = model(kv_heads, false);
    c.name = "tp-qlora-test";
    c.hidden_size = 128, c.head_dim = 32, c.ffn_size = 512;
    return c;
}

struct Run {
    double loss = 0;
    pv::Comm::Totals wire;  // the tensor-parallel group's collectives
    std::vector<std::vector<double>> params, grads;  // per unit: the trainable group
    std::vector<pv::GroupLayout> layouts;            // per unit: the trainable group's layout
};

// The adapters' B (zero at initialisation) set to a value of each element's index in the whole
// tensor, the same whatever slice of it a rank holds.
void set_lora_b(pv::Llama<double>& m) {
    for (int u = 0; u < m.num_units(); ++u)
        for (const pv::TensorSlot& t : m.trainable(u).tensors) {
            if (t.spec.name.find("lora_b") == std::string::npos) continue;
            std::vector<double> v(size_t(t.spec.numel()));
            for (long long i = 0; i < t.spec.numel(); ++i)
                v[size_t(i)] = 0.05 * std::sin(0.37 * double(t.spec.whole_index(i)) + double(t.spec.id));
            CUDA_CHECK(cudaMemcpy(m.params(u) + t.offset, v.data(), v.size() * sizeof(double), cudaMemcpyHostToDevice));
        }
}

// Two micro-batches forward, then backward, gradients accumulated; tensor-parallel when comm is
// given (T = its size), the whole model otherwise. head_chunk > 0: the head's logits that many rows
// at a time, the loss computed in the backward (as the trainer runs it).
Run run(const pv::LlamaConfig& c, pv::Comm* comm, const pv::ActivationCheckpointing& checkpointing,
        const pv::LoraConfig& lora, bool sequence, bool nf4, long long head_chunk) {
    const int seq = sequence ? kSeqSequence : kSeq;
    pv::ModelOptions o = pv::whole_model(kBatch, seq, 17, pv::Gradients::owned, 2);
    o.head_chunk_rows = head_chunk;
    o.checkpointing = checkpointing;
    o.lora = lora;
    o.nf4 = nf4, o.double_quant = true;
    cudaStream_t stream = nullptr;
    if (comm) {
        o.placement.tensor = {comm->size(), comm->rank(), sequence};
        o.tensor_reduce = pv::tensor_group_sum<double>(*comm, stream);
        o.tensor_gather = pv::tensor_group_gather<double>(*comm, stream);
        o.tensor_all_gather = pv::tensor_group_gather<double>(*comm, stream);
        o.tensor_reduce_scatter = pv::tensor_group_reduce_scatter<double>(*comm, stream);
    }
    pv::Llama<double> m(c, o);
    if (lora.enabled()) set_lora_b(m);
    std::mt19937_64 rng(23);  // the same batches on every rank
    std::vector<std::unique_ptr<DeviceArray<int>>> arrays;
    std::vector<pv::DeviceBatch> batches;
    for (int s = 0; s < 2; ++s) {
        std::vector<int> tokens(kBatch * seq), targets(kBatch * seq);
        for (int i = 0; i < kBatch * seq; ++i) {
            tokens[size_t(i)] = int(rng() % uint64_t(c.vocab_size));
            targets[size_t(i)] = rng() % 5 == 0 ? pv::kIgnoreIndex : int(rng() % uint64_t(c.vocab_size));
        }
        arrays.push_back(std::make_unique<DeviceArray<int>>(tokens));
        arrays.push_back(std::make_unique<DeviceArray<int>>(targets));
        batches.push_back(pv::DeviceBatch{arrays[arrays.size() - 2]->get(), arrays.back()->get(), nullptr,
                                          (long long)s * kBatch * seq, 1, head_chunk > 0});
    }
    DeviceArray<double> loss(2);
    DeviceArray<int> count(2);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (comm) comm->clear_log();
    if (comm) {  // as the trainer starts a step (Llama::discard_grads): each tensor's old gradient, NaN
        // here, written over by its first writer — the group sums' copies among them
        for (int u = 0; u < m.num_units(); ++u)
            for (const pv::TensorSlot& t : m.trainable(u).tensors) {
                const std::vector<double> nan(size_t(t.spec.numel()), std::numeric_limits<double>::quiet_NaN());
                CUDA_CHECK(
                    cudaMemcpy(m.grads(u) + t.offset, nan.data(), nan.size() * sizeof(double), cudaMemcpyHostToDevice));
            }
        m.discard_grads();
    } else {
        m.zero_grads();
    }
    for (int s = 0; s < 2; ++s) pv::single_forward(m, s, batches[size_t(s)], loss.get() + s, count.get() + s);
    for (int s = 0; s < 2; ++s) pv::single_backward(m, s, batches[size_t(s)], 1.0 / 20);
    CUDA_CHECK(cudaDeviceSynchronize());
    Run r;
    if (comm) r.wire = comm->totals();
    const std::vector<double> l = loss.download();
    r.loss = l[0] + l[1];
    for (int u = 0; u < m.num_units(); ++u) {
        const pv::GroupLayout& g = m.trainable(u);
        r.layouts.push_back(g);
        std::vector<double> p(size_t(g.padded)), d(size_t(g.padded));
        CUDA_CHECK(cudaMemcpy(p.data(), m.params(u), p.size() * sizeof(double), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(d.data(), m.grads(u), d.size() * sizeof(double), cudaMemcpyDeviceToHost));
        r.params.push_back(std::move(p));
        r.grads.push_back(std::move(d));
    }
    return r;
}

void check_against_whole(const pv::LlamaConfig& c, pv::Comm& comm, const pv::ActivationCheckpointing& ckpt,
                         const pv::LoraConfig& lora = {}, bool sequence = false, bool nf4 = false,
                         long long head_chunk = 0) {
    const Run whole = run(c, nullptr, ckpt, lora, sequence, nf4, 0);
    const Run mine = run(c, &comm, ckpt, lora, sequence, nf4, head_chunk);
    INFO("T = " << comm.size() << ", rank " << comm.rank() << ", kv heads " << c.num_kv_heads
                << (c.tie_embeddings ? ", tied" : ", untied") << (ckpt.enabled ? ", checkpointing" : "")
                << (lora.enabled() ? ", LoRA with dropout" : "") << (nf4 ? " on an NF4 base (QLoRA)" : "")
                << (sequence ? ", sequence parallelism" : "")
                << (head_chunk > 0 ? ", the head's logits " + std::to_string(head_chunk) + " rows at a time" : ""));
    // The group's collectives, as many and as large as the communication model says (parallel/
    // comm_cost.h), and as counted here by hand — all-reduces per block and micro-batch 2 + 2 of
    // rows·hidden, 1 more recomputed, and one per adapter (A of q/k/v and gate/up fused: P·r × C;
    // B of o and down: C × r); per micro-batch the vocabulary-parallel embedding's rows and the
    // head's input gradient (rows·hidden each), and all-gathers of the cross-entropy's partials (3
    // doubles a row from each rank): one, or with the loss in the backward one per chunk of rows.
    //
    // Sequence parallelism instead: each of those all-reduces of rows·hidden is a reduce-scatter,
    // and per micro-batch the rows are all-gathered 4 times a block (h1, h2 forward; the output
    // gradients of W_down and W_o backward), 2 more when recomputed (h1, h2), once for the head's
    // input and once for the embedding's gradient when it trains; each norm weight that trains (2
    // a block and the head's: none under LoRA) all-reduces its gradient share, hidden elements.
    using K = pv::CollectiveKind;
    const long long rows = kBatch * (sequence ? kSeqSequence : kSeq), L = c.num_layers, C = c.hidden_size, micro = 2;
    const long long head_gathers = micro * (head_chunk > 0 ? (rows + head_chunk - 1) / head_chunk : 1);
    int recomputed = 0;
    for (int b = 0; b < L; ++b) recomputed += ckpt.recomputes(b);
    long long calls = micro * (4 * L + recomputed + 2), elements = calls * rows * C;
    long long scattered = 0, gathered_rows = 0;  // sequence parallelism: reduce-scatters, row gathers
    if (sequence) {
        scattered = calls, calls = 0, elements = 0;
        gathered_rows = micro * (4 * L + 2 * recomputed + 1 + (lora.enabled() ? 0 : 1));
        if (!lora.enabled()) calls += micro * (2 * L + 1), elements += micro * (2 * L + 1) * C;
    }
    if (lora.enabled()) {
        const long long r = lora.rank;
        calls += micro * L * 4;
        elements += micro * L * (3 * r * C + C * r + 2 * r * C + C * r);
    }
    // Replicated kv heads: each block's whole kv rows (2·Hkv·head_dim) of W_qkv's gradient, r wide
    // for its adapter's B (the base frozen).
    if (c.num_kv_heads % comm.size() != 0) {
        const long long kv_rows = 2LL * c.num_kv_heads * c.head_dim;
        calls += micro * L;
        elements += micro * L * kv_rows * (lora.enabled() ? lora.rank : C);
    }
    for (size_t k = 0; k < mine.wire.calls.size(); ++k)
        CHECK(mine.wire.calls[k] == (k == size_t(K::all_reduce)       ? calls
                                     : k == size_t(K::all_gather)     ? head_gathers + gathered_rows
                                     : k == size_t(K::reduce_scatter) ? scattered
                                                                      : 0));
    const double T = comm.size(), ring = 2.0 * (T - 1) / T;
    const double gathered = double(micro) * (T - 1) * double(rows) * 3 * 8;
    const double sequence_bytes = double(scattered + gathered_rows) * (T - 1) * double(rows / comm.size()) * C * 8;
    CHECK(mine.wire.wire_bytes == Approx(ring * double(elements) * 8 + gathered + sequence_bytes).epsilon(1e-12));
    const pv::TensorSequence model_sequence{sequence, lora.enabled() ? 0 : int(2 * L + 1), !lora.enabled()};
    const pv::TensorWire model = pv::tensor_parallel_wire(c, pv::DType::fp64, lora, comm.size(), rows, 2, int(L),
                                                          recomputed, lora.enabled() ? 0 : int(L), true, true,
                                                          model_sequence, head_chunk);
    CHECK(model.all_reduces == calls);
    CHECK(model.all_gathers == head_gathers + gathered_rows);
    CHECK(model.reduce_scatters == scattered);
    CHECK(model.bytes == Approx(mine.wire.wire_bytes).epsilon(1e-12));
    CHECK(std::abs(mine.loss - whole.loss) <= 1e-12 * std::abs(whole.loss));
    REQUIRE(mine.layouts.size() == whole.layouts.size());
    for (size_t u = 0; u < whole.layouts.size(); ++u)
        for (const pv::TensorSlot& t : mine.layouts[u].tensors) {
            const pv::TensorSlot& w = whole.layouts[u].find(t.spec.name);
            INFO(t.spec.name << (t.spec.slice.whole() ? " (whole)" : " (slice)"));
            double largest = 0;
            for (long long i = 0; i < w.spec.numel(); ++i)
                largest = std::max(largest, std::abs(whole.grads[u][size_t(w.offset + i)]));
            REQUIRE(largest > 0);  // a gradient of zeros would prove nothing
            long long bad = -1;
            for (long long i = 0; i < t.spec.numel() && bad < 0; ++i) {
                const size_t at = size_t(t.offset + i), there = size_t(w.offset + t.spec.whole_index(i));
                if (mine.params[u][at] != whole.params[u][there]) bad = i;
                if (!(std::abs(mine.grads[u][at] - whole.grads[u][there]) <= 1e-10 * largest)) bad = i;  // (NaN too)
            }
            INFO("first element off: " << bad);
            CHECK(bad < 0);
        }
}

}  // namespace tensor_parallel_mpi_test

using namespace tensor_parallel_mpi_test;

TEST_CASE("tensor parallelism over the job's ranks trains what one rank trains", "[tensor_parallel]") {
    pv::World world(nullptr, nullptr);
    pv::Comm& comm = world.comm();
    for (int kv : {8, 4})
        for (bool tied : {true, false}) check_against_whole(model(kv, tied), comm, {});
    check_against_whole(model(4, false), comm, pv::ActivationCheckpointing{true, 0});
    // Replicated kv heads: one (multi-query) on every rank; at 4 ranks two, each on two ranks.
    check_against_whole(model(1, true), comm, {});
    check_against_whole(model(2, false), comm, pv::ActivationCheckpointing{true, 0});
}

// The fused linear cross-entropy under tensor parallelism: each chunk's partials gathered and merged
// in the backward, the loss with the gradient; the whole model computes its loss in the forward.
TEST_CASE("the head's logits a chunk of rows at a time under tensor parallelism: the loss in the backward",
          "[tensor_parallel][head]") {
    pv::World world(nullptr, nullptr);
    pv::Comm& comm = world.comm();
    check_against_whole(model(4, true), comm, {}, {}, false, false, 5);  // 14 rows: 5, 5, 4
    check_against_whole(model(8, false), comm, pv::ActivationCheckpointing{true, 0}, {}, false, false, 1);
    check_against_whole(model(4, false), comm, {}, {}, true, false, 5);  // sequence parallelism: 12 rows
}

TEST_CASE("LoRA under tensor parallelism trains what it trains on one rank, dropout included",
          "[tensor_parallel][lora]") {
    pv::World world(nullptr, nullptr);
    pv::LoraConfig lora;
    lora.rank = 3, lora.alpha = 6, lora.dropout = 0.25;  // every linear: q, k, v, o, gate, up, down
    check_against_whole(model(4, true), world.comm(), {}, lora);
    check_against_whole(model(8, false), world.comm(), pv::ActivationCheckpointing{true, 0}, lora);
    check_against_whole(model(1, false), world.comm(), {}, lora);  // a replicated kv head's B
}

TEST_CASE("QLoRA under tensor parallelism trains what it trains on one rank: each module's NF4 blocks split",
          "[tensor_parallel][lora][nf4]") {
    pv::World world(nullptr, nullptr);
    pv::LoraConfig lora;
    lora.rank = 2, lora.alpha = 4, lora.dropout = 0.25;
    check_against_whole(qlora_model(4), world.comm(), {}, lora, false, true);
    // A replicated kv head at 4 ranks (two, each on two ranks), with checkpointing and sequence parallelism.
    check_against_whole(qlora_model(2), world.comm(), pv::ActivationCheckpointing{true, 0}, lora, true, true);
}

TEST_CASE("sequence parallelism under tensor parallelism trains what one rank trains", "[tensor_parallel]") {
    pv::World world(nullptr, nullptr);
    pv::Comm& comm = world.comm();
    check_against_whole(model(4, true), comm, {}, {}, true);
    check_against_whole(model(8, false), comm, pv::ActivationCheckpointing{true, 0}, {}, true);
    check_against_whole(model(1, false), comm, {}, {}, true);  // replicated kv heads
    pv::LoraConfig lora;
    lora.rank = 3, lora.alpha = 6, lora.dropout = 0.25;
    check_against_whole(model(4, false), comm, pv::ActivationCheckpointing{true, 0}, lora, true);
}

TEST_CASE("sequence parallelism refuses rows the group does not split", "[tensor_parallel]") {
    pv::ModelOptions o = pv::whole_model(kBatch, kSeq, 17);  // 14 rows
    o.placement.tensor = {4, 0, true};
    CHECK_THROWS_WITH((pv::Llama<double>(model(4, true), o)),
                      Catch::Contains("splits a micro-batch's 14 rows") && Catch::Contains("multiple of 4"));
    o.placement.tensor = {1, 0, true};
    CHECK_THROWS_WITH((pv::Llama<double>(model(4, true), o)), Catch::Contains("it needs --tp 2 or more"));
}

TEST_CASE("tensor parallelism refuses what this build does not split", "[tensor_parallel]") {
    pv::ModelOptions o = pv::whole_model(kBatch, kSeq, 17);
    pv::LlamaConfig c = model(4, true);
    c.ffn_size = 32;  // 8 ranks split it (4 each)
    o.tensor_reduce = [](void*, long long) {};
    o.placement.tensor = {3, 0};
    CHECK_THROWS_WITH((pv::Llama<double>(c, o)),
                      Catch::Contains("3 does not divide the 8 query heads of tp-test; --tp can be 1, 2, 4, 8"));
    // QLoRA: q_proj's 48 rows of 20 split 24 a rank at 2, 480 elements, cutting NF4's blocks of 64
    // (4 and 8 ranks: 240 and 120).
    o.placement.tensor = {2, 0};
    o.lora.rank = 2, o.lora.alpha = 4, o.lora.targets = {"q_proj"}, o.nf4 = true;
    CHECK_THROWS_WITH((pv::Llama<double>(c, o)),
                      Catch::Contains("layers.0.w_qkv's slice of model.layers.0.self_attn.q_proj.weight (rows "
                                      "[0, 24) of 48, 20 columns each) would cut the module's 64-element "
                                      "quantisation blocks") &&
                          Catch::Contains("--tp can be 1 with --quantize nf4"));
}
