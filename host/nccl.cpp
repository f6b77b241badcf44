// NCCL on the host: the NCCL calls polevault uses, with nccl.h's own signatures, implemented on MPI
// with one process per rank (mpirun -np N). The product calls NCCL exactly as on GPUs; on the
// CUDA backend the real libnccl is linked instead of this file.
//
// Nothing here runs at load time: a program that never calls NCCL never touches MPI.
//
// Communicators
//   ncclGetUniqueId   128 bytes: a magic string and 128 random bits. The product broadcasts rank 0's
//                     id over MPI before ncclCommInitRank, as llm.c does.
//   ncclCommInitRank  nranks == 1: a communicator of this process alone, no MPI at all (a one-rank
//                     reference). nranks > 1: collective over MPI_COMM_WORLD — every world rank must
//                     call it at the same time with nranks > 1. The ranks exchange (id, nranks, rank)
//                     with an all-gather, group themselves by id (so several ids may partition the
//                     world) and MPI_Comm_split with key = rank, so MPI rank == NCCL rank. Every rank
//                     checks every group (size == nranks, ranks 0..nranks-1 each once) on the same
//                     table, so a bad call fails with ncclInvalidUsage on every rank instead of
//                     hanging. A subset of the world cannot create a communicator alone (MPI has no
//                     way to find the others): split a larger communicator with ncclCommSplit.
//   ncclCommSplit     MPI_Comm_split of the parent (collective over the parent); NCCL_SPLIT_NOCOLOR
//                     gives NULL; ranks are ordered by key, ties by parent rank (NCCL's rule and MPI's).
//   ncclCommDestroy   waits for queued work (as NCCL does), then frees the MPI communicators.
//   ncclCommGetAsyncError / ncclCommAbort   a failure while collectives run (injected for tests:
//                     POLEVAULT_HOST_NCCL_ASYNC_ERROR, see injected_failure) and giving up on a
//                     communicator without waiting for its peers.
// Each communicator owns two MPI communicators: one for collectives, whose messages carry a tag
// made from the communicator's collective sequence number, and one for ncclSend/ncclRecv (tag 0),
// so a send can never match a collective's message, whatever is in flight.
//
// Collectives (explicit messages and local loops; never MPI_Reduce/MPI_Allreduce with an op)
//   all-reduce       the count is cut into N near-equal chunks [count·j/N, count·(j+1)/N); each rank
//                    receives chunk r of every rank's input, reduces it in rank order 0..N-1
//                    (host/nccl_reduce.h), then the reduced chunks are all-gathered. Each output
//                    element is computed by exactly one rank, so all ranks get identical bits
//                    whatever MPI's transport does.
//   reduce-scatter   rank r receives block r of every rank's input and reduces it in rank order.
//   all-gather, broadcast   plain copies.
//   In-place forms follow NCCL: all-reduce sendbuff == recvbuff; reduce-scatter recvbuff ==
//   sendbuff + rank·recvcount; all-gather sendbuff == recvbuff + rank·sendcount; broadcast
//   sendbuff == recvbuff. Any other overlap is refused (ncclInvalidArgument), as are host pointers
//   and buffers that do not fit their cudaMalloc allocation (the runtime's memory registry).
//   Types: fp64, fp32, bf16, fp16, int8/uint8, int32/uint32, int64/uint64; ops: sum, prod, max,
//   min, avg (NCCL's order); fp8 and ncclRedOpCreatePreMulSum ops are refused.
//
// Streams. A call (or a whole group, below) is one piece of stream work (host/stream.h), run inside
// DeviceMemoryAccess, so it orders with kernels and copies and runs later in the deferred mode.
// As NCCL does, the operations of a communicator run in issue order whatever their streams: each
// call's work waits (through an event) for the NCCL work issued before it in this process — here
// for every communicator, not only the same one, which is stronger than NCCL (see below).
//
// Groups. ncclGroupStart/End nest (a depth per host thread). At the outermost ncclGroupEnd the
// group's calls become ONE piece of stream work, on the stream of the first call; the group's other
// streams are joined to it by events before and after, as NCCL joins them. The work posts every
// send and receive as MPI_Isend/MPI_Irecv, runs the group's collectives in issue order, then waits
// for all point-to-point requests: a ring of send/recv pairs in one group cannot deadlock, and
// sends to one peer keep their order. Sends and receives to oneself are paired locally, in order,
// and must be matched within the group. If a call inside a group fails its checks, ncclGroupEnd
// returns that error and runs nothing.
//
// Graphs. A call on a capturing stream (host/graph.h) becomes a node of the graph, as NCCL's
// kernels do on a GPU, and runs at each launch: a collective's MPI tags are numbered when it runs,
// not at the call, so every launch's messages are new ones. Within the capture the calls are
// chained in issue order; the capture is marked as holding ordered work, so each launch of its
// graph is put in the process's order (after the NCCL work issued before the launch, before the
// work issued after it). A failure inside a launch cannot be returned: it aborts the job, as in
// the deferred mode.
//
// Deferred-mode safety (POLEVAULT_HOST_STREAMS=deferred). Queued work runs when the host
// synchronises, and a collective blocks until its peers run theirs. That cannot deadlock if:
//   1. ranks issue the collectives of a communicator in the same order (NCCL's own rule);
//   2. every rank eventually synchronises its streams;
//   3. a rank never blocks in a host-side MPI call (MPI_Barrier, MPI_Bcast, ...) while NCCL work is
//      queued: on a GPU that work would progress meanwhile, here it waits for a synchronisation.
//      Call cudaDeviceSynchronize (or synchronise the streams carrying NCCL work) first. This
//      file's own blocking calls (ncclCommInitRank, ncclCommSplit, ncclCommDestroy) do so.
// Because every rank's NCCL work runs in its issue order (the event chain above), a rank's
// executor can never run a later collective before an earlier one: the deferred mode runs NCCL
// work in the same order as the sync mode, so it deadlocks only where the sync mode would. The
// chain spans communicators, so two communicators used concurrently from different streams work
// here even where a GPU would need them ordered (NCCL's documented rule); that rule is not checked.
//
// Errors return NCCL's codes with a message on stderr, which ncclGetLastError also returns:
// bad arguments ncclInvalidArgument, misuse ncclInvalidUsage, MPI failures ncclSystemError. A
// failure inside stream work that runs later (the deferred mode) cannot be returned to anyone and
// peers would wait for it forever: it prints its message and calls MPI_Abort.
#include "host/graph.h"
#include "host/nccl_reduce.h"
#include "host/stream.h"

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

