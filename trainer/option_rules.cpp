// The table of training options' ranges and choices (see trainer/option_rules.h).
#include "trainer/option_rules.h"

#include "parallel/plan.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <climits>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

namespace pv {

namespace {

constexpr double kInt = INT_MAX, kLong = double(LLONG_MAX);

constexpr double kHuge = std::numeric_limits<double>::max();
NumberRule at_least(double lo, double hi = kInt) { return whole_number(lo, hi); }
NumberRule real(double lo, double hi, bool lo_open = false, bool hi_open = false) {
    return real_number(lo, hi, lo_open, hi_open);
}

// clang-format off
// Every numeric training option by its JSON key. Booleans, strings and the seed (any 64-bit
// value) have no range; the enumerated strings are option_choices'.
const std::map<std::string, NumberRule>& number_rules() {
    static const std::map<std::string, NumberRule> rules{
        {"vocab",                  at_least(257, 1 << 20)},
        {"steps",                  at_least(1, kLong)},
        {"batch",                  at_least(1)},
        {"micro_batch",            at_least(0)},
        {"accumulation",           at_least(0)},
        {"seq_len",                at_least(0)},  // 0: from the data (fine-tuning, trainer/run_data.h)
        {"lr",                     real(0, kHuge)},
        {"warmup",                 at_least(0)},
        {"warmup_ratio",           real(0, 1)},
        {"epochs",                 real(0, 1e6)},
        {"schedule_steps",         at_least(0, kLong)},
        {"final_lr_fraction",      real(0, 1)},
        {"clip",                   real(0, kHuge)},
        {"skip_nonfinite",         at_least(0, kLong)},
        {"weight_decay",           real(0, kHuge)},
        {"beta1",                  real(0, 1, false, true)},  // 1 would divide by 1 - beta^t = 0
        {"beta2",                  real(0, 1, false, true)},
        {"eps",                    real(0, kHuge, true)},
        {"pipeline_stages",        at_least(0)},
        {"in_flight",              at_least(0)},
        {"pipeline_chunks",        at_least(0)},
        {"shard_group",            at_least(0)},
        {"tp",                     at_least(1)},
        {"checkpoint_activations", at_least(-2)},  // -2: auto; and not 1: checked below
        {"eval_interval",          at_least(0)},
        {"eval_batches",           at_least(1)},
        {"checkpoint_interval",    at_least(0, kLong)},
        {"stop_after",             at_least(0, kLong)},
        {"keep_checkpoints",       at_least(0, kLong)},
        {"sample_tokens",          at_least(0)},
        {"temperature",            real(0, kHuge)},
        {"top_p",                  real(0, 1, true)},  // 0 keeps no token
        {"lora_rank",              at_least(0)},
        {"lora_alpha",             real(0, kHuge, true)},
        {"lora_dropout",           real(0, 1, false, true)},
    };
    return rules;
}
// clang-format on

// The shortest text that reads back as `v` ("0.1", "1e+39", "nan").
std::string number_text(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char text[64];
    const auto end = std::to_chars(text, text + sizeof text, v).ptr;
    return std::string(text, end);
}

std::string bound_text(double v) {
    if (v >= kHuge) return "";
    if (v == kInt) return "2147483647";
    if (v == kLong) return "9223372036854775807";
    return number_text(v);
}

std::string choice_list(const std::vector<std::string>& choices) {
    std::string out;
    for (const std::string& c : choices) out += (out.empty() ? "" : ", ") + (c.empty() ? std::string("\"\"") : c);
    return out;
}

}  // namespace

NumberRule whole_number(double lo, double hi) { return {lo, hi, false, false, true}; }
NumberRule real_number(double lo, double hi, bool lo_open, bool hi_open) { return {lo, hi, lo_open, hi_open, false}; }

std::string number_problem(double value, const NumberRule& r) {
    const bool below = r.lo_open ? !(value > r.lo) : !(value >= r.lo);
    const bool above = r.hi_open ? !(value < r.hi) : !(value <= r.hi);
    const bool whole = !r.integer || value == std::floor(value);
    if (std::isfinite(value) && !below && !above && whole) return "";
    const std::string kind = r.integer ? "an integer" : "a finite number";
    if (r.hi >= kHuge || (r.integer && r.hi >= kInt && std::isfinite(value) && !above))
        return "must be " + kind + (r.lo_open ? " > " : " >= ") + bound_text(r.lo);
    return "must be " + kind + " in " + (r.lo_open ? "(" : "[") + bound_text(r.lo) + ", " + bound_text(r.hi) +
           (r.hi_open ? ")" : "]");
}

std::vector<std::string> option_choices(const std::string& key) {
    if (key == "dtype") return {"bf16", "fp32", "fp64"};
    if (key == "schedule") return {"constant", "cosine", "linear", "wsd"};
    if (key == "parallel") {
        std::vector<std::string> names = strategy_names();
        names.insert(names.begin(), "auto");
        return names;
    }
    if (key == "interconnect") return {"fast", "slow"};
    if (key == "balance") return {"flops", "params"};
    if (key == "pipeline_schedule") return {"gpipe", "1f1b", "interleaved"};
    if (key == "offload") return {"none", "optimizer", "params"};
    if (key == "quantize") return {"", "nf4"};
    return {};
}

std::string flag_of(const std::string& key) {
    std::string flag = "--" + key;
    for (char& c : flag)
        if (c == '_') c = '-';
    return flag;
}

std::vector<std::string> train_option_problems(const nlohmann::json& j) {
    std::vector<std::string> problems;
    const auto say = [&](const std::string& key, const nlohmann::json& v, const std::string& what) {
        problems.push_back(flag_of(key) + " " + v.dump() + ": " + what);
    };
    for (const auto& [key, rule] : number_rules()) {
        if (!j.contains(key)) continue;
        const nlohmann::json& v = j.at(key);
        if (!v.is_number() || (rule.integer && !v.is_number_integer())) {
            if (v.is_number())  // a fractional number for an integer option
                say(key, v, "must be an integer");
            else
                say(key, v, "must be a number");
            continue;
        }
        const double x = v.get<double>();
        if (std::string p = number_problem(x, rule); !p.empty()) {
            problems.push_back(flag_of(key) + " " + (v.is_number_integer() ? v.dump() : number_text(x)) + ": " + p);
        }
    }
    if (j.contains("checkpoint_activations") && j.at("checkpoint_activations") == 1)
        say("checkpoint_activations", j.at("checkpoint_activations"),
            "give -1 (off), 0 (every block recomputes), N >= 2 (one block in N keeps its activations) or -2 (auto: the "
            "fewest blocks that fit)");
    for (const char* key : {"dtype", "schedule", "parallel", "interconnect", "balance", "pipeline_schedule", "offload", "quantize"}) {
        if (!j.contains(key)) continue;
        const nlohmann::json& v = j.at(key);
        const std::vector<std::string> choices = option_choices(key);
        bool known = false;
        for (const std::string& c : choices) known |= v.is_string() && v.get<std::string>() == c;
        if (!known) say(key, v, "must be one of " + choice_list(choices));
    }
    return problems;
}

}  // namespace pv
