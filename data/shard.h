// Token shards: the on-disk form of a tokenized corpus, one file per shard.
//
// Layout of version 2, the one written (every integer little-endian, no padding; the header is 32
// bytes):
//
// clang-format off
//   offset                size                 field
//   0                     8                    magic        "PVTOKENS" (ASCII, no terminator)
//   8                     4   u32              version      2
//   12                    4   u32              vocab_size   every token is < vocab_size
//   16                    4   u32              token_bytes  2 (vocab_size ≤ 65536) or 4
//   20                    4   u32              eot_token    the tokenizer's end-of-sequence token (EOS):
//                                                           what the loader pads packed windows with
//   24                    8   u64              count        number of tokens
//   32                    count × token_bytes  tokens       unsigned, token_bytes each
//   32 + count × tb       count × 1            flags        one byte per token, in token order:
//                                                             bit 0 (kTokenCounted)  the token counts as a
//                                                                   training target (a token predicting it
//                                                                   adds to the loss); clear: target -100
//                                                             bit 1 (kTokenStartsDocument)  a document
//                                                                   starts at this token
//                                                             bit 2 (kTokenSplittable)  the token's document
//                                                                   may be split across windows (plain
//                                                                   text); clear: it must be packed whole
//                                                                   into one window (a chat, a prompt and
//                                                                   completion), or dropped
//                                                             bits 3-7 zero
// clang-format on
//
// The file is exactly 32 + count × (token_bytes + 1) bytes. A document runs from a token with
// bit 1 to the token before the next one with bit 1; its first token's bit 2 holds for all of it
// (every token of a document has the same bit 2). A shard's first token need not start a
// document: the training data is the shards concatenated in order, so a document may continue
// from the previous shard.
//
// Version 1 (older builds wrote it; still read) is the same without the flags: the file is
// 32 + count × token_bytes bytes, every token counts, documents end at each eot_token (the next
// document starts after it) and every document is splittable. read_shard returns it with empty
// `flags`; the loader derives those meanings (data/loader.h).
//
// write_shard picks the narrowest width (2 bytes when every id fits, i.e. vocab_size ≤ 65536),
// writes `path.tmp`, fsyncs it and renames it over `path`, then fsyncs the directory, so a crash
// leaves either the old file or the complete new one under the final name, never half a shard.
// read_shard checks everything a corrupt, truncated or foreign file could get wrong (magic,
// version, width, size against the header's count, every token and the eot against vocab_size,
// every flags byte: no unknown bit, bit 2 constant within a document) and throws
// std::runtime_error naming the file, the problem and the fix: a shard is user input, and a bad
// token id would otherwise surface much later as an out-of-bounds embedding read. (A flipped
// bit 0 or 1 is a valid shard with another meaning; no format without a checksum can tell.)
// Host code only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

// The bits of a token's flags byte (version 2).
inline constexpr uint8_t kTokenCounted = 1u << 0;
inline constexpr uint8_t kTokenStartsDocument = 1u << 1;
inline constexpr uint8_t kTokenSplittable = 1u << 2;
inline constexpr uint8_t kTokenFlagBits = kTokenCounted | kTokenStartsDocument | kTokenSplittable;

struct TokenShard {
    uint32_t vocab_size = 0;
    uint32_t eot_token = 0;  // the end-of-sequence token (EOS)
    std::vector<uint32_t> tokens;
    // One byte per token (the bits above), or empty: version-1 meaning (every token counts,
    // documents end at eot_token, all splittable). write_shard needs one per token.
    std::vector<uint8_t> flags;
};

inline constexpr char kShardMagic[8] = {'P', 'V', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 2;
inline constexpr size_t kShardHeaderBytes = 32;

// 2 when every token id < vocab_size fits in 16 bits, else 4.
inline uint32_t shard_token_bytes(uint32_t vocab_size) { return vocab_size <= 65536u ? 2u : 4u; }

// The first problem with a flags array (an unknown bit, or a token whose bit 2 differs from the
// previous token's inside one document), as "token at index I ...", or empty when there is none.
std::string flags_problem(const std::vector<uint8_t>& flags);

// Atomically (tmp + fsync + rename) writes the shard as version 2. Throws std::runtime_error
// naming the path and the OS error, or the offending token if one is ≥ vocab_size, or when flags
// is not one valid byte per token (such a shard could not be read back).
void write_shard(const std::string& path, const TokenShard& shard);

// Reads and fully validates a shard of version 2 or 1 (empty flags); throws std::runtime_error
// naming the file, problem and fix.
TokenShard read_shard(const std::string& path);

}  // namespace pv
