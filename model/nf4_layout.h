// Where an NF4-quantised tensor's fields live in its parameter group (QLoRA's frozen base;
// kernels/nf4.cuh has the format, bit for bit bitsandbytes').
//
// bitsandbytes quantises each Hugging Face linear on its own (its absmax blocks, double-quant
// offset and nested blocks are per module), so a fused polevault tensor ([Wq; Wk; Wv], [Wgate;
// Wup]) is quantised part by part, exactly as a bitsandbytes checkpoint of the same model: the
// codes and statistics of q_proj are those bitsandbytes gives q_proj, and a pre-quantised
// checkpoint's fields copy in unchanged. A tensor's slot in the group holds its parts one after
// another; each part's fields start on a 256-byte boundary:
//   codes     ceil(n/2) bytes, two 4-bit codes per byte (the first element in the high nibble)
//   absmax    fp32 per block of 64 — or, with double quantisation, one 8-bit code per block,
//   nested    fp32 per 256 blocks, and
//   offset    one fp32 (the mean the absmaxes were centred on).
// An NF4 group keeps the storage type T of the run's other groups (its bytes counted in T
// elements, slots aligned to max(64 elements, 256 bytes)), so sharding, ZeRO-3's gathers and the
// memory accounting treat it like any group; a slice boundary then always falls on a 256-byte,
// so whole-block, boundary of every field.
//
// Tensor parallelism (model/tensor_parallel.h) gives a rank a block of rows or of columns of a
// fused tensor. Each Hugging Face module stays quantised as a whole (bitsandbytes' statistics
// span the module), and the slice holds the codes and absmaxes (or absmax codes) of the module's
// 64-element blocks it covers, with the module's nested scales and offset whole: so a slice must
// not cut a block. A block of rows qualifies when it starts and ends on a block boundary of the
// flattened module (or at its end); a block of columns when the module's columns, the slice's
// first column and its width are multiples of 64 (a block then never spans two rows). Anything
// else is refused (std::invalid_argument naming the tensor). nf4_slice_fields cuts a slice's
// fields out of the whole module's.
// Host code only.
#pragma once

#include "model/parameters.h"

#include <cstdint>
#include <vector>

namespace pv {

inline constexpr long long kNf4FieldAlignment = 256;  // bytes

// The block linears --quantize nf4 stores in NF4 (bitsandbytes' Linear4bit layers), by the
// polevault name after "layers.<l>.".
inline constexpr const char* kNf4Linears[] = {"w_qkv", "w_o", "w_gate_up", "w_down"};

// One part's fields: byte offsets from the start of its tensor's slot, and its element count.
// A slice's part (kernels/nf4.cuh Nf4BlockMap): local block j is block
// block_first + (j / block_run)·block_stride + j % block_run of the whole module; block_run = 0
// for a whole module. nested_blocks: the whole module's nested scales (double quantisation).
struct Nf4PartFields {
    long long n = 0;                                          // elements (rows · cols of the part)
    long long row_begin = 0;                                  // its rows within the fused tensor
    long long codes = 0, absmax = 0, nested = 0, offset = 0;  // nested, offset: double quantisation only
    long long end = 0;                                        // one past its last byte
    long long block_first = 0, block_run = 0, block_stride = 0;
    long long nested_blocks = 0;
};

// The fields of each of `spec`'s parts, in part order. Throws std::invalid_argument when spec is a
// tensor-parallel slice that cuts one of its modules' 64-element blocks.
std::vector<Nf4PartFields> nf4_part_fields(const TensorSpec& spec, bool double_quant);

// The slot of `slice` (nf4_slot_bytes(slice) bytes at `out`, zeroed by the caller) from the slot
// of the whole tensor it is a slice of (`whole`, slice.whole_tensor(), at `whole_slot`): each
// part's codes and absmaxes of the blocks the slice covers, its nested scales and offset whole.
void nf4_slice_fields(const TensorSpec& whole, const TensorSpec& slice, bool double_quant, const uint8_t* whole_slot,
                      uint8_t* out);

// Bytes of a tensor's slot: its parts' fields, the last one's end.
long long nf4_slot_bytes(const TensorSpec& spec, bool double_quant);

}  // namespace pv
