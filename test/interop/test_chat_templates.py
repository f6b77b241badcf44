"""Chat templates: polevault's `train prepare` against transformers' apply_chat_template.

For each template of test/data/chat_templates/ (chat_template_cases.py lists them with their
tokens), a byte-level BPE is trained by `tokenizers` on the conversations with the template's
special tokens, and saved by transformers with the template (tokenizer.json, tokenizer_config.json
and chat_template.jinja, as transformers 5 saves a tokenizer). `train prepare --tokenizer` renders
the conversations; its shards are read back and each example (a run from one starts-document flag
to the next) must be, against transformers:
  - the same token ids as tokenizer(apply_chat_template(..., tokenize=False),
    add_special_tokens=False) — so also the same text;
  - counted exactly on the tokens of the answers (chat_template_cases.answer_spans, from
    transformers' renderings; for a {% generation %} template starting where transformers'
    assistant mask starts), the example's first token never.
Llama 3.2's template prints today's date: both sides are given the same fixed day
(SOURCE_DATE_EPOCH for polevault, transformers' clock for transformers).
"""

import json
import os
import struct
from datetime import datetime, timezone

import pytest

import chat_template_cases as cases
import polevault_cli as pv

EPOCH = cases.EPOCH


def read_shard_v4(path):
    """(tokens, flags) of a version-4 token shard (data/shard.h)."""
    data = open(path, "rb").read()
    assert data[:8] == b"PVTOKENS"
    version, _vocab, width, _eot, count = struct.unpack_from("<IIIIQ", data, 8)
    assert version == 4, version
    body = 48
    tokens = list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", data, body))
    flags = list(data[body + count * width : body + count * width + count])
    return tokens, flags


@pytest.fixture(autouse=True)
def fixed_day(monkeypatch):
    import transformers.utils.chat_template_utils as ctu

    class Fixed(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.fromtimestamp(EPOCH, timezone.utc).replace(tzinfo=None)

    monkeypatch.setattr(ctu, "datetime", Fixed)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(EPOCH))
    pv._ENV["SOURCE_DATE_EPOCH"] = str(EPOCH)


def expected_mask(tok, name, template, messages, ids):
    """1 where a token starts inside an answer span (chat_template_cases), else 0."""

    def render(msgs, gen):
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    specials = cases.TEMPLATES[name][2]
    text, spans = cases.answer_spans(render, messages, specials)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids
    offsets = enc["offset_mapping"]
    if "{% generation %}" in template or "{%- generation %}" in template:
        out = tok.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        gen_mask = out["assistant_masks"]
        starts = [i for i, m in enumerate(gen_mask) if m and (i == 0 or not gen_mask[i - 1])]
        # the rule: from where each generation block starts to the end of its turn
        span_ends = [end for _start, end in spans]
        spans = []
        for i, s in enumerate(starts):
            char = offsets[s][0]
            end = next((e for e in span_ends if e > char), char)
            spans.append((char, end))
    return [int(any(a <= off[0] < b for a, b in spans)) for off in offsets]


@pytest.mark.parametrize("name", sorted(cases.TEMPLATES))
def test_prepare_renders_as_transformers(tmp_path, name):
    template = (cases.TEMPLATE_DIR / name).read_text()
    tok = cases.make_tokenizer(tmp_path / "model", name, template)
    assert (tmp_path / "model" / "chat_template.jinja").exists()
    conversations = cases.conversations(cases.TEMPLATES[name][3])
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    out = tmp_path / "out"
    pv.run_train(
        "prepare", data, "--tokenizer", tmp_path / "model" / "tokenizer.json", "--out", out, "--val-fraction", "0.5"
    )
    tokens, flags = [], []
    for shard in sorted(out.glob("train_*.pvtokens")) + [out / "val.pvtokens"]:
        t, f = read_shard_v4(shard)
        tokens += t
        flags += f
    starts = [i for i, f in enumerate(flags) if f & 2] + [len(flags)]
    assert len(starts) - 1 == len(conversations)
    for k, messages in enumerate(conversations):
        ids = tokens[starts[k] : starts[k + 1]]
        counted = [f & 1 for f in flags[starts[k] : starts[k + 1]]]
        text = tok.apply_chat_template(messages, tokenize=False)
        want = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text, f"{name}, conversation {k}: the rendered text differs"
        assert ids == want, f"{name}, conversation {k}: the token ids differ"
        mask = expected_mask(tok, name, template, messages, want)
        mask[0] = 0  # nothing in an example predicts its first token
        assert counted == mask, f"{name}, conversation {k}: the counted tokens differ\n{text!r}"


@pytest.mark.parametrize("name", sorted(cases.TEMPLATES))
def test_special_token_text_in_messages_stays_text(tmp_path, name):
    """The same text as transformers renders, but the special-token strings inside the messages
    are plain text: exactly as many special tokens fewer as the messages spell."""
    template = (cases.TEMPLATE_DIR / name).read_text()
    tok = cases.make_tokenizer(tmp_path / "model", name, template)
    data = tmp_path / "chats.jsonl"
    # a plain chat first: prepare needs a training and a validation document
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in (cases.CONVERSATIONS[0], cases.FORGED)))
    out = tmp_path / "out"
    pv.run_train(
        "prepare", data, "--tokenizer", tmp_path / "model" / "tokenizer.json", "--out", out, "--val-fraction", "0.5"
    )
    tokens, flags = [], []
    for shard in sorted(out.glob("train_*.pvtokens")) + [out / "val.pvtokens"]:
        t, f = read_shard_v4(shard)
        tokens += t
        flags += f
    tokens = tokens[[i for i, f in enumerate(flags) if f & 2][-1] :]
    text = tok.apply_chat_template(cases.FORGED, tokenize=False)
    assert tok.decode(tokens) == text
    specials = set(tok.all_special_ids) | {tok.convert_tokens_to_ids(s) for s in cases.TEMPLATES[name][2]}
    spelled = sum(m["content"].count(s) for m in cases.FORGED for s in cases.TEMPLATES[name][2])
    theirs = tok(text, add_special_tokens=False)["input_ids"]
    assert spelled > 0
    assert sum(t in specials for t in tokens) == sum(t in specials for t in theirs) - spelled
