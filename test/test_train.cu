// The `train` program end to end, run as a separate process (the binary of this build flavour,
// build/<flavour>/train): a tiny run learns and prints what it should; two runs with the same
// seed print the same losses bit for bit; a run interrupted and resumed from its checkpoint ends
// bit-identical to one that was not; `train sample` and `train prepare` work from their files;
// a model trained on the built-in corpus beats the corpus's unigram entropy; bad input fails with
// a message naming the fix.
#include <catch2/catch.hpp>

#include "data/tokenizer.h"
#include "test/temp_dir.h"

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace train_test {

namespace fs = std::filesystem;
using pv::test::TempDir;

struct Run {
    int status = -1;
    std::string output;
};

fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path(); }

Run run_train_command(const std::string& shell_command) {
    Run r;
    const std::string command = shell_command + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    return r;
}

Run run_train(const std::string& args) { return run_train_command((build_dir() / "train").string() + " " + args); }

std::vector<std::string> losses(const std::string& output) {
    std::vector<std::string> out;
    const std::regex loss(R"(\| loss ([0-9.]+) \|)");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), loss); it != std::sregex_iterator(); ++it)
        out.push_back((*it)[1]);
    return out;
}

std::vector<double> validation_losses(const std::string& output) {
    std::vector<double> out;
    const std::regex loss(R"(validation loss ([0-9.]+))");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), loss); it != std::sregex_iterator(); ++it)
        out.push_back(std::stod((*it)[1]));
    return out;
}

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// metrics.jsonl without the timing fields (tokens/s, ms, which differ run to run): what must be
// identical between two runs that computed the same thing.
std::string metrics_without_timing(const fs::path& p) {
    std::istringstream in(read_file(p));
    std::string line, out;
    const std::regex timing(R"(, "tokens_per_s": [^,]*, "ms": [^,]*)");
    while (std::getline(in, line)) out += std::regex_replace(line, timing, "") + "\n";
    return out;
}

const std::string kTiny =
    "--steps 6 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --warmup 2 --lr 3e-3 --eval-interval 3 "
    "--eval-batches 1";

}  // namespace train_test

using namespace train_test;

TEST_CASE("train: a tiny run on the built-in corpus learns, evaluates, checkpoints and samples", "[train]") {
    TempDir dir("train");
    const Run r = run_train(kTiny + " --sample-tokens 6 --out-dir " + dir.path.string());
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto l = losses(r.output);
    REQUIRE(l.size() == 6);
    for (const auto& v : l) REQUIRE(v.size() >= 8);  // at least 7 significant digits: "d.ddddddd"
    REQUIRE(std::stod(l.back()) < std::stod(l.front()));
    REQUIRE(validation_losses(r.output).size() == 2);
    REQUIRE(r.output.find("sample (temperature") != std::string::npos);
    REQUIRE(fs::exists(dir.path / "metrics.jsonl"));
    for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors",
                          "config.json", "tokenizer.json", "trainer_state.json"})
        REQUIRE(fs::exists(dir.path / "step_6" / f));
    REQUIRE_FALSE(fs::exists(dir.path / "step_6.tmp"));
}

TEST_CASE("train: two runs with the same seed print identical losses", "[train]") {
    TempDir dir("train_det");
    const Run a = run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.path.string());
    const Run b = run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.path.string());
    INFO(a.output << "\n----\n" << b.output);
    REQUIRE(a.status == 0);
    REQUIRE(b.status == 0);
    REQUIRE(losses(a.output).size() == 6);
    REQUIRE(losses(a.output) == losses(b.output));
    const Run c = run_train(kTiny + " --sample-tokens 0 --seed 7 --out-dir " + dir.path.string());
    REQUIRE(losses(c.output) != losses(a.output));
}

