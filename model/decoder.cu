// Inference with a KV cache (see model/decoder.h): one pass per prefill chunk or decode step.
#include "model/decoder.h"

#include "kernels/attention_decode.cuh"
#include "kernels/embedding.cuh"
#include "kernels/matmul.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"
#include "model/dtype.h"

#include <stdexcept>
#include <string>

namespace pv {

namespace {

template <class T>
int checked_max_positions(const Llama<T>& model, int max_positions, int max_rows) {
    const LlamaConfig& c = model.config();
    if (max_positions < 1 || max_positions > c.max_seq_len)
        throw std::invalid_argument("Decoder: max_positions = " + std::to_string(max_positions) + " must be in [1, " +
                                    std::to_string(c.max_seq_len) + "], the model's max_position_embeddings");
    if (max_rows < 1 || max_rows > max_positions)
        throw std::invalid_argument("Decoder: max_rows = " + std::to_string(max_rows) + " must be in [1, " +
                                    std::to_string(max_positions) + "] (max_positions)");
    if (!model.runs_every_unit() || model.tensor_parallel().size > 1)
        throw std::invalid_argument("Decoder: the model holds only part of itself here (a pipeline stage or a "
                                    "tensor-parallel slice); decoding needs the whole model on one rank");
    bool complete = model.embedding_weights() && model.head_weights().final_norm && model.head_weights().lm_head;
    for (int u = 1; u + 1 < model.num_units(); ++u) {
        const BlockParams<const T*>& w = model.block_weights(u);
        complete = complete && w.attn_norm && w.w_qkv && w.w_o && w.mlp_norm && w.w_gate_up && w.w_down;
    }
    if (!complete)
        throw std::invalid_argument(
            "Decoder: the model does not hold all of its weights (bound parameters not bound, or sharded); "
            "decoding needs every weight on this rank");
    return max_positions;
}

}  // namespace

std::vector<ActivationBuffer> decoder_buffers(const LlamaConfig& c, DType dtype, const LoraConfig& lora,
                                              int max_positions, int max_rows) {
    const long long R = max_rows, C = c.hidden_size, F = c.ffn_size;
    const size_t t = dtype_size(dtype), a = dtype == DType::fp64 ? 8 : 4;
    const long long cache = (long long)c.num_layers * max_positions * c.kv_width();
    const int H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim_resolved();
    const size_t scratch = with_dtype(dtype, [&](auto tag) {
        return attention_decode_scratch_bound<typename decltype(tag)::type>(max_rows, max_positions, H, Hkv, hd);
    });
    return {{"cache_k", cache, t},
            {"cache_v", cache, t},
            {"x", R * C, t},
            {"h", R * C, t},
            {"qkv", R * c.qkv_width(), t},
            {"att", R * c.q_width(), t},
            {"proj", R * C, t},
            {"gate_up", R * 2 * F, t},
            {"act", R * F, t},
            {"adapter_scratch", R * lora_max_a_rows(c, lora), t},
            {"logits", c.vocab_size, t},
            {"rstd", R, a},
            {"tokens", R, sizeof(int)},
            {"positions", R, sizeof(int)},
            {"rope_table", (long long)rope_inverse_frequencies(c).size() * 2 * max_positions, a},
            {"attention_scratch", (long long)scratch, 1}};
}

std::pair<int, int> sample_decoder_shape(const LlamaConfig& c, size_t prompt_bytes, int sample_tokens) {
    const int rows = int(std::clamp<size_t>(prompt_bytes, 1, size_t(c.max_seq_len)));
    return {std::min<long long>(c.max_seq_len, (long long)rows + std::max(sample_tokens, 1) - 1), rows};
}

template <class T>
Decoder<T>::Decoder(const Llama<T>& model, int max_positions, int max_rows)
    : model_(model),
      max_positions_(checked_max_positions(model, max_positions, max_rows)),
      max_rows_(max_rows),
      stream_(model.stream()) {
    const LlamaConfig& c = model.config();
    const long long R = max_rows;
    const std::vector<ActivationBuffer> b = decoder_buffers(c, dtype_of<T>(), model.lora(), max_positions, max_rows);
    const MemoryCategory act = MemoryCategory::activations, work = MemoryCategory::workspace;
    const auto n = [&](int i) { return size_t(b[size_t(i)].elements); };
    cache_k_ = DeviceBuffer<T>(n(0), act);
    cache_v_ = DeviceBuffer<T>(n(1), act);
    x_ = DeviceBuffer<T>(n(2), work);
    h_ = DeviceBuffer<T>(n(3), work);
    qkv_ = DeviceBuffer<T>(n(4), work);
    att_ = DeviceBuffer<T>(n(5), work);
    proj_ = DeviceBuffer<T>(n(6), work);
    gate_up_ = DeviceBuffer<T>(n(7), work);
    act_ = DeviceBuffer<T>(n(8), work);
    adapter_scratch_ = DeviceBuffer<T>(n(9), work);
    device_logits_ = DeviceBuffer<T>(n(10), work);
    rstd_ = DeviceBuffer<acc_t<T>>(n(11), work);
    tokens_ = DeviceBuffer<int>(n(12), work);
    positions_ = DeviceBuffer<int>(n(13), work);
    rope_table_ = rope_table_buffer<acc_t<T>>(c, max_positions, stream_);  // the cache's positions (n(14))
    if (n(15) > 0) attention_scratch_ = DeviceBuffer<unsigned char>(n(15), work);
    host_positions_.resize(size_t(R));
    host_logits_.resize(size_t(c.vocab_size));
    logits_.resize(size_t(c.vocab_size));
    CUBLAS_CHECK(cublasCreate(&cublas_));
}

template <class T>
Decoder<T>::~Decoder() {
    cudaStreamSynchronize(stream_);
    if (cublas_) cublasDestroy(cublas_);
}

template <class T>
const std::vector<double>& Decoder<T>::prefill(const std::vector<int>& ids) {
    const int vocab = config().vocab_size;
    if (ids.empty()) throw std::invalid_argument("Decoder: no tokens to add (an empty prompt has no last position)");
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= vocab)
            throw std::invalid_argument("Decoder: token " + std::to_string(ids[i]) + " (at index " + std::to_string(i) +
                                        ") is outside the model's vocabulary of " + std::to_string(vocab));
    if ((long long)position_ + (long long)ids.size() > max_positions_)
        throw std::out_of_range("Decoder: " + std::to_string(position_) + " cached positions + " +
                                std::to_string(ids.size()) + " new tokens exceed the cache's " +
                                std::to_string(max_positions_) + " positions");
    for (size_t done = 0; done < ids.size();) {
        const int n = int(std::min(ids.size() - done, size_t(max_rows_)));
        pass(ids.data() + done, n);
        done += size_t(n);
    }
    return logits_;
}

