// The benchmarks that run kernels, run at the smallest shapes on the host platform (make test, host
// flavour only, under every schedule): a bench is not a test of its kernels' results, but a bench
// that crashes or overruns a buffer at some shape is a bench nobody can use on the GPU it was
// written for. kernels_bench once wrote the q, k, v weight gradient (qkv width × C) into the
// embedding gradient's V × C buffer, a heap overflow at test-tiny (V 67 < 80) that no test ran
// (b4e8ed5). Each run must exit 0 and print every line it promises, with finite figures.
#include "test/train_runner.h"

#include <catch2/catch.hpp>

#include <regex>
#include <string>

using train_test::build_dir;
using train_test::Run;
using train_test::run_train_command;

namespace {

Run run_bench(const std::string& name, const std::string& args) {
    return run_train_command((build_dir() / "bench" / name).string() + " " + args);
}

// The kernels_bench lines with a time, a bandwidth and a FLOP rate, all finite numbers.
int timed_lines(const std::string& output) {
    const std::regex line(
        R"((^|\n)  \S[^\n]*? +[0-9]+\.[0-9]+ ms +[0-9]+\.[0-9]+ GB/s +[0-9]+\.[0-9]+ TFLOP/s(?=\n|$))");
    return int(std::distance(std::sregex_iterator(output.begin(), output.end(), line), std::sregex_iterator()));
}

}  // namespace

TEST_CASE("kernels_bench runs every kernel at the test shapes, in every dtype, untied and tied", "[bench]") {
    for (const char* shape : {"test-tiny", "test-tied"})
        for (const char* dtype : {"bf16", "fp32", "fp64"}) {
            // Rows and sequence lengths that divide no tile: 3 sequences of 21.
            const Run r = run_bench("kernels_bench", std::string("--shape ") + shape + " --dtype " + dtype +
                                                         " --batch 3 --seq 21 --repeat 1");
            INFO(shape << " " << dtype << "\n" << r.output);
            REQUIRE(r.status == 0);
            CHECK(r.output.find("nan") == std::string::npos);
            CHECK(r.output.find("inf ") == std::string::npos);
            CHECK(timed_lines(r.output) >= 20);
            for (const char* kernel : {"embedding backward", "rmsnorm backward", "attention backward",
                                       "matmul qkv backward", "swiglu backward", "cross-entropy backward"})
                CHECK(r.output.find(kernel) != std::string::npos);
        }
    // --dry-run prints a real shape's figures without allocating.
    const Run dry = run_bench("kernels_bench", "--shape llama-3.2-1b --batch 4 --seq 2048 --dry-run");
    INFO(dry.output);
    REQUIRE(dry.status == 0);
    CHECK(dry.output.find("attention forward") != std::string::npos);
    // One rank of a tensor-parallel group: its kernels run at the rank's shape (test-tiny at --tp 2: 3
    // query heads, 1 KV head); at a real shape, 8B under --tp 8 at one sequence of 4096, the attention
    // grids are small enough that every kernel splits, and the unsplit kernels are timed beside them.
    const Run rank = run_bench("kernels_bench", "--shape test-tiny --tp 2 --batch 3 --seq 21 --repeat 1");
    INFO(rank.output);
    REQUIRE(rank.status == 0);
    CHECK(rank.output.find("one rank of --tp 2") != std::string::npos);
    CHECK(timed_lines(rank.output) >= 20);
    const Run tp8 = run_bench("kernels_bench", "--shape llama-3.1-8b --tp 8 --batch 1 --seq 4096 --dry-run");
    INFO(tp8.output);
    REQUIRE(tp8.status == 0);
    CHECK(tp8.output.find("attention forward, unsplit") != std::string::npos);
    CHECK(tp8.output.find("attention backward, unsplit") != std::string::npos);
    // What cannot work is refused with the usage.
    const Run bad = run_bench("kernels_bench", "--shape test-tiny --seq 100000");
    CHECK(bad.status != 0);
    CHECK(bad.output.find("--seq exceeds the model's max_seq_len") != std::string::npos);
    const Run bad_tp = run_bench("kernels_bench", "--shape test-tiny --tp 4");
    CHECK(bad_tp.status != 0);
    CHECK(bad_tp.output.find("4 does not divide the 6 query heads of test-tiny") != std::string::npos);
}

TEST_CASE("decode_bench generates with and without the KV cache: in fp64 the same tokens", "[bench]") {
    for (const std::string dtype : {"bf16", "fp64"}) {
        const Run r = run_bench("decode_bench", "--shape test-tiny --dtype " + dtype + " --prompt 5 --tokens 9");
        INFO(dtype << "\n" << r.output);
        REQUIRE(r.status == 0);
        CHECK(r.output.find("decode") != std::string::npos);
        // In bf16 the two paths round differently and may pick another token (the bench says so).
        CHECK(r.output.find(dtype == "fp64" ? "greedy tokens identical" : "greedy tokens ") != std::string::npos);
    }
}
