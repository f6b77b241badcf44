// Byte-level BPE tokenizer: see data/tokenizer.h for the algorithm and the file format.
#include "data/tokenizer.h"

#include "io/durable_file.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace pv {

namespace {

// The Llama 3 / GPT-4 pre-split pattern (Llama 3's tokenizer.json, pre_tokenizer Split regex).
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex=true splits by.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// GPT-2's byte-to-unicode table: the 188 printable bytes map to the code point of the same value,
// the others, in byte order, to U+0100, U+0101, ... so every byte is a visible character.
struct ByteTable {
    std::array<std::string, 256> to_utf8;           // byte -> its character, UTF-8 encoded
    std::unordered_map<uint32_t, uint8_t> from_cp;  // code point -> byte
    ByteTable() {
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
            std::string s;
            if (cp < 0x80) {
                s += char(cp);
            } else {  // cp < 0x800 for all of them
                s += char(0xC0 | (cp >> 6));
                s += char(0x80 | (cp & 0x3F));
            }
            to_utf8[b] = s;
            from_cp[cp] = uint8_t(b);
        }
    }
};

const ByteTable& byte_table() {
    static const ByteTable table;
    return table;
}

std::string bytes_to_unicode(std::string_view bytes) {
    const ByteTable& t = byte_table();
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char c : bytes) out += t.to_utf8[c];
    return out;
}

// Inverse of bytes_to_unicode; false when s holds a character outside the table (or bad UTF-8).
bool unicode_to_bytes(std::string_view s, std::string& out) {
    const ByteTable& t = byte_table();
    out.clear();
    for (size_t i = 0; i < s.size();) {
        unsigned char c = s[i];
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size() && (s[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t(c & 0x1F) << 6) | (s[i + 1] & 0x3F);
            i += 2;
        } else {
            return false;  // every table character is 1 or 2 bytes of UTF-8
        }
        auto it = t.from_cp.find(cp);
        if (it == t.from_cp.end()) return false;
        out += char(it->second);
    }
    return true;
}

uint64_t pair_key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct PcreCodeDeleter {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// Compiles a pre-split pattern; on failure returns null and sets err.
std::unique_ptr<pcre2_code, PcreCodeDeleter> compile_pattern(const std::string& pattern, std::string& err) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &offset, nullptr);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        err = "regex does not compile at offset " + std::to_string(offset) + ": " + reinterpret_cast<const char*>(msg);
        return nullptr;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // a speed-up only: the interpreter works without it
    return std::unique_ptr<pcre2_code, PcreCodeDeleter>(re);
}

}  // namespace

struct Tokenizer::Impl {
    std::string pattern;
    std::unique_ptr<pcre2_code, PcreCodeDeleter> regex;
    std::vector<std::string> id_bytes;           // id -> bytes it decodes to (specials: their text)
    std::vector<char> id_valid;                  // false for holes in a loaded vocabulary
    std::unordered_map<std::string, int> vocab;  // bytes -> id, the BPE model's tokens only
    std::array<int, 256> byte_id{};              // byte value -> its base token
    struct Merge {
        int rank, result;
    };
    std::unordered_map<uint64_t, Merge> merges;   // (left id, right id) -> rank, merged id
    std::vector<std::pair<int, int>> merge_list;  // by rank
    struct Special {
        std::string text;
        int id;
        bool special;
    };
    std::vector<Special> specials;
    bool ignore_merges = false;

    void set_pattern(const std::string& p) {
        std::string err;
        regex = compile_pattern(p, err);
        if (!regex) throw std::invalid_argument("tokenizer pattern: " + err);
        pattern = p;
    }

    void add_id(int id, const std::string& bytes) {
        if (id >= int(id_bytes.size())) {
            id_bytes.resize(id + 1);
            id_valid.resize(id + 1, 0);
        }
        id_bytes[id] = bytes;
        id_valid[id] = 1;
    }

