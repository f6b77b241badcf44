// The Llama model as a list of units (DESIGN.md §2-3): the embedding, num_layers transformer
// blocks, the head (final RMSNorm + lm_head + cross-entropy). A strategy (parallel/) drives it:
// it calls forward_unit and backward_unit with explicit residual-stream buffers and decides what
// runs where; the model knows nothing of ranks or strategies.
//
// Per unit the model holds its parameter groups (model/parameters.h) and, when trainable, a
// gradient buffer of the same layout; per unit and per micro-batch slot an activation arena with
// what the backward needs (sized by activation_layout, which the memory planner reuses); and one
// shared workspace for the transient buffers of whichever unit is running.
//
// One block, N = batch·seq rows, C hidden, in the order the forward runs:
//   h1 = RMSNorm(x)·w_attn             (rstd1 saved)
//   qkv = h1·W_qkvᵀ, RoPE on q and k   (saved, roped)
//   att = attention(qkv)               (att and lse saved)
//   x2 = x + att·W_oᵀ, h2 = RMSNorm(x2)·w_mlp   (fused; x2, h2, rstd2 saved)
//   gu = h2·W_guᵀ, s = SwiGLU(gu)      (gu, s saved)
//   out = x2 + s·W_downᵀ
// The head: hN = RMSNorm(x)·w_final, logits = hN·W_lmᵀ (W_lm = wte when tied), loss = Σ CE.
#pragma once

#include "kernels/common.cuh"
#include "kernels/device_memory.h"
#include "model/config.h"
#include "model/parameters.h"

#include <memory>
#include <string>
#include <vector>

namespace pv {

// Token id that the cross-entropy skips (Hugging Face's convention).
inline constexpr int kIgnoreIndex = -100;

// One buffer of an arena: name, element count and element size.
struct ActivationBuffer {
    std::string name;
    long long elements = 0;
    size_t element_bytes = 0;
    size_t bytes() const { return size_t(elements) * element_bytes; }
};

// The activations one unit keeps for its backward, for a micro-batch of batch x seq_len tokens in
// storage type `dtype` (statistics in its accumulator type). The memory planner uses this too.
std::vector<ActivationBuffer> activation_layout(const LlamaConfig& c, UnitKind kind, int batch, int seq_len, DType dtype);

// Buffers of a unit call. Which fields a unit reads depends on its kind (see each).
template <class T>
struct UnitIO {
    const int* tokens = nullptr;      // embedding: [N] token ids
    const int* targets = nullptr;     // head: [N] next-token ids, kIgnoreIndex to skip
    const T* residual_in = nullptr;   // block, head: the residual stream in, [N][C]
    T* residual_out = nullptr;        // embedding, block: the residual stream out, [N][C]
    acc_t<T>* loss_sum = nullptr;     // head forward: Σ cross-entropy over counted tokens (device)
    int* count = nullptr;             // head forward: number of counted tokens (device)
    // Backward:
    const T* dresidual_out = nullptr; // embedding, block: gradient of residual_out
    T* dresidual_in = nullptr;        // block, head: gradient of residual_in (written)
    double loss_scale = 1.0;          // head: 1 / (global count of counted tokens), DESIGN.md §4
};

enum class Gradients { none, owned, bound };
enum class Parameters { owned, bound };

// The units a model holds: [first, end) (end −1: to the last unit). Model parallelism gives each
// rank one contiguous stage; the model then allocates parameters, gradients and activation arenas
// for those units only. A stage with the head of a model with tied embeddings also holds the
// embedding's parameters and gradients (the head multiplies by wte), but no arena for it.
struct StageUnits {
    int first = 0;
    int end = -1;
};

template <class T>
class Llama {
  public:
    // A model for micro-batches of batch x seq_len tokens, with `slots` activation arenas
    // (micro-batches in flight), parameters initialised from `seed`, groups splittable into
    // `shards`. `gradients`: none (inference), owned (one gradient buffer per unit, allocated
    // here) or bound (the caller binds a buffer to a unit before its backward: ZeRO-2/3 keep
    // only a few full-size gradient buffers alive and rotate them through the units).
    // `parameters`: owned (allocated and initialised here) or bound (ZeRO-3: each rank keeps a
    // slice, initialised with init_params, and binds a gathered copy of a unit before using it).
    // `stage`: the units held (StageUnits); the others have no buffers and cannot run.
    Llama(const LlamaConfig& config, int batch, int seq_len, int slots, uint64_t seed,
          Gradients gradients = Gradients::owned, int shards = 1, cudaStream_t stream = nullptr,
          Parameters parameters = Parameters::owned, StageUnits stage = {});
    ~Llama();
    Llama(const Llama&) = delete;
    Llama& operator=(const Llama&) = delete;

