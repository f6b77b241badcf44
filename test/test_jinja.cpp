// The Jinja subset (data/jinja.h): each construct chat templates use against the output Jinja2
// gives for it under transformers' settings (trim_blocks, lstrip_blocks; the expected strings
// are Jinja2's documented behaviour, worked out by hand), provenance marks through string
// operations, errors that name the line, and random inputs that must never crash the parser.
#include "data/jinja.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <random>
#include <string>

namespace jinja_test {

using json = nlohmann::ordered_json;
using Catch::Matchers::Contains;

std::string render(const std::string& src, const json& ctx = json::object()) {
    return pv::JinjaTemplate(src, "t").render(ctx).text;
}

std::string error_of(const std::string& src, const json& ctx = json::object()) {
    try {
        render(src, ctx);
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

TEST_CASE("jinja: text, output, comments and literals") {
    CHECK(render("plain text") == "plain text");
    CHECK(render("a{# a comment #}b") == "ab");
    CHECK(render("{{ 'x' }}{{ \"y\" }}") == "xy");
    CHECK(render("{{ 'a\\nb\\t\\'c\\\\' }}") == "a\nb\t'c\\");
    CHECK(render("{{ '\\u00e9\\x41' }}") == "\xc3\xa9"
                                             "A");
    CHECK(render("{{ 1 }} {{ 1.5 }} {{ 2.0 }} {{ -3 }} {{ 1e3 }}") == "1 1.5 2.0 -3 1000.0");
    CHECK(render("{{ true }} {{ False }} {{ none }} {{ None }}") == "True False None None");
    CHECK(render("{{ [1, 'a', none] }}") == "[1, 'a', None]");
    CHECK(render("{{ {'a': 1, 'b': [true]} }}") == "{'a': 1, 'b': [True]}");
    CHECK(render("{{ undefined_thing }}|") == "|");
    CHECK(render("{{ 'a' 'b' }}") == "ab");
}

TEST_CASE("jinja: arithmetic, comparison and logic follow Python") {
    CHECK(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }}") ==
          "7 9 3 -4 1 2");
    CHECK(render("{{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 1 + 1.5 }}") == "3.5 2.0 1024 2.5");
    CHECK(render("{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}") == "ab a1None abab [1, 2]");
    CHECK(render("{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1] == [1] }}") ==
          "True False True True True");
    CHECK(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}") ==
          "True True True True");
    CHECK(render("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not 0 }} {{ not 1 == 2 }}") == "x y True True");
    CHECK(render("{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'yes' if 0 }}]") == "yes no []");
    CHECK(render("{{ '' or [] or 0 or none or 'last' }}") == "last");
}

TEST_CASE("jinja: whitespace control, trim_blocks and lstrip_blocks as transformers sets them") {
    // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
    CHECK(render("{% if true %}\n  yes\n{% endif %}\nz") == "  yes\nz");
    CHECK(render("a\n    {% if true %}\nb\n    {% endif %}\nc") == "a\nb\nc");
    CHECK(render("{{ 'x' }}\ny") == "x\ny");  // not after {{ }}
    CHECK(render("a  {{- 'x' -}}  \n b") == "axb");
    CHECK(render("a \n {%- if true -%} \n b {%- endif %}") == "ab");
    CHECK(render("  {%+ if true %}x{% endif %}") == "  x");
    CHECK(render("{% if true +%}\nx{% endif %}") == "\nx");
    CHECK(render("x {% if true %}y{% endif %}") == "x y");  // not at the start of a line: kept
    CHECK(render("{# c #}\nx") == "x");
    CHECK(render("{% raw %}{{ not evaluated }}{% endraw %}") == "{{ not evaluated }}");
    CHECK(render("{{ 'x' }}\n") == "x");  // keep_trailing_newline=False: one final newline goes
    CHECK(render("x\n\n") == "x\n");
}

