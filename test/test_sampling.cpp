// sample_token: hand-computed distributions at the boundaries u·M crosses, temperature scaling,
// greedy decoding and ties, huge and masked logits, a grid of u values whose token frequencies
// must equal independently computed nucleus probabilities, and every rejection with its message.
#include "model/sampling.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace sampling_test {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The largest u the function accepts.
const double kJustBelowOne = std::nextafter(1.0, 0.0);

// sample_token(...) throws std::invalid_argument whose message contains every substring.
inline void expect_rejected(const std::vector<double>& logits, double temperature, double top_p, double u,
                            const std::vector<std::string>& substrings) {
    std::string message;
    try {
        (void)pv::sample_token(logits, temperature, top_p, u);
    } catch (const std::invalid_argument& e) {
        message = e.what();
    }
    INFO("message: " << message);
    REQUIRE(!message.empty());
    CHECK(message.find("sample_token") != std::string::npos);
    for (const auto& s : substrings) {
        INFO("expected substring: " << s);
        CHECK(message.find(s) != std::string::npos);
    }
}

// The nucleus distribution, computed independently of the product's sort-and-scan: softmax in
// long double, then token i is in the nucleus iff its probability is positive and the mass of the
// tokens ranked ahead of it (more probable, or equally probable with a lower id) is below top_p —
// which is what "the shortest ranked prefix reaching top_p" means, token by token. Returns the
// renormalised probabilities, 0 outside the nucleus.
inline std::vector<long double> nucleus_probabilities(const std::vector<double>& logits, double temperature,
                                                      double top_p) {
    const size_t n = logits.size();
    long double max_logit = -INFINITY;
    for (double x : logits) max_logit = std::max(max_logit, (long double)x);
    std::vector<long double> p(n);
    long double total = 0;
    for (size_t i = 0; i < n; ++i) total += p[i] = std::exp(((long double)logits[i] - max_logit) / temperature);
    for (auto& x : p) x /= total;
    std::vector<long double> q(n, 0);
    long double mass = 0;
    for (size_t i = 0; i < n; ++i) {
        long double ahead = 0;
        for (size_t j = 0; j < n; ++j)
            if (p[j] > p[i] || (p[j] == p[i] && j < i)) ahead += p[j];
        if (p[i] > 0 && ahead < top_p) q[i] = p[i], mass += p[i];
    }
    for (auto& x : q) x /= mass;
    return q;
}

}  // namespace sampling_test

using namespace sampling_test;

TEST_CASE("sample_token: probabilities 0.5, 0.3, 0.2 and the boundaries u·M crosses", "[sampling]") {
    const std::vector<double> logits = {std::log(0.5), std::log(0.3), std::log(0.2)};
    SECTION("top_p = 1: cumulative 0.5, 0.8, 1") {
        CHECK(pv::sample_token(logits, 1.0, 1.0, 0.0) == 0);
        CHECK(pv::sample_token(logits, 1.0, 1.0, 0.499) == 0);
        CHECK(pv::sample_token(logits, 1.0, 1.0, 0.501) == 1);
        CHECK(pv::sample_token(logits, 1.0, 1.0, 0.799) == 1);
        CHECK(pv::sample_token(logits, 1.0, 1.0, 0.801) == 2);
        CHECK(pv::sample_token(logits, 1.0, 1.0, kJustBelowOne) == 2);
    }
    SECTION("top_p = 0.6 keeps {0, 1} (0.5 < 0.6 ≤ 0.8), renormalised to 0.625, 0.375") {
        CHECK(pv::sample_token(logits, 1.0, 0.6, 0.0) == 0);
        CHECK(pv::sample_token(logits, 1.0, 0.6, 0.624) == 0);  // 0.624·0.8 = 0.4992 < 0.5
        CHECK(pv::sample_token(logits, 1.0, 0.6, 0.626) == 1);  // 0.626·0.8 = 0.5008 > 0.5
        CHECK(pv::sample_token(logits, 1.0, 0.6, 0.9) == 1);    // never token 2
        CHECK(pv::sample_token(logits, 1.0, 0.6, kJustBelowOne) == 1);
    }
    SECTION("top_p = 0.4 keeps only token 0; top_p = 0.81 keeps all three") {
        for (double u : {0.0, 0.3, 0.7, kJustBelowOne}) CHECK(pv::sample_token(logits, 1.0, 0.4, u) == 0);
        CHECK(pv::sample_token(logits, 1.0, 0.81, 0.799) == 1);
        CHECK(pv::sample_token(logits, 1.0, 0.81, 0.801) == 2);
    }
    SECTION("the ranking, not the id order, decides: ids 1, 2, 0 hold 0.5, 0.3, 0.2") {
        const std::vector<double> shuffled = {std::log(0.2), std::log(0.5), std::log(0.3)};
        CHECK(pv::sample_token(shuffled, 1.0, 1.0, 0.499) == 1);
        CHECK(pv::sample_token(shuffled, 1.0, 1.0, 0.501) == 2);
        CHECK(pv::sample_token(shuffled, 1.0, 1.0, 0.799) == 2);
        CHECK(pv::sample_token(shuffled, 1.0, 1.0, 0.801) == 0);
        for (double u : {0.0, 0.55, kJustBelowOne}) CHECK(pv::sample_token(shuffled, 1.0, 0.6, u) != 0);
    }
}

