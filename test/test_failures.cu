// What `train` does when something goes wrong (issue 17's failure table in the README): bad
// options from the command line or a checkpoint's file, and the tools that show a run. Whole
// programs in child processes, under one schedule: their kernels meet every schedule in their own
// suites.
#include <catch2/catch.hpp>

#include "test/temp_dir.h"
#include "test/train_runner.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace train_test;

// One rule per option, for the command line and a checkpoint's trainer_state.json alike
// (trainer/option_rules.h): finite numbers in range, known choices, whole numbers for counts.
TEST_CASE("train: every option is checked the same from the command line and from trainer_state.json",
          "[train]") {
    // The flags: NaN, infinities and out-of-range values refused naming the flag, with a short
    // message (not CLI11's 310-digit bound).
    const std::vector<std::pair<std::string, std::string>> flags{
        {"--clip nan", "--clip nan: must be a finite number >= 0"},
        {"--beta1 nan", "--beta1 nan: must be a finite number in [0, 1)"},
        {"--beta2 1", "--beta2 1: must be a finite number in [0, 1)"},
        {"--eps 0", "--eps 0: must be a finite number > 0"},
        {"--eps inf", "--eps inf: must be a finite number > 0"},
        {"--weight-decay -nan", "--weight-decay"},
        {"--temperature nan", "--temperature nan: must be a finite number >= 0"},
        {"--top-p nan", "--top-p nan: must be a finite number in [0, 1]"},
        {"--lr 1e400", "--lr inf: must be a finite number >= 0"},
        {"--steps 0", "--steps 0: must be an integer >= 1"},
        {"--microbatches 0", "--microbatches 0: must be an integer >= 1"},
        {"--out-dir ''", "--out-dir \"\": is empty"},
        {"sample . --temperature nan", "--temperature: nan: must be a finite number >= 0"},
    };
    for (const auto& [args, message] : flags) {
        const Run r = run_train(args);
        INFO(args << "\n" << r.output);
        CHECK(r.status != 0);
        CHECK(r.output.find(message) != std::string::npos);
        CHECK(r.output.find("179769") == std::string::npos);
    }
    // The file: each edit of a real checkpoint's trainer_state.json is refused on --resume,
    // naming the file and the field, before anything is built.
    TempDir dir("train_state_rules");
    const std::string out = dir.file("run");
    const Run first = run_train("--steps 3 --stop-after 1 --warmup 1 --batch 2 --micro-batch 2 --seq-len 16 --vocab 300 "
                                "--eval-interval 0 --sample-tokens 0 --out-dir " + out);
    INFO(first.output);
    REQUIRE(first.status == 0);
    const fs::path state = fs::path(out) / "step_1" / "trainer_state.json";
    const std::string original = read_file(state);
    const nlohmann::json saved = nlohmann::json::parse(original);
    const std::vector<std::tuple<std::string, nlohmann::json, std::string>> edits{
        {"/options/microbatches", 0, "--microbatches 0: must be an integer >= 1"},
        {"/options/microbatches", 2.5, "\"microbatches\" is 2.5; expected an integer"},
        {"/options/batch", 5000000000LL, "--batch 5000000000: must be an integer in [1, 2147483647]"},
        {"/options/dtype", "int8", "--dtype \"int8\": must be one of bf16, fp32, fp64"},
        {"/options/parallel", "bogus", "--parallel \"bogus\": must be one of auto, single"},
        {"/options/beta1", 5.0, "--beta1 5: must be a finite number in [0, 1)"},
        {"/options/eps", 0, "--eps 0: must be a finite number > 0"},
        {"/options/clip", -1, "--clip -1: must be a finite number >= 0"},
        {"/options/clip", nullptr, "\"clip\" is null; expected a number"},
        {"/options/seed", -1, "\"seed\" is -1; expected an unsigned integer"},
        {"/options/no_such_option", 1, "\"no_such_option\" is not an option of this polevault"},
        {"/step", 2.5, "step 2.5 is not a count"},
        {"/step", -1, "step -1 is not a count"},
        {"/data/fingerprint", "xyz", "data.fingerprint \"xyz\" is not a hexadecimal fingerprint"},
        {"/dtype", "fp64", "dtype \"fp64\" differs from options.dtype \"bf16\""},
    };
    for (const auto& [pointer, value, message] : edits) {
        nlohmann::json edited = saved;
        edited[nlohmann::json::json_pointer(pointer)] = value;
        std::ofstream(state) << edited.dump(2);
        const Run r = run_train("--resume " + out);
        INFO(pointer << " = " << value.dump() << "\n" << r.output);
        CHECK(r.status != 0);
        CHECK(r.output.find(state.string()) != std::string::npos);
        CHECK(r.output.find(message) != std::string::npos);
    }
    // The file as written resumes.
    std::ofstream(state) << original;
    const Run resumed = run_train("--resume " + out + " --stop-after 1");
    INFO(resumed.output);
    CHECK(resumed.status == 0);
}

