// Token shards: round trips at both token widths and empty, the atomic write, and every rejection
// path of read_shard with a message that names the file, the problem and the fix.
#include "test/temp_dir.h"
#include "data/shard.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace shard_test {

namespace fs = std::filesystem;

using pv::test::TempDir;  // test/temp_dir.h

inline pv::TokenShard random_shard(uint32_t vocab, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    pv::TokenShard s;
    s.vocab_size = vocab;
    s.eot_token = vocab - 1;
    s.tokens.resize(n);
    for (auto& t : s.tokens) t = static_cast<uint32_t>(rng() % vocab);
    if (n > 0) s.tokens[0] = vocab - 1;  // the largest id is representable
    return s;
}

inline std::vector<unsigned char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline void put_u32(std::vector<unsigned char>& b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

inline void put_u64(std::vector<unsigned char>& b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

// read_shard(path) throws std::runtime_error whose message contains the path and every substring.
inline void expect_rejected(const std::string& path, const std::vector<std::string>& substrings) {
    std::string message;
    try {
        (void)pv::read_shard(path);
    } catch (const std::runtime_error& e) {
        message = e.what();
    }
    INFO("message: " << message);
    REQUIRE(!message.empty());
    CHECK(message.find(path) != std::string::npos);
    for (const auto& s : substrings) {
        INFO("expected substring: " << s);
        CHECK(message.find(s) != std::string::npos);
    }
}

}  // namespace shard_test

using namespace shard_test;

TEST_CASE("shards round-trip at 2-byte and 4-byte widths and empty", "[data]") {
    TempDir dir;
    struct Case {
        uint32_t vocab;
        size_t n;
        uint32_t width;
    };
    for (const Case c : {Case{50257, 1000, 2}, Case{65536, 333, 2}, Case{65537, 333, 4}, Case{128256, 1001, 4},
                         Case{7, 0, 2}, Case{200000, 0, 4}, Case{1, 5, 2}}) {
        INFO("vocab " << c.vocab << ", " << c.n << " tokens");
        const auto s = random_shard(c.vocab, c.n, c.vocab + c.n);
        const auto path = dir.file("rt.bin");
        pv::write_shard(path, s);
        CHECK(!fs::exists(path + ".tmp"));
        const auto bytes = read_bytes(path);
        REQUIRE(bytes.size() == pv::kShardHeaderBytes + c.n * c.width);
        CHECK(std::memcmp(bytes.data(), "PVTOKENS", 8) == 0);
        CHECK(bytes[16] == c.width);
        const auto r = pv::read_shard(path);
        CHECK(r.vocab_size == s.vocab_size);
        CHECK(r.eot_token == s.eot_token);
        CHECK(r.tokens == s.tokens);
    }
}

TEST_CASE("shard header is little-endian in the documented layout", "[data]") {
    TempDir dir;
    pv::TokenShard s{70000, 3, {0x01020304u % 70000, 69999, 3}};
    const auto path = dir.file("layout.bin");
    pv::write_shard(path, s);
    const auto b = read_bytes(path);
    REQUIRE(b.size() == 32 + 3 * 4);
    const std::vector<unsigned char> header = {'P',  'V',  'T',  'O', 'K', 'E', 'N', 'S',  // magic
                                               1,    0,    0,    0,                        // version
                                               0x70, 0x11, 0x01, 0,                        // vocab 70000
                                               4,    0,    0,    0,                        // width
                                               3,    0,    0,    0,                        // eot
                                               3,    0,    0,    0,   0,   0,   0,   0};   // count
    CHECK(std::vector<unsigned char>(b.begin(), b.begin() + 32) == header);
    const uint32_t t0 = 0x01020304u % 70000;
    CHECK(b[32] == (t0 & 0xFF));
    CHECK(b[33] == ((t0 >> 8) & 0xFF));
    CHECK(b[34] == ((t0 >> 16) & 0xFF));
}

TEST_CASE("write_shard replaces a file whole and reports OS errors with the path", "[data]") {
    TempDir dir;
    const auto path = dir.file("replace.bin");
    pv::write_shard(path, random_shard(1000, 500, 1));
    const auto second = random_shard(1000, 20, 2);
    pv::write_shard(path, second);
    CHECK(pv::read_shard(path).tokens == second.tokens);

    const auto missing_dir = dir.file("no/such/dir/x.bin");
    try {
        pv::write_shard(missing_dir, second);
        FAIL("expected an exception");
    } catch (const std::runtime_error& e) {
        const std::string m = e.what();
        INFO(m);
        CHECK(m.find(missing_dir) != std::string::npos);
        CHECK(m.find("No such file or directory") != std::string::npos);
    }

    pv::TokenShard bad{100, 5, {1, 2, 100}};
    try {
        pv::write_shard(dir.file("bad.bin"), bad);
        FAIL("expected an exception");
    } catch (const std::runtime_error& e) {
        const std::string m = e.what();
        INFO(m);
        CHECK(m.find("index 2") != std::string::npos);
        CHECK(m.find("100") != std::string::npos);
    }
    CHECK(!fs::exists(dir.file("bad.bin")));
    CHECK(!fs::exists(dir.file("bad.bin.tmp")));
}

TEST_CASE("read_shard rejects broken files, naming the file, the problem and the fix", "[data]") {
    TempDir dir;
    const auto good_path = dir.file("good.bin");
    pv::write_shard(good_path, random_shard(1000, 64, 3));  // 2-byte tokens
    const auto good = read_bytes(good_path);
    REQUIRE(good.size() == 32 + 128);

    SECTION("missing file") {
        expect_rejected(dir.file("absent.bin"), {"cannot open", "No such file or directory", "check the path"});
    }
    SECTION("wrong magic") {
        auto b = good;
        b[0] = 'X';
        write_bytes(dir.file("magic.bin"), b);
        expect_rejected(dir.file("magic.bin"), {"not a polevault token shard", "PVTOKENS", "write_shard"});
    }
    SECTION("a tiny foreign file") {
        write_bytes(dir.file("tiny.bin"), {'h', 'i'});
        expect_rejected(dir.file("tiny.bin"), {"not a polevault token shard"});
    }
    SECTION("header cut short") {
        write_bytes(dir.file("short.bin"), std::vector<unsigned char>(good.begin(), good.begin() + 20));
        expect_rejected(dir.file("short.bin"), {"truncated", "20 bytes", "32-byte header", "re-create"});
    }
    SECTION("unsupported version") {
        auto b = good;
        put_u32(b, 8, 2);
        write_bytes(dir.file("version.bin"), b);
        expect_rejected(dir.file("version.bin"), {"unsupported shard version 2", "version 1", "re-create"});
    }
    SECTION("bad token width") {
        auto b = good;
        put_u32(b, 16, 3);
        write_bytes(dir.file("width.bin"), b);
        expect_rejected(dir.file("width.bin"), {"bad token width 3", "2 or 4", "re-create"});
    }
    SECTION("width 2 with a vocabulary that needs 4") {
        auto b = good;
        put_u32(b, 12, 70000);
        write_bytes(dir.file("width2.bin"), b);
        expect_rejected(dir.file("width2.bin"), {"bad token width 2", "70000", "re-create"});
    }
    SECTION("truncated tokens") {
        write_bytes(dir.file("trunc.bin"), std::vector<unsigned char>(good.begin(), good.end() - 3));
        expect_rejected(dir.file("trunc.bin"), {"truncated", "64 tokens", "128 bytes", "only 125", "re-create"});
    }
    SECTION("absurd count") {
        auto b = good;
        put_u64(b, 24, ~0ull);
        write_bytes(dir.file("count.bin"), b);
        expect_rejected(dir.file("count.bin"), {"truncated", "18446744073709551615 tokens", "only 128"});
    }
    SECTION("extra bytes") {
        auto b = good;
        b.push_back(0);
        b.push_back(0);
        write_bytes(dir.file("extra.bin"), b);
        expect_rejected(dir.file("extra.bin"), {"oversized", "128 bytes", "130", "2 extra", "re-create"});
    }
    SECTION("token not below the vocabulary size") {
        auto b = good;
        b[32 + 2 * 37] = 0xE8;  // token 37 = 1000 = 0x03E8
        b[32 + 2 * 37 + 1] = 0x03;
        write_bytes(dir.file("token.bin"), b);
        expect_rejected(dir.file("token.bin"), {"index 37", "is 1000", "vocab_size 1000", "tokenizer"});
    }
    SECTION("eot not below the vocabulary size") {
        auto b = good;
        put_u32(b, 20, 1000);
        write_bytes(dir.file("eot.bin"), b);
        expect_rejected(dir.file("eot.bin"), {"eot_token 1000", "vocab_size 1000", "re-create"});
    }
    SECTION("a directory") { expect_rejected(dir.path.string(), {"not a regular file"}); }
}
