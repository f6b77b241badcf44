// The Llama units: parameters, arenas, and each unit's forward and backward as a sequence of
// kernel and GEMM launches on the model's stream (see model/llama.h for the math).
#include "model/llama.h"

#include "kernels/attention_instances.h"
#include "kernels/cross_entropy.cuh"
#include "kernels/embedding.cuh"
#include "kernels/glue.cuh"
#include "kernels/matmul.cuh"
#include "kernels/philox.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"
#include "model/nf4_slot.cuh"
#include "model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace pv {

namespace {

// The arena buffers of each unit kind, in the order of activation_layout (model/activations.cpp)
// and the typed views.
enum BlockBuffer { kOut, kH1, kRstd1, kQkv, kAtt, kLse, kX2, kH2, kRstd2, kGateUp, kAct };
enum HeadBuffer { kHeadH, kHeadRstd, kHeadRowLoss, kHeadRowStats };
enum WorkBuffer {
    kProj,
    kDh,
    kDact,
    kDgateUp,
    kDatt,
    kDqkv,
    kNormScratch,
    kAttentionScratch,
    kLoraDu,
    kLoraDropped,
    kLoraGroupGrad,
    kKvGroupGrad,
    kLoraBShare,
    kDequantized,
    kEmbeddingScratch,
    kVocabPartials,
    kRowsSummed,
    kRowsNormed,
    kNormGradShare,
    kLogits
};

// The block tensor (BlockTensor) of linear k (LoraLinear).
int base_tensor_of(int k) {
    constexpr int tensors[kLoraLinears] = {kWQkv, kWO, kWGateUp, kWDown};
    return tensors[k];
}

// A linear's adapter shape for the kernels (kernels/lora.cuh).
LoraShape lora_shape(const LoraLinearShape& s, const LoraConfig& lora) {
    LoraShape out;
    out.in = s.in, out.out = s.out, out.rank = lora.rank, out.parts = int(s.parts.size());
    for (size_t p = 0; p < s.parts.size(); ++p)
        out.part[p] = {s.parts[p].out_begin, s.parts[p].rows, s.parts[p].b_begin};
    out.scale = lora.enabled() ? lora.scale() : 1.0;
    return out;
}

// The rows of a chunk of the head's logits (model/activations.h head_chunk_rows), the same on every
// rank of a tensor-parallel group — each gathers its partials once per chunk — so taken at the
// most columns a rank holds (rank 0's), not this rank's.
long long head_chunk_of(const LlamaConfig& whole, long long rows, DType dtype, TensorParallel tensor,
                        long long requested) {
    return head_chunk_rows(rows, tensor_parallel_shape(whole, {tensor.size, 0}).vocab_size, dtype, requested);
}

}  // namespace

long long lora_max_a_rows(const LlamaConfig& c, const LoraConfig& lora) {
    long long rows = 0;
    for (const LoraLinearShape& s : lora_linears(c, lora))
        rows = std::max<long long>(rows, lora_shape(s, lora).a_rows());
    return rows;
}

std::vector<ActivationBuffer> model_workspace_layout(const LlamaConfig& whole, int batch, int seq_len, DType dtype,
                                                     const LoraConfig& lora, bool nf4, TensorParallel tensor,
                                                     long long head_chunk) {
    const LlamaConfig c = tensor_parallel_shape(whole, tensor);
    const long long N = (long long)batch * seq_len, C = c.hidden_size, F = c.ffn_size;
    const long long R = tensor.stream_rows(N);  // the residual stream's rows
    const long long kv_rows = replicated_kv_rows(whole, tensor.size);
    const size_t t = dtype_size(dtype);
    const long long lora_max_a_rows = pv::lora_max_a_rows(c, lora);
    // The scratch sizes depend on the storage type only through its accumulator.
    const size_t norm_scratch = with_dtype(
        dtype, [&](auto tag) { return rmsnorm_backward_scratch_bytes<typename decltype(tag)::type>(R, int(C)); });
    const size_t attention_scratch = with_dtype(dtype, [&](auto tag) {
        return attention_scratch_bytes<typename decltype(tag)::type>(batch, seq_len, c.num_heads, c.num_kv_heads,
                                                                     c.head_dim_resolved());
    });
    return {{"proj", N * C, t},
            {"dh", N * C, t},
            {"dact", N * F, t},
            {"dgate_up", N * 2 * F, t},
            {"datt", N * c.q_width(), t},
            {"dqkv", N * c.qkv_width(), t},
            {"norm_scratch", (long long)norm_scratch, 1},
            {"attention_scratch", (long long)attention_scratch, 1},
            {"lora_du", N * lora_max_a_rows, t},
            {"lora_dropped", lora.dropout > 0 ? N * std::max<long long>({C, F, c.q_width()}) : 0, t},
            // Under tensor parallelism the largest adapter matrix every rank holds whole: a
            // column-parallel linear's A [P·r][C] (a row-parallel one's B, [C][r], is smaller).
            {"lora_group_grad", tensor.size > 1 ? lora_max_a_rows * C : 0, t},
            // Replicated kv heads: the whole model's kv rows of W_qkv's gradient (or of its
            // adapter's B, r wide), and the B gradient's share of this micro-batch (its rows).
            {"kv_group_grad", kv_rows * std::max<long long>(C, lora.rank), t},
            {"lora_b_share", kv_rows > 0 && lora.rank > 0 ? (long long)c.qkv_width() * lora.rank : 0, t},
            {"dequantized",
             nf4 ? std::max<long long>({(long long)c.qkv_width() * C, (long long)c.q_width() * C, 2 * F * C}) : 0, t},
            {"embedding_scratch", (long long)embedding_backward_scratch_bytes(N), 1},
            // The vocabulary-parallel cross-entropy: this rank's partials [N], then the group's [T][N]
            // (3 accumulator values a row).
            {"vocab_partials", tensor.size > 1 ? (tensor.size + 1) * N : 0,
             size_t(3 * (dtype == DType::fp64 ? 8 : 4))},
            {"rows_summed", tensor.sequence ? R * C : 0, t},
            {"rows_normed", tensor.sequence ? R * C : 0, t},
            {"norm_grad_share", tensor.sequence ? C : 0, t},
            // The head's logits, one chunk of rows at a time (the fused linear cross-entropy).
            {"logits", head_chunk_of(whole, N, dtype, tensor, head_chunk) * c.vocab_size, t}};
}

