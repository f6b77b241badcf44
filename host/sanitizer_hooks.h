// Happens-before annotations for ThreadSanitizer, in one place.
//
// In the TSan build (make test-tsan, which defines POLEVAULT_TSAN) kernels and tests are
// instrumented but host/ is not: the platform's bookkeeping (fiber switches, the scheduler's
// state, the worker pool's hand-offs) must not create happens-before edges CUDA does not
// promise. So host/ states the edges CUDA does promise explicitly, with these calls: barrier
// arrival -> departure, warp-barrier arrival -> departure, launch -> block start, thread exit
// -> kernel end, stream submission -> execution -> whoever waits. Elsewhere they compile to nothing.
#pragma once

#if defined(POLEVAULT_TSAN)
extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, const char* name);
}
#endif

namespace pv::host {

#if defined(POLEVAULT_TSAN)
inline constexpr bool kThreadSanitizer = true;
inline void tsan_acquire(const void* token) { __tsan_acquire(const_cast<void*>(token)); }
inline void tsan_release(const void* token) { __tsan_release(const_cast<void*>(token)); }
#else
inline constexpr bool kThreadSanitizer = false;
inline void tsan_acquire(const void*) {}
inline void tsan_release(const void*) {}
#endif

}  // namespace pv::host
