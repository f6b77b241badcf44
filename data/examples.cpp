// Training examples: reading, encoding to tokens and flags, rendering with the counted tokens
// marked (data/examples.h).
#include "data/examples.h"

#include "io/input_file.h"
#include "data/shard.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>

namespace pv {
namespace {

namespace fs = std::filesystem;

// A piece to encode: plain text, a special token's text, or a token given by id (BOS, EOS).
struct Piece {
    std::string text;
    bool special = false;
    int id = -1;
    PieceTarget target = PieceTarget::prompt;
};

[[noreturn]] void fail(const std::string& where, const std::string& what) {
    throw std::runtime_error(where + ": " + what);
}

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// The input file opened for reading; throws naming the file when it is missing, a directory or
// unreadable.
File open_input(const std::string& path) {
    const std::string where = "input '" + path + "'";
    std::error_code ec;
    if (fs::is_directory(path, ec)) fail(where, "is a directory; pass the files in it");
    InputFile in = open_input_file(path, "input", "check the path and its permissions");  // regular files only
    File f(::fdopen(in.fd(), "rb"), &std::fclose);
    if (!f) fail(where, "cannot read: " + std::string(std::strerror(errno)));
    in.release();  // the FILE owns the descriptor now
    return f;
}

// Calls on_chunk(bytes, n) for the file's bytes in order until it returns false.
template <class F>
void read_chunks(const std::string& path, F&& on_chunk) {
    File f = open_input(path);
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0)
        if (!on_chunk(buf, n)) return;
    if (std::ferror(f.get())) fail("input '" + path + "'", "read failed: " + std::string(std::strerror(errno)));
}

// Calls on_line(line, number) for each '\n'-separated line (the last may lack the '\n'; nothing
// after a final '\n' is a line), numbered from 1, until it returns false.
template <class F>
void for_each_line(const std::string& path, F&& on_line) {
    std::string line;
    size_t number = 0;
    bool more = true;
    read_chunks(path, [&](const char* bytes, size_t n) {
        for (size_t begin = 0; more && begin < n;) {
            const void* nl = std::memchr(bytes + begin, '\n', n - begin);
            const size_t end = nl ? size_t(static_cast<const char*>(nl) - bytes) : n;
            line.append(bytes + begin, end - begin);
            begin = end + 1;
            if (!nl) break;
            more = on_line(std::string_view(line), ++number);
            line.clear();
        }
        return more;
    });
    if (more && !line.empty()) on_line(std::string_view(line), ++number);
}

const std::string& string_field(const nlohmann::json& j, const char* key, const std::string& where,
                                const std::string& fix) {
    const nlohmann::json& v = j.at(key);
    if (!v.is_string())
        fail(where, "field \"" + std::string(key) + "\" holds a JSON " + v.type_name() + ", not a string; " + fix);
    return v.get_ref<const std::string&>();
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& m, const std::string& where) {
    const std::string shape = "a chat is {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]}";
    if (!m.is_array())
        fail(where, "\"messages\" holds a JSON " + std::string(m.type_name()) + ", not an array; " + shape);
    if (m.empty()) fail(where, "\"messages\" is empty; " + shape + " with at least one message");
    std::vector<ChatMessage> out;
    for (size_t i = 0; i < m.size(); ++i) {
        const std::string at = where + ": message " + std::to_string(i);
        const nlohmann::json& e = m[i];
        if (!e.is_object()) fail(at, "is a JSON " + std::string(e.type_name()) + ", not an object; " + shape);
        if (!e.contains("role") || !e.contains("content"))
            fail(at, std::string("has no \"") + (e.contains("role") ? "content" : "role") + "\"; " + shape);
        const nlohmann::json& role = e["role"];
        const std::optional<ChatRole> r = role.is_string() ? parse_chat_role(role.get<std::string>()) : std::nullopt;
        if (!r)
            fail(at, "has role " + role.dump() +
                         "; the roles are \"system\", \"user\" and \"assistant\" (tool calls are not supported)");
        const std::string fix = "the content of a message is its text";
        out.push_back({*r, string_field(e, "content", at, fix)});
    }
    return out;
}

// How many leading ids a and b share.
size_t common_prefix(const std::vector<int>& a, const std::vector<int>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

void encode_pieces(const Tokenizer& tok, const std::vector<Piece>& pieces, bool train_on_prompt,
                   std::vector<uint32_t>& tokens, std::vector<uint8_t>& flags) {
    const auto emit = [&](int id, PieceTarget t) {
        tokens.push_back(uint32_t(id));
        flags.push_back(t == PieceTarget::answer || train_on_prompt ? kTokenCounted : 0);
    };
    for (size_t i = 0; i < pieces.size();) {
        const Piece& p = pieces[i];
        if (p.id >= 0) {
            emit(p.id, p.target), ++i;
            continue;
        }
        if (p.special) {
            const std::vector<int> ids = tok.encode(p.text, /*parse_special=*/true);
            if (ids.size() != 1)
                throw std::runtime_error("the tokenizer has no special token \"" + p.text + "\" (it encodes as " +
                                         std::to_string(ids.size()) + " tokens)");
            emit(ids[0], p.target), ++i;
            continue;
        }
        // A run of plain pieces up to the next special one, adjacent ones of one target joined.
        std::vector<std::pair<std::string, PieceTarget>> parts;
        for (; i < pieces.size() && !pieces[i].special && pieces[i].id < 0; ++i) {
            if (pieces[i].text.empty()) continue;
            if (!parts.empty() && parts.back().second == pieces[i].target)
                parts.back().first += pieces[i].text;
            else
                parts.push_back({pieces[i].text, pieces[i].target});
        }
        std::string run, prefix;
        for (const auto& part : parts) run += part.first;
        const std::vector<int> ids = tok.encode(run, /*parse_special=*/false);
        size_t begin = 0;
        for (size_t m = 0; m < parts.size(); ++m) {
            size_t end = ids.size();
            if (m + 1 < parts.size()) {
                prefix += parts[m].first;
                end = std::max(begin, common_prefix(tok.encode(prefix, false), ids));
            }
            for (size_t k = begin; k < end; ++k) emit(ids[k], parts[m].second);
            begin = end;
        }
    }
}

std::vector<Piece> example_pieces(const Tokenizer& tok, const Example& e, const std::optional<ChatFormat>& format) {
    std::vector<Piece> out;
    if (e.kind == ExampleKind::chat) {
        if (!format) throw std::runtime_error("the data has chats but no chat format was chosen");
        for (ChatPiece& c : chat_pieces(*format, e.messages))
            out.push_back({std::move(c.text), c.special, -1, c.target});
        return out;
    }
    if (tok.eos_id() < 0) throw std::runtime_error("the tokenizer has no end-of-sequence token to end a document with");
    if (e.kind == ExampleKind::text) {
        out.push_back({e.text, false, -1, PieceTarget::answer});
    } else {
        if (tok.bos_id() >= 0) out.push_back({"", false, tok.bos_id(), PieceTarget::prompt});
        out.push_back({e.prompt, false, -1, PieceTarget::prompt});
        out.push_back({e.completion, false, -1, PieceTarget::answer});
    }
    out.push_back({"", false, tok.eos_id(), PieceTarget::answer});
    return out;
}

bool has_assistant(const Example& e) {
    return std::any_of(e.messages.begin(), e.messages.end(),
                       [](const ChatMessage& m) { return m.role == ChatRole::assistant; });
}

}  // namespace

bool is_json_lines(const std::string& path) {
    std::string ext = fs::path(path).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return ext == ".jsonl" || ext == ".ndjson";
}

std::optional<Example> parse_example_line(std::string_view line, const std::string& text_field,
                                          const std::string& where) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return std::nullopt;  // blank
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line.begin(), line.end());
    } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number beyond a double (2e999)
        fail(where, std::string("not JSON (") + e.what() + "); a .jsonl file holds one JSON object per line");
    }
    if (!j.is_object())
        fail(where,
             std::string("a JSON ") + j.type_name() + ", not an object; a .jsonl file holds one JSON object per line");
    Example e;
    e.where = where;
    if (j.contains("messages")) {
        e.kind = ExampleKind::chat;
        e.messages = parse_messages(j["messages"], where);
    } else if (j.contains("prompt") || j.contains("completion")) {
        const std::string fix = "an instruction example is {\"prompt\": \"...\", \"completion\": \"...\"}";
        if (!j.contains("prompt") || !j.contains("completion"))
            fail(where, std::string("has \"") + (j.contains("prompt") ? "prompt" : "completion") + "\" but no \"" +
                            (j.contains("prompt") ? "completion" : "prompt") + "\"; " + fix);
        e.kind = ExampleKind::prompt_completion;
        e.prompt = string_field(j, "prompt", where, fix);
        e.completion = string_field(j, "completion", where, fix);
    } else if (j.contains(text_field)) {
        e.text = string_field(j, text_field.c_str(), where,
                              "name the field that holds the document text (--field / text_field)");
    } else {
        fail(where, "the object has no field \"" + text_field +
                        "\" (nor \"messages\" or \"prompt\"/\"completion\"); a line is {\"" + text_field +
                        "\": \"...\"}, {\"prompt\": ..., \"completion\": ...} or {\"messages\": [...]}; name the "
                        "field that holds the document text (--field / text_field)");
    }
    return e;
}

