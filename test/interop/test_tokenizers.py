"""polevault's tokenizer against the Python `tokenizers` package (the library transformers
uses), live, on the two tokenizer files in ../shared/tokenizers: Llama 3's byte-level BPE and a
SentencePiece-style BPE with byte fallback (Prepend/Replace normaliser, `<0xNN>` byte tokens,
ByteFallback/Fuse/Strip decoder, a TemplateProcessing post-processor adding `<s>`).

Through `train tokenize --tokenizer FILE` (one process per call, the text on stdin):
- for every text, the ids equal `encode(text, add_special_tokens=False)` (special-token strings
  in the text become their ids, as HF does), and --decode of those ids prints HF's
  `decode(ids, skip_special_tokens=False)`: the text the model sees, special tokens included;
- with --no-parse-special the ids equal HF's with `encode_special_tokens = True` (the strings
  are plain text), on the texts that hold such strings;
- with --add-special they equal `encode(text, add_special_tokens=True)` (what the
  post-processor adds), on a few texts.
The golden fixture that make_tokenizer_golden.py makes covers a few hundred texts inside
`make test`; this file checks the same rules against the library itself, with no fixture in
between.
"""

import functools
from pathlib import Path

import pytest
from tokenizers import Tokenizer

import polevault_cli as pv

TOKENIZERS = Path(__file__).resolve().parents[3] / "shared" / "tokenizers"
FILES = {"llama3": TOKENIZERS / "llama3-tokenizer.json", "spbpe32k": TOKENIZERS / "spbpe32k-tokenizer.json"}

TEXTS = [
    "Hello, world!",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "To be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer",
    "",
    " ",
    "   leading and trailing spaces   ",
    "tabs\tand\t\ttabs\r\nwindows line\r\nend",
    "\n\n\n\n",
    "multiple     inner      spaces  \n  and indented lines",
    "digits 0 12 123 1234 12345 1234567890 3.14159 1,000,000 2026-11-24",
    "I'm sure you'll see they've gone; HE'S here, WE'LL go, it'D do, don't",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "for (int i = 0; i < n; ++i) { y[i] += a * x[i]; }\n",
    '{"url": "https://example.com/path?q=1&r=2#frag", "ok": true, "n": null}',
    "我爱自然语言处理。今天天气很好！",
    "東京は日本の首都です。カタカナとひらがな、漢字。",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "مرحبا بالعالم، هذه جملة عربية.",
    "שלום עולם, זה טקסט בעברית",
    "नमस्ते दुनिया, यह हिंदी है।",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "Привет, мир! Γειά σου Κόσμε! Ἀθῆναι",
    "👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️‍🔥 🤖🤖🤖",
    "e\u0301 vs \u00e9, a\u0308\u0304, Z\u0351\u0352\u0353 (combining marks)",
    "non\u00a0breaking\u2009thin\u200bzero\u200dwidth\ufeffbom\u3000ideographic",
    "𝕳𝖊𝖑𝖑𝖔 𓀀𓁐 𐍈 \U0010fffd \ue000 private use",
    "∑_{i=1}^{n} x² ≤ ∞ ≠ √2 → ⊕ ©®™ ½ Ⅻ ① ﬁ ﬂ",
    "a" * 200 + " " + "ab" * 50 + " " + "9" * 40,
    "control bell\x07 start\x01 del\x7f esc\x1b[0m nul\x00 end",
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<s>[INST] hello [/INST] world</s>",
    " <s> </s><unk> <|begin_of_text|> x<|reserved_special_token_3|>y ",
    "<|begin_of_text| <s <unk </s",
]
# The flags change what they change on a handful of texts as on all (every process loads the
# tokenizer anew, so the suite's time goes by the call): --no-parse-special on every text holding
# a special-token string of either file plus two without, --add-special on six.
NO_PARSE_SPECIAL_TEXTS = [0, 11] + [i for i, text in enumerate(TEXTS) if "<" in text]
ADD_SPECIAL_TEXTS = [0, 3, 8, 14, 29, 31]


@pytest.fixture(scope="module", params=sorted(FILES))
def tokenizer(request):
    return FILES[request.param]


@functools.cache
def reference(path, parse_special=True):
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = not parse_special
    return tokenizer


@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_encode_and_decode_as_tokenizers(tokenizer, index):
    path = tokenizer
    text = TEXTS[index]
    parsed = reference(path).encode(text, add_special_tokens=False).ids
    assert pv.tokenize(path, text) == parsed

    decoded = reference(path).decode(parsed, skip_special_tokens=False)
    printed = pv.detokenize(path, parsed)
    assert printed in (decoded, decoded + "\n"), (printed, decoded)


@pytest.mark.parametrize("index", NO_PARSE_SPECIAL_TEXTS)
def test_no_parse_special_encodes_special_strings_as_text(tokenizer, index):
    path = tokenizer
    text = TEXTS[index]
    expected = reference(path, parse_special=False).encode(text, add_special_tokens=False).ids
    assert pv.tokenize(path, text, "--no-parse-special") == expected


@pytest.mark.parametrize("index", ADD_SPECIAL_TEXTS)
def test_add_special_as_the_post_processor(tokenizer, index):
    path = tokenizer
    text = TEXTS[index]
    expected = reference(path).encode(text, add_special_tokens=True).ids
    assert pv.tokenize(path, text, "--add-special") == expected

