// Chat formats: how a conversation ({"role", "content"} messages) is written out for a model, as
// its Hugging Face chat template (tokenizer_config.json's `chat_template`, Jinja) would render it
// — without a Jinja engine: the formats polevault knows are written here, and a template is
// recognised by the literal text it emits. Host code only.
//
// A rendering is a list of ChatPieces: special tokens (template text such as "<|eot_id|>",
// encoded with special tokens parsed) and plain text (the template's text around them and the
// message contents, encoded with special tokens treated as text, so no message can forge one).
// Each piece says whether it is prompt (system, user, the headers: trained on only with
// --train-on-prompt) or answer (assistant content and the assistant turn's end token: always
// trained on). data/examples.h turns pieces into tokens and flags.
//
// The formats (`content` is the message's content with Python's str.strip() applied, as the
// templates' `| trim` and `.strip()` do: Unicode whitespace at both ends removed):
//
//   llama3    Meta-Llama-3-*-Instruct (Llama 3.0). Every message, in order:
//               <|begin_of_text|>                           (once, first)
//               <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//             answer: CONTENT and <|eot_id|> of assistant messages; the rest is prompt.
//
//   llama3.1  Llama 3.1, 3.2 and 3.3 Instruct: as llama3, but a system turn always comes first
//             and begins with the template's date lines:
//               <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n
//               Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nSYSTEM<|eot_id|>
//             (SYSTEM: the first message's content when its role is system, else empty), then
//             every other message as in llama3. 26 Jul 2024 is the templates' fixed date; the
//             Llama 3.2 template prints today's date where Hugging Face provides strftime_now, so
//             its rendering by `transformers` changes daily (in masked system text only).
//
//   llama2    Llama-2-*-chat and CodeLlama-*-Instruct: an optional system message, then user and
//             assistant messages alternating, starting with user:
//               <s>[INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] USER [/INST] ...
//             The first user turn is "[INST] " + strip("<<SYS>>\n" + SYSTEM + "\n<</SYS>>\n\n" +
//             USER) + " [/INST]" (the system block only when there is a system message; the raw
//             SYSTEM and USER are joined, then stripped as one string, as the template does);
//             later ones "[INST] " + USER + " [/INST]", each after <s>; an assistant turn is
//             " " + ANSWER + " " then </s>. answer: the assistant turns (" ANSWER " and </s>).
//
// Sources (facts only; the templates are Jinja, this is our own code): the chat_template texts of
// Meta-Llama-3-8B-Instruct ("... '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+
// message['content'] | trim + '<|eot_id|>' ... bos_token + content ..."), of Llama-3.1/3.2-Instruct
// ("Cutting Knowledge Date: December 2023\n", "Today Date: " + date_string + "\n\n", date_string
// defaulting to "26 Jul 2024", the system message `|trim`med) and of Llama-2-7b-chat-hf
// ("bos_token + '[INST] ' + content.strip() + ' [/INST]'", "' '  + content.strip() + ' ' + eos_token",
// "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content']"), as public copies of
// those tokenizer_config.json files quote them; Meta's Llama 2 prompt-format page
// (llama.com/docs/model-cards-and-prompt-formats/meta-llama-2) shows the same [INST] layout.
//
// Recognition (recognise_chat_template): the template's string literals (and raw text) must
// contain each format's distinctive emitted pieces — llama2: "[INST] ", " [/INST]", "<<SYS>>\n",
// "\n<</SYS>>\n\n" with bos_token and eos_token; llama3: "<|start_header_id|>",
// "<|end_header_id|>\n\n", "<|eot_id|>" with bos_token or "<|begin_of_text|>"; llama3.1: those
// plus "Cutting Knowledge Date: December 2023\n" and "26 Jul 2024" — and strip the content (`trim`
// or `.strip()`). Whitespace control ({%- -%}), quoting style and escapes (a "\n" escape or a
// real newline) do not matter. A template with none of these sets is refused by name.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pv {

enum class ChatFormat { llama3, llama3_1, llama2 };

// "llama3", "llama3.1", "llama2".
std::string chat_format_name(ChatFormat f);
// Every format's name.
std::vector<std::string> chat_format_names();
// "llama3 (...), llama3.1 (...), llama2 (...)": every format with the models that use it.
std::string chat_format_list();
// The format of this name; std::invalid_argument naming the formats there are otherwise.
ChatFormat parse_chat_format(const std::string& name);

// The known format a Jinja chat template renders as, or nothing.
std::optional<ChatFormat> recognise_chat_template(std::string_view jinja);

// tokenizer_config.json beside a tokenizer.json (the same directory), whether or not it exists.
std::string tokenizer_config_beside(const std::string& tokenizer_path);

// The chat format to render with: `name` (--chat-format) when given; otherwise the one the
// `chat_template` of tokenizer_config.json at `config_path` is recognised as (a string, or the
// template named "default" in a list of {name, template}). Throws std::invalid_argument naming
// the formats there are when there is no name and the file is missing, has no template or an
// unrecognised one (std::runtime_error when the file is not JSON).
ChatFormat resolve_chat_format(const std::string& name, const std::string& config_path);

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
// the messages do not fit the format (llama2: roles not system? then user/assistant alternating
// from user) or are empty.
std::vector<ChatPiece> chat_pieces(ChatFormat f, const std::vector<ChatMessage>& messages);

// The text (special tokens parsed) that follows a rendered conversation when the model is to write
// the next assistant turn (the templates' add_generation_prompt): llama3 and llama3.1 open the
// assistant's header, "<|start_header_id|>assistant<|end_header_id|>\n\n"; llama2 adds nothing
// (the answer follows " [/INST]" directly).
std::string chat_generation_prompt(ChatFormat f);

// The special tokens format f writes: the tokenizer must have each as one token.
std::vector<std::string> chat_special_tokens(ChatFormat f);

// Python's str.strip(): s without the Unicode whitespace (str.isspace) at either end. s is UTF-8;
// bytes that are not valid UTF-8 are never whitespace.
std::string_view python_strip(std::string_view s);

}  // namespace pv
