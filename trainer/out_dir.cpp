// The output directory's housekeeping and the branch rule (see out_dir.h).
#include "trainer/out_dir.h"

#include "io/durable_file.h"
#include "model/checkpoint.h"
#include "trainer/state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <string_view>
#include <system_error>

namespace pv {
namespace {

namespace fs = std::filesystem;

// The complete checkpoints of out_dir later than `step`.
std::vector<CheckpointDir> later_checkpoints(const std::string& out_dir, long long step) {
    std::vector<CheckpointDir> later = list_checkpoints(out_dir, kTrainerStateFile);
    later.erase(std::remove_if(later.begin(), later.end(), [&](const CheckpointDir& c) { return c.step <= step; }),
                later.end());
    return later;
}

// "metrics.jsonl, step_6, step_7" (the first few names, then how many more).
std::string file_names(const std::vector<std::string>& paths) {
    std::string out;
    for (size_t i = 0; i < paths.size() && i < 4; ++i) out += (i ? ", " : "") + fs::path(paths[i]).filename().string();
    if (paths.size() > 4) out += " and " + std::to_string(paths.size() - 4) + " more";
    return out;
}

std::string names(const std::vector<CheckpointDir>& dirs) {
    std::vector<std::string> paths;
    for (const CheckpointDir& d : dirs) paths.push_back(d.path);
    return file_names(paths);
}

void remove_dir(const std::string& path, const std::string& why) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) throw std::runtime_error("cannot remove " + path + " (" + why + "): " + ec.message());
}

// Whether two paths name one directory (the second need not exist yet).
bool same_dir(const std::string& a, const std::string& b) {
    std::error_code ec;
    const fs::path x = fs::weakly_canonical(a, ec);
    if (ec) return false;
    const fs::path y = fs::weakly_canonical(b, ec);
    return !ec && x == y;
}

// The output directory a checkpoint directory belongs to.
std::string parent_of(const std::string& checkpoint_dir) {
    fs::path p(checkpoint_dir);
    if (!p.has_filename()) p = p.parent_path();  // "out/step_5/"
    const fs::path parent = p.parent_path();
    return parent.empty() ? "." : parent.string();
}

// Whether `name` is step_N or step_N.tmp (N decimal digits): a name a run writes and replaces.
bool checkpoint_name(std::string name) {
    constexpr std::string_view prefix = "step_", suffix = ".tmp";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        name.resize(name.size() - suffix.size());
    return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
           name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

bool is_real_directory(const fs::path& p) {
    std::error_code ec;
    return fs::symlink_status(p, ec).type() == fs::file_type::directory;
}

// Why the entry `p` named step_N or step_N.tmp is not the run's own (empty: it is). A run's
// step_N is a directory (not a link) holding its marker, trainer_state.json; a run's step_N.tmp
// is a directory (not a link) of regular files only, a checkpoint a crash interrupted.
std::string not_the_runs(const fs::path& p) {
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(p, ec))) return "is a symbolic link";
    if (!is_real_directory(p)) return "is not a directory";
    if (p.extension() != ".tmp")
        return fs::symlink_status(p / kTrainerStateFile, ec).type() == fs::file_type::regular
                   ? ""
                   : "holds no " + std::string(kTrainerStateFile) + " (it is no checkpoint of a run)";
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
        if (it->symlink_status(ec).type() != fs::file_type::regular)
            return "holds " + it->path().filename().string() + ", which is not a regular file (a checkpoint's is)";
    return ec ? "cannot be listed: " + ec.message() : "";
}

}  // namespace

void check_out_dir(const std::string& out_dir) {
    if (out_dir.empty())
        throw std::invalid_argument(
            "--out-dir is empty: name the directory the run writes metrics.jsonl and its step_N checkpoints to (e.g. "
            "--out-dir runs/first)");
    std::error_code ec;
    const fs::file_status status = fs::status(out_dir, ec);
    if (ec && status.type() != fs::file_type::not_found)
        throw std::invalid_argument(
            "--out-dir " + out_dir + ": " + ec.message() +
            (ec == std::errc::filename_too_long
                 ? " (a component of the path is longer than NAME_MAX, 255 bytes, or the whole path longer than "
                   "PATH_MAX, 4096): choose a shorter path"
                 : ": choose another path for the run's output"));
    if (status.type() == fs::file_type::not_found && fs::is_symlink(fs::symlink_status(out_dir, ec)))
        throw std::invalid_argument("--out-dir " + out_dir + " is a symbolic link to " +
                                    fs::read_symlink(out_dir, ec).string() +
                                    ", which does not exist: create that directory, or choose another --out-dir");
    if (status.type() != fs::file_type::not_found && !fs::is_directory(status))
        throw std::invalid_argument("--out-dir " + out_dir +
                                    " exists and is not a directory: choose another path for the run's output");
    if (status.type() == fs::file_type::not_found) return;
    // What the run writes, replaces or removes must be its own: refused before anything is loaded.
    const fs::path metrics = fs::path(out_dir) / "metrics.jsonl";
    const fs::file_type metrics_type = fs::symlink_status(metrics, ec).type();
    if (metrics_type != fs::file_type::not_found && metrics_type != fs::file_type::regular)
        throw std::invalid_argument(metrics.string() + " is " +
                                    (metrics_type == fs::file_type::symlink ? "a symbolic link" : "not a regular file") +
                                    ": a run writes its metrics only into a file of its own there; move it away, or "
                                    "choose another --out-dir");
    for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (!checkpoint_name(it->path().filename().string())) continue;
        if (const std::string why = not_the_runs(it->path()); !why.empty())
            throw std::invalid_argument(it->path().string() + " " + why +
                                        ": it is not a checkpoint this program wrote, and a run replaces or removes "
                                        "step_N and step_N.tmp in its --out-dir; move it away, or choose another "
                                        "--out-dir");
    }
}

