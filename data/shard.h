// Token shards: the on-disk form of a tokenized corpus, one file per shard.
//
// Layout (every integer little-endian, no padding; the header is 32 bytes):
//
//   offset  size                 field
//   0       8                    magic        "PVTOKENS" (ASCII, no terminator)
//   8       4   u32              version      1
//   12      4   u32              vocab_size   every token is < vocab_size
//   16      4   u32              token_bytes  2 (vocab_size ≤ 65536) or 4
//   20      4   u32              eot_token    the end-of-text token that separates documents
//   24      8   u64              count        number of tokens
//   32      count × token_bytes  tokens       unsigned, token_bytes each
//
// The file is exactly 32 + count × token_bytes bytes. Documents are concatenated with eot_token
// between them; the shard does not record document boundaries otherwise.
//
// write_shard picks the narrowest width (2 bytes when every id fits, i.e. vocab_size ≤ 65536),
// writes `path.tmp`, fsyncs it and renames it over `path`, then fsyncs the directory, so a crash
// leaves either the old file or the complete new one under the final name, never half a shard.
// read_shard checks everything a corrupt, truncated or foreign file could get wrong (magic,
// version, width, size against the header's count, every token and the eot against vocab_size)
// and throws std::runtime_error naming the file, the problem and the fix: a shard is user input,
// and a bad token id would otherwise surface much later as an out-of-bounds embedding read.
// Host code only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

struct TokenShard {
    uint32_t vocab_size = 0;
    uint32_t eot_token = 0;
    std::vector<uint32_t> tokens;
};

inline constexpr char kShardMagic[8] = {'P', 'V', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 32;

// 2 when every token id < vocab_size fits in 16 bits, else 4.
inline uint32_t shard_token_bytes(uint32_t vocab_size) { return vocab_size <= 65536u ? 2u : 4u; }

// Atomically (tmp + fsync + rename) writes the shard. Throws std::runtime_error naming the path and
// the OS error, or the offending token if one is ≥ vocab_size (such a shard could not be read back).
void write_shard(const std::string& path, const TokenShard& shard);

// Reads and fully validates a shard; throws std::runtime_error naming the file, problem and fix.
TokenShard read_shard(const std::string& path);

}  // namespace pv
