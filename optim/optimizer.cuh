// The optimizer state of the parameters one rank updates, and the step that updates them.
//
// Ownership. For every unit the rank owns one contiguous element range [begin, end) of the
// unit's padded trainable group (frozen groups have no optimizer state): the whole group on a
// single rank and under DDP, shard r of N under ZeRO (the group is padded so that N equal,
// aligned shards tile it; model/parameters.h). The
// state covers exactly the owned range: m and v in acc_t<T> and, for bf16, the float master copy
// (DESIGN.md §4). Padding elements are owned like any other but belong to no tensor, so they are
// never updated and stay zero.
//
// The step. At construction each unit's tensors are intersected with the owned range into a
// device table (optim/adamw.cuh, AdamWTable): the pieces, each with its tensor's weight decay flag
// (matrices, not RMSNorm weights, unless decay_norm_weights) and its stochastic-rounding key
// (tensor id, element index within the tensor), so a shard makes exactly the choices the
// unsharded update makes. update_unit is then one multi-tensor launch over the owned range,
// bit-identical to one adamw_update per piece. The caller passes the parameter and
// gradient pointers of the owned range (element `begin` of the group): the full group's
// pointers offset by begin on a single rank, a reduce-scattered gradient shard under ZeRO; the
// gradient scale (clipping) comes from the host or, in a training step, from device memory.
//
// Checkpoints read and write the state per unit as host bytes of the owned range.
//
// Placement. The state lives on the device, or (--offload, optim/offload.h) in pinned host
// memory: the same fields, the same ranges, charged to MemoryCategory::pinned_host, zeroed and
// filled on the host; update_unit is then refused (the offloaded step, OffloadedAdamW, runs the
// CPU update over pieces(u)), and no device table is built.
#pragma once

#include "platform/device_memory.h"
#include "model/parameters.h"
#include "optim/adamw.cuh"
#include "optim/host_placement.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

// What a training run sets once for every step.
struct AdamWSettings {
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double weight_decay = 0.0;
    bool decay_norm_weights = false;   // also decay the tensors whose decay flag is off (RMSNorm weights)
    bool stochastic_rounding = false;  // bf16 only: round the master stochastically
    uint64_t seed = 0;                 // stochastic rounding's key
};

// The tensor pieces of `layout` inside the owned range [begin, end), relative to begin: one
// AdamWTable slot each (the memory planner counts them too).
inline std::vector<AdamWPiece> owned_pieces(const GroupLayout& layout, long long begin, long long end) {
    std::vector<AdamWPiece> pieces;
    for (const TensorSlot& slot : layout.tensors) {
        const long long lo = std::max(slot.offset, begin);
        const long long hi = std::min(slot.offset + slot.spec.numel(), end);
        if (lo < hi) pieces.push_back({lo - begin, hi - begin, lo - slot.offset, slot.spec.id, slot.spec.decay});
    }
    return pieces;
}

template <class T>
class AdamWState {
  public:
    using A = acc_t<T>;
    enum class Field { master, m, v };

