// The Llama units: parameters, arenas, and each unit's forward and backward as a sequence of
// kernel and GEMM launches on the model's stream (see model/llama.h for the math).
#include "model/llama.h"

#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/embedding.cuh"
#include "kernels/glue.cuh"
#include "kernels/matmul.cuh"
#include "kernels/philox.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"

#include <stdexcept>

namespace pv {

namespace {

template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, double>) return DType::fp64;
    else if constexpr (std::is_same_v<T, float>) return DType::fp32;
    else return DType::bf16;
}

size_t acc_size(DType t) { return t == DType::fp64 ? 8 : 4; }

// Lays out named buffers back to back, each start 256-byte aligned; returns the total bytes.
size_t arena_bytes(const std::vector<ActivationBuffer>& buffers) {
    size_t total = 0;
    for (const auto& b : buffers) total = (total + 255) / 256 * 256 + b.bytes();
    return total;
}

void* arena_find(void* base, const std::vector<ActivationBuffer>& buffers, const std::string& name) {
    size_t offset = 0;
    for (const auto& b : buffers) {
        offset = (offset + 255) / 256 * 256;
        if (b.name == name) return static_cast<char*>(base) + offset;
        offset += b.bytes();
    }
    throw std::logic_error("no activation buffer named '" + name + "'");
}

}  // namespace

std::vector<ActivationBuffer> activation_layout(const LlamaConfig& c, UnitKind kind, int batch, int seq_len, DType dtype) {
    const long long N = (long long)batch * seq_len, C = c.hidden_size;
    const size_t t = dtype_size(dtype), a = acc_size(dtype);
    switch (kind) {
        case UnitKind::embedding:
            return {{"out", N * C, t}};
        case UnitKind::block:
            return {{"out", N * C, t},
                    {"h1", N * C, t},
                    {"rstd1", N, a},
                    {"qkv", N * c.qkv_width(), t},
                    {"att", N * c.q_width(), t},
                    {"lse", (long long)batch * c.num_heads * seq_len, a},
                    {"x2", N * C, t},
                    {"h2", N * C, t},
                    {"rstd2", N, a},
                    {"gate_up", N * 2LL * c.ffn_size, t},
                    {"act", N * c.ffn_size, t}};
        case UnitKind::head:
            return {{"h", N * C, t}, {"rstd", N, a}, {"logits", N * c.vocab_size, t}, {"row_loss", N, a}};
    }
    return {};
}

