// The CUDA runtime subset polevault uses, on the CPU, with NVIDIA's signatures.
//
// Memory. cudaMalloc is posix_memalign of exactly the requested size (so AddressSanitizer's
// redzone begins at the first byte past it and an off-by-one kernel write is reported) filled
// with 0xFF bytes (so reading memory nobody wrote gives NaN in every floating type). A registry
// of live allocations lets copies check their direction and bounds, as a debugging GPU
// runtime would, and lets cudaFree reject pointers it never returned.
//
// Copies and memsets go through the streams of host/stream.cpp, with CUDA's rules for what is
// synchronous with the host: cudaMemcpy/cudaMemset always; cudaMemcpyAsync from pageable memory
// returns once the source is staged (here: snapshotted), to pageable memory once the copy is done.
#include "host/access_meter.h"
#include "host/device_profile.h"
#include "host/graph.h"
#include "host/stream.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <memory>
#include <vector>

namespace pv::host {
namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

enum class AllocKind { device, pinned_host };
struct Allocation {
    size_t bytes;
    AllocKind kind;
    bool registered = false;  // pinned by cudaHostRegister: the caller's memory, not freed here
};

std::mutex registry_mutex;
std::map<const char*, Allocation> allocations;  // by start address

// The allocation containing [p, p + bytes), or nullptr.
const Allocation* find_allocation(const void* p, size_t bytes, AllocKind kind) {
    const char* c = static_cast<const char*>(p);
    auto it = allocations.upper_bound(c);
    if (it == allocations.begin()) return nullptr;
    --it;
    if (it->second.kind != kind) return nullptr;
    const size_t offset = size_t(c - it->first);
    if (offset >= std::max<size_t>(it->second.bytes, 1) ||
        bytes > it->second.bytes - std::min(offset, it->second.bytes))
        return nullptr;
    return &it->second;
}

// ASan build: device allocations are poisoned except inside DeviceMemoryAccess scopes.
int device_access_depth = 0;  // guarded by registry_mutex

void poison_device_memory(bool poisoned) {
#if defined(__SANITIZE_ADDRESS__)
    for (const auto& [p, a] : allocations) {
        if (a.kind != AllocKind::device) continue;
        if (poisoned) {
            ASAN_POISON_MEMORY_REGION(p, a.bytes);
        } else {
            ASAN_UNPOISON_MEMORY_REGION(p, a.bytes);
        }
    }
#else
    (void)poisoned;
#endif
}

cudaError_t allocate(void** ptr, size_t bytes, AllocKind kind) {
    if (!ptr) return set_last_error(cudaErrorInvalidValue);
    if (const cudaError_t e = check_unsafe_call_during_capture(); e != cudaSuccess) return set_last_error(e);
    *ptr = nullptr;
    if (bytes == 0) return cudaSuccess;  // CUDA returns success and a null pointer
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes) != 0) return set_last_error(cudaErrorMemoryAllocation);
    std::memset(p, 0xFF, bytes);
    std::lock_guard lock(registry_mutex);
    allocations[static_cast<const char*>(p)] = {bytes, kind};
#if defined(__SANITIZE_ADDRESS__)
    if (kind == AllocKind::device && device_access_depth == 0) ASAN_POISON_MEMORY_REGION(p, bytes);
#endif
    *ptr = p;
    return cudaSuccess;
}

cudaError_t release(void* ptr, AllocKind kind) {
    if (const cudaError_t e = check_unsafe_call_during_capture(); e != cudaSuccess) return set_last_error(e);
    if (!ptr) return cudaSuccess;
    {
        std::lock_guard lock(registry_mutex);
        auto it = allocations.find(static_cast<const char*>(ptr));
        if (it == allocations.end() || it->second.kind != kind || it->second.registered)
            return set_last_error(cudaErrorInvalidValue);  // a registered range is cudaHostUnregister's
    }
    // As on the device, freeing waits for work that may still use it. That work runs while the
    // allocation is still registered: a kernel deferred until now must see it as device memory
    // (the ASan build unpoisons only registered allocations for a launch).
    cudaDeviceSynchronize();
    {
        std::lock_guard lock(registry_mutex);
        allocations.erase(static_cast<const char*>(ptr));
    }
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(ptr, 1);  // free() needs the chunk's header region sane; ASan repoisons
#endif
    std::free(ptr);
    return cudaSuccess;
}

