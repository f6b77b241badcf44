// Checkpoint tensor files and step directories: round trips keep every byte in all three dtypes,
// with and without padding; the file holds Hugging Face names and shapes (the expected list is
// written by hand from HF's Llama naming, not from the parts); a split tensor holds the right rows
// of its fused tensor; dtype conversion matches an independent round-to-nearest-even reference and
// a table of known bit patterns; a file written at one shard count loads at another; every error
// names the file, the tensor and the fix; the directory transaction and latest_checkpoint; the
// files' checksums catch what the tensor checks cannot (a flipped bit, a relabelled dtype, swapped
// offsets), and a checkpoint missing optimizer files is refused unless accepted.
#include "test/error_of.h"
#include "test/temp_dir.h"
#include "model/checkpoint.h"

#include "formats/config_json.h"
#include "formats/safetensors.h"
#include "io/durable_file.h"
#include "model/checkpoint_files.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace checkpoint_test {

namespace fs = std::filesystem;

using pv::test::TempDir;  // test/temp_dir.h

inline std::vector<pv::GroupLayout> layouts_for(const pv::LlamaConfig& c, int shards) {
    std::vector<pv::GroupLayout> layouts;
    for (const pv::UnitSpec& unit : pv::model_units(c))
        layouts.push_back(pv::layout_group(pv::GroupKind::trainable, pv::DType::fp32, unit.tensors, shards));
    return layouts;
}

inline uint32_t float_bits(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
}

inline float bits_float(uint32_t b) {
    float x;
    std::memcpy(&x, &b, 4);
    return x;
}

// Element i of a group, whatever its dtype, as a double (bf16: the top half of an fp32).
inline double get(const pv::HostGroups& g, size_t u, long long i) {
    const uint8_t* p = g.units[u].data() + size_t(i) * pv::dtype_size(g.dtype);
    switch (g.dtype) {
        case pv::DType::bf16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            return bits_float(uint32_t(h) << 16);
        }
        case pv::DType::fp32: {
            float f;
            std::memcpy(&f, p, 4);
            return f;
        }
        case pv::DType::fp64: {
            double d;
            std::memcpy(&d, p, 8);
            return d;
        }
    }
    return 0;
}

inline void put_f32(pv::HostGroups& g, size_t u, long long i, float v) {
    std::memcpy(g.units[u].data() + size_t(i) * 4, &v, 4);
}

inline void put_f64(pv::HostGroups& g, size_t u, long long i, double v) {
    std::memcpy(g.units[u].data() + size_t(i) * 8, &v, 8);
}

// Random values in every tensor element, zero everywhere else (alignment gaps and padding).
inline pv::HostGroups random_groups(const std::vector<pv::GroupLayout>& layouts, pv::DType dtype, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    pv::HostGroups g;
    g.dtype = dtype;
    const size_t es = pv::dtype_size(dtype);
    for (const pv::GroupLayout& layout : layouts) {
        std::vector<uint8_t> bytes(size_t(layout.padded) * es, 0);
        for (const pv::TensorSlot& t : layout.tensors)
            for (long long i = 0; i < t.spec.numel(); ++i) {
                uint8_t* p = bytes.data() + size_t(t.offset + i) * es;
                const double v = normal(rng);
                if (dtype == pv::DType::fp64) std::memcpy(p, &v, 8);
                if (dtype == pv::DType::fp32) {
                    const float f = float(v);
                    std::memcpy(p, &f, 4);
                }
                if (dtype == pv::DType::bf16) {
                    const uint16_t h = uint16_t(float_bits(float(v)) >> 16);  // any bf16 value will do
                    std::memcpy(p, &h, 2);
                }
            }
        g.units.push_back(std::move(bytes));
    }
    return g;
}

// Round to nearest, ties to even, to bf16 (8 significant bits, fp32's exponent range), computed
// in double arithmetic: scale x so that the bf16 quantum at its magnitude becomes 1, round with
// std::nearbyint (ties to even in the default rounding mode), scale back. Independent of the bit
// trick the product uses.
inline float bf16_reference(float x) {
    if (std::isnan(x)) return x;
    if (std::isinf(x) || x == 0.0f) return x;
    int e = 0;
    (void)std::frexp(double(x), &e);            // |x| in [2^(e-1), 2^e)
    const int quantum = std::max(e, -125) - 8;  // 2^-133 below fp32's smallest normal 2^-126
    const double r = std::ldexp(std::nearbyint(std::ldexp(double(x), -quantum)), quantum);
    if (std::fabs(r) >= 0x1p128) return x > 0 ? INFINITY : -INFINITY;
    return float(r);  // exact: r has at most 8 significant bits
}

using pv::test::error_of;  // test/error_of.h

inline void touch(const fs::path& p, const std::string& text = "x") { std::ofstream(p) << text; }

inline std::string slurp_text(const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace checkpoint_test

using namespace checkpoint_test;

TEST_CASE("checkpoint tensors round-trip every byte in every dtype, with and without padding", "[checkpoint]") {
    TempDir dir;
    bool saw_padding = false;
    for (const char* name : {"test-tiny", "test-tied"}) {
        for (int shards : {1, 3}) {
            const auto layouts = layouts_for(pv::preset(name), shards);
            for (const pv::GroupLayout& l : layouts) saw_padding |= l.padded > l.used;
            for (auto [dtype, st] : {std::pair{pv::DType::bf16, "BF16"}, std::pair{pv::DType::fp32, "F32"},
                                     std::pair{pv::DType::fp64, "F64"}}) {
                INFO(name << ", shards " << shards << ", " << pv::dtype_name(dtype));
                const pv::HostGroups g = random_groups(layouts, dtype, 17 + uint64_t(shards));
                const std::string path = dir.file("model.safetensors");
                pv::write_group_tensors(path, layouts, g, {{"format", "pt"}, {"step", "12"}});
                CHECK_FALSE(fs::exists(path + ".tmp"));

                const pv::HostGroups back = pv::read_group_tensors(path, layouts, dtype);
                CHECK(back.dtype == dtype);
                REQUIRE(back.units.size() == g.units.size());
                for (size_t u = 0; u < g.units.size(); ++u) CHECK(back.units[u] == g.units[u]);

                const pv::SafeTensorsFile f = pv::read_safetensors(path);
                CHECK(f.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}});
                for (const pv::SafeTensor& t : f.tensors) CHECK(t.dtype == st);
            }
        }
    }
    CHECK(saw_padding);  // shards = 3 pads some group, so zero padding was really in play
}

