// Everything that cuts text before the BPE model sees it: added-token matching, the normalizer,
// the pre-tokenizer steps, and the regexes they run on (data/tokenizer_parts.h). Each function
// follows the Hugging Face `tokenizers` component of the same name; the comments say where its
// behaviour is not obvious.
#include "data/tokenizer_parts.h"

#include "data/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <stdexcept>

namespace pv::tok {

// ---- Regex ----

struct Regex::Code {
    pcre2_code* code = nullptr;
    ~Code() { pcre2_code_free(code); }
};

namespace {

struct MatchData {
    pcre2_match_data* md;
    explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {}
    ~MatchData() { pcre2_match_data_free(md); }
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;
};

// One step forward from byte i: a whole character, or one invalid byte.
size_t next_char(std::string_view s, size_t i) {
    const int n = utf8_char_length(s, i);
    return i + size_t(n > 0 ? n : 1);
}

}  // namespace

namespace {

// The pattern as PCRE2 must read it to match what Oniguruma matches: \s and \S become the Unicode
// White_Space property, which is Oniguruma's \s (PCRE2's own \s also takes U+180E MONGOLIAN VOWEL
// SEPARATOR, which Unicode dropped from White_Space in 6.3; Llama 3's pattern then splits
// " \u180e" differently). Escaped backslashes and \Q...\E literals are copied as they are.
std::string oniguruma_compatible(const std::string& pattern) {
    std::string out;
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] != '\\' || i + 1 == pattern.size()) {
            out += pattern[i];
            continue;
        }
        const char c = pattern[++i];
        if (c == 's') {
            out += "\\p{White_Space}";
        } else if (c == 'S') {
            out += "\\P{White_Space}";
        } else if (c == 'Q') {
            const size_t end = pattern.find("\\E", i + 1);
            const size_t stop = end == std::string::npos ? pattern.size() : end + 2;
            out.append(pattern, i - 1, stop - (i - 1));
            i = stop - 1;
        } else {
            out += '\\';
            out += c;
        }
    }
    return out;
}

// A match that ends in an error (PCRE2's match or depth limit, on a pattern that backtracks
// exponentially) would leave the rest of the text unsplit, so it ends the encoding instead.
std::runtime_error match_error(const std::string& pattern, int rc, size_t text_bytes, size_t at) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return std::runtime_error("the tokenizer's regex " + pattern + " failed on a text of " +
                              std::to_string(text_bytes) + " bytes, matching from byte " + std::to_string(at) +
                              ": " + reinterpret_cast<const char*>(msg) +
                              " (the pattern backtracks too much on this text; fix the pattern in tokenizer.json "
                              "or split the text into shorter documents)");
}

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::string compiled = oniguruma_compatible(pattern);
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        throw std::invalid_argument("regex " + pattern + " does not compile at offset " + std::to_string(offset) +
                                    ": " + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // a speed-up only: the interpreter works without it
    auto code = std::make_shared<Code>();
    code->code = re;
    code_ = std::move(code);
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
    out.clear();
    MatchData m(code_->code);
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0;
    bool matched = false;
    size_t last_end = 0;
    while (start <= text.size()) {
        const int rc = pcre2_match(code_->code, subject, text.size(), start, 0, m.md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) throw match_error(pattern_, rc, text.size(), start);
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
        const size_t s = ov[0], e = ov[1];
        if (s == e && matched && e == last_end) {  // an empty match where the last one ended
            if (e >= text.size()) break;
            start = next_char(text, e);
            continue;
        }
        out.emplace_back(s, e);
        matched = true;
        last_end = e;
        start = e;
    }
}

bool Regex::matches_at(std::string_view text, size_t pos) const {
    MatchData m(code_->code);
    const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                               PCRE2_ANCHORED, m.md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) throw match_error(pattern_, rc, text.size(), pos);
    return rc >= 0;
}

void Pattern::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
    if (regex) return regex->find_all(text, out);
    out.clear();
    if (literal.empty()) return;
    for (size_t at = text.find(literal); at != std::string_view::npos; at = text.find(literal, at + literal.size()))
        out.emplace_back(at, at + literal.size());
}

// ---- Added tokens ----

void TokenTrie::add(std::string_view pattern, int value) {
    if (pattern.empty()) return;
    int node = 0;
    for (char ch : pattern) {
        const auto c = static_cast<unsigned char>(ch);
        auto& next = nodes_[size_t(node)].next;
        auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, -1));
        if (it != next.end() && it->first == c) {
            node = it->second;
        } else {
            const int fresh = int(nodes_.size());
            next.insert(it, {c, fresh});
            nodes_.emplace_back();
            node = fresh;
        }
    }
    // Two tokens with one string: the first keeps it (only its id can come out of matching).
    if (nodes_[size_t(node)].value < 0) nodes_[size_t(node)].value = value;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

