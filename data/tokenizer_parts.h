// The parts of a tokenizer as data/tokenizer.cpp runs them, each the polevault form of one
// component of a Hugging Face tokenizer.json (internal to data/tokenizer*.cpp and data/bpe*.cpp):
//
//   AddedVocabulary   "added_tokens": exact strings cut out of the text before anything else
//   Normalizer        "normalizer": Prepend, Replace (a string or a regex), Sequence of those
//   PreTokenizerStep  "pre_tokenizer": Split, ByteLevel, Metaspace, Digits, Sequence of those
//   BpeModel          "model" of type BPE (data/bpe.h)
//   DecoderStep       "decoder": ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence
//   post_prefix/suffix "post_processor": the ids TemplateProcessing puts around one sequence
//
// Regexes (Split patterns, Replace patterns, ByteLevel's GPT-2 pattern) run on PCRE2 with
// PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF. Hugging Face compiles them with Oniguruma; the
// two agree on \p{L}, \p{N} and the rest of the patterns tokenizers use once \s is read as the
// Unicode White_Space property, which is Oniguruma's \s (Regex rewrites it; the golden tests check
// every script and space character we could think of). Invalid UTF-8, which Hugging Face never
// sees (it takes str), cannot match and is left between matches.
#pragma once

#include "data/bpe.h"
#include "data/tokenizer.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pv::tok {

// A compiled PCRE2 pattern; copies share it.
class Regex {
  public:
    // Throws std::invalid_argument with PCRE2's message and the offset when the pattern does not
    // compile.
    explicit Regex(const std::string& pattern);
    const std::string& pattern() const { return pattern_; }
    // The non-overlapping matches in text as [begin, end) byte ranges, left to right. An empty match
    // right where the previous match ended is skipped (the search moves on one byte), as
    // Oniguruma's find_iter does; other empty matches are reported (they split text).
    void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
    // Whether the pattern matches at exactly byte pos of text.
    bool matches_at(std::string_view text, size_t pos) const;

  private:
    struct Code;
    std::string pattern_;
    std::shared_ptr<const Code> code_;
};

// A pattern that is either a literal string (HF's {"String": ...}) or a regex ({"Regex": ...}).
struct Pattern {
    std::string literal;           // used when regex is null
    std::shared_ptr<Regex> regex;  // null: literal
    void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
};

struct NormalizerStep {
    enum class Kind { prepend, replace } kind;
    std::string text;  // prepend: what is put in front of non-empty text; replace: the replacement
    Pattern pattern;   // replace: what is replaced
};

// How a Split step treats the delimiters it finds (HF's SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreTokenizerStep {
    enum class Kind { split, byte_level, metaspace, digits } kind;
    explicit PreTokenizerStep(Kind k) : kind(k) {}
    // split: the delimiter pattern, what becomes of it, and whether the pattern names the pieces
    // to keep instead (invert). digits: \p{N} one character at a time, isolated or contiguous.
    Pattern pattern;
    SplitBehavior behavior = SplitBehavior::isolated;
    bool invert = false;
    // byte_level: a space put in front of a piece that has none, and GPT-2's pre-split regex.
    bool add_prefix_space = false;
    bool use_regex = false;
    // metaspace: spaces become `replacement`; it is put in front of a piece (always, only of the
    // text's first piece, never) unless there already; split: cut before each replacement.
    enum class Prepend { always, first, never } prepend = Prepend::always;
    std::string replacement;
    bool split = true;
};

struct DecoderStep {
    enum class Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace } kind;
    explicit DecoderStep(Kind k) : kind(k) {}
    Pattern pattern;               // replace: what is replaced in each token
    std::string text;              // replace: the replacement; metaspace: the replacement character
    uint32_t strip_char = 0;       // strip: the character removed ...
    int strip_start = 0;           // ... up to this many times from each token's start
    int strip_stop = 0;            // ... and this many from its end
    bool metaspace_first = false;  // metaspace: the first token's replacement characters are dropped
};

