// Agreement with Hugging Face `tokenizers`: the ids and texts that test/interop/
// make_tokenizer_golden.py recorded with the Python package (test/data/tokenizers/golden.jsonl),
// for Llama 3's byte-level BPE and a 32k SentencePiece-style BPE with byte fallback (read from
// ../shared/tokenizers, or $POLEVAULT_SHARED/tokenizers), and for variants of small tokenizers cut
// from them that exercise the components those two files do not use (Metaspace, unk tokens,
// Split behaviours, Digits, GPT-2's ByteLevel regex, added-token flags, a template with BOS and
// EOS, other decoders). Every recorded encode and decode must be equal: 100%, no tolerance.
// Also here: TokenStreamDecoder gives decode()'s text piece by piece on the same ids.
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "test/temp_dir.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace tokenizer_golden_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fixture_dir() { return fs::path(__FILE__).parent_path() / "data" / "tokenizers"; }

// $POLEVAULT_SHARED, else ../shared relative to the current directory (the repository root when
// `make test` runs). Its absence fails the test: these checks are not optional.
fs::path shared_dir() {
    if (const char* env = std::getenv("POLEVAULT_SHARED"); env && *env) return env;
    return fs::current_path().parent_path() / "shared";
}

std::string read_file(const fs::path& path) {
    std::ifstream f(path, std::ios::binary);
    INFO("reading " << path);
    REQUIRE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// FNV-1a, 64 bits, as the generator writes it (16 hex digits).
std::string fnv(std::string_view s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
    return buf;
}

std::string joined(const std::vector<int>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    return s;
}

std::string hex(std::string_view s) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) out += digits[c >> 4], out += digits[c & 15];
    return out;
}

// A text for messages: JSON-escaped, cut to 160 bytes.
std::string shown(std::string_view s) {
    std::string cut(s.substr(0, 160));
    return json(pv::utf8_lossy(cut)).dump() + (s.size() > 160 ? "..." : "");
}

struct Golden {
    json header;
    std::vector<json> cases, decodes, per_ids;
};

const Golden& golden() {
    static const Golden g = [] {
        Golden out;
        std::istringstream in(read_file(fixture_dir() / "golden.jsonl"));
        std::string line;
        while (std::getline(in, line)) {
            json j = json::parse(line);
            if (j.contains("header")) out.header = j["header"];
            if (j.contains("case")) out.cases.push_back(j["case"]);
            if (j.contains("decode")) out.decodes.push_back(j["decode"]);
            if (j.contains("per_id")) out.per_ids.push_back(j["per_id"]);
        }
        return out;
    }();
    return g;
}

// A file from ../shared that the fixture was made from, checked to be that very file.
std::string shared_file(const fs::path& relative, const std::string& expected_fnv) {
    const fs::path path = shared_dir() / relative;
    INFO(path << " is needed by the tokenizer tests and is absent: run them from the repository root with "
                 "../shared beside it, or set POLEVAULT_SHARED");
    REQUIRE(fs::exists(path));
    std::string bytes = read_file(path);
    INFO(path << " is not the file test/data/tokenizers/golden.jsonl was made from: regenerate the fixture with "
                 "test/interop/make_tokenizer_golden.py");
    REQUIRE(fnv(bytes) == expected_fnv);
    return bytes;
}

const std::string& shakespeare() {
    static const std::string text =
        shared_file("data/tinyshakespeare.txt", golden().header["shakespeare_fnv"].get<std::string>());
    return text;
}

// The tokenizer a record names: one of the two shared files, or a variant of a small base
// (its top-level and model keys replaced, added tokens appended, as the generator did).
const pv::Tokenizer& tokenizer(const std::string& name) {
    static std::map<std::string, pv::Tokenizer> cache;
    static pv::test::TempDir dir("tokenizer_golden");
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    const json& header = golden().header;
    std::string path;
    if (name == "llama3" || name == "spbpe32k") {
        const fs::path rel = fs::path("tokenizers") / (name + "-tokenizer.json");
        shared_file(rel, header["fnv"][name].get<std::string>());
        path = (shared_dir() / rel).string();
    } else {
        INFO("variant " << name);
        REQUIRE(header["variants"].contains(name));
        const json& spec = header["variants"][name];
        const std::string base_name = spec["base"].get<std::string>();
        const std::string base = read_file(fixture_dir() / base_name);
        REQUIRE(fnv(base) == header["base_fnv"][base_name].get<std::string>());
        json j = json::parse(base);
        const json set = spec.value("set", json::object()), model_set = spec.value("model_set", json::object()),
                   added = spec.value("added", json::array());
        for (const auto& [k, v] : set.items()) j[k] = v;
        for (const auto& [k, v] : model_set.items()) j["model"][k] = v;
        for (const json& t : added) j["added_tokens"].push_back(t);
        path = dir.file(name + ".json");
        std::ofstream(path, std::ios::binary) << j.dump();
    }
    return cache.emplace(name, pv::Tokenizer::load(path)).first->second;
}

