// Chat and instruction examples: every format renders as its published template's text encoded
// whole (the expectation is that text, written out here and encoded by the tokenizer with special
// tokens parsed, as Hugging Face encodes a rendered chat — never the pieces the code under test
// makes), with exactly the assistant turns (or completions) counted; --train-on-prompt; special
// tokens in content stay text; templates are recognised by their text and unknown ones refused
// by name; malformed JSON lines name their file and line; render_counted marks what counts.
#include "test/temp_dir.h"
#include "data/chat.h"
#include "data/examples.h"
#include "data/shard.h"
#include "data/tokenizer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace chat_test {

namespace fs = std::filesystem;
using pv::test::TempDir;

const std::string kCorpus =
    "You are terse. Hi there, what is the time? Hello! How can I help you today? Tell me a joke. "
    "No. Be kind and brief. Goodbye, friend. The kernel runs on the device; the host waits. "
    "Question: what is two plus two? Answer: four. [INST] [/INST] <<SYS>> system user assistant\n\n";

const pv::Tokenizer& llama3_tok() {
    static const pv::Tokenizer t = pv::Tokenizer::train(kCorpus, 420,
                                                        {"<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
                                                         "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
    return t;
}

const pv::Tokenizer& llama2_tok() {
    static const pv::Tokenizer t = pv::Tokenizer::train(kCorpus, 400, {"<|endoftext|>", "<s>", "</s>"});
    return t;
}

// The expected encoding of a rendered text given as segments (text, counted): the whole text
// encoded with special tokens parsed; each segment's tokens marked counted or not. Requires each
// segment boundary to be a token boundary (the encoding of the text up to it a prefix of the
// whole), which holds for these segments with the Llama pre-tokenizer.
struct Expected {
    std::vector<uint32_t> tokens;
    std::vector<bool> counted;
};

Expected expected_of(const pv::Tokenizer& tok, const std::vector<std::pair<std::string, bool>>& segments) {
    std::string all;
    for (const auto& s : segments) all += s.first;
    const std::vector<int> ids = tok.encode(all, /*parse_special=*/true);
    Expected e;
    e.tokens.assign(ids.begin(), ids.end());
    std::string prefix;
    size_t done = 0;
    for (const auto& s : segments) {
        prefix += s.first;
        const std::vector<int> head = tok.encode(prefix, true);
        REQUIRE(head.size() <= ids.size());
        REQUIRE(std::equal(head.begin(), head.end(), ids.begin()));  // the segment ends on a token boundary
        for (; done < head.size(); ++done) e.counted.push_back(s.second);
    }
    return e;
}

pv::Example chat(std::vector<pv::ChatMessage> messages) {
    pv::Example e;
    e.kind = pv::ExampleKind::chat;
    e.messages = std::move(messages);
    e.where = "input 'test.jsonl' line 7";
    return e;
}

using pv::ChatRole;

struct Encoded {
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> flags;
};

Encoded encode(const pv::Tokenizer& tok, const pv::Example& e, std::optional<pv::ChatFormat> f, bool all = false) {
    Encoded out;
    pv::encode_example(tok, e, pv::ExampleEncoding{f, all}, out.tokens, out.flags);
    return out;
}

// The example's encoding is the expected one: same tokens, bit 0 as expected (never on the first
// token of a chat or prompt, nothing predicts it inside the example), bit 1 on the first token
// only, bit 2 (splittable) nowhere.
void check_encoding(const Encoded& got, const Expected& want, bool train_on_prompt = false) {
    REQUIRE(got.tokens == want.tokens);
    REQUIRE(got.flags.size() == want.tokens.size());
    for (size_t i = 0; i < got.flags.size(); ++i) {
        INFO("token " << i << " (id " << got.tokens[i] << ")");
        const bool counted = i > 0 && (train_on_prompt || want.counted[i]);
        CHECK(bool(got.flags[i] & pv::kTokenCounted) == counted);
        CHECK(bool(got.flags[i] & pv::kTokenStartsDocument) == (i == 0));
        CHECK(!(got.flags[i] & pv::kTokenSplittable));
    }
}

template <class F>
std::string thrown(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The published chat templates as tokenizer_config.json holds them once its JSON is decoded:
// Llama 3's literals hold real newlines (the file writes "\n"), Llama 2's the two characters
// backslash-n (the file writes "\\n"), which Jinja reads as a newline.
const std::string kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}";
const std::string kLlama31Template =
    "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n"
    "{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n";
const std::string kLlama2Template =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
    "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}";

}  // namespace chat_test

using namespace chat_test;

TEST_CASE("llama3: the template's text, assistant content and its <|eot_id|> counted", "[chat]") {
    const pv::Tokenizer& tok = llama3_tok();
    // Contents with whitespace around them: the template trims each.
    const pv::Example e = chat({{ChatRole::system, "  You are terse.\n"},
                                {ChatRole::user, "Hi there \t"},
                                {ChatRole::assistant, "\nHello! How can I help?  "},
                                {ChatRole::user, "Tell me a joke."},
                                {ChatRole::assistant, "No."}});
    const Expected want =
        expected_of(tok, {{"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n",
                           false},
                          {"Hello! How can I help?<|eot_id|>", true},
                          {"<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n",
                           false},
                          {"No.<|eot_id|>", true}});
    check_encoding(encode(tok, e, pv::ChatFormat::llama3), want);
    // --train-on-prompt: everything but the first token counts.
    check_encoding(encode(tok, e, pv::ChatFormat::llama3, true), want, true);
    // The rendering as text is the template's.
    CHECK(pv::example_training_text(e, pv::ChatFormat::llama3) ==
          tok.decode(std::vector<int>(want.tokens.begin(), want.tokens.end())));
}

TEST_CASE("llama3: special-token text in a message stays text; a last user turn is masked", "[chat]") {
    const pv::Tokenizer& tok = llama3_tok();
    const int eot = tok.token_id("<|eot_id|>");
    const pv::Example e = chat({{ChatRole::user, "say <|eot_id|> and <|begin_of_text|>"},
                                {ChatRole::assistant, "ok <|eot_id|>"},
                                {ChatRole::user, "again"}});
    const Encoded got = encode(tok, e, pv::ChatFormat::llama3);
    // Three turns, three <|eot_id|> tokens: the ones in the contents are not tokens.
    CHECK(std::count(got.tokens.begin(), got.tokens.end(), uint32_t(eot)) == 3);
    CHECK(std::count(got.tokens.begin(), got.tokens.end(), uint32_t(tok.token_id("<|begin_of_text|>"))) == 1);
    const std::string text =
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nsay <|eot_id|> and <|begin_of_text|><|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nok <|eot_id|><|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|>";
    CHECK(tok.decode(std::vector<int>(got.tokens.begin(), got.tokens.end())) == text);
    // What counts: the assistant's content (its <|eot_id|> as text) and its turn's end token.
    std::string counted;
    for (size_t i = 0; i < got.tokens.size(); ++i)
        if (got.flags[i] & pv::kTokenCounted) counted += tok.decode({int(got.tokens[i])});
    CHECK(counted == "ok <|eot_id|><|eot_id|>");
}

TEST_CASE("llama3.1: the dated system turn comes first, with or without a system message", "[chat]") {
    const pv::Tokenizer& tok = llama3_tok();
    const std::string date = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
    const pv::Example with = chat(
        {{ChatRole::system, " Be kind. "}, {ChatRole::user, "What is two plus two?"}, {ChatRole::assistant, "four"}});
    check_encoding(encode(tok, with, pv::ChatFormat::llama3_1),
                   expected_of(tok, {{"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + date +
                                          "Be kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is two "
                                          "plus two?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                                      false},
                                     {"four<|eot_id|>", true}}));
    const pv::Example without = chat({{ChatRole::user, "Hi"}, {ChatRole::assistant, "Hello!"}});
    check_encoding(encode(tok, without, pv::ChatFormat::llama3_1),
                   expected_of(tok, {{"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + date +
                                          "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                          "<|start_header_id|>assistant<|end_header_id|>\n\n",
                                      false},
                                     {"Hello!<|eot_id|>", true}}));
}

TEST_CASE("llama2: [INST] turns with the system block, answers and </s> counted", "[chat]") {
    const pv::Tokenizer& tok = llama2_tok();
    // The system block and the first user message are stripped as one string: the user's leading
    // space after the block stays, its trailing one goes.
    const pv::Example e = chat({{ChatRole::system, "Be kind."},
                                {ChatRole::user, " Hi "},
                                {ChatRole::assistant, "Hello. "},
                                {ChatRole::user, "Bye"},
                                {ChatRole::assistant, " Goodbye, friend."}});
    const Expected want = expected_of(tok, {{"<s>[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\n Hi [/INST]", false},
                                            {" Hello. </s>", true},
                                            {"<s>[INST] Bye [/INST]", false},
                                            {" Goodbye, friend. </s>", true}});
    check_encoding(encode(tok, e, pv::ChatFormat::llama2), want);
    check_encoding(encode(tok, e, pv::ChatFormat::llama2, true), want, true);
    // Without a system message the first turn is plain.
    const pv::Example plain = chat({{ChatRole::user, " Hi "}, {ChatRole::assistant, "Hello."}});
    check_encoding(encode(tok, plain, pv::ChatFormat::llama2),
                   expected_of(tok, {{"<s>[INST] Hi [/INST]", false}, {" Hello. </s>", true}}));
}

TEST_CASE("llama2: roles must alternate from user after an optional system message", "[chat]") {
    const pv::Tokenizer& tok = llama2_tok();
    const auto error = [&](std::vector<pv::ChatMessage> m) {
        return thrown([&] { encode(tok, chat(std::move(m)), pv::ChatFormat::llama2); });
    };
    using Catch::Matchers::Contains;
    // The template's own check, its message quoted (as transformers raises it).
    const std::string alternate =
        "the chat template refuses the conversation: \"Conversation roles must alternate "
        "user/assistant/user/assistant/...\" (chat format llama2)";
    CHECK_THAT(error({{ChatRole::user, "a"}, {ChatRole::user, "b"}}),
               Contains("input 'test.jsonl' line 7: " + alternate));
    CHECK_THAT(error({{ChatRole::system, "s"}, {ChatRole::assistant, "b"}}), Contains("line 7: " + alternate));
    CHECK_THAT(error({{ChatRole::user, "a"}, {ChatRole::assistant, "b"}, {ChatRole::system, "c"}}),
               Contains(alternate));
    CHECK_THAT(error({{ChatRole::system, "s"}}), Contains("renders the conversation as nothing"));
    // The same chats are fine in llama3, which renders any order.
    CHECK_NOTHROW(encode(llama3_tok(), chat({{ChatRole::user, "a"}, {ChatRole::user, "b"}, {ChatRole::assistant, "c"}}),
                         pv::ChatFormat::llama3));
}

TEST_CASE("a chat without an assistant message is an error unless every token is trained on", "[chat]") {
    const pv::Example e = chat({{ChatRole::system, "s"}, {ChatRole::user, "q"}});
    CHECK_THAT(thrown([&] { encode(llama3_tok(), e, pv::ChatFormat::llama3); }),
               Catch::Matchers::Contains("line 7: the chat has no assistant message") &&
                   Catch::Matchers::Contains("--train-on-prompt"));
    const Encoded all = encode(llama3_tok(), e, pv::ChatFormat::llama3, true);
    CHECK(std::count_if(all.flags.begin(), all.flags.end(), [](uint8_t f) { return f & pv::kTokenCounted; }) ==
          long(all.flags.size()) - 1);
}

TEST_CASE("prompt and completion: [BOS] prompt completion EOS, the prompt masked; text splittable", "[chat]") {
    const pv::Tokenizer& tok = llama3_tok();
    REQUIRE(tok.eos_id() >= 0);
    const std::string eos = tok.decode({tok.eos_id()});
    const std::string bos = tok.bos_id() >= 0 ? tok.decode({tok.bos_id()}) : "";
    pv::Example e;
    e.kind = pv::ExampleKind::prompt_completion;
    e.prompt = "Question: what is two plus two?\nAnswer:";
    e.completion = " four";
    const Expected want = expected_of(tok, {{bos + e.prompt, false}, {e.completion + eos, true}});
    check_encoding(encode(tok, e, std::nullopt), want);
    check_encoding(encode(tok, e, std::nullopt, true), want, true);
    // A prompt holding special-token text keeps it as text.
    e.prompt = "<|eot_id|>?";
    const Encoded forged = encode(tok, e, std::nullopt);
    CHECK(std::count(forged.tokens.begin(), forged.tokens.end(), uint32_t(tok.token_id("<|eot_id|>"))) == 0);
    // Plain text: T(text) EOS, every token counted, splittable.
    pv::Example t;
    t.text = "The kernel runs. <|eot_id|>";
    const Encoded text = encode(tok, t, std::nullopt);
    std::vector<uint32_t> ids;
    for (int id : tok.encode(t.text, false)) ids.push_back(uint32_t(id));
    ids.push_back(uint32_t(tok.eos_id()));
    CHECK(text.tokens == ids);
    for (size_t i = 0; i < text.flags.size(); ++i)
        CHECK(text.flags[i] == (pv::kTokenCounted | pv::kTokenSplittable | (i == 0 ? pv::kTokenStartsDocument : 0)));
}

TEST_CASE("a tokenizer without the format's special tokens is refused by name", "[chat]") {
    const pv::Tokenizer plain = pv::Tokenizer::train(kCorpus, 300);
    const std::string m = thrown([&] { pv::check_chat_tokens(plain, pv::ChatFormat::llama3); });
    CHECK_THAT(m, Catch::Matchers::Contains("no special token \"<|begin_of_text|>\"") &&
                      Catch::Matchers::Contains("llama3 chat format"));
    CHECK_THAT(thrown([&] { pv::check_chat_tokens(llama3_tok(), pv::ChatFormat::llama2); }),
               Catch::Matchers::Contains("\"<s>\""));
    CHECK_NOTHROW(pv::check_chat_tokens(llama3_tok(), pv::ChatFormat::llama3_1));
    CHECK_NOTHROW(pv::check_chat_tokens(llama2_tok(), pv::ChatFormat::llama2));
}

TEST_CASE("the chat template: --chat-template, else --chat-format, else tokenizer_config.json's, else an error",
          "[chat]") {
    TempDir dir("chat_config");
    using Catch::Matchers::Contains;
    const auto config = [&](const nlohmann::json& j) {
        const std::string path = dir.file("tokenizer_config.json");
        write_text(path, j.dump(2));
        return path;
    };
    // tokenizer_config.json's template is used as it is (any template: it runs in the Jinja
    // subset), with the file's named tokens and added tokens.
    const pv::ChatFormat own = pv::resolve_chat_format(
        "", config({{"chat_template", kLlama3Template},
                    {"bos_token", "<|begin_of_text|>"},
                    {"eos_token", {{"content", "<|eot_id|>"}, {"lstrip", false}}},
                    {"added_tokens_decoder", {{"128006", {{"content", "<|start_header_id|>"}, {"special", true}}}}}}));
    CHECK(own.source == kLlama3Template);
    CHECK(own.bos_token == "<|begin_of_text|>");
    CHECK(own.eos_token == "<|eot_id|>");
    CHECK_THAT(own.name, Contains("chat_template of") && Contains("tokenizer_config.json"));
    CHECK(std::find(own.special_tokens.begin(), own.special_tokens.end(), "<|start_header_id|>") !=
          own.special_tokens.end());
    CHECK(pv::resolve_chat_format("", config({{"chat_template",
                                               {{{"name", "tool_use"}, {"template", "x"}},
                                                {{"name", "default"}, {"template", kLlama31Template}}}}}))
              .source == kLlama31Template);
    // The flag wins over the template, --chat-template over both.
    CHECK(pv::resolve_chat_format("llama2", config({{"chat_template", kLlama3Template}})).source ==
          pv::ChatFormat::llama2.source);
    CHECK(pv::resolve_chat_format("llama3.1", "") == pv::ChatFormat::llama3_1);
    write_text(dir.file("t.jinja"), "{{ bos_token }}{{ messages[0].content }}");
    const pv::ChatFormat file = pv::resolve_chat_format(
        "llama2", config({{"chat_template", kLlama3Template}, {"bos_token", "<B>"}}), dir.file("t.jinja"));
    CHECK(file.source == "{{ bos_token }}{{ messages[0].content }}");
    CHECK(file.bos_token == "<B>");
    // A template outside the subset is refused naming its line.
    CHECK_THAT(thrown([&] {
                   pv::resolve_chat_format("", config({{"chat_template", "{% for m in messages %}\n{% frob %}"}}));
               }),
               Contains("line 2") && Contains("unknown tag 'frob'"));
    // Every message names the formats there are.
    const auto names_formats = [](const std::string& m) {
        INFO(m);
        CHECK_THAT(m, Contains("llama3 (") && Contains("llama3.1 (") && Contains("llama2 ("));
        return m;
    };
    CHECK_THAT(names_formats(thrown([&] {
                   pv::resolve_chat_format("", config({{"bos_token", "<s>"}}));
               })),
               Contains("has no chat_template") && Contains("--chat-format"));
    CHECK_THAT(names_formats(thrown([&] { pv::resolve_chat_format("", dir.file("absent.json")); })),
               Contains("no tokenizer_config.json") && Contains("--chat-format"));
    CHECK_THAT(names_formats(thrown([&] { pv::resolve_chat_format("", ""); })), Contains("no tokenizer was given"));
    CHECK_THAT(names_formats(thrown([&] { pv::resolve_chat_format("chatml", ""); })),
               Contains("unknown chat format 'chatml'"));
    CHECK(pv::tokenizer_config_beside("/a/b/tokenizer.json") == "/a/b/tokenizer_config.json");
}

TEST_CASE("python_strip removes what Python's str.strip() does", "[chat]") {
    CHECK(pv::python_strip("  \t\n\r\v\fabc \n") == "abc");
    CHECK(pv::python_strip("\u00a0\u3000x y\u2028\u2029\u202f\u205f\u1680\u2000\u200a\x1c\x1f\u0085") == "x y");
    CHECK(pv::python_strip("\u200bx\u200b") == "\u200bx\u200b");  // zero-width space is not whitespace
    CHECK(pv::python_strip("\xa0x") == "\xa0x");                  // a lone byte 0xA0 is not U+00A0
    CHECK(pv::python_strip("x\xe3\x80") == "x\xe3\x80");          // a cut sequence stays
    CHECK(pv::python_strip(" \u3000 ") == "");
    CHECK(pv::python_strip("") == "");
}

TEST_CASE("malformed JSON lines name the file, the line and the message", "[chat]") {
    TempDir dir("chat_lines");
    using Catch::Matchers::Contains;
    const auto error_of = [&](const std::string& line) {
        const std::string path = dir.file("bad.jsonl");
        write_text(path, "{\"text\": \"fine\"}\n\n" + line + "\n");
        const std::string m = thrown([&] { pv::read_examples(path, "text"); });
        INFO(m);
        CHECK_THAT(m, Contains("input '" + path + "' line 3"));
        return m;
    };
    CHECK_THAT(error_of(R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]})"),
               Contains("message 1: has role \"bot\"") && Contains("\"system\", \"user\" and \"assistant\""));
    CHECK_THAT(error_of(R"({"messages": [{"role": "user", "content": 5}]})"),
               Contains("message 0: field \"content\" holds a JSON number, not a string"));
    CHECK_THAT(error_of(R"({"messages": [{"role": "user", "content": null}]})"), Contains("JSON null, not a string"));
    CHECK_THAT(error_of(R"({"messages": []})"), Contains("\"messages\" is empty"));
    CHECK_THAT(error_of(R"({"messages": "hi"})"), Contains("\"messages\" holds a JSON string, not an array"));
    CHECK_THAT(error_of(R"({"messages": ["hi"]})"), Contains("message 0: is a JSON string, not an object"));
    CHECK_THAT(error_of(R"({"messages": [{"content": "a"}]})"), Contains("message 0: has no \"role\""));
    CHECK_THAT(error_of(R"({"messages": [{"role": "user"}]})"), Contains("message 0: has no \"content\""));
    CHECK_THAT(error_of(R"({"messages": [{"role": 1, "content": "a"}]})"), Contains("has role 1"));
    CHECK_THAT(error_of(R"({"prompt": "q"})"), Contains("has \"prompt\" but no \"completion\""));
    CHECK_THAT(error_of(R"({"completion": "a"})"), Contains("has \"completion\" but no \"prompt\""));
    CHECK_THAT(error_of(R"({"prompt": "q", "completion": ["a"]})"),
               Contains("field \"completion\" holds a JSON array, not a string"));
    CHECK_THAT(error_of(R"({"body": "x"})"), Contains("no field \"text\"") && Contains("\"messages\""));
    CHECK_THAT(error_of(R"({"text": 3})"), Contains("field \"text\" holds a JSON number"));
    CHECK_THAT(error_of("[1, 2]"), Contains("not an object"));
    CHECK_THAT(error_of("{\"messages\": [}"), Contains("not JSON"));
    // A number beyond a double is nlohmann's out_of_range, not a parse_error; it once escaped as
    // that, naming neither file nor line (fuzz/corpus/examples/regression_number_overflow.jsonl,
    // found by fuzz_examples).
    CHECK_THAT(error_of(R"({"text": "a", "n": 2e333333})"), Contains("not JSON") && Contains("number overflow"));
    // The good shapes, in order; the kind is decided by the first of messages, prompt, text.
    const std::string path = dir.file("good.jsonl");
    write_text(path,
               "{\"text\": \"t\"}\n{\"prompt\": \"p\", \"completion\": \"c\", \"text\": \"ignored\"}\n"
               "{\"messages\": [{\"role\": \"system\", \"content\": \"s\", \"name\": \"x\"}], \"prompt\": \"p\"}\n"
               "{\"text\": \"\"}\n");
    const auto examples = pv::read_examples(path, "text");
    REQUIRE(examples.size() == 3);  // the empty text is skipped
    CHECK(examples[0].kind == pv::ExampleKind::text);
    CHECK(examples[0].text == "t");
    CHECK(examples[1].kind == pv::ExampleKind::prompt_completion);
    CHECK((examples[1].prompt == "p" && examples[1].completion == "c"));
    CHECK(examples[2].kind == pv::ExampleKind::chat);
    CHECK((examples[2].messages.size() == 1 && examples[2].messages[0].role == ChatRole::system));
    CHECK(examples[2].where == "input '" + path + "' line 3");
}