template <class A>
DeviceBuffer<A> rope_table_buffer(const LlamaConfig& config, int positions, cudaStream_t stream) {
    const std::vector<A> values = rope_table_values<A>(rope_inverse_frequencies(config), positions);
    DeviceBuffer<A> table(values.size(), MemoryCategory::workspace);
    CUDA_CHECK(cudaMemcpyAsync(table.get(), values.data(), table.bytes(), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // `values` is a pageable host buffer
    return table;
}
template DeviceBuffer<float> rope_table_buffer<float>(const LlamaConfig&, int, cudaStream_t);
template DeviceBuffer<double> rope_table_buffer<double>(const LlamaConfig&, int, cudaStream_t);

template <class T>
Llama<T>::Llama(const LlamaConfig& config, const ModelOptions& o)
    : config_(config),
      shape_(tensor_parallel_shape(config, o.placement.tensor)),
      tensor_(o.placement.tensor),
      tensor_reduce_(o.tensor_reduce),
      tensor_gather_(o.tensor_gather),
      tensor_all_gather_(o.tensor_all_gather),
      tensor_reduce_scatter_(o.tensor_reduce_scatter),
      lora_(o.lora),
      seed_(o.seed),
      nf4_(o.nf4),
      attention_p_fp32_(o.attention_p_fp32),
      batch_(o.batch),
      seq_len_(o.seq_len),
      gradients_(o.placement.gradients),
      parameters_(o.placement.parameters),
      stream_(o.stream) {
    validate_or_throw(config_);
    const Placement& place = o.placement;
    if (o.batch < 1 || o.seq_len < 1)
        throw std::invalid_argument("Llama: batch and seq_len must be >= 1 (got " + std::to_string(o.batch) + ", " +
                                    std::to_string(o.seq_len) + ")");
    if (o.seq_len > config_.max_seq_len)
        throw std::invalid_argument("Llama: seq_len = " + std::to_string(o.seq_len) +
                                    " exceeds the model's max_seq_len = " + std::to_string(config_.max_seq_len) +
                                    "; use a shorter sequence");
    kv_rows_ = replicated_kv_rows(config_, tensor_.size);
    kv_adapter_sum_ = kv_rows_ > 0 && adapter_kv_rows(shape_, o.lora) > 0;
    if (kv_rows_ > 0) heads_ = tensor_parallel_heads(config_, tensor_);
    vocab_ = tensor_parallel_vocab(config_, tensor_);
    if (tensor_.sequence && tensor_.size == 1)
        throw std::invalid_argument("Llama: sequence parallelism splits the rows over a tensor-parallel group; "
                                    "it needs --tp 2 or more");
    if (tensor_.sequence && rows() % tensor_.size != 0)
        throw std::invalid_argument("Llama: sequence parallelism over " + std::to_string(tensor_.size) +
                                    " ranks splits a micro-batch's " + std::to_string(rows()) +
                                    " rows (micro-batch x sequence length), which " + std::to_string(tensor_.size) +
                                    " does not divide: give a micro-batch or sequence length that makes it a "
                                    "multiple of " + std::to_string(tensor_.size));
    std::vector<UnitSpec> specs = tensor_parallel_units(config_, o.lora, tensor_);
    const int all = int(specs.size());
    for (const StageUnits& c : place.chunks) {
        const StageUnits resolved{c.first, c.end < 0 ? all : c.end, c.slots};
        if (resolved.first < (chunks_.empty() ? 0 : chunks_.back().end) || resolved.first >= resolved.end ||
            resolved.end > all)
            throw std::invalid_argument("Llama: stage units [" + std::to_string(c.first) + ", " +
                                        std::to_string(c.end) + ") are not a non-empty range of the model's " +
                                        std::to_string(all) + " units after the chunks before it");
        if (c.slots < 1)
            throw std::invalid_argument("Llama: stage units [" + std::to_string(c.first) + ", " +
                                        std::to_string(c.end) + ") need at least one activation slot (got " +
                                        std::to_string(c.slots) + ")");
        chunks_.push_back(resolved);
    }
    if (chunks_.empty()) throw std::invalid_argument("Llama: a model holds at least one chunk of units");
    if (const auto problems = validate(lora_); !problems.empty()) throw std::invalid_argument(problems.front());
    const auto shapes = lora_linears(shape_, lora_);
    for (int k = 0; k < kLoraLinears; ++k) lora_shapes_[k] = lora_shape(shapes[size_t(k)], lora_);
    group_options_ = GroupOptions{o.frozen, o.lora, o.nf4, o.double_quant, tensor_};
    const std::vector<std::vector<GroupLayout>> layouts =
        model_layouts(config_, dtype_of<T>(), place.shards, group_options_);
    CUBLAS_CHECK(cublasCreate(&cublas_));
    if (o.cublas_workspace_bytes > 0) {
        cublas_workspace_ = device_alloc(o.cublas_workspace_bytes, MemoryCategory::workspace);
        CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, o.cublas_workspace_bytes));
    }
    const DType dt = dtype_of<T>();
    // The arenas, from the function the memory planner calls.
    const int sequence_shards = tensor_.sequence ? tensor_.size : 1;
    const ActivationArenas arenas =
        activation_arenas(shape_, o.batch, o.seq_len, dt, lora_, o.checkpointing, chunks_, sequence_shards);
    if (arenas.recompute_bytes > 0)
        recompute_arena_ = device_alloc(arenas.recompute_bytes, MemoryCategory::activations);
    for (UnitSpec& spec : specs) {
        Unit fresh;
        fresh.groups = layouts[units_.size()];
        if (nf4_ && spec.kind == UnitKind::block)
            for (int k = 0; k < kLoraLinears; ++k)
                nf4_fields_[k] = nf4_part_fields(spec.tensors[size_t(base_tensor_of(k))], o.double_quant);
        if (spec.kind == UnitKind::block)  // the adapters follow the base, A then B, in linear order
            for (int k = 0, i = kBlockTensors; k < kLoraLinears; ++k)
                if (lora_shapes_[k].parts > 0) fresh.lora_ids[k] = spec.tensors[size_t(i)].id, i += 2;
        for (const TensorSpec& t : spec.tensors)
            for (size_t g = 0; g < fresh.groups.size(); ++g)
                for (const TensorSlot& slot : fresh.groups[g].tensors)
                    if (slot.spec.id == t.id) fresh.place.emplace_back(int(g), slot.offset);
        fresh.spec = std::move(spec);
        fresh.params.assign(fresh.groups.size(), nullptr);
        units_.push_back(std::move(fresh));
        Unit& unit = units_.back();
        const int u = num_units() - 1;
        const bool runs_here = runs(u);
        unit.held = runs_here || (u == 0 && config_.tie_embeddings && chunks_.back().end == all);
        if (!unit.held) continue;
        if (parameters_ == Parameters::owned)
            for (size_t g = 0; g < unit.groups.size(); ++g) {
                if (unit.groups[g].padded == 0) continue;
                unit.params[g] = static_cast<T*>(device_alloc(unit.groups[g].bytes(), MemoryCategory::parameters));
                init_params(u, int(g), unit.params[g], 0, unit.groups[g].padded, o.seed);
            }
        if (gradients_ == Gradients::owned && trainable(u).padded > 0) {
            unit.grads = static_cast<T*>(device_alloc(trainable(u).bytes(), MemoryCategory::gradients));
            CUDA_CHECK(cudaMemsetAsync(unit.grads, 0, trainable(u).bytes(), stream_));
        }
        unit.arena_layout = slot_arena_layout(shape_, u, o.batch, o.seq_len, dt, lora_, o.checkpointing, sequence_shards);
        unit.recomputes = unit.spec.kind == UnitKind::block && o.checkpointing.recomputes(u - 1);
        if (!runs_here) continue;  // the tied embedding's copy on the head's stage
        for (int s = 0; s < arenas.slots[size_t(u)]; ++s)
            unit.arenas.push_back(device_alloc(arenas.slot_bytes[size_t(u)], MemoryCategory::activations));
        resolve_activations(u);
    }
    for (int u = 0; u < num_units(); ++u) resolve_params(u);
    rope_table_ = rope_table_buffer<acc_t<T>>(config_, seq_len_, stream_);

    // The workspace: transient buffers of one unit at a time, for forward and backward.
    const long long R = stream_rows(), C = config_.hidden_size;
    const std::vector<ActivationBuffer> workspace_layout =
        model_workspace_layout(config_, o.batch, o.seq_len, dt, lora_, nf4_, tensor_, o.head_chunk_rows);
    const std::vector<size_t> at = arena_offsets(workspace_layout);
    workspace_ = device_alloc(arena_bytes(workspace_layout), MemoryCategory::workspace);
    char* w = static_cast<char*>(workspace_);
    work_ = Workspace{reinterpret_cast<T*>(w + at[kProj]),
                      reinterpret_cast<T*>(w + at[kDh]),
                      reinterpret_cast<T*>(w + at[kDact]),
                      reinterpret_cast<T*>(w + at[kDgateUp]),
                      reinterpret_cast<T*>(w + at[kDatt]),
                      reinterpret_cast<T*>(w + at[kDqkv]),
                      w + at[kNormScratch],
                      w + at[kAttentionScratch],
                      reinterpret_cast<T*>(w + at[kLoraDu]),
                      reinterpret_cast<T*>(w + at[kLoraDropped]),
                      reinterpret_cast<T*>(w + at[kLoraGroupGrad]),
                      reinterpret_cast<T*>(w + at[kKvGroupGrad]),
                      reinterpret_cast<T*>(w + at[kLoraBShare]),
                      reinterpret_cast<T*>(w + at[kDequantized]),
                      w + at[kEmbeddingScratch],
                      w + at[kVocabPartials],
                      reinterpret_cast<T*>(w + at[kRowsSummed]),
                      reinterpret_cast<T*>(w + at[kRowsNormed]),
                      reinterpret_cast<T*>(w + at[kNormGradShare]),
                      reinterpret_cast<T*>(w + at[kLogits])};
    head_chunk_ = head_chunk_of(config_, rows(), dt, tensor_, o.head_chunk_rows);
    deferred_loss_.assign(size_t(std::max(1, arenas.slots.back())), DeferredLoss{});
    for (T*& d : dresidual_) d = static_cast<T*>(device_alloc(size_t(R * C) * sizeof(T), MemoryCategory::workspace));
}

