// bitsandbytes 4-bit linears in Hugging Face checkpoints (formats/bnb_checkpoint.h).
#include "formats/bnb_checkpoint.h"

#include "formats/config_json.h"
#include "io/durable_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace pv {
namespace {

using json = nlohmann::json;

constexpr int kBlockSize = 64, kNestedBlockSize = 256;  // kernels/nf4.cuh's, the only ones polevault stores

long long blocks_of(long long n) { return (n + kBlockSize - 1) / kBlockSize; }
long long nested_blocks_of(long long n) { return (blocks_of(n) + kNestedBlockSize - 1) / kNestedBlockSize; }

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

[[noreturn]] void fail(const HfCheckpoint& source, const std::string& tensor, const std::string& what) {
    throw std::runtime_error("checkpoint tensors '" + source.origin() + "': bitsandbytes 4-bit tensor '" + tensor +
                             "' " + what);
}

// The flag that gives a run the other double-quantisation setting.
const char* double_quant_flag(bool double_quant) { return double_quant ? "--double-quant" : "--no-double-quant"; }

// A tensor's header, checked for dtype and shape.
const SafeTensorInfo& expect(const HfCheckpoint& source, const std::string& weight, const std::string& name,
                             const std::string& dtype, const std::vector<int64_t>& shape) {
    const SafeTensorInfo* t = source.find(name);
    if (!t)
        fail(source, weight,
             "has no companion '" + name +
                 "' (a bitsandbytes NF4 linear is stored as the codes, absmax, quant_map and quant_state, with "
                 "nested_absmax and nested_quant_map under double quantisation: save the model again with "
                 "transformers' save_pretrained)");
    if (t->dtype != dtype || t->shape != shape)
        fail(source, weight,
             "has '" + name + "' of " + t->dtype + " " + shape_text(t->shape) + ", expected " + dtype + " " +
                 shape_text(shape) +
                 " (was it quantised with another block size, or for another model? compare "
                 "config.json with the weights)");
    return *t;
}

// `count` float32 values of tensor `name` equal `table` bit for bit.
void expect_table(const HfCheckpoint& source, const std::string& weight, const std::string& name, const float* table,
                  size_t count, const char* what) {
    std::vector<float> v(count);
    source.read_bytes(name, 0, count * sizeof(float), v.data());
    for (size_t i = 0; i < count; ++i)
        if (std::memcmp(&v[i], &table[i], sizeof(float)) != 0)
            fail(source, weight,
                 "has a '" + name.substr(weight.size() + 1) + "' that is not " + what + " (entry " + std::to_string(i) +
                     " is " + std::to_string(v[i]) + ", not " + std::to_string(table[i]) +
                     "): polevault stores NF4 with bitsandbytes' own tables only; quantise the model with "
                     "bitsandbytes' nf4 quant_type, or load its dense weights with --quantize nf4");
}

}  // namespace

bool is_bnb_quantized(const HfCheckpoint& source, const std::string& weight) {
    return source.find(weight + kBnbQuantStateSuffix) != nullptr;
}

std::vector<std::string> bnb_companions(const std::string& weight, bool double_quant) {
    std::vector<std::string> out = {weight + ".absmax", weight + ".quant_map"};
    if (double_quant) out.insert(out.end(), {weight + ".nested_absmax", weight + ".nested_quant_map"});
    out.push_back(weight + kBnbQuantStateSuffix);
    return out;
}

