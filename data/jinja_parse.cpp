// The Jinja subset's lexer and parser (data/jinja.h): source text to a syntax tree
// (data/jinja_ast.h), applying the whitespace rules at lexing time as Jinja does, so the tree's
// text nodes are exactly what is written.
#include "data/jinja.h"
#include "data/jinja_ast.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

namespace pv::jinja {
namespace {

[[noreturn]] void syntax(const std::string& name, int line, const std::string& what) {
    throw JinjaError(name + ": line " + std::to_string(line) + ": syntax error: " + what);
}

// One piece of the source: raw text, or a tag's inside ({{ }}: 'v', {% %}: 'b').
struct Chunk {
    char kind;  // 't' text, 'v' variable, 'b' block
    std::string text;
    int line;
};

int count_lines(std::string_view s) { return int(std::count(s.begin(), s.end(), '\n')); }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Splits the source into chunks, applying whitespace control, trim_blocks and lstrip_blocks.
std::vector<Chunk> scan(std::string_view src, const std::string& name) {
    std::vector<Chunk> out;
    size_t i = 0;
    int line = 1;
    bool line_starting = true;  // the previous match ended with a newline (or this is the start)
    bool strip_next = false;    // the previous tag ended with "-"
    while (i <= src.size()) {
        size_t open = i;
        for (;;) {
            open = src.find('{', open);
            if (open == std::string_view::npos || open + 1 >= src.size()) {
                open = std::string_view::npos;
                break;
            }
            const char c = src[open + 1];
            if (c == '{' || c == '%' || c == '#') break;
            ++open;
        }
        std::string text(src.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i));
        const int text_line = line;
        line += count_lines(text);
        if (strip_next) {
            size_t k = 0;
            while (k < text.size() && is_space(text[k])) ++k;
            text.erase(0, k);
        }
        if (open == std::string_view::npos) {
            if (!text.empty()) out.push_back({'t', text, text_line});
            break;
        }
        const char kind = src[open + 1];
        size_t inner = open + 2;
        const char left = inner < src.size() ? src[inner] : 0;
        if (left == '-') {
            while (!text.empty() && is_space(text.back())) text.pop_back();
        } else if (left != '+' && kind != '{') {  // lstrip_blocks
            const size_t nl = text.rfind('\n');
            const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
            if (l_pos > 0 || line_starting) {
                bool blank = l_pos < text.size();
                for (size_t k = l_pos; k < text.size(); ++k) blank = blank && is_space(text[k]);
                if (blank) text.resize(l_pos);
            }
        }
        if (!text.empty()) out.push_back({'t', text, text_line});
        if (left == '-' || left == '+') ++inner;
        const int tag_line = line;
        const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        // The tag's end: for {{ }} and {% %}, outside string literals.
        size_t end = inner;
        if (kind == '#') {
            end = src.find("#}", inner);
        } else {
            char quote = 0;
            for (; end < src.size(); ++end) {
                const char c = src[end];
                if (quote) {
                    if (c == '\\') ++end;
                    else if (c == quote) quote = 0;
                } else if (c == '\'' || c == '"') {
                    quote = c;
                } else if (src.compare(end, 2, close) == 0) {
                    break;
                }
            }
            if (end >= src.size()) end = std::string_view::npos;
        }
        if (end == std::string_view::npos)
            syntax(name, tag_line, "unclosed '" + std::string(src.substr(open, 2)) + "' (no '" + close + "')");
        size_t body_end = end;
        char right = 0;
        if (body_end > inner && (src[body_end - 1] == '-' || src[body_end - 1] == '+')) right = src[--body_end];
        std::string body(src.substr(inner, body_end - inner));
        line += count_lines(src.substr(open, end + 2 - open));
        i = end + 2;
        strip_next = right == '-';
        line_starting = false;
        if (right != '-' && right != '+' && kind != '{') {  // trim_blocks: one newline after the tag
            if (src.compare(i, 1, "\n") == 0) ++i, ++line, line_starting = true;
            else if (src.compare(i, 2, "\r\n") == 0) i += 2, ++line, line_starting = true;
        }
        if (kind == '#') continue;
        if (kind == '%') {  // {% raw %}: everything to {% endraw %} is text
            size_t a = 0;
            while (a < body.size() && is_space(body[a])) ++a;
            size_t b = body.size();
            while (b > a && is_space(body[b - 1])) --b;
            if (body.substr(a, b - a) == "raw") {
                size_t e = i;
                size_t raw_end = std::string_view::npos, after = 0;
                while ((e = src.find("{%", e)) != std::string_view::npos) {
                    size_t k = e + 2;
                    if (k < src.size() && (src[k] == '-' || src[k] == '+')) ++k;
                    while (k < src.size() && is_space(src[k])) ++k;
                    if (src.compare(k, 6, "endraw") == 0) {
                        const size_t c = src.find("%}", k);
                        if (c == std::string_view::npos) break;
                        raw_end = e, after = c + 2;
                        break;
                    }
                    e += 2;
                }
                if (raw_end == std::string_view::npos) syntax(name, tag_line, "{% raw %} without {% endraw %}");
                std::string raw(src.substr(i, raw_end - i));
                if (src[raw_end + 2] == '-')
                    while (!raw.empty() && is_space(raw.back())) raw.pop_back();
                out.push_back({'t', raw, line});
                line += count_lines(src.substr(i, after - i));
                i = after;
                strip_next = src[after - 3] == '-';
                if (src[after - 3] != '-' && src.compare(i, 1, "\n") == 0) ++i, ++line;
                continue;
            }
        }
        out.push_back({kind == '{' ? 'v' : 'b', body, tag_line});
    }
    return out;
}

// Expression tokens.
struct Tok {
    enum Kind { name, str, integer, floating, op, end };
    Kind kind;
    std::string text;  // name, op, decoded string
    int64_t i = 0;
    double f = 0;
};

void append_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) s += char(cp);
    else if (cp < 0x800) s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    else if (cp < 0x10000) s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
    else
        s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F)), s += char(0x80 | ((cp >> 6) & 0x3F)),
            s += char(0x80 | (cp & 0x3F));
}

