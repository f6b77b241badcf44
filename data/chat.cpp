// Chat formats: rendering, recognising templates, resolving --chat-format (data/chat.h).
#include "data/chat.h"

#include "io/input_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace pv {
namespace {

namespace fs = std::filesystem;

struct FormatInfo {
    ChatFormat format;
    const char* name;
    const char* models;
};

// clang-format off
constexpr FormatInfo kFormats[] = {
    {ChatFormat::llama3,   "llama3",   "Llama 3 Instruct: <|start_header_id|>role<|end_header_id|> headers, <|eot_id|>"},
    {ChatFormat::llama3_1, "llama3.1", "Llama 3.1/3.2/3.3 Instruct: llama3 with the dated system turn first"},
    {ChatFormat::llama2,   "llama2",   "Llama 2 chat, CodeLlama Instruct: <s>[INST] <<SYS>> ... [/INST] answer </s>"},
};
// clang-format on

// The Llama 3.1+ system turn's fixed lines (date_string's default in those templates).
constexpr const char* kLlama31DateLines = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

// Decodes one UTF-8 code point at s[i]; returns its length (0: not valid UTF-8 there).
size_t utf8_at(std::string_view s, size_t i, uint32_t& cp) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
        if ((b(i + k) & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (b(i + k) & 0x3F);
    }
    return n;
}

// Python's str.isspace(): characters of bidirectional type WS, B or S, or category Zs.
bool python_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

// What a Jinja template emits literally: its string literals (quotes removed, escapes decoded)
// and its raw text outside {{ }}, {% %} and {# #}.
std::vector<std::string> jinja_literals(std::string_view t) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < t.size()) {
        size_t open = i;  // the next {{, {% or {#
        for (;; ++open) {
            open = t.find('{', open);
            if (open == std::string_view::npos || open + 1 >= t.size()) open = std::string_view::npos;
            if (open == std::string_view::npos || t[open + 1] == '{' || t[open + 1] == '%' || t[open + 1] == '#') break;
        }
        if (open == std::string_view::npos) {
            out.emplace_back(t.substr(i));
            break;
        }
        if (open > i) out.emplace_back(t.substr(i, open - i));
        const char kind = t[open + 1];
        const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        i = open + 2;
        if (kind == '#') {  // a comment
            const size_t end = t.find(close, i);
            i = end == std::string_view::npos ? t.size() : end + 2;
            continue;
        }
        while (i < t.size() && t.compare(i, 2, close) != 0) {
            if (t[i] != '\'' && t[i] != '"') {
                ++i;
                continue;
            }
            const char quote = t[i++];
            std::string lit;
            for (; i < t.size() && t[i] != quote; ++i) {
                if (t[i] == '\\' && i + 1 < t.size()) {
                    const char e = t[++i];
                    lit += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
                } else {
                    lit += t[i];
                }
            }
            ++i;  // the closing quote
            out.push_back(std::move(lit));
        }
        i = std::min(t.size(), i + 2);
    }
    return out;
}

std::string trimmed(std::string_view s) { return std::string(python_strip(s)); }

void llama3_message(std::vector<ChatPiece>& out, const ChatMessage& m) {
    const PieceTarget t = m.role == ChatRole::assistant ? PieceTarget::answer : PieceTarget::prompt;
    out.push_back({"<|start_header_id|>", true, PieceTarget::prompt});
    out.push_back({chat_role_name(m.role), false, PieceTarget::prompt});
    out.push_back({"<|end_header_id|>", true, PieceTarget::prompt});
    out.push_back({"\n\n", false, PieceTarget::prompt});
    out.push_back({trimmed(m.content), false, t});
    out.push_back({"<|eot_id|>", true, t});
}

std::vector<ChatPiece> llama3_pieces(const std::vector<ChatMessage>& messages, bool dated_system) {
    std::vector<ChatPiece> out;
    out.push_back({"<|begin_of_text|>", true, PieceTarget::prompt});
    size_t first = 0;
    if (dated_system) {
        std::string system;
        if (messages[0].role == ChatRole::system) system = trimmed(messages[0].content), first = 1;
        out.push_back({"<|start_header_id|>", true, PieceTarget::prompt});
        out.push_back({"system", false, PieceTarget::prompt});
        out.push_back({"<|end_header_id|>", true, PieceTarget::prompt});
        out.push_back({std::string("\n\n") + kLlama31DateLines + system, false, PieceTarget::prompt});
        out.push_back({"<|eot_id|>", true, PieceTarget::prompt});
    }
    for (size_t i = first; i < messages.size(); ++i) llama3_message(out, messages[i]);
    return out;
}

std::vector<ChatPiece> llama2_pieces(const std::vector<ChatMessage>& messages) {
    size_t first = 0;
    std::string system_block;
    if (messages[0].role == ChatRole::system) {
        system_block = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
        first = 1;
    }
    if (first == messages.size())
        throw std::invalid_argument("the llama2 chat format needs a user message after the system message");
    std::vector<ChatPiece> out;
    for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        const ChatRole expected = (i - first) % 2 == 0 ? ChatRole::user : ChatRole::assistant;
        if (m.role != expected)
            throw std::invalid_argument("message " + std::to_string(i) + " is " + chat_role_name(m.role) +
                                        " where the llama2 chat format needs " + chat_role_name(expected) +
                                        ": after an optional first system message, user and assistant "
                                        "messages alternate, starting with user");
        if (m.role == ChatRole::user) {
            const std::string content = i == first ? system_block + m.content : m.content;
            out.push_back({"<s>", true, PieceTarget::prompt});
            out.push_back({"[INST] " + trimmed(content) + " [/INST]", false, PieceTarget::prompt});
        } else {
            out.push_back({" " + trimmed(m.content) + " ", false, PieceTarget::answer});
            out.push_back({"</s>", true, PieceTarget::answer});
        }
    }
    return out;
}

}  // namespace

