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
#include "platform/device_memory.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

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
__host__ __device__ inline __nv_bfloat16 adamw_stochastic_round_bf16(float x, uint32_t random) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);  // the bits (host and device: the CPU update shares this code)
    if ((u & 0x7F800000u) == 0x7F800000u) return __float2bfloat16(x);  // NaN or infinity
    const uint32_t rounded = (u + (random & 0xFFFFu)) >> 16;
    return __ushort_as_bfloat16((unsigned short)rounded);
}

// The update of one element (the header's formulas, in this order), shared by the per-tensor and
// the multi-tensor kernels and by the CPU update (optim/adamw_cpu.h) so that all make bit-identical
// updates. p is the master value (or the
// parameter itself for fp32/fp64), `decay` the weight-decay factor of the element's tensor.
template <class A, class G>
__host__ __device__ inline void adamw_math(A& p, G grad, A& m, A& v, const AdamWCoefficients<A>& c, A decay) {
    A g;
    if constexpr (std::is_same_v<G, __nv_bfloat16>)
        g = A(__bfloat162float(grad));
    else
        g = A(grad);
    // Each operation rounded on its own (acc_mul etc., kernels/common.cuh): no FMA, so both
    // kernels, and a CPU loop written in the same order, round identically.
    g = acc_mul(g, c.grad_scale);
    p = acc_mul(p, decay);  // decoupled weight decay: before, and independent of, the Adam step
    m = acc_add(acc_mul(c.beta1, m), acc_mul(c.one_minus_beta1, g));
    v = acc_add(acc_mul(c.beta2, v), acc_mul(acc_mul(c.one_minus_beta2, g), g));
    p = acc_sub(p, acc_div(acc_mul(c.step_size, m), acc_add(acc_div(acc_sqrt(v), c.bias2_sqrt), c.eps)));
}

// The stored parameter from the updated master: round to nearest even, or stochastic rounding
// keyed by (seed, tensor_id, element, step); fp32/fp64 store the value itself.
template <class T>
__host__ __device__ inline T adamw_stored_param(acc_t<T> p, bool stochastic_rounding, uint64_t seed, uint32_t tensor_id,
                                                long long element, uint32_t step) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        if (stochastic_rounding) {
            const Philox4 r = philox_draw(seed, RandomPurpose::stochastic_rounding, tensor_id, uint64_t(element), step);
            return adamw_stochastic_round_bf16(p, r.v[0]);
        }
        return from_acc<T>(p);  // round to nearest even
    } else {
        return p;
    }
}

template <class T, class G>
__global__ void adamw_update_kernel(T* params, acc_t<T>* master, const G* grads, acc_t<T>* m, acc_t<T>* v, long long n,
                                    AdamWCoefficients<acc_t<T>> c, bool stochastic_rounding, uint64_t seed,
                                    uint32_t tensor_id, long long first_element, uint32_t step) {
    using A = acc_t<T>;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    constexpr bool has_master = std::is_same_v<T, __nv_bfloat16>;
    A p = has_master ? master[i] : A(params[i]);
    A mi = m[i], vi = v[i];
    adamw_math(p, grads[i], mi, vi, c, c.decay);
    m[i] = mi;
    v[i] = vi;
    if constexpr (has_master) master[i] = p;
    params[i] = adamw_stored_param<T>(p, stochastic_rounding, seed, tensor_id, first_element + i, step);
}

// ---- the multi-tensor update: one launch over a group's owned range ------------------------------
//
// An owned range (a unit's whole padded group, or a ZeRO shard of it) holds pieces of several
// tensors and padding. Its table lists the pieces: slot s covers elements [begin, end) of the
// range (index 0 = the range's first element), which are elements [first_element, first_element +
// end − begin) of tensor tensor_id, and blocks [first_block, first_block + ceil((end − begin) /
// kAdamWChunk)) of the launch. A block finds its slot by a binary search over first_block and
// updates one chunk of kAdamWChunk elements of it, 4 consecutive elements per thread: as 4-wide
// vector loads and stores (16 bytes of float m, v and master, 8 of bf16) when the slot's start
// and every pointer are aligned for them, element by element otherwise and at a slot's ragged
// end. Padding lies in no slot, so it is never read or written. Each element's math is
// adamw_math with its tensor's decay factor and its rounding key (tensor_id, first_element + i −
// begin), exactly what adamw_update on that tensor's piece does: the two are bit-identical.
//
// The gradient scale can come from device memory (the clip scale the step computed on the device,
// optim/clip.cuh), so the update is queued without the host ever seeing the norm. A scale that is
// not finite (a NaN or infinite gradient norm or loss) makes every block return before touching
// anything: the step is refused with the parameters and the state intact, and the host, reading
// the norm after the update, reports it.
//
// Non-finite results. `nonfinite` (null: not watched) is a device word the caller sets to
// kAdamWAllFinite before the launch; an element whose new parameter (the stored value), m or v is
// NaN or infinite lowers it to that element's index in the owned range (atomicMin, so the first
// such element whatever the block order). The math is untouched — the check reads what was written
// — so the update stays bit-identical, and the branch is never taken in a healthy run.

