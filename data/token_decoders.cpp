// The decoder chain: token strings -> text, one Hugging Face decoder step after the other
// (data/tokenizer_parts.h). Each step maps a list of strings to a list of strings, as HF's
// Decoder::decode_chain does; the result is their concatenation.
//
//   ByteLevel     all tokens -> one string: each alphabet character becomes its byte (a token with
//                 any other character is kept as its UTF-8). HF then replaces invalid UTF-8 by
//                 U+FFFD; polevault keeps the bytes, so any byte string round-trips.
//   Replace       per token, every occurrence of the pattern by the content (e.g. "▁" -> " ").
//   ByteFallback  a run of consecutive "<0xNN>" tokens becomes the string of its bytes when they are
//                 valid UTF-8, else one U+FFFD per byte (HF's rule, which utf8_lossy does not follow).
//   Fuse          all tokens -> one string.
//   Strip         per token, up to `start` leading and `stop` trailing copies of one character.
//   Metaspace     per token, the replacement character -> ' ', except in the first token, where it is
//                 dropped (unless the prepend scheme is "never").
#include "data/tokenizer_parts.h"

#include "data/utf8.h"

namespace pv::tok {

namespace {

// The byte of a "<0xNN>" token (two hex digits, either case), or -1.
int fallback_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; ++i) {
        const char c = t[size_t(i)];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

std::vector<std::string> byte_level(std::vector<std::string> tokens) {
    std::string out, bytes;
    for (const std::string& t : tokens) {
        if (byte_level_to_bytes(t, bytes))
            out += bytes;
        else
            out += t;
    }
    return {out};
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
    std::vector<std::string> out;
    std::string run;  // bytes of the current run of <0xNN> tokens
    size_t run_tokens = 0;
    auto flush = [&] {
        if (run_tokens == 0) return;
        if (utf8_valid(run)) {
            out.push_back(run);
        } else {
            for (size_t i = 0; i < run_tokens; ++i) out.emplace_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_tokens = 0;
    };
    for (std::string& t : tokens) {
        if (const int b = fallback_byte(t); b >= 0) {
            run += char(b);
            ++run_tokens;
        } else {
            flush();
            out.push_back(std::move(t));
        }
    }
    flush();
    return out;
}

std::vector<std::string> replace(const DecoderStep& step, std::vector<std::string> tokens) {
    std::vector<std::pair<size_t, size_t>> matches;
    for (std::string& t : tokens) {
        step.pattern.find_all(t, matches);
        if (matches.empty()) continue;
        std::string r;
        size_t prev = 0;
        for (auto [b, e] : matches) {
            r.append(t, prev, b - prev);
            r += step.text;
            prev = e;
        }
        r.append(t, prev, std::string::npos);
        t.swap(r);
    }
    return tokens;
}

std::vector<std::string> strip(const DecoderStep& step, std::vector<std::string> tokens) {
    std::string c;
    utf8_append(c, step.strip_char);
    for (std::string& t : tokens) {
        size_t begin = 0, end = t.size();
        for (int i = 0; i < step.strip_start && t.compare(begin, c.size(), c) == 0; ++i) begin += c.size();
        for (int i = 0; i < step.strip_stop && end >= begin + c.size() && t.compare(end - c.size(), c.size(), c) == 0;
             ++i)
            end -= c.size();
        t = t.substr(begin, end - begin);
    }
    return tokens;
}

std::vector<std::string> metaspace(const DecoderStep& step, std::vector<std::string> tokens) {
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::string& t = tokens[i];
        std::string r;
        for (size_t at = 0; at < t.size();) {
            if (t.compare(at, step.text.size(), step.text) == 0) {
                if (!(i == 0 && step.metaspace_first)) r += ' ';
                at += step.text.size();
            } else {
                r += t[at++];
            }
        }
        tokens[i] = std::move(r);
    }
    return tokens;
}

}  // namespace

std::string run_decoders(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens) {
    for (const DecoderStep& step : steps) {
        switch (step.kind) {
            case DecoderStep::Kind::byte_level: tokens = byte_level(std::move(tokens)); break;
            case DecoderStep::Kind::replace: tokens = replace(step, std::move(tokens)); break;
            case DecoderStep::Kind::byte_fallback: tokens = byte_fallback(std::move(tokens)); break;
            case DecoderStep::Kind::fuse: {
                std::string all;
                for (const std::string& t : tokens) all += t;
                tokens = {all};
                break;
            }
            case DecoderStep::Kind::strip: tokens = strip(step, std::move(tokens)); break;
            case DecoderStep::Kind::metaspace: tokens = metaspace(step, std::move(tokens)); break;
        }
    }
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
}

}  // namespace pv::tok