std::string_view python_strip(std::string_view s) {
    size_t begin = 0, end = s.size();
    uint32_t cp = 0;
    while (begin < end) {
        const size_t n = utf8_at(s, begin, cp);
        if (n == 0 || !python_space(cp)) break;
        begin += n;
    }
    while (end > begin) {
        size_t start = end - 1;  // back up to the lead byte of the last code point (at most 3 steps)
        while (start > begin && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        const size_t n = utf8_at(s, start, cp);
        if (n != end - start || !python_space(cp)) break;
        end = start;
    }
    return s.substr(begin, end - begin);
}

std::string chat_format_name(ChatFormat f) {
    for (const FormatInfo& i : kFormats)
        if (i.format == f) return i.name;
    return "?";
}

std::vector<std::string> chat_format_names() {
    std::vector<std::string> names;
    for (const FormatInfo& i : kFormats) names.push_back(i.name);
    return names;
}

std::string chat_format_list() {
    std::string s;
    for (const FormatInfo& i : kFormats) s += (s.empty() ? "" : "; ") + std::string(i.name) + " (" + i.models + ")";
    return s;
}

ChatFormat parse_chat_format(const std::string& name) {
    for (const FormatInfo& i : kFormats)
        if (name == i.name) return i.format;
    throw std::invalid_argument("unknown chat format '" + name + "'; the formats are: " + chat_format_list());
}

std::optional<ChatFormat> recognise_chat_template(std::string_view jinja) {
    const std::vector<std::string> lit = jinja_literals(jinja);
    const auto has = [&](std::string_view piece) {
        return std::any_of(lit.begin(), lit.end(), [&](const std::string& l) { return l == piece; });
    };
    const auto has_inside = [&](std::string_view piece) {
        return std::any_of(lit.begin(), lit.end(),
                           [&](const std::string& l) { return l.find(piece) != std::string::npos; });
    };
    const auto uses = [&](std::string_view word) { return jinja.find(word) != std::string_view::npos; };
    const bool strips = uses("trim") || uses(".strip()");
    if (has("[INST] ") && has(" [/INST]") && has("<<SYS>>\n") && has("\n<</SYS>>\n\n") && uses("bos_token") &&
        uses("eos_token") && strips)
        return ChatFormat::llama2;
    const bool headers = has("<|start_header_id|>") && has("<|end_header_id|>\n\n") && has("<|eot_id|>") && strips;
    if (headers && has_inside("Cutting Knowledge Date: December 2023\n") && has_inside("26 Jul 2024"))
        return ChatFormat::llama3_1;
    if (headers && !has_inside("Cutting Knowledge Date") && (uses("bos_token") || has_inside("<|begin_of_text|>")))
        return ChatFormat::llama3;
    return std::nullopt;
}

std::string tokenizer_config_beside(const std::string& tokenizer_path) {
    return (fs::path(tokenizer_path).parent_path() / "tokenizer_config.json").string();
}

ChatFormat resolve_chat_format(const std::string& name, const std::string& config_path) {
    if (!name.empty()) return parse_chat_format(name);
    const std::string fix = "; pass --chat-format NAME if the model's chats look like one of: " + chat_format_list();
    std::error_code ec;
    if (config_path.empty() || !fs::is_regular_file(config_path, ec))
        throw std::invalid_argument(
            "the data has chats but no chat format: there is no tokenizer_config.json " +
            (config_path.empty() ? std::string("(no tokenizer was given)") : "at '" + config_path + "'") +
            " with a chat_template to recognise" + fix);
    const std::string text = read_input_file(config_path, "tokenizer config", kMaxJsonFileBytes);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error("'" + config_path + "': not JSON (" + e.what() + ")");
    }
    std::string jinja;
    if (j.is_object() && j.contains("chat_template")) {
        const nlohmann::json& t = j["chat_template"];
        if (t.is_string()) jinja = t.get<std::string>();
        if (t.is_array())  // named templates: the default one renders plain chats
            for (const nlohmann::json& e : t)
                if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
                    e["template"].is_string())
                    jinja = e["template"].get<std::string>();
    }
    if (jinja.empty())
        throw std::invalid_argument("the data has chats but '" + config_path + "' has no chat_template" + fix);
    if (const auto f = recognise_chat_template(jinja)) return *f;
    throw std::invalid_argument("the chat_template in '" + config_path +
                                "' is none polevault knows (there is no Jinja engine: the known formats are "
                                "written out and recognised by their text)" +
                                fix);
}

const char* chat_role_name(ChatRole r) {
    return r == ChatRole::system ? "system" : r == ChatRole::user ? "user" : "assistant";
}

std::optional<ChatRole> parse_chat_role(std::string_view s) {
    if (s == "system") return ChatRole::system;
    if (s == "user") return ChatRole::user;
    if (s == "assistant") return ChatRole::assistant;
    return std::nullopt;
}

std::string chat_generation_prompt(ChatFormat f) {
    return f == ChatFormat::llama2 ? "" : "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

std::vector<ChatPiece> chat_pieces(ChatFormat f, const std::vector<ChatMessage>& messages) {
    if (messages.empty()) throw std::invalid_argument("the chat has no messages");
    switch (f) {
        case ChatFormat::llama3: return llama3_pieces(messages, false);
        case ChatFormat::llama3_1: return llama3_pieces(messages, true);
        case ChatFormat::llama2: return llama2_pieces(messages);
    }
    throw std::invalid_argument("unknown chat format");
}

std::vector<std::string> chat_special_tokens(ChatFormat f) {
    if (f == ChatFormat::llama2) return {"<s>", "</s>"};
    return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
}

}  // namespace pv