TEST_CASE("checkpoint files hold Hugging Face names and shapes, unpadded", "[checkpoint]") {
    TempDir dir;
    // test-tiny (model/config.cpp): vocab 67, hidden 48, 2 layers, 6 heads and 2 KV heads of head
    // dim 8 (q width 48, kv width 16), ffn 40, untied. HF Llama names, [out, in] for projections.
    using Shape = std::vector<int64_t>;
    std::vector<std::pair<std::string, Shape>> expected = {{"model.embed_tokens.weight", {67, 48}}};
    for (int l = 0; l < 2; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        expected.insert(expected.end(), {{p + "input_layernorm.weight", {48}},
                                         {p + "self_attn.q_proj.weight", {48, 48}},
                                         {p + "self_attn.k_proj.weight", {16, 48}},
                                         {p + "self_attn.v_proj.weight", {16, 48}},
                                         {p + "self_attn.o_proj.weight", {48, 48}},
                                         {p + "post_attention_layernorm.weight", {48}},
                                         {p + "mlp.gate_proj.weight", {40, 48}},
                                         {p + "mlp.up_proj.weight", {40, 48}},
                                         {p + "mlp.down_proj.weight", {48, 40}}});
    }
    expected.push_back({"model.norm.weight", {48}});
    expected.push_back({"lm_head.weight", {67, 48}});

    for (int shards : {1, 3}) {
        const auto layouts = layouts_for(pv::preset("test-tiny"), shards);
        const std::string path = dir.file("tiny.safetensors");
        pv::write_group_tensors(path, layouts, random_groups(layouts, pv::DType::fp32, 5));
        const pv::SafeTensorsFile f = pv::read_safetensors(path);
        REQUIRE(f.tensors.size() == expected.size());
        size_t bytes = 0;
        for (size_t i = 0; i < expected.size(); ++i) {
            INFO(expected[i].first);
            CHECK(f.tensors[i].name == expected[i].first);  // buffer order = unit, tensor, part order
            CHECK(f.tensors[i].shape == expected[i].second);
            bytes += f.tensors[i].data.size();
        }
        // Unpadded: exactly the model's parameters, 4 bytes each.
        CHECK(bytes == size_t(pv::parameter_count(pv::preset("test-tiny"))) * 4);
        CHECK(fs::file_size(path) < bytes + 4096);  // no padding hides in the buffer either
    }

    // test-tied: vocab 65, 3 layers, tied: no lm_head.weight anywhere.
    const auto tied = layouts_for(pv::preset("test-tied"), 2);
    const std::string path = dir.file("tied.safetensors");
    pv::write_group_tensors(path, tied, random_groups(tied, pv::DType::bf16, 6));
    const pv::SafeTensorsFile f = pv::read_safetensors(path);
    CHECK(f.tensors.size() == 1 + 3 * 9 + 1);
    for (const pv::SafeTensor& t : f.tensors) CHECK(t.name != "lm_head.weight");
    CHECK(f.tensors.front().name == "model.embed_tokens.weight");
    CHECK(f.tensors.front().shape == Shape{65, 48});
    CHECK(f.tensors.back().name == "model.norm.weight");
    CHECK(f.at("model.layers.2.mlp.down_proj.weight").shape == Shape{48, 40});
}

TEST_CASE("checkpoint split tensors hold the right rows of the fused ones", "[checkpoint]") {
    TempDir dir;
    const auto layouts = layouts_for(pv::preset("test-tiny"), 3);
    const pv::HostGroups g = random_groups(layouts, pv::DType::fp32, 7);
    const std::string path = dir.file("split.safetensors");
    pv::write_group_tensors(path, layouts, g);
    const pv::SafeTensorsFile f = pv::read_safetensors(path);

    // Element (r, c) of a file tensor, and of a polevault tensor in unit u at its offset.
    const auto file_at = [&](const std::string& name, long long r, long long c, long long cols) {
        float v;
        std::memcpy(&v, f.at(name).data.data() + size_t(r * cols + c) * 4, 4);
        return double(v);
    };
    const size_t unit = 2;  // block 1
    const auto fused_at = [&](const std::string& name, long long r, long long c, long long cols) {
        return get(g, unit, layouts[unit].find(name).offset + r * cols + c);
    };
    // [Wq; Wk; Wv]: rows 0..47 are q, 48..63 k, 64..79 v; [Wgate; Wup]: rows 0..39 gate, 40..79 up.
    const std::string p = "model.layers.1.";
    for (long long r = 0; r < 48; ++r)
        for (long long c = 0; c < 48; ++c)
            REQUIRE(file_at(p + "self_attn.q_proj.weight", r, c, 48) == fused_at("layers.1.w_qkv", r, c, 48));
    for (long long r = 0; r < 16; ++r)
        for (long long c = 0; c < 48; ++c) {
            REQUIRE(file_at(p + "self_attn.k_proj.weight", r, c, 48) == fused_at("layers.1.w_qkv", 48 + r, c, 48));
            REQUIRE(file_at(p + "self_attn.v_proj.weight", r, c, 48) == fused_at("layers.1.w_qkv", 64 + r, c, 48));
        }
    for (long long r = 0; r < 40; ++r)
        for (long long c = 0; c < 48; ++c) {
            REQUIRE(file_at(p + "mlp.gate_proj.weight", r, c, 48) == fused_at("layers.1.w_gate_up", r, c, 48));
            REQUIRE(file_at(p + "mlp.up_proj.weight", r, c, 48) == fused_at("layers.1.w_gate_up", 40 + r, c, 48));
        }
    for (long long r = 0; r < 48; ++r) {
        REQUIRE(file_at(p + "post_attention_layernorm.weight", r, 0, 1) == fused_at("layers.1.mlp_norm", r, 0, 1));
        for (long long c = 0; c < 40; ++c)
            REQUIRE(file_at(p + "mlp.down_proj.weight", r, c, 40) == fused_at("layers.1.w_down", r, c, 40));
    }
}

