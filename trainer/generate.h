// Text generation with a KV cache: the prompt is prefilled in one pass (model/decoder.h), then
// one token at a time is chosen from the last position's logits and fed back at its true position.
//
// Generated token i (counting from 0) is drawn from the logits with temperature and nucleus top-p
// (model/sampling.h; temperature 0 is greedy), its uniform number u_i taken from Philox keyed by
// (seed, sampling, 0, i): the same seed gives the same tokens on every backend and schedule,
// whatever ran before. Generation ends after max_tokens tokens, or after a token in stop_ids (the
// model's end-of-sequence tokens), which is returned as the last token. Nothing slides or restarts:
// the prompt and every token but the last sit at their positions 0, 1, ... in the cache, so the
// decoder must hold prompt + max_tokens − 1 positions (checked before any work).
#pragma once

#include "data/tokenizer.h"
#include "model/decoder.h"
#include "model/llama.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pv {

struct GenerateOptions {
    std::vector<int> prompt;  // token ids, at least one
    int max_tokens = 100;
    double temperature = 0.8;  // 0: greedy
    double top_p = 0.95;
    uint64_t seed = 1337;
    std::vector<int> stop_ids;  // the model's end-of-sequence tokens
};

struct GenerateResult {
    std::vector<int> ids;  // the generated tokens, a stop token included
    bool stopped = false;  // ended at a stop token (else after max_tokens)
    // The prefill (the prompt's pass, up to the first token's logits) and the decode (every later
    // step: ids.size() − 1 tokens fed back, each with its sampling), in seconds.
    double prefill_seconds = 0, decode_seconds = 0;
    int decode_steps() const { return ids.empty() ? 0 : int(ids.size()) - 1; }
};

// Generates from an empty decoder (its cache is reset first); `on_token` (optional) receives each
// token as it is chosen. Throws std::invalid_argument for an empty prompt, max_tokens < 1, or a
// prompt and max_tokens the decoder cannot hold (naming the numbers).
template <class T>
GenerateResult generate(Decoder<T>& decoder, const GenerateOptions& o, const std::function<void(int)>& on_token = {});

// The ids generation starts from when the prompt is empty: the BOS token when the model has one,
// else its EOS (a document start in polevault's packed data, where EOS separates documents).
// Throws std::invalid_argument when it has neither.
int start_token(int bos_id, int eos_id);

// The training run's closing sample: `prompt` (text; empty: start_token) continued on `model`'s
// weights with up to max_tokens tokens, streamed as text to on_piece, stopping at the tokenizer's
// EOS. max_tokens is shortened so that prompt and sample fit the model's max_position_embeddings (a
// short note is passed to on_piece when that ends the sample): a run's closing sample never fails
// on its length.
template <class T>
GenerateResult generate_text(const Llama<T>& model, const Tokenizer& tokenizer, const std::string& prompt,
                             int max_tokens, double temperature, double top_p, uint64_t seed,
                             const std::function<void(const std::string&)>& on_piece);

}  // namespace pv
