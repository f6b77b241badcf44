// Parameter groups: how a unit's tensors are laid out in flat buffers (DESIGN.md §3).
//
// A unit (the embedding, one transformer block, the head) is a list of groups. A group has a kind
// — trainable (it gets a gradient, an fp32 master where the storage type is narrower, Adam's m
// and v, and DDP/ZeRO reduce it) or frozen (none of those: it only feeds the forward and passes
// gradients through to its inputs) — and a storage dtype of its own, independent of the compute
// type. The quantized kinds QLoRA needs (packed 4-bit codes, their block scales) are further
// kinds with their own storage dtypes; nothing here assumes a group holds the compute type.
//
// A group is ONE flat buffer; its tensors are views at offsets. Every tensor starts on a
// 64-element boundary, and the group is padded so it splits into `shards` equal slices that are
// themselves multiples of 64 elements: DDP buckets, ZeRO shards and optimizer state are then
// arithmetic on offsets. Padding is zeroed when the buffer is allocated and nothing ever writes
// it, so it contributes nothing to norms or updates. An empty group (a unit whose tensors are all
// frozen has an empty trainable group) has no elements at all.
//
// Tensors the GEMMs fuse are one tensor here: [Wq; Wk; Wv] is one [(H + 2·Hkv)·hd][C] matrix and
// [Wgate; Wup] one [2F][C] matrix, each with `parts` naming the Hugging Face tensors (row ranges)
// it contains, for import, export and --freeze. Tensor parallelism will split a tensor by rows or
// columns across ranks: that is a per-tensor placement in the layout (each rank's group holding
// its block of rows or columns), while checkpoints keep writing whole tensors under these names.
// Host code only.
#pragma once

#include "model/config.h"
#include "model/lora.h"
#include "model/placement.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace pv {

// The storage types (DESIGN.md §4), named bf16, fp32 and fp64 (dtype_name; --dtype's values).
// model/dtype.h turns a DType into its element type (with_dtype).
enum class DType { bf16, fp32, fp64 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);
// The DType named `name` (dtype_name's inverse). Throws std::invalid_argument naming the value and
// the three choices for any other name.
DType parse_dtype(const std::string& name);

// How a tensor is initialised: N(0, 0.02²) for matrices, 1 for RMSNorm weights; a LoRA A is
// U(−1/√cols, 1/√cols) (PEFT's kaiming-uniform), a LoRA B zero (model/lora.h).
enum class Init { normal, ones, uniform_fan_in, zeros };

// A Hugging Face tensor inside a (possibly fused) polevault tensor: rows [row_begin, +rows), which
// are the Hugging Face tensor's rows [hf_row_begin, +rows) (not 0 for a tensor-parallel slice) of
// its hf_rows (0: rows, the part is all of it).
struct TensorPart {
    std::string hf_name;
    long long row_begin = 0, rows = 0;
    long long hf_row_begin = 0;
    long long hf_rows = 0;
    long long whole_rows() const { return hf_rows > 0 ? hf_rows : rows; }
};

// Local rows [local, local + rows) of a slice are the whole tensor's rows [whole, whole + rows).
// copy: another rank of the group holds the same rows and is the one that counts them (a replicated
// key/value head on a rank after the first that reads it): the gradient norm and a checkpoint's join
// take them from that rank.
struct RowRun {
    long long local = 0, whole = 0, rows = 0;
    bool copy = false;
};

// Where a tensor-parallel rank's block of a tensor sits in the whole tensor (model/tensor_parallel.h):
// its rows (runs, in local order) and the columns [col_begin, col_begin + the spec's cols) of a
// whole tensor of rows × cols. rows = 0: the tensor is whole.
struct TensorSlice {
    long long rows = 0, cols = 0;
    long long col_begin = 0;
    std::vector<RowRun> runs{};
    bool whole() const { return rows == 0; }
};

struct TensorSpec {
    std::string name;              // polevault's name, e.g. "layers.3.w_qkv"
    long long rows = 0, cols = 0;  // a vector is rows x 1
    Init init = Init::normal;
    bool decay = true;              // AdamW's weight decay applies (matrices); false for RMSNorm weights
    std::vector<TensorPart> parts;  // the HF tensors it holds (one part covering it all if unfused)
    uint32_t id = 0;                // model-wide tensor id: keys its random initialisation and rounding (philox.cuh)
    TensorSlice slice{};            // a tensor-parallel block of the whole tensor (default: the whole)
    long long numel() const { return rows * cols; }
    // The index in the whole tensor of local element i (row-major): what keys its initialisation.
    long long whole_index(long long i) const;
    // The columns and elements of the whole tensor (the columns of each Hugging Face tensor of its parts).
    long long whole_cols() const { return slice.whole() ? cols : slice.cols; }
    long long whole_numel() const { return slice.whole() ? numel() : slice.rows * slice.cols; }
    // The whole tensor a slice is cut from: its shape, its parts whole (each Hugging Face tensor
    // at its rows of the fused whole). A whole tensor returns itself.
    TensorSpec whole_tensor() const;
};

