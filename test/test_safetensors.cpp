// safetensors: round trips keep names, dtypes, shapes, bytes and metadata; the on-disk layout
// matches the specification byte for byte; every way a file can be broken is rejected with a
// message naming the file and the problem; writes are atomic and leave no .tmp behind.
#include "test/temp_dir.h"
#include "formats/safetensors.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace safetensors_test {

namespace fs = std::filesystem;

using pv::test::TempDir;  // test/temp_dir.h

inline std::vector<uint8_t> slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file with the given JSON header (padded to alignment unless told not to) and buffer.
inline std::vector<uint8_t> make_file(const std::string& header, size_t buffer_bytes, bool pad = true) {
    std::string h = header;
    if (pad) h.append((8 - h.size() % 8) % 8, ' ');
    std::vector<uint8_t> out(8);
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(uint64_t{h.size()} >> (8 * i));
    out.insert(out.end(), h.begin(), h.end());
    for (size_t i = 0; i < buffer_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
    return out;
}

inline std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 31 * i + (i >> 8));
    return v;
}

// read_safetensors of `bytes` throws std::runtime_error whose message holds the path and every substring.
inline void expect_rejected(const TempDir& dir, const std::vector<uint8_t>& bytes,
                            const std::vector<std::string>& substrings) {
    const std::string path = dir.file("broken.safetensors");
    spit(path, bytes);
    try {
        (void)pv::read_safetensors(path);
        FAIL("accepted a broken file");
    } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find(path) != std::string::npos);
        for (const auto& s : substrings) {
            INFO("expected substring: " << s);
            CHECK(what.find(s) != std::string::npos);
        }
    }
}

}  // namespace safetensors_test

using namespace safetensors_test;

TEST_CASE("safetensors dtype sizes", "[safetensors]") {
    CHECK(pv::safetensors_dtype_size("F64") == 8);
    CHECK(pv::safetensors_dtype_size("F32") == 4);
    CHECK(pv::safetensors_dtype_size("BF16") == 2);
    CHECK(pv::safetensors_dtype_size("F16") == 2);
    CHECK(pv::safetensors_dtype_size("I64") == 8);
    CHECK(pv::safetensors_dtype_size("I32") == 4);
    CHECK(pv::safetensors_dtype_size("U8") == 1);
    CHECK(pv::safetensors_dtype_size("BOOL") == 1);
    CHECK_THROWS_AS(pv::safetensors_dtype_size("F128"), std::invalid_argument);
    CHECK_THROWS_AS(pv::safetensors_dtype_size("f32"), std::invalid_argument);
}

