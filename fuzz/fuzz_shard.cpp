// Fuzz target: token shards (data/shard.h), read and validated by read_shard; an accepted shard
// is written back (write_shard) and must read back to the same tokens, flags and tokenizer
// fingerprint — an exception or a difference there aborts (a finding). The checksum is re-signed
// (resigned, below).
#include "data/shard.h"
#include "fuzz/fuzz_target.h"

#include <vector>

namespace {

// Versions 3 and 4 keep an XXH3-64 of the header's other bytes and the payload in the header's last
// 8 bytes, which a mutated input almost never matches: it is recomputed (re-signed), so that the
// checks behind it are reached; every 16th input keeps its bytes, so the mismatch is fuzzed too.
std::vector<uint8_t> resigned(const uint8_t* data, size_t size) {
    std::vector<uint8_t> bytes(data, data + size);
    if (size < 12 || data[size / 2] % 16 == 0) return bytes;
    const uint32_t version = uint32_t(data[8]) | uint32_t(data[9]) << 8 | uint32_t(data[10]) << 16 |
                             uint32_t(data[11]) << 24;
    const size_t header = version == 3 ? pv::kShardV3HeaderBytes : version >= 4 ? pv::kShardHeaderBytes : 0;
    if (header == 0 || size < header) return bytes;
    pv::Xxh3 checksum;
    checksum.update(bytes.data(), header - 8);
    checksum.update(bytes.data() + header, size - header);
    const uint64_t digest = checksum.digest();
    for (int i = 0; i < 8; ++i) bytes[header - 8 + i] = uint8_t(digest >> (8 * i));
    return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::vector<uint8_t> input = resigned(data, size);
    const std::string path = pv::fuzz::write_scratch("train_000000.pvtokens", input.data(), input.size());
    pv::TokenShard shard;
    if (!pv::fuzz::accepts([&] { shard = pv::read_shard(path); })) return 0;
    if (shard.flags.empty()) return 0;  // version 1: written back it would become version 2
    const std::string again = (pv::fuzz::scratch_dir() / "again.pvtokens").string();
    pv::write_shard(again, shard);
    const pv::TokenShard back = pv::read_shard(again);
    if (back.tokens != shard.tokens || back.flags != shard.flags || back.vocab_size != shard.vocab_size ||
        back.eot_token != shard.eot_token || back.tokenizer != shard.tokenizer) {
        std::fprintf(stderr, "fuzz finding: the shard does not round-trip\n");
        std::abort();
    }
    return 0;
}
