// The platform's speed: what a kernel launch, an emulated thread, a barrier or shuffle crossing
// and a GEMM cost on this backend. `make bench` runs it with one worker
// (POLEVAULT_HOST_WORKERS=1), so host figures are per core.
//
//   launches/s          empty kernel, one thread, back to back
//   graph               the same kernels 1000 to a stream, launched one by one and as one CUDA
//                       graph captured from them (cudaGraphLaunch): the launch cost a graph saves
//   threads/s           a barrier-free kernel (axpy), in emulated CUDA threads per second
//   crossings/s         a kernel whose threads cross __syncthreads and __shfl_xor_sync in a loop,
//                       in thread-crossings per second (one thread passing one barrier/shuffle)
//   GEMM GFLOP/s        cublasGemmEx, square, per dtype
#include "bench/timing.h"
#include "platform/device_memory.h"
#include "platform/platform.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace platform_bench {

__global__ void empty_kernel() {}

__global__ void axpy(float a, const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// Each round: one __syncthreads and one shuffle per thread, with shared memory in between so
// the barrier is needed.
__global__ void crossings(float* out, int rounds) {
    __shared__ float s[256];
    float v = float(threadIdx.x);
    for (int r = 0; r < rounds; ++r) {
        s[threadIdx.x] = v;
        __syncthreads();
        v = s[(threadIdx.x + 1) % blockDim.x] + __shfl_xor_sync(0xffffffffu, v, 1) * 0.5f;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

template <class F>
double time_it(int repeats, F body) {
    return pv::bench::seconds_per_call(repeats, body);
}

void bench_gemm(cublasHandle_t handle, const char* name, cudaDataType type, cublasComputeType_t compute, int n,
                size_t elem_bytes) {
    const size_t bytes = size_t(n) * n * elem_bytes;
    void* a = pv::device_alloc(bytes, pv::MemoryCategory::workspace);
    void* b = pv::device_alloc(bytes, pv::MemoryCategory::workspace);
    void* c = pv::device_alloc(bytes, pv::MemoryCategory::workspace);
    CUDA_CHECK(cudaMemset(a, 0x3C, bytes));  // small finite values in every dtype
    CUDA_CHECK(cudaMemset(b, 0x3C, bytes));
    const double alpha64 = 1.0, beta64 = 0.0;
    const float alpha32 = 1.0f, beta32 = 0.0f;
    const bool f64 = compute == CUBLAS_COMPUTE_64F;
    const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
    const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
    const double s = time_it(3, [&] {
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, alpha, a, type, n, b, type, n, beta, c,
                                  type, n, compute, CUBLAS_GEMM_DEFAULT));
    });
    std::printf("  GEMM %-5s %4d^3            %10.2f GFLOP/s\n", name, n, 2.0 * n * n * n / s * 1e-9);
    for (void* p : {a, b, c}) pv::memory_free(p);
}

}  // namespace platform_bench

using namespace platform_bench;

int main() {
    std::printf("polevault platform benchmark (backend: %s, POLEVAULT_HOST_WORKERS=%s)\n", PV_BACKEND_NAME,
                std::getenv("POLEVAULT_HOST_WORKERS") ? std::getenv("POLEVAULT_HOST_WORKERS") : "default");

    const double launch_s = time_it(20000, [] { launch(empty_kernel, dim3(1), dim3(1), 0, nullptr); });
    std::printf("  empty-kernel launches      %10.0f launches/s  (%.2f us each)\n", 1.0 / launch_s, launch_s * 1e6);

    {
        // A blocking stream, so the timing events on the legacy stream order with its work.
        constexpr int kPerGraph = 1000;
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreate(&s));
        const auto launch_all = [&] {
            for (int i = 0; i < kPerGraph; ++i) launch(empty_kernel, dim3(1), dim3(1), 0, s);
        };
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        launch_all();
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        const double eager_s = time_it(20, launch_all) / kPerGraph;
        const double graph_s = time_it(20, [&] { CUDA_CHECK(cudaGraphLaunch(exec, s)); }) / kPerGraph;
        std::printf("  %d empty kernels           %10.2f us each launched, %.2f us each as one graph\n", kPerGraph,
                    eager_s * 1e6, graph_s * 1e6);
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
        CUDA_CHECK(cudaStreamDestroy(s));
    }

    const int n = 1 << 22;
    float* x = static_cast<float*>(pv::device_alloc(n * sizeof(float), pv::MemoryCategory::workspace));
    float* y = static_cast<float*>(pv::device_alloc(n * sizeof(float), pv::MemoryCategory::workspace));
    CUDA_CHECK(cudaMemset(x, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(y, 0, n * sizeof(float)));
    const double axpy_s = time_it(5, [&] { launch(axpy, dim3(n / 256), dim3(256), 0, nullptr, 2.0f, x, y, n); });
    std::printf("  barrier-free threads       %10.2f M threads/s  (%.1f ns per thread)\n", n / axpy_s * 1e-6,
                axpy_s / n * 1e9);

    const int blocks = 256, threads = 256, rounds = 16;
    const double cross_s = time_it(3, [&] { launch(crossings, dim3(blocks), dim3(threads), 0, nullptr, y, rounds); });
    const double crossings_per_launch = double(blocks) * threads * rounds * 2;  // a barrier and a shuffle per round
    std::printf("  barrier+shuffle crossings  %10.2f M crossings/s  (%.1f ns per crossing)\n",
                crossings_per_launch / cross_s * 1e-6, cross_s / crossings_per_launch * 1e9);
    pv::memory_free(x);
    pv::memory_free(y);

    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    bench_gemm(handle, "fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F, 1024, 4);
    bench_gemm(handle, "bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1024, 2);
    bench_gemm(handle, "fp64", CUDA_R_64F, CUBLAS_COMPUTE_64F, 512, 8);
    CUBLAS_CHECK(cublasDestroy(handle));
    return 0;
}
