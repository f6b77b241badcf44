// Internal to host/: how emulated CUDA work (kernels, copies, memsets, GEMMs, collectives) is
// put on a stream. Every piece of stream work goes through stream_submit, so the two execution
// modes of host/stream.cpp (sync: at the call; deferred: later, streams interleaved at random,
// POLEVAULT_HOST_STREAMS=deferred) apply to all of it.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace pv::host {

// Checks that `stream` is a live stream handle (or one of the default-stream handles).
bool stream_is_valid(cudaStream_t stream);

// Queues `work` on `stream`; it runs after everything submitted to that stream before it.
// The work must own (capture by value) whatever it reads later, and must not change it: on a
// capturing stream it becomes a graph node (host/graph.h), run once per cudaGraphLaunch.
// Returns what CUDA would: cudaSuccess, or a capture's error (the legacy stream used while a
// blocking stream captures).
cudaError_t stream_submit(cudaStream_t stream, std::function<void()> work);
// Queues `work` and returns once it has run (calls that are synchronous with the host:
// cudaMemcpy, copies to and from pageable memory); refused on a capturing stream.
cudaError_t stream_submit_and_wait(cudaStream_t stream, std::function<void()> work);
// cudaErrorStreamCaptureUnsupported, invalidating the capture, if `stream` is capturing: for work
// a graph cannot hold (a copy to or from pageable memory); cudaSuccess otherwise.
cudaError_t refuse_in_capture(cudaStream_t stream);
// Runs everything queued on every stream (cudaDeviceSynchronize).
void synchronize_all_streams();
// True in the deferred mode.
bool streams_are_deferred();

// Records `error` as the calling host thread's last CUDA error (what cudaGetLastError returns)
// and returns it, so callers can write `return set_last_error(cudaErrorInvalidValue);`.
cudaError_t set_last_error(cudaError_t error);

// The memory registry: true if [p, p + bytes) lies inside one cudaMalloc allocation / one
// cudaMallocHost allocation.
bool is_device_range(const void* p, size_t bytes);
bool is_pinned_range(const void* p, size_t bytes);

// In the ASan build device memory is poisoned while host code runs, so a host dereference of a
// device pointer is reported; stream work (kernels, copies, GEMMs, collectives) runs inside this
// scope, which makes device memory accessible. Elsewhere it does nothing.
class DeviceMemoryAccess {
  public:
    DeviceMemoryAccess();
    ~DeviceMemoryAccess();
    DeviceMemoryAccess(const DeviceMemoryAccess&) = delete;
    DeviceMemoryAccess& operator=(const DeviceMemoryAccess&) = delete;
};

}  // namespace pv::host
