// Tokenizer speed: loading each tokenizer.json, and encoding tinyshakespeare (1.1 MB) with it, as
// one text and line by line, on one thread; decoding the ids back. Reads the tokenizer files and
// the text from ../shared (or $POLEVAULT_SHARED), so run it from the repository root. Times are
// the thread's CPU time, best of 3, so that other work on a shared machine does not count.
//
//   load s          Tokenizer::load
//   encode MB/s     encode(whole text), bytes of text per second
//   lines MB/s      encode of each line alone (the whole text once)
//   decode MB/s     decode(ids of the whole text), bytes of text per second
//
// test/interop/tokenizer_speed_hf.py measures Hugging Face `tokenizers` doing the same work; the
// docs/training-and-data.md has both.
#include "data/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <time.h>

namespace {

namespace fs = std::filesystem;

double thread_cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double best_seconds(int repeats, const std::function<void()>& body) {
    double best = 1e30;
    for (int i = 0; i < repeats; ++i) {
        const double t0 = thread_cpu_seconds();
        body();
        best = std::min(best, thread_cpu_seconds() - t0);
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
    std::printf("tinyshakespeare: %.2f MB, %zu lines; one thread, CPU time\n", mb, lines.size());
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
