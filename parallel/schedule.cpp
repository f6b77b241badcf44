// Pipeline schedules: the tables, their transfers, the simulator and the drawing (parallel/schedule.h).
#include "parallel/schedule.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <tuple>

namespace pv {

namespace {

std::string step_name(const PipeStep& e, bool chunks) {
    return std::string(e.backward ? "B" : "F") + std::to_string(e.micro) + (chunks ? "." + std::to_string(e.chunk) : "");
}

// Assigns each forward the lowest slot of its (rank, chunk) that is free, freed by its backward;
// records the slots each (rank, chunk) needs. The table's order must already be valid for this.
void assign_slots(PipelineSchedule& s) {
    s.slots.assign(size_t(s.ranks), std::vector<int>(size_t(s.chunks), 0));
    for (int r = 0; r < s.ranks; ++r) {
        std::vector<std::vector<int>> held(size_t(s.chunks));  // per chunk: slot -> micro (−1 free)
        std::map<std::pair<int, int>, int> slot_of;
        for (PipeStep& e : s.steps[size_t(r)]) {
            std::vector<int>& h = held[size_t(e.chunk)];
            if (!e.backward) {
                auto free = std::find(h.begin(), h.end(), -1);
                if (free == h.end()) free = h.insert(h.end(), -1);
                *free = e.micro;
                e.slot = int(free - h.begin());
                slot_of[{e.micro, e.chunk}] = e.slot;
            } else {
                auto it = slot_of.find({e.micro, e.chunk});
                e.slot = it == slot_of.end() ? 0 : it->second;
                if (it != slot_of.end()) h[size_t(e.slot)] = -1;
            }
        }
        for (int c = 0; c < s.chunks; ++c) s.slots[size_t(r)][size_t(c)] = int(held[size_t(c)].size());
    }
}

}  // namespace

int PipelineSchedule::rank_slots(int rank) const {
    int sum = 0;
    for (int k : slots.at(size_t(rank))) sum += k;
    return sum;
}

const char* pipeline_schedule_name(PipelineScheduleKind k) {
    switch (k) {
        case PipelineScheduleKind::gpipe: return "gpipe";
        case PipelineScheduleKind::one_f_one_b: return "1f1b";
        case PipelineScheduleKind::interleaved: return "interleaved";
    }
    return "?";
}

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
    for (PipelineScheduleKind k :
         {PipelineScheduleKind::gpipe, PipelineScheduleKind::one_f_one_b, PipelineScheduleKind::interleaved})
        if (name == pipeline_schedule_name(k)) return k;
    throw std::invalid_argument("unknown pipeline schedule '" + name + "': choose gpipe, 1f1b or interleaved");
}

PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int ranks, int micro, int chunks, int in_flight) {
    const std::string what = std::string("the ") + pipeline_schedule_name(kind) + " schedule";
    if (ranks < 1 || micro < 1 || in_flight < 0)
        throw std::invalid_argument(what + " needs at least one rank and one micro-batch");
    if (kind != PipelineScheduleKind::interleaved && chunks != 1)
        throw std::invalid_argument(what + " runs one chunk per rank; model chunks are for the interleaved schedule");
    if (kind == PipelineScheduleKind::interleaved) {
        if (chunks < 2)
            throw std::invalid_argument(what + " needs at least 2 model chunks per rank (got " +
                                        std::to_string(chunks) + "): give more, or choose 1f1b");
        if (ranks < 2)
            throw std::invalid_argument(what + " needs a pipeline of at least 2 ranks");
        if (micro % ranks != 0)
            throw std::invalid_argument(what + " runs the micro-batches through each chunk " + std::to_string(ranks) +
                                        " at a time, but a step has " + std::to_string(micro) +
                                        ": make the micro-batches per step a multiple of the pipeline's " +
                                        std::to_string(ranks) + " ranks");
    }
    PipelineSchedule s;
    s.kind = kind, s.ranks = ranks, s.chunks = chunks, s.micro = micro;
    s.steps.resize(size_t(ranks));
    for (int r = 0; r < ranks; ++r) {
        std::vector<PipeStep>& row = s.steps[size_t(r)];
        if (kind == PipelineScheduleKind::gpipe) {
            const int group = in_flight > 0 ? std::min(in_flight, micro) : micro;
            for (int first = 0; first < micro; first += group) {
                const int end = std::min(micro, first + group);
                for (int m = first; m < end; ++m) row.push_back({false, m, 0, 0});
                for (int m = first; m < end; ++m) row.push_back({true, m, 0, 0});
            }
            continue;
        }
        // 1F1B and its interleaved form: the k-th forward and k-th backward of this rank.
        const int total = micro * chunks, group = ranks * chunks;
        auto forward = [&](int k) {
            if (chunks == 1) return PipeStep{false, k, 0, 0};
            return PipeStep{false, k / group * ranks + k % ranks, k % group / ranks, 0};
        };
        auto backward = [&](int k) {
            PipeStep e = forward(k);
            e.backward = true;
            e.chunk = chunks - 1 - e.chunk;
            return e;
        };
        int warmup = chunks == 1 ? ranks - r - 1 : (ranks - r - 1) * 2 + (chunks - 1) * ranks;
        if (in_flight > 0) warmup = std::min(warmup, in_flight - 1);
        warmup = std::min(warmup, total);
        for (int k = 0; k < warmup; ++k) row.push_back(forward(k));
        for (int k = 0; k + warmup < total; ++k) {
            row.push_back(forward(k + warmup));
            row.push_back(backward(k));
            row.back().joined = chunks > 1;  // Megatron's four-way exchange after each pair (header)
        }
        for (int k = std::max(total - warmup, 0); k < total; ++k) row.push_back(backward(k));
    }
    assign_slots(s);
    return s;
}

namespace {

// The one transfer entry i needs before it (its input, or its output's gradient), if any.
std::vector<PipeTransfer> receive_of(const PipelineSchedule& s, int rank, size_t i) {
    const PipeStep& e = s.steps[size_t(rank)][i];
    const int stage = s.stage_of(rank, e.chunk), last = s.stages() - 1;
    if (!e.backward && stage > 0) return {{false, (stage - 1) % s.ranks, false, e.micro, stage - 1}};
    if (e.backward && stage < last) return {{false, (stage + 1) % s.ranks, true, e.micro, stage + 1}};
    return {};
}

// The one transfer entry i makes after it (its output, or its input's gradient), if any.
std::vector<PipeTransfer> send_of(const PipelineSchedule& s, int rank, size_t i) {
    const PipeStep& e = s.steps[size_t(rank)][i];
    const int stage = s.stage_of(rank, e.chunk), last = s.stages() - 1;
    if (!e.backward && stage < last) return {{true, (stage + 1) % s.ranks, false, e.micro, stage}};
    if (e.backward && stage > 0) return {{true, (stage - 1) % s.ranks, true, e.micro, stage}};
    return {};
}

}  // namespace

std::vector<PipeTransfer> transfers_before(const PipelineSchedule& s, int rank, size_t i) {
    const std::vector<PipeStep>& row = s.steps[size_t(rank)];
    if (i < row.size() && row[i].joined) return {};  // inside a round
    std::vector<PipeTransfer> out;
    size_t begin = i;  // the previous round: [begin, i)
    while (begin > 0 && (begin == i || row[begin].joined)) --begin;
    for (size_t k = begin; k < i; ++k)
        for (const PipeTransfer& t : send_of(s, rank, k)) out.push_back(t);
    for (size_t k = i; k < row.size() && (k == i || row[k].joined); ++k)
        for (const PipeTransfer& t : receive_of(s, rank, k)) out.push_back(t);
    return out;
}

