// write_file_atomically, fsync_path, fsync_tree, rename_durably: the one fsync policy described in
// io/durable_file.h.
#include "io/durable_file.h"

#include "io/input_file.h"
#include "io/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace pv {
namespace {

namespace fs = std::filesystem;

// Closes a descriptor on every path out of a scope.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

[[noreturn]] void fail(const std::string& kind, const std::string& path, const std::string& what) {
    throw std::runtime_error(kind + " '" + path + "': " + what);
}

// The directory a rename into `path` changes; "." for a bare file name.
std::string parent_of(const std::string& path) {
    const fs::path parent = fs::path(path).parent_path();
    return parent.empty() ? std::string(".") : parent.string();
}

thread_local WriteRecorder* innermost_recorder = nullptr;

}  // namespace

WriteRecorder::WriteRecorder() : outer_(innermost_recorder) { innermost_recorder = this; }
WriteRecorder::~WriteRecorder() { innermost_recorder = outer_; }
void WriteRecorder::record(WrittenFile file) {
    if (innermost_recorder) innermost_recorder->files_.push_back(std::move(file));
}

void fsync_path(const std::string& path, bool directory, const std::string& kind_in) {
    const std::string kind = !kind_in.empty() ? kind_in : directory ? "directory" : "file";
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
    if (f.fd < 0) fail(kind, path, "cannot open to fsync: " + std::string(std::strerror(errno)));
    if (::fsync(f.fd) != 0) fail(kind, path, "fsync failed: " + std::string(std::strerror(errno)));
}

void fsync_tree(const std::string& tmp_dir, const std::string& kind) {
    std::error_code ec;
    fs::recursive_directory_iterator it(tmp_dir, ec);
    if (ec) fail(kind, tmp_dir, "cannot list: " + ec.message());
    while (it != fs::recursive_directory_iterator()) {
        const fs::file_status status = it->symlink_status(ec);
        if (ec) fail(kind, it->path().string(), "cannot stat: " + ec.message());
        if (fs::is_regular_file(status))
            fsync_path(it->path().string(), false, kind);
        else if (fs::is_directory(status))
            fsync_path(it->path().string(), true, kind);
        it.increment(ec);
        if (ec) fail(kind, tmp_dir, "cannot list: " + ec.message());
    }
    fsync_path(tmp_dir, true, kind);
}

void rename_durably(const std::string& from, const std::string& to, const std::string& kind) {
    if (::rename(from.c_str(), to.c_str()) != 0)
        fail(kind, to, "cannot rename '" + from + "' to it: " + std::strerror(errno));
    fsync_path(parent_of(to), true, kind);
}

FileDigest write_file_atomically(const std::string& path, const std::string& kind,
                                 const std::function<void(const ByteSink&)>& write) {
    const std::string tmp = path + ".tmp";
    Xxh3 checksum;
    uint64_t written = 0;
    {
        Fd f;
        f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (f.fd < 0)
            fail(kind, tmp,
                 "cannot create: " + std::string(std::strerror(errno)) +
                     " (does the directory exist and is it writable?)");
        try {
            write([&](const void* data, size_t n) {
                checksum.update(data, n);
                written += n;
                Progress::report_to_current(double(n));  // a checkpoint's or an export's (io/progress.h)
                const char* p = static_cast<const char*>(data);
                while (n > 0) {
                    const ssize_t w = ::write(f.fd, p, n);
                    if (w < 0 && errno == EINTR) continue;
                    if (w <= 0)
                        fail(kind, tmp,
                             "write failed: " + std::string(std::strerror(errno)) +
                                 " (check free disk space and permissions)");
                    p += w;
                    n -= size_t(w);
                }
            });
            if (::fsync(f.fd) != 0) fail(kind, tmp, "fsync failed: " + std::string(std::strerror(errno)));
            const int fd = f.fd;
            f.fd = -1;
            if (::close(fd) != 0) fail(kind, tmp, "close failed: " + std::string(std::strerror(errno)));
        } catch (...) {
            ::unlink(tmp.c_str());
            throw;
        }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        fail(kind, path, "cannot rename '" + tmp + "' to it: " + std::strerror(err));
    }
    fsync_path(parent_of(path), true, kind);
    const FileDigest digest{written, checksum.digest()};
    WriteRecorder::record({path, digest});
    return digest;
}

FileDigest copy_file_atomically(const std::string& from, const std::string& to, const std::string& kind) {
    const InputFile in = open_input_file(from, kind, "the file to copy");
    return write_file_atomically(to, kind, [&](const ByteSink& sink) {
        std::vector<unsigned char> buf(size_t(1) << 20);
        for (uint64_t at = 0; at < in.size();) {
            const size_t n = size_t(std::min<uint64_t>(buf.size(), in.size() - at));
            in.pread_exact(buf.data(), n, at);
            sink(buf.data(), n);
            at += n;
        }
    });
}

}  // namespace pv
