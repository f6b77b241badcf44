// Chat formats: built-in templates, resolving --chat-format / --chat-template / tokenizer_config.json,
// rendering through the Jinja subset into special and plain pieces with their targets (data/chat.h).
#include "data/chat.h"

#include "data/jinja.h"

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

// The published templates, as tokenizer_config.json holds them once its JSON is decoded (the files
// under test/data/chat_templates/ are the same texts; its README says where each came from).
// Llama 3.0: Meta-Llama-3-8B-Instruct.
constexpr const char* kLlama3Source = R"JINJA({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})JINJA";
// Llama 3.1 / 3.3 Instruct (the fixed "26 Jul 2024"; 3.2's strftime_now variant is a fixture).
constexpr const char* kLlama31Source = R"JINJA({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|}\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>" }}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
            {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" }}
{%- endif %})JINJA";
// Llama-2-*-chat-hf.
constexpr const char* kLlama2Source = R"JINJA({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})JINJA";

struct FormatInfo {
    const char* name;
    const char* models;
    const char* source;
    const char* bos;
    const char* eos;
    std::vector<std::string> specials;
};

const std::vector<FormatInfo>& formats() {
    static const std::vector<FormatInfo> f = {
        {"llama3", "Llama 3 Instruct: <|start_header_id|>role<|end_header_id|> headers, <|eot_id|>", kLlama3Source,
         "<|begin_of_text|>", "<|eot_id|>", {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}},
        {"llama3.1", "Llama 3.1/3.3 Instruct: llama3 with the dated system turn first", kLlama31Source,
         "<|begin_of_text|>", "<|eot_id|>", {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}},
        {"llama2", "Llama 2 chat: <s>[INST] <<SYS>> ... [/INST] answer </s>", kLlama2Source, "<s>", "</s>",
         {"<s>", "</s>"}},
    };
    return f;
}

ChatFormat builtin(const char* name) {
    for (const FormatInfo& i : formats())
        if (std::string(name) == i.name) return make_chat_format(i.name, i.source, i.bos, i.eos, i.specials);
    throw std::logic_error("no built-in chat format " + std::string(name));
}

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

// The template's variables for these messages (transformers' render: messages, tools and
// documents as None, add_generation_prompt, the named special tokens that are set).
nlohmann::ordered_json chat_context(const ChatFormat& f, const std::vector<ChatMessage>& messages, size_t count,
                                    bool add_generation_prompt) {
    nlohmann::ordered_json ctx;
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (size_t i = 0; i < count; ++i)
        list.push_back({{"role", chat_role_name(messages[i].role)}, {"content", messages[i].content}});
    ctx["messages"] = std::move(list);
    ctx["tools"] = nullptr;
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = add_generation_prompt;
    const std::pair<const char*, const std::string*> named[] = {
        {"bos_token", &f.bos_token}, {"eos_token", &f.eos_token}, {"unk_token", &f.unk_token}, {"pad_token", &f.pad_token}};
    for (const auto& [key, value] : named)
        if (!value->empty()) ctx[key] = *value;
    return ctx;
}

JinjaRendering render_chat(const ChatFormat& f, const std::vector<ChatMessage>& messages, size_t count,
                           bool add_generation_prompt) {
    try {
        return f.jinja->render(chat_context(f, messages, count, add_generation_prompt), {"messages"});
    } catch (const JinjaRaised& e) {
        throw std::invalid_argument("the chat template refuses the conversation" +
                                    (count < messages.size() ? " (its first " + std::to_string(count) + " messages)"
                                                             : std::string()) +
                                    ": \"" + e.what() + "\"");
    } catch (const JinjaError& e) {
        throw std::invalid_argument(std::string("the chat template cannot render the conversation: ") + e.what());
    }
}

size_t common_prefix(const std::string& a, const std::string& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t k = 0;
    while (k < n && a[k] == b[k]) ++k;
    return k;
}

// Where two renderings part, moved back to the start of a special token or UTF-8 character that
// spans it: "...<|end|>\n<|user|>" and "...<|end|>\n<|endoftext|>" share "<|", which belongs to
// the next message's token.
size_t boundary(const ChatFormat& f, const std::string& text, size_t pos) {
    while (pos > 0 && pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
    for (const std::string& s : f.special_tokens)
        for (size_t from = pos >= s.size() ? pos - s.size() + 1 : 0; from < pos && from < text.size(); ++from)
            if (text.compare(from, s.size(), s) == 0) return boundary(f, text, from);
    return pos;
}

// Which bytes of the rendering are answer: see data/chat.h.
std::vector<bool> answer_bytes(const ChatFormat& f, const std::vector<ChatMessage>& messages, const JinjaRendering& r) {
    std::vector<bool> answer(r.text.size(), false);
    size_t g = 0;  // the next generation block
    for (size_t k = 0; k < messages.size(); ++k) {
        if (messages[k].role != ChatRole::assistant) continue;
        const size_t end = boundary(f, r.text, common_prefix(r.text, render_chat(f, messages, k + 1, false).text));
        size_t start;
        if (f.jinja->has_generation()) {
            // the first generation block that ends after the text before this message
            const size_t before =
                k == 0 ? 0 : boundary(f, r.text, common_prefix(r.text, render_chat(f, messages, k, false).text));
            while (g < r.generation.size() && r.generation[g].second <= before && r.generation[g].second < end) ++g;
            if (g >= r.generation.size()) continue;
            start = r.generation[g].first;
            for (; g < r.generation.size() && r.generation[g].first < std::max(end, start + 1); ++g)
                for (size_t b = r.generation[g].first; b < r.generation[g].second; ++b) answer[b] = true;
        } else {
            start = boundary(f, r.text, common_prefix(r.text, render_chat(f, messages, k, true).text));
        }
        for (size_t b = start; b < end; ++b) answer[b] = true;
    }
    return answer;
}

}  // namespace

