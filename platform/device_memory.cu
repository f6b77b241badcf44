// Device memory accounting by category (see device_memory.h). Built on cudaMalloc/cudaFree, so
// it is the same code on both backends.
#include "platform/device_memory.h"

#include "platform/platform.h"

#include <cstdio>
#include <mutex>
#include <unordered_map>

#include <sys/mman.h>

namespace pv {
namespace {

// How a live pointer was allocated, for memory_free.
enum class Origin { device, pinned, registered };

struct Ledger {
    struct Entry {
        size_t bytes;
        MemoryCategory category;
        Origin origin;
    };
    std::mutex mutex;
    std::unordered_map<void*, Entry> live;
    MemoryStats stats;

    void add(void* p, size_t bytes, MemoryCategory c, Origin origin) {
        std::lock_guard lock(mutex);
        live[p] = {bytes, c, origin};
        const int i = int(c);
        stats.current[i] += bytes;
        stats.peak[i] = std::max(stats.peak[i], stats.current[i]);
        if (c != MemoryCategory::pinned_host) {
            stats.device_current += bytes;
            stats.device_peak = std::max(stats.device_peak, stats.device_current);
        }
    }
    // Returns how the pointer was allocated.
    Entry remove(void* p) {
        std::lock_guard lock(mutex);
        auto it = live.find(p);
        if (it == live.end()) {
            std::fprintf(stderr, "polevault: memory_free(%p): not a pointer from device_alloc/pinned_host_alloc\n", p);
            std::abort();
        }
        const Entry e = it->second;
        live.erase(it);
        stats.current[int(e.category)] -= e.bytes;
        if (e.category != MemoryCategory::pinned_host) stats.device_current -= e.bytes;
        return e;
    }
};

Ledger& ledger() {
    static Ledger* l = new Ledger;  // never destroyed: buffers may be freed during static destruction
    return *l;
}

}  // namespace

const char* category_name(MemoryCategory c) {
    switch (c) {
        case MemoryCategory::parameters: return "parameters";
        case MemoryCategory::gradients: return "gradients";
        case MemoryCategory::optimizer_state: return "optimizer state";
        case MemoryCategory::activations: return "activations";
        case MemoryCategory::comm_buffers: return "communication buffers";
        case MemoryCategory::workspace: return "workspace";
        case MemoryCategory::pinned_host: return "pinned host";
    }
    return "?";
}

void* device_alloc(size_t bytes, MemoryCategory category) {
    if (bytes == 0) return nullptr;
    if (category == MemoryCategory::pinned_host) return pinned_host_alloc(bytes);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        const MemoryStats s = memory_stats();
        std::fprintf(stderr, "polevault: cannot allocate %zu bytes of device memory for %s: %s\n%s", bytes,
                     category_name(category), cudaGetErrorString(e), format_memory_stats(s).c_str());
        std::abort();
    }
    ledger().add(p, bytes, category, Origin::device);
    return p;
}

void* pinned_host_alloc(size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    ledger().add(p, bytes, MemoryCategory::pinned_host, Origin::pinned);
    return p;
}

void* pinned_host_alloc_touched(size_t bytes, const std::function<void(void*, size_t)>& first_touch) {
    if (bytes == 0) return nullptr;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        std::fprintf(stderr, "polevault: cannot reserve %zu bytes of host memory for pinned host state\n", bytes);
        std::abort();
    }
    first_touch(p, bytes);
    CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
    ledger().add(p, bytes, MemoryCategory::pinned_host, Origin::registered);
    return p;
}

void memory_free(void* ptr) {
    if (!ptr) return;
    const Ledger::Entry e = ledger().remove(ptr);
    switch (e.origin) {
        case Origin::device: CUDA_CHECK(cudaFree(ptr)); break;
        case Origin::pinned: CUDA_CHECK(cudaFreeHost(ptr)); break;
        case Origin::registered:
            cudaDeviceSynchronize();  // no copy may still read or write the range (cudaFreeHost waits too)
            CUDA_CHECK(cudaHostUnregister(ptr));
            munmap(ptr, e.bytes);
            break;
    }
}

MemoryStats memory_stats() {
    std::lock_guard lock(ledger().mutex);
    return ledger().stats;
}

void reset_memory_peaks() {
    std::lock_guard lock(ledger().mutex);
    MemoryStats& s = ledger().stats;
    s.peak = s.current;
    s.device_peak = s.device_current;
}

std::string format_memory_stats(const MemoryStats& s) {
    std::string out;
    char line[160];
    for (int i = 0; i < kMemoryCategoryCount; ++i) {
        std::snprintf(line, sizeof line, "  %-22s current %14zu B   peak %14zu B\n", category_name(MemoryCategory(i)),
                      s.current[i], s.peak[i]);
        out += line;
    }
    std::snprintf(line, sizeof line, "  %-22s current %14zu B   peak %14zu B\n", "device total", s.device_current,
                  s.device_peak);
    return out + line;
}

}  // namespace pv
