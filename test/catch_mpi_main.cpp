// The Catch2 main of the multi-rank tests (test/mpi/test_mpi_*.cu), run as `mpirun -np N binary`.
//
// Every rank runs the whole session (the test cases are collective: each rank plays its part).
// The job must report one verdict and must never hang:
//
// - Agreement per test case. When a test case ends, every rank synchronises its streams and the
//   ranks all-reduce "did it fail here?" on a private duplicate of MPI_COMM_WORLD (so the harness's
//   messages can never match a test's). A test case that failed on any rank counts as failed.
// - One summary. Only rank 0 reports (Catch2's console reporter, so test/run_tests.sh reads it as
//   any other binary's); its closing totals are the job's: test cases failed on any rank, and
//   assertions summed over ranks. Other ranks' reporters write to /dev/null, and their failed
//   assertions are printed on stderr, prefixed with the rank. Every rank exits non-zero if any
//   rank failed.
// - No hang. A failed CHECK lets the test case go on, in step with the other ranks. A failed
//   REQUIRE (or an exception) ends it on this rank only, and the other ranks may then wait forever
//   in a collective this rank will not join. So a rank whose test case was cut short waits at most
//   kGraceSeconds for the others to reach the end of the test case, then calls MPI_Abort with a
//   message naming the test case; mpirun then ends every rank, non-zero.
//
// Leaks (the asan flavour). Open MPI loses some allocations of its own, many of them inside its
// plugins, which MPI_Finalize unloads — after that LeakSanitizer cannot even name the library. So
// the leak check runs before MPI_Finalize (which also disables the one at exit), when our objects
// should all be gone and MPI's are still reachable; what MPI itself has lost by then is
// suppressed by library name. This file is compiled once, uninstrumented, for every flavour (the
// Makefile: Catch2's mains): LeakSanitizer's entry point is declared weak, so it is there to call
// exactly when the program is linked with the sanitizer's runtime.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

// Open MPI's own leaks are suppressed for every host binary in host/mpi_sanitizer.cpp.
extern "C" void __lsan_do_leak_check() __attribute__((weak));