template <class T>
Llama<T>::Llama(const LlamaConfig& config, int batch, int seq_len, int slots, uint64_t seed, Gradients gradients, int shards,
                cudaStream_t stream, Parameters parameters, StageUnits stage)
    : config_(config), batch_(batch), seq_len_(seq_len), gradients_(gradients), parameters_(parameters), stream_(stream) {
    validate_or_throw(config_);
    if (batch < 1 || seq_len < 1 || slots < 1)
        throw std::invalid_argument("Llama: batch, seq_len and slots must be >= 1 (got " + std::to_string(batch) + ", " +
                                    std::to_string(seq_len) + ", " + std::to_string(slots) + ")");
    if (seq_len > config_.max_seq_len)
        throw std::invalid_argument("Llama: seq_len = " + std::to_string(seq_len) + " exceeds the model's max_seq_len = " +
                                    std::to_string(config_.max_seq_len) + "; use a shorter sequence");
    std::vector<UnitSpec> specs = model_units(config_);
    const int all = int(specs.size());
    first_unit_ = stage.first;
    end_unit_ = stage.end < 0 ? all : stage.end;
    if (first_unit_ < 0 || first_unit_ >= end_unit_ || end_unit_ > all)
        throw std::invalid_argument("Llama: stage units [" + std::to_string(stage.first) + ", " + std::to_string(stage.end) +
                                    ") are not a non-empty range of the model's " + std::to_string(all) + " units");
    CUBLAS_CHECK(cublasCreate(&cublas_));
    const DType dt = dtype_of<T>();
    uint32_t next_id = 0;
    for (UnitSpec& spec : specs) {
        Unit fresh;
        fresh.layout = layout_group(spec.tensors, next_id, shards);
        next_id += uint32_t(spec.tensors.size());
        fresh.spec = std::move(spec);
        units_.push_back(std::move(fresh));
        Unit& unit = units_.back();
        const int u = num_units() - 1;
        const bool runs_here = u >= first_unit_ && u < end_unit_;
        unit.held = runs_here || (u == 0 && config_.tie_embeddings && end_unit_ == all);
        if (!unit.held) continue;
        const size_t bytes = size_t(unit.layout.padded) * sizeof(T);
        if (parameters == Parameters::owned) {
            unit.params = static_cast<T*>(device_alloc(bytes, MemoryCategory::parameters));
            init_params(num_units() - 1, unit.params, 0, unit.layout.padded, seed);
        }
        if (gradients == Gradients::owned) {
            unit.grads = static_cast<T*>(device_alloc(bytes, MemoryCategory::gradients));
            CUDA_CHECK(cudaMemsetAsync(unit.grads, 0, bytes, stream_));
        }
        unit.arena_layout = activation_layout(config_, unit.spec.kind, batch, seq_len, dt);
        if (!runs_here) continue;  // the tied embedding's copy on the head's stage
        for (int s = 0; s < slots; ++s)
            unit.arenas.push_back(device_alloc(arena_bytes(unit.arena_layout), MemoryCategory::activations));
    }
    // RoPE's inverse frequencies, computed once in double on the host.
    const auto freqs = rope_inverse_frequencies(config_);
    std::vector<acc_t<T>> freqs_acc(freqs.begin(), freqs.end());
    inv_freq_ = static_cast<acc_t<T>*>(device_alloc(freqs_acc.size() * sizeof(acc_t<T>), MemoryCategory::workspace));
    CUDA_CHECK(cudaMemcpyAsync(inv_freq_, freqs_acc.data(), freqs_acc.size() * sizeof(acc_t<T>), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // freqs_acc is a pageable host buffer

    // The workspace: transient buffers of one unit at a time, for forward and backward.
    const long long N = rows(), C = config_.hidden_size, F = config_.ffn_size;
    const size_t t = sizeof(T);
    workspace_layout_ = {{"proj", N * C, t},  // attention / MLP projection output before the residual add
                         {"dh", N * C, t},
                         {"dact", N * F, t},
                         {"dgate_up", N * 2 * F, t},
                         {"datt", N * config_.q_width(), t},
                         {"dqkv", N * config_.qkv_width(), t},
                         {"norm_scratch", (long long)rmsnorm_backward_scratch_bytes<T>(N, int(C)), 1},
                         {"attention_scratch", (long long)attention_backward_scratch_bytes<T>(batch, seq_len, config_.num_heads), 1}};
    workspace_ = device_alloc(arena_bytes(workspace_layout_), MemoryCategory::workspace);
    for (T*& d : dresidual_) d = static_cast<T*>(device_alloc(size_t(N * C) * sizeof(T), MemoryCategory::workspace));
}

template <class T>
Llama<T>::~Llama() {
    cudaStreamSynchronize(stream_);
    for (Unit& u : units_) {
        if (parameters_ == Parameters::owned && u.held) memory_free(u.params);
        if (gradients_ == Gradients::owned && u.held) memory_free(u.grads);
        for (void* a : u.arenas) memory_free(a);
    }
    memory_free(inv_freq_);
    memory_free(workspace_);
    for (T* d : dresidual_) memory_free(d);
    if (cublas_) cublasDestroy(cublas_);
}

template <class T>
template <class U>
U* Llama<T>::arena_buffer(int u, int slot, const std::string& name) {
    Unit& unit = units_[size_t(u)];
    return static_cast<U*>(arena_find(unit.arenas.at(size_t(slot)), unit.arena_layout, name));
}

template <class T>
template <class U>
U* Llama<T>::work(const std::string& name) {
    return static_cast<U*>(arena_find(workspace_, workspace_layout_, name));
}

template <class T>
T* Llama<T>::unit_output(int u, int slot) {
    if (unit_kind(u) == UnitKind::head) throw std::logic_error("the head has no residual-stream output");
    return arena_buffer<T>(u, slot, "out");
}

template <class T>
const T* Llama<T>::logits(int slot) const {
    auto* self = const_cast<Llama<T>*>(this);
    return self->template arena_buffer<T>(num_units() - 1, slot, "logits");
}

template <class T>
const T* Llama<T>::weight(int u, const std::string& name) const {
    const Unit& unit = units_[size_t(u)];
    return unit.params + unit.layout.find(name).offset;
}

template <class T>
T* Llama<T>::weight_grad(int u, const std::string& name) {
    Unit& unit = units_[size_t(u)];
    if (!unit.grads) throw std::logic_error("this model was built without gradients");
    return unit.grads + unit.layout.find(name).offset;
}

template <class T>
T* Llama<T>::tensor(const std::string& name) {
    for (int u = 0; u < num_units(); ++u)
        for (const TensorSlot& t : units_[size_t(u)].layout.tensors)
            if (t.spec.name == name) {
                if (!units_[size_t(u)].held) throw std::logic_error("tensor '" + name + "' is not held by this model's stage");
                return units_[size_t(u)].params + t.offset;
            }
    throw std::invalid_argument("no tensor named '" + name + "'");
}

template <class T>
T* Llama<T>::tensor_grad(const std::string& name) {
    for (int u = 0; u < num_units(); ++u)
        for (const TensorSlot& t : units_[size_t(u)].layout.tensors)
            if (t.spec.name == name) return weight_grad(u, name);
    throw std::invalid_argument("no tensor named '" + name + "'");
}

template <class T>
void Llama<T>::init_params(int u, T* dst, long long begin, long long end, uint64_t seed) const {
    const GroupLayout& layout = units_.at(size_t(u)).layout;
    if (begin < 0 || end > layout.padded || begin > end)
        throw std::invalid_argument("init_params: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                    ") outside unit " + std::to_string(u) + "'s " + std::to_string(layout.padded) +
                                    " elements");
    if (end == begin) return;
    CUDA_CHECK(cudaMemsetAsync(dst, 0, size_t(end - begin) * sizeof(T), stream_));  // padding stays zero
    for (const TensorSlot& t : layout.tensors) {
        const long long lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.spec.numel());
        if (lo >= hi) continue;
        if (t.spec.init == Init::ones) fill(dst + (lo - begin), from_acc<T>(acc_t<T>(1)), hi - lo, stream_);
        else init_normal(dst + (lo - begin), hi - lo, 0.02, seed, t.id, lo - t.offset, stream_);
    }
}

