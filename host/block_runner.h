// Runs one block of a kernel launch on the calling worker thread: the block's threads as fibers,
// switched at __syncthreads and warp collectives, with the diagnostics a GPU cannot give
// (a barrier that can never complete, a collective whose mask names an exited lane, a shuffle
// reading a lane outside its mask, ...). Each diagnostic aborts the process with a message naming
// the kernel, the block, the threads and the source lines involved.
#pragma once

#include "host/device_api.h"

namespace pv::host {

// `linear_block` is the block's index in x-fastest order (it keys the schedule's random choices).
void run_block(const KernelLaunch& launch, uint3 block_idx, size_t linear_block);

// The kernel's name for messages (its symbol, demangled; the address if it has none).
std::string kernel_name(const void* kernel);

}  // namespace pv::host
