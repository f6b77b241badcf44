// Pipeline schedules (DESIGN.md §2): which forward or backward each pipeline rank runs, in what
// order, as a table — checked by one simulator before anything runs, and then executed as written
// (trainer/trainer.h walks this rank's row; parallel/pipeline.h adds the transfers).
//
// A pipeline of p ranks holds the model's units in p·V contiguous stages ("virtual stages"): stage
// s runs on rank s mod p as that rank's chunk s div p (V = 1 but for the interleaved schedule). An
// optimizer step runs M micro-batches. Each table entry is (forward or backward, micro-batch,
// chunk, activation slot); forward (m, s) needs forward (m, s − 1) from the rank before, backward
// (m, s) needs backward (m, s + 1) from the rank after and its own forward.
//
//   gpipe        every rank: K forwards, then the same K backwards, group after group (K = the
//                micro-batches in flight, --in-flight; K = 1 is naive model parallelism, one
//                stage busy at a time). Stage r holds K micro-batches' activations.
//   1f1b         rank r: min(p − r − 1, M) warm-up forwards, then one forward and one backward
//                alternately, then the remaining backwards (PipeDream-Flush, Megatron's default).
//                Same bubble as GPipe with K = M, but rank r holds at most min(p − r, M)
//                micro-batches' activations instead of M.
//   interleaved  1F1B over V chunks per rank (Megatron's virtual stages): the forwards run p
//                micro-batches through chunk 0, then the same p through chunk 1, …; warm-up
//                (p − r − 1)·2 + (V − 1)·p. The bubble shrinks by about V, for V times the transfers.
// With --in-flight K the 1f1b schedules shorten their warm-up so that no rank holds more than K
// (memory for bubble; K ≥ 1).
//
// The bubble (p − 1)/(M + p − 1) of GPipe and 1F1B is the simulator's figure, not an assumption:
// it times every table with forward = 1 and backward = 2 (the usual ratio) and no transfer time.
//
// Transfers. Before a forward of stage s > 0 its rank receives the residual stream from stage
// s − 1's rank; after it, it sends its output to stage s + 1's; backwards the same in reverse
// with gradients. Point-to-point transfers in NCCL complete only when both sides have posted
// them, so each rank issues the sends after one round of its row and the receives before the
// next as ONE group (ncclGroupStart/End): otherwise two neighbours in 1F1B's steady state each
// wait in a send for the other's receive. A round is one entry (Megatron's
// send_forward_recv_backward and send_backward_recv_forward), or in the interleaved schedule's
// steady state a forward and a backward together (its four-way exchange: both outputs sent, the
// next forward's input and backward's gradient received). The simulator models exactly that: a
// group completes when every transfer in it has met its partner, and transfers between two ranks
// meet in the order they were issued.
#pragma once

#include <string>
#include <vector>

namespace pv {

enum class PipelineScheduleKind { gpipe, one_f_one_b, interleaved };
const char* pipeline_schedule_name(PipelineScheduleKind k);  // "gpipe", "1f1b", "interleaved"
// Throws std::invalid_argument naming the choices.
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);

struct PipeStep {
    bool backward = false;
    int micro = 0;  // the micro-batch of the optimizer step
    int chunk = 0;  // this rank's chunk (virtual stage chunk·p + rank)
    int slot = 0;   // the activation slot holding (micro, chunk) from its forward to its backward
    bool joined = false;  // runs in one round with the entry before it (header: transfers)
    bool operator==(const PipeStep&) const = default;
};

struct PipelineSchedule {
    PipelineScheduleKind kind = PipelineScheduleKind::gpipe;
    int ranks = 1, chunks = 1, micro = 1;
    std::vector<std::vector<PipeStep>> steps;  // per rank, in execution order
    // Per rank, per chunk: the activation slots its steps use (each chunk its own peak: in the
    // interleaved schedule a rank's first chunk holds more micro-batches than its last).
    std::vector<std::vector<int>> slots;
    int stage_of(int rank, int chunk) const { return chunk * ranks + rank; }
    int stages() const { return ranks * chunks; }
    int rank_slots(int rank) const;  // the sum over the rank's chunks
};

// The table of `kind` for `ranks` pipeline ranks, `micro` micro-batches per step, `chunks` per
// rank (interleaved: ≥ 2, and micro a multiple of ranks; else 1) and at most `in_flight`
// (micro-batch, chunk) pairs in flight per rank (0: the schedule's own: gpipe M, 1f1b p − r).
// Throws std::invalid_argument naming what cannot be scheduled and the fix.
PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int ranks, int micro, int chunks = 1,
                                        int in_flight = 0);

// One transfer a rank issues (the simulator's and the executor's view of a table).
struct PipeTransfer {
    bool send = false;
    int peer = 0;
    bool gradient = false;  // the residual stream's gradient (backward), else the stream (forward)
    int micro = 0;
    int stage = 0;  // the stage whose output (forward) or input gradient (backward) it carries
    bool operator==(const PipeTransfer&) const = default;
};
// The transfers rank `rank` issues as one group just before entry i of its row (i = the row's
// length: after its last): the sends of the previous round's entries and the receives of the
// round that starts at i. A round is an entry and the entries joined to it; empty inside a round.
std::vector<PipeTransfer> transfers_before(const PipelineSchedule& s, int rank, size_t i);

// How long the simulator takes for each entry and transfer: by default one forward of one stage
// is the unit, a backward takes 2 and a transfer nothing (the bubble's textbook figures); the
// performance model gives seconds (bench/pipeline_table.cpp).
struct PipeTimes {
    double forward = 1, backward = 2;
    double transfer = 0;  // from the later of a transfer's two sides posting it to its arrival
};

// What the simulator found, in PipeTimes' unit.
struct ScheduleFacts {
    double makespan = 0;                 // start of the first forward to the end of the last backward
    double bubble = 0;                   // idle fraction of rank-time: 1 − Σ busy / (ranks · makespan)
    std::vector<int> peak_in_flight;     // per rank: most (micro, chunk) forwards whose backward is pending
    std::vector<std::vector<int>> chunk_peak;  // per rank, per chunk: the same, counting that chunk's only
    std::vector<long long> sends, recvs;  // per rank
    std::vector<std::vector<double>> start;  // per rank, per entry: when it starts
};

// Runs the table (every rank, entries in order, each send grouped with the next receive — header
// comment, or each transfer alone when group_transfers is false) and checks: every (micro, stage)
// forward and backward exactly once on its stage's rank, a backward after its own forward, each
// activation slot free when a forward takes it, every receive met by the send of the data it
// expects, and no deadlock. Throws std::logic_error naming the first violation (a deadlock names
// what each rank waits for).
ScheduleFacts simulate_pipeline_schedule(const PipelineSchedule& s, bool group_transfers = true,
                                         const PipeTimes& times = {});

// One line: "1f1b over 8 micro-batches, activation slots per stage 4 3 2 1, bubble 27.3%
// (simulated, backward = 2 forwards)"; with chunks each rank's as "4+2" (chunk 0, chunk 1).
std::string describe_pipeline_schedule(const PipelineSchedule& s);

// The timeline as text, one line per rank, one column per time unit: "F3" forward of micro-batch
// 3 (with chunks: "F3.1", chunk 1), "B3" backward (two units), "." idle; and the bubble below.
std::string draw_pipeline_schedule(const PipelineSchedule& s);

}  // namespace pv