std::string_view python_strip(std::string_view s, bool left, bool right) {
    size_t begin = 0, end = s.size();
    uint32_t cp = 0;
    while (left && begin < end) {
        const size_t n = utf8_at(s, begin, cp);
        if (n == 0 || !python_space(cp)) break;
        begin += n;
    }
    while (right && end > begin) {
        size_t start = end - 1;  // back up to the lead byte of the last code point (at most 3 steps)
        while (start > begin && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        const size_t n = utf8_at(s, start, cp);
        if (n != end - start || !python_space(cp)) break;
        end = start;
    }
    return s.substr(begin, end - begin);
}

ChatFormat make_chat_format(std::string name, std::string source, std::string bos_token, std::string eos_token,
                            std::vector<std::string> special_tokens) {
    ChatFormat f;
    f.jinja = std::make_shared<const JinjaTemplate>(source, name);
    f.name = std::move(name);
    f.source = std::move(source);
    f.bos_token = std::move(bos_token);
    f.eos_token = std::move(eos_token);
    f.special_tokens = std::move(special_tokens);
    for (const std::string* t : {&f.bos_token, &f.eos_token})
        if (!t->empty() && std::find(f.special_tokens.begin(), f.special_tokens.end(), *t) == f.special_tokens.end())
            f.special_tokens.push_back(*t);
    return f;
}

const ChatFormat ChatFormat::llama3 = builtin("llama3");
const ChatFormat ChatFormat::llama3_1 = builtin("llama3.1");
const ChatFormat ChatFormat::llama2 = builtin("llama2");

std::string chat_format_name(const ChatFormat& f) { return f.name; }

std::vector<std::string> chat_format_names() {
    std::vector<std::string> names;
    for (const FormatInfo& i : formats()) names.push_back(i.name);
    return names;
}

std::string chat_format_list() {
    std::string s;
    for (const FormatInfo& i : formats()) s += (s.empty() ? "" : "; ") + std::string(i.name) + " (" + i.models + ")";
    return s;
}

ChatFormat parse_chat_format(const std::string& name) {
    for (const FormatInfo& i : formats())
        if (name == i.name) return builtin(i.name);
    throw std::invalid_argument("unknown chat format '" + name + "'; the formats are: " + chat_format_list());
}

std::string chat_template_file_beside(const std::string& config_path) {
    return (fs::path(config_path).parent_path() / "chat_template.jinja").string();
}

std::string tokenizer_config_beside(const std::string& tokenizer_path) {
    return (fs::path(tokenizer_path).parent_path() / "tokenizer_config.json").string();
}

namespace {

// A named token of tokenizer_config.json: a string, or {"content": ...} (AddedToken's form).
std::string token_text(const nlohmann::json& j, const char* key) {
    if (!j.contains(key)) return "";
    const nlohmann::json& v = j[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return "";
}

struct TokenizerConfig {
    bool exists = false;
    std::string chat_template;
    std::string template_origin;  // where chat_template came from, for the format's name
    std::string bos, eos, unk, pad;
    std::vector<std::string> specials;  // every added token's text and the named ones
};

TokenizerConfig read_tokenizer_config(const std::string& path) {
    TokenizerConfig c;
    std::error_code ec;
    if (path.empty()) return c;
    // transformers 5 saves the template as chat_template.jinja beside tokenizer_config.json and
    // loads it from there first.
    const std::string jinja_file = chat_template_file_beside(path);
    if (fs::is_regular_file(jinja_file, ec)) {
        c.exists = true;
        c.chat_template = read_input_file(jinja_file, "chat template", kMaxJsonFileBytes);
        c.template_origin = "'" + jinja_file + "'";
    }
    if (!fs::is_regular_file(path, ec)) return c;
    c.exists = true;
    const std::string text = read_input_file(path, "tokenizer config", kMaxJsonFileBytes);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error("'" + path + "': not JSON (" + e.what() + ")");
    }
    if (!j.is_object()) throw std::runtime_error("'" + path + "': not a JSON object");
    if (c.chat_template.empty() && j.contains("chat_template")) {
        c.template_origin = "chat_template of '" + path + "'";
        const nlohmann::json& t = j["chat_template"];
        if (t.is_string()) c.chat_template = t.get<std::string>();
        if (t.is_array())  // named templates: the default one renders plain chats
            for (const nlohmann::json& e : t)
                if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
                    e["template"].is_string())
                    c.chat_template = e["template"].get<std::string>();
    }
    c.bos = token_text(j, "bos_token"), c.eos = token_text(j, "eos_token");
    c.unk = token_text(j, "unk_token"), c.pad = token_text(j, "pad_token");
    const auto add = [&](const std::string& s) {
        if (!s.empty() && std::find(c.specials.begin(), c.specials.end(), s) == c.specials.end()) c.specials.push_back(s);
    };
    for (const std::string* s : {&c.bos, &c.eos, &c.unk, &c.pad}) add(*s);
    if (j.contains("added_tokens_decoder") && j["added_tokens_decoder"].is_object())
        for (const auto& [id, t] : j["added_tokens_decoder"].items())
            if (t.is_object() && t.contains("content") && t["content"].is_string()) add(t["content"].get<std::string>());
    if (j.contains("additional_special_tokens") && j["additional_special_tokens"].is_array()) {
        for (const nlohmann::json& t : j["additional_special_tokens"]) {
            if (t.is_string()) add(t.get<std::string>());
            else if (t.is_object() && t.contains("content") && t["content"].is_string()) add(t["content"].get<std::string>());
        }
    }
    return c;
}

}  // namespace