BnbTensor check_bnb_tensor(const HfCheckpoint& source, const std::string& weight, long long rows, long long cols,
                           bool double_quant) {
    const std::string state_name = weight + kBnbQuantStateSuffix;
    const SafeTensorInfo* state_info = source.find(state_name);
    if (!state_info) fail(source, weight, "has no quant_state ('" + state_name + "')");
    if (state_info->dtype != "U8" || state_info->shape.size() != 1 || state_info->bytes > (1u << 20))
        fail(source, weight,
             "has a quant_state of " + state_info->dtype + " " + shape_text(state_info->shape) +
                 ", not the U8 bytes of a JSON object");
    std::string text(state_info->bytes, '\0');
    source.read_bytes(state_name, 0, state_info->bytes, text.data());
    json state;
    try {
        state = json::parse(text);
    } catch (const json::exception& e) {
        fail(source, weight, "has a quant_state that is not JSON (" + std::string(e.what()) + ")");
    }
    auto field = [&](const char* key) -> const json& {
        if (!state.is_object() || !state.contains(key))
            fail(source, weight, std::string("has a quant_state without \"") + key + "\": " + text);
        return state.at(key);
    };
    const json& quant_type = field("quant_type");
    if (quant_type != "nf4")
        fail(source, weight,
             "is quantised as " + quant_type.dump() +
                 ", not \"nf4\": polevault stores NF4 only (bnb_4bit_quant_type=\"nf4\"); quantise the model "
                 "again as nf4, or load its dense weights with --quantize nf4");
    if (field("blocksize") != kBlockSize)
        fail(source, weight,
             "has blocksize " + field("blocksize").dump() +
                 ", not 64: polevault stores NF4 in blocks of 64 (QLoRA's); quantise with blocksize 64");
    const json& shape = field("shape");
    if (shape != json::array({rows, cols}))
        fail(source, weight,
             "has quant_state shape " + shape.dump() + ", expected [" + std::to_string(rows) + ", " +
                 std::to_string(cols) +
                 "] (was it written for a different model? compare config.json with the "
                 "weights)");
    const json& dtype = field("dtype");
    if (dtype != "bfloat16" && dtype != "float16" && dtype != "float32")
        fail(source, weight, "was quantised from dtype " + dtype.dump() + ", not bfloat16, float16 or float32");
    const bool nested = state.contains("nested_offset");
    if (nested != double_quant)
        fail(source, weight,
             std::string(nested ? "has double-quantised absmaxes (bnb_4bit_use_double_quant=true)"
                                : "has plain fp32 absmaxes (bnb_4bit_use_double_quant=false)") +
                 ", but this run stores NF4 " + (double_quant ? "with" : "without") + " double quantisation: pass " +
                 double_quant_flag(nested) +
                 " (polevault copies a pre-quantised checkpoint's fields as they are, never requantises them)");
    BnbTensor out{weight, nested, 0.0f};
    const long long n = rows * cols;
    expect(source, weight, weight, "U8", {(n + 1) / 2, 1});
    expect(source, weight, weight + ".absmax", nested ? "U8" : "F32", {blocks_of(n)});
    expect(source, weight, weight + ".quant_map", "F32", {16});
    expect_table(source, weight, weight + ".quant_map", nf4_levels_table(), 16, "bitsandbytes' NF4 levels");
    if (nested) {
        if (field("nested_blocksize") != kNestedBlockSize)
            fail(source, weight,
                 "has nested_blocksize " + field("nested_blocksize").dump() +
                     ", not 256: polevault double-quantises in blocks of 256 (bitsandbytes' own); quantise again");
        if (field("nested_dtype") != "float32")
            fail(source, weight, "has nested_dtype " + field("nested_dtype").dump() + ", not \"float32\"");
        const json& offset = field("nested_offset");
        if (!offset.is_number() || !std::isfinite(offset.get<double>()))
            fail(source, weight, "has nested_offset " + offset.dump() + ", not a finite number");
        out.offset = float(offset.get<double>());  // as bitsandbytes reads it: a float32 tensor
        expect(source, weight, weight + ".nested_absmax", "F32", {nested_blocks_of(n)});
        expect(source, weight, weight + ".nested_quant_map", "F32", {256});
        expect_table(source, weight, weight + ".nested_quant_map", nf4_dynamic_map_table(), 256,
                     "bitsandbytes' signed dynamic map");
    }
    return out;
}

void refuse_bnb_into_dense(const HfCheckpoint& source, const std::string& weight, bool run_quantizes) {
    if (run_quantizes)
        throw std::runtime_error("checkpoint tensors '" + source.origin() + "': '" + weight +
                                 "' is a bitsandbytes 4-bit linear, but QLoRA quantises only the blocks' linears "
                                 "(q/k/v/o/gate/up/down_proj) and keeps this tensor dense: save the checkpoint with "
                                 "it unquantised (transformers' llm_int8_skip_modules, which skips lm_head by "
                                 "default)");
    const bool nested = source.find(weight + ".nested_absmax") != nullptr;
    throw std::runtime_error(
        "checkpoint tensors '" + source.origin() + "': '" + weight +
        "' is a bitsandbytes 4-bit (NF4) linear: this checkpoint is pre-quantised, and polevault reads it only "
        "into an NF4 base, as it is; pass --lora-rank R --quantize nf4" +
        (nested ? "" : " --no-double-quant") + " (QLoRA) — dequantising it into a dense model would silently " +
        "give up the memory it saves");
}

