// A fresh directory under the system temp dir for one test, unique per process and name (suites
// run concurrently under several schedules), removed with everything in it on scope exit.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace pv::test {

struct TempDir {
    std::filesystem::path path;
    // Two alive at once in one process need different names.
    explicit TempDir(const std::string& name = "dir") {
        path = std::filesystem::temp_directory_path() / ("polevault_test_" + name + "_" + std::to_string(::getpid()));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace pv::test
