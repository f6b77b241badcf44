// The data loader; the order and batch semantics are described in data/loader.h.
#include "data/loader.h"

#include <algorithm>
#include <random>
#include <stdexcept>

namespace pv {
namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The mt19937_64 seed of epoch e: a hash of (seed, e), so neighbouring seeds or epochs give
// unrelated streams.
uint64_t epoch_seed(uint64_t seed, long long epoch) {
    return splitmix64(splitmix64(seed) ^ splitmix64(0x5DEECE66Dull + static_cast<uint64_t>(epoch)));
}

// Uniform in [0, bound] by rejection on the raw 64-bit output: portable, unlike
// std::uniform_int_distribution, whose algorithm differs between standard libraries.
uint64_t uniform_upto(std::mt19937_64& rng, uint64_t bound) {
    if (bound == ~0ull) return rng();
    const uint64_t range = bound + 1;
    const uint64_t limit = ~0ull - (~0ull % range + 1) % range;  // largest multiple of range, minus 1
    uint64_t x;
    do x = rng();
    while (x > limit);
    return x % range;
}

std::string batch_mismatch(const BatchGeometry& g) {
    const long long product = 1LL * g.micro_batch * g.accumulation * g.world;
    return "--batch " + std::to_string(g.global_batch) + " is not --micro-batch " + std::to_string(g.micro_batch) +
           " × accumulation " + std::to_string(g.accumulation) + " × ranks " + std::to_string(g.world) + " = " +
           std::to_string(product) + ": set --batch " + std::to_string(product) +
           ", or --micro-batch/--accumulation so that their product with the rank count is " +
           std::to_string(g.global_batch);
}

void require_positive(std::vector<std::string>& errors, const char* flag, int v) {
    if (v <= 0)
        errors.push_back(std::string(flag) + " is " + std::to_string(v) + ": it must be a positive integer");
}

}  // namespace

std::vector<std::string> validate(const BatchGeometry& g) {
    std::vector<std::string> errors;
    require_positive(errors, "--batch (sequences per optimizer step over all ranks)", g.global_batch);
    require_positive(errors, "--micro-batch (sequences per forward pass on one rank)", g.micro_batch);
    require_positive(errors, "--accumulation (micro-steps per optimizer step)", g.accumulation);
    require_positive(errors, "the data-parallel rank count (mpirun -np)", g.world);
    if (errors.empty() && 1LL * g.micro_batch * g.accumulation * g.world != g.global_batch)
        errors.push_back(batch_mismatch(g));
    return errors;
}

int accumulation_for(int global_batch, int micro_batch, int world) {
    std::vector<std::string> errors;
    require_positive(errors, "--batch (sequences per optimizer step over all ranks)", global_batch);
    require_positive(errors, "--micro-batch (sequences per forward pass on one rank)", micro_batch);
    require_positive(errors, "the data-parallel rank count (mpirun -np)", world);
    if (!errors.empty()) {
        std::string all;
        for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e;
        throw std::invalid_argument(all);
    }
    const long long per_step = 1LL * micro_batch * world;
    if (global_batch % per_step != 0) {
        const long long below = global_batch / per_step * per_step, above = below + per_step;
        std::string choices =
            below > 0 ? std::to_string(below) + " or " + std::to_string(above) : std::to_string(above);
        throw std::invalid_argument("--batch " + std::to_string(global_batch) + " is not --micro-batch " +
                                    std::to_string(micro_batch) + " × accumulation k × ranks " + std::to_string(world) +
                                    " for any whole k (--micro-batch × ranks = " + std::to_string(per_step) +
                                    " does not divide " + std::to_string(global_batch) +
                                    "): set --batch to a multiple of " + std::to_string(per_step) + " (e.g. " +
                                    choices + "), or a --micro-batch whose product with the rank count divides " +
                                    std::to_string(global_batch));
    }
    return static_cast<int>(global_batch / per_step);
}

