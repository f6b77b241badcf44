// LoRA adapter configuration and shapes (model/lora.h).
#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace pv {

double LoraConfig::scale() const { return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank); }

const std::vector<std::string>& lora_module_names() {
    static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
    return names;
}

namespace {

std::string known_modules() {
    std::string all;
    for (const std::string& n : lora_module_names()) all += (all.empty() ? "" : ",") + n;
    return all;
}

}  // namespace

std::vector<std::string> validate(const LoraConfig& lora) {
    std::vector<std::string> problems;
    if (lora.rank < 0)
        problems.push_back("--lora-rank must be >= 0 (0: no adapters), got " + std::to_string(lora.rank));
    if (!lora.enabled()) return problems;
    if (!(std::isfinite(lora.alpha) && lora.alpha > 0))
        problems.push_back("--lora-alpha must be a positive number, got " + std::to_string(lora.alpha));
    if (!(lora.dropout >= 0 && lora.dropout < 1))
        problems.push_back("--lora-dropout must be in [0, 1), got " + std::to_string(lora.dropout));
    if (lora.targets.empty()) problems.push_back("--lora-targets names no module; name some of " + known_modules());
    for (size_t i = 0; i < lora.targets.size(); ++i) {
        const std::string& t = lora.targets[i];
        const auto& known = lora_module_names();
        if (std::find(known.begin(), known.end(), t) == known.end())
            problems.push_back("--lora-targets: unknown module '" + t + "'; the modules are " + known_modules());
        if (std::find(lora.targets.begin(), lora.targets.begin() + long(i), t) != lora.targets.begin() + long(i))
            problems.push_back("--lora-targets names '" + t + "' twice");
    }
    return problems;
}

std::vector<std::string> parse_lora_targets(const std::string& comma_separated) {
    std::vector<std::string> out;
    size_t begin = 0;
    while (begin <= comma_separated.size()) {
        const size_t end = std::min(comma_separated.find(',', begin), comma_separated.size());
        std::string t = comma_separated.substr(begin, end - begin);
        t.erase(0, t.find_first_not_of(" \t"));
        t.erase(t.find_last_not_of(" \t") + 1);
        if (!t.empty()) {
            const auto& known = lora_module_names();
            if (std::find(known.begin(), known.end(), t) == known.end())
                throw std::invalid_argument("--lora-targets: unknown module '" + t + "'; the modules are " +
                                            known_modules());
            out.push_back(t);
        }
        begin = end + 1;
    }
    return out;
}

std::vector<LoraLinearShape> lora_linears(const LlamaConfig& c, const LoraConfig& lora) {
    const int C = c.hidden_size, F = c.ffn_size, q = c.q_width(), kv = c.kv_width();
    struct Module {
        const char* name;
        const char* path;
        int linear, out_begin, rows;
    };
    const Module modules[] = {
        {"q_proj", "self_attn.q_proj", kLoraQkv, 0, q},       {"k_proj", "self_attn.k_proj", kLoraQkv, q, kv},
        {"v_proj", "self_attn.v_proj", kLoraQkv, q + kv, kv}, {"o_proj", "self_attn.o_proj", kLoraO, 0, C},
        {"gate_proj", "mlp.gate_proj", kLoraGateUp, 0, F},    {"up_proj", "mlp.up_proj", kLoraGateUp, F, F},
        {"down_proj", "mlp.down_proj", kLoraDown, 0, C}};
    std::vector<LoraLinearShape> out(kLoraLinears);
    out[kLoraQkv] = {C, c.qkv_width(), {}};
    out[kLoraO] = {q, C, {}};
    out[kLoraGateUp] = {C, 2 * F, {}};
    out[kLoraDown] = {F, C, {}};
    if (!lora.enabled()) return out;
    for (const Module& m : modules) {  // in forward order, so parts are in row order
        if (std::find(lora.targets.begin(), lora.targets.end(), m.name) == lora.targets.end()) continue;
        LoraLinearShape& s = out[size_t(m.linear)];
        s.parts.push_back(LoraPart{m.path, m.out_begin, m.rows, s.b_rows()});
    }
    return out;
}

std::string lora_a_name(int linear) {
    static const char* names[] = {"lora_a_qkv", "lora_a_o", "lora_a_gate_up", "lora_a_down"};
    return names[linear];
}

std::string lora_b_name(int linear) {
    static const char* names[] = {"lora_b_qkv", "lora_b_o", "lora_b_gate_up", "lora_b_down"};
    return names[linear];
}

}  // namespace pv
