// AdamW on the CPU (see optim/adamw_cpu.h).
#include "optim/adamw_cpu.h"

namespace pv {

namespace {

// Elements [lo, hi) of one piece; `key` the rounding key of element lo. The rounding mode is a
// template parameter so the loop body has no branch on it (fp32/fp64 loops vectorise).
template <class T, class G, bool kStochastic>
void update_span(T* __restrict__ params, acc_t<T>* __restrict__ master, const G* __restrict__ grads,
                 acc_t<T>* __restrict__ m, acc_t<T>* __restrict__ v, long long lo, long long hi,
                 const AdamWCoefficients<acc_t<T>>& c, acc_t<T> decay, uint64_t seed, uint32_t tensor_id, long long key,
                 uint32_t step) {
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        for (long long i = lo; i < hi; ++i) {
            A p = master[i];
            adamw_math(p, grads[i], m[i], v[i], c, decay);
            master[i] = p;
            params[i] = adamw_stored_param<T>(p, kStochastic, seed, tensor_id, key + (i - lo), step);
        }
    } else {  // the parameters are their own master
        for (long long i = lo; i < hi; ++i) {
            A p = A(params[i]);
            adamw_math(p, grads[i], m[i], v[i], c, decay);
            params[i] = p;
        }
    }
}

// The first index in [lo, hi) whose stored parameter, m or v is not finite, or kAdamWAllFinite.
template <class T>
unsigned long long first_nonfinite(const T* params, const acc_t<T>* m, const acc_t<T>* v, long long lo, long long hi) {
    for (long long i = lo; i < hi; ++i)
        if (!adamw_finite<T>(params[i], m[i], v[i])) return (unsigned long long)i;
    return kAdamWAllFinite;
}

}  // namespace

template <class T, class G>
bool adamw_update_cpu(T* params, acc_t<T>* master, const G* grads, acc_t<T>* m, acc_t<T>* v,
                      const std::vector<AdamWPiece>& pieces, const AdamWStep& step, bool decay_norm_weights,
                      double grad_scale, bool stochastic_rounding, uint64_t seed, ThreadPool& pool,
                      unsigned long long* nonfinite) {
    using A = acc_t<T>;
    adamw_check_master<T>(master, "adamw_update_cpu");
    if (!(grad_scale - grad_scale == 0.0)) return false;  // NaN or infinite: refuse the step, as the kernel
    // The launcher's coefficients (adamw_update_group): the factor of tensors without the decay
    // flag in c.decay, decay_on for the others; the scale as the kernel converts it.
    AdamWCoefficients<A> c = adamw_coefficients<A>(step, decay_norm_weights ? step.weight_decay : 0.0);
    const A decay_on = adamw_coefficients<A>(step, step.weight_decay).decay;
    c.grad_scale = A(grad_scale);
    struct Span {
        const AdamWPiece* piece;
        long long lo, hi;
    };
    std::vector<Span> spans;
    for (const AdamWPiece& p : pieces)
        for (long long lo = p.begin; lo < p.end; lo += kAdamWCpuChunk)
            spans.push_back({&p, lo, std::min(lo + kAdamWCpuChunk, p.end)});
    std::vector<unsigned long long> first_bad(nonfinite ? spans.size() : 0, kAdamWAllFinite);  // per span
    pool.run(spans.size(), [&](size_t k) {
        const Span& s = spans[k];
        const AdamWPiece& p = *s.piece;
        const A decay = p.decay ? decay_on : c.decay;
        const long long key = p.first_element + (s.lo - p.begin);
        if (stochastic_rounding)
            update_span<T, G, true>(params, master, grads, m, v, s.lo, s.hi, c, decay, seed, p.tensor_id, key,
                                    uint32_t(step.t));
        else
            update_span<T, G, false>(params, master, grads, m, v, s.lo, s.hi, c, decay, seed, p.tensor_id, key,
                                     uint32_t(step.t));
        if (nonfinite) first_bad[k] = first_nonfinite(params, m, v, s.lo, s.hi);
    });
    for (unsigned long long i : first_bad) *nonfinite = std::min(*nonfinite, i);
    return true;
}

#define PV_ADAMW_CPU(T, G)                                                                                     \
    template bool adamw_update_cpu<T, G>(T*, acc_t<T>*, const G*, acc_t<T>*, acc_t<T>*,                        \
                                         const std::vector<AdamWPiece>&, const AdamWStep&, bool, double, bool, \
                                         uint64_t, ThreadPool&, unsigned long long*);
PV_ADAMW_CPU(__nv_bfloat16, __nv_bfloat16)
PV_ADAMW_CPU(__nv_bfloat16, float)
PV_ADAMW_CPU(float, float)
PV_ADAMW_CPU(double, double)
#undef PV_ADAMW_CPU

}  // namespace pv
