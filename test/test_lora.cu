// LoRA (model/lora.h, kernels/lora.cuh): the fused adapter kernels against per-module fp64 loops
// (test/reference/lora.h) in every dtype, with and without dropout; the whole LoRA model against the
// fp64 reference model with PEFT's per-module adapters; the fp64 gradient check through adapters,
// the frozen base and dropout; the layout (adapters trainable, the base frozen, PEFT's counts) and
// initialisation (A uniform within 1/√in, B zero, so a fresh adapter changes nothing).
#include "kernels/lora.cuh"
#include "model/llama.h"
#include "model/unit_loop.h"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/llama.h"
#include "test/reference/lora.h"

#include <map>
#include <random>
#include <set>

using namespace pv::test;

namespace lora_test {

// The dropout factor keep/(1 − p) of every element of an [N][in] input.
std::vector<double> dropout_mask(const pv::LoraDropout& d, uint32_t tensor, long long N, int in) {
    std::vector<double> m(size_t(N * in), 1.0);
    if (!d.on()) return m;
    for (long long n = 0; n < N; ++n)
        for (int i = 0; i < in; ++i)
            m[size_t(n * in + i)] = pv::lora_keep(d, tensor, n, i, in) ? 1.0 / (1.0 - d.p) : 0.0;
    return m;
}

std::vector<double> rows_of(const std::vector<double>& m, size_t cols, size_t begin, size_t rows) {
    return std::vector<double>(m.begin() + long(begin * cols), m.begin() + long((begin + rows) * cols));
}

// One fused linear with `parts` (output rows) targeted, run through lora_forward and lora_backward,
// compared with the per-module reference.
// dA and dB start random and accumulate, or poisoned and are written over (grad_write).
// keys_in_memory: the kernels read the dropout's first row and step from device memory (a captured
// micro-step's, LoraDropout::keys), their by-value fields set to other numbers, which would give
// another mask.
template <class T>
void check_kernels(const std::vector<std::pair<int, int>>& parts, int out, int in, int rank, long long N,
                   double dropout, pv::GradWrite grad_write = pv::GradWrite::add, bool keys_in_memory = false) {
    const bool add = grad_write == pv::GradWrite::add;
    const double tol = tolerance<T>();
    pv::LoraShape s;
    s.in = in, s.out = out, s.rank = rank, s.parts = int(parts.size()), s.scale = 1.75;
    int b_rows = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
        s.part[p] = {parts[p].first, parts[p].second, b_rows};
        b_rows += parts[p].second;
    }
    const pv::LoraDropout d{dropout, 4242, 7, 1000};
    DeviceArray<long long> keys(std::vector<long long>{d.first_row, d.step});
    pv::LoraDropout run = d;
    if (keys_in_memory) run.first_row = 0, run.step = 8, run.keys = keys.get();
    const uint32_t tensor = 31;
    auto round = [](std::vector<T> v) { return to_double(v); };
    const auto x_h = random_vector<T>(size_t(N * in), 1), a_h = random_vector<T>(size_t(s.a_rows() * in), 2);
    const auto b_h = random_vector<T>(size_t(b_rows * rank), 3), y0_h = random_vector<T>(size_t(N * out), 4);
    const auto dy_h = random_vector<T>(size_t(N * out), 5), dx0_h = random_vector<T>(size_t(N * in), 6);
    const auto da0_h = random_vector<T>(a_h.size(), 7), db0_h = random_vector<T>(b_h.size(), 8);
    DeviceArray<T> x(x_h), a(a_h), b(b_h), y(y0_h), u(size_t(N * s.a_rows())), dy(dy_h), dx(dx0_h), da(a_h.size()),
        db(b_h.size()), du(size_t(N * s.a_rows())), dropped(size_t(N * in));
    if (add) da.upload(da0_h), db.upload(db0_h);
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    pv::lora_forward(h, x.get(), a.get(), b.get(), y.get(), u.get(), dropped.get(), N, s, run, tensor, nullptr);
    dropped.poison();  // the backward regenerates the dropped input
    pv::lora_backward(h, dy.get(), x.get(), a.get(), b.get(), u.get(), dx.get(), da.get(), db.get(), du.get(),
                      dropped.get(), N, s, run, tensor, nullptr, grad_write);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUBLAS_CHECK(cublasDestroy(h));

