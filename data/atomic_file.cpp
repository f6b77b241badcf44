// write_file_atomically: path.tmp, fsync, rename, fsync of the directory.
#include "data/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace pv {
namespace {

// Closes a descriptor on every path out of a scope.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

void write_file_atomically(const std::string& path, const std::string& kind, const std::function<void(const ByteSink&)>& write) {
    auto fail = [&](const std::string& file, const std::string& what) -> void {
        throw std::runtime_error(kind + " '" + file + "': " + what);
    };
    const std::string tmp = path + ".tmp";
    {
        Fd f;
        f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (f.fd < 0)
            fail(tmp, "cannot create: " + std::string(std::strerror(errno)) + " (does the directory exist and is it writable?)");
        try {
            write([&](const void* data, size_t n) {
                const char* p = static_cast<const char*>(data);
                while (n > 0) {
                    const ssize_t w = ::write(f.fd, p, n);
                    if (w < 0 && errno == EINTR) continue;
                    if (w <= 0)
                        fail(tmp, "write failed: " + std::string(std::strerror(errno)) + " (check free disk space and permissions)");
                    p += w;
                    n -= size_t(w);
                }
            });
            if (::fsync(f.fd) != 0) fail(tmp, "fsync failed: " + std::string(std::strerror(errno)));
            const int fd = f.fd;
            f.fd = -1;
            if (::close(fd) != 0) fail(tmp, "close failed: " + std::string(std::strerror(errno)));
        } catch (...) {
            ::unlink(tmp.c_str());
            throw;
        }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        fail(path, "cannot rename '" + tmp + "' to it: " + std::strerror(err));
    }
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    Fd d;
    d.fd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd >= 0) (void)::fsync(d.fd);
}

}  // namespace pv
