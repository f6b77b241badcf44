// The training data loader: fixed-length windows of the token stream, in a shuffled order that
// depends only on (seed, global sample index), and the batch geometry that splits them over
// micro-steps and data-parallel ranks.
//
// The stream. The shards' tokens are concatenated (in the order given) into one stream of N
// tokens, each with its flags (data/shard.h): counted, starts a document, splittable. A shard
// without flags (version 1, or one built in memory) means: every token counts, a document starts
// after each eot_token, every document is splittable. The stream's first token always starts a
// document (a validation shard may begin inside one).
//
// Windows when every document is splittable (all plain text; the default run). Window k is the
// T+1 tokens starting at k·T; its inputs are the first T and its targets the same tokens shifted
// by one (targets[i] = stream[k·T + i + 1]), so consecutive windows overlap by one token: the last
// target of window k is the first input of window k+1, and each of the tokens at positions
// 1 .. W·T is a target exactly once per epoch. There are W = (N − 1) / T windows; the tail that
// does not fill a window is unused. Windows cross document (EOT) and shard boundaries, as in
// GPT-2 / llm.c pre-training: the EOT token is just another token the model learns to predict
// across.
//
// Packing when some document is not splittable (chats, prompts and completions). Such a
// document longer than T+1 tokens cannot be trained on whole and is dropped (counts() has how
// many, and `train` prints it: an answer is never cut silently). The rest are packed
// greedily, in stream order, into windows of T+1 tokens:
//   - plain text fills the window and, at its end, is split as above: the next window starts
//     with the window's last token (a one-token overlap);
//   - an unsplittable document that fits the room left is added whole; one that does not is not
//     split: the window is closed, its rest filled with the EOS token (the header's eot_token)
//     as padding, and the document starts the next window (no overlap);
//   - a window that ends exactly at a document's end is followed by a window starting at the
//     next document (no overlap);
//   - the last window, if not full, is padded;
//   - a window that would hold a single token is left out: it has no target (a one-token
//     document alone before a chat that fills a window, or a last lone token).
// So every window is a contiguous run of the stream without the dropped documents, and no window
// holds part of an unsplittable document. The window table (start, length) is computed once from
// the data and T: a pure function of them, as the order below is of (seed, g).
//
// Targets. The target of input i is token i+1 of the window when that token's counted flag is set,
// else kIgnoreTarget (-100; the cross-entropy skips it). Padding never counts: the target of the
// last real token before padding and of every pad is -100.
//
// Document mask (document_mask = true). positions[i] is input i's position within its document:
// 0 at a document's first token, counting up; the window's first token is at 0 too (a document
// continued from the previous window restarts at 0), and so is the first pad (padding is a
// document of its own). The target that would cross into the next document — the last token of
// a document predicting the first of the next — is kIgnoreTarget. (The model restricts each
// query's attention to keys j with i − positions[i] ≤ j ≤ i and uses positions for RoPE.)
// Without it, positions are empty (0 .. T−1 in every row) and targets are as above.
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
// seq_len, seed, document_mask, step, micro_step, geometry, rank). A checkpoint's loader position
// is just the step number; nothing else needs saving, and a run may resume on a different world
// size as long as B is unchanged.
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

// The target of an input whose next token does not count (model/llama.h's kIgnoreIndex).
inline constexpr int kIgnoreTarget = -100;

class DataLoader {
  public:
    // Throws std::invalid_argument if seq_len < 1, the shards disagree on vocab_size, a shard's
    // flags are not one per token, or the data gives no window (fewer than seq_len + 1 tokens, or
    // every document dropped).
    DataLoader(std::vector<TokenShard> shards, int seq_len, uint64_t seed, bool document_mask = false);

    long long windows() const { return windows_; }     // W
    long long total_tokens() const { return total_; }  // N
    int seq_len() const { return seq_len_; }
    uint64_t seed() const { return seed_; }
    uint32_t vocab_size() const { return vocab_size_; }
    bool document_mask() const { return document_mask_; }
    bool packed() const { return !window_start_.empty(); }  // some document is not splittable

    // What the windows hold over one epoch (every window once).
    struct Counts {
        long long documents = 0;               // in the stream
        long long unsplittable_documents = 0;  // of them, chats and prompts (not split)
        long long dropped_documents = 0;       // unsplittable ones longer than seq_len + 1 tokens
        long long dropped_tokens = 0;          // their tokens
        long long padding_tokens = 0;          // EOS padding over all windows (of their T+1 tokens each)
        long long targets = 0;                 // W × T
        long long counted_targets = 0;         // of them, the ones that count
    };
    const Counts& counts() const { return counts_; }

    struct MicroBatch {
        std::vector<int> inputs, targets;  // [micro_batch][seq_len], row-major
        std::vector<int> positions;        // [micro_batch][seq_len] positions within documents; empty: 0..seq_len-1
        long long first_sample = 0;        // the global sample index of its first sequence (keys dropout)
    };

    // The micro-batch of optimizer step `step`, micro-step `micro_step` ∈ [0, g.accumulation), on
    // rank ∈ [0, g.world). Throws std::invalid_argument on an invalid geometry or index.
    MicroBatch micro_batch(long long step, int micro_step, const BatchGeometry& g, int rank) const;

    // The window global sample `g` (≥ 0) reads: perm_{g / W}[g mod W].
    long long window_of(long long g) const;

    // Window k ∈ [0, W): its T inputs and T targets, and with `positions` (used only with the
    // document mask) its T positions.
    void window(long long k, int* inputs, int* targets, int* positions = nullptr) const;

  private:
    void copy_tokens(long long start, long long n, int* out) const;
    // The n kept-stream tokens (the stream without dropped documents) from `start`, and their flags.
    void copy_kept(long long start, long long n, int* tokens, uint8_t* flags) const;
    void pack();
    void count_targets();

    std::vector<TokenShard> shards_;
    std::vector<long long> offsets_;  // offsets_[i]: stream position of shards_[i]'s first token
    std::vector<uint8_t> flags_;      // the stream's flags (derived for shards without)
    // The kept stream as runs of the stream: run r is kept_[r].length tokens from stream position
    // kept_[r].stream, at kept-stream position kept_[r].kept. One run when nothing is dropped.
    struct KeptRun {
        long long kept, stream, length;
    };
    std::vector<KeptRun> kept_;
    // Packed windows: kept-stream start and length (≤ T+1, padded to T+1); empty when every
    // document is splittable (window k starts at k·T, T+1 long).
    std::vector<long long> window_start_;
    std::vector<int> window_length_;
    int seq_len_;
    uint64_t seed_;
    bool document_mask_;
    uint32_t vocab_size_ = 0;
    int pad_token_ = 0;
    long long total_ = 0;
    long long windows_ = 0;
    Counts counts_;
    mutable long long cached_epoch_ = -1;
    mutable std::vector<long long> perm_;
};

}  // namespace pv