inline constexpr int kAdamWVector = 4;  // elements per thread
inline constexpr long long kAdamWChunk = 256LL * kAdamWVector;
inline constexpr unsigned long long kAdamWAllFinite = ~0ULL;  // `nonfinite`: no element went non-finite

// Whether an updated element is finite: its stored parameter, m and v (x − x is 0 exactly for
// finite x; NaN otherwise). Shared by the kernel and the CPU update (optim/adamw_cpu.cu).
template <class T>
__host__ __device__ inline bool adamw_finite(T stored, acc_t<T> m, acc_t<T> v) {
    const acc_t<T> p = to_acc(stored);
    return p - p == acc_t<T>(0) && m - m == acc_t<T>(0) && v - v == acc_t<T>(0);
}

struct AdamWSlot {
    long long begin = 0, end = 0;  // elements of the owned range
    long long first_element = 0;   // element index within the tensor of element `begin`
    long long first_block = 0;     // the launch's first block for this slot
    uint32_t tensor_id = 0;
    uint32_t decay = 1;  // 1: the tensor is decayed (its decay flag); 0: only with decay_norm_weights
};

// Four consecutive elements, aligned so that one load moves them all (a 128-bit access for four
// floats, 64-bit for four bf16, two 128-bit ones for four doubles).
template <class X>
struct alignas(kAdamWVector * sizeof(X)) AdamWPack {
    X x[kAdamWVector];
};

