// Reading the keys of a JSON file a user hands us (config.json, adapter_config.json,
// generation_config.json): the document parsed with nlohmann/json, and the errors every such
// reader words the same way. Each error is a std::runtime_error "<kind> '<origin>': <what>", where
// <what> names the key, its value as it appears in the file (json_shown) and, for a value of the
// wrong JSON type, both types and the fix. The rules of each file (which keys, which values) stay
// with its reader (formats/config_json.cpp, formats/peft_config.cpp), which builds on JsonReader.
// Host code only (g++); no CUDA headers.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace pv {

// A value as it appears in the file, shortened (to 80 characters) so one bad key cannot flood
// the message.
std::string json_shown(const nlohmann::json& v);

// "a string", "an array", "an integer", "a non-integer number", ...: the JSON type of a value, for
// type errors.
std::string json_type_of(const nlohmann::json& v);

// `text` parsed as a JSON object. Otherwise throws std::runtime_error "<kind> '<origin>': not valid
// JSON (<the parser's message>); <fix>", or, for valid JSON of another type, "<kind> '<origin>':
// the file is <its type>, but <kind> is a JSON object {...} of keys; is this the right file?".
nlohmann::json parse_json_object(const std::string& text, const std::string& kind, const std::string& origin,
                                 const std::string& fix);

// The keys of one parsed JSON object (kept by the caller, alive as long as the reader); `kind`
// names the file ("config.json") and `origin` which one (a path) in every error.
class JsonReader {
  public:
    JsonReader(const nlohmann::json& root, std::string kind, std::string origin);

    const nlohmann::json& root() const { return root_; }

    // Throws std::runtime_error "<kind> '<origin>': <what>".
    [[noreturn]] void fail(const std::string& what) const;
    // fail("<name> = <value> is <its type>, expected <expected>: <fix>"); `name` is the key as a
    // user would search for it ("rope_scaling.factor").
    [[noreturn]] void wrong_type(const std::string& name, const nlohmann::json& v, const std::string& expected,
                                 const std::string& fix) const;

    // The value of `key` in the root object (or in `obj`), or nullptr when the key is absent.
    const nlohmann::json* find(const std::string& key) const { return find(root_, key); }
    static const nlohmann::json* find(const nlohmann::json& obj, const std::string& key);

  private:
    const nlohmann::json& root_;
    std::string kind_, origin_;
};

}  // namespace pv
