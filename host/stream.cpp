// Streams and events on the host, in three modes (POLEVAULT_HOST_STREAMS):
//
// sync (default)  every piece of stream work runs at the call, in program order: a correct CUDA
//                 execution, and the easiest to debug.
// deferred        work is queued and runs later, when the host synchronises (stream, event or
//                 device synchronisation, a synchronous copy, cudaFree). An executor then picks,
//                 at random (POLEVAULT_HOST_SEED), which stream whose next item is ready runs next,
//                 so independent streams interleave in every order CUDA allows.
// bursts          deferred, but the executor runs one stream for a random burst of items before
//                 switching (run_until): one stream runs far ahead of another. Ready means: the
//                 stream's earlier items are done, the event a cudaStreamWaitEvent named has
//                 happened, and the legacy default stream's implicit synchronisation with blocking
//                 streams holds. A kernel that reads what another stream has not finished writing,
//                 or host code reading results it never waited for, then gives wrong answers here.
//
// Under ThreadSanitizer each item's submission happens-before its execution, and each item
// happens-before whatever waits for it, so the race checker sees exactly CUDA's ordering.
#include "host/stream.h"

#include "host/graph.h"
#include "host/sanitizer_hooks.h"
#include "host/schedule.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace pv::host {
namespace {

struct WorkItem {
    std::function<void()> run;
    std::vector<std::shared_ptr<WorkItem>> deps;  // must be done before this item runs
    bool done = false;
    std::chrono::steady_clock::time_point finished;
};
using Item = std::shared_ptr<WorkItem>;

}  // namespace
}  // namespace pv::host

struct CUstream_st {
    unsigned flags = 0;
    int priority = 0;
    std::deque<pv::host::Item> queue;  // deferred mode: items not yet run
    pv::host::Item last;               // the most recently submitted item
    // While it captures (host/graph.h): the capture, and the nodes its next node waits for.
    std::shared_ptr<pv::host::Capture> capture;
    std::vector<int> tails;
    bool blocking() const { return !(flags & cudaStreamNonBlocking); }
};

struct CUevent_st {
    unsigned flags = 0;
    pv::host::Item record;  // the latest cudaEventRecord's item (nullptr: never recorded)
    // Recorded in a capture: the capture and the nodes a wait on it waits for (record is null).
    std::shared_ptr<pv::host::Capture> capture;
    std::vector<int> tails;
};

