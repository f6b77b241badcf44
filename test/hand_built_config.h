// A small GQA config whose FLOPs and weights the tests count by hand: head_dim set explicitly
// (q = 2·6 = 12 ≠ hidden 8, kv = 1·6 = 6), ffn 12, two blocks, vocabulary 10.
#pragma once

#include "model/config.h"

namespace pv_test {

inline pv::LlamaConfig hand_built(bool tied) {
    pv::LlamaConfig c;
    c.name = tied ? "hand-tied" : "hand";
    c.vocab_size = 10;
    c.hidden_size = 8;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 6;
    c.ffn_size = 12;
    c.max_seq_len = 16;
    c.tie_embeddings = tied;
    return c;
}

}  // namespace pv_test