    const auto mask = d.on() ? dropout_mask(d, tensor, N, in) : std::vector<double>{};
    std::vector<double> y_ref = round(y0_h), dx_ref = round(dx0_h);
    std::vector<double> da_ref = add ? round(da0_h) : std::vector<double>(a_h.size(), 0.0);
    std::vector<double> db_ref = add ? round(db0_h) : std::vector<double>(b_h.size(), 0.0);
    const auto xd = round(x_h), ad = round(a_h), bd = round(b_h), dyd = round(dy_h);
    for (size_t p = 0; p < parts.size(); ++p) {
        const pv::reference::LoraModule m{
            size_t(N), size_t(in), size_t(out), size_t(parts[p].first), size_t(parts[p].second), size_t(rank), s.scale};
        const auto A = rows_of(ad, size_t(in), p * size_t(rank), size_t(rank));
        const auto B = rows_of(bd, size_t(rank), size_t(s.part[p].b_begin), size_t(parts[p].second));
        pv::reference::lora_forward(m, xd, A, B, y_ref, mask);
        std::vector<double> dA(A.size(), 0.0), dB(B.size(), 0.0);
        pv::reference::lora_backward(m, dyd, xd, A, B, dx_ref, dA, dB, mask);
        for (size_t i = 0; i < dA.size(); ++i) da_ref[p * size_t(rank * in) + i] += dA[i];
        for (size_t i = 0; i < dB.size(); ++i) db_ref[size_t(s.part[p].b_begin * rank) + i] += dB[i];
    }
    for (const auto& [name, got, want] : std::vector<std::tuple<const char*, std::vector<double>, std::vector<double>>>{
             {"y", round(y.download()), y_ref},
             {"dx", round(dx.download()), dx_ref},
             {"dA", round(da.download()), da_ref},
             {"dB", round(db.download()), db_ref}}) {
        const std::string err = compare(got, want, tol);
        INFO(name << " parts " << parts.size() << " dropout " << dropout << (add ? "" : ", dA and dB written over")
                  << (keys_in_memory ? ", keys in device memory" : "") << ": " << err);
        CHECK(err.empty());
    }
}

struct Batch {
    std::vector<int> tokens, targets;
};

Batch make_batch(const pv::LlamaConfig& c, int B, int T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    Batch b{std::vector<int>(size_t(B * T)), std::vector<int>(size_t(B * T))};
    for (auto& t : b.tokens) t = int(rng() % uint64_t(c.vocab_size));
    for (auto& t : b.targets) t = rng() % 6 == 0 ? pv::kIgnoreIndex : int(rng() % uint64_t(c.vocab_size));
    return b;
}

// Forward and (optionally) backward with the single driver at training step `step` (−1: no dropout).
template <class T>
std::pair<double, int> run_step(pv::Llama<T>& m, const Batch& b, bool backward, long long step = -1) {
    DeviceArray<int> tokens(b.tokens), targets(b.targets);
    pv::DeviceBatch batch{tokens.get(), targets.get(), nullptr, 3 * m.seq_len(), step};
    DeviceArray<pv::acc_t<T>> loss_sum(1);
    DeviceArray<int> count(1);
    int counted = 0;
    for (int t : b.targets) counted += t != pv::kIgnoreIndex;
    m.zero_grads();
    pv::single_forward(m, 0, batch, loss_sum.get(), count.get());
    if (backward) pv::single_backward(m, 0, batch, 1.0 / counted);
    CUDA_CHECK(cudaDeviceSynchronize());
    return {double(loss_sum.download()[0]), counted};
}

pv::LoraConfig lora_config(int rank, std::vector<std::string> targets = {}, double dropout = 0) {
    pv::LoraConfig l;
    l.rank = rank, l.alpha = 3 * rank, l.dropout = dropout;
    if (!targets.empty()) l.targets = std::move(targets);
    return l;
}

pv::ModelOptions options(int B, int T, uint64_t seed, const pv::LoraConfig& lora) {
    pv::ModelOptions o = pv::whole_model(B, T, seed);
    o.lora = lora;
    return o;
}