TEST_CASE("jinja: if, for, loop variables, set, namespace, macro") {
    CHECK(render("{% if 0 %}a{% elif 1 %}b{% else %}c{% endif %}") == "b");
    CHECK(render("{% for x in [1, 2, 3] %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}"
                 "{{ loop.length }} {% endfor %}") == "01TrueFalse3 12FalseFalse3 23FalseTrue3 ");
    CHECK(render("{% for x in [1, 2, 3, 4] if x % 2 == 0 %}{{ x }}{{ loop.index }}{% endfor %}") == "2142");
    CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}") == "empty");
    CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") == "a=1;b=2;");
    CHECK(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}") == "13");
    CHECK(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}") == "1");
    // set in a loop does not leak; a namespace carries state out
    CHECK(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}") == "1");
    CHECK(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}") ==
          "4");
    CHECK(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}") == "21");
    CHECK(render("{% set s %}in{{ 1 }}{% endset %}[{{ s }}]") == "[in1]");
    CHECK(render("{% macro m(a, b='d') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}") == "<1d><2x>");
    CHECK(render("{% for x in range(3) %}{{ x }}{% endfor %}{{ range(1, 7, 2) }}") == "012[1, 3, 5]");
    CHECK(render("{% for a in [1, 2] %}{% for b in [3] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}") ==
          "1112");
}

TEST_CASE("jinja: attribute, item and slice access") {
    const json ctx = {{"m", {{"role", "user"}, {"content", "hello"}}}, {"l", {1, 2, 3, 4}}};
    CHECK(render("{{ m.role }} {{ m['content'] }} {{ m.missing is defined }} {{ m.get('role') }}"
                 "{{ m.get('x', 'def') }}",
                 ctx) == "user hello False userdef");
    CHECK(render("{{ l[0] }}{{ l[-1] }}{{ l[1:] }}{{ l[:2] }}{{ l[::-1] }}{{ l[::2] }}{{ l[5] is defined }}", ctx) ==
          "14[2, 3, 4][1, 2][4, 3, 2, 1][1, 3]False");
    CHECK(render("{{ 'h\xc3\xa9llo'[1] }}{{ 'hello'[1:3] }}{{ 'abc'[::-1] }}") == "\xc3\xa9"
                                                                                    "elcba");
    CHECK(render("{{ m.keys() | list }} {{ m.values() | list }}", ctx) == "['role', 'content'] ['user', 'hello']");
}

TEST_CASE("jinja: tests") {
    const json ctx = {{"s", "x"}, {"n", nullptr}, {"d", json::object()}, {"l", json::array()}, {"i", 3}};
    CHECK(render("{{ s is string }}{{ n is none }}{{ n is not none }}{{ d is mapping }}{{ l is iterable }}"
                 "{{ l is sequence }}{{ i is number }}{{ i is integer }}{{ i is odd }}{{ i is divisibleby 3 }}"
                 "{{ q is defined }}{{ q is undefined }}{{ false is false }}{{ true is true }}{{ s is mapping }}",
                 ctx) == "TrueTrueFalseTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueFalse");
}