TEST_CASE("safetensors round trip", "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("model.safetensors");
    // Names out of alphabetical order: the buffer keeps the given order.
    const std::vector<pv::SafeTensor> tensors = {
        {"wte", "BF16", {7, 3}, pattern(7 * 3 * 2, 1)},
        {"scale", "F64", {}, pattern(8, 2)},  // scalar
        {"empty", "F32", {4, 0, 2}, {}},      // zero-sized
        {"layers.0.w", "F32", {2, 3, 5}, pattern(2 * 3 * 5 * 4, 3)},
        {"ids", "I64", {3}, pattern(3 * 8, 4)},
        {"half", "F16", {1, 1}, pattern(2, 5)},
        {"count", "I32", {2}, pattern(8, 6)},
        {"mask", "U8", {5}, pattern(5, 7)},  // leaves the buffer unaligned at the end
    };
    const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "1200"}, {"note", "ünïcode"}};
    pv::write_safetensors(path, tensors, metadata);
    CHECK_FALSE(fs::exists(path + ".tmp"));

    const pv::SafeTensorsFile f = pv::read_safetensors(path);
    CHECK(f.metadata == metadata);
    REQUIRE(f.tensors.size() == tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
        INFO(tensors[i].name);
        CHECK(f.tensors[i].name == tensors[i].name);
        CHECK(f.tensors[i].dtype == tensors[i].dtype);
        CHECK(f.tensors[i].shape == tensors[i].shape);
        CHECK(f.tensors[i].data == tensors[i].data);
        CHECK(&f.at(tensors[i].name) == &f.tensors[i]);
    }
    try {
        (void)f.at("lm_head");
        FAIL("at() found a missing tensor");
    } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        CHECK(what.find("lm_head") != std::string::npos);
        CHECK(what.find(path) != std::string::npos);
    }

    // No metadata and no tensors at all are valid too; a rewrite replaces the file.
    pv::write_safetensors(path, {});
    const pv::SafeTensorsFile empty = pv::read_safetensors(path);
    CHECK(empty.metadata.empty());
    CHECK(empty.tensors.empty());
    CHECK(slurp(path) == make_file("{}", 0));
    CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("safetensors on-disk layout matches the specification", "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("tiny.safetensors");
    const std::vector<uint8_t> a = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};  // F32 1.0, -2.0
    const std::vector<uint8_t> s = {0x80, 0x3f};                                      // BF16 1.0
    pv::write_safetensors(path, {{"a", "F32", {2}, a}, {"s", "BF16", {}, s}}, {{"k", "v"}});

    // 133 bytes of compact JSON with sorted keys, padded with 3 spaces to 136 = 0x88 so that the
    // buffer starts at 8 + 136 = 144, a multiple of 8.
    const std::string json =
        "{\"__metadata__\":{\"k\":\"v\"},"
        "\"a\":{\"data_offsets\":[0,8],\"dtype\":\"F32\",\"shape\":[2]},"
        "\"s\":{\"data_offsets\":[8,10],\"dtype\":\"BF16\",\"shape\":[]}}";
    REQUIRE(json.size() == 133);
    // (Built as one string: GCC 12 warns falsely about inserting a string into a short vector.)
    const std::string head = std::string("\x88\0\0\0\0\0\0\0", 8) + json + "   ";
    std::vector<uint8_t> expected(head.begin(), head.end());
    expected.insert(expected.end(), a.begin(), a.end());
    expected.insert(expected.end(), s.begin(), s.end());
    const std::vector<uint8_t> actual = slurp(path);
    CHECK(actual.size() == 8 + 136 + 10);
    CHECK(actual == expected);

    // The reader takes an unpadded header and tensors listed out of buffer order.
    const std::string unpadded =
        "{\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[8,10]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    std::vector<uint8_t> by_hand = make_file(unpadded, 0, false);
    by_hand.insert(by_hand.end(), a.begin(), a.end());
    by_hand.insert(by_hand.end(), s.begin(), s.end());
    spit(path, by_hand);
    const pv::SafeTensorsFile f = pv::read_safetensors(path);
    REQUIRE(f.tensors.size() == 2);
    CHECK(f.tensors[0].name == "a");
    CHECK(f.tensors[1].name == "s");
    float v[2];
    std::memcpy(v, f.at("a").data.data(), sizeof v);
    CHECK(v[0] == 1.0f);
    CHECK(v[1] == -2.0f);
    CHECK(f.at("s").data == s);
}

TEST_CASE("safetensors writer rejects inconsistent tensors", "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("bad.safetensors");
    using Ts = std::vector<pv::SafeTensor>;
    CHECK_THROWS_AS(pv::write_safetensors(path, Ts{{"x", "F32", {2}, pattern(8, 0)}, {"x", "F32", {1}, pattern(4, 0)}}),
                    std::invalid_argument);
    CHECK_THROWS_AS(pv::write_safetensors(path, Ts{{"x", "F32", {2}, pattern(7, 0)}}), std::invalid_argument);
    CHECK_THROWS_AS(pv::write_safetensors(path, Ts{{"x", "F32", {}, pattern(8, 0)}}), std::invalid_argument);
    CHECK_THROWS_AS(pv::write_safetensors(path, Ts{{"x", "Q4", {2}, pattern(2, 0)}}), std::invalid_argument);
    CHECK_THROWS_AS(pv::write_safetensors(path, Ts{{"x", "U8", {-1}, {}}}), std::invalid_argument);
    CHECK_THROWS_AS(pv::write_safetensors(path, Ts{{"__metadata__", "U8", {1}, pattern(1, 0)}}), std::invalid_argument);
    CHECK_THROWS_AS(pv::write_safetensors(path, Ts{{"", "U8", {1}, pattern(1, 0)}}), std::invalid_argument);
    CHECK_FALSE(fs::exists(path));
    CHECK_FALSE(fs::exists(path + ".tmp"));
    // A directory that does not exist: an I/O error naming the file, nothing left behind.
    CHECK_THROWS_AS(pv::write_safetensors(dir.file("nowhere/x.safetensors"), {}), std::runtime_error);
}