struct ncclComm {
    int rank = 0;
    int nranks = 1;
    int device = 0;
    MPI_Comm collectives = MPI_COMM_NULL;     // NULL for a one-rank communicator without MPI
    MPI_Comm point_to_point = MPI_COMM_NULL;  // ncclSend/ncclRecv
    int max_tag = 32767;                      // MPI_TAG_UB of `collectives` (MPI guarantees ≥ 32767)
    std::atomic<unsigned long long> collectives_run{0};  // numbers the collectives' MPI tags as they run
    std::atomic<int> async_error{ncclSuccess};  // ncclCommGetAsyncError; set by a failed collective
    std::atomic<bool> aborted{false};           // ncclCommAbort
};

namespace pv::host::nccl {
namespace {

// ---- errors ----------------------------------------------------------------------------------
std::mutex error_mutex;
char last_error[1024] = "";
constexpr char kPrefix[] = "polevault host NCCL: ";

[[gnu::format(printf, 2, 3)]] ncclResult_t fail(ncclResult_t code, const char* format, ...) {
    char message[sizeof last_error - 32];
    va_list args;
    va_start(args, format);
    std::vsnprintf(message, sizeof message, format, args);
    va_end(args);
    std::lock_guard lock(error_mutex);
    std::snprintf(last_error, sizeof last_error, "%s%s", kPrefix, message);
    std::fprintf(stderr, "%s\n", last_error);
    std::fflush(stderr);
    return code;
}

ncclResult_t mpi_failure(int code, const char* call) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int length = 0;
    MPI_Error_string(code, text, &length);
    return fail(ncclSystemError, "%s failed: %s", call, text);
}

#define PV_MPI_TRY(call)                                                      \
    do {                                                                      \
        const int pv_mpi_rc_ = (call);                                        \
        if (pv_mpi_rc_ != MPI_SUCCESS) return mpi_failure(pv_mpi_rc_, #call); \
    } while (0)

#define PV_NCCL_TRY(expr)                                   \
    do {                                                    \
        const ncclResult_t pv_nccl_rc_ = (expr);            \
        if (pv_nccl_rc_ != ncclSuccess) return pv_nccl_rc_; \
    } while (0)

bool mpi_usable() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
}

ncclResult_t require_mpi(const char* call) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized)
        return fail(ncclInvalidUsage,
                    "%s needs MPI: call MPI_Init (or MPI_Init_thread) first; the host NCCL runs one process per "
                    "rank on MPI (mpirun -np N)",
                    call);
    if (finalized) return fail(ncclInvalidUsage, "%s after MPI_Finalize", call);
    return ncclSuccess;
}

// Ends the job: for failures that no caller can be told about (inside deferred stream work).
[[noreturn]] void abort_job() {
    std::fflush(stdout);
    std::fflush(stderr);
    if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
}

// ---- communicators ---------------------------------------------------------------------------
std::mutex comms_mutex;
std::set<const ncclComm*> live_comms;

ncclResult_t check_comm(const ncclComm* comm, const char* call) {
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", call);
    std::lock_guard lock(comms_mutex);
    if (!live_comms.count(comm))
        return fail(ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed, or never created)", call,
                    static_cast<const void*>(comm));
    return ncclSuccess;
}

// A communicator over `collectives` (and a duplicate of it for send/recv); MPI_COMM_NULL makes a
// one-rank communicator without MPI.
ncclResult_t make_comm(ncclComm** out, MPI_Comm collectives, int rank, int nranks, int device) {
    auto comm = std::make_unique<ncclComm>();
    comm->rank = rank;
    comm->nranks = nranks;
    comm->device = device;
    if (collectives != MPI_COMM_NULL) {
        comm->collectives = collectives;
        PV_MPI_TRY(MPI_Comm_set_errhandler(collectives, MPI_ERRORS_RETURN));
        PV_MPI_TRY(MPI_Comm_dup(collectives, &comm->point_to_point));
        PV_MPI_TRY(MPI_Comm_set_errhandler(comm->point_to_point, MPI_ERRORS_RETURN));
        int mpi_rank = -1, mpi_size = 0;
        PV_MPI_TRY(MPI_Comm_rank(collectives, &mpi_rank));
        PV_MPI_TRY(MPI_Comm_size(collectives, &mpi_size));
        if (mpi_rank != rank || mpi_size != nranks)
            return fail(ncclInternalError, "communicator built with MPI rank %d of %d for NCCL rank %d of %d", mpi_rank,
                        mpi_size, rank, nranks);
        int* tag_ub = nullptr;
        int found = 0;
        PV_MPI_TRY(MPI_Comm_get_attr(collectives, MPI_TAG_UB, &tag_ub, &found));
        if (found && tag_ub && *tag_ub > comm->max_tag) comm->max_tag = *tag_ub;
    }
    std::lock_guard lock(comms_mutex);
    live_comms.insert(comm.get());
    *out = comm.release();
    return ncclSuccess;
}

constexpr char kIdMagic[] = "polevault host NCCL unique id";

bool id_is_ours(const ncclUniqueId& id) { return std::memcmp(id.internal, kIdMagic, sizeof kIdMagic) == 0; }

