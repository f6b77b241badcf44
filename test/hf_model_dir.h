// A Hugging Face model directory written by hand for tests (test_hf_checkpoint, the multi-rank
// loading test): Hugging Face's tensor names and shapes for a LlamaConfig, written from HF's
// naming (not from polevault's layouts), with random bit patterns in BF16, F16 (subnormals
// included) and F32 whose values are decoded here from the formats' fields, and save_pretrained's
// sharding: model.safetensors, or shards model-0000k-of-0000N.safetensors with an index naming
// each tensor's file.
#pragma once

#include "formats/config_json.h"
#include "formats/safetensors.h"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace pv::test {

// One tensor of a Hugging Face Llama checkpoint: its name, shape, and where its rows go in
// polevault's (fused) tensor: [Wq; Wk; Wv] and [Wgate; Wup] are row ranges of one matrix.
struct HfTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::string ours;  // polevault's tensor
    long long row0;    // its first row there
    long long numel() const { return shape.size() == 1 ? shape[0] : shape[0] * shape[1]; }
};

inline std::vector<HfTensor> hf_tensors(const pv::LlamaConfig& c) {
    const long long V = c.vocab_size, H = c.hidden_size, F = c.ffn_size, q = c.q_width(), kv = c.kv_width();
    std::vector<HfTensor> t = {{"model.embed_tokens.weight", {V, H}, "wte", 0}};
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".", n = "layers." + std::to_string(l) + ".";
        t.insert(t.end(), {{p + "input_layernorm.weight", {H}, n + "attn_norm", 0},
                           {p + "self_attn.q_proj.weight", {q, H}, n + "w_qkv", 0},
                           {p + "self_attn.k_proj.weight", {kv, H}, n + "w_qkv", q},
                           {p + "self_attn.v_proj.weight", {kv, H}, n + "w_qkv", q + kv},
                           {p + "self_attn.o_proj.weight", {H, q}, n + "w_o", 0},
                           {p + "post_attention_layernorm.weight", {H}, n + "mlp_norm", 0},
                           {p + "mlp.gate_proj.weight", {F, H}, n + "w_gate_up", 0},
                           {p + "mlp.up_proj.weight", {F, H}, n + "w_gate_up", F},
                           {p + "mlp.down_proj.weight", {H, F}, n + "w_down", 0}});
    }
    t.push_back({"model.norm.weight", {H}, "final_norm", 0});
    if (!c.tie_embeddings) t.push_back({"lm_head.weight", {V, H}, "lm_head", 0});
    return t;
}

// IEEE binary16 from its fields, written from the format (not the product's bit manipulation).
inline double f16_value(uint16_t h) {
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? std::ldexp(double(m), -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024.0 + m, e - 25);
    return sign ? -v : v;
}
inline double bf16_value(uint16_t h) {
    const int sign = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? std::ldexp(double(m), -133) : e == 255 ? (m ? NAN : INFINITY) : std::ldexp(128.0 + m, e - 134);
    return sign ? -v : v;
}

// Round to nearest even at bf16's 8 significant bits (fp32's exponent range), in double
// arithmetic: scale so the quantum is 1, nearbyint, scale back; ±Inf past bf16's range.
inline double bf16_round(double x) {
    if (std::isnan(x) || std::isinf(x) || x == 0) return x;
    int e = 0;
    (void)std::frexp(x, &e);
    const int quantum = std::max(e, -125) - 8;
    const double r = std::ldexp(std::nearbyint(std::ldexp(x, -quantum)), quantum);
    return std::fabs(r) >= 0x1p128 ? std::copysign(INFINITY, x) : r;
}

// A tensor of random bit patterns in `dtype`, and its values decoded here. F16 includes
// subnormals (exponent field 0); magnitudes stay near 1 otherwise.
struct Stored {
    pv::SafeTensor file;
    std::vector<double> values;
};

