// Fuzz target: the JSON lines inputs of `train prepare` (data/examples.h): read_examples on a
// .jsonl file, then each example checked and encoded as prepare does, in the llama3 chat format
// with a small Llama 3 tokenizer (test/data/tokenizers/llama3-small.json, which has its special
// tokens). Encoding must give one flags byte per token.
#include "data/examples.h"
#include "fuzz/fuzz_target.h"

#ifndef PV_FUZZ_DATA_DIR
#error "PV_FUZZ_DATA_DIR (the repository's test/data) must be defined by the build"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    static const pv::Tokenizer tok = pv::Tokenizer::load(PV_FUZZ_DATA_DIR "/tokenizers/llama3-small.json");
    const std::string path = pv::fuzz::write_scratch("input.jsonl", data, size);
    std::vector<pv::Example> examples;
    if (!pv::fuzz::accepts([&] { examples = pv::read_examples(path, "text"); })) return 0;
    for (const bool train_on_prompt : {false, true}) {
        const pv::ExampleEncoding how{pv::ChatFormat::llama3, train_on_prompt};
        for (const pv::Example& e : examples) {
            std::vector<uint32_t> tokens;
            std::vector<uint8_t> flags;
            pv::fuzz::accepts([&] {
                pv::check_example(e, how);
                pv::encode_example(tok, e, how, tokens, flags);
            });
            if (tokens.size() != flags.size()) {
                std::fprintf(stderr, "fuzz finding: %zu tokens but %zu flags\n", tokens.size(), flags.size());
                std::abort();
            }
        }
    }
    return 0;
}
