// Chat formats: how a conversation ({"role", "content"} messages) is written out for a model, as
// its Hugging Face chat template (tokenizer_config.json's `chat_template`, Jinja) renders it with
// transformers' apply_chat_template: the template runs in polevault's Jinja subset (data/jinja.h).
// Host code only.
//
// Where the template comes from (resolve_chat_format): --chat-template FILE (a .jinja file), else
// --chat-format NAME (a built-in template below), else the tokenizer's own: chat_template.jinja
// beside it (transformers 5 saves templates there), else tokenizer_config.json's chat_template (a
// string, or the one named "default" in a list of {name, template}). bos_token,
// eos_token, unk_token and pad_token come from that tokenizer_config.json when there is one (a
// built-in template brings its own model's).
//
// A rendering is a list of ChatPieces: special tokens (template text such as "<|eot_id|>",
// encoded with special tokens parsed) and plain text (the template's text around them and the
// message contents, encoded with special tokens treated as text, so no message can forge one).
// Which is which: the template is rendered with the messages marked as data (data/jinja.h's
// provenance marks, carried through trim, slices, concatenation), and only bytes the template
// itself wrote are searched for the format's special-token strings (ChatFormat::special_tokens).
//
// Each piece says whether it is prompt (system, user, the headers: trained on only with
// --train-on-prompt) or answer (always trained on). The answer is each assistant message as the
// template renders it, from where the template's generation prompt ends to where the next
// message starts, so it holds the end-of-turn text the template writes after the content
// (<|eot_id|>, </s>, <|im_end|>\n, <end_of_turn>\n, ...). It is found as transformers' docs and
// TRL find it, by rendering prefixes: for assistant message k of the rendering R of all messages,
//   start = the length of the common prefix of R and render(messages[:k], add_generation_prompt)
//   end   = the length of the common prefix of R and render(messages[:k+1])
// each moved back to the start of a special token (of the format's) or UTF-8 character that spans
// it (so text a template writes only after the last message, such as Phi-3's eos_token, belongs
// to the last message; where "<|end|>\n<|user|>" and "<|end|>\n<|endoftext|>" part inside "<|",
// the answer ends before it). A template with {% generation %} blocks says where each answer starts:
// there an answer is each generation block, extended to `end` above when that is later.
// data/examples.h turns pieces into tokens and flags.
//
// Built-in templates (--chat-format NAME; the published templates' text, see chat.cpp):
//   llama3    Meta-Llama-3-*-Instruct (Llama 3.0)
//   llama3.1  Llama 3.1 and 3.3 Instruct (the system turn with "Today Date: 26 Jul 2024")
//   llama2    Llama-2-*-chat
// The Llama 3.2 template prints today's date where Hugging Face provides strftime_now, so its
// rendering changes daily (in masked system text only); polevault's strftime_now reads
// SOURCE_DATE_EPOCH when it is set (data/jinja.h), so a run can be made reproducible.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pv {

class JinjaTemplate;

// A chat template and what it renders with.
struct ChatFormat {
    std::string name;    // "llama3" (built-in), or where the template came from
    std::string source;  // the Jinja text
    std::string bos_token, eos_token, unk_token, pad_token;  // the template's variables ("" absent)
    // Strings that are one special token each where the template writes them (the tokenizer's
    // added tokens and the named tokens above).
    std::vector<std::string> special_tokens;
    std::shared_ptr<const JinjaTemplate> jinja;  // source, parsed

    // The built-in templates.
    static const ChatFormat llama3, llama3_1, llama2;

    bool operator==(const ChatFormat& o) const {
        return name == o.name && source == o.source && bos_token == o.bos_token && eos_token == o.eos_token;
    }
};

// A format of this Jinja source, parsed (throws JinjaError naming `name` and the line when it is
// not in polevault's Jinja subset).
ChatFormat make_chat_format(std::string name, std::string source, std::string bos_token, std::string eos_token,
                            std::vector<std::string> special_tokens);

// "llama3", "llama3.1", "llama2", or the template's origin.
std::string chat_format_name(const ChatFormat& f);
// Every built-in format's name.
std::vector<std::string> chat_format_names();
// "llama3 (...), llama3.1 (...), llama2 (...)": every built-in format with the models that use it.
std::string chat_format_list();
// The built-in format of this name; std::invalid_argument naming the formats there are otherwise.
ChatFormat parse_chat_format(const std::string& name);

// chat_template.jinja beside a tokenizer_config.json (where transformers 5 saves the template; it
// wins over the file's chat_template key, as when transformers loads it).
std::string chat_template_file_beside(const std::string& config_path);

// tokenizer_config.json beside a tokenizer.json (the same directory), whether or not it exists.
std::string tokenizer_config_beside(const std::string& tokenizer_path);

// The chat format to render with: the template in `template_path` (--chat-template) when given;
// else the built-in `name` (--chat-format); else the `chat_template` of tokenizer_config.json at
// `config_path`. The named tokens and special tokens come from `config_path` when it exists (for
// a built-in, its own when the file has none). Throws std::invalid_argument saying what to pass
// when there is no template (no name, and the file is missing or has no chat_template),
// std::runtime_error when a file is unreadable or not JSON, JinjaError when the template is not
// in the subset.
ChatFormat resolve_chat_format(const std::string& name, const std::string& config_path,
                               const std::string& template_path = "");

enum class ChatRole { system, user, assistant };
struct ChatMessage {
    ChatRole role = ChatRole::user;
    std::string content;
};
// "system", "user", "assistant"; parse_chat_role gives nothing for anything else.
const char* chat_role_name(ChatRole r);
std::optional<ChatRole> parse_chat_role(std::string_view s);

// Which tokens of a piece count as training targets: prompt ones only with --train-on-prompt.
enum class PieceTarget { prompt, answer };

struct ChatPiece {
    std::string text;
    bool special = false;  // one special token (parsed); else plain text (special tokens as text)
    PieceTarget target = PieceTarget::prompt;
};

// The conversation rendered in format f. Throws std::invalid_argument, without a file name, when
// the template refuses the messages (its raise_exception message, quoted), cannot render them,
// renders nothing, or the messages are empty.
std::vector<ChatPiece> chat_pieces(const ChatFormat& f, const std::vector<ChatMessage>& messages);

// The text (special tokens parsed) that follows a rendered conversation when the model is to write
// the next assistant turn (add_generation_prompt): what rendering one user message with it adds
// to rendering it without (llama3: "<|start_header_id|>assistant<|end_header_id|>\n\n"; llama2:
// nothing, the answer follows " [/INST]" directly).
std::string chat_generation_prompt(const ChatFormat& f);

// The special tokens format f writes: those of f.special_tokens the template's text contains
// (bos_token and eos_token where it uses those variables). The tokenizer must have each as one
// token.
std::vector<std::string> chat_special_tokens(const ChatFormat& f);

// Python's str.strip(): s without the Unicode whitespace (str.isspace) at either end (lstrip():
// right false; rstrip(): left false). s is UTF-8; bytes that are not valid UTF-8 are never
// whitespace.
std::string_view python_strip(std::string_view s, bool left = true, bool right = true);

}  // namespace pv
