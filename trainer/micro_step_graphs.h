// Captured micro-steps (--cuda-graphs): a step's micro-steps — each a forward and a
// backward, hundreds to thousands of kernel, GEMM and collective launches — captured once each as a
// CUDA graph by stream capture and from then on launched as one graph, so the host pays a launch
// per micro-step instead of one per kernel. Under a pipeline each entry of this rank's row of the
// schedule (a chunk's forward or backward of one micro-batch) is captured alone, with the
// transfers the table puts before it (parallel/pp.h): a forward's backward runs entries later, in
// another round of transfers.
//
// A graph replays the work it captured with the arguments it captured, so what may differ between
// its launches is kept out of it or read from device memory:
// - The micro-batch's upload (a copy from a pinned staging buffer the host fills and reuses behind
//   an event) runs before the launch, into the slot's fixed device buffers.
// - The step's loss scale and the micro-batch's dropout keys (its first global row and the step)
//   are written to device memory before the launch and read there by the kernels (DeviceScalar,
//   DeviceBatch::dropout_keys), never baked in as arguments.
// - What the host decides per micro-step is the key: the micro-step's index in the step (the first
//   backward writes the gradients over, the others add; each has its own loss slot), whether it is
//   the step's last (ddp all-reduces the gradients then, zero1 reduce-scatters them, hybrid
//   sharding all-reduces the slices over the replicas), whether the micro-batch has document
//   positions, and the strategy's host state (which unit each of zero2's and zero3's rotating
//   gradient buffers held last, which decides whether a buffer is zeroed; a pipeline's place in
//   its row and which residual-gradient buffers it sends from and receives into: Strategy::
//   micro_step_state).
// - The host state a micro-step changes — which units' gradients the next backward writes over
//   (Llama::discarded_grads), and the strategy's — is saved after the capture and set again after
//   each launch, as the eager micro-step would have left it; a launch from another model state than
//   its capture's is refused (it would replay the wrong gradient writes).
// Collectives are captured with the kernels (NCCL 2.9 and later captures; so does the host's,
// host/nccl.cpp) and run at each launch. NCCL asks that whether an operation is captured be the
// same on every rank taking part, and that each launch be of the graph made by that capture: every
// step starts from the same host state (the model's, the gradient part's: RotatingGradients::
// begin_step, the pipeline's: Pipeline::run_micro_steps), so every rank captures each of its graphs
// in the first step and launches those from then on. The strategy brackets each micro-step (Strategy::
// before_micro_step, begin_micro_step, end_micro_step) so that a capture waits for no event
// recorded outside it and joins its comm streams back before it ends; each communicator's record
// gets the captured calls again at each later launch (Comm::repeat), so per-step figures and the
// ranks' per-step check count every collective that ran, and each launch holding a communicator's
// collectives is one tracked collective for the stall watchdog (Comm::tracked_launch).
#pragma once

#include "model/llama.h"
#include "parallel/strategy.h"
#include "platform/platform.h"

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

struct MicroStepKey {
    int micro = 0;           // the micro-batch's index in the optimizer step
    bool last = false;       // the step's last backward (a pipeline's: of this rank's chunk)
    bool positions = false;  // the micro-batch has document positions (document masking)
    bool backward = true;    // holds a backward (a pipeline's forward entries are captured alone)
    std::vector<int> state;  // Strategy::micro_step_state before it (a pipeline's: the entry's place)
    auto operator<=>(const MicroStepKey&) const = default;
};

template <class T, class G>
class MicroStepGraphs {
  public:
    explicit MicroStepGraphs(Strategy<T, G>& s) : s_(s), model_(s.model()) {}
    ~MicroStepGraphs() { destroy_all(); }
    MicroStepGraphs(const MicroStepGraphs&) = delete;
    MicroStepGraphs& operator=(const MicroStepGraphs&) = delete;