// DESIGN.md §3: a checkpoint holds everything the run depends on, so stopping and resuming changes
// nothing: every logged number and every saved tensor is bit-identical to an uninterrupted run.
TEST_CASE("train: a run stopped at a checkpoint and resumed ends bit-identical to one that never stopped",
          "[train][resume]") {
    TempDir dir("train_resume");
    const std::string run = "--steps 8 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --warmup 2 --lr 3e-3 "
                            "--eval-interval 2 --eval-batches 1 --sample-tokens 0 --checkpoint-interval 4";
    // Round to nearest; then stochastic rounding with the fp32 accumulation buffer, where the
    // bf16 weights are not a function of the master and must come from the checkpoint.
    for (const std::string variant : {"", " --stochastic-rounding --fp32-grad-accumulation"}) {
        INFO("variant:" << variant);
        const fs::path straight = dir.path / "straight", stopped = dir.path / "stopped";
        fs::remove_all(straight), fs::remove_all(stopped);
        const Run a = run_train(run + variant + " --out-dir " + straight.string());
        INFO(a.output);
        REQUIRE(a.status == 0);
        const Run b1 = run_train(run + variant + " --stop-after 4 --out-dir " + stopped.string());
        INFO(b1.output);
        REQUIRE(b1.status == 0);
        REQUIRE(fs::exists(stopped / "step_4" / "trainer_state.json"));
        REQUIRE_FALSE(fs::exists(stopped / "step_8"));
        // A crash while writing a later checkpoint leaves only a .tmp directory, which must be ignored.
        fs::create_directories(stopped / "step_6.tmp");
        std::ofstream(stopped / "step_6.tmp" / "model.safetensors") << "half written";
        // Resume from the output directory: no flags, everything comes from the checkpoint.
        const Run b2 = run_train("--resume " + stopped.string());
        INFO(b2.output);
        REQUIRE(b2.status == 0);
        REQUIRE(b2.output.find("resumed from " + (stopped / "step_4").string() + " at step 4") != std::string::npos);
        const auto la = losses(a.output), lb1 = losses(b1.output), lb2 = losses(b2.output);
        REQUIRE(la.size() == 8);
        REQUIRE(lb1.size() == 4);
        REQUIRE(lb2.size() == 4);
        for (size_t i = 0; i < 4; ++i) {
            REQUIRE(la[i] == lb1[i]);
            REQUIRE(la[4 + i] == lb2[i]);
        }
        // Every step's loss, learning rate, gradient norm and validation loss, at 17 digits, and
        // the resumed run's metrics file holds one history, not two.
        REQUIRE(metrics_without_timing(straight / "metrics.jsonl") == metrics_without_timing(stopped / "metrics.jsonl"));
        for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
            INFO(f);
            const std::string x = read_file(straight / "step_8" / f), y = read_file(stopped / "step_8" / f);
            REQUIRE(x.size() > 1000);
            REQUIRE(x == y);
        }
    }
}

TEST_CASE("train sample: generates from a checkpoint, reproducibly per seed", "[train][sample]") {
    TempDir dir("train_sample");
    const Run t = run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.path.string());
    REQUIRE(t.status == 0);
    const std::string ckpt = (dir.path / "step_6").string();
    const Run a = run_train("sample " + ckpt + " --prompt 'The model' --max-tokens 12 --seed 5");
    const Run b = run_train("sample " + dir.path.string() + " --prompt 'The model' --max-tokens 12 --seed 5");
    const Run c = run_train("sample " + ckpt + " --prompt 'The model' --max-tokens 12 --seed 6");
    INFO(a.output << "\n----\n" << b.output << "\n----\n" << c.output);
    REQUIRE(a.status == 0);
    REQUIRE(b.status == 0);
    REQUIRE(c.status == 0);
    REQUIRE(a.output.find("sampling from " + ckpt) != std::string::npos);
    REQUIRE(a.output.find("The model") != std::string::npos);
    REQUIRE(a.output == b.output);  // the output directory resolves to its latest checkpoint
    REQUIRE(a.output != c.output);
    // Greedy decoding does not depend on the seed.
    const Run g1 = run_train("sample " + ckpt + " --temperature 0 --max-tokens 8 --seed 1");
    const Run g2 = run_train("sample " + ckpt + " --temperature 0 --max-tokens 8 --seed 2");
    REQUIRE(g1.status == 0);
    REQUIRE(g1.output == g2.output);
    // Without its tokenizer a checkpoint cannot be sampled, and says why.
    fs::remove(dir.path / "step_6" / "tokenizer.json");
    const Run missing = run_train("sample " + ckpt);
    INFO(missing.output);
    REQUIRE(missing.status != 0);
    REQUIRE(missing.output.find("tokenizer.json") != std::string::npos);
}

