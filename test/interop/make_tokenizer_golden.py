#!/usr/bin/env python3
"""Golden token ids from Hugging Face `tokenizers`, for test/test_tokenizer_golden.cpp.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install tokenizers==0.23.3
    /tmp/venv/bin/python test/interop/make_tokenizer_golden.py [--shared ../shared]

Writes test/data/tokenizers/:
  llama3-small.json, spbpe-small.json   small tokenizers cut from the two files in
                                        SHARED/tokenizers/ (the first ids and the merges among
                                        them), bases for the variants below
  golden.jsonl                          one JSON object per line:
    {"header": ...}        tokenizers' version, the FNV-1a 64 of every tokenizer file used, and the
                           variants: {"name": {"base": FILE, "set": {top-level keys},
                           "model_set": {model keys}, "added": [extra added tokens]}}
    {"case": ...}          one text through one tokenizer:
        "tok"              "llama3" / "spbpe32k" (SHARED/tokenizers/*.json) or a variant name
        "text"             the text (valid UTF-8), or "shakespeare": [offset, length] of
                           SHARED/data/tinyshakespeare.txt, or "mixed": k (the header's mixed_texts[k],
                           every kind of text above shuffled together), or "shakespeare_lines": true
                           (every line of it, encoded one by one)
        "ids"              encode(text, add_special_tokens=False)
        "ids_plain"        the same with split_special_tokens=True, when it differs ({"fnv": ...}
                           for long texts)
        "ids_added", "ids_plain_added"   add_special_tokens=True (for some texts)
        "decoded"          decode(ids, skip_special_tokens=False), when it differs from text
        "decoded_skip"     decode(ids, skip_special_tokens=True), when it differs from decoded
        "decoded_plain"    decode(ids_plain, skip_special_tokens=False), when it differs from text
                           (for long texts each decoded text is {"fnv": ..., "lossy": it holds U+FFFD})
        "ids_fnv", "n"  for long texts: FNV-1a 64 of the ids written "1,2,3" and their count,
                           instead of "ids"
    {"decode": ...}        ids made up here (byte tokens that form invalid UTF-8 among others):
        "tok", "ids", "decoded" (HF's text), and for byte-level files "bytes_hex": the bytes the
        ids stand for through GPT-2's byte-to-unicode table, which polevault's decode returns
    {"per_id": ...}        "tok", "fnv" of decode([id]) for every id joined by "\\0" (HF's
                           text), and for byte-level files "bytes_fnv" of the bytes each id
                           stands for (its string read through the byte table; added tokens: their
                           UTF-8), joined the same way

Hugging Face's encode takes str, so invalid UTF-8 can only be tested through decode; polevault's
byte-level decode returns raw bytes where HF writes U+FFFD (data/tokenizer.h), hence bytes_hex.
"""

import argparse
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "test", "data", "tokenizers")


