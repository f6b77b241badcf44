// The block runner: a CUDA block's threads as fibers on one worker thread.
//
// Scheduling. The runner makes passes over the block's threads in the order the schedule gives
// (host/schedule.h; in index order by default), resuming every thread that can run. A thread runs until it exits or must wait: at __syncthreads (until every
// live thread has arrived) or at a warp collective (until every lane of its mask has arrived).
// The thread whose arrival completes a barrier or collective releases the others and carries on
// without a switch. When a pass finds nothing to run while threads are still alive, the block is
// deadlocked: that is reported, never waited on.
//
// Semantics kept from the hardware: threads that have exited count as arrived at __syncthreads
// (POLEVAULT_HOST_STRICT=1 reports even that); a shuffle reading outside its width segment gets
// its own value. Semantics the CUDA documentation leaves undefined are reported: barriers at
// different source lines in one block, a mask naming lanes that exited or do not exist, a
// shuffle source outside the mask, lanes of one mask at different collectives, a bad width.
#include "host/block_runner.h"

#include "host/fiber.h"
#include "host/sanitizer_hooks.h"
#include "host/schedule.h"
#include "host/stream.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <chrono>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace pv::host {

__thread const ThreadIndex* tls_thread = nullptr;
__thread BlockIndex tls_block;

