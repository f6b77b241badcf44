"""The polevault side of the interop tests: the `train` program run as a user runs it, and the
token shard format written from Python.

`train` is build/host/train unless $POLEVAULT_TRAIN names another (run.sh sets it). Every call
has a time limit and fails the test with the command's stderr when it exits non-zero.

Shard layout (data/shard.h), little-endian, 32-byte header:
  "PVTOKENS"  u32 version = 1  u32 vocab_size  u32 token_bytes (2 or 4)  u32 eot_token  u64 count
followed by count tokens of token_bytes each.
"""

import json
import os
import re
import struct
import subprocess
from pathlib import Path

import numpy as np

TRAIN = os.environ.get("POLEVAULT_TRAIN", str(Path(__file__).resolve().parents[2] / "build/host/train"))

# One worker thread per program: the suite runs on 2 cores beside nothing else, and the models
# are tiny; this keeps a run's time predictable.
_ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


def run_train(*args, stdin=b"", timeout=300):
    """Runs `train ARGS`, returns its stdout as text; fails with stderr on a non-zero exit."""
    command = [TRAIN, *[str(a) for a in args]]
    done = subprocess.run(command, input=stdin, capture_output=True, timeout=timeout, env=_ENV)
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited with {done.returncode}\n"
            f"--- stderr ---\n{done.stderr.decode(errors='replace')}\n"
            f"--- stdout ---\n{done.stdout.decode(errors='replace')}"
        )
    return done.stdout.decode()


def last_line(stdout):
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "the command printed nothing on stdout"
    return lines[-1]


def random_tokens(count, seed, vocab):
    return np.random.default_rng(seed).integers(0, vocab, size=count).tolist()


def write_shard(path, tokens, vocab_size, eot_token):
    """Writes a version-1 token shard holding `tokens` (ints < vocab_size)."""
    tokens = [int(t) for t in tokens]
    assert all(0 <= t < vocab_size for t in tokens) and 0 <= eot_token < vocab_size
    width = 2 if vocab_size <= 65536 else 4
    header = b"PVTOKENS" + struct.pack("<IIIIQ", 1, vocab_size, width, eot_token, len(tokens))
    body = struct.pack(f"<{len(tokens)}{'H' if width == 2 else 'I'}", *tokens)
    Path(path).write_bytes(header + body)
    return path


_EVAL_LINE = re.compile(
    r"loss (?P<loss>\S+) perplexity (?P<perplexity>\S+) tokens (?P<tokens>\d+) windows (?P<windows>\d+)"
)


def evaluate(model_dir, data, dtype, seq_len):
    """`train eval`: returns {loss, perplexity, tokens, windows} from its final stdout line."""
    out = run_train("eval", model_dir, "--data", data, "--dtype", dtype, "--seq-len", seq_len)
    line = last_line(out)
    match = _EVAL_LINE.fullmatch(line)
    assert match, f"train eval's last line is not 'loss X perplexity Y tokens N windows W': {line!r}"
    return {
        "loss": float(match["loss"]),
        "perplexity": float(match["perplexity"]),
        "tokens": int(match["tokens"]),
        "windows": int(match["windows"]),
    }


def greedy_ids(model_dir, prompt_ids, max_tokens, dtype):
    """`train sample --temperature 0 --print-ids`: the generated ids (the prompt not included)."""
    out = run_train(
        "sample", model_dir,
        "--prompt-ids", ",".join(str(i) for i in prompt_ids),
        "--max-tokens", max_tokens, "--temperature", 0, "--print-ids", "--dtype", dtype,
    )
    ids = json.loads(last_line(out))
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), f"not a JSON array of ids: {ids!r}"
    return ids


def tokenize(tokenizer_file, text, *flags):
    """`train tokenize --tokenizer FILE [flags]` on `text` (str or bytes): the ids."""
    data = text.encode() if isinstance(text, str) else text
    out = run_train("tokenize", "--tokenizer", tokenizer_file, *flags, stdin=data, timeout=120)
    ids = json.loads(last_line(out))
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), f"not a JSON array of ids: {ids!r}"
    return ids


def detokenize(tokenizer_file, ids):
    """`train tokenize --decode` on the JSON array `ids`: stdout exactly as printed (strict UTF-8;
    the caller decides about a newline the command may add after the text)."""
    return run_train("tokenize", "--tokenizer", tokenizer_file, "--decode", stdin=json.dumps(ids).encode(), timeout=120)