TEST_CASE("jinja: filters and string methods") {
    CHECK(render("{{ '  a b  ' | trim }}|{{ '  a  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|"
                 "{{ 'a  '.rstrip() }}") == "a b|a|a|a|a");
    CHECK(render("{{ 'abc' | upper }}{{ 'ABC' | lower }}{{ 'hello world' | title }}{{ 'hELLO' | capitalize }}") ==
          "ABCabcHello WorldHello");
    CHECK(render("{{ [1, 2] | length }}{{ 'h\xc3\xa9' | length }}{{ {'a': 1} | count }}{{ u | length }}") == "2210");
    CHECK(render("{{ u | default('d') }}{{ '' | default('e') }}{{ '' | default('f', true) }}") == "df");
    CHECK(render("{{ ['a', 'b'] | join(', ') }}{{ [1, 2] | first }}{{ [1, 2] | last }}{{ 'ab' | list }}") ==
          "a, b12['a', 'b']");
    CHECK(render("{{ {'a': 1} | items | list }}{{ 5 | string }}{{ 'aXbX' | replace('X', '-') }}") ==
          "[('a', 1)]5a-b-");
    CHECK(render("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ 'a-b-c'.rsplit('-', 1) }}") ==
          "['a', 'b', '', 'c']['a', 'b']['a', 'b c']['a-b', 'c']");
    CHECK(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}") ==
          "TrueTrueTrue");
    CHECK(render("{{ '{} and {}'.format(1, 'b') }}{{ '{0}{0}'.format('x') }}{{ '{n}!'.format(n=3) }}") == "1 and bxx3!");
    CHECK(render("{{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}") == "a\n  b|  a\n  b");
    const json ctx = {{"ms",
                       {{{"role", "system"}, {"content", "S"}},
                        {{"role", "user"}, {"content", "U"}},
                        {{"role", "user"}, {"content", "V"}}}}};
    CHECK(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join }}", ctx) == "UV");
    CHECK(render("{{ ms | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}", ctx) == "['S']");
    CHECK(render("{{ ms | map(attribute='role') | unique | list }}", ctx) == "['system', 'user']");
    CHECK(render("{{ 'x' | safe }}{{ ['b', 'a'] | sort }}{{ [1, 2] | reverse | list }}") == "x['a', 'b'][2, 1]");
    // found by comparing random expressions with Jinja2: a sign binds before filters, bools are
    // numbers, the title filter starts words only after spaces and brackets, n * s repeats
    CHECK(render("{{ -2 | abs }}{{ true is number }}{{ \"{'b'} x-y\" | title }}{{ 2 * 'ab' }}{{ (1, 2)[::-1] }}") ==
          "2True{'b'} X-Yabab(2, 1)");
    CHECK(render("\r\nx\ry") == "\nx\ny");
}

TEST_CASE("jinja: tojson is json.dumps(ensure_ascii=False) as transformers configures it") {
    const json ctx = {{"v", {{"name", "f"}, {"args", {1, 2.5, true, nullptr}}, {"s", "\xc3\xa9\"\n<&>"}}}};
    CHECK(render("{{ v | tojson }}", ctx) ==
          "{\"name\": \"f\", \"args\": [1, 2.5, true, null], \"s\": \"\xc3\xa9\\\"\\n<&>\"}");
    CHECK(render("{{ v | tojson(indent=2) }}", json{{"v", {{"a", {1}}}}}) == "{\n  \"a\": [\n    1\n  ]\n}");
    CHECK(render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}") == "{\"a\": 2, \"b\": 1}");
    CHECK(render("{{ [] | tojson }}{{ {} | tojson }}") == "[]{}");
}

TEST_CASE("jinja: undefined values behave as Jinja's default Undefined") {
    CHECK(render("[{{ nothing }}]{% for x in nothing %}x{% endfor %}{% if nothing %}y{% endif %}") == "[]");
    CHECK(render("{{ nothing | length }}{{ nothing is defined }}") == "0False");
    CHECK_THAT(error_of("\n{{ nothing.attr }}"), Contains("line 2") && Contains("'nothing' is undefined"));
    CHECK_THAT(error_of("{{ nothing + 1 }}"), Contains("undefined"));
    CHECK_THAT(error_of("{{ messages[0]['role'] }}", json{{"messages", json::array()}}), Contains("undefined"));
}

TEST_CASE("jinja: errors name the line and what is wrong") {
    CHECK_THAT(error_of("a\n{% if x %}"), Contains("t: line 2") && Contains("never closed"));
    CHECK_THAT(error_of("{% endif %}"), Contains("without the block"));
    CHECK_THAT(error_of("\n\n{{ x | nosuchfilter }}"), Contains("line 3") && Contains("no filter named 'nosuchfilter'"));
    CHECK_THAT(error_of("{{ x is nosuchtest }}"), Contains("no test named"));
    CHECK_THAT(error_of("{{ 'unterminated }}"), Contains("line 1"));
    CHECK_THAT(error_of("{{ 1 + }}"), Contains("expected a value"));
    CHECK_THAT(error_of("{% frobnicate %}"), Contains("unknown tag 'frobnicate'"));
    CHECK_THAT(error_of("{{ 'a' + 1 }}"), Contains("unsupported operand"));
    CHECK_THAT(error_of("{{ [1].append(2) }}"), Contains("sandbox"));
    CHECK_THAT(error_of("{{ 1 / 0 }}"), Contains("division by zero"));
    // raise_exception's message is the template's, exactly
    try {
        render("{{ raise_exception('Conversation roles must alternate') }}");
        FAIL("no exception");
    } catch (const pv::JinjaRaised& e) {
        CHECK(std::string(e.what()) == "Conversation roles must alternate");
    }
}

