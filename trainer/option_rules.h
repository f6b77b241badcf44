// What every training option may be, in one table that both the command line and a checkpoint's
// trainer_state.json go through, so a file can never make `train` do what its flags cannot.
//
// Each numeric option has a range (finite always: NaN and infinities are refused, whatever the
// range), each enumerated one its choices. Options are checked by their JSON form (the same keys
// trainer_state.json holds), so one loop covers every field; the flag of key `final_lr_fraction`
// is `--final-lr-fraction`. A problem reads "--eps 0: must be > 0 (AdamW epsilon)": the flag, the
// value as given, and what is allowed. Rules between options are one table too (option_rules):
// each row names its flags and says what is wrong with them together; the parallel layer's row
// runs the strategy's own checks on the world size (parallel/plan.h check_strategy). Rules that
// need the data or a checkpoint (batch divisibility, --seq-len 0 without a model) stay where that
// is known (trainer/main.cu).
// Host C++ only.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace pv {

struct TrainOptions;

// The allowed range of a number; integer ones must also be whole numbers (a JSON 2.5 for
// --in-flight is refused; on the command line CLI11 refuses it when converting).
struct NumberRule {
    double lo, hi;
    bool lo_open = false, hi_open = false;  // an open end excludes the bound itself
    bool integer = false;
};

// Integers from lo to hi (default: to the most an int holds); reals from lo to hi (default: any
// finite number above lo).
NumberRule whole_number(double lo, double hi = 2147483647.0);
NumberRule real_number(double lo, double hi = 1.7976931348623157e308, bool lo_open = false, bool hi_open = false);

// Empty when `value` is finite and within `rule`; else what is wrong with it ("must be > 0",
// "must be a finite number in [0, 1)").
std::string number_problem(double value, const NumberRule& rule);

// The choices of an enumerated training option by its JSON key ("dtype" -> bf16, fp32, fp64);
// empty for any other key.
std::vector<std::string> option_choices(const std::string& key);

// "--final-lr-fraction" for "final_lr_fraction".
std::string flag_of(const std::string& key);

// The rules between options: the flags a rule relates, and its problem for options `o` on
// `ranks` ranks (empty when they agree).
struct OptionRule {
    const char* flags;
    std::string (*problem)(const TrainOptions& o, int ranks);
};
const std::vector<OptionRule>& option_rules();
// Throws std::invalid_argument with the first rule's problem (the options as given: --parallel
// auto is resolved later, and its strategy checked then).
void check_option_rules(const TrainOptions& o, int ranks);

// Every problem of the options, each naming the flag; empty when they are all valid.
std::vector<std::string> train_option_problems(const TrainOptions& o);
// The same of their JSON form as a file holds it, before it is converted (so 2.5 or 1e10 for an
// int option is seen as it is, not truncated or wrapped); keys absent are not checked.
std::vector<std::string> train_option_problems(const nlohmann::json& options);

}  // namespace pv
