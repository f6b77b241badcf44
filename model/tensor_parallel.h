// Tensor parallelism's split of a block's tensors (Megatron-LM, Shoeybi et al. 2019): what each of
// the T ranks of a tensor-parallel group holds of every whole tensor. Host code only.
//
// Attention is split by heads: W_qkv column-parallel (rank r computes its Hq/T query heads and the
// key/value heads they read), W_o row-parallel (its input columns are those heads' outputs); the
// MLP by the ffn dimension: W_gate and W_up column-parallel (rows [r·F/T, (r+1)·F/T) of each),
// W_down row-parallel (the same columns). In y = x·W_qkvᵀ the columns of y are the rows of W_qkv,
// so a column-parallel linear holds a block of ROWS of the weight, a row-parallel one a block of
// COLUMNS; the norms are replicated. A column-parallel linear's input is replicated (its input
// gradient is summed over the group in the backward), a row-parallel linear's output is a partial
// sum (summed over the group in the forward): the two all-reduces per sub-layer of the paper.
//
// Grouped-query attention: when T divides the key/value heads, rank r holds kv heads
// [r·Hkv/T, (r+1)·Hkv/T). When it does not but each rank's query heads read one kv head (Hq/T
// divides the group size Hq/Hkv), that kv head is replicated on the T/Hkv ranks that read it, as
// Megatron does; its gradient is then the sum of theirs. Other T are refused, naming the T that
// work.
//
// The vocabulary (Megatron's vocabulary-parallel embedding and head): rank r holds the token rows
// [r·P, min(V, (r+1)·P)) of the embedding and of an untied lm_head, P = ⌈V/T⌉ (the vocabulary
// padded to a multiple of T). The padding rows are stored nowhere: the last rank holds fewer rows,
// so they never reach the logits, the loss or a checkpoint. A T that would leave a rank no rows is
// refused. The embedding looks up the tokens in its rows (zeros for the others) and the group sums
// the rows; the head computes its columns of the logits and the vocabulary-parallel cross-entropy
// (kernels/cross_entropy.cuh) merges the ranks' row statistics: the whole logits never meet.
//
// LoRA (model/lora.h): a column-parallel base's adapter keeps A whole (replicated: its gradient is
// summed over the group) and splits B by output rows like the base; a row-parallel base's adapter
// splits A by input columns like the base and keeps B whole.
//
// A slice keeps the whole tensor's name and id: TensorSpec::slice says where its block sits in
// the whole tensor (initialisation keys each element by its index in the whole tensor, so every T
// initialises the same model), and its parts name the Hugging Face rows they hold (hf_row_begin),
// so checkpoints keep whole Hugging Face tensors.
#pragma once

#include "model/config.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "model/placement.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pv {

// The attention heads a rank holds: query heads [q_first, q_first + q_count), kv heads
// [kv_first, kv_first + kv_count).
// kv_copy: the kv heads are replicated and a rank before this one holds them too (its rows of
// them are RowRun::copy).
struct HeadSlice {
    int q_first = 0, q_count = 0, kv_first = 0, kv_count = 0;
    bool kv_copy = false;
};

// The token rows [first, first + count) of the embedding and the head a rank holds.
struct VocabSlice {
    long long first = 0, count = 0;
};

// Whether block linear k (model/lora.h LoraLinear) is column-parallel (W_qkv, W_gate_up: rows
// split, input whole) rather than row-parallel (W_o, W_down: columns split, output a partial sum).
inline bool column_parallel(int linear) { return linear == kLoraQkv || linear == kLoraGateUp; }

// Whether a block's closing residual add (out = x2 + the down projection) is the down GEMM's β = 1
// onto a copy of x2 (model/llama.cu forward_block; the step model prices the same launches): not
// under tensor parallelism, where the row-parallel GEMM holds a share summed over the group first,
// nor in a recompute, which stops before the down projection.
inline bool residual_add_in_down_gemm(int tensor_size, bool recompute) { return tensor_size == 1 && !recompute; }