TEST_CASE("train prepare: text and JSON lines become shards that train and sample", "[train][prepare]") {
    TempDir dir("train_prepare");
    std::string text;
    for (int i = 0; i < 300; ++i) text += "Line " + std::to_string(i) + " of a small document about kernels and tests.\n";
    std::ofstream(dir.file("a.txt")) << text;
    {
        std::ofstream b(dir.file("b.jsonl"));
        for (int i = 0; i < 50; ++i) b << "{\"text\": \"Record " << i << " says hello to the loader.\", \"id\": " << i << "}\n";
    }
    const std::string data = dir.file("data");
    const Run p = run_train("prepare " + dir.file("a.txt") + " " + dir.file("b.jsonl") + " --out " + data +
                            " --vocab 300 --val-fraction 0.1");
    INFO(p.output);
    REQUIRE(p.status == 0);
    REQUIRE(p.output.find("prepared 51 documents") != std::string::npos);
    REQUIRE(fs::exists(fs::path(data) / "val.pvtokens"));
    REQUIRE(fs::exists(fs::path(data) / "tokenizer.json"));
    const Run t = run_train("--data " + data + " --steps 3 --batch 2 --micro-batch 2 --seq-len 16 --warmup 1 "
                            "--eval-interval 3 --eval-batches 1 --sample-tokens 4 --out-dir " + dir.file("run"));
    INFO(t.output);
    REQUIRE(t.status == 0);
    REQUIRE(losses(t.output).size() == 3);
    REQUIRE(validation_losses(t.output).size() == 1);
    REQUIRE(t.output.find("sample (temperature") != std::string::npos);
    REQUIRE(fs::exists(fs::path(dir.file("run")) / "step_3" / "tokenizer.json"));
    // A JSON-lines record without the field is an error naming the file and the line.
    std::ofstream(dir.file("bad.jsonl")) << "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n";
    const Run bad = run_train("prepare " + dir.file("bad.jsonl") + " --out " + dir.file("bad") + " --vocab 300");
    INFO(bad.output);
    REQUIRE(bad.status != 0);
    REQUIRE(bad.output.find("bad.jsonl") != std::string::npos);
    REQUIRE(bad.output.find("2") != std::string::npos);
}