namespace train_test {

// CRC-32 (ISO-HDLC, the one PNG uses) of bytes, bit by bit.
uint32_t crc32(const std::string& bytes) {
    uint32_t c = 0xFFFFFFFFu;
    for (unsigned char b : bytes) {
        c ^= b;
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

uint32_t big_endian(const std::string& s, size_t at) {
    return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 | uint32_t(uint8_t(s[at + 2])) << 8 |
           uint32_t(uint8_t(s[at + 3]));
}

// The PNG's width and height after checking its structure: the signature, then chunks whose
// lengths tile the file and whose CRCs match, IHDR first, at least one IDAT, IEND last.
std::pair<uint32_t, uint32_t> png_size(const std::string& png) {
    REQUIRE(png.size() > 8);
    REQUIRE(png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0);
    std::vector<std::string> types;
    uint32_t width = 0, height = 0;
    for (size_t at = 8; at < png.size();) {
        REQUIRE(at + 12 <= png.size());
        const uint32_t length = big_endian(png, at);
        REQUIRE(at + 12 + length <= png.size());
        const std::string type_and_data = png.substr(at + 4, 4 + length);
        REQUIRE(crc32(type_and_data) == big_endian(png, at + 8 + length));
        types.push_back(type_and_data.substr(0, 4));
        if (types.back() == "IHDR") width = big_endian(png, at + 8), height = big_endian(png, at + 12);
        at += 12 + length;
    }
    REQUIRE(types.front() == "IHDR");
    REQUIRE(types.back() == "IEND");
    REQUIRE(std::count(types.begin(), types.end(), "IDAT") >= 1);
    return {width, height};
}

}  // namespace train_test

// `train plot`: a valid PNG of the requested size from runs' metrics.jsonl, also when steps were
// non-finite (null, or the nan older builds wrote) or the last line is torn; no metrics: refused.
TEST_CASE("train plot: a valid PNG of several runs, non-finite steps and torn lines left out", "[train]") {
    TempDir dir("train_plot");
    const fs::path a = dir.path / "a", b = dir.path / "b";
    fs::create_directories(a), fs::create_directories(b);
    {
        std::ofstream fa(a / "metrics.jsonl"), fb(b / "metrics.jsonl");
        for (int step = 1; step <= 20; ++step) {
            fa << "{\"step\": " << step << ", \"loss\": " << 6.0 - 0.1 * step << ", \"lr\": " << 1e-3 * step
               << ", \"grad_norm\": " << 1.0 / step << "}\n";
            if (step % 5 == 0) fa << "{\"step\": " << step << ", \"val_loss\": " << 6.1 - 0.1 * step << "}\n";
            fb << "{\"step\": " << step << ", \"loss\": " << (step == 7 ? "null" : std::to_string(5.0 - 0.05 * step))
               << ", \"lr\": 0.001, \"grad_norm\": " << (step == 7 ? "null" : "0.5") << "}\n";
        }
        fb << "{\"step\": 21, \"loss\": nan, \"lr\": 0.001}\n{\"step\": 22, \"lo";
    }
    const std::string png = dir.file("both.png");
    const Run r = run_train("plot " + a.string() + " " + b.string() + " --out " + png + " --width 640 --height 480");
    INFO(r.output);
    REQUIRE(r.status == 0);
    REQUIRE(r.output.find("plot: " + png) != std::string::npos);
    CHECK(png_size(read_file(png)) == std::pair<uint32_t, uint32_t>{640, 480});
    // One run, the default output beside its metrics.
    const Run one = run_train("plot " + b.string());
    INFO(one.output);
    REQUIRE(one.status == 0);
    CHECK(png_size(read_file(b / "loss.png")) == std::pair<uint32_t, uint32_t>{1200, 900});
    const Run none = run_train("plot " + dir.path.string());
    INFO(none.output);
    CHECK(none.status != 0);
    CHECK(none.output.find((dir.path / "metrics.jsonl").string() + " is not a file") != std::string::npos);
}

