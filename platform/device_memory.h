// Device memory by category: every buffer polevault allocates goes through device_alloc (or
// pinned_host_alloc) with the category it belongs to (DESIGN.md §3), so the current and peak
// bytes of each category are known on both backends, and the memory planner's predictions can
// be checked against what a run really held.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>

namespace pv {

enum class MemoryCategory : int {
    parameters,
    gradients,
    optimizer_state,
    activations,
    comm_buffers,
    workspace,
    pinned_host,  // page-locked host memory (cudaMallocHost), counted apart from device totals
};
inline constexpr int kMemoryCategoryCount = 7;
const char* category_name(MemoryCategory c);

// Allocates `bytes` of device memory (cudaMalloc) charged to `category`; aborts with a message
// naming the category and size if the device has no room. Zero bytes give nullptr.
void* device_alloc(size_t bytes, MemoryCategory category);
// Page-locked host memory (cudaMallocHost), charged to MemoryCategory::pinned_host.
void* pinned_host_alloc(size_t bytes);
// The same, its pages placed by `first_touch` before they are pinned: the range is reserved
// untouched (mmap), first_touch(p, bytes) must write every page of it (Linux allocates a page on
// the memory node of the thread that first touches it: optim/host_placement.h), then
// cudaHostRegister pins the pages where they are.
void* pinned_host_alloc_touched(size_t bytes, const std::function<void(void*, size_t)>& first_touch);
// Frees what device_alloc, pinned_host_alloc or pinned_host_alloc_touched returned (nullptr is a no-op).
void memory_free(void* ptr);

struct MemoryStats {
    std::array<size_t, kMemoryCategoryCount> current{}, peak{};
    size_t device_current = 0;  // every category but pinned_host
    size_t device_peak = 0;     // the highest device_current seen (not the sum of the peaks)
};
MemoryStats memory_stats();
// Starts a new measurement window: peaks become the current values.
void reset_memory_peaks();
// One line per category with current and peak bytes, for logs.
std::string format_memory_stats(const MemoryStats& stats);

// An owning typed buffer in device memory, charged to a category.
template <class T>
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    DeviceBuffer(size_t count, MemoryCategory category)
        : ptr_(static_cast<T*>(device_alloc(count * sizeof(T), category))), count_(count) {}
    ~DeviceBuffer() { memory_free(ptr_); }
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr, o.count_ = 0; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            memory_free(ptr_);
            ptr_ = o.ptr_, count_ = o.count_;
            o.ptr_ = nullptr, o.count_ = 0;
        }
        return *this;
    }
    T* get() const { return ptr_; }
    size_t size() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }

  private:
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

}  // namespace pv
