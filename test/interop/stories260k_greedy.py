"""Greedy ids of stories260K from BOS, computed independently of polevault.

A plain NumPy float64 transcription of llama2.c's run.c forward pass (its weight order, its
interleaved RoPE pairs, its RMSNorm with eps 1e-5, SwiGLU, grouped KV heads, the shared
classifier), fed the .bin file directly. test_train compares `train convert` + `train sample
--temperature 0` against the ids this writes to test/data/stories260k_greedy.json.

    build/interop-venv/bin/python test/interop/stories260k_greedy.py ../shared/models/stories260K.bin
"""
import json
import struct
import sys

import numpy as np

STEPS = 100


def main(path, out):
    raw = open(path, "rb").read()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    w = np.frombuffer(raw[28:], dtype=np.float32).astype(np.float64)
    at = [0]

    def take(*shape):
        n = int(np.prod(shape))
        a = w[at[0]:at[0] + n].reshape(shape)
        at[0] += n
        return a

    hs = dim // heads
    kv_dim = kv_heads * hs
    emb = take(vocab, dim)
    rms_att = take(layers, dim)
    wq, wk, wv = take(layers, dim, dim), take(layers, kv_dim, dim), take(layers, kv_dim, dim)
    wo = take(layers, dim, dim)
    rms_ffn = take(layers, dim)
    w1, w2, w3 = take(layers, hidden, dim), take(layers, dim, hidden), take(layers, hidden, dim)
    rms_final = take(dim)
    take(seq_len, hs // 2)  # freq_cis_real, unused by run.c
    take(seq_len, hs // 2)  # freq_cis_imag
    wcls = emb if shared else take(vocab, dim)

    def rmsnorm(x, g):
        return x / np.sqrt((x * x).mean() + 1e-5) * g

    def rope(v, pos):  # run.c: pairs (i, i+1), frequency from i mod head_size
        v = v.copy()
        for i in range(0, v.shape[0], 2):
            angle = pos / 10000.0 ** ((i % hs) / hs)
            c, s = np.cos(angle), np.sin(angle)
            a, b = v[i], v[i + 1]
            v[i], v[i + 1] = a * c - b * s, a * s + b * c
        return v

    keys = [[] for _ in range(layers)]
    values = [[] for _ in range(layers)]
    token, ids = 1, []
    for pos in range(STEPS):
        x = emb[token].copy()
        for l in range(layers):
            h = rmsnorm(x, rms_att[l])
            q, k, v = rope(wq[l] @ h, pos), rope(wk[l] @ h, pos), wv[l] @ h
            keys[l].append(k)
            values[l].append(v)
            att = np.zeros(dim)
            for head in range(heads):
                kvh = head // (heads // kv_heads)
                qh = q[head * hs:(head + 1) * hs]
                scores = np.array([qh @ kk[kvh * hs:(kvh + 1) * hs] for kk in keys[l]]) / np.sqrt(hs)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                att[head * hs:(head + 1) * hs] = sum(pi * vv[kvh * hs:(kvh + 1) * hs] for pi, vv in zip(p, values[l]))
            x = x + wo[l] @ att
            h = rmsnorm(x, rms_ffn[l])
            a, b = w1[l] @ h, w3[l] @ h
            x = x + w2[l] @ (a / (1.0 + np.exp(-a)) * b)
        logits = wcls @ rmsnorm(x, rms_final)
        token = int(np.argmax(logits))
        ids.append(token)
        if token == 2:  # EOS, where `train sample` stops too
            break
    json.dump({"prompt_ids": [1], "greedy_ids": ids}, open(out, "w"))
    print(ids)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "test/data/stories260k_greedy.json")