template <class T>
void Llama<T>::bind_params(int u, T* params) {
    if (parameters_ != Parameters::bound) throw std::logic_error("bind_params: this model owns its parameters");
    units_.at(size_t(u)).params = params;
}

template <class T>
void Llama<T>::bind_grads(int u, T* grads) {
    if (gradients_ != Gradients::bound) throw std::logic_error("bind_grads: this model owns its gradient buffers");
    units_.at(size_t(u)).grads = grads;
}

template <class T>
void Llama<T>::zero_grads() {
    for (Unit& u : units_)
        if (u.grads) CUDA_CHECK(cudaMemsetAsync(u.grads, 0, size_t(u.layout.padded) * sizeof(T), stream_));
}

template <class T>
void Llama<T>::forward_unit(int u, int slot, const UnitIO<T>& io) {
    if (!runs(u)) throw std::logic_error("forward_unit: unit " + std::to_string(u) + " is not in this model's stage");
    switch (unit_kind(u)) {
        case UnitKind::embedding:
            embedding_forward(io.tokens, weight(u, "wte"), io.residual_out, rows(), config_.hidden_size,
                              config_.vocab_size, stream_);
            break;
        case UnitKind::block: forward_block(u, slot, io); break;
        case UnitKind::head: forward_head(slot, io); break;
    }
}

template <class T>
void Llama<T>::backward_unit(int u, int slot, const UnitIO<T>& io) {
    if (!runs(u)) throw std::logic_error("backward_unit: unit " + std::to_string(u) + " is not in this model's stage");
    switch (unit_kind(u)) {
        case UnitKind::embedding:
            // With tied embeddings the head has already added its part to this same gradient.
            embedding_backward(io.tokens, io.dresidual_out, weight_grad(u, "wte"), rows(), config_.hidden_size,
                               config_.vocab_size, stream_);
            break;
        case UnitKind::block: backward_block(u, slot, io); break;
        case UnitKind::head: backward_head(slot, io); break;
    }
}

