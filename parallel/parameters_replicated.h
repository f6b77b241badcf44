// Parameters replicated (DDP, ZeRO-1, ZeRO-2; parallel/policy.h ParameterPlacement::replicated):
// every rank holds every parameter of the units it holds. With a replicated optimizer every rank
// makes the same update and nothing moves. With a sharded one (ZeRO-1 and -2) each rank updates
// its slice, and an in-place all-gather per unit writes every rank's new slice into every rank's
// parameters — queued on the comm stream after the update and left running: the next step's
// forward of unit u waits for unit u's all-gather alone (an event), so the gathers of the later
// units overlap the forward of the earlier ones. Whoever reads parameters outside the compute
// stream calls settle first (checkpoints do). Per step that moves (N−1)/N·Ψ elements; with
// ZeRO-1's reduce-scatter, the same 2·(N−1)/N·Ψ as DDP's all-reduce, with 12Ψ/N bytes of optimizer
// state instead of 12Ψ (bf16). Frozen groups are neither updated nor gathered.
#pragma once

#include "parallel/data_parts.h"
#include "parallel/strategy.h"

#include <vector>

namespace pv {

template <class T, class G>
class ReplicatedParameters : public ParameterPart<T, G> {
  public:
    ReplicatedParameters(Strategy<T, G>& s, bool gather_after_update)
        : ParameterPart<T, G>(s), gather_(gather_after_update) {}
    ~ReplicatedParameters() override {
        for (cudaEvent_t e : gathered_) cudaEventDestroy(e);
    }

    void after_update() override {
        if (!gather_) return;  // every rank made the same update
        Strategy<T, G>& s = this->s_;
        Comm& c = *s.shard_comm();
        c.fence_from(s.model().stream());  // every unit's update
        for (int u = 0; u < s.model().num_units(); ++u) {
            if (s.slice_len(u) == 0 || !s.model().holds(u)) continue;  // nothing to train, or another stage's
            T* p = s.model().params(u);
            c.all_gather(p + s.slice_begin(u), p, size_t(s.slice_len(u)));
            CUDA_CHECK(cudaEventRecord(gathered(u), c.stream()));
            pending_[size_t(u)] = true;
        }
    }

    void settle() override {
        if (!gather_) return;
        wait_polling(this->s_.shard_comm()->stream(), this->s_.comms());  // the gathers ran on it
        pending_.assign(pending_.size(), false);
    }

    void settled_on_device() override { pending_.assign(pending_.size(), false); }

    void before_unit_forward(int u) override {
        if (pending_.empty() || !pending_[size_t(u)]) return;
        CUDA_CHECK(cudaStreamWaitEvent(this->s_.model().stream(), gathered_[size_t(u)], 0));
        pending_[size_t(u)] = false;
    }

  private:
    cudaEvent_t gathered(int u) {
        if (gathered_.empty()) {
            gathered_.resize(size_t(this->s_.model().num_units()));
            for (cudaEvent_t& e : gathered_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            pending_.assign(gathered_.size(), false);
        }
        return gathered_[size_t(u)];
    }
    bool gather_;
    std::vector<cudaEvent_t> gathered_;  // per unit: its parameters' all-gather done (created on first use)
    std::vector<bool> pending_;          // recorded and not yet waited for
};

}  // namespace pv