bool is_device(const void* p, size_t bytes) {
    std::lock_guard lock(registry_mutex);
    return find_allocation(p, bytes, AllocKind::device) != nullptr;
}

}  // namespace

std::vector<std::pair<const void*, size_t>> device_allocations() {
    std::lock_guard lock(registry_mutex);
    std::vector<std::pair<const void*, size_t>> out;
    for (const auto& [p, a] : allocations)
        if (a.kind == AllocKind::device) out.emplace_back(p, a.bytes);
    return out;
}

namespace {

bool is_pinned(const void* p, size_t bytes) {
    std::lock_guard lock(registry_mutex);
    return find_allocation(p, bytes, AllocKind::pinned_host) != nullptr;
}

// Checks a copy's pointers against its declared direction: device sides must lie inside one
// device allocation, host sides must not be device memory.
cudaError_t check_copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    const bool dst_dev = is_device(dst, count), src_dev = is_device(src, count);
    const bool dst_touches_dev = is_device(dst, 1), src_touches_dev = is_device(src, 1);
    switch (kind) {
        case cudaMemcpyHostToHost: return !dst_touches_dev && !src_touches_dev ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyHostToDevice: return dst_dev && !src_touches_dev ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyDeviceToHost: return src_dev && !dst_touches_dev ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyDeviceToDevice: return dst_dev && src_dev ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyDefault:
            // Direction inferred from the pointers; a device side must still fit its allocation.
            if ((dst_touches_dev && !dst_dev) || (src_touches_dev && !src_dev)) return cudaErrorInvalidValue;
            return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

}  // namespace

cudaError_t set_last_error(cudaError_t error) {
    if (error != cudaSuccess) last_error = error;
    return error;
}

bool is_device_range(const void* p, size_t bytes) { return is_device(p, bytes); }
bool is_pinned_range(const void* p, size_t bytes) { return is_pinned(p, bytes); }

DeviceMemoryAccess::DeviceMemoryAccess() {
    std::lock_guard lock(registry_mutex);
    if (device_access_depth++ == 0) poison_device_memory(false);
}

DeviceMemoryAccess::~DeviceMemoryAccess() {
    std::lock_guard lock(registry_mutex);
    if (--device_access_depth == 0) poison_device_memory(true);
}

int shared_mem_per_block_optin() {
    const char* env = std::getenv("POLEVAULT_HOST_SHARED_OPTIN");
    if (!env || !*env) return kSharedMemPerBlockOptin;
    char* end = nullptr;
    const long bytes = std::strtol(env, &end, 10);
    if (*end != '\0' || bytes < kSharedMemPerBlock || bytes > kSharedMemPerBlockOptin) {
        std::fprintf(stderr,
                     "polevault host: POLEVAULT_HOST_SHARED_OPTIN=%s is not a byte count from %d (48 KiB) to %d "
                     "(227 KiB): unset it, or give one such as 101376 (the 99 KiB of sm_86 and sm_89)\n",
                     env, kSharedMemPerBlock, kSharedMemPerBlockOptin);
        std::abort();
    }
    return int(bytes);
}

int host_device_count() {
    static const int count = [] {
        // Set explicitly, the count is taken as it is (so a test can give a node fewer GPUs than
        // ranks); by default a node has 8, or as many as its ranks.
        if (const char* env = std::getenv("POLEVAULT_HOST_DEVICES")) return std::max(1, std::atoi(env));
        int n = 8;
        if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) n = std::max(n, std::atoi(env));
        return n;
    }();
    return count;
}

}  // namespace pv::host

