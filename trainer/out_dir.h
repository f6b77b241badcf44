// The output directory a training run writes to (--out-dir: metrics.jsonl and step_N
// checkpoints), and what a run does with what is already there. Host C++ only.
//
//   - An empty --out-dir, or one that exists and is not a directory, is refused at start-up.
//   - Never clobbered. A new run (no --resume), or a branch into another directory, is refused
//     when --out-dir already holds a run — its metrics.jsonl or a complete step_N checkpoint —
//     naming what is there and the three ways on: --resume it, another --out-dir, or
//     --overwrite, which removes exactly those files (nothing else in the directory) once the
//     new run has loaded, and says what it removed.
//   - One writer at a time. Rank 0 holds an advisory lock (flock(2), exclusive) on
//     OUT/train.lock from before anything is loaded until the process ends, and writes its pid,
//     host and start time into the file; a second `train` into the same directory — a new run,
//     or a resume racing the writer — is refused, naming them. The kernel drops the lock when
//     the holder exits, however it exits, so a crash never leaves a stale lock behind (the file
//     stays; it is not part of the run). flock works across hosts on NFSv4 and Lustre (with
//     flock mounts), not on every network file system: there it is a local lock only.
//   - step_N.tmp directories are checkpoints a crash interrupted (model/checkpoint.h: never a
//     checkpoint, never resumed from); a run removes them when it starts writing there.
//   - Nothing the run did not write is replaced or removed. What a run writes, replaces or
//     removes there must be its own, or the run is refused before anything is loaded, naming
//     it: metrics.jsonl a regular file (not a link); each step_N a directory (not a link)
//     holding trainer_state.json, its marker; each step_N.tmp a directory (not a link) of
//     regular files only, as a crash leaves one. Files are opened with O_NOFOLLOW.
//   - --keep-checkpoints K: after a checkpoint is complete (committed), the complete checkpoints
//     older than the newest K are deleted — never before the new one is complete, and never one
//     later than the new one (that would be another run's: it stays).
//   - Branching. `--resume OUT/step_5` while OUT, the directory the run writes to, holds later
//     checkpoints (step_6, ...) would mix two histories in one directory (and `--resume OUT` would
//     then take the abandoned step_10), so it is refused, naming them, unless the user says what
//     happens to them: --out-dir NEW (the branch goes to NEW, whose metrics.jsonl starts with the
//     parent's history up to step 5) or --overwrite-later (the later checkpoints and the metrics
//     lines past step 5 are removed first, and the run says what it removed).
#pragma once

#include <string>
#include <vector>

namespace pv {

// Refuses (std::invalid_argument naming the fix) an empty out_dir, a path that is not a directory
// (or too long, or a dangling link), and an out_dir holding what is not the run's (above).
void check_out_dir(const std::string& out_dir);

// The smallest file size limit (ulimit -f) `train` can start under: Open MPI's start-up writes a
// 4 MiB file (its PMIx shared-memory store; measured: one process fails at 4000 KiB, starts at
// 4096 KiB, as do two ranks), and a checkpoint's files are larger still. A world of one that no
// launcher started runs without MPI (parallel/world.h) but is held to the same floor, which only
// toy models' checkpoints stay under.
inline constexpr unsigned long long kMinFileSizeLimit = 4ull << 20;

// Before MPI starts (MPI_Init fails with PMIx errors that say nothing of the limit): throws
// std::invalid_argument when the file size limit (RLIMIT_FSIZE) is below kMinFileSizeLimit,
// saying the limit in KiB and how to raise it.
void check_file_size_limit();

// What one checkpoint of a run writes, as the plan sizes it before step 1: its tensors' bytes (a
// lower bound: the files' headers and padding are left out), its largest file and that file's name.
struct CheckpointSize {
    unsigned long long total = 0, largest = 0;
    std::string largest_file;  // e.g. "adam_m.safetensors"
};

// Before step 1 (rank 0), so that no step is computed only to be lost: throws std::runtime_error
// when the file size limit (ulimit -f) is below the checkpoint's largest file, or out_dir's free
// space (statvfs) below the checkpoint's total, saying both sizes and the fix.
void check_room_for_checkpoint(const std::string& out_dir, const CheckpointSize& size);

// The files of a run in out_dir: metrics.jsonl and the complete checkpoints (paths, in that
// order); empty when there is none or out_dir does not exist. Unfinished step_N.tmp are not a
// run: every run removes them (above).
std::vector<std::string> run_files(const std::string& out_dir);

// The rule against clobbering: throws std::invalid_argument naming the run's files and the three
// choices when out_dir holds a run and `overwrite` is false. `resume` is the --resume given, for
// the message (empty: a new run).
void check_no_run(const std::string& out_dir, bool overwrite, const std::string& resume);

// --overwrite: removes run_files(out_dir); returns the lines to print.
std::vector<std::string> remove_run(const std::string& out_dir);

// Rank 0's lock on out_dir for the run (see above): creates out_dir if missing, takes the lock or
// throws std::runtime_error naming the holder (its pid, host and start) and the fix.
class OutDirLock {
  public:
    explicit OutDirLock(const std::string& out_dir);
    ~OutDirLock();
    OutDirLock(const OutDirLock&) = delete;
    OutDirLock& operator=(const OutDirLock&) = delete;

  private:
    int fd_ = -1;
};

// The branch rule above, before anything is loaded: throws std::invalid_argument naming the later
// checkpoints and the two flags, when out_dir holds complete checkpoints later than `step` (the
// resumed checkpoint's, `resume_dir`) and overwrite_later is false. A branch into another
// directory follows check_no_run instead; --overwrite of the directory being resumed is refused.
void check_branch(const std::string& resume_dir, long long step, const std::string& out_dir, bool overwrite_later,
                  bool overwrite);

// Makes out_dir ready for a run (rank 0, before its first step): creates it, removes stale
// step_N.tmp directories, and when resuming at `step` from `resume_dir` (empty: a fresh run)
// removes later checkpoints (overwrite_later) and writes metrics.jsonl with the history up to
// `step`: the directory's own, trimmed, or for a branch into another directory the parent's lines
// copied. Returns the lines to print (what was removed or copied).
std::vector<std::string> prepare_out_dir(const std::string& out_dir, const std::string& resume_dir, long long step,
                                         bool overwrite_later);

// --keep-checkpoints: deletes the complete checkpoints of out_dir with steps up to `newest` except
// the newest `keep` of them (keep 0: none deleted); returns their paths.
std::vector<std::string> prune_checkpoints(const std::string& out_dir, long long newest, long long keep);

}  // namespace pv