TEST_CASE("train: bad input fails with a message naming the problem and the fix", "[train]") {
    TempDir dir("train_bad");
    const Run batch = run_train("--steps 2 --batch 5 --micro-batch 2 --out-dir " + dir.file("batch"));
    REQUIRE(batch.status != 0);
    INFO(batch.output);
    REQUIRE(batch.output.find("batch 5") != std::string::npos);
    REQUIRE(batch.output.find("--batch") != std::string::npos);
    const Run data = run_train("--data /nonexistent/shard.bin");
    REQUIRE(data.status != 0);
    INFO(data.output);
    REQUIRE(data.output.find("/nonexistent/shard.bin") != std::string::npos);
    const Run flag = run_train("--dtype fp16");
    REQUIRE(flag.status != 0);
    REQUIRE(flag.output.find("fp16") != std::string::npos);
    const Run accumulate32 = run_train("--dtype fp32 --fp32-grad-accumulation --out-dir " + dir.file("acc"));
    INFO(accumulate32.output);
    REQUIRE(accumulate32.status != 0);
    REQUIRE(accumulate32.output.find("--fp32-grad-accumulation is for --dtype bf16") != std::string::npos);
    const Run rounding = run_train("--dtype fp64 --stochastic-rounding --out-dir " + dir.file("sr"));
    REQUIRE(rounding.status != 0);
    REQUIRE(rounding.output.find("--stochastic-rounding is for --dtype bf16") != std::string::npos);
    // Pipelines: micro-batches in flight only with mp, and they must fill whole rounds.
    const Run in_flight = run_train("--microbatches 2 --out-dir " + dir.file("inflight"));
    REQUIRE(in_flight.status != 0);
    REQUIRE(in_flight.output.find("--microbatches 2 is for --parallel mp") != std::string::npos);
    const Run rounds = run_train("--parallel mp --microbatches 3 --batch 4 --micro-batch 1 --out-dir " + dir.file("rounds"));
    INFO(rounds.output);
    REQUIRE(rounds.status != 0);
    REQUIRE(rounds.output.find("4 micro-batches per step do not fill whole pipeline rounds of --microbatches 3") !=
            std::string::npos);
    // Resuming: a directory without checkpoints, a change that would break the run, a finished
    // run, a damaged checkpoint.
    fs::create_directories(dir.path / "empty");
    const Run none = run_train("--resume " + dir.file("empty"));
    INFO(none.output);
    REQUIRE(none.status != 0);
    REQUIRE(none.output.find("neither a checkpoint") != std::string::npos);
    const std::string out = dir.file("run");
    REQUIRE(run_train("--steps 2 --warmup 1 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --eval-interval 0 "
                      "--sample-tokens 0 --out-dir " + out).status == 0);
    const Run dtype = run_train("--resume " + out + " --dtype fp32");
    INFO(dtype.output);
    REQUIRE(dtype.status != 0);
    REQUIRE(dtype.output.find("cannot change dtype") != std::string::npos);
    const Run done = run_train("--resume " + out);
    INFO(done.output);
    REQUIRE(done.status != 0);
    REQUIRE(done.output.find("raise --steps") != std::string::npos);
    const fs::path weights = fs::path(out) / "step_2" / "model.safetensors";
    fs::resize_file(weights, fs::file_size(weights) - 100);
    const Run damaged = run_train("--resume " + out + " --steps 4");
    INFO(damaged.output);
    REQUIRE(damaged.status != 0);
    REQUIRE(damaged.output.find(weights.string()) != std::string::npos);
}

namespace train_test {

// −Σ p log p of the empirical token distribution: the lowest average loss any predictor that
// ignores context can reach on these tokens (the best such predictor is their own frequencies).
double unigram_entropy(const std::vector<int>& ids) {
    std::map<int, double> counts;
    for (int id : ids) counts[id] += 1.0;
    double h = 0;
    for (const auto& [id, c] : counts) h -= c / double(ids.size()) * std::log(c / double(ids.size()));
    return h;
}

}  // namespace train_test

// The model must use context: its loss on held-out text must go clearly below what any
// context-free predictor could reach. The bound is the unigram entropy, computed here from the
// corpus file the build embedded and the tokenizer the run saved — both of the whole corpus and
// of the held-out tail itself (the tail's own frequencies are the best context-free predictor of
// the tail, so no model without context gets below its entropy). Threshold: 0.3 nats below both.
// The validation loss averages 4 × 16 × 32 = 2048 tokens whose losses spread by about 2.5 nats:
// a standard error of about 2.5 / √2048 ≈ 0.06 for independent tokens, so 0.3 is five of them,
// while a model that learned only frequencies sits at or above the bound. When the model leaves
// the unigram plateau depends on the corpus (it changes with every header added to the project)
// and the seed, so the run is long enough to be past it with room: measured 0.78-0.84 nats below
// with seeds 1 and 2 (small untied model, 150 steps at constant lr 5e-3, about 25 s on 2 cores).
// Not run under ASan ([learning]): it tests optimisation, not memory, and the other train tests
// run the same code there.
TEST_CASE("train: a small model on the built-in corpus goes clearly below the unigram entropy",
          "[train][learning]") {
    TempDir dir("train_learning");
    // Untied (a separate lm_head learns next-token statistics faster than a tied one), small.
    std::ofstream(dir.file("config.json"))
        << R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 192,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})";
    const Run r = run_train("--config " + dir.file("config.json") + " --vocab 300 --steps 150 --batch 16 "
                            "--micro-batch 16 --seq-len 32 --warmup 5 --lr 5e-3 --schedule constant "
                            "--eval-interval 150 --eval-batches 4 --sample-tokens 0 --out-dir " + dir.file("run"));
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto val = validation_losses(r.output);
    REQUIRE(val.size() == 1);
    const std::string corpus = read_file(build_dir() / "corpus.txt");
    REQUIRE(corpus.size() > 100000);
    const pv::Tokenizer tokenizer = pv::Tokenizer::load((fs::path(dir.file("run")) / "step_150" / "tokenizer.json").string());
    const std::vector<int> ids = tokenizer.encode(corpus, false);
    REQUIRE(tokenizer.decode(ids) == corpus);
    // The held-out tail: the last 10% of the corpus's tokens (train.cu's documented split).
    const std::vector<int> tail(ids.end() - long(ids.size() / 10), ids.end());
    const double corpus_entropy = unigram_entropy(ids), tail_entropy = unigram_entropy(tail);
    INFO("validation loss " << val[0] << ", unigram entropy: corpus " << corpus_entropy << ", held-out tail "
                            << tail_entropy);
    REQUIRE(corpus_entropy > 3.5);  // a sanity bound: 300 tokens, far from a degenerate corpus
    REQUIRE(val[0] < corpus_entropy - 0.3);
    REQUIRE(val[0] < tail_entropy - 0.3);
}