// Waits for a nonblocking world-wide call; if it takes long, says what the usual cause is.
ncclResult_t wait_for_world(MPI_Request* request, const char* call) {
    const auto start = std::chrono::steady_clock::now();
    bool hinted = false;
    for (;;) {
        int done = 0;
        PV_MPI_TRY(MPI_Test(request, &done, MPI_STATUS_IGNORE));
        if (done) return ncclSuccess;
        if (!hinted && std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
            std::fprintf(stderr,
                         "polevault host NCCL: %s has waited 30 s for the other ranks of MPI_COMM_WORLD: every world "
                         "rank must call it at the same time (with nranks > 1)\n",
                         call);
            hinted = true;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

// ---- buffers -----------------------------------------------------------------------------------
ncclResult_t check_buffer(const char* call, const char* name, const void* p, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
    if (!p) return fail(ncclInvalidArgument, "%s: %s is NULL (%zu bytes needed)", call, name, bytes);
    if (is_device_range(p, bytes)) return ncclSuccess;
    if (is_device_range(p, 1))
        return fail(ncclInvalidArgument,
                    "%s: %s (%p) + %zu bytes runs past the end of its cudaMalloc allocation; check the count and type",
                    call, name, p, bytes);
    return fail(ncclInvalidArgument,
                "%s: %s (%p) is not device memory (a host pointer?); NCCL buffers come from cudaMalloc", call, name, p);
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    if (a_bytes == 0 || b_bytes == 0) return false;
    const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

ncclResult_t check_type(const char* call, ncclDataType_t type) {
    if (element_size(type) == 0)
        return fail(ncclInvalidArgument, "%s: datatype %s (%d) is not supported by the host NCCL", call,
                    type_name(type), int(type));
    return ncclSuccess;
}

ncclResult_t check_op(const char* call, ncclRedOp_t op) {
    if (!op_supported(op))
        return fail(
            ncclInvalidArgument,
            "%s: reduction op %d is not supported by the host NCCL (ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg)",
            call, int(op));
    return ncclSuccess;
}

// count · element size · factor in bytes, refusing overflow.
ncclResult_t bytes_of(const char* call, size_t count, ncclDataType_t type, size_t factor, size_t* bytes) {
    const size_t es = element_size(type);
    if (factor != 0 && count > SIZE_MAX / es / factor)
        return fail(ncclInvalidArgument, "%s: count %zu is too large", call, count);
    *bytes = count * es * factor;
    return ncclSuccess;
}

// ---- operations --------------------------------------------------------------------------------
enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast, send, recv };

struct Op {
    const char* name = "";
    Kind kind = Kind::all_reduce;
    ncclComm* comm = nullptr;
    cudaStream_t stream = nullptr;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;  // all-reduce: count; reduce-scatter: recvcount; all-gather: sendcount
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t op = ncclSum;
    int peer = 0;  // send/recv: the peer; broadcast: the root
    int tag = 0;   // collectives: two tags, tag and tag + 1, from the sequence number
};

bool is_point_to_point(const Op& op) { return op.kind == Kind::send || op.kind == Kind::recv; }

// The MPI requests of one collective phase or of a group's sends and receives. Messages longer
// than 1 GiB go in pieces (MPI counts are int); the receiver cuts the same pieces. Every transfer
// posts at least one (maybe empty) message, so ranks that disagree on a count get an error that
// says so instead of a hang.
class Transfers {
  public:
    explicit Transfers(const char* call) : call_(call) {}

    ncclResult_t send(const void* buffer, size_t bytes, int peer, int tag, MPI_Comm comm) {
        const auto* p = static_cast<const unsigned char*>(buffer);
        size_t offset = 0;
        do {
            const int n = int(std::min(kPiece, bytes - offset));
            requests_.emplace_back();
            expected_.push_back(kSend);
            peers_.push_back(peer);
            PV_MPI_TRY(MPI_Isend(p + offset, n, MPI_BYTE, peer, tag, comm, &requests_.back()));
            offset += size_t(n);
        } while (offset < bytes);
        return ncclSuccess;
    }

    ncclResult_t recv(void* buffer, size_t bytes, int peer, int tag, MPI_Comm comm) {
        auto* p = static_cast<unsigned char*>(buffer);
        size_t offset = 0;
        do {
            const int n = int(std::min(kPiece, bytes - offset));
            requests_.emplace_back();
            expected_.push_back(size_t(n));
            peers_.push_back(peer);
            PV_MPI_TRY(MPI_Irecv(p + offset, n, MPI_BYTE, peer, tag, comm, &requests_.back()));
            offset += size_t(n);
        } while (offset < bytes);
        return ncclSuccess;
    }

    // Waits for every request; a received size that differs from the expected one is an error.
    ncclResult_t wait() {
        if (requests_.empty()) return ncclSuccess;
        std::vector<MPI_Status> statuses(requests_.size());
        const int rc = MPI_Waitall(int(requests_.size()), requests_.data(), statuses.data());
        for (size_t i = 0; i < requests_.size(); ++i) {
            if (rc == MPI_ERR_IN_STATUS && statuses[i].MPI_ERROR != MPI_SUCCESS &&
                statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
                if (statuses[i].MPI_ERROR == MPI_ERR_TRUNCATE)
                    return fail(ncclInvalidUsage,
                                "%s: rank %d sent more bytes than this rank expects: the ranks disagree on the count "
                                "or datatype",
                                call_, peers_[i]);
                return mpi_failure(statuses[i].MPI_ERROR, call_);
            }
            if (expected_[i] == kSend || rc != MPI_SUCCESS) continue;
            int got = 0;
            MPI_Get_count(&statuses[i], MPI_BYTE, &got);
            if (size_t(got) != expected_[i])
                return fail(ncclInvalidUsage,
                            "%s: received %d bytes from rank %d where %zu were expected: the ranks disagree on the "
                            "count or datatype",
                            call_, got, peers_[i], expected_[i]);
        }
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) return mpi_failure(rc, call_);
        requests_.clear();
        expected_.clear();
        peers_.clear();
        return ncclSuccess;
    }

  private:
    static constexpr size_t kPiece = size_t(1) << 30;
    static constexpr size_t kSend = SIZE_MAX;
    const char* call_;
    std::vector<MPI_Request> requests_;
    std::vector<size_t> expected_;  // bytes per receive request; kSend for sends
    std::vector<int> peers_;        // per request
};

// Chunk j of an all-reduce of `count` elements over n ranks: [chunk_start(j), chunk_start(j + 1)).
size_t chunk_start(size_t count, int j, int n) {
    return size_t(static_cast<unsigned __int128>(count) * unsigned(j) / unsigned(n));
}

ncclResult_t run_collective(const Op& op) {
    const ncclComm& c = *op.comm;
    const int n = c.nranks, r = c.rank;
    const size_t es = element_size(op.type);
    const auto* send = static_cast<const unsigned char*>(op.send);
    auto* recv = static_cast<unsigned char*>(op.recv);
    Transfers t(op.name);
    switch (op.kind) {
        case Kind::all_reduce: {
            // Reduce-scatter of n chunks (rank j reduces chunk j in rank order), then all-gather.
            const size_t mine_start = chunk_start(op.count, r, n);
            const size_t mine = chunk_start(op.count, r + 1, n) - mine_start;
            std::vector<unsigned char> staging(size_t(n) * mine * es);
            std::vector<const void*> inputs(static_cast<size_t>(n));
            for (int j = 0; j < n; ++j) {
                if (j == r) {
                    inputs[size_t(j)] = send + mine_start * es;
                    continue;
                }
                inputs[size_t(j)] = staging.data() + size_t(j) * mine * es;
                PV_NCCL_TRY(t.recv(staging.data() + size_t(j) * mine * es, mine * es, j, op.tag, c.collectives));
                const size_t start = chunk_start(op.count, j, n), end = chunk_start(op.count, j + 1, n);
                PV_NCCL_TRY(t.send(send + start * es, (end - start) * es, j, op.tag, c.collectives));
            }
            PV_NCCL_TRY(t.wait());
            reduce_in_rank_order(inputs.data(), n, mine, op.type, op.op, recv + mine_start * es);
            for (int j = 0; j < n; ++j) {
                if (j == r) continue;
                const size_t start = chunk_start(op.count, j, n), end = chunk_start(op.count, j + 1, n);
                PV_NCCL_TRY(t.recv(recv + start * es, (end - start) * es, j, op.tag + 1, c.collectives));
                PV_NCCL_TRY(t.send(recv + mine_start * es, mine * es, j, op.tag + 1, c.collectives));
            }
            return t.wait();
        }
        case Kind::reduce_scatter: {
            const size_t block = op.count * es;
            std::vector<unsigned char> staging(size_t(n) * block);
            std::vector<const void*> inputs(static_cast<size_t>(n));
            for (int j = 0; j < n; ++j) {
                if (j == r) {
                    inputs[size_t(j)] = send + size_t(r) * block;
                    continue;
                }
                inputs[size_t(j)] = staging.data() + size_t(j) * block;
                PV_NCCL_TRY(t.recv(staging.data() + size_t(j) * block, block, j, op.tag, c.collectives));
                PV_NCCL_TRY(t.send(send + size_t(j) * block, block, j, op.tag, c.collectives));
            }
            PV_NCCL_TRY(t.wait());
            reduce_in_rank_order(inputs.data(), n, op.count, op.type, op.op, recv);
            return ncclSuccess;
        }
        case Kind::all_gather: {
            const size_t block = op.count * es;
            if (send != recv + size_t(r) * block && block) std::memcpy(recv + size_t(r) * block, send, block);
            for (int j = 0; j < n; ++j) {
                if (j == r) continue;
                PV_NCCL_TRY(t.recv(recv + size_t(j) * block, block, j, op.tag, c.collectives));
                PV_NCCL_TRY(t.send(send, block, j, op.tag, c.collectives));
            }
            return t.wait();
        }
        case Kind::broadcast: {
            const size_t bytes = op.count * es;
            if (r == op.peer) {
                if (send != recv && bytes) std::memcpy(recv, send, bytes);
                for (int j = 0; j < n; ++j)
                    if (j != r) PV_NCCL_TRY(t.send(send, bytes, j, op.tag, c.collectives));
            } else {
                PV_NCCL_TRY(t.recv(recv, bytes, op.peer, op.tag, c.collectives));
            }
            return t.wait();
        }
        default: return fail(ncclInternalError, "%s: not a collective", op.name);
    }
}

// The k-th send to oneself pairs with the k-th receive from oneself, per communicator.
struct SelfPair {
    const Op* send;
    const Op* recv;
};

ncclResult_t pair_self_transfers(const std::vector<Op>& ops, std::vector<SelfPair>* pairs) {
    std::vector<const ncclComm*> comms;
    for (const Op& op : ops)
        if (is_point_to_point(op) && op.peer == op.comm->rank &&
            std::find(comms.begin(), comms.end(), op.comm) == comms.end())
            comms.push_back(op.comm);
    for (const ncclComm* comm : comms) {
        std::vector<const Op*> sends, recvs;
        for (const Op& op : ops)
            if (op.comm == comm && is_point_to_point(op) && op.peer == comm->rank)
                (op.kind == Kind::send ? sends : recvs).push_back(&op);
        if (sends.size() != recvs.size())
            return fail(ncclInvalidUsage,
                        "%zu ncclSend and %zu ncclRecv to and from this rank itself (rank %d): each send to oneself "
                        "needs a matching receive in the same group",
                        sends.size(), recvs.size(), comm->rank);
        for (size_t k = 0; k < sends.size(); ++k) {
            const size_t send_bytes = sends[k]->count * element_size(sends[k]->type);
            const size_t recv_bytes = recvs[k]->count * element_size(recvs[k]->type);
            if (send_bytes != recv_bytes)
                return fail(ncclInvalidUsage, "a send of %zu bytes to oneself meets a receive of %zu bytes", send_bytes,
                            recv_bytes);
            pairs->push_back({sends[k], recvs[k]});
        }
    }
    return ncclSuccess;
}

// The stream work of one call or group: post every send and receive, run the collectives in issue
// order (MPI progresses the posted transfers meanwhile), then wait for the transfers.
ncclResult_t execute(const std::vector<Op>& ops, const std::vector<SelfPair>& self_pairs) {
    for (const SelfPair& p : self_pairs)
        std::memmove(p.recv->recv, p.send->send, p.send->count * element_size(p.send->type));
    Transfers p2p(ops.size() == 1 ? ops[0].name : "ncclGroupEnd");
    for (const Op& op : ops) {
        if (!is_point_to_point(op) || op.peer == op.comm->rank) continue;
        const size_t bytes = op.count * element_size(op.type);
        if (op.kind == Kind::send)
            PV_NCCL_TRY(p2p.send(op.send, bytes, op.peer, 0, op.comm->point_to_point));
        else
            PV_NCCL_TRY(p2p.recv(op.recv, bytes, op.peer, 0, op.comm->point_to_point));
    }
    for (Op op : ops)
        if (!is_point_to_point(op)) {
            // Two tags per collective (all-reduce has two phases), numbered as the communicator's
            // collectives run (every rank runs them in the same order), cycling below MPI_TAG_UB:
            // numbered at the call, a captured graph's launches would repeat its capture's tags.
            const unsigned long long slots = (unsigned long long)(op.comm->max_tag) / 2 + 1;
            op.tag = int((op.comm->collectives_run++ % slots) * 2);
            PV_NCCL_TRY(run_collective(op));
        }
    return p2p.wait();
}

// Orders NCCL work in issue order across streams: every piece waits for a chain event, which
// records the end of the piece before it, and is recorded again after it. Outside a capture the
// chain is the process's; inside one it is the capture's own (an event recorded outside a capture
// cannot be waited for inside it), which orders the graph's collectives among themselves, and
// every launch of that graph joins the process's chain (order_graph_launch), so a graph's
// collectives run after the NCCL work issued before its launch and before the work issued after.
std::mutex launch_mutex;
cudaEvent_t previous_launch = nullptr;                                   // guarded by launch_mutex
std::vector<std::pair<unsigned long long, cudaEvent_t>> capture_chains;  // per active capture; guarded too

ncclResult_t check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) return fail(ncclUnhandledCudaError, "%s failed: %s", what, cudaGetErrorString(e));
    return ncclSuccess;
}

