// Stalled ranks: every rank ends within --collective-timeout seconds of a collective that a peer
// never joins, with a message naming the rank that did not arrive and the collective — never a hang.
//
// What "waiting" means. The timeout is per collective wait, measured from the moment this rank
// reached the collective, so a long step (compute, a slow rank that arrives in time) never trips
// it. A rank reaches a collective:
//   - on the device: each collective of a Comm with more than one rank is bracketed by two events
//     on its stream, `arrived` before and `done` after (CollectiveTracker). A collective whose
//     `arrived` has happened and whose `done` has not is one the device waits in; the compute
//     queued before it on the stream is over. The host's polling wait (wait_polling) looks at the
//     oldest unfinished collective once a wait has lasted a while, and publishes it with the time
//     it first saw it arrived;
//   - on the host: while the NCCL call itself runs (the host backend's collectives block in MPI
//     until every peer has joined; a GPU's return at once), the rank waits in that collective.
//   A CUDA graph's launch (--cuda-graphs) holding a communicator's captured collectives is one
//   tracked collective of it ("captured micro-step #9"), bracketed on the stream it is launched on:
//   captured calls are not tracked one by one (an event recorded in a capture cannot be queried).
// What a rank publishes (process-wide, under a mutex): whether it waits and in which collective
// since when, its last issued collective, the training step. A waiting rank's collectives are
// numbered per communicator from 1 ("all-reduce #7 on communicator 'world'").
//
// Naming the rank that did not arrive. A rank whose main thread is stuck (in a kernel, in I/O, in
// a test hook's sleep) cannot answer, so every rank of a world of several runs a watchdog thread
// (CollectiveWatchdog) that reads the published state every 50 ms and talks MPI on its own
// duplicate of MPI_COMM_WORLD (the world is started with MPI_THREAD_MULTIPLE for it; the host
// NCCL uses MPI from the main thread meanwhile). When its rank has waited longer than the timeout
// in one collective, the watchdog asks every other rank's watchdog for its state (answers awaited
// 3 s), names the ranks that are in no collective — they have not arrived — and those that did not
// answer, then ends the job (abort_all_ranks). A watchdog asked while its own rank waits in no
// collective prints that this rank stalled before it answers. If every rank waits, they wait in
// different collectives: the message says so and lists them. A rank in declared long host work
// (LongHostWork: the checkpoint writer) is not stalled: if only such ranks are in the way, the
// asking rank notes it on stderr and its wait starts again.
//
// Test hook: POLEVAULT_TEST_STALL="rank=R,collective=N[,seconds=S][,busy=1]" or
// "rank=R,step=K[,seconds=S][,busy=1]", read once: world rank R stops before issuing its N-th
// collective (1-based, over all its communicators) or the first collective of training step K, for
// S seconds (default: forever); busy=1 declares the pause LongHostWork.
//
// Limits. A GPU rank that blocks outside wait_polling (a synchronous copy behind a collective)
// publishes no wait: it answers "in no collective" and does not time out itself (its peers do).
// The host backend's deferred stream mode runs collectives inside a stream query, where no wait
// is published either; the timeout is meant for the default (sync) mode and GPUs. A host more than
// kTrackedCollectives collectives ahead of its device sees a wait only once the device reaches the
// latest collective that shares the slot (a step issues a few hundred at most).
#pragma once

#include "platform/platform.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pv {

// One collective of one communicator: "all-reduce #7 on communicator 'world' (step 3)".
struct CollectiveId {
    const char* kind = "";  // collective_name()
    std::string comm;
    long long seq = 0;   // 1-based, per communicator
    long long step = 0;  // the training step it was issued in (0: before the first)
};
std::string describe(const CollectiveId& id);

// The training step the collectives issued from now on belong to (Trainer::step).
void note_training_step(long long step);

// The per-communicator record of collectives behind the published state (see the header comment).
class CollectiveTracker {
  public:
    static constexpr int kTrackedCollectives = 512;
    CollectiveTracker(std::string comm, cudaStream_t stream);
    virtual ~CollectiveTracker();
    CollectiveTracker(const CollectiveTracker&) = delete;
    CollectiveTracker& operator=(const CollectiveTracker&) = delete;

    // Around the NCCL call of one collective: the test hook, the `arrived` event and the host's
    // wait (before); the `done` event (after).
    void before(const char* kind);
    void after();
    // The same for work on another stream that holds collectives of this communicator (a graph's
    // launch, which ends joined to the comm stream's work): `arrived` and `done` recorded on `stream`.
    void before(const char* kind, cudaStream_t stream);
    void after(cudaStream_t stream);
    // The oldest collective this rank's device has reached and not finished, if any.
    std::optional<CollectiveId> arrived_unfinished();

  protected:
    struct Slot {
        cudaEvent_t arrived = nullptr, done = nullptr;
        CollectiveId id;
    };
    // Whether the slot's `done` (or `arrived`) event has happened: cudaEventQuery. A test
    // replaces it to play a device that has reached or finished chosen collectives, which the host
    // backend's streams, done at the call, never leave pending.
    virtual bool happened(const Slot& s, bool done);

  private:
    Slot& slot(long long seq) { return slots_[size_t(seq % kTrackedCollectives)]; }
    std::string comm_;
    cudaStream_t stream_;
    std::vector<Slot> slots_;
    long long issued_ = 0;     // collectives whose `done` is recorded
    long long completed_ = 0;  // collectives seen done
};

// Publishes that the host waits for the device in `id` (keeping the start time if it already
// waited in it), or that it no longer waits (wait_polling).
void publish_device_wait(const CollectiveId& id);
void publish_no_wait();
// Declares long host work that is progress, not a stall (the writer writing a checkpoint while the
// other ranks wait in their next collective): a rank that times out waiting for this one while it
// lasts says so on stderr and waits again, instead of ending the job.
class LongHostWork {
  public:
    explicit LongHostWork(const std::string& what);  // "writing checkpoint out/step_4"
    ~LongHostWork();
    LongHostWork(const LongHostWork&) = delete;
    LongHostWork& operator=(const LongHostWork&) = delete;
};

// What this rank publishes now: whether it waits in a collective, which one, for how long; the
// long host work it declares (empty: none).
struct CollectiveWait {
    bool waiting = false;
    CollectiveId collective;
    double seconds = 0;
    std::string busy;
};
CollectiveWait current_wait();

// The watchdog thread of one rank (see the header comment). Collective over MPI_COMM_WORLD:
// every rank constructs it together. Without MPI_THREAD_MULTIPLE it cannot ask the other ranks
// and names only the collective this rank waited in.
class CollectiveWatchdog {
  public:
    explicit CollectiveWatchdog(double timeout_seconds);
    ~CollectiveWatchdog();
    CollectiveWatchdog(const CollectiveWatchdog&) = delete;
    CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace pv