namespace {

enum class State : uint8_t { not_started, runnable, at_barrier, at_warp, exited };

struct EmulatedThread : ThreadIndex {
    unsigned linear = 0, lane = 0, warp = 0;
    State state = State::not_started;
    FiberContext context;
    FiberStack stack;
    std::source_location site;  // where it waits
    // The warp collective it waits at, and its result once complete.
    WarpOp op = WarpOp::sync;
    const char* op_label = "";  // the collective's name in diagnostics
    unsigned mask = 0;
    uint64_t value = 0;
    int arg = 0, width = 32;
    bool is_signed = false;
    uint64_t result = 0;
    int barrier_result = 0;
    // A warp exchange (mma, ldmatrix): its combine function, this lane's words and result.
    WarpExchangeFn combine = nullptr;
    LaneWords exchange_in{}, exchange_out{};
    // cp.async copies issued and not yet landed, oldest first (from copies_head), and the sizes
    // of the committed groups, oldest first (from groups_head); copies past the committed ones
    // are in the open group.
    std::vector<CpAsyncCopy> copies;
    std::vector<std::source_location> copy_sites;
    std::vector<size_t> group_sizes;
    size_t copies_head = 0, groups_head = 0, committed_copies = 0;
    // Happens-before bookkeeping for ThreadSanitizer (host/sanitizer_hooks.h).
    unsigned barrier_generation = 0;  // of the barrier it waits at
    unsigned syncwarp_count = 0;      // __syncwarp calls completed
    unsigned group_parity = 0;        // parity of each lane's syncwarp_count at the current one
    char syncwarp_tokens[2] = {};     // released at __syncwarp arrival, by parity
};

struct WarpState {
    unsigned existing = 0;  // lanes that exist (a partial last warp has fewer)
    unsigned exited = 0;
    unsigned waiting = 0;     // lanes waiting at a warp collective
    unsigned at_barrier = 0;  // lanes waiting at __syncthreads
};

struct Runner {
    StackPool stacks{fiber_stack_bytes()};
    FiberContext scheduler;
    std::vector<EmulatedThread> threads;
    std::vector<WarpState> warps;
    const KernelLaunch* launch = nullptr;
    EmulatedThread* current = nullptr;
    unsigned live = 0;
    // The barrier being assembled.
    unsigned barrier_arrived = 0;
    int barrier_count = 0;
    std::source_location barrier_site;
    unsigned barrier_generation = 0;
    // Happens-before tokens: barrier arrivals (by generation parity), block start and end.
    char barrier_tokens[2] = {};
    char block_start_token = 0, block_end_token = 0;
};

thread_local Runner runner;

bool strict_mode() {
    static const bool strict = [] {
        const char* env = std::getenv("POLEVAULT_HOST_STRICT");
        return env && *env && std::strcmp(env, "0") != 0;
    }();
    return strict;
}

bool same_site(const std::source_location& a, const std::source_location& b) {
    // The same call site's file name is the same pointer; compare the text only when they differ.
    return a.line() == b.line() && a.column() == b.column() &&
           (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

std::string site_text(const std::source_location& s) {
    return std::string(s.file_name()) + ":" + std::to_string(s.line()) + " in " + s.function_name();
}

// "0-15, 17, 20-31"
std::string thread_list(const std::vector<unsigned>& ids) {
    std::string out;
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
        if (!out.empty()) out += ", ";
        out += std::to_string(ids[i]);
        if (j > i) out += "-" + std::to_string(ids[j]);
        i = j + 1;
    }
    return out;
}

std::string lane_list(unsigned warp, unsigned lanes) {
    std::vector<unsigned> ids;
    for (unsigned l = 0; l < 32; ++l)
        if (lanes & (1u << l)) ids.push_back(warp * 32 + l);
    return thread_list(ids);
}

const char* op_name(WarpOp op) {
    switch (op) {
        case WarpOp::shfl_idx: return "__shfl_sync";
        case WarpOp::shfl_up: return "__shfl_up_sync";
        case WarpOp::shfl_down: return "__shfl_down_sync";
        case WarpOp::shfl_xor: return "__shfl_xor_sync";
        case WarpOp::ballot: return "__ballot_sync";
        case WarpOp::any: return "__any_sync";
        case WarpOp::all: return "__all_sync";
        case WarpOp::sync: return "__syncwarp";
        case WarpOp::reduce_add: return "__reduce_add_sync";
        case WarpOp::reduce_min: return "__reduce_min_sync";
        case WarpOp::reduce_max: return "__reduce_max_sync";
        case WarpOp::reduce_and: return "__reduce_and_sync";
        case WarpOp::reduce_or: return "__reduce_or_sync";
        case WarpOp::reduce_xor: return "__reduce_xor_sync";
        case WarpOp::exchange: return "warp exchange";
    }
    return "?";
}

bool is_shuffle(WarpOp op) {
    return op == WarpOp::shfl_idx || op == WarpOp::shfl_up || op == WarpOp::shfl_down || op == WarpOp::shfl_xor;
}

[[noreturn]] void report(const std::string& problem) {
    // Blocks on other workers may hit the same bug at the same moment: one report is enough.
    static std::mutex one_report;
    one_report.lock();
    const Runner& r = runner;
    const uint3 b = tls_block.block_idx;
    std::fprintf(stderr,
                 "polevault host: %s\n  kernel %s, block (%u,%u,%u) of a (%u,%u,%u) grid, %u threads per block\n"
                 "  schedule: %s (launch %llu)\n",
                 problem.c_str(), kernel_name(r.launch->kernel).c_str(), b.x, b.y, b.z, tls_block.grid_dim.x,
                 tls_block.grid_dim.y, tls_block.grid_dim.z, unsigned(r.threads.size()), describe(schedule()).c_str(),
                 static_cast<unsigned long long>(r.launch->sequence));
    std::fflush(stderr);
    std::abort();
}

void yield(EmulatedThread& t) { switch_to(t.context, runner.scheduler); }

void release_barrier(Runner& r) {
    if (strict_mode() && r.live < r.threads.size()) {
        std::vector<unsigned> gone;
        for (const auto& t : r.threads)
            if (t.state == State::exited) gone.push_back(t.linear);
        report("threads " + thread_list(gone) + " exited before the __syncthreads at " + site_text(r.barrier_site) +
               " (allowed on hardware, reported in POLEVAULT_HOST_STRICT mode)");
    }
    for (auto& t : r.threads)
        if (t.state == State::at_barrier) t.state = State::runnable, t.barrier_result = r.barrier_count;
    for (auto& w : r.warps) w.at_barrier = 0;
    r.barrier_arrived = 0;
    r.barrier_count = 0;
    ++r.barrier_generation;
}

std::string hex(unsigned v) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%08x", v);
    return b;
}

std::string hex_pointer(const void* p) {
    char b[32];
    std::snprintf(b, sizeof b, "%p", p);
    return b;
}

// A collective that can never complete: the lanes `waiting` wait at it for the lanes `missing`,
// which `why` (exited, wait at a barrier). One wording whichever side is noticed first, so the
// report does not depend on the schedule.
[[noreturn]] void report_stuck_collective(unsigned warp, const char* label, unsigned mask,
                                          const std::source_location& site, unsigned waiting, unsigned missing,
                                          const std::string& why) {
    report(std::string(label) + " (mask " + hex(mask) + ") at " + site_text(site) + " can never complete: threads " +
           lane_list(warp, waiting) + " wait at it for threads " + lane_list(warp, missing) + ", which " + why);
}

// A lane that waits at a warp collective whose mask names `t` can never be released once `t`
// waits at a barrier or has exited.
template <class Why>
void check_no_lane_waits_for(Runner& r, const EmulatedThread& t, Why why) {
    const WarpState& w = r.warps[t.warp];
    for (unsigned waiting = w.waiting; waiting; waiting &= waiting - 1) {
        const EmulatedThread& other = r.threads[t.warp * 32 + unsigned(std::countr_zero(waiting))];
        if (other.mask & (1u << t.lane))
            report_stuck_collective(t.warp, other.op_label, other.mask, other.site, w.waiting & other.mask,
                                    1u << t.lane, why());
    }
}

void thread_exited(Runner& r, EmulatedThread& t) {
    if (t.copies.size() > t.copies_head)
        report("thread " + std::to_string(t.linear) + " exited with " +
               std::to_string(t.copies.size() - t.copies_head) +
               " cp.async copies that never landed (the first issued at " + site_text(t.copy_sites[t.copies_head]) +
               "): commit them (cp_async_commit) and wait for them (cp_async_wait) before the thread ends");
    t.state = State::exited;
    --r.live;
    r.warps[t.warp].exited |= 1u << t.lane;
    check_no_lane_waits_for(r, t, [] { return std::string("exited"); });
    if (r.barrier_arrived > 0 && r.barrier_arrived == r.live) release_barrier(r);
}

void thread_main(void* arg) {
    auto* t = static_cast<EmulatedThread*>(arg);
    Runner& r = runner;
    fiber_started(r.scheduler);
    tsan_acquire(&r.block_start_token);  // CUDA: the launch happens-before every thread
    r.launch->invoke(r.launch->closure.get());
    tsan_release(&r.block_end_token);  // CUDA: every thread happens-before the kernel's end
    thread_exited(r, *t);
    switch_to(t->context, r.scheduler, /*leaving_for_good=*/true);
    __builtin_unreachable();
}

void resume(Runner& r, EmulatedThread& t) {
    r.current = &t;
    tls_thread = &t;
    if (t.state == State::not_started) {
        t.stack = r.stacks.acquire();
        fiber_prepare(t.context, t.stack, &thread_main, &t);
#if defined(POLEVAULT_TSAN)
        t.context.tsan_fiber = __tsan_create_fiber(0);
#endif
        t.state = State::runnable;
    }
    switch_to(r.scheduler, t.context);
    if (t.state == State::exited) {
        r.stacks.release(t.stack);
#if defined(POLEVAULT_TSAN)
        __tsan_destroy_fiber(t.context.tsan_fiber);
#endif
    }
}

[[noreturn]] void report_deadlock(const Runner& r) {
    std::string text = "deadlock: no thread of the block can proceed.";
    // Group the waiting threads by where they wait.
    std::vector<const EmulatedThread*> groups;
    for (const auto& t : r.threads) {
        if (t.state != State::at_barrier && t.state != State::at_warp) continue;
        bool seen = false;
        for (const auto* g : groups) seen |= g->state == t.state && same_site(g->site, t.site);
        if (!seen) groups.push_back(&t);
    }
    for (const auto* g : groups) {
        std::vector<unsigned> ids;
        for (const auto& t : r.threads)
            if (t.state == g->state && same_site(t.site, g->site)) ids.push_back(t.linear);
        text += "\n  threads " + thread_list(ids) + " wait at " +
                (g->state == State::at_barrier ? std::string("__syncthreads") : std::string(g->op_label)) + " at " +
                site_text(g->site);
    }
    text += "\n  (a barrier or warp collective that not every thread it needs can reach: divergent code?)";
    report(text);
}

// Computes every lane's result of a complete collective over `mask` and releases the lanes.
void complete_collective(Runner& r, unsigned warp, unsigned mask) {
    EmulatedThread* lanes = &r.threads[warp * 32];
    const EmulatedThread& first = lanes[std::countr_zero(mask)];
    if (first.op == WarpOp::exchange) {  // always the full warp
        LaneWords in[32], out[32];
        for (unsigned l = 0; l < 32; ++l) in[l] = lanes[l].exchange_in;
        first.combine(in, out);
        for (unsigned l = 0; l < 32; ++l) lanes[l].exchange_out = out[l], lanes[l].state = State::runnable;
        r.warps[warp].waiting = 0;
        return;
    }
    unsigned parity = 0;  // which syncwarp token each lane released into
    for (unsigned m = mask; m; m &= m - 1) {
        const unsigned l = unsigned(std::countr_zero(m));
        parity |= (lanes[l].syncwarp_count & 1u) << l;
    }
    uint64_t ballot = 0, sum = 0, bit_and = ~uint64_t(0), bit_or = 0, bit_xor = 0;
    int64_t smin = INT64_MAX, smax = INT64_MIN;
    uint64_t umin = UINT64_MAX, umax = 0;
    for (unsigned m = mask; m; m &= m - 1) {
        const unsigned l = unsigned(std::countr_zero(m));
        const uint64_t v = lanes[l].value;
        if (v) ballot |= 1u << l;
        sum += v;
        bit_and &= v, bit_or |= v, bit_xor ^= v;
        const int64_t s = int32_t(uint32_t(v));
        smin = std::min(smin, s), smax = std::max(smax, s);
        umin = std::min(umin, v), umax = std::max(umax, v);
    }
    for (unsigned m = mask; m; m &= m - 1) {
        const unsigned l = unsigned(std::countr_zero(m));
        EmulatedThread& t = lanes[l];
        const unsigned width = unsigned(t.width), segment = l & ~(width - 1);
        unsigned src = l;
        switch (t.op) {
            case WarpOp::shfl_idx: src = segment + (unsigned(t.arg) & (width - 1)); break;
            case WarpOp::shfl_up: src = (l - segment) >= unsigned(t.arg) ? l - unsigned(t.arg) : l; break;
            case WarpOp::shfl_down: src = (l - segment) + unsigned(t.arg) < width ? l + unsigned(t.arg) : l; break;
            case WarpOp::shfl_xor: {
                // Lanes may read from earlier segments but get their own value from later ones.
                const unsigned x = l ^ (unsigned(t.arg) & 31u);
                src = x >= segment + width ? l : x;
                break;
            }
            default: break;
        }
        if (is_shuffle(t.op)) {
            if (!(mask & (1u << src)))
                report("thread " + std::to_string(t.linear) + " reads lane " + std::to_string(src) + " in " +
                       t.op_label + " at " + site_text(t.site) + ", but that lane is outside the mask 0x" +
                       [&] {
                           char b[16];
                           std::snprintf(b, sizeof b, "%08x", mask);
                           return std::string(b);
                       }() +
                       " (the value it would read is undefined)");
            t.result = lanes[src].value;
        } else {
            switch (first.op) {
                case WarpOp::ballot: t.result = ballot; break;
                case WarpOp::any: t.result = ballot != 0; break;
                case WarpOp::all: t.result = ballot == mask; break;
                case WarpOp::reduce_add: t.result = uint32_t(sum); break;
                case WarpOp::reduce_min: t.result = first.is_signed ? uint64_t(uint32_t(int32_t(smin))) : umin; break;
                case WarpOp::reduce_max: t.result = first.is_signed ? uint64_t(uint32_t(int32_t(smax))) : umax; break;
                case WarpOp::reduce_and: t.result = bit_and; break;
                case WarpOp::reduce_or: t.result = bit_or; break;
                case WarpOp::reduce_xor: t.result = bit_xor; break;
                default: t.result = 0; break;
            }
        }
        t.group_parity = parity;
        t.state = State::runnable;
    }
    r.warps[warp].waiting &= ~mask;
}

}  // namespace