// The chain event for work on `stream` (under launch_mutex); forgets the chains of ended captures.
ncclResult_t chain_for(cudaStream_t stream, cudaEvent_t** chain) {
    const unsigned long long capture = capture_id(stream);
    std::erase_if(capture_chains, [&](const auto& c) {
        const bool ended = c.first != capture && !capture_is_active(c.first);
        if (ended) cudaEventDestroy(c.second);
        return ended;
    });
    cudaEvent_t* e = &previous_launch;
    if (capture) {
        auto it = std::find_if(capture_chains.begin(), capture_chains.end(),
                               [&](const auto& c) { return c.first == capture; });
        if (it == capture_chains.end()) it = capture_chains.insert(capture_chains.end(), {capture, nullptr});
        e = &it->second;
    }
    if (!*e) PV_NCCL_TRY(check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
    *chain = e;
    return ncclSuccess;
}

// Submits `submit`'s work on `primary` in the chain (under launch_mutex): after the NCCL work
// issued before it, with the `others` streams joined to `primary` before and after, as NCCL
// joins a group's streams.
ncclResult_t submit_in_order(cudaStream_t primary, const std::vector<cudaStream_t>& others,
                             const std::function<cudaError_t()>& submit) {
    cudaEvent_t* chain = nullptr;
    PV_NCCL_TRY(chain_for(primary, &chain));
    PV_NCCL_TRY(check_cuda(cudaStreamWaitEvent(primary, *chain, 0), "cudaStreamWaitEvent"));
    for (cudaStream_t other : others) {  // the group's other streams join the primary ...
        cudaEvent_t joined = nullptr;
        PV_NCCL_TRY(check_cuda(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
        PV_NCCL_TRY(check_cuda(cudaEventRecord(joined, other), "cudaEventRecord"));
        PV_NCCL_TRY(check_cuda(cudaStreamWaitEvent(primary, joined, 0), "cudaStreamWaitEvent"));
        PV_NCCL_TRY(check_cuda(cudaEventDestroy(joined), "cudaEventDestroy"));
    }
    PV_NCCL_TRY(check_cuda(submit(), "the collective's stream work"));
    PV_NCCL_TRY(check_cuda(cudaEventRecord(*chain, primary), "cudaEventRecord"));
    for (cudaStream_t other : others)  // ... and wait for the group's end
        PV_NCCL_TRY(check_cuda(cudaStreamWaitEvent(other, *chain, 0), "cudaStreamWaitEvent"));
    return ncclSuccess;
}

// A graph holding NCCL work is launched through this (host/graph.h OrderedSubmit).
cudaError_t order_graph_launch(cudaStream_t stream, const std::function<cudaError_t()>& submit) {
    std::lock_guard lock(launch_mutex);
    return submit_in_order(stream, {}, submit) == ncclSuccess ? cudaSuccess : cudaErrorUnknown;
}

// Asynchronous errors. A GPU's NCCL reports a failure that happens while its kernels run (a peer
// died, the network failed) through ncclCommGetAsyncError, while the stream simply never
// finishes. Here MPI would block the same way, so the failure is injected for tests:
// POLEVAULT_HOST_NCCL_ASYNC_ERROR=R:K makes the K-th (0-based) piece of NCCL stream work that
// runs on world rank R fail with ncclRemoteError instead of running: its communicators report the
// error, their later work is skipped (a broken communicator moves no data), and the peers wait in
// MPI for data that never comes — until the product, polling, aborts the job.
bool injected_failure() {
    static const std::pair<int, long long> target = [] {
        std::pair<int, long long> t{-1, -1};
        if (const char* v = std::getenv("POLEVAULT_HOST_NCCL_ASYNC_ERROR"))
            if (std::sscanf(v, "%d:%lld", &t.first, &t.second) != 2) {
                std::fprintf(stderr, "polevault host NCCL: POLEVAULT_HOST_NCCL_ASYNC_ERROR=%s; use RANK:INDEX\n", v);
                std::exit(2);
            }
        return t;
    }();
    if (target.first < 0) return false;
    static std::atomic<long long> ran{0};
    const long long index = ran.fetch_add(1);
    int rank = 0;
    if (mpi_usable()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank == target.first && index == target.second;
}

// Runs a call or group unless a communicator of it has failed or been aborted.
ncclResult_t execute_unless_broken(const std::vector<Op>& ops, const std::vector<SelfPair>& self_pairs) {
    bool broken = injected_failure();
    for (const Op& op : ops) broken = broken || op.comm->async_error != ncclSuccess || op.comm->aborted;
    if (!broken) return execute(ops, self_pairs);
    for (const Op& op : ops) {
        int expected = ncclSuccess;
        op.comm->async_error.compare_exchange_strong(expected, ncclRemoteError);
    }
    return ncclSuccess;  // asynchronous: reported by ncclCommGetAsyncError, not by the call
}

// Submits a call or group as one piece of stream work. Work that runs later — in the deferred
// mode, or in a captured graph's launches — cannot return its failure to the caller.
ncclResult_t launch(std::vector<Op> ops) {
    if (ops.empty()) return ncclSuccess;
    std::vector<SelfPair> self_pairs;
    PV_NCCL_TRY(pair_self_transfers(ops, &self_pairs));
    std::vector<cudaStream_t> streams;
    for (const Op& op : ops)
        if (std::find(streams.begin(), streams.end(), op.stream) == streams.end()) streams.push_back(op.stream);
    for (cudaStream_t s : streams)
        if (!stream_is_valid(s))
            return fail(ncclInvalidArgument, "a stream of the group (%p) is no longer live", static_cast<void*>(s));

    std::lock_guard lock(launch_mutex);
    const cudaStream_t primary = streams[0];
    const bool captured = capture_id(primary) != 0;
    if (captured) order_capture_launches(primary, order_graph_launch);
    const bool later = streams_are_deferred() || captured;
    auto status = std::make_shared<ncclResult_t>(ncclSuccess);
    const auto submit = [&] {
        return stream_submit(primary, [ops = std::move(ops), self_pairs = std::move(self_pairs), status, later] {
            *status = execute_unless_broken(ops, self_pairs);
            if (*status != ncclSuccess && later) {
                std::fprintf(stderr,
                             "polevault host NCCL: %s failed inside stream work that ran after the call (deferred "
                             "streams or a graph's launch), where no caller can be told; aborting the MPI job\n",
                             ops.size() == 1 ? ops[0].name : "a group");
                abort_job();
            }
        });
    };
    PV_NCCL_TRY(submit_in_order(primary, std::vector<cudaStream_t>(streams.begin() + 1, streams.end()), submit));
    return *status;  // always ncclSuccess when the work runs later
}

// ---- groups ------------------------------------------------------------------------------------
struct Group {
    int depth = 0;
    std::vector<Op> ops;
    ncclResult_t error = ncclSuccess;  // the first failed call inside the group
    std::string error_message;
};
thread_local Group group;

// Inside a group, remembers the first failure (ncclGroupEnd reports it and runs nothing).
ncclResult_t note_failure(ncclResult_t result) {
    if (result != ncclSuccess && group.depth > 0 && group.error == ncclSuccess) {
        group.error = result;
        std::lock_guard lock(error_mutex);
        group.error_message = last_error + std::strlen(kPrefix);
    }
    return result;
}

ncclResult_t issue(Op op) {
    if (group.depth > 0) {
        group.ops.push_back(op);
        return ncclSuccess;
    }
    return launch({op});
}

ncclResult_t check_call(const char* call, const ncclComm* comm, cudaStream_t stream) {
    PV_NCCL_TRY(check_comm(comm, call));
    if (!stream_is_valid(stream))
        return fail(ncclInvalidArgument, "%s: stream %p is not a live cudaStream_t", call, static_cast<void*>(stream));
    return ncclSuccess;
}

ncclResult_t check_root(const char* call, const char* what, int root, const ncclComm* comm) {
    if (root < 0 || root >= comm->nranks)
        return fail(ncclInvalidArgument, "%s: %s %d is not a rank of this communicator (0..%d)", call, what, root,
                    comm->nranks - 1);
    return ncclSuccess;
}

ncclResult_t all_reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        ncclComm* comm, cudaStream_t stream) {
    const char* call = "ncclAllReduce";
    PV_NCCL_TRY(check_call(call, comm, stream));
    PV_NCCL_TRY(check_type(call, type));
    PV_NCCL_TRY(check_op(call, op));
    size_t bytes = 0;
    PV_NCCL_TRY(bytes_of(call, count, type, 1, &bytes));
    PV_NCCL_TRY(check_buffer(call, "sendbuff", sendbuff, bytes));
    PV_NCCL_TRY(check_buffer(call, "recvbuff", recvbuff, bytes));
    if (sendbuff != recvbuff && overlap(sendbuff, bytes, recvbuff, bytes))
        return fail(ncclInvalidArgument, "%s: sendbuff and recvbuff overlap without being equal (the in-place form)",
                    call);
    return issue({call, Kind::all_reduce, comm, stream, sendbuff, recvbuff, count, type, op, 0, 0});
}

ncclResult_t reduce_scatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                            ncclComm* comm, cudaStream_t stream) {
    const char* call = "ncclReduceScatter";
    PV_NCCL_TRY(check_call(call, comm, stream));
    PV_NCCL_TRY(check_type(call, type));
    PV_NCCL_TRY(check_op(call, op));
    size_t send_bytes = 0, recv_bytes = 0;
    PV_NCCL_TRY(bytes_of(call, recvcount, type, size_t(comm->nranks), &send_bytes));
    PV_NCCL_TRY(bytes_of(call, recvcount, type, 1, &recv_bytes));
    PV_NCCL_TRY(check_buffer(call, "sendbuff", sendbuff, send_bytes));
    PV_NCCL_TRY(check_buffer(call, "recvbuff", recvbuff, recv_bytes));
    const bool in_place = recvbuff == static_cast<const unsigned char*>(sendbuff) + size_t(comm->rank) * recv_bytes;
    if (!in_place && overlap(sendbuff, send_bytes, recvbuff, recv_bytes))
        return fail(ncclInvalidArgument,
                    "%s: recvbuff overlaps sendbuff without being the in-place form (recvbuff = sendbuff + rank * "
                    "recvcount)",
                    call);
    return issue({call, Kind::reduce_scatter, comm, stream, sendbuff, recvbuff, recvcount, type, op, 0, 0});
}

ncclResult_t all_gather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t type, ncclComm* comm,
                        cudaStream_t stream) {
    const char* call = "ncclAllGather";
    PV_NCCL_TRY(check_call(call, comm, stream));
    PV_NCCL_TRY(check_type(call, type));
    size_t send_bytes = 0, recv_bytes = 0;
    PV_NCCL_TRY(bytes_of(call, sendcount, type, 1, &send_bytes));
    PV_NCCL_TRY(bytes_of(call, sendcount, type, size_t(comm->nranks), &recv_bytes));
    PV_NCCL_TRY(check_buffer(call, "sendbuff", sendbuff, send_bytes));
    PV_NCCL_TRY(check_buffer(call, "recvbuff", recvbuff, recv_bytes));
    const bool in_place = sendbuff == static_cast<const unsigned char*>(recvbuff) + size_t(comm->rank) * send_bytes;
    if (!in_place && overlap(sendbuff, send_bytes, recvbuff, recv_bytes))
        return fail(ncclInvalidArgument,
                    "%s: sendbuff overlaps recvbuff without being the in-place form (sendbuff = recvbuff + rank * "
                    "sendcount)",
                    call);
    return issue({call, Kind::all_gather, comm, stream, sendbuff, recvbuff, sendcount, type, ncclSum, 0, 0});
}

ncclResult_t broadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, int root,
                       ncclComm* comm, cudaStream_t stream) {
    const char* call = "ncclBroadcast";
    PV_NCCL_TRY(check_call(call, comm, stream));
    PV_NCCL_TRY(check_type(call, type));
    PV_NCCL_TRY(check_root(call, "root", root, comm));
    size_t bytes = 0;
    PV_NCCL_TRY(bytes_of(call, count, type, 1, &bytes));
    PV_NCCL_TRY(check_buffer(call, "recvbuff", recvbuff, bytes));
    if (comm->rank == root) {  // sendbuff is read on the root only
        PV_NCCL_TRY(check_buffer(call, "sendbuff", sendbuff, bytes));
        if (sendbuff != recvbuff && overlap(sendbuff, bytes, recvbuff, bytes))
            return fail(ncclInvalidArgument,
                        "%s: sendbuff and recvbuff overlap without being equal (the in-place form)", call);
    }
    return issue({call, Kind::broadcast, comm, stream, sendbuff, recvbuff, count, type, ncclSum, root, 0});
}