TEST_CASE("checkpoint reading converts dtypes: round to nearest even, NaN stays NaN, widening exact", "[checkpoint]") {
    TempDir dir;
    const auto layouts = layouts_for(pv::preset("test-tiny"), 1);
    const std::string path = dir.file("f32.safetensors");

    // fp32 values: a hand-made table of bit patterns with their bf16 (by hand), then random bit
    // patterns (every exponent, subnormals, Inf and NaN), then random normals.
    const std::vector<std::pair<uint32_t, uint16_t>> table = {
        {0x3F800000, 0x3F80},                        // 1
        {0x3F808000, 0x3F80},                        // 1 + 2^-8: a tie, to the even 1
        {0x3F818000, 0x3F82},                        // 1 + 3·2^-8: a tie, to the even 1 + 2^-6
        {0x3F808001, 0x3F81},                        // just above the tie
        {0x3F807FFF, 0x3F80},                        // just below it
        {0xBF818000, 0xBF82},                        // a negative tie
        {0x7F7F7FFF, 0x7F7F},                        // below the tie at bf16's largest finite
        {0x7F7F8000, 0x7F80},                        // that tie, odd mantissa: up to Inf
        {0x7F7FFFFF, 0x7F80},                        // fp32's largest: Inf
        {0x7F800000, 0x7F80},                        // Inf
        {0xFF800000, 0xFF80},                        // -Inf
        {0x80000000, 0x8000},                        // -0
        {0x00000001, 0x0000},                        // the smallest subnormal: to 0
        {0x00008000, 0x0000},                        // a subnormal tie, to the even 0
        {0x00018000, 0x0002},                        // a subnormal tie, to the even 2
        {0x00008001, 0x0001}, {0x007FFFFF, 0x0080},  // the largest subnormal: up to the smallest normal
    };
    const std::vector<uint32_t> nans = {0x7FC00000, 0x7F800001, 0xFF800001, 0xFFFFFFFF, 0x7FBFFFFF};
    pv::HostGroups g = random_groups(layouts, pv::DType::fp32, 8);
    std::mt19937 rng(9);
    const long long wte = layouts[0].find("wte").offset;
    for (long long i = 0; i < 67 * 48; ++i) {
        const size_t k = size_t(i);
        const uint32_t bits = k < table.size()                 ? table[k].first
                              : k < table.size() + nans.size() ? nans[k - table.size()]
                                                               : uint32_t(rng());
        put_f32(g, 0, wte + i, bits_float(bits));
    }
    pv::write_group_tensors(path, layouts, g);

    SECTION("F32 -> bf16") {
        const pv::HostGroups b = pv::read_group_tensors(path, layouts, pv::DType::bf16);
        CHECK(b.dtype == pv::DType::bf16);
        const auto bf16_at = [&](size_t u, long long i) {
            uint16_t h;
            std::memcpy(&h, b.units[u].data() + size_t(i) * 2, 2);
            return h;
        };
        for (size_t k = 0; k < table.size(); ++k) {
            INFO("fp32 0x" << std::hex << table[k].first);
            CHECK(bf16_at(0, wte + long(k)) == table[k].second);
        }
        for (size_t k = 0; k < nans.size(); ++k) {
            INFO("fp32 NaN 0x" << std::hex << nans[k]);
            const uint16_t h = bf16_at(0, wte + long(table.size() + k));
            CHECK((h & 0x7F80) == 0x7F80);  // exponent all ones ...
            CHECK((h & 0x007F) != 0);       // ... and a payload: NaN, not Inf
            CHECK((h & 0x8000) == ((nans[k] >> 16) & 0x8000));
        }
        size_t compared = 0;
        for (size_t u = 0; u < layouts.size(); ++u) {
            std::vector<bool> inside(size_t(layouts[u].padded), false);
            for (const pv::TensorSlot& t : layouts[u].tensors)
                for (long long i = 0; i < t.spec.numel(); ++i) {
                    inside[size_t(t.offset + i)] = true;
                    const float x = float(get(g, u, t.offset + i));
                    const float want = bf16_reference(x);
                    const uint32_t got = uint32_t(bf16_at(u, t.offset + i)) << 16;
                    if (std::isnan(want)) {
                        REQUIRE(std::isnan(bits_float(got)));
                    } else {
                        INFO("fp32 0x" << std::hex << float_bits(x) << ": got 0x" << got << ", want 0x"
                                       << float_bits(want));
                        REQUIRE(got == float_bits(want));
                    }
                    ++compared;
                }
            for (long long i = 0; i < layouts[u].padded; ++i)
                if (!inside[size_t(i)]) REQUIRE(bf16_at(u, i) == 0);
        }
        CHECK(compared == size_t(pv::parameter_count(pv::preset("test-tiny"))));
    }
    SECTION("F32 -> fp64 is exact") {
        const pv::HostGroups d = pv::read_group_tensors(path, layouts, pv::DType::fp64);
        for (size_t u = 0; u < layouts.size(); ++u)
            for (long long i = 0; i < layouts[u].padded; ++i) {
                const double want = get(g, u, i), got = get(d, u, i);
                if (std::isnan(want))
                    REQUIRE(std::isnan(got));
                else
                    REQUIRE(got == want);
            }
    }
    SECTION("BF16 -> fp32 and fp64 are exact") {
        const pv::HostGroups b = random_groups(layouts, pv::DType::bf16, 10);
        pv::write_group_tensors(dir.file("b.safetensors"), layouts, b);
        const pv::HostGroups f = pv::read_group_tensors(dir.file("b.safetensors"), layouts, pv::DType::fp32);
        const pv::HostGroups d = pv::read_group_tensors(dir.file("b.safetensors"), layouts, pv::DType::fp64);
        for (size_t u = 0; u < layouts.size(); ++u)
            for (long long i = 0; i < layouts[u].padded; ++i) {
                REQUIRE(get(f, u, i) == get(b, u, i));
                REQUIRE(get(d, u, i) == get(b, u, i));
            }
    }
}

