// Learning-rate schedules (host code) and the gradient-clipping factor (host and device code: the
// training step computes it on the device, optim/clip.cuh, with this same function).
//
// learning_rate(c, step) for the 0-based optimizer step `step`, with lr = c.lr,
// W = c.warmup, N = c.total_steps and final = lr · c.final_fraction:
//
//   warmup (step < W):   lr · (step + 1) / W                 linear ramp; reaches lr at step W − 1
//   afterwards, with progress p = (step − W) / (N − W), clamped to [0, 1]
//   (p = 0 at step W; the last step N − 1 has p = (N − 1 − W)/(N − W) < 1, so `final` itself
//   would be reached at step N, one past the end — the usual Hugging Face convention):
//     constant:  lr
//     cosine:    final + (lr − final) · (1 + cos(π·p)) / 2
//     linear:    lr + (final − lr) · p
//     wsd:       warmup-stable-decay, with d = c.decay_fraction the last part of the post-warmup
//                progress that decays:
//                  lr                                         while p < 1 − d
//                  lr + (final − lr) · (p − (1 − d)) / d      afterwards (d = 0: lr throughout)
//   When N == W (no step after warmup) p is taken as 1.
//
// Gradient clipping (torch.nn.utils.clip_grad_norm_): with the global L2 norm ‖g‖ of all
// gradients (the square root of the sum of sum_of_squares over every tensor, kernels/glue.cuh),
//   clip_scale(‖g‖, max_norm) = max_norm / (‖g‖ + 1e-6)   if max_norm > 0 and ‖g‖ > max_norm
//                               1                          otherwise
//                               NaN                        if ‖g‖ is NaN or infinite (whatever
//                                                          max_norm is), so the caller refuses
//                                                          the step instead of applying it
// The factor is applied as AdamWStep::grad_scale, folded into the update: gradients are never
// rewritten.
#pragma once

#include <cuda_runtime.h>  // __host__ __device__

#include <string>
#include <string_view>
#include <vector>

namespace pv {

enum class LrSchedule { constant, cosine, linear, wsd };

struct LrConfig {
    LrSchedule kind = LrSchedule::cosine;
    double lr = 3e-4;             // peak learning rate
    int warmup = 0;               // steps of linear warmup
    double final_fraction = 0.1;  // final learning rate = lr · final_fraction (cosine, linear, wsd)
    double decay_fraction = 0.2;  // wsd: last part of training that decays
    long long total_steps = 0;    // optimizer steps of the run
};

// The learning rate of 0-based optimizer step `step` (formulas above).
double learning_rate(const LrConfig& c, long long step);

// "constant", "cosine", "linear" or "wsd"; anything else throws std::invalid_argument naming the
// valid names.
LrSchedule parse_schedule(std::string_view name);

// The name parse_schedule accepts for `kind`.
const char* schedule_name(LrSchedule kind);

// Every problem with the config, empty when it is usable. Each message starts with the field and
// its value and says what is allowed.
std::vector<std::string> validate(const LrConfig& c);

// The factor that scales gradients of global norm grad_norm down to max_norm (see above). A norm
// is finite exactly when norm − norm is 0 (NaN − NaN and inf − inf are NaN): a test that means
// the same in host and device code.
__host__ __device__ inline double clip_scale(double grad_norm, double max_norm) {
    const double zero_if_finite = grad_norm - grad_norm;
    if (!(zero_if_finite == 0.0)) return zero_if_finite;  // NaN
    return max_norm > 0 && grad_norm > max_norm ? max_norm / (grad_norm + 1e-6) : 1.0;
}

}  // namespace pv
