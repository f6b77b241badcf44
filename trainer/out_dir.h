// The output directory a training run writes to (--out-dir: metrics.jsonl and step_N
// checkpoints), and what a run does with what is already there. Host C++ only.
//
//   - An empty --out-dir, or one that exists and is not a directory, is refused at start-up.
//   - step_N.tmp directories are checkpoints a crash interrupted (model/checkpoint.h: never a
//     checkpoint, never resumed from); a run removes them when it starts writing there.
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

// Refuses (std::invalid_argument naming the fix) an empty out_dir or a path that is not a directory.
void check_out_dir(const std::string& out_dir);

// The branch rule above, before anything is loaded: throws std::invalid_argument naming the later
// checkpoints and the two flags, when out_dir holds complete checkpoints later than `step` (the
// resumed checkpoint's, `resume_dir`) and overwrite_later is false.
void check_branch(const std::string& resume_dir, long long step, const std::string& out_dir, bool overwrite_later);

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
