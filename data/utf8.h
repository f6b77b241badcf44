// UTF-8 helpers for the tokenizer: stepping over characters of text that may be invalid, the
// replacement Hugging Face's decoders make of invalid bytes, and GPT-2's byte-to-unicode table.
// Host code only.
//
// Well-formed UTF-8 (Unicode 15, table 3-7): a lead byte and its continuation ranges
//   00..7F                  one byte
//   C2..DF 80..BF           two
//   E0 A0..BF 80..BF, E1..EC 80..BF 80..BF, ED 80..9F 80..BF, EE..EF 80..BF 80..BF
//   F0 90..BF 80..BF 80..BF, F1..F3 80..BF x3, F4 80..8F 80..BF 80..BF
// Anything else is invalid. The "maximal subpart" of an invalid sequence is its lead byte plus
// the continuation bytes that still fit the pattern (at least one byte); Rust's
// String::from_utf8_lossy, which Hugging Face `tokenizers` uses, writes one U+FFFD per maximal
// subpart, and so does utf8_lossy here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace pv {

// The character at s[i]: its length in bytes when s[i..] starts a complete well-formed sequence,
// else 0 (an invalid byte, or a sequence cut off by the end of s).
int utf8_char_length(std::string_view s, size_t i);

// Whether all of s is well-formed UTF-8.
bool utf8_valid(std::string_view s);

// Bytes of the maximal subpart at s[i] (1..3) when utf8_char_length is 0; the step an iteration
// over possibly invalid text takes so that it agrees with utf8_lossy.
int utf8_invalid_length(std::string_view s, size_t i);

// The code point of the complete sequence of `len` bytes at s[i].
uint32_t utf8_decode(std::string_view s, size_t i, int len);

// Appends the UTF-8 encoding of code point cp (< 0x110000).
void utf8_append(std::string& out, uint32_t cp);

// s with every maximal invalid subpart replaced by U+FFFD: what Hugging Face returns where
// polevault's byte-level decode returns the bytes themselves.
std::string utf8_lossy(std::string_view s);

// Whether s ends inside a sequence that more bytes could still complete (e.g. "\xE2\x82" of
// "\xE2\x82\xAC"): a streaming decoder holds such a tail back.
bool utf8_ends_incomplete(std::string_view s);

// Rust's char::is_whitespace (the Unicode White_Space property), which the added-token flags
// lstrip/rstrip use.
bool is_unicode_whitespace(uint32_t cp);

// GPT-2's byte-to-unicode table, the alphabet of byte-level BPE vocabularies: the 188 printable
// bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to the code point of the same value, the other 68,
// in byte order, to U+0100, U+0101, ... so every byte is a visible character.
struct ByteLevelAlphabet {
    std::array<std::string, 256> to_utf8;  // byte -> its character, UTF-8 encoded (1 or 2 bytes)
    std::array<int16_t, 0x144> to_byte;    // code point -> byte, -1 where no byte maps to it
};
const ByteLevelAlphabet& byte_level_alphabet();

// The bytes a string of alphabet characters stands for; false when s holds anything else.
bool byte_level_to_bytes(std::string_view s, std::string& out);

}  // namespace pv