DataLoader::DataLoader(std::vector<TokenShard> shards, int seq_len, uint64_t seed, bool document_mask)
    : shards_(std::move(shards)), seq_len_(seq_len), seed_(seed), document_mask_(document_mask) {
    if (seq_len_ < 1)
        throw std::invalid_argument("sequence length " + std::to_string(seq_len_) + " must be at least 1");
    for (size_t i = 0; i < shards_.size(); ++i) {
        if (i > 0 && shards_[i].vocab_size != shards_[0].vocab_size)
            throw std::invalid_argument("shard " + std::to_string(i) + " has vocab_size " +
                                        std::to_string(shards_[i].vocab_size) + " but shard 0 has " +
                                        std::to_string(shards_[0].vocab_size) +
                                        ": all shards must come from the same tokenizer");
        if (!shards_[i].flags.empty() && shards_[i].flags.size() != shards_[i].tokens.size())
            throw std::invalid_argument("shard " + std::to_string(i) + " has " +
                                        std::to_string(shards_[i].flags.size()) + " flags for " +
                                        std::to_string(shards_[i].tokens.size()) +
                                        " tokens: give every token its flags byte, or none (version-1 meaning)");
        offsets_.push_back(total_);
        total_ += static_cast<long long>(shards_[i].tokens.size());
    }
    if (!shards_.empty()) vocab_size_ = shards_[0].vocab_size, pad_token_ = int(shards_[0].eot_token);

    // The stream's flags; a shard without them: all counted and splittable, a document starting
    // after each eot_token (which may end the previous shard).
    flags_.reserve(size_t(total_));
    bool after_eot = true;
    for (size_t i = 0; i < shards_.size(); ++i) {
        TokenShard& s = shards_[i];
        if (!s.flags.empty()) {
            // A document continued from the previous shard keeps its splittable bit.
            if (!flags_.empty() && !(s.flags[0] & kTokenStartsDocument) &&
                (s.flags[0] & kTokenSplittable) != (flags_.back() & kTokenSplittable))
                throw std::invalid_argument("shard " + std::to_string(i) +
                                            " continues the previous shard's last document, but one says it may be "
                                            "split and the other not: the shards come from different runs; re-run "
                                            "`train prepare` into an empty directory");
            flags_.insert(flags_.end(), s.flags.begin(), s.flags.end());
            std::vector<uint8_t>().swap(s.flags);  // kept once, in flags_
        } else {
            for (uint32_t t : s.tokens) {
                flags_.push_back(uint8_t(kTokenCounted | kTokenSplittable | (after_eot ? kTokenStartsDocument : 0)));
                after_eot = t == s.eot_token;
            }
        }
        if (!s.tokens.empty()) after_eot = s.tokens.back() == s.eot_token;
    }
    if (!flags_.empty()) flags_[0] |= kTokenStartsDocument;

    for (long long p = 0; p < total_; ++p) {
        if (!(flags_[size_t(p)] & kTokenStartsDocument)) continue;
        ++counts_.documents;
        counts_.unsplittable_documents += !(flags_[size_t(p)] & kTokenSplittable);
    }
    if (counts_.unsplittable_documents == 0) {
        kept_.push_back({0, 0, total_});
        windows_ = total_ > 0 ? (total_ - 1) / seq_len_ : 0;
        if (windows_ == 0)
            throw std::invalid_argument("the data has " + std::to_string(total_) + " tokens; a sequence length of " +
                                        std::to_string(seq_len_) + " needs at least " + std::to_string(seq_len_ + 1LL) +
                                        ": add data or lower the sequence length");
    } else {
        pack();
        if (windows_ == 0)
            throw std::invalid_argument(
                "the data gives no window of " + std::to_string(seq_len_ + 1LL) + " tokens: " +
                std::to_string(counts_.dropped_documents) + " of its " + std::to_string(counts_.documents) +
                " documents are chats or prompts longer than that (dropped), and the rest hold " +
                std::to_string(total_ - counts_.dropped_tokens) +
                " tokens: raise the sequence length (--seq-len) or add data");
    }
    counts_.targets = windows_ * seq_len_;
    count_targets();
}

