// The optimizer step with the state offloaded to the host (ZeRO-Offload; --offload optimizer).
//
// The owned range's fp32 master (bf16 runs), Adam m and v live in pinned host memory
// (AdamWState on_host). A step, for each unit u with an owned range, in unit order:
//   1. its reduced gradient (the owned range, G) is copied device → host into a pinned staging
//      buffer — and, for fp32/fp64, whose parameters are their own master, the owned parameters
//      too (the device keeps the authoritative copy, so a checkpoint or a load needs no host one);
//   2. AdamW runs on the CPU (optim/adamw_cpu.h: the kernel's math, bit for bit on the host
//      backend) into the master, m, v and the staged parameters (T);
//   3. the staged parameters are copied host → device into the owned range.
// The gradient scale (clipping) is copied back once, before the first unit's gradient; a scale
// that is not finite refuses the step as the kernel does (nothing updated; the trainer reports it).
//
// Overlap. The copies run on a copy stream of their own, in order: the scale, gradients of units
// 0 and 1, then after each CPU update of unit k its parameter upload and the gradient copy of unit
// k + 2 into the staging buffer k just released. Two staging buffers of each kind, used by units
// in turn: while the CPU updates unit k, unit k + 1's gradient is arriving and unit k − 1's
// parameters are leaving. An event per buffer tells the host when its download is done (the
// host's only waits); the copy stream starts behind an event on the compute stream (the gradients
// and the scale are complete there), and the compute stream waits for the copy stream's last
// upload before anything reads the parameters again. A buffer is rewritten by the CPU only after
// the host has waited for the download queued behind its previous upload, so an upload never reads
// a buffer being rewritten.
//
// Memory (pinned host, offload_staging_bytes): 2 × largest owned range × (sizeof(G) + sizeof(T))
// plus the scale; on the device nothing (the state's device bytes drop to 0). With --offload params
// (zero3's slices in pinned host memory) the CPU updates the slices in place: no parameter staging
// and no parameter copies (the next gather uploads them, parallel/parameters_sharded.h).
#pragma once

#include "optim/adamw_cpu.h"
#include "optim/host_placement.h"
#include "optim/optimizer.cuh"
#include "optim/thread_pool.h"
#include "platform/device_memory.h"

#include <functional>
#include <stdexcept>
#include <vector>

namespace pv {

// The pinned host staging of an offloaded step: two buffers of the largest owned range for the
// gradients (grad_bytes each element) and two for the parameters (param_bytes; 0 when the
// parameters are on the host already), and the scale.
inline size_t offload_staging_bytes(long long largest_owned, size_t param_bytes, size_t grad_bytes) {
    return 2 * size_t(largest_owned) * (param_bytes + grad_bytes) + sizeof(double);
}

template <class T, class G>
class OffloadedAdamW {
  public:
    using A = acc_t<T>;
    static constexpr bool kHasMaster = std::is_same_v<T, __nv_bfloat16>;