template <class T>
Llama<T>::~Llama() {
    cudaStreamSynchronize(stream_);
    for (Unit& u : units_) {
        if (parameters_ == Parameters::owned && u.held)
            for (T* p : u.params) memory_free(p);
        if (gradients_ == Gradients::owned && u.held) memory_free(u.grads);
        for (void* a : u.arenas) memory_free(a);
    }
    memory_free(workspace_);
    memory_free(recompute_arena_);
    memory_free(cublas_workspace_);
    for (T* d : dresidual_) memory_free(d);
    if (cublas_) cublasDestroy(cublas_);
}

// The typed views of unit u's weights and gradients from its groups' current buffers. The head
// of a tied model reads the embedding's, so binding the embedding resolves the head again.
template <class T>
void Llama<T>::resolve_params(int u) {
    Unit& unit = units_[size_t(u)];
    unit.weights.assign(unit.spec.tensors.size(), nullptr);
    unit.weight_grads.assign(unit.spec.tensors.size(), nullptr);
    for (size_t i = 0; i < unit.place.size(); ++i) {
        const auto [g, offset] = unit.place[i];
        if (T* base = unit.params[size_t(g)]) unit.weights[i] = base + offset;
        if (unit.groups[size_t(g)].trainable() && unit.grads) unit.weight_grads[i] = unit.grads + offset;
    }
    const auto& w = unit.weights;
    const auto& d = unit.weight_grads;
    switch (unit.spec.kind) {
        case UnitKind::embedding: break;
        case UnitKind::block: {
            unit.block_w = {w[kAttnNorm], w[kWQkv], w[kWO], w[kMlpNorm], w[kWGateUp], w[kWDown], {}};
            unit.block_g = {d[kAttnNorm], d[kWQkv], d[kWO], d[kMlpNorm], d[kWGateUp], d[kWDown], {}};
            size_t i = kBlockTensors;  // the adapters follow, A then B, for the targeted linears in order
            for (int k = 0; k < kLoraLinears; ++k) {
                if (lora_shapes_[k].parts == 0) continue;
                unit.block_w.lora[k] = {w[i], w[i + 1]};
                unit.block_g.lora[k] = {d[i], d[i + 1]};
                i += 2;
            }
            break;
        }
        case UnitKind::head: {
            const bool tied = config_.tie_embeddings;
            const Unit& embedding = units_.front();
            unit.head_w = {w[0], tied ? embedding.weights[0] : w[1]};
            unit.head_g = {d[0], tied ? embedding.weight_grads[0] : d[1]};
            break;
        }
    }
}

template <class T>
void Llama<T>::resolve_activations(int u) {
    Unit& unit = units_[size_t(u)];
    const std::vector<size_t> at = arena_offsets(unit.arena_layout);
    // A recomputing block's buffers other than its output are the recompute arena's.
    const std::vector<size_t> shared_at =
        unit.recomputes ? arena_offsets(recompute_arena_layout(shape_, batch_, seq_len_, dtype_of<T>(), lora_,
                                                               tensor_.sequence ? tensor_.size : 1))
                        : at;
    for (void* arena : unit.arenas) {
        char* a = static_cast<char*>(arena);
        char* r = unit.recomputes ? static_cast<char*>(recompute_arena_) : a;
        auto t = [&](int i) { return reinterpret_cast<T*>(i == kOut ? a + at[size_t(i)] : r + shared_at[size_t(i)]); };
        auto acc = [&](int i) { return reinterpret_cast<acc_t<T>*>(r + shared_at[size_t(i)]); };
        switch (unit.spec.kind) {
            case UnitKind::embedding: unit.outputs.push_back(t(kOut)); break;
            case UnitKind::block: {
                unit.outputs.push_back(t(kOut));
                BlockActivations<T> acts{t(kOut), t(kH1), acc(kRstd1), t(kQkv),    t(kAtt), acc(kLse),
                                         t(kX2),  t(kH2), acc(kRstd2), t(kGateUp), t(kAct), {}};
                for (int k = 0; k < kLoraLinears; ++k) acts.lora_u[k] = t(kAct + 1 + k);
                unit.block_acts.push_back(acts);
                break;
            }
            case UnitKind::head:
                unit.head_acts.push_back(
                    {t(kHeadH), acc(kHeadRstd), acc(kHeadRowLoss),
                     reinterpret_cast<CrossEntropyStats<acc_t<T>>*>(a + at[size_t(kHeadRowStats)])});
                break;
        }
    }
}

