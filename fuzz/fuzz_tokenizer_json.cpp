// Fuzz target: a Hugging Face tokenizer.json (data/tokenizer.h), loaded as `train --data` and
// `train prepare --tokenizer` load it; an accepted tokenizer then encodes a fixed text (ASCII,
// digits, whitespace runs, multi-byte characters, special-token strings) in each mode and decodes
// what it gave, which must not throw std::out_of_range (an id encode made that is not a token)
// or anything else but the documented std::runtime_error.
#include "data/tokenizer.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::string path = pv::fuzz::write_scratch("tokenizer.json", data, size);
    pv::fuzz::accepts([&] {
        const pv::Tokenizer tok = pv::Tokenizer::load(path);
        static const std::string text =
            "Hello, world!  The kernel's 12345 tokens\n\n\t caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 "
            "<|endoftext|><s> </s><|begin_of_text|>x";
        for (const bool parse_special : {true, false}) {
            const std::vector<int> ids = tok.encode(text, parse_special, parse_special);
            tok.decode(ids, false);
            tok.decode(ids, true);
        }
        tok.bos_id(), tok.eos_id(), tok.add_bos_token();
    });
    return 0;
}
