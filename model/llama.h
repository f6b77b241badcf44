// The Llama model as a list of units (DESIGN.md §2-3): the embedding, num_layers transformer
// blocks, the head (final RMSNorm + lm_head + cross-entropy). A strategy (parallel/) drives it:
// it calls forward_unit and backward_unit with explicit residual-stream buffers and decides what
// runs where; the model knows nothing of ranks or strategies.
//
// Per unit the model holds its parameter groups (model/parameters.h: a trainable group and,
// with --freeze, a frozen one) and a gradient buffer of the trainable group's layout; per unit
// and per micro-batch slot an activation arena with what the backward needs (sized by
// activation_layout, which the memory planner reuses; with activation checkpointing a recomputed
// block's slot keeps its output only, see ActivationCheckpointing); and one shared workspace for the
// transient buffers of whichever unit is running. The forward and backward read typed views of
// these (BlockParams, BlockActivations, ...), resolved when buffers are allocated or bound.
//
// One block, N = batch·seq rows, C hidden, in the order the forward runs:
//   h1 = RMSNorm(x)·w_attn             (rstd1 saved)
//   qkv = h1·W_qkvᵀ, RoPE on q and k   (saved, roped)
//   att = attention(qkv)               (att and lse saved)
//   x2 = x + att·W_oᵀ, h2 = RMSNorm(x2)·w_mlp   (fused; x2, h2, rstd2 saved)
//   gu = h2·W_guᵀ, s = SwiGLU(gu)      (gu, s saved)
//   out = x2 + s·W_downᵀ
// The head: hN = RMSNorm(x)·w_final, logits = hN·W_lmᵀ (W_lm = wte when tied), loss = Σ CE.
// The fused linear cross-entropy: the logits exist a chunk of rows at a time (head_chunk_rows),
// never all N·V of them. When the loss is wanted in the backward (UnitIO::loss_in_backward, the
// trainer's steps) the forward stops at hN, and the backward computes per chunk the logits, the
// loss and their gradient in one pass, then the chunk's dX and dW GEMMs: the three GEMMs of an
// unchunked head. Otherwise the forward computes the loss per chunk and the backward computes
// each chunk's logits again (one more GEMM) before its gradient.
#pragma once

#include "kernels/common.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/lora.cuh"
#include "kernels/rope.cuh"
#include "platform/device_memory.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/dtype.h"
#include "model/lora.h"
#include "model/nf4_layout.h"
#include "model/parameters.h"
#include "model/placement.h"
#include "model/tensor_parallel.h"

#include <functional>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace pv {

// Token id that the cross-entropy skips (Hugging Face's convention).
inline constexpr int kIgnoreIndex = -100;

// The most rows of any adapter's A (its u = x·Aᵀ has that many columns): the adapters' scratch per row.
long long lora_max_a_rows(const LlamaConfig& c, const LoraConfig& lora);

// The workspace the model allocates once for whichever unit is running: the forward's and the
// backward's transient buffers (arena_bytes of this layout). The memory planner uses this too.
// `whole` is the whole model; a rank of a tensor-parallel group computes with its shape
// (model/tensor_parallel.h tensor_parallel_shape).
std::vector<ActivationBuffer> model_workspace_layout(const LlamaConfig& whole, int batch, int seq_len, DType dtype,
                                                     const LoraConfig& lora, bool nf4, TensorParallel tensor = {},
                                                     long long head_chunk = 0);

