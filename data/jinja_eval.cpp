// The Jinja subset's evaluator (data/jinja.h): Python's value semantics as Jinja exposes them,
// the filters, tests, methods and globals chat templates use, and the provenance marks
// (template text or data) carried through string operations.
#include "data/jinja.h"
#include "data/chat.h"
#include "data/jinja_ast.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <set>
#include <unordered_map>

namespace pv {
namespace jinja {
namespace {

// ---- errors --------------------------------------------------------------------------------

struct Error {
    int line;
    std::string what;
};
[[noreturn]] void fail(int line, const std::string& what) { throw Error{line, what}; }

// Control flow out of a loop body.
struct BreakLoop {};
struct ContinueLoop {};

// ---- strings with provenance ----------------------------------------------------------------

// A string being built, with its mask.
struct MStr {
    std::string s, m;  // m: empty = all template text
    void add(const std::string& t, const std::string& tm) {
        if (tm.empty() && m.empty()) {
            s += t;
            return;
        }
        if (m.empty()) m.assign(s.size(), '\0');
        s += t;
        if (tm.empty()) m.append(t.size(), '\0');
        else m += tm;
    }
    void add(const Value& v) { add(v.s, v.mask); }
    void add_text(const std::string& t) { add(t, {}); }
    Value value() && { return Value::str(std::move(s), std::move(m)); }
};

bool any_data(const std::string& mask) { return mask.find('\1') != std::string::npos; }
std::string sub_mask(const std::string& m, size_t pos, size_t n) { return m.empty() ? m : m.substr(pos, n); }
// A string wholly data when `data`, else wholly template text.
Value str_marked(std::string s, bool data) {
    std::string m = data ? std::string(s.size(), '\1') : std::string();
    return Value::str(std::move(s), std::move(m));
}

// Code point starts of a UTF-8 string (Python indexes strings by code point), plus its size.
std::vector<size_t> cp_starts(const std::string& s) {
    std::vector<size_t> out;
    for (size_t i = 0; i < s.size(); ++i)
        if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
    out.push_back(s.size());
    return out;
}

// ---- Python's str() and repr() ----------------------------------------------------------------

// A (key, value) tuple, as dict.items() gives.
Value pair(Value a, Value b) {
    Value v = Value::of_list({std::move(a), std::move(b)});
    v.is_tuple = true;
    return v;
}

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, r.ptr);  // d.ddddde[+-]XX, the shortest round-trip digits
    const size_t e = sci.find('e');
    const int exp = std::atoi(sci.c_str() + e + 1);
    std::string mant = sci.substr(0, e);
    const bool neg = mant[0] == '-';
    if (neg) mant.erase(0, 1);
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    std::string out;
    if (exp < -4 || exp >= 16) {  // Python's repr switches to exponent form here
        out = digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        out += eb;
    } else if (exp < 0) {
        out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else {
        if (digits.size() <= size_t(exp) + 1) out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
        else out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return neg ? "-" + out : out;
}

std::string py_repr(const Value& v);

std::string str_repr(const std::string& s) {
    const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string o(1, q);
    for (unsigned char c : s) {
        if (c == '\\') o += "\\\\";
        else if (c == static_cast<unsigned char>(q)) o += '\\', o += char(c);
        else if (c == '\n') o += "\\n";
        else if (c == '\r') o += "\\r";
        else if (c == '\t') o += "\\t";
        else if (c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            o += b;
        } else o += char(c);
    }
    return o + q;
}

// str(v) and its mask.
Value to_str(const Value& v) {
    switch (v.kind) {
        case Value::undefined: return Value::str("");
        case Value::none: return Value::str("None");
        case Value::boolean: return Value::str(v.b ? "True" : "False");
        case Value::integer: return Value::str(std::to_string(v.i));
        case Value::floating: return Value::str(float_repr(v.f));
        case Value::string: return v;
        default: {
            const std::string r = py_repr(v);
            bool data = false;
            std::function<void(const Value&)> scan = [&](const Value& x) {
                if (x.kind == Value::string) data = data || any_data(x.mask);
                if (x.kind == Value::list)
                    for (const Value& y : *x.items) scan(y);
                if (x.kind == Value::dict)
                    for (const auto& kv : *x.map) scan(kv.second);
            };
            scan(v);
            return str_marked(r, data);
        }
    }
}

std::string py_repr(const Value& v) {
    switch (v.kind) {
        case Value::string: return str_repr(v.s);
        case Value::list: {
            std::string o = v.is_tuple ? "(" : "[";
            for (size_t k = 0; k < v.items->size(); ++k) o += (k ? ", " : "") + py_repr((*v.items)[k]);
            if (v.is_tuple) return o + (v.items->size() == 1 ? ",)" : ")");
            return o + "]";
        }
        case Value::dict: {
            if (v.is_namespace) return "<Namespace>";
            std::string o = "{";
            for (size_t k = 0; k < v.map->size(); ++k)
                o += (k ? ", " : "") + str_repr((*v.map)[k].first) + ": " + py_repr((*v.map)[k].second);
            return o + "}";
        }
        case Value::function: return "<function>";
        default: return to_str(v).s;
    }
}

const char* type_name(const Value& v) {
    switch (v.kind) {
        case Value::undefined: return "undefined";
        case Value::none: return "NoneType";
        case Value::boolean: return "bool";
        case Value::integer: return "int";
        case Value::floating: return "float";
        case Value::string: return "str";
        case Value::list: return "list";
        case Value::dict: return v.is_namespace ? "Namespace" : "dict";
        case Value::function: return "function";
    }
    return "?";
}

bool truthy(const Value& v) {
    switch (v.kind) {
        case Value::undefined:
        case Value::none: return false;
        case Value::boolean: return v.b;
        case Value::integer: return v.i != 0;
        case Value::floating: return v.f != 0;
        case Value::string: return !v.s.empty();
        case Value::list: return !v.items->empty();
        case Value::dict: return v.is_namespace || !v.map->empty();
        case Value::function: return true;
    }
    return false;
}

bool is_number(const Value& v) {
    return v.kind == Value::integer || v.kind == Value::floating || v.kind == Value::boolean;
}
double num(const Value& v) {
    return v.kind == Value::floating ? v.f : v.kind == Value::boolean ? double(v.b) : double(v.i);
}
int64_t as_int(const Value& v) { return v.kind == Value::boolean ? int64_t(v.b) : v.i; }

bool equal(const Value& a, const Value& b) {
    if (is_number(a) && is_number(b)) {
        if (a.kind == Value::floating || b.kind == Value::floating) return num(a) == num(b);
        return as_int(a) == as_int(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
        case Value::undefined:
        case Value::none: return true;
        case Value::string: return a.s == b.s;
        case Value::list:
            if (a.items->size() != b.items->size()) return false;
            for (size_t k = 0; k < a.items->size(); ++k)
                if (!equal((*a.items)[k], (*b.items)[k])) return false;
            return true;
        case Value::dict:
            if (a.map == b.map) return true;
            if (a.map->size() != b.map->size()) return false;
            for (const auto& kv : *a.map) {
                bool found = false;
                for (const auto& kw : *b.map)
                    if (kw.first == kv.first) found = equal(kv.second, kw.second);
                if (!found) return false;
            }
            return true;
        case Value::function: return a.fn == b.fn;
        default: return false;
    }
}

// Python's <: numbers, strings, lists.
bool less(const Value& a, const Value& b, int line) {
    if (is_number(a) && is_number(b)) {
        if (a.kind == Value::floating || b.kind == Value::floating) return num(a) < num(b);
        return as_int(a) < as_int(b);
    }
    if (a.kind == Value::string && b.kind == Value::string) return a.s < b.s;
    if (a.kind == Value::list && b.kind == Value::list) {
        for (size_t k = 0; k < a.items->size() && k < b.items->size(); ++k) {
            if (less((*a.items)[k], (*b.items)[k], line)) return true;
            if (less((*b.items)[k], (*a.items)[k], line)) return false;
        }
        return a.items->size() < b.items->size();
    }
    fail(line, std::string("'<' is not supported between ") + type_name(a) + " and " + type_name(b));
}

// ---- JSON (transformers' tojson: json.dumps(x, ensure_ascii=False, indent, separators, sort_keys))

void json_string(std::string& o, const std::string& s) {
    o += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\r': o += "\\r"; break;
            case '\t': o += "\\t"; break;
            case '\b': o += "\\b"; break;
            case '\f': o += "\\f"; break;
            default:
                if (c < 0x20) {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\u%04x", c);
                    o += b;
                } else {
                    o += char(c);
                }
        }
    }
    o += '"';
}

struct JsonStyle {
    int indent = -1;  // -1: None
    std::string item_sep = ", ", key_sep = ": ";
    bool sort_keys = false;
};

void to_json(std::string& o, const Value& v, const JsonStyle& st, int depth, int line) {
    const auto newline = [&](int d) {
        if (st.indent >= 0) o += "\n" + std::string(size_t(st.indent * d), ' ');
    };
    switch (v.kind) {
        case Value::none: o += "null"; return;
        case Value::boolean: o += v.b ? "true" : "false"; return;
        case Value::integer: o += std::to_string(v.i); return;
        case Value::floating:
            o += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : float_repr(v.f);
            return;
        case Value::string: json_string(o, v.s); return;
        case Value::list: {
            if (v.items->empty()) {
                o += "[]";
                return;
            }
            o += '[';
            for (size_t k = 0; k < v.items->size(); ++k) {
                if (k) o += st.item_sep;
                newline(depth + 1);
                to_json(o, (*v.items)[k], st, depth + 1, line);
            }
            newline(depth);
            o += ']';
            return;
        }
        case Value::dict: {
            if (v.map->empty()) {
                o += "{}";
                return;
            }
            std::vector<const std::pair<std::string, Value>*> kv;
            for (const auto& e : *v.map) kv.push_back(&e);
            if (st.sort_keys)
                std::stable_sort(kv.begin(), kv.end(), [](auto* a, auto* b) { return a->first < b->first; });
            o += '{';
            for (size_t k = 0; k < kv.size(); ++k) {
                if (k) o += st.item_sep;
                newline(depth + 1);
                json_string(o, kv[k]->first);
                o += st.key_sep;
                to_json(o, kv[k]->second, st, depth + 1, line);
            }
            newline(depth);
            o += '}';
            return;
        }
        default: fail(line, std::string("Object of type ") + type_name(v) + " is not JSON serializable");
    }
}

bool has_data(const Value& v) {
    if (v.kind == Value::string) return any_data(v.mask);
    if (v.kind == Value::list)
        return std::any_of(v.items->begin(), v.items->end(), [](const Value& x) { return has_data(x); });
    if (v.kind == Value::dict)
        return std::any_of(v.map->begin(), v.map->end(), [](const auto& kv) { return has_data(kv.second); });
    return false;
}

// ---- strings -------------------------------------------------------------------------------

bool py_space_ascii(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// strip/lstrip/rstrip with Python's semantics (which: 1 left, 2 right, 3 both): without chars,
// Unicode whitespace as str.isspace() sees it (pv::python_strip); with chars, those characters.
Value strip(const Value& v, int which, const Value* chars) {
    const std::string& s = v.s;
    size_t b = 0, e = s.size();
    if (chars && chars->kind == Value::string) {
        const std::vector<size_t> cs = cp_starts(chars->s);
        std::set<std::string> set;
        for (size_t k = 0; k + 1 < cs.size(); ++k) set.insert(chars->s.substr(cs[k], cs[k + 1] - cs[k]));
        const std::vector<size_t> st = cp_starts(s);
        size_t lo = 0, hi = st.size() - 1;
        if (which & 1)
            while (lo < hi && set.count(s.substr(st[lo], st[lo + 1] - st[lo]))) ++lo;
        if (which & 2)
            while (hi > lo && set.count(s.substr(st[hi - 1], st[hi] - st[hi - 1]))) --hi;
        b = st[lo], e = st[hi];
    } else {
        const std::string_view r = python_strip(s, which & 1, which & 2);
        b = size_t(r.data() - s.data()), e = b + r.size();
    }
    return Value::str(s.substr(b, e - b), sub_mask(v.mask, b, e - b));
}

// Maps ASCII letters; keeps the mask (lengths do not change).
// 0 lower, 1 upper, 2 str.title(), 3 capitalize, 4 Jinja's title filter.
Value map_case(const Value& v, int mode) {
    std::string s = v.s;
    bool word_start = true;
    for (size_t k = 0; k < s.size(); ++k) {
        const unsigned char c = static_cast<unsigned char>(s[k]);
        const bool alpha = std::isalpha(c) != 0 || c >= 0x80;
        if (mode == 0) s[k] = char(std::tolower(c));
        else if (mode == 1) s[k] = char(std::toupper(c));
        else if (mode == 2) {
            s[k] = char(word_start ? std::toupper(c) : std::tolower(c));
            word_start = !alpha && !(c >= '0' && c <= '9') ? true : false;
            if (alpha || (c >= '0' && c <= '9')) word_start = false;
        } else if (mode == 3) {
            s[k] = char(k == 0 ? std::toupper(c) : std::tolower(c));
        } else {  // Jinja's title filter: words begin after runs of whitespace, '-', '(', '{', '[', '<'
            s[k] = char(word_start ? std::toupper(c) : std::tolower(c));
            word_start = std::isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        }
    }
    return Value::str(std::move(s), v.mask);
}

Value replace(const Value& v, const Value& old, const Value& repl, int64_t count) {
    MStr o;
    size_t i = 0;
    int64_t done = 0;
    if (old.s.empty()) {  // Python inserts the replacement between characters
        const std::vector<size_t> st = cp_starts(v.s);
        for (size_t k = 0; k + 1 < st.size() + 1; ++k) {
            if (count < 0 || done < count) o.add(repl), ++done;
            if (k + 1 < st.size()) o.add(v.s.substr(st[k], st[k + 1] - st[k]), sub_mask(v.mask, st[k], st[k + 1] - st[k]));
        }
        return std::move(o).value();
    }
    for (;;) {
        const size_t at = (count >= 0 && done >= count) ? std::string::npos : v.s.find(old.s, i);
        if (at == std::string::npos) {
            o.add(v.s.substr(i), sub_mask(v.mask, i, std::string::npos));
            break;
        }
        o.add(v.s.substr(i, at - i), sub_mask(v.mask, i, at - i));
        const bool replaced_data = any_data(sub_mask(v.mask, at, old.s.size()));
        if (replaced_data) o.add(repl.s, std::string(repl.s.size(), '\1'));
        else o.add(repl);
        i = at + old.s.size();
        ++done;
    }
    return std::move(o).value();
}

Value split(const Value& v, const Value* sep, int64_t maxsplit, bool from_right) {
    List parts;
    const std::string& s = v.s;
    const auto piece = [&](size_t b, size_t e) { parts.push_back(Value::str(s.substr(b, e - b), sub_mask(v.mask, b, e - b))); };
    if (sep && sep->kind == Value::string) {
        if (sep->s.empty()) throw std::invalid_argument("empty separator");
        std::vector<std::pair<size_t, size_t>> spans;
        if (!from_right) {
            size_t i = 0;
            int64_t n = 0;
            for (;;) {
                const size_t at = (maxsplit >= 0 && n >= maxsplit) ? std::string::npos : s.find(sep->s, i);
                if (at == std::string::npos) {
                    spans.emplace_back(i, s.size());
                    break;
                }
                spans.emplace_back(i, at);
                i = at + sep->s.size();
                ++n;
            }
        } else {
            size_t e = s.size();
            int64_t n = 0;
            for (;;) {
                const size_t at = (maxsplit >= 0 && n >= maxsplit) || e < sep->s.size()
                                      ? std::string::npos
                                      : s.rfind(sep->s, e - sep->s.size());
                if (at == std::string::npos) {
                    spans.emplace_back(0, e);
                    break;
                }
                spans.emplace_back(at + sep->s.size(), e);
                e = at;
                ++n;
            }
            std::reverse(spans.begin(), spans.end());
        }
        for (auto& sp : spans) piece(sp.first, sp.second);
    } else {  // runs of whitespace; no empty strings
        size_t i = 0;
        int64_t n = 0;
        while (i < s.size()) {
            while (i < s.size() && py_space_ascii(s[i])) ++i;
            if (i >= s.size()) break;
            if (maxsplit >= 0 && n >= maxsplit && !from_right) {
                size_t e = s.size();
                while (e > i && py_space_ascii(s[e - 1])) --e;
                piece(i, e);
                break;
            }
            size_t j = i;
            while (j < s.size() && !py_space_ascii(s[j])) ++j;
            piece(i, j);
            ++n;
            i = j;
        }
    }
    return Value::of_list(std::move(parts));
}

// ---- the evaluator -------------------------------------------------------------------------

class Renderer;
using Scope = std::unordered_map<std::string, Value>;

struct Out {
    std::string text, data;
    std::vector<std::pair<size_t, size_t>> generation;
    void add(const Value& v) {
        text += v.s;
        if (v.mask.empty()) data.append(v.s.size(), '\0');
        else data += v.mask;
    }
};

class Renderer {
public:
    Renderer(const Template& t, Scope globals) : t_(t) { scopes_.push_back(std::move(globals)); }

    void run(Out& out) { body(t_.body, out); }

    Value lookup(const std::string& name) const {
        for (size_t k = scopes_.size(); k-- > 0;) {
            const auto it = scopes_[k].find(name);
            if (it != scopes_[k].end()) return it->second;
        }
        return Value::undef(name);
    }

    void body(const Body& b, Out& out) {
        for (const Node& n : b) node(n, out);
    }

    void node(const Node& n, Out& out) {
        if (++steps_ > kMaxSteps)
            fail(n.line, "the template ran " + std::to_string(kMaxSteps) + " steps without finishing (a loop "
                         "that does not end?)");
        if (out.text.size() > kMaxBytes) fail(n.line, "the rendering passed " + std::to_string(kMaxBytes) + " bytes");
        switch (n.kind) {
            case Node::raw: out.add(Value::str(n.text)); return;
            case Node::output: {
                const Value v = eval(*n.expr);
                out.add(to_str(v));
                return;
            }
            case Node::if_:
                for (const auto& br : n.branches)
                    if (!br.first || truthy(eval(*br.first))) {
                        body(br.second, out);
                        return;
                    }
                return;
            case Node::for_: return for_loop(n, out);
            case Node::set: {
                Value v = eval(*n.expr);
                if (!n.attr.empty()) {
                    Value ns = lookup(n.targets[0]);
                    if (ns.kind != Value::dict || !ns.is_namespace)
                        fail(n.line, "cannot assign attribute '" + n.attr + "' on " + type_name(ns) + " '" +
                                         n.targets[0] + "' (only on a namespace())");
                    set_key(*ns.map, n.attr, std::move(v));
                    return;
                }
                assign(n.targets, std::move(v), n.line);
                return;
            }
            case Node::set_block: {
                Out inner;
                body(n.body, inner);
                Value v = Value::str(inner.text, any_data(inner.data) ? inner.data : std::string());
                if (n.expr) v = apply_filter_chain(*n.expr, v);
                scopes_.back()[n.targets[0]] = std::move(v);
                return;
            }
            case Node::filter_block: {
                Out inner;
                body(n.body, inner);
                out.add(to_str(apply_filter_chain(*n.expr, Value::str(inner.text, any_data(inner.data) ? inner.data : ""))));
                return;
            }
            case Node::macro: scopes_.back()[n.targets[0]] = make_macro(n); return;
            case Node::generation: {
                const size_t begin = out.text.size();
                body(n.body, out);
                out.generation.emplace_back(begin, out.text.size());
                return;
            }
            case Node::break_:
                if (loop_depth_ == 0) fail(n.line, "{% break %} outside a loop");
                throw BreakLoop{};
            case Node::continue_:
                if (loop_depth_ == 0) fail(n.line, "{% continue %} outside a loop");
                throw ContinueLoop{};
        }
    }

    static void set_key(Dict& d, const std::string& k, Value v) {
        for (auto& kv : d)
            if (kv.first == k) {
                kv.second = std::move(v);
                return;
            }
        d.emplace_back(k, std::move(v));
    }

    void assign(const std::vector<std::string>& names, Value v, int line) {
        if (names.size() == 1) {
            scopes_.back()[names[0]] = std::move(v);
            return;
        }
        const List items = iterate(v, line);
        if (items.size() != names.size())
            fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                           std::to_string(names.size()) + " names");
        for (size_t k = 0; k < names.size(); ++k) scopes_.back()[names[k]] = items[k];
    }

    List iterate(const Value& v, int line) {
        switch (v.kind) {
            case Value::undefined: return {};
            case Value::list: return *v.items;
            case Value::dict: {
                List keys;
                for (const auto& kv : *v.map) keys.push_back(Value::str(kv.first));
                return keys;
            }
            case Value::string: {
                List chars;
                const std::vector<size_t> st = cp_starts(v.s);
                for (size_t k = 0; k + 1 < st.size(); ++k)
                    chars.push_back(Value::str(v.s.substr(st[k], st[k + 1] - st[k]), sub_mask(v.mask, st[k], st[k + 1] - st[k])));
                return chars;
            }
            default: fail(line, std::string("'") + type_name(v) + "' object is not iterable");
        }
    }

    void for_loop(const Node& n, Out& out) {
        List items = iterate(eval(*n.expr), n.line);
        if (n.cond) {  // the filter sees the loop variable, not `loop`
            List kept;
            for (const Value& x : items) {
                scopes_.emplace_back();
                assign(n.targets, x, n.line);
                const bool keep = truthy(eval(*n.cond));
                scopes_.pop_back();
                if (keep) kept.push_back(x);
            }
            items = std::move(kept);
        }
        if (items.empty()) {
            body(n.else_body, out);
            return;
        }
        const Value outer_loop = lookup("loop");
        ++loop_depth_;
        const int64_t len = int64_t(items.size());
        for (int64_t k = 0; k < len; ++k) {
            if (++steps_ > kMaxSteps)
                fail(n.line, "the template ran " + std::to_string(kMaxSteps) + " steps without finishing (a loop "
                             "that does not end?)");
            scopes_.emplace_back();
            assign(n.targets, items[size_t(k)], n.line);
            Dict loop = {{"index0", Value::of(k)},
                         {"index", Value::of(k + 1)},
                         {"revindex0", Value::of(len - k - 1)},
                         {"revindex", Value::of(len - k)},
                         {"first", Value::of(k == 0)},
                         {"last", Value::of(k == len - 1)},
                         {"length", Value::of(len)},
                         {"depth", Value::of(int64_t(1))},
                         {"depth0", Value::of(int64_t(0))},
                         {"previtem", k > 0 ? items[size_t(k - 1)] : Value::undef("loop.previtem")},
                         {"nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undef("loop.nextitem")}};
            Value lv = Value::of_dict(std::move(loop));
            const int64_t idx = k;
            lv.map->emplace_back("cycle", Value::of_fn([idx](Args& a) {
                                     if (a.pos.empty()) fail(a.line, "loop.cycle() needs arguments");
                                     return a.pos[size_t(idx) % a.pos.size()];
                                 }));
            scopes_.back()["loop"] = lv;
            bool stop = false;
            try {
                body(n.body, out);
            } catch (const BreakLoop&) {
                stop = true;
            } catch (const ContinueLoop&) {
            }
            scopes_.pop_back();
            if (stop) break;
        }
        --loop_depth_;
        (void)outer_loop;
    }

    Value make_macro(const Node& n) {
        const Node* def = &n;
        return Value::of_fn([this, def](Args& a) {
            Scope s;
            size_t k = 0;
            for (; k < def->params.size(); ++k) {
                const std::string& p = def->params[k].first;
                Value v;
                bool given = false;
                if (k < a.pos.size()) v = a.pos[k], given = true;
                for (auto& kw : a.kw)
                    if (kw.first == p) v = kw.second, given = true;
                if (!given) v = def->params[k].second ? eval(*def->params[k].second) : Value::undef(p);
                s[p] = std::move(v);
            }
            if (a.pos.size() > def->params.size())
                fail(a.line, "macro '" + def->targets[0] + "' takes " + std::to_string(def->params.size()) +
                                 " arguments, " + std::to_string(a.pos.size()) + " given");
            s["varargs"] = Value::of_list(List(a.pos.begin() + long(std::min(a.pos.size(), def->params.size())), a.pos.end()));
            if (macro_depth_ >= kMaxMacroDepth)
                fail(a.line, "macro '" + def->targets[0] + "' called " + std::to_string(kMaxMacroDepth) +
                                 " levels deep (endless recursion?)");
            ++macro_depth_;
            struct Leave {
                int& n;
                ~Leave() { --n; }
            } leave{macro_depth_};
            // A macro sees the template's top-level names and its arguments, not its caller's locals.
            std::vector<Scope> saved;
            saved.swap(scopes_);
            scopes_.push_back(saved.front());
            scopes_.push_back(std::move(s));
            const int depth = loop_depth_;
            loop_depth_ = 0;
            Out inner;
            try {
                body(def->body, inner);
            } catch (...) {
                scopes_.swap(saved);
                loop_depth_ = depth;
                throw;
            }
            scopes_.swap(saved);
            loop_depth_ = depth;
            return Value::str(inner.text, any_data(inner.data) ? inner.data : std::string());
        });
    }

    // ---- expressions ----

    Value eval(const Expr& e) {
        switch (e.kind) {
            case Expr::literal: return e.lit;
            case Expr::var: return lookup(e.name);
            case Expr::list:
            case Expr::tuple: {
                List l;
                for (const auto& k : e.kids) l.push_back(eval(*k));
                Value v = Value::of_list(std::move(l));
                v.is_tuple = e.kind == Expr::tuple;
                return v;
            }
            case Expr::dict: {
                Dict d;
                for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
                    const Value key = eval(*e.kids[k]);
                    if (key.kind != Value::string) fail(e.line, "dict keys must be strings here");
                    set_key(d, key.s, eval(*e.kids[k + 1]));
                }
                return Value::of_dict(std::move(d));
            }
            case Expr::attr: return get_attr(eval(*e.kids[0]), e.name, e.line, e.kids[0].get());
            case Expr::item: return get_item(eval(*e.kids[0]), eval(*e.kids[1]), e.line, e.kids[0].get());
            case Expr::slice: return slice(e);
            case Expr::call: return call(e);
            case Expr::filter: return apply_filter(e, eval(*e.kids[0]));
            case Expr::test: return Value::of(test(e) != e.negate);
            case Expr::unary: {
                const Value v = eval(*e.kids[0]);
                if (e.name == "not") return Value::of(!truthy(v));
                if (!is_number(v)) fail(e.line, "bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
                if (e.name == "+") return v.kind == Value::boolean ? Value::of(as_int(v)) : v;
                return v.kind == Value::floating ? Value::of(-v.f) : Value::of(-as_int(v));
            }
            case Expr::binary: return binary(e);
            case Expr::compare: {
                Value l = eval(*e.kids[0]);
                for (size_t k = 0; k < e.ops.size(); ++k) {
                    Value r = eval(*e.kids[k + 1]);
                    if (!compare(e.ops[k], l, r, e.line)) return Value::of(false);
                    l = std::move(r);
                }
                return Value::of(true);
            }
            case Expr::cond:
                if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
                return e.kids[2] ? eval(*e.kids[2]) : Value::undef();
        }
        fail(e.line, "unknown expression");
    }

    static std::string describe(const Expr* e) {
        if (!e) return "a value";
        if (e->kind == Expr::var) return "'" + e->name + "'";
        if (e->kind == Expr::attr) return describe(e->kids[0].get()) + "." + e->name;
        return "a value";
    }

    [[noreturn]] static void undefined_error(const Value& v, const std::string& what, int line, const Expr* of) {
        const std::string name = !v.undefined_name.empty() ? "'" + v.undefined_name + "'" : describe(of);
        fail(line, name + " is undefined" + what);
    }

    Value get_attr(const Value& v, const std::string& name, int line, const Expr* of) {
        if (v.kind == Value::undefined) undefined_error(v, " (reading its attribute '" + name + "')", line, of);
        if (v.kind == Value::dict) {
            static const std::set<std::string> methods = {"items", "keys", "values", "get"};
            if (!v.is_namespace && methods.count(name)) return bound_method(v, name, line);
            for (const auto& kv : *v.map)
                if (kv.first == name) return kv.second;
            return Value::undef(describe(of) == "a value" ? name : describe(of).substr(1, describe(of).size() - 2) + "." + name);
        }
        if (v.kind == Value::string || v.kind == Value::list) return bound_method(v, name, line);
        return Value::undef(name);
    }

    Value get_item(const Value& v, const Value& key, int line, const Expr* of) {
        if (v.kind == Value::undefined) undefined_error(v, " (reading its item " + py_repr(key) + ")", line, of);
        if (v.kind == Value::dict) {
            if (key.kind == Value::string)
                for (const auto& kv : *v.map)
                    if (kv.first == key.s) return kv.second;
            return Value::undef(key.kind == Value::string ? key.s : py_repr(key));
        }
        if ((v.kind == Value::list || v.kind == Value::string) && (key.kind == Value::integer || key.kind == Value::boolean)) {
            if (v.kind == Value::list) {
                int64_t k = as_int(key), n = int64_t(v.items->size());
                if (k < 0) k += n;
                if (k < 0 || k >= n) return Value::undef(describe(of) + "[" + std::to_string(as_int(key)) + "]");
                return (*v.items)[size_t(k)];
            }
            const std::vector<size_t> st = cp_starts(v.s);
            int64_t k = as_int(key), n = int64_t(st.size()) - 1;
            if (k < 0) k += n;
            if (k < 0 || k >= n) return Value::undef("string index");
            return Value::str(v.s.substr(st[size_t(k)], st[size_t(k) + 1] - st[size_t(k)]),
                              sub_mask(v.mask, st[size_t(k)], st[size_t(k) + 1] - st[size_t(k)]));
        }
        if (key.kind == Value::string) return get_attr(v, key.s, line, of);
        return Value::undef();
    }

    Value slice(const Expr& e) {
        const Value v = eval(*e.kids[0]);
        int64_t idx[3] = {0, 0, 1};
        bool given[3] = {false, false, false};
        for (int k = 0; k < 3; ++k)
            if (e.kids[size_t(k) + 1]) {
                const Value x = eval(*e.kids[size_t(k) + 1]);
                if (x.kind == Value::none) continue;
                if (x.kind != Value::integer && x.kind != Value::boolean)
                    fail(e.line, "slice indices must be integers or None");
                idx[k] = as_int(x), given[k] = true;
            }
        const int64_t step = given[2] ? idx[2] : 1;
        if (step == 0) fail(e.line, "slice step cannot be zero");
        std::vector<size_t> st;
        int64_t n;
        if (v.kind == Value::list) n = int64_t(v.items->size());
        else if (v.kind == Value::string) st = cp_starts(v.s), n = int64_t(st.size()) - 1;
        else if (v.kind == Value::undefined) undefined_error(v, " (slicing it)", e.line, e.kids[0].get());
        else return Value::undef("a slice of " + std::string(type_name(v)));  // Jinja's getitem: undefined
        // Python's slice.indices()
        const auto clamp = [&](int64_t x, bool has, int64_t def) {
            if (!has) return def;
            if (x < 0) x += n;
            if (step > 0) return std::clamp<int64_t>(x, 0, n);
            return std::clamp<int64_t>(x, -1, n - 1);
        };
        const int64_t start = clamp(idx[0], given[0], step > 0 ? 0 : n - 1);
        const int64_t stop = clamp(idx[1], given[1], step > 0 ? n : -1);
        std::vector<int64_t> picks;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) picks.push_back(k);
        if (v.kind == Value::list) {
            List l;
            for (int64_t k : picks) l.push_back((*v.items)[size_t(k)]);
            Value out = Value::of_list(std::move(l));
            out.is_tuple = v.is_tuple;
            return out;
        }
        MStr o;
        for (int64_t k : picks)
            o.add(v.s.substr(st[size_t(k)], st[size_t(k) + 1] - st[size_t(k)]),
                  sub_mask(v.mask, st[size_t(k)], st[size_t(k) + 1] - st[size_t(k)]));
        return std::move(o).value();
    }

    Args args_of(const Expr& e, size_t first) {
        Args a;
        a.line = e.line;
        for (size_t k = first; k < e.kids.size(); ++k) a.pos.push_back(eval(*e.kids[k]));
        for (const auto& kw : e.kw) a.kw.emplace_back(kw.first, eval(*kw.second));
        return a;
    }

    Value call(const Expr& e) {
        const Value f = eval(*e.kids[0]);
        if (f.kind == Value::undefined) undefined_error(f, " (calling it)", e.line, e.kids[0].get());
        if (f.kind != Value::function) fail(e.line, std::string("'") + type_name(f) + "' object is not callable");
        Args a = args_of(e, 1);
        return (*f.fn)(a);
    }

    Value binary(const Expr& e) {
        if (e.name == "and") {
            Value l = eval(*e.kids[0]);
            return truthy(l) ? eval(*e.kids[1]) : l;
        }
        if (e.name == "or") {
            Value l = eval(*e.kids[0]);
            return truthy(l) ? l : eval(*e.kids[1]);
        }
        const Value l = eval(*e.kids[0]), r = eval(*e.kids[1]);
        if (e.name == "~") {
            MStr o;
            o.add(to_str(l));
            o.add(to_str(r));
            return std::move(o).value();
        }
        if (l.kind == Value::undefined || r.kind == Value::undefined)
            undefined_error(l.kind == Value::undefined ? l : r, " (used with '" + e.name + "')", e.line,
                            e.kids[l.kind == Value::undefined ? 0 : 1].get());
        const std::string& op = e.name;
        if (op == "+") {
            if (l.kind == Value::string && r.kind == Value::string) {
                MStr o;
                o.add(l);
                o.add(r);
                return std::move(o).value();
            }
            if (l.kind == Value::list && r.kind == Value::list) {
                List x = *l.items;
                x.insert(x.end(), r.items->begin(), r.items->end());
                return Value::of_list(std::move(x));
            }
        }
        if (op == "*" && (l.kind == Value::integer || l.kind == Value::boolean) &&
            (r.kind == Value::string || r.kind == Value::list)) {
            Expr swapped;  // n * s is s * n
            swapped.kind = Expr::binary;
            swapped.name = "*";
            swapped.line = e.line;
            for (const Value* x : {&r, &l}) {
                auto lit = std::make_unique<Expr>();
                lit->kind = Expr::literal;
                lit->lit = *x;
                swapped.kids.push_back(std::move(lit));
            }
            return binary(swapped);
        }
        if (op == "*" && ((l.kind == Value::string || l.kind == Value::list) &&
                          (r.kind == Value::integer || r.kind == Value::boolean))) {
            const int64_t times = as_int(r);
            const size_t unit = l.kind == Value::string ? l.s.size() : l.items->size();
            if (times > 0 && unit > 0 && uint64_t(times) > kMaxBytes / unit)
                fail(e.line, "repeating a " + std::string(type_name(l)) + " " + std::to_string(r.i) + " times is too large");
            if (l.kind == Value::string) {
                MStr o;
                for (int64_t k = 0; k < times; ++k) o.add(l);
                return std::move(o).value();
            }
            List x;
            for (int64_t k = 0; k < times; ++k) x.insert(x.end(), l.items->begin(), l.items->end());
            return Value::of_list(std::move(x));
        }
        if (op == "%" && l.kind == Value::string) return percent_format(l, r, e.line);
        if (!is_number(l) || !is_number(r))
            fail(e.line, "unsupported operand types for " + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
        const bool fl = l.kind == Value::floating || r.kind == Value::floating;
        if (op == "/") {
            if (num(r) == 0) fail(e.line, "division by zero");
            return Value::of(num(l) / num(r));
        }
        if (op == "//" || op == "%") {
            if (num(r) == 0) fail(e.line, "integer division or modulo by zero");
            if (fl) {
                const double q = std::floor(num(l) / num(r));
                return op == "//" ? Value::of(q) : Value::of(num(l) - q * num(r));
            }
            const int64_t a = as_int(l), b = as_int(r);
            int64_t q = a / b;
            if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
            return op == "//" ? Value::of(q) : Value::of(a - q * b);
        }
        if (op == "**") {
            if (!fl && as_int(r) >= 0) {
                int64_t x = 1;
                for (int64_t k = 0; k < as_int(r); ++k) x *= as_int(l);
                return Value::of(x);
            }
            return Value::of(std::pow(num(l), num(r)));
        }
        if (fl) {
            const double a = num(l), b = num(r);
            return Value::of(op == "+" ? a + b : op == "-" ? a - b : a * b);
        }
        const int64_t a = as_int(l), b = as_int(r);
        return Value::of(op == "+" ? a + b : op == "-" ? a - b : a * b);
    }

    Value percent_format(const Value& fmt, const Value& arg, int line) {
        List args = arg.kind == Value::list ? *arg.items : List{arg};
        MStr o;
        size_t k = 0;
        for (size_t i = 0; i < fmt.s.size(); ++i) {
            if (fmt.s[i] != '%' || i + 1 >= fmt.s.size()) {
                o.add(fmt.s.substr(i, 1), sub_mask(fmt.mask, i, 1));
                continue;
            }
            const char c = fmt.s[++i];
            if (c == '%') {
                o.add_text("%");
                continue;
            }
            if (k >= args.size()) fail(line, "not enough arguments for format string");
            const Value& a = args[k++];
            if (c == 's') o.add(to_str(a));
            else if (c == 'r') o.add(str_marked(py_repr(a), has_data(a)));
            else if (c == 'd' || c == 'i') o.add_text(std::to_string(is_number(a) ? int64_t(num(a)) : 0));
            else fail(line, std::string("unsupported format character '") + c + "'");
        }
        return std::move(o).value();
    }

    bool contains(const Value& container, const Value& x, int line) {
        switch (container.kind) {
            case Value::string:
                if (x.kind != Value::string) fail(line, "'in <string>' requires string as left operand");
                return container.s.find(x.s) != std::string::npos;
            case Value::list:
                return std::any_of(container.items->begin(), container.items->end(),
                                   [&](const Value& y) { return equal(x, y); });
            case Value::dict:
                if (x.kind != Value::string) return false;
                return std::any_of(container.map->begin(), container.map->end(),
                                   [&](const auto& kv) { return kv.first == x.s; });
            case Value::undefined: undefined_error(container, " (testing 'in' it)", line, nullptr);
            default: fail(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
        }
    }

    bool compare(const std::string& op, const Value& l, const Value& r, int line) {
        if (op == "==") return equal(l, r);
        if (op == "!=") return !equal(l, r);
        if (op == "in") return contains(r, l, line);
        if (op == "not in") return !contains(r, l, line);
        if (op == "<") return less(l, r, line);
        if (op == ">") return less(r, l, line);
        if (op == "<=") return !less(r, l, line);
        return !less(l, r, line);  // >=
    }

    bool test(const Expr& e) {
        const std::string& t = e.name;
        if (t == "defined") return eval(*e.kids[0]).kind != Value::undefined;
        if (t == "undefined") return eval(*e.kids[0]).kind == Value::undefined;
        const Value v = eval(*e.kids[0]);
        Args a = args_of(e, 1);
        const auto arg = [&](size_t k) -> const Value& {
            if (k >= a.pos.size()) fail(e.line, "the test '" + t + "' needs an argument");
            return a.pos[k];
        };
        if (t == "none") return v.kind == Value::none;
        if (t == "string") return v.kind == Value::string;
        if (t == "number") return is_number(v);  // Python's bool is a number too
        if (t == "integer") return v.kind == Value::integer;
        if (t == "float") return v.kind == Value::floating;
        if (t == "boolean") return v.kind == Value::boolean;
        if (t == "true") return v.kind == Value::boolean && v.b;
        if (t == "false") return v.kind == Value::boolean && !v.b;
        if (t == "mapping") return v.kind == Value::dict;
        if (t == "iterable") return v.kind == Value::list || v.kind == Value::dict || v.kind == Value::string || v.kind == Value::undefined;
        if (t == "sequence") return v.kind == Value::list || v.kind == Value::dict || v.kind == Value::string || v.kind == Value::undefined;
        if (t == "callable") return v.kind == Value::function;
        if (t == "odd" || t == "even") {
            if (v.kind != Value::integer) fail(e.line, "the test '" + t + "' needs an integer");
            return (v.i % 2 != 0) == (t == "odd");
        }
        if (t == "divisibleby") return as_int(arg(0)) != 0 && as_int(v) % as_int(arg(0)) == 0;
        if (t == "eq" || t == "equalto" || t == "==") return equal(v, arg(0));
        if (t == "ne" || t == "!=") return !equal(v, arg(0));
        if (t == "lt" || t == "lessthan" || t == "<") return less(v, arg(0), e.line);
        if (t == "gt" || t == "greaterthan" || t == ">") return less(arg(0), v, e.line);
        if (t == "le" || t == "<=") return !less(arg(0), v, e.line);
        if (t == "ge" || t == ">=") return !less(v, arg(0), e.line);
        if (t == "in") return contains(arg(0), v, e.line);
        if (t == "sameas") {
            const Value& o = arg(0);
            if (v.kind != o.kind) return false;
            if (v.kind == Value::list) return v.items == o.items;
            if (v.kind == Value::dict) return v.map == o.map;
            return equal(v, o);
        }
        if (t == "lower") return v.kind == Value::string && map_case(v, 0).s == v.s;
        if (t == "upper") return v.kind == Value::string && map_case(v, 1).s == v.s;
        fail(e.line, "no test named '" + t + "'");
    }

    // ---- methods ----

    Value bound_method(const Value& self, const std::string& name, int line) {
        static const std::set<std::string> str_methods = {
            "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower", "title",
            "capitalize", "replace", "find", "rfind", "count", "join", "format", "isdigit", "isalpha", "isspace",
            "splitlines"};
        static const std::set<std::string> list_methods = {"index", "count"};
        static const std::set<std::string> mutating = {"append", "extend", "insert", "pop", "remove", "clear",
                                                        "update", "setdefault", "popitem", "sort", "reverse"};
        if (mutating.count(name) && self.kind != Value::string)
            return Value::of_fn([name, line](Args&) -> Value {
                fail(line, "'" + name + "' would modify a value, which the sandbox transformers renders in refuses");
            });
        const bool known = self.kind == Value::string ? str_methods.count(name) > 0
                           : self.kind == Value::list ? list_methods.count(name) > 0
                                                      : true;
        if (!known) return Value::undef(name);
        Renderer* r = this;
        return Value::of_fn([r, self, name](Args& a) { return r->method(self, name, a); });
    }

    Value method(const Value& self, const std::string& name, Args& a) {
        const int line = a.line;
        const auto arg = [&](size_t k) -> const Value* { return k < a.pos.size() ? &a.pos[k] : nullptr; };
        const auto kwarg = [&](const char* k) -> const Value* {
            for (const auto& kv : a.kw)
                if (kv.first == k) return &kv.second;
            return nullptr;
        };
        const auto need_str = [&](const Value* v, const char* what) -> const Value& {
            if (!v || v->kind != Value::string) fail(line, std::string(what) + " needs a string argument");
            return *v;
        };
        if (self.kind == Value::dict) {
            if (name == "items") {
                List l;
                for (const auto& kv : *self.map) l.push_back(pair(Value::str(kv.first), kv.second));
                return Value::of_list(std::move(l));
            }
            if (name == "keys") {
                List l;
                for (const auto& kv : *self.map) l.push_back(Value::str(kv.first));
                return Value::of_list(std::move(l));
            }
            if (name == "values") {
                List l;
                for (const auto& kv : *self.map) l.push_back(kv.second);
                return Value::of_list(std::move(l));
            }
            // get
            const Value& key = need_str(arg(0), "get");
            for (const auto& kv : *self.map)
                if (kv.first == key.s) return kv.second;
            return arg(1) ? *arg(1) : Value::null();
        }
        if (self.kind == Value::list) {
            const Value* x = arg(0);
            if (!x) fail(line, name + "() needs an argument");
            int64_t n = 0;
            for (size_t k = 0; k < self.items->size(); ++k)
                if (equal((*self.items)[k], *x)) {
                    if (name == "index") return Value::of(int64_t(k));
                    ++n;
                }
            if (name == "index") fail(line, py_repr(*x) + " is not in list");
            return Value::of(n);
        }
        // strings
        if (name == "strip" || name == "lstrip" || name == "rstrip") {
            const Value* c = arg(0);
            if (c && c->kind == Value::none) c = nullptr;
            return strip(self, name == "strip" ? 3 : name == "lstrip" ? 1 : 2, c);
        }
        if (name == "split" || name == "rsplit") {
            const Value* sep = arg(0) ? arg(0) : kwarg("sep");
            if (sep && sep->kind == Value::none) sep = nullptr;
            const Value* m = arg(1) ? arg(1) : kwarg("maxsplit");
            try {
                return split(self, sep, m ? as_int(*m) : -1, name == "rsplit");
            } catch (const std::invalid_argument&) {
                fail(line, "empty separator");
            }
        }
        if (name == "splitlines") {
            List l;
            size_t b = 0;
            for (size_t k = 0; k < self.s.size(); ++k)
                if (self.s[k] == '\n' || self.s[k] == '\r') {
                    l.push_back(Value::str(self.s.substr(b, k - b), sub_mask(self.mask, b, k - b)));
                    if (self.s[k] == '\r' && k + 1 < self.s.size() && self.s[k + 1] == '\n') ++k;
                    b = k + 1;
                }
            if (b < self.s.size()) l.push_back(Value::str(self.s.substr(b), sub_mask(self.mask, b, std::string::npos)));
            return Value::of_list(std::move(l));
        }
        if (name == "startswith" || name == "endswith") {
            const Value* p = arg(0);
            List options = p && p->kind == Value::list ? *p->items : List{need_str(p, name.c_str())};
            for (const Value& o : options) {
                if (o.kind != Value::string) fail(line, name + " needs strings");
                if (name == "startswith" ? self.s.compare(0, o.s.size(), o.s) == 0
                                         : self.s.size() >= o.s.size() &&
                                               self.s.compare(self.s.size() - o.s.size(), o.s.size(), o.s) == 0)
                    return Value::of(true);
            }
            return Value::of(false);
        }
        if (name == "upper") return map_case(self, 1);
        if (name == "lower") return map_case(self, 0);
        if (name == "title") return map_case(self, 2);
        if (name == "capitalize") return map_case(self, 3);
        if (name == "replace") {
            const Value* c = arg(2);
            return replace(self, need_str(arg(0), "replace"), need_str(arg(1), "replace"), c ? as_int(*c) : -1);
        }
        if (name == "find" || name == "rfind") {
            const Value& x = need_str(arg(0), name.c_str());
            const size_t at = name == "find" ? self.s.find(x.s) : self.s.rfind(x.s);
            if (at == std::string::npos) return Value::of(int64_t(-1));
            int64_t cps = 0;
            for (size_t k = 0; k < at; ++k) cps += (static_cast<unsigned char>(self.s[k]) & 0xC0) != 0x80;
            return Value::of(cps);
        }
        if (name == "count") {
            const Value& x = need_str(arg(0), "count");
            if (x.s.empty()) return Value::of(int64_t(cp_starts(self.s).size()));
            int64_t n = 0;
            for (size_t at = self.s.find(x.s); at != std::string::npos; at = self.s.find(x.s, at + x.s.size())) ++n;
            return Value::of(n);
        }
        if (name == "join") {
            MStr o;
            const List items = iterate(arg(0) ? *arg(0) : Value::undef(), line);
            for (size_t k = 0; k < items.size(); ++k) {
                if (k) o.add(self);
                if (items[k].kind != Value::string) fail(line, "join() needs strings");
                o.add(items[k]);
            }
            return std::move(o).value();
        }
        if (name == "isdigit" || name == "isalpha" || name == "isspace") {
            if (self.s.empty()) return Value::of(false);
            for (unsigned char c : self.s)
                if (!(name == "isdigit" ? std::isdigit(c) : name == "isalpha" ? std::isalpha(c) : py_space_ascii(char(c))))
                    return Value::of(false);
            return Value::of(true);
        }
        // format: "{}", "{0}", "{name}" fields, "{{" and "}}"
        MStr o;
        size_t auto_index = 0;
        for (size_t k = 0; k < self.s.size(); ++k) {
            const char c = self.s[k];
            if ((c == '{' || c == '}') && k + 1 < self.s.size() && self.s[k + 1] == c) {
                o.add_text(std::string(1, c));
                ++k;
                continue;
            }
            if (c != '{') {
                o.add(self.s.substr(k, 1), sub_mask(self.mask, k, 1));
                continue;
            }
            const size_t close = self.s.find('}', k);
            if (close == std::string::npos) fail(line, "format(): a '{' without '}'");
            const std::string field = self.s.substr(k + 1, close - k - 1);
            const Value* v = nullptr;
            if (field.empty()) v = arg(auto_index++);
            else if (std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); }))
                v = arg(size_t(std::stoul(field)));
            else v = kwarg(field.c_str());
            if (!v) fail(line, "format(): no argument for field '{" + field + "}'");
            o.add(to_str(*v));
            k = close;
        }
        return std::move(o).value();
    }

    // ---- filters ----

    // f applied to input: its arguments evaluated here.
    Value apply_filter(const Expr& f, const Value& input) {
        Args a;
        a.line = f.line;
        a.pos.push_back(input);
        for (size_t k = 1; k < f.kids.size(); ++k) a.pos.push_back(eval(*f.kids[k]));
        for (const auto& kw : f.kw) a.kw.emplace_back(kw.first, eval(*kw.second));
        return filter(f.name, a);
    }
    // A {% filter a | b %} or {% set x | a %} chain over a block's text: kids[0] is the filter
    // applied before this one (null for the first).
    Value apply_filter_chain(const Expr& f, Value input) {
        if (f.kids[0]) input = apply_filter_chain(*f.kids[0], std::move(input));
        return apply_filter(f, input);
    }

    Value filter(const std::string& name, Args& a) {
        const int line = a.line;
        const Value v = a.pos[0];
        const auto arg = [&](size_t k, const char* kw) -> const Value* {
            if (k < a.pos.size()) return &a.pos[k];
            for (const auto& x : a.kw)
                if (x.first == kw) return &x.second;
            return nullptr;
        };
        const auto need_string = [&](const Value& x) -> Value {
            if (x.kind == Value::undefined) return Value::str("");
            return to_str(x);
        };
        if (name == "trim") {
            const Value s = need_string(v);
            const Value* chars = arg(1, "chars");
            return strip(s, 3, chars && chars->kind == Value::string ? chars : nullptr);
        }
        if (name == "safe") return v;
        if (name == "string") return need_string(v);
        if (name == "upper") return map_case(need_string(v), 1);
        if (name == "lower") return map_case(need_string(v), 0);
        if (name == "capitalize") return map_case(need_string(v), 3);
        if (name == "title") return map_case(need_string(v), 4);
        if (name == "length" || name == "count") {
            switch (v.kind) {
                case Value::undefined: return Value::of(int64_t(0));
                case Value::string: return Value::of(int64_t(cp_starts(v.s).size() - 1));
                case Value::list: return Value::of(int64_t(v.items->size()));
                case Value::dict: return Value::of(int64_t(v.map->size()));
                default: fail(line, std::string("object of type '") + type_name(v) + "' has no len()");
            }
        }
        if (name == "default" || name == "d") {
            const Value* def = arg(1, "default_value");
            const Value* boolean = arg(2, "boolean");
            const bool use_default = v.kind == Value::undefined || (boolean && truthy(*boolean) && !truthy(v));
            return use_default ? (def ? *def : Value::str("")) : v;
        }
        if (name == "tojson") {
            JsonStyle st;
            const Value* indent = arg(1, "indent");
            if (indent && indent->kind == Value::integer) {
                st.indent = int(indent->i);
                st.item_sep = ",";
            }
            if (const Value* seps = arg(2, "separators"); seps && seps->kind == Value::list && seps->items->size() == 2)
                st.item_sep = (*seps->items)[0].s, st.key_sep = (*seps->items)[1].s;
            if (const Value* sk = arg(3, "sort_keys")) st.sort_keys = truthy(*sk);
            if (v.kind == Value::undefined) undefined_error(v, " (passed to tojson)", line, nullptr);
            std::string o;
            to_json(o, v, st, 0, line);
            return str_marked(o, has_data(v));
        }
        if (name == "join") {
            const Value* sep = arg(1, "d");
            const Value* attr = arg(2, "attribute");
            MStr o;
            const List items = iterate(v, line);
            for (size_t k = 0; k < items.size(); ++k) {
                if (k && sep) o.add(to_str(*sep));
                o.add(to_str(attr ? get_attr(items[k], to_str(*attr).s, line, nullptr) : items[k]));
            }
            return std::move(o).value();
        }
        if (name == "first" || name == "last") {
            const List items = iterate(v, line);
            if (items.empty()) return Value::undef(name);
            return name == "first" ? items.front() : items.back();
        }
        if (name == "list") return Value::of_list(iterate(v, line));
        if (name == "reverse") {
            if (v.kind == Value::string) {
                const std::vector<size_t> st = cp_starts(v.s);
                MStr o;
                for (size_t k = st.size() - 1; k-- > 0;)
                    o.add(v.s.substr(st[k], st[k + 1] - st[k]), sub_mask(v.mask, st[k], st[k + 1] - st[k]));
                return std::move(o).value();
            }
            List items = iterate(v, line);
            std::reverse(items.begin(), items.end());
            return Value::of_list(std::move(items));
        }
        if (name == "items") {
            if (v.kind == Value::undefined) return Value::of_list({});
            if (v.kind != Value::dict) fail(line, "items needs a mapping");
            Args none;
            none.line = line;
            return method(v, "items", none);
        }
        if (name == "dictsort") {
            if (v.kind != Value::dict) fail(line, "dictsort needs a mapping");
            Dict d = *v.map;
            std::stable_sort(d.begin(), d.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
            List l;
            for (auto& kv : d) l.push_back(pair(Value::str(kv.first), kv.second));
            return Value::of_list(std::move(l));
        }
        if (name == "replace") {
            const Value* old = arg(1, "old");
            const Value* repl = arg(2, "new");
            const Value* count = arg(3, "count");
            if (!old || !repl) fail(line, "replace needs two arguments");
            return replace(need_string(v), to_str(*old), to_str(*repl), count && count->kind == Value::integer ? count->i : -1);
        }
        if (name == "int") {
            if (v.kind == Value::integer) return v;
            if (v.kind == Value::floating) return Value::of(int64_t(v.f));
            if (v.kind == Value::boolean) return Value::of(as_int(v));
            if (v.kind == Value::string) {
                try {
                    return Value::of(int64_t(std::stoll(v.s)));
                } catch (...) {
                }
            }
            const Value* def = arg(1, "default");
            return def ? *def : Value::of(int64_t(0));
        }
        if (name == "float") {
            if (is_number(v)) return Value::of(num(v));
            if (v.kind == Value::string) {
                try {
                    return Value::of(std::stod(v.s));
                } catch (...) {
                }
            }
            return Value::of(0.0);
        }
        if (name == "abs") {
            if (!is_number(v)) fail(line, "abs needs a number");
            return v.kind == Value::floating ? Value::of(std::fabs(v.f)) : Value::of(int64_t(std::llabs(as_int(v))));
        }
        if (name == "round") {
            const Value* p = arg(1, "precision");
            const double scale = std::pow(10.0, p ? double(as_int(*p)) : 0.0);
            return Value::of(std::nearbyint(num(v) * scale) / scale);
        }
        if (name == "indent") {
            const Value* w = arg(1, "width");
            const Value* first = arg(2, "first");
            const Value* blank = arg(3, "blank");
            const std::string pad = w && w->kind == Value::string ? w->s : std::string(size_t(w ? as_int(*w) : 4), ' ');
            const Value s = need_string(v);
            MStr o;
            size_t b = 0;
            bool first_line = true;
            while (b <= s.s.size()) {
                size_t e = s.s.find('\n', b);
                const bool last = e == std::string::npos;
                if (last) e = s.s.size();
                const bool empty = e == b;
                if ((!first_line || (first && truthy(*first))) && (!empty || (blank && truthy(*blank)))) o.add_text(pad);
                o.add(s.s.substr(b, e - b), sub_mask(s.mask, b, e - b));
                if (last) break;
                o.add(s.s.substr(e, 1), sub_mask(s.mask, e, 1));
                b = e + 1;
                first_line = false;
            }
            return std::move(o).value();
        }
        if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
            const bool attr_form = name == "selectattr" || name == "rejectattr";
            const bool keep_if = name == "selectattr" || name == "select";
            const Value* attr = attr_form ? arg(1, "attribute") : nullptr;
            if (attr_form && (!attr || attr->kind != Value::string)) fail(line, name + " needs an attribute name");
            const size_t t = attr_form ? 2 : 1;
            const Value* test_name = arg(t, "test");
            List out;
            for (const Value& item : iterate(v, line)) {
                const Value x = attr_form ? get_attr_path(item, attr->s, line) : item;
                bool r;
                if (!test_name) r = truthy(x);
                else r = run_test(to_str(*test_name).s, x, List(a.pos.begin() + long(std::min(a.pos.size(), t + 1)), a.pos.end()), line);
                if (r == keep_if) out.push_back(item);
            }
            return Value::of_list(std::move(out));
        }
        if (name == "map") {
            List out;
            const Value* attr = nullptr;
            for (const auto& kw : a.kw)
                if (kw.first == "attribute") attr = &kw.second;
            const Value* def = nullptr;
            for (const auto& kw : a.kw)
                if (kw.first == "default") def = &kw.second;
            for (const Value& item : iterate(v, line)) {
                if (attr) {
                    Value x = get_attr_path(item, to_str(*attr).s, line);
                    out.push_back(x.kind == Value::undefined && def ? *def : x);
                } else {
                    if (a.pos.size() < 2) fail(line, "map needs a filter name or attribute=");
                    Args inner;
                    inner.line = line;
                    inner.pos.push_back(item);
                    inner.pos.insert(inner.pos.end(), a.pos.begin() + 2, a.pos.end());
                    out.push_back(filter(to_str(a.pos[1]).s, inner));
                }
            }
            return Value::of_list(std::move(out));
        }
        if (name == "unique") {
            List out;
            for (const Value& x : iterate(v, line))
                if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
            return Value::of_list(std::move(out));
        }
        if (name == "sort") {
            List items = iterate(v, line);
            const Value* rev = arg(1, "reverse");
            const Value* attr = arg(3, "attribute");
            std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
                const Value kx = attr ? get_attr_path(x, to_str(*attr).s, line) : x;
                const Value ky = attr ? get_attr_path(y, to_str(*attr).s, line) : y;
                return less(kx, ky, line);
            });
            if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
            return Value::of_list(std::move(items));
        }
        if (name == "batch") fail(line, "the filter 'batch' is not in polevault's Jinja subset");
        fail(line, "no filter named '" + name + "' (not in polevault's Jinja subset)");
    }

