// Tokenizer: encoding and decoding through the parts of data/tokenizer_parts.h, training, saving,
// and the streaming decoder (see data/tokenizer.h). Reading a tokenizer.json is in
// data/tokenizer_json.cpp.
#include "data/tokenizer.h"

#include "data/tokenizer_parts.h"
#include "data/utf8.h"
#include "io/checksum.h"
#include "io/durable_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <unordered_map>

namespace pv {

namespace {

// The Llama 3 / GPT-4 pre-split pattern (Llama 3's tokenizer.json, pre_tokenizer Split regex), with
// which trained tokenizers split text.
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

}  // namespace

void Tokenizer::Impl::index_ids() {
    size_t n = model.tokens.size();
    for (const tok::AddedToken& t : added.tokens) n = std::max(n, size_t(t.id) + 1);
    id_text.assign(n, nullptr);
    id_special.assign(n, 0);
    id_skipped.assign(n, 0);
    for (size_t id = 0; id < model.tokens.size(); ++id)
        if (model.valid[id]) id_text[id] = &model.tokens[id];
    for (const tok::AddedToken& t : added.tokens) id_text[size_t(t.id)] = &t.text;
    // HF skips a token in decode when its string is a special token's content, whichever table the
    // string came from (so a normalized special token, whose string is normalized, is not skipped).
    std::unordered_map<std::string_view, bool> special;
    for (const tok::AddedToken& t : added.tokens)
        if (t.special) special[t.content] = true, id_special[size_t(t.id)] = 1;
    for (size_t id = 0; id < n; ++id) id_skipped[id] = id_text[id] && special.count(*id_text[id]) ? 1 : 0;
}

std::vector<int> Tokenizer::encode(std::string_view text, bool parse_special, bool add_special) const {
    const Impl& m = *impl_;
    std::vector<int> out;
    out.reserve(text.size() / 3 + 1 + m.post_prefix.size() + m.post_suffix.size());
    if (add_special) out.insert(out.end(), m.post_prefix.begin(), m.post_prefix.end());
    auto model_encode = [&](std::string_view piece) { m.model.encode(piece, out); };
    for (const tok::Segment& raw : m.added.split(text, m.added.raw_trie, parse_special)) {
        if (raw.token >= 0) {
            out.push_back(m.added.tokens[size_t(raw.token)].id);
            continue;
        }
        const std::string_view seg = text.substr(raw.begin, raw.end - raw.begin);
        const bool at_start = raw.begin == 0;
        if (m.normalizer.empty() && m.added.normalized_trie.empty()) {
            tok::pre_tokenize(m.pre_tokenizer, seg, at_start, model_encode);
            continue;
        }
        const std::string norm = tok::normalize(m.normalizer, seg);
        for (const tok::Segment& s : m.added.split(norm, m.added.normalized_trie, parse_special)) {
            if (s.token >= 0)
                out.push_back(m.added.tokens[size_t(s.token)].id);
            else
                tok::pre_tokenize(m.pre_tokenizer, std::string_view(norm).substr(s.begin, s.end - s.begin),
                                  at_start && s.begin == 0, model_encode);
        }
    }
    if (add_special) out.insert(out.end(), m.post_suffix.begin(), m.post_suffix.end());
    return out;
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
    const Impl& m = *impl_;
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int id : ids) {
        if (id < 0 || id >= int(m.id_text.size()) || !m.id_text[size_t(id)])
            throw std::out_of_range("Tokenizer::decode: " + std::to_string(id) + " is not a token id (vocab_size " +
                                    std::to_string(vocab_size()) + ")");
        if (skip_special && m.id_skipped[size_t(id)]) continue;
        tokens.push_back(*m.id_text[size_t(id)]);
    }
    if (!m.has_decoder) {
        std::string out;
        for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
        return out;
    }
    return tok::run_decoders(m.decoder, std::move(tokens));
}

int Tokenizer::vocab_size() const { return int(impl_->id_text.size()); }

