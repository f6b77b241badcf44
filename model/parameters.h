// Parameter groups: how a unit's tensors are laid out in flat device buffers (DESIGN.md §3).
//
// A unit (the embedding, one transformer block, the head) owns a list of groups, one per
// (storage kind, trainable) pair: today one trainable group in the run's storage type; LoRA and
// NF4 add frozen and quantised groups beside it. A group is ONE flat buffer; its tensors are
// views at offsets. Every tensor starts on a 64-element boundary, and the group is padded so it
// splits into `shards` equal slices that are themselves multiples of 64 elements: DDP buckets,
// ZeRO shards and optimizer state then become arithmetic on offsets. Padding is zeroed when the
// buffer is allocated and nothing ever writes it, so it contributes nothing to norms or updates.
//
// Tensors the GEMMs fuse are one tensor here: [Wq; Wk; Wv] is one [(H + 2·Hkv)·hd][C] matrix and
// [Wgate; Wup] one [2F][C] matrix, each with `parts` naming the Hugging Face tensors (row ranges)
// it contains, for import and export.
#pragma once

#include "model/config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

enum class DType { bf16, fp32, fp64 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

// How a tensor is initialised: N(0, 0.02²) for matrices, 1 for RMSNorm weights.
enum class Init { normal, ones };

// A Hugging Face tensor inside a (possibly fused) polevault tensor: rows [row_begin, +rows).
struct TensorPart {
    std::string hf_name;
    long long row_begin = 0, rows = 0;
};

struct TensorSpec {
    std::string name;  // polevault's name, e.g. "layers.3.w_qkv"
    long long rows = 0, cols = 0;  // a vector is rows x 1
    Init init = Init::normal;
    std::vector<TensorPart> parts;  // the HF tensors it holds (one part covering it all if unfused)
    long long numel() const { return rows * cols; }
};

// A tensor placed in a group.
struct TensorSlot {
    TensorSpec spec;
    uint32_t id = 0;        // model-wide tensor id: keys its random initialisation (philox.cuh)
    long long offset = 0;   // elements from the group's start; a multiple of kTensorAlignment
};

inline constexpr long long kTensorAlignment = 64;  // elements

struct GroupLayout {
    std::vector<TensorSlot> tensors;
    long long used = 0;    // elements up to the end of the last tensor
    long long padded = 0;  // total elements: a multiple of shards · kTensorAlignment
    int shards = 1;
    long long shard_numel() const { return padded / shards; }
    const TensorSlot& find(const std::string& name) const;  // throws naming the tensor
};

// Places `specs` (ids first_id, first_id + 1, ...) in one group splittable into `shards`.
GroupLayout layout_group(const std::vector<TensorSpec>& specs, uint32_t first_id, int shards);

enum class UnitKind { embedding, block, head };

struct UnitSpec {
    UnitKind kind;
    int layer = -1;                   // blocks only
    std::vector<TensorSpec> tensors;  // its trainable tensors, in layout order
};

// The units of a Llama model in forward order: embedding, num_layers blocks, head. With tied
// embeddings the head has no lm_head of its own: it uses the embedding unit's wte.
std::vector<UnitSpec> model_units(const LlamaConfig& config);

}  // namespace pv