int block_barrier(int predicate, std::source_location site) {
    Runner& r = runner;
    EmulatedThread& t = *r.current;
    if (r.barrier_arrived == 0) {
        r.barrier_site = site;
    } else if (!same_site(site, r.barrier_site)) {
        report("threads wait at different __syncthreads: thread " + std::to_string(t.linear) + " at " +
               site_text(site) + ", others at " + site_text(r.barrier_site) +
               " (a __syncthreads in divergent code can never complete)");
    }
    check_no_lane_waits_for(r, t, [&] { return "wait at __syncthreads at " + site_text(site); });
    t.state = State::at_barrier;
    t.site = site;
    t.barrier_generation = r.barrier_generation;
    tsan_release(&r.barrier_tokens[t.barrier_generation & 1]);
    r.warps[t.warp].at_barrier |= 1u << t.lane;
    ++r.barrier_arrived;
    r.barrier_count += predicate;
    if (r.barrier_arrived == r.live) {
        release_barrier(r);  // the last to arrive releases everyone and carries on
    } else {
        yield(t);
    }
    // Everything every thread did before arriving happens-before what any does after leaving.
    tsan_acquire(&r.barrier_tokens[t.barrier_generation & 1]);
    return t.barrier_result;
}

namespace {

// Thread t arrives at a warp collective (its exchange fields already set for an exchange),
// waits until every lane of the mask has arrived, and returns with its result in place.
void arrive_at_collective(Runner& r, EmulatedThread& t, const char* label, WarpOp op, unsigned mask, uint64_t bits,
                          int arg, int width, bool is_signed, std::source_location site) {
    WarpState& w = r.warps[t.warp];
    const unsigned me = 1u << t.lane;
    // Messages are built only when reporting: this is the hot path of every collective.
    const auto where = [&] { return std::string(label) + " at " + site_text(site); };
    if (!(mask & me))
        report("thread " + std::to_string(t.linear) + " calls " + where() + " with mask " + hex(mask) +
               " that does not include its own lane " + std::to_string(t.lane));
    if (is_shuffle(op) && (width < 1 || width > 32 || (width & (width - 1))))
        report("thread " + std::to_string(t.linear) + " calls " + where() + " with width " + std::to_string(width) +
               " (must be a power of two from 1 to 32)");
    if (mask & ~w.existing)
        report("mask " + hex(mask) + " of " + where() + " names lanes that do not exist (threads " +
               lane_list(t.warp, mask & ~w.existing) + " are beyond the block's " + std::to_string(r.threads.size()) +
               " threads)");
    if (mask & w.exited)
        report_stuck_collective(t.warp, label, mask, site, (w.waiting & mask) | me, mask & w.exited, "exited");
    if (mask & w.at_barrier)
        report_stuck_collective(t.warp, label, mask, site, (w.waiting & mask) | me, mask & w.at_barrier,
                                "wait at __syncthreads at " + site_text(r.barrier_site));
    // Lanes of this mask already waiting must wait at the same collective with the same mask;
    // each arrival was checked against the lowest waiting lane, so checking that one suffices.
    if (const unsigned others = mask & w.waiting) {
        const EmulatedThread& o = r.threads[t.warp * 32 + unsigned(std::countr_zero(others))];
        if (o.op != op || o.mask != mask || o.combine != t.combine || (op != WarpOp::sync && !same_site(o.site, site)))
            report("lanes of one mask at different collectives: thread " + std::to_string(t.linear) + " at " + where() +
                   " (mask " + hex(mask) + "), thread " + std::to_string(o.linear) + " at " + o.op_label + " at " +
                   site_text(o.site) + " (mask " + hex(o.mask) + ")");
    }
    for (unsigned others = w.waiting & ~mask; others; others &= others - 1) {
        const EmulatedThread& o = r.threads[t.warp * 32 + unsigned(std::countr_zero(others))];
        if (o.mask & me)
            report("lanes of one mask at different collectives: thread " + std::to_string(t.linear) + " at " + where() +
                   " (mask " + hex(mask) + "), while thread " + std::to_string(o.linear) + " waits for it at " +
                   o.op_label + " at " + site_text(o.site) + " (mask " + hex(o.mask) + ")");
    }
    t.state = State::at_warp;
    t.site = site;
    t.op = op, t.op_label = label, t.mask = mask, t.value = bits, t.arg = arg, t.width = width, t.is_signed = is_signed;
    if (op == WarpOp::sync) tsan_release(&t.syncwarp_tokens[t.syncwarp_count & 1]);
    w.waiting |= me;
    if ((w.waiting & mask) == mask) {
        complete_collective(r, t.warp, mask);  // the last lane to arrive computes and carries on
    } else {
        yield(t);
    }
    if (op == WarpOp::sync) {
        // __syncwarp orders memory among its lanes (shuffles and votes do not, so they add no
        // edge): acquire what each lane released on arriving at this __syncwarp.
        if constexpr (kThreadSanitizer)
            for (unsigned m = mask; m; m &= m - 1) {
                const unsigned l = unsigned(std::countr_zero(m));
                tsan_acquire(&r.threads[t.warp * 32 + l].syncwarp_tokens[(t.group_parity >> l) & 1]);
            }
        ++t.syncwarp_count;
    }
}

}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, bool is_signed,
                         std::source_location site) {
    Runner& r = runner;
    EmulatedThread& t = *r.current;
    t.combine = nullptr;
    arrive_at_collective(r, t, op_name(op), op, mask, bits, arg, width, is_signed, site);
    return t.result;
}

