// Temperature and nucleus (top-p) sampling of the next token (model/sampling.h). Plain host C++.
#include "model/sampling.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace pv {

namespace {

// The shortest text that reads back as x: 0.1 prints as 0.1, the double just below 1 as
// 0.9999999999999999 (not "1", which would make "u = 1 must be below 1" confusing).
std::string num(double x) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
}

[[noreturn]] void reject(const std::string& problem) { throw std::invalid_argument("sample_token: " + problem); }

}  // namespace

int sample_token(const std::vector<double>& logits, double temperature, double top_p, double u) {
    if (logits.empty())
        reject("logits is empty: pass the model's logits for the last position, one per vocabulary entry");
    // Written so that NaN fails too.
    if (!(temperature >= 0 && std::isfinite(temperature)))
        reject("temperature = " + num(temperature) +
               " must be 0 (greedy) or positive and finite (0.7 to 1.0 is usual)");
    if (!(top_p > 0 && top_p <= 1))
        reject("top_p = " + num(top_p) +
               " must be in (0, 1]: it is the probability mass the nucleus keeps (1 keeps every token)");
    if (!(u >= 0 && u < 1))
        reject("u = " + num(u) +
               " must be in [0, 1): draw it uniformly, e.g. std::uniform_real_distribution<double>(0, 1)");

    // Check every logit before any mode returns, so greedy decoding does not hide a broken model.
    const size_t n = logits.size();
    size_t best = 0;  // the argmax, lowest id on ties (strict > keeps the first)
    bool any_finite = false;
    for (size_t k = 0; k < n; ++k) {
        const double x = logits[k];
        if (std::isnan(x))
            reject("logits[" + std::to_string(k) +
                   "] is NaN: the model's output is broken (look for NaN in "
                   "the loss, the gradients or the weights)");
        if (x == INFINITY)
            reject("logits[" + std::to_string(k) +
                   "] is +inf: the model's output overflowed (look for "
                   "divergence in the loss, or use a wider storage type)");
        if (x != -INFINITY) any_finite = true;
        if (x > logits[best]) best = k;
    }
    if (!any_finite)
        reject("every one of the " + std::to_string(n) +
               " logits is -inf: no token has any probability (a mask excluded the whole vocabulary)");
    if (temperature == 0) return static_cast<int>(best);

    // Softmax with the maximum subtracted: the largest term is exp(0) = 1, so total ≥ 1, and
    // masked (-inf) logits give exactly 0.
    const double max_logit = logits[best];
    std::vector<double> p(n);
    double total = 0;
    for (size_t k = 0; k < n; ++k) total += p[k] = std::exp((logits[k] - max_logit) / temperature);
    for (double& x : p) x /= total;

    // Ranking: probability descending, equal probabilities by lower id.
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });

    // The nucleus: the shortest prefix whose mass reaches top_p. The first token always enters
    // (mass 0 < top_p, and its probability is 1/total > 0); tokens whose probability is 0 never do.
    size_t size = 0;
    double mass = 0;
    while (size < n && mass < top_p && p[order[size]] > 0) mass += p[order[size++]];

    // The first token whose cumulative probability exceeds u·mass. The cumulative sum repeats the
    // nucleus sum term by term, so it ends at exactly `mass`, and u·mass < mass for every u < 1
    // (rounding u·mass up to mass would need mass to be a power of two, where the product is
    // exact): some token always exceeds the target. The loop cannot return a token of
    // probability 0 either: the sum does not grow there, so it had exceeded the target before.
    const double target = u * mass;
    double cumulative = 0;
    for (size_t i = 0; i < size; ++i) {
        cumulative += p[order[i]];
        if (cumulative > target) return order[i];
    }
    return order[size - 1];  // not reached (see above); the last nucleus token if it were
}

}  // namespace pv
