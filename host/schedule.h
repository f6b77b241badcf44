// The order in which the host platform runs a block's threads and a grid's blocks.
//
// On a GPU, threads and blocks run in an order nobody controls, and a kernel that is only right
// in one order fails rarely and elsewhere. Here the order is chosen, and chosen adversarially:
//
//   POLEVAULT_HOST_THREAD_ORDER  in-order (default) | reverse | random | warp-greedy
//   POLEVAULT_HOST_BLOCK_ORDER   in-order (default) | reverse | random
//   POLEVAULT_HOST_SEED          seed of the random orders (default 1)
//
// Threads are resumed in passes (a thread runs until it exits or waits at a barrier or warp
// collective). `random` draws a new permutation for every pass; `warp-greedy` picks warps in a
// random order and runs each as far as it can before the next starts: it turns a missing
// trailing barrier (a write-after-read hazard) into wrong output. Block orders permute the
// linear block index the workers take. Every random choice is a function of (seed, launch
// number, block index), so a failure reproduces with the same variables.
#pragma once

#include <cstdint>
#include <string>

namespace pv::host {

enum class ThreadOrder { in_order, reverse, random, warp_greedy };
enum class BlockOrder { in_order, reverse, random };

struct Schedule {
    ThreadOrder threads = ThreadOrder::in_order;
    BlockOrder blocks = BlockOrder::in_order;
    uint64_t seed = 1;
};

// The schedule from the environment, read once; an unknown value aborts naming the valid ones.
const Schedule& schedule();
std::string describe(const Schedule& s);

// A well-mixed 64-bit hash of its arguments (splitmix64 steps), for seeding per-block choices.
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0);

// A small, fast generator for permutations (xorshift64*).
struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed) : state(seed ? seed : 0x9E3779B97F4A7C15ull) {}
    uint64_t next() {
        state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
        return state * 0x2545F4914F6CDD1Dull;
    }
    // Uniform in [0, n), from the high bits (xorshift64*'s low bits are its weakest).
    uint64_t below(uint64_t n) { return uint64_t((static_cast<unsigned __int128>(next()) * n) >> 64); }
};

// Fisher-Yates shuffle of [first, first + n).
template <class T>
void shuffle(T* first, size_t n, Rng& rng) {
    for (size_t i = n; i > 1; --i) {
        const size_t j = size_t(rng.below(i));
        T tmp = first[i - 1];
        first[i - 1] = first[j];
        first[j] = tmp;
    }
}

}  // namespace pv::host
