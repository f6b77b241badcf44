// Token shards: the on-disk form of a tokenized corpus, one file per shard.
//
// Layout of version 4, the one written (every integer little-endian, no padding; the header is 48
// bytes):
//
// clang-format off
//   offset                size                 field
//   0                     8                    magic        "PVTOKENS" (ASCII, no terminator)
//   8                     4   u32              version      4
//   12                    4   u32              vocab_size   every token is < vocab_size (at most 2^31 - 1:
//                                                           the model's vocabulary is a signed 32-bit count)
//   16                    4   u32              token_bytes  2 (vocab_size ≤ 65536) or 4
//   20                    4   u32              eot_token    the tokenizer's end-of-sequence token (EOS):
//                                                           what the loader pads packed windows with
//   24                    8   u64              count        number of tokens
//   32                    8   u64              tokenizer    Tokenizer::id_fingerprint() of the tokenizer the
//                                                           tokens were made with (what every id means),
//                                                           or 0: not recorded
//   40                    8   u64              checksum     XXH3-64 (io/checksum.h) of bytes 0-39 followed by
//                                                           every byte after the header: the whole file
//                                                           but this field
//   48                    count × token_bytes  tokens       unsigned, token_bytes each
//   48 + count × tb       count × 1            flags        one byte per token, in token order:
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
// The file is exactly 48 + count × (token_bytes + 1) bytes. A document runs from a token with
// bit 1 to the token before the next one with bit 1; its first token's bit 2 holds for all of it
// (every token of a document has the same bit 2). A shard's first token need not start a
// document: the training data is the shards concatenated in order, so a document may continue
// from the previous shard.
//
// Older versions are still read. Version 3 is version 4 without the tokenizer field: a 40-byte
// header whose bytes 32-39 are the checksum (of bytes 0-31 and everything after the header).
// Version 2 is version 3 without the checksum: a 32-byte header (bytes 0-31 above), then the
// tokens and flags; nothing to verify beyond the structure. Version 1 is version 2 without the
// flags: the file is 32 + count × token_bytes bytes, every token counts, documents end at each
// eot_token (the next document starts after it) and every document is splittable. read_shard returns it with empty
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
// bit 0 or 1 is a valid shard with another meaning, which only the checksum of versions 3 and 4
// catches: it is verified while the tokens are read, so any flipped bit or overwritten byte is
// refused.) The file
// is opened as user input (io/input_file.h: a FIFO or directory named like a shard is refused, not
// waited on), and the count is checked against the file's size before anything is allocated.
// Host code only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pv {

// The bits of a token's flags byte (versions 2 and 3).
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
    // Tokenizer::id_fingerprint() of the tokenizer that made the tokens; 0: not recorded (a shard
    // written without one, or read from a version before 4). train checks it against the
    // tokenizers it is given (trainer/run_data.h).
    uint64_t tokenizer = 0;
};

inline constexpr char kShardMagic[8] = {'P', 'V', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 4;
inline constexpr size_t kShardHeaderBytes = 48;    // version 4
inline constexpr size_t kShardV3HeaderBytes = 40;  // version 3
inline constexpr size_t kShardV2HeaderBytes = 32;  // versions 1 and 2
inline constexpr uint32_t kMaxShardVocab = 0x7fffffffu;

// 2 when every token id < vocab_size fits in 16 bits, else 4.
inline uint32_t shard_token_bytes(uint32_t vocab_size) { return vocab_size <= 65536u ? 2u : 4u; }

// The first problem with a flags array (an unknown bit, or a token whose bit 2 differs from the
// previous token's inside one document), as "token at index I ...", or empty when there is none.
std::string flags_problem(const std::vector<uint8_t>& flags);

// Atomically (tmp + fsync + rename) writes the shard as version 4. Throws std::runtime_error
// naming the path and the OS error, or the offending token if one is ≥ vocab_size, or when flags
// is not one valid byte per token (such a shard could not be read back).
void write_shard(const std::string& path, const TokenShard& shard);

// write_shard of a shard too large to hold: `count` tokens that read(begin, n, tokens, flags)
// gives, n ≤ 2^20 at a time (each range is asked for several times, so it must give the same
// values each time). The file is byte-identical to write_shard's of the same tokens and flags.
using ShardReader = std::function<void(uint64_t begin, size_t n, uint32_t* tokens, uint8_t* flags)>;
void write_shard_streamed(const std::string& path, uint32_t vocab_size, uint32_t eot_token, uint64_t tokenizer,
                          uint64_t count, const ShardReader& read);

// Reads and fully validates a shard of version 4, 3, 2 or 1 (a tokenizer fingerprint in version 4
// only, a checksum from version 3, empty flags in version 1); throws std::runtime_error naming
// the file, problem and fix.
TokenShard read_shard(const std::string& path);

}  // namespace pv
