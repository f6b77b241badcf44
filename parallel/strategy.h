// A strategy (DESIGN.md §2): the loop over units, and the hooks where its parts add
// communication. A strategy is applied to a model that knows nothing about it; it is one class,
// whose gradient and parameter parts (parallel/data_parts.h, chosen by the registry row's
// parallel/policy.h DataPolicy) make it ddp, zero1, zero2 or zero3, and to which a pipeline
// (parallel/pp.h) may be applied.
//
// One micro-step runs forward over the units (embedding, blocks, head) and backward in reverse,
// the residual stream's gradient passed between the model's two buffers. After each unit's
// backward the gradient part's `after_unit_backward` runs: DDP's starts that unit's gradient
// all-reduce there (a bucket), overlapping the backward of the units below.
//
// Streams. Communication runs on the Comm's stream, ordered with the compute stream by events:
// a collective waits for the compute work before it (fence_from), and the compute stream waits
// for a unit's collective only where it first reads its result — a unit's reduced gradient at
// its norm (reduced_on_comm / wait_reduced), a unit's gathered parameters at its forward (zero1).
//
// Gradients. G is the type gradients are reduced and the optimizer reads: T, or float with fp32
// gradient accumulation for bf16, where each micro-step's bf16 gradients of a unit are added into
// a float buffer right after the unit's backward (so a DDP bucket can reduce the float sums as
// soon as the last micro-step's unit is done). A unit's group is written by that unit's backward
// and, for the tied embedding, earlier by the head's; the embedding unit runs last, so "after
// unit u's backward" is always after every write to group u.
//
// Ownership. Data-parallel rank r of N owns slice r of every unit's padded group ([r·len,
// (r+1)·len), len = padded/N): ZeRO keeps optimizer state only there; DDP keeps all of it, but
// every strategy forms the global gradient norm the same way — per unit, each rank the squares
// of its slice; those summed over ranks in rank order; then the units added in unit order — so
// DDP and ZeRO clip by bit-identical scales. Hybrid sharding (parallel/mesh.h) shards
// over a group of K ranks instead: rank r owns slice r mod K of K, and the norm's sum runs over
// its group alone — every group holds the same reduced slices, so each sums the same terms in the
// same order and every rank clips by the same scale. Tensor parallelism (--tp, parallel/
// tensor_parallel.h) adds the tensor axis to that sum: each rank of a tensor-parallel group holds
// its own slices of the block matrices, which all count, and copies of the rest (norms, embedding,
// head, with equal gradients), which count on the group's first rank only. A pipeline (pp.h)
// splits the units instead: a rank counts only its stage's units in the norm, the other stages
// zeros, and the sum runs over the shard and pipeline axes of the mesh (parallel/mesh.h), so a
// pipeline of one data-parallel rank per stage has one rank's bits per unit.
//
// Communicators. Every strategy talks over the mesh's groups: the data axes split the batch (the
// token count), the shard axis shards (ZeRO's collectives; DDP's slices of the norm), the
// replicate axis holds hybrid sharding's replicas, the pipeline axis carries the stages' transfers,
// the tensor axis the model's tensor-parallel sums (bound by make_strategy).
#pragma once

#include "kernels/glue.cuh"
#include "model/llama.h"
#include "model/tensor_parallel.h"
#include "model/unit_loop.h"
#include "parallel/comm.h"
#include "parallel/data_parts.h"
#include "parallel/mesh.h"
#include "parallel/policy.h"
#include "parallel/pp.h"
#include "parallel/schedule.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace pv {

