// bitsandbytes 4-bit (NF4) linears in a Hugging Face checkpoint: what transformers' save_pretrained
// writes for a model loaded with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
// checked against the NF4 slots polevault keeps (model/nf4_layout.h), read into them field by
// field, and written by `train export --merged --quantized`. Host code only.
//
// The tensors of one quantised linear X.weight of [rows][cols], n = rows·cols elements (facts
// from bitsandbytes 0.50's Params4bit/QuantState.as_dict and a checkpoint transformers 5.23 saved):
//   X.weight                     U8 [ceil(n/2), 1]   the packed codes (kernels/nf4.cuh's layout)
//   X.weight.absmax              U8 [B] with double quantisation (the 8-bit absmax codes),
//                                F32 [B] without (the absmaxes), B = ceil(n/64)
//   X.weight.quant_map           F32 [16]            the NF4 levels
//   X.weight.nested_absmax       F32 [ceil(B/256)]   double quantisation only
//   X.weight.nested_quant_map    F32 [256]           double quantisation only: the dynamic map
//   X.weight.quant_state.bitsandbytes__nf4   U8 [k]  k bytes of UTF-8 JSON:
//       {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [rows, cols],
//        "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": <float>}
//       (the nested_* keys with double quantisation only; dtype is the tensor's type before
//       quantisation, what dequantize_4bit returns; nested_offset the fp32 mean of the absmaxes,
//       written as the double it converts to, which bitsandbytes reads back as a float32 tensor).
// Unquantised tensors (embeddings, norms, lm_head) are stored as usual, and config.json carries
// {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true,
// "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": ..., ...}}.
//
// A pre-quantised part's fields are copied into its slot as they are — the codes, the absmax or
// absmax codes, the nested absmaxes and the offset — never dequantised and requantised, so a
// polevault QLoRA run computes with exactly the weights bitsandbytes would. What the slot cannot
// hold is refused by name with the fix: another quant_type or block size, a quant_map that is not
// NF4's levels or a nested_quant_map that is not the dynamic map (bit for bit), a shape that
// contradicts config.json, and double quantisation other than the run's (--double-quant /
// --no-double-quant). A pre-quantised checkpoint read into a dense group (no --quantize nf4) is
// refused too: dequantising it would silently give up the memory it promises.
#pragma once

#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/nf4_layout.h"

#include <functional>
#include <string>
#include <vector>

namespace pv {

inline constexpr const char* kBnbQuantStateSuffix = ".quant_state.bitsandbytes__nf4";

// Whether `weight` (an HF tensor name such as model.layers.0.self_attn.q_proj.weight) is stored as
// a bitsandbytes 4-bit linear in `source`: its quant_state tensor is there.
bool is_bnb_quantized(const HfCheckpoint& source, const std::string& weight);

// A pre-quantised linear, checked.
struct BnbTensor {
    std::string weight;  // the codes' tensor name
    bool double_quant = false;
    float offset = 0;  // nested_offset (double quantisation)
};

// The names of `weight`'s companion tensors (everything but the codes) for the given setting.
std::vector<std::string> bnb_companions(const std::string& weight, bool double_quant);

// Checks every tensor of the pre-quantised linear `weight` of [rows][cols] against NF4 as polevault
// stores it with `double_quant` (the run's setting); reads the quant_state and the two maps.
// Throws std::runtime_error naming the checkpoint, the tensor, the problem and the fix.
BnbTensor check_bnb_tensor(const HfCheckpoint& source, const std::string& weight, long long rows, long long cols,
                           bool double_quant);

// The error for a pre-quantised `weight` read into a dense group: a run without --quantize nf4
// (`run_quantizes` false), or a tensor QLoRA keeps dense (embeddings, lm_head).
[[noreturn]] void refuse_bnb_into_dense(const HfCheckpoint& source, const std::string& weight, bool run_quantizes);

// Copies the bytes [lo, hi) of a part's slot fields (byte offsets from the start of its tensor's
// slot, model/nf4_layout.h) from the pre-quantised linear `t`: for each field that overlaps, calls
// sink(slot_byte, data, bytes) with that field's bytes inside [lo, hi), read in pieces of at most
// `piece` bytes. Gaps between fields are never delivered (the caller zeroed them).
void read_bnb_fields(const HfCheckpoint& source, const BnbTensor& t, const Nf4PartFields& f, long long lo, long long hi,
                     size_t piece, const std::function<void(long long, const uint8_t*, size_t)>& sink);

// ---- writing (train export --merged --quantized) ----------------------------------------------------

// A tensor to write, with its bytes.
struct TensorBytes {
    SafeTensorInfo info;
    std::vector<uint8_t> bytes;
};

// The tensors of one quantised linear `weight` of [rows][cols] in bitsandbytes' layout (above),
// from its part's fields `f` in a slot's host bytes `slot`, quantised from `dtype` ("bfloat16",
// "float32"): the codes, absmax, quant_map, [nested_absmax, nested_quant_map,] quant_state.
std::vector<TensorBytes> bnb_part_tensors(const std::string& weight, long long rows, long long cols,
                                          const Nf4PartFields& f, const uint8_t* slot, const std::string& dtype,
                                          bool double_quant);

// Writes config.json (formats/config_json.h's) with the quantization_config transformers reads for such
// a checkpoint (bnb_4bit_compute_dtype = torch_dtype).
void write_bnb_hf_config(const std::string& path, const LlamaConfig& c, const std::string& torch_dtype,
                         bool double_quant);

// kernels/nf4.cuh's kNf4Levels[16] and kNf4DynamicMap[256], for host code that cannot include a
// CUDA header (model/bnb_tables.cu).
const float* nf4_levels_table();
const float* nf4_dynamic_map_table();

}  // namespace pv