TEST_CASE("checkpoint reading narrows F64 by rounding to nearest even, bf16 through fp32", "[checkpoint]") {
    TempDir dir;
    const auto layouts = layouts_for(pv::preset("test-tiny"), 1);
    pv::HostGroups g = random_groups(layouts, pv::DType::fp64, 11);
    // fp64 values with their fp32 and bf16 roundings, by hand.
    struct Case {
        double x;
        float f32;
        uint16_t bf16;
    };
    const std::vector<Case> cases = {
        {1.0 + 0x1p-24, 1.0f, 0x3F80},                                // fp32 tie, to even
        {1.0 + 3 * 0x1p-24, 1.0f + 0x1p-22f, 0x3F80},                 // fp32 tie, to even (up); bf16 down
        {1.0 + 0x1p-24 + 0x1p-40, 1.0f + 0x1p-23f, 0x3F80},           // just above the fp32 tie
        {1.0 + 0x1p-8 + 0x1p-20, 1.0f + 0x1p-8f + 0x1p-20f, 0x3F81},  // exact in fp32, above the bf16 tie
        // Double rounding: 1 + 2^-8 + 2^-30 rounds to the bf16 tie 1 + 2^-8 in fp32, then to the even
        // 1; rounding it directly would give 1 + 2^-7 (0x3F81). Documented in checkpoint.cpp.
        {1.0 + 0x1p-8 + 0x1p-30, 1.0f + 0x1p-8f, 0x3F80},
        {-2.5, -2.5f, 0xC020},
        {1e300, INFINITY, 0x7F80},  // overflows both
        {-1e-300, -0.0f, 0x8000},   // underflows both, keeps its sign
    };
    const long long wte = layouts[0].find("wte").offset;
    for (size_t k = 0; k < cases.size(); ++k) put_f64(g, 0, wte + long(k), cases[k].x);
    put_f64(g, 0, wte + long(cases.size()), NAN);
    const std::string path = dir.file("f64.safetensors");
    pv::write_group_tensors(path, layouts, g);

    const pv::HostGroups f = pv::read_group_tensors(path, layouts, pv::DType::fp32);
    const pv::HostGroups b = pv::read_group_tensors(path, layouts, pv::DType::bf16);
    for (size_t k = 0; k < cases.size(); ++k) {
        INFO("case " << k << ": " << cases[k].x);
        const float got = float(get(f, 0, wte + long(k)));
        CHECK(float_bits(got) == float_bits(cases[k].f32));
        uint16_t h;
        std::memcpy(&h, b.units[0].data() + size_t(wte + long(k)) * 2, 2);
        CHECK(h == cases[k].bf16);
    }
    CHECK(std::isnan(get(f, 0, wte + long(cases.size()))));
    CHECK(std::isnan(get(b, 0, wte + long(cases.size()))));
    // Everything else: fp32 within half an fp32 ulp, bf16 within half a bf16 ulp plus fp32's.
    for (size_t u = 0; u < layouts.size(); ++u)
        for (const pv::TensorSlot& t : layouts[u].tensors)
            for (long long i = (u == 0 ? long(cases.size()) + 1 : 0); i < t.spec.numel(); ++i) {
                const double x = get(g, u, t.offset + i);
                REQUIRE(std::fabs(get(f, u, t.offset + i) - x) <= std::fabs(x) * 0x1p-24);
                REQUIRE(std::fabs(get(b, u, t.offset + i) - x) <= std::fabs(x) * (0x1p-8 + 0x1p-23));
            }
}

TEST_CASE("checkpoint reading converts F16 files exactly", "[checkpoint]") {
    TempDir dir;
    const auto layouts = layouts_for(pv::preset("test-tiny"), 2);
    // Rewrite a file of ours with every tensor as F16, each filled with a table of half floats.
    const std::string path = dir.file("f16.safetensors");
    pv::write_group_tensors(path, layouts, random_groups(layouts, pv::DType::fp32, 12));
    const std::vector<std::pair<uint16_t, float>> halves = {
        {0x3C00, 1.0f},
        {0xC000, -2.0f},
        {0x0001, 0x1p-24f},
        {0x8000, -0.0f},
        {0x7C00, INFINITY},
        {0xFC00, -INFINITY},
        {0x3555, 0.333251953125f},
        {0x7BFF, 65504.0f},
        {0x03FF, 1023 * 0x1p-24f},
        {0x0400, 0x1p-14f},
        {0x7E00, NAN},
    };
    std::vector<pv::SafeTensor> tensors = pv::read_safetensors(path).tensors;
    for (pv::SafeTensor& t : tensors) {
        t.dtype = "F16";
        t.data.resize(t.data.size() / 2);
        for (size_t i = 0; i < t.data.size() / 2; ++i) {
            const uint16_t h = halves[i % halves.size()].first;
            std::memcpy(t.data.data() + 2 * i, &h, 2);
        }
    }
    pv::write_safetensors(path, tensors);

    const pv::HostGroups f = pv::read_group_tensors(path, layouts, pv::DType::fp32);
    const pv::HostGroups b = pv::read_group_tensors(path, layouts, pv::DType::bf16);
    const pv::HostGroups d = pv::read_group_tensors(path, layouts, pv::DType::fp64);
    for (size_t u = 0; u < layouts.size(); ++u) {
        for (const pv::TensorSlot& t : layouts[u].tensors) {
            for (const pv::TensorPart& part : t.spec.parts) {  // each file tensor restarts the table
                for (long long i = 0; i < part.rows * t.spec.cols; ++i) {
                    const float want = halves[size_t(i) % halves.size()].second;
                    const long long at = t.offset + part.row_begin * t.spec.cols + i;
                    if (std::isnan(want)) {
                        REQUIRE(std::isnan(get(f, u, at)));
                        REQUIRE(std::isnan(get(b, u, at)));
                        REQUIRE(std::isnan(get(d, u, at)));
                        continue;
                    }
                    REQUIRE(float_bits(float(get(f, u, at))) == float_bits(want));
                    REQUIRE(get(d, u, at) == double(want));
                    REQUIRE(std::signbit(get(d, u, at)) == std::signbit(want));
                    REQUIRE(float_bits(float(get(b, u, at))) == float_bits(bf16_reference(want)));
                }
            }
        }
    }
}

TEST_CASE("checkpoint written at one shard count loads at another", "[checkpoint]") {
    TempDir dir;
    for (const char* name : {"test-tiny", "test-tied"}) {
        INFO(name);
        const auto one = layouts_for(pv::preset(name), 1);
        const auto four = layouts_for(pv::preset(name), 4);
        bool differs = false;
        for (size_t u = 0; u < one.size(); ++u) differs |= one[u].padded != four[u].padded;
        REQUIRE(differs);  // the padding really changes

        for (pv::DType dtype : {pv::DType::bf16, pv::DType::fp64}) {
            const pv::HostGroups g = random_groups(one, dtype, 13);
            const std::string path = dir.file("one.safetensors");
            pv::write_group_tensors(path, one, g);
            const pv::HostGroups back = pv::read_group_tensors(path, four, dtype);
            for (size_t u = 0; u < one.size(); ++u) {
                REQUIRE(back.units[u].size() == size_t(four[u].padded) * pv::dtype_size(dtype));
                std::vector<bool> inside(size_t(four[u].padded), false);
                for (size_t k = 0; k < one[u].tensors.size(); ++k) {
                    const pv::TensorSlot& a = one[u].tensors[k];
                    const pv::TensorSlot& b = four[u].tensors[k];
                    for (long long i = 0; i < a.spec.numel(); ++i) {
                        REQUIRE(get(back, u, b.offset + i) == get(g, u, a.offset + i));
                        inside[size_t(b.offset + i)] = true;
                    }
                }
                for (long long i = 0; i < four[u].padded; ++i)
                    if (!inside[size_t(i)]) REQUIRE(get(back, u, i) == 0.0);
            }
        }
    }
}

