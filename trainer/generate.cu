// Text generation (see generate.h).
#include "trainer/generate.h"

#include "kernels/philox.cuh"
#include "model/sampling.h"
#include "model/unit_loop.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace pv {

template <class T>
std::string generate(Llama<T>& model, const Tokenizer& tokenizer, const GenerateOptions& o,
                     const std::function<void(const std::string&)>& on_piece) {
    std::vector<int> context = tokenizer.encode(o.prompt, false);
    if (context.empty()) {
        if (tokenizer.eot_id() < 0)
            throw std::invalid_argument(
                "generate: the prompt is empty and the tokenizer has no end-of-text token to "
                "start from; give a prompt");
        context.push_back(tokenizer.eot_id());
    }
    const int vocab = model.config().vocab_size;
    const int seq_len = model.seq_len();
    DeviceBuffer<int> tokens(size_t(model.rows()), MemoryCategory::workspace);
    std::vector<int> window(size_t(model.rows()), 0);
    std::vector<T> logits(static_cast<size_t>(vocab));
    std::vector<double> scores(static_cast<size_t>(vocab));
    std::string text;
    for (int i = 0; i < o.max_tokens; ++i) {
        const size_t len = std::min(context.size(), size_t(seq_len));
        std::copy(context.end() - long(len), context.end(), window.begin());
        CUDA_CHECK(cudaMemcpy(tokens.get(), window.data(), window.size() * sizeof(int), cudaMemcpyHostToDevice));
        single_forward<T>(model, 0, tokens.get(), nullptr, nullptr, nullptr);
        CUDA_CHECK(cudaMemcpy(logits.data(), model.logits(0) + (len - 1) * size_t(vocab), logits.size() * sizeof(T),
                              cudaMemcpyDeviceToHost));
        for (size_t k = 0; k < logits.size(); ++k) scores[k] = double(to_acc(logits[k]));
        // 53 random bits from two Philox words: u uniform in [0, 1).
        const Philox4 r = philox_draw(o.seed, RandomPurpose::sampling, 0, uint64_t(i));
        const double u = double((uint64_t(r.v[0]) << 21) ^ (r.v[1] >> 11)) * 0x1p-53;
        const int next = sample_token(scores, o.temperature, o.top_p, u);
        context.push_back(next);
        const std::string piece = tokenizer.decode({next});
        text += piece;
        if (on_piece) on_piece(piece);
        if (next == tokenizer.eot_id()) break;
    }
    return text;
}

template std::string generate(Llama<__nv_bfloat16>&, const Tokenizer&, const GenerateOptions&,
                              const std::function<void(const std::string&)>&);
template std::string generate(Llama<float>&, const Tokenizer&, const GenerateOptions&,
                              const std::function<void(const std::string&)>&);
template std::string generate(Llama<double>&, const Tokenizer&, const GenerateOptions&,
                              const std::function<void(const std::string&)>&);

}  // namespace pv
