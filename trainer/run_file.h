// Run files: `train --run run.yaml` takes training flags from a YAML file (docs/run-files.md).
//
//   # run.yaml
//   init-from: models/SmolLM2-135M
//   lora_rank: 16                    # a flag's name without --, with - or _
//   lora-targets: [q_proj, v_proj]   # list flags take a YAML list or a comma-separated string
//   learning_rate: 2.0e-4            # Hugging Face TrainingArguments / PEFT / TRL names where the
//   per_device_train_batch_size: 4   # meaning is the same (the table is in docs/run-files.md)
//
// Flags on the command line override the file's. Unknown keys, keys given twice (also as two
// spellings or an alias and its flag) and values of the wrong type are errors naming the file and
// the line, with the nearest known key. A run writes its resolved options back as run.yaml in its
// output directory (resolved_run_yaml): every flag's final value and where it came from; that file
// given to --run reproduces the same options.
//
// This file knows YAML and the aliases; the flags themselves are CLI11's (trainer/options.cpp),
// described to it as FlagSpecs, so every training flag is a key without a second list. Host C++.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace pv {

struct TrainOptions;

// Where an option's value came from.
enum class OptionSource { default_value, checkpoint, run_file, command_line };
const char* source_name(OptionSource s);  // "default", "checkpoint", "run file", "command line"

struct OptionSources {
    std::string run_file;                          // the --run file; empty: none
    std::map<std::string, OptionSource> by_key;    // by JSON key ("lora_rank"); absent: base_source
    std::map<std::string, std::string> notes;      // by JSON key: how a value was derived (batch from accumulation)
    OptionSource base_source = OptionSource::default_value;  // the defaults, or a resumed checkpoint's options
    OptionSource of(const std::string& key) const;
};

// A training flag as the run file sees it: its long name without "--" ("lora-rank"), what it
// takes, and whether a YAML list is joined with commas into its value.
struct FlagSpec {
    enum class Kind { value, flag, optional_value } kind = Kind::value;
    std::string name;
    std::string type;      // CLI11's type name: INT, UINT, FLOAT, TEXT
    bool list = false;     // comma-separated (--lora-targets, --freeze)
    std::string negation;  // a flag's "--no-..." form, if it has one ("no-double-quant")
    std::string group;     // its --help group ("LoRA/QLoRA")
};

// One key of a run file as the command-line arguments it stands for.
struct RunFileEntry {
    std::string key;                // as written in the file ("per_device_train_batch_size")
    int line = 0;                   // 1-based
    std::string flag;               // the flag it sets, without "--" ("micro-batch")
    std::vector<std::string> args;  // e.g. {"--micro-batch", "4"}, {"--no-double-quant"}
};

struct RunFile {
    std::string path;
    std::vector<RunFileEntry> entries;  // in file order
    std::vector<std::string> notes;     // keys accepted and ignored, each "FILE:LINE: ..." (logging_steps)
};

// Reads and translates a run file; throws std::invalid_argument "FILE:LINE: ..." for a YAML
// syntax error, a top level that is not a mapping, an unknown key (with "did you mean"), a key
// given twice, an alias polevault cannot honour, or a value of the wrong shape or type.
RunFile read_run_file(const std::string& path, const std::vector<FlagSpec>& flags);
RunFile parse_run_file(const std::string& text, const std::string& path, const std::vector<FlagSpec>& flags);

// The Hugging Face / PEFT / TRL / axolotl names the run file accepts, each with what it means in
// polevault (for docs and help).
struct RunFileAlias {
    const char* name;
    const char* meaning;
};
const std::vector<RunFileAlias>& run_file_aliases();

// The nearest of `candidates` to `word` by edit distance (a transposition counts as one edit), if
// near enough to be a likely typo; empty otherwise.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean X?)"-style tail: "; did you mean X?" or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         const std::string& prefix = "");

// The options as a run file: every training flag (the keys of train_options_json plus the
// per-invocation ones) with its final value, and a comment saying where it came from (default,
// checkpoint, run file, command line) and, where `resolved` differs (an automatic micro-batch, the
// strategy --parallel auto chose), what the run resolved it to. --run of the result gives the
// same TrainOptions.
std::string resolved_run_yaml(const TrainOptions& o, const OptionSources& sources,
                              const TrainOptions* resolved = nullptr);

}  // namespace pv
