// demo: the platform at work until `train` exists. It runs a few real CUDA kernels and a cuBLAS
// GEMM on whichever backend this was built for, checks each against a plain loop, and prints
// what it ran, how long it took and the device memory it used by category.
//
//   ./demo            (no arguments; exits non-zero if any check fails)
#include "platform/device_memory.h"
#include "platform/platform.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

// Softmax of each row of x[rows][cols] (one block per row): a block-wide max and sum, each a
// warp-shuffle reduction followed by a reduction over the warps' partial results in shared memory.
template <int kBlock>
__global__ void softmax_rows(const float* x, float* y, int cols) {
    __shared__ float partial[kBlock / 32];
    const float* row = x + size_t(blockIdx.x) * cols;
    float* out = y + size_t(blockIdx.x) * cols;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    auto block_reduce = [&](float v, bool is_max) {
        for (int offset = 16; offset > 0; offset /= 2) {
            const float o = __shfl_xor_sync(0xffffffffu, v, offset);
            v = is_max ? fmaxf(v, o) : v + o;
        }
        if (lane == 0) partial[warp] = v;
        __syncthreads();
        v = partial[0];
        for (int w = 1; w < kBlock / 32; ++w) v = is_max ? fmaxf(v, partial[w]) : v + partial[w];
        __syncthreads();  // partial is reused by the next reduction
        return v;
    };

    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += kBlock) m = fmaxf(m, row[c]);
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += kBlock) s += expf(row[c] - m);
    s = block_reduce(s, false);
    for (int c = threadIdx.x; c < cols; c += kBlock) out[c] = expf(row[c] - m) / s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("polevault platform demo (backend: %s)\n", PV_BACKEND_NAME);
    std::printf("device 0: %s, %d SMs, %zu KiB shared memory per block (%zu KiB opt-in)\n\n", prop.name,
                prop.multiProcessorCount, prop.sharedMemPerBlock / 1024, prop.sharedMemPerBlockOptin / 1024);
    bool ok = true;

    // 1. Softmax over rows: 256 rows of 1000 random logits, one 256-thread block per row.
    const int rows = 256, cols = 1000;
    std::vector<float> x(size_t(rows) * cols);
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& v : x) v = normal(rng);
    auto* dx = static_cast<float*>(pv::device_alloc(x.size() * sizeof(float), pv::MemoryCategory::activations));
    auto* dy = static_cast<float*>(pv::device_alloc(x.size() * sizeof(float), pv::MemoryCategory::activations));
    CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    auto t0 = std::chrono::steady_clock::now();
    launch(softmax_rows<256>, dim3(rows), dim3(256), 0, nullptr, dx, dy, cols);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());
    const double softmax_s = seconds_since(t0);
    std::vector<float> y(x.size());
    CUDA_CHECK(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        for (int c = 0; c < cols; ++c) m = std::max(m, double(x[size_t(r) * cols + c]));
        for (int c = 0; c < cols; ++c) s += std::exp(double(x[size_t(r) * cols + c]) - m);
        for (int c = 0; c < cols; ++c) {
            const double ref = std::exp(double(x[size_t(r) * cols + c]) - m) / s;
            worst = std::max(worst, std::fabs(y[size_t(r) * cols + c] - ref) / (ref + 1e-30));
        }
    }
    ok &= worst < 1e-4;
    std::printf("softmax   %d x %d floats, %d threads: %8.2f ms, max relative error %.2e  %s\n", rows, cols, rows * 256,
                softmax_s * 1e3, worst, worst < 1e-4 ? "ok" : "WRONG");

    // 2. A cuBLAS GEMM: y[256][384] = x[256][512] · W[384][512]ᵀ (row-major, the forward of a
    //    linear layer), in fp32.
    const int bt = 256, in = 512, out = 384;
    std::vector<float> a(size_t(bt) * in), w(size_t(out) * in);
    for (float& v : a) v = normal(rng);
    for (float& v : w) v = normal(rng) * 0.02f;
    auto* da = static_cast<float*>(pv::device_alloc(a.size() * sizeof(float), pv::MemoryCategory::activations));
    auto* dw = static_cast<float*>(pv::device_alloc(w.size() * sizeof(float), pv::MemoryCategory::parameters));
    auto* dout =
        static_cast<float*>(pv::device_alloc(size_t(bt) * out * sizeof(float), pv::MemoryCategory::activations));
    CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dw, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    const float one = 1.0f, zero = 0.0f;
    t0 = std::chrono::steady_clock::now();
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, bt, in, &one, dw, CUDA_R_32F, in, da, CUDA_R_32F,
                              in, &zero, dout, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CUDA_CHECK(cudaDeviceSynchronize());
    const double gemm_s = seconds_since(t0);
    std::vector<float> got(size_t(bt) * out);
    CUDA_CHECK(cudaMemcpy(got.data(), dout, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double gemm_err = 0, scale = 0;
    for (int i = 0; i < bt; ++i)
        for (int o = 0; o < out; ++o) {
            double ref = 0;
            for (int k = 0; k < in; ++k) ref += double(a[size_t(i) * in + k]) * w[size_t(o) * in + k];
            gemm_err = std::max(gemm_err, std::fabs(got[size_t(i) * out + o] - ref));
            scale = std::max(scale, std::fabs(ref));
        }
    const double gemm_rel = gemm_err / scale;
    ok &= gemm_rel < 1e-5;
    std::printf("gemm      %d x %d x %d fp32:            %8.2f ms (%.2f GFLOP/s), max error %.2e of max |y|  %s\n", bt,
                out, in, gemm_s * 1e3, 2.0 * bt * out * in / gemm_s * 1e-9, gemm_rel, gemm_rel < 1e-5 ? "ok" : "WRONG");
    CUBLAS_CHECK(cublasDestroy(handle));

    std::printf("\ndevice memory by category:\n%s", pv::format_memory_stats(pv::memory_stats()).c_str());
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(dy), static_cast<void*>(da), static_cast<void*>(dw),
                    static_cast<void*>(dout)})
        pv::memory_free(p);
    std::printf("\n%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