using namespace pv::host;

// ---- errors ---------------------------------------------------------------------------------
extern "C" cudaError_t cudaGetLastError() {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
extern "C" cudaError_t cudaPeekAtLastError() { return last_error; }

extern "C" const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
#define PV_NAME(e) \
    case e: return #e;
        PV_NAME(cudaSuccess)
        PV_NAME(cudaErrorInvalidValue)
        PV_NAME(cudaErrorMemoryAllocation)
        PV_NAME(cudaErrorInvalidConfiguration)
        PV_NAME(cudaErrorInvalidDevice)
        PV_NAME(cudaErrorInvalidDeviceFunction)
        PV_NAME(cudaErrorInvalidResourceHandle)
        PV_NAME(cudaErrorInvalidMemcpyDirection)
        PV_NAME(cudaErrorNotReady)
        PV_NAME(cudaErrorNoDevice)
        PV_NAME(cudaErrorLaunchOutOfResources)
        PV_NAME(cudaErrorIllegalState)
        PV_NAME(cudaErrorNotSupported)
        PV_NAME(cudaErrorStreamCaptureUnsupported)
        PV_NAME(cudaErrorStreamCaptureInvalidated)
        PV_NAME(cudaErrorStreamCaptureUnmatched)
        PV_NAME(cudaErrorStreamCaptureUnjoined)
        PV_NAME(cudaErrorStreamCaptureIsolation)
        PV_NAME(cudaErrorStreamCaptureImplicit)
        PV_NAME(cudaErrorCapturedEvent)
#undef PV_NAME
        default: return "cudaErrorUnknown";
    }
}

extern "C" const char* cudaGetErrorString(cudaError_t error) {
    // The texts the CUDA runtime prints for these codes.
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
        case cudaErrorNotSupported: return "operation not supported";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
        case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
        case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
        case cudaErrorStreamCaptureImplicit:
            return "operation would make the legacy stream depend on a capturing blocking stream";
        case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
        default: return "unrecognized error code";
    }
}