template <class T>
const std::vector<double>& Decoder<T>::step(int id) {
    return prefill({id});
}

// n new tokens at positions position_ .. position_ + n − 1, through every block, then the head on
// the last row; the logits to the host.
template <class T>
void Decoder<T>::pass(const int* ids, int n) {
    const LlamaConfig& c = config();
    const int C = c.hidden_size, F = c.ffn_size, H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim_resolved();
    const int qkv_w = c.qkv_width(), q_w = c.q_width(), kv_w = c.kv_width();
    const int p0 = position_;
    for (int i = 0; i < n; ++i) host_positions_[size_t(i)] = p0 + i;
    // Pageable sources: the copies are done before the calls return (and the buffers live on).
    CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), ids, size_t(n) * sizeof(int), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(positions_.get(), host_positions_.data(), size_t(n) * sizeof(int),
                               cudaMemcpyHostToDevice, stream_));
    T* x = x_.get();
    embedding_forward(tokens_.get(), model_.embedding_weights(), x, n, C, c.vocab_size, stream_);
    const size_t cache_layer = size_t(max_positions_) * size_t(kv_w);
    for (int layer = 0; layer < c.num_layers; ++layer) {
        const BlockParams<const T*>& w = model_.block_weights(1 + layer);  // unit 0 is the embedding
        // Each linear through the model, so adapters (and a quantised base) apply as in training.
        T* k_cache = cache_k_.get() + size_t(layer) * cache_layer;
        T* v_cache = cache_v_.get() + size_t(layer) * cache_layer;
        rmsnorm_forward(x, w.attn_norm, h_.get(), rstd_.get(), n, C, c.rms_norm_eps, stream_);
        const int u = 1 + layer;
        model_.linear_forward(u, kLoraQkv, h_.get(), qkv_.get(), n, adapter_scratch_.get(), cublas_);
        const RopeTable<acc_t<T>> table{rope_table_.get(), max_positions_, hd};
        rope_forward(qkv_.get(), table, positions_.get(), n, max_positions_, H, hd, qkv_w, stream_);
        rope_forward(qkv_.get() + q_w, table, positions_.get(), n, max_positions_, Hkv, hd, qkv_w, stream_);
        attention_decode_store_kv(qkv_.get() + q_w, qkv_.get() + q_w + kv_w, qkv_w, k_cache, v_cache, n, p0, kv_w,
                                  stream_);
        attention_decode(qkv_.get(), qkv_w, k_cache, v_cache, att_.get(), n, p0, H, Hkv, hd, attention_scratch_.get(),
                         attention_scratch_.bytes(), stream_);
        model_.linear_forward(u, kLoraO, att_.get(), proj_.get(), n, adapter_scratch_.get(), cublas_);
        residual_rmsnorm_forward(x, proj_.get(), x, w.mlp_norm, h_.get(), rstd_.get(), n, C, c.rms_norm_eps, stream_);
        model_.linear_forward(u, kLoraGateUp, h_.get(), gate_up_.get(), n, adapter_scratch_.get(), cublas_);
        swiglu_forward(gate_up_.get(), act_.get(), n, F, stream_);
        // The residual add in the GEMM (β = 1 onto x), as the training forward does it.
        model_.linear_forward(u, kLoraDown, act_.get(), x, n, adapter_scratch_.get(), cublas_, true);
    }
    // The head on the last row only: its logits are all a caller needs.
    const HeadParams<const T*>& head = model_.head_weights();
    const T* last = x + size_t(n - 1) * size_t(C);
    rmsnorm_forward(last, head.final_norm, h_.get(), rstd_.get(), 1, C, c.rms_norm_eps, stream_);
    matmul_forward(cublas_, h_.get(), head.lm_head, device_logits_.get(), 1, C, c.vocab_size, stream_);
    CUDA_CHECK(cudaMemcpyAsync(host_logits_.data(), device_logits_.get(), device_logits_.bytes(),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t k = 0; k < logits_.size(); ++k) logits_[k] = double(to_acc(host_logits_[k]));
    position_ = p0 + n;
}

template class Decoder<__nv_bfloat16>;
template class Decoder<float>;
template class Decoder<double>;

}  // namespace pv