    const LlamaConfig& config() const { return config_; }
    int batch() const { return batch_; }
    int seq_len() const { return seq_len_; }
    long long rows() const { return (long long)batch_ * seq_len_; }
    int num_units() const { return int(units_.size()); }
    UnitKind unit_kind(int u) const { return units_[size_t(u)].spec.kind; }
    // The stage's units [first_unit, end_unit) run here; holds(u) also for the tied embedding's
    // copy on the head's stage (parameters and gradients, no arena).
    int first_unit() const { return first_unit_; }
    int end_unit() const { return end_unit_; }
    bool runs(int u) const { return u >= first_unit_ && u < end_unit_; }
    bool holds(int u) const { return units_[size_t(u)].held; }

    void forward_unit(int u, int slot, const UnitIO<T>& io);
    void backward_unit(int u, int slot, const UnitIO<T>& io);

    // The residual-stream output buffer of unit u in `slot` (embedding and blocks), where the
    // single driver reads the next unit's input from.
    T* unit_output(int u, int slot);
    // The head's logits [N][V] of the last forward in `slot` (overwritten by its backward).
    const T* logits(int slot) const;
    // Two [N][C] gradient buffers for the residual stream, used alternately by a driver.
    T* residual_grad(int which) { return dresidual_[which]; }

    // Parameters and gradients of unit u (one group each for now).
    const GroupLayout& layout(int u) const { return units_[size_t(u)].layout; }
    T* params(int u) { return units_[size_t(u)].params; }
    T* grads(int u) { return units_[size_t(u)].grads; }
    // Sets every gradient (padding included) to zero: the start of an optimizer step. Units
    // without a buffer (bound gradients not bound now) are skipped.
    void zero_grads();
    // Writes elements [begin, end) of unit u's initial group to dst (end − begin elements):
    // N(0, 0.02²) from Philox keyed by (seed, tensor, element) for matrices, 1 for RMSNorm
    // weights, 0 for padding — the same values whatever slice is asked for.
    void init_params(int u, T* dst, long long begin, long long end, uint64_t seed) const;
    // Parameters::bound: unit u's forward and backward read `params` (layout(u).padded elements)
    // until another buffer is bound.
    void bind_params(int u, T* params);
    // Gradients::bound: unit u's backward accumulates into `grads` (layout(u).padded elements)
    // until another buffer is bound; the buffer stays the caller's.
    void bind_grads(int u, T* grads);
    // The device pointer of a tensor by name ("wte", "layers.0.w_qkv", ...).
    T* tensor(const std::string& name);
    T* tensor_grad(const std::string& name);

    cudaStream_t stream() const { return stream_; }

  private:
    struct Unit {
        UnitSpec spec;
        GroupLayout layout;
        bool held = true;
        T* params = nullptr;
        T* grads = nullptr;
        std::vector<void*> arenas;                  // one per slot
        std::vector<ActivationBuffer> arena_layout; // buffers in each arena, in order
    };
    template <class U>
    U* arena_buffer(int u, int slot, const std::string& name);
    const T* weight(int u, const std::string& name) const;
    T* weight_grad(int u, const std::string& name);
    void forward_block(int u, int slot, const UnitIO<T>& io);
    void backward_block(int u, int slot, const UnitIO<T>& io);
    void forward_head(int slot, const UnitIO<T>& io);
    void backward_head(int slot, const UnitIO<T>& io);

    LlamaConfig config_;
    int batch_, seq_len_;
    int first_unit_ = 0, end_unit_ = 0;
    Gradients gradients_;
    Parameters parameters_;
    cudaStream_t stream_;
    cublasHandle_t cublas_ = nullptr;
    std::vector<Unit> units_;
    acc_t<T>* inv_freq_ = nullptr;  // RoPE inverse frequencies, head_dim / 2
    T* dresidual_[2] = {nullptr, nullptr};
    // The shared workspace: named transient buffers of the running unit.
    void* workspace_ = nullptr;
    std::vector<ActivationBuffer> workspace_layout_;
    template <class U>
    U* work(const std::string& name);
};

}  // namespace pv