namespace mpi_main {

constexpr int kGraceSeconds = 15;

int world_rank = 0;
int world_size = 1;
MPI_Comm harness = MPI_COMM_NULL;  // the harness's own agreement messages

// The job's totals, agreed at the end of the run (read by rank 0's reporter).
long long failed_cases_anywhere = 0;
Catch::Counts assertions_everywhere;

[[noreturn]] void abort_job(const std::string& why) {
    std::fprintf(stderr, "rank %d: %s; aborting the MPI job\n", world_rank, why.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
}

class RankListener : public Catch::TestEventListenerBase {
  public:
    using TestEventListenerBase::TestEventListenerBase;

    void testCaseStarting(Catch::TestCaseInfo const& info) override {
        TestEventListenerBase::testCaseStarting(info);
        test_case_ = info.name;
        cut_short_ = false;
    }

    bool assertionEnded(Catch::AssertionStats const& stats) override {
        const Catch::AssertionResult& result = stats.assertionResult;
        if (result.isOk()) return true;
        // REQUIRE, FAIL and unexpected exceptions end the test case on this rank only.
        if (!Catch::shouldContinueOnFailure(result.m_info.resultDisposition)) cut_short_ = true;
        if (world_rank != 0) print_failure(stats);  // rank 0's reporter prints its own
        return true;
    }

    void testCaseEnded(Catch::TestCaseStats const& stats) override {
        TestEventListenerBase::testCaseEnded(stats);
        // Work this rank left queued would block the agreement (a host MPI call) in the deferred
        // mode; a test case cut short may have left collectives no peer will join, so skip it then.
        if (!cut_short_) cudaDeviceSynchronize();
        int failed_here = stats.totals.assertions.failed > 0 ? 1 : 0, failed_anywhere = 0;
        MPI_Request request;
        MPI_Iallreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, harness, &request);
        const auto start = std::chrono::steady_clock::now();
        for (int done = 0;;) {
            MPI_Test(&request, &done, MPI_STATUS_IGNORE);
            if (done) break;
            if (cut_short_ && std::chrono::steady_clock::now() - start > std::chrono::seconds(kGraceSeconds))
                abort_job("test case \"" + test_case_ +
                          "\" ended early here (a failed REQUIRE or an exception) and the "
                          "other ranks did not reach its end within " +
                          std::to_string(kGraceSeconds) + " s (they are probably waiting in a collective)");
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        if (failed_anywhere) ++failed_cases_anywhere;
        if (failed_anywhere && !failed_here && world_rank == 0)
            std::printf("test case \"%s\" failed on another rank (its messages are above or below)\n",
                        test_case_.c_str());
    }

    void testRunEnded(Catch::TestRunStats const& stats) override {
        const Catch::Counts& a = stats.totals.assertions;
        unsigned long long mine[3] = {a.passed, a.failed, a.failedButOk}, sum[3] = {0, 0, 0};
        MPI_Allreduce(mine, sum, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, harness);
        assertions_everywhere.passed = sum[0];
        assertions_everywhere.failed = sum[1];
        assertions_everywhere.failedButOk = sum[2];
        TestEventListenerBase::testRunEnded(stats);
    }

  private:
    void print_failure(Catch::AssertionStats const& stats) const {
        const Catch::AssertionResult& result = stats.assertionResult;
        std::string text = "rank " + std::to_string(world_rank) + ", test case \"" + test_case_ +
                           "\": " + result.getSourceInfo().file + ":" + std::to_string(result.getSourceInfo().line) +
                           ": FAILED";
        if (result.hasExpression())
            text += ": " + result.getExpressionInMacro() + " with expansion: " + result.getExpandedExpression();
        if (result.hasMessage()) text += ": " + result.getMessage();
        for (const Catch::MessageInfo& info : stats.infoMessages) text += "\n    with message: " + info.message;
        std::fprintf(stderr, "%s\n", text.c_str());
        std::fflush(stderr);
    }

    std::string test_case_;
    bool cut_short_ = false;
};

// Rank 0's reporter: Catch2's console output, closing with the job's totals.
class JobConsoleReporter : public Catch::ConsoleReporter {
  public:
    using ConsoleReporter::ConsoleReporter;

    void testRunEnded(Catch::TestRunStats const& stats) override {
        Catch::Totals totals = stats.totals;
        const size_t cases = totals.testCases.total();
        totals.testCases.failed = size_t(failed_cases_anywhere);
        totals.testCases.passed = cases - totals.testCases.failed - totals.testCases.failedButOk;
        totals.assertions = assertions_everywhere;
        ConsoleReporter::testRunEnded(Catch::TestRunStats(stats.runInfo, totals, stats.aborting));
    }
};

}  // namespace mpi_main

using mpi_main::JobConsoleReporter;
using mpi_main::RankListener;
CATCH_REGISTER_LISTENER(RankListener)
CATCH_REGISTER_REPORTER("mpi-job-console", JobConsoleReporter)

int main(int argc, char** argv) {
    using namespace mpi_main;
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_dup(MPI_COMM_WORLD, &harness);

    Catch::Session session;
    int result = session.applyCommandLine(argc, argv);
    if (result == 0) {
        Catch::ConfigData& config = session.configData();
        // mpirun gives ranks a terminal-like stdout; colour codes would hide the summary from
        // test/run_tests.sh, so colour is only used when asked for.
        if (config.useColour == Catch::UseColour::Auto) config.useColour = Catch::UseColour::No;
        if (world_rank == 0) {
            if (config.reporterName == "console") config.reporterName = "mpi-job-console";
        } else {
            config.outputFilename = "/dev/null";
        }
        session.run();
        result = failed_cases_anywhere > 0 ? 1 : 0;
    }
    if (__lsan_do_leak_check != nullptr) __lsan_do_leak_check();  // exits non-zero on a leak
    MPI_Comm_free(&harness);
    MPI_Finalize();
    return result;
}
