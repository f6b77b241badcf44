// Writing a file so that a crash never leaves a half-written file under its final name: the
// bytes go to `path.tmp`, which is fsynced, renamed over `path`, and the directory fsynced (best
// effort: some file systems refuse it). Shards, safetensors files and checkpoints all use it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace pv {

// Appends bytes to the file being written.
using ByteSink = std::function<void(const void* data, size_t bytes)>;

// Calls `write` with a sink into `path.tmp`, then makes the file durable and renames it over
// `path`. On any failure `path.tmp` is removed and std::runtime_error is thrown, its message
// starting "<kind> '<file>': " and naming the OS error (e.g. kind = "token shard").
void write_file_atomically(const std::string& path, const std::string& kind, const std::function<void(const ByteSink&)>& write);

}  // namespace pv
