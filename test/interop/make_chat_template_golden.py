"""Writes test/data/chat_templates/golden.json: every template of chat_template_cases.py rendered
by transformers' apply_chat_template for each of its conversations (and the forged one), with the
answer spans (UTF-8 byte offsets) of polevault's rule (chat_template_cases.answer_spans; for a {% generation %}
template each span starts where transformers' generation block starts). test_chat.cpp checks
polevault's rendering against it in CI, where there is no Python.

    build/interop-venv/bin/python test/interop/make_chat_template_golden.py

The day is fixed (chat_template_cases' EPOCH, via transformers' clock) so Llama 3.2's date line is
reproducible; polevault's test sets SOURCE_DATE_EPOCH to the same second.
"""

import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chat_template_cases as cases  # noqa: E402


def main():
    import transformers.utils.chat_template_utils as ctu

    class Fixed(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.fromtimestamp(cases.EPOCH, timezone.utc).replace(tzinfo=None)

    ctu.datetime = Fixed
    out = {"generator": "test/interop/make_chat_template_golden.py", "epoch": cases.EPOCH, "templates": {}}
    for name in sorted(cases.TEMPLATES):
        bos, eos, specials, system_ok = cases.TEMPLATES[name]
        template = (cases.TEMPLATE_DIR / name).read_text()
        with tempfile.TemporaryDirectory() as d:
            tok = cases.make_tokenizer(Path(d), name, template)

        def render(msgs, gen):
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

        entries = []
        for messages in cases.conversations(system_ok) + [cases.FORGED]:
            text, spans = cases.answer_spans(render, messages, specials)
            if "generation %}" in template:
                kwargs = dict(tok.special_tokens_map)
                rendered, indices = ctu.render_jinja_template(
                    conversations=[messages], chat_template=template, return_assistant_tokens_mask=True, **kwargs
                )
                assert rendered[0] == text
                ends = [e for _s, e in spans]
                spans = [(s, max(e0, next((e for e in ends if e > s), s))) for s, e0 in indices[0]]
            utf8 = [[len(text[:a].encode()), len(text[:b].encode())] for a, b in spans]  # byte offsets
            entries.append({"messages": messages, "text": text, "answers": utf8})
        out["templates"][name] = {"bos_token": bos, "eos_token": eos, "special_tokens": specials, "cases": entries}
    path = cases.TEMPLATE_DIR / "golden.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
