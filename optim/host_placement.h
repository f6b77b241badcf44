// Where the offloaded optimizer's host work runs and its state lives (--offload; optim/offload.h).
//
// A GPU is attached to one socket's PCIe root; on a machine of several memory nodes (two sockets,
// or one split into NUMA domains) the pinned state should sit in that socket's memory and the
// threads that stream through it should run on that socket's cores: the update moves 28 bytes an
// element through host memory (optim/adamw_cpu.h), and memory across the socket link is slower.
// Measured on an H100's 16-core host: 35 GB a step at about 17 GB/s, where one thread of this 2-core
// development VM reaches 9.4 GB/s (../shared/notes/gpu-review.md).
//
// So: the CPUs of the GPU's memory node come from sysfs (the device's PCI bus id, its numa_node,
// that node's cpulist), the rank's offload pool (offload_pool) is bound to them, and the state is
// allocated untouched and first written by that pool (host_alloc_first_touched, with
// platform/device_memory.h pinned_host_alloc_touched) — Linux places a page on the node of the
// thread that first touches it — before it is pinned. Where the node is unknown (a single-node
// machine reports none, or -1; the host backend's device has no PCI location) the pool is not bound
// and the placement is the kernel's default. Host code.
#pragma once

#include "optim/thread_pool.h"

#include <string>
#include <vector>

namespace pv {

// "0-3,8-11,16" -> {0, 1, 2, 3, 8, 9, 10, 11, 16} (sysfs's cpulist format); std::invalid_argument
// naming the text when it is not one.
std::vector<int> parse_cpu_list(const std::string& text);

// The CPUs of the memory node of the PCI device `bus_id` ("0000:41:00.0", any case), under a sysfs
// mounted at `sysfs_root`, that this process may run on; empty when sysfs does not say (no such
// device, numa_node -1, an unreadable cpulist) or none of them is allowed.
std::vector<int> numa_cpus_of_pci_device(const std::string& bus_id, const std::string& sysfs_root = "/sys");

// The CPUs nearest the current GPU (cudaDeviceGetPCIBusId, then numa_cpus_of_pci_device); empty
// when unknown.
std::vector<int> gpu_local_cpus();

// This rank's pool for its offloaded optimizer: cpu_threads_per_rank() threads, bound to
// gpu_local_cpus() when known, created on first use.
ThreadPool& offload_pool();

// One line for the run's log: the pool's threads and where they are bound.
std::string describe_offload_pool();

// Page-locked host memory whose pages `pool` touches first (each writes zeros to its share of
// 2 MiB pieces), charged to MemoryCategory::pinned_host; memory_free releases it.
void* host_alloc_first_touched(size_t bytes, ThreadPool& pool);

}  // namespace pv
