// UTF-8 helpers: see data/utf8.h for the well-formedness table they follow.
#include "data/utf8.h"

namespace pv {

namespace {

// The continuation range of byte k (1-based) of a sequence with this lead byte; false for a lead
// byte that starts no sequence (continuation bytes, C0, C1, F5..FF).
bool sequence_shape(unsigned char lead, int& length, unsigned char& lo1, unsigned char& hi1) {
    lo1 = 0x80, hi1 = 0xBF;
    if (lead < 0x80) {
        length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        if (lead == 0xE0) lo1 = 0xA0;
        if (lead == 0xED) hi1 = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        if (lead == 0xF0) lo1 = 0x90;
        if (lead == 0xF4) hi1 = 0x8F;
    } else {
        return false;
    }
    return true;
}

// How many bytes of a sequence starting at s[i] fit the pattern (the lead byte counts one), and
// the sequence's full length; fitting == length means a complete character.
int fitting_bytes(std::string_view s, size_t i, int& length) {
    unsigned char lo1, hi1;
    if (!sequence_shape(static_cast<unsigned char>(s[i]), length, lo1, hi1)) {
        length = 0;
        return 0;
    }
    int k = 1;
    for (; k < length && i + k < s.size(); ++k) {
        const auto c = static_cast<unsigned char>(s[i + k]);
        const unsigned char lo = k == 1 ? lo1 : 0x80, hi = k == 1 ? hi1 : 0xBF;
        if (c < lo || c > hi) break;
    }
    return k;
}

}  // namespace

int utf8_char_length(std::string_view s, size_t i) {
    int length;
    const int fit = fitting_bytes(s, i, length);
    return length > 0 && fit == length ? length : 0;
}

bool utf8_valid(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const int n = utf8_char_length(s, i);
        if (n == 0) return false;
        i += size_t(n);
    }
    return true;
}

int utf8_invalid_length(std::string_view s, size_t i) {
    int length;
    const int fit = fitting_bytes(s, i, length);
    return fit > 0 ? fit : 1;
}

uint32_t utf8_decode(std::string_view s, size_t i, int len) {
    const auto b = [&](int k) { return uint32_t(static_cast<unsigned char>(s[i + k])); };
    switch (len) {
        case 1: return b(0);
        case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
        case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
        default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
    }
}

void utf8_append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | cp >> 6);
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | cp >> 12);
        out += char(0x80 | (cp >> 6 & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | cp >> 18);
        out += char(0x80 | (cp >> 12 & 0x3F));
        out += char(0x80 | (cp >> 6 & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

std::string utf8_lossy(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const int n = utf8_char_length(s, i);
        if (n > 0) {
            out.append(s.substr(i, size_t(n)));
            i += size_t(n);
        } else {
            out += "\xEF\xBF\xBD";  // U+FFFD
            i += size_t(utf8_invalid_length(s, i));
        }
    }
    return out;
}

bool utf8_ends_incomplete(std::string_view s) {
    // Only the last three bytes can hold the start of an unfinished sequence.
    for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
        const size_t i = s.size() - back;
        int length;
        const int fit = fitting_bytes(s, i, length);
        if (length > 1 && fit == int(back) && fit < length) return true;
    }
    return false;
}

bool is_unicode_whitespace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

const ByteLevelAlphabet& byte_level_alphabet() {
    static const ByteLevelAlphabet table = [] {
        ByteLevelAlphabet t;
        t.to_byte.fill(-1);
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
            utf8_append(t.to_utf8[size_t(b)], cp);
            t.to_byte[cp] = int16_t(b);
        }
        return t;
    }();
    return table;
}

bool byte_level_to_bytes(std::string_view s, std::string& out) {
    const ByteLevelAlphabet& t = byte_level_alphabet();
    out.clear();
    for (size_t i = 0; i < s.size();) {
        const int n = utf8_char_length(s, i);
        if (n == 0 || n > 2) return false;  // every alphabet character is 1 or 2 bytes of UTF-8
        const uint32_t cp = utf8_decode(s, i, n);
        if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return false;
        out += char(t.to_byte[cp]);
        i += size_t(n);
    }
    return true;
}

}  // namespace pv