std::vector<Tok> tokenize(const std::string& s, const std::string& name, int line) {
    std::vector<Tok> out;
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (is_space(c)) {
            ++i;
            continue;
        }
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            size_t j = i;
            while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
            out.push_back({Tok::name, s.substr(i, j - i)});
            i = j;
            continue;
        }
        if (std::isdigit(static_cast<unsigned char>(c))) {
            size_t j = i;
            bool is_float = false;
            while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
            if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
                is_float = true;
                ++j;
                while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
            }
            if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
                if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
                    is_float = true;
                    j = k;
                    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
                }
            }
            std::string digits;
            for (size_t k = i; k < j; ++k)
                if (s[k] != '_') digits += s[k];
            Tok t{is_float ? Tok::floating : Tok::integer, digits};
            if (is_float) t.f = std::strtod(digits.c_str(), nullptr);
            else t.i = std::strtoll(digits.c_str(), nullptr, 10);
            out.push_back(t);
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            std::string v;
            size_t j = i + 1;
            for (; j < s.size() && s[j] != c; ++j) {
                if (s[j] != '\\' || j + 1 >= s.size()) {
                    v += s[j];
                    continue;
                }
                const char e = s[++j];
                switch (e) {
                    case 'n': v += '\n'; break;
                    case 't': v += '\t'; break;
                    case 'r': v += '\r'; break;
                    case 'b': v += '\b'; break;
                    case 'f': v += '\f'; break;
                    case 'v': v += '\v'; break;
                    case 'a': v += '\a'; break;
                    case '0': v += '\0'; break;
                    case '\\': v += '\\'; break;
                    case '\'': v += '\''; break;
                    case '"': v += '"'; break;
                    case '\n': break;
                    case 'x':
                    case 'u':
                    case 'U': {
                        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                        if (j + n >= s.size()) syntax(name, line, "a truncated \\" + std::string(1, e) + " escape");
                        const std::string hex = s.substr(j + 1, n);
                        append_utf8(v, uint32_t(std::strtoul(hex.c_str(), nullptr, 16)));
                        j += n;
                        break;
                    }
                    default: v += '\\', v += e;  // Python keeps unknown escapes as written
                }
            }
            if (j >= s.size()) syntax(name, line, "an unterminated string literal");
            out.push_back({Tok::str, v});
            i = j + 1;
            continue;
        }
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                          "(",  ")",  "[",  "]",  "{",  "}",  ",", ".", ":", "|", "=", "?"};
        bool found = false;
        for (const char* op : ops)
            if (s.compare(i, std::strlen(op), op) == 0) {
                out.push_back({Tok::op, op});
                i += std::strlen(op);
                found = true;
                break;
            }
        if (!found) syntax(name, line, std::string("unexpected character '") + c + "'");
    }
    out.push_back({Tok::end, ""});
    return out;
}