std::vector<Example> read_examples(const std::string& path, const std::string& text_field, size_t limit) {
    std::vector<Example> out;
    if (limit == 0) return out;
    if (!is_json_lines(path)) {
        std::string text;
        read_chunks(path, [&](const char* bytes, size_t n) {
            text.append(bytes, n);
            return true;
        });
        if (!text.empty()) out.push_back({ExampleKind::text, std::move(text), {}, {}, {}, "input '" + path + "'"});
        return out;
    }
    for_each_line(path, [&](std::string_view line, size_t number) {
        std::optional<Example> e =
            parse_example_line(line, text_field, "input '" + path + "' line " + std::to_string(number));
        if (e && !(e->kind == ExampleKind::text && e->text.empty())) out.push_back(std::move(*e));
        return out.size() < limit;
    });
    return out;
}

void check_example(const Example& e, const ExampleEncoding& how) {
    if (e.kind != ExampleKind::chat) return;
    try {
        if (!how.chat_format) throw std::runtime_error("the data has chats but no chat format was chosen");
        (void)chat_pieces(*how.chat_format, e.messages);
        if (!how.train_on_prompt && !has_assistant(e))
            throw std::runtime_error(
                "the chat has no assistant message, so none of its tokens would be trained on; add the answer, or "
                "pass --train-on-prompt to train on every message");
    } catch (const std::exception& x) {
        fail(e.where, x.what() + (how.chat_format ? " (chat format " + chat_format_name(*how.chat_format) + ")" : ""));
    }
}