uint64_t Tokenizer::id_fingerprint() const {
    const Impl& m = *impl_;
    Xxh3 h;
    // Numbers as 8 little-endian bytes, strings as their length then their bytes, so that the
    // value is the same on every machine and no two different tables hash the same bytes.
    const auto put_number = [&](uint64_t v) {
        unsigned char b[8];
        for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
        h.update(b, sizeof b);
    };
    const auto put_string = [&](const std::string& s) {
        put_number(s.size());
        h.update(s.data(), s.size());
    };
    put_number(m.model.tokens.size());
    for (size_t id = 0; id < m.model.tokens.size(); ++id) {
        const char valid = m.model.valid[id];
        h.update(&valid, 1);
        if (valid) put_string(m.model.tokens[id]);
    }
    std::vector<std::pair<int, const std::string*>> added;
    for (const tok::AddedToken& t : m.added.tokens) added.emplace_back(t.id, &t.content);
    std::sort(added.begin(), added.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [id, content] : added) {
        put_number(uint64_t(id));
        put_string(*content);
    }
    const uint64_t f = h.digest();
    return f != 0 ? f : 1;
}

int Tokenizer::token_id(std::string_view token_text) const {
    const Impl& m = *impl_;
    for (const tok::AddedToken& t : m.added.tokens)
        if (t.content == token_text) return t.id;
    if (!m.model.byte_level) return m.model.find(token_text);
    std::string bytes;
    if (byte_level_to_bytes(token_text, bytes))
        if (const int id = m.model.find(bytes); id >= 0) return id;
    if (const int id = m.model.unmapped.find(token_text); id >= 0) return id;
    return m.model.find(token_text);
}

std::vector<std::string> Tokenizer::added_token_texts() const {
    std::vector<std::string> out;
    for (const tok::AddedToken& t : impl_->added.tokens) out.push_back(t.content);
    return out;
}

bool Tokenizer::is_special(int id) const { return id >= 0 && id < vocab_size() && impl_->id_special[size_t(id)] != 0; }

int Tokenizer::bos_id() const { return impl_->bos; }
int Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos; }
const std::string& Tokenizer::config_json() const { return impl_->config_text; }

Tokenizer Tokenizer::train(std::string_view text, int vocab_size, std::vector<std::string> special_tokens) {
    for (size_t i = 0; i < special_tokens.size(); ++i) {
        if (special_tokens[i].empty()) throw std::invalid_argument("Tokenizer::train: empty special token");
        for (size_t j = 0; j < i; ++j)
            if (special_tokens[i] == special_tokens[j])
                throw std::invalid_argument("Tokenizer::train: special token '" + special_tokens[i] + "' repeated");
    }
    if (vocab_size < 256 + int(special_tokens.size()))
        throw std::invalid_argument("Tokenizer::train: vocab_size " + std::to_string(vocab_size) + " is below 256 + " +
                                    std::to_string(special_tokens.size()) + " special tokens");
    auto impl = std::make_shared<Impl>();
    tok::PreTokenizerStep split{tok::PreTokenizerStep::Kind::split};
    split.pattern.regex = std::make_shared<tok::Regex>(kLlama3Pattern);
    impl->pre_tokenizer = {split, tok::PreTokenizerStep{tok::PreTokenizerStep::Kind::byte_level}};
    impl->has_decoder = true;
    impl->decoder = {tok::DecoderStep{tok::DecoderStep::Kind::byte_level}};
    for (size_t i = 0; i < special_tokens.size(); ++i) {
        tok::AddedToken t;
        t.content = t.text = special_tokens[i];
        t.special = true;
        impl->added.tokens.push_back(t);
        impl->added.raw_trie.add(t.content, int(i));
    }

    // Unique pieces with counts, sorted so the word list does not depend on hash order; the
    // special tokens are cut out first so that they are never learned.
    std::unordered_map<std::string_view, int64_t> piece_count;
    for (const tok::Segment& s : impl->added.split(text, impl->added.raw_trie, true))
        if (s.token < 0)
            tok::pre_tokenize(impl->pre_tokenizer, text.substr(s.begin, s.end - s.begin), s.begin == 0,
                              [&](std::string_view p) { ++piece_count[p]; });
    std::vector<std::pair<std::string_view, int64_t>> pieces(piece_count.begin(), piece_count.end());
    std::sort(pieces.begin(), pieces.end());
    tok::learn_byte_level_merges(pieces, vocab_size - int(special_tokens.size()), impl->model);

    int next_id = int(impl->model.tokens.size());
    for (tok::AddedToken& t : impl->added.tokens) t.id = next_id++;
    impl->eos = -1;
    for (const tok::AddedToken& t : impl->added.tokens)
        if (t.content == "<|endoftext|>") impl->eos = t.id;
    impl->index_ids();
    return Tokenizer(std::move(impl));
}

