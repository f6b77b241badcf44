// `train tokenize`: the command a user runs to see what the model will see of a text — the token
// ids a tokenizer.json gives it, exactly as Hugging Face `tokenizers` would (data/tokenizer.h), or
// the text of a list of ids.
#pragma once

#include "trainer/options.h"

#include <istream>
#include <ostream>

namespace pv {

// Reads all of `in`: text, whose ids are written to `out` as one JSON array on one line
// ("[128000, 9906, 1917]\n"); or, with o.decode, a JSON array of ids, whose text is written as it
// is (no newline added). Throws std::runtime_error naming the problem for input that is not an
// array of ids, and Tokenizer::load's errors for the file.
int tokenize_command(const TokenizeOptions& o, std::istream& in, std::ostream& out);

}  // namespace pv