namespace pv::host {
namespace {

enum class Mode { sync, deferred, bursts };

Mode stream_mode() {
    static const Mode mode = [] {
        const char* v = std::getenv("POLEVAULT_HOST_STREAMS");
        if (!v || !*v || std::strcmp(v, "sync") == 0) return Mode::sync;
        if (std::strcmp(v, "deferred") == 0) return Mode::deferred;
        if (std::strcmp(v, "bursts") == 0) return Mode::bursts;
        std::fprintf(stderr, "polevault host: POLEVAULT_HOST_STREAMS=%s; use sync, deferred or bursts\n", v);
        std::exit(2);
    }();
    return mode;
}

bool deferred_mode() { return stream_mode() != Mode::sync; }

// One lock for all stream state; the executor holds it while it runs items (an item never
// calls back into the stream API).
std::recursive_mutex streams_mutex;
CUstream_st legacy_stream;      // the NULL stream (and cudaStreamLegacy)
CUstream_st per_thread_stream;  // cudaStreamPerThread: one shared stand-in, blocking
std::set<cudaStream_t> live_streams;
// The live streams in creation order: what the executor and the implicit-synchronisation rules
// iterate. Iterating live_streams (ordered by address) would make the executor's choices depend
// on where the heap put each stream, which can change from run to run (the allocations Open MPI
// makes while messages arrive move it), so a seed would not name one interleaving.
std::vector<cudaStream_t> streams_in_creation_order;
std::set<cudaEvent_t> live_events;
std::vector<std::shared_ptr<Capture>> active_captures;         // begun and not yet ended
Rng executor_rng(mix_seed(schedule().seed, 0x5354524541ull));  // "STREA"

CUstream_st* resolve(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy) return &legacy_stream;
    if (s == cudaStreamPerThread) return &per_thread_stream;
    return s;
}

bool pending(const Item& item) { return item && !item->done; }

void execute(WorkItem& item) {
    tsan_acquire(&item);  // its submission, and the items it depends on
    {
        DeviceMemoryAccess access;
        item.run();
    }
    item.run = nullptr;  // release captured buffers (snapshots) now
    item.done = true;
    item.finished = std::chrono::steady_clock::now();
    tsan_release(&item);  // for whoever waits for it
}

bool ready(const CUstream_st& s) {
    if (s.queue.empty()) return false;
    for (const Item& d : s.queue.front()->deps)
        if (!d->done) return false;
    return true;
}

// Runs queued items until `done()`. deferred: each item from a stream chosen at random among
// those whose next item is ready, so a consumer that does not wait is likely to run before its
// producer. bursts: the executor keeps running one stream while its next item is ready,
// switching with probability 1/16 per item or when the stream blocks or empties, so one stream
// runs far ahead of another, as on a busy GPU, and a missing wait on work issued long before
// (a buffer reused while a collective still reads it) shows; a choice per item would almost
// never starve a stream that long.
template <class Done>
void run_until(Done done) {
    std::vector<CUstream_st*> candidates;
    CUstream_st* current = nullptr;
    const bool bursts = stream_mode() == Mode::bursts;
    while (!done()) {
        if (bursts && current && ready(*current) && executor_rng.below(16) != 0) {
            Item item = current->queue.front();
            current->queue.pop_front();
            execute(*item);
            continue;
        }
        candidates.clear();
        for (CUstream_st* s : {&legacy_stream, &per_thread_stream})
            if (ready(*s)) candidates.push_back(s);
        for (cudaStream_t s : streams_in_creation_order)
            if (ready(*s)) candidates.push_back(s);
        if (candidates.empty()) {
            std::fprintf(stderr, "polevault host: deferred streams cannot make progress (internal error)\n");
            std::abort();
        }
        current = candidates[executor_rng.below(candidates.size())];
        Item item = current->queue.front();
        current->queue.pop_front();
        execute(*item);
    }
}

bool stream_idle(const CUstream_st& s) { return s.queue.empty(); }

bool all_idle() {
    if (!legacy_stream.queue.empty() || !per_thread_stream.queue.empty()) return false;
    for (cudaStream_t s : streams_in_creation_order)
        if (!s->queue.empty()) return false;
    return true;
}

// Queues an item on `s` with CUDA's implicit dependencies and returns it.
Item enqueue(CUstream_st* s, std::function<void()> work, std::vector<Item> deps = {}) {
    auto item = std::make_shared<WorkItem>();
    item->run = std::move(work);
    item->deps = std::move(deps);
    if (s == &legacy_stream) {
        // The legacy stream waits for all earlier work of blocking streams ...
        if (pending(per_thread_stream.last)) item->deps.push_back(per_thread_stream.last);
        for (cudaStream_t o : streams_in_creation_order)
            if (o->blocking() && pending(o->last)) item->deps.push_back(o->last);
    } else if (s->blocking() && pending(legacy_stream.last)) {
        // ... and blocking streams wait for earlier work of the legacy stream.
        item->deps.push_back(legacy_stream.last);
    }
    tsan_release(item.get());
    s->last = item;
    s->queue.push_back(item);
    return item;
}

// Stream capture (host/graph.h). All under streams_mutex.

void invalidate(Capture& c) { c.invalidated = true; }

// Records `work` as the capturing stream's next node.
void record_node(CUstream_st* s, std::function<void()> work) {
    Capture& c = *s->capture;
    c.nodes.push_back(GraphNode{std::move(work), s->tails});
    s->tails = {int(c.nodes.size()) - 1};
}

// The legacy default stream may not be used while a blocking stream captures (CUDA would make the
// capture depend on it implicitly).
cudaError_t check_legacy_use(const CUstream_st* s) {
    if (s != &legacy_stream) return cudaSuccess;
    cudaError_t e = cudaSuccess;
    for (const auto& c : active_captures)
        for (cudaStream_t t : streams_in_creation_order)
            if (t->capture == c && t->blocking()) invalidate(*c), e = cudaErrorStreamCaptureImplicit;
    return e;
}

// A stream that must not be synchronised with, queried or given synchronous work while it captures.
cudaError_t refuse_if_capturing(CUstream_st* s) {
    if (!s->capture) return cudaSuccess;
    invalidate(*s->capture);
    return cudaErrorStreamCaptureUnsupported;
}

}  // namespace

