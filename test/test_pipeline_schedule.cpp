// Pipeline schedules (parallel/schedule.h): every table the builders make passes the simulator;
// its bubble is the closed form from the literature — GPipe and 1F1B (p − 1)/(M + p − 1), the
// interleaved schedule (p − 1)/(V·M + p − 1) (Narayanan et al. 2021, with forward : backward = 1 : 2)
// — and its activation slots the schedules' definitions (GPipe M or its group, 1F1B min(p − r, M));
// 1F1B's transfers need the grouped send and receive (alone they deadlock); and damaged tables —
// reordered, incomplete, a slot reused too early — are refused with the place named.
#include <catch2/catch.hpp>

#include "parallel/schedule.h"
#include "test/error_of.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

using pv::PipelineScheduleKind;
using pv::test::error_of;

TEST_CASE("GPipe and 1F1B tables run, with the bubble (p-1)/(M+p-1) and their activation slots", "[schedule]") {
    for (int p = 1; p <= 6; ++p)
        for (int m = 1; m <= 12; ++m) {
            INFO(p << " ranks, " << m << " micro-batches");
            const double bubble = double(p - 1) / double(m + p - 1);
            const pv::PipelineSchedule gpipe = pv::make_pipeline_schedule(PipelineScheduleKind::gpipe, p, m);
            const pv::PipelineSchedule f1b1 = pv::make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, p, m);
            const pv::ScheduleFacts g = pv::simulate_pipeline_schedule(gpipe);
            const pv::ScheduleFacts f = pv::simulate_pipeline_schedule(f1b1);
            CHECK(g.bubble == Approx(bubble).margin(1e-12));
            CHECK(f.bubble == Approx(bubble).margin(1e-12));
            CHECK(g.makespan == f.makespan);
            for (int r = 0; r < p; ++r) {
                INFO("rank " << r);
                CHECK(gpipe.slots[size_t(r)] == std::vector<int>{m});
                CHECK(g.peak_in_flight[size_t(r)] == m);
                CHECK(f1b1.slots[size_t(r)] == std::vector<int>{std::min(p - r, m)});
                CHECK(f.peak_in_flight[size_t(r)] == std::min(p - r, m));
                // Each micro-batch's output sent on (not by the last stage), its gradient sent back (not by the first).
                const long long sends = (r + 1 < p ? m : 0) + (r > 0 ? m : 0);
                CHECK(f.sends[size_t(r)] == sends);
                CHECK(f.recvs[size_t(r)] == sends);
                CHECK(g.sends[size_t(r)] == sends);
            }
        }
}

TEST_CASE("a cap on the micro-batches in flight: GPipe's groups, 1F1B's shorter warm-up", "[schedule]") {
    for (int p : {2, 3, 4})
        for (int m : {3, 4, 8})
            for (int cap : {1, 2, 3}) {
                INFO(p << " ranks, " << m << " micro-batches, at most " << cap << " in flight");
                const auto gpipe = pv::make_pipeline_schedule(PipelineScheduleKind::gpipe, p, m, 1, cap);
                const auto f1b1 = pv::make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, p, m, 1, cap);
                const pv::ScheduleFacts g = pv::simulate_pipeline_schedule(gpipe);
                const pv::ScheduleFacts f = pv::simulate_pipeline_schedule(f1b1);
                for (int r = 0; r < p; ++r) {
                    CHECK(g.peak_in_flight[size_t(r)] == std::min(cap, m));
                    CHECK(f.peak_in_flight[size_t(r)] == std::min({cap, p - r, m}));
                }
                // Naive model parallelism (one in flight): one stage busy at a time, bubble (p-1)/p.
                if (cap == 1) CHECK(g.bubble == Approx(double(p - 1) / p).margin(1e-12));
                CHECK(f.bubble >= pv::simulate_pipeline_schedule(
                                      pv::make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, p, m))
                                          .bubble -
                                      1e-12);
            }
}

TEST_CASE("interleaved 1F1B: the bubble (p-1)/(V*M+p-1), V chunks per rank", "[schedule]") {
    for (int p : {2, 3, 4})
        for (int v : {2, 3})
            for (int m : {p, 2 * p, 4 * p}) {
                INFO(p << " ranks, " << v << " chunks, " << m << " micro-batches");
                const auto s = pv::make_pipeline_schedule(PipelineScheduleKind::interleaved, p, m, v);
                const pv::ScheduleFacts f = pv::simulate_pipeline_schedule(s);
                CHECK(f.bubble == Approx(double(p - 1) / double(v * m + p - 1)).margin(1e-12));
                for (int r = 0; r < p; ++r) {  // V times the transfers of 1F1B, less the ends of the pipeline
                    const long long sends = (r + 1 < p ? m : 0) + (r > 0 ? m : 0) + 2LL * m * (v - 1);
                    CHECK(f.sends[size_t(r)] == sends);
                    // Each chunk's slots are what the simulator counts in flight in that chunk, and
                    // the first chunk holds the most (its forwards run furthest ahead).
                    CHECK(s.slots[size_t(r)] == f.chunk_peak[size_t(r)]);
                    CHECK(std::is_sorted(s.slots[size_t(r)].rbegin(), s.slots[size_t(r)].rend()));
                    CHECK(s.rank_slots(r) >= f.peak_in_flight[size_t(r)]);
                }
            }
    CHECK(error_of<std::invalid_argument>(
              [] { pv::make_pipeline_schedule(PipelineScheduleKind::interleaved, 4, 6, 2); }) ==
          "the interleaved schedule runs the micro-batches through each chunk 4 at a time, but a step has 6: make "
          "the micro-batches per step a multiple of the pipeline's 4 ranks");
    CHECK_THROWS_AS(pv::make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, 2, 4, 2), std::invalid_argument);
    CHECK(error_of<std::invalid_argument>([] { pv::parse_pipeline_schedule("zb"); }) ==
          "unknown pipeline schedule 'zb': choose gpipe, 1f1b or interleaved");
}

