// The Jinja subset's values and syntax tree, shared by the parser (data/jinja_parse.cpp) and the
// evaluator (data/jinja_eval.cpp). Internal to those two files and data/jinja.h's class.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pv::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict
struct Args;
using Function = std::function<Value(Args&)>;

// A value. Strings carry a provenance mask (data/jinja.h): `mask` is empty when every byte is
// template text, else one byte per byte of `s` (1: data).
struct Value {
    enum Kind { undefined, none, boolean, integer, floating, string, list, dict, function };
    Kind kind = undefined;
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::string s, mask;
    std::shared_ptr<List> items;  // list (and tuple)
    std::shared_ptr<Dict> map;    // dict; a namespace() too (mutable through set ns.attr)
    std::shared_ptr<Function> fn;
    bool is_namespace = false;
    bool is_tuple = false;  // a list that Python would hold as a tuple (repr "(a, b)")
    std::string undefined_name;  // what was undefined, for errors

    static Value undef(std::string name = "") {
        Value v;
        v.undefined_name = std::move(name);
        return v;
    }
    static Value null() { Value v; v.kind = none; return v; }
    static Value of(bool x) { Value v; v.kind = boolean; v.b = x; return v; }
    static Value of(int64_t x) { Value v; v.kind = integer; v.i = x; return v; }
    static Value of(double x) { Value v; v.kind = floating; v.f = x; return v; }
    static Value str(std::string x, std::string m = {}) {
        Value v;
        v.kind = string;
        v.s = std::move(x);
        v.mask = std::move(m);
        return v;
    }
    static Value of_list(List l) {
        Value v;
        v.kind = list;
        v.items = std::make_shared<List>(std::move(l));
        return v;
    }
    static Value of_dict(Dict d) {
        Value v;
        v.kind = dict;
        v.map = std::make_shared<Dict>(std::move(d));
        return v;
    }
    static Value of_fn(Function f) {
        Value v;
        v.kind = function;
        v.fn = std::make_shared<Function>(std::move(f));
        return v;
    }
};

struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    int line = 0;
};

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
    enum Kind {
        literal,   // lit
        var,       // a variable: name
        list,      // kids
        tuple,     // kids
        dict,      // kids: key, value, key, value...
        attr,      // kids[0].name
        item,      // kids[0][kids[1]]
        slice,     // kids[0][kids[1]:kids[2]:kids[3]] (null kids: omitted)
        call,      // kids[0](kids[1..], kw)
        filter,    // kids[0] | name(kids[1..], kw); kids[0] null in a {% filter %} block
        test,      // kids[0] is [not: negate] name(kids[1..])
        unary,     // name: "-", "+", "not"
        binary,    // name: + - * / // % ** ~ and or
        compare,   // kids[0] ops[0] kids[1] ops[1] kids[2] ...
        cond,      // kids[1] if kids[0] else kids[2] (kids[2] may be null)
    };
    Kind kind;
    int line = 0;
    Value lit;
    std::string name;
    std::vector<ExprP> kids;
    std::vector<std::pair<std::string, ExprP>> kw;
    std::vector<std::string> ops;
    bool negate = false;
    int height = 1;  // of the tree below (the parser bounds it: the evaluator recurses over it)
};

struct Node;
using Body = std::vector<Node>;

struct Node {
    enum Kind { raw, output, if_, for_, set, set_block, macro, generation, break_, continue_, filter_block };
    Kind kind;
    int line = 0;
    std::string text;                                  // raw
    ExprP expr;                                        // output, set (value), for (iterable), filter_block
    std::vector<std::pair<ExprP, Body>> branches;      // if: (condition, body)...; the else has none
    std::vector<std::string> targets;                  // for / set / set_block names; macro: its name
    std::string attr;                                  // set ns.attr: targets[0] is ns
    ExprP cond;                                        // for ... if cond
    Body body, else_body;                              // for, set_block, macro, generation
    std::vector<std::pair<std::string, ExprP>> params;  // macro (default may be null)
};

struct Template {
    std::string name;
    Body body;
    bool has_generation = false;
};

// Parses Jinja source (data/jinja_parse.cpp); throws pv::JinjaError.
Template parse(std::string_view source, const std::string& name);

}  // namespace pv::jinja
