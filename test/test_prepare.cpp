// `train prepare`'s engine: text and JSON-lines inputs become a token stream that decodes to the
// documents each followed by "<|endoftext|>" (expectations built from the inputs, not by the code
// under test), split into training shards and the last ceil(fraction·N) tokens for validation;
// a given tokenizer is used as is; runs are byte-identical; stale shards go; load_dataset reads
// it all back; every bad input is rejected with a message naming the file, line or option.
#include "test/temp_dir.h"
#include "data/examples.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace prepare_test {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

const std::string kEot = "<|endoftext|>";

using pv::test::TempDir;  // test/temp_dir.h

inline void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// Random text: words with non-ASCII letters, punctuation and whitespace runs; with
// invalid_utf8, also stray continuation bytes, truncated sequences, surrogates and 0xFF.
inline std::string random_text(std::mt19937_64& rng, size_t words, bool invalid_utf8) {
    static const char* const kWords[] = {"the",   "kernel", "warp",   "shard", "token", "Naïve", "café", "日本語",
                                         "Ωμέγα", "🙂",   "x86-64", "42",    "1024",  "don't", "it's", "fp32"};
    static const char* const kGaps[] = {" ", " ", " ", ", ", ". ", "\n", "\n\n", "  ", "\t", "!\n"};
    static const char* const kBad[] = {"\xff", "\xc3", "\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe6\x97"};
    std::string s;
    for (size_t i = 0; i < words; ++i) {
        s += kWords[rng() % std::size(kWords)];
        if (invalid_utf8 && rng() % 8 == 0) s += kBad[rng() % std::size(kBad)];
        s += kGaps[rng() % std::size(kGaps)];
    }
    return s;
}

inline std::vector<int> as_ids(const std::vector<uint32_t>& t) { return std::vector<int>(t.begin(), t.end()); }

// The token stream a prepared directory holds: the training shards in order, then validation.
inline std::vector<uint32_t> stream_of(const pv::PreparedData& r) {
    std::vector<uint32_t> s;
    for (const auto& p : r.train_shards) {
        const auto t = pv::read_shard(p).tokens;
        s.insert(s.end(), t.begin(), t.end());
    }
    const auto v = pv::read_shard(r.val_shard).tokens;
    s.insert(s.end(), v.begin(), v.end());
    return s;
}

// The flags of a prepared directory's stream, in the same order.
inline std::vector<uint8_t> flags_of(const pv::PreparedData& r) {
    std::vector<uint8_t> f;
    for (const auto& p : r.train_shards) {
        const auto t = pv::read_shard(p).flags;
        f.insert(f.end(), t.begin(), t.end());
    }
    const auto v = pv::read_shard(r.val_shard).flags;
    f.insert(f.end(), v.begin(), v.end());
    return f;
}

// The documents joined as the stream must decode: each followed by "<|endoftext|>".
inline std::string joined(const std::vector<std::string>& docs) {
    std::string s;
    for (const auto& d : docs) s += d + kEot;
    return s;
}

// Calls f and requires an exception of type E whose message holds every substring.
template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& substrings) {
    std::string message;
    bool thrown = false;
    try {
        f();
    } catch (const E& e) {
        thrown = true;
        message = e.what();
    }
    INFO("message: " << message);
    REQUIRE(thrown);
    for (const auto& s : substrings) {
        INFO("expected substring: " << s);
        CHECK(message.find(s) != std::string::npos);
    }
}

// A plain-text file of `bytes` bytes 'a'..'z' (with vocab 257 each byte is one token, its value).
inline std::string letters(size_t bytes, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::string s(bytes, 'a');
    for (auto& c : s) c = char('a' + rng() % 26);
    return s;
}

}  // namespace prepare_test

using namespace prepare_test;

TEST_CASE("text and JSON-lines inputs become a stream of the documents each followed by EOT", "[prepare]") {
    TempDir dir("mixed");
    std::mt19937_64 rng(20240601);
    std::vector<std::string> docs;  // the expected documents, in order

    // Plain text: the whole file, invalid UTF-8 included, is one document.
    const std::string plain1 = random_text(rng, 900, true);
    write_bytes(dir.file("a.txt"), plain1);
    docs.push_back(plain1);

    // JSON lines: a blank line, CRLF endings, escapes, a literal "<|endoftext|>", an empty text
    // (skipped), other fields ignored.
    std::string jsonl;
    for (int i = 0; i < 6; ++i) {
        const std::string text = random_text(rng, 40 + rng() % 60, false);
        jsonl += nlohmann::json{{"id", i}, {"text", text}}.dump() + (i % 2 ? "\r\n" : "\n");
        docs.push_back(text);
        if (i == 2) jsonl += "\n   \n";
    }
    jsonl += "{\"text\": \"caf\\u00e9 \\ud83d\\ude42 tab\\there\", \"n\": 1}\n";
    docs.push_back("caf\xc3\xa9 \xf0\x9f\x99\x82 tab\there");
    jsonl += "{\"text\": \"a forged <|endoftext|> boundary\"}\n";
    docs.push_back("a forged <|endoftext|> boundary");
    jsonl += "{\"text\": \"\"}\n";
    jsonl += "{\"meta\": {\"text\": 1}, \"text\": \"last line without newline\"}";
    docs.push_back("last line without newline");
    write_bytes(dir.file("b.JSONL"), jsonl);

    const std::string plain2 = random_text(rng, 300, true) + "\n";
    write_bytes(dir.file("c.md"), plain2);
    docs.push_back(plain2);

    pv::PrepareOptions o;
    o.inputs = {dir.file("a.txt"), dir.file("b.JSONL"), dir.file("c.md")};
    o.vocab = 300;
    o.out_dir = dir.file("out/nested");  // created, parents too
    o.val_fraction = 0.25;
    o.shard_tokens = 200;
    const pv::PreparedData r = pv::prepare_data(o);

    CHECK(r.documents == long(docs.size()));
    CHECK(r.vocab_size == 300);
    CHECK(r.tokenizer_path == dir.file("out/nested/tokenizer.json"));
    CHECK(r.val_shard == dir.file("out/nested/val.pvtokens"));
    const pv::Tokenizer tok = pv::Tokenizer::load(r.tokenizer_path);
    CHECK(tok.vocab_size() == 300);
    REQUIRE(tok.eos_id() >= 0);

    const std::vector<uint32_t> stream = stream_of(r);
    const long long n = (long long)stream.size();
    CHECK(tok.decode(as_ids(stream)) == joined(docs));
    CHECK(r.train_tokens + r.val_tokens == n);
    CHECK(r.val_tokens == (n + 3) / 4);  // ceil(n / 4)

    // EOTs are exactly the document ends (the forged one is text), and each document's ids are
    // the saved tokenizer's encoding of it.
    std::vector<uint32_t> expected;
    for (const auto& d : docs) {
        for (int id : tok.encode(d, false)) expected.push_back(uint32_t(id));
        expected.push_back(uint32_t(tok.eos_id()));
    }
    CHECK(stream == expected);
    CHECK(std::count(stream.begin(), stream.end(), uint32_t(tok.eos_id())) == long(docs.size()));
    // Plain text: every token counts and may be split; a document starts after each EOT.
    const std::vector<uint8_t> flags = flags_of(r);
    REQUIRE(flags.size() == stream.size());
    for (size_t i = 0; i < flags.size(); ++i) {
        const bool starts = i == 0 || stream[i - 1] == uint32_t(tok.eos_id());
        CHECK(flags[i] == (pv::kTokenCounted | pv::kTokenSplittable | (starts ? pv::kTokenStartsDocument : 0)));
    }
    CHECK(r.counted_tokens == n);
    CHECK(r.text_documents == r.documents);
    CHECK(r.chat_documents + r.prompt_completion_documents == 0);
    CHECK(r.chat_format.empty());

    // Training shards: train_000000, ... each 200 tokens but the last, with the tokenizer's header.
    const long long shards = (r.train_tokens + 199) / 200;
    REQUIRE((long long)r.train_shards.size() == shards);
    REQUIRE(shards >= 3);
    for (long long s = 0; s < shards; ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "out/nested/train_%06lld.pvtokens", s);
        CHECK(r.train_shards[size_t(s)] == dir.file(name));
        const pv::TokenShard sh = pv::read_shard(r.train_shards[size_t(s)]);
        CHECK(sh.vocab_size == 300u);
        CHECK(sh.eot_token == uint32_t(tok.eos_id()));
        CHECK((long long)sh.tokens.size() == (s + 1 < shards ? 200 : r.train_tokens - 200 * (shards - 1)));
    }
    const pv::TokenShard val = pv::read_shard(r.val_shard);
    CHECK((long long)val.tokens.size() == r.val_tokens);
    CHECK(val.vocab_size == 300u);
    CHECK(val.eot_token == uint32_t(tok.eos_id()));
    CHECK(!fs::exists(r.tokenizer_path + ".tmp"));
}

