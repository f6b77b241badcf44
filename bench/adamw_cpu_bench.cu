// Throughput of the CPU AdamW update (optim/adamw_cpu.h), the offloaded optimizer's step, beside
// what the host's memory can move: for 1, 2, 4, ... up to cpu_threads_per_rank() threads
// (POLEVAULT_CPU_THREADS overrides; the last row is that count), the update's elements per second
// over an owned range of 4 tensors × 4M elements — bf16 (round to nearest and stochastic rounding,
// with a float master) and fp32 — and a streaming copy's GB/s over the same pool and the same
// chunking (kAdamWCpuChunk elements), the ceiling the update is held against.
//
// Bytes per element the update moves: bf16 2 (grad) + 3 × 4 read and written (master, m, v) + 2
// (param written) = 28; fp32 4 (grad) + 3 × 4 read and written (param, m, v) = 28. The copy moves
// 8 bytes an element (4 read, 4 written). The buffers are filled by the main thread (on a
// machine of several memory nodes their pages are that thread's node's); the first call of each
// measurement is not timed.
#include "optim/adamw_cpu.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using pv::acc_t;
constexpr long long kTensor = 1 << 22, kTensors = 4, kElements = kTensor * kTensors;
constexpr int kRepeats = 5;

template <class F>
double seconds_per_call(F&& once) {
    once();  // first touches, and a warm pool
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRepeats; ++i) once();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kRepeats;
}

// Elements per second of the update, and its GB/s at 28 bytes an element.
template <class T>
double update_rate(bool stochastic, pv::ThreadPool& pool) {
    using A = acc_t<T>;
    constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
    std::vector<T> params(size_t(kElements), T(0.5f));
    std::vector<T> grads(size_t(kElements), T(0.01f));
    std::vector<A> master(bf ? size_t(kElements) : 0, A(0.5f)), m(size_t(kElements), A(0.001f)),
        v(size_t(kElements), A(0.0001f));
    std::vector<pv::AdamWPiece> pieces;
    for (long long k = 0; k < kTensors; ++k)
        pieces.push_back({k * kTensor, (k + 1) * kTensor, 0, uint32_t(k), k % 2 == 0});
    pv::AdamWStep step{.lr = 1e-3, .weight_decay = 0.1};
    const double s = seconds_per_call([&] {
        pv::adamw_update_cpu<T, T>(params.data(), bf ? master.data() : nullptr, grads.data(), m.data(), v.data(),
                                   pieces, step, false, 1.0, stochastic, 7, pool);
        ++step.t;
    });
    return double(kElements) / s;
}

// GB/s of a streaming copy of kElements floats, in the update's chunks, over the pool.
double copy_gbs(pv::ThreadPool& pool) {
    std::vector<float> src(size_t(kElements), 1.0f), dst(size_t(kElements), 0.0f);
    const size_t chunks = size_t((kElements + pv::kAdamWCpuChunk - 1) / pv::kAdamWCpuChunk);
    const double s = seconds_per_call([&] {
        pool.run(chunks, [&](size_t c) {
            const size_t begin = c * size_t(pv::kAdamWCpuChunk);
            const size_t n = std::min(size_t(pv::kAdamWCpuChunk), size_t(kElements) - begin);
            std::memcpy(dst.data() + begin, src.data() + begin, n * sizeof(float));
        });
    });
    return double(kElements) * 8 / s / 1e9;
}

}  // namespace

int main() {
    const int most = pv::cpu_threads_per_rank();
    std::vector<int> counts;
    for (int t = 1; t < most; t *= 2) counts.push_back(t);
    counts.push_back(most);
    std::printf("CPU AdamW over %lld elements (4 tensors), %d repeats; M elements/s (GB/s at 28 bytes an element), "
                "and a streaming copy's GB/s (8 bytes an element) over the same pool\n\n",
                kElements, kRepeats);
    std::printf("| threads | bf16, round to nearest | bf16, stochastic rounding | fp32 | copy (memory) |\n");
    std::printf("|---:|---:|---:|---:|---:|\n");
    for (int threads : counts) {
        pv::ThreadPool pool(threads);
        const double nearest = update_rate<__nv_bfloat16>(false, pool);
        const double stochastic = update_rate<__nv_bfloat16>(true, pool);
        const double fp32 = update_rate<float>(false, pool);
        std::printf("| %d | %.0f M/s (%.1f GB/s) | %.0f M/s (%.1f GB/s) | %.0f M/s (%.1f GB/s) | %.1f GB/s |\n",
                    threads, nearest / 1e6, nearest * 28 / 1e9, stochastic / 1e6, stochastic * 28 / 1e9, fp32 / 1e6,
                    fp32 * 28 / 1e9, copy_gbs(pool));
    }
    return 0;
}
