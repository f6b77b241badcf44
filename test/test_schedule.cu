// Learning-rate schedules and the clipping factor (optim/schedule.h): values at chosen steps,
// worked out here from the formulas, the warmup ramp, parsing and validation.
#include "optim/clip.cuh"
#include "optim/schedule.h"
#include "test/check.h"

#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <stdexcept>

namespace schedule_test {

inline pv::LrConfig config(pv::LrSchedule kind, double lr, int warmup, long long total, double final_fraction = 0.1,
                           double decay_fraction = 0.2) {
    pv::LrConfig c;
    c.kind = kind;
    c.lr = lr;
    c.warmup = warmup;
    c.total_steps = total;
    c.final_fraction = final_fraction;
    c.decay_fraction = decay_fraction;
    return c;
}

inline bool close(double a, double b) { return std::fabs(a - b) <= 1e-14 * std::fmax(1.0, std::fabs(b)); }

inline bool mentions(const std::vector<std::string>& errors, const std::string& what) {
    for (const auto& e : errors)
        if (e.find(what) != std::string::npos) return true;
    return false;
}

}  // namespace schedule_test

using namespace schedule_test;
using pv::learning_rate;
using pv::LrSchedule;

TEST_CASE("warmup ramps linearly to the peak", "[optim][schedule]") {
    for (LrSchedule kind : {LrSchedule::constant, LrSchedule::cosine, LrSchedule::linear, LrSchedule::wsd}) {
        const auto c = config(kind, 1e-3, 10, 110);
        for (int s = 0; s < 10; ++s) REQUIRE(close(learning_rate(c, s), 1e-3 * (s + 1) / 10.0));
        REQUIRE(close(learning_rate(c, 0), 1e-4));
        REQUIRE(close(learning_rate(c, 9), 1e-3));   // end of warmup: the peak
        REQUIRE(close(learning_rate(c, 10), 1e-3));  // first step after warmup: p = 0
    }
}

TEST_CASE("constant schedule", "[optim][schedule]") {
    const auto c = config(LrSchedule::constant, 0.5, 4, 100);
    REQUIRE(close(learning_rate(c, 0), 0.125));
    REQUIRE(close(learning_rate(c, 3), 0.5));
    REQUIRE(close(learning_rate(c, 52), 0.5));
    REQUIRE(close(learning_rate(c, 99), 0.5));
}

TEST_CASE("cosine schedule", "[optim][schedule]") {
    // lr 1e-3, warmup 10, total 110, final 1e-4: p = (step − 10)/100.
    const auto c = config(LrSchedule::cosine, 1e-3, 10, 110, 0.1);
    REQUIRE(close(learning_rate(c, 0), 1e-4));
    REQUIRE(close(learning_rate(c, 10), 1e-3));
    REQUIRE(close(learning_rate(c, 60), 5.5e-4));  // p = 1/2: halfway between 1e-3 and 1e-4
    // p = 1/4: 1e-4 + 9e-4·(1 + cos(π/4))/2 = 1e-4 + 9e-4·(2 + √2)/4
    REQUIRE(close(learning_rate(c, 35), 1e-4 + 9e-4 * (2.0 + std::sqrt(2.0)) / 4.0));
    // last step 109: p = 0.99
    REQUIRE(close(learning_rate(c, 109), 1e-4 + 9e-4 * (1.0 + std::cos(0.99 * std::numbers::pi)) / 2.0));
    REQUIRE(close(learning_rate(c, 110), 1e-4));   // one past the end reaches the final value
    REQUIRE(close(learning_rate(c, 1000), 1e-4));  // and stays there
    for (long long s = 10; s < 110; ++s) REQUIRE(learning_rate(c, s + 1) < learning_rate(c, s));
}

TEST_CASE("linear schedule", "[optim][schedule]") {
    // lr 2, warmup 4, total 104, final 1: p = (step − 4)/100.
    const auto c = config(LrSchedule::linear, 2.0, 4, 104, 0.5);
    REQUIRE(close(learning_rate(c, 0), 0.5));
    REQUIRE(close(learning_rate(c, 3), 2.0));
    REQUIRE(close(learning_rate(c, 4), 2.0));
    REQUIRE(close(learning_rate(c, 54), 1.5));
    REQUIRE(close(learning_rate(c, 103), 1.01));
}