void read_bnb_fields(const HfCheckpoint& source, const BnbTensor& t, const Nf4PartFields& f, long long lo, long long hi,
                     size_t piece, const std::function<void(long long, const uint8_t*, size_t)>& sink) {
    std::vector<uint8_t> buffer;
    // A field of `bytes` bytes at slot byte `at`, from tensor `name` (or the offset's 4 bytes).
    auto field = [&](long long at, long long bytes, const std::string& name) {
        const long long a = std::max(lo, at), b = std::min(hi, at + bytes);
        for (long long x = a; x < b; x += (long long)piece) {
            const size_t len = size_t(std::min<long long>((long long)piece, b - x));
            buffer.resize(len);
            if (name.empty())
                std::memcpy(buffer.data(), reinterpret_cast<const uint8_t*>(&t.offset) + (x - at), len);
            else
                source.read_bytes(name, uint64_t(x - at), len, buffer.data());
            sink(x, buffer.data(), len);
        }
    };
    const long long blocks = blocks_of(f.n);
    field(f.codes, (f.n + 1) / 2, t.weight);
    field(f.absmax, t.double_quant ? blocks : 4 * blocks, t.weight + ".absmax");
    if (!t.double_quant) return;
    field(f.nested, 4 * nested_blocks_of(f.n), t.weight + ".nested_absmax");
    field(f.offset, 4, "");
}

std::vector<TensorBytes> bnb_part_tensors(const std::string& weight, long long rows, long long cols,
                                          const Nf4PartFields& f, const uint8_t* slot, const std::string& dtype,
                                          bool double_quant) {
    const long long n = rows * cols, blocks = blocks_of(n);
    std::vector<TensorBytes> out;
    auto field = [&](const std::string& name, const char* type, std::vector<int64_t> shape, long long at,
                     long long bytes) {
        out.push_back({{name, type, std::move(shape), 0, 0}, std::vector<uint8_t>(slot + at, slot + at + bytes)});
    };
    auto table = [&](const std::string& name, const float* t, int64_t count) {
        const auto* b = reinterpret_cast<const uint8_t*>(t);
        out.push_back({{name, "F32", {count}, 0, 0}, std::vector<uint8_t>(b, b + count * sizeof(float))});
    };
    field(weight, "U8", {(n + 1) / 2, 1}, f.codes, (n + 1) / 2);
    field(weight + ".absmax", double_quant ? "U8" : "F32", {blocks}, f.absmax, double_quant ? blocks : 4 * blocks);
    table(weight + ".quant_map", nf4_levels_table(), 16);
    json state = {{"quant_type", "nf4"}, {"blocksize", kBlockSize}, {"dtype", dtype}, {"shape", {rows, cols}}};
    if (double_quant) {
        field(weight + ".nested_absmax", "F32", {nested_blocks_of(n)}, f.nested, 4 * nested_blocks_of(n));
        table(weight + ".nested_quant_map", nf4_dynamic_map_table(), 256);
        float offset = 0;
        std::memcpy(&offset, slot + f.offset, sizeof offset);
        state["nested_blocksize"] = kNestedBlockSize;
        state["nested_dtype"] = "float32";
        state["nested_offset"] = double(offset);  // exact: nlohmann prints a double to round-trip
    }
    const std::string text = state.dump();
    out.push_back({{weight + kBnbQuantStateSuffix, "U8", {int64_t(text.size())}, 0, 0},
                   std::vector<uint8_t>(text.begin(), text.end())});
    return out;
}

void write_bnb_hf_config(const std::string& path, const LlamaConfig& c, const std::string& torch_dtype,
                         bool double_quant) {
    json j = json::parse(hf_config_json(c, torch_dtype));
    // transformers' BitsAndBytesConfig.to_dict() keys; the block linears of every layer are
    // quantised, embeddings, norms and lm_head are not (what transformers skips by default).
    j["quantization_config"] = {{"quant_method", "bitsandbytes"},
                                {"load_in_4bit", true},
                                {"load_in_8bit", false},
                                {"_load_in_4bit", true},
                                {"_load_in_8bit", false},
                                {"bnb_4bit_quant_type", "nf4"},
                                {"bnb_4bit_use_double_quant", double_quant},
                                {"bnb_4bit_compute_dtype", torch_dtype},
                                {"bnb_4bit_quant_storage", "uint8"},
                                {"llm_int8_enable_fp32_cpu_offload", false},
                                {"llm_int8_has_fp16_weight", false},
                                {"llm_int8_skip_modules", nullptr},
                                {"llm_int8_threshold", 6.0}};
    const std::string text = j.dump(2) + "\n";
    write_file_atomically(path, "config.json", [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

}  // namespace pv