template <class T>
T* Llama<T>::unit_output(int u, int slot) {
    if (unit_kind(u) == UnitKind::head) throw std::logic_error("the head has no residual-stream output");
    return units_[size_t(u)].outputs.at(size_t(slot));
}

template <class T>
void Llama<T>::logits(int slot, T* out) const {
    const Unit& head = units_.back();
    if (!runs(num_units() - 1)) throw std::logic_error("logits: the head does not run here");
    matmul_forward(cublas_, head.head_acts.at(size_t(slot)).h, head.head_w.lm_head, out, rows(), config_.hidden_size,
                   shape_.vocab_size, stream_);
}

template <class T>
long long Llama<T>::tensor_elements(GroupKind kind) const {
    long long n = 0;
    for (const Unit& u : units_)
        for (const GroupLayout& g : u.groups)
            if (g.kind == kind || (kind == GroupKind::frozen && g.kind == GroupKind::nf4))
                for (const TensorSlot& t : g.tensors) n += t.spec.whole_numel();
    return n;
}

template <class T>
std::vector<std::vector<GroupLayout>> Llama<T>::tensor_rank_layouts(int r) const {
    GroupOptions o = group_options_;
    o.tensor = r < 0 ? TensorParallel{} : TensorParallel{tensor_.size, r};
    return model_layouts(config_, dtype_of<T>(), units_.front().groups.front().shards, o);
}

template <class T>
T* Llama<T>::tensor(const std::string& name) {
    for (int u = 0; u < num_units(); ++u)
        for (size_t i = 0; i < units_[size_t(u)].spec.tensors.size(); ++i)
            if (units_[size_t(u)].spec.tensors[i].name == name) {
                if (!units_[size_t(u)].held)
                    throw std::logic_error("tensor '" + name + "' is not held by this model's stage");
                return const_cast<T*>(units_[size_t(u)].weights[i]);
            }
    throw std::invalid_argument("no tensor named '" + name + "'");
}

namespace {

// The initial values (Init::normal or uniform_fan_in) of local elements [first, first + n) of t,
// each keyed by its index in the whole tensor, so a ZeRO shard and a tensor-parallel slice get the
// values the whole tensor has there; the uniform bound is the whole tensor's fan-in.
template <class T>
void init_values(T* dst, const TensorSpec& t, long long first, long long n, uint64_t seed, cudaStream_t stream) {
    const long long whole_cols = t.slice.whole() ? t.cols : t.slice.cols;
    const auto fill = [&](T* out, long long count, WholeIndex where) {
        if (t.init == Init::normal)
            init_normal(out, count, 0.02, seed, t.id, where, stream);
        else  // PEFT's kaiming_uniform(a = √5): bound 1/√fan_in
            init_uniform(out, count, 1.0 / std::sqrt(double(whole_cols)), seed, t.id, where, stream);
    };
    if (t.slice.whole()) return fill(dst, n, WholeIndex{first});
    for (const RowRun& r : t.slice.runs) {
        const long long lo = std::max(first, r.local * t.cols), hi = std::min(first + n, (r.local + r.rows) * t.cols);
        if (lo < hi)
            fill(dst + (lo - first), hi - lo,
                 WholeIndex{lo - r.local * t.cols, t.cols, t.slice.cols, t.slice.col_begin, r.whole});
    }
}

}  // namespace

