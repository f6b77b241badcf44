// Where the offloaded optimizer's host work runs and its state lives (optim/host_placement.h):
// sysfs's CPU lists and the GPU's memory node read from a planted sysfs tree, a pool bound to
// CPUs (its workers run there, the caller beside them only inside ScopedAffinity), and host memory
// first written by a pool and then pinned (cudaHostRegister: the host platform's copies treat it as
// page-locked; it is released by memory_free and accounted as pinned host).
#include "optim/host_placement.h"
#include "platform/device_memory.h"
#include "platform/platform.h"
#include "test/temp_dir.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace {

void write_file(const std::filesystem::path& path, const std::string& text) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
}

}  // namespace

TEST_CASE("sysfs CPU lists parse, and malformed ones are refused naming the text", "[host-placement]") {
    CHECK(pv::parse_cpu_list("0-3,8-11,16") == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11, 16});
    CHECK(pv::parse_cpu_list("5") == std::vector<int>{5});
    CHECK(pv::parse_cpu_list("7,2-3,2") == std::vector<int>{2, 3, 7});  // sorted, once each
    for (const char* bad : {"", "a", "3-1", "1,", ",1", "1,,2", "-2", "1-", "0-9999999"})
        CHECK_THROWS_WITH(pv::parse_cpu_list(bad), Catch::Contains(std::string("\"") + bad + "\""));
}

TEST_CASE("the GPU's memory node's CPUs come from sysfs, as this process may use them", "[host-placement]") {
    pv::test::TempDir sys("host_placement_sysfs");
    const std::vector<int> allowed = pv::current_thread_cpus();
    REQUIRE(!allowed.empty());
    // Node 1 lists every allowed CPU and one no machine here has: the result is the allowed ones.
    std::string list;
    for (int c : allowed) list += (list.empty() ? "" : ",") + std::to_string(c);
    write_file(sys.path / "bus/pci/devices/0000:41:00.0/numa_node", "1\n");
    write_file(sys.path / "devices/system/node/node1/cpulist", list + ",999999\n");
    CHECK(pv::numa_cpus_of_pci_device("0000:41:00.0", sys.path.string()) == allowed);
    // The bus id as CUDA spells it (upper case hex) finds sysfs's lower-case directory.
    write_file(sys.path / "bus/pci/devices/0000:c1:00.0/numa_node", "1\n");
    CHECK(pv::numa_cpus_of_pci_device("0000:C1:00.0", sys.path.string()) == allowed);
    // Nothing to go on: no such device, a node of -1 (a machine that does not say), a node without a
    // CPU list, a CPU list that is not one, a node none of whose CPUs is allowed.
    CHECK(pv::numa_cpus_of_pci_device("0000:01:00.0", sys.path.string()).empty());
    write_file(sys.path / "bus/pci/devices/0000:02:00.0/numa_node", "-1\n");
    CHECK(pv::numa_cpus_of_pci_device("0000:02:00.0", sys.path.string()).empty());
    write_file(sys.path / "bus/pci/devices/0000:03:00.0/numa_node", "3\n");
    CHECK(pv::numa_cpus_of_pci_device("0000:03:00.0", sys.path.string()).empty());
    write_file(sys.path / "bus/pci/devices/0000:04:00.0/numa_node", "4\n");
    write_file(sys.path / "devices/system/node/node4/cpulist", "0-\n");
    CHECK(pv::numa_cpus_of_pci_device("0000:04:00.0", sys.path.string()).empty());
    write_file(sys.path / "bus/pci/devices/0000:05:00.0/numa_node", "5\n");
    write_file(sys.path / "devices/system/node/node5/cpulist", "999998-999999\n");
    CHECK(pv::numa_cpus_of_pci_device("0000:05:00.0", sys.path.string()).empty());
}

TEST_CASE("the host platform's device has no PCI location: the offload pool is not bound", "[host-placement][host-only]") {
    char bus_id[64] = {'x'};
    CHECK(cudaDeviceGetPCIBusId(bus_id, int(sizeof bus_id), 0) == cudaErrorNotSupported);
    CHECK(cudaGetLastError() == cudaErrorNotSupported);
    CHECK(pv::gpu_local_cpus().empty());
    CHECK(cudaGetLastError() == cudaSuccess);  // not left behind for the next CUDA_CHECK
    CHECK(pv::offload_pool().cpus().empty());
    CHECK_FALSE(pv::offload_pool().bound());
    CHECK(pv::describe_offload_pool().find("not bound (the GPU's memory node is not known here)") !=
          std::string::npos);
}

