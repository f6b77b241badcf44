// Fibers: user-space execution contexts with their own stacks, switched by a few instructions
// (host/fiber_switch.S, ~5 ns) instead of swapcontext's syscall (~190 ns). Each emulated CUDA
// thread runs on a fiber; the worker's own stack is the scheduler's context.
//
// Sanitizers must be told about every stack switch, or ASan reports false stack overflows and
// loses track of fake stacks; switch_to() does that in one place (and is where ThreadSanitizer's
// fiber hooks go).
#pragma once

#include <cstddef>
#include <vector>

namespace pv::host {

// A fiber stack: mmapped with MAP_NORESERVE (only touched pages cost memory) under a PROT_NONE
// guard page, so an overflow faults instead of corrupting a neighbour.
struct FiberStack {
    char* base = nullptr;  // lowest usable address
    size_t size = 0;
};

// A suspended or runnable context.
struct FiberContext {
    void* sp = nullptr;                  // saved stack pointer while not running
    const void* stack_bottom = nullptr;  // for the sanitizers (nullptr: a worker's own stack)
    size_t stack_size = 0;
    void* asan_fake_stack = nullptr;  // ASan's per-context fake stack handle
    void* tsan_fiber = nullptr;       // TSan's context for it (TSan build only)
};

// Reuses stacks of threads that have finished: a barrier-free kernel needs only one stack per
// worker, however many threads it has. Under ThreadSanitizer stacks are unmapped instead: TSan
// forgets an unmapped range, where reusing it would make one emulated thread's stack frames look
// like a race with the next one's (or, with a happens-before edge to prevent that, hide real
// races between them).
class StackPool {
  public:
    explicit StackPool(size_t stack_bytes);
    ~StackPool();
    StackPool(const StackPool&) = delete;
    StackPool& operator=(const StackPool&) = delete;
    FiberStack acquire();
    void release(FiberStack stack);

  private:
    size_t stack_bytes_;
    std::vector<FiberStack> free_;
    std::vector<FiberStack> all_;
};

// Prepares `context` to start `entry(arg)` on `stack` at its first switch_to. `entry` must
// never return: it ends by switching away for good (switch_to with `leaving_for_good`).
void fiber_prepare(FiberContext& context, FiberStack stack, void (*entry)(void*), void* arg);

// Suspends `from` (the running context) and resumes `to`. Returns when something switches
// back to `from`. `leaving_for_good` tells the sanitizers that `from` will never run again.
void switch_to(FiberContext& from, FiberContext& to, bool leaving_for_good = false);

// Must be the first call of a fiber's entry function (completes the sanitizers' switch).
void fiber_started(FiberContext& scheduler);

// Stack size of emulated threads: POLEVAULT_HOST_STACK_KB, default 256 KiB (1 MiB under ASan,
// whose redzones grow frames).
size_t fiber_stack_bytes();

}  // namespace pv::host