LaneWords warp_exchange(WarpExchangeFn combine, const char* name, const LaneWords& mine, std::source_location site) {
    Runner& r = runner;
    EmulatedThread& t = *r.current;
    t.combine = combine;
    t.exchange_in = mine;
    // The instructions are .sync.aligned: the whole warp, converged.
    arrive_at_collective(r, t, name, WarpOp::exchange, 0xffffffffu, 0, 0, 32, false, site);
    return t.exchange_out;
}

unsigned current_lane() { return runner.current->lane; }

bool bank_conflict_check() {
    static const bool check = [] {
        const char* env = std::getenv("POLEVAULT_HOST_BANK_CONFLICTS");
        return env && *env && std::strcmp(env, "0") != 0;
    }();
    return check;
}

void report_bank_conflicts(unsigned extra, const char* what, std::source_location site) {
    report("warp " + std::to_string(runner.current->linear / 32) + ": " + what + " at " + site_text(site) +
           " has shared-memory bank conflicts: its 8-row matrices take " + std::to_string(extra) +
           " wavefront(s) more than one each (rows of one matrix on the same banks; pad or swizzle the rows)");
}

void check_aligned_16(const void* p, const char* what, std::source_location site) {
    if (reinterpret_cast<uintptr_t>(p) % 16 == 0) return;
    report("thread " + std::to_string(runner.current->linear) + ": " + what + " address " + hex_pointer(p) + " at " +
           site_text(site) + " is not 16-byte aligned");
}