TEST_CASE("checkpoint tensor errors name the file, the tensor and the fix", "[checkpoint]") {
    TempDir dir;
    const pv::LlamaConfig tiny = pv::preset("test-tiny");
    pv::LlamaConfig tiny_tied = tiny;
    tiny_tied.tie_embeddings = true;
    pv::LlamaConfig wider = tiny;
    wider.ffn_size = 44;
    const auto untied_layouts = layouts_for(tiny, 1);
    const auto tied_layouts = layouts_for(tiny_tied, 1);
    const std::string untied = dir.file("untied.safetensors"), tied = dir.file("tied.safetensors");
    const pv::HostGroups untied_groups = random_groups(untied_layouts, pv::DType::fp32, 14);
    pv::write_group_tensors(untied, untied_layouts, untied_groups);
    pv::write_group_tensors(tied, tied_layouts, random_groups(tied_layouts, pv::DType::fp32, 15));

    SECTION("a tensor the model needs is missing") {
        const std::string what =
            error_of<std::runtime_error>([&] { pv::read_group_tensors(tied, untied_layouts, pv::DType::fp32); });
        CHECK_THAT(what, Catch::Contains(tied) && Catch::Contains("'lm_head.weight' is missing") &&
                             Catch::Contains("different model or configuration"));
    }
    SECTION("a tensor has the wrong shape") {
        const std::string what = error_of<std::runtime_error>(
            [&] { pv::read_group_tensors(untied, layouts_for(wider, 1), pv::DType::fp32); });
        CHECK_THAT(what, Catch::Contains(untied) && Catch::Contains("'model.layers.0.mlp.gate_proj.weight'") &&
                             Catch::Contains("shape [40, 48], expected [44, 48]") && Catch::Contains("config.json"));
    }
    SECTION("a vector stored as a matrix has the wrong shape") {
        std::vector<pv::SafeTensor> tensors = pv::read_safetensors(untied).tensors;
        for (pv::SafeTensor& t : tensors)
            if (t.name == "model.norm.weight") t.shape = {48, 1};
        pv::write_safetensors(untied, tensors);
        const std::string what =
            error_of<std::runtime_error>([&] { pv::read_group_tensors(untied, untied_layouts, pv::DType::fp32); });
        CHECK_THAT(what, Catch::Contains("'model.norm.weight' has shape [48, 1], expected [48]"));
    }
    SECTION("the file holds a tensor the model has not; allow_extra ignores it") {
        const std::string what =
            error_of<std::runtime_error>([&] { pv::read_group_tensors(untied, tied_layouts, pv::DType::fp32); });
        CHECK_THAT(what, Catch::Contains(untied) && Catch::Contains("'lm_head.weight'") &&
                             Catch::Contains("belongs to no parameter") && Catch::Contains("allow_extra"));
        const pv::HostGroups g = pv::read_group_tensors(untied, tied_layouts, pv::DType::fp32, true);
        for (size_t u = 0; u + 1 < g.units.size(); ++u)
            CHECK(g.units[u] == untied_groups.units[u]);                                    // same layouts but the head
        CHECK(get(g, g.units.size() - 1, 5) == get(untied_groups, g.units.size() - 1, 5));  // final norm
    }
    SECTION("an unsupported dtype") {
        std::vector<pv::SafeTensor> tensors = pv::read_safetensors(untied).tensors;
        tensors[3].dtype = "I32";  // same size as F32: the file itself is valid
        pv::write_safetensors(untied, tensors);
        const std::string what =
            error_of<std::runtime_error>([&] { pv::read_group_tensors(untied, untied_layouts, pv::DType::bf16); });
        CHECK_THAT(what, Catch::Contains(untied) && Catch::Contains("'" + tensors[3].name + "'") &&
                             Catch::Contains("dtype I32") && Catch::Contains("BF16, F16, F32, F64"));
    }
    SECTION("a missing file") {
        const std::string what = error_of<std::runtime_error>(
            [&] { pv::read_group_tensors(dir.file("absent.safetensors"), untied_layouts, pv::DType::fp32); });
        CHECK_THAT(what, Catch::Contains("absent.safetensors") && Catch::Contains("cannot open"));
    }
    SECTION("the groups do not match the layouts") {
        pv::HostGroups short_unit = untied_groups;
        short_unit.units[1].pop_back();
        const size_t need = size_t(untied_layouts[1].padded) * 4;
        std::string what = error_of<std::invalid_argument>(
            [&] { pv::write_group_tensors(dir.file("x.safetensors"), untied_layouts, short_unit); });
        CHECK_THAT(what, Catch::Contains("unit 1 holds " + std::to_string(need - 1) + " bytes") &&
                             Catch::Contains(std::to_string(need) + " bytes") && Catch::Contains("x.safetensors"));
        pv::HostGroups wrong_dtype = untied_groups;
        wrong_dtype.dtype = pv::DType::fp64;
        what = error_of<std::invalid_argument>(
            [&] { pv::write_group_tensors(dir.file("x.safetensors"), untied_layouts, wrong_dtype); });
        CHECK_THAT(what, Catch::Contains("unit 0 holds") && Catch::Contains("fp64"));
        pv::HostGroups fewer = untied_groups;
        fewer.units.pop_back();
        what = error_of<std::invalid_argument>(
            [&] { pv::write_group_tensors(dir.file("x.safetensors"), untied_layouts, fewer); });
        CHECK_THAT(what, Catch::Contains(std::to_string(fewer.units.size()) + " units of data for " +
                                         std::to_string(untied_layouts.size()) + " layouts"));
        CHECK_FALSE(fs::exists(dir.file("x.safetensors")));
    }
}