ScheduleFacts simulate_pipeline_schedule(const PipelineSchedule& s, bool group_transfers, const PipeTimes& times) {
    const int p = s.ranks;
    if (int(s.steps.size()) != p || int(s.slots.size()) != p)
        throw std::logic_error("pipeline schedule: a table needs one row and one slot count per rank");
    for (const std::vector<int>& k : s.slots)
        if (int(k.size()) != s.chunks)
            throw std::logic_error("pipeline schedule: a table needs one slot count per chunk of each rank");
    // Each rank's actions: compute entries and groups of transfers (indices into ops).
    struct Op {
        int rank;
        PipeTransfer t;
        int partner = -1;
        bool posted = false, matched = false;
        double posted_at = 0, matched_at = 0;
    };
    struct Action {
        int entry = -1;        // a compute entry, or −1 for a group
        std::vector<int> ops;  // the group's transfers
    };
    std::vector<Op> ops;
    std::vector<std::vector<Action>> actions(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) {
        const auto& row = s.steps[size_t(r)];
        auto add_group = [&](const std::vector<PipeTransfer>& ts) {
            if (ts.empty()) return;
            if (!group_transfers) {
                for (const PipeTransfer& t : ts) {
                    actions[size_t(r)].push_back({-1, {int(ops.size())}});
                    ops.push_back({r, t});
                }
                return;
            }
            Action a;
            for (const PipeTransfer& t : ts) a.ops.push_back(int(ops.size())), ops.push_back({r, t});
            actions[size_t(r)].push_back(a);
        };
        for (size_t i = 0; i <= row.size(); ++i) {
            add_group(transfers_before(s, r, i));
            if (i < row.size()) actions[size_t(r)].push_back({int(i), {}});
        }
    }
    // Pair the k-th send from a to b with the k-th receive on b from a, and check they carry the same data.
    std::map<std::pair<int, int>, std::vector<int>> sends, recvs;
    for (int r = 0; r < p; ++r)
        for (const Action& a : actions[size_t(r)])
            for (int o : a.ops) {
                const PipeTransfer& t = ops[size_t(o)].t;
                if (t.peer < 0 || t.peer >= p || t.peer == r)
                    throw std::logic_error("pipeline schedule: rank " + std::to_string(r) +
                                           " transfers to rank " + std::to_string(t.peer));
                (t.send ? sends[{r, t.peer}] : recvs[{t.peer, r}]).push_back(o);
            }
    auto describe = [](const PipeTransfer& t) {
        return std::string(t.gradient ? "the gradient of stage " : "the output of stage ") + std::to_string(t.stage) +
               " for micro-batch " + std::to_string(t.micro);
    };
    for (auto& [pair, list] : sends) {
        const std::vector<int>& other = recvs[pair];
        for (size_t k = 0; k < std::max(list.size(), other.size()); ++k) {
            const std::string who = "rank " + std::to_string(pair.first) + " -> rank " + std::to_string(pair.second);
            if (k >= other.size())
                throw std::logic_error("pipeline schedule: " + who + " sends " + describe(ops[size_t(list[k])].t) +
                                       " that is never received");
            if (k >= list.size())
                throw std::logic_error("pipeline schedule: " + who + ": a receive of " +
                                       describe(ops[size_t(other[k])].t) + " that is never sent");
            PipeTransfer a = ops[size_t(list[k])].t, b = ops[size_t(other[k])].t;
            if (std::tie(a.gradient, a.micro, a.stage) != std::tie(b.gradient, b.micro, b.stage))
                throw std::logic_error("pipeline schedule: " + who + ": transfer " + std::to_string(k) + " sends " +
                                       describe(a) + " where the receiver expects " + describe(b));
            ops[size_t(list[k])].partner = other[k];
            ops[size_t(other[k])].partner = list[k];
        }
    }
    for (auto& [pair, list] : recvs)
        if (!list.empty() && sends[pair].empty())
            throw std::logic_error("pipeline schedule: rank " + std::to_string(pair.second) + " receives " +
                                   describe(ops[size_t(list[0])].t) + " from rank " + std::to_string(pair.first) +
                                   ", which never sends");

    ScheduleFacts f;
    f.peak_in_flight.assign(size_t(p), 0);
    f.sends.assign(size_t(p), 0), f.recvs.assign(size_t(p), 0);
    f.start.resize(size_t(p));
    for (const Op& o : ops) ++(o.t.send ? f.sends : f.recvs)[size_t(o.rank)];
    std::vector<size_t> next(static_cast<size_t>(p), 0);
    std::vector<double> clock(static_cast<size_t>(p), 0), busy(size_t(p), 0);
    // Per rank: (micro, chunk) -> 1 forward done, 2 backward done; per (chunk, slot) the micro holding it.
    std::vector<std::map<std::pair<int, int>, int>> done(static_cast<size_t>(p));
    std::vector<std::map<std::pair<int, int>, int>> slot_holder(static_cast<size_t>(p));
    std::vector<int> in_flight(static_cast<size_t>(p), 0);
    std::vector<std::vector<int>> chunk_held(size_t(p), std::vector<int>(size_t(s.chunks), 0));
    f.chunk_peak = chunk_held;
    for (int r = 0; r < p; ++r) f.start[size_t(r)].assign(s.steps[size_t(r)].size(), 0);
    auto run_entry = [&](int r, const PipeStep& e, size_t i) {
        const std::string at = "pipeline schedule: rank " + std::to_string(r) + " entry " + std::to_string(i) + " (" +
                               step_name(e, s.chunks > 1) + ")";
        if (e.chunk < 0 || e.chunk >= s.chunks || e.micro < 0 || e.micro >= s.micro)
            throw std::logic_error(at + ": no such micro-batch or chunk");
        if (e.slot < 0 || e.slot >= s.slots[size_t(r)][size_t(e.chunk)])
            throw std::logic_error(at + ": slot " + std::to_string(e.slot) + " of " +
                                   std::to_string(s.slots[size_t(r)][size_t(e.chunk)]));
        int& state = done[size_t(r)][{e.micro, e.chunk}];
        auto holder = slot_holder[size_t(r)].find({e.chunk, e.slot});
        if (!e.backward) {
            if (state != 0) throw std::logic_error(at + ": a second forward");
            if (holder != slot_holder[size_t(r)].end())
                throw std::logic_error(at + ": its slot still holds micro-batch " + std::to_string(holder->second));
            slot_holder[size_t(r)][{e.chunk, e.slot}] = e.micro;
            f.peak_in_flight[size_t(r)] = std::max(f.peak_in_flight[size_t(r)], ++in_flight[size_t(r)]);
            int& held = chunk_held[size_t(r)][size_t(e.chunk)];
            f.chunk_peak[size_t(r)][size_t(e.chunk)] = std::max(f.chunk_peak[size_t(r)][size_t(e.chunk)], ++held);
        } else {
            if (state != 1) throw std::logic_error(at + (state == 0 ? ": before its forward" : ": a second backward"));
            if (holder == slot_holder[size_t(r)].end() || holder->second != e.micro)
                throw std::logic_error(at + ": its activations are not in slot " + std::to_string(e.slot));
            slot_holder[size_t(r)].erase(holder);
            --in_flight[size_t(r)], --chunk_held[size_t(r)][size_t(e.chunk)];
        }
        state = e.backward ? 2 : 1;
        f.start[size_t(r)][i] = clock[size_t(r)];
        const double d = e.backward ? times.backward : times.forward;
        clock[size_t(r)] += d, busy[size_t(r)] += d;
    };
    for (;;) {
        bool progress = false, finished = true;
        for (int r = 0; r < p; ++r) {
            while (next[size_t(r)] < actions[size_t(r)].size()) {
                const Action& a = actions[size_t(r)][next[size_t(r)]];
                if (a.entry >= 0) {
                    run_entry(r, s.steps[size_t(r)][size_t(a.entry)], size_t(a.entry));
                    ++next[size_t(r)], progress = true;
                    continue;
                }
                bool all = true;
                for (int o : a.ops) {
                    Op& op = ops[size_t(o)];
                    if (!op.posted) op.posted = true, op.posted_at = clock[size_t(r)];
                    Op& other = ops[size_t(op.partner)];
                    if (!op.matched && other.posted) {
                        op.matched = other.matched = true;
                        op.matched_at = other.matched_at = std::max(op.posted_at, other.posted_at) + times.transfer;
                    }
                    all = all && op.matched;
                }
                if (!all) break;
                for (int o : a.ops) clock[size_t(r)] = std::max(clock[size_t(r)], ops[size_t(o)].matched_at);
                ++next[size_t(r)], progress = true;
            }
            finished = finished && next[size_t(r)] == actions[size_t(r)].size();
        }
        if (finished) break;
        if (!progress) {
            std::string waits;
            for (int r = 0; r < p; ++r) {
                if (next[size_t(r)] == actions[size_t(r)].size()) continue;
                for (int o : actions[size_t(r)][next[size_t(r)]].ops)
                    if (!ops[size_t(o)].matched)
                        waits += "; rank " + std::to_string(r) + (ops[size_t(o)].t.send ? " sends " : " receives ") +
                                 describe(ops[size_t(o)].t) + (ops[size_t(o)].t.send ? " to" : " from") + " rank " +
                                 std::to_string(ops[size_t(o)].t.peer);
            }
            throw std::logic_error("pipeline schedule: deadlock" + waits);
        }
    }
    for (int r = 0; r < p; ++r)
        for (int m = 0; m < s.micro; ++m)
            for (int c = 0; c < s.chunks; ++c)
                if (done[size_t(r)][{m, c}] != 2)
                    throw std::logic_error("pipeline schedule: rank " + std::to_string(r) + " never runs " +
                                           (done[size_t(r)][{m, c}] == 0 ? "the forward" : "the backward") +
                                           " of micro-batch " + std::to_string(m) + " chunk " + std::to_string(c));
    double total_busy = 0;
    for (int r = 0; r < p; ++r) f.makespan = std::max(f.makespan, clock[size_t(r)]), total_busy += busy[size_t(r)];
    f.bubble = f.makespan > 0 ? 1 - total_busy / (double(p) * f.makespan) : 0;
    return f;
}

