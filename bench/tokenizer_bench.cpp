// Tokenizer speed: loading each tokenizer.json, and encoding tinyshakespeare (1.1 MB) with it, as
// one text and line by line, on one thread; decoding the ids back. Reads the tokenizer files and
// the text from ../shared (or $POLEVAULT_SHARED), so run it from the repository root.
//
//   load s          Tokenizer::load, best of 3
//   encode MB/s     encode(whole text), bytes of text per second, best of 3
//   lines MB/s      encode of each line alone (the whole text once), best of 3
//   decode MB/s     decode(ids of the whole text), bytes of text per second, best of 3
//
// Hugging Face's figures for the same work (tokenizers 0.23.3, one thread, same machine) are in
// the README beside these.
#include "data/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

double best_seconds(int repeats, const std::function<void()>& body) {
    double best = 1e30;
    for (int i = 0; i < repeats; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        body();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

std::string read_file(const fs::path& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr,
                     "tokenizer_bench: cannot read %s (run from the repository root with ../shared beside it, "
                     "or set POLEVAULT_SHARED)\n",
                     path.c_str());
        std::exit(1);
    }
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

int main() {
    const char* env = std::getenv("POLEVAULT_SHARED");
    const fs::path shared = env && *env ? fs::path(env) : fs::current_path().parent_path() / "shared";
    const std::string text = read_file(shared / "data" / "tinyshakespeare.txt");
    std::vector<std::string_view> lines;
    for (size_t start = 0; start <= text.size();) {
        const size_t nl = std::min(text.find('\n', start), text.size());
        lines.push_back(std::string_view(text).substr(start, nl - start));
        start = nl + 1;
    }
    const double mb = double(text.size()) / 1e6;
    std::printf("tinyshakespeare: %.2f MB, %zu lines; one thread\n", mb, lines.size());
    std::printf("%-26s %8s %8s %12s %10s %11s\n", "tokenizer", "load s", "tokens", "encode MB/s", "lines MB/s",
                "decode MB/s");
    for (const char* name : {"llama3-tokenizer.json", "spbpe32k-tokenizer.json"}) {
        const fs::path path = shared / "tokenizers" / name;
        read_file(path);  // a clear message when it is missing
        pv::Tokenizer tok = pv::Tokenizer::load(path.string());
        const double load = best_seconds(3, [&] { tok = pv::Tokenizer::load(path.string()); });
        std::vector<int> ids;
        const double encode = best_seconds(3, [&] { ids = tok.encode(text); });
        size_t line_tokens = 0;
        const double by_line = best_seconds(3, [&] {
            line_tokens = 0;
            for (std::string_view l : lines) line_tokens += tok.encode(l).size();
        });
        std::string back;
        const double decode = best_seconds(3, [&] { back = tok.decode(ids); });
        std::printf("%-26s %8.3f %8zu %12.2f %10.2f %11.2f\n", name, load, ids.size(), mb / encode, mb / by_line,
                    mb / decode);
        if (line_tokens == 0 || back.empty()) return 1;  // keeps the work from being optimised away
    }
    return 0;
}