TEST_CASE("a custom JSONL text field is read", "[prepare]") {
    TempDir dir("field");
    write_bytes(dir.file("d.ndjson"), "{\"content\": \"alpha beta\", \"text\": 7}\n{\"content\": \"gamma\"}\n");
    pv::PrepareOptions o;
    o.inputs = {dir.file("d.ndjson")};
    o.text_field = "content";
    o.vocab = 257;  // bytes only: one token per byte
    o.val_fraction = 0.5;
    o.out_dir = dir.file("out");
    const pv::PreparedData r = pv::prepare_data(o);
    CHECK(r.documents == 2);
    const pv::Tokenizer tok = pv::Tokenizer::load(r.tokenizer_path);
    CHECK(tok.decode(as_ids(stream_of(r))) == joined({"alpha beta", "gamma"}));
}

TEST_CASE("a given tokenizer is used as is and copied to the output", "[prepare]") {
    TempDir dir("given");
    std::mt19937_64 rng(7);
    const std::string own = dir.file("own.json");
    pv::Tokenizer::train(random_text(rng, 2000, false), 320).save(own);
    const std::vector<std::string> docs = {random_text(rng, 400, true), random_text(rng, 200, false)};
    write_bytes(dir.file("x.txt"), docs[0]);
    write_bytes(dir.file("y.txt"), docs[1]);

    pv::PrepareOptions o;
    o.inputs = {dir.file("x.txt"), dir.file("y.txt")};
    o.tokenizer = own;
    o.vocab = 100;  // ignored with a given tokenizer
    o.out_dir = dir.file("out");
    const pv::PreparedData r = pv::prepare_data(o);

    const pv::Tokenizer given = pv::Tokenizer::load(own);
    std::vector<uint32_t> expected;
    for (const auto& d : docs) {
        for (int id : given.encode(d, false)) expected.push_back(uint32_t(id));
        expected.push_back(uint32_t(given.eos_id()));
    }
    CHECK(stream_of(r) == expected);
    CHECK(r.vocab_size == given.vocab_size());
    CHECK(r.vocab_size == 320);
    CHECK(r.val_tokens == ((long long)expected.size() + 9) / 10);  // ceil(N / 10)
    CHECK(read_bytes(r.tokenizer_path) == read_bytes(own));        // copied byte for byte
    CHECK(!fs::exists(dir.file("out/tokenizer_config.json")));     // there is none beside own.json
    const pv::Tokenizer copied = pv::Tokenizer::load(r.tokenizer_path);
    CHECK(copied.vocab_size() == given.vocab_size());
    CHECK(copied.encode(docs[0], false) == given.encode(docs[0], false));
    CHECK(copied.encode(docs[1], false) == given.encode(docs[1], false));
    // Every shard records what the tokenizer's ids mean.
    for (const std::string& shard : r.train_shards) CHECK(pv::read_shard(shard).tokenizer == given.id_fingerprint());
    CHECK(pv::read_shard(r.val_shard).tokenizer == given.id_fingerprint());

    // The output directory's own tokenizer.json as input: loaded before it is rewritten.
    o.tokenizer = r.tokenizer_path;
    const pv::PreparedData again = pv::prepare_data(o);
    CHECK(stream_of(again) == expected);
}

TEST_CASE("validation is the last ceil(fraction * N) tokens, decimal fractions exact", "[prepare]") {
    TempDir dir("split");
    // With vocab 257 (no merges) every byte is one token, its byte value, and EOT is 256: a
    // 99-byte document is N = 100 tokens whose values are known without the tokenizer.
    const std::string doc = letters(99, 3);
    write_bytes(dir.file("d.txt"), doc);
    std::vector<uint32_t> expected;
    for (unsigned char c : doc) expected.push_back(c);
    expected.push_back(256);

    pv::PrepareOptions o;
    o.inputs = {dir.file("d.txt")};
    o.vocab = 257;
    o.out_dir = dir.file("out");
    auto check = [&](double fraction, long long val) {
        INFO("val_fraction " << fraction);
        o.val_fraction = fraction;
        const pv::PreparedData r = pv::prepare_data(o);
        CHECK(r.val_tokens == val);
        CHECK(r.train_tokens == 100 - val);
        const std::vector<uint32_t> v = pv::read_shard(r.val_shard).tokens;
        CHECK(v == std::vector<uint32_t>(expected.end() - val, expected.end()));
        CHECK(stream_of(r) == expected);
    };
    // In binary these three products are a little above the integer (0.07 × 100 =
    // 7.000000000000001): the decimal fraction is meant.
    check(0.07, 7);
    check(0.14, 14);
    check(0.28, 28);
    check(0.1, 10);
    check(0.5, 50);
    check(0.015, 2);   // 1.5 -> 2
    check(0.0101, 2);  // 1.01 -> 2
    check(0.4999, 50);
    std::mt19937_64 rng(11);
    for (int i = 0; i < 3; ++i) {
        const long long k = 2 + long(rng() % 49);  // 2 .. 50
        check(double(k) / 100.0, k);
        if (k < 50) check((double(k) + 0.5) / 100.0, k + 1);
    }
}

