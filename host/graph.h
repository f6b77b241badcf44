// Internal to host/: CUDA graphs by stream capture. Between cudaStreamBeginCapture and
// cudaStreamEndCapture the work submitted to a capturing stream (kernels, copies, memsets, GEMMs,
// collectives: everything goes through stream_submit) is recorded as nodes of a graph instead of
// run; cudaGraphLaunch runs the nodes later, as often as asked, each time reading the memory as it
// is then. Other streams join a capture by waiting on an event recorded in it, and must be joined
// back (the origin waits on an event recorded after their last node) before it ends.
//
// What CUDA forbids during a capture is refused here with CUDA's error, and the capture is
// invalidated where CUDA invalidates it (cudaStreamEndCapture then returns
// cudaErrorStreamCaptureInvalidated and no graph), so code that captures correctly on the host
// captures on a GPU: synchronising with or querying a capturing stream or a captured event, a copy
// to or from pageable memory on a capturing stream, waiting on an event recorded outside the
// capture (stricter than CUDA, which can take it as an external dependency with
// cudaEventWaitExternal), and, while a capture in cudaStreamCaptureModeGlobal or (from its own
// thread) ThreadLocal mode is active, the calls CUDA calls potentially unsafe: cudaMalloc,
// cudaFree, their host variants, cudaMemcpy, cudaMemset and cudaDeviceSynchronize. Using the legacy
// default stream while a blocking stream captures is refused too.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace pv::host {

// One recorded piece of stream work and the nodes it waits for (indices of earlier nodes).
struct GraphNode {
    std::function<void()> run;
    std::vector<int> deps;
};

// Work that must keep one process-wide order with other work of its kind: the host NCCL's, whose
// every piece runs after the one issued before it (host/nccl.cpp). A capture that records such
// work is marked with the function that orders a submission, and each launch of its graph is
// submitted through it, so a graph's collectives take their place in that order at each launch.
using OrderedSubmit = cudaError_t (*)(cudaStream_t stream, const std::function<cudaError_t()>& submit);

// A capture in progress: the nodes so far, the stream that began it and how strict it is.
struct Capture {
    unsigned long long id = 0;  // unique to this capture in the process, from 1
    std::vector<GraphNode> nodes;
    std::vector<cudaStream_t> streams;  // the stream that began it (first), then every one that joined
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;    // the thread that began it (ThreadLocal mode's scope)
    bool invalidated = false;  // an illegal call happened: EndCapture returns no graph
    bool ended = false;        // cudaStreamEndCapture ran: its events mark no work that will run
    OrderedSubmit order = nullptr;  // set when it records ordered work: its graph's launches go through it
};

// Whether `node` is `ancestor` or depends on it, directly or through other nodes.
bool depends_on(const std::vector<GraphNode>& nodes, int node, int ancestor);

// A graph of these nodes (cudaStreamEndCapture's result); `order`: the capture's (may be null).
cudaGraph_t make_graph(std::vector<GraphNode> nodes, OrderedSubmit order);

// The id of the capture `stream` takes part in, 0 if none; whether the capture `id` has not ended.
unsigned long long capture_id(cudaStream_t stream);
bool capture_is_active(unsigned long long id);
// Marks the capture `capturing` takes part in as recording ordered work (OrderedSubmit).
void order_capture_launches(cudaStream_t capturing, OrderedSubmit order);

// cudaSuccess, or the error a potentially unsafe call (cudaMalloc, cudaMemcpy, ...) gets while a
// capture forbids it; the forbidding captures are invalidated.
cudaError_t check_unsafe_call_during_capture();

}  // namespace pv::host
