// The product-side wrapper through which every collective goes (DESIGN.md §5 "Counting").
//
// A Comm is one NCCL communicator plus the stream its collectives run on. Every call is recorded
// — kind, element count, data type, communicator — on both backends, so tests and docs/parallel-training.md's
// table read exact per-step figures from the product itself, and the bytes each rank puts on the
// wire are derived from the record with the ring algorithm NCCL uses for large messages:
//
//   all-reduce      count elements         2·(N−1)/N · count · size   (reduce-scatter + all-gather)
//   reduce-scatter  recv_count per rank    (N−1) · recv_count · size  (= (N−1)/N of the input)
//   all-gather      send_count per rank    (N−1) · send_count · size
//   broadcast       count elements         (N−1)/N · count · size: the ring passes the data over
//                                          N − 1 links, counted as their average per rank
//   send            count elements         count · size; recv: 0 (the sender counts the bytes)
// With N = 1 nothing is sent. Sizes are bytes of the data type.
//
// Streams. Collectives run on the Comm's stream. `fence_from(compute)` makes the comm stream wait
// for the compute stream's work so far (an event, no host stall), `fence_to(compute)` makes the
// compute stream wait for the collectives issued so far: the order DDP needs between a unit's
// backward, its gradient all-reduce and the optimizer. The comm stream is created at the device's
// greatest priority, so collectives are not starved by the compute kernels they overlap.
//
// Errors. A collective that fails while it runs (a dead peer, a network failure) is reported only
// through ncclCommGetAsyncError; the host therefore never waits on communication with a bare
// synchronisation but with wait_polling, which aborts the communicator and ends the job.
// A collective that a peer never joins (a stalled rank) is found by the watchdog of
// parallel/collective_watch.h: a Comm of several ranks brackets each collective with a tracker's
// events, and wait_polling publishes the collective the device waits in.
#pragma once

#include "parallel/collective_watch.h"
#include "platform/platform.h"

#include <nccl.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pv {

enum class CollectiveKind { all_reduce, reduce_scatter, all_gather, broadcast, send, recv };
inline constexpr int kCollectiveKinds = 6;
const char* collective_name(CollectiveKind k);

struct CollectiveRecord {
    CollectiveKind kind;
    size_t count;  // elements: all-reduce/broadcast/send/recv the buffer, reduce-scatter the
                   // output per rank, all-gather the input per rank
    ncclDataType_t dtype;
    int ranks;          // the communicator's size
    std::string comm;   // the communicator's name
    double wire_bytes;  // bytes this rank sends (header comment)
    int peer = -1;      // send/recv: the other rank; collectives: -1
};

size_t nccl_type_size(ncclDataType_t t);

template <class T>
ncclDataType_t nccl_type() {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return ncclBfloat16;
    else if constexpr (std::is_same_v<T, float>)
        return ncclFloat32;
    else if constexpr (std::is_same_v<T, double>)
        return ncclFloat64;
    else if constexpr (std::is_same_v<T, int>)
        return ncclInt32;
    else if constexpr (std::is_same_v<T, long long>)
        return ncclInt64;
    else
        static_assert(sizeof(T) == 0, "no NCCL type for this element type");
}

// Aborts (every rank: MPI_Abort) with the NCCL error and where it happened.
#define NCCL_CHECK(call) ::pv::nccl_check((call), #call, __FILE__, __LINE__)
void nccl_check(ncclResult_t r, const char* what, const char* file, int line);

class Comm {
  public:
    // Wraps `comm` (owned by the caller, which destroys it after the Comm) with a new stream.
    Comm(ncclComm_t comm, std::string name);
    // Wraps `comm` on another Comm's stream (which must outlive this one): collectives of several
    // communicators on one stream run in issue order, the order NCCL requires of communicators
    // that share ranks (hybrid sharding's, parallel/mesh.h), and one fence orders all of them.
    Comm(ncclComm_t comm, std::string name, const Comm& same_stream_as);
    ~Comm();
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    const std::string& name() const { return name_; }
    ncclComm_t nccl() const { return comm_; }
    cudaStream_t stream() const { return stream_; }

