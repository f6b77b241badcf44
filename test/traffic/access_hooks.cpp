// The callbacks GCC's -fsanitize=thread instrumentation calls before every memory access, routed to
// the host's traffic meter (host/access_meter.h) instead of ThreadSanitizer's runtime, which this
// binary does not link. ThreadSanitizer's instrumentation is used because it reports every read
// and every write as what it is (AddressSanitizer's drops a store's check when a load of the same
// address was checked before it: an in-place update would look read-only). Linked only into
// test_kernel_traffic; the atomics the instrumented code uses are performed here, for real.
#include "host/access_meter.h"

#include <cstddef>
#include <cstdint>

using pv::host::access_meter_record;

extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read1(void* p) { access_meter_record(p, 1, false); }
void __tsan_read2(void* p) { access_meter_record(p, 2, false); }
void __tsan_read4(void* p) { access_meter_record(p, 4, false); }
void __tsan_read8(void* p) { access_meter_record(p, 8, false); }
void __tsan_read16(void* p) { access_meter_record(p, 16, false); }
void __tsan_write1(void* p) { access_meter_record(p, 1, true); }
void __tsan_write2(void* p) { access_meter_record(p, 2, true); }
void __tsan_write4(void* p) { access_meter_record(p, 4, true); }
void __tsan_write8(void* p) { access_meter_record(p, 8, true); }
void __tsan_write16(void* p) { access_meter_record(p, 16, true); }
void __tsan_unaligned_read2(void* p) { access_meter_record(p, 2, false); }
void __tsan_unaligned_read4(void* p) { access_meter_record(p, 4, false); }
void __tsan_unaligned_read8(void* p) { access_meter_record(p, 8, false); }
void __tsan_unaligned_read16(void* p) { access_meter_record(p, 16, false); }
void __tsan_unaligned_write2(void* p) { access_meter_record(p, 2, true); }
void __tsan_unaligned_write4(void* p) { access_meter_record(p, 4, true); }
void __tsan_unaligned_write8(void* p) { access_meter_record(p, 8, true); }
void __tsan_unaligned_write16(void* p) { access_meter_record(p, 16, true); }
void __tsan_read_range(void* p, size_t n) { access_meter_record(p, n, false); }
void __tsan_write_range(void* p, size_t n) { access_meter_record(p, n, true); }

// Atomics (their memory-order argument is ignored: sequentially consistent is always correct).
int32_t __tsan_atomic32_fetch_add(volatile int32_t* a, int32_t v, int) {
    access_meter_record(const_cast<int32_t*>(a), 4, false);
    access_meter_record(const_cast<int32_t*>(a), 4, true);
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
int64_t __tsan_atomic64_fetch_add(volatile int64_t* a, int64_t v, int) {
    access_meter_record(const_cast<int64_t*>(a), 8, false);
    access_meter_record(const_cast<int64_t*>(a), 8, true);
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
int32_t __tsan_atomic32_load(const volatile int32_t* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }
int64_t __tsan_atomic64_load(const volatile int64_t* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }
void __tsan_atomic32_store(volatile int32_t* a, int32_t v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }
void __tsan_atomic64_store(volatile int64_t* a, int64_t v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }
int8_t __tsan_atomic8_load(const volatile int8_t* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }
void __tsan_atomic8_store(volatile int8_t* a, int8_t v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// Compare-and-swap (atomicMin and atomicMax on 64 bits are loops of it): a read, and a write when
// it succeeds.
int __tsan_atomic64_compare_exchange_weak(volatile int64_t* a, int64_t* expected, int64_t v, int, int) {
    access_meter_record(const_cast<int64_t*>(a), 8, false);
    const bool swapped = __atomic_compare_exchange_n(a, expected, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (swapped) access_meter_record(const_cast<int64_t*>(a), 8, true);
    return swapped;
}
int __tsan_atomic64_compare_exchange_strong(volatile int64_t* a, int64_t* expected, int64_t v, int, int) {
    access_meter_record(const_cast<int64_t*>(a), 8, false);
    const bool swapped = __atomic_compare_exchange_n(a, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (swapped) access_meter_record(const_cast<int64_t*>(a), 8, true);
    return swapped;
}
}
