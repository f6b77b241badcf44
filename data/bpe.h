// The BPE model of a tokenizer (Hugging Face's "model": {"type": "BPE"}): a vocabulary, ranked
// merges, and what to do with a character the vocabulary lacks. Internal to data/tokenizer*.cpp.
//
// Encoding one pre-tokenized piece (HF's BPE::merge_word, then Word::merge_all):
//   0. ignore_merges (Llama 3): a piece that is itself in the vocabulary is that one token.
//   1. The piece is cut into characters: bytes when the pre-tokenizer ended with ByteLevel (the
//      vocabulary is then keyed by the bytes each token stands for, see byte_level below), else
//      UTF-8 characters (an invalid byte is a character of its own). Each character is its token;
//      a character the vocabulary lacks becomes its bytes' <0xNN> tokens when byte_fallback is set
//      and all exist, else the unk token (consecutive unknown characters share one unk when
//      fuse_unk is set), else nothing (HF drops it).
//   2. Merges apply lowest rank first, leftmost on ties, each creating a candidate with its new
//      neighbours; a candidate whose pair no longer merges into the same token is stale and
//      skipped. A heap makes this O(n log n).
// Long pieces (a SentencePiece-style file without pre-tokenizer sends whole documents here) are
// first cut between two characters that no vocabulary token holds side by side, where both are
// tokens themselves: every symbol is a vocabulary token spelling the text it covers, so no merge
// can ever cross such a cut, and merging the parts alone gives the same ids in a fraction of the
// time (a heap over a million symbols misses the cache at every level).
// A duplicate merge keeps its last rank, as HF builds its merge map.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <mutex>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pv::tok {

// A string -> id table in one open-addressing array (linear probing, at most half full) with the
// strings stored beside it; found by std::string_view. A lookup costs about one cache miss, where a
// node-based map costs several: it serves the vocabulary in encoding and the ~840k lookups of
// Llama 3's merges in loading.
class StringIndex {
  public:
    void reserve(size_t n);
    // Sets the id of key, replacing an earlier one.
    void set(std::string_view key, int id);
    // The id of key, or -1.
    int find(std::string_view key) const {
        if (slots_.empty()) return -1;
        const uint64_t h = hash(key);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key < 0) return -1;
            if (s.hash == h && keys_[size_t(s.key)] == key) return s.id;
        }
    }
    size_t size() const { return keys_.size(); }

  private:
    struct Slot {
        uint64_t hash = 0;
        int key = -1;  // index into keys_, -1 for an empty slot
        int id = -1;
    };
    static uint64_t hash(std::string_view s) { return std::hash<std::string_view>{}(s)*0x9E3779B97F4A7C15ull; }
    std::vector<Slot> slots_;
    std::vector<std::string> keys_;
    size_t mask_ = 0;
};

inline uint64_t pair_key(int a, int b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

// A map from a pair of non-negative ints (two token ids, two characters) to V, in one
// open-addressing array (linear probing, at most half full). Encoding looks a pair up for every
// candidate merge and loading inserts ~280k merges for Llama 3: this beats a node-based map by
// several times.
template <class V>
class PairMap {
  public:
    void reserve(size_t n) {
        size_t capacity = 16;
        while (capacity < 2 * n) capacity *= 2;
        if (capacity <= keys_.size()) return;
        std::vector<uint64_t> old_keys = std::move(keys_);
        std::vector<V> old_values = std::move(values_);
        keys_.assign(capacity, kEmpty);
        values_.assign(capacity, V{});
        mask_ = capacity - 1;
        shift_ = 64 - std::countr_zero(capacity);
        size_ = 0;
        for (size_t i = 0; i < old_keys.size(); ++i)
            if (old_keys[i] != kEmpty) set(int(old_keys[i] >> 32), int(old_keys[i] & 0xffffffffu), old_values[i]);
    }
    // Sets the value of (a, b), replacing an earlier one.
    void set(int a, int b, V v) {
        if (2 * (size_ + 1) > keys_.size()) reserve(2 * (size_ + 1));
        const uint64_t key = pair_key(a, b);
        size_t i = slot(key);
        while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
        if (keys_[i] == kEmpty) ++size_;
        keys_[i] = key;
        values_[i] = v;
    }
    // The value of (a, b), or null.
    const V* find(int a, int b) const {
        if (keys_.empty()) return nullptr;
        const uint64_t key = pair_key(a, b);
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            if (keys_[i] == key) return &values_[i];
            if (keys_[i] == kEmpty) return nullptr;
        }
    }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

  private:
    static constexpr uint64_t kEmpty = ~uint64_t(0);  // no pair of ints >= 0 has this key
    size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }
    std::vector<uint64_t> keys_;
    std::vector<V> values_;
    size_t mask_ = 0, size_ = 0;
    int shift_ = 64;
};

struct BpeModel {
    std::vector<std::string> tokens;  // id -> the token as the file spells it ("" for unused ids)
    std::vector<char> valid;          // id -> whether the vocabulary has it
    // byte_level: pieces are raw bytes and `vocab` maps the bytes a token stands for (its string
    // read through GPT-2's byte-to-unicode table) to its id; a token whose string is not spelled in
    // that alphabet can never come out of encoding and sits in `unmapped` by its string.
    bool byte_level = false;
    StringIndex vocab;
    StringIndex unmapped;
    std::array<int, 256> byte_id;  // byte_level: the token of one byte, -1 where absent
    struct Merge {
        int rank, result;
    };
    PairMap<Merge> merges;                        // (left id, right id) -> rank, merged id
    std::vector<std::pair<int, int>> merge_list;  // rank -> (left id, right id), for writing
    int unk = -1;                                 // the unk token's id, -1 for none
    bool fuse_unk = false;
    bool byte_fallback = false;
    bool ignore_merges = false;
    std::array<int, 256> fallback_id;  // byte -> its "<0xNN>" token, -1 where absent

    BpeModel() {
        byte_id.fill(-1);
        fallback_id.fill(-1);
    }
    // Sets id's string; byte_level files also enter it in vocab by its bytes (or in unmapped).
    void add_token(int id, const std::string& text);
    // The id of the token with this model-space string (bytes when byte_level), or -1.
    int find(std::string_view s) const { return vocab.find(s); }
    // Appends the ids of one pre-tokenized piece (see the top of this file).
    void encode(std::string_view piece, std::vector<int>& out) const;

  private:
    // Steps 1 and 2 of the top of this file for one word.
    void merge_word(std::string_view word, std::vector<int>& out) const;
    // Cuts a long piece where no merge can ever join its two sides, and merges each part alone.
    void merge_long_piece(std::string_view piece, std::vector<int>& out) const;
    // The pairs of adjacent characters (code points, or bytes when byte_level) inside any token,
    // built on the first long piece: a merge can only join two characters that some token holds
    // side by side.
    const PairMap<char>& inner_pairs() const;
    mutable std::once_flag inner_pairs_once_;
    mutable PairMap<char> inner_pairs_;
};

// Learns byte-level merges from unique pieces weighted by their counts, until the vocabulary
// (256 byte tokens, model ids 0..255, then one per distinct merge result) holds `target` tokens or
// no pair is left. Each step merges the most frequent adjacent pair, ties to the smallest
// (left id, right id), so the result depends only on the pieces and counts.
void learn_byte_level_merges(const std::vector<std::pair<std::string_view, int64_t>>& pieces, int target,
                             BpeModel& model);

}  // namespace pv::tok