    template <class T>
    void all_reduce(const T* send, T* recv, size_t count, ncclRedOp_t op = ncclSum) {
        record(CollectiveKind::all_reduce, count, nccl_type<T>());
        const Tracked tracked(tracking(), CollectiveKind::all_reduce);
        NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type<T>(), op, comm_, stream_));
    }
    // recv[recv_count] = the reduction of block rank() of every rank's send[size()·recv_count].
    template <class T>
    void reduce_scatter(const T* send, T* recv, size_t recv_count, ncclRedOp_t op = ncclSum) {
        record(CollectiveKind::reduce_scatter, recv_count, nccl_type<T>());
        const Tracked tracked(tracking(), CollectiveKind::reduce_scatter);
        NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type<T>(), op, comm_, stream_));
    }
    // recv[size()·send_count] = every rank's send[send_count], in rank order.
    template <class T>
    void all_gather(const T* send, T* recv, size_t send_count) {
        record(CollectiveKind::all_gather, send_count, nccl_type<T>());
        const Tracked tracked(tracking(), CollectiveKind::all_gather);
        NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type<T>(), comm_, stream_));
    }
    template <class T>
    void broadcast(const T* send, T* recv, size_t count, int root) {
        record(CollectiveKind::broadcast, count, nccl_type<T>());
        const Tracked tracked(tracking(), CollectiveKind::broadcast);
        NCCL_CHECK(ncclBroadcast(send, recv, count, nccl_type<T>(), root, comm_, stream_));
    }
    // Point-to-point transfers; between begin_group and end_group they form one NCCL group, posted
    // together and complete together (a pipeline's send and the next receive: parallel/schedule.h).
    template <class T>
    void send(const T* buf, size_t count, int peer) {
        record(CollectiveKind::send, count, nccl_type<T>(), peer);
        const Tracked tracked(grouped_ ? nullptr : tracking(), CollectiveKind::send);
        NCCL_CHECK(ncclSend(buf, count, nccl_type<T>(), peer, comm_, stream_));
    }
    template <class T>
    void recv(T* buf, size_t count, int peer) {
        record(CollectiveKind::recv, count, nccl_type<T>(), peer);
        const Tracked tracked(grouped_ ? nullptr : tracking(), CollectiveKind::recv);
        NCCL_CHECK(ncclRecv(buf, count, nccl_type<T>(), peer, comm_, stream_));
    }
    // The watchdog brackets the whole group (its work is queued at ncclGroupEnd).
    void begin_group();
    void end_group();

    // The comm stream waits for `compute`'s work so far; `compute` waits for the comm stream's.
    void fence_from(cudaStream_t compute);
    void fence_to(cudaStream_t compute);
    // fence_to where `compute` may capture (a CUDA graph): only if the comm stream is part of the
    // same capture (its collectives were captured, so the capture must join it back before it ends)
    // or neither captures (an event recorded outside a capture cannot be waited for inside it).
    void join_to(cudaStream_t compute);
    // Whether the comm stream is capturing a CUDA graph: its calls are recorded, not run, and run at
    // each launch of the graph (trainer/micro_step_graphs.h).
    bool capturing() const;

    // The host waits for the comm stream's work, polling for asynchronous errors (wait_polling).
    void synchronize();
    // Ends the job if the communicator has had an asynchronous error (ncclCommGetAsyncError):
    // aborts it (ncclCommAbort) and stops every rank with a message naming this rank, the
    // communicator and the error.
    void check_async_error();

    // The oldest collective the device has reached and not finished (CollectiveTracker); none on a
    // one-rank communicator.
    std::optional<CollectiveId> arrived_unfinished() {
        return tracker_ ? tracker_->arrived_unfinished() : std::nullopt;
    }

    // The record since construction or the last clear: every call's CollectiveRecord only while
    // keep_records(true) is in force (the tests that read it), so a long `train` run holds no
    // per-call memory; the totals always.
    static void keep_records(bool on);
    const std::vector<CollectiveRecord>& log() const { return log_; }
    struct Totals {
        std::array<long long, kCollectiveKinds> calls{};
        double wire_bytes = 0;
    };
    Totals totals() const { return totals_; }
    void clear_log() { log_.clear(), totals_ = Totals{}; }
    // Collectives (all-reduce, reduce-scatter, all-gather, broadcast; not send/recv, which differ
    // between a pipeline's stages) issued since construction, whatever clear_log did: the
    // trainer's per-step check that every rank runs the same ones (trainer/step_checks.h).
    long long collectives() const { return collectives_; }

    // A CUDA graph's launch runs the collectives it captured again without calling anything here:
    // what they added to the record at the capture (the calls since a mark) is added again at each
    // later launch (repeat), so the figures count every collective that ran.
    struct Mark {
        size_t log = 0;
        Totals totals;
        long long collectives = 0;
    };
    struct Calls {
        std::vector<CollectiveRecord> log;  // (empty unless keep_records)
        Totals totals;
        long long collectives = 0;
    };
    Mark mark() const { return {log_.size(), totals_, collectives_}; }
    Calls calls_since(const Mark& m) const;
    void repeat(const Calls& c);
    // A graph launch on `stream` holding this communicator's captured collectives, bracketed for
    // the stall watchdog as one collective ("captured micro-step"): captured calls are not tracked
    // one by one (a captured event cannot be queried).
    void tracked_launch(cudaStream_t stream, const std::function<void()>& launch);

  private:
    // Brackets one NCCL call for the stall watchdog (CollectiveTracker::before/after).
    struct Tracked {
        Tracked(CollectiveTracker* t, CollectiveKind kind) : tracker(t) {
            if (tracker) tracker->before(collective_name(kind));
        }
        ~Tracked() {
            if (tracker) tracker->after();
        }
        Tracked(const Tracked&) = delete;
        Tracked& operator=(const Tracked&) = delete;
        CollectiveTracker* tracker;
    };
    void record(CollectiveKind kind, size_t count, ncclDataType_t dtype, int peer = -1);
    // The tracker for a call now: none while the stream captures (tracked_launch brackets the launches).
    CollectiveTracker* tracking() const { return tracker_ && !capturing() ? tracker_.get() : nullptr; }
    ncclComm_t comm_;
    std::string name_;
    int rank_ = 0, size_ = 1;
    cudaStream_t stream_ = nullptr;
    bool owns_stream_ = true;
    bool grouped_ = false;  // between begin_group and end_group
    CollectiveTracker* group_tracker_ = nullptr;  // the tracker begin_group bracketed the group with
    cudaEvent_t from_ = nullptr, to_ = nullptr;
    std::vector<CollectiveRecord> log_;
    Totals totals_;
    static std::atomic<bool> keep_records_;
    long long collectives_ = 0;
    std::unique_ptr<CollectiveTracker> tracker_;  // with more than one rank
};

// Makes the host wait until `stream` has finished its work, polling every communicator of `comms`
// meanwhile (Comm::check_async_error). On a GPU a collective whose peer died never completes, so a
// bare cudaStreamSynchronize on work that depends on communication would hang the job forever;
// every such wait in the product goes through here instead, and a failure ends the job with a
// message naming the rank.
void wait_polling(cudaStream_t stream, const std::vector<Comm*>& comms);
// The same for one event (the work recorded before it).
void wait_event_polling(cudaEvent_t event, const std::vector<Comm*>& comms);

}  // namespace pv
