// `train tokenize`, run as the user runs it (the train binary of this build flavour, text on stdin):
// ids as one JSON array equal to Hugging Face's (values recorded with tokenizers 0.23.3 on the two
// files in ../shared/tokenizers), the --add-special / --no-parse-special / --decode flags, a byte
// round trip through encode and decode, and clear errors for bad input.
#include "test/temp_dir.h"

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tokenizer_cli_test {

namespace fs = std::filesystem;
using pv::test::TempDir;

struct Run {
    int status = -1;
    std::string out;  // stdout only: the command's output must be exactly the ids or the text
};

fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path(); }

fs::path shared_tokenizer(const std::string& name) {
    const char* env = std::getenv("POLEVAULT_SHARED");
    const fs::path path =
        (env && *env ? fs::path(env) : fs::current_path().parent_path() / "shared") / "tokenizers" / name;
    INFO(path << " is needed by this test and is absent: run it from the repository root with ../shared beside it, "
                 "or set POLEVAULT_SHARED");
    REQUIRE(fs::exists(path));
    return path;
}

// `train tokenize ARGS < input`, stderr to `err_file`.
Run tokenize(const TempDir& dir, const std::string& args, const std::string& input) {
    const std::string in = dir.file("stdin"), err = dir.file("stderr");
    std::ofstream(in, std::ios::binary) << input;
    const fs::path train = build_dir() / "train";
    INFO(train << " is needed by this test: build it (make " << train.string() << ")");
    REQUIRE(fs::exists(train));
    const std::string command = train.string() + " tokenize " + args + " < '" + in + "' 2> '" + err + "'";
    FILE* pipe = popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    Run r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::ifstream e(err, std::ios::binary);
    r.out += std::string(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
    return r;
}

}  // namespace tokenizer_cli_test

using namespace tokenizer_cli_test;

TEST_CASE("train tokenize prints Hugging Face's ids and decodes them back", "[tokenizer]") {
    TempDir dir("tokenize_cli");
    const std::string llama3 = "--tokenizer '" + shared_tokenizer("llama3-tokenizer.json").string() + "'";
    const std::string sp = "--tokenizer '" + shared_tokenizer("spbpe32k-tokenizer.json").string() + "'";
    // Special-token strings become their ids (HF's encode(text, add_special_tokens=False)) ...
    CHECK(tokenize(dir, llama3, "Hello world<|begin_of_text|>x").out == "[9906, 1917, 128000, 87]\n");
    // ... or stay text (HF with encode_special_tokens=True).
    CHECK(tokenize(dir, llama3 + " --no-parse-special", "Hello world<|begin_of_text|>x").out ==
          "[9906, 1917, 27, 91, 7413, 3659, 4424, 91, 29, 87]\n");
    // --add-special: the post-processor's BOS, for the SentencePiece-style file.
    CHECK(tokenize(dir, sp + " --add-special", "Hello</s>world").out == "[1, 22557, 2, 1526]\n");
    CHECK(tokenize(dir, sp, "").out == "[]\n");
    // --decode: HF's decode(ids, skip_special_tokens=False), no newline added.
    CHECK(tokenize(dir, sp + " --decode", "[1, 22557, 2, 1526]").out == "<s> Hello</s> world");
    // Any bytes round-trip through a byte-level tokenizer (a small one cut from Llama 3's: fast to load).
    const std::string small =
        "--tokenizer '" + (fs::path(__FILE__).parent_path() / "data/tokenizers/llama3-small.json").string() + "'";
    const std::string bytes("\xff\xfe abc \xe2\x82 \x00\n\r\n\xf0\x9f\x99\x82", 19);
    const Run ids = tokenize(dir, small, bytes);
    REQUIRE(ids.status == 0);
    CHECK(ids.out.size() > 20);
    CHECK(tokenize(dir, small + " --decode", ids.out).out == bytes);
}

TEST_CASE("train tokenize refuses input that is not an array of ids", "[tokenizer]") {
    TempDir dir("tokenize_cli_errors");
    const std::string sp = "--tokenizer '" + shared_tokenizer("spbpe32k-tokenizer.json").string() + "'";
    Run r = tokenize(dir, sp + " --decode", "[1, 2");
    CHECK(r.status == 1);
    CHECK(r.out.find("not JSON") != std::string::npos);
    r = tokenize(dir, sp + " --decode", "{\"ids\": [1]}");
    CHECK(r.status == 1);
    CHECK(r.out.find("not a JSON array of ids") != std::string::npos);
    r = tokenize(dir, sp + " --decode", "[1, 32000]");
    CHECK(r.status == 1);
    CHECK(r.out.find("32000 is not a token id") != std::string::npos);
    r = tokenize(dir, "--tokenizer '" + dir.file("absent.json") + "'", "x");
    CHECK(r.status != 0);
    CHECK(r.out.find("absent.json") != std::string::npos);
}