// ---- devices --------------------------------------------------------------------------------
extern "C" cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return set_last_error(cudaErrorInvalidValue);
    *count = host_device_count();
    return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= host_device_count()) return set_last_error(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGetDevice(int* device) {
    if (!device) return set_last_error(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceReset() { return cudaSuccess; }

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (!prop) return set_last_error(cudaErrorInvalidValue);
    if (device < 0 || device >= host_device_count()) return set_last_error(cudaErrorInvalidDevice);
    std::memset(prop, 0, sizeof *prop);
    std::snprintf(prop->name, sizeof prop->name, "%s", kDeviceName);
    prop->totalGlobalMem = kTotalGlobalMem;
    prop->sharedMemPerBlock = kSharedMemPerBlock;
    prop->sharedMemPerBlockOptin = shared_mem_per_block_optin();
    prop->sharedMemPerMultiprocessor = kSharedMemPerMultiprocessor;
    prop->regsPerBlock = kRegsPerBlock;
    prop->regsPerMultiprocessor = kRegsPerBlock;
    prop->warpSize = kWarpSize;
    prop->maxThreadsPerBlock = kMaxThreadsPerBlock;
    prop->maxThreadsPerMultiProcessor = kMaxThreadsPerMultiProcessor;
    for (int i = 0; i < 3; ++i) prop->maxThreadsDim[i] = kMaxBlockDim[i], prop->maxGridSize[i] = kMaxGridDim[i];
    prop->totalConstMem = kTotalConstMem;
    prop->major = kComputeMajor;
    prop->minor = kComputeMinor;
    prop->multiProcessorCount = kMultiProcessorCount;
    prop->l2CacheSize = kL2CacheBytes;
    prop->memoryBusWidth = kMemoryBusWidthBits;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->concurrentKernels = 1;
    prop->unifiedAddressing = 1;
    prop->canMapHostMemory = 1;
    prop->asyncEngineCount = 2;
    prop->streamPrioritiesSupported = 1;
    prop->cooperativeLaunch = 1;
    prop->pciBusID = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (!value) return set_last_error(cudaErrorInvalidValue);
    if (device < 0 || device >= host_device_count()) return set_last_error(cudaErrorInvalidDevice);
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock: *value = kMaxThreadsPerBlock; break;
        case cudaDevAttrMaxBlockDimX: *value = kMaxBlockDim[0]; break;
        case cudaDevAttrMaxBlockDimY: *value = kMaxBlockDim[1]; break;
        case cudaDevAttrMaxBlockDimZ: *value = kMaxBlockDim[2]; break;
        case cudaDevAttrMaxGridDimX: *value = kMaxGridDim[0]; break;
        case cudaDevAttrMaxGridDimY: *value = kMaxGridDim[1]; break;
        case cudaDevAttrMaxGridDimZ: *value = kMaxGridDim[2]; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = kSharedMemPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = shared_mem_per_block_optin(); break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = kSharedMemPerMultiprocessor; break;
        case cudaDevAttrWarpSize: *value = kWarpSize; break;
        case cudaDevAttrMultiProcessorCount: *value = kMultiProcessorCount; break;
        case cudaDevAttrClockRate: *value = kClockRateKHz; break;
        case cudaDevAttrComputeCapabilityMajor: *value = kComputeMajor; break;
        case cudaDevAttrComputeCapabilityMinor: *value = kComputeMinor; break;
        case cudaDevAttrMaxThreadsPerMultiProcessor: *value = kMaxThreadsPerMultiProcessor; break;
        case cudaDevAttrL2CacheSize: *value = kL2CacheBytes; break;
        case cudaDevAttrGlobalMemoryBusWidth: *value = kMemoryBusWidthBits; break;
        default: return set_last_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    if (!free_bytes || !total_bytes) return set_last_error(cudaErrorInvalidValue);
    size_t used = 0;
    {
        std::lock_guard lock(registry_mutex);
        for (const auto& [p, a] : allocations)
            if (a.kind == AllocKind::device) used += a.bytes;
    }
    *total_bytes = kTotalGlobalMem;
    *free_bytes = kTotalGlobalMem - std::min(used, kTotalGlobalMem);
    return cudaSuccess;
}

// ---- memory ---------------------------------------------------------------------------------
extern "C" cudaError_t cudaMalloc(void** ptr, size_t bytes) { return allocate(ptr, bytes, AllocKind::device); }
extern "C" cudaError_t cudaFree(void* ptr) { return release(ptr, AllocKind::device); }
extern "C" cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return allocate(ptr, bytes, AllocKind::pinned_host); }
extern "C" cudaError_t cudaFreeHost(void* ptr) { return release(ptr, AllocKind::pinned_host); }
extern "C" cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags) {
    const unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (flags & ~known) return set_last_error(cudaErrorInvalidValue);
    return allocate(ptr, bytes, AllocKind::pinned_host);
}

