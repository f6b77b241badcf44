// The comm wrapper (see comm.h).
#include "parallel/comm.h"

#include "parallel/world.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace pv {

const char* collective_name(CollectiveKind k) {
    switch (k) {
        case CollectiveKind::all_reduce: return "all-reduce";
        case CollectiveKind::reduce_scatter: return "reduce-scatter";
        case CollectiveKind::all_gather: return "all-gather";
        case CollectiveKind::broadcast: return "broadcast";
        case CollectiveKind::send: return "send";
        case CollectiveKind::recv: return "recv";
    }
    return "?";
}

size_t nccl_type_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8:
        case ncclUint8: return 1;
        case ncclFloat16:
        case ncclBfloat16: return 2;
        case ncclInt32:
        case ncclUint32:
        case ncclFloat32: return 4;
        case ncclInt64:
        case ncclUint64:
        case ncclFloat64: return 8;
        default: return 0;
    }
}

void nccl_check(ncclResult_t r, const char* what, const char* file, int line) {
    if (r == ncclSuccess) return;
    abort_all_ranks(std::string("NCCL error '") + ncclGetErrorString(r) + "' (" + ncclGetLastError(nullptr) + ") in " +
                    what + " at " + file + ":" + std::to_string(line));
}

Comm::Comm(ncclComm_t comm, std::string name) : comm_(comm), name_(std::move(name)) {
    NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    NCCL_CHECK(ncclCommCount(comm_, &size_));
    // The highest priority the device has: a collective's kernels are scheduled ahead of the
    // compute kernels queued beside them, so the communication they overlap is not starved.
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&from_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&to_, cudaEventDisableTiming));
    if (size_ > 1) tracker_ = std::make_unique<CollectiveTracker>(name_, stream_);
}

Comm::Comm(ncclComm_t comm, std::string name, const Comm& same_stream_as)
    : comm_(comm), name_(std::move(name)), stream_(same_stream_as.stream()), owns_stream_(false) {
    NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    NCCL_CHECK(ncclCommCount(comm_, &size_));
    CUDA_CHECK(cudaEventCreateWithFlags(&from_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&to_, cudaEventDisableTiming));
    if (size_ > 1) tracker_ = std::make_unique<CollectiveTracker>(name_, stream_);
}

Comm::~Comm() {
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(from_);
    cudaEventDestroy(to_);
    if (owns_stream_) cudaStreamDestroy(stream_);
}

void Comm::synchronize() { wait_polling(stream_, {this}); }

void Comm::check_async_error() {
    ncclResult_t error = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &error));
    if (error == ncclSuccess || error == ncclInProgress) return;
    ncclCommAbort(comm_);  // stop its kernels; the peers may be gone, so do not wait for them
    abort_all_ranks(std::string("NCCL asynchronous error '") + ncclGetErrorString(error) + "' on communicator '" +
                    name_ + "' (rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                    ") while waiting for the device: a peer rank failed or the network did; the communicator is "
                    "aborted and the job ends (the first failure is in the log of the rank that failed)");
}

namespace {

// Publishes the collective the device waits in, if it waits in one of `comms`'
// (collective_watch.h); true if it does.
bool publish_collective_wait(const std::vector<Comm*>& comms) {
    for (Comm* c : comms)
        if (const std::optional<CollectiveId> id = c->arrived_unfinished()) return publish_device_wait(*id), true;
    publish_no_wait();
    return false;
}

// Polls `query` (cudaStreamQuery or cudaEventQuery) until the work is done, checking the
// communicators for an asynchronous error at every poll. A long wait also publishes, every 64
// polls, the collective the device waits in, for the stall watchdog (collective_watch.h).
template <class Query>
void poll_until_done(Query query, const char* what, const std::vector<Comm*>& comms) {
    bool published = false;
    for (long long polls = 0;; ++polls) {
        const cudaError_t state = query();
        if (state != cudaSuccess && state != cudaErrorNotReady)
            fail_cuda_call(what, cudaGetErrorString(state), __FILE__, __LINE__);
        for (Comm* c : comms) c->check_async_error();  // also after success: the work may have failed
        if (state == cudaSuccess) break;
        if (polls < 1000) {
            std::this_thread::yield();
        } else {
            if (polls % 64 == 0) published = publish_collective_wait(comms) || published;
            std::this_thread::sleep_for(std::chrono::microseconds(50));  // a long wait: leave the core alone
        }
    }
    if (published) publish_no_wait();
}

}  // namespace