cudaError_t check_unsafe_call_during_capture() {
    std::lock_guard lock(streams_mutex);
    cudaError_t e = cudaSuccess;
    for (const auto& c : active_captures) {
        const bool forbids = c->mode == cudaStreamCaptureModeGlobal ||
                             (c->mode == cudaStreamCaptureModeThreadLocal && c->thread == std::this_thread::get_id());
        if (forbids) invalidate(*c), e = cudaErrorStreamCaptureUnsupported;
    }
    return e;
}

cudaError_t refuse_in_capture(cudaStream_t stream) {
    std::lock_guard lock(streams_mutex);
    return refuse_if_capturing(resolve(stream));
}

bool stream_is_valid(cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return true;
    std::lock_guard lock(streams_mutex);
    return live_streams.count(stream) != 0;
}

bool streams_are_deferred() { return deferred_mode(); }

namespace {
// Both submissions: recorded on a capturing stream (work waited for is refused there), else queued
// (deferred) or run at the call (sync); `wait`: returns once it has run.
cudaError_t submit(cudaStream_t stream, std::function<void()> work, bool wait) {
    std::unique_lock lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    if (s->capture) {
        if (wait) return refuse_if_capturing(s);
        record_node(s, std::move(work));
        return cudaSuccess;
    }
    if (const cudaError_t e = check_legacy_use(s); e != cudaSuccess) return e;
    if (deferred_mode()) {
        Item item = enqueue(s, std::move(work));
        if (wait) run_until([&] { return item->done; });
        return cudaSuccess;
    }
    lock.unlock();
    DeviceMemoryAccess access;
    work();
    return cudaSuccess;
}
}  // namespace

cudaError_t stream_submit(cudaStream_t stream, std::function<void()> work) {
    return submit(stream, std::move(work), false);
}
cudaError_t stream_submit_and_wait(cudaStream_t stream, std::function<void()> work) {
    return submit(stream, std::move(work), true);
}

void synchronize_all_streams() {
    if (!deferred_mode()) return;
    std::lock_guard lock(streams_mutex);
    run_until(all_idle);
}

}  // namespace pv::host

using namespace pv::host;

extern "C" cudaError_t cudaDeviceSynchronize() {
    if (const cudaError_t e = check_unsafe_call_during_capture(); e != cudaSuccess) return set_last_error(e);
    synchronize_all_streams();
    return cudaSuccess;
}