// Overwrites every adapter B (zero at initialisation, which would hide A's gradient and the whole
// adapter path) with random values.
template <class T>
void randomise_b(pv::Llama<T>& m, uint64_t seed) {
    for (int u = 0; u < m.num_units(); ++u)
        for (const pv::TensorSlot& t : m.trainable(u).tensors)
            if (t.spec.name.find("lora_b") != std::string::npos) {
                const auto v = random_vector<T>(size_t(t.spec.numel()), seed++, -0.5, 0.5);
                CUDA_CHECK(cudaMemcpy(m.params(u) + t.offset, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
            }
}

// Every tensor of every group as fp64 by polevault name; with `grads`, the trainable group's gradients.
template <class T>
pv::reference::Tensors download(pv::Llama<T>& m, bool grads) {
    pv::reference::Tensors out;
    for (int u = 0; u < m.num_units(); ++u)
        for (int g = 0; g < (grads ? 1 : m.num_groups(u)); ++g)
            for (const pv::TensorSlot& t : m.group(u, g).tensors) {
                std::vector<T> host(size_t(t.spec.numel()));
                const T* src = (grads ? m.grads(u) : m.group_params(u, g)) + t.offset;
                CUDA_CHECK(cudaMemcpy(host.data(), src, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
                out[t.spec.name] = to_double(host);
            }
    return out;
}

// polevault's stacked adapters split into PEFT's per-module tensors ("layers.N.q_proj.lora_A"), by
// the HF names of their parts; other tensors unchanged.
pv::reference::Tensors per_module(const pv::reference::Tensors& fused, const pv::LlamaConfig& c,
                                  const pv::LoraConfig& lora) {
    pv::reference::Tensors out;
    for (const pv::UnitSpec& u : pv::model_units(c, lora))
        for (const pv::TensorSpec& t : u.tensors) {
            if (!fused.count(t.name)) continue;  // gradients: the trainable tensors only
            const std::vector<double>& v = fused.at(t.name);
            if (t.name.find("lora_") == std::string::npos) {
                out[t.name] = v;
                continue;
            }
            for (const pv::TensorPart& p : t.parts) {  // model.layers.N.self_attn.q_proj.lora_A.weight
                const std::string hf = p.hf_name;
                const size_t module_end = hf.rfind(".lora_"), module_begin = hf.rfind('.', module_end - 1) + 1;
                const std::string name = "layers." + std::to_string(u.layer) + "." +
                                         hf.substr(module_begin, module_end - module_begin) +
                                         (hf.find("lora_A") != std::string::npos ? ".lora_A" : ".lora_B");
                out[name] = rows_of(v, size_t(t.cols), size_t(p.row_begin), size_t(p.rows));
            }
        }
    return out;
}

template <class T>
void compare_with_reference(const std::string& preset, const pv::LoraConfig& lora, double loss_tol, double grad_tol) {
    const pv::LlamaConfig& c = pv::preset(preset);
    const int B = 2, Tn = 6;
    pv::Llama<T> m(c, options(B, Tn, 21, lora));
    randomise_b(m, 100);
    const Batch b = make_batch(c, B, Tn, 4);
    const auto [loss, counted] = run_step(m, b, true);
    const pv::reference::LlamaLora ref_lora{size_t(lora.rank), lora.scale(),
                                            std::set<std::string>(lora.targets.begin(), lora.targets.end())};
    const auto ref = pv::reference::llama_forward_backward(c, per_module(download(m, false), c, lora), b.tokens,
                                                           b.targets, B, Tn, 1.0 / counted, true, nullptr,
                                                           pv::reference::RopePairs::rotate_half, &ref_lora);
    INFO(preset << " loss " << loss << " reference " << ref.loss_sum);
    REQUIRE(std::fabs(loss - ref.loss_sum) <= loss_tol * std::fabs(ref.loss_sum));
    const auto grads = per_module(download(m, true), c, lora);  // only adapters are trainable
    size_t adapters = 0;
    for (const auto& [name, g] : grads) {
        REQUIRE(name.find("lora_") != std::string::npos);
        ++adapters;
        const std::string err = compare(g, ref.grads.at(name), grad_tol);
        INFO("gradient of " << name << ": " << err);
        CHECK(err.empty());
    }
    REQUIRE(adapters == 2 * lora.targets.size() * size_t(c.num_layers));
}

}  // namespace lora_test

using namespace lora_test;

TEST_CASE("the fused adapter kernels equal per-module fp64 loops, with and without dropout", "[lora]") {
    for (double dropout : {0.0, 0.3}) {
        // Three parts of a fused qkv-like weight, a single whole-width part, a middle part only.
        check_kernels<double>({{0, 7}, {7, 5}, {12, 5}}, 17, 13, 3, 11, dropout);
        check_kernels<double>({{0, 9}}, 9, 20, 4, 7, dropout);
        check_kernels<double>({{7, 5}}, 17, 13, 2, 9, dropout);
        check_kernels<float>({{0, 7}, {12, 5}}, 17, 13, 3, 11, dropout);
        check_kernels<__nv_bfloat16>({{0, 7}, {7, 5}, {12, 5}}, 17, 13, 3, 11, dropout);
        // Inputs whose width is a multiple of every vector width (the dropout's 16-byte path).
        check_kernels<float>({{0, 9}}, 9, 16, 4, 7, dropout);
        check_kernels<__nv_bfloat16>({{0, 9}}, 9, 16, 4, 7, dropout);
    }
    // dA and dB written over poisoned buffers (a step's first micro-step: Llama::discard_grads).
    check_kernels<float>({{0, 7}, {7, 5}, {12, 5}}, 17, 13, 3, 11, 0.3, pv::GradWrite::overwrite);
    check_kernels<__nv_bfloat16>({{0, 9}}, 9, 16, 4, 7, 0.0, pv::GradWrite::overwrite);
    // The dropout's keys read from device memory (--cuda-graphs), on both of its paths.
    check_kernels<double>({{0, 7}, {7, 5}, {12, 5}}, 17, 13, 3, 11, 0.3, pv::GradWrite::add, true);
    check_kernels<float>({{0, 9}}, 9, 16, 4, 7, 0.3, pv::GradWrite::overwrite, true);
}

TEST_CASE("LoRA dropout keeps 1 − p of the elements, keyed by the global row", "[lora]") {
    const pv::LoraDropout d{0.25, 9, 3, 500};
    const int in = 64;
    long long kept = 0;
    const long long N = 200;
    for (long long n = 0; n < N; ++n)
        for (int i = 0; i < in; ++i) kept += pv::lora_keep(d, 5, n, i, in);
    const double fraction = double(kept) / double(N * in);  // 12800 draws: σ ≈ 0.004
    REQUIRE(std::fabs(fraction - 0.75) < 0.02);
    // A micro-batch starting one row later sees the same mask for the same global row.
    const pv::LoraDropout later{0.25, 9, 3, 501};
    int same = 0, differs_by_step = 0;
    const pv::LoraDropout next_step{0.25, 9, 4, 500};
    for (int i = 0; i < in; ++i) {
        same += pv::lora_keep(d, 5, 1, i, in) == pv::lora_keep(later, 5, 0, i, in);
        differs_by_step += pv::lora_keep(d, 5, 1, i, in) != pv::lora_keep(next_step, 5, 1, i, in);
    }
    REQUIRE(same == in);
    REQUIRE(differs_by_step > 0);
}

TEST_CASE("a LoRA model matches the fp64 reference model with PEFT's per-module adapters", "[lora][model]") {
    compare_with_reference<double>("test-tiny", lora_config(3), 1e-12, 1e-10);  // GQA, untied, all seven modules
    compare_with_reference<double>("test-tied", lora_config(2, {"q_proj", "v_proj", "down_proj"}), 1e-12, 1e-10);
    compare_with_reference<double>("test-tiny", lora_config(4, {"k_proj", "up_proj", "o_proj"}), 1e-12, 1e-10);
    compare_with_reference<float>("test-tiny", lora_config(3), 1e-5, 1e-3);
}

TEST_CASE("LoRA layout: adapters train, the base is frozen, counts as PEFT's r·(in + out)", "[lora][model]") {
    const pv::LlamaConfig& c = pv::preset("test-tiny");
    const pv::LoraConfig lora = lora_config(4, {"q_proj", "v_proj", "gate_proj", "down_proj"});
    pv::Llama<float> m(c, options(1, 4, 3, lora));
    const long long C = c.hidden_size, F = c.ffn_size, q = c.q_width(), kv = c.kv_width();
    const long long per_layer = 4 * ((C + q) + (C + kv) + (C + F) + (F + C));
    REQUIRE(m.tensor_elements(pv::GroupKind::trainable) == per_layer * c.num_layers);
    REQUIRE(m.tensor_elements(pv::GroupKind::frozen) == pv::parameter_count(c));
    REQUIRE(m.trainable(0).padded == 0);                  // the embedding is frozen
    REQUIRE(m.trainable(m.num_units() - 1).padded == 0);  // the head too
    for (int u = 1; u + 1 < m.num_units(); ++u) {
        for (const pv::TensorSlot& t : m.trainable(u).tensors) REQUIRE(t.spec.name.find("lora_") != std::string::npos);
        REQUIRE(m.group(u, 1).kind == pv::GroupKind::frozen);
        REQUIRE(m.group(u, 1).tensors.size() == size_t(pv::kBlockTensors));
    }
    // PEFT's names on the parts, and B's rows are the module's rows.
    const pv::TensorSlot& b_qkv = m.trainable(1).find("layers.0.lora_b_qkv");
    REQUIRE(b_qkv.spec.rows == q + kv);
    REQUIRE(b_qkv.spec.parts.size() == 2);
    REQUIRE(b_qkv.spec.parts[1].hf_name == "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
    REQUIRE(b_qkv.spec.parts[1].row_begin == q);
    const pv::TensorSlot& a_gu = m.trainable(1).find("layers.0.lora_a_gate_up");
    REQUIRE(a_gu.spec.rows == 4);  // gate only
    REQUIRE(a_gu.spec.parts[0].hf_name == "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight");
    REQUIRE(!m.trainable(1).find("layers.0.lora_a_down").spec.parts.empty());
    REQUIRE_THROWS_WITH(m.trainable(1).find("layers.0.lora_a_o"), Catch::Contains("no tensor named"));
}

TEST_CASE("LoRA initialisation: A uniform within 1/√in, B zero, so the model starts as its base", "[lora][model]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    pv::Llama<double> base(c, pv::whole_model(2, 6, 17));
    pv::Llama<double> adapted(c, options(2, 6, 17, lora_config(3)));
    const Batch b = make_batch(c, 2, 6, 9);
    REQUIRE(run_step(base, b, false).first == run_step(adapted, b, false).first);  // bit for bit
    const auto params = download(adapted, false);
    const auto base_params = download(base, false);
    for (const auto& [name, v] : params) {
        if (name.find("lora_a") != std::string::npos) {
            const pv::TensorSlot& t = adapted.trainable(1).find("layers.0." + name.substr(name.find("lora_a")));
            const double bound = 1.0 / std::sqrt(double(t.spec.cols));
            double mean = 0, max_abs = 0;
            for (double x : v) mean += x, max_abs = std::max(max_abs, std::fabs(x));
            mean /= double(v.size());
            INFO(name << " mean " << mean << " max " << max_abs << " bound " << bound);
            REQUIRE(max_abs < bound);
            REQUIRE(max_abs > 0.8 * bound);  // spread over the interval, not a narrower law
            REQUIRE(std::fabs(mean) < 0.2 * bound);
        } else if (name.find("lora_b") != std::string::npos) {
            for (double x : v) REQUIRE(x == 0.0);
        } else {
            REQUIRE(v == base_params.at(name));  // the base's values do not depend on the adapters
        }
    }
    // The error messages of a configuration that cannot work.
    REQUIRE_THROWS_WITH(pv::Llama<double>(c, options(1, 4, 1, lora_config(-1))), Catch::Contains("--lora-rank"));
    REQUIRE_THROWS_WITH(pv::Llama<double>(c, options(1, 4, 1, lora_config(2, {}, 1.0))), Catch::Contains("[0, 1)"));
    REQUIRE_THROWS_WITH(pv::parse_lora_targets("q_proj,qkv_proj"), Catch::Contains("unknown module 'qkv_proj'"));
}

TEST_CASE("LoRA whole-model gradient check (fp64): adapters through the frozen base, with dropout",
          "[lora][gradcheck]") {
    struct Variant {
        const char* preset;
        pv::LoraConfig lora;
    };
    for (const auto& [preset, lora] :
         std::vector<Variant>{{"test-tiny", lora_config(2, {}, 0.4)},
                              {"test-tied", lora_config(3, {"q_proj", "k_proj", "up_proj", "down_proj"}, 0.0)}}) {
        const pv::LlamaConfig& c = pv::preset(preset);
        pv::Llama<double> m(c, options(2, 5, 8, lora));
        randomise_b(m, 7);
        const Batch b = make_batch(c, 2, 5, 11);
        const long long step = 6;  // dropout on (when p > 0), the same mask in every evaluation
        const auto [loss0, counted] = run_step(m, b, true, step);
        const auto grads = download(m, true);
        std::mt19937_64 rng(5);
        for (int u = 1; u + 1 < m.num_units(); ++u) {
            const pv::GroupLayout& layout = m.trainable(u);
            std::vector<double> flat(size_t(layout.padded));
            CUDA_CHECK(cudaMemcpy(flat.data(), m.params(u), flat.size() * sizeof(double), cudaMemcpyDeviceToHost));
            auto loss_at = [&] {
                CUDA_CHECK(cudaMemcpy(m.params(u), flat.data(), flat.size() * sizeof(double), cudaMemcpyHostToDevice));
                return run_step(m, b, false, step).first / counted;
            };
            for (const pv::TensorSlot& t : layout.tensors) {
                INFO(preset << " " << t.spec.name);
                check_tensor_gradient(flat, t.offset, t.spec.numel(), grads.at(t.spec.name), loss_at, 12, rng);
            }
            loss_at();
        }
        // Dropout changes the loss only when asked for: evaluation (step −1) draws no mask.
        if (lora.dropout > 0) REQUIRE(run_step(m, b, false, -1).first != loss0);
    }
}

namespace lora_test {

template <class T>
std::vector<T> download_n(const T* p, size_t n) {
    std::vector<T> host(n);
    CUDA_CHECK(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

pv::ModelOptions qlora_options(int B, int T, uint64_t seed, const pv::LoraConfig& lora, bool double_quant) {
    pv::ModelOptions o = options(B, T, seed, lora);
    o.nf4 = true, o.double_quant = double_quant;
    return o;
}

// A QLoRA model and a LoRA model whose base weights are the QLoRA model's dequantised values and
// whose adapters are the same: forward and adapter gradients bit-identical (the same GEMMs on the
// same values), in the dtype given.
template <class T>
void check_qlora_equals_dequantised(bool double_quant) {
    const pv::LlamaConfig& c = pv::preset("test-tiny");
    const pv::LoraConfig lora = lora_config(3, {"q_proj", "v_proj", "o_proj", "down_proj"});
    pv::Llama<T> q(c, qlora_options(2, 6, 13, lora, double_quant));
    pv::Llama<T> dense(c, options(2, 6, 99, lora));  // other seed: every value is copied below
    randomise_b(q, 3);
    for (int u = 0; u < q.num_units(); ++u) {
        CUDA_CHECK(cudaMemcpy(dense.params(u), q.params(u), q.trainable(u).bytes(), cudaMemcpyDeviceToDevice));
        const std::vector<pv::UnitSpec> base = pv::model_units(c);
        for (size_t i = 0; i < base[size_t(u)].tensors.size(); ++i) {
            const pv::TensorSpec& t = base[size_t(u)].tensors[i];
            // The dequantised base: merged_tensor folds the adapters in, so take it with B = 0 first.
            DeviceArray<T> saved_b(size_t(q.trainable(u).padded));
            CUDA_CHECK(cudaMemcpy(saved_b.get(), q.params(u), q.trainable(u).bytes(), cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemset(q.params(u), 0, q.trainable(u).bytes()));
            q.merged_tensor(u, int(i), dense.tensor(t.name));
            CUDA_CHECK(cudaMemcpy(q.params(u), saved_b.get(), q.trainable(u).bytes(), cudaMemcpyDeviceToDevice));
        }
    }
    // The quantised weights really are NF4: within half the widest level gap (0.15) × absmax of the
    // initial N(0, 0.02²) values — and not equal to them.
    pv::Llama<T> unquantised(c, options(2, 6, 13, lora));
    const auto wq = to_double(download_n(dense.tensor("layers.1.w_qkv"), size_t(c.qkv_width() * c.hidden_size)));
    const auto w0 = to_double(download_n(unquantised.tensor("layers.1.w_qkv"), wq.size()));
    double max_err = 0, max_abs = 0;
    for (size_t i = 0; i < wq.size(); ++i)
        max_err = std::max(max_err, std::fabs(wq[i] - w0[i])), max_abs = std::max(max_abs, std::fabs(w0[i]));
    INFO("NF4 error " << max_err << " of max |w| " << max_abs);
    CHECK(max_err > 0);
    CHECK(max_err <= 0.17 * max_abs);
    const Batch b = make_batch(c, 2, 6, 21);
    const auto [lq, nq] = run_step(q, b, true);
    const auto [ld, nd] = run_step(dense, b, true);
    REQUIRE(lq == ld);
    for (int u = 1; u + 1 < q.num_units(); ++u) {
        const size_t n = size_t(q.trainable(u).padded);
        std::vector<T> gq(n), gd(n);
        CUDA_CHECK(cudaMemcpy(gq.data(), q.grads(u), n * sizeof(T), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(gd.data(), dense.grads(u), n * sizeof(T), cudaMemcpyDeviceToHost));
        REQUIRE(to_double(gq) == to_double(gd));
    }
}

}  // namespace lora_test

TEST_CASE("a QLoRA model computes exactly the LoRA model on its dequantised weights", "[lora][nf4][model]") {
    check_qlora_equals_dequantised<double>(true);
    check_qlora_equals_dequantised<float>(false);
    check_qlora_equals_dequantised<__nv_bfloat16>(true);
}

TEST_CASE("QLoRA layout: NF4 groups hold the blocks' linears, 4.127 bits each, any slice initialises alone",
          "[lora][nf4][model]") {
    const pv::LlamaConfig& c = pv::preset("test-tied");
    pv::ModelOptions o = qlora_options(1, 4, 5, lora_config(2), true);
    o.placement.shards = 3;
    o.placement.gradients = pv::Gradients::none;
    pv::Llama<float> m(c, o);
    const long long per_layer = (long long)c.qkv_width() * c.hidden_size + (long long)c.q_width() * c.hidden_size +
                                3LL * c.ffn_size * c.hidden_size;
    REQUIRE(m.nf4_tensor_elements() == per_layer * c.num_layers);
    for (int u = 1; u + 1 < m.num_units(); ++u) {
        const pv::GroupLayout& g = m.group(u, m.num_groups(u) - 1);
        REQUIRE(g.kind == pv::GroupKind::nf4);
        REQUIRE(g.tensors.size() == 4);
        REQUIRE(g.bytes() % (256 * 3) == 0);  // shards split at 256-byte (whole-block) boundaries
        // Bytes against the format: per part ceil(n/2) + ceil(n/64) + 4·ceil(n/64/256) + 4, each
        // field 256-aligned, at most 4 fields · 255 bytes of alignment per part.
        long long format = 0, parts = 0;
        for (const pv::TensorSlot& t : g.tensors)
            for (const pv::TensorPart& p : t.spec.parts) {
                const long long n = p.rows * t.spec.cols, blocks = (n + 63) / 64;
                format += (n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256) + 4, ++parts;
            }
        REQUIRE(g.used * 4 >= format);
        REQUIRE(g.used * 4 <= format + parts * 4 * 255 + 255 * 4);
        for (long long begin : {0LL, g.padded / 3, 2 * g.padded / 3}) {  // the three shards alone
            DeviceArray<float> slice(size_t(g.padded / 3));
            m.init_params(u, m.num_groups(u) - 1, slice.get(), begin, begin + g.padded / 3, 5);
            std::vector<float> whole(size_t(g.padded));
            CUDA_CHECK(
                cudaMemcpy(whole.data(), m.group_params(u, m.num_groups(u) - 1), g.bytes(), cudaMemcpyDeviceToHost));
            const auto got = slice.download();
            REQUIRE(std::memcmp(got.data(), whole.data() + begin, got.size() * sizeof(float)) == 0);
        }
    }
    REQUIRE_THROWS_WITH(pv::Llama<float>(c,
                                         [&] {
                                             pv::ModelOptions no_lora = pv::whole_model(1, 4, 5);
                                             no_lora.nf4 = true;
                                             return no_lora;
                                         }()),
                        Catch::Contains("needs LoRA"));
}

// fp64 central differences through one fused adapter on top of a frozen base GEMM (the linear as
// the model runs it: y = x·Wᵀ + s·(drop(x)·Aᵀ)·Bᵀ): dx (the frozen path plus the adapter's), dA and
// dB against L = <g, y>, with dropout on, for every element.
TEST_CASE("LoRA linear gradient check (fp64): dx through the frozen base and the adapter, dA, dB, dropout",
          "[lora][gradcheck]") {
    const int N = 5, in = 7, out = 9, rank = 2;
    pv::LoraShape s;
    s.in = in, s.out = out, s.rank = rank, s.parts = 2, s.scale = 1.5;
    s.part[0] = {0, 4, 0};
    s.part[1] = {6, 3, 4};  // rows 4-5 have no adapter
    const pv::LoraDropout d{0.3, 77, 2, 40};
    std::vector<double> x = random_vector<double>(N * in, 1), w = random_vector<double>(out * in, 2),
                        a = random_vector<double>(2 * rank * in, 3), b = random_vector<double>(7 * rank, 4);
    const std::vector<double> g = random_vector<double>(N * out, 5);
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    DeviceArray<double> dw(w), dy(g), u(size_t(N * 2 * rank)), y(size_t(N * out)), dropped(size_t(N * in)),
        du(size_t(N * 2 * rank));
    auto loss = [&] {
        DeviceArray<double> dx_(x), da_(a), db_(b);
        pv::matmul_forward(h, dx_.get(), dw.get(), y.get(), N, in, out, nullptr);
        pv::lora_forward(h, dx_.get(), da_.get(), db_.get(), y.get(), u.get(), dropped.get(), N, s, d, 9, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        return dot(y.download(), g);
    };
    loss();
    DeviceArray<double> xd(x), ad(a), bd(b), gx(size_t(N * in)), ga(std::vector<double>(a.size(), 0.0)),
        gb(std::vector<double>(b.size(), 0.0));
    pv::matmul_backward(h, dy.get(), xd.get(), dw.get(), gx.get(), static_cast<double*>(nullptr), N, in, out, false,
                        nullptr);  // the frozen base: dx only
    pv::lora_backward(h, dy.get(), xd.get(), ad.get(), bd.get(), u.get(), gx.get(), ga.get(), gb.get(), du.get(),
                      dropped.get(), N, s, d, 9, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (const auto& [name, param, grad] :
         std::vector<std::tuple<const char*, std::vector<double>*, std::vector<double>>>{
             {"dx", &x, gx.download()}, {"dA", &a, ga.download()}, {"dB", &b, gb.download()}}) {
        const std::string err = compare(grad, numerical_gradient(*param, loss), kGradTolerance);
        INFO(name << ": " << err);
        CHECK(err.empty());
    }
    CUBLAS_CHECK(cublasDestroy(h));  // after the last loss()
}

// A whole LoRA block (fp64): the gradient of its input (dresidual_in: the residual, both norms and
// the frozen linears with their adapters, attention, SwiGLU) against central differences of
// <g, block output>, with dropout on.
TEST_CASE("LoRA block gradient check (fp64): the block input's gradient through frozen linears and adapters",
          "[lora][gradcheck]") {
    const pv::LlamaConfig& c = pv::preset("test-tiny");
    const int B = 1, Tn = 4, C = c.hidden_size;
    pv::Llama<double> m(c, options(B, Tn, 12, lora_config(2, {"q_proj", "v_proj", "up_proj", "down_proj"}, 0.25)));
    randomise_b(m, 31);
    std::vector<double> x = random_vector<double>(size_t(B * Tn * C), 8);
    const std::vector<double> g = random_vector<double>(size_t(B * Tn * C), 9);
    DeviceArray<double> xin(x.size()), gout(g), gin(x.size());
    pv::UnitIO<double> io;
    io.step = 3, io.first_row = 17;
    auto loss = [&] {
        xin.upload(x);
        io.residual_in = xin.get();
        io.residual_out = m.unit_output(1, 0);
        m.forward_unit(1, 0, io);
        CUDA_CHECK(cudaDeviceSynchronize());
        return dot(download_n(m.unit_output(1, 0), x.size()), g);
    };
    loss();
    pv::UnitIO<double> back = io;
    back.dresidual_out = gout.get();
    back.dresidual_in = gin.get();
    m.backward_unit(1, 0, back);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::string err = compare(gin.download(), numerical_gradient(x, loss), kGradTolerance);
    INFO(err);
    CHECK(err.empty());
}