// Greedy packing in stream order (data/loader.h): windows of the kept stream, at most T+1 long.
void DataLoader::pack() {
    const long long room = seq_len_ + 1LL;
    long long kept = 0;             // kept-stream position of the next kept document
    long long start = 0, fill = 0;  // the open window: kept-stream start and tokens in it
    const auto close = [&] {        // closes the open window (padded when not full)
        if (fill >= 2) {            // a single token has no target: nothing to train on
            window_start_.push_back(start);
            window_length_.push_back(int(fill));
            counts_.padding_tokens += room - fill;
        }
        fill = 0;
    };
    for (long long begin = 0; begin < total_;) {
        long long end = begin + 1;
        while (end < total_ && !(flags_[size_t(end)] & kTokenStartsDocument)) ++end;
        const long long length = end - begin;
        const bool splittable = flags_[size_t(begin)] & kTokenSplittable;
        if (!splittable && length > room) {
            ++counts_.dropped_documents;
            counts_.dropped_tokens += length;
            begin = end;
            continue;
        }
        if (!kept_.empty() && kept_.back().stream + kept_.back().length == begin)
            kept_.back().length += length;
        else
            kept_.push_back({kept, begin, length});
        if (!splittable) {
            if (fill + length > room) close();
            if (fill == 0) start = kept;
            fill += length;
            if (fill == room) close();
        } else {
            for (long long p = kept, left = length; left > 0;) {
                if (fill == 0) start = p;
                const long long take = std::min(left, room - fill);
                fill += take, p += take, left -= take;
                if (fill == room) {
                    close();
                    if (left > 0) start = p - 1, fill = 1;  // the text goes on: overlap by one token
                }
            }
        }
        kept += length;
        begin = end;
    }
    close();
    windows_ = static_cast<long long>(window_start_.size());
}

void DataLoader::count_targets() {
    const auto counts = [&](uint8_t f) {
        return (f & kTokenCounted) && !(document_mask_ && (f & kTokenStartsDocument));
    };
    if (!packed()) {  // the targets are stream positions 1 .. W·T
        for (long long p = 1; p <= windows_ * seq_len_; ++p) counts_.counted_targets += counts(flags_[size_t(p)]);
        return;
    }
    std::vector<int> tokens(size_t(seq_len_) + 1);
    std::vector<uint8_t> flags(tokens.size());
    for (long long k = 0; k < windows_; ++k) {
        copy_kept(window_start_[size_t(k)], window_length_[size_t(k)], tokens.data(), flags.data());
        for (int i = 1; i < window_length_[size_t(k)]; ++i) counts_.counted_targets += counts(flags[size_t(i)]);
    }
}

long long DataLoader::window_of(long long g) const {
    if (g < 0) throw std::invalid_argument("global sample index " + std::to_string(g) + " is negative");
    const long long epoch = g / windows_;
    if (epoch != cached_epoch_) {
        perm_.resize(static_cast<size_t>(windows_));
        for (long long i = 0; i < windows_; ++i) perm_[i] = i;
        std::mt19937_64 rng(epoch_seed(seed_, epoch));
        for (long long i = windows_ - 1; i > 0; --i)
            std::swap(perm_[i], perm_[uniform_upto(rng, static_cast<uint64_t>(i))]);
        cached_epoch_ = epoch;
    }
    return perm_[g % windows_];
}

