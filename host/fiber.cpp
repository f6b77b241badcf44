// Fibers for the host platform: stacks, the initial frame, and sanitizer-aware switching.
#include "host/fiber.h"

#include "host/sanitizer_hooks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

extern "C" void pv_fiber_switch(void** save_sp, void* load_sp);
extern "C" void pv_fiber_trampoline();

namespace pv::host {

size_t fiber_stack_bytes() {
    static const size_t bytes = [] {
#if defined(__SANITIZE_ADDRESS__)
        size_t kb = 1024;
#else
        size_t kb = 256;
#endif
        if (const char* env = std::getenv("POLEVAULT_HOST_STACK_KB")) kb = std::strtoull(env, nullptr, 10);
        if (kb < 16) kb = 16;
        return kb * 1024;
    }();
    return bytes;
}

namespace {

// Returns a stack (and its guard page) to the system. A fiber that ends switches away for good
// from inside its entry function, so that frame's ASan redzones stay poisoned in the shadow;
// munmap does not clear the shadow, and the next mapping at that address (libbacktrace's, when
// LeakSanitizer symbolises at exit) would read as poisoned: ASan then reports an error from
// inside its own symbolizer and deadlocks on the symbolizer's lock. So the stack is unpoisoned first.
void unmap_stack(const FiberStack& s) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(s.base, s.size);
#endif
    munmap(s.base - page, s.size + page);
}

}  // namespace

StackPool::StackPool(size_t stack_bytes) : stack_bytes_(stack_bytes) {}

StackPool::~StackPool() {
    for (const FiberStack& s : all_) unmap_stack(s);
}

void StackPool::release(FiberStack stack) {
    if constexpr (kThreadSanitizer) {
        unmap_stack(stack);
        std::erase_if(all_, [&](const FiberStack& s) { return s.base == stack.base; });
    } else {
        free_.push_back(stack);
    }
}

FiberStack StackPool::acquire() {
    if (!free_.empty()) {
        FiberStack s = free_.back();
        free_.pop_back();
        return s;
    }
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t size = (stack_bytes_ + page - 1) / page * page;
    void* mem = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        std::fprintf(stderr, "polevault host: cannot map a %zu-byte fiber stack (too many threads alive?)\n", size);
        std::abort();
    }
    mprotect(mem, page, PROT_NONE);  // guard page below the stack: overflow faults
    FiberStack s{static_cast<char*>(mem) + page, size};
    all_.push_back(s);
    return s;
}

void fiber_prepare(FiberContext& context, FiberStack stack, void (*entry)(void*), void* arg) {
    // The initial frame pv_fiber_switch pops (layout in fiber_switch.S); the top is 16-aligned
    // so the trampoline's call leaves the entry function ABI-aligned.
    auto top = (reinterpret_cast<uintptr_t>(stack.base + stack.size)) & ~uintptr_t(15);
    // Seven slots (r15, r14, r13, r12, rbx, rbp, resume address) placed so that after they are
    // popped rsp is 16-aligned again (top - 16), as the trampoline's call requires.
    auto* frame = reinterpret_cast<uint64_t*>(top) - 9;
    for (int i = 0; i < 9; ++i) frame[i] = 0;
    frame[2] = reinterpret_cast<uint64_t>(entry);  // r13
    frame[3] = reinterpret_cast<uint64_t>(arg);    // r12
    frame[6] = reinterpret_cast<uint64_t>(&pv_fiber_trampoline);
    context.sp = frame;
    context.stack_bottom = stack.base;
    context.stack_size = stack.size;
    context.asan_fake_stack = nullptr;
}

void switch_to(FiberContext& from, FiberContext& to, bool leaving_for_good) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(leaving_for_good ? nullptr : &from.asan_fake_stack, to.stack_bottom, to.stack_size);
#else
    (void)leaving_for_good;
#endif
#if defined(POLEVAULT_TSAN)
    // Without synchronisation: the platform states CUDA's happens-before edges itself.
    __tsan_switch_to_fiber(to.tsan_fiber, 1 /* __tsan_switch_to_fiber_no_sync */);
#endif
    pv_fiber_switch(&from.sp, to.sp);
#if defined(__SANITIZE_ADDRESS__)
    // Back in `from`. Only fibers and their worker's scheduler switch to each other, so the
    // context we came from is known to the caller; ASan needs its own handle restored.
    __sanitizer_finish_switch_fiber(from.asan_fake_stack, nullptr, nullptr);
#endif
}

void fiber_started(FiberContext& scheduler) {
#if defined(__SANITIZE_ADDRESS__)
    // The stack we came from is the worker's own: remember its bounds for switching back.
    __sanitizer_finish_switch_fiber(nullptr, &scheduler.stack_bottom, &scheduler.stack_size);
#else
    (void)scheduler;
#endif
}

}  // namespace pv::host
