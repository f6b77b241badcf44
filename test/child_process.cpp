// run_in_child: fork, exec /proc/self/exe with one test selected, collect its output, enforce a
// timeout. Plain POSIX so it serves every backend and sanitizer build.
#include "test/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <vector>

namespace pv::test {

ChildResult run_in_child(const std::string& test_name, const Environment& env, int timeout_seconds) {
    ChildResult result;
    int fds[2];
    if (pipe(fds) != 0) {
        result.output = "pipe() failed";
        return result;
    }
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        // The child's abort is the expected outcome: no core dump, and Catch2 must not print a
        // reporter summary that could be mistaken for a pass.
        const rlimit no_core{0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        setenv("POLEVAULT_CHILD_TEST", "1", 1);
        for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
        execl("/proc/self/exe", "child", test_name.c_str(), "--reporter", "compact", static_cast<char*>(nullptr));
        _exit(127);
    }
    close(fds[1]);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
    char buf[4096];
    for (;;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            kill(pid, SIGKILL);
            result.timed_out = true;
            break;
        }
        pollfd p{fds[0], POLLIN, 0};
        if (poll(&p, 1, int(std::min<long>(left.count(), 1000))) > 0) {
            const ssize_t n = read(fds[0], buf, sizeof buf);
            if (n <= 0) break;  // EOF: the child closed its output (exited)
            result.output.append(buf, size_t(n));
        }
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status)) {
        result.exit_code = WEXITSTATUS(status);
        result.died = result.exit_code != 0;
    } else if (WIFSIGNALED(status)) {
        result.signal = WTERMSIG(status);
        result.died = !result.timed_out;
    }
    return result;
}

}  // namespace pv::test