def byte_alphabet():
    """GPT-2's byte-to-unicode table: byte -> character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_CHAR = byte_alphabet()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def token_bytes(s):
    """The bytes a byte-level token string stands for, or its UTF-8 when it is not in the alphabet."""
    if all(c in CHAR_BYTE for c in s):
        return bytes(CHAR_BYTE[c] for c in s)
    return s.encode("utf-8")


def fnv(b):
    """FNV-1a, 64 bits, as 16 hex digits: a checksum the C++ test computes in a few lines."""
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def cut_small(full, keep):
    """A tokenizer.json with the vocabulary entries `keep` (renumbered densely, in id order) and the
    merges whose parts and result all remain."""
    model = full["model"]
    kept = sorted((i, t) for t, i in model["vocab"].items() if keep(t, i))
    new_id = {t: k for k, (_, t) in enumerate(kept)}
    merges = []
    for m in model["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in new_id and b in new_id and a + b in new_id:
            merges.append([a, b])
    small = json.loads(json.dumps(full))
    small["model"]["vocab"] = new_id
    small["model"]["merges"] = merges
    return small


def small_bases(shared):
    l3 = json.load(open(os.path.join(shared, "tokenizers", "llama3-tokenizer.json"), encoding="utf-8"))
    small = cut_small(l3, lambda t, i: i < 1500)
    n = len(small["model"]["vocab"])
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    small["added_tokens"] = [dict(t, id=n + names.index(t["content"])) for t in l3["added_tokens"] if t["content"] in names]
    small["added_tokens"].sort(key=lambda t: t["id"])
    l3_small = small

    sp = json.load(open(os.path.join(shared, "tokenizers", "spbpe32k-tokenizer.json"), encoding="utf-8"))
    sp_small = cut_small(sp, lambda t, i: i < 1200 or (len(t) == 1 and ord(t) < 0x500))
    return {"llama3-small.json": l3_small, "spbpe-small.json": sp_small}


def added(content, id, special=False, lstrip=False, rstrip=False, normalized=False, single_word=False):
    return {"id": id, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def flagged_tokens(first_id):
    """Added tokens exercising every flag (ids from first_id)."""
    specs = [
        ("<tool>", dict(special=True, lstrip=True)),
        ("</tool>", dict(special=True, rstrip=True)),
        ("[X]", dict(lstrip=True, rstrip=True)),
        ("cat", dict(single_word=True)),
        ("dog", dict(single_word=True, normalized=True)),
        ("New York", dict(normalized=True)),
        ("<a>", dict(special=True)),
        ("<a><b>", dict(special=True)),
        ("b>x", dict()),
        ("<|norm|>", dict(special=True, normalized=True)),
        ("é!", dict(normalized=True, lstrip=True)),
    ]
    return [added(c, first_id + k, **f) for k, (c, f) in enumerate(specs)]


def variants(bases):
    l3n = len(bases["llama3-small.json"]["model"]["vocab"]) + len(bases["llama3-small.json"]["added_tokens"])
    spn = len(bases["spbpe-small.json"]["model"]["vocab"])
    bl_last = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    bl_decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}

    def split(pattern, behavior, invert=False):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}, bl_last]}

    def metaspace(scheme, do_split):
        m = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": do_split}
        return {"normalizer": None, "pre_tokenizer": m, "decoder": dict(m)}

    v = {
        "l3s": {"base": "llama3-small.json"},
        "l3s_merges": {"base": "llama3-small.json", "model_set": {"ignore_merges": False}},
        "l3s_gpt2": {"base": "llama3-small.json", "set": {"pre_tokenizer": {
            "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}}},
        "l3s_gpt2_prefix": {"base": "llama3-small.json", "set": {"pre_tokenizer": {
            "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}},
        "l3s_removed": {"base": "llama3-small.json", "set": {"pre_tokenizer": split({"Regex": "\\s+"}, "Removed")}},
        "l3s_prev": {"base": "llama3-small.json",
                     "set": {"pre_tokenizer": split({"Regex": "[,.;!?]"}, "MergedWithPrevious")}},
        "l3s_next": {"base": "llama3-small.json", "set": {"pre_tokenizer": split({"String": " "}, "MergedWithNext")}},
        "l3s_contiguous": {"base": "llama3-small.json",
                           "set": {"pre_tokenizer": split({"Regex": "\\p{P}"}, "Contiguous")}},
        "l3s_invert": {"base": "llama3-small.json",
                       "set": {"pre_tokenizer": split({"Regex": "\\p{L}+|\\p{N}"}, "Isolated", invert=True)}},
        "l3s_digits": {"base": "llama3-small.json", "set": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, bl_last]}}},
        "l3s_digit_runs": {"base": "llama3-small.json", "set": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "Split", "pattern": {"Regex": " ?\\p{L}+"}, "behavior": "Isolated", "invert": False},
            bl_last]}}},
        "l3s_flags": {"base": "llama3-small.json", "added": flagged_tokens(l3n), "set": {"post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "<|end_of_text|>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [l3n - 5], "tokens": ["<|begin_of_text|>"]},
                "<|end_of_text|>": {"id": "<|end_of_text|>", "ids": [l3n - 4], "tokens": ["<|end_of_text|>"]}}}}},
        "sps": {"base": "spbpe-small.json"},
        "sps_flags": {"base": "spbpe-small.json", "added": flagged_tokens(spn)},
        "sps_meta_first": {"base": "spbpe-small.json", "set": metaspace("first", True)},
        "sps_meta_first_nosplit": {"base": "spbpe-small.json", "set": metaspace("first", False)},
        "sps_meta_always": {"base": "spbpe-small.json", "set": metaspace("always", True)},
        "sps_meta_never": {"base": "spbpe-small.json", "set": metaspace("never", False)},
        "sps_meta_first_flags": {"base": "spbpe-small.json", "set": metaspace("first", True),
                                 "added": flagged_tokens(spn)},
        "sps_unk_fused": {"base": "spbpe-small.json", "model_set": {"byte_fallback": False, "fuse_unk": True}},
        "sps_unk": {"base": "spbpe-small.json", "model_set": {"byte_fallback": False, "fuse_unk": False}},
        "sps_dropped": {"base": "spbpe-small.json",
                        "model_set": {"byte_fallback": False, "unk_token": None}},
        "sps_replace_regex": {"base": "spbpe-small.json", "set": {"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"Regex": "[ \\t]+"}, "content": "\u2581"}]}}},
        "sps_strip2": {"base": "spbpe-small.json", "set": {"decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Strip", "content": " ", "start": 2, "stop": 1}]}}},
        "sps_nodecoder": {"base": "spbpe-small.json", "set": {"decoder": None}},
        "sps_bytelevel_decoder": {"base": "spbpe-small.json", "set": {"decoder": bl_decoder}},
    }
    return v


def apply_variant(bases, spec):
    j = json.loads(json.dumps(bases[spec["base"]]))
    for k, val in spec.get("set", {}).items():
        j[k] = val
    for k, val in spec.get("model_set", {}).items():
        j["model"][k] = val
    j["added_tokens"] = j["added_tokens"] + spec.get("added", [])
    return j


SCRIPTS = [
    "中文文本的分词测试，包括标点符号。", "日本語のテキスト、ひらがなとカタカナ（カタカナ）も。", "한국어 문장입니다. 띄어쓰기 포함!",
    "العربية: مرحبا بالعالم، كيف حالك؟", "עברית: שָׁלוֹם עוֹלָם", "हिन्दी में एक वाक्य है। क्षत्रिय", "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Русский текст с буквой ё и Ё.", "Ελληνικά: καλημέρα κόσμε, ΆΈΉ", "Հայերեն տեքստ", "ქართული ტექსტი", "தமிழ் உரை",
    "বাংলা লেখা", "ግዕዝ ፊደል", "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ", "བོད་ཡིག", "ភាសាខ្មែរ", "ພາສາລາວ", "မြန်မာစာ", "සිංහල",
    "Tiếng Việt có dấu: Hồ Chí Minh, người đẹp", "e\u0301 vs \u00e9, n\u0303, a\u030a\u0327", "Z̴̡̛a̶̢l̷g̸o̵ ̶t̸e̷x̶t̴",
    "ｆｕｌｌｗｉｄｔｈ　ＬＡＴＩＮ１２３", "𝐀𝐁𝐂 𝑥𝑦𝑧 𝟙𝟚𝟛", "ℕ ℤ ℚ ℝ ℂ ™ ℃", "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ", "ᐃᓄᒃᑎᑐᑦ",
    "Ǆǅǆ ǈ ß ẞ ŉ İı ſ", "ﬁ ﬂ ﬀ ligatures", "Ꙁ ꙁ Ⱑ", "☃ ★ ♞ ⚡ ∑ ∫ √ ≠ ≤ ∞", "₹ € ¥ £ ₿ $",
    "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵🇺🇸 flags", "👍🏽👍🏿 tones", "1️⃣ #️⃣ keycaps", "❤️ ♥︎ variation", "🏳️‍🌈 🧑🏽‍💻 zwj",
    "🫨 🪿 new emoji", "𱍐 𰀀 CJK ext", "𑼀𑼁 Kawi", "\u200b zero\u200cwidth\u200djoiner\ufeffbom", "\u202eRTL override\u202c",
    "a\u00adb soft hyphen", "Ĳ ĳ Ŀ ŀ", "ᚠᛇᚻ᛫ᛒᛦᚦ runes", "𓀀𓁀 hieroglyphs", "ꦗꦮ javanese",
]

SPACES = ["\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u180e", "\u200b", "\ufeff", "\u2009", "\u202f",
          "\u205f", "\u1680", "\t", "\x0b", "\x0c", "\r", "\u001c", "\u001f"]

WHITESPACE = [
    "", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n\n", " \n ", "\t\t\tx", "a  b", "a   b", "a \n b",
    "  leading", "trailing  ", "  both  ", "line1\nline2\r\nline3\rline4", "\n\n  indented\n\t\ttabbed\n",
    "x\n \n y", "  \n", "a\u00a0\u00a0b", "end with newline\n", " " * 17 + "x", "\t \t \t", "a\r\n\r\nb",
    "word\n\n\n\nword", "   \r\n   ", "1 2  3   4",
] + [f"a{w}{w}b" for w in SPACES] + [f"a{w}b" for w in SPACES] + [f"x {w}" for w in SPACES] + [
    f"{w}y" for w in SPACES]

DIGITS = ["1", "12", "123", "1234", "12345", "1234567", "12345678901234567890", "3.14159", "1,000,000",
          "2024-11-24", "0x1F 0b1010 1e-9", "٣٤٥ ٦٧٨٩", "१२३४", "①②③", "½ ¾", "Ⅻ ⅻ", "x² y³", "٫", "a1b22c333d4444"]

CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    '{"key": [1, 2, {"nested": null}], "s": "a\\"b"}',
    "<html><body class=\"x\">Hi &amp; bye</body></html>",
    "if [[ -n \"$x\" ]]; then echo \"${x}\" | grep -E '^a+$'; fi",
    "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
    "x = re.compile(r'(?i)\\s+\\S*')",
    "don't can't won't I'm you're he'll they've we'd it's",
    "DON'T I'M YOU'RE HE'LL THEY'VE WE'D IT'S 'S 'T",
    "'ſ 'K 'll'll''''", "rock'n'roll o'clock", "...!!!???---___", "a.b,c;d:e!f?g",
    "http://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
    "tab\tseparated\tvalues\n1\t2\t3",
]

SPECIAL_LLAMA3 = [
    "<|begin_of_text|>Hello", "Hello<|end_of_text|>", "a<|end_of_text|>b<|begin_of_text|>c",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    " <|eot_id|> ", "<|end_of_text", "<|begin_of_text|<|begin_of_text|>>", "<|reserved_special_token_7|>x",
    "<|begin_of_text|><|begin_of_text|>", "<s>[INST] hi [/INST]</s>",
]

SPECIAL_SP = [
    "<s>Hello", "Hello</s>", "a</s>b<s>c", "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello!</s>",
    " <s> Hello ", "<unk>", "<s><s>", "</s", "<0x41> as text", "text <s>", "<|begin_of_text|>",
]

FLAGS = [
    "call <tool>run</tool> now", "call   <tool>  run  </tool>   now", "<tool>", " <tool> ", "[X]", "a [X] b",
    "a   [X]   b", "[X][X]", "cat", "a cat sat", "concatenate", "cat_x", "_cat", "cat.", "(cat)", "dog days",
    "hotdog", "dog1", "New York", "new york", "in New York City", "New  York", "<a><b>x", "<a>b>x", "<a><b>",
    "<a><b", "b>xx", "<|norm|>", "a<|norm|>b", "café!", "caf é!", "é!", "  é!", "\u3000<tool>\u3000",
    "<tool>\n</tool>\n", "x<|begin_of_text|>y", "cat<tool>dog", "[X]cat[X]",
]


def shakespeare_slices(text, rng, count):
    out = []
    for _ in range(count):
        length = rng.choice([20, 60, 200, 500, 1000])
        off = rng.randrange(0, len(text) - length)
        out.append((off, length))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(REPO), "shared"))
    args = ap.parse_args()
    shared = args.shared
    os.makedirs(OUT, exist_ok=True)

    bases = small_bases(shared)
    for name, j in bases.items():
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
    var = variants(bases)

    files = {
        "llama3": os.path.join(shared, "tokenizers", "llama3-tokenizer.json"),
        "spbpe32k": os.path.join(shared, "tokenizers", "spbpe32k-tokenizer.json"),
    }
    toks = {name: Tokenizer.from_file(path) for name, path in files.items()}
    byte_level = {"llama3": True, "spbpe32k": False}
    for name, spec in var.items():
        j = apply_variant(bases, spec)
        toks[name] = Tokenizer.from_str(json.dumps(j))
        byte_level[name] = spec["base"].startswith("llama3")
        for t in j["added_tokens"]:  # HF must give the ids the file says
            assert toks[name].token_to_id(t["content"]) == t["id"], (name, t)

    shakespeare_path = os.path.join(shared, "data", "tinyshakespeare.txt")
    shakespeare = open(shakespeare_path, encoding="utf-8").read()
    assert shakespeare.isascii()  # offsets and lengths in characters are then byte offsets too
    rng = random.Random(13)
    slices = shakespeare_slices(shakespeare, rng, 30)

    # Long texts of everything mixed (kept once, in the header): whole documents reach the BPE model
    # of a file without pre-tokenizer, which cuts them where no merge can cross (data/bpe.h).
    mixed_rng = random.Random(5)
    long_mixed = []
    for _ in range(3):
        parts = SCRIPTS + WHITESPACE + DIGITS + CODE + SPECIAL_LLAMA3 + SPECIAL_SP
        mixed_rng.shuffle(parts)
        long_mixed.append("".join(parts))

    header = {
        "generator": "test/interop/make_tokenizer_golden.py",
        "tokenizers_version": tokenizers.__version__,
        "fnv": {name: fnv(open(path, "rb").read()) for name, path in files.items()},
        "base_fnv": {name: fnv(open(os.path.join(OUT, name), "rb").read()) for name in bases},
        "shakespeare_fnv": fnv(open(shakespeare_path, "rb").read()),
        "variants": var,
        "mixed_texts": long_mixed,
    }
    lines = [json.dumps({"header": header}, ensure_ascii=False)]

    def case(tok_name, text, with_added=False, text_field=None, hashed=False):
        tok = toks[tok_name]
        rec = {"tok": tok_name}
        rec.update(text_field if text_field is not None else {"text": text})
        if text in long_mixed:
            rec = {"tok": tok_name, "mixed": long_mixed.index(text)}
        ids = tok.encode(text, add_special_tokens=False).ids
        long = hashed or len(ids) > 3000
        if long:
            rec["ids_fnv"] = fnv(",".join(map(str, ids)).encode())
            rec["n"] = len(ids)
        else:
            rec["ids"] = ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        plain_added = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = False
        if plain != ids:
            rec["ids_plain"] = plain if not long else {"fnv": fnv(",".join(map(str, plain)).encode())}
        if with_added:
            rec["ids_added"] = tok.encode(text, add_special_tokens=True).ids
            rec["ids_plain_added"] = plain_added
        def text_of(t):  # long texts as {"fnv": ..., "lossy": whether HF wrote U+FFFD}
            return t if not long else {"fnv": fnv(t.encode("utf-8")), "lossy": "\ufffd" in t}
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            rec["decoded"] = text_of(decoded)
        skipped = tok.decode(ids, skip_special_tokens=True)
        if skipped != decoded:
            rec["decoded_skip"] = text_of(skipped)
        if plain != ids:
            dp = tok.decode(plain, skip_special_tokens=False)
            if dp != text:
                rec["decoded_plain"] = text_of(dp)
        lines.append(json.dumps({"case": rec}, ensure_ascii=False, separators=(",", ":")))

    general = SCRIPTS + WHITESPACE + DIGITS + CODE
    for name in ["llama3", "spbpe32k"]:
        for k, (off, length) in enumerate(slices):
            case(name, shakespeare[off:off + length], with_added=k < 3,
                 text_field={"shakespeare": [off, length]})
        for k, t in enumerate(general + SPECIAL_LLAMA3 + SPECIAL_SP):
            case(name, t, with_added=k % 10 == 0 or t in SPECIAL_LLAMA3 or t in SPECIAL_SP)
        case(name, shakespeare, text_field={"shakespeare": [0, len(shakespeare)]})
        for t in long_mixed:
            case(name, t, hashed=True)
        # Every line encoded alone: one record with the hash of all their ids.
        all_ids = [tok for line in shakespeare.split("\n") for tok in toks[name].encode(line, add_special_tokens=False).ids + [-1]]
        lines.append(json.dumps({"case": {"tok": name, "shakespeare_lines": True, "n": len(all_ids),
                                          "ids_fnv": fnv(",".join(map(str, all_ids)).encode())}}))
    # The variants on the small bases: texts that reach the component each one changes.
    short_slices = [sl for sl in slices if sl[1] <= 200][:2]
    for name in var:
        texts = (SPECIAL_LLAMA3[:5] if name.startswith("l3s") else SPECIAL_SP[:6]) + WHITESPACE[:18] + \
            DIGITS[:8] + CODE[:3] + CODE[7:9] + SCRIPTS[:3] + SCRIPTS[20:22] + ["   x", "▁▁x", " ▁ ", "x▁y"]
        if "flags" in name:
            texts = FLAGS + texts[:8]
        for off, length in short_slices:
            case(name, shakespeare[off:off + length], text_field={"shakespeare": [off, length]})
        for k, t in enumerate(texts):
            case(name, t, with_added=k % 6 == 0)
        case(name, long_mixed[0], hashed=True)

    # Decoding made-up ids, invalid UTF-8 among them.
    drng = random.Random(7)
    pieces = [b"\xe2\x82\xac", b"\xe2\x82", b"\x80", b"\xff", b"\xc3", b"\xf0\x9f\x99\x82", b"\xf0\x9f",
              b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xf8", b"a", b" ", b"\x00",
              b"\xc2\xa0", b"\xce\xb1"]
    for name in ["llama3", "spbpe32k"] + [n for n in var if n in ("l3s", "sps", "sps_meta_first", "sps_nodecoder")]:
        tok = toks[name]
        vocab = tok.get_vocab()
        for trial in range(40):
            seq = b"".join(drng.choice(pieces) for _ in range(drng.randint(1, 8)))
            if byte_level[name]:
                ids = [vocab[BYTE_CHAR[b]] for b in seq]
            else:
                ids = [vocab["<0x%02X>" % b] for b in seq]
            if trial % 3 == 1:  # among ordinary tokens
                word = tok.encode(" word", add_special_tokens=False).ids
                ids = word + ids + word
            if trial % 5 == 2:  # and special ones
                ids = [tok.token_to_id("<s>" if not byte_level[name] else (
                    "<|begin_of_text|>" if name == "llama3" else "<|begin_of_text|>"))] + ids
            rec = {"tok": name, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
            if byte_level[name]:
                rev = {i: s for s, i in vocab.items()}
                rec["bytes_hex"] = b"".join(token_bytes(rev[i]) for i in ids).hex()
            lines.append(json.dumps({"decode": rec}, ensure_ascii=False, separators=(",", ":")))

    # decode([id]) for every id of the two real files.
    for name in ["llama3", "spbpe32k"]:
        tok = toks[name]
        n = tok.get_vocab_size(with_added_tokens=True)
        texts = [tok.decode([i], skip_special_tokens=False) for i in range(n)]
        rec = {"tok": name, "n": n, "fnv": fnv("\0".join(texts).encode("utf-8"))}
        if byte_level[name]:
            rev = {i: s for s, i in tok.get_vocab(with_added_tokens=True).items()}
            added_ids = {i for i, t in tok.get_added_tokens_decoder().items()}
            rec["bytes_fnv"] = fnv(b"\0".join(
                rev[i].encode("utf-8") if i in added_ids else token_bytes(rev[i]) for i in range(n)))
        lines.append(json.dumps({"per_id": rec}, ensure_ascii=False))

    path = os.path.join(OUT, "golden.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}: {len(lines)} lines, {os.path.getsize(path)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
