// io/durable_file.h, the one fsync policy: write_file_atomically puts the whole file under its
// name and leaves no .tmp, or throws and leaves the old file; every failure (creating the .tmp, a
// rename, the fsync of a file or of a directory, EINVAL included) is an error naming the path and
// the OS error. /proc gives a real fsync failure: its files and directories refuse fsync (EINVAL).
#include "test/error_of.h"
#include "test/temp_dir.h"
#include "io/durable_file.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace durable_file_test {

namespace fs = std::filesystem;

using pv::test::TempDir;  // test/temp_dir.h

using pv::test::error_of;  // test/error_of.h

inline std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_text(const std::string& path, const std::string& text) {
    pv::write_file_atomically(path, "test file", [&](const pv::ByteSink& sink) {
        // In two pieces: the sink appends.
        sink(text.data(), text.size() / 2);
        sink(text.data() + text.size() / 2, text.size() - text.size() / 2);
    });
}

}  // namespace durable_file_test

using namespace durable_file_test;

TEST_CASE("write_file_atomically: the whole file under its name, no .tmp; a failed write keeps the old file", "[io]") {
    TempDir dir("durable");
    const std::string path = dir.file("out.txt");
    write_text(path, "first version");
    CHECK(slurp(path) == "first version");
    CHECK_FALSE(fs::exists(path + ".tmp"));
    write_text(path, "second");  // replaces, shorter: truncated, not overwritten in place
    CHECK(slurp(path) == "second");
    write_text(path, "");
    CHECK(fs::file_size(path) == 0);

    // The writer throws midway: the error passes through, the .tmp is gone, the old file stays.
    write_text(path, "kept");
    CHECK_THROWS_WITH(pv::write_file_atomically(path, "test file",
                                                [&](const pv::ByteSink& sink) {
                                                    sink("partial", 7);
                                                    throw std::runtime_error("writer gave up");
                                                }),
                      "writer gave up");
    CHECK(slurp(path) == "kept");
    CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("write_file_atomically: a path that cannot be created is an error naming it and the OS error", "[io]") {
    TempDir dir("durable");
    // Under a regular file (as root, a read-only directory would not stop the write).
    { std::ofstream(dir.file("blocker")) << "x"; }
    const std::string under_file = dir.file("blocker/out.bin");
    std::string what = error_of<std::runtime_error>([&] { write_text(under_file, "data"); });
    CHECK_THAT(what, Catch::StartsWith("test file '" + under_file + ".tmp': cannot create: ") &&
                         Catch::Contains("Not a directory"));
    const std::string missing = dir.file("no/such/dir/out.bin");
    what = error_of<std::runtime_error>([&] { write_text(missing, "data"); });
    CHECK_THAT(what, Catch::StartsWith("test file '" + missing + ".tmp': cannot create: ") &&
                         Catch::Contains("No such file or directory"));
    CHECK_FALSE(fs::exists(missing));
}

TEST_CASE("fsync_path: every failure is an error, a directory's EINVAL included", "[io]") {
    TempDir dir("durable");
    const std::string file = dir.file("f.txt");
    write_text(file, "x");
    pv::fsync_path(file, false);
    pv::fsync_path(dir.path.string(), true);

    const std::string missing = dir.file("missing");
    CHECK(error_of<std::runtime_error>([&] { pv::fsync_path(missing, false); }) ==
          "file '" + missing + "': cannot open to fsync: No such file or directory");
    CHECK(error_of<std::runtime_error>([&] { pv::fsync_path(file, true, "checkpoint directory"); }) ==
          "checkpoint directory '" + file + "': cannot open to fsync: Not a directory");

    // A file system that cannot sync: procfs answers EINVAL for files and directories alike. The
    // old checkpoint code accepted it for a directory; now it is an error like any other.
    if (!fs::is_directory("/proc/self")) {
        WARN("no /proc: the EINVAL case is not checked here");
        return;
    }
    CHECK(error_of<std::runtime_error>([&] { pv::fsync_path("/proc/self", true); }) ==
          "directory '/proc/self': fsync failed: Invalid argument");
    CHECK(error_of<std::runtime_error>([&] { pv::fsync_path("/proc/self/status", false, "trainer state"); }) ==
          "trainer state '/proc/self/status': fsync failed: Invalid argument");
}

TEST_CASE("fsync_tree and rename_durably: a directory published whole, failures naming the path", "[io]") {
    TempDir dir("durable");
    const fs::path tmp = dir.path / "step_1.tmp";
    fs::create_directories(tmp / "nested" / "deeper");
    write_text((tmp / "a.txt").string(), "a");
    write_text((tmp / "nested" / "deeper" / "b.txt").string(), "b");
    if (fs::is_directory("/proc/self"))
        fs::create_directory_symlink("/proc/self", tmp / "link");  // not followed, so no EINVAL
    pv::fsync_tree(tmp.string(), "checkpoint directory");
    pv::rename_durably(tmp.string(), (dir.path / "step_1").string(), "checkpoint directory");
    CHECK_FALSE(fs::exists(tmp));
    CHECK(slurp(dir.path / "step_1" / "nested" / "deeper" / "b.txt") == "b");

    const std::string absent = (dir.path / "absent.tmp").string();
    CHECK(error_of<std::runtime_error>([&] { pv::fsync_tree(absent, "checkpoint directory"); }) ==
          "checkpoint directory '" + absent + "': cannot list: No such file or directory");
    const std::string to = (dir.path / "step_2").string();
    CHECK(error_of<std::runtime_error>([&] { pv::rename_durably(absent, to, "checkpoint directory"); }) ==
          "checkpoint directory '" + to + "': cannot rename '" + absent + "' to it: No such file or directory");
    CHECK_FALSE(fs::exists(to));
    // A destination under a regular file.
    { std::ofstream(dir.file("blocker")) << "x"; }
    const std::string under_file = dir.file("blocker/step_1");
    const std::string from = (dir.path / "step_1").string();
    CHECK(error_of<std::runtime_error>([&] { pv::rename_durably(from, under_file, "checkpoint directory"); }) ==
          "checkpoint directory '" + under_file + "': cannot rename '" + from + "' to it: Not a directory");
    CHECK(fs::is_directory(from));
}
