// BPE encoding of one piece and byte-level BPE training: see data/bpe.h.
#include "data/bpe.h"

#include "data/utf8.h"
#include "io/progress.h"

#include <algorithm>
#include <bit>
#include <queue>
#include <unordered_map>

namespace pv::tok {

void StringIndex::reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    if (capacity <= slots_.size()) return;
    const std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
        if (s.key < 0) continue;
        size_t i = s.hash & mask_;
        while (slots_[i].key >= 0) i = (i + 1) & mask_;
        slots_[i] = s;
    }
    keys_.reserve(n);
}

void StringIndex::set(std::string_view key, int id) {
    if (2 * (keys_.size() + 1) > slots_.size()) reserve(2 * (keys_.size() + 1));
    const uint64_t h = hash(key);
    size_t i = h & mask_;
    for (; slots_[i].key >= 0; i = (i + 1) & mask_)
        if (slots_[i].hash == h && keys_[size_t(slots_[i].key)] == key) {
            slots_[i].id = id;
            return;
        }
    slots_[i] = {h, int(keys_.size()), id};
    keys_.emplace_back(key);
}

void BpeModel::add_token(int id, const std::string& text) {
    if (id >= int(tokens.size())) {
        tokens.resize(size_t(id) + 1);
        valid.resize(size_t(id) + 1, 0);
    }
    tokens[size_t(id)] = text;
    valid[size_t(id)] = 1;
    if (!byte_level) {
        vocab.set(text, id);
        return;
    }
    std::string bytes;
    if (byte_level_to_bytes(text, bytes)) {
        vocab.set(bytes, id);
        if (bytes.size() == 1) byte_id[static_cast<unsigned char>(bytes[0])] = id;
    } else {
        unmapped.set(text, id);
    }
}

