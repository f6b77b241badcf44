// Running a test in a child process, for planted-bug tests: the platform must abort with a
// message naming the problem, and a test can only observe that from outside the process.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pv::test {

struct ChildResult {
    bool died = false;       // exited non-zero or was killed by a signal (other than our timeout)
    bool timed_out = false;  // still running after the timeout, then killed: a hang, not a report
    int exit_code = 0;       // when it exited
    int signal = 0;          // when a signal ended it
    std::string output;      // stdout and stderr, interleaved
};

using Environment = std::vector<std::pair<std::string, std::string>>;

// Runs this test binary again with only the (usually hidden) test case `test_name` selected,
// with `env` added to (or replacing in) this process's environment.
ChildResult run_in_child(const std::string& test_name, const Environment& env = {}, int timeout_seconds = 120);

}  // namespace pv::test

// Asserts that the hidden test `name` dies in a child process with `expected` in its output.
#define REQUIRE_DIES_WITH(name, expected)                           \
    do {                                                            \
        const auto child_ = ::pv::test::run_in_child(name);         \
        INFO("child output:\n" << child_.output);                   \
        REQUIRE_FALSE(child_.timed_out);                            \
        REQUIRE(child_.died);                                       \
        REQUIRE(child_.output.find(expected) != std::string::npos); \
    } while (0)
