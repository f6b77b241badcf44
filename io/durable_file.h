// Durable writes, and the project's one fsync policy. A file is written to `path.tmp`, fsynced,
// renamed over `path` and its directory fsynced, so a crash leaves the old file or the complete
// new one under the final name; a directory of files (a checkpoint) is fsynced entry by entry and
// published by one rename. Every fsync failure is an error, of a file or a directory alike (no
// EINVAL exception, no best effort): a write that is not known to be durable is never reported as
// done. Errors are std::runtime_error naming the path and the OS error (strerror). Shards, the
// tokenizer, config.json, safetensors files, trainer_state.json and checkpoint directories all go
// through here.
//
// Every file written is checksummed (XXH3-64, io/checksum.h) as its bytes pass through the sink,
// so a checkpoint records what it wrote without reading it back: a WriteRecorder alive on the
// writing thread collects each file's final path, size and checksum (save_checkpoint keeps one
// while it writes a step_N.tmp/ and stores the list in trainer_state.json). Host code only (g++);
// no CUDA headers.
#pragma once

#include "io/checksum.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pv {

// Appends bytes to the file being written.
using ByteSink = std::function<void(const void* data, size_t bytes)>;

// A file write_file_atomically completed: the path it was renamed to, its size and checksum.
struct WrittenFile {
    std::string path;
    FileDigest digest;
};

// While alive, collects every file write_file_atomically completes on this thread (the writes of
// one checkpoint). Recorders nest: the innermost collects.
class WriteRecorder {
  public:
    WriteRecorder();
    ~WriteRecorder();
    WriteRecorder(const WriteRecorder&) = delete;
    WriteRecorder& operator=(const WriteRecorder&) = delete;
    const std::vector<WrittenFile>& files() const { return files_; }
    static void record(WrittenFile file);  // to the innermost recorder, if any

  private:
    std::vector<WrittenFile> files_;
    WriteRecorder* outer_;
};

// Calls `write` with a sink into `path.tmp`, then makes the file durable and renames it over
// `path`, then fsyncs the directory. On any failure std::runtime_error is thrown, its message
// starting "<kind> '<file>': " and naming the OS error (e.g. kind = "token shard"); `path.tmp` is
// removed if the failure comes before the rename. A failed directory fsync is thrown too, though
// the new file is then already in place under `path`. Returns the size and checksum of what was
// written (also given to the thread's WriteRecorder).
FileDigest write_file_atomically(const std::string& path, const std::string& kind,
                                 const std::function<void(const ByteSink&)>& write);

// A file a run appends records to as it goes (metrics.jsonl): every write is checked. Opened
// with O_NOFOLLOW, so a symbolic link at `path` is refused, never followed out of the run's
// directory, and anything but a regular file is refused; `truncate` starts it empty (a new run),
// otherwise records are appended. A failed or short write, or a failed close, throws
// std::runtime_error "<kind> '<path>': write failed: <os error> (<what to do>)": no record is
// dropped silently. Not fsynced per record: a crash may lose the last records, never corrupt the
// earlier ones.
class AppendedFile {
  public:
    AppendedFile(const std::string& path, const std::string& kind, bool truncate);
    ~AppendedFile();
    AppendedFile(const AppendedFile&) = delete;
    AppendedFile& operator=(const AppendedFile&) = delete;
    void write(const std::string& bytes);
    void close();  // checked; the destructor closes unchecked (after an error)

  private:
    int fd_ = -1;
    std::string path_, kind_;
};

// What to do about a failed write's errno, in words: a full file system, the file size limit
// (naming it, from getrlimit), a read-only file system; empty for others.
std::string write_error_advice(int error);

// The file size limit (RLIMIT_FSIZE, what `ulimit -f` sets) in bytes; 0 when unlimited.
uint64_t file_size_limit();

// write_file_atomically of a copy of the regular file `from` (io/input_file.h), byte for byte, read
// in bounded pieces. Errors name `from` or `to`.
FileDigest copy_file_atomically(const std::string& from, const std::string& to, const std::string& kind);

// fsync of a file (directory = false) or a directory (directory = true) by path. Throws
// std::runtime_error "<kind> '<path>': cannot open to fsync: <os error>" or "... fsync failed:
// <os error>"; kind defaults to "file" or "directory".
void fsync_path(const std::string& path, bool directory, const std::string& kind = {});

// Makes `tmp_dir` durable before it is published: fsyncs every regular file and directory under it
// (symlinks and other entries are not followed) and then `tmp_dir` itself. Errors as fsync_path's,
// plus "<kind> '<path>': cannot list: ..." / "cannot stat: ...".
void fsync_tree(const std::string& tmp_dir, const std::string& kind);

// Publishes `from` under the name `to` with rename(2) (atomic: a crash leaves one name or the
// other) and fsyncs the parent directory of `to`. A rename failure throws "<kind> '<to>': cannot
// rename '<from>' to it: <os error>". `from` and `to` must lie on one file system; a directory
// `to` must not exist or be empty.
void rename_durably(const std::string& from, const std::string& to, const std::string& kind);

}  // namespace pv
