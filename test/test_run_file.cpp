// train's option parsing in process (trainer/options.h, trainer/run_file.h): --run's YAML files,
// their Hugging Face aliases, command-line overrides, errors naming the file and line with "did you
// mean", the resolved run.yaml a run writes (read back to the same options), and "did you mean"
// for unknown flags, commands and choices. One case runs the program itself (--version, --help).
#include <catch2/catch.hpp>

#include "test/temp_dir.h"
#include "test/train_runner.h"
#include "model/config.h"
#include "trainer/auto_layout.h"
#include "trainer/option_rules.h"
#include "trainer/options.h"
#include "trainer/run_file.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using pv::OptionSource;
using pv::test::TempDir;

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
    const std::string path = dir.file(name);
    std::ofstream(path) << text;
    return path;
}

// The message parse_arguments refuses `args` with ("" if it accepts them).
std::string refusal(const std::vector<std::string>& args) {
    try {
        pv::parse_arguments(args);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

// Every option, the ones checkpoints do not save included.
std::string everything(const pv::TrainOptions& o) {
    return pv::train_options_json(o) + o.gpu_memory + "|" + std::to_string(o.collective_timeout) + "|" +
           std::to_string(o.allow_inexact_resume) + std::to_string(o.overwrite_later);
}

}  // namespace

TEST_CASE("run file: flags by either spelling, lists, booleans and numbers typed as the flag takes them",
          "[options][run-file]") {
    TempDir dir("run_file_flags");
    const std::string run = write(dir, "run.yaml",
                                  "# a run\n"
                                  "lora-rank: 8\n"
                                  "lora_alpha: 16\n"
                                  "lora-targets: [q_proj, v_proj]\n"
                                  "freeze: \"\"\n"
                                  "lr: 3.0e-4\n"
                                  "steps: 40\n"
                                  "warmup: 4\n"
                                  "seed: 18446744073709551615\n"
                                  "decay_norm_weights: true\n"
                                  "double-quant: false\n"
                                  "checkpoint-activations: 2\n"
                                  "prompt: \"Once upon\"\n"
                                  "gpu-memory: 24GB\n"
                                  "collective_timeout: 30\n");
    const pv::Command c = pv::parse_arguments({"--run", run});
    CHECK(c.kind == pv::Command::Kind::train);
    CHECK(c.train.lora_rank == 8);
    CHECK(c.train.lora_alpha == 16);
    CHECK(c.train.lora_targets == "q_proj,v_proj");
    CHECK(c.train.lr == 3e-4);
    CHECK(c.train.steps == 40);
    CHECK(c.train.warmup == 4);
    CHECK(c.train.seed == 18446744073709551615ull);
    CHECK(c.train.decay_norm_weights);
    CHECK_FALSE(c.train.double_quant);
    CHECK(c.train.checkpoint_activations == 2);
    CHECK(c.train.prompt == "Once upon");
    CHECK(c.train.gpu_memory == "24GB");
    CHECK(c.train.collective_timeout == 30);
    CHECK(c.train_sources.run_file == run);
    CHECK(c.train_sources.of("lora_rank") == OptionSource::run_file);
    CHECK(c.train_sources.of("batch") == OptionSource::default_value);
    // Booleans for --checkpoint-activations: true is the bare flag, false turns it off.
    const std::string on = write(dir, "on.yaml", "checkpoint_activations: true\n");
    CHECK(pv::parse_arguments({"--run", on}).train.checkpoint_activations == 0);
    // auto, from a run file and back out of the resolved run.yaml.
    const std::string automatic = write(dir, "auto.yaml", "checkpoint_activations: auto\n");
    const pv::Command a = pv::parse_arguments({"--run", automatic});
    CHECK(a.train.checkpoint_activations == pv::kCheckpointActivationsAuto);
    CHECK(pv::resolved_run_yaml(a.train, a.train_sources, nullptr).find("\ncheckpoint_activations: auto ") !=
          std::string::npos);
    const std::string off = write(dir, "off.yaml", "checkpoint_activations: false\n");
    CHECK(pv::parse_arguments({"--run", off, "--checkpoint-activations"}).train.checkpoint_activations == 0);
    // `train plan` takes --run too; an empty file sets nothing.
    const std::string empty = write(dir, "empty.yaml", "# nothing yet\n");
    const pv::Command plan = pv::parse_arguments({"plan", "--run", run, "--ranks", "2"});
    CHECK(plan.kind == pv::Command::Kind::plan);
    CHECK(plan.train.lora_rank == 8);
    CHECK(everything(pv::parse_arguments({"--run", empty}).train) == everything(pv::TrainOptions{}));
}

TEST_CASE("run file: the command line overrides it, and each value's source is known", "[options][run-file]") {
    TempDir dir("run_file_override");
    const std::string run = write(dir, "run.yaml", "lr: 1.0e-3\nsteps: 40\nlora_rank: 4\n");
    const pv::Command c = pv::parse_arguments({"--lr", "5e-4", "--run", run, "--lora-rank", "16"});
    CHECK(c.train.lr == 5e-4);
    CHECK(c.train.lora_rank == 16);
    CHECK(c.train.steps == 40);
    CHECK(c.train_sources.of("lr") == OptionSource::command_line);
    CHECK(c.train_sources.of("steps") == OptionSource::run_file);
    CHECK(c.train_sources.of("seq_len") == OptionSource::default_value);
    // On resume the checkpoint's options are the base.
    pv::TrainOptions saved;
    saved.seq_len = 32;
    const pv::Command resumed = pv::parse_arguments({"--run", run}, saved, OptionSource::checkpoint);
    CHECK(resumed.train.seq_len == 32);
    CHECK(resumed.train_sources.of("seq_len") == OptionSource::checkpoint);
    CHECK(resumed.train.steps == 40);
}

TEST_CASE("run file: Hugging Face, PEFT, TRL and axolotl names where polevault means the same",
          "[options][run-file]") {
    TempDir dir("run_file_aliases");
    const std::string run = write(dir, "hf.yaml",
                                  "learning_rate: 2.0e-4\n"
                                  "per_device_train_batch_size: 4\n"
                                  "gradient_accumulation_steps: 2\n"
                                  "max_seq_length: 128\n"
                                  "lora_r: 16\n"
                                  "lora_alpha: 32\n"
                                  "lora_dropout: 0.05\n"
                                  "target_modules: all-linear\n"
                                  "save_steps: 10\n"
                                  "save_total_limit: 2\n"
                                  "eval_steps: 5\n"
                                  "logging_steps: 10\n"
                                  "output_dir: runs/hf\n"
                                  "seed: 42\n"
                                  "weight_decay: 0.0\n"
                                  "max_steps: 100\n"
                                  "lr_scheduler_type: linear\n"
                                  "warmup_steps: 10\n"
                                  "max_grad_norm: 0.3\n"
                                  "adam_beta2: 0.999\n"
                                  "bf16: true\n"
                                  "fp16: false\n"
                                  "gradient_checkpointing: true\n");
    pv::Command c = pv::parse_arguments({"--run", run});
    CHECK(c.train.lr == 2e-4);
    CHECK(c.train.micro_batch == 4);
    CHECK(c.train.accumulation == 2);
    CHECK(c.train.seq_len == 128);
    CHECK(c.train.lora_rank == 16);
    CHECK(c.train.lora_alpha == 32);
    CHECK(c.train.lora_dropout == 0.05);
    CHECK(c.train.lora_targets == "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    CHECK(c.train.checkpoint_interval == 10);
    CHECK(c.train.keep_checkpoints == 2);
    CHECK(c.train.eval_interval == 5);
    CHECK(c.train.out_dir == "runs/hf");
    CHECK(c.train.seed == 42);
    CHECK(c.train.weight_decay == 0);
    CHECK(c.train.steps == 100);
    CHECK(c.train.schedule == "linear");
    CHECK(c.train.warmup == 10);
    CHECK(c.train.clip == 0.3);
    CHECK(c.train.beta2 == 0.999);
    CHECK(c.train.dtype == "bf16");
    CHECK(c.train.checkpoint_activations == 0);
    REQUIRE(c.notes.size() == 1);
    CHECK(c.notes[0] == run + ":12: logging_steps ignored: polevault logs every step (its line on stdout and in "
                             "metrics.jsonl)");
    // The global batch once the ranks are known: per-device batch x accumulation x ranks.
    pv::apply_accumulation(c.train, 4, &c.train_sources);
    CHECK(c.train.batch == 32);
    CHECK(c.train.accumulation == 0);
    CHECK(c.train_sources.of("batch") == OptionSource::run_file);
    // What polevault cannot honour is refused, saying what to give instead.
    const std::vector<std::pair<std::string, std::string>> refused{
        {"fp16: true\n", ":1: fp16: polevault has no fp16 training"},
        {"bf16: false\n", ":1: bf16: false does not say which type to train in"},
        {"lr_scheduler_type: polynomial\n", ":1: lr_scheduler_type: polynomial has no polevault equivalent"},
        {"gradient_accumulation_steps: 4\n", "--accumulation 4 needs --micro-batch (per_device_train_batch_size)"},
        {"gradient_accumulation_steps: 4\nmicro_batch_size: 2\nbatch: 8\n",
         "--batch 8 and --accumulation 4 both set the global batch"},
    };
    // Epochs and a warmup ratio are polevault flags too.
    const pv::Command ratio =
        pv::parse_arguments({"--run", write(dir, "ratio.yaml", "num_train_epochs: 3\nwarmup_ratio: 0.05\n")});
    CHECK(ratio.train.epochs == 3);
    CHECK(ratio.train.warmup_ratio == 0.05);
    CHECK(pv::parse_arguments({"--run", write(dir, "axolotl.yaml", "num_epochs: 2\n")}).train.epochs == 2);
    for (const auto& [text, message] : refused) {
        const std::string bad = write(dir, "bad.yaml", text);
        const std::string why = refusal({"--run", bad});
        INFO(text << "\n" << why);
        CHECK(why.find(message) != std::string::npos);
    }
}

TEST_CASE("run file: unknown keys, repeated keys, bad values and bad YAML name the file and the line",
          "[options][run-file]") {
    TempDir dir("run_file_errors");
    const std::vector<std::pair<std::string, std::string>> cases{
        {"steps: 10\nlora_rnak: 8\n", ":2: unknown key lora_rnak; did you mean lora_rank?"},
        {"learning_rat: 1.0e-4\n", ":1: unknown key learning_rat; did you mean learning_rate?"},
        {"steps: 10\nsteps: 20\n", ":2: steps is given twice (first on line 1): keep one"},
        {"lora-rank: 8\nlora_rank: 8\n", ":2: lora_rank sets --lora-rank, which lora-rank on line 1 already sets"},
        {"lora_rank: 8\nlora_r: 4\n", ":2: lora_r sets --lora-rank, which lora_rank on line 1 already sets"},
        {"dtype: fp32\nbf16: true\n", ":2: bf16 sets --dtype, which dtype on line 1 already sets"},
        {"lora_rank: eight\n", ":1: lora_rank: expected a whole number, got eight"},
        {"lr: true\n", ":1: lr: expected a number, got true"},
        {"lora_rank: [1, 2]\n", ":1: lora_rank: expected one value, not a list"},
        {"rslora: 1\n", ":1: rslora: expected true or false, got 1"},
        {"steps:\n", ":1: steps has no value"},
        {"\n\ndtype: bf61\n", ":3: dtype: --dtype: bf61 is not one of bf16, fp32, fp64; did you mean bf16?"},
        {"eps: 0\n", ":1: eps: --eps 0: must be a finite number > 0"},
        {"lora_dropout: 1.5\n", ":1: lora_dropout: --lora-dropout 1.5: must be a finite number in [0, 1)"},
        {"- lr\n- steps\n", ":1: the file must be a mapping of flags to values"},
        {"run: other.yaml\n", ":1: run: a run file cannot name another"},
        {"lr: [1\n", ":2:1: not valid YAML"},
    };
    for (const auto& [text, message] : cases) {
        const std::string path = write(dir, "bad.yaml", text);
        const std::string why = refusal({"--run", path});
        INFO(text << "\n" << why);
        CHECK(why.find(path + message) != std::string::npos);
    }
    CHECK(refusal({"--run", dir.file("missing.yaml")}).find("--run: File does not exist") != std::string::npos);
}

TEST_CASE("run file: the resolved run.yaml gives back the same options, each value's source in a comment",
          "[options][run-file]") {
    TempDir dir("run_file_round_trip");
    const std::string run = write(dir, "run.yaml",
                                  "lora_r: 8\ntarget_modules: [q_proj, v_proj]\nlearning_rate: 1.0e-4\n"
                                  "prompt: \"A \\\"quoted\\\" prompt: with # and\\nnewline \\u00e9\"\n"
                                  "checkpoint_activations: 3\nquantize: nf4\nno-double-quant: true\n");
    const pv::Command c = pv::parse_arguments({"--run", run, "--lr", "0.0001234567890123", "--steps", "7",
                                               "--gpu-memory", "h100-80", "--seed", "18446744073709551615",
                                               "--no-checkpoint-activations", "--collective-timeout", "12.5"});
    pv::TrainOptions resolved = c.train;
    resolved.micro_batch = 4;
    const std::string yaml = pv::resolved_run_yaml(c.train, c.train_sources, &resolved);
    INFO(yaml);
    CHECK(yaml.find("lora_rank: 8") != std::string::npos);
    CHECK(yaml.find("# run file\n") != std::string::npos);
    CHECK(yaml.find("# command line\n") != std::string::npos);
    CHECK(yaml.find("micro_batch: 0") != std::string::npos);
    CHECK(yaml.find("# default; this run: 4\n") != std::string::npos);
    CHECK(yaml.find("\n# LoRA/QLoRA\n") != std::string::npos);
    for (const pv::FlagSpec& f : pv::train_flag_specs()) {  // every flag written (its negation as false)
        std::string key = f.name;
        std::replace(key.begin(), key.end(), '-', '_');
        if (key.rfind("no_", 0) != 0) CHECK(yaml.find("\n" + key + ": ") != std::string::npos);
    }
    const std::string written = write(dir, "resolved.yaml", yaml);
    const pv::Command back = pv::parse_arguments({"--run", written});
    CHECK(everything(back.train) == everything(c.train));
    CHECK(back.train.checkpoint_activations == -1);
    CHECK(back.train.lora_targets == "q_proj,v_proj");
    CHECK(back.train.prompt == "A \"quoted\" prompt: with # and\nnewline \u00e9");
    // Defaults round-trip too.
    const pv::Command plain = pv::parse_arguments({});
    const std::string defaults = write(dir, "defaults.yaml", pv::resolved_run_yaml(plain.train, plain.train_sources));
    CHECK(everything(pv::parse_arguments({"--run", defaults}).train) == everything(pv::TrainOptions{}));
}

TEST_CASE("did you mean: unknown flags, commands and choices on every command", "[options]") {
    CHECK(refusal({"--lora-rnak", "8"}) == "unknown option --lora-rnak; did you mean --lora-rank?");
    CHECK(refusal({"--lora-rnak=8"}) == "unknown option --lora-rnak; did you mean --lora-rank?");
    CHECK(refusal({"plan", "--rank", "2"}) == "unknown option --rank for `train plan`; did you mean --ranks?");
    CHECK(refusal({"sample", ".", "--tempreture", "0.5"}) ==
          "unknown option --tempreture for `train sample`; did you mean --temperature?");
    CHECK(refusal({"smaple", "."}).find("unknown command smaple; did you mean sample?") != std::string::npos);
    CHECK(refusal({"--no-such-thing-at-all"}) == "unknown option --no-such-thing-at-all");
    CHECK(refusal({"--dtype", "bf61"}) == "--dtype: bf61 is not one of bf16, fp32, fp64; did you mean bf16?");
    CHECK(refusal({"--parallel", "zero4"}).find("did you mean zero1?") != std::string::npos);
    CHECK(refusal({"--schedule", "cosin"}).find("did you mean cosine?") != std::string::npos);
    CHECK(pv::nearest_name("lora_rnak", {"lora_rank", "lora_alpha"}) == "lora_rank");
    CHECK(pv::nearest_name("xyz", {"lora_rank", "lora_alpha"}).empty());
}

TEST_CASE("train --version and grouped --help", "[options][train]") {
    const train_test::Run version = train_test::run_train("--version");
    INFO(version.output);
    CHECK(version.status == 0);
    CHECK(version.output.rfind("polevault ", 0) == 0);
    CHECK(version.output.find(" backend)") != std::string::npos);
    const train_test::Run help = train_test::run_train("--help");
    INFO(help.output);
    CHECK(help.status == 0);
    size_t at = 0;
    for (const char* group : {"Data:", "Model:", "Optimisation:", "LoRA/QLoRA:", "Parallel:", "Checkpoints:", "Output:"}) {
        const size_t found = help.output.find(std::string("\n") + group + "\n");
        CHECK(found != std::string::npos);
        CHECK(found > at);
        at = found;
    }
    CHECK(help.output.find("--run") != std::string::npos);
    const train_test::Run plan = train_test::run_train("plan --help");
    CHECK(plan.status == 0);
    CHECK(plan.output.find("\nPlan:\n") != std::string::npos);
    CHECK(plan.output.find("--lora-rank") != std::string::npos);
}

// CLI11 alone reads integers with strtoll/strtoull in base 0: 2^64 became 2^63 - 1 steps, --seed -1
// wrapped to 2^64 - 1, 010 was 8. Every integer flag of every command reads decimal digits exactly.
TEST_CASE("integer flags: overflow, a negative count and other bases are refused; leading zeros are decimal",
          "[options]") {
    CHECK(refusal({"--steps", "18446744073709551616"}) ==
          "--steps: 18446744073709551616: out of range: must be an integer in [-9223372036854775808, "
          "9223372036854775807]");
    CHECK(refusal({"--seed", "-1"}) == "--seed: -1: must be an integer in [0, 18446744073709551615], in decimal digits");
    CHECK(refusal({"--seed", "18446744073709551616"}).find("out of range") != std::string::npos);
    CHECK(refusal({"--steps", "0x10"}).find("in decimal digits") != std::string::npos);
    CHECK(refusal({"sample", ".", "--seed", "-5"}).find("--seed: -5: must be an integer in [0, ") != std::string::npos);
    CHECK(refusal({"plan", "--ranks", "99999999999999999999"}).find("--ranks: 99999999999999999999: out of range") !=
          std::string::npos);
    CHECK(pv::parse_arguments({"--steps", "010"}).train.steps == 10);
    CHECK(pv::parse_arguments({"--seed", "18446744073709551615"}).train.seed == 18446744073709551615ull);
    // A run file's values go through the same flags.
    TempDir dir("integer_flags");
    CHECK(refusal({"--run", write(dir, "run.yaml", "seed: -1\n")}).find("--seed: -1: must be") != std::string::npos);
}

// The rules between options (trainer/option_rules.h): the defaults break none at 1 and 4 ranks;
// each case below breaks one rule, which refuses it with a message naming both flags and the
// fix, and every rule of the table has a case (a new row needs one here).
TEST_CASE("the rules between options: one table, each row refusing its case by name", "[options]") {
    for (int ranks : {1, 4}) {
        pv::TrainOptions o;
        o.parallel = ranks == 1 ? "single" : "ddp";
        CHECK_NOTHROW(pv::check_option_rules(o, ranks));
    }
    struct Case {
        const char* rule;  // the row's flags
        void (*set)(pv::TrainOptions&);
        int ranks;
        std::vector<const char*> says;
    };
    const std::vector<Case> cases = {
        {"--parallel auto, --shard-group", [](pv::TrainOptions& o) { o.shard_group = 2; }, 4,
         {"--shard-group 2", "--parallel zero1"}},
        {"--fp32-grad-accumulation, --dtype", [](pv::TrainOptions& o) { o.fp32_grad_accumulation = true, o.dtype = "fp32"; },
         1, {"--fp32-grad-accumulation", "--dtype bf16", "drop the flag"}},
        {"--stochastic-rounding, --dtype", [](pv::TrainOptions& o) { o.stochastic_rounding = true, o.dtype = "fp64"; },
         1, {"--stochastic-rounding", "--dtype bf16"}},
        {"--freeze, --lora-rank", [](pv::TrainOptions& o) { o.freeze = "lm_head.weight", o.lora_rank = 8; }, 1,
         {"--freeze lm_head.weight", "--lora-rank 8", "drop --freeze"}},
        {"--quantize, --lora-rank", [](pv::TrainOptions& o) { o.quantize = "nf4"; }, 1,
         {"--quantize nf4", "add --lora-rank"}},
        {"--quantize, --offload",
         [](pv::TrainOptions& o) { o.quantize = "nf4", o.lora_rank = 8, o.offload = "params", o.parallel = "zero3"; },
         2, {"--offload params", "--quantize nf4", "--offload optimizer"}},
        {"--pipeline-chunks, --pipeline-schedule", [](pv::TrainOptions& o) { o.pipeline_chunks = 3; }, 1,
         {"--pipeline-chunks 3", "--pipeline-schedule interleaved"}},
        {"--sequence-parallel, --tp, --micro-batch, --seq-len",
         [](pv::TrainOptions& o) { o.parallel = "ddp", o.tp = 4, o.sequence_parallel = true, o.micro_batch = 1, o.seq_len = 18; },
         4, {"--sequence-parallel over --tp 4", "18 tokens (--micro-batch 1 x --seq-len 18)", "multiple of 4"}},
        {"--parallel and its flags, the ranks",
         [](pv::TrainOptions& o) { o.parallel = "zero1", o.pipeline_stages = 3; }, 4,
         {"--pipeline-stages 3", "does not divide the 4 ranks"}},
    };
    std::vector<std::string> covered;
    for (const Case& c : cases) {
        INFO(c.rule);
        pv::TrainOptions o;
        o.parallel = "auto";
        c.set(o);
        std::string message;
        try {
            pv::check_option_rules(o, c.ranks);
        } catch (const std::invalid_argument& e) {
            message = e.what();
        }
        for (const char* s : c.says) CHECK(message.find(s) != std::string::npos);
        // The row that refuses it is the one named (the others pass these options).
        for (const pv::OptionRule& r : pv::option_rules())
            CHECK(r.problem(o, c.ranks).empty() == (std::string(r.flags) != c.rule));
        covered.push_back(c.rule);
    }
    for (const pv::OptionRule& r : pv::option_rules())
        CHECK(std::find(covered.begin(), covered.end(), std::string(r.flags)) != covered.end());
}

// --parallel auto's search (trainer/auto_layout.h): the flags given stay fixed, defaults are
// searched, each layout passes the option table, and the layout chosen is written back whole.
TEST_CASE("--parallel auto: what the user gave stays fixed, every layout passes the option table", "[options][auto]") {
    pv::PlanRequest run;
    run.config = pv::preset("test-tiny");
    run.seq_len = 32;
    const pv::Command given = pv::parse_arguments({"--batch", "8", "--tp", "2", "--micro-batch", "2",
                                                   "--no-checkpoint-activations", "--offload", "none"});
    const pv::Interconnect link = pv::interconnect_of(given.train, 0);
    pv::SearchRequest r =
        pv::layout_search_request(given.train, given.train, given.train_sources, run, 4, link, 1e18, 0);
    CHECK(r.tp == 2);
    CHECK(r.micro_batch == 2);
    CHECK(r.checkpointing_fixed);
    CHECK(r.offload == "none");
    CHECK(r.strategy.empty());
    CHECK(r.shard_group == -1);
    for (const pv::LayoutPrediction& p : pv::search_layouts(r).fitting) {
        INFO(p.describe());
        CHECK(p.tp == 2);
        CHECK(p.micro_batch == 2);
        CHECK(!p.checkpointing.enabled);
        CHECK(p.options.offload == pv::Offload::none);
    }
    const pv::Command defaults = pv::parse_arguments({"--batch", "8"});
    r = pv::layout_search_request(defaults.train, defaults.train, defaults.train_sources, run, 4, link, 1e18, 0);
    CHECK(r.tp == 0);
    CHECK(r.micro_batch == 0);
    CHECK(!r.checkpointing_fixed);
    CHECK(r.offload.empty());
    // The option table's rules: sequence parallelism over 2 ranks needs an even number of rows a
    // micro-batch, so the search never offers it at 1 x 15.
    const pv::Command sp = pv::parse_arguments({"--batch", "8", "--sequence-parallel", "--seq-len", "15"});
    r = pv::layout_search_request(sp.train, sp.train, sp.train_sources, run, 4, link, 1e18, 0);
    pv::LayoutPrediction p;
    p.strategy = "zero1", p.tp = 2, p.dp = 2, p.micro_batch = 1, p.accumulation = 4;
    p.options.sequence_parallel = true;
    CHECK(r.refuses(p).find("--sequence-parallel over --tp 2") != std::string::npos);
    p.micro_batch = 2, p.accumulation = 2;
    CHECK(r.refuses(p).empty());
    // QLoRA on test-tiny: W_o's 48 columns split 24 a rank would cut NF4's 64-element blocks, so the
    // search tries no tp but 1 (the dense base takes tp 2).
    pv::PlanRequest qlora_run = run;
    qlora_run.groups.lora.rank = 8, qlora_run.groups.lora.alpha = 16, qlora_run.groups.nf4 = true;
    r = pv::layout_search_request(defaults.train, defaults.train, defaults.train_sources, qlora_run, 4, link, 1e18, 0);
    const pv::SearchResult searched = pv::search_layouts(r);
    REQUIRE(!searched.fitting.empty());
    for (const pv::LayoutPrediction& q : searched.fitting) CHECK(q.tp == 1);
    r = pv::layout_search_request(defaults.train, defaults.train, defaults.train_sources, run, 4, link, 1e18, 0);
    const pv::SearchResult dense = pv::search_layouts(r);
    CHECK(std::any_of(dense.fitting.begin(), dense.fitting.end(), [](const pv::LayoutPrediction& q) { return q.tp == 2; }));
    // The layout written back: every flag of it.
    pv::TrainOptions o = defaults.train;
    p = {};
    p.strategy = "zero3", p.tp = 2, p.pp = 2, p.dp = 1, p.micro_batch = 1, p.accumulation = 8;
    p.options.shard_group = 0, p.options.offload = pv::Offload::params;
    p.checkpointing = pv::ActivationCheckpointing{true, 0};
    pv::apply_layout(o, p, defaults.train_sources);
    CHECK(o.parallel == "zero3");
    CHECK(o.tp == 2);
    CHECK(o.pipeline_stages == 2);
    CHECK(o.micro_batch == 1);
    CHECK(o.checkpoint_activations == 0);
    CHECK(o.offload == "params");
    p.strategy = "pp", p.checkpointing = {};
    pv::apply_layout(o, p, defaults.train_sources);
    CHECK(o.pipeline_stages == 0);  // pp's stages are its ranks
    CHECK(o.checkpoint_activations == -1);
    const pv::Command every_third = pv::parse_arguments({"--checkpoint-activations=3"});
    o = every_third.train;
    p.checkpointing = pv::ActivationCheckpointing{true, 0};
    pv::apply_layout(o, p, every_third.train_sources);
    CHECK(o.checkpoint_activations == 3);  // one block in 3 keeps its activations, as given
    // The search's fewest blocks: auto, resolved to them; auto with nothing recomputed: none.
    o = defaults.train;
    p.checkpointing = pv::ActivationCheckpointing{true, 0, 5};
    pv::apply_layout(o, p, defaults.train_sources);
    CHECK(o.checkpoint_activations == pv::kCheckpointActivationsAuto);
    CHECK(o.checkpoint_blocks == 5);
    CHECK(pv::activation_checkpointing(o).recomputes(4));
    CHECK_FALSE(pv::activation_checkpointing(o).recomputes(5));
    const pv::Command automatic = pv::parse_arguments({"--checkpoint-activations", "auto"});
    o = automatic.train;
    CHECK(o.checkpoint_activations == pv::kCheckpointActivationsAuto);
    CHECK_FALSE(pv::activation_checkpointing(o).enabled);  // unresolved: planned without, then resolved
    p.checkpointing = {};
    pv::apply_layout(o, p, automatic.train_sources);
    CHECK(o.checkpoint_activations == pv::kCheckpointActivationsAuto);
    CHECK(o.checkpoint_blocks == 0);
    CHECK(pv::parse_arguments({"--checkpoint-activations=auto"}).train.checkpoint_activations ==
          pv::kCheckpointActivationsAuto);
    CHECK(pv::parse_arguments({"--checkpoint-activations=010"}).train.checkpoint_activations == 10);  // not octal
    CHECK(refusal({"--checkpoint-activations=automatic"}).find("or auto (the fewest blocks that fit)") !=
          std::string::npos);
    CHECK(refusal({"--checkpoint-activations=-2"}).find("or auto (the fewest blocks that fit)") != std::string::npos);
    // fp32 gradient accumulation: a default gives way to a strategy that reduces in bf16; the
    // user's flag stays, and the option table refuses such a layout.
    o = defaults.train;
    o.fp32_grad_accumulation = true;
    p.strategy = "zero2";
    pv::apply_layout(o, p, defaults.train_sources);
    CHECK(!o.fp32_grad_accumulation);
    const pv::Command fp32 = pv::parse_arguments({"--batch", "8", "--fp32-grad-accumulation"});
    o = fp32.train;
    pv::apply_layout(o, p, fp32.train_sources);
    CHECK(o.fp32_grad_accumulation);
    // The machines: the world's ranks per node unless given; --interconnect slow is Ethernet.
    CHECK(pv::interconnect_of(defaults.train, 4).gpus_per_node == 4);
    CHECK(pv::interconnect_of(defaults.train, 0).gpus_per_node == 8);
    CHECK(pv::interconnect_of(defaults.train, 0).inter_node == pv::Interconnect{}.inter_node);
    const pv::Command slow = pv::parse_arguments({"--interconnect", "slow", "--gpus-per-node", "2"});
    CHECK(pv::interconnect_of(slow.train, 4).gpus_per_node == 2);
    CHECK(pv::interconnect_of(slow.train, 4).inter_node == Approx(12.5e9 * 0.7));
    const pv::Command rates = pv::parse_arguments({"--interconnect", "slow", "--inter-node-gbs", "20",
                                                   "--intra-node-gbs", "100", "--pcie-gbs", "25",
                                                   "--host-memory-gbs", "40"});
    CHECK(pv::interconnect_of(rates.train, 4).inter_node == Approx(20e9));
    CHECK(pv::interconnect_of(rates.train, 4).intra_node == Approx(100e9));
    CHECK(pv::interconnect_of(rates.train, 4).pcie == Approx(25e9));
    CHECK(pv::interconnect_of(rates.train, 4).host_memory == Approx(40e9));
    CHECK(pv::interconnect_of(defaults.train, 4).pcie == pv::Interconnect{}.pcie);
    CHECK(pv::interconnect_of(defaults.train, 4).host_memory == pv::Interconnect{}.host_memory);
}