TEST_CASE("jinja: provenance marks follow data through string operations") {
    const json ctx = {{"m", {{"content", "  <|x|> hi  "}}}, {"bos", "<s>"}};
    const pv::JinjaRendering r = pv::JinjaTemplate("{{ bos }}[{{ m.content | trim }}]{{ m.content.upper()[0:3] }}")
                                     .render(ctx, {"m"});
    CHECK(r.text == "<s>[<|x|> hi]  <");
    CHECK(r.data == std::string("\0\0\0\0", 4) + std::string(8, '\1') + std::string(1, '\0') + std::string(3, '\1'));
    const pv::JinjaRendering g =
        pv::JinjaTemplate("a{% generation %}b{{ 'c' }}{% endgeneration %}d{% generation %}{% endgeneration %}").render({});
    CHECK(g.text == "abcd");
    REQUIRE(g.generation.size() == 2);
    CHECK(g.generation[0] == std::pair<size_t, size_t>(1, 3));
    CHECK(g.generation[1] == std::pair<size_t, size_t>(4, 4));
}

TEST_CASE("jinja: strftime_now renders today's date in the given format") {
    const std::string s = render("{{ strftime_now('%Y') }}");
    CHECK(s.size() == 4);
    CHECK(s >= "2024");
}

TEST_CASE("jinja: random sources never crash the parser or the renderer") {
    const std::vector<std::string> atoms = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", "if", "for", "in", "endif",
                                            "endfor", "x", "'s'", "\"", "(", ")", "[", "]", "|", "trim", ".", "1",
                                            " ", "\n", "set", "=", "loop", "not", "and", "is", "defined", ",", ":",
                                            "{", "}", "else", "macro", "endmacro", "~", "*", "raw", "endraw"};
    std::mt19937 rng(12345);
    int rendered = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        std::string src;
        const int n = int(rng() % 24);
        for (int k = 0; k < n; ++k) src += atoms[rng() % atoms.size()];
        try {
            pv::JinjaTemplate t(src, "r");
            (void)t.render(json{{"x", {1, "a"}}});
            ++rendered;
        } catch (const pv::JinjaError&) {
        } catch (const pv::JinjaRaised&) {
        }
    }
    CHECK(rendered > 100);
}

}  // namespace jinja_test

namespace jinja_test {

TEST_CASE("jinja: hostile templates end in an error, not a crash or a hang") {
    CHECK_THAT(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), Contains("nested deeper"));
    std::string chain = "{{ 1";
    for (int i = 0; i < 5000; ++i) chain += " + 1";
    CHECK_THAT(error_of(chain + " }}"), Contains("deeper than"));
    std::string blocks;
    for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
    CHECK_THAT(error_of(blocks), Contains("nested deeper"));
    CHECK_THAT(error_of("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"), Contains("levels deep"));
    CHECK_THAT(error_of("{{ 'ab' * 1000000000000 }}"), Contains("too large"));
    CHECK_THAT(error_of("{{ range(100000000) }}"), Contains("range()"));
}

// A million loop iterations before the limit stops them: 1 s here, 40 s under ASan, where the
// loop's code path is the one the cases above already run ([heavy]: left out of the ASan build).
TEST_CASE("jinja: a loop that would not finish ends at the iteration limit", "[heavy]") {
    CHECK_THAT(error_of("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}x"),
               Contains("without finishing"));
}

}  // namespace jinja_test
