#include "model/grid_dispatch.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace pv {

int resident_blocks(const SmLimits& sm, int threads, int registers, size_t shared) {
    if (threads <= 0 || registers < 0) throw std::invalid_argument("resident_blocks: a block needs threads");
    const int warps = (threads + 31) / 32;
    const int per_thread = std::max(8, (registers + 7) / 8 * 8);
    const int warps_by_registers = sm.registers / (per_thread * 32);
    if (shared > sm.shared_bytes_per_block || warps > warps_by_registers || threads > sm.threads) return 0;
    const int by_registers = warps_by_registers / warps;
    const int by_shared = int(sm.shared_bytes / (shared + sm.reserved_shared_per_block));
    return std::min({by_registers, by_shared, sm.threads / (warps * 32), sm.blocks});
}

namespace {

// The blocks of one launch, taken in order.
class LaunchOrder {
  public:
    explicit LaunchOrder(const std::vector<BlockRun>& grid) : grid_(grid) {}
    bool next(double& work) {
        while (run_ < grid_.size() && taken_ == grid_[run_].blocks) ++run_, taken_ = 0;
        if (run_ == grid_.size()) return false;
        ++taken_;
        work = grid_[run_].work;
        return true;
    }

  private:
    const std::vector<BlockRun>& grid_;
    size_t run_ = 0;
    long long taken_ = 0;
};

struct Sm {
    std::vector<double> remaining;  // each resident block's work left
    double since = 0;               // when `remaining` was last brought up to date
    long version = 0;               // bumped when its blocks change (stale events are skipped)
};

}  // namespace

double grid_seconds(const std::vector<BlockRun>& grid, int sms, int blocks_per_sm, int warps_per_block,
                    const SmIssue& issue) {
    if (sms <= 0 || blocks_per_sm <= 0 || warps_per_block <= 0 || issue.rate <= 0 || issue.full_warps <= 0)
        throw std::invalid_argument("grid_seconds: no SM to run a block on");
    // Each resident block's rate on an SM holding `n` blocks, in units of the SM's full rate: the
    // schedule is worked out in instructions and scaled once at the end, so that the rate (an
    // efficiency, a clock) cannot change which blocks tie and so the order they run in.
    const auto block_rate = [&](size_t n) {
        const double warps = double(n) * warps_per_block;
        return std::min(1.0, warps / issue.full_warps) / double(n);
    };
    LaunchOrder order(grid);
    std::vector<Sm> sm(static_cast<size_t>(sms));
    double work = 0;
    for (int round = 0; round < blocks_per_sm; ++round)
        for (Sm& s : sm)
            if (order.next(work)) s.remaining.push_back(work);
    // The next block end on each SM, earliest first: (time, SM, the SM's version then).
    using Event = std::tuple<double, size_t, long>;
    std::priority_queue<Event, std::vector<Event>, std::greater<>> ends;
    const auto schedule = [&](size_t i) {
        Sm& s = sm[i];
        if (s.remaining.empty()) return;
        const double least = *std::min_element(s.remaining.begin(), s.remaining.end());
        ends.emplace(s.since + least / block_rate(s.remaining.size()), i, s.version);
    };
    for (size_t i = 0; i < sm.size(); ++i) schedule(i);
    double end = 0;
    while (!ends.empty()) {
        const auto [t, i, version] = ends.top();
        ends.pop();
        Sm& s = sm[i];
        if (version != s.version) continue;
        const double done = (t - s.since) * block_rate(s.remaining.size());
        std::vector<double> left;
        for (double r : s.remaining)
            if (r - done > 1e-9 * std::max(1.0, r)) left.push_back(r - done);
        // The blocks that ended give their places to the next ones in launch order.
        for (size_t ended = s.remaining.size() - left.size(); ended > 0 && order.next(work); --ended)
            left.push_back(work);
        s.remaining = std::move(left);
        s.since = t;
        ++s.version;
        end = std::max(end, t);
        schedule(i);
    }
    return end / issue.rate;
}

}  // namespace pv