TEST_CASE("training shards hold at most shard_tokens, in order", "[prepare]") {
    TempDir dir("shards");
    const std::string doc1 = letters(5, 5), doc2 = letters(4, 6);
    write_bytes(dir.file("1.txt"), doc1);
    write_bytes(dir.file("2.txt"), doc2);
    std::vector<uint32_t> expected;
    for (unsigned char c : doc1) expected.push_back(c);
    expected.push_back(256);
    for (unsigned char c : doc2) expected.push_back(c);
    expected.push_back(256);  // N = 11; val_fraction 0.1 holds out ceil(1.1) = 2, leaving 9

    pv::PrepareOptions o;
    o.inputs = {dir.file("1.txt"), dir.file("2.txt")};
    o.vocab = 257;
    o.out_dir = dir.file("out");
    for (long long limit : {1LL, 2LL, 4LL, 8LL, 9LL, 10LL, 1000LL}) {
        INFO("shard_tokens " << limit);
        o.shard_tokens = limit;
        const pv::PreparedData r = pv::prepare_data(o);
        REQUIRE(r.train_tokens == 9);
        CHECK((long long)r.train_shards.size() == (9 + limit - 1) / limit);
        std::vector<uint32_t> train;
        for (size_t s = 0; s < r.train_shards.size(); ++s) {
            const auto t = pv::read_shard(r.train_shards[s]).tokens;
            CHECK((long long)t.size() <= limit);
            if (s + 1 < r.train_shards.size()) CHECK((long long)t.size() == limit);
            CHECK(!t.empty());
            train.insert(train.end(), t.begin(), t.end());
        }
        CHECK(train == std::vector<uint32_t>(expected.begin(), expected.begin() + 9));
        CHECK(stream_of(r) == expected);
    }
}

TEST_CASE("many documents keep their order and two runs are byte-identical", "[prepare]") {
    TempDir dir("determinism");
    std::mt19937_64 rng(99);
    // Enough documents and bytes (> 64 KiB) that encoding runs on several threads.
    std::vector<std::string> docs;
    std::string jsonl;
    for (int i = 0; i < 400; ++i) {
        docs.push_back(std::to_string(i) + ": " + random_text(rng, 20 + rng() % 80, false));
        jsonl += nlohmann::json{{"text", docs.back()}}.dump() + "\n";
    }
    REQUIRE(jsonl.size() > 2 * 65536);
    write_bytes(dir.file("many.jsonl"), jsonl);
    const std::string plain = random_text(rng, 3000, true);
    write_bytes(dir.file("plain.txt"), plain);
    docs.push_back(plain);

    pv::PrepareOptions o;
    o.inputs = {dir.file("many.jsonl"), dir.file("plain.txt")};
    o.vocab = 400;
    o.shard_tokens = 20000;
    o.out_dir = dir.file("a");
    const pv::PreparedData a = pv::prepare_data(o);
    o.out_dir = dir.file("b");
    const pv::PreparedData b = pv::prepare_data(o);

    const pv::Tokenizer tok = pv::Tokenizer::load(a.tokenizer_path);
    std::vector<uint32_t> expected;
    for (const auto& d : docs) {
        for (int id : tok.encode(d, false)) expected.push_back(uint32_t(id));
        expected.push_back(uint32_t(tok.eos_id()));
    }
    CHECK(stream_of(a) == expected);
    CHECK(tok.decode(as_ids(expected)) == joined(docs));
    REQUIRE(a.train_shards.size() >= 2);

    std::vector<std::string> names_a, names_b;
    for (const auto& e : fs::directory_iterator(dir.file("a"))) names_a.push_back(e.path().filename().string());
    for (const auto& e : fs::directory_iterator(dir.file("b"))) names_b.push_back(e.path().filename().string());
    std::sort(names_a.begin(), names_a.end());
    std::sort(names_b.begin(), names_b.end());
    CHECK(names_a == names_b);
    CHECK(names_a.size() == a.train_shards.size() + 2);  // + val.pvtokens, tokenizer.json; no .tmp
    for (const auto& name : names_a) {
        INFO(name);
        CHECK(read_bytes(dir.file("a/" + name)) == read_bytes(dir.file("b/" + name)));
    }
}

TEST_CASE("rerunning into a directory removes the earlier run's extra shards", "[prepare]") {
    TempDir dir("stale");
    write_bytes(dir.file("d.txt"), letters(99, 8));
    write_bytes(dir.file("e.txt"), letters(49, 9));
    pv::PrepareOptions o;
    o.inputs = {dir.file("d.txt")};
    o.vocab = 257;
    o.out_dir = dir.file("out");
    o.shard_tokens = 10;
    REQUIRE(pv::prepare_data(o).train_shards.size() == 9);  // 90 training tokens
    write_bytes(dir.file("out/train_zzz.pvtokens"), "a stray file of the shard pattern");
    write_bytes(dir.file("out/notes.txt"), "keep me");

    o.inputs = {dir.file("e.txt")};  // N = 50: 45 training tokens, 5 validation
    o.shard_tokens = 20;
    const pv::PreparedData r = pv::prepare_data(o);
    REQUIRE(r.train_shards.size() == 3);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.file("out"))) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"notes.txt", "tokenizer.json", "train_000000.pvtokens",
                                            "train_000001.pvtokens", "train_000002.pvtokens", "val.pvtokens"});

    const pv::DataSet ds = pv::load_dataset(dir.file("out"));
    REQUIRE(ds.train.size() == 3);
    std::vector<uint32_t> all;
    for (const auto& s : ds.train) all.insert(all.end(), s.tokens.begin(), s.tokens.end());
    REQUIRE(ds.val.has_value());
    all.insert(all.end(), ds.val->tokens.begin(), ds.val->tokens.end());
    std::vector<uint32_t> expected;
    for (unsigned char c : letters(49, 9)) expected.push_back(c);
    expected.push_back(256);
    CHECK(all == expected);
}