template <class T, class G>
class Strategy {
  public:
    // The mesh of the world's ranks (a world of one for the single strategy); the model's groups
    // must split into shards() shards. The parts come with apply, before anything runs.
    Strategy(Llama<T>& model, std::unique_ptr<Mesh> mesh, const DataPolicy& policy)
        : model_(model), mesh_(std::move(mesh)), comm_(mesh_->world()), policy_(policy) {
        static_assert(std::is_same_v<G, T> || std::is_same_v<G, float>, "gradients are T or float");
        if constexpr (!std::is_same_v<G, T>)
            for (int u = 0; u < model.num_units(); ++u)
                grad32_.push_back(
                    model.holds(u) && model.trainable(u).padded > 0
                        ? DeviceBuffer<float>(size_t(model.trainable(u).padded), MemoryCategory::gradients)
                        : DeviceBuffer<float>());
        long long largest = 0;
        for (int u = 0; u < model.num_units(); ++u) largest = std::max(largest, model.trainable(u).padded);
        norm_scratch_ = DeviceBuffer<uint8_t>(sum_of_squares_scratch_bytes<G>(largest), MemoryCategory::workspace);
        unit_norms_ = DeviceBuffer<double>(2 * size_t(model.num_units()), MemoryCategory::workspace);
        // The ranges of each unit's trainable group this rank's squares count in the norm (header).
        for (int u = 0; u < model.num_units(); ++u)
            norm_ranges_.push_back(counted_ranges(model.trainable(u), mesh_->coords().tensor));
        if (comm_) {
            reduced_.resize(size_t(model.num_units()));
            for (cudaEvent_t& e : reduced_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            reduce_pending_.assign(reduced_.size(), false);
        }
    }
    ~Strategy() {
        parameters_.reset(), gradients_.reset();  // before the events and communicators they use
        for (cudaEvent_t e : reduced_) cudaEventDestroy(e);
    }
    Strategy(const Strategy&) = delete;
    Strategy& operator=(const Strategy&) = delete;

    // The name the run was asked for (--parallel), set by make_strategy.
    const char* name() const { return name_; }
    Llama<T>& model() { return model_; }
    const Mesh& mesh() const { return *mesh_; }
    // The world's communicator (null: one rank).
    Comm* comm() { return comm_; }
    // The communicator the batch is split over — the mesh's data axes (null: this rank sees the
    // whole batch) — and this rank's place in it. Every communicator the strategy uses, for counting.
    Comm* data_comm() { return mesh_->comm(kDataAxes); }
    int data_rank() { return data_comm() ? data_comm()->rank() : 0; }
    int data_ranks() { return data_comm() ? data_comm()->size() : 1; }
    std::vector<Comm*> comms() { return mesh_->comms(); }
    // The ranks the groups are sharded over — the mesh's shard axis: the data-parallel ranks, or
    // a shard group — and this rank's shard; the communicator of those ranks (null with one), and
    // the one of the ranks holding the same shard (hybrid sharding's replicas; null without).
    Comm* shard_comm() { return mesh_->comm(MeshAxes(MeshAxis::shard) | kOwnComm); }
    Comm* replica_comm() { return mesh_->comm(MeshAxes(MeshAxis::replicate) | kOwnComm); }
    int shards() { return shard_comm() ? shard_comm()->size() : 1; }
    int shard_rank() { return shard_comm() ? shard_comm()->rank() : 0; }
    // The stages' communicator (null without a pipeline).
    Comm* pipeline_comm() { return pipeline_ ? &pipeline_->comm() : nullptr; }
    // The tensor-parallel group's communicator (null without --tp), and whether this rank's loss
    // counts in the step's sum over the world: a tensor-parallel group computes one loss, counted
    // on its first rank.
    Comm* tensor_comm() { return mesh_->comm(axes(MeshAxis::tensor)); }
    bool counts_loss() const { return mesh_->coords().tensor == 0; }
    // Micro-batches in flight at once (activation slots): 1, or the pipeline's (pp.h).
    int slots() const { return pipeline_ ? pipeline_->slots() : 1; }

    // Applied once by make_strategy, before any step: the run's name, its parts (parallel/
    // data_parts.h) and the pipeline (null: none).
    void apply(const char* name, std::unique_ptr<GradientPart<T, G>> gradients,
               std::unique_ptr<ParameterPart<T, G>> parameters, std::unique_ptr<Pipeline<T>> pipeline) {
        name_ = name;
        gradients_ = std::move(gradients), parameters_ = std::move(parameters);
        pipeline_ = std::move(pipeline);
    }

    // One optimizer step's `micro` micro-batches on this rank, in the order of its schedule
    // (parallel/schedule.h): `run(entry, last)` runs one forward or backward (`last`: the last
    // backward of the step on this rank's units). Without a pipeline each forward is followed by
    // its backward in slot 0; a pipeline runs its table's row and adds the transfers between entries.
    void run_micro_steps(int micro, const std::function<void(const PipeStep&, bool)>& run) {
        if (pipeline_) return pipeline_->run_micro_steps(micro, run);
        for (int m = 0; m < micro; ++m) {
            run(PipeStep{false, m, 0, 0}, false);
            run(PipeStep{true, m, 0, 0}, m + 1 == micro);
        }
    }
    // Around each captured micro-step under --cuda-graphs (trainer/micro_step_graphs.h: a forward
    // and its backward, or one entry of a pipeline's row with its transfers). Before it, outside any
    // capture: the compute stream waits for every collective issued so far (the last step's
    // parameter gathers, the last micro-step's reduce-scatters), so a captured micro-step waits for
    // no event recorded outside it. At its start, inside: the parts record their events again
    // (GradientPart::begin_micro_step). At its end, inside: the compute stream joins every comm
    // stream that took part, which a capture must do before it ends (and which the gradient norm's
    // per-unit waits for the reductions then need not repeat). The host state a micro-step decides
    // by: micro_step_state (the gradient part's, then the pipeline's, pp.h).
    void before_micro_step() {
        for (Comm* c : comms()) c->fence_to(model_.stream());
        parameters_->settled_on_device();
    }
    void begin_micro_step() { gradients_->begin_micro_step(); }
    void end_micro_step() {
        for (Comm* c : comms()) c->join_to(model_.stream());
        reduce_pending_.assign(reduce_pending_.size(), false);  // joined: the gradients' collectives are done
    }
    std::vector<int> micro_step_state() const {
        std::vector<int> state = gradients_->micro_step_state();
        if (pipeline_) {
            const std::vector<int> pipe = pipeline_->state();
            state.insert(state.end(), pipe.begin(), pipe.end());
        }
        return state;
    }
    void set_micro_step_state(const std::vector<int>& state) {
        const auto parts = std::ptrdiff_t(gradients_->micro_step_state().size());
        gradients_->set_micro_step_state({state.begin(), state.begin() + parts});
        if (pipeline_) pipeline_->set_state({state.begin() + parts, state.end()});
    }
    // Whether this rank holds every parameter whole (it can sample, for one).
    bool holds_whole_model() const {
        return parameters_->whole() && model_.runs_every_unit() && model_.tensor_parallel().size == 1;
    }

    // The slice of group g of unit u this rank owns (default: the trainable group).
    long long slice_len(int u, int g = 0) { return model_.group(u, g).padded / shards(); }
    long long slice_begin(int u, int g = 0) { return slice_len(u, g) * shard_rank(); }
    // The range the optimizer of this rank updates: everything, or the slice (ZeRO); nothing of
    // a unit the rank does not hold (a pipeline, pp.h).
    bool sharded_optimizer() const { return policy_.sharded_optimizer(); }
    long long owned_begin(int u) { return sharded_optimizer() ? slice_begin(u) : 0; }
    long long owned_len(int u) { return sharded_optimizer() ? slice_len(u) : model_.trainable(u).padded; }

    // The start of an optimizer step: gradients to zero.
    void begin_step() { gradients_->begin_step(); }
    // The full-size gradients (and their fp32 accumulators) to zero: for a part that keeps them.
    // The model's count as zero without a memset — the first micro-step's backward writes over
    // them (Llama::discard_grads; 2.5 GB of memset at Llama-3.2-1B in bf16).
    void zero_full_gradients() {
        model_.discard_grads();
        for (auto& g : grad32_)
            if (g.bytes() > 0) CUDA_CHECK(cudaMemsetAsync(g.get(), 0, g.bytes(), model_.stream()));
    }

    // One micro-step's forward of the micro-batch `batch` (its device arrays, model/unit_loop.h):
    // loss sum and count of this micro-batch into the device scalars.
    void forward(int slot, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count) {
        auto before = [&](int u) { before_unit_forward(u); };
        if (pipeline_) return pipeline_->forward(slot, batch, loss_sum, count, before);
        single_forward(model_, slot, batch, loss_sum, count, before);
    }

    // One micro-step's backward; `last` marks the last micro-step of the optimizer step.
    void backward(int slot, const DeviceBatch& batch, DeviceScalar<double> loss_scale, bool last) {
        if (!grad32_.empty()) model_.discard_grads();  // each micro-step's T gradients, then added up
        auto before = [&](int u) { before_unit_backward(u); };
        auto done = [&](int u) { unit_backward_done(u, last); };
        if (pipeline_) return pipeline_->backward(slot, batch, loss_scale, before, done);
        single_backward(model_, slot, batch, loss_scale, before, done);
    }

    // After the last micro-step: the owned range's gradients are complete and reduced, on the
    // compute stream's timeline — the policy's reduction, then a pipeline's tied-embedding sum
    // (pp.h) over the reduced owned range of the first and last stages.
    void finish_gradients() {
        model_.settle_grads();  // (a unit this step's backward never reached: zeros, as before any)
        gradients_->finish();
        Comm* ends = pipeline_ ? mesh_->pipeline_ends() : nullptr;
        if (ends && model_.holds(0) && model_.trainable(0).padded > 0) {  // (a frozen embedding has no gradient)
            // (after the data-parallel reduction of both partial gradients: one stream runs every collective)
            ends->fence_from(model_.stream());
            G* g = const_cast<G*>(owned_grads(0));
            ends->all_reduce(g, g, size_t(owned_len(0)));
            ends->fence_to(model_.stream());
        }
    }

    // Unit u's full gradient buffer (where it has one), and the reduced gradient of this rank's
    // slice and of the range its optimizer owns (element owned_begin).
    G* grads(int u) {
        if constexpr (std::is_same_v<G, T>)
            return model_.grads(u);
        else
            return grad32_[size_t(u)].get();
    }
    const G* slice_grads(int u) { return gradients_->slice_grads(u); }
    // The parameters of the owned range, which the optimizer updates (ZeRO-3: the rank's slice).
    T* owned_params(int u) { return parameters_->owned_params(u); }
    // Whether owned_params and local_params are pinned host memory (zero3 with --offload params),
    // not device memory: the optimizer, the checkpoints and the loads then copy them as host bytes.
    bool params_on_host() const { return parameters_->on_host(); }
    const G* owned_grads(int u) { return gradients_->owned_grads(u); }

    // The squared global gradient norm's terms (header comment), queued on the compute stream:
    // per unit, this rank's squares of its slice (zero for a unit not counted here), that vector
    // summed over ranks in rank order (over the shard group with hybrid sharding: header comment).
    // Returns the device array of the num_units() sums; adding
    // them in unit order (optim/clip.cuh) gives the squared norm, with the same association on
    // every strategy, so a pipeline (whose stages hold whole units) clips exactly as one rank does.
    const double* unit_norms_sq() {
        const int units = model_.num_units();
        double* per_unit = unit_norms_.get();  // [units] this rank's, then [units] the sums over ranks
        CUDA_CHECK(cudaMemsetAsync(per_unit, 0, size_t(units) * sizeof(double), model_.stream()));
        for (int u = 0; u < units; ++u) {  // with one rank the slice is the group
            wait_reduced(u);
            if (in_norm(u)) add_squares(u, 0, model_.trainable(u).padded, per_unit + u);
        }
        Comm* c = norm_comm();
        if (!c) return per_unit;
        c->fence_from(model_.stream());
        c->all_reduce(per_unit, per_unit + units, size_t(units));
        c->fence_to(model_.stream());
        return per_unit + units;
    }
    // The ranks unit_norms_sq sums over: the mesh's shard, pipeline and tensor axes (hybrid
    // sharding's replicas hold the same slices); null with one rank.
    Comm* norm_comm() {
        const bool tensor = mesh_->shape().tensor > 1;
        if (pipeline_)
            return mesh_->comm(tensor ? MeshAxis::shard | MeshAxis::pipeline | MeshAxis::tensor
                                      : MeshAxis::shard | MeshAxis::pipeline);
        return tensor ? mesh_->comm(MeshAxis::shard | MeshAxis::tensor) : shard_comm();
    }
    // Whether this rank's slice of unit u counts in the norm (each element once over the ranks).
    bool counts_in_norm(int u) const { return in_norm(u); }

    // The diagnosis of a step whose norm is not finite (the failure path only; trainer/step_checks.h):
    // the squared norms of the given element ranges [begin, end) of unit u's trainable group —
    // this rank's slice of each, reduced over norm_comm() as unit_norms_sq reduces, so every rank
    // gets the global figures. Collective over norm_comm(); the host waits for the result.
    std::vector<double> range_norms_sq(int u, const std::vector<std::pair<long long, long long>>& ranges) {
        const size_t n = ranges.size();
        std::vector<double> out(n, 0.0);
        if (n == 0) return out;
        DeviceBuffer<double> sums(2 * n, MemoryCategory::workspace);  // [n] this rank's, [n] reduced
        CUDA_CHECK(cudaMemsetAsync(sums.get(), 0, n * sizeof(double), model_.stream()));
        for (size_t k = 0; k < n && in_norm(u); ++k) add_squares(u, ranges[k].first, ranges[k].second, sums.get() + k);
        const double* result = sums.get();
        if (Comm* c = norm_comm()) {
            c->fence_from(model_.stream());
            c->all_reduce(sums.get(), sums.get() + n, n);
            c->fence_to(model_.stream());
            result += n;
        }
        CUDA_CHECK(cudaMemcpyAsync(out.data(), result, n * sizeof(double), cudaMemcpyDeviceToHost, model_.stream()));
        wait_polling(model_.stream(), comms());
        return out;
    }

    // After the optimizer has updated the owned ranges: every rank sees every new parameter — on
    // the compute stream's timeline (a strategy may leave its parameter collectives running
    // beside the next step's forward, which waits for each unit's own; parallel/parameters_replicated.h).
    void after_update() { parameters_->after_update(); }
    // Makes the host wait for any parameter collective still running (after_update's), so that
    // parameters can be read outside the compute stream: checkpoints (whole_on_writer calls it),
    // sampling, a test's downloads.
    void settle_parameters() { parameters_->settle(); }

    // Checkpoints (train/checkpoint.*) ask the strategy where this rank keeps each group, and to
    // bring a whole padded group to the writing rank 0. The parameters of group g of unit u this
    // rank keeps: elements [local_begin, local_begin + local_len) of the padded group (the whole
    // group, a ZeRO-3 slice, or nothing for a unit another stage holds).
    T* local_params(int u, int g) { return parameters_->local_params(u, g); }
    long long local_begin(int u, int g) { return parameters_->local_begin(u, g); }
    long long local_len(int u, int g) { return parameters_->local_len(u, g); }

    // The whole `padded` elements of a field of group g of unit u on rank 0 (empty elsewhere), from
    // the `len` elements at `local` each rank keeps: within the stage holding the unit (every rank
    // without a pipeline) slices are all-gathered over the shard group of the writer's replica
    // (ZeRO; hybrid sharding's other replicas hold copies) or a whole local copy is read; then, when
    // another stage holds the unit, its first data-parallel rank sends it to the writer over the
    // pipeline. Under tensor parallelism the writer's tensor-parallel group gathers its ranks'
    // slices and the writer joins them: the result is then the group in the model's
    // whole_layouts(), whole tensors. Collective over the strategy's ranks; counted like every
    // collective.
    template <class X>
    std::vector<uint8_t> whole_on_writer(int u, int g, const X* local, long long len, long long padded) {
        settle_parameters();
        const bool writer = !comm_ || comm_->rank() == 0;
        Comm* pipe = pipeline_comm();
        const int owner = pipe ? pipeline_->owner(u) : 0;  // the pipeline rank holding the unit
        // Under tensor parallelism what travels is the joined group: the whole layout's elements.
        const long long joined = tensor_comm() ? model_.whole_layouts()[size_t(u)][size_t(g)].padded : padded;
        if (pipe && pipe->rank() != owner) {  // another stage's unit: the writer receives it
            if (!writer) return {};
            DeviceBuffer<X> whole(size_t(joined), MemoryCategory::comm_buffers);
            pipe->recv(whole.get(), size_t(joined), owner);
            pipe->synchronize();
            return download_bytes(whole.get(), joined);
        }
        DeviceBuffer<X> gathered;
        const X* whole = local;
        if (len != padded) {
            Comm* shards = shard_comm();
            if (!shards || padded != len * shards->size())
                throw std::logic_error("checkpoint: unit " + std::to_string(u) + " is sharded but " + name() +
                                       " has no communicator of its shards to gather it");
            if (replica_comm() && replica_comm()->rank() != 0) return {};  // not the writer's replica
            gathered = DeviceBuffer<X>(size_t(padded), MemoryCategory::comm_buffers);
            shards->fence_from(model_.stream());
            shards->all_gather(local, gathered.get(), size_t(len));
            shards->synchronize();
            whole = gathered.get();
        }
        if (Comm* t = tensor_comm()) {
            if (data_rank() != 0) return {};  // the writer's tensor-parallel group (its stage's) alone
            // The group's first rank holds the most (model/tensor_parallel.h: the last may hold
            // fewer vocabulary rows): each rank's slice travels in a block of that size.
            const long long most = model_.tensor_rank_layouts(0)[size_t(u)][size_t(g)].padded;
            DeviceBuffer<X> mine;
            if (padded < most) {
                mine = DeviceBuffer<X>(size_t(most), MemoryCategory::comm_buffers);
                CUDA_CHECK(cudaMemsetAsync(mine.get(), 0, size_t(most) * sizeof(X), model_.stream()));
                CUDA_CHECK(cudaMemcpyAsync(mine.get(), whole, size_t(padded) * sizeof(X), cudaMemcpyDeviceToDevice,
                                           model_.stream()));
                whole = mine.get();
            }
            DeviceBuffer<X> all(size_t(most) * size_t(t->size()), MemoryCategory::comm_buffers);
            t->fence_from(model_.stream());
            t->all_gather(whole, all.get(), size_t(most));
            t->synchronize();
            const bool sends = pipe && owner != 0 && t->rank() == 0;  // another stage's joiner
            if (!writer && !sends) return {};
            const std::vector<uint8_t> bytes = download_bytes(all.get(), most * t->size());
            std::vector<GroupLayout> slices;
            std::vector<const uint8_t*> at;
            for (int r = 0; r < t->size(); ++r) {
                slices.push_back(model_.tensor_rank_layouts(r)[size_t(u)][size_t(g)]);
                at.push_back(bytes.data() + size_t(r) * size_t(most) * sizeof(X));
            }
            std::vector<uint8_t> joined_bytes =
                join_tensor_slices(model_.whole_layouts()[size_t(u)][size_t(g)], slices, at, sizeof(X));
            if (!pipe || owner == 0) return joined_bytes;
            // Another stage's group: its first rank sends the joined group to the writer.
            DeviceBuffer<X> out(size_t(joined), MemoryCategory::comm_buffers);
            CUDA_CHECK(cudaMemcpy(out.get(), joined_bytes.data(), joined_bytes.size(), cudaMemcpyHostToDevice));
            pipe->send(out.get(), size_t(joined), 0);
            pipe->synchronize();
            return {};
        }
        if (pipe && owner != 0) {  // this stage's first data-parallel rank sends it to the writer
            if (data_rank() != 0) return {};
            pipe->fence_from(model_.stream());
            pipe->send(whole, size_t(padded), 0);
            pipe->synchronize();
            return {};
        }
        return writer ? download_bytes(whole, padded) : std::vector<uint8_t>{};
    }

    // For the parts (data_parts.h) and the trainer. Whether a pipeline runs this rank's units (a chunk at a time,
    // its forwards and backwards interleaved with other micro-batches'), and the chunk of this
    // rank's units holding unit u.
    bool pipelined() const { return pipeline_ != nullptr; }
    StageUnits chunk_of(int u) const {
        for (const StageUnits& c : model_.chunks())
            if (u >= c.first && u < c.end) return c;
        throw std::logic_error("Strategy: unit " + std::to_string(u) + " is in none of this rank's chunks");
    }
    // Unit u's gradient collective has just been queued on the comm stream: the first reader of
    // the reduced gradient on the compute stream, the norm of unit u (unit_norms_sq), waits for it
    // and for nothing else, so the norms of the units reduced earlier run while the last buckets
    // (the tied embedding's, the largest and always the last) are still on the wire.
    void reduced_on_comm(int u) {
        CUDA_CHECK(cudaEventRecord(reduced_[size_t(u)], comm_->stream()));
        reduce_pending_[size_t(u)] = true;
    }

  private:
    template <class X>
    static std::vector<uint8_t> download_bytes(const X* p, long long n) {
        std::vector<uint8_t> bytes(size_t(n) * sizeof(X));
        if (n > 0) CUDA_CHECK(cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost));
        return bytes;
    }
    // Whether this rank's squares of unit u count in the global norm (each element once): a
    // pipeline's tied copy counts on the first stage only.
    bool in_norm(int u) const { return !pipeline_ || model_.runs(u); }
    // Adds to *out, on the compute stream, the squares of the reduced gradient of unit u's elements
    // [begin, end) within this rank's slice and the ranges it counts in the norm (norm_ranges_).
    void add_squares(int u, long long begin, long long end, double* out) {
        const long long lo = slice_begin(u), hi = lo + slice_len(u);
        for (const auto& [first, last] : norm_ranges_[size_t(u)]) {
            const long long b = std::max({first, begin, lo}), e = std::min({last, end, hi});
            if (b < e)
                sum_of_squares_launch(slice_grads(u) + (b - lo), e - b, out, norm_scratch_.get(), true,
                                      model_.stream());
        }
    }
    // After unit u's backward: the fp32 accumulation, then the gradient part's hook.
    void unit_backward_done(int u, bool last) {
        accumulate32(u);
        gradients_->after_unit_backward(u, last);
    }
    // With fp32 gradient accumulation: unit u's micro-step gradient added into its float buffer.
    void accumulate32(int u) {
        if constexpr (!std::is_same_v<G, T>)
            if (model_.grads(u))
                accumulate(grad32_[size_t(u)].get(), model_.grads(u), model_.trainable(u).padded, model_.stream());
    }
    void before_unit_forward(int u) { parameters_->before_unit_forward(u); }
    void wait_reduced(int u) {
        if (reduce_pending_.empty() || !reduce_pending_[size_t(u)]) return;
        CUDA_CHECK(cudaStreamWaitEvent(model_.stream(), reduced_[size_t(u)], 0));
        reduce_pending_[size_t(u)] = false;
    }
    // The gradient buffer first (rotating gradients), then the parameters (sharded ones).
    void before_unit_backward(int u) {
        gradients_->before_unit_backward(u);
        parameters_->before_unit_backward(u);
    }

    Llama<T>& model_;
    std::unique_ptr<Mesh> mesh_;
    Comm* comm_;  // the world's
    DataPolicy policy_;
    const char* name_ = "";
    std::unique_ptr<Pipeline<T>> pipeline_;
    std::unique_ptr<GradientPart<T, G>> gradients_;
    std::unique_ptr<ParameterPart<T, G>> parameters_;
    std::vector<DeviceBuffer<float>> grad32_;
    DeviceBuffer<uint8_t> norm_scratch_;
    DeviceBuffer<double> unit_norms_;
    std::vector<std::vector<std::pair<long long, long long>>> norm_ranges_;  // per unit: [begin, end) counted here
    std::vector<cudaEvent_t> reduced_;  // per unit, with a communicator: its gradient collective done
    std::vector<bool> reduce_pending_;  // recorded and not yet waited for by the compute stream
};

}  // namespace pv
