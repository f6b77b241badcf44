// Progress of the operations that take longer than a moment — preparing data, loading and
// quantising weights, verifying and writing checkpoints, evaluating, exporting — on stderr, so a
// user never faces a silent minute. Host code only.
//
// Nothing is printed for the first 2 s: most operations end sooner, and a line for each would be
// noise. After that:
//   - on a terminal (stderr is a TTY), one line redrawn in place at most 5 times a second:
//       loading weights from m.safetensors  [##########..........]  1.21 / 2.47 GB  49%  0:00:12
//     and, when the operation ends, that line completed with "done in T";
//   - otherwise (a log file, a batch job's output), one such line every 10 s and a last one at
//     the end, so a log shows the operation advancing without a flood of lines.
// Only the reporting process prints: `train` turns progress off on every rank but rank 0.
//
// Progresses nest per thread like WriteRecorder (io/durable_file.h): report_to_current(n) adds to
// the innermost one alive on the calling thread, so write_file_atomically counts the bytes of a
// checkpoint or an export without knowing who watches. advance() is thread-safe: the workers of a
// parallel encoding may report to one Progress.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

namespace pv {

class Progress {
  public:
    enum class Unit { bytes, items };
    using Clock = std::function<double()>;  // seconds since an arbitrary origin

    // `total` <= 0: unknown (no bar, no percentage). `out` and `clock` are for tests; by default
    // stderr (a TTY or not, as isatty says) and the steady clock.
    Progress(std::string what, double total, Unit unit = Unit::bytes);
    Progress(std::string what, double total, Unit unit, std::FILE* out, bool terminal, Clock clock);
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void advance(double amount);
    // Adds bytes to the innermost Progress alive on this thread, if it counts bytes.
    static void report_to_current(double amount);

    // Whether this process prints progress at all (rank 0 of a run does; the others do not).
    static void set_enabled(bool enabled);

  private:
    void maybe_print(bool last);
    std::string line(double elapsed) const;

    std::string what_;
    double total_;
    Unit unit_;
    std::FILE* out_;
    bool terminal_;
    Clock clock_;
    double start_ = 0, last_print_ = -1;
    std::atomic<double> done_{0};
    bool printed_ = false;
    std::mutex print_mutex_;
    Progress* outer_;
};

}  // namespace pv
