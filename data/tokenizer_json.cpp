// Tokenizer::load: a Hugging Face tokenizer.json (and tokenizer_config.json beside it) read into
// the parts of data/tokenizer_parts.h. Every component is read by its "type"; one polevault does not
// run is refused with the file, the component and the types it supports, never guessed at. Field
// defaults are HF's (ByteLevel's add_prefix_space and use_regex default to true, Metaspace's
// replacement to "▁", ...).
#include "data/tokenizer.h"

#include "io/input_file.h"
#include "data/tokenizer_parts.h"
#include "data/utf8.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace pv {

namespace {

using nlohmann::json;

// model.vocab's entries and model.merges, taken out of the document while it is parsed: Llama 3's
// 128k entries and 280k merges as a JSON document (a std::map node per entry, a json value per
// merge) cost more to build and free than all the rest of loading. The parser's callback hands
// each one over as it is read and drops it from the document, which keeps empty containers.
struct StreamedModel {
    std::vector<std::pair<std::string, json>> vocab;  // token, id
    std::vector<json> merges;                         // "a b" or ["a", "b"]
    std::vector<std::string> path;                    // the key at each depth of the current value
    std::string token;                                // the vocab key whose value comes next
    bool has_token = false;

    bool under(const char* section) const { return path.size() > 2 && path[1] == "model" && path[2] == section; }

    // nlohmann's parser callback: depth counts the open containers (model's keys are at depth 2,
    // a vocab entry or a merge at depth 3); returning false drops the value from the document.
    bool operator()(int depth, json::parse_event_t event, json& parsed) {
        const size_t d = size_t(depth);
        switch (event) {
            case json::parse_event_t::key:
                if (path.size() <= d) path.resize(d + 1);
                path[d] = parsed.get<std::string>();
                path.resize(d + 1);
                if (d == 3 && under("vocab")) {
                    token = std::move(parsed.get_ref<std::string&>());
                    has_token = true;
                    return false;
                }
                return true;
            case json::parse_event_t::value:
                if (d == 3 && under("vocab") && has_token) {
                    vocab.emplace_back(std::move(token), std::move(parsed));
                    has_token = false;
                    return false;
                }
                if (d == 3 && under("merges") && parsed.is_string()) {
                    merges.push_back(std::move(parsed));
                    return false;
                }
                return true;
            case json::parse_event_t::array_end:  // a merge written as ["a", "b"]
                if (d == 3 && under("merges")) {
                    merges.push_back(std::move(parsed));
                    return false;
                }
                return true;
            default: return true;
        }
    }
};

// Errors name the file: "tokenizer 'PATH': what".
struct Loader {
    std::string path;

    std::runtime_error fail(const std::string& what) const {
        return std::runtime_error("tokenizer '" + path + "': " + what);
    }

