// Mixed-precision AdamW with torch.optim.AdamW semantics (DESIGN.md §4), elementwise.
//
// For every element, at step t ≥ 1 (t counts optimizer steps from 1, as torch's `step`):
//   g  = grad · grad_scale                  grad_scale folds gradient clipping in (clip_scale in
//                                           optim/schedule.h) and any other global factor
//   p ← p − lr·wd·p                         decoupled weight decay, on the master value
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + (1 − β2)·g²
//   m̂ = m / (1 − β1ᵗ),  v̂ = v / (1 − β2ᵗ)    bias correction
//   p ← p − lr·m̂ / (sqrt(v̂) + eps)           eps outside the square root
// The kernel evaluates the last line as torch does, p − (lr/(1 − β1ᵗ))·m / (sqrt(v)/sqrt(1 − β2ᵗ)
// + eps), with the step-independent factors lr/(1 − β1ᵗ), sqrt(1 − β2ᵗ) and 1 − lr·wd formed once
// on the host in double and handed to the kernel in the accumulator type.
//
// Storage. Parameters are T ∈ {bf16, fp32, fp64}; m and v are acc_t<T> (float for bf16 and fp32,
// double for fp64); gradients are G, either T or float (an fp32 gradient-accumulation buffer).
// A master copy in acc_t<T> exists only when T is narrower than fp32, i.e. for bf16: the update
// runs on the float master and the bf16 parameter is the master rounded once. For fp32 and fp64
// the parameters are their own master (`master` must be null).
// Bytes per trained parameter:
//   bf16: 2 (param) + 2 (grad) + 4 (master) + 4 (m) + 4 (v) = 16
//   fp32: 4 (param) + 4 (grad) + 4 (m) + 4 (v)             = 16
//   fp64: 8 + 8 + 8 + 8                                      = 32
// (a float gradient buffer for bf16 parameters adds 2 bytes to the bf16 figure).
//
// Rounding the master to bf16. By default round to nearest even (from_acc). With stochastic
// rounding the master x rounds to one of its two bf16 neighbours, up with probability
// (x − down)/(up − down), so E[round(x)] = x and small updates are not lost to rounding:
//   bf16 is the top 16 bits of a float. Let u = bits(x) and r a uniform 16-bit random number.
//   Then  bits(bf16) = (u + r) >> 16.
//   The low 16 bits of u, L, are x's distance above its truncation in units of 2⁻¹⁶ bf16 ulps;
//   u + r carries into bit 16 exactly when r ≥ 65536 − L, which happens for L of the 65536
//   values of r: probability L/65536 = (x − down)/(up − down), exactly. Since floats are sign and
//   magnitude, the same trick rounds the magnitude, so negative values work alike; a carry out of
//   the mantissa bumps the exponent, which is the correct next bf16 value (up to infinity from
//   the largest finite binade, which is where round to nearest goes too). NaN and infinity are
//   left to round to nearest (adding r could turn an infinity into a NaN).
// r is the low half of philox_draw(seed, stochastic_rounding, tensor_id, first_element + i, t):
// keyed by the element's index in its whole tensor and by the step, never by the thread, the
// launch or the shard, so a shard updating elements [first_element, first_element + n) makes
// exactly the choices the unsharded tensor makes, at every world size.
//
// Kernels: one thread per element, 256 per block, no shared memory and no reductions: every
// element's result depends only on its own inputs, so it is deterministic under any schedule.
#pragma once

#include "kernels/common.cuh"
#include "kernels/philox.cuh"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace pv {

// One optimizer step's hyperparameters (torch.optim.AdamW's names; betas default to the usual
// LLM values, not torch's 0.999). t is the 1-based step used in the bias correction and in the
// stochastic-rounding key.
struct AdamWStep {
    double lr;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.0;
    long long t = 1;
    double grad_scale = 1.0;
};

// The per-step constants in the accumulator type, formed on the host in double.
template <class A>
struct AdamWCoefficients {
    A decay;  // 1 − lr·wd
    A beta1, one_minus_beta1;
    A beta2, one_minus_beta2;
    A step_size;   // lr / (1 − β1ᵗ)
    A bias2_sqrt;  // sqrt(1 − β2ᵗ)
    A eps;
    A grad_scale;
};

// bf16 from a float by the stochastic-rounding bit trick of the header comment; `random` supplies
// the 16 random bits in its low half.
__device__ inline __nv_bfloat16 adamw_stochastic_round_bf16(float x, uint32_t random) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return __float2bfloat16(x);  // NaN or infinity
    const uint32_t rounded = (u + (random & 0xFFFFu)) >> 16;
    return __ushort_as_bfloat16((unsigned short)rounded);
}