// ---- streams --------------------------------------------------------------------------------
extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int priority) {
    if (!stream || (flags & ~unsigned(cudaStreamNonBlocking))) return set_last_error(cudaErrorInvalidValue);
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    priority = std::clamp(priority, greatest, least);  // as CUDA clamps an out-of-range priority
    *stream = new CUstream_st{flags, priority, {}, nullptr, nullptr, {}};
    std::lock_guard lock(streams_mutex);
    live_streams.insert(*stream);
    streams_in_creation_order.push_back(*stream);
    return cudaSuccess;
}
// An H100's range: 0 (the default, least) to −5 (greatest); lower numbers run first. The host
// executor does not prioritise (every interleaving is allowed anyway), it only checks the value.
extern "C" cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
    if (!priority || !stream_is_valid(stream)) return set_last_error(cudaErrorInvalidValue);
    std::lock_guard lock(streams_mutex);
    *priority = resolve(stream)->priority;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    return cudaStreamCreateWithPriority(stream, flags, 0);
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithPriority(stream, 0, 0); }

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    std::lock_guard lock(streams_mutex);
    if (!stream || !live_streams.count(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    if (stream->capture) return set_last_error(cudaErrorIllegalState);  // end its capture first
    // CUDA lets queued work finish after the handle is gone; running it now keeps that promise.
    if (deferred_mode()) run_until([&] { return stream_idle(*stream); });
    live_streams.erase(stream);
    streams_in_creation_order.erase(
        std::find(streams_in_creation_order.begin(), streams_in_creation_order.end(), stream));
    delete stream;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    if (const cudaError_t e = refuse_if_capturing(s); e != cudaSuccess) return set_last_error(e);
    if (deferred_mode()) run_until([&] { return stream_idle(*s); });
    return cudaSuccess;
}

// A GPU makes progress while the host polls; the deferred executor runs only when the host waits,
// so a query runs the stream's queued work first (one valid timing: it all finished before the
// query). Otherwise a loop of queries, as a wait that polls for NCCL errors is, would never end.
extern "C" cudaError_t cudaStreamQuery(cudaStream_t stream) {
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    if (const cudaError_t e = refuse_if_capturing(s); e != cudaSuccess) return set_last_error(e);
    if (deferred_mode()) run_until([&] { return stream_idle(*s); });
    return stream_idle(*s) ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    if (!event || !live_events.count(event)) return set_last_error(cudaErrorInvalidResourceHandle);
    if (flags != cudaEventWaitDefault && flags != cudaEventWaitExternal) return set_last_error(cudaErrorInvalidValue);
    CUstream_st* s = resolve(stream);
    if (event->capture) {  // recorded in a capture: the stream joins it, or merges the event's nodes in
        // An ended capture's event marks nodes only its graph's launches run; the legacy stream
        // cannot be captured.
        if (event->capture->ended) return set_last_error(cudaErrorCapturedEvent);
        if (s == &legacy_stream) {
            invalidate(*event->capture);
            return set_last_error(cudaErrorStreamCaptureImplicit);
        }
        if (!s->capture) {
            s->capture = event->capture, s->tails = event->tails;
            s->capture->streams.push_back(s);
        } else if (s->capture == event->capture) {
            for (int n : event->tails)
                if (std::find(s->tails.begin(), s->tails.end(), n) == s->tails.end()) s->tails.push_back(n);
        } else {  // two captures would merge
            invalidate(*s->capture), invalidate(*event->capture);
            return set_last_error(cudaErrorStreamCaptureIsolation);
        }
        return cudaSuccess;
    }
    if (s->capture) {
        // Work recorded outside the capture: the graph could not wait for it (CUDA can, as an
        // external event node with cudaEventWaitExternal; we refuse it). An event never recorded
        // is complete and needs no wait.
        if (!event->record) return cudaSuccess;
        invalidate(*s->capture);
        return set_last_error(cudaErrorStreamCaptureIsolation);
    }
    // The wait names the event's most recent record at the time of this call; an event never
    // recorded is already complete.
    if (deferred_mode() && pending(event->record)) enqueue(s, [] {}, {event->record});
    return cudaSuccess;
}

// ---- events ---------------------------------------------------------------------------------
namespace {
bool event_is_live(cudaEvent_t event) {
    std::lock_guard lock(streams_mutex);
    return event && live_events.count(event) != 0;
}
}  // namespace

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
    const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!event || (flags & ~known)) return set_last_error(cudaErrorInvalidValue);
    *event = new CUevent_st{flags, nullptr, nullptr, {}};
    std::lock_guard lock(streams_mutex);
    live_events.insert(*event);
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t event) {
    std::lock_guard lock(streams_mutex);
    if (!event || live_events.erase(event) == 0) return set_last_error(cudaErrorInvalidResourceHandle);
    delete event;  // a queued record item holds its own state, not the event
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event_is_live(event) || !stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    if (s->capture) {  // marks the capture's nodes so far: a wait on it joins or orders against them
        event->capture = s->capture, event->tails = s->tails, event->record = nullptr;
        return cudaSuccess;
    }
    if (const cudaError_t e = check_legacy_use(s); e != cudaSuccess) return set_last_error(e);
    event->capture = nullptr, event->tails.clear();
    auto item = std::make_shared<WorkItem>();
    if (deferred_mode()) {
        event->record = enqueue(s, [] {});
    } else {
        item->done = true;
        item->finished = std::chrono::steady_clock::now();
        event->record = item;
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event_is_live(event)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    if (event->capture) return set_last_error(cudaErrorCapturedEvent);
    if (pending(event->record)) run_until([&] { return event->record->done; });
    return cudaSuccess;
}

// As cudaStreamQuery: the deferred executor runs only when the host waits, so a query first runs
// the work the event's record waits for, or a loop of queries (wait_event_polling) never ends.
extern "C" cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event_is_live(event)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    if (event->capture) return set_last_error(cudaErrorCapturedEvent);
    if (deferred_mode() && pending(event->record)) run_until([&] { return event->record->done; });
    return pending(event->record) ? cudaErrorNotReady : cudaSuccess;
}

