// What every fuzz target (fuzz/fuzz_*.cpp, `make fuzz`) shares: a scratch directory for the
// readers that take a path, and the rule for what counts as a finding.
//
// Readers that open files get the input written to a file in a scratch directory per process, in
// /dev/shm when there is one (tmpfs: an execution costs a write to memory, not to a disk), named
// as the product names it (model.safetensors, tokenizer.json, ...) so that the reader takes the
// same branches it takes for the real file.
//
// Findings. libFuzzer with AddressSanitizer and UBSan reports crashes, over-reads, undefined
// behaviour, leaks, hangs (-timeout) and allocations beyond -malloc_limit_mb / -rss_limit_mb.
// Tighter than those: one allocation larger than kFixedBytes + kBytesPerInputByte × the input's
// size is a size taken from the file and not checked against it (a reader's own fixed buffers,
// such as HfCheckpoint's 16 MiB read chunk, fit under kFixedBytes; what a reader builds from the
// file's contents grows with them); begin_input(size), the first call of every target, sets it.
// On top of that, a reader may reject an input only the documented way: std::runtime_error or
// std::invalid_argument (what every reader promises, with a message naming the file). Anything
// else escaping it — std::length_error or std::bad_alloc from a size taken from the file, an
// std::out_of_range from an unchecked index, a bare nlohmann::json exception — is a finding too,
// and accepts() aborts with its message so libFuzzer saves the input.
#pragma once

#include "io/checksum.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>

#include <fcntl.h>
#include <unistd.h>

extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, size_t),
                                                         void (*free_hook)(const volatile void*));

namespace pv::fuzz {

inline constexpr size_t kFixedBytes = size_t(32) << 20, kBytesPerInputByte = 256;
inline size_t allocation_limit = SIZE_MAX;

inline void check_allocation(const volatile void*, size_t bytes) {
    if (bytes <= allocation_limit) return;
    static const char message[] = "fuzz finding: one allocation larger than the input's size allows\n";
    (void)!::write(2, message, sizeof message - 1);
    std::abort();
}
inline void ignore_free(const volatile void*) {}

// Call first in every execution: the allocation limit for an input of `size` bytes (above).
inline void begin_input(size_t size) {
    static const bool installed = __sanitizer_install_malloc_and_free_hooks(check_allocation, ignore_free) != 0;
    if (!installed) std::abort();
    allocation_limit = kFixedBytes + kBytesPerInputByte * size;
}

// A directory of this process's own, created on first use and removed at exit.
inline const std::filesystem::path& scratch_dir() {
    static const std::filesystem::path dir = [] {
        namespace fs = std::filesystem;
        const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
        fs::path d = base / ("polevault_fuzz_" + std::to_string(::getpid()));
        fs::remove_all(d);
        fs::create_directories(d);
        static struct Remover {
            fs::path d;
            ~Remover() {
                std::error_code ec;
                fs::remove_all(d, ec);
            }
        } remover{d};
        return d;
    }();
    return dir;
}

// Writes `size` bytes to scratch_dir()/name (replacing it) and returns its path.
inline std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
    const std::string path = (scratch_dir() / name).string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) std::abort();
    for (size_t done = 0; done < size;) {
        const ssize_t n = ::write(fd, data + done, size - done);
        if (n <= 0) std::abort();
        done += size_t(n);
    }
    ::close(fd);
    return path;
}

// Writes `size` bytes to scratch_dir()/name for each of `names` as write_scratch does, and a
// trainer_state.json beside them recording each file's size and XXH3-64 checksum, as a checkpoint
// records its files (model/checkpoint_files.h): the input is "re-signed", so the checksum it would
// otherwise never match lets it through to the parser behind the verification. Returns the first
// file's path.
inline std::string write_signed_scratch(std::initializer_list<std::string> names, const uint8_t* data, size_t size) {
    pv::Xxh3 checksum;
    checksum.update(data, size);
    const std::string digest = "{\"bytes\": " + std::to_string(size) + ", \"xxh3\": \"" +
                               pv::checksum_hex(checksum.digest()) + "\"}";
    std::string state;
    for (const std::string& name : names) {
        write_scratch(name, data, size);
        state += (state.empty() ? "{\"files\": {\"" : ", \"") + name + "\": " + digest;
    }
    state += "}}";
    write_scratch("trainer_state.json", reinterpret_cast<const uint8_t*>(state.data()), state.size());
    return (scratch_dir() / *names.begin()).string();
}

// Runs `read`; returns whether it accepted the input. A rejection other than the documented kinds
// (above) aborts, naming the exception's type and message.
inline bool accepts(const std::function<void()>& read) {
    try {
        read();
        return true;
    } catch (const std::runtime_error&) {
        return false;
    } catch (const std::invalid_argument&) {
        return false;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz finding: the reader threw %s (not std::runtime_error or invalid_argument): %s\n",
                     typeid(e).name(), e.what());
        std::abort();
    }
}

}  // namespace pv::fuzz
