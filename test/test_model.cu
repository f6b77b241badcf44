// The whole model: the kernels' forward and backward (through the `single` driver) against the
// fp64 reference model, in fp64, fp32 and bf16; and the fp64 gradient check — directional
// derivatives along random directions and sampled coordinates of every tensor, by central
// differences of the model's own forward — with GQA, tied and untied embeddings, several layers,
// ignored targets and packed documents (positions restarting per document, attention within
// each) (DESIGN.md §5).
#include "kernels/glue.cuh"
#include "model/llama.h"
#include "model/unit_loop.h"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/llama.h"

#include <deque>
#include <limits>
#include <set>
#include <random>

using namespace pv::test;

namespace model_test {

struct Batch {
    int B, T;
    std::vector<int> tokens, targets;
    std::vector<int> positions;  // [B·T] within documents; empty: plain causal, row % T
};

// Positions of B sequences of T tokens cut into documents of the given lengths, the same cut in
// every sequence (the last document runs to the end of the row).
std::vector<int> document_positions(const std::vector<int>& lengths, int B, int T) {
    std::vector<int> pos;
    for (int b = 0; b < B; ++b) {
        size_t k = 0;
        for (int i = 0, p = 0; i < T; ++i, ++p) {
            if (k < lengths.size() && p == lengths[k]) p = 0, ++k;
            pos.push_back(p);
        }
    }
    return pos;
}

// Random tokens; targets are the next tokens with about one in five ignored (unevenly: the
// first sequence has more).
Batch make_batch(const pv::LlamaConfig& c, int B, int T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    Batch b{B, T, std::vector<int>(size_t(B * T)), std::vector<int>(size_t(B * T)), {}};
    for (auto& t : b.tokens) t = int(rng() % uint64_t(c.vocab_size));
    for (int i = 0; i < B * T; ++i) {
        const bool ignore = rng() % 5 == 0 || (i < T && i % 3 == 0);
        b.targets[size_t(i)] = ignore ? pv::kIgnoreIndex : int(rng() % uint64_t(c.vocab_size));
    }
    return b;
}

// micro_step runs forward and backward with the single driver on top of whatever the gradients
// hold (they add up); run_step zeroes them first. Both return (loss sum, count), read after the
// backward (which writes them when loss_in_backward).
template <class T>
std::pair<double, int> micro_step(pv::Llama<T>& m, const Batch& b, bool backward = true,
                                  bool loss_in_backward = false) {
    DeviceArray<int> tokens(b.tokens), targets(b.targets), positions(b.positions.empty() ? b.tokens : b.positions);
    const pv::DeviceBatch batch{tokens.get(), targets.get(), b.positions.empty() ? nullptr : positions.get(), 0, -1,
                                loss_in_backward};
    DeviceArray<pv::acc_t<T>> loss_sum(1);
    DeviceArray<int> count(1);
    int expected_count = 0;
    for (int t : b.targets) expected_count += t != pv::kIgnoreIndex;
    pv::single_forward(m, 0, batch, loss_sum.get(), count.get());
    if (backward) pv::single_backward(m, 0, batch, 1.0 / expected_count);
    CUDA_CHECK(cudaDeviceSynchronize());
    return {double(loss_sum.download()[0]), count.download()[0]};
}
template <class T>
std::pair<double, int> run_step(pv::Llama<T>& m, const Batch& b, bool backward = true, bool loss_in_backward = false) {
    m.zero_grads();
    return micro_step(m, b, backward, loss_in_backward);
}

// Every unit's whole trainable gradient buffer, padding included (empty for a unit without one).
template <class T>
std::vector<std::vector<T>> download_grad_buffers(pv::Llama<T>& m) {
    std::vector<std::vector<T>> out(size_t(m.num_units()));
    for (int u = 0; u < m.num_units(); ++u)
        if (m.grads(u)) {
            out[size_t(u)].resize(size_t(m.trainable(u).padded));
            CUDA_CHECK(cudaMemcpy(out[size_t(u)].data(), m.grads(u), out[size_t(u)].size() * sizeof(T),
                                  cudaMemcpyDeviceToHost));
        }
    return out;
}

// The model's parameters as the reference wants them: one unpadded fp64 vector per tensor.
template <class T>
pv::reference::Tensors download_params(pv::Llama<T>& m, bool grads = false) {
    pv::reference::Tensors out;
    for (int u = 0; u < m.num_units(); ++u)
        for (int g = 0; g < (grads ? 1 : m.num_groups(u)); ++g)  // gradients: the trainable group only
            for (const pv::TensorSlot& t : m.group(u, g).tensors) {
                std::vector<T> host(size_t(t.spec.numel()));
                const T* src = (grads ? m.grads(u) : m.group_params(u, g)) + t.offset;
                CUDA_CHECK(cudaMemcpy(host.data(), src, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
                out[t.spec.name] = to_double(host);
            }
    return out;
}

// Training options for a whole model on one rank with `frozen` tensors.
pv::ModelOptions options(int B, int Tn, uint64_t seed, const std::set<std::string>& frozen = {},
                         pv::Gradients gradients = pv::Gradients::owned) {
    pv::ModelOptions o = pv::whole_model(B, Tn, seed, gradients);
    o.frozen = frozen;
    return o;
}

// How the head runs: its logits `chunk` rows at a time (0: the default, all rows for these
// models), its loss computed in the forward or with the gradient in the backward.
struct HeadRun {
    long long chunk = 0;
    bool loss_in_backward = false;
};

// A frozen set that exercises every case: the (tied) embedding, a norm, a fused matrix and a
// block's whole MLP, so gradients must flow through frozen tensors to trainable ones below.
const std::set<std::string> kSomeFrozen = {
    "wte", "layers.0.attn_norm", "layers.1.w_qkv", "layers.1.w_gate_up", "layers.1.w_down", "final_norm"};

// `documents`: the lengths of packed documents (each sequence cut the same way); empty: causal.
template <class T>
void compare_with_reference(const std::string& preset, int B, int Tn, double loss_tol, double grad_tol,
                            const std::set<std::string>& frozen = {}, const std::vector<int>& documents = {},
                            HeadRun head = {}) {
    const pv::LlamaConfig& c = pv::preset(preset);
    pv::ModelOptions o = options(B, Tn, 77, frozen);
    o.head_chunk_rows = head.chunk;
    pv::Llama<T> m(c, o);
    Batch b = make_batch(c, B, Tn, 5);
    if (!documents.empty()) b.positions = document_positions(documents, B, Tn);
    const auto [loss, count] = run_step(m, b, true, head.loss_in_backward);
    const auto params = download_params(m);
    const auto ref =
        pv::reference::llama_forward_backward(c, params, b.tokens, b.targets, size_t(B), size_t(Tn), 1.0 / count, true,
                                              b.positions.empty() ? nullptr : &b.positions);
    INFO(preset << " B " << B << " T " << Tn << " loss " << loss << " reference " << ref.loss_sum << ", head chunks of "
                << m.head_chunk() << " rows, loss in the " << (head.loss_in_backward ? "backward" : "forward"));
    REQUIRE(count == ref.count);
    REQUIRE(std::fabs(loss - ref.loss_sum) <= loss_tol * std::fabs(ref.loss_sum));
    const auto grads = download_params(m, true);
    REQUIRE(grads.size() + frozen.size() ==
            ref.grads.size());  // a gradient for every trainable tensor, none for frozen ones
    for (const auto& [name, g] : ref.grads) {
        if (frozen.count(name)) continue;
        const std::string err = compare(grads.at(name), g, grad_tol);
        INFO("gradient of " << name << ": " << err);
        CHECK(err.empty());
    }
}

}  // namespace model_test

using namespace model_test;

// The fused linear cross-entropy: the logits a chunk of rows at a time (chunks that do not divide
// the rows, one row, all of them), the loss in the forward or in the backward with the gradient.
TEST_CASE("the head's logits a chunk of rows at a time, its loss in either pass, match the fp64 reference",
          "[model][head]") {
    for (long long chunk : {1LL, 4LL, 14LL})
        for (bool in_backward : {false, true}) {
            const HeadRun head{chunk, in_backward};
            compare_with_reference<double>("test-tiny", 2, 7, 1e-12, 1e-10, {}, {}, head);   // untied
            compare_with_reference<double>("test-tied", 1, 13, 1e-12, 1e-10, {}, {}, head);  // tied
            compare_with_reference<double>("test-tied", 1, 13, 1e-12, 1e-10, kSomeFrozen, {}, head);
        }
    compare_with_reference<float>("test-tiny", 2, 7, 1e-5, 1e-3, {}, {}, {5, true});
}

// The same chunks give the same bits whichever pass computes the loss: the forward's rows and the
// backward's one pass share the statistics and the gradient formula (kernels/cross_entropy.cuh).
TEST_CASE("the loss computed in the backward is the forward's bit for bit, and so are the gradients",
          "[model][head]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    const Batch b = make_batch(c, 2, 13, 8);
    for (long long chunk : {5LL, 0LL}) {
        pv::ModelOptions o = options(2, 13, 91);
        o.head_chunk_rows = chunk;
        pv::Llama<float> forward(c, o), backward(c, o);
        const auto [loss_f, count_f] = run_step(forward, b, true, false);
        const auto [loss_b, count_b] = run_step(backward, b, true, true);
        INFO("head chunks of " << forward.head_chunk() << " rows");
        REQUIRE(count_f == count_b);
        REQUIRE(std::memcmp(&loss_f, &loss_b, sizeof loss_f) == 0);
        for (int u = 0; u < forward.num_units(); ++u) {
            const size_t n = size_t(forward.trainable(u).padded);
            std::vector<float> gf(n), gb(n);
            CUDA_CHECK(cudaMemcpy(gf.data(), forward.grads(u), n * sizeof(float), cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(gb.data(), backward.grads(u), n * sizeof(float), cudaMemcpyDeviceToHost));
            INFO("unit " << u);
            REQUIRE(std::memcmp(gf.data(), gb.data(), n * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("model forward and backward match the fp64 reference model (fp64)", "[model]") {
    compare_with_reference<double>("test-tiny", 2, 7, 1e-12, 1e-10);   // GQA 6/2, untied, 2 layers
    compare_with_reference<double>("test-tied", 1, 13, 1e-12, 1e-10);  // tied, 3 layers
}

TEST_CASE("with packed documents the model matches the fp64 reference model (fp64, fp32)", "[model][documents]") {
    // Documents of one token, of several, one crossing the 8-row tiles of the fp64 kernels.
    compare_with_reference<double>("test-tiny", 2, 7, 1e-12, 1e-10, {}, {3, 1, 3});
    compare_with_reference<double>("test-tied", 1, 13, 1e-12, 1e-10, {}, {1, 9, 3});
    compare_with_reference<float>("test-tiny", 2, 7, 1e-5, 1e-3, {}, {2, 5});
}

// Independent of the reference: in a packed batch with document masking every document gets the
// logits (and so the loss) it gets as a sequence of its own: positions restart, attention stays
// inside the document, and every other op works row by row.
TEST_CASE("a packed document gets the logits it gets alone (fp64)", "[model][documents]") {
    const pv::LlamaConfig& c = pv::preset("test-tiny");
    const std::vector<int> lengths = {5, 1, 11};
    const int Tn = 17, V = c.vocab_size;
    pv::Llama<double> packed(c, pv::whole_model(1, Tn, 31, pv::Gradients::none));
    Batch b = make_batch(c, 1, Tn, 12);
    b.positions = document_positions(lengths, 1, Tn);
    run_step(packed, b, false);
    const std::vector<double> logits = download_logits(packed, 0);
    int start = 0;
    for (int len : lengths) {
        pv::Llama<double> alone(c, pv::whole_model(1, len, 31, pv::Gradients::none));  // the same weights
        const Batch one{1,
                        len,
                        std::vector<int>(b.tokens.begin() + start, b.tokens.begin() + start + len),
                        std::vector<int>(b.targets.begin() + start, b.targets.begin() + start + len),
                        {}};
        run_step(alone, one, false);
        const std::vector<double> want = download_logits(alone, 0);
        const std::vector<double> got(logits.begin() + start * V, logits.begin() + (start + len) * V);
        const std::string err = compare(got, want, 1e-12);
        INFO("document at " << start << " of " << len << " tokens: " << err);
        REQUIRE(err.empty());
        start += len;
    }
}

TEST_CASE("with frozen tensors the trainable ones get exactly the reference's gradients (fp64)", "[model][freeze]") {
    compare_with_reference<double>("test-tiny", 2, 7, 1e-12, 1e-10, kSomeFrozen);
    compare_with_reference<double>("test-tied", 1, 13, 1e-12, 1e-10, kSomeFrozen);
    const pv::LlamaConfig& c = pv::preset("test-tied");
    pv::Llama<double> m(c, options(1, 4, 1, kSomeFrozen));
    REQUIRE(m.num_groups(0) == 2);
    REQUIRE(m.trainable(0).padded == 0);  // the embedding has nothing left to train
    REQUIRE(m.grads(0) == nullptr);
    REQUIRE(m.group(1, 1).kind == pv::GroupKind::frozen);
    REQUIRE(m.group(1, 1).tensors.size() == 1);  // layers.0.attn_norm
    REQUIRE(m.num_groups(1 + c.num_layers) == 2);
    long long frozen = 0;
    for (const std::string& name : kSomeFrozen)
        for (const pv::UnitSpec& u : pv::model_units(c))
            for (const pv::TensorSpec& t : u.tensors)
                if (t.name == name) frozen += t.numel();
    REQUIRE(m.tensor_elements(pv::GroupKind::frozen) == frozen);
    REQUIRE(m.tensor_elements(pv::GroupKind::trainable) + frozen == pv::parameter_count(c));
}

TEST_CASE("model forward and backward in fp32 and bf16 stay close to the fp64 reference", "[model]") {
    compare_with_reference<float>("test-tiny", 2, 7, 1e-5, 1e-3);
    // bf16: the loss within 1e-2 (DESIGN.md §5); gradients are not compared element-wise.
    const pv::LlamaConfig& c = pv::preset("test-tied");
    // Also with the head's logits 5 rows at a time and the loss computed in the backward.
    for (const HeadRun head : {HeadRun{}, HeadRun{5, true}}) {
        pv::ModelOptions o = options(2, 9, 77);
        o.head_chunk_rows = head.chunk;
        pv::Llama<__nv_bfloat16> m(c, o);
        const Batch b = make_batch(c, 2, 9, 6);
        const auto [loss, count] = run_step(m, b, head.loss_in_backward, head.loss_in_backward);
        const auto ref =
            pv::reference::llama_forward_backward(c, download_params(m), b.tokens, b.targets, 2, 9, 1.0, false);
        INFO("head chunks of " << m.head_chunk() << " rows");
        REQUIRE(count == ref.count);
        REQUIRE(std::fabs(loss / count - ref.loss_sum / ref.count) <= 1e-2 * ref.loss_sum / ref.count);
    }
}

TEST_CASE("whole-model gradient check (fp64): random directions and sampled coordinates", "[model][gradcheck][heavy]") {
    struct Variant {
        const char* preset;
        std::set<std::string> frozen;
        bool documents;  // packed documents of 2 and 3 tokens
    };
    for (const auto& [preset, frozen, documents] : std::vector<Variant>{{"test-tiny", {}, false},
                                                                        {"test-tied", {}, false},
                                                                        {"test-tied", kSomeFrozen, false},
                                                                        {"test-tiny", {}, true}}) {
        INFO("frozen tensors: " << frozen.size() << (documents ? ", packed documents" : ""));
        const pv::LlamaConfig& c = pv::preset(preset);
        const int B = 2, Tn = 5;
        pv::Llama<double> m(c, options(B, Tn, 99, frozen));
        Batch b = make_batch(c, B, Tn, 8);
        if (documents) b.positions = document_positions({2, 3}, B, Tn);
        const auto [loss0, count] = run_step(m, b);
        const double scale = 1.0 / count;
        const auto grads = download_params(m, true);
        // The mean loss as a function of one unit's parameter group (host copy `flat`).
        auto mean_loss = [&] { return run_step(m, b, false).first * scale; };

        std::mt19937_64 rng(3);
        for (int u = 0; u < m.num_units(); ++u) {
            const pv::GroupLayout& layout = m.trainable(u);  // frozen tensors have no gradient to check
            if (layout.padded == 0) continue;
            std::vector<double> flat(size_t(layout.padded));
            CUDA_CHECK(cudaMemcpy(flat.data(), m.params(u), flat.size() * sizeof(double), cudaMemcpyDeviceToHost));
            auto loss_at = [&] {
                CUDA_CHECK(cudaMemcpy(m.params(u), flat.data(), flat.size() * sizeof(double), cudaMemcpyHostToDevice));
                return mean_loss();
            };
            for (const pv::TensorSlot& t : layout.tensors) {
                INFO(preset << " tensor " << t.spec.name);
                // Sampled coordinates: up to 50 per tensor (DESIGN.md §5); 10 in the frozen and the
                // documents variants, whose tensors the plain run of the same preset has already
                // checked at 50.
                check_tensor_gradient(flat, t.offset, t.spec.numel(), grads.at(t.spec.name), loss_at,
                                      frozen.empty() && !documents ? 50 : 10, rng);
            }
            loss_at();  // restore the unit's parameters on the device
        }
        REQUIRE(std::isfinite(loss0));
    }
}

TEST_CASE("forward-only evaluation gives next-token logits equal to the reference's (fp64)", "[model]") {
    const pv::LlamaConfig& c = pv::preset("test-tiny");
    const int B = 1, Tn = 9;
    pv::Llama<double> m(c, pv::whole_model(B, Tn, 123, pv::Gradients::none, 2));
    const Batch b = make_batch(c, B, Tn, 10);
    DeviceArray<int> tokens(b.tokens);
    pv::single_forward<double>(m, 1, pv::DeviceBatch{tokens.get()}, nullptr, nullptr);  // slot 1, no targets
    const std::vector<double> logits = download_logits(m, 1);
    const auto ref =
        pv::reference::llama_forward_backward(c, download_params(m), b.tokens, b.targets, B, Tn, 1.0, false);
    const std::string err = compare(logits, ref.logits, 1e-12);
    INFO(err);
    REQUIRE(err.empty());
}

// ZeRO-3 keeps a slice of every group and initialises it alone: every slice must hold exactly the
// values the whole group has (Philox keyed by element, norm weights 1, padding 0).
TEST_CASE("init_params gives any slice of a unit the values of the whole group", "[model]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    pv::ModelOptions o = options(2, 8, 5, kSomeFrozen, pv::Gradients::none);
    o.placement.shards = 3;
    pv::Llama<double> m(c, o);
    for (int u = 0; u < m.num_units(); ++u)
        for (int g = 0; g < m.num_groups(u); ++g) {
            const long long n = m.group(u, g).padded;
            if (n == 0) continue;
            std::vector<double> whole(static_cast<size_t>(n));
            CUDA_CHECK(
                cudaMemcpy(whole.data(), m.group_params(u, g), whole.size() * sizeof(double), cudaMemcpyDeviceToHost));
            if (m.group(u, g).used < n) REQUIRE(whole[size_t(m.group(u, g).used)] == 0.0);  // padding
            for (const auto& [begin, end] : std::vector<std::pair<long long, long long>>{
                     {0, n / 3}, {n / 3, 2 * n / 3}, {2 * n / 3, n}, {7, n - 5}, {n - 1, n}}) {
                DeviceArray<double> slice{size_t(end - begin)};
                m.init_params(u, g, slice.get(), begin, end, 5);
                const auto got = slice.download();
                INFO("unit " << u << " group " << g << " [" << begin << ", " << end << ")");
                REQUIRE(std::equal(got.begin(), got.end(), whole.begin() + begin));
            }
        }
    DeviceArray<double> out{size_t(4)};
    REQUIRE_THROWS_WITH(m.init_params(1, 0, out.get(), -1, 3, 5), Catch::Contains("outside unit 1"));
}

TEST_CASE("a model with bound parameters and gradients computes exactly what an owning one does", "[model]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    pv::Llama<double> owning(c, options(2, 8, 9, kSomeFrozen));
    pv::ModelOptions o = options(2, 8, 9, kSomeFrozen, pv::Gradients::bound);
    o.placement.parameters = pv::Parameters::bound;
    pv::Llama<double> bound(c, o);
    std::deque<DeviceArray<double>> params, grads;  // DeviceArray does not move; a deque never moves its elements
    for (int u = 0; u < owning.num_units(); ++u) {
        for (int g = 0; g < owning.num_groups(u); ++g) {
            const size_t n = size_t(owning.group(u, g).padded);
            params.emplace_back(n);
            CUDA_CHECK(cudaMemcpy(params.back().get(), owning.group_params(u, g), n * sizeof(double),
                                  cudaMemcpyDeviceToDevice));
            bound.bind_params(u, g, params.back().get());
        }
        const size_t n = size_t(owning.trainable(u).padded);
        grads.emplace_back(n);
        CUDA_CHECK(cudaMemset(grads.back().get(), 0, n * sizeof(double)));
        bound.bind_grads(u, grads.back().get());
    }
    const Batch b = make_batch(c, 2, 8, 3);
    const auto [loss_a, count_a] = run_step(owning, b);
    const auto [loss_b, count_b] = run_step(bound, b);
    REQUIRE(loss_a == loss_b);
    REQUIRE(count_a == count_b);
    REQUIRE(download_params(owning, true) == download_params(bound, true));
    REQUIRE_THROWS_AS(owning.bind_params(0, 0, params[0].get()), std::logic_error);
}

// Llama::discard_grads starts a step without a memset: each unit's first backward writes over its
// gradient (β = 0 GEMMs, the norms', the adapters', a tied embedding's through the lm_head, the
// first of the head's chunks only), and the result must be what zeroing and adding gives. Every
// tensor's gradient is poisoned with NaN first, so a writer that adds instead of writing over, or a
// tensor nobody writes, shows; two micro-steps, so one that writes over where it should add shows.
template <class T>
void check_discard_equals_zeroing(const std::string& preset, const pv::ModelOptions& o, const std::string& what) {
    const pv::LlamaConfig& c = pv::preset(preset);
    pv::Llama<T> m(c, o);
    const Batch one = make_batch(c, o.batch, o.seq_len, 21), two = make_batch(c, o.batch, o.seq_len, 22);
    m.zero_grads();
    micro_step(m, one), micro_step(m, two);
    const auto want = download_grad_buffers(m);
    for (int u = 0; u < m.num_units(); ++u)
        if (m.grads(u))
            for (const pv::TensorSlot& t : m.trainable(u).tensors) {
                const std::vector<T> nan(size_t(t.spec.numel()),
                                         pv::from_acc<T>(std::numeric_limits<float>::quiet_NaN()));
                CUDA_CHECK(
                    cudaMemcpy(m.grads(u) + t.offset, nan.data(), nan.size() * sizeof(T), cudaMemcpyHostToDevice));
            }
    m.discard_grads();
    micro_step(m, one), micro_step(m, two);
    const auto got = download_grad_buffers(m);
    int checked = 0;
    for (int u = 0; u < m.num_units(); ++u) {
        REQUIRE(got[size_t(u)].size() == want[size_t(u)].size());
        for (size_t i = 0; i < got[size_t(u)].size(); ++i) {
            const double g = double(pv::to_acc(got[size_t(u)][i])), w = double(pv::to_acc(want[size_t(u)][i]));
            if (g != w)
                FAIL(what << ": unit " << u << " element " << i << ": " << g << " after discard_grads, " << w
                          << " after zero_grads");
        }
        checked += !got[size_t(u)].empty();
    }
    INFO(what);
    CHECK(checked > 0);
    // A unit no backward reached since discard_grads is zeroed by settle_grads (Strategy::
    // finish_gradients runs it before the gradients are read).
    m.discard_grads();
    m.settle_grads();
    long long nonzero = 0;
    for (const std::vector<T>& buffer : download_grad_buffers(m))
        for (const T& x : buffer) nonzero += double(pv::to_acc(x)) != 0.0;
    CHECK(nonzero == 0);
}

TEST_CASE("a step begun by discard_grads (no memset) ends with the gradients zero_grads and adding give",
          "[model][gradients]") {
    check_discard_equals_zeroing<float>("test-tiny", options(2, 7, 41), "untied (the embedding zeroed, then added)");
    check_discard_equals_zeroing<float>("test-tied", options(1, 13, 42), "tied (the lm_head writes the embedding's)");
    pv::ModelOptions chunked = options(1, 13, 43);
    chunked.head_chunk_rows = 5;  // the lm_head's first chunk writes, the next two add
    check_discard_equals_zeroing<float>("test-tied", chunked, "tied, the head in chunks of 5 rows");
    check_discard_equals_zeroing<float>("test-tiny", options(2, 7, 44, kSomeFrozen), "untied, some tensors frozen");
    check_discard_equals_zeroing<__nv_bfloat16>("test-tied", options(2, 9, 45), "tied, bf16");
    pv::ModelOptions lora = options(2, 7, 46);
    lora.lora.rank = 2, lora.lora.alpha = 4;
    check_discard_equals_zeroing<float>("test-tiny", lora, "LoRA on every linear");
}

// The micro-step as a CUDA graph: the model's forward and backward captured on its stream
// (cudaStreamBeginCapture, global mode: no allocation, synchronisation or pageable copy anywhere
// in them, or the capture ends without a graph) and launched, twice, give the eager micro-step's
// loss and gradients bit for bit. The batch is uploaded and the gradients zeroed outside the
// graph, before each launch, as a captured training step would.
template <class T>
void check_captured_micro_step(const std::string& preset, const pv::ModelOptions& o, const std::string& what) {
    INFO(what);
    const pv::LlamaConfig& c = pv::preset(preset);
    struct OwnStream {  // a created one (the legacy default stream cannot capture), outliving the model
        cudaStream_t s = nullptr;
        OwnStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
        ~OwnStream() { cudaStreamDestroy(s); }
    } own;
    const cudaStream_t stream = own.s;
    pv::ModelOptions on_stream = o;
    on_stream.stream = stream;
    pv::Llama<T> m(c, on_stream);
    const Batch b = make_batch(c, o.batch, o.seq_len, 51);
    int expected_count = 0;
    for (int t : b.targets) expected_count += t != pv::kIgnoreIndex;
    const auto [eager_loss, eager_count] = run_step(m, b);
    const auto eager_grads = download_grad_buffers(m);

    DeviceArray<int> tokens(b.tokens), targets(b.targets);
    const pv::DeviceBatch batch{tokens.get(), targets.get(), nullptr, 0, -1, false};
    DeviceArray<pv::acc_t<T>> loss_sum(1);
    DeviceArray<int> count(1);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    pv::single_forward(m, 0, batch, loss_sum.get(), count.get());
    pv::single_backward(m, 0, batch, 1.0 / expected_count);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch_index = 0; launch_index < 2; ++launch_index) {
        m.zero_grads();
        loss_sum.poison(), count.poison();
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        REQUIRE(double(loss_sum.download()[0]) == eager_loss);
        REQUIRE(count.download()[0] == eager_count);
        const auto grads = download_grad_buffers(m);
        for (size_t u = 0; u < grads.size(); ++u) {
            REQUIRE(grads[u].size() == eager_grads[u].size());
            if (!grads[u].empty())  // (a unit without a gradient has no buffer: nothing to compare)
                REQUIRE(std::memcmp(grads[u].data(), eager_grads[u].data(), grads[u].size() * sizeof(T)) == 0);
        }
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST_CASE("a micro-step captured as a CUDA graph gives the eager micro-step's loss and gradients, bit for bit",
          "[model][graphs]") {
    check_captured_micro_step<float>("test-tiny", options(2, 7, 61), "untied, fp32");
    check_captured_micro_step<__nv_bfloat16>("test-tied", options(2, 9, 62), "tied, bf16");
    pv::ModelOptions lora = options(2, 7, 63);
    lora.lora.rank = 2, lora.lora.alpha = 4;
    check_captured_micro_step<float>("test-tiny", lora, "LoRA on every linear");
}
