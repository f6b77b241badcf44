// Run files (see trainer/run_file.h): YAML through yaml-cpp, the aliases, "did you mean", and the
// resolved run.yaml a run writes.
#include "trainer/run_file.h"

#include "trainer/options.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace pv {

const char* source_name(OptionSource s) {
    switch (s) {
        case OptionSource::default_value: return "default";
        case OptionSource::checkpoint: return "checkpoint";
        case OptionSource::run_file: return "run file";
        case OptionSource::command_line: return "command line";
    }
    return "?";
}

OptionSource OptionSources::of(const std::string& key) const {
    const auto it = by_key.find(key);
    return it == by_key.end() ? base_source : it->second;
}

namespace {

// "lora-rank" and "lora_rank" alike.
std::string normal(std::string name) {
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
}

// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
// neighbours each cost one ("rnak" is one edit from "rank").
size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

bool is_bool(const YAML::Node& n) {
    if (!n.IsScalar() || n.Tag() == "!") return false;  // "true" in quotes is text
    const std::string t = n.Scalar();
    return t == "true" || t == "True" || t == "TRUE" || t == "false" || t == "False" || t == "FALSE";
}
bool bool_value(const YAML::Node& n) { return lower(n.Scalar()) == "true"; }

bool is_integer_text(const std::string& t) {
    size_t i = t.size() > 0 && (t[0] == '-' || t[0] == '+') ? 1 : 0;
    if (i == t.size()) return false;
    for (; i < t.size(); ++i)
        if (!std::isdigit(static_cast<unsigned char>(t[i]))) return false;
    return true;
}

bool is_number_text(const std::string& t) {
    if (t.empty() || std::isspace(static_cast<unsigned char>(t[0]))) return false;
    char* end = nullptr;
    std::strtod(t.c_str(), &end);
    return end == t.c_str() + t.size();
}

const char* kind_of(const YAML::Node& n) {
    return n.IsMap() ? "a mapping" : n.IsSequence() ? "a list" : n.IsNull() ? "nothing" : "a value";
}

// The modules PEFT's target_modules: all-linear means, in a Llama block.
constexpr const char* kAllLinear = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";

// Hugging Face TrainingArguments / PEFT LoraConfig / TRL SFTConfig / axolotl names that are
// polevault flags under another name, with the same meaning (the special cases are in translate()).
struct SimpleAlias {
    const char* name;
    const char* flag;
};
constexpr SimpleAlias kSimpleAliases[] = {
    {"learning_rate", "lr"},
    {"per_device_train_batch_size", "micro-batch"},
    {"micro_batch_size", "micro-batch"},
    {"gradient_accumulation_steps", "accumulation"},
    {"max_seq_length", "seq-len"},
    {"sequence_len", "seq-len"},
    {"lora_r", "lora-rank"},
    {"target_modules", "lora-targets"},
    {"lora_target_modules", "lora-targets"},
    {"save_steps", "checkpoint-interval"},
    {"save_total_limit", "keep-checkpoints"},
    {"eval_steps", "eval-interval"},
    {"output_dir", "out-dir"},
    {"max_steps", "steps"},
    {"warmup_steps", "warmup"},
    {"max_grad_norm", "clip"},
    {"adam_beta1", "beta1"},
    {"adam_beta2", "beta2"},
    {"adam_epsilon", "eps"},
    {"num_train_epochs", "epochs"},
    {"num_epochs", "epochs"},
    {"warmup_ratio", "warmup-ratio"},
};

}  // namespace

