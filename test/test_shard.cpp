// Token shards: round trips at both token widths and empty, with every flags value and the
// tokenizer fingerprint; version-1, 2 and 3 files (written here byte by byte) still read; the
// checksum (computed here with libxxhash directly) catches any flipped bit; the atomic write; and every rejection path of
// read_shard — the header, the tokens and the flags section — with a message that names the
// file, the problem and the fix.
#include "test/temp_dir.h"
#include "data/shard.h"

#include <catch2/catch.hpp>
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace shard_test {

namespace fs = std::filesystem;

using pv::test::TempDir;  // test/temp_dir.h

// Random tokens and valid random flags: documents of random lengths and kinds (splittable or
// not), each token counted or not at random, so every valid flags value occurs.
inline pv::TokenShard random_shard(uint32_t vocab, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    pv::TokenShard s;
    s.vocab_size = vocab;
    s.eot_token = vocab - 1;
    s.tokens.resize(n);
    for (auto& t : s.tokens) t = static_cast<uint32_t>(rng() % vocab);
    if (n > 0) s.tokens[0] = vocab - 1;  // the largest id is representable
    uint8_t kind = 0;
    for (size_t i = 0; i < n; ++i) {
        const bool starts = i > 0 && rng() % 5 == 0;  // i = 0 continues a document of the previous shard
        if (i == 0 || starts) kind = rng() % 2 ? pv::kTokenSplittable : 0;
        s.flags.push_back(
            uint8_t(kind | (starts ? pv::kTokenStartsDocument : 0) | (rng() % 2 ? pv::kTokenCounted : 0)));
    }
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

// The version-4 header's checksum recomputed after a test edits the bytes (XXH3-64 of bytes 0-39
// then everything after the 48-byte header), so a structural check is reached rather than the
// checksum's.
inline void reseal(std::vector<unsigned char>& b) {
    std::vector<unsigned char> covered(b.begin(), b.begin() + 40);
    covered.insert(covered.end(), b.begin() + 48, b.end());
    put_u64(b, 40, XXH3_64bits(covered.data(), covered.size()));
}

// The bytes of a version-3 file with the same contents as version-4 bytes `b` (the tokenizer
// field cut, the checksum recomputed over bytes 0-31 and the body).
inline std::vector<unsigned char> as_version3(std::vector<unsigned char> b) {
    b.erase(b.begin() + 32, b.begin() + 40);
    put_u32(b, 8, 3);
    std::vector<unsigned char> covered(b.begin(), b.begin() + 32);
    covered.insert(covered.end(), b.begin() + 40, b.end());
    put_u64(b, 32, XXH3_64bits(covered.data(), covered.size()));
    return b;
}

// The bytes of a version-2 file with the same contents as version-4 bytes `b` (the tokenizer
// field and the checksum cut).
inline std::vector<unsigned char> as_version2(std::vector<unsigned char> b) {
    b.erase(b.begin() + 32, b.begin() + 48);
    put_u32(b, 8, 2);
    return b;
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
        auto s = random_shard(c.vocab, c.n, c.vocab + c.n);
        s.tokenizer = 0x8000000000000000ull | (c.vocab * 2654435761ull);  // the top byte is used too
        const auto path = dir.file("rt.bin");
        pv::write_shard(path, s);
        CHECK(!fs::exists(path + ".tmp"));
        const auto bytes = read_bytes(path);
        REQUIRE(bytes.size() == pv::kShardHeaderBytes + c.n * (c.width + 1));
        CHECK(std::memcmp(bytes.data(), "PVTOKENS", 8) == 0);
        CHECK(bytes[8] == 4);
        CHECK(bytes[16] == c.width);
        std::vector<unsigned char> resealed = bytes;
        reseal(resealed);
        CHECK(resealed == bytes);  // the header's checksum is XXH3 of everything but itself
        const auto r = pv::read_shard(path);
        CHECK(r.vocab_size == s.vocab_size);
        CHECK(r.eot_token == s.eot_token);
        CHECK(r.tokens == s.tokens);
        CHECK(r.flags == s.flags);
        CHECK(r.tokenizer == s.tokenizer);
    }
}

TEST_CASE("shard header is little-endian in the documented layout, the flags after the tokens", "[data]") {
    TempDir dir;
    pv::TokenShard s{70000, 3, {0x01020304u % 70000, 69999, 3}, {0b011, 0b001, 0b110}, 0x0807060504030201ull};
    const auto path = dir.file("layout.bin");
    pv::write_shard(path, s);
    const auto b = read_bytes(path);
    REQUIRE(b.size() == 48 + 3 * 4 + 3);
    const std::vector<unsigned char> header = {'P',  'V',  'T',  'O', 'K', 'E', 'N', 'S',  // magic
                                               4,    0,    0,    0,                        // version
                                               0x70, 0x11, 0x01, 0,                        // vocab 70000
                                               4,    0,    0,    0,                        // width
                                               3,    0,    0,    0,                        // eot
                                               3,    0,    0,    0,   0,   0,   0,   0,    // count
                                               1,    2,    3,    4,   5,   6,   7,   8};   // tokenizer
    CHECK(std::vector<unsigned char>(b.begin(), b.begin() + 40) == header);
    const uint32_t t0 = 0x01020304u % 70000;
    std::vector<unsigned char> covered(b.begin(), b.begin() + 40);
    covered.insert(covered.end(), b.begin() + 48, b.end());
    const uint64_t checksum = XXH3_64bits(covered.data(), covered.size());
    for (int i = 0; i < 8; ++i) CHECK(b[40 + size_t(i)] == ((checksum >> (8 * i)) & 0xFF));
    CHECK(b[48] == (t0 & 0xFF));
    CHECK(b[49] == ((t0 >> 8) & 0xFF));
    CHECK(b[50] == ((t0 >> 16) & 0xFF));
    CHECK(std::vector<unsigned char>(b.end() - 3, b.end()) == std::vector<unsigned char>{0b011, 0b001, 0b110});
    // The bits are those the layout table names.
    CHECK(pv::kTokenCounted == 1);
    CHECK(pv::kTokenStartsDocument == 2);
    CHECK(pv::kTokenSplittable == 4);
}

TEST_CASE("version-1 shards (no flags) still read, at both widths", "[data]") {
    TempDir dir;
    for (const uint32_t vocab : {300u, 70000u}) {
        INFO("vocab " << vocab);
        const uint32_t width = vocab <= 65536 ? 2 : 4;
        const std::vector<uint32_t> tokens = {5, vocab - 1, 7, 0, vocab - 1};
        // The version-1 layout, by hand: the 32-byte header, then the tokens, nothing after.
        std::vector<unsigned char> b = {'P', 'V', 'T', 'O', 'K', 'E', 'N', 'S'};
        b.resize(32);
        put_u32(b, 8, 1);
        put_u32(b, 12, vocab);
        put_u32(b, 16, width);
        put_u32(b, 20, vocab - 1);
        put_u64(b, 24, tokens.size());
        for (uint32_t t : tokens)
            for (uint32_t k = 0; k < width; ++k) b.push_back(static_cast<unsigned char>(t >> (8 * k)));
        const auto path = dir.file("v1.bin");
        write_bytes(path, b);
        const auto r = pv::read_shard(path);
        CHECK(r.vocab_size == vocab);
        CHECK(r.eot_token == vocab - 1);
        CHECK(r.tokens == tokens);
        CHECK(r.flags.empty());  // version-1 meaning, derived by the loader
        // One extra byte is no flags section: a version-1 file is exactly header + tokens.
        b.push_back(0);
        write_bytes(path, b);
        expect_rejected(path, {"oversized", "1 extra"});
        b.pop_back();
        b.pop_back();
        write_bytes(path, b);
        expect_rejected(path, {"truncated", "5 tokens × " + std::to_string(width) + " bytes"});
    }
}

TEST_CASE("version-3 shards (a checksum, no tokenizer) still read, and a flipped bit is still caught", "[data]") {
    TempDir dir;
    auto s = random_shard(70000, 200, 13);
    s.tokenizer = 12345;
    pv::write_shard(dir.file("v4.bin"), s);
    const auto v3 = as_version3(read_bytes(dir.file("v4.bin")));
    REQUIRE(v3.size() == 40 + 200 * 5);
    write_bytes(dir.file("v3.bin"), v3);
    const auto r = pv::read_shard(dir.file("v3.bin"));
    CHECK(r.tokens == s.tokens);
    CHECK(r.flags == s.flags);
    CHECK(r.tokenizer == 0);  // not recorded
    auto flipped = v3;
    flipped[40 + 7] ^= 1;
    write_bytes(dir.file("v3flip.bin"), flipped);
    expect_rejected(dir.file("v3flip.bin"), {"checksum mismatch"});
}

TEST_CASE("version-2 shards (flags, no checksum) still read", "[data]") {
    TempDir dir;
    const auto s = random_shard(70000, 200, 11);
    pv::write_shard(dir.file("v4.bin"), s);
    const auto v2 = as_version2(read_bytes(dir.file("v4.bin")));
    REQUIRE(v2.size() == 32 + 200 * 5);
    write_bytes(dir.file("v2.bin"), v2);
    const auto r = pv::read_shard(dir.file("v2.bin"));
    CHECK(r.tokens == s.tokens);
    CHECK(r.flags == s.flags);
    CHECK(r.vocab_size == 70000);
    // Structure is still checked in version 2: a cut file is refused.
    write_bytes(dir.file("v2cut.bin"), std::vector<unsigned char>(v2.begin(), v2.end() - 1));
    expect_rejected(dir.file("v2cut.bin"), {"truncated", "200 tokens × (4 + 1 flags byte)"});
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

    pv::TokenShard bad{100, 5, {1, 2, 100}, {1, 1, 1}};
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

    // Flags that could not be read back are refused before anything is written.
    const auto refused = [&](pv::TokenShard s, const std::string& expected) {
        try {
            pv::write_shard(dir.file("flags.bin"), s);
            FAIL("expected an exception");
        } catch (const std::runtime_error& e) {
            const std::string m = e.what();
            INFO(m);
            CHECK(m.find(expected) != std::string::npos);
        }
        CHECK(!fs::exists(dir.file("flags.bin")));
    };
    refused(pv::TokenShard{100, 5, {1, 2, 3}, {}}, "0 flags bytes for 3 tokens");
    refused(pv::TokenShard{100, 5, {1, 2, 3}, {1, 1}}, "2 flags bytes for 3 tokens");
    refused(pv::TokenShard{100, 5, {1, 2, 3}, {1, 9, 1}}, "index 1");
    refused(pv::TokenShard{100, 5, {1, 2, 3}, {0b110, 0b100, 0b000}}, "index 2");
}

TEST_CASE("read_shard rejects broken files, naming the file, the problem and the fix", "[data]") {
    TempDir dir;
    const auto good_path = dir.file("good.bin");
    pv::write_shard(good_path, random_shard(1000, 64, 3));  // 2-byte tokens
    const auto good = read_bytes(good_path);
    REQUIRE(good.size() == 48 + 128 + 64);
    // Writes a variant of the good file, its checksum recomputed (reseal), so the check under
    // test is reached.
    const auto write_resealed = [&](const std::string& path, std::vector<unsigned char> b) {
        reseal(b);
        write_bytes(path, b);
    };

    SECTION("missing file") {
        expect_rejected(dir.file("absent.bin"), {"cannot open", "No such file or directory", "check the path"});
    }
    SECTION("wrong magic") {
        auto b = good;
        b[0] = 'X';
        write_bytes(dir.file("magic.bin"), b);
        expect_rejected(dir.file("magic.bin"), {"not a polevault token shard", "PVTOKENS", "made by `train prepare`"});
    }
    SECTION("JSON lines passed where prepared data goes: the prepare command to run") {
        const std::string line = "{\"messages\": [{\"role\": \"user\", \"content\": \"hello there, how are you\"}]}\n";
        write_bytes(dir.file("chats.jsonl"), std::vector<unsigned char>(line.begin(), line.end()));
        expect_rejected(dir.file("chats.jsonl"),
                        {"not a polevault token shard", "it looks like text or JSON lines",
                         "`train prepare " + dir.file("chats.jsonl") + " --tokenizer MODEL/tokenizer.json --out DIR`"});
    }
    SECTION("a tiny foreign file") {
        write_bytes(dir.file("tiny.bin"), {'h', 'i'});
        expect_rejected(dir.file("tiny.bin"), {"not a polevault token shard"});
    }
    SECTION("header cut short") {
        write_bytes(dir.file("short.bin"), std::vector<unsigned char>(good.begin(), good.begin() + 20));
        expect_rejected(dir.file("short.bin"), {"truncated", "20 bytes", "32-byte header", "re-create"});
        write_bytes(dir.file("short4.bin"), std::vector<unsigned char>(good.begin(), good.begin() + 44));
        expect_rejected(dir.file("short4.bin"), {"truncated", "44 bytes", "48-byte header of version 4"});
        auto v3 = std::vector<unsigned char>(good.begin(), good.begin() + 36);
        put_u32(v3, 8, 3);
        write_bytes(dir.file("short3.bin"), v3);
        expect_rejected(dir.file("short3.bin"), {"truncated", "36 bytes", "40-byte header of version 3"});
    }
    SECTION("unsupported version") {
        auto b = good;
        put_u32(b, 8, 5);
        write_bytes(dir.file("version.bin"), b);
        expect_rejected(dir.file("version.bin"), {"unsupported shard version 5", "versions 1 to 4", "re-create"});
    }
    SECTION("bad token width") {
        auto b = good;
        put_u32(b, 16, 3);
        write_resealed(dir.file("width.bin"), b);
        expect_rejected(dir.file("width.bin"), {"bad token width 3", "2 or 4", "re-create"});
    }
    SECTION("width 2 with a vocabulary that needs 4") {
        auto b = good;
        put_u32(b, 12, 70000);
        write_resealed(dir.file("width2.bin"), b);
        expect_rejected(dir.file("width2.bin"), {"bad token width 2", "70000", "re-create"});
    }
    SECTION("truncated tokens") {
        write_bytes(dir.file("trunc.bin"), std::vector<unsigned char>(good.begin(), good.end() - 64 - 3));
        expect_rejected(dir.file("trunc.bin"),
                        {"truncated", "64 tokens × (2 + 1 flags byte)", "192 bytes", "only 125", "re-create"});
    }
    SECTION("truncated flags") {
        write_bytes(dir.file("flagtrunc.bin"), std::vector<unsigned char>(good.begin(), good.end() - 1));
        expect_rejected(dir.file("flagtrunc.bin"), {"truncated", "64 tokens", "192 bytes", "only 191", "re-create"});
    }
    SECTION("a version-2 file without its flags section (a version-1 body under a version-2 header)") {
        write_bytes(dir.file("noflags.bin"), std::vector<unsigned char>(good.begin(), good.end() - 64));
        expect_rejected(dir.file("noflags.bin"), {"truncated", "only 128"});
    }
    SECTION("a flags byte with an unknown bit") {
        for (int bit = 3; bit < 8; ++bit) {
            INFO("bit " << bit);
            auto b = good;
            b[48 + 128 + 17] |= static_cast<unsigned char>(1u << bit);
            write_resealed(dir.file("bit.bin"), b);
            expect_rejected(dir.file("bit.bin"), {"corrupt flags", "index 17", "bits other than 0-2", "re-create"});
        }
    }
    SECTION("a document whose splittable bit changes inside it") {
        auto b = good;
        size_t i = 1;  // a token that does not start a document
        while (b[48 + 128 + i] & pv::kTokenStartsDocument) ++i;
        b[48 + 128 + i] ^= pv::kTokenSplittable;
        write_resealed(dir.file("split.bin"), b);
        expect_rejected(dir.file("split.bin"), {"corrupt flags", "index " + std::to_string(i), "splittable"});
    }
    SECTION("absurd count") {
        auto b = good;
        put_u64(b, 24, ~0ull);
        write_bytes(dir.file("count.bin"), b);
        expect_rejected(dir.file("count.bin"), {"truncated", "18446744073709551615 tokens", "only 192"});
    }
    SECTION("extra bytes") {
        auto b = good;
        b.push_back(0);
        b.push_back(0);
        write_bytes(dir.file("extra.bin"), b);
        expect_rejected(dir.file("extra.bin"), {"oversized", "192 bytes", "194", "2 extra", "re-create"});
    }
    SECTION("token not below the vocabulary size") {
        auto b = good;
        b[48 + 2 * 37] = 0xE8;  // token 37 = 1000 = 0x03E8
        b[48 + 2 * 37 + 1] = 0x03;
        write_resealed(dir.file("token.bin"), b);
        expect_rejected(dir.file("token.bin"), {"index 37", "is 1000", "vocab_size 1000", "tokenizer"});
    }
    SECTION("eot not below the vocabulary size") {
        auto b = good;
        put_u32(b, 20, 1000);
        write_resealed(dir.file("eot.bin"), b);
        expect_rejected(dir.file("eot.bin"), {"eot_token 1000", "vocab_size 1000", "re-create"});
    }
    SECTION("a directory") { expect_rejected(dir.path.string(), {"is a directory", "not a regular file"}); }
    SECTION("a FIFO named like a shard is refused at once, not waited on") {
        const std::string fifo = dir.file("train_000000.pvtokens");
        REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
        expect_rejected(fifo, {"is a FIFO (named pipe)", "not a regular file"});  // hangs without the fix
    }
    SECTION("vocab_size beyond a signed 32-bit count") {
        auto b = good;
        put_u32(b, 12, 3000000000u);
        put_u32(b, 16, 4);
        write_resealed(dir.file("vocab.bin"), b);
        expect_rejected(dir.file("vocab.bin"), {"header field vocab_size is 3000000000", "outside 1..2147483647"});
    }
    SECTION("a flipped bit anywhere (tokens, flags, header fields) fails the checksum") {
        // A flag bit 0 or 1 flipped, or a token changed within the vocabulary, is a valid shard with
        // another meaning: only the checksum tells.
        // Byte 33 is the tokenizer field, 41 the checksum itself.
        for (const size_t at :
             {size_t(12), size_t(20), size_t(33), size_t(41), size_t(48 + 2 * 5), size_t(48 + 128 + 9)}) {
            for (const int bit : {0, 1}) {
                INFO("byte " << at << " bit " << bit);
                auto b = good;
                b[at] ^= static_cast<unsigned char>(1u << bit);
                write_bytes(dir.file("flip.bin"), b);
                expect_rejected(dir.file("flip.bin"), {"checksum mismatch", "corrupted", "re-create"});
            }
        }
    }
    SECTION("two tokens swapped fails the checksum") {
        auto b = good;
        size_t j = 1;
        while (b[48 + 2 * j] == b[48] && b[49 + 2 * j] == b[49]) ++j;
        std::swap(b[48], b[48 + 2 * j]);
        std::swap(b[49], b[49 + 2 * j]);
        write_bytes(dir.file("swap.bin"), b);
        expect_rejected(dir.file("swap.bin"), {"checksum mismatch"});
    }
}
