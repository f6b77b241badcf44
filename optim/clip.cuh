// The figures an optimizer step needs from all its gradients and losses — the loss sum, the global
// gradient norm and the clip scale — formed on the device, so that the update can be queued behind
// them without the host waiting for anything (trainer/trainer.h reads them back once, after the
// update is queued).
//
//   sum_losses:    *out = Σ_k double(losses[k]) for k = 0, 1, ... in order (the micro-batches'
//                  loss sums in acc_t<T>, widened exactly), starting from 0.0: the same
//                  additions in the same order the host made when it read each loss back.
//   step_figures:  total = Σ_u unit_norms_sq[u] in unit order from 0.0; norm = sqrt(total)
//                  (correctly rounded on both backends); scale = clip_scale(norm, max_norm)
//                  (optim/schedule.h, the one function the host used), replaced by NaN when the
//                  loss sum is not finite, so that the update (optim/adamw.cuh, which skips a
//                  scale that is not finite) refuses a step whose loss or norm is NaN or infinite
//                  and the host, reading the figures, reports it.
// Both are one thread of one block: a handful of additions, ordered, so bit-identical to the host
// arithmetic they replace.
#pragma once

#include "kernels/common.cuh"
#include "optim/schedule.h"

namespace pv {

struct StepFigures {
    double loss_sum = 0;   // Σ of the loss sums (over micro-batches, and ranks where reduced)
    double grad_norm = 0;  // the global gradient norm before clipping
    double scale = 0;      // the gradient scale the update applies (NaN: the step is refused)
};

template <class A>
__global__ void sum_losses_kernel(const A* losses, int count, double* out) {
    double s = 0;
    for (int k = 0; k < count; ++k) s += double(losses[k]);
    *out = s;
}

__global__ inline void step_figures_kernel(const double* loss_sum, const double* unit_norms_sq, int units,
                                           double max_norm, StepFigures* out) {
    double total = 0;
    for (int u = 0; u < units; ++u) total += unit_norms_sq[u];
    const double norm = sqrt(total);
    const double loss = *loss_sum;
    const double zero_if_finite = loss - loss;
    out->loss_sum = loss;
    out->grad_norm = norm;
    out->scale = zero_if_finite == 0.0 ? clip_scale(norm, max_norm) : zero_if_finite;  // NaN for a bad loss
}

// *out = the sum of losses[count] in index order, as a double.
template <class A>
void sum_losses(const A* losses, int count, double* out, cudaStream_t stream) {
    launch(sum_losses_kernel<A>, dim3(1), dim3(1), 0, stream, losses, count, out);
    CUDA_CHECK_LAUNCH();
}

// *out = the step's figures from the loss sum and the per-unit squared norms (header comment).
inline void step_figures(const double* loss_sum, const double* unit_norms_sq, int units, double max_norm,
                         StepFigures* out, cudaStream_t stream) {
    launch(step_figures_kernel, dim3(1), dim3(1), 0, stream, loss_sum, unit_norms_sq, units, max_norm, out);
    CUDA_CHECK_LAUNCH();
}

}  // namespace pv
