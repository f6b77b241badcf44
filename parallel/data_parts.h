// The interfaces of a data-parallel strategy's parts (parallel/policy.h says what each part is and
// costs; DESIGN.md §2). A Strategy (parallel/strategy.h) owns one gradient part and one parameter
// part, chosen by its registry row (parallel/plan.cpp) in make_strategy (parallel/strategies.h),
// and calls them at its hooks; the optimizer's part is only where it updates (sharded_optimizer).
// A part reads the strategy's geometry — its communicators, slices and owned ranges — through
// the strategy it is built on.
#pragma once

#include "model/llama.h"

#include <vector>

namespace pv {

template <class T, class G>
class Strategy;

// How gradients are reduced over the data-parallel ranks and where the reduced ones live.
template <class T, class G>
class GradientPart {
  public:
    explicit GradientPart(Strategy<T, G>& s) : s_(s) {}
    virtual ~GradientPart() = default;
    GradientPart(const GradientPart&) = delete;
    GradientPart& operator=(const GradientPart&) = delete;

    // The start of an optimizer step: the gradients this part accumulates into, to zero.
    virtual void begin_step() { s_.zero_full_gradients(); }
    // Before unit u's backward, and after it (`last`: the step's last micro-step on this unit).
    virtual void before_unit_backward(int /*u*/) {}
    virtual void after_unit_backward(int u, bool last) = 0;
    // After the last micro-step: every reduction queued is ordered before the compute stream's work.
    virtual void finish() {}
    // --cuda-graphs (Strategy::begin_micro_step): at the start of each micro-step, on the compute
    // stream, which has waited for every collective issued before it, the part records again the
    // events its micro-step waits for — a capture cannot wait for an event recorded outside it,
    // and after a capture its events mark graph nodes, not work anything could wait for.
    virtual void begin_micro_step() {}
    // The host state a micro-step reads and changes (which unit each rotating buffer held last): a
    // graph replays the work its capture's state decided, so it is kept per state and set after
    // each launch as the capture left it.
    virtual std::vector<int> micro_step_state() const { return {}; }
    virtual void set_micro_step_state(const std::vector<int>& /*state*/) {}
    // The reduced gradient of this rank's slice of unit u, and of the range its optimizer owns.
    virtual const G* slice_grads(int u) { return s_.grads(u) + s_.slice_begin(u); }
    virtual const G* owned_grads(int u) { return s_.grads(u) + s_.owned_begin(u); }

  protected:
    Strategy<T, G>& s_;
};

// Where the parameters live and how they reach the units that run.
template <class T, class G>
class ParameterPart {
  public:
    explicit ParameterPart(Strategy<T, G>& s) : s_(s) {}
    virtual ~ParameterPart() = default;
    ParameterPart(const ParameterPart&) = delete;
    ParameterPart& operator=(const ParameterPart&) = delete;

    virtual void before_unit_forward(int /*u*/) {}
    virtual void before_unit_backward(int /*u*/) {}
    // After the optimizer has updated the owned ranges: every rank sees every new parameter, on
    // the compute stream's timeline (a part may leave collectives running; settle waits for them).
    virtual void after_update() {}
    virtual void settle() {}
    // --cuda-graphs (Strategy::before_micro_step): the compute stream now waits for every
    // collective issued so far, so nothing after_update left running needs a wait of its own.
    virtual void settled_on_device() {}
    // Whether this part keeps every parameter of the units the rank holds (not a slice).
    virtual bool whole() const { return true; }
    // Whether the rank's parameters are pinned host memory (--offload params).
    virtual bool on_host() const { return false; }
    // The parameters of the owned range, which the optimizer updates.
    virtual T* owned_params(int u) { return s_.model().params(u) + s_.owned_begin(u); }
    // What the rank keeps of group g of unit u: elements [local_begin, local_begin + local_len) of
    // the padded group, at local_params.
    virtual T* local_params(int u, int g) { return s_.model().group_params(u, g); }
    virtual long long local_begin(int /*u*/, int /*g*/) { return 0; }
    virtual long long local_len(int u, int g) {
        return s_.model().holds(u) ? s_.model().group(u, g).padded : 0;
    }

  protected:
    Strategy<T, G>& s_;
};

}  // namespace pv
