// Inference with a KV cache on top of a Llama<T>'s weights: a prompt is prefilled in one pass, then
// tokens are decoded one at a time, each step computing only the new position against the cached
// keys and values of all earlier ones (O(position) work per token instead of a whole forward).
//
// A pass over n new tokens at positions p0 .. p0 + n − 1 (n = the prompt for a prefill, 1 for a
// step) runs, in every block, what Llama::forward_block runs, on the n new rows only:
//   h1 = RMSNorm(x)·w_attn,  qkv = h1·W_qkvᵀ,  RoPE on q and k at positions p0 .. p0 + n − 1
//   cache rows p0 .. ← the k and v parts of qkv
//   att = attention_decode(q, cache rows 0 .. p0 + n − 1)       (kernels/attention_decode.cuh)
//   x2 = x + att·W_oᵀ,  h2 = RMSNorm(x2)·w_mlp,  out = x2 + SwiGLU(h2·W_guᵀ)·W_downᵀ
// and the head on the last row only: logits = RMSNorm(x)·w_final·W_lmᵀ (W_lm = wte when tied).
// The same kernels round at the same points as the training forward, so the logits of position t
// equal row t of a forward over the whole sequence, up to the order of the sums inside the
// attention and the GEMMs (test/test_decoder.cu checks every position in every dtype).
//
// The cache is [layers][max_positions][Hkv·hd] for K and again for V, in T, sized to what the caller
// asks (max_positions ≤ the model's max_position_embeddings): 2·L·max_positions·Hkv·hd elements.
// A pass holds at most max_rows tokens (its workspace is sized for that many rows); a longer
// prefill runs in passes of max_rows, which the decode kernel handles like any other (new rows
// against a cache that already holds earlier ones).
//
// The decoder reads the model's weights through its views (Llama::block_weights, ...) and never
// writes to the model; it owns its cache, workspace and cuBLAS handle and runs on the model's
// stream. The model must hold every unit with its parameters (a whole model on one rank). Logits
// come back to the host as double, converted from the model's storage type T.
#pragma once

#include "model/llama.h"
#include "platform/device_memory.h"

#include <utility>
#include <vector>

namespace pv {

// Every device buffer a Decoder allocates, in the order the constructor allocates them from this
// list: the K and V caches (MemoryCategory::activations), then its workspace (the rest). The
// memory planner adds them to a run that samples after training.
std::vector<ActivationBuffer> decoder_buffers(const LlamaConfig& c, DType dtype, const LoraConfig& lora,
                                              int max_positions, int max_rows);
inline constexpr int kDecoderCacheBuffers = 2;  // the first two: the K and V caches

// The Decoder that `train` builds after its last step to continue --prompt by sample_tokens
// tokens: at most one row per prompt byte (a token holds at least one byte; an empty prompt is
// the start token alone) and positions for the prompt and the tokens after it, within the
// model's context. {max_positions, max_rows}.
std::pair<int, int> sample_decoder_shape(const LlamaConfig& c, size_t prompt_bytes, int sample_tokens);

template <class T>
class Decoder {
  public:
    // Throws std::invalid_argument when max_positions is not in [1, max_position_embeddings],
    // max_rows not in [1, max_positions], or the model does not hold every unit's weights.
    Decoder(const Llama<T>& model, int max_positions, int max_rows);
    ~Decoder();
    Decoder(const Decoder&) = delete;
    Decoder& operator=(const Decoder&) = delete;

    // Appends the tokens at the next positions (in passes of at most max_rows) and returns the
    // logits [vocab] of the last one: the distribution of the token after it. Throws
    // std::invalid_argument for an empty list or a token outside the vocabulary, and
    // std::out_of_range when the cache would go past max_positions (naming both numbers).
    const std::vector<double>& prefill(const std::vector<int>& ids);
    // One token: prefill({id}).
    const std::vector<double>& step(int id);
    // Forgets every position (the next prefill starts at position 0).
    void reset() { position_ = 0; }

    int position() const { return position_; }  // tokens in the cache
    int max_positions() const { return max_positions_; }
    int max_rows() const { return max_rows_; }
    const LlamaConfig& config() const { return model_.config(); }
    // Bytes of the KV cache.
    size_t cache_bytes() const { return 2 * cache_k_.bytes(); }

  private:
    void pass(const int* ids, int n);

    const Llama<T>& model_;
    const int max_positions_, max_rows_;
    cudaStream_t stream_;
    cublasHandle_t cublas_ = nullptr;
    int position_ = 0;
    DeviceBuffer<T> cache_k_, cache_v_;  // [layers][max_positions][Hkv·hd]
    // Workspace for max_rows rows: the residual stream, the block's intermediates, the head.
    DeviceBuffer<T> x_, h_, qkv_, att_, proj_, gate_up_, act_, device_logits_;
    DeviceBuffer<T> adapter_scratch_;  // the adapters' u (Llama::linear_forward)
    DeviceBuffer<acc_t<T>> rstd_;
    DeviceBuffer<acc_t<T>> rope_table_;  // RoPE's cos/sin for positions [0, max_positions)
    DeviceBuffer<int> tokens_, positions_;
    DeviceBuffer<unsigned char> attention_scratch_;
    std::vector<int> host_positions_;
    std::vector<T> host_logits_;
    std::vector<double> logits_;
};

}  // namespace pv