template <class T>
void Llama<T>::init_params(int u, int g, T* dst, long long begin, long long end, uint64_t seed) const {
    const GroupLayout& layout = units_.at(size_t(u)).groups.at(size_t(g));
    if (begin < 0 || end > layout.padded || begin > end)
        throw std::invalid_argument("init_params: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                    ") outside unit " + std::to_string(u) + "'s group of " +
                                    std::to_string(layout.padded) + " elements");
    if (end == begin) return;
    CUDA_CHECK(cudaMemsetAsync(dst, 0, size_t(end - begin) * sizeof(T), stream_));  // padding stays zero
    if (layout.kind == GroupKind::nf4) {
        // Each slot overlapping the range: the whole tensor's initial values quantised (its
        // statistics span the tensor; a tensor-parallel slice then takes its blocks' fields), then
        // the overlap copied.
        for (const TensorSlot& t : layout.tensors) {
            const long long len = slot_elements(t.spec, layout.kind, layout.dtype, layout.double_quant);
            const long long lo = std::max(begin, t.offset), hi = std::min(end, t.offset + len);
            if (lo >= hi) continue;
            const TensorSpec whole = t.spec.whole_tensor();
            DeviceBuffer<T> values(size_t(whole.numel()), MemoryCategory::workspace),
                slot(size_t(len), MemoryCategory::workspace);
            init_values(values.get(), whole, 0, whole.numel(), seed, stream_);
            nf4_quantize_slice_slot(t.spec, layout.double_quant, values.get(), slot.get(), stream_);
            CUDA_CHECK(cudaMemcpyAsync(dst + (lo - begin), slot.get() + (lo - t.offset), size_t(hi - lo) * sizeof(T),
                                       cudaMemcpyDeviceToDevice, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
        return;
    }
    for (const TensorSlot& t : layout.tensors) {
        const long long lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.spec.numel());
        if (lo >= hi) continue;
        switch (t.spec.init) {
            case Init::ones: fill(dst + (lo - begin), from_acc<T>(acc_t<T>(1)), hi - lo, stream_); break;
            case Init::normal:
            case Init::uniform_fan_in:
                init_values(dst + (lo - begin), t.spec, lo - t.offset, hi - lo, seed, stream_);
                break;
            case Init::zeros: break;  // the memset above
        }
    }
}

template <class T>
void Llama<T>::bind_params(int u, int g, T* params) {
    if (parameters_ != Parameters::bound) throw std::logic_error("bind_params: this model owns its parameters");
    units_.at(size_t(u)).params.at(size_t(g)) = params;
    resolve_params(u);
    if (u == 0 && config_.tie_embeddings) resolve_params(num_units() - 1);
}

template <class T>
void Llama<T>::bind_grads(int u, T* grads) {
    if (gradients_ != Gradients::bound) throw std::logic_error("bind_grads: this model owns its gradient buffers");
    units_.at(size_t(u)).grads = grads;
    resolve_params(u);
    if (u == 0 && config_.tie_embeddings) resolve_params(num_units() - 1);
}

template <class T>
void Llama<T>::zero_grads() {
    for (int u = 0; u < num_units(); ++u)
        if (T* g = grads(u)) CUDA_CHECK(cudaMemsetAsync(g, 0, trainable(u).bytes(), stream_));
}

template <class T>
void Llama<T>::discard_grads() {
    for (int u = 0; u < num_units(); ++u) discard_grads(u);
}

template <class T>
void Llama<T>::discard_grads(int u) {
    Unit& unit = units_.at(size_t(u));
    unit.grads_discarded = unit.grads != nullptr;
}

template <class T>
void Llama<T>::settle_grads() {
    for (int u = 0; u < num_units(); ++u) settle_grads(u);
}

template <class T>
std::vector<bool> Llama<T>::discarded_grads() const {
    std::vector<bool> out;
    for (const Unit& unit : units_) out.push_back(unit.grads_discarded);
    return out;
}

template <class T>
void Llama<T>::set_discarded_grads(const std::vector<bool>& discarded) {
    if (discarded.size() != units_.size()) throw std::logic_error("set_discarded_grads: one flag per unit");
    for (size_t u = 0; u < units_.size(); ++u) units_[u].grads_discarded = discarded[u];
}

template <class T>
void Llama<T>::settle_grads(int u) {
    if (!units_[size_t(u)].grads_discarded) return;
    CUDA_CHECK(cudaMemsetAsync(grads(u), 0, trainable(u).bytes(), stream_));
    units_[size_t(u)].grads_discarded = false;
}

template <class T>
void Llama<T>::forward_unit(int u, int slot, const UnitIO<T>& io) {
    if (!runs(u)) throw std::logic_error("forward_unit: unit " + std::to_string(u) + " is not in this model's stage");
    switch (unit_kind(u)) {
        case UnitKind::embedding:
        {
            // Vocabulary-parallel (model/tensor_parallel.h): this rank's rows, zeros for the other
            // tokens, summed over the group (one nonzero term per element: exact) — into this
            // rank's rows of the stream under sequence parallelism.
            T* whole = tensor_.sequence ? work_.proj : io.residual_out;
            embedding_forward_rows(io.tokens, units_[size_t(u)].weights[0], whole, rows(), config_.hidden_size,
                                   shape_.vocab_size, int(vocab_.first), config_.vocab_size, stream_);
            sum_rows(whole, io.residual_out);
            break;
        }
        case UnitKind::block: forward_block(u, slot, io); break;
        case UnitKind::head: forward_head(slot, io); break;
    }
}

template <class T>
void Llama<T>::backward_unit(int u, int slot, const UnitIO<T>& io) {
    if (!runs(u)) throw std::logic_error("backward_unit: unit " + std::to_string(u) + " is not in this model's stage");
    switch (unit_kind(u)) {
        case UnitKind::embedding:
            // With tied embeddings the head has already added its part to this same gradient (or
            // written it over, after discard_grads). The scatter-add only adds: a gradient still
            // discarded is zeroed first. A frozen embedding has no gradient and nothing below it
            // to pass one to.
            settle_grads(u);
            if (T* dwte = units_[size_t(u)].weight_grads[0])
                embedding_backward_rows(io.tokens, whole_rows(io.dresidual_out, work_.proj), dwte, rows(),
                                        config_.hidden_size, shape_.vocab_size, int(vocab_.first),
                                        work_.embedding_scratch, stream_);
            break;
        case UnitKind::block:
            // The same parameters (bound now as in the forward), input and dropout keys as the
            // forward had: the same activations, bit for bit.
            if (units_[size_t(u)].recomputes) forward_block(u, slot, io, true);
            backward_block(u, slot, io);
            break;
        case UnitKind::head: backward_head(slot, io); break;
    }
    units_[size_t(u)].grads_discarded = false;  // written (the head: and a tied embedding's, in backward_head)
}

template <class T>
void Llama<T>::forward_block(int u, int slot, const UnitIO<T>& io, bool recompute) {
    const LlamaConfig& c = shape_;
    const long long N = rows(), R = stream_rows();  // the linears' and attention's rows, the stream's
    const int C = c.hidden_size, F = c.ffn_size, hd = c.head_dim_resolved();
    const BlockParams<const T*>& w = units_[size_t(u)].block_w;
    const BlockActivations<T>& a = units_[size_t(u)].block_acts[size_t(slot)];
    const T* x = io.residual_in;
    // The norms' outputs: this rank's rows, gathered (saved whole) before the column-parallel linears.
    T* const h1_rows = tensor_.sequence ? work_.rows_normed : a.h1;
    T* const h2_rows = tensor_.sequence ? work_.rows_normed : a.h2;

    const LoraDropout drop = dropout_of(io);
    rmsnorm_forward(x, w.attn_norm, h1_rows, a.rstd1, R, C, c.rms_norm_eps, stream_);
    whole_rows(h1_rows, a.h1);
    linear(u, kLoraQkv, a.h1, a.qkv, N, a.lora_u[kLoraQkv], drop, cublas_);
    rope_forward(a.qkv, rope_table(), io.positions, N, seq_len_, c.num_heads, hd, c.qkv_width(), stream_);
    rope_forward(a.qkv + c.q_width(), rope_table(), io.positions, N, seq_len_, c.num_kv_heads, hd, c.qkv_width(),
                 stream_);
    attention_forward(a.qkv, io.positions, a.att, a.lse, work_.attention_scratch, batch_, seq_len_, c.num_heads,
                      c.num_kv_heads, hd, stream_, attention_p_fp32_);
    linear(u, kLoraO, a.att, work_.proj, N, a.lora_u[kLoraO], drop, cublas_);
    const T* att_out = sum_rows(work_.proj);  // row-parallel: each rank's heads' share
    // The block's output is x2 + the down projection. Without tensor parallelism nothing stands
    // between the down GEMM and that add, so the norm writes x2 into the output as well (one write
    // of N·C) and the GEMM adds onto it (β = 1): the add's launch and its 3·N·C of traffic become
    // the GEMM reading N·C (model/tensor_parallel.h residual_add_in_down_gemm says when).
    const bool fused_residual = residual_add_in_down_gemm(tensor_.size, recompute);
    if (fused_residual && !io.residual_out) throw std::logic_error("forward_block: a block with no output");
    residual_rmsnorm_forward(x, att_out, a.x2, w.mlp_norm, h2_rows, a.rstd2, R, C, c.rms_norm_eps, stream_,
                             fused_residual ? io.residual_out : nullptr);
    whole_rows(h2_rows, a.h2);
    linear(u, kLoraGateUp, a.h2, a.gate_up, N, a.lora_u[kLoraGateUp], drop, cublas_);
    swiglu_forward(a.gate_up, a.act, N, F, stream_);
    if (recompute) {
        // The backward reads no product of the down projection but its adapter's u; the output
        // (and whoever read it) is left alone. Saves the down GEMM: F·C of the block's (qkv + q +
        // 3F)·C matmul weights, 28% of them in Llama-3.2-1B.
        if (const LoraShape& s = lora_shapes_[kLoraDown]; s.parts > 0)
            lora_project_input(cublas_, a.act, w.lora[kLoraDown].a, a.lora_u[kLoraDown], work_.lora_dropped, N, s,
                               dropout_for(kLoraDown, drop), units_[size_t(u)].lora_ids[kLoraDown], stream_);
        return;
    }
    if (fused_residual) {
        linear(u, kLoraDown, a.act, io.residual_out, N, a.lora_u[kLoraDown], drop, cublas_, true);
        return;
    }
    linear(u, kLoraDown, a.act, work_.proj, N, a.lora_u[kLoraDown], drop, cublas_);
    add(a.x2, sum_rows(work_.proj), io.residual_out, R * C, stream_);  // row-parallel: each rank's ffn columns' share
}

// The gradients of frozen tensors are null in `d`: their dW is skipped, dX still flows.
template <class T>
void Llama<T>::backward_block(int u, int slot, const UnitIO<T>& io) {
    const LlamaConfig& c = shape_;
    const long long N = rows(), R = stream_rows();
    const int C = c.hidden_size, F = c.ffn_size, hd = c.head_dim_resolved();
    const BlockParams<const T*>& w = units_[size_t(u)].block_w;
    const BlockParams<T*>& d = units_[size_t(u)].block_g;
    const BlockActivations<T>& a = units_[size_t(u)].block_acts[size_t(slot)];
    const Workspace& ws = work_;
    const T* x = io.residual_in;
    const T* dy = io.dresidual_out;
    T* dx = io.dresidual_in;
    const LoraDropout drop = dropout_of(io);
    const GradWrite write = grad_write(u);  // each weight's gradient has one writer below

    // MLP: out = x2 + act·W_downᵀ. The residual passes dy through to x2: the MLP norm's backward
    // writes dx = dy + its share, dL/dx2 (dx becomes the block input's gradient at the end). Under
    // sequence parallelism dy and dx are this rank's rows, gathered (into the forward's proj) for
    // the row-parallel linears' backward.
    linear_backward(u, kLoraDown, whole_rows(dy, ws.proj), a.act, ws.dact, a, drop, write);
    swiglu_backward(a.gate_up, ws.dact, ws.dgate_up, N, F, stream_);
    linear_backward(u, kLoraGateUp, ws.dgate_up, a.h2, ws.dh, a, drop, write);
    const T* dh2 = sum_rows(ws.dh);  // column-parallel: the input gradient's shares
    rmsnorm_backward(a.x2, w.mlp_norm, a.rstd2, dh2, dy, dx, norm_grad_into(d.mlp_norm), ws.norm_scratch, R, C, stream_,
                     write);
    add_norm_grad(d.mlp_norm, write);
    // Attention: x2 = x + att·W_oᵀ. dx now holds dL/dx2.
    linear_backward(u, kLoraO, whole_rows(dx, ws.proj), a.att, ws.datt, a, drop, write);
    attention_backward(a.qkv, io.positions, a.att, ws.datt, a.lse, ws.dqkv, ws.attention_scratch, batch_, seq_len_,
                       c.num_heads, c.num_kv_heads, hd, stream_);
    rope_backward(ws.dqkv, rope_table(), io.positions, N, seq_len_, c.num_heads, hd, c.qkv_width(), stream_);
    rope_backward(ws.dqkv + c.q_width(), rope_table(), io.positions, N, seq_len_, c.num_kv_heads, hd, c.qkv_width(),
                  stream_);
    linear_backward(u, kLoraQkv, ws.dqkv, a.h1, ws.dh, a, drop, write);
    const T* dh1 = sum_rows(ws.dh);
    rmsnorm_backward(x, w.attn_norm, a.rstd1, dh1, dx, dx, norm_grad_into(d.attn_norm), ws.norm_scratch, R, C, stream_,
                     write);
    add_norm_grad(d.attn_norm, write);
}

template <class T>
T* Llama<T>::sum_rows(T* whole, T* rows) {
    const long long count = this->rows() * config_.hidden_size;
    if (!tensor_.sequence) {
        if (rows && rows != whole) throw std::logic_error("sum_rows: without sequence parallelism the sum is in place");
        reduce_over_tensor_group(whole, count);
        return whole;
    }
    if (!tensor_reduce_scatter_)
        throw std::logic_error("Llama: sequence parallelism with no tensor_reduce_scatter bound");
    T* out = rows ? rows : work_.rows_summed;
    tensor_reduce_scatter_(whole, out, count / tensor_.size);
    return out;
}

template <class T>
const T* Llama<T>::whole_rows(const T* rows, T* whole) {
    if (!tensor_.sequence) return rows;
    if (!tensor_all_gather_) throw std::logic_error("Llama: sequence parallelism with no tensor_all_gather bound");
    tensor_all_gather_(rows, whole, stream_rows() * config_.hidden_size);
    return whole;
}

template <class T>
T* Llama<T>::norm_grad_into(T* dweight) {
    if (!dweight || !tensor_.sequence) return dweight;
    CUDA_CHECK(cudaMemsetAsync(work_.norm_grad_share, 0, size_t(config_.hidden_size) * sizeof(T), stream_));
    return work_.norm_grad_share;
}

template <class T>
void Llama<T>::add_norm_grad(T* dweight, GradWrite write) {
    if (!dweight || !tensor_.sequence) return;
    reduce_over_tensor_group(work_.norm_grad_share, config_.hidden_size);
    write_grad(dweight, static_cast<const T*>(work_.norm_grad_share), config_.hidden_size, write, stream_);
}

namespace {

template <class P>
P base_weight(const BlockParams<P>& w, int k) {
    switch (k) {
        case kLoraQkv: return w.w_qkv;
        case kLoraO: return w.w_o;
        case kLoraGateUp: return w.w_gate_up;
        default: return w.w_down;
    }
}

}  // namespace

template <class T>
void Llama<T>::linear(int u, int k, const T* x, T* y, long long n, T* u_save, const LoraDropout& dropout,
                      cublasHandle_t handle, bool accumulate) const {
    const Unit& unit = units_[size_t(u)];
    const LoraShape& s = lora_shapes_[k];
    matmul_forward(handle, x, dense_weight(u, k), y, n, s.in, s.out, stream_, accumulate);
    if (s.parts > 0)
        lora_forward(handle, x, unit.block_w.lora[k].a, unit.block_w.lora[k].b, y, u_save, work_.lora_dropped, n, s,
                     dropout_for(k, dropout), unit.lora_ids[k], stream_);
}

template <class T>
LoraDropout Llama<T>::dropout_of(const UnitIO<T>& io) const {
    if (io.step < 0 || lora_.dropout == 0) return {};
    LoraDropout d{lora_.dropout, seed_, uint32_t(io.step), io.first_row};
    d.keys = io.dropout_keys;
    return d;
}

template <class T>
LoraDropout Llama<T>::dropout_for(int k, LoraDropout d) const {
    if (!d.on() || tensor_.size == 1 || column_parallel(k)) return d;
    const int whole_in = k == kLoraO ? config_.q_width() : config_.ffn_size;
    const int in = lora_shapes_[k].in;  // this rank's columns of it: [rank·in, (rank + 1)·in)
    d.key_in = whole_in, d.col_begin = tensor_.rank * in;
    return d;
}

template <class T>
void Llama<T>::linear_forward(int u, int k, const T* x, T* y, long long n, T* scratch, cublasHandle_t handle,
                              bool accumulate) const {
    linear(u, k, x, y, n, scratch, LoraDropout{}, handle, accumulate);
}

template <class T>
void Llama<T>::linear_backward(int u, int k, const T* dy, const T* x, T* dx, const BlockActivations<T>& a,
                               const LoraDropout& dropout, GradWrite write) {
    const Unit& unit = units_[size_t(u)];
    const LoraShape& s = lora_shapes_[k];
    // Replicated kv heads (model/tensor_parallel.h): the ranks reading one kv head each hold a share
    // of the gradient of its rows of W_qkv (and of its adapter's B); this micro-batch's share is
    // summed over the group before it is added (sum_replicated_kv).
    const bool kv_sum = k == kLoraQkv && kv_rows_ > 0;
    T* dw = base_weight(unit.block_g, k);
    matmul_backward(cublas_, dy, x, dense_weight(u, k), dx, kv_sum ? nullptr : dw, rows(), s.in, s.out, false, stream_,
                    write);
    const int q_rows = shape_.q_width(), hd = shape_.head_dim_resolved();
    if (kv_sum && dw) {  // dW += dyᵀ·x: the query rows at once, the key and value rows through the sum
        gemm_dyt_x(cublas_, dy, s.out, x, s.in, dw, s.in, rows(), s.in, q_rows, 1.0, beta_of(write), stream_);
        CUDA_CHECK(cudaMemsetAsync(work_.kv_group_grad, 0, size_t(kv_rows_ * s.in) * sizeof(T), stream_));
        for (int j = 0; j < 2; ++j)
            gemm_dyt_x(cublas_, dy + q_rows + j * hd, s.out, x, s.in, kv_share(j, s.in), s.in, rows(), s.in, hd, 1.0,
                       0.0, stream_);
        sum_replicated_kv(s.in);
        for (int j = 0; j < 2; ++j)
            write_grad(dw + (long long)(q_rows + j * hd) * s.in, static_cast<const T*>(kv_share(j, s.in)),
                       (long long)hd * s.in, write, stream_);
    }
    if (s.parts == 0) return;
    T* da = unit.block_g.lora[k].a;
    T* db = unit.block_g.lora[k].b;
    T* const db_kv_sum = kv_sum && kv_adapter_sum_ ? db : nullptr;  // B's rows: through lora_b_share
    if (db_kv_sum) {
        CUDA_CHECK(cudaMemsetAsync(work_.lora_b_share, 0, size_t(s.out) * s.rank * sizeof(T), stream_));
        db = work_.lora_b_share;
    }
    // Tensor parallelism (model/tensor_parallel.h): the adapter matrix every rank of the group holds
    // whole — a column-parallel linear's A (its du is each rank's output rows' share), a
    // row-parallel one's B (its u is each rank's input columns' share) — gets a share of its
    // gradient on each rank. This micro-batch's gradient is computed into scratch, summed over the
    // group, then added, so whatever the gradient buffer held before stays counted once.
    const bool column = column_parallel(k);
    T* whole_grad = tensor_.size > 1 ? (column ? da : db) : nullptr;
    long long count = 0;
    if (whole_grad) {
        count = column ? (long long)s.a_rows() * s.in : (long long)s.out * s.rank;  // (a row-parallel B: one part)
        CUDA_CHECK(cudaMemsetAsync(work_.lora_group_grad, 0, size_t(count) * sizeof(T), stream_));
        (column ? da : db) = work_.lora_group_grad;
    }
    lora_backward(cublas_, dy, x, unit.block_w.lora[k].a, unit.block_w.lora[k].b, a.lora_u[k], dx, da, db,
                  work_.lora_du, work_.lora_dropped, rows(), s, dropout_for(k, dropout), unit.lora_ids[k], stream_,
                  write);  // (into a zeroed scratch share, writing over it is adding to it)
    if (whole_grad) {
        reduce_over_tensor_group(work_.lora_group_grad, count);
        write_grad(whole_grad, static_cast<const T*>(work_.lora_group_grad), count, write, stream_);
    }
    if (db_kv_sum) {  // a query part's rows at once; a key or value part's through the sum
        const size_t r = size_t(s.rank);
        CUDA_CHECK(cudaMemsetAsync(work_.kv_group_grad, 0, size_t(kv_rows_) * r * sizeof(T), stream_));
        for (int p = 0; p < s.parts; ++p)
            if (s.part[p].out_begin >= q_rows)
                CUDA_CHECK(cudaMemcpyAsync(kv_share((s.part[p].out_begin - q_rows) / hd, s.rank),
                                           work_.lora_b_share + s.part[p].b_begin * r, size_t(s.part[p].rows) * r *
                                           sizeof(T), cudaMemcpyDeviceToDevice, stream_));
        sum_replicated_kv(s.rank);
        for (int p = 0; p < s.parts; ++p) {
            const T* share = s.part[p].out_begin < q_rows ? work_.lora_b_share + s.part[p].b_begin * r
                                                            : kv_share((s.part[p].out_begin - q_rows) / hd, s.rank);
            write_grad(db_kv_sum + s.part[p].b_begin * r, share, (long long)s.part[p].rows * s.rank, write, stream_);
        }
    }
}

template <class T>
T* Llama<T>::kv_share(int j, int width) const {
    return work_.kv_group_grad +
           ((long long)j * config_.num_kv_heads + heads_.kv_first) * shape_.head_dim_resolved() * width;
}

template <class T>
void Llama<T>::sum_replicated_kv(int width) {
    reduce_over_tensor_group(work_.kv_group_grad, kv_rows_ * width);
}

template <class T>
const T* Llama<T>::dense_weight(int u, int k) const {
    const T* w = base_weight(units_[size_t(u)].block_w, k);
    if (!nf4_) return w;
    nf4_dequantize_slot(nf4_fields_[k], units_[size_t(u)].groups.back().double_quant, lora_shapes_[k].in, w,
                        work_.dequantized, stream_);
    return work_.dequantized;
}

template <class T>
void Llama<T>::merged_tensor(int u, int i, T* out) {
    const Unit& unit = units_.at(size_t(u));
    if (!unit.held) throw std::logic_error("merged_tensor: unit " + std::to_string(u) + " is not held here");
    const TensorSpec& spec = unit.spec.tensors.at(size_t(i));
    const size_t bytes = size_t(spec.numel()) * sizeof(T);
    int k = -1;  // the block linear it is, if any
    for (int j = 0; j < kLoraLinears && unit.spec.kind == UnitKind::block; ++j)
        if (base_tensor_of(j) == i) k = j;
    if (k < 0) {
        CUDA_CHECK(cudaMemcpyAsync(out, unit.weights[size_t(i)], bytes, cudaMemcpyDeviceToDevice, stream_));
    } else {
        CUDA_CHECK(cudaMemcpyAsync(out, dense_weight(u, k), bytes, cudaMemcpyDeviceToDevice, stream_));
        const LoraShape& s = lora_shapes_[k];
        for (int p = 0; p < s.parts; ++p)  // [rows][in] += s · B_p [rows][r] · A_p [r][in]
            gemm_dy_w(cublas_, unit.block_w.lora[k].b + (long long)s.part[p].b_begin * s.rank, s.rank,
                      unit.block_w.lora[k].a + (long long)p * s.rank * s.in, s.in,
                      out + (long long)s.part[p].out_begin * s.in, s.in, s.part[p].rows, s.in, s.rank, s.scale, 1.0,
                      stream_);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

template <class T>
long long Llama<T>::nf4_tensor_elements() const {
    long long n = 0;
    for (const Unit& u : units_)
        for (const GroupLayout& g : u.groups)
            if (g.kind == GroupKind::nf4)
                for (const TensorSlot& t : g.tensors) n += t.spec.whole_numel();  // the model's, as tensor_elements
    return n;
}

template <class T>
void Llama<T>::forward_head(int slot, const UnitIO<T>& io) {
    const LlamaConfig& c = config_;
    const Unit& unit = units_.back();
    const long long N = rows();
    const HeadActivations<T>& a = unit.head_acts[size_t(slot)];
    T* const h_rows = tensor_.sequence ? work_.rows_normed : a.h;  // gathered under sequence parallelism
    rmsnorm_forward(io.residual_in, unit.head_w.final_norm, h_rows, a.rstd, stream_rows(), c.hidden_size,
                    c.rms_norm_eps, stream_);
    whole_rows(h_rows, a.h);
    deferred_loss_.at(size_t(slot)) = {};
    if (!io.targets) return;
    if (io.loss_in_backward) {  // the backward computes the logits, the loss and its gradient at once
        deferred_loss_[size_t(slot)] = {io.loss_sum, io.count};
        return;
    }
    // The loss alone, a chunk of logits at a time: each chunk's rows' statistics (tensor-parallel:
    // this rank's columns' partials, gathered once over the group and merged in rank order, so
    // every rank gets the same loss and statistics), then one sum over all N rows.
    using Partial = CrossEntropyPartial<acc_t<T>>;
    Partial* const mine = static_cast<Partial*>(work_.vocab_partials);
    for (long long r = 0; r < N; r += head_chunk_) {
        const long long n = std::min(head_chunk_, N - r);
        head_chunk_logits(a, r, n);
        if (tensor_.size == 1)
            cross_entropy_rows(work_.logits, io.targets + r, a.row_loss + r, a.row_stats + r, n, shape_.vocab_size,
                               kIgnoreIndex, stream_);
        else
            cross_entropy_partials(work_.logits, io.targets + r, mine + r, n, shape_.vocab_size, int(vocab_.first),
                                   stream_);
    }
    if (tensor_.size > 1) {
        gather_over_tensor_group(mine, mine + N, N * (long long)(sizeof(Partial) / sizeof(acc_t<T>)));
        cross_entropy_merge_rows<T>(mine + N, tensor_.size, io.targets, a.row_stats, a.row_loss, N, c.vocab_size,
                                    kIgnoreIndex, stream_);
    }
    cross_entropy_sum<T>(a.row_loss, io.targets, io.loss_sum, io.count, N, kIgnoreIndex, stream_);
}

template <class T>
void Llama<T>::head_chunk_logits(const HeadActivations<T>& a, long long first_row, long long n) {
    matmul_forward(cublas_, a.h + first_row * config_.hidden_size, units_.back().head_w.lm_head, work_.logits, n,
                   config_.hidden_size, shape_.vocab_size, stream_);
}

template <class T>
void Llama<T>::backward_head(int slot, const UnitIO<T>& io) {
    const LlamaConfig& c = config_;
    const Unit& unit = units_.back();
    const long long N = rows(), C = c.hidden_size;
    const HeadActivations<T>& a = unit.head_acts[size_t(slot)];
    const DeferredLoss loss = deferred_loss_.at(size_t(slot));
    deferred_loss_[size_t(slot)] = {};
    const int V = shape_.vocab_size;  // this rank's columns of the logits (all of them for T = 1)
    using Partial = CrossEntropyPartial<acc_t<T>>;
    Partial* const mine = static_cast<Partial*>(work_.vocab_partials);
    // Per chunk of rows: its logits, which become their gradient in place (the softmax statistics
    // the forward's, or computed here with the loss when the forward left the loss to this pass),
    // then the chunk's input gradient rows and its share of the weight gradient — the first chunk's
    // written over a discarded gradient (a tied embedding's: its unit's), the others added.
    const int lm_head_unit = c.tie_embeddings ? 0 : num_units() - 1;
    const GradWrite norm_write = grad_write(num_units() - 1);
    GradWrite lm_head_write = grad_write(lm_head_unit);
    for (long long r = 0; r < N; r += head_chunk_) {
        const long long n = std::min(head_chunk_, N - r);
        const int* targets = io.targets + r;
        head_chunk_logits(a, r, n);
        if (loss.loss_sum && tensor_.size == 1) {
            cross_entropy_loss_and_gradient(work_.logits, targets, a.row_loss + r, a.row_stats + r, n, V, kIgnoreIndex,
                                            io.loss_scale, stream_);
        } else {
            if (loss.loss_sum) {  // vocabulary-parallel: the chunk's rows' statistics over the group first
                cross_entropy_partials(work_.logits, targets, mine, n, V, int(vocab_.first), stream_);
                gather_over_tensor_group(mine, mine + n, n * (long long)(sizeof(Partial) / sizeof(acc_t<T>)));
                cross_entropy_merge_rows<T>(mine + n, tensor_.size, targets, a.row_stats + r, a.row_loss + r, n,
                                            c.vocab_size, kIgnoreIndex, stream_);
            }
            cross_entropy_backward_columns(work_.logits, targets, a.row_stats + r, work_.logits, n, V,
                                           int(vocab_.first), c.vocab_size, kIgnoreIndex, io.loss_scale, stream_);
        }
        matmul_backward(cublas_, work_.logits, a.h + r * C, unit.head_w.lm_head, work_.dh + r * C, unit.head_g.lm_head,
                        n, c.hidden_size, V, false, stream_, lm_head_write);
        lm_head_write = GradWrite::add;
    }
    if (unit.head_g.lm_head) units_[size_t(lm_head_unit)].grads_discarded = false;
    if (loss.loss_sum) cross_entropy_sum<T>(a.row_loss, io.targets, loss.loss_sum, loss.count, N, kIgnoreIndex, stream_);
    const T* dh = sum_rows(work_.dh);  // vocabulary-parallel: each rank's columns' share
    // Nothing flows past the final norm: dresidual_in is the norm's share alone.
    rmsnorm_backward(io.residual_in, unit.head_w.final_norm, a.rstd, dh, static_cast<const T*>(nullptr),
                     io.dresidual_in, norm_grad_into(unit.head_g.final_norm), work_.norm_scratch, stream_rows(),
                     c.hidden_size, stream_, norm_write);
    add_norm_grad(unit.head_g.final_norm, norm_write);
}

template class Llama<__nv_bfloat16>;
template class Llama<float>;
template class Llama<double>;

}  // namespace pv