TEST_CASE("safetensors reader rejects broken files", "[safetensors]") {
    TempDir dir;
    const std::string ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    REQUIRE_NOTHROW(pv::read_safetensors((spit(dir.file("ok"), make_file(ok, 8)), dir.file("ok"))));

    SECTION("missing file") {
        try {
            (void)pv::read_safetensors(dir.file("absent.safetensors"));
            FAIL("read a missing file");
        } catch (const std::runtime_error& e) {
            CHECK(std::string(e.what()).find("absent.safetensors") != std::string::npos);
            CHECK(std::string(e.what()).find("cannot open") != std::string::npos);
        }
    }
    SECTION("a FIFO named like a safetensors file is refused at once, not waited on") {
        const std::string fifo = dir.file("model.safetensors");
        REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
        CHECK_THROWS_WITH(pv::read_safetensors(fifo), Catch::Contains(fifo) && Catch::Contains("FIFO"));
    }
    SECTION("shorter than the length prefix") {
        expect_rejected(dir, {}, {"shorter than the 8-byte"});
        expect_rejected(dir, {1, 0, 0}, {"3 bytes"});
    }
    SECTION("header length beyond the file") {
        std::vector<uint8_t> f = make_file(ok, 8);
        f[0] = 0xff;
        f[5] = 0x01;
        expect_rejected(dir, f, {"header length", "runs past the end"});
        std::vector<uint8_t> huge(16, 0xff);  // u64 max must not wrap around
        expect_rejected(dir, huge, {"runs past the end"});
    }
    SECTION("header not JSON or not an object") {
        expect_rejected(dir, make_file("{\"x\":", 0), {"not valid JSON"});
        expect_rejected(dir, make_file("[1, 2]", 0), {"not a JSON object"});
        expect_rejected(dir, make_file("{\"x\":[1]}", 0), {"tensor 'x'", "not a JSON object"});
        expect_rejected(dir, make_file("{\"__metadata__\":{\"a\":1}}", 0), {"__metadata__", "not a string"});
    }
    SECTION("missing fields") {
        expect_rejected(dir, make_file("{\"x\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8), {"tensor 'x'", "dtype"});
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8),
                        {"tensor 'x'", "shape"});
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8), {"tensor 'x'", "data_offsets"});
    }
    SECTION("malformed fields") {
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8),
                        {"tensor 'x'", "shape"});
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8),
                        {"tensor 'x'", "data_offsets"});
    }
    SECTION("unknown dtype") {
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1),
                        {"tensor 'x'", "unknown safetensors dtype 'F4'"});
    }
    SECTION("offsets outside the buffer") {
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7),
                        {"tensor 'x'", "outside the 7-byte data buffer"});
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8),
                        {"tensor 'x'", "outside"});
    }
    SECTION("overlapping tensors") {
        expect_rejected(dir,
                        make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                  "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                                  8),
                        {"tensor 'y'", "overlap"});
    }
    SECTION("gaps between tensors") {
        expect_rejected(dir,
                        make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                  "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                                  12),
                        {"tensor 'y'", "gap after byte 4"});
        expect_rejected(dir, make_file("{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
                        {"tensor 'y'", "gap after byte 0"});
    }
    SECTION("size differs from the shape") {
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
                        {"tensor 'x'", "span 8 bytes", "needs 12"});
        expect_rejected(dir, make_file("{\"x\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,4]}}", 4),
                        {"tensor 'x'", "needs 8"});
    }
    SECTION("trailing bytes") {
        expect_rejected(dir, make_file(ok, 9), {"1 trailing bytes"});
        expect_rejected(dir, make_file("{}", 3), {"3 trailing bytes"});
    }
}

