// Token shard writer and reader; the format is described in data/shard.h.
#include "data/shard.h"

#include "io/checksum.h"
#include "io/durable_file.h"
#include "io/input_file.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>

namespace pv {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw std::runtime_error("token shard '" + path + "': " + what);
}

void put_u32(unsigned char* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
uint64_t get_u64(const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

// The header's size in a version.
size_t header_bytes_of(uint32_t version) {
    return version >= 4 ? kShardHeaderBytes : version == 3 ? kShardV3HeaderBytes : kShardV2HeaderBytes;
}

// Where the header keeps its checksum (versions 3 and 4): its last 8 bytes, after every field
// the checksum covers.
size_t checksum_offset(uint32_t version) { return header_bytes_of(version) - 8; }

// Bytes a version-1 to 4 file of `count` tokens has after the header; false on overflow.
bool payload_bytes(uint32_t version, uint64_t count, uint32_t width, uint64_t& out) {
    const uint64_t per_token = width + (version >= 2 ? 1u : 0u);
    if (count > UINT64_MAX / per_token) return false;
    out = count * per_token;
    return true;
}

}  // namespace

namespace {

// flags_problem of flags[0, n), numbered from `base`, after a token whose flags byte is *previous
// (null: none, the first token of the shard).
std::string flags_problem_in(const uint8_t* flags, size_t n, const uint8_t* previous, uint64_t base) {
    for (size_t i = 0; i < n; ++i) {
        const uint8_t f = flags[i];
        const uint8_t* before = i > 0 ? &flags[i - 1] : previous;
        if (f & ~kTokenFlagBits)
            return "token at index " + std::to_string(base + i) + " has flags byte " + std::to_string(f) +
                   " with bits other than 0-2 set (bits 3-7 are always zero)";
        if (before && !(f & kTokenStartsDocument) && (f & kTokenSplittable) != (*before & kTokenSplittable))
            return "token at index " + std::to_string(base + i) + " is inside a document but its splittable bit (2) " +
                   "differs from the previous token's (a document is splittable or not as a whole)";
    }
    return "";
}

}  // namespace

std::string flags_problem(const std::vector<uint8_t>& flags) {
    return flags_problem_in(flags.data(), flags.size(), nullptr, 0);
}

void write_shard(const std::string& path, const TokenShard& shard) {
    if (shard.flags.size() != shard.tokens.size())
        fail(path, "has " + std::to_string(shard.flags.size()) + " flags bytes for " +
                       std::to_string(shard.tokens.size()) + " tokens; give every token its flags byte");
    write_shard_streamed(path, shard.vocab_size, shard.eot_token, shard.tokenizer, shard.tokens.size(),
                         [&](uint64_t begin, size_t n, uint32_t* tokens, uint8_t* flags) {
                             std::copy_n(shard.tokens.begin() + long(begin), n, tokens);
                             std::copy_n(shard.flags.begin() + long(begin), n, flags);
                         });
}

void write_shard_streamed(const std::string& path, uint32_t vocab_size, uint32_t eot_token, uint64_t tokenizer,
                          uint64_t count, const ShardReader& read) {
    if (vocab_size == 0) fail(path, "vocab_size is 0; set it to the tokenizer's vocabulary size");
    if (eot_token >= vocab_size)
        fail(path, "eot_token " + std::to_string(eot_token) + " is not below vocab_size " +
                       std::to_string(vocab_size) + "; use the tokenizer's end-of-text id");
    if (vocab_size > kMaxShardVocab)
        fail(path, "vocab_size " + std::to_string(vocab_size) + " is above the largest vocabulary (" +
                       std::to_string(kMaxShardVocab) + ")");

    const uint32_t width = shard_token_bytes(vocab_size);
    unsigned char header[kShardHeaderBytes];
    std::memcpy(header, kShardMagic, 8);
    put_u32(header + 8, kShardVersion);
    put_u32(header + 12, vocab_size);
    put_u32(header + 16, width);
    put_u32(header + 20, eot_token);
    put_u64(header + 24, count);
    put_u64(header + 32, tokenizer);

    // The payload is produced twice, in bounded pieces: once for the header's checksum (checking
    // every token and flags byte on the way), once to write; no full-size buffer is ever needed.
    const size_t piece = size_t(1) << 20;
    std::vector<uint32_t> tokens(size_t(std::min<uint64_t>(count, piece)));
    std::vector<uint8_t> flags(tokens.size());
    std::vector<unsigned char> bytes(tokens.size() * width);
    const auto produce = [&](bool check, const std::function<void(const unsigned char*, size_t)>& out) {
        uint8_t previous = 0;  // the flags byte before the piece, for flags_problem's document rule
        for (uint64_t begin = 0; begin < count; begin += piece) {
            const size_t n = size_t(std::min<uint64_t>(count - begin, piece));
            read(begin, n, tokens.data(), flags.data());
            unsigned char* p = bytes.data();
            for (size_t i = 0; i < n; ++i, p += width) {
                const uint32_t t = tokens[i];
                if (check && t >= vocab_size)
                    fail(path, "token at index " + std::to_string(begin + i) + " is " + std::to_string(t) +
                                   ", not below vocab_size " + std::to_string(vocab_size) +
                                   "; the tokens and the vocabulary size do not belong together");
                p[0] = static_cast<unsigned char>(t);
                p[1] = static_cast<unsigned char>(t >> 8);
                if (width == 4) {
                    p[2] = static_cast<unsigned char>(t >> 16);
                    p[3] = static_cast<unsigned char>(t >> 24);
                }
            }
            if (check) {
                if (const std::string problem =
                        flags_problem_in(flags.data(), n, begin > 0 ? &previous : nullptr, begin);
                    !problem.empty())
                    fail(path, problem + "; fix the flags before writing");
                previous = flags[n - 1];
            }
            out(bytes.data(), n * width);
        }
        for (uint64_t begin = 0; begin < count; begin += piece) {
            const size_t n = size_t(std::min<uint64_t>(count - begin, piece));
            read(begin, n, tokens.data(), flags.data());
            out(flags.data(), n);
        }
    };
    const size_t checksum_at = checksum_offset(kShardVersion);
    Xxh3 checksum;
    checksum.update(header, checksum_at);
    produce(true, [&](const unsigned char* data, size_t n) { checksum.update(data, n); });
    put_u64(header + checksum_at, checksum.digest());

    write_file_atomically(path, "token shard", [&](const ByteSink& sink) {
        sink(header, sizeof header);
        produce(false, [&](const unsigned char* data, size_t n) { sink(data, n); });
    });
}

namespace {

// What to do with a file that is not a shard: text and JSON lines are what `train prepare` reads.
std::string not_a_shard_fix(const std::string& path, const unsigned char* head, size_t n) {
    bool text = n > 0;
    for (size_t i = 0; i < n; ++i) text = text && (head[i] >= 0x20 || head[i] == '\n' || head[i] == '\r' || head[i] == '\t' || head[i] >= 0x80);
    if (text)
        return "; it looks like text or JSON lines: tokenize it first with `train prepare " + path +
               " --tokenizer MODEL/tokenizer.json --out DIR` (or --vocab N to train a tokenizer), then pass DIR";
    return "; pass a directory made by `train prepare`, or one of its .pvtokens files";
}

}  // namespace

TokenShard read_shard(const std::string& path) {
    const InputFile f =
        open_input_file(path, "token shard", "check the path; shards are made by the data preparation step");
    const uint64_t size = f.size();

    const std::string recreate = "; re-create the shard with the data preparation step";
    if (size < kShardV2HeaderBytes) {
        // Too short for a header: say which problem it is if the magic is already wrong.
        unsigned char head[8] = {};
        f.read_exact(head, static_cast<size_t>(std::min<uint64_t>(size, 8)));
        if (size < 8 || std::memcmp(head, kShardMagic, 8) != 0)
            fail(path, "not a polevault token shard (" + std::to_string(size) + " bytes, no \"PVTOKENS\" header)" +
                           not_a_shard_fix(path, head, size_t(std::min<uint64_t>(size, 8))));
        fail(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                       std::to_string(kShardV2HeaderBytes) + "-byte header" + recreate);
    }
    unsigned char header[kShardHeaderBytes];
    f.read_exact(header, kShardV2HeaderBytes);
    if (std::memcmp(header, kShardMagic, 8) != 0)
        fail(path, "not a polevault token shard (the first 8 bytes are not \"PVTOKENS\")" +
                       not_a_shard_fix(path, header, kShardV2HeaderBytes));
    const uint32_t version = get_u32(header + 8);
    const uint32_t vocab = get_u32(header + 12);
    const uint32_t width = get_u32(header + 16);
    const uint32_t eot = get_u32(header + 20);
    const uint64_t count = get_u64(header + 24);
    if (version < 1 || version > kShardVersion)
        fail(path, "unsupported shard version " + std::to_string(version) + " (this build reads versions 1 to " +
                       std::to_string(kShardVersion) + ")" + recreate + " of this build");
    const size_t header_bytes = header_bytes_of(version);
    if (size < header_bytes)
        fail(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " + std::to_string(header_bytes) +
                       "-byte header of version " + std::to_string(version) + recreate);
    f.read_exact(header + kShardV2HeaderBytes, header_bytes - kShardV2HeaderBytes);
    if (vocab == 0 || vocab > kMaxShardVocab)
        fail(path, "header field vocab_size is " + std::to_string(vocab) + ", outside 1.." +
                       std::to_string(kMaxShardVocab) + " (no tokenizer has that many tokens); the header is corrupt" +
                       recreate);
    if (width != 2 && width != 4)
        fail(path,
             "bad token width " + std::to_string(width) + " bytes (must be 2 or 4); the header is corrupt" + recreate);
    if (width == 2 && vocab > 65536)
        fail(path, "bad token width 2 bytes for vocab_size " + std::to_string(vocab) +
                       " (ids above 65535 need 4 bytes); the header is corrupt" + recreate);
    if (eot >= vocab)
        fail(path, "eot_token " + std::to_string(eot) + " is not below vocab_size " + std::to_string(vocab) +
                       "; the header is corrupt" + recreate);

    const uint64_t payload = size - header_bytes;
    uint64_t expected = 0;
    const bool overflow = !payload_bytes(version, count, width, expected);  // does not fit in 64 bits
    const std::string per_token =
        version >= 2 ? " × (" + std::to_string(width) + " + 1 flags byte)" : " × " + std::to_string(width);
    if (overflow || payload < expected)
        fail(path, "truncated: the header says " + std::to_string(count) + " tokens" + per_token + " bytes" +
                       (overflow ? "" : " = " + std::to_string(expected) + " bytes") +
                       " after the header, but the file has only " + std::to_string(payload) +
                       " (was its writing interrupted?)" + recreate);
    if (payload > expected)
        fail(path, "oversized: the header says " + std::to_string(count) + " tokens" + per_token +
                       " bytes = " + std::to_string(expected) + " bytes after the header, but the file has " +
                       std::to_string(payload) + " (" + std::to_string(payload - expected) +
                       " extra); the file is corrupt or was appended to" + recreate);

    // Only now, with count known to fit the file, is anything allocated.
    const size_t checksum_at = checksum_offset(version);
    Xxh3 checksum;
    checksum.update(header, checksum_at);
    TokenShard shard;
    shard.vocab_size = vocab;
    shard.eot_token = eot;
    shard.tokenizer = version >= 4 ? get_u64(header + 32) : 0;
    shard.tokens.resize(static_cast<size_t>(count));
    // A token id is checked after the checksum: a corrupt byte is reported as corruption, not as
    // a tokenizer mismatch.
    std::optional<std::pair<size_t, uint32_t>> out_of_range;
    std::vector<unsigned char> buf;
    const size_t chunk = size_t(1) << 20;
    for (size_t begin = 0; begin < shard.tokens.size(); begin += chunk) {
        const size_t end = std::min(shard.tokens.size(), begin + chunk);
        buf.resize((end - begin) * width);
        f.read_exact(buf.data(), buf.size());
        checksum.update(buf.data(), buf.size());
        const unsigned char* p = buf.data();
        for (size_t i = begin; i < end; ++i, p += width) {
            const uint32_t t = width == 2 ? uint32_t(p[0]) | uint32_t(p[1]) << 8 : get_u32(p);
            if (t >= vocab && !out_of_range) out_of_range = {i, t};
            shard.tokens[i] = t;
        }
    }
    if (version >= 2) {
        shard.flags.resize(static_cast<size_t>(count));
        f.read_exact(shard.flags.data(), shard.flags.size());
        checksum.update(shard.flags.data(), shard.flags.size());
    }
    if (version >= 3 && checksum.digest() != get_u64(header + checksum_at))
        fail(path, "checksum mismatch: the header records XXH3 " + checksum_hex(get_u64(header + checksum_at)) +
                       " but the file's bytes hash to " + checksum_hex(checksum.digest()) +
                       ": the file was corrupted (a flipped bit, an overwritten byte) after it was written" + recreate);
    if (out_of_range)
        fail(path, "token at index " + std::to_string(out_of_range->first) + " is " +
                       std::to_string(out_of_range->second) + ", not below vocab_size " + std::to_string(vocab) +
                       "; the shard is corrupt or was made with another tokenizer" + recreate +
                       " and the matching tokenizer");
    if (const std::string problem = flags_problem(shard.flags); !problem.empty())
        fail(path, "corrupt flags: " + problem + recreate);
    return shard;
}

}  // namespace pv
