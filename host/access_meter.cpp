// The host's device-memory traffic meter (host/access_meter.h).
#include "host/access_meter.h"

#include "host/block_runner.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace pv::host {
namespace {

// One metered allocation: a bit per byte read and one per byte written.
struct Region {
    uintptr_t begin = 0, end = 0;
    size_t words = 0;
    std::unique_ptr<std::atomic<uint64_t>[]> read, written;
};

std::atomic<bool> running{false};
std::atomic<bool> in_launch{false};  // between launch_begin and launch_end (one grid runs at a time)
std::vector<Region> regions;         // sorted by begin; fixed while the meter runs
std::atomic<uint64_t> accessed{0};   // bytes of every access of the current launch
std::mutex records_mutex;
std::vector<LaunchTraffic> records;

Region* region_of(uintptr_t a) {
    auto it =
        std::upper_bound(regions.begin(), regions.end(), a, [](uintptr_t x, const Region& r) { return x < r.begin; });
    if (it == regions.begin()) return nullptr;
    --it;
    return a < it->end ? &*it : nullptr;
}

// Marks bytes [from, to) of a region read or written; a read skips the bytes already written.
void mark(Region& r, size_t from, size_t to, bool write) {
    while (from < to) {
        const size_t word = from / 64, lo = from % 64, hi = std::min<size_t>(64, lo + (to - from));
        const uint64_t mask = (hi == 64 ? ~uint64_t(0) : (uint64_t(1) << hi) - 1) & ~((uint64_t(1) << lo) - 1);
        if (write)
            r.written[word].fetch_or(mask, std::memory_order_relaxed);
        else
            r.read[word].fetch_or(mask & ~r.written[word].load(std::memory_order_relaxed), std::memory_order_relaxed);
        from += hi - lo;
    }
}

uint64_t count_and_clear(std::atomic<uint64_t>* bits, size_t words) {
    uint64_t n = 0;
    for (size_t i = 0; i < words; ++i) n += uint64_t(std::popcount(bits[i].exchange(0, std::memory_order_relaxed)));
    return n;
}

// The bytes of [p, p + bytes) that lie in metered device memory, marked read or written; returns
// how many there were.
size_t mark_range(const void* p, size_t bytes, bool write) {
    if (!p || bytes == 0) return 0;
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t end = a + bytes;
    size_t marked = 0;
    while (a < end) {
        Region* r = region_of(a);
        if (!r) break;  // not device memory (an access never spans host and device memory)
        const uintptr_t stop = std::min(end, r->end);
        mark(*r, a - r->begin, stop - r->begin, write);
        marked += stop - a;
        a = stop;
    }
    return marked;
}

}  // namespace

void access_meter_start() {
    if (running.exchange(true)) throw std::logic_error("access_meter_start: the meter is already running");
    regions.clear();
    for (const auto& [p, bytes] : device_allocations()) {
        Region r;
        r.begin = reinterpret_cast<uintptr_t>(p);
        r.end = r.begin + bytes;
        r.words = (bytes + 63) / 64;
        r.read.reset(new std::atomic<uint64_t>[r.words]());
        r.written.reset(new std::atomic<uint64_t>[r.words]());
        regions.push_back(std::move(r));
    }
    std::sort(regions.begin(), regions.end(), [](const Region& x, const Region& y) { return x.begin < y.begin; });
    std::lock_guard lock(records_mutex);
    records.clear();
}

std::vector<LaunchTraffic> access_meter_stop() {
    if (!running.exchange(false)) throw std::logic_error("access_meter_stop: the meter is not running");
    regions.clear();
    std::lock_guard lock(records_mutex);
    return std::move(records);
}

bool access_meter_running() { return running.load(std::memory_order_relaxed); }

void access_meter_record(const void* p, size_t bytes, bool write) {
    if (!in_launch.load(std::memory_order_relaxed)) return;
    if (const size_t device = mark_range(p, bytes, write)) accessed.fetch_add(device, std::memory_order_relaxed);
}

void access_meter_launch_begin() {
    if (!running.load(std::memory_order_relaxed)) return;
    accessed.store(0, std::memory_order_relaxed);
    in_launch.store(true, std::memory_order_release);
}

namespace {
void finish_record(std::string name) {
    LaunchTraffic t;
    t.kernel = std::move(name);
    for (Region& r : regions) {
        t.read_bytes += count_and_clear(r.read.get(), r.words);
        t.written_bytes += count_and_clear(r.written.get(), r.words);
    }
    t.accessed_bytes = accessed.exchange(0, std::memory_order_relaxed);
    std::lock_guard lock(records_mutex);
    records.push_back(std::move(t));
}
}  // namespace

void access_meter_launch_end(const void* kernel) {
    if (!running.load(std::memory_order_relaxed)) return;
    in_launch.store(false, std::memory_order_release);
    finish_record(kernel_name(kernel));
}

void access_meter_platform_op(const char* name, const void* read, size_t read_bytes, const void* written,
                              size_t written_bytes) {
    if (!running.load(std::memory_order_relaxed)) return;
    accessed.store(read_bytes + written_bytes, std::memory_order_relaxed);
    mark_range(read, read_bytes, false);
    mark_range(written, written_bytes, true);
    finish_record(name);
}

}  // namespace pv::host