    // State for shard `shard` of `shards` of each layout (shards = 1: everything). The layouts
    // must be splittable into `shards` (GroupLayout::shards a multiple of it). `held` (empty: all)
    // says which units this rank keeps state for at all (a pipeline stage's, parallel/mp.h); the
    // others get an empty range.
    // `on_host`: the state in pinned host memory (header comment).
    AdamWState(std::vector<GroupLayout> layouts, int shard, int shards, const std::vector<bool>& held = {},
               bool on_host = false)
        : layouts_(std::move(layouts)), on_host_(on_host) {
        for (size_t i = 0; i < layouts_.size(); ++i) {
            const GroupLayout& l = layouts_[i];
            if (shards < 1 || shard < 0 || shard >= shards || l.padded % shards != 0)
                throw std::invalid_argument("AdamWState: shard " + std::to_string(shard) + " of " +
                                            std::to_string(shards) + " does not split a group of " +
                                            std::to_string(l.padded) + " elements");
            Unit u;
            if (!held.empty() && !held.at(i)) {
                units_.push_back(u);
                continue;
            }
            const long long len = l.padded / shards;
            u.begin = len * shard;
            u.end = u.begin + len;
            if (len == 0) {  // a unit with nothing trainable
                units_.push_back(u);
                continue;
            }
            const size_t bytes = size_t(len) * sizeof(A);
            u.m = allocate(bytes, true);
            u.v = allocate(bytes, true);
            if constexpr (kHasMaster) u.master = allocate(bytes, false);
            u.pieces = owned_pieces(l, u.begin, u.end);
            if (!on_host_ && !u.pieces.empty()) u.table = std::make_shared<AdamWTable>(u.pieces);
            units_.push_back(u);
        }
        // The zero fills above run on the legacy stream, asynchronously to the host, and the
        // updates on a non-blocking stream that does not wait for it.
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    ~AdamWState() {
        for (Unit& u : units_) memory_free(u.master), memory_free(u.m), memory_free(u.v);
    }
    AdamWState(const AdamWState&) = delete;
    AdamWState& operator=(const AdamWState&) = delete;

    static constexpr bool kHasMaster = std::is_same_v<T, __nv_bfloat16>;
    bool on_host() const { return on_host_; }
    // The tensor pieces of unit u's owned range (relative to begin(u)).
    const std::vector<AdamWPiece>& pieces(int u) const { return units_[size_t(u)].pieces; }
    int num_units() const { return int(units_.size()); }
    long long begin(int u) const { return units_[size_t(u)].begin; }
    long long end(int u) const { return units_[size_t(u)].end; }
    const GroupLayout& layout(int u) const { return layouts_[size_t(u)]; }

    // The master copy from the current parameters (the owned range, starting at element begin):
    // at the start of training and after loading weights. No-op without a master.
    // On the host the parameters are downloaded (after the stream's work) and widened there;
    // params_on_host: params_range is host memory (--offload params), read as it is.
    void init_master(int u, const T* params_range, cudaStream_t stream, bool params_on_host = false) {
        if (end(u) == begin(u)) return;
        if constexpr (kHasMaster) {
            const long long n = end(u) - begin(u);
            A* master = units_[size_t(u)].master;
            if (!on_host_) return pv::init_master(params_range, master, n, stream);
            std::vector<T> params(static_cast<size_t>(n));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            if (params_on_host)
                std::memcpy(static_cast<void*>(params.data()), params_range, size_t(n) * sizeof(T));
            else
                CUDA_CHECK(cudaMemcpy(params.data(), params_range, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
            for (long long i = 0; i < n; ++i) master[i] = to_acc(params[size_t(i)]);  // exact: widening
        }
    }

    // One AdamW step at 1-based step t on unit u's owned range, one launch. params_range and
    // grads_range point at element begin(u) of the group; the gradient scale (clipping) is
    // grad_scale, or *device_scale when that is not null (a scale that is not finite leaves the
    // parameters and the state untouched). nonfinite: null, or a device word (kAdamWAllFinite
    // before) lowered to the index in the owned range of the first element the update made non-finite.
    template <class G>
    void update_unit(int u, T* params_range, const G* grads_range, const AdamWSettings& s, double lr, long long t,
                     double grad_scale, cudaStream_t stream, const double* device_scale = nullptr,
                     unsigned long long* nonfinite = nullptr) {
        const Unit& st = units_[size_t(u)];
        if (on_host_) throw std::logic_error("AdamWState::update_unit: the state is offloaded (OffloadedAdamW)");
        if (!st.table) return;  // nothing owned
        AdamWStep h;
        h.lr = lr;
        h.beta1 = s.beta1, h.beta2 = s.beta2, h.eps = s.eps;
        h.weight_decay = s.weight_decay;
        h.t = t;
        h.grad_scale = grad_scale;
        adamw_update_group<T, G>(params_range, st.master, grads_range, st.m, st.v, *st.table, h, s.decay_norm_weights,
                                 device_scale, s.stochastic_rounding, s.seed, stream, nonfinite);
    }

    // The array of a field over unit u's owned range: device memory, or pinned host memory when
    // on_host().
    A* data(int u, Field f) const { return field(u, f); }

    // Host bytes of a field over unit u's owned range, from a checkpoint.
    void upload(int u, Field f, const std::vector<uint8_t>& bytes) {
        if (bytes.size() != range_bytes(u))
            throw std::invalid_argument("AdamWState::upload: " + std::to_string(bytes.size()) +
                                        " bytes for a range of " + std::to_string(range_bytes(u)));
        if (bytes.empty()) return;
        if (on_host_)
            std::memcpy(field(u, f), bytes.data(), bytes.size());
        else
            CUDA_CHECK(cudaMemcpy(field(u, f), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    }

  private:
    struct Unit {
        long long begin = 0, end = 0;
        A* master = nullptr;
        A* m = nullptr;
        A* v = nullptr;
        std::vector<AdamWPiece> pieces;     // the owned range's tensor pieces
        std::shared_ptr<AdamWTable> table;  // their device table (null: nothing owned, or on the host)
    };
    // A field's array in the state's placement; m and v start at zero (the master is written by
    // init_master or a checkpoint).
    A* allocate(size_t bytes, bool zero) const {
        if (!on_host_) {
            A* p = static_cast<A*>(device_alloc(bytes, MemoryCategory::optimizer_state));
            if (zero) CUDA_CHECK(cudaMemset(p, 0, bytes));
            return p;
        }
        // On the host: first written (zeros) by the offload pool, on the GPU's memory node where
        // it is known (optim/host_placement.h), before it is pinned.
        return static_cast<A*>(host_alloc_first_touched(bytes, offload_pool()));
    }
    size_t range_bytes(int u) const { return size_t(end(u) - begin(u)) * sizeof(A); }
    A* field(int u, Field f) const {
        const Unit& st = units_[size_t(u)];
        A* p = f == Field::master ? st.master : f == Field::m ? st.m : st.v;
        if (!p && (f != Field::master || kHasMaster)) return nullptr;  // a unit not held: an empty range
        if (!p) throw std::invalid_argument("AdamWState: no master copy for this storage type");
        return p;
    }
    std::vector<GroupLayout> layouts_;
    bool on_host_ = false;
    std::vector<Unit> units_;
};

}  // namespace pv