namespace {

// One symbol of a word being merged: its token, its neighbours, and whether it is still there.
struct Symbol {
    int id, prev, next;
    bool alive;
};

// A merge waiting in the heap: lowest rank first, then leftmost.
struct Candidate {
    int rank, pos, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void BpeModel::encode(std::string_view piece, std::vector<int>& out) const {
    if (piece.empty()) return;
    if (ignore_merges) {
        if (const int id = find(piece); id >= 0) {
            out.push_back(id);
            return;
        }
    }
    constexpr size_t kLongPiece = 256;  // bytes; below this one heap is cheap
    if (piece.size() > kLongPiece && !merges.empty())
        merge_long_piece(piece, out);
    else
        merge_word(piece, out);
}

const PairMap<char>& BpeModel::inner_pairs() const {
    std::call_once(inner_pairs_once_, [&] {
        for (size_t id = 0; id < tokens.size(); ++id) {
            if (!valid[id]) continue;
            std::string bytes;
            std::string_view t = tokens[id];
            if (byte_level) {
                if (!byte_level_to_bytes(t, bytes)) continue;  // unreachable by encoding
                for (size_t i = 0; i + 1 < bytes.size(); ++i)
                    inner_pairs_.set(static_cast<unsigned char>(bytes[i]), static_cast<unsigned char>(bytes[i + 1]), 1);
                continue;
            }
            int prev = -1;
            for (size_t i = 0; i < t.size();) {
                const int n = utf8_char_length(t, i);
                const int cp = n > 0 ? int(utf8_decode(t, i, n)) : 0x110000 + static_cast<unsigned char>(t[i]);
                if (prev >= 0) inner_pairs_.set(prev, cp, 1);
                prev = cp;
                i += size_t(n > 0 ? n : 1);
            }
        }
    });
    return inner_pairs_;
}

void BpeModel::merge_long_piece(std::string_view piece, std::vector<int>& out) const {
    const PairMap<char>& pairs = inner_pairs();
    size_t start = 0;  // the current part begins here
    int prev = -1;     // the previous character (code point or byte) when it is a token, else -1
    for (size_t i = 0; i < piece.size();) {
        int cp;
        size_t len = 1;
        bool known;
        if (byte_level) {
            cp = static_cast<unsigned char>(piece[i]);
            known = byte_id[size_t(cp)] >= 0;
        } else {
            const int n = utf8_char_length(piece, i);
            len = n > 0 ? size_t(n) : 1;
            cp = n > 0 ? int(utf8_decode(piece, i, n)) : 0x110000 + static_cast<unsigned char>(piece[i]);
            known = n > 0 && find(piece.substr(i, len)) >= 0;
        }
        if (known && prev >= 0 && !pairs.find(prev, cp)) {
            merge_word(piece.substr(start, i - start), out);
            start = i;
        }
        prev = known ? cp : -1;
        i += len;
    }
    merge_word(piece.substr(start), out);
}

void BpeModel::merge_word(std::string_view piece, std::vector<int>& out) const {
    std::vector<Symbol> word;
    word.reserve(piece.size());
    auto add = [&](int id) {
        const int n = int(word.size());
        word.push_back({id, n - 1, -1, true});
        if (n > 0) word[size_t(n - 1)].next = n;
    };
    int pending_unk = -1;  // an unk not yet added (fuse_unk lets the next unknown character join it)
    for (size_t i = 0; i < piece.size();) {
        size_t len = 1;
        int id;
        if (byte_level) {
            id = byte_id[static_cast<unsigned char>(piece[i])];
        } else {
            const int n = utf8_char_length(piece, i);
            len = n > 0 ? size_t(n) : 1;
            id = find(piece.substr(i, len));
        }
        // The string the vocabulary was asked for, whose bytes byte fallback spells out: byte-level
        // files hold the byte's alphabet character, others the character itself.
        const std::string_view chr =
            byte_level ? std::string_view(byte_level_alphabet().to_utf8[static_cast<unsigned char>(piece[i])])
                       : piece.substr(i, len);
        i += len;
        if (id >= 0) {
            if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
            add(id);
            continue;
        }
        if (byte_fallback && std::all_of(chr.begin(), chr.end(),
                                         [&](char c) { return fallback_id[static_cast<unsigned char>(c)] >= 0; })) {
            for (char c : chr) add(fallback_id[static_cast<unsigned char>(c)]);
            continue;
        }
        if (unk >= 0) {
            if (pending_unk >= 0 && !fuse_unk) add(pending_unk);
            pending_unk = unk;
        }
    }
    if (pending_unk >= 0) add(pending_unk);

    if (word.size() > 1 && !merges.empty()) {
        std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
        auto consider = [&](int pos) {
            if (pos < 0 || word[size_t(pos)].next < 0) return;
            if (const Merge* m = merges.find(word[size_t(pos)].id, word[size_t(word[size_t(pos)].next)].id))
                heap.push({m->rank, pos, m->result});
        };
        for (int i = 0; i + 1 < int(word.size()); ++i) consider(i);
        while (!heap.empty()) {
            const Candidate c = heap.top();
            heap.pop();
            Symbol& left = word[size_t(c.pos)];
            if (!left.alive || left.next < 0) continue;
            Symbol& right = word[size_t(left.next)];
            // Stale unless the pair there now still merges into the same token (HF's test).
            const Merge* m = merges.find(left.id, right.id);
            if (!m || m->result != c.result) continue;
            left.id = c.result;
            right.alive = false;
            left.next = right.next;
            if (right.next >= 0) word[size_t(right.next)].prev = c.pos;
            consider(left.prev);
            consider(c.pos);
        }
    }
    for (const Symbol& s : word)
        if (s.alive) out.push_back(s.id);
}

namespace {

// Byte-level BPE training over unique pieces; see learn_byte_level_merges. Pair counts are kept
// incrementally over the unique pieces (weighted by their counts), with an index from each pair
// to the pieces holding it and a lazily-invalidated max-heap, so a merge only touches the pieces
// it changes.
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
            const auto& s = words[size_t(w)];
            for (size_t i = 0; i + 1 < s.size(); ++i) {
                uint64_t k = pair_key(s[i], s[i + 1]);
                pair_count[k] += counts[size_t(w)];
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
            auto& s = words[size_t(w)];
            const int64_t c = counts[size_t(w)];
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

}  // namespace

void learn_byte_level_merges(const std::vector<std::pair<std::string_view, int64_t>>& pieces, int target,
                             BpeModel& model) {
    const ByteLevelAlphabet& alphabet = byte_level_alphabet();
    model.byte_level = true;
    std::vector<std::string> bytes_of;  // id -> the bytes it stands for
    for (int b = 0; b < 256; ++b) {
        model.add_token(b, alphabet.to_utf8[size_t(b)]);
        bytes_of.emplace_back(1, char(b));
    }
    Trainer t;
    for (const auto& [p, c] : pieces) {
        if (p.size() < 2) continue;  // nothing to merge
        std::vector<int> s(p.size());
        for (size_t i = 0; i < p.size(); ++i) s[i] = static_cast<unsigned char>(p[i]);
        t.words.push_back(std::move(s));
        t.counts.push_back(c);
    }
    t.init();
    int next_id = 256;
    uint64_t key;
    Progress progress("training a " + std::to_string(target) + "-token BPE tokenizer", double(target - next_id),
                      Progress::Unit::items);  // io/progress.h
    while (next_id < target && t.best(key)) {
        const int a = int(key >> 32), b = int(key & 0xffffffffu);
        const std::string bytes = bytes_of[size_t(a)] + bytes_of[size_t(b)];
        // Two merges may spell the same bytes (e.g. (ab, c) and (a, bc)): they share the token.
        int result = model.find(bytes);
        if (result < 0) {
            result = next_id++;
            std::string spelled;
            for (char c : bytes) spelled += alphabet.to_utf8[static_cast<unsigned char>(c)];
            model.add_token(result, spelled);
            bytes_of.push_back(bytes);
            progress.advance(1);
        }
        model.merges.set(a, b, {int(model.merge_list.size()), result});
        model.merge_list.push_back({a, b});
        t.merge(key, result);
    }
}

}  // namespace pv::tok