TEST_CASE("sample_token: temperature divides the logits", "[sampling]") {
    const std::vector<double> logits = {0.0, std::log(2.0)};
    // T = 1: p = 1/3, 2/3; token 1 ranks first and owns u < 2/3.
    CHECK(pv::sample_token(logits, 1.0, 1.0, 0.66) == 1);
    CHECK(pv::sample_token(logits, 1.0, 1.0, 0.67) == 0);
    // T = 0.5: logits 0, 2 ln 2 → p = 1/5, 4/5.
    CHECK(pv::sample_token(logits, 0.5, 1.0, 0.79) == 1);
    CHECK(pv::sample_token(logits, 0.5, 1.0, 0.81) == 0);
    // T = 2: logits 0, ln(2)/2 → p ∝ 1, √2: token 1 has √2 / (1 + √2) = 0.5858.
    CHECK(pv::sample_token(logits, 2.0, 1.0, 0.585) == 1);
    CHECK(pv::sample_token(logits, 2.0, 1.0, 0.587) == 0);
    // T = 1e6: nearly uniform, token 1 holds 0.5 + 1.7e-7.
    CHECK(pv::sample_token(logits, 1e6, 1.0, 0.4999) == 1);
    CHECK(pv::sample_token(logits, 1e6, 1.0, 0.5001) == 0);
    // T = 1e-300: exp((0 − ln 2)/T) = exp(−6.9e299) underflows, so token 0 has probability 0.
    CHECK(pv::sample_token(logits, 1e-300, 1.0, kJustBelowOne) == 1);
    // ... but equal logits stay equal at any temperature: (0 − 0)/T = 0.
    CHECK(pv::sample_token({0.0, 0.0}, 1e-300, 1.0, 0.75) == 1);
}

TEST_CASE("sample_token: 'exceeds' is strict, and ties rank by lower id", "[sampling]") {
    // p = 1/2, 1/2 exactly (exp(0) = 1 twice): token 0 owns [0, 0.5), token 1 owns [0.5, 1).
    const std::vector<double> even = {0.0, 0.0};
    CHECK(pv::sample_token(even, 1.0, 1.0, std::nextafter(0.5, 0.0)) == 0);
    CHECK(pv::sample_token(even, 1.0, 1.0, 0.5) == 1);
    CHECK(pv::sample_token(even, 1.0, 1.0, 0.25) == 0);
    CHECK(pv::sample_token(even, 1.0, 1.0, 0.75) == 1);
    // "Reaches" includes equality: top_p = 0.5 is reached by token 0 alone (p = 0.5 exactly), and
    // with four equal logits (p = 1/4 exactly) by the first two.
    CHECK(pv::sample_token(even, 1.0, 0.5, kJustBelowOne) == 0);
    CHECK(pv::sample_token({0.0, 0.0, 0.0, 0.0}, 1.0, 0.5, kJustBelowOne) == 1);
    CHECK(pv::sample_token({0.0, 0.0, 0.0, 0.0}, 1.0, 0.5, 0.49) == 0);
    // Ids 0 and 2 tie at e³ / (2e³ + e) = 0.4683: top_p 0.4 keeps the lower id only, top_p 0.5 both.
    const std::vector<double> tied = {3.0, 1.0, 3.0};
    for (double u : {0.0, 0.6, kJustBelowOne}) CHECK(pv::sample_token(tied, 1.0, 0.4, u) == 0);
    CHECK(pv::sample_token(tied, 1.0, 0.5, 0.49) == 0);
    CHECK(pv::sample_token(tied, 1.0, 0.5, 0.51) == 2);
    CHECK(pv::sample_token(tied, 1.0, 0.5, kJustBelowOne) == 2);
}