std::string case_text(const json& c) {
    if (c.contains("text")) return c["text"].get<std::string>();
    if (c.contains("mixed")) return golden().header["mixed_texts"][c["mixed"].get<size_t>()].get<std::string>();
    const std::vector<size_t> at = c["shakespeare"].get<std::vector<size_t>>();
    return shakespeare().substr(at[0], at[1]);
}

// Checks our decoded text against HF's: a string, or for long texts {"fnv", "lossy"}. Where HF's
// text holds U+FFFD, a ByteLevel decoder met invalid UTF-8, which polevault keeps as bytes
// (data/tokenizer.h): then HF's text is our text's lossy conversion; elsewhere the two are equal.
void check_text(const std::string& ours, const json& hf) {
    if (hf.is_string()) {
        const std::string& s = hf.get_ref<const std::string&>();
        CHECK((s.find("\xEF\xBF\xBD") != std::string::npos ? pv::utf8_lossy(ours) : ours) == s);
    } else {
        CHECK(fnv(hf["lossy"].get<bool>() ? pv::utf8_lossy(ours) : ours) == hf["fnv"].get<std::string>());
    }
}

void check_case(const json& c) {
    const pv::Tokenizer& tok = tokenizer(c["tok"].get<std::string>());
    if (c.contains("shakespeare_lines")) {  // every line alone, -1 after each
        std::vector<int> all;
        size_t start = 0;
        const std::string& s = shakespeare();
        while (start <= s.size()) {
            const size_t nl = std::min(s.find('\n', start), s.size());
            for (int id : tok.encode(std::string_view(s).substr(start, nl - start))) all.push_back(id);
            all.push_back(-1);
            start = nl + 1;
        }
        CHECK(all.size() == c["n"].get<size_t>());
        CHECK(fnv(joined(all)) == c["ids_fnv"].get<std::string>());
        return;
    }
    const std::string text = case_text(c);
    INFO("tokenizer " << c["tok"] << ", text " << shown(text));
    // Expected ids are a list, or for long texts {"fnv": hash of the list}.
    auto check_ids = [](const std::vector<int>& ours, const json& expected) {
        if (expected.is_array())
            CHECK(ours == expected.get<std::vector<int>>());
        else
            CHECK(fnv(joined(ours)) == expected["fnv"].get<std::string>());
    };
    const json expected = c.contains("ids") ? c["ids"] : json{{"fnv", c["ids_fnv"]}};
    const std::vector<int> ids = tok.encode(text);
    check_ids(ids, expected);
    if (c.contains("n")) CHECK(ids.size() == c["n"].get<size_t>());
    const json decoded = c.value("decoded", json(text));
    check_text(tok.decode(ids), decoded);
    check_text(tok.decode(ids, true), c.value("decoded_skip", decoded));
    const std::vector<int> plain = tok.encode(text, false);
    check_ids(plain, c.value("ids_plain", expected));
    if (c.contains("ids_plain")) check_text(tok.decode(plain), c.value("decoded_plain", json(text)));
    if (c.contains("ids_added")) {
        CHECK(tok.encode(text, true, true) == c["ids_added"].get<std::vector<int>>());
        CHECK(tok.encode(text, false, true) == c["ids_plain_added"].get<std::vector<int>>());
    }
}

// Whether a case encodes the whole of tinyshakespeare (as one text or line by line).
bool whole_text(const json& c) {
    return c.contains("shakespeare_lines") ||
           (c.contains("shakespeare") && c["shakespeare"][1].get<size_t>() == shakespeare().size());
}

void check_cases(bool shared_files, bool whole) {
    int n = 0;
    for (const json& c : golden().cases) {
        const std::string name = c["tok"].get<std::string>();
        if ((name == "llama3" || name == "spbpe32k") != shared_files || whole_text(c) != whole) continue;
        check_case(c);
        ++n;
    }
    // The fixture holds what it should (a truncated file would pass with nothing checked).
    CHECK(n >= (whole ? 4 : shared_files ? 400 : 1000));
}

