// Throughput of the CPU AdamW update (optim/adamw_cpu.h), the offloaded optimizer's step: elements
// per second over an owned range of 4 tensors × 1M elements, bf16 (round to nearest and stochastic
// rounding, with a float master) and fp32, on 1 thread and on cpu_threads_per_rank() threads
// (POLEVAULT_CPU_THREADS overrides). Bytes moved per element: bf16 2 (grad) + 3 × 4 read and
// written (master, m, v) + 2 (param); fp32 4 + 3 × 4 + 4 (param read) — printed as GB/s beside.
#include "optim/adamw_cpu.h"

#include <chrono>
#include <cstdio>
#include <vector>

namespace {

using pv::acc_t;

template <class T>
void run(const char* name, bool stochastic, int threads) {
    using A = acc_t<T>;
    constexpr long long kTensor = 1 << 20, kTensors = 4, n = kTensor * kTensors;
    constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
    std::vector<T> params(size_t(n), T(0.5f));
    std::vector<T> grads(size_t(n), T(0.01f));
    std::vector<A> master(bf ? size_t(n) : 0, A(0.5f)), m(size_t(n), A(0.001f)), v(size_t(n), A(0.0001f));
    std::vector<pv::AdamWPiece> pieces;
    for (long long k = 0; k < kTensors; ++k)
        pieces.push_back({k * kTensor, (k + 1) * kTensor, 0, uint32_t(k), k % 2 == 0});
    pv::ThreadPool pool(threads);
    pv::AdamWStep step{.lr = 1e-3, .weight_decay = 0.1};
    auto once = [&] {
        pv::adamw_update_cpu<T, T>(params.data(), bf ? master.data() : nullptr, grads.data(), m.data(), v.data(),
                                   pieces, step, false, 1.0, stochastic, 7, pool);
        ++step.t;
    };
    once();  // first touches
    const int repeats = 5;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) once();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
    const double bytes = bf ? 2 + 2 * 12 + 2 : 4 + 2 * 8 + 2 * 4;
    std::printf("adamw_cpu %-22s %2d thread(s): %7.1f M elements/s (%5.2f GB/s)\n", name, threads, n / s / 1e6,
                n * bytes / s / 1e9);
}

}  // namespace

int main() {
    for (int threads : {1, pv::cpu_threads_per_rank()}) {
        run<__nv_bfloat16>("bf16 round to nearest", false, threads);
        run<__nv_bfloat16>("bf16 stochastic", true, threads);
        run<float>("fp32", false, threads);
    }
    return 0;
}