TEST_CASE("load_dataset reads a prepared directory or a single shard", "[prepare]") {
    TempDir dir("load");
    std::mt19937_64 rng(5);
    write_bytes(dir.file("t.txt"), random_text(rng, 600, true));
    pv::PrepareOptions o;
    o.inputs = {dir.file("t.txt")};
    o.vocab = 300;
    o.shard_tokens = 150;
    o.out_dir = dir.file("out");
    const pv::PreparedData r = pv::prepare_data(o);
    REQUIRE(r.train_shards.size() >= 2);

    const pv::DataSet ds = pv::load_dataset(dir.file("out"));
    REQUIRE(ds.train.size() == r.train_shards.size());
    for (size_t i = 0; i < ds.train.size(); ++i) CHECK(ds.train[i].tokens == pv::read_shard(r.train_shards[i]).tokens);
    REQUIRE(ds.val.has_value());
    CHECK(ds.val->tokens == pv::read_shard(r.val_shard).tokens);
    CHECK(ds.tokenizer_path == r.tokenizer_path);

    const pv::DataSet one = pv::load_dataset(r.val_shard);
    REQUIRE(one.train.size() == 1);
    CHECK(one.train[0].tokens == ds.val->tokens);
    CHECK(!one.val.has_value());
    CHECK(one.tokenizer_path.empty());

    // Name order, whatever order the files were written in; no val, no tokenizer.
    const std::string hand = dir.file("hand");
    fs::create_directories(hand);
    for (uint32_t i : {2u, 0u, 1u, 3u}) {
        char name[64];
        std::snprintf(name, sizeof name, "train_%06u.pvtokens", i);
        pv::write_shard(hand + "/" + name, pv::TokenShard{20, 19, {i, i, 19}, {7, 5, 5}});
    }
    const pv::DataSet h = pv::load_dataset(hand);
    REQUIRE(h.train.size() == 4);
    for (size_t k = 0; k < 4; ++k) CHECK(h.train[k].tokens[0] == std::vector<uint32_t>{0, 1, 2, 3}[k]);
    CHECK(!h.val.has_value());
    CHECK(h.tokenizer_path.empty());
}

TEST_CASE("load_dataset rejects missing paths, empty directories, mixed vocabularies, bad shards", "[prepare]") {
    TempDir dir("load_errors");
    const std::string missing = dir.file("nope");
    expect_error<std::runtime_error>([&] { (void)pv::load_dataset(missing); }, {missing, "does not exist"});

    const std::string empty = dir.file("empty");
    fs::create_directories(empty);
    write_bytes(empty + "/val.pvtokens", "");
    expect_error<std::runtime_error>([&] { (void)pv::load_dataset(empty); }, {empty, "no train_*.pvtokens"});

    const std::string mixed = dir.file("mixed");
    fs::create_directories(mixed);
    pv::write_shard(mixed + "/train_000000.pvtokens", pv::TokenShard{300, 299, {1, 2, 3}, {7, 5, 5}});
    pv::write_shard(mixed + "/train_000001.pvtokens", pv::TokenShard{400, 399, {1, 2, 3}, {7, 5, 5}});
    expect_error<std::runtime_error>([&] { (void)pv::load_dataset(mixed); },
                                     {mixed + "/train_000001.pvtokens", "vocab_size 400", "300", "different runs"});

    // The same vocabulary size from two tokenizers: the shards' fingerprints tell them apart (and
    // a shard that records none, written without a tokenizer, is taken as it is).
    const std::string mixed_tokenizers = dir.file("mixed_tokenizers");
    fs::create_directories(mixed_tokenizers);
    pv::write_shard(mixed_tokenizers + "/train_000000.pvtokens", pv::TokenShard{300, 299, {1, 2, 3}, {7, 5, 5}, 0xa1});
    pv::write_shard(mixed_tokenizers + "/train_000001.pvtokens", pv::TokenShard{300, 299, {1, 2, 3}, {7, 5, 5}, 0});
    REQUIRE(pv::load_dataset(mixed_tokenizers).train.size() == 2);
    pv::write_shard(mixed_tokenizers + "/train_000002.pvtokens", pv::TokenShard{300, 299, {1, 2, 3}, {7, 5, 5}, 0xb2});
    expect_error<std::runtime_error>(
        [&] { (void)pv::load_dataset(mixed_tokenizers); },
        {mixed_tokenizers + "/train_000002.pvtokens", "tokenizer 00000000000000b2", "00000000000000a1", "different runs"});

    const std::string mixed_val = dir.file("mixed_val");
    fs::create_directories(mixed_val);
    pv::write_shard(mixed_val + "/train_000000.pvtokens", pv::TokenShard{300, 299, {1, 2, 3}, {7, 5, 5}});
    pv::write_shard(mixed_val + "/val.pvtokens", pv::TokenShard{512, 511, {1, 2, 3}, {7, 5, 5}});
    expect_error<std::runtime_error>([&] { (void)pv::load_dataset(mixed_val); },
                                     {mixed_val + "/val.pvtokens", "vocab_size 512", "300"});

    // A gap in the numbering (a shard removed or renamed) is data lost: refused, naming the file.
    const std::string gap = dir.file("gap");
    fs::create_directories(gap);
    for (const char* name : {"train_000000.pvtokens", "train_000002.pvtokens"})
        pv::write_shard(gap + "/" + name, pv::TokenShard{300, 299, {1, 2, 3}, {7, 5, 5}});
    expect_error<std::runtime_error>([&] { (void)pv::load_dataset(gap); },
                                     {gap + "/train_000001.pvtokens", "is missing", "'" + gap + "'",
                                      "re-run `train prepare`"});

    const std::string bad = dir.file("bad");
    fs::create_directories(bad);
    write_bytes(bad + "/train_000000.pvtokens", "not a shard at all, longer than a header........");
    expect_error<std::runtime_error>([&] { (void)pv::load_dataset(bad); },
                                     {bad + "/train_000000.pvtokens", "not a polevault token shard"});
    expect_error<std::runtime_error>([&] { (void)pv::load_dataset(bad + "/train_000000.pvtokens"); },
                                     {"not a polevault token shard"});
}

