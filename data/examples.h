// Training examples: what one input document is (plain text, a prompt and its completion, or a
// chat), read from files, and its tokens with their flags (data/shard.h: counted, starts a
// document, splittable). Host code only.
//
// Reading. A *.jsonl / *.ndjson file (any case) holds one JSON object per line; blank lines are
// skipped. Each object is, by the first of these it has:
//   {"messages": [{"role": R, "content": C}, ...]}   a chat; R is "system", "user" or "assistant",
//                                                   C a string; other keys are ignored
//   {"prompt": P, "completion": C}                  an instruction example; both strings
//   {TEXT_FIELD: T}                                 plain text ("text" unless --field says)
// Anything else — not JSON, not an object, none of these keys, a value of the wrong type, an
// empty "messages", an unknown role, a "prompt" without "completion" — is an error naming the
// file and line (and the message's index). Any other file is plain text: the whole file, byte
// for byte, is one document. An empty plain text ("" or an empty file) is skipped.
//
// Encoding (encode_example), with T(x) the tokenizer's encoding of x with special-token strings
// treated as text (so no input can forge a special token) and EOS its end-of-sequence token:
//   text               T(text) EOS. Every token counts; the document is splittable.
//   prompt/completion  [BOS] T(prompt + completion) EOS: BOS when the tokenizer has one. The
//                      prompt's tokens do not count (unless --train-on-prompt); the completion's
//                      and EOS do. Not splittable.
//   chat               the pieces of its chat template's rendering (data/chat.h): special pieces
//                      (the template's own text spelling one of the format's special tokens, which
//                      add_tokenizer_specials extends with the tokenizer's added tokens) encoded
//                      with special tokens parsed (each must be one token of the tokenizer, else an
//                      error names the token and the format), each run of plain pieces between
//                      two special ones encoded as one text. Prompt pieces do not count (unless
//                      --train-on-prompt), answer pieces do. Not splittable. A chat without an
//                      assistant message is an error unless --train-on-prompt (nothing in it
//                      would be trained on).
// The first token of an example starts a document. It never counts in a chat or a prompt and
// completion: no token of the example predicts it (it would be predicted across documents).
//
// A run of plain pieces is encoded whole because a tokenizer is not additive. Hugging Face
// encodes a rendered chat's text between two special tokens as one text, so for contents without
// special-token strings these are HF's tokens (given special tokens that strip no text beside
// them: lstrip/rstrip are false for all of Llama 2's and Llama 3's). A SentencePiece-style
// tokenizer prepends "▁" to each text it encodes, so encoding the user's and the assistant's
// parts of "[INST] q [/INST] a " separately would not give its tokens. Where a run holds pieces
// of both kinds, the tokens are split between them at the longest common prefix of the run's
// tokens and the tokens of the text before the boundary: the tokens both encodings share cover
// the first piece exactly; the rest (at the boundary a token may span both pieces, which the
// Llama formats' pre-tokenizers never produce) belongs to the later piece.
#pragma once

#include "data/chat.h"
#include "data/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pv {

enum class ExampleKind { text, prompt_completion, chat };

struct Example {
    ExampleKind kind = ExampleKind::text;
    std::string text;                   // text
    std::string prompt, completion;     // prompt_completion
    std::vector<ChatMessage> messages;  // chat
    std::string where;                  // "input 'FILE' line N" (JSON lines) or "input 'FILE'", for errors
};

// One JSON line as an example; nothing for a blank line. Throws std::runtime_error starting
// with `where`.
std::optional<Example> parse_example_line(std::string_view line, const std::string& text_field,
                                          const std::string& where);

// The examples of one input file, in order (see Reading above), the first `limit` of them (the
// lines after those are not read). Throws std::runtime_error naming the file (and line).
std::vector<Example> read_examples(const std::string& path, const std::string& text_field, size_t limit = SIZE_MAX);

// Whether a path is read as JSON lines (*.jsonl, *.ndjson, any case).
bool is_json_lines(const std::string& path);

struct ExampleEncoding {
    std::optional<ChatFormat> chat_format;  // needed by chats
    bool train_on_prompt = false;
};

// Throws std::runtime_error starting with the example's `where` when a chat does not fit its
// format (or none is chosen) or has no assistant message without train_on_prompt: the checks of
// encode_example that need no tokenizer, so a run can make them before training one.
void check_example(const Example& e, const ExampleEncoding& how);

// Appends the example's tokens and flags to `tokens` and `flags`. Throws std::runtime_error
// starting with the example's `where` when it cannot be encoded (a chat without a format, a
// structure its format refuses, a special token the tokenizer lacks, no EOS).
void encode_example(const Tokenizer& tok, const Example& e, const ExampleEncoding& how, std::vector<uint32_t>& tokens,
                    std::vector<uint8_t>& flags);

// The text a tokenizer trained on the examples should see for e: text, prompt + completion, or
// the chat rendered as a string (its pieces joined).
std::string example_training_text(const Example& e, const std::optional<ChatFormat>& chat_format);

// Throws std::runtime_error naming the format and the token when the tokenizer lacks one of the
// special tokens format f writes (each must encode, with special tokens parsed, as one token).
void check_chat_tokens(const Tokenizer& tok, const ChatFormat& f);

// f with the tokenizer's added tokens among its special tokens: where the template's own text
// holds one, it is that token, as when Hugging Face encodes a rendered chat.
void add_tokenizer_specials(ChatFormat& f, const Tokenizer& tok);

// What `train tokenize --render FILE.jsonl` shows: the first `examples` examples of the file,
// each as a header line ("line N: chat, 57 tokens, 21 counted") and its tokens decoded, the
// counted spans wrapped in ⟦ ⟧ (with `colour`, also shown in green by ANSI escapes). Chats
// use the template `chat_template` if given, else `chat_format` if given, else the template of
// tokenizer_config.json at `tokenizer_config`.
struct RenderOptions {
    std::string chat_format;       // --chat-format; empty: the template of tokenizer_config.json
    std::string chat_template;     // --chat-template FILE; overrides both
    std::string tokenizer_config;  // tokenizer_config.json (tokenizer_config_beside(tokenizer))
    std::string text_field = "text";
    bool train_on_prompt = false;
    int examples = 3;
    bool colour = false;
};
std::string render_counted(const Tokenizer& tok, const std::string& path, const RenderOptions& o);

// The counted-span markers render_counted writes.
inline constexpr const char* kCountedOpen = "⟦";
inline constexpr const char* kCountedClose = "⟧";

}  // namespace pv