void encode_example(const Tokenizer& tok, const Example& e, const ExampleEncoding& how, std::vector<uint32_t>& tokens,
                    std::vector<uint8_t>& flags) {
    check_example(e, how);
    const size_t first = tokens.size();
    try {
        encode_pieces(tok, example_pieces(tok, e, how.chat_format), how.train_on_prompt, tokens, flags);
    } catch (const std::exception& x) {
        tokens.resize(first), flags.resize(first);
        const std::string format = e.kind == ExampleKind::chat && how.chat_format
                                       ? " (chat format " + chat_format_name(*how.chat_format) + ")"
                                       : "";
        fail(e.where, x.what() + format);
    }
    if (tokens.size() == first) return;
    if (e.kind == ExampleKind::text) {
        for (size_t i = first; i < flags.size(); ++i) flags[i] |= kTokenSplittable;
    } else {
        flags[first] &= uint8_t(~kTokenCounted);  // nothing in the example predicts its first token
    }
    flags[first] |= kTokenStartsDocument;
}

std::string example_training_text(const Example& e, const std::optional<ChatFormat>& chat_format) {
    if (e.kind == ExampleKind::text) return e.text;
    if (e.kind == ExampleKind::prompt_completion) return e.prompt + e.completion;
    if (!chat_format) fail(e.where, "the data has chats but no chat format was chosen");
    std::string s;
    for (const ChatPiece& p : chat_pieces(*chat_format, e.messages)) s += p.text;
    return s;
}