void check_shared_operand(const void* p, const char* what, std::source_location site) {
    check_aligned_16(p, what, site);
    const auto* c = static_cast<const unsigned char*>(p);
    const unsigned char* dyn = tls_block.dynamic_smem;
    if (dyn && c >= dyn && c < dyn + runner.launch->smem_bytes) return;  // the common case
    const EmulatedThread& t = *runner.current;
    const char* where = nullptr;
    if (c >= reinterpret_cast<const unsigned char*>(t.stack.base) &&
        c < reinterpret_cast<const unsigned char*>(t.stack.base) + t.stack.size)
        where = "the thread's own stack (local memory)";
    else if (is_device_range(p, 16))
        where = "global memory (a cudaMalloc allocation)";
    if (where)
        report("thread " + std::to_string(t.linear) + ": " + what + " address " + hex_pointer(p) + " at " +
               site_text(site) + " is in " + where + ", not shared memory");
}

void cp_async_issue(void* dst, const unsigned char (&bytes)[16], std::source_location site) {
    EmulatedThread& t = *runner.current;
    CpAsyncCopy copy;
    copy.dst = dst;
    std::memcpy(copy.bytes, bytes, 16);
    t.copies.push_back(copy);
    t.copy_sites.push_back(site);
}

void cp_async_commit_group() {
    EmulatedThread& t = *runner.current;
    const size_t issued = t.copies.size() - t.copies_head;
    t.group_sizes.push_back(issued - t.committed_copies);
    t.committed_copies = issued;
}

