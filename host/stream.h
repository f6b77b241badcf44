// Internal to host/: how emulated CUDA work (kernels, copies, memsets, events, GEMMs,
// collectives) is put on a stream.
//
// Today every stream executes its work synchronously, at the call: the simplest model that is
// still a correct CUDA program order. The deferred mode (work runs later on an executor,
// independent streams interleaved in a seeded random order honouring events) plugs in here
// without touching any caller, because every piece of stream work goes through stream_submit.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace pv::host {

// Checks that `stream` is a live stream handle (or one of the default-stream handles).
bool stream_is_valid(cudaStream_t stream);

// Queues `work` on `stream`; it runs after everything submitted to that stream before it.
// The work must own (capture by value) whatever it reads later.
void stream_submit(cudaStream_t stream, std::function<void()> work);

// Records `error` as the calling host thread's last CUDA error (what cudaGetLastError returns)
// and returns it, so callers can write `return set_last_error(cudaErrorInvalidValue);`.
cudaError_t set_last_error(cudaError_t error);

// The device memory registry: true if [p, p + bytes) lies inside one cudaMalloc allocation.
bool is_device_range(const void* p, size_t bytes);

}  // namespace pv::host