ncclResult_t point_to_point(Kind kind, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                            int peer, ncclComm* comm, cudaStream_t stream) {
    const char* call = kind == Kind::send ? "ncclSend" : "ncclRecv";
    PV_NCCL_TRY(check_call(call, comm, stream));
    PV_NCCL_TRY(check_type(call, type));
    PV_NCCL_TRY(check_root(call, "peer", peer, comm));
    size_t bytes = 0;
    PV_NCCL_TRY(bytes_of(call, count, type, 1, &bytes));
    if (kind == Kind::send)
        PV_NCCL_TRY(check_buffer(call, "sendbuff", sendbuff, bytes));
    else
        PV_NCCL_TRY(check_buffer(call, "recvbuff", recvbuff, bytes));
    return issue({call, kind, comm, stream, sendbuff, recvbuff, count, type, ncclSum, peer, 0});
}

}  // namespace
}  // namespace pv::host::nccl

using namespace pv::host;
using namespace pv::host::nccl;

// ---- versions, errors ----------------------------------------------------------------------------
extern "C" ncclResult_t ncclGetVersion(int* version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;  // the API this file implements: the toolkit's nccl.h
    return ncclSuccess;
}

extern "C" const char* ncclGetErrorString(ncclResult_t result) {
    // NCCL's own texts.
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

extern "C" const char* ncclGetLastError(ncclComm_t) {
    std::lock_guard lock(error_mutex);
    return last_error;
}

// ---- communicators -------------------------------------------------------------------------------
extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    std::memset(id->internal, 0, sizeof id->internal);
    std::memcpy(id->internal, kIdMagic, sizeof kIdMagic);
    std::random_device entropy;
    for (size_t i = sizeof kIdMagic; i < sizeof kIdMagic + 16; i += 4) {
        const unsigned word = entropy();
        std::memcpy(id->internal + i, &word, 4);
    }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    const char* call = "ncclCommInitRank";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", call);
    *comm = nullptr;
    if (!id_is_ours(commId))
        return fail(
            ncclInvalidArgument,
            "%s: the ncclUniqueId was not made by ncclGetUniqueId; rank 0 makes it and broadcasts it (MPI_Bcast) "
            "to every rank before ncclCommInitRank",
            call);
    int device = 0;
    cudaGetDevice(&device);
    if (nranks == 1) {  // this process alone: no MPI needed
        if (rank != 0) return fail(ncclInvalidArgument, "%s: rank %d of a 1-rank communicator", call, rank);
        return make_comm(comm, MPI_COMM_NULL, 0, 1, device);
    }
    PV_NCCL_TRY(require_mpi(call));
    synchronize_all_streams();  // never block in MPI with NCCL work queued (deferred mode)

    // Every world rank contributes (id, nranks, rank); all of them see the same table and reach
    // the same verdict, so a bad call fails everywhere rather than hanging somewhere.
    struct Entry {
        ncclUniqueId id;
        int nranks;
        int rank;
    };
    int world_size = 0, world_rank = 0;
    PV_MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    PV_MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    const Entry mine{commId, nranks, rank};
    std::vector<Entry> table(size_t(world_size), mine);
    MPI_Request request;
    PV_MPI_TRY(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, table.data(), int(sizeof mine), MPI_BYTE,
                              MPI_COMM_WORLD, &request));
    PV_NCCL_TRY(wait_for_world(&request, call));

    // Group the world ranks by id, in order of first appearance: the color of MPI_Comm_split.
    std::vector<int> color(size_t(world_size), -1);
    int colors = 0;
    for (int w = 0; w < world_size; ++w) {
        for (int v = 0; v < w && color[size_t(w)] < 0; ++v)
            if (std::memcmp(&table[size_t(v)].id, &table[size_t(w)].id, sizeof(ncclUniqueId)) == 0)
                color[size_t(w)] = color[size_t(v)];
        if (color[size_t(w)] < 0) color[size_t(w)] = colors++;
    }
    for (int c = 0; c < colors; ++c) {
        std::vector<int> members;
        for (int w = 0; w < world_size; ++w)
            if (color[size_t(w)] == c) members.push_back(w);
        const int size = int(members.size());
        std::vector<bool> taken(size_t(size), false);
        for (int w : members) {
            const Entry& e = table[size_t(w)];
            std::string problem;
            if (e.nranks != size)
                problem = "passed nranks = " + std::to_string(e.nranks) + ", but " + std::to_string(size) +
                          " world rank(s) passed its id";
            else if (e.rank < 0 || e.rank >= size)
                problem = "passed rank " + std::to_string(e.rank) + ", outside 0.." + std::to_string(size - 1);
            else if (taken[size_t(e.rank)])
                problem = "passed rank " + std::to_string(e.rank) + ", which another world rank also passed";
            if (!problem.empty())
                return fail(ncclInvalidUsage,
                            "%s: world rank %d %s. Every rank of MPI_COMM_WORLD calls ncclCommInitRank together "
                            "(nranks > 1); each id is used by exactly nranks of them, with ranks 0..nranks-1. For "
                            "a subset of the world, use ncclCommSplit",
                            call, w, problem.c_str());
            taken[size_t(e.rank)] = true;
        }
    }
    MPI_Comm collectives = MPI_COMM_NULL;
    PV_MPI_TRY(MPI_Comm_split(MPI_COMM_WORLD, color[size_t(world_rank)], rank, &collectives));
    return make_comm(comm, collectives, rank, nranks, device);
}

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                               ncclConfig_t*) {
    return ncclCommInitRank(comm, nranks, commId, rank);  // no configuration applies on the host
}