bool cp_async_next_ready(int pending, CpAsyncCopy& copy) {
    EmulatedThread& t = *runner.current;
    while (t.group_sizes.size() - t.groups_head > size_t(pending)) {
        size_t& front = t.group_sizes[t.groups_head];
        if (front == 0) {
            ++t.groups_head;
            continue;
        }
        copy = t.copies[t.copies_head++];
        --front, --t.committed_copies;
        if (t.copies_head == t.copies.size()) t.copies.clear(), t.copy_sites.clear(), t.copies_head = 0;
        return true;
    }
    if (t.groups_head == t.group_sizes.size()) t.group_sizes.clear(), t.groups_head = 0;
    return false;
}

unsigned active_mask() {
    const Runner& r = runner;
    const EmulatedThread& t = *r.current;
    const WarpState& w = r.warps[t.warp];
    return w.existing & ~w.exited;
}

// One pass over the block: resumes every thread that can run, in the schedule's order. Returns
// whether any thread ran.
bool run_pass(Runner& r, ThreadOrder order, Rng& rng) {
    bool progressed = false;
    const unsigned n = unsigned(r.threads.size());
    auto try_resume = [&](unsigned i) {
        EmulatedThread& t = r.threads[i];
        if (t.state != State::not_started && t.state != State::runnable) return false;
        resume(r, t);
        return progressed = true;
    };
    switch (order) {
        case ThreadOrder::in_order:
            for (unsigned i = 0; i < n; ++i) try_resume(i);
            break;
        case ThreadOrder::reverse:
            for (unsigned i = n; i-- > 0;) try_resume(i);
            break;
        case ThreadOrder::random: {
            thread_local std::vector<unsigned> perm;
            perm.resize(n);
            for (unsigned i = 0; i < n; ++i) perm[i] = i;
            shuffle(perm.data(), n, rng);
            for (unsigned i : perm) try_resume(i);
            break;
        }
        case ThreadOrder::warp_greedy: {
            // A random warp runs as far as it can before the next one starts.
            thread_local std::vector<unsigned> warps;
            const unsigned nw = unsigned(r.warps.size());
            warps.resize(nw);
            for (unsigned w = 0; w < nw; ++w) warps[w] = w;
            shuffle(warps.data(), nw, rng);
            for (unsigned w : warps) {
                for (bool again = true; again;) {
                    again = false;
                    for (unsigned i = w * 32; i < std::min(n, w * 32 + 32); ++i) again |= try_resume(i);
                }
            }
            break;
        }
    }
    return progressed;
}