TEST_CASE("checkpoint directories: begin, commit, replace, and find the latest complete one", "[checkpoint]") {
    TempDir dir;
    const fs::path out = dir.path / "runs" / "a";  // does not exist yet: begin creates it

    // begin: a fresh .tmp beside the final name; files go inside; commit publishes them.
    const std::string tmp5 = pv::begin_checkpoint_dir((out / "step_5").string());
    CHECK(tmp5 == (out / "step_5.tmp").string());
    REQUIRE(fs::is_directory(tmp5));
    CHECK(fs::is_empty(tmp5));
    touch(fs::path(tmp5) / "trainer_state.json", "{\"step\": 5}");
    fs::create_directories(fs::path(tmp5) / "extra");
    touch(fs::path(tmp5) / "extra" / "note.txt");
    const auto layouts = layouts_for(pv::preset("test-tiny"), 1);
    pv::write_group_tensors((fs::path(tmp5) / "model.safetensors").string(), layouts,
                            random_groups(layouts, pv::DType::bf16, 16));
    pv::commit_checkpoint_dir((out / "step_5").string());
    CHECK_FALSE(fs::exists(out / "step_5.tmp"));
    CHECK(slurp_text(out / "step_5" / "trainer_state.json") == "{\"step\": 5}");
    CHECK(fs::exists(out / "step_5" / "extra" / "note.txt"));
    CHECK(pv::read_safetensors((out / "step_5" / "model.safetensors").string()).tensors.size() == 1 + 2 * 9 + 2);

    // A stale .tmp (a crash mid-write) is replaced by an empty one.
    fs::create_directories(out / "step_6.tmp");
    touch(out / "step_6.tmp" / "half_written.safetensors");
    const std::string tmp6 = pv::begin_checkpoint_dir((out / "step_6").string() + "/");  // trailing slash
    CHECK(tmp6 == (out / "step_6.tmp").string());
    CHECK(fs::is_empty(tmp6));

    // A re-run of step 5 replaces the old directory as a whole.
    pv::begin_checkpoint_dir((out / "step_5").string());
    touch(out / "step_5.tmp" / "trainer_state.json", "{\"step\": 5, \"rerun\": true}");
    pv::commit_checkpoint_dir((out / "step_5").string());
    CHECK(slurp_text(out / "step_5" / "trainer_state.json") == "{\"step\": 5, \"rerun\": true}");
    CHECK_FALSE(fs::exists(out / "step_5" / "model.safetensors"));
    CHECK_FALSE(fs::exists(out / "step_5.tmp"));

    // Commit without begin, and begin where a file blocks the path: errors naming the path and why.
    std::string what = error_of<std::runtime_error>([&] { pv::commit_checkpoint_dir((out / "step_8").string()); });
    CHECK_THAT(what, Catch::Contains((out / "step_8.tmp").string()) && Catch::Contains("begin_checkpoint_dir") &&
                         Catch::Contains("No such file or directory"));
    touch(dir.path / "blocker");
    what = error_of<std::runtime_error>([&] { pv::begin_checkpoint_dir((dir.path / "blocker" / "step_1").string()); });
    CHECK_THAT(what, Catch::Contains("blocker/step_1.tmp") && Catch::Contains("Not a directory"));
    CHECK_THROWS_AS(pv::begin_checkpoint_dir(""), std::invalid_argument);

    // latest_checkpoint: the largest N (numerically: 10 > 9) among complete step_N directories.
    const std::string marker = "trainer_state.json";
    CHECK(pv::latest_checkpoint((dir.path / "nowhere").string(), marker) == std::nullopt);
    fs::create_directories(dir.path / "empty");
    CHECK(pv::latest_checkpoint((dir.path / "empty").string(), marker) == std::nullopt);
    CHECK(pv::latest_checkpoint(out.string(), marker) == (out / "step_5").string());
    for (const char* d : {"step_9", "step_10", "step_20", "step_30.tmp", "step_x", "step_", "step_-40", "stepped_50",
                          "step_99999999999999999999999"}) {
        fs::create_directories(out / d);
        if (std::string(d) != "step_20") touch(out / d / marker);  // step_20 is incomplete
    }
    touch(out / "step_40");  // a file, not a directory
    fs::create_directories(out / "step_60");
    fs::create_directories(out / "step_60" / marker);  // the marker must be a regular file
    CHECK(pv::latest_checkpoint(out.string(), marker) == (out / "step_10").string());
    // The checkpoint becomes visible only when its commit renames it into place.
    const std::string tmp20 = pv::begin_checkpoint_dir((out / "step_20").string());
    touch(fs::path(tmp20) / marker);
    CHECK(pv::latest_checkpoint(out.string(), marker) == (out / "step_10").string());
    pv::commit_checkpoint_dir((out / "step_20").string());
    CHECK(pv::latest_checkpoint(out.string(), marker) == (out / "step_20").string());
    // Another marker name: only directories holding it count.
    touch(out / "step_9" / "model.safetensors");
    CHECK(pv::latest_checkpoint(out.string(), "model.safetensors") == (out / "step_9").string());

    what = error_of<std::runtime_error>([&] { (void)pv::latest_checkpoint((dir.path / "blocker").string(), marker); });
    CHECK_THAT(what, Catch::Contains("blocker") && Catch::Contains("not a directory"));
}

// list_checkpoints: every complete step_N by step (numerically), the rest ignored;
// checkpoint_temporaries: the step_N.tmp directories only.
TEST_CASE("checkpoint directories: every complete one in step order, and the unfinished .tmp ones", "[checkpoint]") {
    TempDir dir;
    const fs::path out = dir.path / "run";
    const std::string marker = "trainer_state.json";
    CHECK(pv::list_checkpoints(out.string(), marker).empty());
    CHECK(pv::checkpoint_temporaries(out.string()).empty());
    for (const char* d :
         {"step_10", "step_9", "step_2", "step_3", "step_7.tmp", "step_12.tmp", "step_x.tmp", "other"}) {
        fs::create_directories(out / d);
        if (std::string(d) != "step_3") touch(out / d / marker);  // step_3 is incomplete
    }
    touch(out / "step_5.tmp");  // a file, not a directory
    const auto all = pv::list_checkpoints(out.string(), marker);
    std::vector<std::pair<long long, std::string>> got;
    for (const auto& c : all) got.emplace_back(c.step, c.path);
    CHECK(got == std::vector<std::pair<long long, std::string>>{
                     {2, (out / "step_2").string()}, {9, (out / "step_9").string()}, {10, (out / "step_10").string()}});
    CHECK(pv::checkpoint_temporaries(out.string()) ==
          std::vector<std::string>{(out / "step_12.tmp").string(), (out / "step_7.tmp").string()});
}