// Throws std::invalid_argument naming why `size` cannot split `c` and the sizes that can.
void check_tensor_parallel(const LlamaConfig& c, int size);
// Whether T splits c's heads and ffn (check_tensor_parallel's test, without the message).
bool tensor_parallel_fits(const LlamaConfig& c, int size);
HeadSlice tensor_parallel_heads(const LlamaConfig& c, TensorParallel tp);
VocabSlice tensor_parallel_vocab(const LlamaConfig& c, TensorParallel tp);
// Whether the kv heads are replicated across the group (T does not divide Hkv).
bool kv_heads_replicated(const LlamaConfig& c, int size);
// The whole model's key and value rows of W_qkv (2·Hkv·head_dim) when T replicates the kv heads,
// else 0: the rows of the buffer in which a replicated head's weight gradient is summed over the
// group (each rank adds its share at its head's rows, zeros elsewhere).
long long replicated_kv_rows(const LlamaConfig& c, int size);
// The rows of W_qkv's adapter B (lora_linears(c, lora)[kLoraQkv]) that adapt k or v, whose
// gradient is summed over the group when the kv heads are replicated; 0 when it adapts q alone.
long long adapter_kv_rows(const LlamaConfig& c, const LoraConfig& lora);

// model_units(c, lora) with every block tensor, the embedding and an untied lm_head replaced by
// rank tp.rank's slice of it (the norms whole). tp.size = 1: model_units itself.
std::vector<UnitSpec> tensor_parallel_units(const LlamaConfig& c, const LoraConfig& lora, TensorParallel tp);

// QLoRA under tensor parallelism: each rank's slice of an NF4 block linear must hold whole 64-element
// quantisation blocks of its Hugging Face modules (model/nf4_layout.h). Throws std::invalid_argument
// naming the tensor a split over `size` ranks would cut and the sizes that split every one.
void check_nf4_tensor_parallel(const LlamaConfig& c, const LoraConfig& lora, int size);
// Whether an NF4 base splits over `size` ranks (check_nf4_tensor_parallel's test, without the message).
bool nf4_tensor_parallel_fits(const LlamaConfig& c, const LoraConfig& lora, int size);

// The element ranges [begin, end) of group g (a rank's slices) that tensor rank `rank` counts in
// a sum over the group's elements that takes each whole element once, such as the gradient norm:
// the whole group on rank 0; on the others their slices without their copies (RowRun::copy), the
// whole tensors being rank 0's. Adjacent ranges are merged. Padding and alignment gaps are zero in
// a gradient, so rank 0's range spans them.
std::vector<std::pair<long long, long long>> counted_ranges(const GroupLayout& g, int rank);

// The bytes of a group of whole tensors (layout `whole`) from the T ranks' slices of it: rank r's
// group (layout slices[r]) at slice_bytes[r], in values of `element` bytes (the parameters' type or
// the optimizer's). Each slice's rows go where its TensorSpec::slice places them in the whole
// tensor; a tensor every rank holds whole (an RMSNorm weight) is taken from rank 0. Padding and
// alignment gaps are zero. Throws std::invalid_argument when the slices leave an element of a
// whole tensor unwritten or name a tensor the whole layout lacks. Checkpoints keep whole tensors
// this way (parallel/strategy.h whole_on_writer); loading reads each slice from the whole tensors
// directly (model/checkpoint.h read_group_ranges).
std::vector<uint8_t> join_tensor_slices(const GroupLayout& whole, const std::vector<GroupLayout>& slices,
                                        const std::vector<const uint8_t*>& slice_bytes, size_t element);

// The shape one rank computes with: c with its query heads, kv heads, ffn size and vocabulary rows
// (head_dim set explicitly, since hidden_size / num_heads no longer gives it). Activation and workspace layouts
// and the kernels' dimensions follow from it; tensor names, ids and checkpoints from c.
LlamaConfig tensor_parallel_shape(const LlamaConfig& c, TensorParallel tp);

}  // namespace pv
