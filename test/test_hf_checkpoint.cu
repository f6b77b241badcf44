// Hugging Face model directories in (formats/hf_checkpoint.h, trainer/load.h), as --init-from and
// `train sample` read them.
//
// The directories are written by hand (test/hf_model_dir.h), from Hugging Face's naming and
// save_pretrained's sharding (an index naming each tensor's file), not from polevault's layouts: a model whose
// head_dim is given (q width ≠ hidden), GQA, untied and tied; tensors spread over three files in
// an odd order, each file listing its tensors shuffled, BF16, F16 and F32 mixed. The values are
// random bit patterns decoded here independently (ldexp on the fields), F16 subnormals included,
// so loading must reproduce them exactly in fp64 and fp32 and as an independent round-to-nearest-
// even in bf16. Every refusal is checked with its message, and a refused load leaves the model
// as it was (never a partial load). Conversion exactness over all 65536 F16 patterns, overflow
// counts, and ranged reads across the reader's chunk boundary.
#include "formats/config_json.h"
#include "formats/dtype_conversion.h"
#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "test/error_of.h"
#include "test/hf_model_dir.h"
#include "test/temp_dir.h"
#include "trainer/load.h"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

namespace hf_checkpoint_test {

namespace fs = std::filesystem;
using namespace pv::test;

// GQA with head_dim given (4 heads of 12: q width 48, hidden 40), odd sizes.
pv::LlamaConfig small_model(bool tied) {
    pv::LlamaConfig c;
    c.name = "small";
    c.vocab_size = 53;
    c.hidden_size = 40;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 12;
    c.ffn_size = 36;
    c.max_seq_len = 16;
    c.tie_embeddings = tied;
    return c;
}

template <class T>
std::vector<double> download_tensor(pv::Llama<T>& m, const std::string& ours, long long row0, long long numel,
                                    long long cols) {
    std::vector<T> host(static_cast<size_t>(numel));
    CUDA_CHECK(cudaMemcpy(host.data(), m.tensor(ours) + row0 * cols, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<double> out;
    for (const T& v : host) out.push_back(double(pv::to_acc(v)));
    return out;
}

// Loads `dir` into a whole model of type T and checks every tensor against `expected` (converted
// to T: exact for fp64 and fp32, round to nearest even for bf16), and every padding element zero.
template <class T>
pv::LoadStats check_load(const fs::path& dir, const pv::LlamaConfig& c,
                         const std::map<std::string, std::vector<double>>& expected) {
    pv::Llama<T> m(c, pv::whole_model(1, 4, 5, pv::Gradients::none));
    const pv::LoadStats stats = pv::load_model_weights(dir.string(), m);
    for (const HfTensor& t : hf_tensors(c)) {
        INFO(t.name << " as " << pv::dtype_name(pv::dtype_of<T>()));
        const long long cols = t.shape.size() == 1 ? 1 : t.shape[1];
        const std::vector<double> got = download_tensor(m, t.ours, t.row0, t.numel(), cols);
        std::vector<double> want = expected.at(t.name);
        if (std::is_same_v<T, __nv_bfloat16>)
            for (double& v : want) v = bf16_round(v);
        REQUIRE(got == want);
    }
    for (int u = 0; u < m.num_units(); ++u)
        for (int g = 0; g < m.num_groups(u); ++g) {
            const pv::GroupLayout& layout = m.group(u, g);
            std::vector<T> all(size_t(layout.padded));
            CUDA_CHECK(cudaMemcpy(all.data(), m.group_params(u, g), all.size() * sizeof(T), cudaMemcpyDeviceToHost));
            std::vector<bool> inside(all.size(), false);
            for (const pv::TensorSlot& s : layout.tensors)
                for (long long i = 0; i < s.spec.numel(); ++i) inside[size_t(s.offset + i)] = true;
            for (size_t i = 0; i < all.size(); ++i)
                if (!inside[i]) REQUIRE(double(pv::to_acc(all[i])) == 0.0);
        }
    return stats;
}

uint64_t file_bytes(const fs::path& dir) {
    uint64_t n = 0;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") n += fs::file_size(e.path());
    return n;
}

}  // namespace hf_checkpoint_test

using namespace hf_checkpoint_test;

TEST_CASE("hf checkpoint: a sharded directory (3 files, odd order, BF16/F16/F32 mixed) loads exactly in every dtype",
          "[hf_checkpoint]") {
    TempDir dir("hf_sharded");
    for (bool tied : {false, true}) {
        INFO((tied ? "tied" : "untied"));
        const pv::LlamaConfig c = small_model(tied);
        const fs::path d = dir.path / (tied ? "tied" : "untied");
        // Older transformers saved RoPE's inverse frequencies with every layer; HF skips them by name.
        const auto expected = write_model_dir(d, c, 3,
                                              {f32_tensor("model.layers.0.self_attn.rotary_emb.inv_freq", {6}, 1.0f),
                                               f32_tensor("model.layers.1.self_attn.rotary_emb.inv_freq", {6}, 1.0f)});
        REQUIRE(fs::exists(d / "model.safetensors.index.json"));
        REQUIRE_FALSE(fs::exists(d / "model.safetensors"));
        const pv::HfCheckpoint source = pv::HfCheckpoint::open_dir(d.string());
        CHECK(source.files().size() == 3);
        pv::LoadStats stats = check_load<double>(d, c, expected);
        check_load<float>(d, c, expected);
        check_load<__nv_bfloat16>(d, c, expected);
        std::sort(stats.skipped.begin(), stats.skipped.end());  // (in the files' order, which is shuffled)
        CHECK(stats.skipped == std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq",
                                                        "model.layers.1.self_attn.rotary_emb.inv_freq"});
        CHECK(stats.files == 3);
        CHECK(stats.overflows == 0);
        // A whole model reads every byte of its weights once (the skipped tensors not at all), and
        // each header.
        uint64_t skipped_bytes = 2 * 6 * 4;
        CHECK(stats.bytes_read == file_bytes(d) - skipped_bytes);
    }
}

TEST_CASE("hf checkpoint: a single model.safetensors; a tied model's stored lm_head.weight is skipped as HF does",
          "[hf_checkpoint]") {
    TempDir dir("hf_single");
    const pv::LlamaConfig untied = small_model(false), tied = small_model(true);
    const auto expected = write_model_dir(dir.path / "m", untied, 1);
    REQUIRE(fs::exists(dir.path / "m" / "model.safetensors"));
    check_load<double>(dir.path / "m", untied, expected);
    // The same weights read as a tied model: lm_head.weight is not the model's and is skipped.
    pv::write_hf_config((dir.path / "m" / "config.json").string(), tied);
    const pv::LoadStats stats = check_load<double>(dir.path / "m", tied, expected);
    CHECK(stats.skipped == std::vector<std::string>{"lm_head.weight"});
    // An untied model needs it: missing from a tied file, it is an error.
    write_model_dir(dir.path / "t", tied, 1);
    pv::write_hf_config((dir.path / "t" / "config.json").string(), untied);
    pv::Llama<double> m(untied, pv::whole_model(1, 4, 5, pv::Gradients::none));
    const std::string what =
        error_of<std::runtime_error>([&] { pv::load_model_weights((dir.path / "t").string(), m); });
    CHECK_THAT(what, Catch::Contains("'lm_head.weight' is missing"));
}

TEST_CASE("hf checkpoint: what does not fit is refused with the reason, and the model is left as it was",
          "[hf_checkpoint]") {
    TempDir dir("hf_refused");
    const pv::LlamaConfig c = small_model(false);
    const fs::path d = dir.path / "m";
    std::vector<HfTensor> tensors = hf_tensors(c);
    pv::Llama<double> m(c, pv::whole_model(1, 4, 5, pv::Gradients::none));
    const std::vector<double> before = download_tensor(m, "layers.1.w_down", 0, 40 * 36, 36);
    auto refused = [&](const std::vector<std::string>& says) {
        const std::string what = error_of<std::runtime_error>([&] { pv::load_model_weights(d.string(), m); });
        INFO(what);
        for (const std::string& s : says) CHECK_THAT(what, Catch::Contains(s));
        CHECK(download_tensor(m, "layers.1.w_down", 0, 40 * 36, 36) == before);  // nothing was loaded
        fs::remove_all(d);
    };
    SECTION("a missing tensor") {
        tensors.erase(tensors.begin() + 3);  // layers.0 k_proj
        write_model_dir(d, c, 2, {}, &tensors);
        refused({"'model.layers.0.self_attn.k_proj.weight' is missing", "compare config.json with the weights"});
    }
    SECTION("a shape contradicting config.json") {
        tensors[7].shape = {40, 40};  // layers.0 gate_proj: the file says ffn 40, config.json 36
        write_model_dir(d, c, 1, {}, &tensors);
        refused({"'model.layers.0.mlp.gate_proj.weight' has shape [40, 40], expected [36, 40]"});
    }
    SECTION("an unexpected tensor") {
        write_model_dir(d, c, 3, {f32_tensor("model.layers.0.mlp.gate_proj.bias", {36}, 0.5f)});
        refused({"'model.layers.0.mlp.gate_proj.bias'", "belongs to no parameter", "rotary_emb.inv_freq"});
    }
    SECTION("a dtype parameters cannot come from") {
        pv::SafeTensor ints = f32_tensor("model.norm.weight", {40}, 0.0f);
        ints.dtype = "I32";
        tensors.erase(tensors.begin() + long(tensors.size()) - 2);  // the real norm
        write_model_dir(d, c, 1, {ints}, &tensors);
        refused({"'model.norm.weight' has dtype I32", "BF16, F16, F32, F64"});
    }
    SECTION("a shard the index names is missing") {
        write_model_dir(d, c, 3);
        fs::remove(d / "model-00002-of-00003.safetensors");
        refused({"model-00002-of-00003.safetensors", "missing", "fetch every shard"});
    }
    SECTION("a shard holds a tensor the index does not list") {
        write_model_dir(d, c, 3);
        nlohmann::json index;
        std::ifstream(d / "model.safetensors.index.json") >> index;
        index["weight_map"].erase("model.norm.weight");
        std::ofstream(d / "model.safetensors.index.json") << index.dump();
        refused({"'model.norm.weight'", "does not list", "stale or mixed-up shard"});
    }
    SECTION("the index maps a tensor to a file that does not hold it") {
        write_model_dir(d, c, 3);
        nlohmann::json index;
        std::ifstream(d / "model.safetensors.index.json") >> index;
        const std::string was = index["weight_map"]["model.norm.weight"];
        index["weight_map"]["model.norm.weight"] = was == "model-00001-of-00003.safetensors"
                                                       ? "model-00002-of-00003.safetensors"
                                                       : "model-00001-of-00003.safetensors";
        std::ofstream(d / "model.safetensors.index.json") << index.dump();
        refused({"'model.norm.weight'", "does not hold it"});
    }
    SECTION("an index pointing outside the directory") {
        write_model_dir(d, c, 3);
        nlohmann::json index;
        std::ifstream(d / "model.safetensors.index.json") >> index;
        index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
        std::ofstream(d / "model.safetensors.index.json") << index.dump();
        refused({"../elsewhere.safetensors", "not a file inside the model directory"});
    }
    SECTION("an index without a weight_map") {
        write_model_dir(d, c, 3);
        std::ofstream(d / "model.safetensors.index.json") << "{\"metadata\": {}}";
        refused({"model.safetensors.index.json", "weight_map"});
    }
    SECTION("PyTorch pickles only, or nothing") {
        fs::create_directories(d);
        std::ofstream(d / "pytorch_model.bin") << "pickle";
        refused({"pytorch_model.bin", "safetensors"});
        fs::create_directories(d);
        refused({"has neither model.safetensors nor model.safetensors.index.json"});
    }
}

TEST_CASE("hf checkpoint: F16 converts exactly (all 65536 patterns: subnormals, ±0, ±Inf, NaN)", "[hf_checkpoint]") {
    std::vector<uint8_t> src;
    for (uint32_t h = 0; h < 65536; ++h) src.push_back(uint8_t(h & 0xFF)), src.push_back(uint8_t(h >> 8));
    std::vector<double> f64(65536);
    std::vector<float> f32(65536);
    std::vector<uint16_t> b16(65536);
    CHECK(pv::convert_elements(src.data(), "F16", reinterpret_cast<uint8_t*>(f64.data()), pv::DType::fp64, 65536) == 0);
    CHECK(pv::convert_elements(src.data(), "F16", reinterpret_cast<uint8_t*>(f32.data()), pv::DType::fp32, 65536) == 0);
    CHECK(pv::convert_elements(src.data(), "F16", reinterpret_cast<uint8_t*>(b16.data()), pv::DType::bf16, 65536) == 0);
    int subnormals = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const double want = f16_value(uint16_t(h));
        INFO("F16 0x" << std::hex << h);
        subnormals += ((h >> 10) & 31) == 0 && (h & 1023) != 0;
        if (std::isnan(want)) {
            REQUIRE(std::isnan(f64[h]));
            REQUIRE(std::isnan(f32[h]));
            REQUIRE(std::isnan(bf16_value(b16[h])));
            continue;
        }
        REQUIRE(f64[h] == want);
        REQUIRE(std::signbit(f64[h]) == std::signbit(want));  // -0 stays -0
        REQUIRE(double(f32[h]) == want);
        REQUIRE(bf16_value(b16[h]) == bf16_round(want));
        REQUIRE(std::signbit(bf16_value(b16[h])) == std::signbit(want));
    }
    CHECK(subnormals == 2 * 1023);
}