const std::vector<RunFileAlias>& run_file_aliases() {
    static const std::vector<RunFileAlias> aliases{
        {"learning_rate", "--lr"},
        {"per_device_train_batch_size", "--micro-batch (sequences per forward pass on one rank)"},
        {"micro_batch_size", "--micro-batch (axolotl)"},
        {"gradient_accumulation_steps",
         "--accumulation: --batch = micro-batch x accumulation x ranks, computed once the rank count is known"},
        {"max_seq_length", "--seq-len (TRL)"},
        {"sequence_len", "--seq-len (axolotl)"},
        {"lora_r", "--lora-rank (axolotl; PEFT's r)"},
        {"target_modules", "--lora-targets (a list, a comma-separated string, or all-linear)"},
        {"lora_target_modules", "--lora-targets (axolotl)"},
        {"save_steps", "--checkpoint-interval"},
        {"save_total_limit", "--keep-checkpoints"},
        {"eval_steps", "--eval-interval"},
        {"output_dir", "--out-dir"},
        {"max_steps", "--steps"},
        {"warmup_steps", "--warmup"},
        {"max_grad_norm", "--clip"},
        {"adam_beta1", "--beta1"},
        {"adam_beta2", "--beta2"},
        {"adam_epsilon", "--eps"},
        {"lr_scheduler_type", "--schedule: linear, cosine, constant (and constant_with_warmup) as named"},
        {"bf16", "true: --dtype bf16"},
        {"fp16", "false: accepted and ignored; true: refused (polevault has no fp16 training)"},
        {"gradient_checkpointing", "true: --checkpoint-activations; false: --no-checkpoint-activations"},
        {"logging_steps", "accepted and ignored: polevault logs every step (stdout and metrics.jsonl)"},
        {"num_train_epochs", "--epochs (steps = ceil(epochs x training windows / --batch))"},
        {"num_epochs", "--epochs (axolotl)"},
        {"warmup_ratio", "--warmup-ratio (warmup = ceil(ratio x steps), as Hugging Face counts it)"},
    };
    return aliases;
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
    const std::string w = lower(normal(word));
    std::string best;
    size_t best_d = std::string::npos;
    for (const std::string& c : candidates) {
        const size_t d = edit_distance(w, lower(normal(c)));
        if (d < best_d) best_d = d, best = c;
    }
    const size_t allowed = w.size() <= 3 ? 1 : w.size() <= 8 ? 2 : 3;
    return best_d <= allowed && best_d > 0 ? best : best_d == 0 ? best : "";
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         const std::string& prefix) {
    const std::string n = nearest_name(word, candidates);
    return n.empty() ? "" : "; did you mean " + prefix + n + "?";
}

namespace {

class Translator {
  public:
    Translator(const std::string& path, const std::vector<FlagSpec>& flags) : path_(path), flags_(flags) {
        for (const FlagSpec& f : flags_) by_normal_[normal(f.name)] = &f;
    }

    RunFile run(const YAML::Node& root) {
        RunFile out;
        out.path = path_;
        if (root.IsNull()) return out;  // an empty file sets nothing
        if (!root.IsMap())
            fail(root, "the file must be a mapping of flags to values (lora_rank: 8), not " + std::string(kind_of(root)));
        std::map<std::string, std::pair<int, std::string>> seen;  // flag -> (line, key) that set it
        for (auto it = root.begin(); it != root.end(); ++it) {
            const YAML::Node k = it->first, v = it->second;  // copies: the iterator's pair is a temporary
            if (!k.IsScalar()) fail(k, "a key must be a name, not " + std::string(kind_of(k)));
            const std::string key = k.Scalar();
            const int line = k.Mark().line + 1;
            std::vector<RunFileEntry> entries = translate(key, line, k, v, out.notes);
            for (RunFileEntry& e : entries) {
                const std::string target = normal(e.flag);
                if (const auto s = seen.find(target); s != seen.end())
                    fail(k, key + (s->second.second == key ? " is given twice (first on line " +
                                                                 std::to_string(s->second.first) + ")"
                                                           : " sets --" + e.flag + ", which " + s->second.second +
                                                                 " on line " + std::to_string(s->second.first) +
                                                                 " already sets") +
                                 ": keep one");
                seen[target] = {line, key};
                out.entries.push_back(std::move(e));
            }
            if (entries.empty()) seen[normal(key)] = {line, key};
        }
        return out;
    }

  private:
    [[noreturn]] void fail(const YAML::Node& at, const std::string& what) const {
        throw std::invalid_argument(path_ + ":" + std::to_string(at.Mark().line + 1) + ": " + what);
    }

    const FlagSpec* flag(const std::string& name) const {
        const auto it = by_normal_.find(normal(name));
        return it == by_normal_.end() ? nullptr : it->second;
    }

    std::vector<std::string> known_keys() const {
        std::vector<std::string> keys;
        for (const FlagSpec& f : flags_) {
            keys.push_back(normal(f.name));
            if (!f.negation.empty()) keys.push_back(normal(f.negation));
        }
        for (const RunFileAlias& a : run_file_aliases()) keys.push_back(a.name);
        return keys;
    }