// Typed views of a unit's tensors and activations, resolved once when buffers are allocated or
// bound (never looked up by name in a step). P is `const T*` for weights, `T*` for gradients
// (null for a frozen tensor: its backward skips dW).
template <class P>
struct AdapterParams {
    P a = nullptr, b = nullptr;  // null: no adapter on this linear
};
template <class P>
struct BlockParams {
    P attn_norm = nullptr, w_qkv = nullptr, w_o = nullptr, mlp_norm = nullptr, w_gate_up = nullptr, w_down = nullptr;
    AdapterParams<P> lora[kLoraLinears];  // per linear (model/lora.h), in LoraLinear order
};
template <class P>
struct HeadParams {
    P final_norm = nullptr;
    P lm_head = nullptr;  // the embedding's wte when tied
};
template <class T>
struct BlockActivations {
    T* out = nullptr;  // the residual stream out
    T* h1 = nullptr;   // RMSNorm(x)·w_attn
    acc_t<T>* rstd1 = nullptr;
    T* qkv = nullptr;  // roped
    T* att = nullptr;
    acc_t<T>* lse = nullptr;
    T* x2 = nullptr;
    T* h2 = nullptr;
    acc_t<T>* rstd2 = nullptr;
    T* gate_up = nullptr;
    T* act = nullptr;
    T* lora_u[kLoraLinears] = {};  // per adapter: u = drop(x)·Aᵀ [N][P·r]
};
template <class T>
struct HeadActivations {
    T* h = nullptr;
    acc_t<T>* rstd = nullptr;
    acc_t<T>* row_loss = nullptr;
    CrossEntropyStats<acc_t<T>>* row_stats = nullptr;  // each row's softmax (max, sum), for the backward
};

// Buffers of a unit call. Which fields a unit reads depends on its kind (see each).
template <class T>
struct UnitIO {
    const int* tokens = nullptr;     // embedding: [N] token ids
    const int* targets = nullptr;    // head: [N] next-token ids, kIgnoreIndex to skip
    const int* positions = nullptr;  // block: [N] position within its document (RoPE, attention); null: row % seq_len
    long long first_row = 0;         // block: the global row (sample · seq_len) of row 0, keying dropout
    long long step = -1;             // block: the training step keying the adapters' dropout; −1: none
    const long long* dropout_keys = nullptr;  // block: {first_row, step} in device memory, read as the kernels run
    const T* residual_in = nullptr;  // block, head: the residual stream in, [N][C]
    T* residual_out = nullptr;       // embedding, block: the residual stream out, [N][C]
    acc_t<T>* loss_sum = nullptr;    // head forward: Σ cross-entropy over counted tokens (device)
    int* count = nullptr;            // head forward: number of counted tokens (device)
    // Head forward: loss_sum and count are written by this slot's next backward, which computes the
    // loss with its gradient (one pass over each chunk of logits); false: by the forward.
    bool loss_in_backward = false;
    // Backward:
    const T* dresidual_out = nullptr;  // embedding, block: gradient of residual_out
    T* dresidual_in = nullptr;         // block, head: gradient of residual_in (written)
    DeviceScalar<double> loss_scale = 1.0;  // head: 1 / (global count of counted tokens), DESIGN.md §4
};

// The cuBLAS workspace a captured micro-step's model gets (ModelOptions::cublas_workspace_bytes):
// the size cuBLAS's documentation recommends on Hopper (4 MiB on earlier GPUs).
inline constexpr size_t kCublasGraphWorkspaceBytes = size_t(32) << 20;