TEST_CASE("warmup-stable-decay schedule", "[optim][schedule]") {
    // lr 1, no warmup, total 100, final 0.1, the last 20 % decays: p = step/100, decay from p = 0.8.
    const auto c = config(LrSchedule::wsd, 1.0, 0, 100, 0.1, 0.2);
    REQUIRE(close(learning_rate(c, 0), 1.0));
    REQUIRE(close(learning_rate(c, 50), 1.0));
    REQUIRE(close(learning_rate(c, 79), 1.0));
    REQUIRE(close(learning_rate(c, 80), 1.0));    // the decay starts from the peak
    REQUIRE(close(learning_rate(c, 90), 0.55));   // halfway through the decay
    REQUIRE(close(learning_rate(c, 99), 0.145));  // 1 − 0.9·(0.19/0.2)
    // With warmup 10 and total 110, decay from p = 0.8, step 90.
    const auto w = config(LrSchedule::wsd, 1.0, 10, 110, 0.0, 0.2);
    REQUIRE(close(learning_rate(w, 4), 0.5));
    REQUIRE(close(learning_rate(w, 89), 1.0));
    REQUIRE(close(learning_rate(w, 100), 0.5));
    // decay_fraction 0: stable to the end.
    REQUIRE(close(learning_rate(config(LrSchedule::wsd, 1.0, 0, 100, 0.1, 0.0), 99), 1.0));
}

TEST_CASE("a run that is all warmup", "[optim][schedule]") {
    const auto c = config(LrSchedule::cosine, 1.0, 5, 5);
    REQUIRE(close(learning_rate(c, 4), 1.0));
    REQUIRE(pv::validate(c).empty());
}

TEST_CASE("schedule names parse and unknown ones are refused", "[optim][schedule]") {
    REQUIRE(pv::parse_schedule("constant") == LrSchedule::constant);
    REQUIRE(pv::parse_schedule("cosine") == LrSchedule::cosine);
    REQUIRE(pv::parse_schedule("linear") == LrSchedule::linear);
    REQUIRE(pv::parse_schedule("wsd") == LrSchedule::wsd);
    for (LrSchedule k : {LrSchedule::constant, LrSchedule::cosine, LrSchedule::linear, LrSchedule::wsd})
        REQUIRE(pv::parse_schedule(pv::schedule_name(k)) == k);
    try {
        pv::parse_schedule("cosin");
        FAIL("no exception");
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        INFO(what);
        REQUIRE(what.find("'cosin'") != std::string::npos);
        for (const char* name : {"constant", "cosine", "linear", "wsd"}) REQUIRE(what.find(name) != std::string::npos);
    }
}

TEST_CASE("schedule validation names every problem", "[optim][schedule]") {
    REQUIRE(pv::validate(config(LrSchedule::cosine, 3e-4, 100, 1000)).empty());
    REQUIRE(pv::validate(config(LrSchedule::wsd, 0.0, 0, 1, 0.0, 1.0)).empty());
    REQUIRE(mentions(pv::validate(pv::LrConfig{}), "--steps 0"));  // the default needs a length
    REQUIRE(mentions(pv::validate(config(LrSchedule::cosine, -1e-3, 0, 10)), "--lr "));
    REQUIRE(mentions(pv::validate(config(LrSchedule::cosine, std::nan(""), 0, 10)), "--lr "));
    REQUIRE(mentions(pv::validate(config(LrSchedule::cosine, 1e-3, 11, 10)), "--warmup 11 is more than --steps 10"));
    REQUIRE(mentions(pv::validate(config(LrSchedule::cosine, 1e-3, -1, 10)), "--warmup -1"));
    REQUIRE(mentions(pv::validate(config(LrSchedule::cosine, 1e-3, 0, 10, 1.5)), "--final-lr-fraction "));
    REQUIRE(mentions(pv::validate(config(LrSchedule::cosine, 1e-3, 0, 10, -0.1)), "--final-lr-fraction "));
    REQUIRE(mentions(pv::validate(config(LrSchedule::wsd, 1e-3, 0, 10, 0.1, 1.2)), "wsd decay fraction "));
    REQUIRE(mentions(pv::validate(config(LrSchedule::wsd, 1e-3, 0, 10, 0.1, std::nan(""))), "wsd decay fraction "));
    // Several problems: all reported.
    REQUIRE(pv::validate(config(LrSchedule::cosine, -1.0, -2, 0, 2.0, -1.0)).size() == 5);
}