    // The value of `key` (written in the file) for flag `f` as command-line arguments.
    RunFileEntry entry(const std::string& key, int line, const YAML::Node& kn, const FlagSpec& f, const YAML::Node& v) const {
        RunFileEntry e{key, line, f.name, {}};
        const std::string name = "--" + f.name;
        if (v.IsNull()) fail(kn, key + " has no value: give one (or remove the line to keep the default)");
        if (v.IsMap()) fail(kn, key + ": expected a value, not a mapping");
        if (f.kind == FlagSpec::Kind::flag) {
            if (!is_bool(v)) fail(kn, key + ": expected true or false, got " + describe(v));
            if (bool_value(v))
                e.args = {name};
            else if (!f.negation.empty())
                e.args = {"--" + f.negation};
            else
                e.args = {name + "=false"};
            return e;
        }
        if (f.kind == FlagSpec::Kind::optional_value) {  // --checkpoint-activations[=N]
            if (is_bool(v)) {
                if (bool_value(v)) e.args = {name};
                else if (flag("no-" + f.name)) e.args = {"--no-" + f.name};
                else fail(kn, key + ": expected true or a number");
                return e;
            }
            if (!v.IsScalar() || !(is_integer_text(v.Scalar()) || v.Scalar() == "auto"))
                fail(kn, key + ": expected true, false, auto or a whole number, got " + describe(v));
            if (v.Scalar() == "-1" && flag("no-" + f.name))
                e.args = {"--no-" + f.name};
            else
                e.args = {name + "=" + v.Scalar()};
            return e;
        }
        std::string text;
        if (v.IsSequence()) {
            if (!f.list) fail(kn, key + ": expected one value, not a list (" + name + " takes one)");
            for (const YAML::Node& item : v) {
                if (!item.IsScalar()) fail(item, key + ": every item of the list must be a name");
                text += (text.empty() ? "" : ",") + item.Scalar();
            }
        } else {
            text = v.Scalar();
            if (f.type == "INT" || f.type == "UINT") {
                if (!is_integer_text(text)) fail(kn, key + ": expected a whole number, got " + describe(v));
            } else if (f.type == "FLOAT") {
                if (is_bool(v) || !is_number_text(text)) fail(kn, key + ": expected a number, got " + describe(v));
            }
        }
        e.args = {name, text};
        return e;
    }

    static std::string describe(const YAML::Node& v) {
        if (v.IsScalar()) return v.Tag() == "!" ? "\"" + v.Scalar() + "\"" : v.Scalar();
        return kind_of(v);
    }

    // The polevault flags a key stands for: itself, an alias, or nothing (a key accepted and ignored).
    std::vector<RunFileEntry> translate(const std::string& key, int line, const YAML::Node& kn, const YAML::Node& v,
                                        std::vector<std::string>& notes) const {
        const std::string at = path_ + ":" + std::to_string(line) + ": ";
        if (normal(key) == "run") fail(kn, "run: a run file cannot name another; give every option in this one");
        for (const FlagSpec& f : flags_)
            if (!f.negation.empty() && normal(f.negation) == normal(key)) {  // no-double-quant: true
                if (!is_bool(v)) fail(kn, key + ": expected true or false, got " + describe(v));
                return {RunFileEntry{key, line, f.name, {bool_value(v) ? "--" + f.negation : "--" + f.name}}};
            }
        if (const FlagSpec* f = flag(key)) {
            if (f->kind == FlagSpec::Kind::flag && normal(f->name).rfind("no_", 0) == 0) {
                // --no-checkpoint-activations: true. Its own key, the opposite spelling of its flag.
                const FlagSpec* positive = flag(f->name.substr(3));
                if (!is_bool(v)) fail(kn, key + ": expected true or false, got " + describe(v));
                if (positive && !bool_value(v)) return {entry(key, line, kn, *positive, v)};
                RunFileEntry e{key, line, positive ? positive->name : f->name, {"--" + f->name}};
                if (!bool_value(v)) fail(kn, key + ": false says nothing; remove the line");
                return {e};
            }
            return {entry(key, line, kn, *f, v)};
        }
        for (const SimpleAlias& a : kSimpleAliases)
            if (key == a.name) {
                const FlagSpec* f = flag(a.flag);
                if (!f) break;
                if ((key == "target_modules" || key == "lora_target_modules") && v.IsScalar() && v.Scalar() == "all-linear") {
                    RunFileEntry e{key, line, f->name, {"--" + f->name, kAllLinear}};
                    return {e};
                }
                return {entry(key, line, kn, *f, v)};
            }
        if (key == "bf16") {
            if (!is_bool(v)) fail(kn, "bf16: expected true or false, got " + describe(v));
            if (!bool_value(v))
                fail(kn, "bf16: false does not say which type to train in: give dtype: fp32 (or fp64) instead");
            return {RunFileEntry{key, line, "dtype", {"--dtype", "bf16"}}};
        }
        if (key == "fp16") {
            if (!is_bool(v)) fail(kn, "fp16: expected true or false, got " + describe(v));
            if (bool_value(v))
                fail(kn, "fp16: polevault has no fp16 training: use bf16: true (dtype: bf16), which needs no loss scaling");
            return {};
        }
        if (key == "gradient_checkpointing") {
            if (!is_bool(v)) fail(kn, "gradient_checkpointing: expected true or false, got " + describe(v));
            if (const FlagSpec* f = flag("checkpoint-activations")) return {entry(key, line, kn, *f, v)};
        }
        if (key == "lr_scheduler_type") {
            if (!v.IsScalar()) fail(kn, "lr_scheduler_type: expected a name, got " + describe(v));
            const std::string s = v.Scalar();
            const std::string to = s == "constant_with_warmup" ? "constant" : s;
            if (to != "linear" && to != "cosine" && to != "constant")
                fail(kn, "lr_scheduler_type: " + s +
                             " has no polevault equivalent; polevault's schedules (--schedule) are linear, cosine, "
                             "constant (with warmup) and wsd, each decaying to --final-lr-fraction of the peak: give "
                             "schedule: instead");
            return {RunFileEntry{key, line, "schedule", {"--schedule", to}}};
        }
        if (key == "logging_steps") {
            if (!v.IsScalar() || !is_integer_text(v.Scalar()))
                fail(kn, "logging_steps: expected a whole number, got " + describe(v));
            notes.push_back(at + "logging_steps ignored: polevault logs every step (its line on stdout and in "
                                 "metrics.jsonl)");
            return {};
        }
        fail(kn, "unknown key " + key + did_you_mean(key, known_keys()) + " (keys are the training flags, e.g. "
                 "lora_rank for --lora-rank, and the names in docs/run-files.md)");
    }