void check_chat_tokens(const Tokenizer& tok, const ChatFormat& f) {
    for (const std::string& s : chat_special_tokens(f)) {
        const size_t n = tok.encode(s, /*parse_special=*/true).size();
        if (n != 1)
            throw std::runtime_error("the tokenizer has no special token \"" + s + "\", which the " +
                                     chat_format_name(f) + " chat format writes (it encodes as " + std::to_string(n) +
                                     " tokens): use the model's own tokenizer.json, or the model's chat template "
                                     "(--chat-template FILE.jinja, or --chat-format: " +
                                     chat_format_list() + ")");
    }
}

void add_tokenizer_specials(ChatFormat& f, const Tokenizer& tok) {
    for (std::string& s : tok.added_token_texts())
        if (std::find(f.special_tokens.begin(), f.special_tokens.end(), s) == f.special_tokens.end())
            f.special_tokens.push_back(std::move(s));
}

std::string render_counted(const Tokenizer& tok, const std::string& path, const RenderOptions& o) {
    std::optional<ChatFormat> format;
    std::string out;
    int shown = 0;
    for (const Example& e : read_examples(path, o.text_field, size_t(std::max(0, o.examples)))) {
        if (e.kind == ExampleKind::chat && !format) {
            format = resolve_chat_format(o.chat_format, o.tokenizer_config, o.chat_template);
            add_tokenizer_specials(*format, tok);
            check_chat_tokens(tok, *format);
        }
        std::vector<uint32_t> tokens;
        std::vector<uint8_t> flags;
        encode_example(tok, e, ExampleEncoding{format, o.train_on_prompt}, tokens, flags);
        const std::vector<int> ids(tokens.begin(), tokens.end());
        long long counted = 0;
        for (uint8_t f : flags) counted += (f & kTokenCounted) != 0;
        const char* kind = e.kind == ExampleKind::text   ? "text"
                           : e.kind == ExampleKind::chat ? "chat"
                                                         : "prompt/completion";
        out += (shown ? "\n" : "") + e.where + ": " + kind +
               (e.kind == ExampleKind::chat ? " (" + chat_format_name(*format) + ")" : "") + ", " +
               std::to_string(ids.size()) + " tokens, " + std::to_string(counted) + " counted\n";
        // Each span of equal counted bits decoded as the difference of the decoded prefixes (a
        // decoder may treat a sequence's start specially, e.g. strip a leading space), or on its
        // own where that is not a prefix.
        std::string before;  // decode(ids[0, begin))
        for (size_t begin = 0; begin < ids.size();) {
            size_t end = begin;
            const bool count = flags[begin] & kTokenCounted;
            while (end < ids.size() && bool(flags[end] & kTokenCounted) == count) ++end;
            const std::string upto = tok.decode(std::vector<int>(ids.begin(), ids.begin() + long(end)));
            const std::string span =
                upto.compare(0, before.size(), before) == 0
                    ? upto.substr(before.size())
                    : tok.decode(std::vector<int>(ids.begin() + long(begin), ids.begin() + long(end)));
            if (count)
                out += std::string(o.colour ? "\x1b[32m" : "") + kCountedOpen + span + kCountedClose +
                       (o.colour ? "\x1b[0m" : "");
            else
                out += span;
            before = upto;
            begin = end;
        }
        out += "\n";
        ++shown;
    }
    if (shown == 0) out = "input '" + path + "': no examples\n";
    return out;
}

}  // namespace pv
