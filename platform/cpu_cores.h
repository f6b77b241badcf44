// The CPU cores one rank may use, for the two places that run work on host threads: the host
// backend's block workers (host/launch.cpp) and the trainer's CPU work (optim/thread_pool.h).
// Host code, either backend.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace pv {

// The machine's cores shared among the ranks Open MPI started on this node
// (OMPI_COMM_WORLD_LOCAL_SIZE), at least 1; the environment variable `override_env` instead when
// it holds a positive number.
inline int cpu_cores_per_rank(const char* override_env) {
    if (const char* env = std::getenv(override_env)) {
        const long n = std::strtol(env, nullptr, 10);
        if (n >= 1) return int(n);
    }
    const long cores = std::max(1u, std::thread::hardware_concurrency());
    long local_ranks = 1;
    if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
        local_ranks = std::max(1L, std::strtol(env, nullptr, 10));
    return int(std::max(1L, cores / local_ranks));
}

}  // namespace pv