// decay_on: 1 − lr·wd, the factor of decayed tensors; c.decay the factor of the others (1, or
// 1 − lr·wd with decay_norm_weights). device_scale: null, or the gradient scale to use instead of
// c.grad_scale.
template <class T, class G>
__global__ void adamw_group_kernel(T* params, acc_t<T>* master, const G* grads, acc_t<T>* m, acc_t<T>* v,
                                   const AdamWSlot* slots, int slot_count, AdamWCoefficients<acc_t<T>> c,
                                   acc_t<T> decay_on, const double* device_scale, bool stochastic_rounding,
                                   uint64_t seed, uint32_t step, bool aligned, unsigned long long* nonfinite) {
    using A = acc_t<T>;
    constexpr bool has_master = std::is_same_v<T, __nv_bfloat16>;
    if (device_scale) {
        const double scale = *device_scale;
        if (!(scale - scale == 0.0)) return;  // NaN or infinite: refuse the whole step
        c.grad_scale = A(scale);
    }
    const long long block = blockIdx.x;
    int lo = 0, hi = slot_count - 1;  // the last slot whose first block is at or before this one
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (slots[mid].first_block <= block)
            lo = mid;
        else
            hi = mid - 1;
    }
    const AdamWSlot s = slots[lo];
    const A decay = s.decay ? decay_on : c.decay;
    const long long chunk_end = s.begin + (block - s.first_block + 1) * kAdamWChunk;
    const long long end = chunk_end < s.end ? chunk_end : s.end;
    const long long i0 = chunk_end - kAdamWChunk + (long long)threadIdx.x * kAdamWVector;
    const long long key0 = s.first_element + (i0 - s.begin);
    if (aligned && s.begin % kAdamWVector == 0 && i0 + kAdamWVector <= end) {
        A p[kAdamWVector];
        AdamWPack<A> mp = *reinterpret_cast<const AdamWPack<A>*>(m + i0);
        AdamWPack<A> vp = *reinterpret_cast<const AdamWPack<A>*>(v + i0);
        const AdamWPack<G> gp = *reinterpret_cast<const AdamWPack<G>*>(grads + i0);
        if constexpr (has_master) {
            const AdamWPack<A> pp = *reinterpret_cast<const AdamWPack<A>*>(master + i0);
            for (int j = 0; j < kAdamWVector; ++j) p[j] = pp.x[j];
        } else {
            const AdamWPack<T> pp = *reinterpret_cast<const AdamWPack<T>*>(params + i0);
            for (int j = 0; j < kAdamWVector; ++j) p[j] = A(pp.x[j]);
        }
        AdamWPack<T> out;
        for (int j = 0; j < kAdamWVector; ++j) {
            adamw_math(p[j], gp.x[j], mp.x[j], vp.x[j], c, decay);
            out.x[j] = adamw_stored_param<T>(p[j], stochastic_rounding, seed, s.tensor_id, key0 + j, step);
        }
        if (nonfinite)
            for (int j = 0; j < kAdamWVector; ++j)
                if (!adamw_finite<T>(out.x[j], mp.x[j], vp.x[j])) {
                    atomicMin(nonfinite, (unsigned long long)(i0 + j));
                    break;
                }
        *reinterpret_cast<AdamWPack<A>*>(m + i0) = mp;
        *reinterpret_cast<AdamWPack<A>*>(v + i0) = vp;
        if constexpr (has_master) {
            AdamWPack<A> mo;
            for (int j = 0; j < kAdamWVector; ++j) mo.x[j] = p[j];
            *reinterpret_cast<AdamWPack<A>*>(master + i0) = mo;
        }
        *reinterpret_cast<AdamWPack<T>*>(params + i0) = out;
        return;
    }
    for (int j = 0; j < kAdamWVector; ++j) {
        const long long i = i0 + j;
        if (i >= end) break;
        A p = has_master ? master[i] : A(params[i]);
        A mi = m[i], vi = v[i];
        adamw_math(p, grads[i], mi, vi, c, decay);
        m[i] = mi;
        v[i] = vi;
        if constexpr (has_master) master[i] = p;
        const T stored = adamw_stored_param<T>(p, stochastic_rounding, seed, s.tensor_id, key0 + j, step);
        params[i] = stored;
        if (nonfinite && !adamw_finite<T>(stored, mi, vi)) atomicMin(nonfinite, (unsigned long long)i);
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
static_assert(kAdamWChunk == kAdamWBlock * kAdamWVector, "a multi-tensor block updates one chunk");

// The step's constants in the accumulator type, formed in double; `weight_decay` the decay of the
// tensor (step.weight_decay, or 0 for a tensor that is not decayed).
template <class A>
AdamWCoefficients<A> adamw_coefficients(const AdamWStep& step, double weight_decay) {
    if (step.t < 1) {
        std::fprintf(stderr, "polevault: adamw: step t must be >= 1 (got %lld)\n", step.t);
        std::abort();
    }
    const double t = double(step.t);
    AdamWCoefficients<A> c;
    c.decay = A(1.0 - step.lr * weight_decay);
    c.beta1 = A(step.beta1);
    c.one_minus_beta1 = A(1.0 - step.beta1);
    c.beta2 = A(step.beta2);
    c.one_minus_beta2 = A(1.0 - step.beta2);
    c.step_size = A(step.lr / (1.0 - std::pow(step.beta1, t)));
    c.bias2_sqrt = A(std::sqrt(1.0 - std::pow(step.beta2, t)));
    c.eps = A(step.eps);
    c.grad_scale = A(step.grad_scale);
    return c;
}

// A bf16 parameter array needs a float master, fp32/fp64 ones must have none.
template <class T>
void adamw_check_master(const void* master, const char* who) {
    constexpr bool needs_master = std::is_same_v<T, __nv_bfloat16>;
    if (needs_master != (master != nullptr)) {
        std::fprintf(stderr, "polevault: %s: %s\n", who,
                     needs_master ? "bf16 parameters need a float master copy (master is null)"
                                  : "fp32/fp64 parameters are their own master (master must be null)");
        std::abort();
    }
}

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
    adamw_check_master<T>(master, "adamw_update");
    if (n <= 0) return;  // an empty grid is a launch error
    const AdamWCoefficients<A> c = adamw_coefficients<A>(step, step.weight_decay);
    launch(adamw_update_kernel<T, G>, dim3(ceil_div(n, kAdamWBlock)), dim3(kAdamWBlock), 0, stream, params, master,
           grads, m, v, n, c, stochastic_rounding, seed, tensor_id, first_element, uint32_t(step.t));
    CUDA_CHECK_LAUNCH();
}

