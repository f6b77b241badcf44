// Byte-level BPE tokenizer (GPT-2 / Llama 3 style), trained here or loaded from a Hugging Face
// tokenizer.json. Host code only.
//
// Encoding a string:
//   1. Special tokens (exact string matches such as "<|endoftext|>") are cut out first when
//      allow_special is true; each becomes its own id. Otherwise they are ordinary text.
//   2. The rest is pre-split by a regex (the Llama 3 / GPT-4 pattern unless a loaded file names
//      another) run through PCRE2 with PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF. Invalid
//      UTF-8 never errors: the regex cannot match it, and every run of bytes between two matches
//      becomes a piece of its own, so every input byte lands in exactly one piece and
//      decode(encode(x)) == x for EVERY byte string x.
//   3. Each piece starts as its bytes (base ids 0..255, one per byte value) and merges are applied
//      by rank, lowest first, leftmost on ties, until no adjacent pair has a merge (as HF's BPE).
//      A file with "ignore_merges": true (Llama 3) emits a piece that is itself in the vocabulary
//      as that one token without merging, as HF does.
// Decoding concatenates the bytes of each id (a special token decodes to its text).
//
// Training (train): pre-split the text (special tokens cut out, so they are never learned), count
// unique pieces, then repeatedly merge the most frequent adjacent pair, ties to the smallest
// (left id, right id), so the result depends only on the text. Pair counts are kept incrementally
// over the unique pieces (weighted by their counts), with an index from each pair to the pieces
// holding it and a lazily-invalidated max-heap, so a merge only touches the pieces it changes.
// Ids: 0..255 the bytes, then one per merge in merge order, then the special tokens.
//
// File format (save/load): Hugging Face byte-level tokenizer.json. Vocabulary strings are bytes
// mapped through GPT-2's byte-to-unicode table (printable bytes map to themselves, the other 68
// to U+0100+n), merges are pairs of such strings (["a","b"], or the older "a b" form on load),
// special tokens live in "added_tokens". load() throws std::runtime_error naming the file and the
// problem (missing, not JSON, not a BPE model, a merge whose parts are not in the vocabulary, ...).
//
// A Tokenizer is immutable after construction; copies share its tables, and encode/decode may be
// called concurrently from several threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pv {

class Tokenizer {
  public:
    // vocab_size counts the 256 byte tokens, the merges and the special tokens. Throws
    // std::invalid_argument when vocab_size < 256 + special_tokens.size() or a special token is
    // empty or repeated. Stops early (a smaller vocabulary) when the text runs out of pairs.
    static Tokenizer train(std::string_view text, int vocab_size,
                           std::vector<std::string> special_tokens = {"<|endoftext|>"});
    static Tokenizer load(const std::string& path);
    // Writes atomically (io/durable_file.h: path.tmp, fsync, rename); throws std::runtime_error on
    // I/O failure.
    void save(const std::string& path) const;

    std::vector<int> encode(std::string_view text, bool allow_special = true) const;
    // Throws std::out_of_range on an id that is not a token.
    std::string decode(const std::vector<int>& ids) const;

    // One past the largest id.
    int vocab_size() const;
    // The id of a special token with this text, else of the ordinary token with these bytes,
    // else -1.
    int token_id(std::string_view token_text) const;
    // The id of "<|endoftext|>", or -1.
    int eot_id() const;
    // The end-of-sequence token that separates documents (the tokenizer's own EOS), or -1.
    int eos_id() const { return eot_id(); }
    // The beginning-of-sequence token the post-processor adds, or -1 when it adds none.
    int bos_id() const { return -1; }

    struct Impl;

  private:
    explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace pv
