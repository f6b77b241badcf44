// AdamW on the CPU, for optimizer state offloaded to host memory (--offload, optim/offload.h).
//
// The math is the device's, not a copy of it: each element goes through adamw_math and
// adamw_stored_param (optim/adamw.cuh, __host__ __device__), the same expression in the same order
// and the same precision, with the coefficients from the same adamw_coefficients, the same
// per-piece decay flag (AdamWPiece: decay_on where the tensor decays or decay_norm_weights, the
// other factor elsewhere), the same stochastic-rounding key (seed, tensor id, element index within
// the tensor, step) and the same refusal of a step whose gradient scale is not finite. So on the
// host backend the CPU update is bitwise the device kernel's (test/test_adamw.cu), and on a GPU
// too: adamw_math spells every operation with explicitly rounded acc_mul/acc_add/... (no FMA on
// the device, none from g++ in ISO C++ mode). Measured on an H100: test_adamw's CPU-vs-kernel
// cases pass bitwise, and a Llama-3.2-1B run prints the same losses with --offload optimizer.
//
// Work: each piece splits into chunks of kAdamWCpuChunk elements, spread over a ThreadPool. Every
// element depends on its own inputs only, so the result does not depend on the thread count. The
// loop body is branch-free for fp32/fp64 (restrict pointers, one element per iteration), which g++
// vectorises; bf16 with stochastic rounding draws a Philox word per element.
#pragma once

#include "optim/adamw.cuh"
#include "optim/thread_pool.h"

#include <vector>

namespace pv {

inline constexpr long long kAdamWCpuChunk = 1 << 14;

// One AdamW step over an owned range on the host. params, master, grads, m, v: host arrays of the
// range (index 0 = the range's first element); master non-null exactly for bf16; params are read
// (fp32/fp64: they are their own master) and written. `pieces` are the range's tensor pieces
// (owned_pieces). grad_scale replaces step.grad_scale (the device's clip scale, read back); when
// it is not finite nothing is touched and false is returned. nonfinite: null, or lowered to the
// index in the range of the first element whose new parameter, m or v is not finite (as the
// kernel's flag; the caller sets it to kAdamWAllFinite first).
template <class T, class G>
bool adamw_update_cpu(T* params, acc_t<T>* master, const G* grads, acc_t<T>* m, acc_t<T>* v,
                      const std::vector<AdamWPiece>& pieces, const AdamWStep& step, bool decay_norm_weights,
                      double grad_scale, bool stochastic_rounding, uint64_t seed, ThreadPool& pool,
                      unsigned long long* nonfinite = nullptr);

}  // namespace pv