template <class T>
void Llama<T>::forward_block(int u, int slot, const UnitIO<T>& io) {
    const LlamaConfig& c = config_;
    const long long N = rows();
    const int C = c.hidden_size, F = c.ffn_size, hd = c.head_dim_resolved();
    const std::string p = "layers." + std::to_string(units_[size_t(u)].spec.layer) + ".";
    const T* x = io.residual_in;
    T* h1 = arena_buffer<T>(u, slot, "h1");
    T* qkv = arena_buffer<T>(u, slot, "qkv");
    T* att = arena_buffer<T>(u, slot, "att");
    T* x2 = arena_buffer<T>(u, slot, "x2");
    T* h2 = arena_buffer<T>(u, slot, "h2");
    T* gate_up = arena_buffer<T>(u, slot, "gate_up");
    T* act = arena_buffer<T>(u, slot, "act");
    T* proj = work<T>("proj");

    rmsnorm_forward(x, weight(u, p + "attn_norm"), h1, arena_buffer<acc_t<T>>(u, slot, "rstd1"), N, C, c.rms_norm_eps, stream_);
    matmul_forward(cublas_, h1, weight(u, p + "w_qkv"), qkv, N, C, c.qkv_width(), stream_);
    rope_forward(qkv, inv_freq_, N, seq_len_, c.num_heads, hd, c.qkv_width(), stream_);
    rope_forward(qkv + c.q_width(), inv_freq_, N, seq_len_, c.num_kv_heads, hd, c.qkv_width(), stream_);
    attention_forward(qkv, att, arena_buffer<acc_t<T>>(u, slot, "lse"), batch_, seq_len_, c.num_heads, c.num_kv_heads, hd,
                      stream_);
    matmul_forward(cublas_, att, weight(u, p + "w_o"), proj, N, c.q_width(), C, stream_);
    residual_rmsnorm_forward(x, proj, x2, weight(u, p + "mlp_norm"), h2, arena_buffer<acc_t<T>>(u, slot, "rstd2"), N, C,
                             c.rms_norm_eps, stream_);
    matmul_forward(cublas_, h2, weight(u, p + "w_gate_up"), gate_up, N, C, 2 * F, stream_);
    swiglu_forward(gate_up, act, N, F, stream_);
    matmul_forward(cublas_, act, weight(u, p + "w_down"), proj, N, F, C, stream_);
    add(x2, proj, io.residual_out, N * C, stream_);
}

