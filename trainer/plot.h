// `train plot RUN_DIR... [--out FILE.png]`: a run's curves as a picture a person reads at a
// glance — training and validation loss, learning rate and gradient norm against steps (and the
// tokens they are), several runs on the same axes for comparison.
//
// It reads each run's metrics.jsonl (one JSON object per line: step records with loss, lr and
// grad_norm; evaluation records with val_loss; a non-finite value is null, a skipped step may lack
// one), and the batch and sequence length from the run's latest checkpoint (tokens = step × batch ×
// seq_len; without a checkpoint the token axis is left out). A point that is null or not finite is
// left out of its curve and counted in the title, so a run with non-finite steps still plots.
// Lines that are not JSON (a torn last line after a crash) are skipped and counted.
//
// The picture is drawn by gnuplot (Debian's gnuplot-nox, pngcairo terminal), run as a child
// process on a script and data files in a temporary directory; without gnuplot the command says
// which package to install. Host C++ only.
#pragma once

#include <string>
#include <vector>

namespace pv {

struct PlotOptions {
    std::vector<std::string> runs;  // output directories (or metrics.jsonl files)
    std::string out;                // the PNG; empty: loss.png in the first run's directory
    int width = 1200, height = 900;
};

// One run's curves, as read from its metrics.jsonl.
struct RunCurves {
    std::string label;  // the run directory's name
    struct Point {
        long long step;
        double value;
    };
    std::vector<Point> loss, val_loss, lr, grad_norm;
    long long tokens_per_step = 0;  // batch × seq_len from the latest checkpoint; 0: unknown
    long long non_finite = 0;       // points left out because they were null or not finite
    long long unreadable = 0;       // lines that were not JSON objects with a step
};

// Reads a run directory's metrics.jsonl (or the file itself) and its latest checkpoint's batch and
// sequence length. Throws std::runtime_error naming the file when it is missing or has no records.
RunCurves read_run_curves(const std::string& run);

// Writes the PNG; returns its path. Throws std::runtime_error when gnuplot is missing or fails.
std::string plot_runs(const PlotOptions& o);

}  // namespace pv
