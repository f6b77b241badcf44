// Text generation with a KV cache (see generate.h).
#include "trainer/generate.h"

#include "kernels/philox.cuh"
#include "model/sampling.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace pv {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 53 random bits from two Philox words: u uniform in [0, 1), for generated token i.
double uniform_for_token(uint64_t seed, int i) {
    const Philox4 r = philox_draw(seed, RandomPurpose::sampling, 0, uint64_t(i));
    return double((uint64_t(r.v[0]) << 21) ^ (r.v[1] >> 11)) * 0x1p-53;
}

}  // namespace

int start_token(int bos_id, int eos_id) {
    if (bos_id >= 0) return bos_id;
    if (eos_id >= 0) return eos_id;
    throw std::invalid_argument(
        "the prompt is empty and the model declares neither a beginning- nor an end-of-sequence token to start "
        "from: give a prompt");
}

template <class T>
GenerateResult generate(Decoder<T>& decoder, const GenerateOptions& o, const std::function<void(int)>& on_token) {
    if (o.prompt.empty()) throw std::invalid_argument("generate: the prompt has no tokens");
    if (o.max_tokens < 1)
        throw std::invalid_argument("generate: max_tokens = " + std::to_string(o.max_tokens) + " must be at least 1");
    // The last generated token is never fed back, so the cache needs prompt + max_tokens − 1 rows.
    const long long needed = (long long)o.prompt.size() + o.max_tokens - 1;
    if (needed > decoder.max_positions())
        throw std::invalid_argument("generate: the prompt's " + std::to_string(o.prompt.size()) + " tokens + " +
                                    std::to_string(o.max_tokens) + " generated tokens need " + std::to_string(needed) +
                                    " cached positions; the decoder holds " + std::to_string(decoder.max_positions()));
    decoder.reset();
    GenerateResult r;
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<double>* logits = &decoder.prefill(o.prompt);
    r.prefill_seconds = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.max_tokens; ++i) {
        if (i > 0) logits = &decoder.step(r.ids.back());
        const int next = sample_token(*logits, o.temperature, o.top_p, uniform_for_token(o.seed, i));
        r.ids.push_back(next);
        if (on_token) on_token(next);
        if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
            r.stopped = true;
            break;
        }
    }
    r.decode_seconds = seconds_since(t0);
    return r;
}

template <class T>
GenerateResult generate_text(const Llama<T>& model, const Tokenizer& tokenizer, const std::string& prompt,
                             int max_tokens, double temperature, double top_p, uint64_t seed,
                             const std::function<void(const std::string&)>& on_piece) {
    GenerateOptions o;
    o.prompt = tokenizer.encode(prompt, false);
    if (o.prompt.empty()) o.prompt.push_back(start_token(tokenizer.bos_id(), tokenizer.eos_id()));
    if (tokenizer.eos_id() >= 0) o.stop_ids.push_back(tokenizer.eos_id());
    const int room = model.config().max_seq_len - int(o.prompt.size());  // the whole text within the positions
    if (room < 1) {
        on_piece(" [no sample: the prompt fills the model's " + std::to_string(model.config().max_seq_len) +
                 " positions]");
        return {};
    }
    o.max_tokens = std::min(max_tokens, room);
    o.temperature = temperature, o.top_p = top_p, o.seed = seed;
    Decoder<T> decoder(model, int(o.prompt.size()) + o.max_tokens - 1, int(o.prompt.size()));
    GenerateResult r = generate(decoder, o, [&](int id) { on_piece(tokenizer.decode({id})); });
    if (o.max_tokens < max_tokens && !r.stopped)
        on_piece(" [stopped at the model's " + std::to_string(model.config().max_seq_len) + " positions]");
    return r;
}

#define PV_INSTANTIATE(T)                                                                                             \
    template GenerateResult generate(Decoder<T>&, const GenerateOptions&, const std::function<void(int)>&);           \
    template GenerateResult generate_text(const Llama<T>&, const Tokenizer&, const std::string&, int, double, double, \
                                          uint64_t, const std::function<void(const std::string&)>&);
PV_INSTANTIATE(__nv_bfloat16)
PV_INSTANTIATE(float)
PV_INSTANTIATE(double)
#undef PV_INSTANTIATE

}  // namespace pv