// A model instance: micro-batches of batch x seq_len tokens, parameters initialised from `seed`,
// the tensors named in `frozen` (model/freeze.h) in frozen groups, placed as `placement` says.
// With LoRA adapters (`lora`) every base tensor is frozen and only the adapters train.
struct ModelOptions {
    int batch = 1;
    int seq_len = 1;
    uint64_t seed = 0;
    std::set<std::string> frozen;
    LoraConfig lora;
    // QLoRA: the blocks' linear weights stored as NF4 (model/nf4_layout.h), dequantised before each
    // GEMM; needs LoRA (the base is frozen). double_quant: the absmaxes double-quantised.
    bool nf4 = false;
    bool double_quant = true;
    Placement placement;
    cudaStream_t stream = nullptr;
    ActivationCheckpointing checkpointing;  // off by default
    long long head_chunk_rows = 0;          // the head's logits this many rows at a time; 0: head_chunk_rows' choice
    // bf16 attention forward with P in fp32 (the CUDA-core kernel) instead of one bf16 on tensor
    // cores (kernels/attention.cuh attention_forward): for parity with the KV-cache decoder's fp32 P.
    bool attention_p_fp32 = false;
    // The cuBLAS handle's own workspace of this many bytes (cublasSetWorkspace); 0: cuBLAS's default.
    // A captured micro-step needs one (trainer/micro_step_graphs.h): without it cuBLAS allocates a
    // workspace inside each capture, memory the planner cannot see.
    size_t cublas_workspace_bytes = 0;
    // With placement.tensor.size > 1: sums `count` elements of the compute type at `data` over the
    // tensor-parallel group, in place, in order on the model's stream (parallel/ provides it, here
    // or later through bind_tensor_reduce, before the first forward). The
    // model calls it where Megatron's conjugate operators sit: after each row-parallel linear in the
    // forward (W_o, W_down: partial sums) and after each column-parallel linear's input gradient in
    // the backward (W_qkv, W_gate_up).
    std::function<void(void* data, long long count)> tensor_reduce{};
    // With placement.tensor.size > 1: gathers `count` elements of the accumulator type (acc_t<T>)
    // from each rank of the group into recv[size·count], in rank order, on the model's stream
    // (bound like tensor_reduce, or through bind_tensor_gather). The vocabulary-parallel head calls
    // it once per forward: each rank's rows' cross-entropy partials (3 values a row).
    std::function<void(const void* send, void* recv, long long count)> tensor_gather{};
    // With placement.tensor.sequence (sequence parallelism, model/placement.h): over the group, in
    // order on the model's stream, in the compute type T — gathers `count` elements from each rank
    // into recv[size·count] in rank order (the rows before a column-parallel linear), and sums
    // recv_count·size elements at `send` over the group, leaving rank r the sum's elements
    // [r·recv_count, (r + 1)·recv_count) in recv (the rows after a row-parallel linear). Bound like
    // tensor_reduce, or through bind_tensor_sequence.
    std::function<void(const void* send, void* recv, long long count)> tensor_all_gather{};
    std::function<void(const void* send, void* recv, long long recv_count)> tensor_reduce_scatter{};
};

// A whole model on one rank with `slots` activation slots: for training (owned gradients) or
// inference (Gradients::none).
inline ModelOptions whole_model(int batch, int seq_len, uint64_t seed, Gradients gradients = Gradients::owned,
                                int slots = 1) {
    ModelOptions o;
    o.batch = batch, o.seq_len = seq_len, o.seed = seed;
    o.placement.gradients = gradients;
    o.placement.chunks.front().slots = slots;
    return o;
}

// RoPE's cos/sin table (kernels/rope.cuh) for the config's frequencies and positions [0, positions),
// computed on the host in double and uploaded on `stream` (which this call synchronises).
template <class A>
DeviceBuffer<A> rope_table_buffer(const LlamaConfig& config, int positions, cudaStream_t stream);

template <class T>
class Llama {
  public:
    Llama(const LlamaConfig& config, const ModelOptions& options);
    ~Llama();
    Llama(const Llama&) = delete;
    Llama& operator=(const Llama&) = delete;

    const LlamaConfig& config() const { return config_; }  // the whole model's, whatever this rank holds
    const TensorParallel& tensor_parallel() const { return tensor_; }
    int batch() const { return batch_; }
    int seq_len() const { return seq_len_; }
    long long rows() const { return (long long)batch_ * seq_len_; }
    // The residual stream's rows here: a unit's residual_in and residual_out, their gradients, a
    // pipeline's sends (rows() / T under sequence parallelism: this rank's rows of the micro-batch).
    long long stream_rows() const { return tensor_.stream_rows(rows()); }
    int num_units() const { return int(units_.size()); }
    UnitKind unit_kind(int u) const { return units_[size_t(u)].spec.kind; }
    // The chunks of units that run here (one stage, or an interleaved pipeline's several; ends
    // resolved); holds(u) also for the tied embedding's copy on the head's rank (parameters and
    // gradients, no arena).
    const std::vector<StageUnits>& chunks() const { return chunks_; }
    bool runs(int u) const {
        for (const StageUnits& c : chunks_)
            if (u >= c.first && u < c.end) return true;
        return false;
    }
    bool runs_every_unit() const { return chunks_.size() == 1 && chunks_[0].first == 0 && chunks_[0].end == num_units(); }
    bool holds(int u) const { return units_[size_t(u)].held; }

