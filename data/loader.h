// The training data loader: fixed-length windows of the token stream, in a shuffled order that
// depends only on (seed, global sample index), and the batch geometry that splits them over
// micro-steps and data-parallel ranks.
//
// Windows. The shards' tokens are concatenated (in the order given) into one stream of N tokens.
// Window k is the T+1 tokens starting at k·T; its inputs are the first T and its targets the same
// tokens shifted by one (targets[i] = stream[k·T + i + 1]), so consecutive windows overlap by one
// token: the last target of window k is the first input of window k+1, and each of the tokens at
// positions 1 .. W·T is a target exactly once per epoch. There are W = (N − 1) / T windows; the tail that does
// not fill a window is unused. Windows cross document (EOT) and shard boundaries, as in GPT-2 /
// llm.c pre-training: the EOT token is just another token the model learns to predict across.
//
// Order. Global sample g (counted from the start of training, across steps, micro-steps and
// ranks) belongs to epoch e = g / W and is window perm_e[g mod W], where perm_e is a Fisher-Yates
// shuffle of [0, W) driven by std::mt19937_64 seeded with splitmix64-hash(seed, e). The bounded
// draws are done here (rejection sampling on the raw 64-bit output), not by
// std::uniform_int_distribution, whose algorithm the standard leaves to the library, so the order
// is the same on every platform. Each epoch visits every window exactly once.
//
// Batches (DESIGN.md §4). --batch B is the global number of sequences per optimizer step:
// B = micro_batch × accumulation × world. Step s consumes global samples [s·B, (s+1)·B); rank r
// takes the contiguous slice [r·B/world, (r+1)·B/world), and its micro-step j the micro_batch
// consecutive samples starting j·micro_batch into that slice. The ranks therefore read disjoint
// windows that together make up the global batch, and the samples of a step — hence the training
// trajectory, up to summation order — do not depend on how B is factored across ranks and
// micro-steps.
//
// Resuming. Addressing is stateless: micro_batch(step, ...) is a pure function of (shards,
// seq_len, seed, step, micro_step, geometry, rank). A checkpoint's loader position is just the
// step number; nothing else needs saving, and a run may resume on a different world size as
// long as B is unchanged.
//
// A validation set is a separate shard loaded the same way (its own DataLoader).
// Host code only. A DataLoader caches the current epoch's permutation, so one object must not be
// used from several threads at once (give each thread its own; they agree).
#pragma once

#include "data/shard.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pv {

struct BatchGeometry {
    int global_batch = 0;  // --batch: sequences per optimizer step, over all ranks
    int micro_batch = 0;   // --micro-batch: sequences per forward/backward on one rank
    int accumulation = 0;  // --accumulation: micro-steps per optimizer step
    int world = 0;         // data-parallel ranks
};

// Every problem with g, each message naming the flag and the fix; empty when valid.
std::vector<std::string> validate(const BatchGeometry& g);

// The accumulation that makes global_batch = micro_batch × accumulation × world; throws
// std::invalid_argument saying what to change when there is none (or a value is not positive).
int accumulation_for(int global_batch, int micro_batch, int world);

class DataLoader {
  public:
    // Throws std::invalid_argument if seq_len < 1, the shards disagree on vocab_size, or the data
    // has fewer than seq_len + 1 tokens.
    DataLoader(std::vector<TokenShard> shards, int seq_len, uint64_t seed);

    long long windows() const { return windows_; }     // W
    long long total_tokens() const { return total_; }  // N
    int seq_len() const { return seq_len_; }
    uint64_t seed() const { return seed_; }
    uint32_t vocab_size() const { return vocab_size_; }

    struct MicroBatch {
        std::vector<int> inputs, targets;  // [micro_batch][seq_len], row-major
        std::vector<int> positions;        // [micro_batch][seq_len] positions within documents; empty: 0..seq_len-1
    };

    // The micro-batch of optimizer step `step`, micro-step `micro_step` ∈ [0, g.accumulation), on
    // rank ∈ [0, g.world). Throws std::invalid_argument on an invalid geometry or index.
    MicroBatch micro_batch(long long step, int micro_step, const BatchGeometry& g, int rank) const;

    // The window global sample `g` (≥ 0) reads: perm_{g / W}[g mod W].
    long long window_of(long long g) const;

    // Window k ∈ [0, W): its T inputs and T targets.
    void window(long long k, int* inputs, int* targets) const;

  private:
    void copy_tokens(long long start, long long n, int* out) const;

    std::vector<TokenShard> shards_;
    std::vector<long long> offsets_;  // offsets_[i]: stream position of shards_[i]'s first token
    int seq_len_;
    uint64_t seed_;
    uint32_t vocab_size_ = 0;
    long long total_ = 0;
    long long windows_ = 0;
    mutable long long cached_epoch_ = -1;
    mutable std::vector<long long> perm_;
};

}  // namespace pv