    // Calls f(piece) for each pre-split piece of text, covering every byte exactly once, in order.
    template <class F>
    void split(std::string_view text, F&& f) const {
        if (text.empty()) return;
        std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
            pcre2_match_data_create_from_pattern(regex.get(), nullptr));
        auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        size_t pos = 0;  // everything before pos has been emitted
        size_t start = 0;
        while (start < text.size()) {
            int rc = pcre2_match(regex.get(), subject, text.size(), start, 0, md.get(), nullptr);
            if (rc < 0) break;  // no further match (any other error leaves the rest as one piece)
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
            size_t s = ov[0], e = ov[1];
            if (s > pos) f(text.substr(pos, s - pos));  // bytes the regex cannot match (invalid UTF-8)
            if (e > s) {
                f(text.substr(s, e - s));
                pos = e;
                start = e;
            } else {
                pos = s;  // an empty match: step over one byte, emitted with the next gap
                start = s + 1;
            }
        }
        if (pos < text.size()) f(text.substr(pos));
    }

    // Appends the ids of one pre-split piece: merges applied lowest rank first, leftmost on ties,
    // over a linked list of symbols with a heap of candidate pairs (O(n log n) for long pieces).
    void encode_piece(std::string_view piece, std::vector<int>& out) const {
        if (piece.size() == 1) {
            out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
            return;
        }
        if (ignore_merges) {
            auto it = vocab.find(std::string(piece));
            if (it != vocab.end()) {
                out.push_back(it->second);
                return;
            }
        }
        const int n = int(piece.size());
        std::vector<int> id(n), prev(n), next(n);
        for (int i = 0; i < n; ++i) {
            id[i] = byte_id[static_cast<unsigned char>(piece[i])];
            prev[i] = i - 1;
            next[i] = i + 1 < n ? i + 1 : -1;
        }
        struct Cand {
            int rank, left, a, b;
            bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
        };
        std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
        auto consider = [&](int left) {
            if (left < 0 || next[left] < 0) return;
            auto it = merges.find(pair_key(id[left], id[next[left]]));
            if (it != merges.end()) heap.push({it->second.rank, left, id[left], id[next[left]]});
        };
        for (int i = 0; i + 1 < n; ++i) consider(i);
        while (!heap.empty()) {
            Cand c = heap.top();
            heap.pop();
            int r = next[c.left];
            // Stale when the left symbol was absorbed, or either side has changed since the push.
            if (id[c.left] != c.a || r < 0 || id[r] != c.b) continue;
            id[c.left] = merges.at(pair_key(c.a, c.b)).result;
            id[r] = -1;
            next[c.left] = next[r];
            if (next[r] >= 0) prev[next[r]] = c.left;
            consider(prev[c.left]);
            consider(c.left);
        }
        for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
    }
};

namespace {

// Byte-level BPE training over unique pieces; see the header comment.
struct Trainer {
    std::vector<std::vector<int>> words;
    std::vector<int64_t> counts;
    std::unordered_map<uint64_t, int64_t> pair_count;
    std::unordered_map<uint64_t, std::vector<int>> where;  // pair -> words holding it (may repeat)
    struct Entry {
        int64_t count;
        uint64_t key;
        // Max-heap order: larger count first, then the smaller (left, right) pair.
        bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
    };
    std::priority_queue<Entry> heap;

    void init() {
        for (int w = 0; w < int(words.size()); ++w) {
            const auto& s = words[w];
            for (size_t i = 0; i + 1 < s.size(); ++i) {
                uint64_t k = pair_key(s[i], s[i + 1]);
                pair_count[k] += counts[w];
                auto& v = where[k];
                if (v.empty() || v.back() != w) v.push_back(w);
            }
        }
        for (const auto& [k, c] : pair_count) heap.push({c, k});
    }

    // The best pair, or false when none is left.
    bool best(uint64_t& key) {
        while (!heap.empty()) {
            Entry e = heap.top();
            heap.pop();
            auto it = pair_count.find(e.key);
            if (it != pair_count.end() && it->second == e.count && e.count > 0) {
                key = e.key;
                return true;
            }
        }
        return false;
    }

    // Replaces every (a, b) by merged (left to right, non-overlapping) and updates the counts.
    void merge(uint64_t key, int merged) {
        const int a = int(key >> 32), b = int(key & 0xffffffffu);
        std::vector<int> ws = std::move(where[key]);
        where.erase(key);
        std::sort(ws.begin(), ws.end());
        ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
        std::unordered_map<uint64_t, int64_t> delta;
        std::vector<int> out;
        for (int w : ws) {
            auto& s = words[w];
            const int64_t c = counts[w];
            bool found = false;
            for (size_t i = 0; i + 1 < s.size(); ++i)
                if (s[i] == a && s[i + 1] == b) found = true;
            if (!found) continue;  // a stale index entry
            for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= c;
            out.clear();
            for (size_t i = 0; i < s.size();) {
                if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
                    out.push_back(merged);
                    i += 2;
                } else {
                    out.push_back(s[i++]);
                }
            }
            s.swap(out);
            for (size_t i = 0; i + 1 < s.size(); ++i) {
                uint64_t k = pair_key(s[i], s[i + 1]);
                delta[k] += c;
                if (s[i] == merged || s[i + 1] == merged) {
                    auto& v = where[k];
                    if (v.empty() || v.back() != w) v.push_back(w);
                }
            }
        }
        for (const auto& [k, d] : delta) {
            if (d == 0) continue;
            int64_t& pc = pair_count[k];
            pc += d;
            if (pc > 0)
                heap.push({pc, k});
            else
                pair_count.erase(k);
        }
    }
};