void wait_polling(cudaStream_t stream, const std::vector<Comm*>& comms) {
    poll_until_done([&] { return cudaStreamQuery(stream); }, "cudaStreamQuery", comms);
}

void wait_event_polling(cudaEvent_t event, const std::vector<Comm*>& comms) {
    poll_until_done([&] { return cudaEventQuery(event); }, "cudaEventQuery", comms);
}

void Comm::fence_from(cudaStream_t compute) {
    CUDA_CHECK(cudaEventRecord(from_, compute));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, from_, 0));
}

void Comm::fence_to(cudaStream_t compute) {
    CUDA_CHECK(cudaEventRecord(to_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(compute, to_, 0));
}

void Comm::join_to(cudaStream_t compute) {
    cudaStreamCaptureStatus mine = cudaStreamCaptureStatusNone, theirs = cudaStreamCaptureStatusNone;
    unsigned long long my_capture = 0, their_capture = 0;  // (ids only while capturing)
    CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &mine, &my_capture));
    CUDA_CHECK(cudaStreamGetCaptureInfo(compute, &theirs, &their_capture));
    const cudaStreamCaptureStatus none = cudaStreamCaptureStatusNone;
    if ((mine == none) == (theirs == none) && (mine == none || my_capture == their_capture)) fence_to(compute);
}

bool Comm::capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
    return status != cudaStreamCaptureStatusNone;
}

void Comm::begin_group() {
    if (grouped_) throw std::logic_error("Comm::begin_group: a group is already open on " + name_);
    grouped_ = true;
    group_tracker_ = tracking();
    if (group_tracker_) group_tracker_->before("send/recv group");
    NCCL_CHECK(ncclGroupStart());
}

void Comm::end_group() {
    if (!grouped_) throw std::logic_error("Comm::end_group without begin_group on " + name_);
    NCCL_CHECK(ncclGroupEnd());
    if (group_tracker_) group_tracker_->after();
    grouped_ = false, group_tracker_ = nullptr;
}

Comm::Calls Comm::calls_since(const Mark& m) const {
    Calls c;
    if (m.log <= log_.size()) c.log.assign(log_.begin() + long(m.log), log_.end());
    for (size_t k = 0; k < c.totals.calls.size(); ++k) c.totals.calls[k] = totals_.calls[k] - m.totals.calls[k];
    c.totals.wire_bytes = totals_.wire_bytes - m.totals.wire_bytes;
    c.collectives = collectives_ - m.collectives;
    return c;
}

void Comm::repeat(const Calls& c) {
    if (keep_records_) log_.insert(log_.end(), c.log.begin(), c.log.end());
    for (size_t k = 0; k < c.totals.calls.size(); ++k) totals_.calls[k] += c.totals.calls[k];
    totals_.wire_bytes += c.totals.wire_bytes;
    collectives_ += c.collectives;
}

void Comm::tracked_launch(cudaStream_t stream, const std::function<void()>& launch) {
    if (tracker_) tracker_->before("captured micro-step", stream);
    launch();
    if (tracker_) tracker_->after(stream);
}

void Comm::record(CollectiveKind kind, size_t count, ncclDataType_t dtype, int peer) {
    const double n = size_, bytes = double(count) * double(nccl_type_size(dtype));
    double wire = 0;
    switch (kind) {
        case CollectiveKind::all_reduce: wire = 2.0 * (n - 1) / n * bytes; break;
        case CollectiveKind::reduce_scatter:
        case CollectiveKind::all_gather: wire = (n - 1) * bytes; break;
        case CollectiveKind::broadcast: wire = (n - 1) / n * bytes; break;
        case CollectiveKind::send: wire = bytes; break;
        case CollectiveKind::recv: wire = 0; break;
    }
    ++totals_.calls[size_t(kind)];
    totals_.wire_bytes += wire;
    if (keep_records_) log_.push_back(CollectiveRecord{kind, count, dtype, size_, name_, wire, peer});
    if (kind != CollectiveKind::send && kind != CollectiveKind::recv) ++collectives_;
}

std::atomic<bool> Comm::keep_records_{false};

void Comm::keep_records(bool on) { keep_records_ = on; }

}  // namespace pv
