// The model the multi-rank suites run: every size odd or prime (hidden 33, 3 heads of 10 with one
// KV head, FFN 35, a vocabulary of 4·ranks + 1) so that no tensor, group or slice lines up with
// the 64-element alignment or splits evenly over the ranks — padding and uneven shards are
// exercised everywhere. Two blocks, or `layers` (an interleaved pipeline needs a stage per chunk).
#pragma once

#include "model/config.h"

namespace pv::test {

inline LlamaConfig awkward_model(int ranks, bool tied = true, int layers = 2) {
    LlamaConfig c;
    c.name = "awkward";
    c.vocab_size = 4 * ranks + 1;
    c.hidden_size = 33;
    c.num_layers = layers;
    c.num_heads = 3;
    c.num_kv_heads = 1;
    c.head_dim = 10;
    c.ffn_size = 35;
    c.max_seq_len = 16;
    c.tie_embeddings = tied;
    return c;
}

}  // namespace pv::test