// A file written by the reference implementation (Python safetensors 0.8.0, numpy 2.4.6), which
// orders the buffer by alignment then name, not as the header lists it. Made with:
//
//   import numpy as np
//   from safetensors.numpy import save_file
//   save_file({
//       "f32": np.array([[1.5, -2.25, 3.0], [0.125, -0.0, 1e-3]], dtype=np.float32),
//       "f64": np.array(3.141592653589793, dtype=np.float64),
//       "i64": np.array([-1, 0, 2**40], dtype=np.int64),
//       "f16": np.array([1.0, -0.5], dtype=np.float16),
//       "u8": np.arange(5, dtype=np.uint8),
//       "empty": np.zeros((0, 3), dtype=np.int32),
//   }, "python.safetensors", metadata={"format": "np", "source": "safetensors 0.8.0"})
TEST_CASE("safetensors reads a file written by the Python package", "[safetensors]") {
    // Tests run from the repository root (make test); __FILE__ is relative to it too.
    const fs::path path = fs::path(__FILE__).parent_path() / "data/safetensors/python.safetensors";
    INFO("fixture: " << path);
    REQUIRE(fs::exists(path));
    const pv::SafeTensorsFile f = pv::read_safetensors(path.string());
    CHECK(f.metadata == std::map<std::string, std::string>{{"format", "np"}, {"source", "safetensors 0.8.0"}});
    std::vector<std::string> names;
    for (const auto& t : f.tensors) names.push_back(t.name);
    CHECK(names == std::vector<std::string>{"i64", "f64", "f32", "empty", "f16", "u8"});

    const auto values = [&](const std::string& name, auto zero) {
        const pv::SafeTensor& t = f.at(name);
        std::vector<decltype(zero)> v(t.data.size() / sizeof zero);
        std::memcpy(v.data(), t.data.data(), t.data.size());
        return v;
    };
    CHECK(f.at("f32").dtype == "F32");
    CHECK(f.at("f32").shape == std::vector<int64_t>{2, 3});
    CHECK(values("f32", 0.0f) == std::vector<float>{1.5f, -2.25f, 3.0f, 0.125f, -0.0f, 1e-3f});
    CHECK(std::signbit(values("f32", 0.0f)[4]));
    CHECK(f.at("f64").shape.empty());
    CHECK(values("f64", 0.0) == std::vector<double>{3.141592653589793});
    CHECK(f.at("i64").dtype == "I64");
    CHECK(values("i64", int64_t{0}) == std::vector<int64_t>{-1, 0, int64_t{1} << 40});
    CHECK(f.at("f16").dtype == "F16");
    CHECK(values("f16", uint16_t{0}) == std::vector<uint16_t>{0x3c00, 0xb800});  // 1.0, -0.5
    CHECK(f.at("u8").data == std::vector<uint8_t>{0, 1, 2, 3, 4});
    CHECK(f.at("empty").dtype == "I32");
    CHECK(f.at("empty").shape == std::vector<int64_t>{0, 3});
    CHECK(f.at("empty").data.empty());

    // Our writer, given the same tensors in the same order, is read back identically.
    TempDir dir;
    pv::write_safetensors(dir.file("again.safetensors"), f.tensors, f.metadata);
    const pv::SafeTensorsFile g = pv::read_safetensors(dir.file("again.safetensors"));
    REQUIRE(g.tensors.size() == f.tensors.size());
    for (size_t i = 0; i < f.tensors.size(); ++i) {
        CHECK(g.tensors[i].name == f.tensors[i].name);
        CHECK(g.tensors[i].shape == f.tensors[i].shape);
        CHECK(g.tensors[i].data == f.tensors[i].data);
    }
}