struct AddedToken {
    std::string content;
    std::string text;  // its string in decoding: content, normalized when `normalized` (as HF has it)
    int id = -1;
    bool special = false;      // a control token: `encode(parse_special = false)` treats it as text
    bool lstrip = false;       // the match takes the whitespace before it
    bool rstrip = false;       // ... and after it
    bool normalized = false;   // matched in the normalized text (else in the raw text)
    bool single_word = false;  // matched only where no word character touches it
};

// Byte trie over the added tokens' strings, for leftmost-longest matching (what Hugging Face's
// Aho-Corasick automaton with MatchKind::LeftmostLongest finds).
class TokenTrie {
  public:
    void add(std::string_view pattern, int value);
    bool empty() const { return nodes_.size() <= 1; }
    // The first position >= from where a pattern starts, with the value and length of the longest
    // pattern there; false when none.
    bool find(std::string_view text, size_t from, size_t& at, size_t& length, int& value) const;

  private:
    struct Node {
        std::vector<std::pair<unsigned char, int>> next;  // sorted by byte
        int value = -1;
    };
    std::vector<Node> nodes_{Node{}};
    bool first_byte_[256] = {};
};

// The text between added tokens ([begin, end), token < 0) or one added token (its index).
struct Segment {
    int token;
    size_t begin, end;
};

struct AddedVocabulary {
    std::vector<AddedToken> tokens;
    TokenTrie raw_trie;         // non-normalized tokens, matched on the raw text
    TokenTrie normalized_trie;  // normalized tokens (their content normalized too), on normalized text
    // Cuts text at the tokens of one trie, as Hugging Face's AddedVocabulary::find_matches does:
    // leftmost-longest matches; a special token is skipped (left in the text) unless parse_special;
    // a single_word token is skipped where a word character (alphanumeric or '_') touches it; lstrip
    // and rstrip widen the match over the whitespace beside it. Empty text gives no segments.
    std::vector<Segment> split(std::string_view text, const TokenTrie& trie, bool parse_special) const;
};

// The normalizer's steps applied to text, in order.
std::string normalize(const std::vector<NormalizerStep>& steps, std::string_view text);

// Calls emit(piece) for each non-empty piece the pre-tokenizer steps cut text into, in order.
// at_start: text begins the original input (Metaspace's "first" scheme prepends only there).
// Pieces after a ByteLevel step are raw bytes (the model reads them through the byte alphabet).
void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text, bool at_start,
                  const std::function<void(std::string_view)>& emit);

// The decoder's steps over the tokens' strings (HF's Decoder::decode_chain, one step after the
// other), concatenated. A ByteLevel step turns alphabet characters into the bytes they stand for
// and keeps invalid UTF-8 as bytes where Hugging Face writes U+FFFD (see Tokenizer::decode).
std::string run_decoders(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens);

}  // namespace pv::tok

namespace pv {

// Everything a tokenizer is, immutable once built (see data/tokenizer.h).
struct Tokenizer::Impl {
    std::string source;       // the tokenizer.json path it was loaded from ("" when trained)
    std::string json_text;    // the file's bytes as read: save() writes them back unchanged
    std::string config_text;  // tokenizer_config.json beside it, as read ("" when absent)

    tok::AddedVocabulary added;
    std::vector<tok::NormalizerStep> normalizer;
    std::vector<tok::PreTokenizerStep> pre_tokenizer;
    tok::BpeModel model;
    bool has_decoder = false;  // without one, HF joins the tokens' strings with spaces
    std::vector<tok::DecoderStep> decoder;
    std::vector<int> post_prefix, post_suffix;  // what the post-processor puts around a sequence

    std::vector<const std::string*> id_text;  // id -> its string (an added token's content, else the model's)
    std::vector<char> id_special;             // id -> whether it is a special added token
    std::vector<char> id_skipped;             // id -> whether decode(ids, skip_special) leaves it out
    int bos = -1, eos = -1;
    bool add_bos = false;

    // Fills id_text and id_special from model and added, and checks every id is known.
    void index_ids();
};

}  // namespace pv
