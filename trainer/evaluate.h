// `train eval`: a model's loss and perplexity on a prepared dataset.
//
// The data is cut into windows exactly as the training loader cuts it (data/loader.h): window k is
// the T + 1 tokens starting at k·T, its inputs the first T and its targets the same tokens shifted
// by one, targets of −100 skipped. Every window is evaluated once, in order (no shuffling): windows
// 0 .. W − 1, or the first max_windows. They go through the model `batch` at a time (the model's
// micro-batch); a last, partial batch is filled with rows whose targets are all −100, which add
// nothing. The model's head sums the cross-entropy of a batch's counted tokens in acc_t<T>, as the
// training run's evaluation does; the batches' sums and counts add up in double on the host:
//   loss = Σ cross-entropy / Σ counted tokens,   perplexity = exp(loss).
// With the loader's document mask, each row attends within its documents and takes their positions
// for RoPE, as in training. A training run's validation is this computation on the first
// --eval-batches × --micro-batch windows, --micro-batch at a time, and `train eval` of its
// checkpoint takes those settings by default (trainer/model_dir.h): the same loss.
#pragma once

#include "data/loader.h"
#include "model/llama.h"

namespace pv {

struct EvalResult {
    double loss_sum = 0;   // Σ cross-entropy over the counted targets
    long long tokens = 0;  // counted targets
    long long windows = 0;
    double loss() const { return loss_sum / double(tokens); }
};

// Windows [0, min(W, max_windows)) of `data` (max_windows 0: all) through `model` (forward only;
// its batch and seq_len must be the loader's window, checked). Throws std::runtime_error when no
// target is counted (every one −100).
template <class T>
EvalResult evaluate_windows(Llama<T>& model, const DataLoader& data, long long max_windows);

}  // namespace pv