// A checkpoint whose writing fails (here the writer throws as a full disk makes a write fail)
// leaves no .tmp behind and the earlier checkpoint as it was; the message keeps the cause and
// says the bytes needed, where, and the free space there.
TEST_CASE("checkpoint directories: a failed write removes its .tmp and says the bytes needed and free",
          "[checkpoint]") {
    TempDir dir;
    const fs::path out = dir.path / "run";
    pv::write_checkpoint_dir((out / "step_1").string(), 5,
                             [&](const std::string& tmp) { touch(fs::path(tmp) / "trainer_state.json", "one"); });
    CHECK(slurp_text(out / "step_1" / "trainer_state.json") == "one");
    CHECK_FALSE(fs::exists(out / "step_1.tmp"));
    bool wrote = false;
    const std::string what = error_of<std::runtime_error>([&] {
        pv::write_checkpoint_dir((out / "step_2").string(), 123456789, [&](const std::string& tmp) {
            touch(fs::path(tmp) / "model.safetensors", "half");
            wrote = true;
            throw std::runtime_error("safetensors 'x': write failed: No space left on device");
        });
    });
    CHECK(wrote);
    CHECK_FALSE(fs::exists(out / "step_2.tmp"));
    CHECK_FALSE(fs::exists(out / "step_2"));
    CHECK(slurp_text(out / "step_1" / "trainer_state.json") == "one");
    CHECK_THAT(what, Catch::Contains("write failed: No space left on device") &&
                         Catch::Contains("checkpoint " + (out / "step_2").string() + " was not written") &&
                         Catch::Contains("its temporary directory is removed") &&
                         Catch::Contains("needs about 123456789 bytes (117.7 MiB) in " + out.string()) &&
                         Catch::Contains("bytes (") && Catch::Contains(" free"));
    CHECK(pv::latest_checkpoint(out.string(), "trainer_state.json") == (out / "step_1").string());
}

// What a ZeRO-3 rank keeps is a slice of each padded group; reading only that slice must give
// exactly that slice of the whole read, and deliver nothing outside it.
TEST_CASE("checkpoint ranged reads: every group's slice equals the same slice of the whole read", "[checkpoint]") {
    TempDir dir;
    for (const char* name : {"test-tiny", "test-tied"}) {
        const auto layouts = layouts_for(pv::preset(name), 3);
        const std::string path = dir.file("ranges.safetensors");
        pv::write_group_tensors(path, layouts, random_groups(layouts, pv::DType::fp64, 21));
        const pv::HostGroups whole = pv::read_group_tensors(path, layouts, pv::DType::fp32);
        for (int shard = 0; shard < 3; ++shard) {
            INFO(name << ", shard " << shard);
            pv::HfCheckpoint source = pv::HfCheckpoint::open_file(path);
            std::vector<pv::ElementRange> ranges;
            for (const pv::GroupLayout& l : layouts) ranges.push_back({l.shard_numel() * shard, l.shard_numel()});
            std::vector<std::vector<float>> got(layouts.size());
            for (size_t k = 0; k < layouts.size(); ++k) got[k].assign(size_t(ranges[k].len), NAN);
            uint64_t delivered = 0;
            pv::read_group_ranges(source, layouts, ranges, pv::DType::fp32,
                                  [&](size_t k, long long at, const uint8_t* data, long long n) {
                                      REQUIRE(at >= 0);
                                      REQUIRE(at + n <= ranges[k].len);
                                      std::memcpy(got[k].data() + at, data, size_t(n) * 4);
                                      delivered += uint64_t(n);
                                  });
            uint64_t inside = 0;  // tensor elements inside the slices
            for (size_t k = 0; k < layouts.size(); ++k)
                for (long long i = 0; i < ranges[k].len; ++i) {
                    const long long e = ranges[k].begin + i;
                    bool in_tensor = false;
                    for (const pv::TensorSlot& t : layouts[k].tensors)
                        in_tensor |= e >= t.offset && e < t.offset + t.spec.numel();
                    inside += in_tensor;
                    // Delivered: the whole read's value; not delivered (padding, gaps): untouched.
                    if (in_tensor)
                        REQUIRE(double(got[k][size_t(i)]) == get(whole, k, e));
                    else
                        REQUIRE(std::isnan(got[k][size_t(i)]));
                }
            CHECK(delivered == inside);
            // Only the slices' bytes were read (fp64 in the file), besides the header.
            pv::HfCheckpoint header_only = pv::HfCheckpoint::open_file(path);
            CHECK(source.bytes_read() == header_only.bytes_read() + inside * 8);
        }
    }
}

TEST_CASE("checkpoint tensor checks: what Hugging Face ignores by name is skipped, the rest refused", "[checkpoint]") {
    TempDir dir;
    const pv::LlamaConfig tiny = pv::preset("test-tiny");
    pv::LlamaConfig tied = tiny;
    tied.tie_embeddings = true;
    const auto untied_layouts = layouts_for(tiny, 1), tied_layouts = layouts_for(tied, 1);
    const std::string path = dir.file("hf.safetensors");
    std::vector<pv::SafeTensor> tensors;
    pv::write_group_tensors(path, untied_layouts, random_groups(untied_layouts, pv::DType::bf16, 3));
    tensors = pv::read_safetensors(path).tensors;
    tensors.push_back({"model.layers.1.self_attn.rotary_emb.inv_freq", "F32", {4}, std::vector<uint8_t>(16, 0)});
    pv::write_safetensors(path, tensors);
    const pv::HfCheckpoint source = pv::HfCheckpoint::open_file(path);
    using E = pv::ExtraTensors;
    CHECK(pv::check_group_tensors(source, untied_layouts, E::hugging_face) ==
          std::vector<std::string>{"model.layers.1.self_attn.rotary_emb.inv_freq"});
    // Tied: the head uses the embedding, and the file's lm_head.weight is not the model's.
    std::vector<std::string> skipped = pv::check_group_tensors(source, tied_layouts, E::hugging_face);
    std::sort(skipped.begin(), skipped.end());
    CHECK(skipped == std::vector<std::string>{"lm_head.weight", "model.layers.1.self_attn.rotary_emb.inv_freq"});
    CHECK(pv::check_group_tensors(source, tied_layouts, E::ignore).size() == 2);
    CHECK_THAT(error_of<std::runtime_error>([&] { pv::check_group_tensors(source, untied_layouts, E::refuse); }),
               Catch::Contains("'model.layers.1.self_attn.rotary_emb.inv_freq'") &&
                   Catch::Contains("belongs to no parameter"));
    // A name merely ending like it is still foreign.
    tensors.push_back({"model.layers.1.self_attn.rotary_emb.inv_freq_x", "F32", {4}, std::vector<uint8_t>(16, 0)});
    pv::write_safetensors(path, tensors);
    const pv::HfCheckpoint odd = pv::HfCheckpoint::open_file(path);
    CHECK_THAT(error_of<std::runtime_error>([&] { pv::check_group_tensors(odd, untied_layouts, E::hugging_face); }),
               Catch::Contains("'model.layers.1.self_attn.rotary_emb.inv_freq_x'") &&
                   Catch::Contains("skips only what Hugging Face itself ignores"));
}