TEST_CASE("hf checkpoint: values that overflow the target type are counted, Inf and NaN in the file are not",
          "[hf_checkpoint]") {
    auto bits = [](uint32_t b) {
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    };
    // bf16's largest finite is 0x7F7F; halfway to the next (Inf) is 0x7F7F8000 in fp32, which
    // rounds to even: Inf. Just below it stays finite.
    const std::vector<float> f32 = {FLT_MAX, -FLT_MAX, bits(0x7F7F8000), bits(0x7F7F7FFF), INFINITY, NAN, 1.0f};
    std::vector<uint16_t> b16(f32.size());
    CHECK(pv::convert_elements(reinterpret_cast<const uint8_t*>(f32.data()), "F32",
                               reinterpret_cast<uint8_t*>(b16.data()), pv::DType::bf16, f32.size()) == 3);
    CHECK(b16[0] == 0x7F80);
    CHECK(b16[1] == 0xFF80);
    CHECK(b16[2] == 0x7F80);
    CHECK(b16[3] == 0x7F7F);
    CHECK(b16[6] == 0x3F80);
    // F64 -> F32: fp32's rounding threshold to Inf is FLT_MAX + half an ulp = 2^128 − 2^103 (a tie,
    // which goes to even: Inf); just below it rounds to FLT_MAX.
    const std::vector<double> f64 = {1e300, -1e39, 0x1.ffffffp127, 0x1.fffffefffffffp127, -INFINITY, 0.5};
    std::vector<float> out(f64.size());
    CHECK(pv::convert_elements(reinterpret_cast<const uint8_t*>(f64.data()), "F64",
                               reinterpret_cast<uint8_t*>(out.data()), pv::DType::fp32, f64.size()) == 3);
    CHECK(out[3] == FLT_MAX);
    CHECK(out[5] == 0.5f);
    // F64 -> bf16 through fp32: an overflow counts once.
    std::vector<uint16_t> out16(f64.size());
    CHECK(pv::convert_elements(reinterpret_cast<const uint8_t*>(f64.data()), "F64",
                               reinterpret_cast<uint8_t*>(out16.data()), pv::DType::bf16,
                               f64.size()) == 4);  // and FLT_MAX overflows bf16
    // Loading reports them: one huge value in an F32 file read into a bf16 model.
    TempDir dir("hf_overflow");
    const pv::LlamaConfig c = small_model(true);
    std::vector<HfTensor> tensors = hf_tensors(c);
    std::vector<pv::SafeTensor> extra = {f32_tensor("model.norm.weight", {40}, 1.0f)};
    std::memcpy(extra[0].data.data() + 8, &f32[0], 4);  // element 2: FLT_MAX
    tensors.pop_back();                                 // the norm comes from `extra`
    write_model_dir(dir.path / "m", c, 1, extra, &tensors);
    pv::Llama<__nv_bfloat16> m(c, pv::whole_model(1, 4, 5, pv::Gradients::none));
    CHECK(pv::load_model_weights(dir.file("m"), m).overflows == 1);
    pv::Llama<float> m32(c, pv::whole_model(1, 4, 5, pv::Gradients::none));
    CHECK(pv::load_model_weights(dir.file("m"), m32).overflows == 0);
}