void DataLoader::copy_tokens(long long start, long long n, int* out) const {
    // The shard holding `start`: the last one whose offset is ≤ start (empty shards are skipped
    // naturally because the next one shares their offset).
    size_t s = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), start) - offsets_.begin()) - 1;
    long long pos = start - offsets_[s];
    while (n > 0) {
        const auto& tokens = shards_[s].tokens;
        const long long take = std::min<long long>(n, static_cast<long long>(tokens.size()) - pos);
        for (long long i = 0; i < take; ++i) *out++ = static_cast<int>(tokens[static_cast<size_t>(pos + i)]);
        n -= take;
        pos = 0;
        ++s;
    }
}

void DataLoader::copy_kept(long long start, long long n, int* tokens, uint8_t* flags) const {
    // The kept run holding `start`: the last one that begins at or before it.
    size_t r = size_t(std::upper_bound(kept_.begin(), kept_.end(), start,
                                       [](long long v, const KeptRun& run) { return v < run.kept; }) -
                      kept_.begin()) -
               1;
    long long pos = start - kept_[r].kept;
    while (n > 0) {
        const long long take = std::min(n, kept_[r].length - pos);
        const long long from = kept_[r].stream + pos;
        copy_tokens(from, take, tokens);
        std::copy(flags_.begin() + from, flags_.begin() + from + take, flags);
        tokens += take, flags += take, n -= take;
        pos = 0;
        ++r;
    }
}

void DataLoader::window(long long k, int* inputs, int* targets, int* positions) const {
    if (k < 0 || k >= windows_)
        throw std::invalid_argument("window " + std::to_string(k) + " is outside [0, " + std::to_string(windows_) +
                                    ")");
    const int T = seq_len_;
    const int length = packed() ? window_length_[size_t(k)] : T + 1;
    std::vector<int> tokens(size_t(T) + 1, pad_token_);
    std::vector<uint8_t> flags(tokens.size(), 0);
    copy_kept(packed() ? window_start_[size_t(k)] : k * T, length, tokens.data(), flags.data());
    for (int i = 0; i < T; ++i) {
        inputs[i] = tokens[size_t(i)];
        const uint8_t next = flags[size_t(i) + 1];  // padding: 0, never counted
        const bool counted = (next & kTokenCounted) && !(document_mask_ && (next & kTokenStartsDocument));
        targets[i] = counted ? tokens[size_t(i) + 1] : kIgnoreTarget;
    }
    if (document_mask_ && positions)
        for (int i = 0, p = 0; i < T; ++i, ++p) {
            if (i == length || (i < length && (flags[size_t(i)] & kTokenStartsDocument))) p = 0;
            positions[i] = p;
        }
}

DataLoader::MicroBatch DataLoader::micro_batch(long long step, int micro_step, const BatchGeometry& g, int rank) const {
    const auto errors = validate(g);
    if (!errors.empty()) {
        std::string all;
        for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e;
        throw std::invalid_argument(all);
    }
    if (step < 0) throw std::invalid_argument("step " + std::to_string(step) + " is negative");
    if (micro_step < 0 || micro_step >= g.accumulation)
        throw std::invalid_argument("micro-step " + std::to_string(micro_step) + " is outside [0, accumulation " +
                                    std::to_string(g.accumulation) + ")");
    if (rank < 0 || rank >= g.world)
        throw std::invalid_argument("rank " + std::to_string(rank) + " is outside [0, ranks " +
                                    std::to_string(g.world) + ")");
    const long long per_rank = g.global_batch / g.world;
    const long long first = step * g.global_batch + rank * per_rank + 1LL * micro_step * g.micro_batch;
    const size_t T = static_cast<size_t>(seq_len_);
    MicroBatch mb;
    mb.first_sample = first;
    mb.inputs.resize(static_cast<size_t>(g.micro_batch) * T);
    mb.targets.resize(mb.inputs.size());
    if (document_mask_) mb.positions.resize(mb.inputs.size());
    for (int i = 0; i < g.micro_batch; ++i)
        window(window_of(first + i), mb.inputs.data() + i * T, mb.targets.data() + i * T,
               document_mask_ ? mb.positions.data() + i * T : nullptr);
    return mb;
}

}  // namespace pv