namespace train_test {

// `train` under mpirun on this machine (oversubscribed, root allowed), every launch under timeout.
Run run_mpi(int ranks, const std::string& per_rank_command) {
    return run_train_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np " +
                             std::to_string(ranks) + " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " +
                             "-x POLEVAULT_HOST_WORKERS=1 -x OPENBLAS_NUM_THREADS=1 " + per_rank_command);
}

}  // namespace train_test

TEST_CASE("train under mpirun: zero1, zero2, zero3 and ddp train identically, and rank 0 alone reports", "[train][mpi]") {
    TempDir dir("train_mpi");
    const std::string run = (build_dir() / "train").string() + " " + kTiny + " --sample-tokens 0 ";
    const Run ddp = run_mpi(2, run + "--parallel ddp --out-dir " + dir.file("ddp"));
    const Run zero1 = run_mpi(2, run + "--parallel zero1 --out-dir " + dir.file("zero1"));
    const Run zero2 = run_mpi(2, run + "--parallel zero2 --out-dir " + dir.file("zero2"));
    const Run zero3 = run_mpi(2, run + "--parallel zero3 --out-dir " + dir.file("zero3"));
    INFO(ddp.output << "\n----\n" << zero1.output << "\n----\n" << zero2.output << "\n----\n" << zero3.output);
    REQUIRE(zero3.status == 0);
    REQUIRE(losses(zero3.output) == losses(ddp.output));
    REQUIRE(ddp.status == 0);
    REQUIRE(zero1.status == 0);
    REQUIRE(zero2.status == 0);
    REQUIRE(losses(ddp.output).size() == 6);  // one report, not one per rank
    REQUIRE(losses(zero1.output) == losses(ddp.output));
    REQUIRE(losses(zero2.output) == losses(ddp.output));  // accumulation 1: the same sums
    REQUIRE(zero1.output.find("x 2 rank(s), strategy zero1") != std::string::npos);
    // The sharded optimizer state was gathered into whole tensors: the checkpoints are identical.
    for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
        INFO(f);
        REQUIRE(read_file(fs::path(dir.file("ddp")) / "step_6" / f) == read_file(fs::path(dir.file("zero1")) / "step_6" / f));
        REQUIRE(read_file(fs::path(dir.file("ddp")) / "step_6" / f) == read_file(fs::path(dir.file("zero2")) / "step_6" / f));
        REQUIRE(read_file(fs::path(dir.file("ddp")) / "step_6" / f) == read_file(fs::path(dir.file("zero3")) / "step_6" / f));
    }
    // --parallel single cannot span ranks.
    const Run single = run_mpi(2, run + "--parallel single --out-dir " + dir.file("single"));
    REQUIRE(single.status != 0);
    REQUIRE(single.output.find("choose --parallel ddp, zero1, zero2, zero3 or mp") != std::string::npos);
}