void check_file_size_limit() {
    const uint64_t limit = file_size_limit();
    if (limit == 0 || limit >= kMinFileSizeLimit) return;
    throw std::invalid_argument(
        "the file size limit (ulimit -f) is " + std::to_string(limit / 1024) +
        " KiB: too small for a run (a rank's MPI start-up under mpirun alone writes a file of " +
        std::to_string(kMinFileSizeLimit >> 20) +
        " MiB, a checkpoint's files are larger still); raise it with `ulimit -f unlimited`");
}

namespace {
std::string mib_text(unsigned long long bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(1 << 20));
    return text;
}
}  // namespace

void check_room_for_checkpoint(const std::string& out_dir, const CheckpointSize& size) {
    const uint64_t limit = file_size_limit();
    if (limit != 0 && size.largest > limit)
        throw std::runtime_error("the file size limit (ulimit -f) is " + std::to_string(limit / 1024) +
                                 " KiB, and this run's checkpoints hold a file of at least " + mib_text(size.largest) +
                                 " (" + size.largest_file + "): raise it with `ulimit -f unlimited` (checked before "
                                 "step 1, so no step is computed only to be lost)");
    struct statvfs fs_stats {};
    if (::statvfs(out_dir.c_str(), &fs_stats) != 0) return;  // unknown: the writes say what fails
    const unsigned long long free_bytes = (unsigned long long)fs_stats.f_bavail * fs_stats.f_frsize;
    if (free_bytes < size.total)
        throw std::runtime_error("--out-dir " + out_dir + " has " + mib_text(free_bytes) +
                                 " free, and a checkpoint of this run needs at least " + mib_text(size.total) +
                                 ": free space there, or choose another --out-dir (checked before step 1, so no step "
                                 "is computed only to be lost)");
}

std::vector<std::string> run_files(const std::string& out_dir) {
    std::vector<std::string> files;
    std::error_code ec;
    if (!fs::is_directory(out_dir, ec)) return files;
    const fs::path metrics = fs::path(out_dir) / "metrics.jsonl";
    if (fs::symlink_status(metrics, ec).type() != fs::file_type::not_found) files.push_back(metrics.string());
    for (const CheckpointDir& c : list_checkpoints(out_dir, kTrainerStateFile)) files.push_back(c.path);
    return files;
}

void check_no_run(const std::string& out_dir, bool overwrite, const std::string& resume) {
    const std::vector<std::string> files = run_files(out_dir);
    if (files.empty() || overwrite) return;
    const std::string what = resume.empty() ? "a new run" : "the branch of --resume " + resume;
    throw std::invalid_argument("--out-dir " + out_dir + " already holds a run (" + file_names(files) + "); " + what +
                                " there would destroy it. Continue that run with --resume " + out_dir +
                                ", write this one to another --out-dir, or pass --overwrite to remove " +
                                file_names(files) + " first (other files there are left alone)");
}

std::vector<std::string> remove_run(const std::string& out_dir) {
    const std::vector<std::string> files = run_files(out_dir);
    for (const std::string& f : files) remove_dir(f, "--overwrite");
    if (files.empty()) return {};
    return {"--overwrite: removed the run that was in " + out_dir + " (" + file_names(files) + ")"};
}

