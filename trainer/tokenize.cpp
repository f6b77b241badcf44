// `train tokenize` (see trainer/tokenize.h).
#include "trainer/tokenize.h"

#include "data/examples.h"
#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

int tokenize_command(const TokenizeOptions& o, std::istream& in, std::ostream& out) {
    const Tokenizer tok = Tokenizer::load(o.tokenizer);
    if (!o.render.empty()) {
        if (o.decode) throw std::invalid_argument("--render shows a file's examples; drop --decode");
        RenderOptions r;
        r.chat_format = o.chat_format, r.chat_template = o.chat_template;
        r.tokenizer_config = tokenizer_config_beside(o.tokenizer);
        r.train_on_prompt = o.train_on_prompt, r.examples = o.render_examples, r.colour = o.colour;
        out << render_counted(tok, o.render, r);
        return 0;
    }
    if (!o.chat_format.empty() || !o.chat_template.empty() || o.train_on_prompt || o.colour)
        throw std::invalid_argument(
            "--chat-format, --chat-template, --train-on-prompt and --colour go with --render FILE.jsonl");
    const std::string input{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!o.decode) {
        const std::vector<int> ids = tok.encode(input, o.parse_special, o.add_special);
        std::string line = "[";
        for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
        out << line << "]\n";
        return 0;
    }
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(input);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(std::string("tokenize --decode: the input is not JSON (give an array of ids such as "
                                             "[128000, 9906]): ") +
                                 e.what());
    }
    if (!j.is_array())
        throw std::runtime_error(
            "tokenize --decode: the input is not a JSON array of ids (give one such as [1, 2, 3])");
    std::vector<int> ids;
    for (const auto& v : j) {
        if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= tok.vocab_size())
            throw std::runtime_error("tokenize --decode: " + v.dump() + " is not a token id of '" + o.tokenizer +
                                     "' (0 to " + std::to_string(tok.vocab_size() - 1) + ")");
        ids.push_back(v.get<int>());
    }
    out << tok.decode(ids);
    return 0;
}

}  // namespace pv
