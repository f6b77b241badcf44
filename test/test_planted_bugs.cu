// Planted bugs: kernels with the mistakes the host platform promises to catch. Each buggy kernel
// runs in a hidden test case ("[.planted]") that a visible test starts in a child process; the
// child must die with a message naming the problem. On a GPU these bugs hang or give undefined
// results, so the visible tests are [host-only]; the out-of-bounds write is caught by ASan and
// so runs only in `make test-asan` ([asan]).
#include "test/check.h"

#include <cstdlib>

using namespace pv::test;

namespace planted {

// In block 2, threads 0-15 wait at one __syncthreads and the rest at another: on hardware this
// is undefined (and hangs on some architectures); it can never be a correct barrier.
__global__ void divergent_barrier(float* out) {
    if (blockIdx.x != 2 || threadIdx.x < 16) {
        __syncthreads();
        out[threadIdx.x] = 1.0f;
    } else {
        out[threadIdx.x] = 2.0f;
        __syncthreads();
    }
}

// Lane 0 waits at a shuffle for its warp while lanes 1-31 wait at a barrier for lane 0.
__global__ void shuffle_against_barrier(float* out) {
    float v = float(threadIdx.x);
    if (threadIdx.x == 0)
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    else
        __syncthreads();
    out[threadIdx.x] = v;
}

// The upper half of the warp returns early; the rest shuffle with a full mask.
__global__ void shuffle_with_exited_lanes(const float* in, float* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, in[threadIdx.x], 1);
}

// A correct mask (the lower half), but a source lane outside it.
__global__ void shuffle_source_outside_mask(const float* in, float* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, in[threadIdx.x], 20);
}

// Width 12 is not a power of two.
__global__ void shuffle_bad_width(const float* in, float* out) {
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, in[threadIdx.x], 1, 12);
}

// Threads past n return before a barrier the others use: allowed by hardware (exited threads
// count as arrived), reported only in strict mode.
__global__ void early_exit_before_barrier(const float* in, float* out, int n) {
    __shared__ float s[64];
    if (int(threadIdx.x) >= n) return;
    s[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = s[n - 1 - int(threadIdx.x)];
}

// Writes one element past the end of `out`.
__global__ void write_past_end(float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 3.0f;  // should be i < n
}

}  // namespace planted

using namespace planted;

// ---- the buggy runs (hidden; run only by name, in a child) ----------------------------------

