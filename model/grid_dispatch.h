// How a kernel's grid fills the GPU: how many of its blocks an SM holds at once (registers, shared
// memory, threads, the block limit), and how long the grid takes when its blocks are handed out in
// launch order, each to the first block slot that frees — as the GPU's block scheduler does. A grid
// of unequal blocks (causal attention's: the first query tile sees one key tile, the last all of
// them) ends in a tail in which fewer and fewer slots are busy; the instructions over the whole
// GPU's issue rate alone would miss it.
#pragma once

#include <cstddef>
#include <vector>

namespace pv {

// One SM's limits for resident blocks (CUDA C++ Programming Guide, "Technical Specifications per
// Compute Capability"); the defaults are compute capability 9.0's (H100).
struct SmLimits {
    int registers = 65536;
    size_t shared_bytes = 228 * 1024;            // per SM
    size_t shared_bytes_per_block = 227 * 1024;  // the most one block may opt in to
    size_t reserved_shared_per_block = 1024;     // taken by the runtime per block (8.0 and later)
    int threads = 2048;
    int blocks = 32;
};

// Blocks of `threads` threads using `registers` registers each and `shared` bytes of shared memory
// (static and dynamic) that one SM holds at once: the least that the registers (allocated per warp,
// a thread's rounded up to a multiple of 8), the shared memory, the threads and the block limit
// allow. 0 when one block cannot launch at all (more shared memory than a block may have, or more
// registers or threads than an SM has).
int resident_blocks(const SmLimits& sm, int threads, int registers, size_t shared);

// `blocks` consecutive blocks of a grid in launch order (blockIdx.x fastest, then y, then z), each
// issuing `work` warp instructions.
struct BlockRun {
    long long blocks = 0;
    double work = 0;
};

// How fast an SM issues a kernel's instructions: `rate` warp instructions a second while it holds
// at least `full_warps` warps of the kernel, and in proportion to its warps below that (each warp
// no faster than in the fullest SM the rate was measured at). Its blocks share the rate equally.
struct SmIssue {
    double rate = 0;
    int full_warps = 1;
};

// Seconds until a grid's last block ends on `sms` SMs that each hold up to `blocks_per_sm` of its
// blocks of `warps_per_block` warps. The first blocks are spread over the SMs in launch order (one
// to each SM, then a second to each, ...), and as a block ends the next in launch order takes its
// place on that SM, as the GPU's block scheduler does. So a grid of unequal blocks ends in a tail
// in which fewer and fewer SMs are busy, and a grid smaller than the SMs' slots runs as wide as it
// can. At least the total work over all SMs' rate, and at least the largest block at its SM's
// share.
double grid_seconds(const std::vector<BlockRun>& grid, int sms, int blocks_per_sm, int warps_per_block,
                    const SmIssue& sm);

}  // namespace pv