std::string describe_pipeline_schedule(const PipelineSchedule& s) {
    std::string out = std::string(pipeline_schedule_name(s.kind)) + " over " + std::to_string(s.micro) +
                      " micro-batches" + (s.chunks > 1 ? ", " + std::to_string(s.chunks) + " chunks per rank" : "") +
                      ", activation slots per " + (s.chunks > 1 ? "rank (chunk 0+1+…)" : "stage");
    for (const std::vector<int>& rank : s.slots) {
        out += " ";
        for (size_t c = 0; c < rank.size(); ++c) out += (c ? "+" : "") + std::to_string(rank[c]);
    }
    char bubble[96];
    std::snprintf(bubble, sizeof bubble, ", bubble %.1f%% (simulated, backward = 2 forwards)",
                  100 * simulate_pipeline_schedule(s).bubble);
    return out + bubble;
}

std::string draw_pipeline_schedule(const PipelineSchedule& s) {
    const ScheduleFacts f = simulate_pipeline_schedule(s);
    const int columns = int(f.makespan);
    const bool chunks = s.chunks > 1;
    size_t width = 1;
    for (const auto& row : s.steps)
        for (const PipeStep& e : row) width = std::max(width, step_name(e, chunks).size());
    std::string out;
    for (int r = 0; r < s.ranks; ++r) {
        std::vector<std::string> cells(size_t(columns), ".");
        const auto& row = s.steps[size_t(r)];
        for (size_t i = 0; i < row.size(); ++i) {
            const int begin = int(f.start[size_t(r)][i]), length = row[i].backward ? 2 : 1;
            for (int c = begin; c < begin + length && c < columns; ++c) cells[size_t(c)] = step_name(row[i], chunks);
        }
        std::string line = "rank " + std::to_string(r) + " |";
        for (const std::string& c : cells) line += " " + c + std::string(width - c.size(), ' ');
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out += line + "\n";
    }
    char tail[160];
    std::snprintf(tail, sizeof tail, "%s, %d rank(s), %d micro-batch(es)%s: bubble %.1f%% (forward 1, backward 2)\n",
                  pipeline_schedule_name(s.kind), s.ranks, s.micro,
                  chunks ? (", " + std::to_string(s.chunks) + " chunks per rank").c_str() : "", 100 * f.bubble);
    return out + tail;
}

}  // namespace pv