// Pushes ids one by one through a stream decoder; checks what comes out against decode.
void check_stream(const pv::Tokenizer& tok, const std::vector<int>& context, const std::vector<int>& ids) {
    pv::TokenStreamDecoder stream(tok, context);
    std::string out;
    std::vector<std::string> chunks;
    for (int id : ids) chunks.push_back(stream.push(id));
    chunks.push_back(stream.finish());
    for (const std::string& c : chunks) out += c;
    std::vector<int> all = context;
    all.insert(all.end(), ids.begin(), ids.end());
    const std::string whole = tok.decode(all), before = tok.decode(context);
    INFO("context " << joined(context) << ", ids " << joined(ids));
    REQUIRE(whole.compare(0, before.size(), before) == 0);
    CHECK(out == whole.substr(before.size()));
    // Text that is valid UTF-8 as a whole is valid in every piece: nothing cuts a character (unless
    // the context itself ends inside one).
    if (pv::utf8_valid(whole) && pv::utf8_valid(before))
        for (const std::string& c : chunks) CHECK(pv::utf8_valid(c));
}

}  // namespace tokenizer_golden_test

using namespace tokenizer_golden_test;

TEST_CASE("golden: Llama 3 and the SentencePiece-style file encode and decode as Hugging Face", "[tokenizer]") {
    check_cases(true, false);
}

// The same code as the slices above on 2 x 2.2 MB of text: left out of the ASan build ([heavy]).
TEST_CASE("golden: all of tinyshakespeare, whole and line by line, with both files", "[tokenizer][heavy]") {
    check_cases(true, true);
}

TEST_CASE("golden: variants of every supported component encode and decode as Hugging Face", "[tokenizer]") {
    check_cases(false, false);
}

TEST_CASE("golden: decoding byte tokens that form invalid UTF-8", "[tokenizer]") {
    int byte_level = 0;
    for (const json& d : golden().decodes) {
        const pv::Tokenizer& tok = tokenizer(d["tok"].get<std::string>());
        const std::vector<int> ids = d["ids"].get<std::vector<int>>();
        INFO("tokenizer " << d["tok"] << ", ids " << joined(ids));
        const std::string ours = tok.decode(ids);
        if (d.contains("bytes_hex")) {
            // polevault keeps the bytes; HF's text is their lossy conversion.
            CHECK(hex(ours) == d["bytes_hex"].get<std::string>());
            CHECK(pv::utf8_lossy(ours) == d["decoded"].get<std::string>());
            ++byte_level;
        } else {
            CHECK(ours == d["decoded"].get<std::string>());
        }
    }
    CHECK(golden().decodes.size() >= 200);
    CHECK(byte_level >= 80);
}

TEST_CASE("golden: every id of both files decodes as Hugging Face", "[tokenizer]") {
    REQUIRE(golden().per_ids.size() == 2);
    for (const json& p : golden().per_ids) {
        const pv::Tokenizer& tok = tokenizer(p["tok"].get<std::string>());
        INFO("tokenizer " << p["tok"]);
        REQUIRE(tok.vocab_size() == p["n"].get<int>());
        std::string texts, bytes;
        for (int id = 0; id < tok.vocab_size(); ++id) {
            const std::string s = tok.decode({id});
            texts += (id ? std::string(1, '\0') : "") + pv::utf8_lossy(s);
            bytes += (id ? std::string(1, '\0') : "") + s;
        }
        CHECK(fnv(texts) == p["fnv"].get<std::string>());
        if (p.contains("bytes_fnv")) CHECK(fnv(bytes) == p["bytes_fnv"].get<std::string>());
    }
}

TEST_CASE("stream decoding gives decode's text without cutting a character", "[tokenizer]") {
    int streams = 0;
    for (const json& c : golden().cases) {
        if (!c.contains("ids") || c["ids"].empty()) continue;
        const pv::Tokenizer& tok = tokenizer(c["tok"].get<std::string>());
        const std::vector<int> ids = c["ids"].get<std::vector<int>>();
        check_stream(tok, {}, ids);
        // With the first few ids as context (a prompt), the rest streams as its continuation; the
        // context must decode to the start of the whole text (not end inside a byte-fallback run).
        size_t k = std::min<size_t>(3, ids.size() / 2);
        const std::string whole = tok.decode(ids);
        while (k > 0 && whole.rfind(tok.decode({ids.begin(), ids.begin() + long(k)}), 0) != 0) --k;
        check_stream(tok, std::vector<int>(ids.begin(), ids.begin() + long(k)), {ids.begin() + long(k), ids.end()});
        ++streams;
    }
    // Made-up byte sequences: incomplete characters are held back, then flushed by finish().
    // (Byte-fallback runs that turn invalid change text already streamed: see data/tokenizer.h.)
    for (const json& d : golden().decodes)
        if (d.contains("bytes_hex") || d["decoded"].get<std::string>().find("\xEF\xBF\xBD") == std::string::npos)
            check_stream(tokenizer(d["tok"].get<std::string>()), {}, d["ids"].get<std::vector<int>>());
    CHECK(streams > 1000);
}