    // "a.b.c" (map and selectattr accept dotted paths).
    Value get_attr_path(const Value& v, const std::string& path, int line) {
        Value x = v;
        size_t b = 0;
        for (;;) {
            const size_t dot = path.find('.', b);
            const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
            if (x.kind == Value::undefined) return x;
            x = get_item(x, Value::str(part), line, nullptr);
            if (dot == std::string::npos) return x;
            b = dot + 1;
        }
    }

    bool run_test(const std::string& t, const Value& x, const List& extra, int line) {
        Expr e;
        e.kind = Expr::test;
        e.line = line;
        e.name = t;
        auto lit = std::make_unique<Expr>();
        lit->kind = Expr::literal;
        lit->lit = x;
        e.kids.push_back(std::move(lit));
        for (const Value& v : extra) {
            auto l = std::make_unique<Expr>();
            l->kind = Expr::literal;
            l->lit = v;
            e.kids.push_back(std::move(l));
        }
        return test(e);
    }

    // Limits that keep a hostile or broken template from hanging or exhausting the machine; chat
    // templates stay far below them.
    static constexpr long long kMaxSteps = 1'000'000;
    static constexpr size_t kMaxBytes = size_t(1) << 28;
    static constexpr int kMaxMacroDepth = 100;

private:
    const Template& t_;
    std::vector<Scope> scopes_;
    int loop_depth_ = 0;
    long long steps_ = 0;
    int macro_depth_ = 0;
};

