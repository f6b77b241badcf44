// The KV-cache decoder (model/decoder.h) against full recomputation: a prompt is prefilled, then
// tokens are chosen greedily from the decoder's logits one step at a time; afterwards one forward of
// the model (model/unit_loop.h) over the whole sequence as a single window must give, at every
// position the decoder produced logits for, the same logits within the dtype's tolerance, and the
// same greedy choice. In fp64, fp32 and bf16; GQA (3 query heads per KV head), tied and untied,
// head dims 8 (generic), 64 and 128 (specialised), query width unequal to the hidden size, odd
// vocabularies; the prefill in one pass, in passes of 3 rows and one row at a time.
//
// The weights are not the training initialisation (N(0, 0.02) gives nearly uniform logits, where
// the greedy choice would hang on rounding): every matrix is uniform with unit-variance outputs
// and the norms' weights lie in [0.5, 1.5], so the logits spread over several units.
#include "kernels/common.cuh"
#include "model/decoder.h"
#include "model/sampling.h"
#include "model/unit_loop.h"
#include "test/check.h"
#include "test/error_of.h"

#include <cmath>
#include <random>

using namespace pv::test;

namespace decoder_test {

// Fresh weights for every tensor of every group (padding untouched: never read).
template <class T>
void randomise_weights(pv::Llama<T>& m, uint64_t seed) {
    for (int u = 0; u < m.num_units(); ++u)
        for (int g = 0; g < m.num_groups(u); ++g)
            for (const pv::TensorSlot& t : m.group(u, g).tensors) {
                const bool norm = t.spec.init == pv::Init::ones;
                const double a = norm ? 0.5 : std::sqrt(3.0 / double(t.spec.cols));
                auto v = random_vector<T>(size_t(t.spec.numel()), seed++, norm ? 0.5 : -a, norm ? 1.5 : a);
                CUDA_CHECK(cudaMemcpy(m.group_params(u, g) + t.offset, v.data(), v.size() * sizeof(T),
                                      cudaMemcpyHostToDevice));
            }
}

int greedy(const std::vector<double>& logits) { return pv::sample_token(logits, 0.0, 1.0, 0.0); }

// A model of this shape with the name of the case.
pv::LlamaConfig shape(const std::string& name, int vocab, int hidden, int layers, int heads, int kv_heads, int head_dim,
                      int ffn, int max_positions, bool tied) {
    pv::LlamaConfig c;
    c.name = name;
    c.vocab_size = vocab, c.hidden_size = hidden, c.num_layers = layers, c.num_heads = heads;
    c.num_kv_heads = kv_heads, c.head_dim = head_dim, c.ffn_size = ffn, c.max_seq_len = max_positions;
    c.tie_embeddings = tied;
    return c;
}

// Decodes greedily from a random prompt of `prompt` tokens up to `total` tokens with passes of at
// most max_rows rows, then checks every decoded position against one forward over the sequence.
template <class T>
void check_against_recomputation(const pv::LlamaConfig& c, int prompt, int total, int max_rows, uint64_t seed) {
    pv::ModelOptions o = pv::whole_model(1, total, seed, pv::Gradients::none);
    // The decoder keeps P in fp32, and so does the bf16 forward it is held to (the CUDA-core kernel:
    // the tensor cores' one bf16 would differ from it by more than the bf16 tolerance).
    o.attention_p_fp32 = true;
    pv::Llama<T> model(c, o);
    randomise_weights(model, seed);
    std::mt19937_64 rng(seed);
    std::vector<int> seq;
    for (int i = 0; i < prompt; ++i) seq.push_back(int(rng() % uint64_t(c.vocab_size)));

    // What the decoder allocates is what decoder_buffers (the memory planner's figure) lists.
    const pv::MemoryStats before = pv::memory_stats();
    pv::Decoder<T> decoder(model, total, max_rows);
    const pv::MemoryStats after = pv::memory_stats();
    size_t cache = 0, work = 0;
    const auto buffers = pv::decoder_buffers(c, pv::dtype_of<T>(), model.lora(), total, max_rows);
    for (size_t i = 0; i < buffers.size(); ++i)
        (int(i) < pv::kDecoderCacheBuffers ? cache : work) += buffers[i].bytes();
    const auto grew = [&](pv::MemoryCategory k) { return after.current[size_t(k)] - before.current[size_t(k)]; };
    CHECK(grew(pv::MemoryCategory::activations) == cache);
    CHECK(grew(pv::MemoryCategory::workspace) == work);
    CHECK(cache == decoder.cache_bytes());
    std::vector<double> decoded;  // the logits of positions prompt − 1 .. total − 2, in order
    std::vector<double> logits = decoder.prefill(seq);
    for (int t = prompt - 1; t + 1 < total; ++t) {
        decoded.insert(decoded.end(), logits.begin(), logits.end());
        seq.push_back(greedy(logits));
        if (t + 2 < total) logits = decoder.step(seq.back());
    }
    REQUIRE(decoder.position() == total - 1);  // the last token is chosen, never fed

    // The whole sequence through the model as one window.
    DeviceArray<int> tokens(seq);
    pv::single_forward<T>(model, 0, pv::DeviceBatch{tokens.get()}, nullptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const size_t V = size_t(c.vocab_size);
    const std::vector<double> all = to_double(download_logits(model, 0));
    const std::vector<double> expected(all.begin() + long(size_t(prompt - 1) * V), all.end() - long(V));
    const std::string err = compare(decoded, expected, tolerance<T>());
    INFO(c.name << " "
                << (sizeof(T) == 2   ? "bf16"
                    : sizeof(T) == 4 ? "fp32"
                                     : "fp64")
                << " prompt " << prompt << " total " << total << " max_rows " << max_rows << "\n"
                << err);
    REQUIRE(err.empty());
    for (int t = prompt - 1; t + 1 < total; ++t) {
        const std::vector<double> row(all.begin() + long(size_t(t) * V), all.begin() + long(size_t(t + 1) * V));
        INFO("position " << t);
        REQUIRE(greedy(row) == seq[size_t(t + 1)]);
    }
}

template <class T>
void check_shapes(uint64_t seed) {
    // GQA 6/2 at hd 8, untied (test-tiny's shape); tied with 3 layers (test-tied's shape).
    const pv::LlamaConfig tiny = shape("gqa-untied-hd8", 67, 48, 2, 6, 2, 8, 40, 32, false);
    const pv::LlamaConfig tied = shape("gqa-tied-hd8", 65, 48, 3, 6, 2, 8, 40, 32, true);
    // hd 64 with a query width (3·64) unequal to the hidden size; MHA at hd 128.
    const pv::LlamaConfig wide = shape("hd64-q192", 71, 40, 2, 3, 1, 64, 52, 40, false);
    const pv::LlamaConfig mha = shape("mha-hd128-tied", 53, 36, 1, 2, 2, 128, 28, 24, true);
    check_against_recomputation<T>(tiny, 7, 30, 30, seed);      // the prompt in one pass
    check_against_recomputation<T>(tied, 5, 23, 3, seed + 1);   // prefill passes of 3 rows: 3 + 2
    check_against_recomputation<T>(wide, 9, 37, 1, seed + 2);   // the prompt one row at a time
    check_against_recomputation<T>(mha, 11, 24, 11, seed + 3);  // a prompt of exactly one pass
}

}  // namespace decoder_test

using namespace decoder_test;

TEST_CASE("cached decoding equals full recomputation at every position, greedy identical (fp64)", "[decoder]") {
    check_shapes<double>(100);
}

TEST_CASE("cached decoding equals full recomputation at every position, greedy identical (fp32)", "[decoder]") {
    check_shapes<float>(200);
}

TEST_CASE("cached decoding equals full recomputation at every position, greedy identical (bf16)", "[decoder]") {
    check_shapes<__nv_bfloat16>(300);
}

TEST_CASE("the decoder refuses positions past its cache, bad tokens and impossible sizes", "[decoder]") {
    const pv::LlamaConfig c = shape("small", 30, 16, 1, 2, 1, 8, 12, 10, false);
    pv::Llama<float> model(c, pv::whole_model(1, 1, 1, pv::Gradients::none));
    pv::Decoder<float> d(model, 8, 4);
    d.prefill({1, 2, 3, 4, 5, 6});
    const std::string past = error_of<std::out_of_range>([&] { d.prefill({1, 2, 3}); });
    REQUIRE(past.find("6 cached positions + 3 new tokens exceed the cache's 8 positions") != std::string::npos);
    REQUIRE(d.position() == 6);  // nothing was added
    d.step(7);
    d.step(8);
    REQUIRE_THROWS_AS(d.step(9), std::out_of_range);
    d.reset();
    REQUIRE(d.position() == 0);
    REQUIRE(error_of<std::invalid_argument>([&] { d.prefill({1, 30}); }).find("token 30") != std::string::npos);
    REQUIRE(error_of<std::invalid_argument>([&] { d.prefill({}); }).find("no tokens") != std::string::npos);
    REQUIRE(error_of<std::invalid_argument>([&] {
                pv::Decoder<float>(model, 11, 4);
            }).find("max_positions = 11 must be in [1, 10]") != std::string::npos);
    REQUIRE(error_of<std::invalid_argument>([&] {
                pv::Decoder<float>(model, 5, 6);
            }).find("max_rows = 6 must be in [1, 5]") != std::string::npos);
}

TEST_CASE("after reset the decoder gives the logits of a fresh start", "[decoder]") {
    const pv::LlamaConfig c = shape("small", 37, 24, 2, 4, 2, 6, 20, 16, true);
    pv::Llama<double> model(c, pv::whole_model(1, 1, 5, pv::Gradients::none));
    randomise_weights(model, 5);
    pv::Decoder<double> d(model, 16, 16);
    const std::vector<double> first = d.prefill({3, 1, 4, 1, 5});
    d.step(9);
    d.step(2);
    d.reset();
    const std::vector<double> again = d.prefill({3, 1, 4, 1, 5});
    REQUIRE(again == first);  // the cache's old rows are overwritten before they are read
}
