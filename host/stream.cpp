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
    bool blocking() const { return !(flags & cudaStreamNonBlocking); }
};

struct CUevent_st {
    unsigned flags = 0;
    pv::host::Item record;  // the latest cudaEventRecord's item (nullptr: never recorded)
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

}  // namespace

bool stream_is_valid(cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return true;
    std::lock_guard lock(streams_mutex);
    return live_streams.count(stream) != 0;
}

bool streams_are_deferred() { return deferred_mode(); }

void stream_submit(cudaStream_t stream, std::function<void()> work) {
    if (!deferred_mode()) {
        DeviceMemoryAccess access;
        work();
        return;
    }
    std::lock_guard lock(streams_mutex);
    enqueue(resolve(stream), std::move(work));
}

void stream_submit_and_wait(cudaStream_t stream, std::function<void()> work) {
    if (!deferred_mode()) {
        DeviceMemoryAccess access;
        work();
        return;
    }
    std::lock_guard lock(streams_mutex);
    Item item = enqueue(resolve(stream), std::move(work));
    run_until([&] { return item->done; });
}

void synchronize_all_streams() {
    if (!deferred_mode()) return;
    std::lock_guard lock(streams_mutex);
    run_until(all_idle);
}

}  // namespace pv::host

using namespace pv::host;

extern "C" cudaError_t cudaDeviceSynchronize() {
    synchronize_all_streams();
    return cudaSuccess;
}

// ---- streams --------------------------------------------------------------------------------
extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int priority) {
    if (!stream || (flags & ~unsigned(cudaStreamNonBlocking))) return set_last_error(cudaErrorInvalidValue);
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    priority = std::clamp(priority, greatest, least);  // as CUDA clamps an out-of-range priority
    *stream = new CUstream_st{flags, priority, {}, nullptr};
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
    if (!deferred_mode()) return cudaSuccess;
    std::lock_guard lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    run_until([&] { return stream_idle(*s); });
    return cudaSuccess;
}

// A GPU makes progress while the host polls; the deferred executor runs only when the host waits,
// so a query runs the stream's queued work first (one valid timing: it all finished before the
// query). Otherwise a loop of queries, as a wait that polls for NCCL errors is, would never end.
extern "C" cudaError_t cudaStreamQuery(cudaStream_t stream) {
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    CUstream_st* s = resolve(stream);
    if (deferred_mode()) run_until([&] { return stream_idle(*s); });
    return stream_idle(*s) ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
    if (!stream_is_valid(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
    if (!event || !live_events.count(event)) return set_last_error(cudaErrorInvalidResourceHandle);
    if (flags != cudaEventWaitDefault && flags != cudaEventWaitExternal) return set_last_error(cudaErrorInvalidValue);
    // The wait names the event's most recent record at the time of this call; an event never
    // recorded is already complete.
    if (deferred_mode() && pending(event->record)) enqueue(resolve(stream), [] {}, {event->record});
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
    *event = new CUevent_st{flags, nullptr};
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
    auto item = std::make_shared<WorkItem>();
    if (deferred_mode()) {
        event->record = enqueue(resolve(stream), [] {});
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
    if (pending(event->record)) run_until([&] { return event->record->done; });
    return cudaSuccess;
}

// As cudaStreamQuery: the deferred executor runs only when the host waits, so a query first runs
// the work the event's record waits for, or a loop of queries (wait_event_polling) never ends.
extern "C" cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event_is_live(event)) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(streams_mutex);
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
