// open_input_file and InputFile (io/input_file.h).
#include "io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace pv {
namespace {

[[noreturn]] void fail(const std::string& kind, const std::string& path, const std::string& what) {
    throw std::runtime_error(kind + " '" + path + "': " + what);
}

const char* file_type(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "not a regular file";
}

}  // namespace

InputFile::InputFile(int fd, uint64_t size, std::string path, std::string kind)
    : fd_(fd), size_(size), path_(std::move(path)), kind_(std::move(kind)) {}

InputFile::InputFile(InputFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), size_(o.size_), path_(std::move(o.path_)), kind_(std::move(o.kind_)) {}

InputFile& InputFile::operator=(InputFile&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = std::exchange(o.fd_, -1);
        size_ = o.size_;
        path_ = std::move(o.path_);
        kind_ = std::move(o.kind_);
    }
    return *this;
}

InputFile::~InputFile() {
    if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_exact(void* data, size_t n) const {
    auto* p = static_cast<unsigned char*>(data);
    while (n > 0) {
        const ssize_t r = ::read(fd_, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail(kind_, path_, "read failed: " + std::string(std::strerror(errno)));
        if (r == 0) fail(kind_, path_, "the file shrank while being read; is another process rewriting it?");
        p += r;
        n -= size_t(r);
    }
}

void InputFile::pread_exact(void* data, size_t n, uint64_t offset) const {
    auto* p = static_cast<unsigned char*>(data);
    while (n > 0) {
        const ssize_t r = ::pread(fd_, p, n, off_t(offset));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail(kind_, path_, "read failed: " + std::string(std::strerror(errno)));
        if (r == 0) fail(kind_, path_, "the file shrank while being read; is another process rewriting it?");
        p += r;
        n -= size_t(r);
        offset += uint64_t(r);
    }
}

int InputFile::release() { return std::exchange(fd_, -1); }

std::string InputFile::read_all() const {
    std::string bytes(size_t(size_), '\0');
    pread_exact(bytes.data(), bytes.size(), 0);
    return bytes;
}

InputFile open_input_file(const std::string& path, const std::string& kind, const std::string& hint) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        fail(kind, path, "cannot open: " + std::string(std::strerror(errno)) + (hint.empty() ? "" : " (" + hint + ")"));
    struct stat st {};
    const bool stat_ok = ::fstat(fd, &st) == 0;
    InputFile file(fd, stat_ok ? uint64_t(st.st_size) : 0, path, kind);  // closes fd on every path out
    if (!stat_ok) fail(kind, path, "cannot stat: " + std::string(std::strerror(errno)));
    if (!S_ISREG(st.st_mode))
        fail(kind, path,
             std::string("is ") + file_type(st.st_mode) + ", not a regular file; pass the path of the file itself");
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        fail(kind, path, "cannot clear O_NONBLOCK: " + std::string(std::strerror(errno)));
    return file;
}

bool optional_input_file(const std::string& path, const std::string& kind) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return false;
        fail(kind, path, "cannot stat: " + std::string(std::strerror(errno)));
    }
    if (::stat(path.c_str(), &st) != 0)
        fail(kind, path,
             "is a symbolic link whose target cannot be reached (" + std::string(std::strerror(errno)) +
                 "): make it point to the file, or remove it");
    if (!S_ISREG(st.st_mode))
        fail(kind, path, std::string("is ") + file_type(st.st_mode) + ", not a regular file: replace it with the file");
    return true;
}

std::string read_input_file(const std::string& path, const std::string& kind, uint64_t max_bytes,
                            const std::string& hint) {
    const InputFile file = open_input_file(path, kind, hint);
    if (file.size() > max_bytes)
        fail(kind, path,
             "is " + std::to_string(file.size()) + " bytes, more than the " + std::to_string(max_bytes) +
                 " such a file can be; is it the right file?");
    return file.read_all();
}

}  // namespace pv
