// The stop signals' handler and phases, SIGXFSZ ignored, the test hook (see signals.h).
#include "trainer/signals.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>

namespace pv {
namespace {

static_assert(std::atomic<int>::is_always_lock_free, "the handler's flags must be lock-free to be signal-safe");

std::atomic<int> g_phase{int(SignalPhase::loading)};
std::atomic<int> g_stop{0};            // the first stop signal while training
std::atomic<bool> g_mpirun_term{false};  // after mpirun's SIGCONT: its SIGTERM is the same request

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};

// "train: " + name + rest, written to stderr with one write(2) (nothing else is safe here), so
// that the line is not interleaved with another rank's output under mpirun, which forwards each
// write as it comes. A failed write has nowhere to be reported.
void say(const char* name, const char* rest) {
    char line[512];
    size_t n = 0;
    for (const char* part : {"train: ", name, rest})
        for (const char* c = part; *c && n < sizeof line; ++c) line[n++] = *c;
    const char* s = line;
    while (n > 0) {
        const ssize_t w = ::write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w, n -= size_t(w);
    }
}

void on_stop_signal(int signo) {
    const int saved_errno = errno;
    const char* name = signal_name(signo);
    switch (SignalPhase(g_phase.load())) {
        case SignalPhase::loading:
            if (signo == SIGCONT) break;  // mpirun's herald: its SIGTERM follows (nothing to save yet)
            say(name, " before training started: exiting (nothing to save yet)\n");
            // Die by the signal, as without a handler: it is blocked while this handler runs and is
            // delivered, with the default action, when the handler returns.
            std::signal(signo, SIG_DFL);
            std::raise(signo);
            break;
        case SignalPhase::training: {
            int none = 0;
            if (g_stop.compare_exchange_strong(none, signo)) {
                if (signo == SIGCONT) {
                    g_mpirun_term.store(true);
                    say(name,
                        " from mpirun (Open MPI sends it when mpirun is interrupted or terminated, then SIGTERM and "
                        "SIGKILL, each after its odls_base_sigkill_timeout): finishing this step, then writing its "
                        "checkpoint and exiting\n");
                } else {
                    say(name,
                        " received: finishing this step, then writing its checkpoint and exiting (a second signal "
                        "exits at once, without that checkpoint)\n");
                }
                break;
            }
            if (signo == SIGCONT) break;  // mpirun sends one whenever it signals
            if (g_mpirun_term.exchange(false)) {  // the SIGTERM that follows mpirun's SIGCONT: the same request
                say(name, " from mpirun: still finishing this step and writing its checkpoint\n");
                break;
            }
            say(name,
                " again: exiting at once; no checkpoint was written for the step in flight (the checkpoints "
                "written before it are intact)\n");
            ::_exit(128 + signo);
        }
        case SignalPhase::finished:
            if (signo == SIGCONT) break;
            say(name, " after the last step: its checkpoint is written; exiting\n");
            ::_exit(128 + signo);
    }
    errno = saved_errno;
}

}  // namespace

const char* signal_name(int signo) {
    switch (signo) {
        case SIGTERM: return "SIGTERM";
        case SIGINT: return "SIGINT";
        case SIGHUP: return "SIGHUP";
        case SIGUSR1: return "SIGUSR1";
        case SIGCONT: return "SIGCONT";
        default: return "a signal";
    }
}

void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

void install_stop_signals() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    for (int s : kStopSignals) sigaddset(&action.sa_mask, s);  // one handler at a time
    action.sa_flags = SA_RESTART;                              // interrupted system calls resume
    for (int s : kStopSignals) sigaction(s, &action, nullptr);
    if (under_open_mpi()) {
        sigaddset(&action.sa_mask, SIGCONT);
        for (int s : kStopSignals) sigaction(s, &action, nullptr);
        sigaction(SIGCONT, &action, nullptr);
    }
}

bool under_open_mpi() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

int mpirun_kill_grace_seconds() {
    const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
    return v && *v ? std::atoi(v) : 1;  // Open MPI 4's default
}

void set_signal_phase(SignalPhase phase) { g_phase.store(int(phase)); }

int stop_signal() { return g_stop.load(); }

void test_signal_hook(long long step) {
    static const long long at = [] {
        const char* v = std::getenv("POLEVAULT_TEST_SIGNAL_AT_STEP");
        return v && *v ? std::atoll(v) : -1LL;
    }();
    if (step == at) std::raise(SIGTERM);
}

}  // namespace pv
