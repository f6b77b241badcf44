// Captured micro-steps (--cuda-graphs): a step's micro-steps — each a forward and a
// backward, hundreds to thousands of kernel and GEMM launches — captured once each as a CUDA graph
// by stream capture and from then on launched as one graph, so the host pays a launch per
// micro-step instead of one per kernel.
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
//   the step's last, and whether the micro-batch has document positions.
// - The host state a micro-step changes — which units' gradients the next backward writes over
//   (Llama::discarded_grads) — is saved after the capture and set again after each launch, as
//   the eager micro-step would have left it; a launch from another state than its capture's is
//   refused (it would replay the wrong gradient writes).
//
// Only a micro-step that communicates nothing and binds no buffer per unit on the host can be
// captured this way (Strategy::micro_step_capturable): every micro-step of --parallel single, and
// of ddp and zero1 every one but a step's last, whose backward all-reduces or reduce-scatters the
// gradients (that one runs eagerly, after the captured ones, on the same stream).
#pragma once

#include "model/llama.h"
#include "platform/platform.h"

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

struct MicroStepKey {
    int micro = 0;           // the micro-step's index in the optimizer step
    bool last = false;       // the step's last micro-step
    bool positions = false;  // the micro-batch has document positions (document masking)
    auto operator<=>(const MicroStepKey&) const = default;
};

template <class T>
class MicroStepGraphs {
  public:
    explicit MicroStepGraphs(Llama<T>& model) : model_(model) {}
    ~MicroStepGraphs() { destroy_all(); }
    MicroStepGraphs(const MicroStepGraphs&) = delete;
    MicroStepGraphs& operator=(const MicroStepGraphs&) = delete;

    // Queues the micro-step `key` on the model's stream: `work` queues it (forward and backward);
    // the first time for this key it is captured rather than run, then launched.
    void run(const MicroStepKey& key, const std::function<void()>& work) {
        const std::vector<bool> before = model_.discarded_grads();
        auto it = graphs_.find(key);
        if (it == graphs_.end())
            it = graphs_.emplace(key, capture(work, before)).first;
        else if (it->second.before != before)
            throw std::logic_error("micro-step " + std::to_string(key.micro) +
                                   "'s graph was captured with other gradients to write over than now: it would "
                                   "replay the wrong writes");
        CUDA_CHECK(cudaGraphLaunch(it->second.exec, model_.stream()));
        model_.set_discarded_grads(it->second.after);
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
    // Nodes (kernels, GEMMs, copies, memsets) of the largest graph: what one launch replaces.
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
    };

    // Thread-local capture: the calls this thread makes while capturing must be capturable (no
    // allocation, synchronisation or pageable copy); other threads (an offload pool) are not part of it.
    Graph capture(const std::function<void()>& work, const std::vector<bool>& before) {
        cudaStream_t stream = model_.stream();
        Graph g;
        g.before = before;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        try {
            work();
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
        return g;
    }

    Llama<T>& model_;
    std::map<MicroStepKey, Graph> graphs_;
    size_t recaptured_ = 0;  // graphs cleared (captured before)
    long long launches_ = 0;
};

}  // namespace pv