extern "C" cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return set_last_error(cudaErrorInvalidValue);
    if (!event_is_live(start) || !event_is_live(end)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return set_last_error(cudaErrorInvalidResourceHandle);
    if (!start->record || !end->record) return set_last_error(cudaErrorInvalidResourceHandle);
    if (!start->record->done || !end->record->done) return set_last_error(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(end->record->finished - start->record->finished).count();
    return cudaSuccess;
}

// ---- stream capture (host/graph.h) -----------------------------------------------------------
extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return set_last_error(cudaErrorInvalidValue);
    std::lock_guard lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    if (s == &legacy_stream) return set_last_error(cudaErrorStreamCaptureUnsupported);
    if (s->capture) return set_last_error(cudaErrorIllegalState);
    static unsigned long long captures_begun = 0;  // (under streams_mutex)
    auto c = std::make_shared<Capture>();
    c->id = ++captures_begun;
    c->mode = mode, c->thread = std::this_thread::get_id(), c->streams = {s};
    s->capture = c, s->tails.clear();
    active_captures.push_back(c);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    if (!graph) return set_last_error(cudaErrorInvalidValue);
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    if (!s->capture) return set_last_error(cudaErrorIllegalState);
    const std::shared_ptr<Capture> c = s->capture;
    if (c->streams.front() != s) {  // only the stream that began it ends it
        invalidate(*c);
        return set_last_error(cudaErrorStreamCaptureUnmatched);
    }
    // Every stream that joined must have been joined back: its last nodes precede the origin's.
    bool unjoined = false;
    for (cudaStream_t t : c->streams) {
        if (t == s || t->capture != c) continue;
        for (int tail : t->tails) {
            bool reached = false;
            for (int o : s->tails) reached = reached || depends_on(c->nodes, o, tail);
            unjoined = unjoined || !reached;
        }
    }
    for (cudaStream_t t : c->streams)
        if (t->capture == c) t->capture = nullptr, t->tails.clear();
    c->ended = true;
    active_captures.erase(std::find(active_captures.begin(), active_captures.end(), c));
    *graph = nullptr;
    if (c->invalidated) return set_last_error(cudaErrorStreamCaptureInvalidated);
    if (unjoined) return set_last_error(cudaErrorStreamCaptureUnjoined);
    *graph = make_graph(std::move(c->nodes), c->order);
    return cudaSuccess;
}

// The capture's status and id; the graph and its dependencies so far are not exposed (null only).
extern "C" cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                                unsigned long long* id, cudaGraph_t* graph,
                                                const cudaGraphNode_t** dependencies, const cudaGraphEdgeData** edges,
                                                size_t* count) {
    if (!status) return set_last_error(cudaErrorInvalidValue);
    if (graph || dependencies || edges || count) return set_last_error(cudaErrorNotSupported);
    if (const cudaError_t e = cudaStreamIsCapturing(stream, status); e != cudaSuccess) return e;
    if (id) *id = pv::host::capture_id(stream);
    return cudaSuccess;
}

namespace pv::host {

unsigned long long capture_id(cudaStream_t stream) {
    std::lock_guard lock(streams_mutex);
    const CUstream_st* s = resolve(stream);
    return s->capture ? s->capture->id : 0;
}

bool capture_is_active(unsigned long long id) {
    std::lock_guard lock(streams_mutex);
    return std::any_of(active_captures.begin(), active_captures.end(), [&](const auto& c) { return c->id == id; });
}

void order_capture_launches(cudaStream_t capturing, OrderedSubmit order) {
    std::lock_guard lock(streams_mutex);
    if (CUstream_st* s = resolve(capturing); s->capture) s->capture->order = order;
}

}  // namespace pv::host

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    if (!status) return set_last_error(cudaErrorInvalidValue);
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    const CUstream_st* s = resolve(stream);
    *status = !s->capture               ? cudaStreamCaptureStatusNone
              : s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                        : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
