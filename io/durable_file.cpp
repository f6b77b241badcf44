// write_file_atomically, fsync_path, fsync_tree, rename_durably: the one fsync policy described in
// io/durable_file.h.
#include "io/durable_file.h"

#include "io/input_file.h"
#include "io/progress.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
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

std::string os_error(int error) { return std::strerror(error); }

// "write failed: <os error> (<advice>)" for a failed write(2).
std::string write_failure(int error) {
    const std::string advice = write_error_advice(error);
    return "write failed: " + os_error(error) + " (" + (advice.empty() ? "check the device and permissions" : advice) +
           ")";
}

// write(2) of all n bytes, retried after EINTR and short writes; errno of the failure, or 0.
int write_all(int fd, const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;  // no progress and no error: never loop forever
        p += w;
        n -= size_t(w);
    }
    return 0;
}

// The message when a temporary file was removed (or renamed away) by someone else while this
// process wrote it: not a disk problem.
[[noreturn]] void fail_vanished(const std::string& kind, const std::string& tmp) {
    fail(kind, tmp,
         "the temporary file disappeared while it was being written: another process removed or renamed it (is "
         "something else cleaning or writing this directory? only one writer may use it)");
}

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
        // O_NOFOLLOW: a symbolic link planted at the .tmp name is refused, never written through.
        f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (f.fd < 0 && errno == ELOOP)
            fail(kind, tmp, "is a symbolic link: refusing to write through it; remove it (it is not this program's)");
        if (f.fd < 0)
            fail(kind, tmp,
                 "cannot create: " + std::string(std::strerror(errno)) +
                     " (does the directory exist and is it writable?)");
        try {
            write([&](const void* data, size_t n) {
                checksum.update(data, n);
                written += n;
                Progress::report_to_current(double(n));  // a checkpoint's or an export's (io/progress.h)
                if (const int error = write_all(f.fd, data, n)) fail(kind, tmp, write_failure(error));
            });
            if (::fsync(f.fd) != 0) fail(kind, tmp, "fsync failed: " + std::string(std::strerror(errno)));
            struct stat st {};
            if (::fstat(f.fd, &st) == 0 && st.st_nlink == 0) fail_vanished(kind, tmp);
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
        if (err == ENOENT && fs::is_directory(parent_of(path))) fail_vanished(kind, tmp);
        ::unlink(tmp.c_str());
        fail(kind, path, "cannot rename '" + tmp + "' to it: " + std::strerror(err));
    }
    fsync_path(parent_of(path), true, kind);
    const FileDigest digest{written, checksum.digest()};
    WriteRecorder::record({path, digest});
    return digest;
}

std::string write_error_advice(int error) {
    if (error == ENOSPC || error == EDQUOT)
        return "the file system is full (or your disk quota is spent): free space there or choose another directory";
    if (error == EROFS) return "the file system is read-only: choose a directory on a writable one";
    if (error == EFBIG) {
        const uint64_t limit = file_size_limit();
        if (limit == 0) return "the file is larger than this file system allows: choose another file system";
        return "the file size limit (ulimit -f) is " + std::to_string(limit / 1024) +
               " KiB: raise it with `ulimit -f unlimited`";
    }
    return {};
}

uint64_t file_size_limit() {
    struct rlimit limit {};
    if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
    return uint64_t(limit.rlim_cur);
}

AppendedFile::AppendedFile(const std::string& path, const std::string& kind, bool truncate)
    : path_(path), kind_(kind) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (truncate ? O_TRUNC : 0),
                 0644);
    if (fd_ < 0 && errno == ELOOP)
        fail(kind, path, "is a symbolic link: refusing to write through it (a run writes only its own files); remove it");
    if (fd_ < 0) {
        const int error = errno;
        const std::string advice = write_error_advice(error);
        fail(kind, path, "cannot open to write: " + os_error(error) + (advice.empty() ? "" : " (" + advice + ")"));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd_), fd_ = -1;
        fail(kind, path, "is not a regular file: refusing to write to it; remove it (it is not this program's)");
    }
}

AppendedFile::~AppendedFile() {
    if (fd_ >= 0) ::close(fd_);
}

void AppendedFile::write(const std::string& bytes) {
    if (fd_ < 0) fail(kind_, path_, "written after it was closed");
    if (const int error = write_all(fd_, bytes.data(), bytes.size())) fail(kind_, path_, write_failure(error));
}

void AppendedFile::close() {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail(kind_, path_, "close failed: " + os_error(errno));
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