TEST_CASE("interleaved 1F1B holds each chunk's own peak of micro-batches, worked by hand", "[schedule]") {
    // p = 2, V = 2, M = 4. Rank 0 warms up with (p − 1)·2 + (V − 1)·p = 4 forwards: F0.0 F1.0 F0.1
    // F1.1; then pairs F2.0 B0.1, F3.0 B1.1, F2.1 B0.0, F3.1 B1.0; then B2.1 B3.1 B2.0 B3.0. Chunk 0
    // holds micro-batches 0–3 before its first backward (4 slots); chunk 1 holds 0 and 1, frees both,
    // then holds 2 and 3 (2 slots). Rank 1 warms up with 2: F0.0 F1.0; then F0.1 B0.1, F1.1 B1.1,
    // F2.0 B0.0, F3.0 B1.0, F2.1 B2.1, F3.1 B3.1; then B2.0 B3.0. Chunk 0 holds 0, 1, 2 before B0.0
    // frees one (3 slots); chunk 1 one at a time (1 slot).
    const auto s = pv::make_pipeline_schedule(PipelineScheduleKind::interleaved, 2, 4, 2);
    CHECK(s.slots == std::vector<std::vector<int>>{{4, 2}, {3, 1}});
    CHECK(s.rank_slots(0) == 6);
    CHECK(s.rank_slots(1) == 4);
    CHECK(pv::describe_pipeline_schedule(s) ==
          "interleaved over 4 micro-batches, 2 chunks per rank, activation slots per rank (chunk 0+1+…) 4+2 3+1, "
          "bubble 11.1% (simulated, backward = 2 forwards)");
}

TEST_CASE("1F1B's neighbours each wait in a send unless the send and the next receive are one group",
          "[schedule]") {
    const auto s = pv::make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, 2, 4);
    const std::string e = error_of<std::logic_error>([&] { pv::simulate_pipeline_schedule(s, false); });
    CHECK(e ==
          "pipeline schedule: deadlock; rank 0 sends the output of stage 0 for micro-batch 1 to rank 1; rank 1 sends "
          "the gradient of stage 1 for micro-batch 0 to rank 0");
    // GPipe never sends both ways at once: it runs with the transfers alone too.
    CHECK_NOTHROW(pv::simulate_pipeline_schedule(pv::make_pipeline_schedule(PipelineScheduleKind::gpipe, 3, 4), false));
}

TEST_CASE("damaged tables are refused, naming the first violation", "[schedule]") {
    const auto good = pv::make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, 3, 4);
    {  // two backwards of the middle rank swapped: the gradients it sends arrive out of order
        auto s = good;
        auto& row = s.steps[1];
        auto b0 = std::find(row.begin(), row.end(), pv::PipeStep{true, 0, 0, row[0].slot});
        auto b1 = std::find_if(row.begin(), row.end(), [](const pv::PipeStep& e) { return e.backward && e.micro == 1; });
        REQUIRE(b0 != row.end());
        REQUIRE(b1 != row.end());
        std::iter_swap(b0, b1);
        CHECK(error_of<std::logic_error>([&] { pv::simulate_pipeline_schedule(s); }).find("pipeline schedule: rank 1 -> rank 0: transfer 0 sends the gradient of stage 1 for micro-batch 1 where the receiver expects the gradient of stage 1 for micro-batch 0") == 0);
    }
    {  // the last rank's final backward dropped
        auto s = good;
        s.steps[2].pop_back();
        CHECK(error_of<std::logic_error>([&] { pv::simulate_pipeline_schedule(s); }) ==
              "pipeline schedule: rank 2 -> rank 1: a receive of the gradient of stage 2 for micro-batch 3 that is "
              "never sent");
    }
    {  // a backward before its forward on the last rank (which receives nothing for it)
        auto s = good;
        std::swap(s.steps[2][0], s.steps[2][1]);
        CHECK(error_of<std::logic_error>([&] { pv::simulate_pipeline_schedule(s); }).find("before its forward") !=
              std::string::npos);
    }
    {  // the first rank puts two micro-batches in one slot
        auto s = good;
        for (pv::PipeStep& e : s.steps[0]) e.slot = 0;
        CHECK(error_of<std::logic_error>([&] { pv::simulate_pipeline_schedule(s); }) ==
              "pipeline schedule: rank 0 entry 1 (F1): its slot still holds micro-batch 0");
    }
}

TEST_CASE("the timeline as text", "[schedule]") {
    // Worked by hand: stage 1 starts one forward later; stage 0's first backward waits for stage 1's.
    CHECK(pv::draw_pipeline_schedule(pv::make_pipeline_schedule(PipelineScheduleKind::gpipe, 2, 2)) ==
          "rank 0 | F0 F1 .  .  .  B0 B0 B1 B1\n"
          "rank 1 | .  F0 F1 B0 B0 B1 B1 .  .\n"
          "gpipe, 2 rank(s), 2 micro-batch(es): bubble 33.3% (forward 1, backward 2)\n");
}