// Splits text at occurrences of the special tokens: calls on_text(segment) for plain text and
// on_special(index) for each special, earliest first and longest at the same position.
template <class FT, class FS>
void split_specials(std::string_view text, const std::vector<Tokenizer::Impl::Special>& specials, FT&& on_text,
                    FS&& on_special) {
    const size_t k = specials.size();
    std::vector<size_t> next(k);
    for (size_t i = 0; i < k; ++i) next[i] = text.find(specials[i].text);
    size_t pos = 0;
    while (true) {
        size_t best = std::string_view::npos, which = 0;
        for (size_t i = 0; i < k; ++i) {
            if (next[i] != std::string_view::npos && next[i] < pos) next[i] = text.find(specials[i].text, pos);
            if (next[i] == std::string_view::npos) continue;
            if (next[i] < best || (next[i] == best && specials[i].text.size() > specials[which].text.size())) {
                best = next[i];
                which = i;
            }
        }
        if (best == std::string_view::npos) break;
        if (best > pos) on_text(text.substr(pos, best - pos));
        on_special(which);
        pos = best + specials[which].text.size();
    }
    if (pos < text.size()) on_text(text.substr(pos));
}

}  // namespace

Tokenizer Tokenizer::train(std::string_view text, int vocab_size, std::vector<std::string> special_tokens) {
    for (size_t i = 0; i < special_tokens.size(); ++i) {
        if (special_tokens[i].empty()) throw std::invalid_argument("Tokenizer::train: empty special token");
        for (size_t j = 0; j < i; ++j)
            if (special_tokens[i] == special_tokens[j])
                throw std::invalid_argument("Tokenizer::train: special token '" + special_tokens[i] + "' repeated");
    }
    if (vocab_size < 256 + int(special_tokens.size()))
        throw std::invalid_argument("Tokenizer::train: vocab_size " + std::to_string(vocab_size) + " is below 256 + " +
                                    std::to_string(special_tokens.size()) + " special tokens");
    auto impl = std::make_shared<Impl>();
    impl->set_pattern(kLlama3Pattern);
    for (int b = 0; b < 256; ++b) {
        std::string s(1, char(b));
        impl->add_id(b, s);
        impl->vocab[s] = b;
        impl->byte_id[b] = b;
    }
    std::vector<Impl::Special> specials;
    for (const auto& s : special_tokens) specials.push_back({s, -1, true});

    // Unique pieces with counts, sorted so the word list does not depend on hash order.
    std::unordered_map<std::string_view, int64_t> piece_count;
    split_specials(
        text, specials, [&](std::string_view seg) { impl->split(seg, [&](std::string_view p) { ++piece_count[p]; }); },
        [](size_t) {});
    std::vector<std::pair<std::string_view, int64_t>> pieces(piece_count.begin(), piece_count.end());
    std::sort(pieces.begin(), pieces.end());
    Trainer t;
    for (const auto& [p, c] : pieces) {
        if (p.size() < 2) continue;  // nothing to merge
        std::vector<int> s(p.size());
        for (size_t i = 0; i < p.size(); ++i) s[i] = static_cast<unsigned char>(p[i]);
        t.words.push_back(std::move(s));
        t.counts.push_back(c);
    }
    t.init();

    const int target = vocab_size - int(special_tokens.size());
    int next_id = 256;
    uint64_t key;
    while (next_id < target && t.best(key)) {
        const int a = int(key >> 32), b = int(key & 0xffffffffu);
        std::string bytes = impl->id_bytes[a] + impl->id_bytes[b];
        // Two merges may spell the same bytes (e.g. (ab, c) and (a, bc)): they share the token.
        auto [it, fresh] = impl->vocab.try_emplace(bytes, next_id);
        if (fresh) impl->add_id(next_id++, bytes);
        impl->merges[key] = {int(impl->merge_list.size()), it->second};
        impl->merge_list.push_back({a, b});
        t.merge(key, it->second);
    }
    for (auto& s : specials) {
        s.id = next_id++;
        impl->add_id(s.id, s.text);
    }
    impl->specials = std::move(specials);
    return Tokenizer(std::move(impl));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool allow_special) const {
    std::vector<int> out;
    out.reserve(text.size() / 3 + 1);
    auto plain = [&](std::string_view seg) {
        impl_->split(seg, [&](std::string_view p) { impl_->encode_piece(p, out); });
    };
    if (allow_special && !impl_->specials.empty())
        split_specials(text, impl_->specials, plain, [&](size_t i) { out.push_back(impl_->specials[i].id); });
    else
        plain(text);
    return out;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) {
        if (id < 0 || id >= int(impl_->id_bytes.size()) || !impl_->id_valid[id])
            throw std::out_of_range("Tokenizer::decode: " + std::to_string(id) + " is not a token id (vocab_size " +
                                    std::to_string(vocab_size()) + ")");
        out += impl_->id_bytes[id];
    }
    return out;
}

