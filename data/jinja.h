// A Jinja2 subset: enough of the language to render Hugging Face chat templates
// (tokenizer_config.json's `chat_template`) exactly as transformers' apply_chat_template does.
// Host code only.
//
// Why here, in C++: the product must not spawn Python (python3-jinja2 would make every
// `train prepare` depend on an interpreter and its packages, and a chat template is code
// from a downloaded file); a subset written here is tested on every platform CI builds, and
// chat templates use a small, stable part of Jinja. The facts followed are Jinja2's documented
// semantics and transformers' settings for chat templates (chat_template_utils.py,
// _compile_jinja_template): an ImmutableSandboxedEnvironment with trim_blocks=True,
// lstrip_blocks=True, the loopcontrols extension ({% break %}, {% continue %}), the
// {% generation %} block, a `tojson` that is json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys), and the globals raise_exception(msg) and
// strftime_now(fmt). No code of theirs is copied.
//
// The subset (data/jinja_parse.cpp parses it; data/jinja_eval.cpp evaluates it):
//   text, {{ expr }}, {% stmt %}, {# comment #}; whitespace control "-" on either side of any
//   tag, "+" to turn off lstrip_blocks / trim_blocks for one tag; trim_blocks (the newline after
//   a block or comment tag is dropped) and lstrip_blocks (spaces and tabs from the start of a
//   line up to a block or comment tag are dropped); one newline ending the source is dropped
//   (Jinja's keep_trailing_newline=False); "\r\n" and "\r" in the source read as "\n".
//   statements: if/elif/else, for x in y [if cond] ... [else] ... endfor (and for a, b in ...),
//   loop.index0/index/revindex/revindex0/first/last/length/previtem/nextitem, break, continue,
//   set x = e, set a, b = e, set ns.attr = e, set x %}...{% endset, macro/endmacro (positional
//   and keyword arguments with defaults; called as a function), generation/endgeneration, raw.
//   expressions (Jinja's precedence): literals (strings with Python escapes, ints, floats,
//   true/false/none in either case, lists, tuples, dicts), + - * / // % ** ~, comparisons
//   (chained), and/or/not, in/not in, `is [not] TEST` (defined, undefined, none, string, number,
//   integer, float, mapping, iterable, sequence, boolean, true, false, callable, odd, even,
//   divisibleby, eq/equalto/==, ne, lt, le, gt, ge, in, sameas), attribute and item access,
//   slices with steps, calls, filters (see jinja_eval.cpp's filter table), `a if c else b`.
//   Strings have Python's methods templates use (strip, lstrip, rstrip, split, rsplit,
//   startswith, endswith, upper, lower, title, capitalize, replace, find, count, join, format
//   for "{}"/"{0}"/"{name}" fields); dicts items/keys/values/get; lists index/count.
//   Globals: range, namespace, dict, raise_exception, strftime_now (today's local date and time, or
//   SOURCE_DATE_EPOCH's in UTC when that variable holds an integer: reproducible renderings).
// Semantics followed: Python truthiness, str() of values ("None", "True", "1.0", "['a', 'b']"),
// Jinja's default Undefined (renders empty, is falsy, iterates as empty, has length 0, but
// attribute or item access on it, calling it and arithmetic with it are errors), `set` inside a
// for loop does not leak out of it (namespace() objects are how templates carry state out), the
// sandbox's refusal to mutate lists and dicts. Case mapping (upper, lower, title, capitalize) maps
// ASCII letters only; other characters are kept as they are.
//
// Errors: a template that does not parse throws JinjaError naming the template, the line and
// what is wrong; rendering errors (unknown filter, undefined attribute, a type error) name the
// line too. raise_exception(msg) throws JinjaRaised whose what() is exactly msg.
//
// Provenance ("data"): each rendered byte is marked as coming from the template (its literal
// text, and context values passed as template-owned such as bos_token) or from data (values
// under the keys the caller names, e.g. the messages). String operations carry the marks
// through (concatenation, strip, slices, split, join, replace); an operation that transforms
// a data string in other ways marks its whole result as data. Callers use the marks so that
// only template text is ever read as special tokens (data/chat.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pv {

// A syntax or rendering error; the message names the template and the line.
struct JinjaError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The template called raise_exception(msg): what() is msg.
struct JinjaRaised : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct JinjaRendering {
    std::string text;
    std::string data;  // one byte per byte of text: 1 where it came from data, else 0
    // [begin, end) byte ranges of text written inside {% generation %} blocks, in order.
    std::vector<std::pair<size_t, size_t>> generation;
};

namespace jinja {
struct Template;  // the parsed template (data/jinja_ast.h)
}

class JinjaTemplate {
public:
    // Parses `source`; throws JinjaError naming `name` and the line when it is not in the subset.
    explicit JinjaTemplate(std::string_view source, std::string name = "chat template");
    ~JinjaTemplate();
    JinjaTemplate(JinjaTemplate&&) noexcept;
    JinjaTemplate& operator=(JinjaTemplate&&) noexcept;

    // Renders with the context's keys as variables. Strings under the keys in `data_keys` (at any
    // depth) are marked as data; the rest as template text.
    JinjaRendering render(const nlohmann::ordered_json& context, const std::vector<std::string>& data_keys = {}) const;

    // Whether the template has a {% generation %} block.
    bool has_generation() const;

    const std::string& name() const;

private:
    std::unique_ptr<jinja::Template> t_;
};

}  // namespace pv