inline Stored random_tensor(const HfTensor& t, const std::string& dtype, uint64_t seed) {
    std::mt19937_64 rng(seed);
    Stored s{{t.name, dtype, t.shape, {}}, {}};
    for (long long i = 0; i < t.numel(); ++i) {
        if (dtype == "F32") {
            const float f = float(std::normal_distribution<double>(0, 1)(rng));
            const auto* b = reinterpret_cast<const uint8_t*>(&f);
            s.file.data.insert(s.file.data.end(), b, b + 4);
            s.values.push_back(f);
            continue;
        }
        const uint16_t sign = uint16_t((rng() & 1) << 15);
        uint16_t h;
        if (dtype == "F16")
            h = uint16_t(sign | (uint16_t(rng() % 18) << 10) | uint16_t(rng() % 1024));  // exponent 0..17
        else
            h = uint16_t(sign | (uint16_t(120 + rng() % 10) << 7) | uint16_t(rng() % 128));
        s.file.data.push_back(uint8_t(h & 0xFF));
        s.file.data.push_back(uint8_t(h >> 8));
        s.values.push_back(dtype == "F16" ? f16_value(h) : bf16_value(h));
    }
    return s;
}

// A model directory: config.json and the tensors, in one model.safetensors (files = 1) or spread
// over `files` shards with an index; tensor k goes to shard (5k + 1) mod files and is stored as
// BF16, F16, F32 in turn; each shard lists its tensors in a shuffled order. `extra` tensors are
// added to the first shard. Returns the expected values by HF name (and each tensor's dtype in
// *dtypes_out); with write_files false it only returns them (the same ones: the values depend on
// the seeds alone), for the other ranks of a multi-rank test.
inline std::map<std::string, std::vector<double>> write_model_dir(
    const std::filesystem::path& dir, const pv::LlamaConfig& c, int files,
    const std::vector<pv::SafeTensor>& extra = {}, const std::vector<HfTensor>* tensors_in = nullptr,
    std::map<std::string, std::string>* dtypes_out = nullptr, bool write_files = true) {
    if (write_files) {
        std::filesystem::create_directories(dir);
        pv::write_hf_config((dir / "config.json").string(), c, "bfloat16");
    }
    const std::vector<HfTensor> tensors = tensors_in ? *tensors_in : hf_tensors(c);
    std::map<std::string, std::vector<double>> expected;
    std::vector<std::vector<pv::SafeTensor>> shards(static_cast<size_t>(files));
    const char* dtypes[] = {"BF16", "F16", "F32"};
    for (size_t k = 0; k < tensors.size(); ++k) {
        Stored s = random_tensor(tensors[k], dtypes[k % 3], 100 + k);
        expected[tensors[k].name] = s.values;
        if (dtypes_out) (*dtypes_out)[tensors[k].name] = dtypes[k % 3];
        shards[(5 * k + 1) % size_t(files)].push_back(std::move(s.file));
    }
    for (const pv::SafeTensor& t : extra) shards[0].push_back(t);
    if (!write_files) return expected;
    std::mt19937_64 rng(9);
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (int f = 0; f < files; ++f) {
        std::shuffle(shards[size_t(f)].begin(), shards[size_t(f)].end(), rng);
        const std::string name =
            files == 1 ? "model.safetensors"
                       : "model-0000" + std::to_string(f + 1) + "-of-0000" + std::to_string(files) + ".safetensors";
        pv::write_safetensors((dir / name).string(), shards[size_t(f)], {{"format", "pt"}});
        for (const pv::SafeTensor& t : shards[size_t(f)]) index["weight_map"][t.name] = name;
    }
    if (files > 1) std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
    return expected;
}

// An F32 tensor of `shape` filled with `value`.
inline pv::SafeTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, float value) {
    long long n = 1;
    for (int64_t d : shape) n *= d;
    pv::SafeTensor t{name, "F32", std::move(shape), std::vector<uint8_t>(size_t(n) * 4)};
    for (long long i = 0; i < n; ++i) std::memcpy(t.data.data() + 4 * i, &value, 4);
    return t;
}

}  // namespace pv::test