int Tokenizer::vocab_size() const { return int(impl_->id_bytes.size()); }

int Tokenizer::token_id(std::string_view token_text) const {
    for (const auto& s : impl_->specials)
        if (s.text == token_text) return s.id;
    auto it = impl_->vocab.find(std::string(token_text));
    return it == impl_->vocab.end() ? -1 : it->second;
}

int Tokenizer::eot_id() const {
    for (const auto& s : impl_->specials)
        if (s.text == "<|endoftext|>") return s.id;
    return -1;
}

void Tokenizer::save(const std::string& path) const {
    using ojson = nlohmann::ordered_json;
    const Impl& m = *impl_;
    ojson added = ojson::array();
    for (const auto& s : m.specials)
        added.push_back({{"id", s.id},
                         {"content", s.text},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", s.special}});
    ojson vocab = ojson::object();
    for (int id = 0; id < int(m.id_bytes.size()); ++id) {
        if (!m.id_valid[id]) continue;
        auto it = m.vocab.find(m.id_bytes[id]);
        if (it != m.vocab.end() && it->second == id) vocab[bytes_to_unicode(m.id_bytes[id])] = id;
    }
    ojson merges = ojson::array();
    for (auto [a, b] : m.merge_list)
        merges.push_back(ojson::array({bytes_to_unicode(m.id_bytes[a]), bytes_to_unicode(m.id_bytes[b])}));
    ojson j = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           ojson::array(
               {{{"type", "Split"}, {"pattern", {{"Regex", m.pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", m.ignore_merges},
          {"vocab", vocab},
          {"merges", merges}}},
    };
    std::string text;
    try {
        text = j.dump(2);
    } catch (const std::exception& e) {  // a special token that is not valid UTF-8
        throw std::runtime_error("tokenizer '" + path + "': cannot be written as JSON: " + e.what());
    }
    text += '\n';
    // path.tmp, fsync, rename, directory fsync: a crash leaves the old file or the new one.
    write_file_atomically(path, "tokenizer", [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

namespace {

// The pre-split regex a tokenizer.json asks for: a Split with a Regex pattern (alone or inside a
// Sequence), else GPT-2's when a ByteLevel pre-tokenizer has use_regex, else Llama 3's.
std::string pattern_of(const nlohmann::json& pre) {
    std::string split, bytelevel;
    auto visit = [&](const nlohmann::json& p) {
        if (!p.is_object()) return;
        std::string type = p.value("type", "");
        if (type == "Split" && p.contains("pattern") && p["pattern"].is_object() && p["pattern"].contains("Regex") &&
            p["pattern"]["Regex"].is_string() && split.empty())
            split = p["pattern"]["Regex"].get<std::string>();
        if (type == "ByteLevel" && p.value("use_regex", true)) bytelevel = kGpt2Pattern;
    };
    if (pre.is_object()) {
        if (pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
            for (const auto& p : pre["pretokenizers"]) visit(p);
        else
            visit(pre);
    }
    if (!split.empty()) return split;
    if (!bytelevel.empty()) return bytelevel;
    return kLlama3Pattern;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
    auto fail = [&](const std::string& what) -> std::runtime_error {
        return std::runtime_error("tokenizer '" + path + "': " + what);
    };
    std::ifstream f(path, std::ios::binary);
    if (!f) throw fail("cannot open the file (missing or unreadable)");
    std::stringstream ss;
    ss << f.rdbuf();
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
        throw fail(std::string("not JSON: ") + e.what());
    }
    if (!j.is_object()) throw fail("not a tokenizer.json (the top level is not an object)");
    if (!j.contains("model") || !j["model"].is_object()) throw fail("no \"model\" object");
    const auto& model = j["model"];
    if (model.contains("type") && model["type"] != "BPE")
        throw fail("not a BPE model (model.type is " + model["type"].dump() + ")");
    if (!model.contains("vocab") || !model["vocab"].is_object()) throw fail("not a BPE model (no model.vocab object)");
    if (!model.contains("merges") || !model["merges"].is_array()) throw fail("not a BPE model (no model.merges array)");
    if (model.contains("continuing_subword_prefix") && !model["continuing_subword_prefix"].is_null() &&
        model["continuing_subword_prefix"] != "")
        throw fail("continuing_subword_prefix is not supported (byte-level BPE only)");
    if (model.contains("end_of_word_suffix") && !model["end_of_word_suffix"].is_null() &&
        model["end_of_word_suffix"] != "")
        throw fail("end_of_word_suffix is not supported (byte-level BPE only)");

    auto impl = std::make_shared<Impl>();
    {
        std::string p = j.contains("pre_tokenizer") ? pattern_of(j["pre_tokenizer"]) : kLlama3Pattern, err;
        impl->regex = compile_pattern(p, err);
        if (!impl->regex) throw fail("pre_tokenizer " + err);
        impl->pattern = p;
    }
    if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean())
        impl->ignore_merges = model["ignore_merges"].get<bool>();

    std::unordered_map<std::string, int> by_string;  // vocabulary string -> id
    by_string.reserve(model["vocab"].size());
    std::string bytes;
    for (const auto& [tok, idj] : model["vocab"].items()) {
        if (!idj.is_number_integer()) throw fail("vocab entry " + nlohmann::json(tok).dump() + " has no integer id");
        long long id = idj.get<long long>();
        if (id < 0 || id >= (1 << 24)) throw fail("vocab id " + std::to_string(id) + " out of range");
        if (!unicode_to_bytes(tok, bytes))
            throw fail("vocab entry " + nlohmann::json(tok).dump() +
                       " is not byte-level (a character outside the "
                       "GPT-2 byte-to-unicode table)");
        if (int(id) < int(impl->id_valid.size()) && impl->id_valid[id])
            throw fail("vocab id " + std::to_string(id) + " used twice");
        impl->add_id(int(id), bytes);
        impl->vocab[bytes] = int(id);
        by_string[tok] = int(id);
    }
    for (int b = 0; b < 256; ++b) {
        auto it = impl->vocab.find(std::string(1, char(b)));
        if (it == impl->vocab.end())
            throw fail("vocab lacks the byte token " + nlohmann::json(byte_table().to_utf8[b]).dump() + " (byte " +
                       std::to_string(b) + "): not a byte-level BPE vocabulary");
        impl->byte_id[b] = it->second;
    }
    const auto& merges = model["merges"];
    impl->merges.reserve(merges.size());
    impl->merge_list.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
        const auto& m = merges[r];
        std::string a, b;
        if (m.is_string()) {  // the older "a b" form
            const std::string& s = m.get_ref<const std::string&>();
            size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                throw fail("merge " + std::to_string(r) + " " + m.dump() + " is not two tokens separated by a space");
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            a = m[0].get<std::string>();
            b = m[1].get<std::string>();
        } else {
            throw fail("merge " + std::to_string(r) + " " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
        auto ia = by_string.find(a), ib = by_string.find(b), iab = by_string.find(a + b);
        if (ia == by_string.end() || ib == by_string.end())
            throw fail("merge " + std::to_string(r) + " " + m.dump() + ": part " +
                       nlohmann::json(ia == by_string.end() ? a : b).dump() + " is not in the vocab");
        if (iab == by_string.end())
            throw fail("merge " + std::to_string(r) + " " + m.dump() + ": result " + nlohmann::json(a + b).dump() +
                       " is not in the vocab");
        // HF keeps the first rank of a repeated merge.
        if (impl->merges.try_emplace(pair_key(ia->second, ib->second), Impl::Merge{int(r), iab->second}).second)
            impl->merge_list.push_back({ia->second, ib->second});
    }
    if (j.contains("added_tokens")) {
        if (!j["added_tokens"].is_array()) throw fail("\"added_tokens\" is not an array");
        for (const auto& t : j["added_tokens"]) {
            if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
                !t["content"].is_string())
                throw fail("added token " + t.dump() + " lacks an integer id or a string content");
            long long id = t["id"].get<long long>();
            std::string content = t["content"].get<std::string>();
            if (id < 0 || id >= (1 << 24)) throw fail("added token id " + std::to_string(id) + " out of range");
            if (content.empty()) throw fail("added token " + std::to_string(id) + " is empty");
            impl->add_id(int(id), content);
            impl->specials.push_back({content, int(id), t.value("special", true)});
        }
    }
    return Tokenizer(std::move(impl));
}

}  // namespace pv