// Parses one tag's tokens.
class ExprParser {
public:
    ExprParser(std::vector<Tok> toks, const std::string& name, int line) : t_(std::move(toks)), name_(name), line_(line) {}

    bool at_end() const { return t_[p_].kind == Tok::end; }
    bool is_op(const char* op) const { return t_[p_].kind == Tok::op && t_[p_].text == op; }
    bool is_name(const char* n) const { return t_[p_].kind == Tok::name && t_[p_].text == n; }
    bool is_name_at(size_t k, const char* n) const {
        return p_ + k < t_.size() && t_[p_ + k].kind == Tok::name && t_[p_ + k].text == n;
    }
    bool accept_op(const char* op) {
        if (!is_op(op)) return false;
        ++p_;
        return true;
    }
    bool accept_name(const char* n) {
        if (!is_name(n)) return false;
        ++p_;
        return true;
    }
    void expect_op(const char* op) {
        if (!accept_op(op)) fail(std::string("expected '") + op + "'");
    }
    std::string expect_name() {
        if (t_[p_].kind != Tok::name) fail("expected a name");
        return t_[p_++].text;
    }
    void expect_end() {
        if (!at_end()) fail("unexpected '" + t_[p_].text + "' at the end of the tag");
    }
    [[noreturn]] void fail(const std::string& what) const {
        syntax(name_, line_, what + (at_end() ? " (at the end of the tag)" : " (at '" + t_[p_].text + "')"));
    }