TEST_CASE("render_counted shows the examples with the counted tokens marked", "[chat]") {
    TempDir dir("chat_render");
    const pv::Tokenizer& tok = llama3_tok();
    const std::string path = dir.file("data.jsonl");
    write_text(path,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": "
               "\"Hello!\"}]}\n{\"prompt\": \"Q:\", \"completion\": \" four\"}\n{\"text\": \"The end.\"}\n"
               "{\"text\": \"not shown\"}\n{not read: the render stops at its examples\n");
    write_text(dir.file("tokenizer_config.json"),
               nlohmann::json({{"chat_template", kLlama3Template}, {"bos_token", "<|begin_of_text|>"}}).dump());
    pv::RenderOptions o;
    o.tokenizer_config = dir.file("tokenizer_config.json");
    const std::string out = pv::render_counted(tok, path, o);
    INFO(out);
    const Expected first =
        expected_of(tok, {{"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n",
                           false},
                          {"Hello!<|eot_id|>", true}});
    const long counted = std::count(first.counted.begin(), first.counted.end(), true);
    const std::string eos = tok.decode({tok.eos_id()});
    const std::string want =
        "input '" + path + "' line 1: chat (chat_template of '" + o.tokenizer_config + "'), " + std::to_string(first.tokens.size()) + " tokens, " +
        std::to_string(counted) +
        " counted\n<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>"
        "assistant<|end_header_id|>\n\n⟦Hello!<|eot_id|>⟧\n\ninput '" +
        path + "' line 2: prompt/completion, ";
    CHECK(out.substr(0, want.size()) == want);
    CHECK(out.find("counted\nQ:⟦ four" + eos + "⟧\n") != std::string::npos);
    CHECK(out.find("line 3: text, ") != std::string::npos);
    // A text's first token counts (it may be predicted across documents); the rest too.
    CHECK(out.find("counted\n⟦The end." + eos + "⟧\n") != std::string::npos);
    CHECK(out.find("not shown") == std::string::npos);  // three examples by default
    CHECK_THAT(thrown([&] { pv::read_examples(path, "text"); }), Catch::Matchers::Contains("line 5: not JSON"));
    CHECK(pv::read_examples(path, "text", 4).size() == 4);
    o.train_on_prompt = true;
    o.examples = 1;
    o.colour = true;
    const std::string all = pv::render_counted(tok, path, o);
    CHECK(all.find("<|begin_of_text|>\x1b[32m⟦<|start_header_id|>user") != std::string::npos);
    CHECK(all.find("line 2") == std::string::npos);
    // No template and no --chat-format: the error names the formats.
    o.tokenizer_config = dir.file("absent.json");
    CHECK_THAT(thrown([&] { pv::render_counted(tok, path, o); }), Catch::Matchers::Contains("--chat-format"));
}

