// `train plot` (see trainer/plot.h).
#include "trainer/plot.h"

#include "model/checkpoint.h"
#include "trainer/state.h"

#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

namespace pv {

namespace fs = std::filesystem;

namespace {

// A gnuplot single-quoted string: a quote inside is doubled.
std::string quoted(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
}

// Adds (step, value) to `curve` when `key` holds a finite number; counts it when it is present but
// null or not finite (a step the run refused or skipped).
void take(const nlohmann::json& record, const char* key, long long step, std::vector<RunCurves::Point>& curve,
          long long& non_finite) {
    if (!record.contains(key)) return;
    const nlohmann::json& v = record.at(key);
    if (v.is_number() && std::isfinite(v.get<double>()))
        curve.push_back({step, v.get<double>()});
    else
        ++non_finite;
}

void write_curve(const fs::path& file, const std::vector<RunCurves::Point>& curve) {
    std::ofstream f(file);
    f.precision(17);
    for (const auto& p : curve) f << p.step << ' ' << p.value << '\n';
    if (!f) throw std::runtime_error("plot: cannot write " + file.string());
}

// Runs `gnuplot script` with its output captured; throws with what it printed when it fails.
void run_gnuplot(const fs::path& script, const fs::path& log) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("plot: cannot start gnuplot (fork failed)");
    if (pid == 0) {
        if (!std::freopen(log.c_str(), "w", stdout) || !std::freopen(log.c_str(), "a", stderr)) _exit(126);
        execlp("gnuplot", "gnuplot", script.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) throw std::runtime_error("plot: cannot wait for gnuplot");
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        throw std::runtime_error(
            "plot: gnuplot is not installed; install it with: apt-get install gnuplot-nox (Debian's gnuplot "
            "without X, which has the pngcairo terminal)");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw std::runtime_error("plot: gnuplot failed:\n" + text.str());
}

}  // namespace

RunCurves read_run_curves(const std::string& run) {
    const bool is_file = fs::is_regular_file(run);
    const fs::path metrics = is_file ? fs::path(run) : fs::path(run) / "metrics.jsonl";
    const fs::path dir = is_file ? metrics.parent_path() : fs::path(run);
    if (!fs::is_regular_file(metrics))
        throw std::runtime_error("plot: " + metrics.string() +
                                 " is not a file; give a run's output directory (it holds metrics.jsonl)");
    RunCurves c;
    c.label = fs::weakly_canonical(dir).filename().string();
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        nlohmann::json record;
        try {
            record = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
            ++c.unreadable;
            continue;
        }
        if (!record.is_object() || !record.contains("step") || !record.at("step").is_number_integer()) {
            ++c.unreadable;
            continue;
        }
        const long long step = record.at("step").get<long long>();
        take(record, "loss", step, c.loss, c.non_finite);
        take(record, "val_loss", step, c.val_loss, c.non_finite);
        take(record, "lr", step, c.lr, c.non_finite);
        take(record, "grad_norm", step, c.grad_norm, c.non_finite);
    }
    if (c.loss.empty() && c.val_loss.empty() && c.non_finite == 0)
        throw std::runtime_error("plot: " + metrics.string() + " holds no step records");
    // Tokens per step from the newest checkpoint, if it can be read; the plot goes on without.
    try {
        if (const auto latest = latest_checkpoint(dir.string(), kTrainerStateFile)) {
            const TrainerState s = read_trainer_state(*latest + "/" + kTrainerStateFile);
            c.tokens_per_step = (long long)s.options.batch * s.options.seq_len;
        }
    } catch (const std::exception&) {
        c.tokens_per_step = 0;
    }
    return c;
}