    // Queues the micro-step `key` (its state filled in here) on the model's stream: `work` queues
    // it (forward and backward); the first time for this key it is captured rather than run, then
    // launched.
    void run(MicroStepKey key, const std::function<void()>& work) {
        s_.before_micro_step();
        key.state = s_.micro_step_state();
        const std::vector<bool> before = model_.discarded_grads();
        auto it = graphs_.find(key);
        const bool fresh = it == graphs_.end();
        if (fresh)
            it = graphs_.emplace(key, capture(work, before)).first;
        else if (it->second.before != before)
            throw std::logic_error("micro-step " + std::to_string(key.micro) +
                                   "'s graph was captured with other gradients to write over than now: it would "
                                   "replay the wrong writes");
        Graph& g = it->second;
        launch(g, 0);
        if (!fresh)  // the capture recorded its calls once, for this first launch
            for (size_t c = 0; c < g.calls.size(); ++c) g.comms[c]->repeat(g.calls[c]);
        model_.set_discarded_grads(g.after);
        s_.set_micro_step_state(g.state_after);
        ++launches_;
    }

    // Forgets every graph (a buffer one was captured with has moved): the next run of each key
    // captures again. The model's stream has finished with them by then or runs them in order.
    void clear() {
        recaptured_ += graphs_.size();
        destroy_all();
    }

    size_t captured() const { return graphs_.size() + recaptured_; }
    long long launches() const { return launches_; }
    // Nodes (kernels, GEMMs, collectives, copies, memsets) of the largest graph: what one launch replaces.
    size_t largest_nodes() const {
        size_t most = 0;
        for (const auto& [key, g] : graphs_) {
            size_t n = 0;
            CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &n));
            most = std::max(most, n);
        }
        return most;
    }

  private:
    void destroy_all() {  // (no throwing: the destructor calls it)
        for (auto& [key, g] : graphs_) {
            cudaGraphExecDestroy(g.exec);
            cudaGraphDestroy(g.graph);
        }
        graphs_.clear();
    }
    struct Graph {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        std::vector<bool> before, after;  // Llama::discarded_grads before and after the captured micro-step
        std::vector<int> state_after;     // Strategy::micro_step_state after it
        std::vector<Comm*> comms;         // the communicators whose collectives it holds
        std::vector<Comm::Calls> calls;   // and what they added to each one's record
    };

    // Launches g, bracketed by one tracked collective per communicator it holds (from the k-th on).
    void launch(const Graph& g, size_t k) {
        if (k < g.comms.size()) return g.comms[k]->tracked_launch(model_.stream(), [&] { launch(g, k + 1); });
        CUDA_CHECK(cudaGraphLaunch(g.exec, model_.stream()));
    }

    // Thread-local capture: the calls this thread makes while capturing must be capturable (no
    // allocation, synchronisation or pageable copy); other threads (an offload pool) are not part of it.
    Graph capture(const std::function<void()>& work, const std::vector<bool>& before) {
        cudaStream_t stream = model_.stream();
        Graph g;
        g.before = before;
        const std::vector<Comm*> comms = s_.comms();
        std::vector<Comm::Mark> marks;
        for (Comm* c : comms) marks.push_back(c->mark());
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        try {
            s_.begin_micro_step();
            work();
            s_.end_micro_step();
        } catch (...) {
            cudaGraph_t partial = nullptr;
            cudaStreamEndCapture(stream, &partial);  // ends the capture, whatever its state
            if (partial) cudaGraphDestroy(partial);
            throw;
        }
        CUDA_CHECK(cudaStreamEndCapture(stream, &g.graph));
        if (cudaGraphInstantiate(&g.exec, g.graph, 0) != cudaSuccess) {
            cudaGraphDestroy(g.graph);
            throw std::runtime_error("--cuda-graphs: a captured micro-step could not be instantiated as a graph");
        }
        g.after = model_.discarded_grads();
        g.state_after = s_.micro_step_state();
        for (size_t c = 0; c < comms.size(); ++c) {
            Comm::Calls calls = comms[c]->calls_since(marks[c]);
            const auto& n = calls.totals.calls;
            if (std::any_of(n.begin(), n.end(), [](long long k) { return k > 0; }))
                g.comms.push_back(comms[c]), g.calls.push_back(std::move(calls));
        }
        return g;
    }

    Strategy<T, G>& s_;
    Llama<T>& model_;
    std::map<MicroStepKey, Graph> graphs_;
    size_t recaptured_ = 0;  // graphs cleared (captured before)
    long long launches_ = 0;
};

}  // namespace pv