    ExprP make(Expr::Kind k) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->line = line_;
        return e;
    }

    // expression := or_expr ["if" or_expr ["else" expression]]
    ExprP expression(bool with_cond = true) {
        ExprP e = or_expr();
        if (with_cond && is_name("if")) {
            ++p_;
            auto c = make(Expr::cond);
            ExprP test = or_expr();
            ExprP other;
            if (accept_name("else")) other = expression();
            c->kids.push_back(std::move(test));
            c->kids.push_back(std::move(e));
            c->kids.push_back(std::move(other));
            return grown(std::move(c));
        }
        return e;
    }
    // e's height from its children's; chains built by loops (a + b + c ..., a.b.c ..., x | f | g
    // ...) are bounded here, nesting by Depth.
    ExprP grown(ExprP e) {
        for (const auto& k : e->kids)
            if (k) e->height = std::max(e->height, k->height + 1);
        for (const auto& k : e->kw)
            if (k.second) e->height = std::max(e->height, k.second->height + 1);
        if (e->height > kMaxHeight) fail("an expression deeper than " + std::to_string(kMaxHeight) + " operations");
        return e;
    }
    static constexpr int kMaxHeight = 1000;

    ExprP binary(ExprP l, const std::string& op, ExprP r) {
        auto b = make(Expr::binary);
        b->name = op;
        b->kids.push_back(std::move(l));
        b->kids.push_back(std::move(r));
        return grown(std::move(b));
    }
    ExprP or_expr() {
        ExprP e = and_expr();
        while (accept_name("or")) e = binary(std::move(e), "or", and_expr());
        return e;
    }
    ExprP and_expr() {
        ExprP e = not_expr();
        while (accept_name("and")) e = binary(std::move(e), "and", not_expr());
        return e;
    }
    ExprP not_expr() {
        if (accept_name("not")) {
            auto u = make(Expr::unary);
            u->name = "not";
            u->kids.push_back(not_expr());
            return u;
        }
        return compare();
    }
    ExprP compare() {
        ExprP first = math1();
        ExprP c;
        for (;;) {
            std::string op;
            if (t_[p_].kind == Tok::op &&
                (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">=")))
                op = t_[p_++].text;
            else if (is_name("in")) ++p_, op = "in";
            else if (is_name("not") && is_name_at(1, "in")) p_ += 2, op = "not in";
            else break;
            if (!c) {
                c = make(Expr::compare);
                c->kids.push_back(std::move(first));
            }
            c->ops.push_back(op);
            c->kids.push_back(math1());
            c = grown(std::move(c));
        }
        return c ? std::move(c) : std::move(first);
    }
    ExprP math1() {
        ExprP e = concat();
        while (is_op("+") || is_op("-")) {
            const std::string op = t_[p_++].text;
            e = binary(std::move(e), op, concat());
        }
        return e;
    }
    ExprP concat() {
        ExprP e = math2();
        while (accept_op("~")) e = binary(std::move(e), "~", math2());
        return e;
    }
    ExprP math2() {
        ExprP e = power();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const std::string op = t_[p_++].text;
            e = binary(std::move(e), op, power());
        }
        return e;
    }
    ExprP power() {
        ExprP e = unary();
        while (accept_op("**")) e = binary(std::move(e), "**", unary());
        return e;
    }
    // Nesting depth (parentheses, brackets, unary operators, nested calls): bounded so that a
    // hostile template cannot overflow the stack of this recursive parser or of the evaluator.
    struct Depth {
        ExprParser& p;
        explicit Depth(ExprParser& q) : p(q) {
            if (++p.depth_ > kMaxDepth) p.fail("expressions nested deeper than " + std::to_string(kMaxDepth));
        }
        ~Depth() { --p.depth_; }
    };
    static constexpr int kMaxDepth = 200;

    // Jinja's parse_unary: a sign binds tighter than filters and tests, so -x | f is (-x) | f.
    ExprP unary(bool with_filters = true) {
        const Depth guard(*this);
        if (is_op("-") || is_op("+")) {
            auto u = make(Expr::unary);
            u->name = t_[p_++].text;
            u->kids.push_back(unary(false));
            if (with_filters) return filters(grown(std::move(u)));
            return grown(std::move(u));
        }
        ExprP e = postfix(primary());
        if (with_filters) return filters(std::move(e));
        return e;
    }
    ExprP primary() {
        const Tok& t = t_[p_];
        if (t.kind == Tok::str) {
            auto e = make(Expr::literal);
            std::string s;
            while (t_[p_].kind == Tok::str) s += t_[p_++].text;  // adjacent literals join, as in Python
            e->lit = Value::str(s);
            return e;
        }
        if (t.kind == Tok::integer || t.kind == Tok::floating) {
            auto e = make(Expr::literal);
            e->lit = t.kind == Tok::integer ? Value::of(t.i) : Value::of(t.f);
            ++p_;
            return e;
        }
        if (t.kind == Tok::name) {
            ++p_;
            auto e = make(Expr::literal);
            if (t.text == "true" || t.text == "True") e->lit = Value::of(true);
            else if (t.text == "false" || t.text == "False") e->lit = Value::of(false);
            else if (t.text == "none" || t.text == "None") e->lit = Value::null();
            else {
                e->kind = Expr::var;
                e->name = t.text;
            }
            return e;
        }
        if (accept_op("(")) {
            if (accept_op(")")) return make(Expr::tuple);
            ExprP e = expression();
            if (is_op(",")) {
                auto tu = make(Expr::tuple);
                tu->kids.push_back(std::move(e));
                while (accept_op(",")) {
                    if (is_op(")")) break;
                    tu->kids.push_back(expression());
                }
                e = std::move(tu);
            }
            expect_op(")");
            return e;
        }
        if (accept_op("[")) {
            auto l = make(Expr::list);
            while (!is_op("]")) {
                l->kids.push_back(expression());
                if (!accept_op(",")) break;
            }
            expect_op("]");
            return l;
        }
        if (accept_op("{")) {
            auto d = make(Expr::dict);
            while (!is_op("}")) {
                d->kids.push_back(expression());
                expect_op(":");
                d->kids.push_back(expression());
                if (!accept_op(",")) break;
            }
            expect_op("}");
            return d;
        }
        fail("expected a value");
    }
    void call_args(Expr& call) {  // after "("
        while (!is_op(")")) {
            if (t_[p_].kind == Tok::name && p_ + 1 < t_.size() && t_[p_ + 1].kind == Tok::op && t_[p_ + 1].text == "=") {
                std::string k = t_[p_].text;
                p_ += 2;
                call.kw.emplace_back(std::move(k), expression());
            } else {
                if (!call.kw.empty()) fail("a positional argument after a keyword argument");
                call.kids.push_back(expression());
            }
            if (!accept_op(",")) break;
        }
        expect_op(")");
    }
    ExprP postfix(ExprP e) {
        for (;;) {
            if (accept_op(".")) {
                auto a = make(Expr::attr);
                if (t_[p_].kind == Tok::integer) a->name = t_[p_++].text;
                else a->name = expect_name();
                a->kids.push_back(std::move(e));
                e = grown(std::move(a));
            } else if (accept_op("[")) {
                ExprP idx[3];
                bool is_slice = false;
                for (int k = 0; k < 3; ++k) {
                    if (!is_op(":") && !is_op("]")) idx[k] = expression();
                    if (k < 2 && accept_op(":")) is_slice = true;
                    else break;
                }
                expect_op("]");
                auto s = make(is_slice ? Expr::slice : Expr::item);
                s->kids.push_back(std::move(e));
                if (!is_slice && !idx[0]) fail("an empty subscript");
                for (int k = 0; k < (is_slice ? 3 : 1); ++k) s->kids.push_back(std::move(idx[k]));
                e = grown(std::move(s));
            } else if (accept_op("(")) {
                auto c = make(Expr::call);
                c->kids.push_back(std::move(e));
                call_args(*c);
                e = grown(std::move(c));
            } else {
                return e;
            }
        }
    }
    // A filter's name and arguments, applied to e (null: a {% filter %} block's body).
    ExprP filter_call(ExprP e) {
        auto f = make(Expr::filter);
        f->name = expect_name();
        while (accept_op(".")) f->name += "." + expect_name();
        f->kids.push_back(std::move(e));
        if (accept_op("(")) call_args(*f);
        return grown(std::move(f));
    }
    ExprP filters(ExprP e) {
        for (;;) {
            if (accept_op("|")) {
                e = filter_call(std::move(e));
            } else if (is_name("is")) {
                ++p_;
                auto t = make(Expr::test);
                t->negate = accept_name("not");
                t->name = expect_name();
                t->kids.push_back(std::move(e));
                if (accept_op("(")) {
                    call_args(*t);
                } else if (t_[p_].kind == Tok::str || t_[p_].kind == Tok::integer || t_[p_].kind == Tok::floating ||
                           (t_[p_].kind == Tok::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                            !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not"))) {
                    t->kids.push_back(postfix(primary()));  // `is divisibleby 3`, `is sameas none`
                }
                e = grown(std::move(t));
            } else if (accept_op("(")) {
                auto c = make(Expr::call);
                c->kids.push_back(std::move(e));
                call_args(*c);
                e = grown(std::move(c));
            } else {
                return e;
            }
        }
    }

    // Assignment targets: a name, names separated by commas, or ns.attr.
    void targets(Node& n, bool allow_attr) {
        n.targets.push_back(expect_name());
        if (allow_attr && accept_op(".")) {
            n.attr = expect_name();
            return;
        }
        while (accept_op(",")) n.targets.push_back(expect_name());
    }

private:
    std::vector<Tok> t_;
    size_t p_ = 0;
    const std::string& name_;
    int line_;
    int depth_ = 0;
};

