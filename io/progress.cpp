// Progress lines on stderr (see progress.h).
#include "io/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace pv {
namespace {

constexpr double kQuietSeconds = 2.0;     // nothing before this
constexpr double kTerminalRedraw = 0.2;   // a TTY line at most 5 times a second
constexpr double kLogInterval = 10.0;     // a line every 10 s elsewhere
constexpr int kBarWidth = 20;

std::atomic<bool> g_enabled{true};
thread_local Progress* t_current = nullptr;

double steady_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string amount_text(double x, Progress::Unit unit) {
    char text[32];
    if (unit == Progress::Unit::items) {
        std::snprintf(text, sizeof text, "%.0f", x);
        return text;
    }
    const char* units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (x >= 1000 && u < 4) x /= 1000, ++u;
    std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.2f %s", x, units[u]);
    return text;
}

std::string clock_text(double seconds) {
    const long long s = std::llround(std::max(0.0, seconds));
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    return text;
}

}  // namespace

Progress::Progress(std::string what, double total, Unit unit)
    : Progress(std::move(what), total, unit, stderr, ::isatty(STDERR_FILENO) == 1, steady_seconds) {}

Progress::Progress(std::string what, double total, Unit unit, std::FILE* out, bool terminal, Clock clock)
    : what_(std::move(what)),
      total_(total),
      unit_(unit),
      out_(g_enabled.load() ? out : nullptr),
      terminal_(terminal),
      clock_(std::move(clock)),
      outer_(t_current) {
    start_ = clock_();
    t_current = this;
}

Progress::~Progress() {
    t_current = outer_;
    std::lock_guard<std::mutex> lock(print_mutex_);
    maybe_print(true);
}

void Progress::advance(double amount) {
    done_.fetch_add(amount);
    if (!out_) return;
    std::unique_lock<std::mutex> lock(print_mutex_, std::try_to_lock);  // another thread is printing: skip
    if (lock.owns_lock()) maybe_print(false);
}

void Progress::report_to_current(double amount) {
    if (t_current && t_current->unit_ == Unit::bytes) t_current->advance(amount);  // bytes count toward bytes only
}

void Progress::set_enabled(bool enabled) { g_enabled.store(enabled); }

std::string Progress::line(double elapsed) const {
    const double done = done_.load();
    std::string s = what_ + "  ";
    if (total_ > 0) {
        const double f = std::clamp(done / total_, 0.0, 1.0);
        const int filled = int(f * kBarWidth);
        s += "[" + std::string(size_t(filled), '#') + std::string(size_t(kBarWidth - filled), '.') + "]  ";
        char percent[16];
        std::snprintf(percent, sizeof percent, "%3.0f%%", 100 * f);
        s += amount_text(done, unit_) + " / " + amount_text(total_, unit_) + "  " + percent;
    } else {
        s += amount_text(done, unit_);
    }
    return s + "  " + clock_text(elapsed);
}

void Progress::maybe_print(bool last) {
    if (!out_) return;
    const double now = clock_(), elapsed = now - start_;
    if (last) {
        if (!printed_) return;  // it ended before anything was worth saying
        char tail[48];
        std::snprintf(tail, sizeof tail, "  done in %.1f s", elapsed);
        std::fprintf(out_, "%s%s%s%s\n", terminal_ ? "\r" : "", line(elapsed).c_str(), tail,
                     terminal_ ? "\x1b[K" : "");
        std::fflush(out_);
        return;
    }
    if (elapsed < kQuietSeconds) return;
    if (printed_ && now - last_print_ < (terminal_ ? kTerminalRedraw : kLogInterval)) return;
    if (terminal_)
        std::fprintf(out_, "\r%s\x1b[K", line(elapsed).c_str());
    else
        std::fprintf(out_, "%s\n", line(elapsed).c_str());
    std::fflush(out_);
    printed_ = true, last_print_ = now;
}

}  // namespace pv
