// Choosing the next token from the model's logits: temperature, then nucleus (top-p) sampling.
//
// With V logits l_k and temperature T > 0:
//   p_k = exp((l_k − max_j l_j) / T) / Σ_i exp((l_i − max_j l_j) / T)        in double
// Subtracting the maximum makes the largest term exp(0) = 1, so logits of any size (1e4, 1e30)
// neither overflow nor lose the winner. The tokens are ranked by p_k descending, equal p_k by
// lower id (so the result never depends on how a sort breaks ties), and the nucleus is the
// shortest prefix of that ranking whose total probability reaches top_p (Holtzman et al., 2020,
// "The Curious Case of Neural Text Degeneration"): at least the first token, and never a token
// whose p_k underflowed to 0 (the prefix without it already holds all the mass). Within the
// nucleus, renormalised to its mass M, the chosen token is the first whose cumulative
// probability, in ranking order, exceeds u·M:
//   u ∈ [0, p_0/M) → the most probable token, [p_0/M, (p_0 + p_1)/M) → the second, …
// u is the caller's uniform draw in [0, 1). Taking it as an argument, rather than a generator,
// keeps this a pure function: the caller chooses the randomness (Philox keyed by step, a seeded
// std::mt19937_64), and tests can drive u over a grid and compare frequencies exactly.
//
// T = 0 means greedy decoding: the argmax, the lowest id among equal maxima (the limit of the
// above as T → 0 when the maximum is unique). top_p = 1 keeps every token of nonzero probability.
// Whether a nucleus boundary falls exactly on a sum of probabilities (top_p = 0.8 with p = 0.5,
// 0.3, …) is decided by floating-point rounding, as in every implementation.
//
// Bad arguments throw std::invalid_argument naming the argument, its value and the valid range:
// empty logits; temperature negative or not finite; top_p outside (0, 1]; u outside [0, 1); a NaN
// or +inf logit (naming its position: the model's output is broken, and sampling from it would
// hide that); every logit −inf (no token has any probability). −inf logits are otherwise allowed:
// they are how a caller masks tokens out.
// Host code only.
#pragma once

#include <vector>

namespace pv {

// The token id (index into logits) chosen as described above.
int sample_token(const std::vector<double>& logits, double temperature, double top_p, double u);

}  // namespace pv
