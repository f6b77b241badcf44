// The `train` program end to end, run as a separate process (the binary of this build flavour,
// build/<flavour>/train): a tiny run learns and prints what it should, two runs with the same
// seed print the same losses bit for bit, and bad input fails with a message naming the fix.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

namespace train_test {

struct Run {
    int status = -1;
    std::string output;
};

std::string train_binary() {
    return (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "train").string();
}

Run run_train(const std::string& args) {
    Run r;
    const std::string command = train_binary() + " " + args + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    return r;
}

std::vector<std::string> losses(const std::string& output) {
    std::vector<std::string> out;
    const std::regex loss(R"(\| loss ([0-9.]+) \|)");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), loss); it != std::sregex_iterator(); ++it)
        out.push_back((*it)[1]);
    return out;
}

const std::string kTiny =
    "--steps 6 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --warmup 2 --lr 3e-3 --eval-interval 3 "
    "--eval-batches 1";

}  // namespace train_test

using namespace train_test;

TEST_CASE("train: a tiny run on the built-in corpus learns, evaluates and samples", "[train]") {
    const auto dir = std::filesystem::temp_directory_path() / ("polevault_train_" + std::to_string(getpid()));
    const Run r = run_train(kTiny + " --sample-tokens 6 --out-dir " + dir.string());
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto l = losses(r.output);
    REQUIRE(l.size() == 6);
    for (const auto& v : l) REQUIRE(v.size() >= 8);  // at least 7 significant digits: "d.ddddddd"
    REQUIRE(std::stod(l.back()) < std::stod(l.front()));
    REQUIRE(r.output.find("validation loss") != std::string::npos);
    REQUIRE(r.output.find("sample (temperature") != std::string::npos);
    REQUIRE(std::filesystem::exists(dir / "metrics.jsonl"));
    REQUIRE(std::filesystem::exists(dir / "tokenizer.json"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("train: two runs with the same seed print identical losses", "[train]") {
    const auto dir = std::filesystem::temp_directory_path() / ("polevault_train_det_" + std::to_string(getpid()));
    const Run a = run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.string());
    const Run b = run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.string());
    INFO(a.output << "\n----\n" << b.output);
    REQUIRE(a.status == 0);
    REQUIRE(b.status == 0);
    REQUIRE(losses(a.output).size() == 6);
    REQUIRE(losses(a.output) == losses(b.output));
    const Run c = run_train(kTiny + " --sample-tokens 0 --seed 7 --out-dir " + dir.string());
    REQUIRE(losses(c.output) != losses(a.output));
    std::filesystem::remove_all(dir);
}

TEST_CASE("train: bad input fails with a message naming the problem and the fix", "[train]") {
    const Run batch = run_train("--steps 2 --batch 5 --micro-batch 2 --out-dir /tmp/polevault_bad_batch");
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
    std::filesystem::remove_all("/tmp/polevault_bad_batch");
}