TEST_CASE("safetensors reader: header only on opening, then any byte range of a tensor, every byte counted",
          "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("ranges.safetensors");
    const std::vector<uint8_t> a = pattern(40, 1), b = pattern(6, 2);
    pv::write_safetensors(path, {{"a", "F32", {2, 5}, a}, {"b", "BF16", {3}, b}}, {{"k", "v"}});
    const uint64_t size = fs::file_size(path);
    pv::SafeTensorsReader r(path);
    CHECK(r.header_bytes() == size - 46);  // 8 + N: the rest is the two tensors' 46 bytes
    CHECK(r.bytes_read() == r.header_bytes());
    CHECK(r.metadata() == std::map<std::string, std::string>{{"k", "v"}});
    REQUIRE(r.tensors().size() == 2);
    const pv::SafeTensorInfo* ta = r.find("a");
    REQUIRE(ta != nullptr);
    CHECK(r.find("c") == nullptr);
    CHECK(ta->offset == r.header_bytes());
    CHECK(ta->bytes == 40);
    CHECK(ta->numel() == 10);
    CHECK(r.find("b")->offset == r.header_bytes() + 40);
    std::vector<uint8_t> got(12);
    r.read(*ta, 20, 12, got.data());  // row 1, columns 0..2
    CHECK(got == std::vector<uint8_t>(a.begin() + 20, a.begin() + 32));
    CHECK(r.bytes_read() == r.header_bytes() + 12);
    r.read(*r.find("b"), 0, 6, got.data());
    CHECK(std::vector<uint8_t>(got.begin(), got.begin() + 6) == b);
    CHECK(r.bytes_read() == r.header_bytes() + 18);  // the header, 12 + 6 bytes of data: never more than asked
    CHECK_THROWS_AS(r.read(*ta, 36, 8, got.data()), std::out_of_range);
    // The file shrinks after opening: a read past its new end says so.
    const std::vector<uint8_t> whole = slurp(path);
    spit(path, std::vector<uint8_t>(whole.begin(), whole.end() - 10));
    try {
        r.read(*r.find("b"), 0, 6, got.data());
        FAIL("read past the end of a truncated file");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find("truncated") != std::string::npos);
    }
}

TEST_CASE("safetensors reader: a header length past the format's 100 MB limit is refused before allocating",
          "[safetensors]") {
    TempDir dir;
    // A file of 100 MB + 16 bytes (sparse: nothing written) whose header claims 100 MB + 1.
    const std::string path = dir.file("huge.safetensors");
    {
        std::ofstream out(path, std::ios::binary);
        const uint64_t n = 100'000'001;
        for (int i = 0; i < 8; ++i) out.put(char(uint8_t(n >> (8 * i))));
    }
    fs::resize_file(path, 100'000'016);
    try {
        (void)pv::SafeTensorsReader(path);
        FAIL("accepted a 100 MB header");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find("exceeds the format's limit") != std::string::npos);
    }
}

TEST_CASE("safetensors streamed writer: tensors written one at a time; a wrong byte count publishes nothing",
          "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("streamed.safetensors");
    const std::vector<uint8_t> a = pattern(24, 3), b = pattern(4, 4);
    std::vector<pv::SafeTensorInfo> infos = {{"a", "F64", {3}, 0, 0}, {"b", "U8", {2, 2}, 0, 0}};
    pv::write_safetensors_streamed(path, infos, {{"format", "pt"}}, [&](size_t i, const pv::ByteSink& sink) {
        if (i == 0) {  // in two pieces
            sink(a.data(), 10);
            sink(a.data() + 10, 14);
        } else {
            sink(b.data(), 4);
        }
    });
    // The same bytes as the in-memory writer.
    const std::string reference = dir.file("reference.safetensors");
    pv::write_safetensors(reference, {{"a", "F64", {3}, a}, {"b", "U8", {2, 2}, b}}, {{"format", "pt"}});
    CHECK(slurp(path) == slurp(reference));
    for (const size_t given : {size_t(3), size_t(5)}) {
        INFO("bytes given for b: " << given);
        const std::string bad = dir.file("bad.safetensors");
        CHECK_THROWS_AS(pv::write_safetensors_streamed(bad, infos, {},
                                                       [&](size_t i, const pv::ByteSink& sink) {
                                                           const std::vector<uint8_t> x =
                                                               i == 0 ? a : pattern(given, 5);
                                                           sink(x.data(), x.size());
                                                       }),
                        std::logic_error);
        CHECK_FALSE(fs::exists(bad));
        CHECK_FALSE(fs::exists(bad + ".tmp"));
    }
}