TEST_CASE("sample_token: temperature 0 is greedy, lowest id on ties", "[sampling]") {
    CHECK(pv::sample_token({1.0, 3.0, 2.0}, 0.0, 1.0, 0.0) == 1);
    CHECK(pv::sample_token({1.0, 3.0, 3.0, 0.0}, 0.0, 1.0, 0.5) == 1);
    CHECK(pv::sample_token({2.0, 2.0, 2.0}, 0.0, 1.0, 0.9) == 0);
    CHECK(pv::sample_token({-kInf, -5.0, -kInf}, 0.0, 1.0, 0.3) == 1);
    CHECK(pv::sample_token({-1e4, 1e4}, 0.0, 0.1, kJustBelowOne) == 1);
    CHECK(pv::sample_token({7.0}, 0.0, 1.0, 0.0) == 0);
    CHECK(pv::sample_token({-0.5, -0.25, -2.0}, -0.0, 1.0, 0.0) == 1);  // −0 is 0
}

TEST_CASE("sample_token: huge logits do not overflow, masked ones are never chosen", "[sampling]") {
    // exp(1e4) is inf in double; with the maximum subtracted, p = 3/4, 1/4.
    const std::vector<double> big = {1e4, 1e4 - std::log(3.0)};
    CHECK(pv::sample_token(big, 1.0, 1.0, 0.74) == 0);
    CHECK(pv::sample_token(big, 1.0, 1.0, 0.76) == 1);
    // The differences themselves overflow to −inf here; the other token still gets probability 0.
    for (double u : {0.0, 0.5, kJustBelowOne}) {
        CHECK(pv::sample_token({1e308, -1e308}, 1.0, 1.0, u) == 0);
        CHECK(pv::sample_token({-1e308, 1e308, -1e4}, 1.0, 1.0, u) == 1);
    }
    // Masked tokens (−inf) and tokens whose probability underflows to 0 stay out even at top_p = 1
    // and u just below 1.
    const std::vector<double> masked = {-kInf, 0.0, -kInf, std::log(3.0)};  // p = 0, 1/4, 0, 3/4
    CHECK(pv::sample_token(masked, 1.0, 1.0, 0.0) == 3);
    CHECK(pv::sample_token(masked, 1.0, 1.0, 0.74) == 3);
    CHECK(pv::sample_token(masked, 1.0, 1.0, 0.76) == 1);
    CHECK(pv::sample_token(masked, 1.0, 1.0, kJustBelowOne) == 1);
    CHECK(pv::sample_token({0.0, -1e4}, 1.0, 1.0, kJustBelowOne) == 0);
}

