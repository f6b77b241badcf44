// The stream a training run computes on: created by the run (not the legacy default stream), so
// that it is never implicitly serialised with other work and the communication stream
// (parallel/comm.h, created at a higher priority) can overlap it. Being non-blocking, it is also
// not ordered with the synchronous cudaMemcpy calls of loading and checkpointing: whoever reads
// or writes device memory outside the stream waits for it first (the trainer's step ends with a
// stream synchronisation; the optimizer's construction too).
#pragma once

#include "platform/platform.h"

namespace pv {

class ComputeStream {
  public:
    ComputeStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
    ~ComputeStream() {
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
    }
    ComputeStream(const ComputeStream&) = delete;
    ComputeStream& operator=(const ComputeStream&) = delete;
    cudaStream_t get() const { return stream_; }

  private:
    cudaStream_t stream_ = nullptr;
};

}  // namespace pv
