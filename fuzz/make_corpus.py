#!/usr/bin/env python3
"""Writes the generated seeds of the fuzz corpus (fuzz/corpus/<reader>/gen_*): small valid files
of each binary format, built from the formats' layouts (the top-of-file comments of data/shard.h,
formats/llama2c.h, formats/safetensors.h, formats/bnb_checkpoint.h), so each target starts from inputs
its reader accepts. The other seeds are copies of test/data files or files polevault wrote
(fuzz/README.md says which). Deterministic: running it again gives the same bytes.

    python3 fuzz/make_corpus.py
"""
import json
import os
import random
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
rng = random.Random(17)


def put(reader, name, data):
    os.makedirs(os.path.join(CORPUS, reader), exist_ok=True)
    with open(os.path.join(CORPUS, reader, "gen_" + name), "wb") as f:
        f.write(data)


# ---- token shards (data/shard.h) ---------------------------------------------------------------
COUNTED, STARTS, SPLITTABLE = 1, 2, 4


def shard(vocab, eot, tokens, flags=None):
    width = 2 if vocab <= 65536 else 4
    version = 2 if flags is not None else 1
    out = b"PVTOKENS" + struct.pack("<IIIIQ", version, vocab, width, eot, len(tokens))
    out += b"".join(struct.pack("<H" if width == 2 else "<I", t) for t in tokens)
    if flags is not None:
        out += bytes(flags)
    return out


text = [rng.randrange(512) for _ in range(40)]
put("shard", "text_v2.pvtokens",
    shard(512, 0, text, [COUNTED | SPLITTABLE | (STARTS if i in (0, 17) else 0) for i in range(40)]))
# Two chats (not splittable, prompts not counted) and a plain document.
flags = []
for length, prompt in ((9, 5), (7, 3)):
    flags += [STARTS] + [COUNTED if i >= prompt else 0 for i in range(1, length)]
flags += [STARTS | COUNTED | SPLITTABLE] + [COUNTED | SPLITTABLE] * 5
put("shard", "chat_v2.pvtokens", shard(1000, 999, [rng.randrange(1000) for _ in flags], flags))
put("shard", "wide_v2.pvtokens",
    shard(128256, 128001, [rng.randrange(128256) for _ in range(12)], [COUNTED | SPLITTABLE | STARTS] + [COUNTED | SPLITTABLE] * 11))
put("shard", "text_v1.pvtokens", shard(300, 299, [rng.randrange(300) for _ in range(30)] + [299]))
put("shard", "empty_v2.pvtokens", shard(512, 0, [], []))

# ---- llama2.c checkpoints (formats/llama2c.h) ----------------------------------------------------


def llama2c(dim, hidden, layers, heads, kv, vocab, seq):
    hs = dim // heads
    floats = (abs(vocab) * dim + layers * dim + layers * heads * hs * dim + 2 * layers * kv * hs * dim +
              layers * dim * heads * hs + layers * dim + 3 * layers * hidden * dim + dim + 2 * seq * (hs // 2))
    if vocab < 0:
        floats += -vocab * dim
    out = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq)
    return out + struct.pack("<%df" % floats, *[round(rng.uniform(-1, 1), 3) for _ in range(floats)])


put("llama2c", "shared.bin", llama2c(8, 16, 1, 2, 1, 16, 4))
put("llama2c", "separate_classifier.bin", llama2c(8, 12, 2, 2, 2, -12, 2))

# ---- safetensors (formats/safetensors.h) ---------------------------------------------------------
SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1, "I8": 1}


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] in buffer order."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def random_bytes(n):
    return bytes(rng.randrange(256) for _ in range(n))


def tensor(name, dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return (name, dtype, shape, random_bytes(n * SIZES[dtype]))


put("safetensors", "dtypes.safetensors", safetensors(
    [tensor("model.embed_tokens.weight", "BF16", [4, 3]), tensor("model.norm.weight", "F32", [3]),
     tensor("lm_head.weight", "F16", [4, 3]), tensor("scalar", "F64", []), tensor("ids", "I64", [2]),
     tensor("mask", "BOOL", [5]), tensor("empty", "F32", [0, 3])], {"format": "pt"}))
put("safetensors", "empty.safetensors", safetensors([]))

# ---- bitsandbytes NF4 linears (formats/bnb_checkpoint.h) -----------------------------------------
# NF4's levels and the dynamic map, bit for bit as bitsandbytes writes them: read from the
# checkpoint transformers saved for the tests.
with open(os.path.join(ROOT, "test", "data", "bnb", "nf4_dq", "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    buffer = f.read()


def saved(name):
    begin, end = header[name]["data_offsets"]
    return buffer[begin:end]


levels = saved("model.layers.0.self_attn.q_proj.weight.quant_map")
dynamic = saved("model.layers.0.self_attn.q_proj.weight.nested_quant_map")


def bnb_linear(weight, rows, cols, double_quant):
    n = rows * cols
    blocks = (n + 63) // 64
    state = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [rows, cols]}
    out = [(weight, "U8", [(n + 1) // 2, 1], random_bytes((n + 1) // 2))]
    if double_quant:
        state.update({"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0123})
        out += [(weight + ".absmax", "U8", [blocks], random_bytes(blocks)),
                (weight + ".nested_absmax", "F32", [(blocks + 255) // 256],
                 struct.pack("<%df" % ((blocks + 255) // 256), *[0.5] * ((blocks + 255) // 256))),
                (weight + ".nested_quant_map", "F32", [256], dynamic)]
    else:
        out.append((weight + ".absmax", "F32", [blocks], struct.pack("<%df" % blocks, *[0.25] * blocks)))
    out.append((weight + ".quant_map", "F32", [16], levels))
    text = json.dumps(state, separators=(",", ":")).encode()
    out.append((weight + ".quant_state.bitsandbytes__nf4", "U8", [len(text)], text))
    return out


W = "model.layers.0.mlp.down_proj.weight"
put("bnb_checkpoint", "nf4.safetensors", safetensors(bnb_linear(W, 8, 16, False), {"format": "pt"}))
put("bnb_checkpoint", "nf4_dq.safetensors", safetensors(bnb_linear(W, 6, 11, True), {"format": "pt"}))
put("bnb_checkpoint", "two_linears.safetensors", safetensors(
    bnb_linear(W, 4, 64, True) + bnb_linear("model.layers.0.self_attn.q_proj.weight", 3, 5, True) +
    [tensor("model.norm.weight", "BF16", [16])]))