TEST_CASE("hf checkpoint: ranged reads return the elements asked for, across the reader's chunks, counting bytes",
          "[hf_checkpoint]") {
    TempDir dir("hf_ranges");
    // More than one read chunk of F32 (16 MiB = 4 Mi elements), element i = i.
    const long long n = (long long)(pv::HfCheckpoint::kReadChunkBytes / 4) + 1000;
    pv::SafeTensor big{"big", "F32", {n}, std::vector<uint8_t>(size_t(n) * 4)};
    for (long long i = 0; i < n; ++i) {
        const float v = float(i);
        std::memcpy(big.data.data() + 4 * i, &v, 4);
    }
    pv::write_safetensors(dir.file("big.safetensors"), {f32_tensor("small", {3}, 2.0f), big});
    pv::HfCheckpoint c = pv::HfCheckpoint::open_file(dir.file("big.safetensors"));
    const uint64_t header = c.header_bytes();
    CHECK(c.bytes_read() == header);
    CHECK(header == fs::file_size(dir.file("big.safetensors")) - 12 - uint64_t(n) * 4);
    const long long first = n - 1000 - 300, count = 800;  // straddles the chunk boundary at 4 Mi
    std::vector<double> got(static_cast<size_t>(count));
    CHECK(c.read("big", uint64_t(first), uint64_t(count), pv::DType::fp64, got.data()) == 0);
    for (long long i = 0; i < count; ++i) REQUIRE(got[size_t(i)] == double(first + i));
    CHECK(c.bytes_read() == header + uint64_t(count) * 4);
    std::vector<double> last(1);
    c.read("big", uint64_t(n - 1), 1, pv::DType::fp64, last.data());
    CHECK(last[0] == double(n - 1));
    CHECK_THAT(error_of<std::runtime_error>([&] { c.read("big", uint64_t(n - 1), 2, pv::DType::fp64, last.data()); }),
               Catch::Contains("outside tensor 'big'"));
    CHECK_THAT(error_of<std::runtime_error>([&] { c.read("absent", 0, 1, pv::DType::fp64, last.data()); }),
               Catch::Contains("no tensor 'absent'"));
}