class Parser {
public:
    Parser(std::vector<Chunk> chunks, const std::string& name) : c_(std::move(chunks)), name_(name) {}

    Template run() {
        Template t;
        t.name = name_;
        std::string end_kw;
        t.body = body({}, end_kw);
        t.has_generation = has_generation_;
        return t;
    }

private:
    // Parses nodes until a block tag whose first word is in `ends` (returned in end_kw with the
    // tag's parser positioned after the word), or the end of the source.
    Body body(const std::vector<std::string>& ends, std::string& end_kw, std::unique_ptr<ExprParser>* end_tag = nullptr,
              int open_line = 0, const char* open_kw = nullptr) {
        Body out;
        while (i_ < c_.size()) {
            const Chunk& ch = c_[i_++];
            if (ch.kind == 't') {
                Node n;
                n.kind = Node::raw;
                n.line = ch.line;
                n.text = ch.text;
                out.push_back(std::move(n));
                continue;
            }
            auto p = std::make_unique<ExprParser>(tokenize(ch.text, name_, ch.line), name_, ch.line);
            if (ch.kind == 'v') {
                Node n;
                n.kind = Node::output;
                n.line = ch.line;
                if (p->at_end()) p->fail("an empty {{ }}");
                n.expr = p->expression();
                p->expect_end();
                out.push_back(std::move(n));
                continue;
            }
            if (p->at_end()) p->fail("an empty {% %}");
            const std::string kw = p->expect_name();
            for (const std::string& e : ends)
                if (kw == e) {
                    end_kw = kw;
                    if (end_tag) *end_tag = std::move(p);
                    else p->expect_end();
                    return out;
                }
            out.push_back(statement(kw, *p, ch.line));
        }
        if (!ends.empty())
            syntax(name_, open_line, std::string("{% ") + open_kw + " %} is never closed (expected {% " + ends.back() +
                                         " %} before the end of the template)");
        return out;
    }

