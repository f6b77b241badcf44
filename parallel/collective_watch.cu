// Stalled ranks: the published state, the tracker, the test hook and the watchdog (see
// collective_watch.h).
#include "parallel/collective_watch.h"

#include "parallel/world.h"

#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

namespace pv {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format(const char* pattern, double x) {
    char text[64];
    std::snprintf(text, sizeof text, pattern, x);
    return text;
}

// What this rank publishes for its watchdog (header comment); written by the main thread.
struct Published {
    bool waiting = false;
    CollectiveId current;  // while waiting: the collective, since when
    Clock::time_point since;
    bool issued_any = false;
    CollectiveId last;  // the last collective issued, when
    Clock::time_point last_at = Clock::now();
    std::string busy;  // LongHostWork under way, since when
    Clock::time_point busy_since;
    int busy_depth = 0;
};
std::mutex published_mutex;
Published published;
std::atomic<long long> training_step{0};
std::atomic<long long> collectives_issued{0};  // over every communicator: the test hook's N

Published snapshot() {
    std::lock_guard lock(published_mutex);
    return published;
}

int world_rank() {
    int initialized = 0, finalized = 0, rank = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

// POLEVAULT_TEST_STALL (header comment).
struct StallHook {
    int rank = -1;
    long long collective = 0, step = 0;
    double seconds = -1;  // < 0: forever
    bool busy = false;    // the pause is declared LongHostWork
};

const StallHook& stall_hook() {
    static const StallHook hook = [] {
        StallHook h;
        const char* v = std::getenv("POLEVAULT_TEST_STALL");
        if (!v) return h;
        const std::string spec = v;
        size_t at = 0;
        bool ok = true;
        while (ok && at <= spec.size()) {
            const size_t end = std::min(spec.find(',', at), spec.size());
            const std::string item = spec.substr(at, end - at);
            const size_t eq = item.find('=');
            const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
            char* rest = nullptr;
            const double x = std::strtod(value.c_str(), &rest);
            ok = eq != std::string::npos && !value.empty() && *rest == '\0';
            if (key == "rank")
                h.rank = int(x);
            else if (key == "collective")
                h.collective = (long long)x;
            else if (key == "step")
                h.step = (long long)x;
            else if (key == "seconds")
                h.seconds = x;
            else if (key == "busy")
                h.busy = x != 0;
            else
                ok = false;
            at = end + 1;
        }
        if (!ok || h.rank < 0 || (h.collective > 0) == (h.step > 0)) {
            std::fprintf(stderr,
                         "POLEVAULT_TEST_STALL=%s; use rank=R,collective=N[,seconds=S][,busy=1] or "
                         "rank=R,step=K[,seconds=S][,busy=1]\n",
                         v);
            std::exit(2);
        }
        return h;
    }();
    return hook;
}

// Stops this rank's main thread before `next` if the hook says so (once).
void maybe_stall(const CollectiveId& next, long long issued_over_all) {
    const StallHook& h = stall_hook();
    if (h.rank < 0 || h.rank != world_rank()) return;
    if (h.collective > 0 ? issued_over_all != h.collective : next.step != h.step) return;
    static std::atomic<bool> fired{false};
    if (fired.exchange(true)) return;
    std::fprintf(stderr, "POLEVAULT_TEST_STALL: rank %d stops %s before %s\n", h.rank,
                 h.seconds < 0 ? "for good" : format("for %g s", h.seconds).c_str(), describe(next).c_str());
    std::fflush(stderr);
    std::optional<LongHostWork> busy;
    if (h.busy) busy.emplace("pausing in the test hook POLEVAULT_TEST_STALL");
    const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(h.seconds < 0 ? 1e9 : h.seconds));
    while (Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace

std::string describe(const CollectiveId& id) {
    return std::string(id.kind) + " #" + std::to_string(id.seq) + " on communicator '" + id.comm + "' (step " +
           std::to_string(id.step) + ")";
}

void note_training_step(long long step) { training_step = step; }

// ---- the tracker ------------------------------------------------------------------------------

CollectiveTracker::CollectiveTracker(std::string comm, cudaStream_t stream)
    : comm_(std::move(comm)), stream_(stream), slots_(kTrackedCollectives) {}

CollectiveTracker::~CollectiveTracker() {
    for (Slot& s : slots_)
        if (s.arrived) cudaEventDestroy(s.arrived), cudaEventDestroy(s.done);
}

void CollectiveTracker::before(const char* kind) { before(kind, stream_); }
void CollectiveTracker::after() { after(stream_); }

void CollectiveTracker::before(const char* kind, cudaStream_t stream) {
    const CollectiveId id{kind, comm_, issued_ + 1, training_step.load()};
    maybe_stall(id, ++collectives_issued);
    Slot& s = slot(id.seq);  // its previous occupant is kTrackedCollectives earlier (arrived_unfinished)
    if (!s.arrived) {
        CUDA_CHECK(cudaEventCreateWithFlags(&s.arrived, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(s.arrived, stream));
    s.id = id;
    std::lock_guard lock(published_mutex);
    published.waiting = true;  // until the call returns (the host backend's block in MPI)
    published.current = id;
    published.since = published.last_at = Clock::now();
    published.last = id;
    published.issued_any = true;
}

void CollectiveTracker::after(cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(slot(issued_ + 1).done, stream));
    ++issued_;
    publish_no_wait();
}

bool CollectiveTracker::happened(const Slot& s, bool done) {
    const cudaError_t state = cudaEventQuery(done ? s.done : s.arrived);
    if (state == cudaErrorNotReady) return false;
    CUDA_CHECK(state);
    return true;
}

std::optional<CollectiveId> CollectiveTracker::arrived_unfinished() {
    if (completed_ == issued_) return std::nullopt;
    if (happened(slot(issued_), true)) {  // the usual case: all done
        completed_ = issued_;
        return std::nullopt;
    }
    // A slot whose collective was followed by kTrackedCollectives more holds the latest of them:
    // one stream runs a communicator's collectives in order, so that one done means ours is done,
    // and that one reached but not done is where the device waits.
    for (; completed_ < issued_; ++completed_) {
        const Slot& s = slot(completed_ + 1);
        if (!happened(s, true)) return happened(s, false) ? std::optional<CollectiveId>(s.id) : std::nullopt;
    }
    return std::nullopt;
}

void publish_device_wait(const CollectiveId& id) {
    std::lock_guard lock(published_mutex);
    if (!published.waiting || published.current.seq != id.seq || published.current.comm != id.comm) {
        published.current = id;
        published.since = Clock::now();
    }
    published.waiting = true;
}

void publish_no_wait() {
    std::lock_guard lock(published_mutex);
    published.waiting = false;
}

// Nested declarations publish the outermost.
LongHostWork::LongHostWork(const std::string& what) {
    std::lock_guard lock(published_mutex);
    if (published.busy_depth++ > 0) return;
    published.busy = what;
    published.busy_since = Clock::now();
}

LongHostWork::~LongHostWork() {
    std::lock_guard lock(published_mutex);
    if (--published.busy_depth == 0) published.busy.clear();
}

namespace {

// The peers in the way are busy with long work: this rank's wait starts again.
void restart_wait() {
    std::lock_guard lock(published_mutex);
    published.since = Clock::now();
}

}  // namespace

CollectiveWait current_wait() {
    const Published p = snapshot();
    CollectiveWait w;
    if (p.waiting) w.waiting = true, w.collective = p.current, w.seconds = seconds_since(p.since);
    w.busy = p.busy;
    return w;
}

// ---- the watchdog -----------------------------------------------------------------------------

namespace {

constexpr int kQueryTag = 1, kAnswerTag = 2;
constexpr double kAnswerSeconds = 3;  // how long a timed-out rank waits for the others' answers

struct Query {
    double waited = 0;
    char collective[240] = "";
};
struct Answer {
    int waiting = 0, issued_any = 0;
    double seconds = 0;  // waiting: in `current`; otherwise since `last` was issued
    char current[240] = "";
    char last[240] = "";
    char busy[240] = "";  // LongHostWork under way
};

void copy_text(char* to, size_t size, const std::string& from) { std::snprintf(to, size, "%s", from.c_str()); }

}  // namespace

struct CollectiveWatchdog::Impl {
    double timeout = 0;
    int rank = 0, size = 1;
    bool can_ask = false;  // MPI_THREAD_MULTIPLE
    MPI_Comm comm = MPI_COMM_NULL;
    Query incoming;
    MPI_Request incoming_request = MPI_REQUEST_NULL;
    bool said_stalled = false;
    std::atomic<bool> stop{false};
    std::thread thread;

    void run() {
        while (!stop) {
            if (can_ask) serve();
            const Published p = snapshot();
            if (p.waiting && seconds_since(p.since) > timeout) time_out(p);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }

    // Answers another rank's query, if one came; says first if this rank is the one that stalled.
    void serve() {
        int arrived = 0;
        MPI_Status status;
        MPI_Test(&incoming_request, &arrived, &status);
        if (!arrived) return;
        const Published p = snapshot();
        Answer a;
        a.waiting = p.waiting;
        a.issued_any = p.issued_any;
        a.seconds = seconds_since(p.waiting ? p.since : p.last_at);
        copy_text(a.current, sizeof a.current, p.waiting ? describe(p.current) : "");
        copy_text(a.last, sizeof a.last, p.issued_any ? describe(p.last) : "");
        if (!p.busy.empty())
            copy_text(a.busy, sizeof a.busy, p.busy + " (for " + format("%.1f", seconds_since(p.busy_since)) + " s)");
        if (!p.waiting && p.busy.empty() && !said_stalled) {
            said_stalled = true;
            std::fprintf(
                stderr,
                "rank %d/%d: this rank stalled: it is in no collective (%s) while rank %d has waited %.1f s "
                "in %s\n",
                rank, size,
                p.issued_any
                    ? ("its last, " + describe(p.last) + ", was issued " + format("%.1f", a.seconds) + " s ago").c_str()
                    : "it has issued none",
                status.MPI_SOURCE, incoming.waited, incoming.collective);
            std::fflush(stderr);
        }
        MPI_Send(&a, sizeof a, MPI_BYTE, status.MPI_SOURCE, kAnswerTag, comm);
        MPI_Irecv(&incoming, sizeof incoming, MPI_BYTE, MPI_ANY_SOURCE, kQueryTag, comm, &incoming_request);
    }

    // This rank has waited too long in p.current: ask the others, name who did not arrive, end the
    // job — unless the ranks in the way are busy with long work (LongHostWork): then wait again.
    void time_out(const Published& p) {
        const double waited = seconds_since(p.since);
        std::string message = "collective timeout: this rank has waited " + format("%.1f", waited) +
                              " s (--collective-timeout " + format("%g", timeout) + ") in " + describe(p.current);
        const std::string advice =
            ". Every rank stops; if a step can legitimately keep the ranks apart this long, raise "
            "--collective-timeout";
        if (!can_ask)
            abort_all_ranks(message +
                            "; the other ranks cannot be asked which one did not arrive (MPI was started without "
                            "MPI_THREAD_MULTIPLE)" +
                            advice);
        Query q;
        q.waited = waited;
        copy_text(q.collective, sizeof q.collective, describe(p.current));
        const size_t ranks = static_cast<size_t>(size);
        std::vector<Answer> answers(ranks);
        std::vector<MPI_Request> answer_requests(ranks, MPI_REQUEST_NULL), queries(ranks, MPI_REQUEST_NULL);
        for (int r = 0; r < size; ++r)
            if (r != rank) {
                MPI_Irecv(&answers[size_t(r)], sizeof(Answer), MPI_BYTE, r, kAnswerTag, comm,
                          &answer_requests[size_t(r)]);
                MPI_Isend(&q, sizeof q, MPI_BYTE, r, kQueryTag, comm, &queries[size_t(r)]);
            }
        std::vector<bool> answered(ranks, false);
        const Clock::time_point asked = Clock::now();
        for (int pending = size - 1; pending > 0 && seconds_since(asked) < kAnswerSeconds;) {
            serve();  // the others may be timing out too, and asking this rank
            for (int r = 0; r < size; ++r) {
                int done = 0;
                if (r == rank || answered[size_t(r)]) continue;
                MPI_Test(&answer_requests[size_t(r)], &done, MPI_STATUS_IGNORE);
                if (done) answered[size_t(r)] = true, --pending;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        std::string absent, waiting, busy;
        for (int r = 0; r < size; ++r) {
            if (r == rank) continue;
            const Answer& a = answers[size_t(r)];
            const std::string who = "rank " + std::to_string(r);
            if (!answered[size_t(r)])
                absent += (absent.empty() ? "" : "; ") + who + " did not answer within " +
                          format("%g", kAnswerSeconds) + " s (its process is frozen or gone)";
            else if (!a.waiting && a.busy[0])
                busy += (busy.empty() ? "" : "; ") + who + " is " + a.busy;
            else if (!a.waiting)
                absent += (absent.empty() ? "" : "; ") + who + " is in no collective (" +
                          (a.issued_any ? "its last, " + std::string(a.last) + ", was issued " +
                                              format("%.1f", a.seconds) + " s ago"
                                        : std::string("it has issued none")) +
                          "): it stalled";
            else
                waiting += (waiting.empty() ? "" : "; ") + who + " has waited " + format("%.1f", a.seconds) + " s in " +
                           a.current;
        }
        if (absent.empty() && !busy.empty()) {
            std::fprintf(stderr, "rank %d/%d: has waited %.1f s in %s: %s; waiting again\n", rank, size, waited,
                         describe(p.current).c_str(), busy.c_str());
            std::fflush(stderr);
            restart_wait();
            return;
        }
        if (!absent.empty())
            message += ", for what has not arrived: " + absent + (busy.empty() ? "" : "; " + busy) +
                       (waiting.empty() ? "" : "; meanwhile " + waiting);
        else
            message += ", and every rank waits in a collective but not all in the same one (" + waiting +
                       "): the ranks issued different collectives, a divergence between them rather than a stall";
        abort_all_ranks(message + advice);
    }
};

CollectiveWatchdog::CollectiveWatchdog(double timeout_seconds) : impl_(std::make_unique<Impl>()) {
    Impl& w = *impl_;
    w.timeout = timeout_seconds;
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    w.can_ask = level == MPI_THREAD_MULTIPLE;
    if (w.can_ask) {
        MPI_Comm_dup(MPI_COMM_WORLD, &w.comm);
        MPI_Irecv(&w.incoming, sizeof w.incoming, MPI_BYTE, MPI_ANY_SOURCE, kQueryTag, w.comm, &w.incoming_request);
    }
    w.thread = std::thread([&w] { w.run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
    Impl& w = *impl_;
    w.stop = true;
    w.thread.join();
    if (w.can_ask) {
        MPI_Cancel(&w.incoming_request);
        MPI_Wait(&w.incoming_request, MPI_STATUS_IGNORE);
        MPI_Comm_free(&w.comm);
    }
}

}  // namespace pv