    void forward_unit(int u, int slot, const UnitIO<T>& io);
    void backward_unit(int u, int slot, const UnitIO<T>& io);

    // The residual-stream output buffer of unit u in `slot` (embedding and blocks), where the
    // single driver reads the next unit's input from.
    T* unit_output(int u, int slot);
    // The head's logits [N][V] of the last forward in `slot` into `out` (device, N·V elements),
    // computed from the normed rows the forward keeps (the head never holds them whole); under
    // tensor parallelism this rank's columns of them (its vocabulary rows, model/tensor_parallel.h).
    void logits(int slot, T* out) const;
    // The rows of one chunk of the head's logits (head_chunk_rows).
    long long head_chunk() const { return head_chunk_; }
    // Two [N][C] gradient buffers for the residual stream, used alternately by a driver.
    T* residual_grad(int which) { return dresidual_[which]; }

    // Unit u's groups: group 0 is the trainable one (possibly empty), then frozen ones.
    int num_groups(int u) const { return int(units_[size_t(u)].groups.size()); }
    const GroupLayout& group(int u, int g) const { return units_[size_t(u)].groups[size_t(g)]; }
    T* group_params(int u, int g) { return units_[size_t(u)].params[size_t(g)]; }
    // The trainable group of unit u: its layout, parameters and gradient buffer.
    const GroupLayout& trainable(int u) const { return group(u, 0); }
    T* params(int u) { return group_params(u, 0); }
    T* grads(int u) { return units_[size_t(u)].grads; }
    // Elements in tensors of trainable and of frozen groups, each tensor once (a tied wte once), of
    // the whole model (a tensor-parallel slice counts as its whole tensor).
    long long tensor_elements(GroupKind kind) const;
    // Every unit's groups as tensor-parallel rank r of this model's group holds them, and as one
    // rank holds the whole model (whole tensors, padded for the same shards): how a checkpoint
    // joins the slices into whole tensors (model/tensor_parallel.h join_tensor_slices).
    std::vector<std::vector<GroupLayout>> tensor_rank_layouts(int r) const;
    std::vector<std::vector<GroupLayout>> whole_layouts() const { return tensor_rank_layouts(-1); }
    // Tensor parallelism's seam, bound by the strategy (parallel/strategies.h) when
    // ModelOptions::tensor_reduce was not given: the same contract.
    void bind_tensor_reduce(std::function<void(void* data, long long count)> reduce) {
        tensor_reduce_ = std::move(reduce);
    }
    void bind_tensor_gather(std::function<void(const void* send, void* recv, long long count)> gather) {
        tensor_gather_ = std::move(gather);
    }
    void bind_tensor_sequence(std::function<void(const void* send, void* recv, long long count)> all_gather,
                              std::function<void(const void* send, void* recv, long long recv_count)> reduce_scatter) {
        tensor_all_gather_ = std::move(all_gather);
        tensor_reduce_scatter_ = std::move(reduce_scatter);
    }
    // Sets every gradient (padding included) to zero: the start of an optimizer step. Units
    // without a buffer (bound gradients not bound now) are skipped.
    void zero_grads();
    // The same start without a memset: every unit's gradient counts as zero, and the next backward
    // of each unit writes over its buffer instead of adding to it (GradWrite::overwrite: the
    // weight-gradient GEMMs with β = 0, the norms' and adapters' gradients likewise; the head's
    // lm_head overwrites a tied embedding's, whose scatter-add then adds; an untied embedding's
    // scatter-add, which needs zeros, zeroes its buffer first). Each tensor has one writer per
    // backward and padding is never written, so the buffer ends as zero_grads + backward leaves
    // it. A unit whose backward has not run since must be settled before its gradient is read.
    void discard_grads();
    void discard_grads(int u);  // unit u alone (Gradients::bound: a buffer just bound to it)
    // Zeroes the gradient of every unit discard_grads left that no backward has written since (of
    // unit u alone).
    void settle_grads();
    void settle_grads(int u);
    // Which units discard_grads left unwritten (per unit; the host state a micro-step changes): a
    // captured micro-step's launch leaves it as the captured backward did (trainer/micro_step_graphs.h).
    std::vector<bool> discarded_grads() const;
    void set_discarded_grads(const std::vector<bool>& discarded);
    // Writes elements [begin, end) of group g of unit u, initial values, to dst (end − begin
    // elements): N(0, 0.02²) from Philox keyed by (seed, tensor, element) for matrices, 1 for
    // RMSNorm weights, 0 for padding — the same values whatever slice is asked for.
    void init_params(int u, int g, T* dst, long long begin, long long end, uint64_t seed) const;
    // Parameters::bound: group g of unit u reads `params` (group(u, g).padded elements) until
    // another buffer is bound.
    void bind_params(int u, int g, T* params);
    // Gradients::bound: unit u's backward accumulates into `grads` (trainable(u).padded
    // elements) until another buffer is bound; the buffer stays the caller's.
    void bind_grads(int u, T* grads);
    // The device pointer of a tensor by name ("wte", "layers.0.w_qkv", ...), for tests and tools.
    T* tensor(const std::string& name);
    // Read-only views for inference outside the unit loop (model/decoder.h): a block's weights,
    // the head's, the embedding's wte.
    const BlockParams<const T*>& block_weights(int u) const { return units_.at(size_t(u)).block_w; }
    const HeadParams<const T*>& head_weights() const { return units_.back().head_w; }
    const T* embedding_weights() const { return units_.front().weights.at(0); }
    // RoPE's cos/sin table for positions [0, seq_len) (kernels/rope.cuh).
    RopeTable<acc_t<T>> rope_table() const { return {rope_table_.get(), seq_len_, config_.head_dim_resolved()}; }
    // Linear k (LoraLinear order) of block unit u on n rows, outside the unit loop (the decoder):
    // y = x·Wᵀ plus the adapter's s·(x·Aᵀ)·Bᵀ without dropout (added onto y when `accumulate`);
    // `scratch` holds n · lora_max_a_rows(config, lora) elements of T.
    void linear_forward(int u, int k, const T* x, T* y, long long n, T* scratch, cublasHandle_t handle,
                        bool accumulate = false) const;
    // Base tensor i of unit u as a dense [rows][cols] tensor into `out` (device): dequantised when
    // NF4, and for a block's linear with the adapter folded in, W[part rows] += s·B_p·A_p — the
    // merged model's weight (`train export --merged`).
    void merged_tensor(int u, int i, T* out);
    bool quantized() const { return nf4_; }
    // Elements of the whole tensors in NF4 groups (counted among the frozen ones too), as
    // tensor_elements counts them: the model's, not this tensor-parallel rank's slices.
    long long nf4_tensor_elements() const;
    const LoraConfig& lora() const { return lora_; }

