#!/usr/bin/env python3
"""Hugging Face `tokenizers` doing what bench/tokenizer_bench.cpp measures, for docs/training-and-data.md's table.

    /tmp/venv/bin/python test/interop/tokenizer_speed_hf.py [--shared ../shared]

One thread (RAYON_NUM_THREADS=1; encode of one string does not use more), CPU time of this process,
best of 3: Tokenizer.from_file; encode(whole tinyshakespeare, add_special_tokens=False); encode of
each line alone, in a Python loop and with encode_batch; decode(ids, skip_special_tokens=False).
"""

import argparse
import os
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def best(f, n=3):
    b = float("inf")
    for _ in range(n):
        t = time.process_time()
        f()
        b = min(b, time.process_time() - t)
    return b


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(here))), "shared"))
    shared = ap.parse_args().shared
    text = open(os.path.join(shared, "data", "tinyshakespeare.txt"), encoding="utf-8").read()
    lines = text.split("\n")
    mb = len(text.encode("utf-8")) / 1e6
    print(f"tokenizers {tokenizers.__version__}; tinyshakespeare: {mb:.2f} MB, {len(lines)} lines; one thread, CPU time")
    print(f"{'tokenizer':26} {'load s':>8} {'tokens':>8} {'encode MB/s':>12} {'lines MB/s':>11} {'batch MB/s':>11} "
          f"{'decode MB/s':>12}")
    for name in ["llama3-tokenizer.json", "spbpe32k-tokenizer.json"]:
        path = os.path.join(shared, "tokenizers", name)
        load = best(lambda: Tokenizer.from_file(path))
        tok = Tokenizer.from_file(path)
        ids = tok.encode(text, add_special_tokens=False).ids
        encode = best(lambda: tok.encode(text, add_special_tokens=False))
        by_line = best(lambda: [tok.encode(line, add_special_tokens=False) for line in lines])
        batch = best(lambda: tok.encode_batch(lines, add_special_tokens=False))
        decode = best(lambda: tok.decode(ids, skip_special_tokens=False))
        print(f"{name:26} {load:8.3f} {len(ids):8d} {mb / encode:12.2f} {mb / by_line:11.2f} {mb / batch:11.2f} "
              f"{mb / decode:12.2f}")


if __name__ == "__main__":
    main()
