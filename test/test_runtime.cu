// The CUDA runtime subset: copies of every kind, memsets, streams, events, devices, errors, and
// device-memory accounting by category. Written for both backends; [host-only] cases check what
// only the emulation promises (0xFF-filled allocations, the device count from the environment).
#include "platform/device_memory.h"
#include "test/check.h"

#include <thread>

using namespace pv::test;

namespace runtime_test {

__global__ void add_one(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

}  // namespace runtime_test

using namespace runtime_test;

TEST_CASE("copies of every kind round-trip", "[runtime]") {
    const size_t n = 1000;
    const auto host = random_vector<float>(n, 21);
    float *a = nullptr, *b = nullptr, *pinned = nullptr;
    CUDA_CHECK(cudaMalloc(&a, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&b, n * sizeof(float)));
    CUDA_CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(pinned, b, n * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<float> back(n), back2(n);
    CUDA_CHECK(cudaMemcpy(back.data(), pinned, n * sizeof(float), cudaMemcpyHostToHost));
    REQUIRE(back == host);
    // cudaMemcpyDefault infers the direction; a part of an allocation is a valid target.
    CUDA_CHECK(cudaMemcpy(b + 10, host.data(), 5 * sizeof(float), cudaMemcpyDefault));
    CUDA_CHECK(cudaMemcpy(back2.data(), b, n * sizeof(float), cudaMemcpyDefault));
    for (size_t i = 0; i < n; ++i) REQUIRE(back2[i] == (i >= 10 && i < 15 ? host[i - 10] : host[i]));
    // Async copies on a stream, synchronised.
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    CUDA_CHECK(cudaMemcpyAsync(a, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s));
    launch(add_one, dim3(4), dim3(256), 0, s, a, int(n));
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(pinned, a, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; ++i) REQUIRE(pinned[i] == host[i] + 1.0f);
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    CUDA_CHECK(cudaFreeHost(pinned));
}

TEST_CASE("memset, sync and async", "[runtime]") {
    DeviceArray<unsigned char> x(333);
    CUDA_CHECK(cudaMemset(x.get(), 0x5A, 333));
    // cudaMemset of device memory is asynchronous with respect to the host and a non-blocking
    // stream does not wait for the legacy stream: without this the two fills race (on an H100 the
    // later one landed first).
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMemsetAsync(x.get() + 100, 0x11, 50, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaStreamDestroy(s));
    const auto got = x.download();
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == (i >= 100 && i < 150 ? 0x11 : 0x5A));
}

TEST_CASE("copies that do not fit their allocation or direction are refused", "[runtime][host-only]") {
    // A debugging runtime's checks: the host emulation knows every allocation's bounds.
    float* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, 16 * sizeof(float)));
    std::vector<float> h(32, 1.0f);
    REQUIRE(cudaMemcpy(d, h.data(), 17 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    REQUIRE(cudaMemcpy(d + 8, h.data(), 9 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    REQUIRE(cudaMemcpy(h.data(), d, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // swapped
    REQUIRE(cudaMemcpy(d, h.data(), 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);  // swapped
    REQUIRE(cudaMemset(h.data(), 0, 4) == cudaErrorInvalidValue);                          // host pointer
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
    REQUIRE(cudaFree(h.data()) == cudaErrorInvalidValue);  // not from cudaMalloc
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
    CUDA_CHECK(cudaFree(d));
}

TEST_CASE("new allocations read as NaN until written", "[runtime][host-only]") {
    // cudaMalloc fills with 0xFF bytes so a kernel reading memory nobody wrote sees NaN.
    DeviceArray<float> f(7);
    DeviceArray<double> d(7);
    DeviceArray<__nv_bfloat16> b(7);
    for (float v : f.download()) REQUIRE(std::isnan(v));
    for (double v : d.download()) REQUIRE(std::isnan(v));
    for (auto v : b.download()) REQUIRE(std::isnan(__bfloat162float(v)));
    void* empty = &f;
    CUDA_CHECK(cudaMalloc(&empty, 0));  // zero bytes: success and a null pointer
    REQUIRE(empty == nullptr);
}

TEST_CASE("streams and events: order, elapsed time, errors", "[runtime]") {
    cudaStream_t s1, s2;
    CUDA_CHECK(cudaStreamCreate(&s1));
    CUDA_CHECK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, -1));
    cudaEvent_t start, stop, ready, untimed;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
    float ms = -1;
    REQUIRE(cudaEventElapsedTime(&ms, start, stop) == cudaErrorInvalidResourceHandle);  // never recorded
    REQUIRE(cudaGetLastError() == cudaErrorInvalidResourceHandle);

    const int n = 1 << 16;
    const auto host = random_vector<float>(size_t(n), 8);
    DeviceArray<float> x(host);
    CUDA_CHECK(cudaEventRecord(start, s1));
    for (int i = 0; i < 3; ++i) launch(add_one, dim3(n / 256), dim3(256), 0, s1, x.get(), n);
    CUDA_CHECK(cudaEventRecord(ready, s1));
    // s2 continues s1's work once `ready` has happened.
    CUDA_CHECK(cudaStreamWaitEvent(s2, ready, 0));
    launch(add_one, dim3(n / 256), dim3(256), 0, s2, x.get(), n);
    CUDA_CHECK(cudaEventRecord(stop, s2));
    CUDA_CHECK(cudaEventSynchronize(stop));
    REQUIRE(cudaEventQuery(stop) == cudaSuccess);
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    REQUIRE(ms >= 0.0f);
    REQUIRE(ms < 60000.0f);
    REQUIRE(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    const auto got = x.download();
    for (int i = 0; i < n; ++i) REQUIRE(got[size_t(i)] == host[size_t(i)] + 1.0f + 1.0f + 1.0f + 1.0f);

    for (cudaEvent_t e : {start, stop, ready, untimed}) CUDA_CHECK(cudaEventDestroy(e));
    CUDA_CHECK(cudaStreamDestroy(s1));
    CUDA_CHECK(cudaStreamDestroy(s2));
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("devices: count, selection, properties, attributes", "[runtime]") {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    REQUIRE(count >= 1);
    CUDA_CHECK(cudaSetDevice(count - 1));
    int dev = -1;
    CUDA_CHECK(cudaGetDevice(&dev));
    REQUIRE(dev == count - 1);
    CUDA_CHECK(cudaSetDevice(0));
    REQUIRE(cudaSetDevice(count) == cudaErrorInvalidDevice);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidDevice);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    REQUIRE(prop.warpSize == 32);
    REQUIRE(prop.maxThreadsPerBlock == 1024);
    REQUIRE(prop.sharedMemPerBlock == 48 * 1024);
    REQUIRE(prop.sharedMemPerBlockOptin >= prop.sharedMemPerBlock);
    REQUIRE(prop.major >= 8);  // polevault targets sm_80 and sm_90
    int sms = 0, optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    REQUIRE(sms == prop.multiProcessorCount);
    REQUIRE(size_t(optin) == prop.sharedMemPerBlockOptin);
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    REQUIRE(free_bytes <= total);
    REQUIRE(std::string(cudaGetErrorString(cudaErrorInvalidValue)) == "invalid argument");
    REQUIRE(std::string(cudaGetErrorName(cudaErrorInvalidConfiguration)) == "cudaErrorInvalidConfiguration");
}

TEST_CASE("the host device profile: H100 limits, count from the environment", "[runtime][host-only]") {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    REQUIRE(prop.multiProcessorCount == 132);
    REQUIRE(prop.sharedMemPerBlockOptin == 227 * 1024);
    REQUIRE(prop.major == 9);
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    const char* env = std::getenv("POLEVAULT_HOST_DEVICES");
    REQUIRE(count == (env ? std::max(1, std::atoi(env)) : 8));
}

TEST_CASE("the last error is per host thread", "[runtime]") {
    REQUIRE(cudaSetDevice(-1) == cudaErrorInvalidDevice);
    cudaError_t other = cudaErrorUnknown;
    std::thread([&] { other = cudaGetLastError(); }).join();
    REQUIRE(other == cudaSuccess);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidDevice);
}

TEST_CASE("device memory accounting by category", "[runtime][memory]") {
    using pv::MemoryCategory;
    pv::reset_memory_peaks();
    const pv::MemoryStats before = pv::memory_stats();
    auto cur = [&](MemoryCategory c) { return pv::memory_stats().current[size_t(c)] - before.current[size_t(c)]; };
    auto peak = [&](MemoryCategory c) { return pv::memory_stats().peak[size_t(c)] - before.current[size_t(c)]; };

    void* p1 = pv::device_alloc(1000, MemoryCategory::parameters);
    void* g1 = pv::device_alloc(3000, MemoryCategory::gradients);
    void* a1 = pv::device_alloc(5000, MemoryCategory::activations);
    void* h1 = pv::pinned_host_alloc(700);
    REQUIRE(cur(MemoryCategory::parameters) == 1000);
    REQUIRE(cur(MemoryCategory::gradients) == 3000);
    REQUIRE(cur(MemoryCategory::activations) == 5000);
    REQUIRE(cur(MemoryCategory::pinned_host) == 700);
    REQUIRE(pv::memory_stats().device_current - before.device_current == 9000);  // pinned host is not device memory
    pv::memory_free(a1);
    void* a2 = pv::device_alloc(2000, MemoryCategory::activations);
    REQUIRE(cur(MemoryCategory::activations) == 2000);
    REQUIRE(peak(MemoryCategory::activations) == 5000);
    REQUIRE(pv::memory_stats().device_peak - before.device_current == 9000);
    {
        pv::DeviceBuffer<double> opt(100, MemoryCategory::optimizer_state);
        pv::DeviceBuffer<double> moved = std::move(opt);
        REQUIRE(cur(MemoryCategory::optimizer_state) == 800);
        REQUIRE(moved.size() == 100);
        // The memory is real device memory: a kernel-visible round trip.
        const auto host = random_vector<double>(100, 4);
        CUDA_CHECK(cudaMemcpy(moved.get(), host.data(), moved.bytes(), cudaMemcpyHostToDevice));
        std::vector<double> back(100);
        CUDA_CHECK(cudaMemcpy(back.data(), moved.get(), moved.bytes(), cudaMemcpyDeviceToHost));
        REQUIRE(back == host);
    }
    REQUIRE(cur(MemoryCategory::optimizer_state) == 0);
    REQUIRE(peak(MemoryCategory::optimizer_state) == 800);
    REQUIRE(pv::memory_stats().device_peak - before.device_current == 9000);  // 1000+3000+2000+800 < 9000
    pv::reset_memory_peaks();
    REQUIRE(peak(MemoryCategory::activations) == 2000);
    for (void* p : {p1, g1, a2, h1}) pv::memory_free(p);
    REQUIRE(pv::memory_stats().device_current == before.device_current);
    REQUIRE(pv::format_memory_stats(pv::memory_stats()).find("optimizer state") != std::string::npos);
}