ChatFormat resolve_chat_format(const std::string& name, const std::string& config_path,
                               const std::string& template_path) {
    const TokenizerConfig config = read_tokenizer_config(config_path);
    ChatFormat f;
    if (!template_path.empty()) {
        const std::string source = read_input_file(template_path, "chat template", kMaxJsonFileBytes);
        f = make_chat_format("template '" + template_path + "'", source, config.bos, config.eos, config.specials);
    } else if (!name.empty()) {
        f = parse_chat_format(name);
        if (!config.exists) return f;
        // the model's own token strings, where its tokenizer_config.json names them
        std::vector<std::string> specials = f.special_tokens;
        for (const std::string& s : config.specials)
            if (std::find(specials.begin(), specials.end(), s) == specials.end()) specials.push_back(s);
        f = make_chat_format(f.name, f.source, config.bos.empty() ? f.bos_token : config.bos,
                             config.eos.empty() ? f.eos_token : config.eos, specials);
    } else {
        const std::string fix = "; pass --chat-template FILE.jinja with the model's template, or --chat-format NAME "
                                "for a built-in one: " +
                                chat_format_list();
        if (!config.exists)
            throw std::invalid_argument(
                "the data has chats but no chat template: there is no tokenizer_config.json " +
                (config_path.empty() ? std::string("(no tokenizer was given)") : "at '" + config_path + "'") +
                " with a chat_template" + fix);
        if (config.chat_template.empty())
            throw std::invalid_argument("the data has chats but '" + config_path +
                                        "' has no chat_template (and there is no chat_template.jinja beside it)" + fix);
        f = make_chat_format(config.template_origin, config.chat_template, config.bos, config.eos, config.specials);
    }
    f.unk_token = config.unk, f.pad_token = config.pad;
    return f;
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

std::string chat_generation_prompt(const ChatFormat& f) {
    const std::vector<ChatMessage> one = {{ChatRole::user, "x"}};
    const std::string with = render_chat(f, one, 1, true).text;
    const std::string without = render_chat(f, one, 1, false).text;
    return with.substr(common_prefix(with, without));
}

std::vector<ChatPiece> chat_pieces(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
    if (messages.empty()) throw std::invalid_argument("the chat has no messages");
    const JinjaRendering r = render_chat(f, messages, messages.size(), false);
    if (r.text.empty()) throw std::invalid_argument("the chat template renders the conversation as nothing");
    const std::vector<bool> answer = answer_bytes(f, messages, r);
    // Longest special-token strings first, so one that contains another wins.
    std::vector<std::string> specials = f.special_tokens;
    std::sort(specials.begin(), specials.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    std::vector<ChatPiece> out;
    const auto target = [&](size_t b) { return answer[b] ? PieceTarget::answer : PieceTarget::prompt; };
    for (size_t i = 0; i < r.text.size();) {
        const std::string* special = nullptr;
        if (r.data[i] == 0)
            for (const std::string& s : specials)
                if (!s.empty() && r.text.compare(i, s.size(), s) == 0 &&
                    r.data.find('\1', i) >= i + s.size()) {  // every byte the template's
                    special = &s;
                    break;
                }
        if (special) {
            out.push_back({*special, true, target(i)});
            i += special->size();
            continue;
        }
        if (out.empty() || out.back().special || out.back().target != target(i)) out.push_back({"", false, target(i)});
        out.back().text += r.text[i++];
    }
    return out;
}

std::vector<std::string> chat_special_tokens(const ChatFormat& f) {
    std::vector<std::string> out;
    for (const std::string& s : f.special_tokens) {
        const bool written = f.source.find(s) != std::string::npos ||
                             (s == f.bos_token && f.source.find("bos_token") != std::string::npos) ||
                             (s == f.eos_token && f.source.find("eos_token") != std::string::npos);
        if (written && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    }
    return out;
}

}  // namespace pv