template <class T>
void Llama<T>::backward_block(int u, int slot, const UnitIO<T>& io) {
    const LlamaConfig& c = config_;
    const long long N = rows();
    const int C = c.hidden_size, F = c.ffn_size, hd = c.head_dim_resolved();
    const std::string p = "layers." + std::to_string(units_[size_t(u)].spec.layer) + ".";
    const T* x = io.residual_in;
    const T* dy = io.dresidual_out;
    T* dx = io.dresidual_in;
    T* dh = work<T>("dh");
    T* dact = work<T>("dact");
    T* dgate_up = work<T>("dgate_up");
    T* datt = work<T>("datt");
    T* dqkv = work<T>("dqkv");
    void* norm_scratch = work<void>("norm_scratch");

    // MLP: out = x2 + act·W_downᵀ. The residual passes dy through to x2, whose gradient
    // accumulates in dx from here on (it becomes the block input's gradient at the end).
    CUDA_CHECK(cudaMemcpyAsync(dx, dy, size_t(N * C) * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
    matmul_backward(cublas_, dy, arena_buffer<T>(u, slot, "act"), weight(u, p + "w_down"), dact,
                    weight_grad(u, p + "w_down"), N, F, C, false, stream_);
    swiglu_backward(arena_buffer<T>(u, slot, "gate_up"), dact, dgate_up, N, F, stream_);
    matmul_backward(cublas_, dgate_up, arena_buffer<T>(u, slot, "h2"), weight(u, p + "w_gate_up"), dh,
                    weight_grad(u, p + "w_gate_up"), N, C, 2 * F, false, stream_);
    rmsnorm_backward(arena_buffer<T>(u, slot, "x2"), weight(u, p + "mlp_norm"), arena_buffer<acc_t<T>>(u, slot, "rstd2"), dh,
                     dx, weight_grad(u, p + "mlp_norm"), norm_scratch, N, C, stream_);
    // Attention: x2 = x + att·W_oᵀ. dx now holds dL/dx2.
    matmul_backward(cublas_, dx, arena_buffer<T>(u, slot, "att"), weight(u, p + "w_o"), datt, weight_grad(u, p + "w_o"), N,
                    c.q_width(), C, false, stream_);
    attention_backward(arena_buffer<T>(u, slot, "qkv"), arena_buffer<T>(u, slot, "att"), datt,
                       arena_buffer<acc_t<T>>(u, slot, "lse"), dqkv, work<void>("attention_scratch"), batch_, seq_len_,
                       c.num_heads, c.num_kv_heads, hd, stream_);
    rope_backward(dqkv, inv_freq_, N, seq_len_, c.num_heads, hd, c.qkv_width(), stream_);
    rope_backward(dqkv + c.q_width(), inv_freq_, N, seq_len_, c.num_kv_heads, hd, c.qkv_width(), stream_);
    matmul_backward(cublas_, dqkv, arena_buffer<T>(u, slot, "h1"), weight(u, p + "w_qkv"), dh, weight_grad(u, p + "w_qkv"), N,
                    C, c.qkv_width(), false, stream_);
    rmsnorm_backward(x, weight(u, p + "attn_norm"), arena_buffer<acc_t<T>>(u, slot, "rstd1"), dh, dx,
                     weight_grad(u, p + "attn_norm"), norm_scratch, N, C, stream_);
}

template <class T>
void Llama<T>::forward_head(int slot, const UnitIO<T>& io) {
    const LlamaConfig& c = config_;
    const int u = num_units() - 1;
    const long long N = rows();
    T* h = arena_buffer<T>(u, slot, "h");
    T* logits = arena_buffer<T>(u, slot, "logits");
    const T* w_lm = c.tie_embeddings ? weight(0, "wte") : weight(u, "lm_head");
    rmsnorm_forward(io.residual_in, weight(u, "final_norm"), h, arena_buffer<acc_t<T>>(u, slot, "rstd"), N, c.hidden_size,
                    c.rms_norm_eps, stream_);
    matmul_forward(cublas_, h, w_lm, logits, N, c.hidden_size, c.vocab_size, stream_);
    if (io.targets)
        cross_entropy_forward(logits, io.targets, arena_buffer<acc_t<T>>(u, slot, "row_loss"), io.loss_sum, io.count, N,
                              c.vocab_size, kIgnoreIndex, stream_);
}

template <class T>
void Llama<T>::backward_head(int slot, const UnitIO<T>& io) {
    const LlamaConfig& c = config_;
    const int u = num_units() - 1;
    const long long N = rows();
    T* logits = arena_buffer<T>(u, slot, "logits");
    T* dh = work<T>("dh");
    // In place: the logits become their gradient (saves a second N x V buffer).
    cross_entropy_backward(logits, io.targets, logits, N, c.vocab_size, kIgnoreIndex, io.loss_scale, stream_);
    const T* w_lm = c.tie_embeddings ? weight(0, "wte") : weight(u, "lm_head");
    T* dw_lm = c.tie_embeddings ? weight_grad(0, "wte") : weight_grad(u, "lm_head");
    matmul_backward(cublas_, logits, arena_buffer<T>(u, slot, "h"), w_lm, dh, dw_lm, N, c.hidden_size, c.vocab_size, false,
                    stream_);
    CUDA_CHECK(cudaMemsetAsync(io.dresidual_in, 0, size_t(N * c.hidden_size) * sizeof(T), stream_));
    rmsnorm_backward(io.residual_in, weight(u, "final_norm"), arena_buffer<acc_t<T>>(u, slot, "rstd"), dh, io.dresidual_in,
                     weight_grad(u, "final_norm"), work<void>("norm_scratch"), N, c.hidden_size, stream_);
}

template class Llama<__nv_bfloat16>;
template class Llama<float>;
template class Llama<double>;

}  // namespace pv