// One tensor's piece of an owned range, for the table: elements [begin, end) of the range are
// elements [first_element, first_element + end − begin) of tensor tensor_id; decay: its decay flag.
struct AdamWPiece {
    long long begin, end, first_element;
    uint32_t tensor_id;
    bool decay;
};

// The device table of an owned range's pieces (the multi-tensor update's slots), built once.
class AdamWTable {
  public:
    AdamWTable() = default;
    // Pieces must be non-empty and in increasing, non-overlapping order.
    explicit AdamWTable(const std::vector<AdamWPiece>& pieces) {
        std::vector<AdamWSlot> slots;
        for (const AdamWPiece& p : pieces) {
            if (p.end <= p.begin || p.begin < 0 || p.first_element < 0 ||
                (!slots.empty() && p.begin < slots.back().end)) {
                std::fprintf(stderr, "polevault: AdamWTable: piece [%lld, %lld) is empty or out of order\n", p.begin,
                             p.end);
                std::abort();
            }
            slots.push_back({p.begin, p.end, p.first_element, blocks_, p.tensor_id, p.decay ? 1u : 0u});
            blocks_ += ceil_div(p.end - p.begin, kAdamWChunk);
        }
        if (slots.empty()) return;
        slots_ = DeviceBuffer<AdamWSlot>(slots.size(), MemoryCategory::workspace);  // a few bytes per tensor
        CUDA_CHECK(cudaMemcpy(slots_.get(), slots.data(), slots_.bytes(), cudaMemcpyHostToDevice));
    }
    const AdamWSlot* slots() const { return slots_.get(); }
    int count() const { return int(slots_.size()); }
    long long blocks() const { return blocks_; }

  private:
    DeviceBuffer<AdamWSlot> slots_;
    long long blocks_ = 0;
};

// One AdamW step over an owned range in one launch (the multi-tensor kernel above): params,
// master, grads, m and v point at the range's element 0; table lists its tensors' pieces. Each
// piece is updated exactly as adamw_update would update it with weight decay step.weight_decay
// where the piece's decay flag is set or decay_norm_weights, 0 elsewhere. device_scale: null (use
// step.grad_scale), or a device double holding the gradient scale; a scale that is not finite
// leaves everything untouched. nonfinite: null, or a device word lowered to the index of the first
// element whose result is not finite (the multi-tensor kernel's comment).
template <class T, class G>
void adamw_update_group(T* params, acc_t<T>* master, const G* grads, acc_t<T>* m, acc_t<T>* v, const AdamWTable& table,
                        const AdamWStep& step, bool decay_norm_weights, const double* device_scale,
                        bool stochastic_rounding, uint64_t seed, cudaStream_t stream,
                        unsigned long long* nonfinite = nullptr) {
    static_assert(std::is_same_v<G, T> || std::is_same_v<G, float>, "gradients are T or float");
    using A = acc_t<T>;
    adamw_check_master<T>(master, "adamw_update_group");
    if (table.blocks() == 0) return;  // nothing of the range is a tensor
    // The tensors without the decay flag keep c.decay; the others get decay_on.
    const AdamWCoefficients<A> c = adamw_coefficients<A>(step, decay_norm_weights ? step.weight_decay : 0.0);
    const A decay_on = adamw_coefficients<A>(step, step.weight_decay).decay;
    auto fits = [](const void* p, size_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; };
    const bool aligned = fits(params, sizeof(AdamWPack<T>)) && fits(master, sizeof(AdamWPack<A>)) &&
                         fits(grads, sizeof(AdamWPack<G>)) && fits(m, sizeof(AdamWPack<A>)) &&
                         fits(v, sizeof(AdamWPack<A>));
    launch(adamw_group_kernel<T, G>, dim3(unsigned(table.blocks())), dim3(kAdamWBlock), 0, stream, params, master,
           grads, m, v, table.slots(), table.count(), c, decay_on, device_scale, stochastic_rounding, seed,
           uint32_t(step.t), aligned, nonfinite);
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