extern "C" ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
    const char* call = "ncclCommSplit";
    PV_NCCL_TRY(check_comm(comm, call));
    if (!newcomm) return fail(ncclInvalidArgument, "%s: newcomm is NULL", call);
    *newcomm = nullptr;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument, "%s: color %d; use a non-negative color or NCCL_SPLIT_NOCOLOR", call, color);
    synchronize_all_streams();               // never block in MPI with NCCL work queued (deferred mode)
    if (comm->collectives == MPI_COMM_NULL)  // a one-rank communicator without MPI
        return color == NCCL_SPLIT_NOCOLOR ? ncclSuccess : make_comm(newcomm, MPI_COMM_NULL, 0, 1, comm->device);
    PV_NCCL_TRY(require_mpi(call));
    MPI_Comm split = MPI_COMM_NULL;
    PV_MPI_TRY(MPI_Comm_split(comm->collectives, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &split));
    if (split == MPI_COMM_NULL) return ncclSuccess;
    int rank = 0, nranks = 0;
    PV_MPI_TRY(MPI_Comm_rank(split, &rank));
    PV_MPI_TRY(MPI_Comm_size(split, &nranks));
    return make_comm(newcomm, split, rank, nranks, comm->device);
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;  // as NCCL
    PV_NCCL_TRY(check_comm(comm, "ncclCommDestroy"));
    synchronize_all_streams();  // queued work may still use the communicator
    {
        std::lock_guard lock(comms_mutex);
        live_comms.erase(comm);
    }
    std::unique_ptr<ncclComm> owned(comm);
    if (comm->collectives != MPI_COMM_NULL) {
        PV_NCCL_TRY(require_mpi("ncclCommDestroy"));
        PV_MPI_TRY(MPI_Comm_free(&comm->point_to_point));
        PV_MPI_TRY(MPI_Comm_free(&comm->collectives));
    }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
    PV_NCCL_TRY(check_comm(comm, "ncclCommGetAsyncError"));
    if (!async_error) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: async_error is NULL");
    *async_error = ncclResult_t(comm->async_error.load());
    return ncclSuccess;
}