OutDirLock::OutDirLock(const std::string& out_dir) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) throw std::runtime_error("cannot create the output directory " + out_dir + ": " + ec.message());
    const std::string path = (fs::path(out_dir) / "train.lock").string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0)
        throw std::runtime_error("cannot open " + path + " (the output directory's lock): " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int error = errno;
        std::string holder(256, '\0');
        const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
        holder.resize(n > 0 ? size_t(n) : 0);
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
        ::close(fd_);
        fd_ = -1;
        if (error != EWOULDBLOCK)
            throw std::runtime_error("cannot lock " + path + ": " + std::strerror(error));
        throw std::runtime_error("--out-dir " + out_dir + " is being written by another train (" +
                                 (holder.empty() ? "its details not yet written" : holder) +
                                 "): two runs in one directory would mix their checkpoints and metrics. Wait for "
                                 "it to end (then --resume " + out_dir + " continues it), or choose another --out-dir");
    }
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    char started[64] = "";
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    ::gmtime_r(&now, &utc);
    std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S UTC", &utc);
    const std::string line = "pid " + std::to_string(::getpid()) + " on host " + host + ", since " + started + "\n";
    // Best effort: the lock, not the text, is what keeps a second writer out.
    if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, line.data(), line.size(), 0) < 0) {}
}

OutDirLock::~OutDirLock() {
    if (fd_ >= 0) ::close(fd_);  // closing drops the lock
}

void check_branch(const std::string& resume_dir, long long step, const std::string& out_dir, bool overwrite_later,
                  bool overwrite) {
    if (!same_dir(parent_of(resume_dir), out_dir)) return check_no_run(out_dir, overwrite, resume_dir);
    if (overwrite)
        throw std::invalid_argument("--overwrite with --resume " + resume_dir +
                                    " would remove the run being resumed: drop it (--overwrite-later removes only "
                                    "the checkpoints after the resumed one)");
    const std::vector<CheckpointDir> later = later_checkpoints(out_dir, step);
    if (later.empty() || overwrite_later) return;
    throw std::invalid_argument(
        "--resume " + resume_dir + ": the output directory " + out_dir + " already holds later checkpoints (" +
        names(later) +
        ") of the run this one would branch off; writing the branch there would mix two histories. "
        "Pass --out-dir NEW to put the branch in another directory (its metrics.jsonl starts with this history up to "
        "step " +
        std::to_string(step) + "), or --overwrite-later to remove " + names(later) + " and the metrics past step " +
        std::to_string(step) + " first");
}

std::vector<std::string> prepare_out_dir(const std::string& out_dir, const std::string& resume_dir, long long step,
                                         bool overwrite_later) {
    std::vector<std::string> said;
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) throw std::runtime_error("cannot create the output directory " + out_dir + ": " + ec.message());
    for (const std::string& tmp : checkpoint_temporaries(out_dir)) {
        if (!not_the_runs(tmp).empty()) check_out_dir(out_dir);  // says why it is not removed
        remove_dir(tmp, "a checkpoint a crash left unfinished");
        said.push_back("removed " + tmp + ": a checkpoint whose writing never finished (never resumed from)");
    }
    const std::string metrics = (fs::path(out_dir) / "metrics.jsonl").string();
    if (resume_dir.empty()) return said;
    std::string removed;
    if (overwrite_later) {
        const std::vector<CheckpointDir> later = later_checkpoints(out_dir, step);
        for (const CheckpointDir& c : later) remove_dir(c.path, "--overwrite-later");
        removed = names(later);
    }
    const std::string parent = parent_of(resume_dir);
    if (same_dir(parent, out_dir)) {
        const MetricsCopy c = copy_metrics(metrics, metrics, step);
        if (overwrite_later)
            said.push_back("--overwrite-later: removed " + (removed.empty() ? "no checkpoints" : removed) + " from " +
                           out_dir + " and " + std::to_string(c.dropped) + " metrics line(s) past step " +
                           std::to_string(step));
        return said;
    }
    // A branch into another directory: its history up to `step` is the parent's.
    MetricsCopy c = copy_metrics((fs::path(parent) / "metrics.jsonl").string(), metrics, step);
    if (!c.found) copy_metrics(metrics, metrics, step);  // none to copy: at least no lines past `step`
    if (overwrite_later && !removed.empty())
        said.push_back("--overwrite-later: removed " + removed + " from " + out_dir);
    said.push_back("branch: " + out_dir + " continues " + resume_dir +
                   (c.found ? "; its metrics.jsonl starts with " + std::to_string(c.kept) + " line(s) of " + parent +
                                  "'s history up to step " + std::to_string(step)
                            : " (" + parent + " has no metrics.jsonl to copy)"));
    return said;
}

std::vector<std::string> prune_checkpoints(const std::string& out_dir, long long newest, long long keep) {
    std::vector<std::string> removed;
    if (keep <= 0) return removed;
    std::vector<CheckpointDir> all = list_checkpoints(out_dir, kTrainerStateFile);
    all.erase(std::remove_if(all.begin(), all.end(), [&](const CheckpointDir& c) { return c.step > newest; }),
              all.end());
    for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
        remove_dir(all[i].path, "--keep-checkpoints " + std::to_string(keep));
        removed.push_back(all[i].path);
    }
    return removed;
}

}  // namespace pv