TEST_CASE("train under mpirun: a failure on one rank ends every rank within 60 s with its message", "[train][mpi]") {
    TempDir dir("train_mpi_fail");
    const std::string train = (build_dir() / "train").string();
    // Rank 1 is given a data file that does not exist; rank 0 goes ahead and would wait forever in
    // the first collective if rank 1's error did not end the job.
    const auto start = std::chrono::steady_clock::now();
    const Run r = run_mpi(2, "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec " + train +
                                 " --parallel ddp --data /nonexistent/rank1.pvtokens; else exec " + train + " " + kTiny +
                                 " --parallel ddp --out-dir " + dir.file("run") + "; fi'");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(r.output);
    REQUIRE(r.status != 0);
    REQUIRE(r.status != 124);  // not the timeout
    REQUIRE(seconds < 60);
    REQUIRE(r.output.find("rank 1/2") != std::string::npos);
    REQUIRE(r.output.find("/nonexistent/rank1.pvtokens") != std::string::npos);
}

namespace train_test {

// Every step's loss from a metrics.jsonl, at its 17 digits.
std::map<long long, double> metric_losses(const fs::path& p) {
    std::map<long long, double> out;
    std::istringstream in(read_file(p));
    std::string line;
    const std::regex loss(R"(\{"step": ([0-9]+), "loss": ([-0-9.e+]+))");
    std::smatch m;
    while (std::getline(in, line))
        if (std::regex_search(line, m, loss)) out[std::stoll(m[1])] = std::stod(m[2]);
    return out;
}

}  // namespace train_test

// DESIGN.md §3: checkpoints hold whole, unpadded tensors, so a run saved by any strategy at N ranks
// resumes with any strategy at M ranks and continues the same training (fp64: to 1e-10 of a run
// that never stopped, on one rank). The pipelines run the default model's 6 units over 4 ranks
// with 4 micro-batches in flight.
TEST_CASE("train: a checkpoint saved by zero3 at 4 ranks resumes with ddp at 2, and the reverse; mp and zero2 too",
          "[train][mpi]") {
    TempDir dir("train_reshard");
    const std::string train = (build_dir() / "train").string();
    const std::string run = " --dtype fp64 --steps 8 --batch 8 --seq-len 16 --vocab 300 --warmup 2 --lr 3e-3 "
                            "--eval-interval 0 --sample-tokens 0 ";
    REQUIRE(run_train(run + "--out-dir " + dir.file("straight")).status == 0);
    const auto straight = metric_losses(fs::path(dir.file("straight")) / "metrics.jsonl");
    REQUIRE(straight.size() == 8);
    for (const auto& [first, second] : std::vector<std::pair<std::pair<int, std::string>, std::pair<int, std::string>>>{
             {{4, "zero3"}, {2, "ddp"}},
             {{2, "ddp"}, {4, "zero3"}},
             {{4, "mp --microbatches 4"}, {2, "zero2"}},
             {{2, "zero2"}, {4, "mp --microbatches 4"}}}) {
        const std::string out = dir.file(first.second.substr(0, first.second.find(' ')) + std::to_string(first.first));
        const Run a = run_mpi(first.first, train + run + "--parallel " + first.second + " --stop-after 4 --out-dir " + out);
        INFO(a.output);
        REQUIRE(a.status == 0);
        const Run b = run_mpi(second.first, train + " --resume " + out + " --parallel " + second.second);
        INFO(b.output);
        REQUIRE(b.status == 0);
        REQUIRE(b.output.find("resumed from") != std::string::npos);
        const auto resumed = metric_losses(fs::path(out) / "metrics.jsonl");
        REQUIRE(resumed.size() == 8);
        for (const auto& [step, loss] : straight) {
            INFO(first.second << " x" << first.first << " -> " << second.second << " x" << second.first << ", step " << step);
            CHECK(std::abs(resumed.at(step) - loss) <= 1e-10 * std::abs(loss));
        }
    }
}