// Unlike ncclCommDestroy, waits for nothing and talks to no peer (they may be dead): the
// communicator is marked aborted, so queued work that runs later is skipped, and forgotten. Its
// MPI communicators are not freed (MPI_Comm_free is collective); a program aborts a communicator
// on its way out.
extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;  // as NCCL
    PV_NCCL_TRY(check_comm(comm, "ncclCommAbort"));
    comm->aborted = true;
    std::lock_guard lock(comms_mutex);
    live_comms.erase(comm);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    PV_NCCL_TRY(check_comm(comm, "ncclCommCount"));
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    PV_NCCL_TRY(check_comm(comm, "ncclCommUserRank"));
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    PV_NCCL_TRY(check_comm(comm, "ncclCommCuDevice"));
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

// ---- collectives and point-to-point ----------------------------------------------------------------
extern "C" ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return note_failure(all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
}

extern "C" ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
    return note_failure(reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}

extern "C" ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
    return note_failure(all_gather(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}

extern "C" ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
    return note_failure(broadcast(sendbuff, recvbuff, count, datatype, root, comm, stream));
}

extern "C" ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                 cudaStream_t stream) {
    return note_failure(point_to_point(Kind::send, sendbuff, nullptr, count, datatype, peer, comm, stream));
}

extern "C" ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                 cudaStream_t stream) {
    return note_failure(point_to_point(Kind::recv, nullptr, recvbuff, count, datatype, peer, comm, stream));
}

extern "C" ncclResult_t ncclGroupStart() {
    ++group.depth;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclGroupEnd() {
    if (group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
    if (--group.depth > 0) return ncclSuccess;
    std::vector<Op> ops = std::exchange(group.ops, {});
    const ncclResult_t error = std::exchange(group.error, ncclSuccess);
    const std::string message = std::exchange(group.error_message, {});
    if (error != ncclSuccess)
        return fail(error, "ncclGroupEnd: nothing in the group was run, because a call in it failed: %s",
                    message.c_str());
    return launch(std::move(ops));
}
