// The shared core of the JSON file readers (io/json_reader.h).
#include "io/json_reader.h"

#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

namespace pv {

using json = nlohmann::json;

std::string json_shown(const json& v) {
    std::string s = v.dump();
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
}

std::string json_type_of(const json& v) {
    if (v.is_number_float()) return "a non-integer number";
    if (v.is_number()) return "an integer";
    const std::string t = v.type_name();
    return (t == "array" || t == "object" ? "an " : "a ") + t;
}

json parse_json_object(const std::string& text, const std::string& kind, const std::string& origin,
                       const std::string& fix) {
    json root;
    try {
        root = json::parse(text);
    } catch (const json::exception& e) {
        throw std::runtime_error(kind + " '" + origin + "': not valid JSON (" + e.what() + "); " + fix);
    }
    if (!root.is_object())
        throw std::runtime_error(kind + " '" + origin + "': the file is " + json_type_of(root) + ", but " + kind +
                                 " is a JSON object {...} of keys; is this the right file?");
    return root;
}

JsonReader::JsonReader(const json& root, std::string kind, std::string origin)
    : root_(root), kind_(std::move(kind)), origin_(std::move(origin)) {}

void JsonReader::fail(const std::string& what) const {
    throw std::runtime_error(kind_ + " '" + origin_ + "': " + what);
}

void JsonReader::wrong_type(const std::string& name, const json& v, const std::string& expected,
                            const std::string& fix) const {
    fail(name + " = " + json_shown(v) + " is " + json_type_of(v) + ", expected " + expected + ": " + fix);
}

const json* JsonReader::find(const json& obj, const std::string& key) {
    const auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
}

}  // namespace pv