// Edits a safetensors file's JSON header in place (padded with spaces to its old length, which the
// format allows), so the file stays a valid safetensors file of the same size.
inline void edit_safetensors_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
    std::string bytes = slurp_text(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, size_t(n)));
    edit(header);
    std::string text = header.dump();
    REQUIRE(text.size() <= n);
    text.resize(size_t(n), ' ');
    bytes.replace(8, size_t(n), text);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_CASE("checkpoint file checksums: recorded while writing, and every corruption refused naming the file",
          "[checkpoint][checksum]") {
    TempDir dir;
    const pv::LlamaConfig tiny = pv::preset("test-tiny");
    std::vector<pv::GroupLayout> layouts;
    for (const pv::UnitSpec& unit : pv::model_units(tiny))
        layouts.push_back(pv::layout_group(pv::GroupKind::trainable, pv::DType::bf16, unit.tensors, 1));
    const std::string ckpt = dir.file("step_1");
    fs::create_directories(ckpt);
    const std::string model = ckpt + "/model.safetensors", config = ckpt + "/config.json";
    pv::FileDigests files;
    {
        pv::WriteRecorder written;
        pv::write_group_tensors(model, layouts, random_groups(layouts, pv::DType::bf16, 21));
        pv::write_hf_config(config, tiny);
        for (const pv::WrittenFile& f : written.files()) files[fs::path(f.path).filename().string()] = f.digest;
    }
    REQUIRE(files.size() == 2);
    // What the recorder saw is the file's XXH3 and size, computed here by libxxhash over the bytes read back.
    for (const auto& [name, digest] : files) {
        const std::string bytes = slurp_text(ckpt + "/" + name);
        CHECK(digest.bytes == bytes.size());
        CHECK(digest.xxh3 == XXH3_64bits(bytes.data(), bytes.size()));
    }
    pv::verify_checkpoint_files(ckpt, files, 0, 1);  // intact: accepted
    const auto refused = [&](const std::vector<std::string>& expected) {
        const std::string what = error_of<std::runtime_error>([&] { pv::verify_checkpoint_files(ckpt, files, 0, 1); });
        CHECK_THAT(what, Catch::Contains(model));
        for (const std::string& e : expected) CHECK_THAT(what, Catch::Contains(e));
    };
    // Each corruption below leaves a file the tensor reader itself accepts: only the checksum tells.
    const auto still_reads = [&] { CHECK_NOTHROW(pv::read_group_tensors(model, layouts, pv::DType::fp32)); };

    SECTION("a flipped bit inside tensor data") {
        std::string bytes = slurp_text(model);
        bytes[bytes.size() - 1000] ^= 0x10;
        std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
        still_reads();
        refused({"XXH3 checksum", "trainer_state.json records", "restore it"});
    }
    SECTION("BF16 tensors relabelled F16") {
        edit_safetensors_header(model, [](nlohmann::json& h) {
            for (auto& [name, t] : h.items())
                if (name != "__metadata__") t["dtype"] = "F16";
        });
        still_reads();
        refused({"XXH3 checksum"});
    }
    SECTION("two same-size tensors' offsets swapped") {
        edit_safetensors_header(model, [](nlohmann::json& h) {
            auto& k = h["model.layers.0.self_attn.k_proj.weight"];
            auto& v = h["model.layers.0.self_attn.v_proj.weight"];
            REQUIRE(k["shape"] == v["shape"]);
            std::swap(k["data_offsets"], v["data_offsets"]);
        });
        still_reads();
        refused({"XXH3 checksum"});
    }
    SECTION("a truncated file") {
        fs::resize_file(model, fs::file_size(model) - 64);
        refused({"bytes, but trainer_state.json records", "truncated"});
    }
    SECTION("a missing file, unless the caller accepts its absence") {
        fs::remove(model);
        refused({"is missing"});
        pv::verify_checkpoint_files(ckpt, files, 0, 1, {"model.safetensors"});
    }
    SECTION("dealt out over ranks: file i (name order) is read by rank i mod ranks only") {
        std::string bytes = slurp_text(model);  // model.safetensors is file 1 of {config.json, model.safetensors}
        bytes[100] ^= 1;
        std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
        pv::verify_checkpoint_files(ckpt, files, 0, 2);
        CHECK_THROWS_AS(pv::verify_checkpoint_files(ckpt, files, 1, 2), std::runtime_error);
        CHECK_THROWS_AS(pv::verify_checkpoint_files(ckpt, files, 1, 3), std::runtime_error);
        pv::verify_checkpoint_files(ckpt, files, 2, 3);
    }
    SECTION("an edited config.json is refused naming the field, both values") {
        pv::LlamaConfig edited = tiny;
        edited.rope_theta = 500000.0;
        pv::write_hf_config(config, edited);
        const std::string what =
            error_of<std::runtime_error>([&] { pv::check_checkpoint_config(ckpt, pv::hf_config_json(tiny)); });
        CHECK_THAT(
            what, Catch::Contains(config) && Catch::Contains("rope_theta 500000.0") && Catch::Contains("used 10000.0"));
        CHECK_THAT(what, !Catch::Contains("rms_norm_eps"));
        CHECK_THROWS_WITH(pv::verify_checkpoint_files(ckpt, files, 0, 1), Catch::Contains(config));
    }
    SECTION("the intact config.json matches the model it was written for") {
        pv::check_checkpoint_config(ckpt, pv::hf_config_json(tiny));
    }
}

TEST_CASE("checkpoint without a file a bit-exact resume needs: refused naming it and the flag, or accepted",
          "[checkpoint][checksum]") {
    TempDir dir;
    const std::string ckpt = dir.file("step_3");
    fs::create_directories(ckpt);
    for (const char* f : {"master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) touch(ckpt + "/" + f);
    CHECK(pv::missing_optimizer_files(ckpt, true, false).empty());
    fs::remove(ckpt + "/master.safetensors");
    CHECK(pv::missing_optimizer_files(ckpt, false, false).empty());  // an fp32 run has no master
    const std::string what = error_of<std::runtime_error>([&] { pv::missing_optimizer_files(ckpt, true, false); });
    CHECK_THAT(what, Catch::Contains("has no master.safetensors") && Catch::Contains("bit for bit") &&
                         Catch::Contains("--allow-inexact-resume"));
    fs::remove(ckpt + "/adam_v.safetensors");
    CHECK_THAT(error_of<std::runtime_error>([&] { pv::missing_optimizer_files(ckpt, false, false); }),
               Catch::Contains("has no adam_v.safetensors") && Catch::Contains("--allow-inexact-resume"));
    CHECK(pv::missing_optimizer_files(ckpt, true, true) ==
          std::vector<std::string>{"master.safetensors", "adam_v.safetensors"});
}
