// Learning-rate schedules and the clipping factor; the formulas are in optim/schedule.h.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>
#include <stdexcept>

namespace pv {

double learning_rate(const LrConfig& c, long long step) {
    if (step < c.warmup) return c.lr * double(step + 1) / double(c.warmup);
    const double span = double(c.total_steps - c.warmup);
    const double p = span > 0 ? std::clamp(double(step - c.warmup) / span, 0.0, 1.0) : 1.0;
    const double final_lr = c.lr * c.final_fraction;
    switch (c.kind) {
        case LrSchedule::constant: return c.lr;
        case LrSchedule::cosine: return final_lr + (c.lr - final_lr) * (1.0 + std::cos(std::numbers::pi * p)) / 2.0;
        case LrSchedule::linear: return c.lr + (final_lr - c.lr) * p;
        case LrSchedule::wsd: {
            const double d = c.decay_fraction;
            if (d <= 0 || p < 1.0 - d) return c.lr;
            return c.lr + (final_lr - c.lr) * (p - (1.0 - d)) / d;
        }
    }
    return c.lr;
}

const char* schedule_name(LrSchedule kind) {
    switch (kind) {
        case LrSchedule::constant: return "constant";
        case LrSchedule::cosine: return "cosine";
        case LrSchedule::linear: return "linear";
        case LrSchedule::wsd: return "wsd";
    }
    return "?";
}

LrSchedule parse_schedule(std::string_view name) {
    for (LrSchedule k : {LrSchedule::constant, LrSchedule::cosine, LrSchedule::linear, LrSchedule::wsd})
        if (name == schedule_name(k)) return k;
    throw std::invalid_argument("unknown learning-rate schedule '" + std::string(name) +
                                "'; valid: constant, cosine, linear, wsd");
}

std::vector<std::string> validate(const LrConfig& c) {
    std::vector<std::string> errors;
    auto add = [&](auto&&... parts) {
        std::ostringstream s;
        (s << ... << parts);
        errors.push_back(s.str());
    };
    // Each problem names the flag of `train` that sets the field (lr, total_steps: --steps, warmup,
    // final_fraction: --final-lr-fraction); decay_fraction has no flag (wsd's fixed decaying part).
    if (!std::isfinite(c.lr) || c.lr < 0) add("--lr ", c.lr, ": the learning rate must be finite and >= 0");
    if (c.total_steps < 1) add("--steps ", c.total_steps, ": a run needs at least one step");
    if (c.warmup < 0) add("--warmup ", c.warmup, ": warmup steps must be >= 0");
    if (c.total_steps >= 1 && c.warmup > c.total_steps)
        add("--warmup ", c.warmup, " is more than --steps ", c.total_steps, ": use at most ", c.total_steps,
            " warmup steps");
    if (!(c.final_fraction >= 0 && c.final_fraction <= 1))
        add("--final-lr-fraction ", c.final_fraction, ": must be in [0, 1] (final lr = lr * final fraction)");
    if (!(c.decay_fraction >= 0 && c.decay_fraction <= 1))
        add("the wsd decay fraction ", c.decay_fraction, ": must be in [0, 1] (the decaying part of a wsd run)");
    return errors;
}

}  // namespace pv