void run_block(const KernelLaunch& launch, uint3 block_idx, size_t linear_block) {
    Runner& r = runner;
    const unsigned bx = launch.block.x, by = launch.block.y, bz = launch.block.z;
    const unsigned n = bx * by * bz;
    r.launch = &launch;
    r.threads.assign(n, EmulatedThread{});
    r.warps.assign((n + 31) / 32, WarpState{});
    for (unsigned i = 0; i < n; ++i) {
        EmulatedThread& t = r.threads[i];
        t.thread_idx = uint3{i % bx, (i / bx) % by, i / (bx * by)};
        t.linear = i, t.lane = i % 32, t.warp = i / 32;
        r.warps[t.warp].existing |= 1u << t.lane;
    }
    r.live = n;
    r.barrier_arrived = 0;
    r.barrier_count = 0;
    r.barrier_generation = 0;
    tls_block.block_idx = block_idx;
    tls_block.block_dim = uint3{bx, by, bz};
    tls_block.grid_dim = uint3{launch.grid.x, launch.grid.y, launch.grid.z};
    // Dynamic shared memory: exactly the requested size (so ASan catches an overrun) and filled
    // with 0xFF at every block (so a read of what this block never wrote is NaN, not stale data).
    thread_local std::vector<unsigned char> dynamic_smem;
    if (dynamic_smem.size() != launch.smem_bytes) {
        dynamic_smem.resize(launch.smem_bytes);
        dynamic_smem.shrink_to_fit();
    }
    if (!dynamic_smem.empty()) std::memset(dynamic_smem.data(), 0xFF, dynamic_smem.size());
    tls_block.dynamic_smem = dynamic_smem.data();
#if defined(POLEVAULT_TSAN)
    r.scheduler.tsan_fiber = __tsan_get_current_fiber();
#endif
    tsan_release(&r.block_start_token);

    // Passes until every thread has exited, or none can run (a deadlock).
    const Schedule& sched = schedule();
    Rng rng(mix_seed(sched.seed, launch.sequence, linear_block));
    while (r.live > 0 && run_pass(r, sched.threads, rng)) {}
    if (r.live > 0) report_deadlock(r);
    tsan_acquire(&r.block_end_token);
    tls_thread = nullptr;
    r.current = nullptr;
}

std::string kernel_name(const void* kernel) {
    Dl_info info{};
    if (kernel && dladdr(kernel, &info) && info.dli_sname) {
        int status = 0;
        char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
        std::string name = status == 0 && demangled ? demangled : info.dli_sname;
        std::free(demangled);
        return name;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "at %p", kernel);
    return buf;
}

}  // namespace pv::host

long long clock64() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
