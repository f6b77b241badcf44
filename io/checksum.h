// File checksums: XXH3 64-bit (xxHash, Debian libxxhash-dev), the one checksum of the project.
// Checkpoint files record theirs in trainer_state.json (trainer/state.h) as computed while they
// were written (io/durable_file.h WriteRecorder), and token shards carry theirs in the header
// (data/shard.h version 3). XXH3 hashes at memory bandwidth, so verifying a checkpoint costs its
// read, and 64 bits make an undetected corruption (any flipped bit, truncation, swapped bytes or
// edited header) a 2^-64 chance. Written as 16 lowercase hexadecimal digits. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pv {

// A running XXH3-64 (seed 0) over bytes given in any number of pieces: the same value as one
// call over their concatenation.
class Xxh3 {
  public:
    Xxh3();
    ~Xxh3();
    Xxh3(const Xxh3&) = delete;
    Xxh3& operator=(const Xxh3&) = delete;
    void update(const void* data, size_t bytes);
    uint64_t digest() const;

  private:
    void* state_;  // XXH3_state_t (kept out of this header)
};

// 16 lowercase hex digits.
std::string checksum_hex(uint64_t checksum);

// The value of 16 hex digits; throws std::runtime_error "<field> \"...\" is not 16 hexadecimal
// digits (an XXH3-64 checksum)" otherwise.
uint64_t parse_checksum_hex(const std::string& text, const std::string& field);

// What a file holds: its size and checksum.
struct FileDigest {
    uint64_t bytes = 0;
    uint64_t xxh3 = 0;
};

// Reads the regular file `path` once, in bounded pieces (io/input_file.h); throws naming kind and path.
FileDigest digest_file(const std::string& path, const std::string& kind);

}  // namespace pv