bool TokenTrie::find(std::string_view text, size_t from, size_t& at, size_t& length, int& value) const {
    for (size_t i = from; i < text.size(); ++i) {
        if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
        int node = 0;
        int best = -1;
        size_t best_len = 0;
        for (size_t j = i; j < text.size(); ++j) {
            const auto& next = nodes_[size_t(node)].next;
            const auto c = static_cast<unsigned char>(text[j]);
            auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, -1));
            if (it == next.end() || it->first != c) break;
            node = it->second;
            if (nodes_[size_t(node)].value >= 0) best = nodes_[size_t(node)].value, best_len = j + 1 - i;
        }
        if (best >= 0) {
            at = i;
            length = best_len;
            value = best;
            return true;
        }
    }
    return false;
}

namespace {

// The start of the character that ends at byte `end` of s (end > 0).
size_t previous_char(std::string_view s, size_t end) {
    for (size_t back = 1; back <= 4 && back <= end; ++back) {
        const size_t i = end - back;
        if (utf8_char_length(s, i) == int(back)) return i;
    }
    return end - 1;  // an invalid byte
}

// The code point at i, or U+FFFD for an invalid byte.
uint32_t code_point_at(std::string_view s, size_t i) {
    const int n = utf8_char_length(s, i);
    return n > 0 ? utf8_decode(s, i, n) : 0xFFFD;
}

// Rust's c.is_alphanumeric() || c == '_' for the character at i.
bool is_word_char_at(std::string_view s, size_t i) {
    static const Regex word("[\\p{Alphabetic}\\p{N}_]");
    return word.matches_at(s, i);
}

}  // namespace

std::vector<Segment> AddedVocabulary::split(std::string_view text, const TokenTrie& trie, bool parse_special) const {
    std::vector<Segment> out;
    if (text.empty()) return out;
    size_t start_offset = 0;  // everything before it is already in a segment
    size_t at, length;
    int index;
    for (size_t pos = 0; trie.find(text, pos, at, length, index);) {
        size_t start = at, stop = at + length;
        pos = stop;  // the automaton moves on from the match itself, whatever becomes of it
        const AddedToken& t = tokens[size_t(index)];
        if (t.special && !parse_special) continue;
        if (t.single_word) {
            const bool space_before = start == 0 || !is_word_char_at(text, previous_char(text, start));
            const bool space_after = stop == text.size() || !is_word_char_at(text, stop);
            if (!space_before || !space_after) continue;
        }
        if (t.lstrip) {
            size_t s = start;
            while (s > 0) {
                const size_t p = previous_char(text, s);
                if (!is_unicode_whitespace(code_point_at(text, p))) break;
                s = p;
            }
            start = std::max(s, start_offset);  // spaces an earlier match took stay with it
        }
        if (t.rstrip)
            while (stop < text.size() && is_unicode_whitespace(code_point_at(text, stop))) stop = next_char(text, stop);
        if (start_offset < start) out.push_back({-1, start_offset, start});
        out.push_back({index, start, stop});
        start_offset = stop;
    }
    if (start_offset < text.size()) out.push_back({-1, start_offset, text.size()});
    return out;
}

// ---- Normalizer ----

std::string normalize(const std::vector<NormalizerStep>& steps, std::string_view text) {
    std::string s(text);
    std::vector<std::pair<size_t, size_t>> matches;
    for (const NormalizerStep& step : steps) {
        if (step.kind == NormalizerStep::Kind::prepend) {
            if (!s.empty()) s.insert(0, step.text);
            continue;
        }
        step.pattern.find_all(s, matches);
        if (matches.empty()) continue;
        std::string r;
        r.reserve(s.size() + matches.size() * step.text.size());
        size_t prev = 0;
        for (auto [b, e] : matches) {
            r.append(s, prev, b - prev);
            r += step.text;
            prev = e;
        }
        r.append(s, prev, std::string::npos);
        s.swap(r);
    }
    return s;
}

// ---- Pre-tokenizer ----