TEST_CASE("the Llama 3 tokenizer renders a chat as Meta's ids", "[chat]") {
    const fs::path path = fs::current_path().parent_path() / "shared" / "tokenizers" / "llama3-tokenizer.json";
    if (!fs::exists(path)) {
        WARN("skipped: " << path << " is absent");
        return;
    }
    const pv::Tokenizer tok = pv::Tokenizer::load(path.string());
    const Encoded got =
        encode(tok, chat({{ChatRole::user, "Hi"}, {ChatRole::assistant, "Hello"}}), pv::ChatFormat::llama3);
    // From the file's vocabulary: <|begin_of_text|> 128000, <|start_header_id|> 128006,
    // <|end_header_id|> 128007, <|eot_id|> 128009, "user" 882, "ĊĊ" (\n\n) 271, "Hi" 13347,
    // "assistant" 78191, "Hello" 9906.
    CHECK(got.tokens == std::vector<uint32_t>{128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007,
                                              271, 9906, 128009});
    CHECK(got.flags == std::vector<uint8_t>{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1});
}

TEST_CASE("the published templates render as transformers renders them, answers by the prefix rule",
          "[chat]") {
    // test/data/chat_templates/golden.json: transformers 5.23's apply_chat_template output for
    // each template and conversation, with the answer spans (make_chat_template_golden.py).
    std::ifstream in("test/data/chat_templates/golden.json");
    REQUIRE(in.good());
    const nlohmann::json golden = nlohmann::json::parse(in);
    ::setenv("SOURCE_DATE_EPOCH", std::to_string(golden["epoch"].get<long long>()).c_str(), 1);
    int cases = 0;
    for (const auto& [name, t] : golden["templates"].items()) {
        std::ifstream src("test/data/chat_templates/" + name);
        const std::string source((std::istreambuf_iterator<char>(src)), std::istreambuf_iterator<char>());
        REQUIRE(!source.empty());
        const std::vector<std::string> specials = t["special_tokens"].get<std::vector<std::string>>();
        const pv::ChatFormat f = pv::make_chat_format(name, source, t["bos_token"].is_string() ? t["bos_token"] : "",
                                                      t["eos_token"], specials);
        for (const nlohmann::json& c : t["cases"]) {
            std::vector<pv::ChatMessage> messages;
            std::string contents;
            for (const nlohmann::json& m : c["messages"]) {
                messages.push_back({*pv::parse_chat_role(m["role"].get<std::string>()), m["content"]});
                contents += m["content"].get<std::string>() + "\n";
            }
            const std::string want = c["text"];
            INFO(name << "\n" << want);
            std::string text;
            std::vector<bool> answer;
            size_t special_pieces = 0;
            for (const pv::ChatPiece& p : pv::chat_pieces(f, messages)) {
                text += p.text;
                answer.insert(answer.end(), p.text.size(), p.target == pv::PieceTarget::answer);
                special_pieces += p.special;
            }
            CHECK(text == want);
            std::vector<bool> want_answer(want.size(), false);
            for (const nlohmann::json& s : c["answers"])
                for (size_t b = s[0]; b < s[1].get<size_t>(); ++b) want_answer[b] = true;
            CHECK(answer == want_answer);
            // Special tokens: each one the template wrote, none of those the messages spell.
            const auto count = [&](const std::string& s) {
                size_t n = 0;
                for (const std::string& sp : specials)
                    for (size_t at = s.find(sp); at != std::string::npos; at = s.find(sp, at + sp.size())) ++n;
                return n;
            };
            CHECK(special_pieces == count(want) - count(contents));
            ++cases;
        }
    }
    ::unsetenv("SOURCE_DATE_EPOCH");
    CHECK(cases >= 30);
}