    cudaStream_t stream() const { return stream_; }

  private:
    struct Unit {
        UnitSpec spec;
        std::vector<GroupLayout> groups;
        std::vector<std::pair<int, long long>> place;  // per spec tensor: (group, offset)
        bool held = true;
        std::vector<T*> params;                      // per group
        T* grads = nullptr;                          // the trainable group's
        std::vector<void*> arenas;                   // one per slot
        std::vector<ActivationBuffer> arena_layout;  // buffers in each arena, in order
        bool recomputes = false;                     // a block whose backward recomputes its forward
        bool grads_discarded = false;                // discard_grads: the next backward writes over grads
        // Typed views (resolve_*).
        std::vector<const T*> weights;  // per spec tensor
        std::vector<T*> weight_grads;   // per spec tensor; null when frozen or without gradients
        BlockParams<const T*> block_w;
        BlockParams<T*> block_g;
        HeadParams<const T*> head_w;
        HeadParams<T*> head_g;
        std::vector<T*> outputs;                      // per slot: the residual stream out
        std::vector<BlockActivations<T>> block_acts;  // per slot
        std::vector<HeadActivations<T>> head_acts;    // per slot
        uint32_t lora_ids[kLoraLinears] = {};         // each adapter's A tensor id (keys its dropout mask)
    };
    // Workspace: transient buffers of the running unit, forward and backward.
    struct Workspace {
        T* proj = nullptr;  // attention / MLP projection output before the residual add
        T* dh = nullptr;
        T* dact = nullptr;
        T* dgate_up = nullptr;
        T* datt = nullptr;
        T* dqkv = nullptr;
        void* norm_scratch = nullptr;
        void* attention_scratch = nullptr;
        T* lora_du = nullptr;               // [N][largest P·r]
        T* lora_dropped = nullptr;          // [N][largest in], with dropout only
        T* lora_group_grad = nullptr;       // tensor parallelism: a replicated adapter matrix's gradient share
        T* kv_group_grad = nullptr;         // replicated kv heads: their gradient rows, summed over the group
        T* lora_b_share = nullptr;          // replicated kv heads: W_qkv's adapter B's gradient share
        T* dequantized = nullptr;           // NF4: the largest linear weight, dequantised before its GEMM
        void* embedding_scratch = nullptr;  // the embedding backward's sorted positions
        void* vocab_partials = nullptr;     // tensor parallelism: the cross-entropy's partials, the rank's, the group's
        // Sequence parallelism: this rank's rows of a reduce-scatter's sum and of a norm's output
        // before its gather ([N/T][C] each), and a norm weight's gradient share ([C]).
        T* rows_summed = nullptr;
        T* rows_normed = nullptr;
        T* norm_grad_share = nullptr;
        T* logits = nullptr;  // the head's logits, one chunk of rows: [head_chunk_][V]
    };
    // The dense weight of block u's linear k: its parameters, or (NF4) dequantised into the workspace.
    const T* dense_weight(int u, int k) const;
    void resolve_params(int u);
    void resolve_activations(int u);
    // recompute: only what the backward reads, before it (nothing of the output is written).
    void forward_block(int u, int slot, const UnitIO<T>& io, bool recompute = false);
    void backward_block(int u, int slot, const UnitIO<T>& io);
    void forward_head(int slot, const UnitIO<T>& io);
    LoraDropout dropout_of(const UnitIO<T>& io) const;
    // `d` for linear k: under tensor parallelism a row-parallel linear's input is a block of the
    // whole input's columns, and its mask is keyed by the whole input's element index.
    LoraDropout dropout_for(int k, LoraDropout d) const;
    // Linear k of block u: y = x·Wᵀ and the adapter on top (u_save: its u; dropout as given); with
    // `accumulate`, y += both (the base GEMM's β = 1 adds onto what y holds).
    void linear(int u, int k, const T* x, T* y, long long n, T* u_save, const LoraDropout& dropout,
                cublasHandle_t handle, bool accumulate = false) const;
    // Its backward: dx = dy·W (+ the adapter's share), the adapter's dA, dB (null when not trained),
    // the weight gradients added or written over (`write`).
    void linear_backward(int u, int k, const T* dy, const T* x, T* dx, const BlockActivations<T>& a,
                         const LoraDropout& dropout, GradWrite write);
    // How unit u's backward writes its gradient now: over it after discard_grads, else adding.
    GradWrite grad_write(int u) const {
        return units_[size_t(u)].grads_discarded ? GradWrite::overwrite : GradWrite::add;
    }
    void backward_head(int slot, const UnitIO<T>& io);
    // Rows [first_row, first_row + n) of the head's logits into work_.logits (n ≤ head_chunk_).
    void head_chunk_logits(const HeadActivations<T>& a, long long first_row, long long n);