// ---- context and globals ---------------------------------------------------------------------

Value from_json(const nlohmann::ordered_json& j, bool data) {
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null: return Value::null();
        case nlohmann::ordered_json::value_t::boolean: return Value::of(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer:
        case nlohmann::ordered_json::value_t::number_unsigned: return Value::of(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_float: return Value::of(j.get<double>());
        case nlohmann::ordered_json::value_t::string: return str_marked(j.get<std::string>(), data);
        case nlohmann::ordered_json::value_t::array: {
            List l;
            for (const auto& x : j) l.push_back(from_json(x, data));
            return Value::of_list(std::move(l));
        }
        case nlohmann::ordered_json::value_t::object: {
            Dict d;
            for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value(), data));
            return Value::of_dict(std::move(d));
        }
        default: return Value::undef();
    }
}

Scope globals(const nlohmann::ordered_json& context, const std::vector<std::string>& data_keys) {
    Scope g;
    g["range"] = Value::of_fn([](Args& a) {
        int64_t start = 0, stop = 0, step = 1;
        if (a.pos.empty() || a.pos.size() > 3) fail(a.line, "range() takes 1 to 3 arguments");
        for (const Value& v : a.pos)
            if (v.kind != Value::integer) fail(a.line, "range() needs integers");
        if (a.pos.size() == 1) stop = a.pos[0].i;
        else start = a.pos[0].i, stop = a.pos[1].i;
        if (a.pos.size() == 3) step = a.pos[2].i;
        if (step == 0) fail(a.line, "range() step must not be zero");
        List l;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
            l.push_back(Value::of(k));
            if (l.size() > 1'000'000) fail(a.line, "range() of more than 1000000 numbers");
        }
        return Value::of_list(std::move(l));
    });
    g["namespace"] = Value::of_fn([](Args& a) {
        Value ns = Value::of_dict({});
        ns.is_namespace = true;
        for (const Value& p : a.pos)
            if (p.kind == Value::dict)
                for (const auto& kv : *p.map) Renderer::set_key(*ns.map, kv.first, kv.second);
        for (auto& kv : a.kw) Renderer::set_key(*ns.map, kv.first, kv.second);
        return ns;
    });
    g["dict"] = Value::of_fn([](Args& a) {
        Dict d;
        for (const Value& p : a.pos)
            if (p.kind == Value::dict) d = *p.map;
        for (auto& kv : a.kw) Renderer::set_key(d, kv.first, kv.second);
        return Value::of_dict(std::move(d));
    });
    g["raise_exception"] = Value::of_fn([](Args& a) -> Value {
        throw JinjaRaised(a.pos.empty() ? std::string() : to_str(a.pos[0]).s);
    });
    g["strftime_now"] = Value::of_fn([](Args& a) {
        if (a.pos.empty() || a.pos[0].kind != Value::string) fail(a.line, "strftime_now() needs a format string");
        // SOURCE_DATE_EPOCH (the reproducible-builds convention: seconds since 1970, read as UTC)
        // fixes "now", so a rendering that prints the date can be made reproducible.
        std::tm tm{};
        const char* epoch = std::getenv("SOURCE_DATE_EPOCH");
        char* end = nullptr;
        const long long fixed = epoch ? std::strtoll(epoch, &end, 10) : 0;
        if (epoch && *epoch && end && *end == '\0') {
            const std::time_t t = std::time_t(fixed);
            gmtime_r(&t, &tm);
        } else {
            const std::time_t now = std::time(nullptr);
            localtime_r(&now, &tm);
        }
        char buf[256];
        const size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
        return Value::str(std::string(buf, n));
    });
    if (context.is_object())
        for (auto it = context.begin(); it != context.end(); ++it) {
            const bool data = std::find(data_keys.begin(), data_keys.end(), it.key()) != data_keys.end();
            g[it.key()] = from_json(it.value(), data);
        }
    return g;
}

}  // namespace
}  // namespace jinja

JinjaTemplate::JinjaTemplate(std::string_view source, std::string name)
    : t_(std::make_unique<jinja::Template>(jinja::parse(source, name))) {}
JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

bool JinjaTemplate::has_generation() const { return t_->has_generation; }
const std::string& JinjaTemplate::name() const { return t_->name; }

JinjaRendering JinjaTemplate::render(const nlohmann::ordered_json& context, const std::vector<std::string>& data_keys) const {
    jinja::Out out;
    jinja::Renderer r(*t_, jinja::globals(context, data_keys));
    try {
        r.run(out);
    } catch (const jinja::Error& e) {
        throw JinjaError(t_->name + ": line " + std::to_string(e.line) + ": " + e.what);
    } catch (const jinja::BreakLoop&) {
        throw JinjaError(t_->name + ": {% break %} outside a loop");
    } catch (const jinja::ContinueLoop&) {
        throw JinjaError(t_->name + ": {% continue %} outside a loop");
    }
    return {std::move(out.text), std::move(out.data), std::move(out.generation)};
}

}  // namespace pv
