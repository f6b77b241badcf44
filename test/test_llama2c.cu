// llama2.c checkpoints -> Hugging Face directories (formats/llama2c.h).
//
// The oracle for the q/k permutation is the reference model itself, not the permutation: the
// llama2.c weights are read here straight from the .bin (independently of the converter) and fed
// to the fp64 reference (test/reference/llama.h) with llama2.c's own interleaved RoPE, while the
// polevault model runs the converted directory with Hugging Face's rotate_half RoPE. Equal logits
// then mean the converter's permutation is exactly the one that turns one RoPE into the other.
// The real stories260K (dim 64, 5 layers, 8 heads, 4 KV heads, tied) and a small untied model
// written here (a separate classifier) both go through it; a malformed file is refused with the
// reason, and nothing is left behind.
#include "formats/config_json.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/unit_loop.h"
#include "test/check.h"
#include "test/error_of.h"
#include "test/reference/llama.h"
#include "test/temp_dir.h"
#include "trainer/load.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

namespace llama2c_test {

namespace fs = std::filesystem;
using pv::test::error_of;
using pv::test::TempDir;

// The real checkpoint (tests run from the repository root; ../shared is beside it).
fs::path stories260k() { return fs::path(__FILE__).parent_path() / "../../shared/models/stories260K.bin"; }

struct Bin {
    int dim, hidden, layers, heads, kv_heads, vocab, seq_len;  // vocab as stored (negative: untied)
    std::vector<float> weights;                                // everything after the header
};

Bin read_bin(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    REQUIRE(bytes.size() > 28);
    Bin b;
    int header[7];
    std::memcpy(header, bytes.data(), 28);
    b.dim = header[0], b.hidden = header[1], b.layers = header[2], b.heads = header[3], b.kv_heads = header[4];
    b.vocab = header[5], b.seq_len = header[6];
    b.weights.resize((bytes.size() - 28) / 4);
    std::memcpy(b.weights.data(), bytes.data() + 28, b.weights.size() * 4);
    return b;
}

void write_bin(const fs::path& path, const Bin& b) {
    std::ofstream out(path, std::ios::binary);
    const int header[7] = {b.dim, b.hidden, b.layers, b.heads, b.kv_heads, b.vocab, b.seq_len};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(reinterpret_cast<const char*>(b.weights.data()), std::streamsize(b.weights.size() * 4));
}

// llama2.c's arrays in file order (run.c's memory_map_weights), as the reference model's tensors:
// [Wq; Wk; Wv] and [W1 (gate); W3 (up)] stacked as polevault fuses them, rows as llama2.c has them.
pv::reference::Tensors reference_tensors(const Bin& b) {
    const size_t V = size_t(std::abs(b.vocab)), D = size_t(b.dim), F = size_t(b.hidden), L = size_t(b.layers);
    const size_t hs = D / size_t(b.heads), kv = size_t(b.kv_heads) * hs;
    size_t at = 0;
    auto take = [&](size_t n) {
        std::vector<double> v(b.weights.begin() + long(at), b.weights.begin() + long(at + n));
        at += n;
        return v;
    };
    pv::reference::Tensors t;
    t["wte"] = take(V * D);
    std::vector<std::vector<double>> att(L), wq(L), wk(L), wv(L), wo(L), ffn(L), w1(L), w2(L), w3(L);
    for (auto& x : att) x = take(D);
    for (auto& x : wq) x = take(D * D);
    for (auto& x : wk) x = take(kv * D);
    for (auto& x : wv) x = take(kv * D);
    for (auto& x : wo) x = take(D * D);
    for (auto& x : ffn) x = take(D);
    for (auto& x : w1) x = take(F * D);
    for (auto& x : w2) x = take(D * F);
    for (auto& x : w3) x = take(F * D);
    t["final_norm"] = take(D);
    take(size_t(b.seq_len) * hs);  // freq_cis_real and freq_cis_imag
    if (b.vocab < 0) t["lm_head"] = take(V * D);
    REQUIRE(at == b.weights.size());
    for (size_t l = 0; l < L; ++l) {
        const std::string n = "layers." + std::to_string(l) + ".";
        t[n + "attn_norm"] = att[l];
        t[n + "w_qkv"] = wq[l];
        t[n + "w_qkv"].insert(t[n + "w_qkv"].end(), wk[l].begin(), wk[l].end());
        t[n + "w_qkv"].insert(t[n + "w_qkv"].end(), wv[l].begin(), wv[l].end());
        t[n + "w_o"] = wo[l];
        t[n + "mlp_norm"] = ffn[l];
        t[n + "w_gate_up"] = w1[l];
        t[n + "w_gate_up"].insert(t[n + "w_gate_up"].end(), w3[l].begin(), w3[l].end());
        t[n + "w_down"] = w2[l];
    }
    return t;
}

// The polevault fp64 model on the converted directory vs the reference on the .bin's weights with
// interleaved RoPE: logits within 1e-12; and the reference with rotate_half RoPE on the same,
// unpermuted weights differs (else the test could not see a missing permutation).
void check_forward(const fs::path& bin, const fs::path& dir) {
    const Bin b = read_bin(bin);
    const pv::LlamaConfig c = pv::read_hf_config((dir / "config.json").string());
    const int B = 2, T = std::min(19, c.max_seq_len);
    pv::Llama<double> model(c, pv::whole_model(B, T, 3, pv::Gradients::none));
    pv::load_model_weights(dir.string(), model);
    std::mt19937_64 rng(11);
    std::vector<int> tokens(size_t(B * T)), targets(size_t(B * T));
    for (int& t : tokens) t = int(rng() % uint64_t(c.vocab_size));
    for (int& t : targets) t = int(rng() % uint64_t(c.vocab_size));
    pv::test::DeviceArray<int> d_tokens(tokens), d_targets(targets);
    pv::test::DeviceArray<double> loss(1);
    pv::test::DeviceArray<int> count(1);
    pv::single_forward(model, 0, pv::DeviceBatch{d_tokens.get(), d_targets.get()}, loss.get(), count.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<double> logits = pv::test::download_logits(model, 0);

    const pv::reference::Tensors weights = reference_tensors(b);
    const auto ref = pv::reference::llama_forward_backward(c, weights, tokens, targets, B, T, 1.0, false, nullptr,
                                                           pv::reference::RopePairs::interleaved);
    const std::string err = pv::test::compare(logits, ref.logits, 1e-12);
    INFO(err);
    CHECK(err.empty());
    CHECK(std::fabs(loss.download()[0] - ref.loss_sum) <= 1e-12 * std::fabs(ref.loss_sum));
    const auto unpermuted = pv::reference::llama_forward_backward(c, weights, tokens, targets, B, T, 1.0, false);
    CHECK_FALSE(pv::test::compare(logits, unpermuted.logits, 1e-6).empty());
}

}  // namespace llama2c_test

using namespace llama2c_test;

TEST_CASE("llama2c: stories260K converted computes llama2.c's forward in fp64 (interleaved RoPE reference)",
          "[llama2c]") {
    INFO("the real llama2.c checkpoint: " << stories260k()
                                          << " (the shared models directory beside the repository; it must exist)");
    REQUIRE(fs::exists(stories260k()));
    TempDir dir("llama2c_stories");
    const pv::LlamaConfig returned = pv::convert_llama2c(stories260k().string(), dir.file("out"));
    const fs::path out = dir.path / "out";
    for (const char* f : {"config.json", "model.safetensors", "generation_config.json"}) CHECK(fs::exists(out / f));
    CHECK_FALSE(fs::exists(out / "tokenizer.json"));
    CHECK_FALSE(fs::exists(dir.path / "out.tmp"));
    // The config llama2.c's header and constants imply, written out by hand.
    const pv::LlamaConfig c = pv::read_hf_config((out / "config.json").string());
    CHECK(c.vocab_size == 512);
    CHECK(c.hidden_size == 64);
    CHECK(c.ffn_size == 172);
    CHECK(c.num_layers == 5);
    CHECK(c.num_heads == 8);
    CHECK(c.num_kv_heads == 4);
    CHECK(c.head_dim_resolved() == 8);
    CHECK(c.max_seq_len == 512);
    CHECK(c.tie_embeddings);
    CHECK(c.rms_norm_eps == 1e-5);
    CHECK(c.rope_theta == 10000.0);
    CHECK_FALSE(c.rope_scaling.enabled());
    CHECK(returned.num_kv_heads == 4);
    CHECK(pv::read_hf_torch_dtype((out / "config.json").string()) == "float32");
    const pv::GenerationConfig g = pv::read_generation_config((out / "generation_config.json").string());
    CHECK(g.bos_token_id == 1);
    CHECK(g.eos_token_ids == std::vector<int>{2});
    const pv::SafeTensorsFile f = pv::read_safetensors((out / "model.safetensors").string());
    CHECK(f.tensors.size() == 1 + 5 * 9 + 1);  // tied: no lm_head.weight
    for (const pv::SafeTensor& t : f.tensors) CHECK(t.dtype == "F32");
    check_forward(stories260k(), out);
}

TEST_CASE("llama2c: an untied model with GQA: lm_head from the classifier, q/k rows permuted per head, the forward",
          "[llama2c]") {
    TempDir dir("llama2c_untied");
    Bin b{16, 24, 2, 4, 2, -37, 8, {}};  // head size 4, 2 query heads per KV head, separate classifier
    const size_t V = 37, D = 16, F = 24, L = 2, kv = 8;
    const size_t n = V * D + L * D + L * D * D + 2 * L * kv * D + L * D * D + L * D + 3 * L * F * D + D +
                     size_t(b.seq_len) * 4 + V * D;
    b.weights = pv::test::random_vector<float>(n, 5, -0.5, 0.5);
    write_bin(dir.path / "model.bin", b);
    pv::convert_llama2c(dir.file("model.bin"), dir.file("hf"));
    const pv::LlamaConfig c = pv::read_hf_config(dir.file("hf/config.json"));
    CHECK_FALSE(c.tie_embeddings);
    CHECK(c.vocab_size == 37);
    const pv::SafeTensorsFile f = pv::read_safetensors(dir.file("hf/model.safetensors"));
    const auto row = [&](const std::string& name, size_t r, size_t cols) {
        std::vector<float> v(cols);
        std::memcpy(v.data(), f.at(name).data.data() + r * cols * 4, cols * 4);
        return v;
    };
    const auto file_row = [&](size_t offset, size_t r, size_t cols) {
        return std::vector<float>(b.weights.begin() + long(offset + r * cols),
                                  b.weights.begin() + long(offset + (r + 1) * cols));
    };
    // Layer 1's q and k: rotate_half row h·4 + p·2 + j holds interleaved row h·4 + 2j + p.
    const size_t wq = V * D + L * D, wk = wq + L * D * D, wv = wk + L * kv * D;
    for (size_t h = 0; h < 4; ++h)
        for (size_t p = 0; p < 2; ++p)
            for (size_t j = 0; j < 2; ++j) {
                CHECK(row("model.layers.1.self_attn.q_proj.weight", h * 4 + p * 2 + j, D) ==
                      file_row(wq + D * D, h * 4 + 2 * j + p, D));
                if (h < 2)
                    CHECK(row("model.layers.1.self_attn.k_proj.weight", h * 4 + p * 2 + j, D) ==
                          file_row(wk + kv * D, h * 4 + 2 * j + p, D));
            }
    for (size_t r = 0; r < kv; ++r)
        CHECK(row("model.layers.1.self_attn.v_proj.weight", r, D) == file_row(wv + kv * D, r, D));
    const size_t wcls = n - V * D;
    for (size_t r = 0; r < V; ++r) CHECK(row("lm_head.weight", r, D) == file_row(wcls, r, D));
    check_forward(dir.path / "model.bin", dir.path / "hf");
}

TEST_CASE("llama2c: rotate_half row order", "[llama2c]") {
    CHECK(pv::rotate_half_row_order(1, 2) == std::vector<long long>{0, 1});
    CHECK(pv::rotate_half_row_order(2, 4) == std::vector<long long>{0, 2, 1, 3, 4, 6, 5, 7});
    CHECK(pv::rotate_half_row_order(1, 6) == std::vector<long long>{0, 2, 4, 1, 3, 5});
}

TEST_CASE("llama2c: a malformed file is refused with the reason, and nothing is written", "[llama2c]") {
    TempDir dir("llama2c_bad");
    Bin good{8, 12, 1, 2, 1, 11, 4, {}};                                      // head size 4
    const size_t n = 11 * 8 + 8 + 64 + 2 * 32 + 64 + 8 + 3 * 96 + 8 + 4 * 4;  // the RoPE tables: 2 × 4 × 4/2
    good.weights = pv::test::random_vector<float>(n, 1);
    write_bin(dir.path / "good.bin", good);
    REQUIRE_NOTHROW(pv::read_llama2c_header(dir.file("good.bin")));
    const auto refused = [&](const Bin& b, const std::vector<std::string>& says) {
        write_bin(dir.path / "bad.bin", b);
        const std::string what =
            error_of<std::runtime_error>([&] { pv::convert_llama2c(dir.file("bad.bin"), dir.file("out")); });
        INFO(what);
        CHECK_THAT(what, Catch::Contains(dir.file("bad.bin")));
        for (const std::string& s : says) CHECK_THAT(what, Catch::Contains(s));
        CHECK_FALSE(fs::exists(dir.path / "out"));
        CHECK_FALSE(fs::exists(dir.path / "out.tmp"));
    };
    SECTION("shorter than the header") {
        std::ofstream(dir.path / "bad.bin", std::ios::binary) << "0123456789";
        const std::string what =
            error_of<std::runtime_error>([&] { pv::convert_llama2c(dir.file("bad.bin"), dir.file("out")); });
        CHECK_THAT(what, Catch::Contains("10 bytes") && Catch::Contains("28-byte header"));
    }
    SECTION("a field that is not positive") {
        Bin b = good;
        b.layers = 0;
        refused(b, {"n_layers = 0", "must be positive"});
    }
    SECTION("dim not a multiple of n_heads") {
        Bin b = good;
        b.heads = 3;
        refused(b, {"dim 8 is not a multiple of n_heads 3"});
    }
    SECTION("n_heads not a multiple of n_kv_heads") {
        Bin b = good;
        b.heads = 4, b.kv_heads = 3;
        refused(b, {"n_heads 4 is not a multiple of n_kv_heads 3"});
    }
    SECTION("an odd head size") {
        Bin b = good;
        b.heads = 8, b.kv_heads = 8;
        refused(b, {"head size", "= 1 is odd"});
    }
    SECTION("one weight short, one too many, or a classifier the header does not announce") {
        Bin b = good;
        b.weights.pop_back();
        refused(b, {"is " + std::to_string(28 + 4 * (n - 1)) + " bytes", "implies " + std::to_string(28 + 4 * n),
                    "truncated"});
        b.weights.push_back(1.0f), b.weights.push_back(1.0f);
        refused(b, {"implies " + std::to_string(28 + 4 * n)});
        b = good;
        b.vocab = -11;  // untied: needs another 11 × 8 floats
        refused(b, {"separate classifier", "implies " + std::to_string(28 + 4 * (n + 88))});
    }
    SECTION("llama2.c's versioned export format") {
        Bin b = good;
        b.dim = 0x616b3432;
        refused(b, {"ak42", "--version 0"});
    }
    SECTION("an output directory that is not empty") {
        fs::create_directories(dir.path / "taken");
        std::ofstream(dir.path / "taken" / "keep.txt") << "mine";
        const std::string what =
            error_of<std::runtime_error>([&] { pv::convert_llama2c(dir.file("good.bin"), dir.file("taken")); });
        CHECK_THAT(what, Catch::Contains("taken") && Catch::Contains("not an empty directory"));
        CHECK(fs::exists(dir.path / "taken" / "keep.txt"));
    }
}
