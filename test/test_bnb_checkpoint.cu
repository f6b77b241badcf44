// Pre-quantised bitsandbytes 4-bit checkpoints read into QLoRA's NF4 base (formats/bnb_checkpoint.h,
// trainer/load.h). The fixtures in test/data/bnb/ were written by transformers 5.23 and
// bitsandbytes 0.50.2 themselves (test/interop/make_bnb_checkpoint_fixtures.py): a tiny bf16 Llama
// (dense/) and the 4-bit checkpoints save_pretrained wrote after loading it with double
// quantisation (nf4_dq/) and without (nf4/). The expected slot bytes are built here from the files
// as formats/safetensors.h's plain reader returns them, not through the loader under test. Last,
// tensor parallelism's NF4 slices: each rank's slot, quantised whole and cut, dequantises to the
// whole module's values at its elements (the kernel's block map).
#include "formats/bnb_checkpoint.h"
#include "formats/config_json.h"
#include "model/llama.h"
#include "model/tensor_parallel.h"
#include "model/unit_loop.h"
#include "test/check.h"
#include "test/error_of.h"
#include "test/nf4_values.h"
#include "test/temp_dir.h"
#include "trainer/load.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

using namespace pv::test;

namespace {

const std::string kDir = "test/data/bnb/";  // tests run from the repository root

pv::ModelOptions qlora(bool nf4, bool double_quant) {
    pv::ModelOptions o = pv::whole_model(2, 8, 7);
    o.lora.rank = 2, o.lora.alpha = 4;
    o.nf4 = nf4, o.double_quant = double_quant;
    return o;
}

pv::LlamaConfig fixture_config() { return pv::read_hf_config(kDir + "dense/config.json"); }

// The bytes of unit u's NF4 group (its last group) on the host.
template <class T>
std::vector<uint8_t> nf4_group_bytes(pv::Llama<T>& m, int u) {
    const int g = m.num_groups(u) - 1;
    REQUIRE(m.group(u, g).kind == pv::GroupKind::nf4);
    std::vector<uint8_t> out(m.group(u, g).bytes());
    CUDA_CHECK(cudaMemcpy(out.data(), m.group_params(u, g), out.size(), cudaMemcpyDeviceToHost));
    return out;
}

// The nested_offset of a quant_state JSON, parsed by hand (its digits round-trip the fp32 value).
float nested_offset(const pv::SafeTensor& state) {
    const std::string text(state.data.begin(), state.data.end());
    const size_t at = text.find("\"nested_offset\":");
    REQUIRE(at != std::string::npos);
    return float(std::strtod(text.c_str() + at + 16, nullptr));
}

// What unit u's NF4 group must hold after loading `file`: zeros, and each part's fields at the
// offsets model/nf4_layout.h gives, copied from the file's tensors.
std::vector<uint8_t> expected_group(const pv::SafeTensorsFile& file, const pv::GroupLayout& layout) {
    std::vector<uint8_t> out(layout.bytes(), 0);
    const size_t x = pv::dtype_size(layout.dtype);
    for (const pv::TensorSlot& t : layout.tensors) {
        const auto fields = pv::nf4_part_fields(t.spec, layout.double_quant);
        for (size_t p = 0; p < fields.size(); ++p) {
            uint8_t* slot = out.data() + size_t(t.offset) * x;
            const std::string w = t.spec.parts[p].hf_name;
            auto put = [&](long long at, const std::vector<uint8_t>& bytes) {
                std::memcpy(slot + at, bytes.data(), bytes.size());
            };
            put(fields[p].codes, file.at(w).data);
            put(fields[p].absmax, file.at(w + ".absmax").data);
            if (layout.double_quant) {
                put(fields[p].nested, file.at(w + ".nested_absmax").data);
                const float offset = nested_offset(file.at(w + pv::kBnbQuantStateSuffix));
                std::memcpy(slot + fields[p].offset, &offset, sizeof offset);
            }
        }
    }
    return out;
}

template <class T>
std::vector<T> download_n(const T* p, size_t n) {
    std::vector<T> host(n);
    CUDA_CHECK(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

template <class T>
std::pair<double, int> loss_of(pv::Llama<T>& m, uint64_t seed) {
    const int rows = 2 * m.seq_len();
    std::mt19937_64 rng(seed);
    std::vector<int> tokens(static_cast<size_t>(rows)), targets(static_cast<size_t>(rows));
    for (int& t : tokens) t = int(rng() % uint64_t(m.config().vocab_size));
    for (int& t : targets) t = int(rng() % uint64_t(m.config().vocab_size));
    DeviceArray<int> tok(tokens), tgt(targets);
    DeviceArray<pv::acc_t<T>> loss(1);
    DeviceArray<int> count(1);
    pv::single_forward(m, 0, pv::DeviceBatch{tok.get(), tgt.get(), nullptr, 0, -1}, loss.get(), count.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    return {double(loss.download()[0]), count.download()[0]};
}

template <class T>
void load_base(pv::Llama<T>& m, const std::string& dir) {
    pv::HfCheckpoint source = pv::HfCheckpoint::open_dir(dir);
    pv::load_model_weights(source, m, pv::GroupSet::base);
}

// A copy of fixture `name` with `edit` applied to its tensors (config.json as it is).
template <class F>
std::string edited(const TempDir& tmp, const std::string& name, const std::string& as, F&& edit) {
    pv::SafeTensorsFile file = pv::read_safetensors(kDir + name + "/model.safetensors");
    edit(file.tensors);
    const std::string dir = tmp.file(as);
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(kDir + name + "/config.json", dir + "/config.json");
    pv::write_safetensors(dir + "/model.safetensors", file.tensors, file.metadata);
    return dir;
}

pv::SafeTensor& find(std::vector<pv::SafeTensor>& tensors, const std::string& name) {
    for (pv::SafeTensor& t : tensors)
        if (t.name == name) return t;
    FAIL("no tensor " << name);
    return tensors.front();
}

void set_state(std::vector<pv::SafeTensor>& tensors, const std::string& weight, const std::string& from,
               const std::string& to) {
    pv::SafeTensor& s = find(tensors, weight + pv::kBnbQuantStateSuffix);
    std::string text(s.data.begin(), s.data.end());
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    s.data.assign(text.begin(), text.end());
    s.shape = {int64_t(text.size())};
}

const std::string kQ = "model.layers.0.self_attn.q_proj.weight";

}  // namespace

TEST_CASE("a bitsandbytes checkpoint's NF4 fields land in the slots bit for bit, gaps zero", "[bnb]") {
    const pv::LlamaConfig c = fixture_config();
    for (const bool dq : {true, false}) {
        const std::string dir = kDir + (dq ? "nf4_dq" : "nf4");
        INFO(dir);
        pv::Llama<float> m(c, qlora(true, dq));  // initialised (and quantised) from the seed: other bytes
        const std::vector<uint8_t> before = nf4_group_bytes(m, 1);
        load_base(m, dir);
        const std::vector<uint8_t> got = nf4_group_bytes(m, 1);
        const pv::SafeTensorsFile file = pv::read_safetensors(dir + "/model.safetensors");
        const std::vector<uint8_t> want = expected_group(file, m.group(1, m.num_groups(1) - 1));
        CHECK(got != before);
        REQUIRE(got == want);
        // The unquantised tensors (norms here) are the file's bf16 values.
        const std::vector<float> norm = download_n(m.tensor("layers.0.attn_norm"), size_t(c.hidden_size));
        const pv::SafeTensor& hf = file.at("model.layers.0.input_layernorm.weight");
        for (size_t i = 0; i < norm.size(); ++i) {
            uint16_t bits;
            std::memcpy(&bits, hf.data.data() + 2 * i, 2);
            const uint32_t f = uint32_t(bits) << 16;
            float v;
            std::memcpy(&v, &f, 4);
            REQUIRE(norm[i] == v);
        }
    }
}

TEST_CASE("each slice of a bitsandbytes NF4 group loads alone, reading only its own bytes", "[bnb]") {
    const pv::LlamaConfig c = fixture_config();
    pv::Llama<__nv_bfloat16> m(c, qlora(true, true));
    const pv::GroupLayout layout = m.group(1, m.num_groups(1) - 1);
    pv::HfCheckpoint whole_source = pv::HfCheckpoint::open_dir(kDir + "nf4_dq");
    DeviceArray<__nv_bfloat16> whole(size_t(layout.padded));
    pv::load_group_ranges<__nv_bfloat16>(whole_source, {layout}, {{whole.get(), 0, layout.padded}},
                                         pv::ExtraTensors::ignore);
    const uint64_t whole_bytes = whole_source.bytes_read() - whole_source.header_bytes();
    const std::vector<__nv_bfloat16> want = whole.download();
    std::mt19937_64 rng(3);
    for (int trial = 0; trial < 4; ++trial) {
        // Cuts at random 64-element boundaries (ZeRO-3's shards are whole multiples of 64).
        std::vector<long long> cuts = {0, layout.padded};
        for (int k = 0; k < 2 + trial; ++k) cuts.push_back(64 * (long long)(rng() % uint64_t(layout.padded / 64)));
        std::sort(cuts.begin(), cuts.end());
        DeviceArray<__nv_bfloat16> got(size_t(layout.padded));  // poisoned: every byte must be written
        uint64_t read = 0;
        for (size_t k = 0; k + 1 < cuts.size(); ++k) {
            pv::HfCheckpoint source = pv::HfCheckpoint::open_dir(kDir + "nf4_dq");
            const long long len = cuts[k + 1] - cuts[k];
            pv::load_group_ranges<__nv_bfloat16>(source, {layout}, {{got.get() + cuts[k], cuts[k], len}},
                                                 pv::ExtraTensors::ignore);
            const uint64_t bytes = source.bytes_read() - source.header_bytes();
            // The quant_states and maps are read by every rank's check; the fields only for its range.
            INFO("slice [" << cuts[k] << ", " << cuts[k + 1] << ") read " << bytes << " bytes of " << whole_bytes);
            if (len * 4 < layout.padded) CHECK(bytes < whole_bytes);
            read += bytes;
        }
        const std::vector<__nv_bfloat16> g = got.download();
        REQUIRE(std::memcmp(g.data(), want.data(), g.size() * sizeof(g[0])) == 0);
    }
}

TEST_CASE("QLoRA from a bitsandbytes checkpoint computes exactly what the dense one quantised by polevault does",
          "[bnb]") {
    const pv::LlamaConfig c = fixture_config();
    // Without double quantisation bitsandbytes' CPU codes and polevault's agree on this model: the
    // slots are equal byte for byte, and so is the loss.
    {
        pv::Llama<float> pre(c, qlora(true, false)), dense(c, qlora(true, false));
        load_base(pre, kDir + "nf4");
        load_base(dense, kDir + "dense");
        for (int u = 1; u + 1 < pre.num_units(); ++u) REQUIRE(nf4_group_bytes(pre, u) == nf4_group_bytes(dense, u));
        const auto [lp, np] = loss_of(pre, 5);
        const auto [ld, nd] = loss_of(dense, 5);
        REQUIRE(np == nd);
        REQUIRE(lp == ld);
    }
    // With double quantisation the codes, nested absmaxes and offsets agree too; the 8-bit absmax
    // codes may differ by one step where bitsandbytes' CPU table lookup is not the nearest entry
    // (kernels/nf4.cuh, difference 5), never by more.
    {
        pv::Llama<float> pre(c, qlora(true, true)), dense(c, qlora(true, true));
        load_base(pre, kDir + "nf4_dq");
        load_base(dense, kDir + "dense");
        const pv::GroupLayout& layout = pre.group(1, pre.num_groups(1) - 1);
        const std::vector<uint8_t> a = nf4_group_bytes(pre, 1), b = nf4_group_bytes(dense, 1);
        long long blocks = 0, off_by_one = 0;
        for (const pv::TensorSlot& t : layout.tensors)
            for (const pv::Nf4PartFields& f : pv::nf4_part_fields(t.spec, true)) {
                const size_t base = size_t(t.offset) * sizeof(float);
                const long long nb = (f.n + 63) / 64, nn = (nb + 255) / 256;
                REQUIRE(std::memcmp(&a[base + f.codes], &b[base + f.codes], size_t(f.n + 1) / 2) == 0);
                REQUIRE(std::memcmp(&a[base + f.nested], &b[base + f.nested], size_t(4 * nn)) == 0);
                REQUIRE(std::memcmp(&a[base + f.offset], &b[base + f.offset], 4) == 0);
                for (long long k = 0; k < nb; ++k) {
                    const int d = int(a[base + f.absmax + k]) - int(b[base + f.absmax + k]);
                    REQUIRE(std::abs(d) <= 1);
                    off_by_one += d != 0, ++blocks;
                }
            }
        INFO(off_by_one << " of " << blocks << " absmax codes one step apart");
        CHECK(off_by_one * 50 <= blocks);
    }
}

TEST_CASE("bitsandbytes checkpoints that the run cannot hold as they are are refused with the fix", "[bnb]") {
    const pv::LlamaConfig c = fixture_config();
    SECTION("into a dense base (no --quantize nf4)") {
        pv::Llama<float> m(c, qlora(false, true));
        const std::string e = error_of<std::runtime_error>([&] { load_base(m, kDir + "nf4_dq"); });
        CHECK_THAT(e, Catch::Contains("bitsandbytes 4-bit") && Catch::Contains("--quantize nf4"));
        pv::Llama<float> full(c, pv::whole_model(2, 8, 7));  // not even LoRA: the same refusal
        const std::string f = error_of<std::runtime_error>([&] { load_base(full, kDir + "nf4"); });
        CHECK_THAT(f, Catch::Contains("--quantize nf4 --no-double-quant"));
    }
    SECTION("with the other double-quantisation setting") {
        pv::Llama<float> plain(c, qlora(true, false)), dq(c, qlora(true, true));
        CHECK_THAT(error_of<std::runtime_error>([&] { load_base(plain, kDir + "nf4_dq"); }),
                   Catch::Contains(kQ) && Catch::Contains("pass --double-quant"));
        CHECK_THAT(error_of<std::runtime_error>([&] { load_base(dq, kDir + "nf4"); }),
                   Catch::Contains(kQ) && Catch::Contains("pass --no-double-quant"));
    }
    SECTION("fields NF4 does not describe") {
        TempDir tmp("bnb_refusals");
        pv::Llama<float> m(c, qlora(true, true));
        auto refused = [&](const std::string& dir) { return error_of<std::runtime_error>([&] { load_base(m, dir); }); };
        const std::string k = "model.layers.0.self_attn.k_proj.weight";
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "fp4", [&](auto& t) { set_state(t, kQ, "\"nf4\"", "\"fp4\""); })),
                   Catch::Contains(kQ) && Catch::Contains("not \"nf4\""));
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "b128",
                                  [&](auto& t) { set_state(t, k, "\"blocksize\": 64", "\"blocksize\": 128"); })),
                   Catch::Contains(k) && Catch::Contains("blocksize 128"));
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "shape", [&](auto& t) { set_state(t, kQ, "[72, 72]", "[72, 71]"); })),
                   Catch::Contains("quant_state shape [72,71]") && Catch::Contains("[72, 72]"));
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "map",
                                  [&](auto& t) {
                                      pv::SafeTensor& q = find(t, kQ + ".quant_map");
                                      q.data[4 * 9] ^= 1;  // one bit of level 9
                                  })),
                   Catch::Contains(kQ) && Catch::Contains("quant_map") && Catch::Contains("entry 9"));
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "dynmap",
                                  [&](auto& t) {
                                      pv::SafeTensor& q = find(t, k + ".nested_quant_map");
                                      q.data[4 * 200 + 1] ^= 1;
                                  })),
                   Catch::Contains(k) && Catch::Contains("nested_quant_map") && Catch::Contains("entry 200"));
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "missing",
                                  [&](auto& t) {
                                      t.erase(std::find_if(t.begin(), t.end(), [&](const pv::SafeTensor& s) {
                                          return s.name == kQ + ".nested_absmax";
                                      }));
                                  })),
                   Catch::Contains(kQ + ".nested_absmax") && Catch::Contains("has no companion"));
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "stranger",
                                  [&](auto& t) {
                                      t.push_back({kQ + ".foo", "F32", {1}, {0, 0, 0, 0}});
                                  })),
                   Catch::Contains(kQ + ".foo") && Catch::Contains("belongs to no parameter"));
        // q_proj dense (the dense fixture's) beside a quantised k_proj and v_proj: one fused w_qkv.
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "mixed",
                                  [&](auto& t) {
                                      const pv::SafeTensorsFile dense =
                                          pv::read_safetensors(kDir + "dense/model.safetensors");
                                      for (const std::string& s : pv::bnb_companions(kQ, true))
                                          t.erase(std::find_if(t.begin(), t.end(),
                                                               [&](const pv::SafeTensor& x) { return x.name == s; }));
                                      find(t, kQ) = dense.at(kQ);
                                  })),
                   Catch::Contains("layers.0.w_qkv") && Catch::Contains("partly"));
        // lm_head quantised too (llm_int8_skip_modules=[]): QLoRA keeps it dense.
        CHECK_THAT(refused(edited(tmp, "nf4_dq", "head",
                                  [&](auto& t) {
                                      for (const char* s : {"", ".absmax", ".quant_map", ".nested_absmax",
                                                            ".nested_quant_map", pv::kBnbQuantStateSuffix}) {
                                          pv::SafeTensor x = find(t, kQ + s);
                                          x.name = std::string("lm_head.weight") + s;
                                          if (x.name == "lm_head.weight")
                                              std::swap(find(t, "lm_head.weight"), x);
                                          else
                                              t.push_back(x);
                                      }
                                  })),
                   Catch::Contains("'lm_head.weight' is a bitsandbytes 4-bit linear") &&
                       Catch::Contains("llm_int8_skip_modules"));
        // Nothing was half-loaded: the checks come before any read, so the fixture still loads.
        load_base(m, kDir + "nf4_dq");
    }
}