    LlamaConfig config_;  // the whole model's (names, ids, checkpoints)
    LlamaConfig shape_;   // what this rank computes: its tensor-parallel slice's heads, ffn and vocabulary
    TensorParallel tensor_;
    std::function<void(void*, long long)> tensor_reduce_;
    std::function<void(const void*, void*, long long)> tensor_gather_;
    VocabSlice vocab_{};  // the token rows of the embedding and head this rank holds
    // Replicated kv heads: where part j (0: keys, 1: values) of this rank's kv head sits in the
    // whole-model buffer kv_group_grad, rows `width` wide; the sum of that buffer over the group.
    T* kv_share(int j, int width) const;
    void sum_replicated_kv(int width);
    long long kv_rows_ = 0;  // replicated_kv_rows (model/tensor_parallel.h): 0 unless the kv heads are replicated
    bool kv_adapter_sum_ = false;  // and W_qkv's adapter adapts k or v (adapter_kv_rows), whose B rows are summed
    HeadSlice heads_{};            // this rank's heads, when they are replicated
    void reduce_over_tensor_group(T* data, long long count) {
        if (tensor_.size == 1) return;
        if (!tensor_reduce_)
            throw std::logic_error("Llama: tensor parallelism over " + std::to_string(tensor_.size) +
                                   " ranks with no tensor_reduce bound");
        tensor_reduce_(data, count);
    }
    void gather_over_tensor_group(const void* send, void* recv, long long count) {
        if (!tensor_gather_)
            throw std::logic_error("Llama: tensor parallelism over " + std::to_string(tensor_.size) +
                                   " ranks with no tensor_gather bound");
        tensor_gather_(send, recv, count);
    }
    // The conjugate operators at the tensor-parallel regions' borders on [N][C] activations, one
    // code path with or without sequence parallelism. sum_rows: after a row-parallel linear (or a
    // column-parallel one's input gradient), `whole` holding this rank's partial sums — without
    // sequence parallelism all-reduced in place (returns whole), with it reduce-scattered into
    // `rows` (default work_.rows_summed; returns rows). whole_rows: before a column-parallel linear
    // (or a row-parallel one's output gradient) — returns `rows` itself without sequence
    // parallelism (it is whole), with it rows gathered into `whole`. No collective for T = 1.
    T* sum_rows(T* whole, T* rows = nullptr);
    const T* whole_rows(const T* rows, T* whole);
    // A replicated RMSNorm weight's gradient under sequence parallelism is a sum over the group's
    // rows: norm_grad_into gives the backward the buffer to add this rank's rows' share into (the
    // gradient itself without sequence parallelism, null when frozen), add_norm_grad sums the share
    // over the group and adds it to the gradient (or writes it there: `write`).
    T* norm_grad_into(T* dweight);
    void add_norm_grad(T* dweight, GradWrite write);
    std::function<void(const void*, void*, long long)> tensor_all_gather_;
    std::function<void(const void*, void*, long long)> tensor_reduce_scatter_;
    GroupOptions group_options_;  // as constructed (tensor: this rank's)
    LoraConfig lora_;
    uint64_t seed_ = 0;  // keys the adapters' dropout
    bool nf4_ = false;
    bool attention_p_fp32_ = false;  // ModelOptions::attention_p_fp32
    std::vector<Nf4PartFields> nf4_fields_[kLoraLinears];  // per block linear: its parts' fields in its slot
    LoraShape lora_shapes_[kLoraLinears];                  // per block linear (parts = 0: no adapter)
    int batch_, seq_len_;
    std::vector<StageUnits> chunks_;
    Gradients gradients_;
    Parameters parameters_;
    cudaStream_t stream_;
    cublasHandle_t cublas_ = nullptr;
    std::vector<Unit> units_;
    DeviceBuffer<acc_t<T>> rope_table_;  // [seq_len][head_dim]: RoPE's cos and sin
    T* dresidual_[2] = {nullptr, nullptr};
    void* workspace_ = nullptr;
    Workspace work_;
    void* recompute_arena_ = nullptr;  // the recomputed blocks' activations (null: none recomputes)
    void* cublas_workspace_ = nullptr;  // ModelOptions::cublas_workspace_bytes (null: cuBLAS's default)
    long long head_chunk_ = 1;         // rows of the head's logits at a time
    // Per slot: where the next backward writes the loss the forward left to it (null: none).
    struct DeferredLoss {
        acc_t<T>* loss_sum = nullptr;
        int* count = nullptr;
    };
    std::vector<DeferredLoss> deferred_loss_;
};

}  // namespace pv