// A tensor placed in a group.
struct TensorSlot {
    TensorSpec spec;
    long long offset = 0;  // elements from the group's start; a multiple of kTensorAlignment
};

inline constexpr long long kTensorAlignment = 64;  // elements

// nf4: frozen weights stored as NF4 (model/nf4_layout.h); frozen in every other respect.
enum class GroupKind { trainable, frozen, nf4 };

struct GroupLayout {
    GroupKind kind = GroupKind::trainable;
    DType dtype = DType::fp32;
    std::vector<TensorSlot> tensors;
    long long used = 0;    // elements up to the end of the last tensor
    long long padded = 0;  // total elements: a multiple of shards · kTensorAlignment (0 when empty)
    int shards = 1;
    bool double_quant = false;  // nf4 groups: the absmaxes double-quantised
    bool trainable() const { return kind == GroupKind::trainable; }
    long long shard_numel() const { return padded / shards; }
    size_t bytes() const { return size_t(padded) * dtype_size(dtype); }
    const TensorSlot& find(const std::string& name) const;  // throws naming the tensor (for tools and tests)
};

// Whether two groups leave the same elements unwritten: the same size, and tensors of the same
// sizes at the same offsets (a buffer whose padding is zero for one is zero for the other; every
// block of a model, as a rule).
bool same_padding(const GroupLayout& a, const GroupLayout& b);

// Places `specs` in one group of `kind` and `dtype`, splittable into `shards` (an nf4 group: each
// tensor's NF4 slot, model/nf4_layout.h, in elements of `dtype`).
GroupLayout layout_group(GroupKind kind, DType dtype, const std::vector<TensorSpec>& specs, int shards,
                         bool double_quant = false);

enum class UnitKind { embedding, block, head };

// Which of ZeRO-2/3's gradient buffers unit u's backward writes (parallel/gradients_rotating.h,
// and the step cost that counts their zeroing, model/step_cost.cpp): units alternate between
// rotating buffers 0 and 1 in backward order, the last unit (the head) in 0; a tied embedding
// (unit 0) has a buffer of its own, 2.
inline int rotating_gradient_buffer(int u, int last, bool tied) { return u == 0 && tied ? 2 : (last - u) % 2; }

// A block's tensors, in layout order (model_units builds them in this order; typed views read
// them by it).
enum BlockTensor { kAttnNorm, kWQkv, kWO, kMlpNorm, kWGateUp, kWDown, kBlockTensors };

struct UnitSpec {
    UnitKind kind;
    int layer = -1;                   // blocks only
    std::vector<TensorSpec> tensors;  // its tensors, in layout order
};

// The units of a Llama model in forward order: embedding, num_layers blocks, head, tensor ids
// 0, 1, ... in that order. With tied embeddings the head has no lm_head of its own: it uses the
// embedding unit's wte. With LoRA each block's adapters follow its kBlockTensors base tensors
// (lora_a_qkv, lora_b_qkv, lora_a_o, ... for the targeted linears, model/lora.h), with ids after
// every base tensor's, so the base is initialised the same with and without adapters.
std::vector<UnitSpec> model_units(const LlamaConfig& config, const LoraConfig& lora = {});

// An adapter part's Hugging Face name is PEFT's key in adapter_model.safetensors:
// "base_model.model." + the module's path + ".lora_A.weight" (or lora_B), so the file polevault
// writes for the adapters is PEFT's as it is.
inline constexpr const char* kPeftKeyPrefix = "base_model.model.";

// The names of the base (non-adapter) tensors: what LoRA freezes.
std::set<std::string> base_tensor_names(const LlamaConfig& config);

// A unit's groups for storage type `dtype` and `shards` shards: groups[0] is the trainable group
// (possibly empty), then a frozen group when any of the unit's tensors is in `frozen` (polevault
// names, see model/freeze.h).
// The tensors in `quantized` (frozen ones) go to an nf4 group after the frozen one.
std::vector<GroupLayout> layout_unit(const UnitSpec& unit, DType dtype, int shards,
                                     const std::set<std::string>& frozen = {},
                                     const std::set<std::string>& quantized = {}, bool double_quant = true);

// What decides a model's groups besides its shape: the tensors --freeze keeps fixed, LoRA adapters
// (the whole base then frozen), NF4 (every block linear of the base quantised; needs LoRA).
struct GroupOptions {
    std::set<std::string> frozen;
    LoraConfig lora;
    bool nf4 = false;
    bool double_quant = true;
    TensorParallel tensor{};  // this rank's slice of the block tensors (model/tensor_parallel.h)
};

// Every unit's groups (model_units order, with LoRA's adapters) for storage type `dtype` and
// `shards` shards: what Llama allocates, and what the memory figures (parallel/memory.h) count.
// Throws std::invalid_argument for NF4 without LoRA.
std::vector<std::vector<GroupLayout>> model_layouts(const LlamaConfig& config, DType dtype, int shards,
                                                    const GroupOptions& options);

// Elements of `dtype` a tensor takes in a group of `kind` (its NF4 slot for an nf4 group).
long long slot_elements(const TensorSpec& spec, GroupKind kind, DType dtype, bool double_quant);

}  // namespace pv