template <class T, class G>
__global__ void adamw_update_kernel(T* params, acc_t<T>* master, const G* grads, acc_t<T>* m, acc_t<T>* v, long long n,
                                    AdamWCoefficients<acc_t<T>> c, bool stochastic_rounding, uint64_t seed,
                                    uint32_t tensor_id, long long first_element, uint32_t step) {
    using A = acc_t<T>;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    constexpr bool has_master = std::is_same_v<T, __nv_bfloat16>;
    A p;
    if constexpr (has_master)
        p = master[i];
    else
        p = params[i];
    A g;
    if constexpr (std::is_same_v<G, __nv_bfloat16>)
        g = A(__bfloat162float(grads[i]));
    else
        g = A(grads[i]);
    g *= c.grad_scale;
    p *= c.decay;  // decoupled weight decay: before, and independent of, the Adam step
    const A mi = c.beta1 * m[i] + c.one_minus_beta1 * g;
    const A vi = c.beta2 * v[i] + c.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= c.step_size * mi / (acc_sqrt(vi) / c.bias2_sqrt + c.eps);
    if constexpr (has_master) {
        master[i] = p;
        if (stochastic_rounding) {
            const Philox4 r =
                philox_draw(seed, RandomPurpose::stochastic_rounding, tensor_id, uint64_t(first_element + i), step);
            params[i] = adamw_stochastic_round_bf16(p, r.v[0]);
        } else {
            params[i] = from_acc<T>(p);  // round to nearest even
        }
    } else {
        params[i] = p;
    }
}

template <class T>
__global__ void init_master_kernel(const T* params, acc_t<T>* master, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    master[i] = to_acc(params[i]);  // exact: widening
}

// ---- launchers --------------------------------------------------------------------------------

inline constexpr int kAdamWBlock = 256;

// One AdamW step on elements [first_element, first_element + n) of tensor `tensor_id`, whose
// slices are params, master, grads, m and v (n elements each, index 0 = first_element).
// master: the float master copy, non-null exactly when T is bf16 (aborts otherwise); params are
// rewritten from it, by round to nearest even or, with stochastic_rounding, by stochastic
// rounding keyed by (seed, tensor_id, first_element + i, t). stochastic_rounding has no effect
// for fp32 and fp64 (nothing is rounded). m and v start at zero before step t = 1.
template <class T, class G>
void adamw_update(T* params, acc_t<T>* master, const G* grads, acc_t<T>* m, acc_t<T>* v, long long n,
                  const AdamWStep& step, bool stochastic_rounding, uint64_t seed, uint32_t tensor_id,
                  long long first_element, cudaStream_t stream) {
    static_assert(std::is_same_v<G, T> || std::is_same_v<G, float>, "gradients are T or float");
    using A = acc_t<T>;
    constexpr bool needs_master = std::is_same_v<T, __nv_bfloat16>;
    if (needs_master != (master != nullptr)) {
        std::fprintf(stderr, "polevault: adamw_update: %s\n",
                     needs_master ? "bf16 parameters need a float master copy (master is null)"
                                  : "fp32/fp64 parameters are their own master (master must be null)");
        std::abort();
    }
    if (step.t < 1) {
        std::fprintf(stderr, "polevault: adamw_update: step t must be >= 1 (got %lld)\n", step.t);
        std::abort();
    }
    if (n <= 0) return;  // an empty grid is a launch error
    const double t = double(step.t);
    AdamWCoefficients<A> c;
    c.decay = A(1.0 - step.lr * step.weight_decay);
    c.beta1 = A(step.beta1);
    c.one_minus_beta1 = A(1.0 - step.beta1);
    c.beta2 = A(step.beta2);
    c.one_minus_beta2 = A(1.0 - step.beta2);
    c.step_size = A(step.lr / (1.0 - std::pow(step.beta1, t)));
    c.bias2_sqrt = A(std::sqrt(1.0 - std::pow(step.beta2, t)));
    c.eps = A(step.eps);
    c.grad_scale = A(step.grad_scale);
    launch(adamw_update_kernel<T, G>, dim3(ceil_div(n, kAdamWBlock)), dim3(kAdamWBlock), 0, stream, params, master,
           grads, m, v, n, c, stochastic_rounding, seed, tensor_id, first_element, uint32_t(step.t));
    CUDA_CHECK_LAUNCH();
}

// master[n] = params[n] widened to acc_t<T> (exact): the master copy at the start of training or
// after loading bf16 weights.
template <class T>
void init_master(const T* params, acc_t<T>* master, long long n, cudaStream_t stream) {
    if (n <= 0) return;
    launch(init_master_kernel<T>, dim3(ceil_div(n, kAdamWBlock)), dim3(kAdamWBlock), 0, stream, params, master, n);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
