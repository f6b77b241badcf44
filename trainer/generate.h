// Text generation from a model: the prompt's tokens, then one sampled token at a time.
//
// Each new token is drawn from the logits at the last position of the context (model/sampling.h:
// temperature, then nucleus top-p), with the uniform number u_i of the i-th generated token taken
// from Philox keyed by (seed, sampling, 0, i): the same seed gives the same text on every backend
// and schedule, whatever else ran before. The context is the last seq_len tokens (a sliding
// window: the model has seen no longer sequences). There is no KV cache yet, so every token
// recomputes the forward over the window: O(seq_len) forwards of O(seq_len) tokens each, fine
// for the small models a CPU trains and simple to trust.
#pragma once

#include "data/tokenizer.h"
#include "model/llama.h"

#include <functional>
#include <string>

namespace pv {

struct GenerateOptions {
    std::string prompt;
    int max_tokens = 100;
    double temperature = 0.8;  // 0: greedy
    double top_p = 0.95;
    uint64_t seed = 1337;
};

// Generates up to max_tokens tokens after the prompt (stopping early after an end-of-text
// token) and returns them decoded; `on_piece` (optional) receives each token's text as it comes.
// An empty prompt starts from the end-of-text token, i.e. a document start; with neither, it is
// an error. Uses row 0 of the model's slot-0 micro-batch; the other rows are padding.
template <class T>
std::string generate(Llama<T>& model, const Tokenizer& tokenizer, const GenerateOptions& o,
                     const std::function<void(const std::string&)>& on_piece = {});

}  // namespace pv
