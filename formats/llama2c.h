// llama2.c checkpoints (karpathy/llama2.c: the format its run.c reads, export.py's legacy
// "version 0") converted to a Hugging Face model directory: `train convert --from llama2c`.
//
// The file, all little-endian:
//   7 × int32   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//               (vocab_size < 0: the classifier is stored separately; > 0: it is the embedding)
//   fp32 arrays, each matrix row-major [out][in], stacked over the layers where there are layers,
//   with hs = dim / n_heads (the head size), q = n_heads·hs, kv = n_kv_heads·hs:
//     token_embedding [V][dim]
//     rms_att         [L][dim]        attention RMSNorm weights
//     wq              [L][q][dim]
//     wk              [L][kv][dim]
//     wv              [L][kv][dim]
//     wo              [L][dim][q]
//     rms_ffn         [L][dim]        MLP RMSNorm weights
//     w1              [L][hidden][dim]  gate
//     w2              [L][dim][hidden]  down
//     w3              [L][hidden][dim]  up
//     rms_final       [dim]
//     freq_cis_real   [seq_len][hs/2]   RoPE tables of old exports: skipped (we compute RoPE)
//     freq_cis_imag   [seq_len][hs/2]
//     wcls            [V][dim]          only when vocab_size < 0
// and nothing after. llama2.c's model is Llama's: RMSNorm with eps 1e-5, RoPE with θ = 10000 on
// every head, SwiGLU MLP w2(silu(w1·x) ⊙ w3·x), no biases.
//
// RoPE pairs. llama2.c rotates the interleaved pairs (2j, 2j+1) of each head by angle pos·ω_j
// (ω_j = θ^(−2j/hs)): x'[2j] = x[2j]·cos − x[2j+1]·sin, x'[2j+1] = x[2j]·sin + x[2j+1]·cos.
// Hugging Face's rotate_half (and our kernels) rotate the pairs (j, j + hs/2) by the same angle
// with the same formula. So a head's q (or k) in rotate_half order is the interleaved one with its
// components reordered: rotate_half index p·hs/2 + j holds interleaved index 2j + p (p ∈ {0, 1}),
// which makes every pair of one land on the matching pair of the other, rotated alike. Reordering
// the rows of wq and wk that way (per head: n_heads heads for wq, n_kv_heads for wk) gives q and
// k in rotate_half order; attention only takes dot products q·k within a head, and a permutation
// applied to both sides leaves them unchanged, so the model computes exactly what llama2.c does.
// wv and wo keep their order (v is not rotated). This is the permutation Hugging Face's
// convert_llama_weights_to_hf.py applies to Meta's checkpoints.
//
// The directory written: config.json (LlamaForCausalLM, torch_dtype float32, head_dim hs,
// rms_norm_eps 1e-5, rope_theta 10000, max_position_embeddings seq_len, tie_word_embeddings for a
// shared classifier), model.safetensors (F32, Hugging Face names, one tensor read, permuted and
// written at a time) and generation_config.json with llama2.c's BOS 1 and EOS 2 (its
// SentencePiece vocabulary's). No tokenizer ships with a llama2.c checkpoint. The directory is
// built as `out.tmp` and renamed into place; `out` must not exist or be empty.
// Host code only.
#pragma once

#include "model/config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

struct Llama2cHeader {
    int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
    bool shared_classifier = true;  // vocab_size was positive
    long long head_size() const { return dim / n_heads; }
};

// Reads and checks the header of `path` against itself and against the file's size. Throws
// std::runtime_error naming the file, the problem and the fix: a file shorter than the header, a
// field that is not positive, dim not a multiple of n_heads, n_heads not of n_kv_heads, an odd
// head size, a size other than the header implies (truncated, or another format — export.py's
// version 1 and 2 files, which start with the magic "ak42", are named as such).
Llama2cHeader read_llama2c_header(const std::string& path);

// The model a llama2.c header describes (above); `name` becomes its name.
LlamaConfig llama2c_config(const Llama2cHeader& h, const std::string& name);

// The rotate_half order of `heads` heads of `head_size` rows each: row r of the result is row
// order[r] of the interleaved matrix (above).
std::vector<long long> rotate_half_row_order(int heads, long long head_size);

// Converts the checkpoint at `bin` into the Hugging Face directory `out_dir` (above). Returns the
// model's config.
LlamaConfig convert_llama2c(const std::string& bin, const std::string& out_dir);

}  // namespace pv
