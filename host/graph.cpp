// CUDA graphs on the host (host/graph.h): what a capture recorded, instantiated and launched.
// A launch is one piece of work on the launching stream (after the stream's earlier work, before
// its later work, as CUDA orders it) that runs the graph's nodes in an order their dependencies
// allow: the order they were recorded in, or, with the deferred streams
// (POLEVAULT_HOST_STREAMS=deferred or bursts), a random one drawn per launch from the schedule's
// seed, so a node that reads what a node it does not wait for writes gives wrong answers here, as
// the GPU's concurrent branches would. A graph holding ordered work (host/graph.h OrderedSubmit:
// collectives) is submitted through its order, after the ordered work issued before the launch.
#include "host/graph.h"

#include "host/schedule.h"
#include "host/stream.h"

#include <atomic>
#include <cstdint>

struct CUgraph_st {
    std::vector<pv::host::GraphNode> nodes;
    pv::host::OrderedSubmit order = nullptr;
};

struct CUgraphExec_st {
    std::shared_ptr<const std::vector<pv::host::GraphNode>> nodes;  // shared with queued launches
    pv::host::OrderedSubmit order = nullptr;  // the graph holds ordered work: launches go through it
};

namespace pv::host {

bool depends_on(const std::vector<GraphNode>& nodes, int node, int ancestor) {
    std::vector<bool> seen(nodes.size());
    std::vector<int> todo{node};
    while (!todo.empty()) {
        const int n = todo.back();
        todo.pop_back();
        if (n == ancestor) return true;
        if (n < ancestor || seen[size_t(n)]) continue;  // dependencies point to earlier nodes
        seen[size_t(n)] = true;
        todo.insert(todo.end(), nodes[size_t(n)].deps.begin(), nodes[size_t(n)].deps.end());
    }
    return false;
}

cudaGraph_t make_graph(std::vector<GraphNode> nodes, OrderedSubmit order) {
    return new CUgraph_st{std::move(nodes), order};
}

namespace {

// Runs every node once, each after the nodes it waits for; among the ready ones the earliest
// recorded, or (deferred streams) one drawn from `rng`.
void run_nodes(const std::vector<GraphNode>& nodes, Rng* rng) {
    std::vector<int> waiting(nodes.size());
    std::vector<std::vector<int>> dependents(nodes.size());
    std::vector<int> ready;
    for (size_t i = 0; i < nodes.size(); ++i) {
        waiting[i] = int(nodes[i].deps.size());
        for (int d : nodes[i].deps) dependents[size_t(d)].push_back(int(i));
        if (waiting[i] == 0) ready.push_back(int(i));
    }
    while (!ready.empty()) {
        size_t pick = 0;
        if (rng) {
            pick = size_t(rng->below(ready.size()));
        } else {
            for (size_t i = 1; i < ready.size(); ++i)
                if (ready[i] < ready[pick]) pick = i;
        }
        const int n = ready[pick];
        ready.erase(ready.begin() + long(pick));
        nodes[size_t(n)].run();
        for (int d : dependents[size_t(n)])
            if (--waiting[size_t(d)] == 0) ready.push_back(d);
    }
}

}  // namespace
}  // namespace pv::host

using namespace pv::host;

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
    if (!exec || !graph || flags != 0) return set_last_error(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{std::make_shared<const std::vector<GraphNode>>(graph->nodes), graph->order};
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec) return set_last_error(cudaErrorInvalidValue);
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    static std::atomic<uint64_t> launches{0};
    const uint64_t seed = mix_seed(schedule().seed, 0x4752415048ull, launches.fetch_add(1));  // "GRAPH"
    const bool shuffled = streams_are_deferred();
    const auto submit = [&] {
        return stream_submit(stream, [nodes = exec->nodes, seed, shuffled] {
            Rng rng(seed);
            run_nodes(*nodes, shuffled ? &rng : nullptr);
        });
    };
    const cudaError_t e = exec->order ? exec->order(stream, submit) : submit();
    return e == cudaSuccess ? cudaSuccess : set_last_error(e);
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    if (!exec) return set_last_error(cudaErrorInvalidValue);
    delete exec;  // a queued launch holds its own reference to the nodes
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    if (!graph) return set_last_error(cudaErrorInvalidValue);
    delete graph;
    return cudaSuccess;
}

// The number of nodes (nodes == nullptr); the nodes themselves are not exposed.
extern "C" cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
    if (!graph || !count) return set_last_error(cudaErrorInvalidValue);
    if (nodes) return set_last_error(cudaErrorNotSupported);
    *count = graph->nodes.size();
    return cudaSuccess;
}