TEST_CASE("prepare_data rejects bad options and inputs, naming the file, line or option", "[prepare]") {
    TempDir dir("errors");
    write_bytes(dir.file("ok.txt"), letters(200, 1));
    pv::PrepareOptions base;
    base.inputs = {dir.file("ok.txt")};
    base.vocab = 260;
    base.out_dir = dir.file("out");
    auto run = [&](const pv::PrepareOptions& o) { return [o] { (void)pv::prepare_data(o); }; };

    SECTION("the base options work") { REQUIRE_NOTHROW(pv::prepare_data(base)); }
    SECTION("options") {
        pv::PrepareOptions o = base;
        o.inputs.clear();
        expect_error<std::invalid_argument>(run(o), {"no input files"});
        o = base;
        o.out_dir.clear();
        expect_error<std::invalid_argument>(run(o), {"no output directory", "--out DIR"});
        o = base;
        o.vocab = 256;
        expect_error<std::invalid_argument>(run(o), {"--vocab 256", "257", "<|endoftext|>"});
        o = base;
        o.shard_tokens = 0;
        expect_error<std::invalid_argument>(run(o), {"--shard-tokens 0", "not positive"});
        for (double f : {0.0, -0.1, 0.50001, 1.0, std::numeric_limits<double>::quiet_NaN()}) {
            o = base;
            o.val_fraction = f;
            expect_error<std::invalid_argument>(run(o), {"--val-fraction", "(0, 0.5]"});
        }
        o = base;
        o.text_field.clear();
        expect_error<std::invalid_argument>(run(o), {"--field is empty"});
        o = base;
        o.val_fraction = 0;  // as a user reads it: 0, not std::to_string's 0.000000
        expect_error<std::invalid_argument>(run(o), {"--val-fraction 0 is not in"});
    }
    SECTION("missing, directory or unreadable input files") {
        pv::PrepareOptions o = base;
        const std::string missing = dir.file("missing.txt");
        o.inputs = {dir.file("ok.txt"), missing};
        expect_error<std::runtime_error>(run(o), {missing, "cannot open", "No such file"});
        o.inputs = {dir.file("missing.jsonl")};
        expect_error<std::runtime_error>(run(o), {dir.file("missing.jsonl"), "cannot open"});
        fs::create_directories(dir.file("sub"));
        o.inputs = {dir.file("sub")};
        expect_error<std::runtime_error>(run(o), {dir.file("sub"), "is a directory"});
        if (::geteuid() != 0) {  // root reads everything
            write_bytes(dir.file("locked.txt"), "secret");
            ::chmod(dir.file("locked.txt").c_str(), 0);
            o.inputs = {dir.file("locked.txt")};
            expect_error<std::runtime_error>(run(o), {dir.file("locked.txt"), "cannot open", "ermission"});
        }
    }
    SECTION("bad JSON lines name the file and line") {
        pv::PrepareOptions o = base;
        const std::string f = dir.file("bad.jsonl");
        o.inputs = {f};
        auto lines = [&](const std::string& third) {
            write_bytes(f, "{\"text\": \"one\"}\n\n" + third + "\n{\"text\": \"four\"}\n");
        };
        lines("{\"text\": \"unterminated}");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "not JSON"});
        lines("{\"text\": \"bad \xff utf-8\"}");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "not JSON"});
        lines("[\"text\", \"an array\"]");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "array", "not an object"});
        lines("\"just a string\"");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "string", "not an object"});
        lines("{\"body\": \"no text field\"}");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "no field \"text\"", "text_field"});
        lines("{\"text\": 5}");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "\"text\" holds a JSON number", "not a string"});
        lines("{\"text\": null}");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "\"text\" holds a JSON null"});
        lines("{\"text\": [\"a\"]}");
        expect_error<std::runtime_error>(run(o), {f, "line 3", "\"text\" holds a JSON array"});
        o.text_field = "body";
        lines("{\"body\": \"has body\"}");
        expect_error<std::runtime_error>(run(o), {f, "line 1", "no field \"body\""});
    }
    SECTION("no documents") {
        pv::PrepareOptions o = base;
        write_bytes(dir.file("empty.txt"), "");
        write_bytes(dir.file("blank.jsonl"), "\n  \n\r\n{\"text\": \"\"}\n");
        o.inputs = {dir.file("empty.txt"), dir.file("blank.jsonl")};
        expect_error<std::runtime_error>(run(o), {"no documents"});
    }
    SECTION("too little data for both sets") {
        pv::PrepareOptions o = base;
        o.vocab = 257;
        write_bytes(dir.file("tiny.txt"), "a");  // 2 tokens: "a" EOT
        o.inputs = {dir.file("tiny.txt")};
        expect_error<std::runtime_error>(run(o),
                                         {"only 2 tokens", "1 documents", "1 validation", "raise --val-fraction"});
        write_bytes(dir.file("tiny.txt"), "ab");  // 3 tokens, half: 2 validation, 1 training
        o.val_fraction = 0.5;
        expect_error<std::runtime_error>(run(o), {"only 3 tokens", "1 training", "add data"});
        write_bytes(dir.file("tiny.txt"), "abc");  // 4 tokens: 2 and 2, the least that works
        const pv::PreparedData r = pv::prepare_data(o);
        CHECK(r.train_tokens == 2);
        CHECK(r.val_tokens == 2);
    }
    SECTION("tokenizers without an end-of-sequence token or unreadable") {
        pv::PrepareOptions o = base;
        const std::string no_eot = dir.file("no_eot.json");
        pv::Tokenizer::train("some text to train on", 260, {}).save(no_eot);
        o.tokenizer = no_eot;
        expect_error<std::runtime_error>(run(o), {no_eot, "no end-of-sequence token", "pass no tokenizer"});
        o.tokenizer = dir.file("absent.json");
        expect_error<std::runtime_error>(run(o), {dir.file("absent.json"), "cannot open"});
    }
    SECTION("an output directory that cannot be made") {
        pv::PrepareOptions o = base;
        write_bytes(dir.file("a_file"), "x");
        o.out_dir = dir.file("a_file");
        expect_error<std::runtime_error>(run(o), {dir.file("a_file"), "cannot create"});
        o.out_dir = dir.file("a_file/below");
        expect_error<std::runtime_error>(run(o), {dir.file("a_file/below"), "cannot create"});
    }
}

