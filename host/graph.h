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

// A capture in progress: the nodes so far, the stream that began it and how strict it is.
struct Capture {
    std::vector<GraphNode> nodes;
    std::vector<cudaStream_t> streams;  // the stream that began it (first), then every one that joined
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;    // the thread that began it (ThreadLocal mode's scope)
    bool invalidated = false;  // an illegal call happened: EndCapture returns no graph
    bool ended = false;        // cudaStreamEndCapture ran: its events mark no work that will run
};

// Whether `node` is `ancestor` or depends on it, directly or through other nodes.
bool depends_on(const std::vector<GraphNode>& nodes, int node, int ancestor);

// A graph of these nodes (cudaStreamEndCapture's result).
cudaGraph_t make_graph(std::vector<GraphNode> nodes);

// cudaSuccess, or the error a potentially unsafe call (cudaMalloc, cudaMemcpy, ...) gets while a
// capture forbids it; the forbidding captures are invalidated.
cudaError_t check_unsafe_call_during_capture();

}  // namespace pv::host