TEST_CASE("clip_scale", "[optim][schedule]") {
    REQUIRE(pv::clip_scale(0.5, 1.0) == 1.0);                 // under the limit
    REQUIRE(pv::clip_scale(1.0, 1.0) == 1.0);                 // at the limit
    REQUIRE(pv::clip_scale(4.0, 1.0) == 1.0 / (4.0 + 1e-6));  // scaled to (just under) max_norm
    REQUIRE(pv::clip_scale(4.0, 0.0) == 1.0);                 // max_norm 0 disables clipping
    REQUIRE(pv::clip_scale(0.0, 1.0) == 1.0);
    const double inf = std::numeric_limits<double>::infinity();
    REQUIRE(std::isnan(pv::clip_scale(std::nan(""), 1.0)));  // a non-finite norm refuses the step
    REQUIRE(std::isnan(pv::clip_scale(inf, 1.0)));
    REQUIRE(std::isnan(pv::clip_scale(inf, 0.0)));  // even without clipping
}

// The step's figures formed on the device (optim/clip.cuh) against the host arithmetic they
// replace: the same additions in the same order, so the same bits; a non-finite loss or norm
// gives a NaN scale.
TEST_CASE("step figures on the device have the host's bits", "[optim][schedule]") {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> unit(0.0, 3.0);
    const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
    for (int trial = 0; trial < 40; ++trial) {
        const int units = 1 + trial % 7;
        std::vector<double> norms(static_cast<size_t>(units));
        for (double& x : norms) x = unit(rng) * unit(rng);
        std::vector<float> losses(size_t(1 + trial % 5));
        for (float& x : losses) x = float(unit(rng) * 100.0);
        if (trial == 30) norms[0] = nan;
        if (trial == 31) norms[size_t(units - 1)] = inf;
        if (trial == 32) losses[0] = float(inf);
        if (trial == 33) losses[0] = float(nan);
        const double max_norm = trial % 3 == 0 ? 0.0 : 0.5 + trial % 4;
        pv::test::DeviceArray<float> d_losses(losses);
        pv::test::DeviceArray<double> d_norms(norms), d_sum(1);
        pv::test::DeviceArray<pv::StepFigures> d_figures(1);
        pv::sum_losses(d_losses.get(), int(losses.size()), d_sum.get(), nullptr);
        pv::step_figures(d_sum.get(), d_norms.get(), units, max_norm, d_figures.get(), nullptr);
        const pv::StepFigures got = d_figures.download()[0];
        double loss = 0, total = 0;
        for (float x : losses) loss += double(x);
        for (double x : norms) total += x;
        const double norm = std::sqrt(total);
        const double scale = std::isfinite(loss) ? pv::clip_scale(norm, max_norm) : nan;
        INFO("trial " << trial);
        CHECK(std::bit_cast<uint64_t>(got.loss_sum) == std::bit_cast<uint64_t>(loss));
        CHECK(std::bit_cast<uint64_t>(got.grad_norm) == std::bit_cast<uint64_t>(norm));
        if (std::isnan(scale))
            CHECK(std::isnan(got.scale));
        else
            CHECK(std::bit_cast<uint64_t>(got.scale) == std::bit_cast<uint64_t>(scale));
        CHECK(std::isfinite(got.scale) == (trial < 30 || trial > 33));
        if (std::isfinite(norm) && std::isfinite(loss) && max_norm > 0 && norm > max_norm)
            CHECK(got.scale < 1.0);  // clipping happened
    }
}