TEST_CASE("a bound pool's workers run on its CPUs; the caller joins them only inside ScopedAffinity",
          "[host-placement]") {
    const std::vector<int> before = pv::current_thread_cpus();
    const std::vector<int> one{before.back()};
    pv::ThreadPool pool(3, one);
    REQUIRE(pool.bound());
    const std::thread::id caller = std::this_thread::get_id();
    std::mutex mutex;
    std::set<std::vector<int>> worker_sets, caller_sets;
    std::set<std::thread::id> workers;
    const auto record = [&](size_t) {
        const std::vector<int> cpus = pv::current_thread_cpus();
        std::lock_guard lock(mutex);
        if (std::this_thread::get_id() == caller) {
            caller_sets.insert(cpus);
        } else {
            worker_sets.insert(cpus);
            workers.insert(std::this_thread::get_id());
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // every thread gets some indices
    };
    pool.run(64, record);
    CHECK(worker_sets == std::set<std::vector<int>>{one});
    CHECK(!workers.empty());
    if (!caller_sets.empty()) CHECK(caller_sets == std::set<std::vector<int>>{before});  // not bound by the pool
    {
        pv::ScopedAffinity beside(pool.cpus());
        CHECK(beside.ok());
        caller_sets.clear();
        pool.run(64, record);
        if (!caller_sets.empty()) CHECK(caller_sets == std::set<std::vector<int>>{one});
        CHECK(pv::current_thread_cpus() == one);
    }
    CHECK(pv::current_thread_cpus() == before);  // restored
    pv::ThreadPool unbound(2);
    CHECK_FALSE(unbound.bound());
    CHECK(unbound.cpus().empty());
}

TEST_CASE("host memory first written by a pool, then pinned: zeros, page-locked, accounted, released",
          "[host-placement]") {
    pv::ThreadPool pool(2, {pv::current_thread_cpus().front()});
    const size_t bytes = (size_t(5) << 20) + 3;  // not a whole number of the 2 MiB pieces or of pages
    const pv::MemoryStats start = pv::memory_stats();
    auto* p = static_cast<unsigned char*>(pv::host_alloc_first_touched(bytes, pool));
    REQUIRE(p != nullptr);
    CHECK(std::all_of(p, p + bytes, [](unsigned char b) { return b == 0; }));
    const pv::MemoryStats held = pv::memory_stats();
    const int pinned = int(pv::MemoryCategory::pinned_host);
    CHECK(held.current[pinned] == start.current[pinned] + bytes);
    CHECK(held.device_current == start.device_current);
    // Page-locked as cudaMallocHost's: an asynchronous copy to the device and back.
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 + 1);
    void* device = nullptr;
    CUDA_CHECK(cudaMalloc(&device, bytes));
    std::vector<unsigned char> back(bytes);
    CUDA_CHECK(cudaMemcpyAsync(device, p, bytes, cudaMemcpyHostToDevice, nullptr));
    CUDA_CHECK(cudaMemcpy(back.data(), device, bytes, cudaMemcpyDeviceToHost));
    CHECK(std::equal(back.begin(), back.end(), p));
    CUDA_CHECK(cudaFree(device));
    // Registered once only; not cudaFreeHost's to free.
    CHECK(cudaHostRegister(p + 4096, 4096, cudaHostRegisterDefault) == cudaErrorHostMemoryAlreadyRegistered);
    CHECK(cudaGetLastError() == cudaErrorHostMemoryAlreadyRegistered);
    CHECK(cudaFreeHost(p) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    pv::memory_free(p);
    CHECK(pv::memory_stats().current[pinned] == start.current[pinned]);
    std::vector<char> plain(64);
    CHECK(cudaHostUnregister(plain.data()) == cudaErrorHostMemoryNotRegistered);
    CHECK(cudaGetLastError() == cudaErrorHostMemoryNotRegistered);
    // A registration of the caller's memory, directly: and unregistered, the range is plain again.
    CHECK(cudaHostRegister(plain.data(), plain.size(), cudaHostRegisterDefault) == cudaSuccess);
    CHECK(cudaHostUnregister(plain.data()) == cudaSuccess);
}