namespace {

// GPT-2's pre-split pattern, which a ByteLevel pre-tokenizer with use_regex applies.
const Regex& gpt2_regex() {
    static const Regex re("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
    return re;
}

// The pieces [begin, end) that a split of n bytes at these matches keeps, as HF's
// NormalizedString::split does: the text becomes alternating matches and gaps (an empty text is
// one empty gap), invert swaps the two, the behaviour decides what each match becomes, and empty
// pieces are dropped.
std::vector<std::pair<size_t, size_t>> split_pieces(size_t n, const std::vector<std::pair<size_t, size_t>>& matches,
                                                    SplitBehavior behavior, bool invert) {
    struct Part {
        size_t begin, end;
        bool match;
    };
    std::vector<Part> parts;
    size_t prev = 0;
    for (auto [b, e] : matches) {
        if (prev != b) parts.push_back({prev, b, false});
        parts.push_back({b, e, true});
        prev = e;
    }
    if (prev != n || parts.empty()) parts.push_back({prev, n, false});
    if (invert)
        for (Part& p : parts) p.match = !p.match;

    std::vector<Part> kept;  // `match` now means "removed"
    bool previous_match = false;
    switch (behavior) {
        case SplitBehavior::removed: kept = parts; break;
        case SplitBehavior::isolated:
            for (const Part& p : parts) kept.push_back({p.begin, p.end, false});
            break;
        case SplitBehavior::merged_with_previous:
            // A delimiter joins the piece before it, unless that piece is a delimiter itself.
            for (const Part& p : parts) {
                if (p.match && !previous_match && !kept.empty())
                    kept.back().end = p.end;
                else
                    kept.push_back({p.begin, p.end, false});
                previous_match = p.match;
            }
            break;
        case SplitBehavior::merged_with_next:
            // The mirror image: a delimiter joins the piece after it, unless that is a delimiter.
            for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
                if (it->match && !previous_match && !kept.empty())
                    kept.back().begin = it->begin;
                else
                    kept.push_back({it->begin, it->end, false});
                previous_match = it->match;
            }
            std::reverse(kept.begin(), kept.end());
            break;
        case SplitBehavior::contiguous:
            // Consecutive delimiters become one piece.
            for (const Part& p : parts) {
                if (p.match && previous_match && !kept.empty())
                    kept.back().end = p.end;
                else
                    kept.push_back({p.begin, p.end, false});
                previous_match = p.match;
            }
            break;
    }
    std::vector<std::pair<size_t, size_t>> out;
    for (const Part& p : kept)
        if (!p.match && p.end > p.begin) out.emplace_back(p.begin, p.end);
    return out;
}

void pre_tokenize_from(const std::vector<PreTokenizerStep>& steps, size_t k, std::string_view text, bool at_start,
                       const std::function<void(std::string_view)>& emit) {
    if (text.empty()) return;
    if (k == steps.size()) return emit(text);
    const PreTokenizerStep& step = steps[k];
    std::vector<std::pair<size_t, size_t>> matches;
    auto each = [&](std::string_view t, const std::vector<std::pair<size_t, size_t>>& pieces) {
        for (auto [b, e] : pieces) pre_tokenize_from(steps, k + 1, t.substr(b, e - b), at_start && b == 0, emit);
    };
    switch (step.kind) {
        case PreTokenizerStep::Kind::split:
        case PreTokenizerStep::Kind::digits:
            step.pattern.find_all(text, matches);
            each(text, split_pieces(text.size(), matches, step.behavior, step.invert));
            return;
        case PreTokenizerStep::Kind::byte_level: {
            std::string prefixed;
            std::string_view t = text;
            if (step.add_prefix_space && text[0] != ' ') {
                prefixed = " " + std::string(text);
                t = prefixed;
            }
            if (!step.use_regex) return pre_tokenize_from(steps, k + 1, t, at_start, emit);
            gpt2_regex().find_all(t, matches);
            each(t, split_pieces(t.size(), matches, SplitBehavior::isolated, false));
            return;
        }
        case PreTokenizerStep::Kind::metaspace: {
            std::string s;
            s.reserve(text.size() + step.replacement.size());
            for (char c : text) {
                if (c == ' ')
                    s += step.replacement;
                else
                    s += c;
            }
            const bool prepend = step.prepend == PreTokenizerStep::Prepend::always ||
                                 (step.prepend == PreTokenizerStep::Prepend::first && at_start);
            if (prepend && s.compare(0, step.replacement.size(), step.replacement) != 0) s.insert(0, step.replacement);
            if (!step.split) return pre_tokenize_from(steps, k + 1, s, at_start, emit);
            Pattern{step.replacement, nullptr}.find_all(s, matches);
            each(s, split_pieces(s.size(), matches, SplitBehavior::merged_with_next, false));
            return;
        }
    }
}

}  // namespace

void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text, bool at_start,
                  const std::function<void(std::string_view)>& emit) {
    pre_tokenize_from(steps, 0, text, at_start, emit);
}

}  // namespace pv::tok