    // `state` must be on the host; pool: the CPU update's threads (offload_pool(): bound to the
    // GPU's memory node where it is known, optim/host_placement.h); params_on_host: the owned
    // parameters are pinned host memory too (--offload params), updated in place, with no
    // parameter staging or copies.
    OffloadedAdamW(AdamWState<T>& state, ThreadPool& pool, bool params_on_host = false)
        : state_(state), pool_(pool), params_on_host_(params_on_host) {
        if (!state.on_host()) throw std::logic_error("OffloadedAdamW: the optimizer state is on the device");
        long long largest = 0;
        for (int u = 0; u < state.num_units(); ++u) largest = std::max(largest, state.end(u) - state.begin(u));
        largest_ = largest;
        staging_ = static_cast<uint8_t*>(
            pinned_host_alloc(offload_staging_bytes(largest, params_on_host ? 0 : sizeof(T), sizeof(G))));
        CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
        for (cudaEvent_t* e : {&start_, &done_, &arrived_[0], &arrived_[1]})
            CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
    ~OffloadedAdamW() {
        cudaStreamSynchronize(copy_);  // no copy may outlive the staging
        for (cudaEvent_t e : {start_, done_, arrived_[0], arrived_[1]}) cudaEventDestroy(e);
        cudaStreamDestroy(copy_);
        memory_free(staging_);
    }
    OffloadedAdamW(const OffloadedAdamW&) = delete;
    OffloadedAdamW& operator=(const OffloadedAdamW&) = delete;

    // One AdamW step at 1-based step t over every unit's owned range: params(u) and grads(u) the
    // device arrays of unit u's owned range; the gradient scale in device memory (device_scale),
    // complete on `compute`'s timeline. `wait` blocks the host until an event has completed (the
    // trainer's polls the communicators meanwhile). Returns whether the step was applied (false:
    // the scale was not finite). On return the uploads are queued and `compute` waits for them.
    // nonfinite: null, or one host word per unit (kAdamWAllFinite before), lowered to the index in
    // the unit's owned range of the first element the update made non-finite (adamw_update_cpu).
    bool step(const std::function<T*(int)>& params, const std::function<const G*(int)>& grads, const AdamWSettings& s,
              double lr, long long t, const double* device_scale, cudaStream_t compute,
              const std::function<void(cudaEvent_t)>& wait, unsigned long long* nonfinite = nullptr) {
        std::vector<int> units;
        for (int u = 0; u < state_.num_units(); ++u)
            if (!state_.pieces(u).empty()) units.push_back(u);
        CUDA_CHECK(cudaEventRecord(start_, compute));
        CUDA_CHECK(cudaStreamWaitEvent(copy_, start_, 0));
        double* scale = reinterpret_cast<double*>(staging_);
        CUDA_CHECK(cudaMemcpyAsync(scale, device_scale, sizeof(double), cudaMemcpyDeviceToHost, copy_));
        auto fetch = [&](size_t k) {
            if (k >= units.size()) return;
            const int u = units[k], b = int(k % 2);
            const size_t n = size_t(state_.end(u) - state_.begin(u));
            if (!kHasMaster && !params_on_host_)  // fp32/fp64: the parameters are the master
                CUDA_CHECK(cudaMemcpyAsync(param_staging(b), params(u), n * sizeof(T), cudaMemcpyDeviceToHost, copy_));
            CUDA_CHECK(cudaMemcpyAsync(grad_staging(b), grads(u), n * sizeof(G), cudaMemcpyDeviceToHost, copy_));
            CUDA_CHECK(cudaEventRecord(arrived_[b], copy_));
        };
        fetch(0), fetch(1);
        bool applied = true;
        ScopedAffinity beside_pool(pool_.cpus());  // this thread updates beside the pool, on its CPUs
        AdamWStep h;
        h.lr = lr;
        h.beta1 = s.beta1, h.beta2 = s.beta2, h.eps = s.eps;
        h.weight_decay = s.weight_decay;
        h.t = t;
        for (size_t k = 0; k < units.size() && applied; ++k) {
            const int u = units[k], b = int(k % 2);
            wait(arrived_[b]);
            const size_t n = size_t(state_.end(u) - state_.begin(u));
            T* updated = params_on_host_ ? params(u) : param_staging(b);
            applied = adamw_update_cpu<T, G>(
                updated, kHasMaster ? state_.data(u, AdamWState<T>::Field::master) : nullptr, grad_staging(b),
                state_.data(u, AdamWState<T>::Field::m), state_.data(u, AdamWState<T>::Field::v), state_.pieces(u), h,
                s.decay_norm_weights, *scale, s.stochastic_rounding, s.seed, pool_,
                nonfinite ? nonfinite + u : nullptr);
            if (!applied) break;  // the scale is not finite: nothing is updated (it is the same for every unit)
            if (!params_on_host_)
                CUDA_CHECK(cudaMemcpyAsync(params(u), updated, n * sizeof(T), cudaMemcpyHostToDevice, copy_));
            fetch(k + 2);
        }
        if (units.empty()) wait_scale(wait, &applied);
        CUDA_CHECK(cudaEventRecord(done_, copy_));
        CUDA_CHECK(cudaStreamWaitEvent(compute, done_, 0));
        return applied;
    }

  private:
    // No unit to update: the scale still says whether the step was applied.
    void wait_scale(const std::function<void(cudaEvent_t)>& wait, bool* applied) {
        CUDA_CHECK(cudaEventRecord(arrived_[0], copy_));
        wait(arrived_[0]);
        const double scale = *reinterpret_cast<const double*>(staging_);
        *applied = scale - scale == 0.0;
    }
    // The staging layout: the scale, then two parameter buffers (none with the parameters on the
    // host), then two gradient buffers.
    T* param_staging(int b) const {
        return reinterpret_cast<T*>(staging_ + sizeof(double)) + size_t(b) * size_t(largest_);
    }
    G* grad_staging(int b) const {
        const size_t params = params_on_host_ ? 0 : 2 * size_t(largest_) * sizeof(T);
        return reinterpret_cast<G*>(staging_ + sizeof(double) + params) + size_t(b) * size_t(largest_);
    }

    AdamWState<T>& state_;
    ThreadPool& pool_;
    bool params_on_host_ = false;
    long long largest_ = 0;
    uint8_t* staging_ = nullptr;
    cudaStream_t copy_ = nullptr;
    cudaEvent_t start_ = nullptr, done_ = nullptr, arrived_[2] = {};
};

}  // namespace pv
