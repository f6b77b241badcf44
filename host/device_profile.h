// The device the host platform pretends to be: an H100 SXM (compute capability 9.0), with the
// limits NVIDIA documents for it. Launch checks, cudaGetDeviceProperties and
// cudaDeviceGetAttribute all read these numbers, so code that sizes itself from the device
// (shared memory opt-in, SM count for grid sizes) behaves as it would there.
#pragma once

#include <cstddef>

namespace pv::host {

inline constexpr const char* kDeviceName = "polevault host CPU (H100 SXM profile)";
inline constexpr int kComputeMajor = 9, kComputeMinor = 0;
inline constexpr int kMultiProcessorCount = 132;
inline constexpr int kWarpSize = 32;
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr int kMaxThreadsPerMultiProcessor = 2048;
inline constexpr int kMaxBlockDim[3] = {1024, 1024, 64};
inline constexpr int kMaxGridDim[3] = {2147483647, 65535, 65535};
inline constexpr int kSharedMemPerBlock = 48 * 1024;        // default dynamic + static limit
inline constexpr int kSharedMemPerBlockOptin = 227 * 1024;  // with cudaFuncAttributeMaxDynamicSharedMemorySize
inline constexpr int kSharedMemPerMultiprocessor = 228 * 1024;
inline constexpr int kRegsPerBlock = 65536;
inline constexpr int kL2CacheBytes = 50 * 1024 * 1024;
inline constexpr int kClockRateKHz = 1980000;
inline constexpr int kMemoryClockRateKHz = 2619000;
inline constexpr int kMemoryBusWidthBits = 5120;
inline constexpr size_t kTotalGlobalMem = size_t(80) << 30;
inline constexpr size_t kTotalConstMem = 64 * 1024;

// The shared memory a block may opt in to: kSharedMemPerBlockOptin, or POLEVAULT_HOST_SHARED_OPTIN
// bytes where that is set (read at every query, so a test can set it for a while), so that code
// which sizes its kernels from the device runs here as on a GPU with less: 101376 is the 99 KiB of
// sm_86 and sm_89 (RTX 4090, L40S, RTX 6000 Ada). cudaFuncSetAttribute refuses more, as they do.
int shared_mem_per_block_optin();

// Devices visible: POLEVAULT_HOST_DEVICES exactly when set, else 8 (a node) or this node's ranks
// if there are more.
int host_device_count();

}  // namespace pv::host