    std::string path_;
    const std::vector<FlagSpec>& flags_;
    std::map<std::string, const FlagSpec*> by_normal_;
};

}  // namespace

RunFile parse_run_file(const std::string& text, const std::string& path, const std::vector<FlagSpec>& flags) {
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
        throw std::invalid_argument(path + ":" + std::to_string(e.mark.line + 1) + ":" +
                                    std::to_string(e.mark.column + 1) + ": not valid YAML: " + e.msg);
    }
    return Translator(path, flags).run(root);
}

RunFile read_run_file(const std::string& path, const std::vector<FlagSpec>& flags) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument("--run " + path + ": cannot open the file");
    std::stringstream s;
    s << in.rdbuf();
    if (in.bad()) throw std::invalid_argument("--run " + path + ": cannot read the file");
    return parse_run_file(s.str(), path, flags);
}

namespace {

// The options by JSON key, including those checkpoints do not save (this invocation's choices).
nlohmann::json all_options(const TrainOptions& o) {
    nlohmann::json j = nlohmann::json::parse(train_options_json(o));
    j["gpu_memory"] = o.gpu_memory;
    j["collective_timeout"] = o.collective_timeout;
    j["allow_inexact_resume"] = o.allow_inexact_resume;
    j["overwrite_later"] = o.overwrite_later;
    j["overwrite"] = o.overwrite;
    j["extend_schedule"] = o.extend_schedule;
    j["keep_schedule"] = o.keep_schedule;
    return j;
}

std::string yaml_value(const std::string& key, const nlohmann::json& v) {
    if (key == "checkpoint_activations" && v.is_number_integer()) {
        const long long n = v.get<long long>();
        return n == kCheckpointActivationsAuto ? "auto" : n < 0 ? "false" : n == 0 ? "true" : std::to_string(n);
    }
    return v.dump();  // JSON scalars are YAML: "text" in double quotes with JSON's escapes, numbers exact
}

}  // namespace

std::string resolved_run_yaml(const TrainOptions& o, const OptionSources& sources, const TrainOptions* resolved) {
    const nlohmann::json j = all_options(o);
    const nlohmann::json r = resolved ? all_options(*resolved) : j;
    std::string out =
        "# polevault run file: every training option of this run with its final value (docs/run-files.md).\n"
        "# `train --run run.yaml` starts a run with the same options; flags given after it override them.\n"
        "# Each comment says where the value came from: default, checkpoint, run file";
    out += sources.run_file.empty() ? "" : " (" + sources.run_file + ")";
    out += " or command line.\n";
    std::string group;
    for (const FlagSpec& f : train_flag_specs()) {
        const std::string key = normal(f.name);
        if (!j.contains(key)) continue;  // --no-checkpoint-activations: written as checkpoint_activations: false
        if (f.group != group) out += "\n# " + (group = f.group) + "\n";
        std::string line = key + ": " + yaml_value(key, j.at(key));
        std::string comment = source_name(sources.of(key));
        if (const auto n = sources.notes.find(key); n != sources.notes.end()) comment += ": " + n->second;
        if (r.at(key) != j.at(key)) comment += "; this run: " + yaml_value(key, r.at(key));
        line.resize(std::max<size_t>(line.size() + 1, 44), ' ');
        out += line + "# " + comment + "\n";
    }
    return out;
}

}  // namespace pv