TEST_CASE("sample_token: frequencies over a grid of u equal the nucleus probabilities", "[sampling]") {
    // u_j = (j + ½)/G for j < G: each token's share of the grid is its interval's length within
    // 1/G, so the frequencies match the renormalised nucleus probabilities to 1/G. Random logits
    // (with deliberate ties), temperatures and top_p; the expectation comes from
    // nucleus_probabilities above, never from the code under test.
    constexpr int kGrid = 20000;
    std::mt19937_64 rng(20240607);
    std::normal_distribution<double> logit(0.0, 2.0);
    std::uniform_real_distribution<double> temperature(0.5, 2.0), top_p(0.3, 1.0);
    int trials_that_cut = 0, trials_with_three = 0;
    for (int trial = 0; trial < 6; ++trial) {
        const size_t n = 5 + size_t(trial) * 7;
        std::vector<double> logits(n);
        for (auto& x : logits) x = logit(rng);
        logits[n - 1] = logits[1];  // ties with the ids far apart
        logits[n / 2] = logits[2];
        const double t = temperature(rng), p = trial == 0 ? 1.0 : top_p(rng);
        const auto expected = nucleus_probabilities(logits, t, p);

        std::vector<int> count(n, 0);
        for (int j = 0; j < kGrid; ++j) ++count[size_t(pv::sample_token(logits, t, p, (j + 0.5) / kGrid))];

        INFO("trial " << trial << ": " << n << " tokens, temperature " << t << ", top_p " << p);
        int kept = 0;
        for (size_t i = 0; i < n; ++i) {
            INFO("token " << i << ": " << count[i] << " of " << kGrid << ", expected probability "
                          << double(expected[i]));
            CHECK(std::abs(double(count[i]) / kGrid - double(expected[i])) <= 1.0 / kGrid + 1e-12);
            if (expected[i] == 0) CHECK(count[i] == 0);
            kept += expected[i] > 0;
        }
        trials_that_cut += kept < int(n);
        trials_with_three += kept >= 3;
    }
    // The cases are not trivial: some nuclei cut tokens, some hold several.
    CHECK(trials_that_cut >= 3);
    CHECK(trials_with_three >= 3);
}

TEST_CASE("sample_token: rejections name the argument, its value and the range", "[sampling]") {
    const std::vector<double> ok = {0.0, 1.0, 2.0};
    expect_rejected({}, 1.0, 1.0, 0.5, {"logits is empty"});

    expect_rejected(ok, -1.0, 1.0, 0.5, {"temperature = -1", "0 (greedy) or positive and finite"});
    expect_rejected(ok, kNaN, 1.0, 0.5, {"temperature = nan"});
    expect_rejected(ok, kInf, 1.0, 0.5, {"temperature = inf"});

    expect_rejected(ok, 1.0, 0.0, 0.5, {"top_p = 0 ", "(0, 1]"});
    expect_rejected(ok, 1.0, -0.5, 0.5, {"top_p = -0.5", "(0, 1]"});
    expect_rejected(ok, 1.0, std::nextafter(1.0, 2.0), 0.5, {"top_p = 1.0000000000000002", "(0, 1]"});
    expect_rejected(ok, 1.0, kNaN, 0.5, {"top_p = nan"});

    expect_rejected(ok, 1.0, 1.0, 1.0, {"u = 1 ", "[0, 1)"});
    expect_rejected(ok, 1.0, 1.0, -1e-300, {"u = -1e-300", "[0, 1)"});
    expect_rejected(ok, 1.0, 1.0, 2.5, {"u = 2.5", "[0, 1)"});
    expect_rejected(ok, 1.0, 1.0, kNaN, {"u = nan"});

    // A NaN or +inf logit is named by position, in sampling and in greedy mode alike.
    expect_rejected({0.0, 1.0, kNaN, 3.0, 4.0}, 1.0, 1.0, 0.5, {"logits[2] is NaN"});
    expect_rejected({0.0, 1.0, 2.0, 3.0, kNaN}, 0.0, 1.0, 0.5, {"logits[4] is NaN"});
    expect_rejected({0.0, kInf, 2.0}, 1.0, 1.0, 0.5, {"logits[1] is +inf"});
    expect_rejected({kInf}, 0.0, 1.0, 0.5, {"logits[0] is +inf"});
    expect_rejected({-kInf, -kInf, -kInf}, 1.0, 1.0, 0.5, {"every one of the 3 logits is -inf"});
    expect_rejected({-kInf}, 0.0, 1.0, 0.5, {"every one of the 1 logits is -inf"});
}