namespace prepare_test {

// A Llama 3 style tokenizer saved with a tokenizer_config.json holding the Llama 3 chat template
// (the template as the file's JSON decodes it).
inline std::string llama3_tokenizer(const TempDir& dir) {
    fs::create_directories(dir.path / "model");
    const std::string path = dir.file("model/tokenizer.json");
    pv::Tokenizer::train(
        "Hello there, how are you? Fine, thank you. Question: two plus two? Answer: four.", 330,
        {"<|endoftext|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
        .save(path);
    const std::string llama3_template =
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
        "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}";
    write_bytes(dir.file("model/tokenizer_config.json"),
                nlohmann::json{{"bos_token", "<|begin_of_text|>"}, {"chat_template", llama3_template}}.dump(2));
    return path;
}

inline std::string chat_line(const std::string& user, const std::string& answer) {
    return nlohmann::json{
               {"messages", {{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", answer}}}}}
               .dump() +
           "\n";
}

}  // namespace prepare_test

TEST_CASE("chats and prompts: rendered in the recognised format, flags and counts in the shards", "[prepare]") {
    TempDir dir("chats");
    const std::string tokenizer = llama3_tokenizer(dir);
    std::string jsonl;
    for (int i = 0; i < 12; ++i)
        jsonl += chat_line("Question " + std::to_string(i) + "?", "Answer " + std::to_string(i));
    jsonl += "{\"prompt\": \"two plus two?\", \"completion\": \" four\"}\n";
    jsonl += "{\"text\": \"Hello there, a plain text.\"}\n";
    write_bytes(dir.file("d.jsonl"), jsonl);

    pv::PrepareOptions o;
    o.inputs = {dir.file("d.jsonl")};
    o.tokenizer = tokenizer;
    o.out_dir = dir.file("out");
    o.val_fraction = 0.2;
    o.shard_tokens = 37;  // shards cut inside chats: documents continue in the next shard
    const pv::PreparedData r = pv::prepare_data(o);
    CHECK(r.documents == 14);
    CHECK(r.chat_documents == 12);
    CHECK(r.prompt_completion_documents == 1);
    CHECK(r.text_documents == 1);
    CHECK(r.chat_format == "chat_template of '" + dir.file("model/tokenizer_config.json") + "'");
    CHECK(read_bytes(dir.file("out/tokenizer_config.json")) == read_bytes(dir.file("model/tokenizer_config.json")));
    CHECK(read_bytes(r.tokenizer_path) == read_bytes(tokenizer));

    // The stream is the examples encoded in order (as data/examples.h encodes each, tested on its
    // own in test_chat), with their flags.
    const pv::Tokenizer tok = pv::Tokenizer::load(tokenizer);
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> flags;
    for (const pv::Example& e : pv::read_examples(dir.file("d.jsonl"), "text"))
        pv::encode_example(tok, e, pv::ExampleEncoding{pv::ChatFormat::llama3, false}, tokens, flags);
    CHECK(stream_of(r) == tokens);
    CHECK(flags_of(r) == flags);
    long long counted = 0;
    for (uint8_t f : flags) counted += (f & pv::kTokenCounted) != 0;
    CHECK(r.counted_tokens == counted);
    CHECK(counted < (long long)flags.size() / 2);  // prompts and headers do not count
    // The validation set starts at a document: the cut moved back to the start of a chat.
    const long long n = (long long)tokens.size();
    const pv::TokenShard val = pv::read_shard(r.val_shard);
    REQUIRE(!val.flags.empty());
    CHECK((val.flags[0] & pv::kTokenStartsDocument));
    CHECK(r.val_tokens >= (n + 4) / 5);
    CHECK(r.train_tokens + r.val_tokens == n);
    CHECK(r.train_shards.size() == size_t((r.train_tokens + 36) / 37));

    // --train-on-prompt: everything but each chat's and prompt's first token counts.
    o.train_on_prompt = true;
    const pv::PreparedData all = pv::prepare_data(o);
    CHECK(all.counted_tokens == n - 13);
    // --chat-format overrides the template: llama2 with this model's bos_token (its
    // tokenizer_config.json names one) needs the eos_token </s>, which this tokenizer lacks.
    o.chat_format = "llama2";
    expect_error<std::runtime_error>([&] { (void)pv::prepare_data(o); }, {"no special token \"</s>\"", "llama2"});
}

TEST_CASE("chats need a chat format; bad chats name their line before any tokenizer is trained", "[prepare]") {
    TempDir dir("chat_errors");
    write_bytes(dir.file("c.jsonl"), chat_line("hi", "hello") + chat_line("a", "b"));
    pv::PrepareOptions o;
    o.inputs = {dir.file("c.jsonl")};
    o.out_dir = dir.file("out");
    o.vocab = 300;
    auto run = [&] { (void)pv::prepare_data(o); };
    // A trained tokenizer has no template: --chat-format is needed, and the formats are named.
    expect_error<std::invalid_argument>(run, {"no tokenizer was given", "--chat-format", "llama3", "llama2"});
    // With one, the format's special tokens are trained in.
    o.chat_format = "llama2";
    const pv::PreparedData r = pv::prepare_data(o);
    CHECK(r.chat_format == "llama2");
    const pv::Tokenizer trained = pv::Tokenizer::load(r.tokenizer_path);
    CHECK(trained.encode("<s></s>", true).size() == 2);
    CHECK(!fs::exists(dir.file("out/tokenizer_config.json")));
    // A template outside the Jinja subset beside a given tokenizer: its file and line.
    const std::string tokenizer = llama3_tokenizer(dir);
    write_bytes(dir.file("model/tokenizer_config.json"),
                nlohmann::json{{"chat_template", "{% for m in messages %}\n{{ m.content | nosuch }}{% endfor %}"}}.dump());
    o.tokenizer = tokenizer;
    o.chat_format.clear();
    expect_error<std::runtime_error>(
        run, {"line 1", dir.file("model/tokenizer_config.json"), "line 2", "no filter named 'nosuch'"});
    // A chat the format refuses, and one without an answer: file and line.
    o.chat_format = "llama2";
    write_bytes(dir.file("c.jsonl"),
                chat_line("hi", "hello") +
                    "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}, {\"role\": \"user\", "
                    "\"content\": \"y\"}]}\n");
    o.tokenizer.clear();
    expect_error<std::runtime_error>(run, {dir.file("c.jsonl"), "line 2", "Conversation roles must alternate", "llama2"});
    write_bytes(dir.file("c.jsonl"),
                chat_line("hi", "hello") + "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}]}\n");
    expect_error<std::runtime_error>(run, {dir.file("c.jsonl"), "line 2", "no assistant message"});
    o.train_on_prompt = true;
    CHECK_NOTHROW(run());
    // The vocabulary must hold the format's special tokens too.
    o.vocab = 258;
    expect_error<std::invalid_argument>(run, {"vocab 258", "259", "3 special tokens"});
}

TEST_CASE("a rerun with a trained tokenizer removes the given one's tokenizer_config.json", "[prepare]") {
    TempDir dir("stale_config");
    const std::string tokenizer = llama3_tokenizer(dir);
    write_bytes(dir.file("t.txt"), letters(300, 3));
    pv::PrepareOptions o;
    o.inputs = {dir.file("t.txt")};
    o.out_dir = dir.file("out");
    o.tokenizer = tokenizer;
    (void)pv::prepare_data(o);
    CHECK(fs::exists(dir.file("out/tokenizer_config.json")));
    o.tokenizer.clear();
    o.vocab = 300;
    (void)pv::prepare_data(o);
    CHECK(!fs::exists(dir.file("out/tokenizer_config.json")));
}

TEST_CASE("--truncate cuts over-long chats, counting what it cut or left out; a trained tokenizer's EOS is the "
          "file's",
          "[prepare]") {
    TempDir dir("truncate");
    std::string long_answer, long_prompt;
    for (int i = 0; i < 40; ++i) long_answer += "answer" + std::to_string(i) + " ";
    for (int i = 0; i < 60; ++i) long_prompt += "prompt" + std::to_string(i * 7) + " ";
    write_bytes(dir.file("c.jsonl"), chat_line("hi", "hello") + chat_line("a question", long_answer) +
                                         chat_line(long_prompt, "ok") + chat_line("bye", "see you"));
    pv::PrepareOptions o;
    o.inputs = {dir.file("c.jsonl")};
    o.out_dir = dir.file("whole");
    o.vocab = 300;
    o.chat_format = "llama2";  // its </s> made the trained tokenizer's EOS differ from the file's
    const pv::PreparedData whole = pv::prepare_data(o);
    CHECK(whole.truncated_documents == 0);
    CHECK(whole.dropped_documents == 0);
    const std::vector<uint32_t> s0 = stream_of(whole);
    const std::vector<uint8_t> f0 = flags_of(whole);
    std::vector<size_t> starts;
    for (size_t i = 0; i < f0.size(); ++i)
        if (f0[i] & pv::kTokenStartsDocument) starts.push_back(i);
    starts.push_back(f0.size());
    REQUIRE(starts.size() == 5);
    // the short chats fit, the second's answer is cut, the third's prompt alone is longer
    const size_t n = std::max(starts[1] - starts[0], starts[4] - starts[3]) + 2;
    REQUIRE(starts[2] - starts[1] > n);
    REQUIRE(starts[3] - starts[2] > n);
    // `train --data` checks the shards' eot_token against the tokenizer it loads from the directory.
    CHECK(pv::read_shard(whole.val_shard).eot_token == uint32_t(pv::Tokenizer::load(whole.tokenizer_path).eos_id()));

    o.out_dir = dir.file("cut");
    o.truncate = (long long)n;
    const pv::PreparedData cut = pv::prepare_data(o);
    CHECK(cut.truncated_documents == 1);
    CHECK(cut.dropped_documents == 1);  // the long prompt leaves nothing counted in its first n tokens
    std::vector<uint32_t> want(s0.begin(), s0.begin() + long(starts[1] + n));
    std::vector<uint8_t> want_flags(f0.begin(), f0.begin() + long(starts[1] + n));
    want.insert(want.end(), s0.begin() + long(starts[3]), s0.end());
    want_flags.insert(want_flags.end(), f0.begin() + long(starts[3]), f0.end());
    CHECK(stream_of(cut) == want);
    CHECK(flags_of(cut) == want_flags);
    o.truncate = 1;
    expect_error<std::invalid_argument>([&] { (void)pv::prepare_data(o); }, {"truncate 1", "--seq-len"});
}

namespace prepare_test {

// POLEVAULT_SHARED, else ../shared relative to the current directory (as test_tokenizer finds it).
inline fs::path shared_file(const std::string& relative) {
    const char* env = std::getenv("POLEVAULT_SHARED");
    const fs::path path = (env && *env ? fs::path(env) : fs::current_path().parent_path() / "shared") / relative;
    INFO(path << " is needed by this test and is absent: run it from the repository root with ../shared beside "
                 "it, or set POLEVAULT_SHARED");
    REQUIRE(fs::exists(path));
    return path;
}

// Every output file of a prepare run, by name, as bytes.
inline std::map<std::string, std::string> output_files(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& entry : fs::directory_iterator(dir)) out[entry.path().filename().string()] = read_bytes(entry.path());
    return out;
}

TEST_CASE("plain text encoded in 4 KiB pieces on 1 or 3 threads gives the whole text's tokens, byte-identical "
          "shards and a buffer bounded by the piece size",
          "[prepare]") {
    TempDir dir("stream");
    // The first 256 KiB of tinyshakespeare (about 60 pieces of 4 KiB; the whole 1.1 MB proves no more
    // and took four times as long).
    const std::string text = read_bytes(shared_file("data/tinyshakespeare.txt").string()).substr(0, 256 << 10);
    REQUIRE(text.size() == 256 << 10);
    write_bytes(dir.file("shakespeare.txt"), text);
    // The Llama 3 pre-tokenizer (cut at line starts) and a SentencePiece-style one, the 32k Llama
    // 2-style file ("▁" in front of every text and for every space: cut at a space between two
    // words, which is dropped).
    const std::string llama3 = "test/data/tokenizers/llama3-small.json",
                      sp32k = shared_file("tokenizers/spbpe32k-tokenizer.json").string();
    for (const std::string& tokenizer : {llama3, sp32k}) {
        INFO(tokenizer);
        const pv::Tokenizer tok = pv::Tokenizer::load(tokenizer);
        std::vector<int> expected = tok.encode(text, false);
        expected.push_back(tok.eos_id());

        pv::PrepareOptions o;
        o.inputs = {dir.file("shakespeare.txt")};
        o.tokenizer = tokenizer;
        o.shard_tokens = (long long)expected.size() * 3 / 4;  // two training shards (each file costs two fsyncs)
        o.chunk_bytes = size_t(1) << 30;  // one piece: the whole text at once, as before streaming
        o.threads = 1;
        o.out_dir = dir.file("whole");
        const pv::PreparedData whole = pv::prepare_data(o);
        CHECK(whole.peak_buffered_bytes >= text.size());  // the measure sees a whole-text buffer
        CHECK(whole.train_shards.size() == 2);
        const std::vector<uint32_t> got = stream_of(whole);
        CHECK(std::equal(got.begin(), got.end(), expected.begin(), expected.end(),
                         [](uint32_t a, int b) { return a == uint32_t(b); }));
        const auto whole_files = output_files(o.out_dir);

        for (int threads : {1, 3}) {
            o.chunk_bytes = 4096;
            o.threads = threads;
            o.out_dir = dir.file("pieces" + std::to_string(threads));
            const pv::PreparedData pieces = pv::prepare_data(o);
            CHECK(output_files(o.out_dir) == whole_files);
            // Memory does not grow with the input: the text was cut into pieces. The round holds
            // 2 items per thread, each at most a piece plus one read block (4 KiB here) past it,
            // and the reader one more: far below the 256 KiB of input.
            CHECK(pieces.peak_buffered_bytes <= size_t(2 * threads + 1) * 2 * 4096);
            CHECK(pieces.peak_buffered_tokens <= size_t(2 * threads) * 2 * 4096);
        }
    }
}

TEST_CASE("plain text without a safe cut within the bound, a JSON line over it, and tokenizer training above its "
          "input limit are refused, naming the file and the fix",
          "[prepare]") {
    TempDir dir("bounds");
    const std::string llama3 = "test/data/tokenizers/llama3-small.json",
                      sp32k = shared_file("tokenizers/spbpe32k-tokenizer.json").string();
    pv::PrepareOptions o;
    o.tokenizer = llama3;
    o.chunk_bytes = 1024;
    o.max_uncut_bytes = 8192;
    o.threads = 1;
    o.out_dir = dir.file("out");
    auto run = [&] { (void)pv::prepare_data(o); };
    auto streams = [&](const std::string& file, const std::string& tokenizer) {
        INFO(file << " with " << tokenizer);
        o.inputs = {file};
        o.tokenizer = tokenizer;
        o.out_dir = dir.file("streamed");
        const pv::PreparedData r = pv::prepare_data(o);
        CHECK(r.peak_buffered_bytes < 8192);  // cut into pieces
        const pv::Tokenizer tok = pv::Tokenizer::load(tokenizer);
        std::vector<int> expected = tok.encode(read_bytes(file), false);
        expected.push_back(tok.eos_id());
        CHECK(as_ids(stream_of(r)) == expected);
    };
    auto refused = [&](const std::string& file, const std::string& tokenizer) {
        INFO(file << " with " << tokenizer);
        o.inputs = {file};
        o.tokenizer = tokenizer;
        o.out_dir = dir.file("refused");
        expect_error<std::runtime_error>(run, {"input '" + file + "'", "no place to cut the text in the 8192 bytes",
                                               "after byte 0", "break the text into lines"});
        CHECK(!fs::exists(o.out_dir));  // nothing left behind
    };

    // 20 KB with neither a line break nor a space: no candidate cut at all, whatever the tokenizer.
    write_bytes(dir.file("one_word.txt"), letters(20000, 4));
    refused(dir.file("one_word.txt"), llama3);
    refused(dir.file("one_word.txt"), sp32k);
    // Words on lines of their own: Llama 3 cuts at the line starts; the SentencePiece tokenizer
    // never can (the piece after the cut would start with a "▁" the text does not have there), and
    // there is no space to cut at instead.
    std::string lines;
    for (int i = 0; lines.size() < 20000; ++i) lines += letters(5 + i % 7, uint64_t(i)) + "\n";
    write_bytes(dir.file("lines.txt"), lines);
    streams(dir.file("lines.txt"), llama3);
    refused(dir.file("lines.txt"), sp32k);
    // The same words on one line, a space between two: both tokenizers cut at a space (Llama 3
    // keeping it at the start of the next piece, SentencePiece dropping it for its "▁").
    std::string words = lines;
    std::replace(words.begin(), words.end(), '\n', ' ');
    write_bytes(dir.file("words.txt"), words);
    streams(dir.file("words.txt"), llama3);
    streams(dir.file("words.txt"), sp32k);
    // Words two spaces apart: only a single space between two words is a candidate (beside another
    // space the "▁" could merge: "▁▁" is a token), and there is none.
    std::string spaced;
    for (char c : words) spaced += c == ' ' ? std::string("  ") : std::string(1, c);
    write_bytes(dir.file("spaced.txt"), spaced);
    refused(dir.file("spaced.txt"), sp32k);

    // JSON lines: whole examples only; one longer than the bound (line 3) is refused by number,
    // one just within it (line 2) is not.
    const std::string within = nlohmann::json{{"text", letters(8000, 5)}}.dump() + "\n";
    REQUIRE(within.size() <= 8192);
    write_bytes(dir.file("long.jsonl"),
                "{\"text\": \"short\"}\n" + within + nlohmann::json{{"text", letters(9000, 6)}}.dump() + "\n");
    o.inputs = {dir.file("long.jsonl")};
    o.tokenizer = llama3;
    o.out_dir = dir.file("jsonl");
    expect_error<std::runtime_error>(run, {"input '" + dir.file("long.jsonl") + "' line 3",
                                           "longer than 8192 bytes", "split the example"});
    write_bytes(dir.file("long.jsonl"), "{\"text\": \"short\"}\n" + within);
    CHECK_NOTHROW(run());

    // Training a tokenizer holds all of its input: above the limit it is refused before anything
    // is read or written, at the limit it trains.
    o.tokenizer.clear();
    o.vocab = 300;
    o.max_training_bytes = 20000;
    o.out_dir = dir.file("trained");
    write_bytes(dir.file("train.txt"), words.substr(0, 20000));
    o.inputs = {dir.file("train.txt")};
    CHECK_NOTHROW(run());
    write_bytes(dir.file("train.txt"), words.substr(0, 20001));
    fs::remove_all(o.out_dir);
    expect_error<std::invalid_argument>(run, {"the inputs hold 20001 bytes", "more than the 20000 bytes",
                                              "--tokenizer TOK/tokenizer.json"});
    CHECK(!fs::exists(o.out_dir));
}

TEST_CASE("JSON lines in small batches on 1 or 4 threads give the same shards as in one batch", "[prepare]") {
    TempDir dir("stream_jsonl");
    std::mt19937_64 rng(11);
    std::string lines;
    for (int i = 0; i < 300; ++i) {
        nlohmann::json j;
        if (i % 3 == 0)
            j = {{"prompt", random_text(rng, 5, false)}, {"completion", random_text(rng, 8, false)}};
        else
            j = {{"text", random_text(rng, 20, false)}};
        lines += j.dump() + "\n";
        if (i % 50 == 0) lines += "\n";  // blank lines keep their numbers
    }
    write_bytes(dir.file("d.jsonl"), lines);
    pv::PrepareOptions o;
    o.inputs = {dir.file("d.jsonl")};
    o.vocab = 400;
    o.shard_tokens = 4000;  // two training shards (of 7.7k tokens): each file costs two fsyncs
    o.val_fraction = 0.2;
    o.truncate = 12;
    o.chunk_bytes = size_t(1) << 30;
    o.threads = 1;
    o.out_dir = dir.file("whole");
    const pv::PreparedData whole = pv::prepare_data(o);
    CHECK(whole.train_shards.size() == 2);
    o.tokenizer = whole.tokenizer_path;  // trained once: the batches are what is under test
    for (int threads : {1, 4}) {
        o.chunk_bytes = 200;
        o.threads = threads;
        o.out_dir = dir.file("batches" + std::to_string(threads));
        const pv::PreparedData r = pv::prepare_data(o);
        CHECK(output_files(o.out_dir) == output_files(dir.file("whole")));
        CHECK(r.documents == whole.documents);
        CHECK(r.truncated_documents == whole.truncated_documents);
        CHECK(r.dropped_documents == whole.dropped_documents);
        CHECK(r.counted_tokens == whole.counted_tokens);
    }
    // An error is the first bad line, whatever the threads and batches.
    write_bytes(dir.file("bad.jsonl"), lines + "{\"text\": 1}\n" + lines + "not json\n");
    o.inputs = {dir.file("bad.jsonl")};
    o.out_dir = dir.file("bad_out");
    expect_error<std::runtime_error>([&] { (void)pv::prepare_data(o); }, {"line 307"});
    CHECK(!fs::exists(o.out_dir));  // a failed run leaves no output directory behind
}

}  // namespace prepare_test
