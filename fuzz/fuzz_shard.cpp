// Fuzz target: token shards (data/shard.h), read and validated by read_shard; an accepted shard
// is written back (write_shard) and must read back to the same tokens, flags and tokenizer
// fingerprint — an exception or a difference there aborts (a finding).
#include "data/shard.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::string path = pv::fuzz::write_scratch("train_000000.pvtokens", data, size);
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