    Node statement(const std::string& kw, ExprParser& p, int line) {
        if (++nesting_ > kMaxNesting) syntax(name_, line, "blocks nested deeper than " + std::to_string(kMaxNesting));
        struct Leave {
            int& n;
            ~Leave() { --n; }
        } leave{nesting_};
        Node n;
        n.line = line;
        std::string end_kw;
        std::unique_ptr<ExprParser> tag;
        if (kw == "if") {
            n.kind = Node::if_;
            ExprP cond = p.expression();
            p.expect_end();
            for (;;) {
                Body b = body({"elif", "else", "endif"}, end_kw, &tag, line, "if");
                n.branches.emplace_back(std::move(cond), std::move(b));
                if (end_kw == "elif") {
                    cond = tag->expression();
                    tag->expect_end();
                } else if (end_kw == "else") {
                    tag->expect_end();
                    Body e = body({"endif"}, end_kw, nullptr, line, "if");
                    n.branches.emplace_back(nullptr, std::move(e));
                    break;
                } else {
                    tag->expect_end();
                    break;
                }
            }
        } else if (kw == "for") {
            n.kind = Node::for_;
            p.targets(n, false);
            if (!p.accept_name("in")) p.fail("expected 'in'");
            n.expr = p.expression(false);
            if (p.accept_name("if")) n.cond = p.expression(false);
            if (p.accept_name("recursive")) p.fail("recursive loops are not supported");
            p.expect_end();
            n.body = body({"else", "endfor"}, end_kw, &tag, line, "for");
            tag->expect_end();
            if (end_kw == "else") n.else_body = body({"endfor"}, end_kw, nullptr, line, "for");
        } else if (kw == "set") {
            p.targets(n, true);
            if (p.accept_op("=")) {
                n.kind = Node::set;
                n.expr = p.expression();
                if (p.is_op(",")) {  // set a = 1, 2: a tuple
                    auto t = p.make(Expr::tuple);
                    t->kids.push_back(std::move(n.expr));
                    while (p.accept_op(",")) t->kids.push_back(p.expression());
                    n.expr = std::move(t);
                }
                p.expect_end();
            } else {
                n.kind = Node::set_block;
                if (!n.attr.empty() || n.targets.size() != 1) p.fail("a block set takes one name");
                if (p.accept_op("|")) n.expr = p.filter_call(nullptr);
                p.expect_end();
                n.body = body({"endset"}, end_kw, nullptr, line, "set");
            }
        } else if (kw == "macro") {
            n.kind = Node::macro;
            n.targets.push_back(p.expect_name());
            p.expect_op("(");
            while (!p.is_op(")")) {
                std::string param = p.expect_name();
                ExprP def;
                if (p.accept_op("=")) def = p.expression();
                n.params.emplace_back(std::move(param), std::move(def));
                if (!p.accept_op(",")) break;
            }
            p.expect_op(")");
            p.expect_end();
            n.body = body({"endmacro"}, end_kw, nullptr, line, "macro");
        } else if (kw == "generation") {
            n.kind = Node::generation;
            p.expect_end();
            has_generation_ = true;
            n.body = body({"endgeneration"}, end_kw, nullptr, line, "generation");
        } else if (kw == "filter") {
            n.kind = Node::filter_block;
            n.expr = p.filter_call(nullptr);
            while (p.accept_op("|")) n.expr = p.filter_call(std::move(n.expr));
            p.expect_end();
            n.body = body({"endfilter"}, end_kw, nullptr, line, "filter");
        } else if (kw == "break" || kw == "continue") {
            n.kind = kw == "break" ? Node::break_ : Node::continue_;
            p.expect_end();
        } else if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0) {
            syntax(name_, line, "{% " + kw + " %} without the block it closes");
        } else {
            syntax(name_, line, "unknown tag '" + kw + "' (not in polevault's Jinja subset)");
        }
        return n;
    }

    std::vector<Chunk> c_;
    size_t i_ = 0;
    const std::string& name_;
    bool has_generation_ = false;
    int nesting_ = 0;  // block statements open around the one being parsed
    static constexpr int kMaxNesting = 200;
};

}  // namespace

Template parse(std::string_view source, const std::string& name) {
    // Jinja writes every line ending of the template ("\r\n", "\r") as its newline_sequence "\n"
    // (in text and string literals alike; inside tags both are whitespace).
    std::string text;
    text.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
        if (source[i] != '\r') text += source[i];
        else if (i + 1 < source.size() && source[i + 1] == '\n') continue;  // the "\n" follows
        else text += '\n';
    }
    // keep_trailing_newline=False (transformers keeps the default): one newline at the very end of
    // the source is not part of the template.
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return Parser(scan(text, name), name).run();
}

}  // namespace pv::jinja
