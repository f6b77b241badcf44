// Running the `train` program from tests: a command's exit status and output, the losses and
// validation losses its step lines print, files it wrote, under mpirun. Shared by test_train
// (what a run computes) and test_failures (what a run does when something goes wrong).
#pragma once

#include "test/temp_dir.h"

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
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

inline fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path(); }

inline Run run_train_command(const std::string& shell_command) {
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

inline Run run_train(const std::string& args) { return run_train_command((build_dir() / "train").string() + " " + args); }

inline std::vector<std::string> losses(const std::string& output) {
    std::vector<std::string> out;
    const std::regex loss(R"(\| loss ([0-9.]+) \|)");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), loss); it != std::sregex_iterator(); ++it)
        out.push_back((*it)[1]);
    return out;
}

inline std::vector<double> validation_losses(const std::string& output) {
    std::vector<double> out;
    const std::regex loss(R"(validation loss ([0-9.]+))");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), loss); it != std::sregex_iterator(); ++it)
        out.push_back(std::stod((*it)[1]));
    return out;
}

inline std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// metrics.jsonl without the timing fields (tokens/s, ms, which differ run to run): what must be
// identical between two runs that computed the same thing.
inline std::string metrics_without_timing(const fs::path& p) {
    std::istringstream in(read_file(p));
    std::string line, out;
    const std::regex timing(R"(, "tokens_per_s": [^,]*, "ms": [^,]*)");
    while (std::getline(in, line)) out += std::regex_replace(line, timing, "") + "\n";
    return out;
}

inline const std::string kTiny =
    "--steps 6 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --warmup 2 --lr 3e-3 --eval-interval 3 "
    "--eval-batches 1";

// `train` under mpirun on this machine (oversubscribed, root allowed), every launch under timeout.
inline Run run_mpi(int ranks, const std::string& per_rank_command) {
    return run_train_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np " +
                             std::to_string(ranks) + " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 " +
                             "-x POLEVAULT_HOST_WORKERS=1 -x OPENBLAS_NUM_THREADS=1 " + per_rank_command);
}

}  // namespace train_test