std::string plot_runs(const PlotOptions& o) {
    if (o.runs.empty()) throw std::invalid_argument("plot: give at least one run directory");
    std::vector<RunCurves> runs;
    for (const std::string& r : o.runs) runs.push_back(read_run_curves(r));
    const std::string out =
        !o.out.empty() ? o.out
                       : ((fs::is_regular_file(o.runs[0]) ? fs::path(o.runs[0]).parent_path() : fs::path(o.runs[0])) /
                          "loss.png")
                             .string();
    char pattern[] = "/tmp/polevault_plot_XXXXXX";
    if (!mkdtemp(pattern)) throw std::runtime_error("plot: cannot create a temporary directory in /tmp");
    const fs::path tmp = pattern;
    struct Cleanup {
        fs::path p;
        ~Cleanup() {
            std::error_code ec;
            fs::remove_all(p, ec);
        }
    } cleanup{tmp};
    // The token axis when every run has the same tokens per step.
    long long tokens = runs[0].tokens_per_step;
    for (const RunCurves& r : runs) tokens = r.tokens_per_step == tokens ? tokens : 0;
    long long left_out = 0, unreadable = 0;
    for (const RunCurves& r : runs) left_out += r.non_finite, unreadable += r.unreadable;

    std::ostringstream g;
    g << "set terminal pngcairo size " << o.width << "," << o.height << " noenhanced font 'sans,10'\n"
      << "set output " << quoted(out) << "\n"
      << "set datafile missing 'NaN'\nset grid\nset key top right noenhanced\n";
    std::string title = "polevault runs: ";
    for (size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : "") + runs[i].label;
    if (left_out > 0) title += "  (" + std::to_string(left_out) + " non-finite values left out)";
    if (unreadable > 0) title += "  (" + std::to_string(unreadable) + " unreadable lines skipped)";
    g << "set multiplot layout 3,1 title " << quoted(title) << "\n";
    // One panel: the curves of every run in one colour per run; `which` picks the curves.
    using Curves = std::vector<std::pair<const std::vector<RunCurves::Point>*, std::string>>;
    int file_index = 0;
    auto panel = [&](const std::string& name, bool logscale, const std::function<Curves(const RunCurves&)>& which) {
        g << "set title " << quoted(name) << "\nset xlabel 'step'\n";
        g << (logscale ? "set logscale y\n" : "unset logscale y\n");
        if (tokens > 0)
            g << "set x2label 'tokens'\nset x2tics\nset link x2 via x*" << tokens << " inverse x/" << tokens << "\n";
        else
            g << "unset x2label\nunset x2tics\nunset link x2\n";
        std::string plots;
        for (size_t i = 0; i < runs.size(); ++i)
            for (const auto& [curve, label] : which(runs[i])) {
                if (curve->empty()) continue;
                const fs::path file = tmp / ("curve" + std::to_string(file_index++) + ".dat");
                write_curve(file, *curve);
                const bool points = label.find("validation") != std::string::npos || curve->size() == 1;
                plots += std::string(plots.empty() ? "" : ", ") + quoted(file.string()) + " using 1:2 with " +
                         (points ? "linespoints dt 2 pt 7 ps 0.6" : "lines lw 1.5") + " lc " + std::to_string(i + 1) +
                         " title " + quoted(runs[i].label + " " + label);
            }
        if (plots.empty()) plots = "NaN title 'no finite values'";
        g << "plot " << plots << "\n";
    };
    panel("loss", false, [](const RunCurves& r) {
        return Curves{{&r.loss, "training"}, {&r.val_loss, "validation"}};
    });
    panel("learning rate", false, [](const RunCurves& r) { return Curves{{&r.lr, "lr"}}; });
    panel("gradient norm (before clipping)", true, [](const RunCurves& r) {
        return Curves{{&r.grad_norm, "grad norm"}};
    });
    g << "unset multiplot\n";
    const fs::path script = tmp / "plot.gp";
    std::ofstream(script) << g.str();
    run_gnuplot(script, tmp / "gnuplot.log");
    if (!fs::is_regular_file(out) || fs::file_size(out) == 0)
        throw std::runtime_error("plot: gnuplot wrote no " + out);
    return out;
}

}  // namespace pv
