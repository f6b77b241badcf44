// Where the offloaded optimizer's host work runs and its state lives (see optim/host_placement.h).
#include "optim/host_placement.h"

#include "platform/device_memory.h"
#include "platform/platform.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

namespace pv {

namespace {

// The first line of a file, or "" when it cannot be read.
std::string first_line(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line)) return "";
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    return line;
}

// A whole non-negative decimal number, or -1.
long long whole_number(const std::string& text) {
    if (text.empty() || text.size() > 9) return -1;
    long long n = 0;
    for (char c : text) {
        if (c < '0' || c > '9') return -1;
        n = n * 10 + (c - '0');
    }
    return n;
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& text) {
    const auto bad = [&] {
        return std::invalid_argument("not a CPU list (\"0-3,8-11\"): \"" + text + "\"");
    };
    std::set<int> cpus;
    size_t at = 0;
    while (at < text.size()) {
        const size_t comma = std::min(text.find(',', at), text.size());
        const std::string item = text.substr(at, comma - at);
        const size_t dash = item.find('-');
        const long long first = whole_number(item.substr(0, dash));
        const long long last = dash == std::string::npos ? first : whole_number(item.substr(dash + 1));
        if (first < 0 || last < first || last >= 1 << 20) throw bad();
        for (long long c = first; c <= last; ++c) cpus.insert(int(c));
        at = comma + 1;
        if (comma + 1 == text.size()) throw bad();  // a trailing comma
    }
    if (cpus.empty()) throw bad();
    return {cpus.begin(), cpus.end()};
}

std::vector<int> numa_cpus_of_pci_device(const std::string& bus_id, const std::string& sysfs_root) {
    std::string id = bus_id;
    for (char& c : id) c = char(std::tolower(static_cast<unsigned char>(c)));
    const long long node = whole_number(first_line(sysfs_root + "/bus/pci/devices/" + id + "/numa_node"));
    if (node < 0) return {};  // no such device, or "-1": the machine does not say
    std::vector<int> cpus;
    try {
        cpus = parse_cpu_list(first_line(sysfs_root + "/devices/system/node/node" + std::to_string(node) + "/cpulist"));
    } catch (const std::invalid_argument&) {
        return {};
    }
    const std::vector<int> allowed = current_thread_cpus();
    std::vector<int> out;
    for (int c : cpus)
        if (std::binary_search(allowed.begin(), allowed.end(), c)) out.push_back(c);
    return out;
}

std::vector<int> gpu_local_cpus() {
    int device = 0;
    char bus_id[64] = {};
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, int(sizeof bus_id), device) != cudaSuccess) {
        cudaGetLastError();  // the host backend's device has no PCI location: not an error to keep
        return {};
    }
    return numa_cpus_of_pci_device(bus_id);
}

ThreadPool& offload_pool() {
    static ThreadPool pool(cpu_threads_per_rank(), gpu_local_cpus());
    return pool;
}

std::string describe_offload_pool() {
    const ThreadPool& pool = offload_pool();
    std::string line = "offload: " + std::to_string(pool.threads()) + " CPU thread(s) for the optimizer";
    if (pool.cpus().empty()) return line + ", not bound (the GPU's memory node is not known here)";
    std::string list;
    for (size_t k = 0; k < pool.cpus().size(); ++k) {  // ranges: 0-7,16-23
        size_t e = k;
        while (e + 1 < pool.cpus().size() && pool.cpus()[e + 1] == pool.cpus()[e] + 1) ++e;
        list += (list.empty() ? "" : ",") + std::to_string(pool.cpus()[k]) +
                (e > k ? "-" + std::to_string(pool.cpus()[e]) : "");
        k = e;
    }
    return line + (pool.bound() ? ", bound to the GPU's memory node's CPUs " : ", not bound (refused) to CPUs ") +
           list + "; the state first written by them";
}

void* host_alloc_first_touched(size_t bytes, ThreadPool& pool) {
    constexpr size_t kPiece = size_t(2) << 20;
    return pinned_host_alloc_touched(bytes, [&](void* p, size_t n) {
        ScopedAffinity here(pool.cpus());  // the calling thread touches its share where the workers run
        pool.run((n + kPiece - 1) / kPiece, [&](size_t k) {
            const size_t begin = k * kPiece;
            std::memset(static_cast<char*>(p) + begin, 0, std::min(kPiece, n - begin));
        });
    });
}

}  // namespace pv
