// Ranks that agree on the run (trainer/rank_agreement.h).
#include "trainer/rank_agreement.h"

#include "io/checksum.h"
#include "trainer/option_rules.h"
#include "trainer/options.h"

#include <nlohmann/json.hpp>

#include <map>

namespace pv {

std::string run_statement(const TrainOptions& resolved, uint64_t data_fingerprint, uint64_t tokenizer_fingerprint,
                          const std::string& model_config_json) {
    nlohmann::json j;
    j["options"] = nlohmann::json::parse(train_options_json(resolved));
    j["data"] = checksum_hex(data_fingerprint);
    j["tokenizer"] = checksum_hex(tokenizer_fingerprint);
    j["model"] = nlohmann::json::parse(model_config_json);
    return j.dump();
}

namespace {

// "rank 0", "ranks 0, 2 and 3".
std::string ranks_text(const std::vector<int>& ranks) {
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i)
        out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
    return out;
}

// What the item at `key` is called in the message.
std::string item_name(const std::string& key) {
    if (key.rfind("options/", 0) == 0) return flag_of(key.substr(8));
    if (key == "data") return "the training data's fingerprint";
    if (key == "tokenizer") return "the tokenizer's fingerprint";
    return "the model's config.json field " + key.substr(6);  // "model/hidden_size"
}

// Each leaf of the statement by its "options/lr"-style key (model and options one level deep).
std::map<std::string, std::string> items_of(const std::string& statement) {
    const nlohmann::json j = nlohmann::json::parse(statement);
    std::map<std::string, std::string> items;
    for (const auto& [part, value] : j.items()) {
        if (value.is_object())
            for (const auto& [key, v] : value.items()) items[part + "/" + key] = v.dump();
        else
            items[part] = value.dump();
    }
    return items;
}

}  // namespace

std::string rank_disagreement(const std::vector<std::string>& statements) {
    std::vector<std::map<std::string, std::string>> items;
    for (const std::string& s : statements) items.push_back(items_of(s));
    std::map<std::string, bool> keys;
    for (const auto& m : items)
        for (const auto& [key, value] : m) keys[key] = true;
    std::string differences;
    int shown = 0, total = 0;
    for (const auto& [key, unused] : keys) {
        std::map<std::string, std::vector<int>> ranks_by_value;  // "(none)": the rank lacks the item
        for (size_t r = 0; r < items.size(); ++r) {
            const auto it = items[r].find(key);
            ranks_by_value[it == items[r].end() ? "(none)" : it->second].push_back(int(r));
        }
        if (ranks_by_value.size() == 1) continue;
        if (++total > 5) continue;  // the first five say enough
        ++shown;
        std::string values;
        for (const auto& [value, ranks] : ranks_by_value)
            values += (values.empty() ? "" : ", ") + value + " on " + ranks_text(ranks);
        differences += "\n  " + item_name(key) + " is " + values;
    }
    if (total == 0) return "";
    if (total > shown) differences += "\n  (and " + std::to_string(total - shown) + " more)";
    return "the ranks were started with different runs (their replicas would diverge and only rank 0's would be "
           "saved):" +
           differences +
           "\nstart every rank with the same flags and the same files (one `mpirun -np N train ...` command, the "
           "same --data and --init-from on every node)";
}

}  // namespace pv
