// --freeze patterns to frozen tensors (model/freeze.h).
#include "model/freeze.h"

#include "model/parameters.h"

#include <fnmatch.h>

#include <stdexcept>

namespace pv {

namespace {

bool matches(const std::string& pattern, const std::string& name) {
    return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

}  // namespace

std::vector<std::string> split_patterns(const std::string& text) {
    std::vector<std::string> out;
    size_t begin = 0;
    while (begin <= text.size()) {
        const size_t end = std::min(text.find(',', begin), text.size());
        if (end > begin) out.push_back(text.substr(begin, end - begin));
        begin = end + 1;
    }
    return out;
}

FrozenTensors resolve_freeze(const LlamaConfig& config, const std::vector<std::string>& patterns) {
    FrozenTensors out;
    if (patterns.empty()) return out;
    const char* kTied = "lm_head.weight";  // a tied model's lm_head: the embedding under another name
    std::vector<bool> used(patterns.size(), false);
    long long tensors = 0;
    for (const UnitSpec& unit : model_units(config)) {
        for (const TensorSpec& t : unit.tensors) {
            ++tensors;
            std::vector<std::string> names;
            for (const TensorPart& p : t.parts) names.push_back(p.hf_name);
            const bool tied_wte = config.tie_embeddings && t.name == "wte";
            size_t hit = 0;
            for (size_t k = 0; k < patterns.size(); ++k) {
                bool any = false;
                for (const std::string& n : names) any = any || matches(patterns[k], n);
                if (tied_wte && matches(patterns[k], kTied)) any = true;
                if (any) used[k] = true;
            }
            for (const std::string& n : names) {
                bool m = false;
                for (const std::string& p : patterns) m = m || matches(p, n);
                hit += m;
            }
            bool tied_hit = false;
            if (tied_wte)
                for (const std::string& p : patterns) tied_hit = tied_hit || matches(p, kTied);
            if (hit == 0 && !tied_hit) continue;
            if (hit < names.size() && !(tied_wte && tied_hit)) {
                std::string all;
                for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
                throw std::invalid_argument("--freeze: " + all + " are one fused tensor in polevault (" + t.name +
                                            ") and the patterns take only part of it; freeze all of them or none");
            }
            out.names.insert(t.name);
            if (tied_wte)
                out.notes.push_back(hit > 0
                                        ? "model.embed_tokens.weight is tied to lm_head.weight: lm_head is frozen too"
                                        : "lm_head.weight is tied to model.embed_tokens.weight: the embedding is "
                                          "frozen too");
        }
    }
    for (size_t k = 0; k < patterns.size(); ++k)
        if (!used[k])
            throw std::invalid_argument(
                "--freeze: the pattern '" + patterns[k] +
                "' matches no tensor of this model (names "
                "look like 'model.embed_tokens.weight', 'model.layers.0.input_layernorm.weight', "
                "'model.layers.0.self_attn.q_proj.weight'); check its spelling");
    if ((long long)out.names.size() == tensors)
        throw std::invalid_argument("--freeze freezes every tensor of the model: nothing would train; freeze fewer");
    return out;
}

}  // namespace pv