void Tokenizer::save(const std::string& path) const {
    const Impl& m = *impl_;
    if (!m.json_text.empty()) {
        write_file_atomically(path, "tokenizer",
                              [&](const ByteSink& sink) { sink(m.json_text.data(), m.json_text.size()); });
        if (!m.config_text.empty()) {
            const std::string config = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
            write_file_atomically(config, "tokenizer config",
                                  [&](const ByteSink& sink) { sink(m.config_text.data(), m.config_text.size()); });
        }
        return;
    }
    // A trained tokenizer: byte-level BPE with the Llama 3 split, as HF writes one.
    using ojson = nlohmann::ordered_json;
    ojson added = ojson::array();
    for (const tok::AddedToken& s : m.added.tokens)
        added.push_back({{"id", s.id},
                         {"content", s.content},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", s.special}});
    // In id order. ordered_json's map compares each new key with every earlier one (quadratic in
    // the vocabulary); the strings of distinct ids are distinct, so they are appended directly.
    ojson vocab = ojson::object();
    auto& entries = vocab.get_ref<ojson::object_t&>();
    entries.reserve(m.model.tokens.size());
    for (size_t id = 0; id < m.model.tokens.size(); ++id)
        if (m.model.valid[id]) entries.ojson::object_t::Container::emplace_back(m.model.tokens[id], id);
    ojson merges = ojson::array();
    for (auto [a, b] : m.model.merge_list)
        merges.push_back(ojson::array({m.model.tokens[size_t(a)], m.model.tokens[size_t(b)]}));
    ojson j = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           ojson::array(
               {{{"type", "Split"},
                 {"pattern", {{"Regex", m.pre_tokenizer[0].pattern.regex->pattern()}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", m.model.ignore_merges},
          {"vocab", vocab},
          {"merges", merges}}},
    };
    std::string text;
    try {
        text = j.dump(2);
    } catch (const std::exception& e) {  // a special token that is not valid UTF-8
        throw std::runtime_error("tokenizer '" + path + "': cannot be written as JSON: " + e.what());
    }
    text += '\n';
    // path.tmp, fsync, rename, directory fsync: a crash leaves the old file or the new one.
    write_file_atomically(path, "tokenizer", [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

// ---- TokenStreamDecoder ----

namespace {

// Whether more ids could still change the end of this text: an unfinished UTF-8 character, or the
// U+FFFD a ByteFallback decoder writes for an unfinished run of byte tokens.
bool may_change(const std::string& s) {
    static const std::string replacement = "\xEF\xBF\xBD";
    return utf8_ends_incomplete(s) || (s.size() >= 3 && s.compare(s.size() - 3, 3, replacement) == 0);
}

}  // namespace

TokenStreamDecoder::TokenStreamDecoder(Tokenizer tokenizer, const std::vector<int>& context, bool skip_special)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {
    // A few ids of context are enough for decoders that look at the text's start.
    const size_t keep = std::min<size_t>(context.size(), 4);
    window_.assign(context.end() - long(keep), context.end());
    settled_ = window_.size();
    prefix_ = tokenizer_.decode(window_, skip_special_);
}

std::string TokenStreamDecoder::push(int id) {
    window_.push_back(id);
    std::string text = tokenizer_.decode(window_, skip_special_);
    if (text.size() <= prefix_.size() || may_change(text)) return {};
    size_t from = prefix_.size();
    // Later ids changed text already returned (a byte-fallback run that turned invalid after a
    // valid character): what was returned stands, and the rest starts at a character boundary.
    if (text.compare(0, from, prefix_) != 0)
        while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
    std::string fresh = text.substr(from);
    // The ids of this step become the window's settled start; their text is accounted for.
    window_.erase(window_.begin(), window_.begin() + long(settled_));
    settled_ = window_.size();
    prefix_ = tokenizer_.decode(window_, skip_special_);
    return fresh;
}

std::string TokenStreamDecoder::finish() {
    const std::string text = tokenizer_.decode(window_, skip_special_);
    std::string rest = text.size() > prefix_.size() ? text.substr(prefix_.size()) : std::string();
    window_.clear();
    settled_ = 0;
    prefix_.clear();
    return rest;
}

}  // namespace pv
