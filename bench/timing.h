// Timing for benchmarks: seconds per call of a body of stream work, measured with CUDA events
// (device time on a GPU, wall time of the emulation on the host) after one warm-up call that
// pays for first touches of buffers, worker start-up and fiber stacks.
#pragma once

#include "platform/platform.h"

namespace pv::bench {

template <class F>
double seconds_per_call(int repeats, F&& body) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    body();
    CUDA_CHECK(cudaEventRecord(start, nullptr));
    for (int i = 0; i < repeats; ++i) body();
    CUDA_CHECK(cudaEventRecord(stop, nullptr));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return double(ms) * 1e-3 / repeats;
}

}  // namespace pv::bench