// cudaHostRegister: the range [ptr, ptr + size) of the caller's memory counts as page-locked (copies
// from and to it are asynchronous, as from cudaMallocHost's) until cudaHostUnregister. A range
// overlapping any allocation or registration is refused, as CUDA refuses one registered twice.
extern "C" cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
    if (!ptr || size == 0 || (flags & ~unsigned(cudaHostRegisterPortable))) return set_last_error(cudaErrorInvalidValue);
    const char* p = static_cast<const char*>(ptr);
    std::lock_guard lock(registry_mutex);
    auto after = allocations.lower_bound(p);
    if (after != allocations.end() && after->first < p + size)
        return set_last_error(cudaErrorHostMemoryAlreadyRegistered);
    if (after != allocations.begin()) {
        const auto before = std::prev(after);
        if (before->first + before->second.bytes > p) return set_last_error(cudaErrorHostMemoryAlreadyRegistered);
    }
    allocations[p] = {size, AllocKind::pinned_host, true};
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostUnregister(void* ptr) {
    {
        std::lock_guard lock(registry_mutex);
        auto it = allocations.find(static_cast<const char*>(ptr));
        if (it == allocations.end() || !it->second.registered)
            return set_last_error(cudaErrorHostMemoryNotRegistered);
    }
    cudaDeviceSynchronize();  // work still using the range runs while it is registered (as release does)
    std::lock_guard lock(registry_mutex);
    allocations.erase(static_cast<const char*>(ptr));
    return cudaSuccess;
}

// The host backend's device is no PCI device: there is no bus id to give.
extern "C" cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
    if (!pciBusId || len <= 0 || device != 0) return set_last_error(cudaErrorInvalidValue);
    pciBusId[0] = '\0';
    return set_last_error(cudaErrorNotSupported);
}

namespace {

// memmove, reported to the traffic meter (host/access_meter.h) when it runs.
void metered_copy(void* dst, const void* src, size_t count) {
    access_meter_platform_op("memcpy", src, count, dst, count);
    std::memmove(dst, src, count);
}

// A copy with CUDA's host-synchronisation rules. `sync_call` is true for cudaMemcpy.
cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream, bool sync_call) {
    if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return set_last_error(e);
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    if (sync_call)
        if (const cudaError_t e = check_unsafe_call_during_capture(); e != cudaSuccess) return set_last_error(e);
    if (count == 0) return cudaSuccess;
    const bool src_pageable = !is_device(src, count) && !is_pinned(src, count);
    const bool dst_pageable = !is_device(dst, count) && !is_pinned(dst, count);
    if (src_pageable || dst_pageable)  // a graph cannot hold it (CUDA stages or waits at the call)
        if (const cudaError_t e = refuse_in_capture(stream); e != cudaSuccess) return set_last_error(e);
    cudaError_t e = cudaSuccess;
    if (sync_call || dst_pageable) {
        // The call returns once the copy is done.
        e = stream_submit_and_wait(stream, [=] { metered_copy(dst, src, count); });
    } else if (src_pageable && streams_are_deferred()) {
        // Staged at the call: the caller may overwrite its buffer as soon as this returns.
        auto staged =
            std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + count);
        e = stream_submit(stream, [=] { metered_copy(dst, staged->data(), count); });
    } else {
        e = stream_submit(stream, [=] { metered_copy(dst, src, count); });
    }
    return e == cudaSuccess ? cudaSuccess : set_last_error(e);
}

cudaError_t fill(void* ptr, int value, size_t count, cudaStream_t stream, bool sync_call) {
    if (count && !is_device(ptr, count)) return set_last_error(cudaErrorInvalidValue);
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    if (sync_call)
        if (const cudaError_t e = check_unsafe_call_during_capture(); e != cudaSuccess) return set_last_error(e);
    if (count == 0) return cudaSuccess;
    auto work = [=] {
        access_meter_platform_op("memset", nullptr, 0, ptr, count);
        std::memset(ptr, value, count);
    };
    const cudaError_t e = sync_call ? stream_submit_and_wait(stream, work) : stream_submit(stream, work);
    return e == cudaSuccess ? cudaSuccess : set_last_error(e);
}

}  // namespace

extern "C" cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                       cudaStream_t stream) {
    return copy(dst, src, count, kind, stream, false);
}
extern "C" cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    return copy(dst, src, count, kind, nullptr, true);
}
extern "C" cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
    return fill(ptr, value, count, stream, false);
}
extern "C" cudaError_t cudaMemset(void* ptr, int value, size_t count) { return fill(ptr, value, count, nullptr, true); }