TEST_CASE("planted: divergent barrier", "[.planted]") {
    DeviceArray<float> out(32);
    launch(divergent_barrier, dim3(4), dim3(32), 0, nullptr, out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("planted: shuffle against barrier", "[.planted]") {
    DeviceArray<float> out(64);
    launch(shuffle_against_barrier, dim3(1), dim3(64), 0, nullptr, out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("planted: shuffle with exited lanes", "[.planted]") {
    DeviceArray<float> in(random_vector<float>(32, 1)), out(32);
    launch(shuffle_with_exited_lanes, dim3(1), dim3(32), 0, nullptr, in.get(), out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("planted: shuffle source outside mask", "[.planted]") {
    DeviceArray<float> in(random_vector<float>(32, 2)), out(32);
    launch(shuffle_source_outside_mask, dim3(1), dim3(32), 0, nullptr, in.get(), out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("planted: shuffle bad width", "[.planted]") {
    DeviceArray<float> in(random_vector<float>(32, 3)), out(32);
    launch(shuffle_bad_width, dim3(1), dim3(32), 0, nullptr, in.get(), out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("planted: early exit in strict mode", "[.planted]") {
    setenv("POLEVAULT_HOST_STRICT", "1", 1);  // read at the first barrier of the process
    DeviceArray<float> in(random_vector<float>(64, 4)), out(64);
    launch(early_exit_before_barrier, dim3(1), dim3(64), 0, nullptr, in.get(), out.get(), 40);
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("planted: host reads device memory", "[.planted]") {
    float* device = nullptr;
    CUDA_CHECK(cudaMalloc(&device, 64 * sizeof(float)));
    CUDA_CHECK(cudaMemset(device, 0, 64 * sizeof(float)));
    volatile float x = device[3];  // a device pointer dereferenced on the host
    (void)x;
    CUDA_CHECK(cudaFree(device));
}

TEST_CASE("planted: write past the end", "[.planted]") {
    DeviceArray<float> out(1000);
    launch(write_past_end, dim3(4), dim3(256), 0, nullptr, out.get(), 1000);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- the checks ---------------------------------------------------------------------------------

TEST_CASE("a barrier in divergent code is reported, naming kernel, block, threads and lines", "[host-only][planted]") {
    const auto child = run_in_child("planted: divergent barrier");
    INFO(child.output);
    REQUIRE(child.died);
    REQUIRE_FALSE(child.timed_out);
    REQUIRE(child.output.find("threads wait at different __syncthreads") != std::string::npos);
    REQUIRE(child.output.find("planted::divergent_barrier(float*)") != std::string::npos);
    REQUIRE(child.output.find("block (2,0,0) of a (4,1,1) grid") != std::string::npos);
    REQUIRE(child.output.find("test_planted_bugs.cu:") != std::string::npos);
}

TEST_CASE("a shuffle waiting on lanes that wait at a barrier is reported", "[host-only][planted]") {
    const auto child = run_in_child("planted: shuffle against barrier");
    INFO(child.output);
    REQUIRE(child.died);
    REQUIRE(child.output.find("__shfl_xor_sync (mask 0xffffffff) at") != std::string::npos);
    REQUIRE(child.output.find("can never complete") != std::string::npos);
    REQUIRE(child.output.find("wait at __syncthreads at") != std::string::npos);
}

TEST_CASE("a full-mask shuffle after lanes exited is reported", "[host-only][planted]") {
    // Depending on the order threads run, the report comes when a lane exits while others wait
    // for it, or when a lane arrives at the shuffle after others exited: the same words either way.
    const auto child = run_in_child("planted: shuffle with exited lanes");
    INFO(child.output);
    REQUIRE(child.died);
    REQUIRE(child.output.find("__shfl_xor_sync (mask 0xffffffff) at") != std::string::npos);
    REQUIRE(child.output.find("can never complete") != std::string::npos);
    REQUIRE(child.output.find(", which exited") != std::string::npos);
}

TEST_CASE("a shuffle reading a lane outside its mask is reported", "[host-only][planted]") {
    REQUIRE_DIES_WITH("planted: shuffle source outside mask", "reads lane 20 in __shfl_sync");
}

TEST_CASE("a shuffle with a width that is not a power of two is reported", "[host-only][planted]") {
    REQUIRE_DIES_WITH("planted: shuffle bad width", "with width 12");
}

TEST_CASE("early exit before a barrier: hardware semantics by default, reported in strict mode",
          "[host-only][planted]") {
    REQUIRE_DIES_WITH("planted: early exit in strict mode", "threads 40-63 exited before the __syncthreads");
    // Without strict mode the same kernel is correct: exited threads count as arrived.
    const auto host = random_vector<float>(64, 4);
    DeviceArray<float> in(host), out(64);
    launch(early_exit_before_barrier, dim3(1), dim3(64), 0, nullptr, in.get(), out.get(), 40);
    CUDA_CHECK_LAUNCH();
    const auto got = out.download();
    for (int i = 0; i < 40; ++i) REQUIRE(got[size_t(i)] == host[size_t(39 - i)]);
    for (int i = 40; i < 64; ++i) REQUIRE(std::isnan(got[size_t(i)]));
}

TEST_CASE("an out-of-bounds kernel write is reported by AddressSanitizer", "[asan][planted]") {
    REQUIRE(pv::kAddressSanitizer);
    REQUIRE_DIES_WITH("planted: write past the end", "heap-buffer-overflow");
    const auto child = run_in_child("planted: write past the end");
    REQUIRE(child.output.find("write_past_end") != std::string::npos);  // the kernel's frame
}

TEST_CASE("host code dereferencing a device pointer is reported by AddressSanitizer", "[asan][planted]") {
    REQUIRE_DIES_WITH("planted: host reads device memory", "use-after-poison");
    const auto child = run_in_child("planted: host reads device memory");
    REQUIRE(child.output.find("test_planted_bugs.cu") != std::string::npos);  // the offending line
}
