// Device-memory traffic per kernel launch, measured on the host: the bytes of device memory a
// launch reads and writes, each byte counted once however often it is touched. That is the
// traffic a GPU has between its DRAM and the chip when every byte crosses once (reuse served by
// L2 and shared memory), the quantity the performance model (model/kernel_cost.h) predicts, so a
// test can hold each prediction against what the kernel's code really touches.
//
// How the accesses are seen: a translation unit compiled with GCC's -fsanitize=thread calls
// __tsan_read{1,2,4,8,16}(address) / __tsan_write...(address) before every memory access it makes;
// linked without ThreadSanitizer's runtime, the callbacks are ours (test/traffic/access_hooks.cpp,
// forwarding to access_meter_record). Only code compiled that way is seen: the kernels
// instantiated in that translation unit. The platform's own device-memory operations (memset,
// copies) are not instrumented; they report themselves through access_meter_platform_op.
//
// While the meter runs it holds, for every device allocation live when it started, one bit per
// byte read and one per byte written (set with atomic ORs: blocks run on several workers). After
// each launch it counts and clears them into a LaunchTraffic. A read of a byte the launch has
// already written is not counted as read: it is served from the cache the write went to (a
// kernel reading back its own output, as a fused residual add + RMSNorm does). Accesses outside those allocations
// (kernel arguments, the stack, shared memory, host buffers) are not device traffic and are
// ignored. Allocations made while the meter runs are not metered: allocate first.
//
// Host backend only, and only for programs linked with the callbacks (test_kernel_traffic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pv::host {

struct LaunchTraffic {
    std::string kernel;           // the kernel's demangled name, or "memset" / "memcpy"
    uint64_t read_bytes = 0;      // distinct device bytes read
    uint64_t written_bytes = 0;   // distinct device bytes written
    uint64_t accessed_bytes = 0;  // every device access's size summed (re-reads included: cache traffic)
};

// Starts metering every launch executed from now on (throws std::logic_error if it already runs).
void access_meter_start();
// Stops and returns one record per launch and platform operation, in execution order.
std::vector<LaunchTraffic> access_meter_stop();
bool access_meter_running();

// The instrumentation callbacks' entry: `bytes` at `p`, a write or a read.
void access_meter_record(const void* p, size_t bytes, bool write);
// Called around each kernel launch's execution (host/launch.cpp).
void access_meter_launch_begin();
void access_meter_launch_end(const void* kernel);
// A platform operation on device memory (memset, copies): `read`/`written` may be null or host memory.
void access_meter_platform_op(const char* name, const void* read, size_t read_bytes, const void* written,
                              size_t written_bytes);

// The device allocations live now (start, bytes): host/runtime.cpp's registry.
std::vector<std::pair<const void*, size_t>> device_allocations();

}  // namespace pv::host
