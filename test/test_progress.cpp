// Progress lines (io/progress.h) under a clock the test moves: silent for the first 2 s, then a
// line redrawn in place on a terminal or a line every 10 s in a log, a last line with the time
// taken, nesting per thread, and off where the process does not report.
#include <catch2/catch.hpp>

#include "io/progress.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// What a Progress printed into a memory stream.
struct Capture {
    char* buffer = nullptr;
    size_t size = 0;
    std::FILE* file = open_memstream(&buffer, &size);
    ~Capture() {
        std::fclose(file);
        std::free(buffer);
    }
    std::string text() {
        std::fflush(file);
        return std::string(buffer, size);
    }
};

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

}  // namespace

TEST_CASE("progress: nothing for 2 s, then a log line every 10 s and a last line with the time", "[progress]") {
    Capture out;
    double now = 100;
    {
        pv::Progress p("writing checkpoint runs/x/step_5", 2.5e9, pv::Progress::Unit::bytes, out.file, false,
                       [&] { return now; });
        now += 1.5;
        p.advance(1e9);
        CHECK(out.text().empty());  // an operation this short says nothing
        now += 1.0;                 // 2.5 s in
        p.advance(0.25e9);
        CHECK(out.text() == "writing checkpoint runs/x/step_5  [##########..........]  1.25 GB / 2.50 GB   50%  "
                            "0:00:03\n");
        now += 5;
        p.advance(0.25e9);
        CHECK(count(out.text(), "\n") == 1);  // not yet 10 s since the last line
        now += 6;
        p.advance(0.5e9);
        CHECK(count(out.text(), "\n") == 2);
        CHECK(out.text().find("[################....]  2.00 GB / 2.50 GB   80%  0:00:14\n") != std::string::npos);
        now += 1;
        p.advance(0.5e9);
    }
    const std::string all = out.text();
    CHECK(count(all, "\n") == 3);
    CHECK(all.find("[####################]  2.50 GB / 2.50 GB  100%  0:00:15  done in 14.5 s\n") != std::string::npos);
    CHECK(all.find('\r') == std::string::npos);
}

TEST_CASE("progress: a terminal line is redrawn in place at most 5 times a second; a short one prints nothing",
          "[progress]") {
    Capture out;
    double now = 0;
    {
        pv::Progress p("evaluating", 32, pv::Progress::Unit::items, out.file, true, [&] { return now; });
        for (int i = 0; i < 32; ++i) {
            now += 0.125;  // 4 s in all: drawn at 2 s, then whenever 0.2 s have passed (every 0.25 s here)
            p.advance(1);
        }
    }
    const std::string all = out.text();
    CHECK(count(all, "\r") == 10);  // at 2, 2.25, ..., 4 s, and the last line
    CHECK(count(all, "\n") == 1);   // the last line ends it
    CHECK(all.find("\revaluating  [##########..........]  16 / 32   50%  0:00:02\x1b[K") != std::string::npos);
    CHECK(all.find("\revaluating  [####################]  32 / 32  100%  0:00:04  done in 4.0 s\x1b[K\n") !=
          std::string::npos);
    Capture quick;
    {
        pv::Progress p("evaluating", 40, pv::Progress::Unit::items, quick.file, true, [&] { return now; });
        now += 1.9;
        p.advance(40);
    }
    CHECK(quick.text().empty());
}

TEST_CASE("progress: report_to_current reaches the innermost progress of this thread; off prints nothing",
          "[progress]") {
    Capture out;
    double now = 0;
    const auto clock = [&] { return now; };
    {
        pv::Progress outer("export", 0, pv::Progress::Unit::bytes, out.file, false, clock);
        {
            pv::Progress inner("writing model.safetensors", 1000, pv::Progress::Unit::bytes, out.file, false, clock);
            now += 3;
            pv::Progress::report_to_current(400);  // to `inner`
            CHECK(out.text().find("writing model.safetensors  [########............]  400 B / 1.00 KB   40%") !=
                  std::string::npos);
        }
        now += 20;
        pv::Progress::report_to_current(7e6);  // to `outer` again: no total, no bar
        CHECK(out.text().find("export  7.00 MB  0:00:23\n") != std::string::npos);
    }
    pv::Progress::report_to_current(5);  // none alive: nothing happens
    pv::Progress::set_enabled(false);
    Capture silent;
    {
        pv::Progress p("loading", 10, pv::Progress::Unit::items, silent.file, false, clock);
        now += 30;
        p.advance(10);
    }
    pv::Progress::set_enabled(true);
    CHECK(silent.text().empty());
}