// Tensor parallelism's slices (model/nf4_layout.h, Nf4BlockMap): each rank's slot of a block
// linear, made by quantising the whole tensor and cutting out the slice's fields, dequantises to
// exactly the whole tensor's dequantised values at the elements the slice holds (bits compared),
// for blocks of rows (W_qkv, W_gate_up) and of columns (W_o, W_down, whose blocks index nested
// scales spread over the whole module: 4 nested blocks for W_down), with and without double
// quantisation, at 2 and 4 ranks. Random weights with block scales 2^-6..2^6 and a zero block (test/nf4_values.h); outputs poisoned.
TEST_CASE("nf4: a tensor-parallel slice dequantises to the whole tensor's values at its elements", "[bnb][nf4]") {
    pv::LlamaConfig c;
    c.name = "qlora-test";
    c.vocab_size = 37, c.hidden_size = 128, c.num_layers = 1, c.num_heads = 8, c.num_kv_heads = 4;
    c.head_dim = 32, c.ffn_size = 512, c.max_seq_len = 16;
    pv::LoraConfig lora;
    lora.rank = 2, lora.alpha = 4;
    const pv::UnitSpec whole_block = pv::model_units(c, lora).at(1);
    for (bool dq : {true, false})
        for (const pv::TensorSpec& w : whole_block.tensors) {
            if (w.name.find("lora") != std::string::npos || w.name.find("norm") != std::string::npos) continue;
            const std::vector<float> values = nf4_awkward_values<float>(w.numel(), 40 + w.id);
            const DeviceArray<float> x(values);
            DeviceArray<uint8_t> whole_slot(size_t(pv::nf4_slot_bytes(w, dq)));
            pv::nf4_quantize_slot(w, dq, x.get(), whole_slot.get(), nullptr);
            DeviceArray<float> whole_out(size_t(w.numel()));
            pv::nf4_dequantize_slot(pv::nf4_part_fields(w, dq), dq, w.cols, whole_slot.get(), whole_out.get(), nullptr);
            const std::vector<float> want = whole_out.download();
            for (int t : {2, 4})
                for (int r = 0; r < t; ++r) {
                    INFO(w.name << ", T = " << t << ", rank " << r << (dq ? ", double quantisation" : ""));
                    pv::TensorSpec s;
                    const std::vector<pv::UnitSpec> units = pv::tensor_parallel_units(c, lora, {t, r});
                    for (const pv::TensorSpec& x : units.at(1).tensors)
                        if (x.name == w.name) s = x;
                    REQUIRE(!s.slice.whole());
                    DeviceArray<uint8_t> slot(size_t(pv::nf4_slot_bytes(s, dq)));
                    pv::nf4_quantize_slice_slot(s, dq, x.get(), slot.get(), nullptr);
                    DeviceArray<float> out(size_t(s.numel()));
                    pv::nf4_dequantize_slot(pv::nf4_part_fields(s, dq), dq, s.cols, slot.get(), out.get(), nullptr);
                    const std::vector<float> got = out.download();
                    long long bad = -1;
                    for (long long i = 0; i < s.numel() && bad < 0; ++i)
                        if (std::memcmp(&got[size_t(i)], &want[size_t(s.whole_index(i))], sizeof(float)) != 0) bad = i;
                    CHECK(bad == -1);
                }
        }
    // Rank 1 of 2 holds down_proj's columns [256, 512) of 512: per row 4 blocks from block 4 of 8.
    pv::TensorSpec down;
    const std::vector<pv::UnitSpec> units = pv::tensor_parallel_units(c, lora, {2, 1});
    for (const pv::TensorSpec& x : units.at(1).tensors)
        if (x.name == "layers.0.w_down") down = x;
    DeviceArray<uint8_t> slot(size_t(pv::nf4_slot_bytes(down, true)));
    const pv::Nf4Tensor view = pv::nf4_part(slot.get(), pv::nf4_part_fields(down, true).at(0), true);
    CHECK((view.blocks.first == 4 && view.blocks.run == 4 && view.blocks.stride == 8));
    CHECK(view.blocks.whole_block(5) == 8 + 4 + 1);
    // A slice is never quantised on its own: its statistics are the whole module's.
    const DeviceArray<float> x(nf4_awkward_values<float>(down.numel(), 7));
    DeviceArray<uint8_t> scratch(pv::nf4_quantize_scratch_bytes(down.numel(), true));
    CHECK_THROWS_WITH(pv::nf4_quantize(x.get(), down.numel(), view, scratch.get(), nullptr),
                      Catch::Contains("is a slice of a larger tensor; quantise the whole tensor"));
}