    static std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].dump() : "?"; }

    bool flag(const json& obj, const char* key, bool fallback, const std::string& where) const {
        if (!obj.contains(key) || obj[key].is_null()) return fallback;
        if (!obj[key].is_boolean()) throw fail(where + " field \"" + key + "\" is not true or false");
        return obj[key].get<bool>();
    }

    std::string text(const json& obj, const char* key, const std::string& where) const {
        if (!obj.contains(key) || !obj[key].is_string()) throw fail(where + " has no string field \"" + key + "\"");
        return obj[key].get<std::string>();
    }

    // {"String": "..."} or {"Regex": "..."}.
    tok::Pattern pattern(const json& obj, const std::string& where) const {
        if (!obj.contains("pattern") || !obj["pattern"].is_object())
            throw fail(where + " has no \"pattern\" object ({\"String\": ...} or {\"Regex\": ...})");
        const json& p = obj["pattern"];
        tok::Pattern out;
        if (p.contains("String") && p["String"].is_string()) {
            out.literal = p["String"].get<std::string>();
            if (out.literal.empty()) throw fail(where + " pattern is an empty string");
        } else if (p.contains("Regex") && p["Regex"].is_string()) {
            try {
                out.regex = std::make_shared<tok::Regex>(p["Regex"].get<std::string>());
            } catch (const std::invalid_argument& e) {
                throw fail(where + " " + e.what());
            }
        } else {
            throw fail(where + " pattern " + p.dump() + " is neither {\"String\": ...} nor {\"Regex\": ...}");
        }
        return out;
    }

    // One character, as Metaspace's replacement and Strip's content are.
    uint32_t single_char(const std::string& s, const std::string& where) const {
        const int n = s.empty() ? 0 : utf8_char_length(s, 0);
        if (n == 0 || size_t(n) != s.size()) throw fail(where + " \"" + s + "\" is not one character");
        return utf8_decode(s, 0, n);
    }

    // Metaspace's prepend_scheme, or the older add_prefix_space flag.
    tok::PreTokenizerStep::Prepend prepend_scheme(const json& obj, const std::string& where) const {
        using P = tok::PreTokenizerStep::Prepend;
        if (obj.contains("prepend_scheme") && !obj["prepend_scheme"].is_null()) {
            const json& s = obj["prepend_scheme"];
            if (s == "always") return P::always;
            if (s == "first") return P::first;
            if (s == "never") return P::never;
            throw fail(where + " prepend_scheme " + s.dump() + " is not \"always\", \"first\" or \"never\"");
        }
        return flag(obj, "add_prefix_space", true, where) ? P::always : P::never;
    }

    void normalizer(const json& j, std::vector<tok::NormalizerStep>& out) const {
        if (j.is_null()) return;
        const std::string type = j.is_object() ? j.value("type", "") : "";
        if (type == "Sequence") {
            if (!j.contains("normalizers") || !j["normalizers"].is_array())
                throw fail("normalizer Sequence has no \"normalizers\" array");
            for (const json& n : j["normalizers"]) normalizer(n, out);
        } else if (type == "Prepend") {
            out.push_back({tok::NormalizerStep::Kind::prepend, text(j, "prepend", "normalizer Prepend"), {}});
        } else if (type == "Replace") {
            out.push_back({tok::NormalizerStep::Kind::replace, text(j, "content", "normalizer Replace"),
                           pattern(j, "normalizer Replace")});
        } else {
            throw fail("normalizer " + type_of(j) +
                       " is not supported (polevault reads the normalizers Prepend, Replace and "
                       "Sequence, as SentencePiece-style BPE files use them)");
        }
    }

    void pre_tokenizer(const json& j, std::vector<tok::PreTokenizerStep>& out) const {
        using Step = tok::PreTokenizerStep;
        if (j.is_null()) return;
        const std::string type = j.is_object() ? j.value("type", "") : "";
        if (type == "Sequence") {
            if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
                throw fail("pre_tokenizer Sequence has no \"pretokenizers\" array");
            for (const json& p : j["pretokenizers"]) pre_tokenizer(p, out);
        } else if (type == "Split") {
            Step s{Step::Kind::split};
            s.pattern = pattern(j, "pre_tokenizer Split");
            const std::string b = text(j, "behavior", "pre_tokenizer Split");
            if (b == "Removed")
                s.behavior = tok::SplitBehavior::removed;
            else if (b == "Isolated")
                s.behavior = tok::SplitBehavior::isolated;
            else if (b == "MergedWithPrevious")
                s.behavior = tok::SplitBehavior::merged_with_previous;
            else if (b == "MergedWithNext")
                s.behavior = tok::SplitBehavior::merged_with_next;
            else if (b == "Contiguous")
                s.behavior = tok::SplitBehavior::contiguous;
            else
                throw fail("pre_tokenizer Split behavior \"" + b +
                           "\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
            s.invert = flag(j, "invert", false, "pre_tokenizer Split");
            out.push_back(std::move(s));
        } else if (type == "ByteLevel") {
            Step s{Step::Kind::byte_level};
            s.add_prefix_space = flag(j, "add_prefix_space", true, "pre_tokenizer ByteLevel");
            s.use_regex = flag(j, "use_regex", true, "pre_tokenizer ByteLevel");
            out.push_back(std::move(s));
        } else if (type == "Metaspace") {
            Step s{Step::Kind::metaspace};
            s.replacement = j.contains("replacement") ? text(j, "replacement", "pre_tokenizer Metaspace") : "\u2581";
            single_char(s.replacement, "pre_tokenizer Metaspace replacement");
            s.prepend = prepend_scheme(j, "pre_tokenizer Metaspace");
            s.split = flag(j, "split", true, "pre_tokenizer Metaspace");
            out.push_back(std::move(s));
        } else if (type == "Digits") {
            Step s{Step::Kind::digits};
            s.pattern.regex = std::make_shared<tok::Regex>("\\p{N}");
            s.behavior = flag(j, "individual_digits", false, "pre_tokenizer Digits") ? tok::SplitBehavior::isolated
                                                                                     : tok::SplitBehavior::contiguous;
            out.push_back(std::move(s));
        } else {
            throw fail("pre_tokenizer " + type_of(j) +
                       " is not supported (polevault reads the pre-tokenizers Split, ByteLevel, Metaspace, Digits "
                       "and Sequence)");
        }
    }

    void decoder(const json& j, std::vector<tok::DecoderStep>& out) const {
        using Step = tok::DecoderStep;
        const std::string type = j.is_object() ? j.value("type", "") : "";
        if (type == "Sequence") {
            if (!j.contains("decoders") || !j["decoders"].is_array())
                throw fail("decoder Sequence has no \"decoders\" array");
            for (const json& d : j["decoders"]) decoder(d, out);
        } else if (type == "ByteLevel") {
            out.push_back(Step{Step::Kind::byte_level});
        } else if (type == "Replace") {
            Step s{Step::Kind::replace};
            s.pattern = pattern(j, "decoder Replace");
            s.text = text(j, "content", "decoder Replace");
            out.push_back(std::move(s));
        } else if (type == "ByteFallback") {
            out.push_back(Step{Step::Kind::byte_fallback});
        } else if (type == "Fuse") {
            out.push_back(Step{Step::Kind::fuse});
        } else if (type == "Strip") {
            Step s{Step::Kind::strip};
            s.strip_char = single_char(text(j, "content", "decoder Strip"), "decoder Strip content");
            for (auto [key, field] : {std::pair{"start", &s.strip_start}, std::pair{"stop", &s.strip_stop}}) {
                if (!j.contains(key) || !j[key].is_number_unsigned())
                    throw fail(std::string("decoder Strip has no count \"") + key + "\"");
                *field = int(std::min<uint64_t>(j[key].get<uint64_t>(), 1u << 20));
            }
            out.push_back(std::move(s));
        } else if (type == "Metaspace") {
            Step s{Step::Kind::metaspace};
            s.text = j.contains("replacement") ? text(j, "replacement", "decoder Metaspace") : "\u2581";
            single_char(s.text, "decoder Metaspace replacement");
            s.metaspace_first = prepend_scheme(j, "decoder Metaspace") != tok::PreTokenizerStep::Prepend::never;
            out.push_back(std::move(s));
        } else {
            throw fail("decoder " + type_of(j) +
                       " is not supported (polevault reads the decoders ByteLevel, Replace, ByteFallback, Fuse, "
                       "Strip, Metaspace and Sequence)");
        }
    }

    // The ids TemplateProcessing's single-sequence template puts before and after "$A".
    void post_processor(const json& j, const Tokenizer::Impl& impl, std::vector<int>& prefix,
                        std::vector<int>& suffix) const {
        if (j.is_null()) return;
        const std::string type = j.is_object() ? j.value("type", "") : "";
        if (type == "Sequence") {
            if (!j.contains("processors") || !j["processors"].is_array())
                throw fail("post_processor Sequence has no \"processors\" array");
            for (const json& p : j["processors"]) post_processor(p, impl, prefix, suffix);
        } else if (type == "ByteLevel") {
            // Adjusts offsets only: no tokens.
        } else if (type == "TemplateProcessing") {
            if (!j.contains("single") || !j["single"].is_array())
                throw fail("post_processor TemplateProcessing has no \"single\" template array");
            const json specials = j.value("special_tokens", json::object());
            std::vector<int> before, after;
            bool seen_sequence = false;
            for (const json& item : j["single"]) {
                if (item.contains("Sequence")) {
                    if (item["Sequence"].value("id", "") != "A" || seen_sequence)
                        throw fail("post_processor TemplateProcessing single template " + j["single"].dump() +
                                   " does not hold the sequence $A exactly once");
                    seen_sequence = true;
                } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
                           item["SpecialToken"]["id"].is_string()) {
                    const std::string name = item["SpecialToken"]["id"].get<std::string>();
                    if (!specials.contains(name) || !specials[name].contains("ids") ||
                        !specials[name]["ids"].is_array())
                        throw fail("post_processor TemplateProcessing names the special token \"" + name +
                                   "\" without listing its ids in special_tokens");
                    for (const json& id : specials[name]["ids"]) {
                        if (!id.is_number_integer() || id.get<long long>() < 0 ||
                            id.get<long long>() >= (long long)impl.id_text.size() || !impl.id_text[id.get<size_t>()])
                            throw fail("post_processor TemplateProcessing special token \"" + name + "\" has id " +
                                       id.dump() + ", which is not a token");
                        (seen_sequence ? after : before).push_back(id.get<int>());
                    }
                } else {
                    throw fail("post_processor TemplateProcessing template item " + item.dump() +
                               " is neither a Sequence nor a SpecialToken");
                }
            }
            if (!seen_sequence)
                throw fail("post_processor TemplateProcessing single template " + j["single"].dump() + " has no $A");
            prefix.insert(prefix.begin(), before.begin(), before.end());
            suffix.insert(suffix.end(), after.begin(), after.end());
        } else {
            throw fail("post_processor " + type_of(j) +
                       " is not supported (polevault reads the post-processors TemplateProcessing, ByteLevel and "
                       "Sequence)");
        }
    }

    // The vocabulary, merges and unknown-character handling of a BPE model; the vocabulary's
    // entries and the merges come from the parse (StreamedModel), the rest from m.
    // Ids index dense tables (the model's tokens, the id -> text map) and set the vocabulary's
    // size, so an id is refused beyond what the file's entries can number: its vocab entries and
    // added tokens, 0, 1, 2, ..., with at most kUnusedIds ids left unused among them. (A single
    // id of 16 million in a file of a few bytes would otherwise allocate half a gigabyte.)
    static constexpr long long kUnusedIds = 1024;
    void check_id(long long id, long long entries, const std::string& what) const {
        if (id < 0 || id >= std::min<long long>(entries + kUnusedIds, 1 << 24))
            throw fail(what + " id " + std::to_string(id) + " out of range: the file has " + std::to_string(entries) +
                       " vocab entries and added tokens, numbered from 0 (ids above " +
                       std::to_string(entries + kUnusedIds - 1) +
                       " would leave more than 1024 unused); is the file corrupt?");
    }

    void model(const json& m, const StreamedModel& streamed, long long entries, tok::BpeModel& out) const {
        if (!m.is_object()) throw fail("no \"model\" object");
        if (m.contains("type") && m["type"] != "BPE")
            throw fail("model type " + m["type"].dump() +
                       " is not supported: polevault reads BPE models (byte-level BPE as in GPT-2 and Llama 3, "
                       "SentencePiece-style BPE with byte fallback as in Llama 2)");
        if (!m.contains("vocab") || !m["vocab"].is_object()) throw fail("not a BPE model (no model.vocab object)");
        if (!m.contains("merges") || !m["merges"].is_array()) throw fail("not a BPE model (no model.merges array)");
        for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
            if (m.contains(key) && !m[key].is_null() && m[key] != "")
                throw fail(std::string("model ") + key + " " + m[key].dump() +
                           " is not supported (no byte-level or SentencePiece-style BPE uses one)");
        if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"] == 0))
            throw fail("model dropout " + m["dropout"].dump() +
                       " is not supported (BPE dropout makes encoding random; set it to null)");
        out.fuse_unk = flag(m, "fuse_unk", false, "model");
        out.byte_fallback = flag(m, "byte_fallback", false, "model");
        out.ignore_merges = flag(m, "ignore_merges", false, "model");

        tok::StringIndex by_string;  // the vocabulary as the file spells it, for the merges
        by_string.reserve(streamed.vocab.size());
        out.vocab.reserve(streamed.vocab.size());
        for (const auto& [token, idj] : streamed.vocab) {
            if (!idj.is_number_integer()) throw fail("vocab entry " + json(token).dump() + " has no integer id");
            const long long id = idj.get<long long>();
            check_id(id, entries, "vocab");
            if (id < (long long)out.valid.size() && out.valid[size_t(id)])
                throw fail("vocab id " + std::to_string(id) + " used twice");
            out.add_token(int(id), token);
            by_string.set(token, int(id));
        }
        if (m.contains("unk_token") && !m["unk_token"].is_null()) {
            const std::string unk = text(m, "unk_token", "model");
            out.unk = by_string.find(unk);
            if (out.unk < 0) throw fail("model unk_token " + json(unk).dump() + " is not in the vocab");
        }
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            out.fallback_id[size_t(b)] = by_string.find(name);
        }
        if (out.byte_level && out.unk < 0 && !out.byte_fallback)
            for (int b = 0; b < 256; ++b)
                if (out.byte_id[size_t(b)] < 0)
                    throw fail("vocab lacks the byte token " + json(byte_level_alphabet().to_utf8[size_t(b)]).dump() +
                               " (byte " + std::to_string(b) +
                               ") and has no unk_token or byte fallback: text with that byte could not be encoded");

        const std::vector<json>& merges = streamed.merges;
        out.merges.reserve(merges.size());
        out.merge_list.reserve(merges.size());
        std::string_view a, b;
        std::string ab;
        for (size_t r = 0; r < merges.size(); ++r) {
            const json& mj = merges[r];
            if (mj.is_string()) {  // the older "a b" form
                const std::string& s = mj.get_ref<const std::string&>();
                const size_t sp = s.find(' ');
                if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                    throw fail("merge " + std::to_string(r) + " " + mj.dump() +
                               " is not two tokens separated by a space");
                a = std::string_view(s).substr(0, sp);
                b = std::string_view(s).substr(sp + 1);
            } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
                a = mj[0].get_ref<const std::string&>();
                b = mj[1].get_ref<const std::string&>();
            } else {
                throw fail("merge " + std::to_string(r) + " " + mj.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
            }
            const int ia = by_string.find(a), ib = by_string.find(b);
            if (ia < 0 || ib < 0)
                throw fail("merge " + std::to_string(r) + " " + mj.dump() + ": part " + json(ia < 0 ? a : b).dump() +
                           " is not in the vocab");
            ab.assign(a);
            ab += b;
            const int iab = by_string.find(ab);
            if (iab < 0)
                throw fail("merge " + std::to_string(r) + " " + mj.dump() + ": result " + json(ab).dump() +
                           " is not in the vocab");
            // HF collects the merges into a map, so a repeated merge keeps its last rank.
            out.merges.set(ia, ib, {int(r), iab});
            out.merge_list.push_back({ia, ib});
        }
    }

    void added_tokens(const json& j, long long entries, Tokenizer::Impl& impl) const {
        if (j.is_null()) return;
        if (!j.is_array()) throw fail("\"added_tokens\" is not an array");
        for (const json& t : j) {
            if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
                !t["content"].is_string())
                throw fail("added token " + t.dump() + " lacks an integer id or a string content");
            tok::AddedToken a;
            const long long id = t["id"].get<long long>();
            check_id(id, entries, "added token");
            a.id = int(id);
            a.content = t["content"].get<std::string>();
            if (a.content.empty()) throw fail("added token " + std::to_string(id) + " is empty");
            const std::string where = "added token " + json(a.content).dump();
            a.special = flag(t, "special", false, where);
            a.lstrip = flag(t, "lstrip", false, where);
            a.rstrip = flag(t, "rstrip", false, where);
            a.normalized = flag(t, "normalized", !a.special, where);
            a.single_word = flag(t, "single_word", false, where);
            const int index = int(impl.added.tokens.size());
            // A normalized token is looked for in normalized text, so its own string is normalized;
            // that is its string in decoding too.
            a.text = a.normalized ? tok::normalize(impl.normalizer, a.content) : a.content;
            if (a.normalized)
                impl.added.normalized_trie.add(a.text, index);
            else
                impl.added.raw_trie.add(a.content, index);
            impl.added.tokens.push_back(std::move(a));
        }
    }

    // tokenizer_config.json's bos_token / eos_token: a string, {"content": ...}, or null.
    int config_token(const json& config, const char* key, const Tokenizer& tok, const std::string& config_path) const {
        if (!config.contains(key) || config[key].is_null()) return -2;  // not given
        const json& v = config[key];
        std::string name;
        if (v.is_string())
            name = v.get<std::string>();
        else if (v.is_object() && v.contains("content") && v["content"].is_string())
            name = v["content"].get<std::string>();
        else
            throw std::runtime_error("tokenizer config '" + config_path + "': " + key + " " + v.dump() +
                                     " is neither a string nor an object with a \"content\" string");
        const int id = tok.token_id(name);
        if (id < 0)
            throw std::runtime_error("tokenizer config '" + config_path + "': " + key + " " + json(name).dump() +
                                     " is not a token of '" + path + "'");
        return id;
    }
};

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
    const Loader L{path};
    std::string text = read_input_file(path, "tokenizer", kMaxJsonFileBytes, "check the path");
    json j;
    StreamedModel streamed;
    try {
        j = json::parse(
            text, [&](int depth, json::parse_event_t event, json& parsed) { return streamed(depth, event, parsed); });
    } catch (const json::exception& e) {
        throw L.fail(std::string("not JSON: ") + e.what());
    }
    if (!j.is_object()) throw L.fail("not a tokenizer.json (the top level is not an object)");
    for (const char* key : {"truncation", "padding"})
        if (j.contains(key) && !j[key].is_null())
            throw L.fail(std::string("\"") + key + "\" is set (" + j[key].dump() +
                         "): polevault neither truncates nor pads what it encodes; set it to null");

    auto impl = std::make_shared<Impl>();
    impl->source = path;
    impl->json_text = std::move(text);
    L.normalizer(j.value("normalizer", json()), impl->normalizer);
    L.pre_tokenizer(j.value("pre_tokenizer", json()), impl->pre_tokenizer);
    for (size_t k = 0; k < impl->pre_tokenizer.size(); ++k)
        if (impl->pre_tokenizer[k].kind == tok::PreTokenizerStep::Kind::byte_level) {
            if (k + 1 != impl->pre_tokenizer.size())
                throw L.fail(
                    "pre_tokenizer ByteLevel is followed by other pre-tokenizers (polevault runs ByteLevel "
                    "as the last one, as GPT-2 and Llama 3 files have it)");
            impl->model.byte_level = true;
        }
    if (!j.contains("model")) throw L.fail("no \"model\" object");
    const json added = j.value("added_tokens", json());
    const long long entries = (long long)streamed.vocab.size() + (added.is_array() ? (long long)added.size() : 0);
    L.model(j["model"], streamed, entries, impl->model);
    L.added_tokens(added, entries, *impl);
    if (j.contains("decoder") && !j["decoder"].is_null()) {
        impl->has_decoder = true;
        L.decoder(j["decoder"], impl->decoder);
    }
    impl->index_ids();
    L.post_processor(j.value("post_processor", json()), *impl, impl->post_prefix, impl->post_suffix);

    // BOS and EOS: tokenizer_config.json, else the post-processor, else the usual names.
    const std::string config_path = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
    json config = json::object();
    if (std::filesystem::exists(config_path)) {
        impl->config_text = read_input_file(config_path, "tokenizer config", kMaxJsonFileBytes);
        try {
            config = json::parse(impl->config_text);
        } catch (const json::exception& e) {
            throw std::runtime_error("tokenizer config '" + config_path + "': not JSON: " + e.what());
        }
        if (!config.is_object())
            throw std::runtime_error("tokenizer config '" + config_path + "': the top level is not an object");
    }
    const Tokenizer partial(impl);  // token_id for the names in the config
    auto added_named = [&](std::initializer_list<const char*> names) {
        for (const char* name : names)
            for (const tok::AddedToken& t : impl->added.tokens)
                if (t.content == name) return t.id;
        return -1;
    };
    impl->bos = L.config_token(config, "bos_token", partial, config_path);
    if (impl->bos == -2)
        impl->bos = !impl->post_prefix.empty() ? impl->post_prefix.front() : added_named({"<|begin_of_text|>", "<s>"});
    impl->eos = L.config_token(config, "eos_token", partial, config_path);
    if (impl->eos == -2)
        impl->eos = !impl->post_suffix.empty() ? impl->post_suffix.back()
                                               : added_named({"<|end_of_text|>", "</s>", "<|endoftext|>"});
    impl->add_bos = !impl->post_prefix.empty() && impl->bos >= 0 && impl->post_prefix.front() == impl->bos;
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
        impl->add_bos = config["add_bos_token"].get<bool>();
    return Tokenizer(std::move(impl));
}

}  // namespace pv
